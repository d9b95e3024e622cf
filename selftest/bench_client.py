"""``svcframe bench --workload client``: what the CLIENT costs, beside the raw uvloop limit, in one run.

Three client implementations (``IMPLS``), each against its own server (every server pinned to the server
core and in a session of its own, so in the same kind of scheduling group: ``bench_peers.PeerServer``;
loopback):

* ``raw uvloop``: the raw peer of ``bench_peers`` (length-prefixed frames consumed in place): the limit;
* ``asyncio+msgpack``: the hand-written msgpack RPC of ``bench_peers``, what an afternoon's work gives;
* ``svcframe``: a client-only ``Engine(None)`` calling the self-test provider (``work`` for a noop call,
  ``read`` for reads: ``selftest/provider.py``).

Workloads (``CLIENT_WORKLOADS``):

* ``client-cpu``: one client process per client core, ``depth`` (32) noop calls in flight each: the client's
  CPU µs per call, its own process CPU time (user + system, ``time.process_time``) over the window divided
  by its calls; also ops/s and the server's CPU µs per call (psutil), which shows whether the server kept up.
* ``client-seq``: one client, one noop call at a time: p50 / p99 µs, with client and server sharing ONE core
  and on their own cores, for each (server, client) progress-mode pair of ``SEQ_MODES``. The raw peer
  progresses the same way (``bench_peers.peer_progress``: svcframe's own progress loop, ``block``,
  ``spindown`` with its window, ``busy``); the msgpack peer blocks, as asyncio does.
* ``client-read``: one client reading ``size`` bytes per call (64 KiB, 4 MiB), tcp and unix: GiB/s. svcframe
  by inline ``bytes`` result, by the same result received into the client's buffer (``into``: one round
  trip), by bulk push (the server pushes into a buffer the client exposed once: ahead of its answer, one round
  trip, except over unix at sizes moved by cross-memory attach, where the client reads the server's source
  when asked, a second) and by bulk pull (the server returns a handle on a region it exposes, the client
  pulls it into a reused buffer: two round trips). The raw peer's pull (the data comes with the reply) and
  the msgpack peer's inline result beside them; over unix, at sizes read by cross-memory attach, also
  ``cma copy``: one ``process_vm_readv`` of another process's buffer per read and no message, the most a
  read by one copy between processes gets on this machine (Margo's ``na+sm`` bulk transfers are one such
  copy plus their messages). svcframe's reads by cross-memory attach give their ratio to it.

Servers run in their default progress modes (svcframe and raw: ``spindown``) except in ``client-seq``;
clients in theirs (a client-only engine blocks). Client processes run with ``MALLOC_TUNING`` in their
environment; the 4 MiB inline read over tcp is measured again with glibc's default malloc settings (every
``MALLOC_*`` variable removed), each beside a raw reference run the same way.

Every sample is a run of client processes started once and reused (fed one JSON command per line on stdin,
they connect, warm up, report ready, wait for "go", measure, report). Every setting is sampled ``repeats``
times, interleaved with its raw reference and the other implementations, so drift in the machine's load
reaches all alike: a figure is the median of its samples, with their min-max. Each row's ``ratio_to_raw``
divides its headline figure (``HEADLINE``) by the raw row's of the same setting: for CPU per call and
latency lower is better, for GiB/s higher. On a machine shared with other work, figures are indicative;
``tools/instructions_per_client_call.sh`` gives load-independent instruction counts.

Run one client process by hand: ``python -m selftest.bench_client`` (commands on stdin, see ``serve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Awaitable, Callable
from typing import Any

import psutil

from . import SELFTEST_CONFIG

RAW = "raw uvloop"
MSGPACK = "asyncio+msgpack"
SVCFRAME = "svcframe"
IMPLS = (RAW, MSGPACK, SVCFRAME)
COPY = "cma copy"  # client-read's reference for reads by cross-memory attach (no server: the module's text)
CLIENT_WORKLOADS = ("client-cpu", "client-seq", "client-read")
#: the figure each workload's ratio to raw compares (lower is better for the first two)
HEADLINE = {"client-cpu": "client_cpu_usec_per_call", "client-seq": "p50_usec", "client-read": "gib_per_second"}
#: (server mode, client mode) pairs of the sequential rows: each mode on both sides, and the defaults
#: (a server spins down, a client-only engine blocks)
SEQ_MODES = (("block", "block"), ("spindown", "block"), ("spindown", "spindown"), ("busy", "busy"))
READ_SIZES = (64 * 1024, 4 * 1024 * 1024)
#: how the svcframe client reads: the self-test provider's ``read`` methods, and its inline result received
#: straight into the client's buffer (``call(..., into=buffer)``: one round trip, no allocation)
READ_METHODS = ("inline", "into", "push", "pull")
DEPTH = 32  # client-cpu: noop calls in flight per client process
SPINDOWN_MSEC = 10.0  # svcframe's default spindown window, used by the raw peer too
PROVIDER_ID = 1  # the self-test provider in SELFTEST_CONFIG
#: a 4 MiB inline result is a body of 4 MiB + its bin header: the read clients accept up to 8 MiB
MAX_READ_BODY_BYTES = 8 * 1024 * 1024
#: glibc malloc tuning for the client processes (mallopt(3), "Environment"): buffers up to 32 MiB come from
#: the heap rather than a fresh mmap each, and freed memory stays mapped up to 256 MiB, so a large receive
#: buffer or result freed and allocated again per call is not page-faulted in again each time. Setting
#: either variable also turns off glibc's dynamic mmap threshold.
MALLOC_TUNING = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
MALLOC_SETTINGS = ("tuned", "default")


class BenchClientError(RuntimeError):
    """A client process failed or did not answer in time (the message says which and why)."""


# -- the client process ------------------------------------------------------------------------------------
Operation = Callable[[], Awaitable[Any]]


class RawSide:
    """The raw peer's client: a noop is an echo frame, a read a pull frame answered with the data."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cma_bytes = 0

    @classmethod
    async def open(cls, address: str, mode: str) -> RawSide:
        from .bench_peers import raw_connect

        return cls(await raw_connect(address, spin_msec(mode)))

    def operation(self, op: str, size: int, method: str) -> Operation:
        from .bench_peers import raw_noop_frame, raw_pull_frame

        request = self.client.request
        frame = raw_noop_frame() if op == "noop" else raw_pull_frame(size)
        return lambda: request(frame)

    async def close(self) -> None:
        self.client.transport.close()


class MsgpackSide:
    """The hand-written msgpack RPC's client: ``noop()`` and ``read(size)`` calls."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cma_bytes = 0

    @classmethod
    async def open(cls, address: str, mode: str) -> MsgpackSide:
        from .bench_peers import MsgpackClient

        return cls(await MsgpackClient.connect(address))

    def operation(self, op: str, size: int, method: str) -> Operation:
        call = self.client.call
        if op == "noop":
            return lambda: call("noop")
        return lambda: call("read", size)

    async def close(self) -> None:
        await self.client.close()


class SvcframeSide:
    """A svcframe client: ``work`` (noop) and ``read`` (inline, push, pull) on the self-test provider."""

    def __init__(self, engine: Any, address: str) -> None:
        self.engine = engine
        self.address = address

    @property
    def cma_bytes(self) -> int:
        return int(self.engine.cma_bytes)

    @classmethod
    async def open(cls, address: str, mode: str) -> SvcframeSide:
        from svcframe.engine import Engine

        engine = await Engine(None, progress_mode=mode, max_body_bytes=MAX_READ_BODY_BYTES).start()
        await engine.connection(address)
        return cls(engine, address)

    def operation(self, op: str, size: int, method: str) -> Operation:
        from svcframe.bulk import BulkHandle

        from .provider import work_arg

        engine, address, call = self.engine, self.address, self.engine.call
        if op == "noop":
            arg = work_arg(0, None, None, b"")
            return lambda: call(address, "work", arg, provider_id=PROVIDER_ID)
        if method == "inline":
            arg = [size, "inline", None]
            return lambda: call(address, "read", arg, provider_id=PROVIDER_ID)
        buffer = bytearray(size)  # the client's buffer, reused by every read (as a Mochi client's would be)
        if method == "into":
            arg = [size, "inline", None]
            return lambda: call(address, "read", arg, provider_id=PROVIDER_ID, into=buffer)
        if method == "push":
            arg = [size, "push", engine.expose(buffer, "w", peer=address).to_wire()]
            return lambda: call(address, "read", arg, provider_id=PROVIDER_ID)
        arg = [size, "pull", None]

        async def pull() -> None:
            handle = await call(address, "read", arg, provider_id=PROVIDER_ID)
            await engine.pull(BulkHandle.from_wire(handle), buffer)

        return pull

    async def close(self) -> None:
        await self.engine.close()


#: The source of ``cma copy``: a process holding ``size`` bytes, which prints their address and waits.
_COPY_SOURCE = (
    "import ctypes, sys; b = ctypes.create_string_buffer(b'Z' * {size}, {size}); "
    "print(ctypes.addressof(b), flush=True); sys.stdin.read()"
)


class CopySide:
    """``cma copy``: a read is one ``process_vm_readv`` of another process's buffer into ours, no message."""

    def __init__(self) -> None:
        self.cma_bytes = 0
        self.source: subprocess.Popen[bytes] | None = None

    @classmethod
    async def open(cls, address: str, mode: str) -> CopySide:
        return cls()  # (no server: the source is a process of ours, started by ``operation``)

    def operation(self, op: str, size: int, method: str) -> Operation:
        from svcframe import cma

        self.source = source = subprocess.Popen(
            [sys.executable, "-c", _COPY_SOURCE.format(size=size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert source.stdout is not None
        address = int(source.stdout.readline())
        view = memoryview(bytearray(size))  # reused by every read, as the other clients' buffers are
        read, pid = cma.read, source.pid

        async def copy() -> None:
            read(pid, address, view)
            self.cma_bytes += size

        return copy

    async def close(self) -> None:
        if self.source is not None:
            self.source.communicate()  # (its stdin closed: it exits)


SIDES: dict[str, Any] = {RAW: RawSide, MSGPACK: MsgpackSide, SVCFRAME: SvcframeSide, COPY: CopySide}


def spin_msec(mode: str) -> float:
    """The raw peer's polling window for a svcframe progress mode (``bench_peers.peer_progress``)."""
    return {"block": 0.0, "spindown": SPINDOWN_MSEC, "busy": float("inf")}[mode]


async def timed(operation: Operation, depth: int, seconds: float, latencies: bool) -> dict[str, Any]:
    """Run ``operation`` for ``seconds`` with ``depth`` in flight: calls, elapsed seconds, this process's CPU
    seconds (user + system) and minor page faults (memory mapped in afresh) and, with ``latencies``, p50 / p99
    µs."""
    perf = time.perf_counter
    lat = array("d")
    calls = 0
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu0 = time.process_time()
    start = perf()
    end = start + seconds

    async def worker() -> None:
        nonlocal calls
        append = lat.append
        while True:
            t0 = perf()
            if t0 >= end:
                return
            await operation()
            if latencies:
                append(perf() - t0)
            calls += 1

    if depth == 1:
        await worker()
    else:
        await asyncio.gather(*(worker() for _ in range(depth)))
    elapsed = perf() - start
    out: dict[str, Any] = {
        "calls": calls, "elapsed_seconds": elapsed, "cpu_seconds": time.process_time() - cpu0,
        "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0,
    }  # fmt: skip
    if latencies and lat:
        ordered = sorted(lat)
        out["p50_usec"] = ordered[len(ordered) // 2] * 1e6
        out["p99_usec"] = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6
    return out


def serve() -> None:
    """The client process: for each JSON command on stdin, reply ``{"ready": true}`` once connected and warmed
    up, wait for a ``go`` line, measure, reply with the figures (or ``{"error": ...}`` at any step).

    A command: ``{"impl", "address", "core", "mode", "op": "noop"|"read", "depth", "seconds", "size",
    "method"}``; the reply: ``timed``'s figures plus ``cma_bytes`` (bulk bytes moved by cross-memory attach).
    """
    from svcframe.loops import loop_factory

    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            os.sched_setaffinity(0, [cmd["core"]])
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                side, operation = runner.run(_prepare(cmd))
                try:
                    _reply({"ready": True})
                    if sys.stdin.readline().strip() != "go":
                        return
                    cma0 = side.cma_bytes
                    out = runner.run(timed(operation, cmd["depth"], cmd["seconds"], cmd["depth"] == 1))
                    out["cma_bytes"] = side.cma_bytes - cma0
                finally:
                    runner.run(side.close())
        except Exception as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        _reply(out)


async def _prepare(cmd: dict[str, Any]) -> tuple[Any, Operation]:
    side = await SIDES[cmd["impl"]].open(cmd["address"], cmd["mode"])
    try:
        operation = side.operation(cmd["op"], cmd.get("size", 0), cmd.get("method", "inline"))
        warmup = 50 if cmd["op"] == "noop" else max(3, (1 << 20) // max(cmd["size"], 1))
        for _ in range(warmup):  # warm up: connection, caches, buffers
            await operation()
    except BaseException:
        await side.close()
        raise
    return side, operation


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# -- the bench's side: client processes -------------------------------------------------------------------
def client_environment(malloc: str) -> dict[str, str]:
    """This process's environment for a client process: with ``MALLOC_TUNING`` ("tuned"), or with every glibc
    malloc setting removed ("default")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    if malloc == "tuned":
        env.update(MALLOC_TUNING)
    return env


class ClientProcess:
    """A ``python -m selftest.bench_client`` process, fed commands; its stderr goes to a temporary file whose
    tail is quoted when it fails."""

    def __init__(self, env: dict[str, str]) -> None:
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __spec__.name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, env=env, text=True, bufsize=1,
        )  # fmt: skip

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout_seconds: float) -> dict[str, Any]:
        """The next reply line. Raises BenchClientError on a reported error, an exit or a timeout."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_seconds)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            why = f"exited with code {self.proc.poll()}" if ready else f"no answer within {timeout_seconds:g} s"
            raise BenchClientError(f"bench client process {self.proc.pid} {why}{self._log_tail()}")
        out: dict[str, Any] = json.loads(line)
        if "error" in out:
            raise BenchClientError(f"bench client process {self.proc.pid}: {out['error']}")
        return out

    def _log_tail(self) -> str:
        self.log.seek(0)
        tail = self.log.read().decode(errors="replace").strip().splitlines()[-10:]
        return (":\n" + "\n".join(tail)) if tail else ""

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


def sample(clients: list[ClientProcess], commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One sample: every client connects and warms up, then all measure together (a barrier, not a sleep)."""
    for client, cmd in zip(clients, commands, strict=True):
        client.send(json.dumps(cmd))
    for client in clients:
        client.answer(120.0)
    for client in clients:
        client.send("go")
    return [client.answer(cmd["seconds"] + 120.0) for client, cmd in zip(clients, commands, strict=True)]


# -- the bench's side: servers, samples, rows ---------------------------------------------------------------
class ClientBench:
    """Servers, client processes and an admin engine for the client rows; close() ends them all.

    Args:
        seconds: the total measuring time of a setting, split over ``repeats`` interleaved samples.
        repeats: samples per setting.
        server_core: the core every server is pinned to.
        client_cores: the cores of the client processes (``client-cpu``: one per core; the others: the first).
    """

    def __init__(self, seconds: float, repeats: int, server_core: int, client_cores: list[int]) -> None:
        from svcframe.engine import Engine
        from svcframe.loops import loop_factory

        self.sample_seconds = seconds / repeats
        self.repeats = repeats
        self.server_core = server_core
        self.client_cores = client_cores
        self.tmp = tempfile.mkdtemp(prefix="sfbc", dir="/tmp")  # unix socket paths stay short
        self.stack = contextlib.ExitStack()
        self.servers: dict[tuple[str, str, str], tuple[str, int]] = {}  # (impl, transport, mode) -> address, pid
        self.clients: dict[str, list[ClientProcess]] = {m: [] for m in MALLOC_SETTINGS}
        self.server_modes: dict[str, str] = {}  # svcframe server address -> its progress mode now
        self.runner = self.stack.enter_context(asyncio.Runner(loop_factory=loop_factory()))
        self.admin = Engine(None)  # sets the svcframe servers' progress modes (the bench's secret)
        self.runner.run(self.admin.start())
        self.stack.callback(lambda: self.runner.run(self.admin.close()))

    def close(self) -> None:
        for clients in self.clients.values():
            for client in clients:
                client.close()
        self.stack.close()
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> ClientBench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # servers and clients, started on first use
    def server(self, impl: str, transport: str, mode: str = "spindown") -> tuple[str, int]:
        """The address and pid of ``impl``'s server over ``transport``; svcframe's one server changes its
        progress mode live, the raw peer has one server per mode, the msgpack peer's always blocks."""
        key = (impl, transport, mode if impl == RAW else "")
        if key not in self.servers:
            unix = f"{self.tmp}/{len(self.servers)}.sock" if transport == "unix" else None
            if impl == SVCFRAME:
                from svcframe.config import load_config
                from svcframe.launch import Launch

                cfg = load_config(SELFTEST_CONFIG)
                if unix:
                    cfg.engine.address = f"unix://{unix}"
                member = self.stack.enter_context(Launch(cfg, 1, cores=[self.server_core])).members[0]
                if member.pid is None:  # a local launch knows its processes
                    raise BenchClientError(f"no pid for the svcframe server at {member.address}")
                self.servers[key] = (member.address, member.pid)
                self.server_modes[member.address] = cfg.engine.progress_mode
            else:
                from .bench_peers import PeerServer

                kind = "raw" if impl == RAW else "msgpack"
                spin = spin_msec(mode) if impl == RAW else 0.0
                peer = self.stack.enter_context(PeerServer(kind, self.server_core, unix, spin))
                self.servers[key] = (peer.address, peer.pid)
        return self.servers[key]

    def set_server_mode(self, address: str, mode: str) -> None:
        from svcframe.admin import ServiceHandle

        if self.server_modes[address] != mode:
            self.runner.run(ServiceHandle(self.admin, address).set_progress(mode))
            self.server_modes[address] = mode

    def client_processes(self, n: int, malloc: str = "tuned") -> list[ClientProcess]:
        pool = self.clients[malloc]
        while len(pool) < n:
            pool.append(ClientProcess(client_environment(malloc)))
        return pool[:n]

    def run(self, impl: str, transport: str, cmd: dict[str, Any], *, server_mode: str = "spindown",
            cores: list[int], malloc: str = "tuned") -> dict[str, Any]:  # fmt: skip
        """One sample of ``cmd`` on one client process per core of ``cores``, against ``impl``'s server in
        ``server_mode``: the sample's figures (summed over the processes) and the server's CPU time."""
        address, pid = self.server(impl, transport, server_mode) if impl != COPY else ("", os.getpid())
        if impl == SVCFRAME:
            self.set_server_mode(address, server_mode)
        clients = self.client_processes(len(cores), malloc)
        commands = [{**cmd, "impl": impl, "address": address, "core": c, "seconds": self.sample_seconds} for c in cores]
        server = psutil.Process(pid)
        cpu0, wall0 = _cpu_seconds(server), time.monotonic()
        outs = sample(clients, commands)
        server_cpu, wall = _cpu_seconds(server) - cpu0, time.monotonic() - wall0
        if impl == SVCFRAME and server_mode == "busy":
            self.set_server_mode(address, "spindown")  # a busy server would spin through the next samples
        calls = sum(o["calls"] for o in outs)
        figures = {
            "ops_per_second": sum(o["calls"] / o["elapsed_seconds"] for o in outs),
            "client_cpu_usec_per_call": sum(o["cpu_seconds"] for o in outs) / max(calls, 1) * 1e6,
            "client_faults_per_call": sum(o["minor_faults"] for o in outs) / max(calls, 1),
            "server_cpu_usec_per_call": server_cpu / max(calls, 1) * 1e6 if impl != COPY else 0.0,
            "server_utilization": server_cpu / wall if impl != COPY else 0.0,
            "cma_bytes": sum(o["cma_bytes"] for o in outs),
        }
        if "size" in cmd:
            figures["gib_per_second"] = figures["ops_per_second"] * cmd["size"] / 2**30
        for key in ("p50_usec", "p99_usec"):
            if key in outs[0]:
                figures[key] = outs[0][key]
        return figures

    # the workloads
    def cpu_rows(self) -> list[dict[str, Any]]:
        settings: list[tuple[str, dict[str, Any]]] = [(impl, {}) for impl in IMPLS]
        cmd = {"op": "noop", "depth": DEPTH, "mode": "block"}
        return self._rows("client-cpu", settings, lambda impl, s: self.run(impl, "tcp", cmd, cores=self.client_cores))

    def seq_rows(self) -> list[dict[str, Any]]:
        placements = {"same core": self.server_core}
        if self.client_cores[0] != self.server_core:
            placements["own cores"] = self.client_cores[0]
        settings = []
        for placement in placements:
            for server_mode, client_mode in SEQ_MODES:
                modes = {"placement": placement, "server_mode": server_mode, "client_mode": client_mode}
                settings += [(RAW, modes), (SVCFRAME, modes)]
            settings.append((MSGPACK, {"placement": placement, "server_mode": "block", "client_mode": "block"}))

        def one(impl: str, s: dict[str, Any]) -> dict[str, Any]:
            cmd = {"op": "noop", "depth": 1, "mode": s["client_mode"]}
            return self.run(impl, "tcp", cmd, server_mode=s["server_mode"], cores=[placements[s["placement"]]])

        return self._rows("client-seq", settings, one)

    def read_rows(self) -> list[dict[str, Any]]:
        from svcframe.cma import CMA_MIN_BYTES

        settings = []
        for transport in ("tcp", "unix"):
            for size in READ_SIZES:
                where = {"transport": transport, "size": size, "malloc": "tuned"}
                settings += [(RAW, {**where, "method": "inline"}), (MSGPACK, {**where, "method": "inline"})]
                settings += [(SVCFRAME, {**where, "method": m}) for m in READ_METHODS]
                if transport == "unix" and size >= CMA_MIN_BYTES:
                    settings.append((COPY, {**where, "method": "inline"}))
        where = {"transport": "tcp", "size": READ_SIZES[-1], "malloc": "default", "method": "inline"}
        settings += [(impl, where) for impl in IMPLS]

        def one(impl: str, s: dict[str, Any]) -> dict[str, Any]:
            cmd = {"op": "read", "depth": 1, "mode": "block", "size": s["size"], "method": s["method"]}
            return self.run(impl, s["transport"], cmd, cores=self.client_cores[:1], malloc=s["malloc"])

        rows = self._rows("client-read", settings, one)
        tuned = {(r["impl"], r["transport"], r["size"], r["method"]): r for r in rows if r["malloc"] == "tuned"}
        for r in rows:
            base = tuned.get((r["impl"], r["transport"], r["size"], r["method"]))
            if r["malloc"] == "default" and base is not None:
                r["ratio_to_tuned"] = r["gib_per_second"] / base["gib_per_second"]
            copy = tuned.get((COPY, r["transport"], r["size"], "inline"))
            if copy is not None and r["cma_bytes"] and r["malloc"] == "tuned":
                r["ratio_to_copy"] = r["gib_per_second"] / copy["gib_per_second"]
        return rows

    def _rows(
        self,
        workload: str,
        settings: list[tuple[str, dict[str, Any]]],
        one: Callable[[str, dict[str, Any]], dict[str, Any]],
    ) -> list[dict[str, Any]]:
        """``repeats`` rounds of one sample per setting (interleaved), then one row per setting: the median
        of each figure, the min-max of the headline figure, and the samples."""
        samples: list[list[dict[str, Any]]] = [[] for _ in settings]
        for _ in range(self.repeats):
            for i, (impl, setting) in enumerate(settings):
                samples[i].append(one(impl, setting))
        headline = HEADLINE[workload]
        rows = []
        for (impl, setting), xs in zip(settings, samples, strict=True):
            row: dict[str, Any] = {"workload": workload, "impl": impl, **setting}
            row.update({k: statistics.median(x[k] for x in xs) for k in xs[0]})
            row[f"min_{headline}"] = min(x[headline] for x in xs)
            row[f"max_{headline}"] = max(x[headline] for x in xs)
            row["samples"] = xs
            rows.append(row)
        return rows


def _cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def bench_client(
    workloads: tuple[str, ...], seconds: float, repeats: int, server_core: int, client_cores: list[int]
) -> list[dict[str, Any]]:
    """The rows of the client ``workloads`` (of ``CLIENT_WORKLOADS``), in that order."""
    rows: list[dict[str, Any]] = []
    with ClientBench(seconds, repeats, server_core, client_cores) as bench:
        if "client-cpu" in workloads:
            rows += bench.cpu_rows()
        if "client-seq" in workloads:
            rows += bench.seq_rows()
        if "client-read" in workloads:
            rows += bench.read_rows()
    return rows


# -- the tables ---------------------------------------------------------------------------------------------
Table = tuple[str, tuple[str, ...], list[tuple[str, ...]]]  # title, column headers, rows of cells
#: columns of words (aligned left); the others hold figures (aligned right)
TEXT_COLUMNS = ("implementation", "setting", "progress", "cores", "over", "latency", "server", "cma")


def spread(r: dict[str, Any], key: str, unit: str) -> str:
    """The median ``r[key]`` and the (min-max) of its samples in one notation: ``24.3 µs (23.1-25.0 µs)``."""
    from svcframe.units import quantity, quantity_range  # here: a client process loads no svcframe it does not use

    return f"{quantity(r[key], unit)} ({quantity_range(r[f'min_{key}'], r[f'max_{key}'], unit)})"


def ratio_cell(r: dict[str, Any]) -> str:
    """The row's ratio to raw, or ``-`` when it has none."""
    return f"{r['ratio_to_raw']:.2f}" if "ratio_to_raw" in r else "-"


def tables(workload: str, rows: list[dict[str, Any]]) -> list[Table]:
    """The tables of one client workload's rows (medians, with the (min-max) of the samples; figures in one
    notation, ``svcframe.units``), each within 80 columns on a terminal: ``client-read`` gives two, the reads
    with the tuned and with glibc's default malloc settings."""
    from svcframe.units import quantity

    cells: list[tuple[str, ...]]
    if workload == "client-cpu":
        cells = [
            (r["impl"], spread(r, "client_cpu_usec_per_call", "usec"), quantity(r["ops_per_second"], "ops/s"),
             f"{quantity(r['server_cpu_usec_per_call'], 'usec')} ({100 * r['server_utilization']:.0f}%)",
             ratio_cell(r))
            for r in rows
        ]  # fmt: skip
        title = (
            f"client-cpu: client CPU per noop call, {DEPTH} in flight per client process (ratio: CPU per call "
            "over raw's, lower is better; server: its CPU per call and how busy it was)"
        )
        return [(title, ("implementation", "CPU/call", "ops/s", "server", "ratio"), cells)]
    if workload == "client-seq":
        cells = [
            (r["impl"], r["placement"].split()[0], f"{r['server_mode']}/{r['client_mode']}",
             spread(r, "p50_usec", "usec"), quantity(r["p99_usec"], "usec"), ratio_cell(r))
            for r in rows
        ]  # fmt: skip
        title = (
            "client-seq: sequential noop calls (cores: client on the server's core or its own; progress: "
            "server/client mode; ratio: p50 over raw's, lower is better)"
        )
        return [(title, ("implementation", "cores", "progress", "p50", "p99", "ratio"), cells)]
    out: list[Table] = []
    for malloc in MALLOC_SETTINGS:
        cells = []
        for r in (r for r in rows if r["malloc"] == malloc):
            impl = f"{r['impl']} {r['method']}" if r["impl"] == SVCFRAME else r["impl"]
            over = f"{r['transport']} {quantity(r['size'], 'B')}"
            row: list[str] = [impl, over, spread(r, "gib_per_second", "GiB/s"), ratio_cell(r)]
            row.append(f"{r['client_faults_per_call']:.0f}")
            if malloc == "default":
                row.append(f"{r['ratio_to_tuned']:.2f}")
            else:
                row.append(f"{r['ratio_to_copy']:.2f}" if "ratio_to_copy" in r else "cma" if r["cma_bytes"] else "-")
            cells.append(tuple(row))
        if cells:
            last = "cma" if malloc == "tuned" else "of tuned"
            legend = (
                "cma: by cross-memory attach, over cma copy's bandwidth" if malloc == "tuned"
                else "of tuned: over the tuned figure"
            )  # fmt: skip
            title = (
                f"client-read: reads, client with {malloc} malloc settings (ratio: over raw's; pf: the "
                f"client's page faults per read; {legend})"
            )
            out.append((title, ("implementation", "over", "bandwidth", "ratio", "pf", last), cells))
    return out


if __name__ == "__main__":
    serve()
