"""``svcframe bench``: svcframe against the raw uvloop limit (and other Python RPC stacks), in one run.

Workloads (server process pinned to one core, clients on the others; loopback):

* ``seq``: one client, one outstanding noop call: ops/s, p50 and p99 µs; svcframe in every progress
  mode (server and client switched together), the raw echo in block mode (a plain asyncio loop).
* ``sat``: blaster processes (raw sockets, pre-encoded requests, ``sat_depth`` in flight each) saturate
  the server: aggregate ops/s, the server's CPU µs per call (from its process CPU time, psutil) and its
  CPU utilisation, so an under-driven server is visible.
* ``bulk``: pull and push of 64 KiB and 4 MiB over tcp and unix sockets: GiB/s (median of interleaved
  samples, with their range), next to the raw uvloop peer and polled plain sockets (the machine) moving
  the same bytes the same way; ratios to raw of the same transport and size, and unix / tcp.
* ``overhead``: the ``sat`` noop rate with monitoring off, default (statistics) and full tracing.
* ``client-cpu``, ``client-seq``, ``client-read`` (``client`` for the three): the client path, its CPU per
  call, sequential latency on shared and own cores, and reads by inline result, bulk push and bulk pull
  (``selftest/bench_client.py``).

Every figure is also given as a ratio to the raw limit measured in the same run. Results go to a JSON
file. No figure here is a pass/fail test: speed targets are read from this output.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import psutil

from svcframe.config import load_config
from svcframe.launch import Launch, usable_cores
from svcframe.progress import PROGRESS_MODES
from svcframe.units import quantity

from . import SELFTEST_CONFIG
from .bench_client import (
    CLIENT_WORKLOADS,
    HEADLINE,
    TEXT_COLUMNS,
    Table,
    bench_client,
    ratio_cell,
    spread,
    tables,
)
from .bench_peers import PeerServer, raw_connect, raw_noop_frame, raw_pull_frame, raw_push_header
from .driver import SelftestParams, environment, latency_summary
from .provider import DIRECTIONS

BULK_SIZES = (64 * 1024, 4 * 1024 * 1024)
#: What ``svcframe bench`` measures: sequential calls (every progress mode), a saturated server, bulk
#: transfers, the cost of monitoring, and the client (``bench_client``).
WORKLOADS = ("seq", "sat", "bulk", "overhead", *CLIENT_WORKLOADS)
#: names that stand for several workloads
WORKLOAD_GROUPS = {"client": CLIENT_WORKLOADS}


def expand_workloads(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``names`` with groups (``client``) expanded, in ``WORKLOADS`` order.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    wanted: set[str] = set()
    for name in names:
        if name not in WORKLOADS and name not in WORKLOAD_GROUPS:
            raise ValueError(
                f"unknown bench workload {name!r}; choose from {', '.join((*WORKLOADS, *WORKLOAD_GROUPS))}"
            )
        wanted.update(WORKLOAD_GROUPS.get(name, (name,)))
    return tuple(w for w in WORKLOADS if w in wanted)


@dataclass
class BenchOptions:
    quick: bool = False
    seconds: float = 3.0
    sat_clients: int = 2
    sat_depth: int = 32
    bulk_repeats: int = 5  # interleaved rounds per bulk setting (2 with --quick)
    bulk_seconds: float | None = None  # measuring time per bulk setting, over its rounds (None: ``seconds``)
    client_repeats: int = 5  # interleaved samples per client setting (2 with --quick)
    client_seconds: float | None = None  # measuring time per client setting, over its samples (None: ``seconds``)
    workloads: tuple[str, ...] = WORKLOADS
    peers: tuple[str, ...] = ("raw", "zmq", "grpc")

    def __post_init__(self) -> None:
        self.workloads = expand_workloads(self.workloads)
        if self.quick:
            self.seconds = min(self.seconds, 0.6)
            self.bulk_repeats = min(self.bulk_repeats, 2)
            self.bulk_seconds = min(self.bulk_seconds or 0.2, 0.2)
            self.client_repeats = min(self.client_repeats, 2)
            self.client_seconds = min(self.client_seconds or 0.2, 0.2)


def _cores() -> tuple[int, list[int]]:
    cores = usable_cores()
    if len(cores) < 2:
        return cores[0], cores
    return cores[0], cores[1:]


def _cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _row(workload: str, impl: str, **values: Any) -> dict[str, Any]:
    return {"workload": workload, "impl": impl, **values}


# -- seq ----------------------------------------------------------------------------------------------------
async def _timed_loop(call: Any, seconds: float) -> dict[str, Any]:
    for _ in range(200):
        await call()
    lat = []
    perf = time.perf_counter
    start = perf()
    end = start + seconds
    while True:
        t0 = perf()
        if t0 >= end:
            break
        await call()
        lat.append(perf() - t0)
    elapsed = perf() - start
    summary = latency_summary([x * 1e6 for x in lat])
    return {"ops_per_second": len(lat) / elapsed, "p50_usec": summary["p50"], "p99_usec": summary["p99"]}


def bench_seq(opts: BenchOptions, server_core: int) -> list[dict[str, Any]]:
    from svcframe.admin import ServiceHandle
    from svcframe.engine import Engine
    from svcframe.loops import run

    rows = []
    with PeerServer("raw", server_core) as raw:

        async def raw_seq() -> dict[str, Any]:
            client = await raw_connect(raw.address)
            frame = raw_noop_frame()
            out = await _timed_loop(lambda: client.request(frame), opts.seconds)
            client.transport.close()
            return out

        rows.append(_row("seq", "raw uvloop echo", mode="block", **run(raw_seq())))
    cfg = load_config(SELFTEST_CONFIG)
    with Launch(cfg, 1, cores=[server_core]) as job:
        address, pid = job.members[0].address, job.members[0].pid
        assert pid is not None  # a launched member reports its pid with its readiness

        async def sf_seq(mode: str) -> dict[str, Any]:
            async with Engine(None, progress_mode=mode) as engine:
                await ServiceHandle(engine, address).set_progress(mode)
                arg = [0, None, None, b""]
                return await _timed_loop(lambda: engine.call(address, "work", arg, provider_id=1), opts.seconds)

        for mode in PROGRESS_MODES:
            rows.append(_row("seq", "svcframe", mode=mode, **run(sf_seq(mode))))
    rows += _seq_optional(opts, server_core)
    return rows


def _seq_optional(opts: BenchOptions, server_core: int) -> list[dict[str, Any]]:
    from svcframe.loops import run

    rows = []
    if "zmq" in opts.peers and _importable("zmq"):
        with PeerServer("zmq", server_core) as srv:

            async def zmq_seq() -> dict[str, Any]:
                import msgpack
                import zmq
                import zmq.asyncio

                ctx = zmq.asyncio.Context()
                sock = ctx.socket(zmq.DEALER)
                sock.connect(srv.address)
                body = msgpack.packb(None)

                async def call() -> None:
                    await sock.send(body)
                    msgpack.unpackb(await sock.recv())

                try:
                    return await _timed_loop(call, opts.seconds)
                finally:
                    sock.close(0)
                    ctx.term()

            rows.append(_row("seq", "pyzmq + msgpack", mode="block", **run(zmq_seq(), "asyncio")))
    if "grpc" in opts.peers and _importable("grpc"):
        with PeerServer("grpc", server_core) as srv:

            async def grpc_seq() -> dict[str, Any]:
                import grpc

                async with grpc.aio.insecure_channel(srv.address) as channel:
                    noop = channel.unary_unary("/bench.Bench/Noop")
                    return await _timed_loop(lambda: noop(b""), opts.seconds)

            rows.append(_row("seq", "grpcio asyncio unary", mode="block", **run(grpc_seq(), "asyncio")))
    return rows


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


# -- sat ----------------------------------------------------------------------------------------------------
def bench_sat(opts: BenchOptions, server_core: int, client_cores: list[int]) -> list[dict[str, Any]]:
    """Both servers driven by the same blaster processes (raw sockets, pre-encoded frames), so the
    server is the bottleneck; its CPU µs per call comes from its own CPU time over the window."""
    rows = []
    with PeerServer("raw", server_core) as raw:
        rows.append(_row("sat", "raw uvloop echo", **_saturate("raw", raw.address, raw.pid, opts, client_cores)))
    with Launch(load_config(SELFTEST_CONFIG), 1, cores=[server_core]) as job:
        member = job.members[0]
        assert member.pid is not None  # a launched member reports its pid with its readiness
        rows.append(_row("sat", "svcframe", **_saturate("svcframe", member.address, member.pid, opts, client_cores)))
    return rows


def _saturate(kind: str, address: str, pid: int, opts: BenchOptions, client_cores: list[int]) -> dict[str, float]:
    from .bench_peers import blast

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(opts.sat_clients + 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=blast,
            args=(kind, address, opts.sat_depth, opts.seconds, client_cores[i % len(client_cores)], barrier, out),
        )
        for i in range(opts.sat_clients)
    ]
    for p in procs:
        p.start()
    barrier.wait(60)
    cpu0, t0 = _cpu_seconds(pid), time.monotonic()
    total = sum(out.get(timeout=opts.seconds + 60) for _ in procs)
    cpu1, t1 = _cpu_seconds(pid), time.monotonic()
    for p in procs:
        p.join()
    return {
        "ops_per_second": total / (t1 - t0),
        "server_cpu_usec_per_call": (cpu1 - cpu0) / total * 1e6,
        "server_utilization": (cpu1 - cpu0) / (t1 - t0),
    }


# -- bulk ---------------------------------------------------------------------------------------------------
# svcframe's directions are the self-test provider's: in a "pull" the server reads the client's buffer (data
# flows client -> server), in a "push" it writes into it (server -> client). The reference peers move the
# same bytes the same way: their client pushes for svcframe's pull, and pulls for its push.
FLOW = {"pull": "c→s", "push": "s→c"}  # the data: client -> server, server -> client
PEER_OP = {"pull": "push", "push": "pull"}
RAW_BULK = "raw uvloop stream"
BLOCK_BULK = "machine (polled)"  # plain non-blocking sockets polled in a loop: the machine's limit


def bench_bulk(opts: BenchOptions, server_core: int, client_cores: list[int]) -> list[dict[str, Any]]:
    """svcframe, the raw uvloop peer and plain sockets, interleaved: each (transport, size, direction) is
    measured ``bulk_repeats`` times in rounds of one sample per implementation (``bulk_seconds`` split over
    the rounds), so drift in the machine's load reaches all three alike; the median is the figure. A short
    first round is not kept: the first use of large buffers in a process can stall for up to hundreds of
    ms (fresh memory behind the new pages of a VM), whatever the implementation.

    Same conditions for all: every client (this process for the peers, the self-test's client process
    for svcframe, started once: ``selftest/pool.py``) on the same client core, every server on
    ``server_core``, one request at a time, and no sleeping in ``epoll_wait`` between messages: svcframe's
    server and client run in ``spindown`` progress mode, the raw peer polls as long after each message,
    the plain sockets are polled (non-blocking). On a VM, waking an idle core costs tens of µs per message,
    depending on what else runs there: a peer that sleeps measures the scheduler, not the transport.
    """
    from svcframe.loops import run

    from .bench_peers import block_bulk
    from .pool import ClientPool

    rows = []
    tmp = tempfile.mkdtemp(prefix="sfb", dir="/tmp")
    sample = (opts.bulk_seconds or opts.seconds) / opts.bulk_repeats
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, client_cores[:1])  # the self-test pins its client there too
    pool = ClientPool(1).start()
    try:
        for transport in ("tcp", "unix"):
            cfg = load_config(SELFTEST_CONFIG)
            unix = {k: f"{tmp}/{k}.sock" if transport == "unix" else None for k in ("raw", "block", "sf")}
            if transport == "unix":
                cfg.engine.address = f"unix://{unix['sf']}"
            spin = cfg.engine.progress_spindown_msec  # svcframe's server (and client) poll this long
            with (
                PeerServer("raw", server_core, unix=unix["raw"], spindown_msec=spin) as raw,
                PeerServer("block", server_core, unix=unix["block"], spindown_msec=spin) as block,
                Launch(cfg, 1, cores=[server_core]) as job,
            ):
                for size in BULK_SIZES:
                    for direction in DIRECTIONS:
                        params = SelftestParams(
                            workload="bulk", bulk_size=size, bulk_direction=direction, clients=1,
                            duration_seconds=sample, client_cores=client_cores[:1], warmup_iterations=20,
                        )  # fmt: skip
                        samples: dict[str, list[float]] = {RAW_BULK: [], BLOCK_BULK: [], "svcframe": []}
                        op = PEER_OP[direction]
                        for i in range(opts.bulk_repeats + 1):  # round 0: a short warm-up round, not kept
                            t = sample if i else min(sample, 0.1)
                            raw_gib = run(_raw_bulk(raw.address, size, op, t, spindown_msec=spin))
                            block_gib = block_bulk(block.address, size, op, t, 20, poll=True)
                            p = params.model_copy(update={"duration_seconds": t})
                            sf_gib = pool.run(p, [job.members[0].address])["aggregate"]["bandwidth_gib_per_second"]
                            if i:
                                samples[RAW_BULK].append(raw_gib)
                                samples[BLOCK_BULK].append(block_gib)
                                samples["svcframe"].append(sf_gib)
                        for impl, xs in samples.items():
                            rows.append(_row("bulk", impl, transport=transport, size=size, direction=direction,
                                             flow=FLOW[direction], **_spread(xs)))  # fmt: skip
    finally:
        pool.close()
        os.sched_setaffinity(0, saved)
    return rows


def _spread(samples: list[float]) -> dict[str, Any]:
    return {
        "gib_per_second": float(np.median(samples)),
        "min_gib_per_second": min(samples),
        "max_gib_per_second": max(samples),
        "samples": samples,
    }


async def _raw_bulk(
    address: str, size: int, op: str, seconds: float, warmup: int = 20, spindown_msec: float = 0.0
) -> float:
    """The raw peer's client ``op`` ("pull": ask for ``size`` bytes; "push": send them), one at a time:
    GiB/s. Replies land in the client's receive buffer in place; a push leaves as header + memoryview of
    the data in one ``writelines``. The timed loop does nothing else."""
    client = await raw_connect(address, spindown_msec)
    try:
        if op == "pull":
            parts: tuple[bytes | memoryview, ...] = (raw_pull_frame(size),)
        else:
            data = memoryview(bytearray(os.urandom(1 << 16) * (size // (1 << 16) + 1)))[:size]
            parts = (raw_push_header(size), data)
        request = client.request
        for _ in range(warmup):
            await request(*parts)
        n = 0
        perf = time.perf_counter
        start = perf()
        end = start + seconds
        while perf() < end:
            await request(*parts)
            n += 1
        elapsed = perf() - start
    finally:
        client.transport.close()
    return n * size / elapsed / 2**30


# -- monitoring overhead -------------------------------------------------------------------------------------
def bench_overhead(opts: BenchOptions, server_core: int, client_cores: list[int]) -> list[dict[str, Any]]:
    """Saturated noop rate (blaster clients, so the server is the bottleneck) with monitoring off, default
    (statistics on) and full tracing, on one server.

    Each setting is measured ``repeats`` times, interleaved, and the median kept, so drift in the
    machine's load does not favour one setting.
    """
    from svcframe.admin import ServiceHandle
    from svcframe.engine import Engine
    from svcframe.loops import run

    settings = {"off": (False, False), "default": (True, False), "tracing": (True, True)}
    rates: dict[str, list[float]] = {k: [] for k in settings}
    with Launch(load_config(SELFTEST_CONFIG), 1, cores=[server_core]) as job:
        address, pid = job.members[0].address, job.members[0].pid
        assert pid is not None  # a launched member reports its pid with its readiness

        async def configure(enabled: bool, tracing: bool) -> None:
            async with Engine(None) as engine:
                await ServiceHandle(engine, address).patch_config([
                    {"op": "replace", "path": "/engine/monitoring/enabled", "value": enabled},
                    {"op": "replace", "path": "/engine/monitoring/tracing", "value": tracing},
                ])  # fmt: skip

        repeats = 1 if opts.quick else 3
        for _ in range(repeats):
            for name, (enabled, tracing) in settings.items():
                run(configure(enabled, tracing))
                sat = _saturate("svcframe", address, pid, opts, client_cores)  # server-bound
                rates[name].append(sat["ops_per_second"])
    base = float(np.median(rates["off"]))
    return [
        _row(
            "overhead",
            f"svcframe, monitoring {name}",
            ops_per_second=float(np.median(r)),
            ratio_to_off=float(np.median(r)) / base,
            samples=r,
        )
        for name, r in rates.items()
    ]


# -- the run ------------------------------------------------------------------------------------------------
def bench_steps(workloads: tuple[str, ...]) -> list[str]:
    """The steps :func:`run_bench` takes for ``workloads`` (expanded, ``WORKLOADS`` order), in order: each
    server workload, then ``client`` once for the client ones (they share their servers and clients)."""
    server = [w for w in workloads if w not in CLIENT_WORKLOADS]
    return server + (["client"] if any(w in CLIENT_WORKLOADS for w in workloads) else [])


def run_bench(opts: BenchOptions, on_step: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Run the selected workloads; return ``{"kind", "options", "environment", "rows", "wall_seconds"}``.
    ``on_step(description, done, total)`` is called before each step of :func:`bench_steps` (progress display):
    ``done`` steps of ``total`` are complete."""
    server_core, client_cores = _cores()
    original_affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, client_cores)  # this process is the seq/bulk client (restored at the end)
    try:
        return _run_bench(opts, server_core, client_cores, on_step or (lambda description, done, total: None))
    finally:
        os.sched_setaffinity(0, original_affinity)


def _run_bench(
    opts: BenchOptions, server_core: int, client_cores: list[int], on_step: Callable[[str, int, int], None]
) -> dict[str, Any]:
    # The bench's servers are its own: it reconfigures them (progress mode, monitoring), which needs an
    # authenticated connection. Servers and clients it starts inherit this secret.
    os.environ.setdefault("SVCFRAME_SECRET", secrets.token_hex(16))
    client = tuple(w for w in opts.workloads if w in CLIENT_WORKLOADS)
    steps: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "seq": lambda: bench_seq(opts, server_core),
        "sat": lambda: bench_sat(opts, server_core, client_cores),
        "bulk": lambda: bench_bulk(opts, server_core, client_cores),
        "overhead": lambda: bench_overhead(opts, server_core, client_cores),
        "client": lambda: bench_client(
            client, opts.client_seconds or opts.seconds, opts.client_repeats, server_core, client_cores
        ),
    }
    rows: list[dict[str, Any]] = []
    wall_seconds = {}  # what each step took, servers and clients included
    chosen = bench_steps(opts.workloads)
    for done, name in enumerate(chosen):
        on_step(", ".join(client) if name == "client" else name, done, len(chosen))
        t0 = time.monotonic()
        rows += steps[name]()
        wall_seconds[name] = time.monotonic() - t0
    add_ratios(rows)
    return {
        "kind": "svcframe-bench", "options": asdict(opts), "environment": environment(), "rows": rows,
        "wall_seconds": wall_seconds,
    }  # fmt: skip


#: per workload: the figure a ratio to raw compares, and the fields that make two rows the same setting
RATIO_OF: dict[str, tuple[str, tuple[str, ...]]] = {
    "seq": ("ops_per_second", ()),
    "sat": ("ops_per_second", ()),
    "bulk": ("gib_per_second", ("transport", "size", "direction")),
    "client-cpu": (HEADLINE["client-cpu"], ()),
    "client-seq": (HEADLINE["client-seq"], ("placement", "server_mode", "client_mode")),
    "client-read": (HEADLINE["client-read"], ("transport", "size", "malloc")),
}


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Give every row its ratio to the raw limit of the same workload and setting (``RATIO_OF``; a saturated
    row also its server CPU per call over raw's), and every unix bulk row its ratio to the tcp row of the
    same implementation, size and direction."""

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["workload"], *(r.get(f) for f in RATIO_OF[r["workload"]][1]))

    rated = [r for r in rows if r["workload"] in RATIO_OF]
    raw = {key(r): r for r in rated if r["impl"].startswith("raw")}
    for r in rated:
        base = raw.get(key(r))
        if base is None:
            continue
        figure = RATIO_OF[r["workload"]][0]
        r["ratio_to_raw"] = r[figure] / base[figure]
        if r["workload"] == "sat":
            r["cpu_per_call_vs_raw"] = r["server_cpu_usec_per_call"] / base["server_cpu_usec_per_call"]
    # between processes on one node: what the unix socket gives over tcp, per implementation
    tcp = {
        (r["impl"], r["size"], r["direction"]): r for r in rows if r["workload"] == "bulk" and r["transport"] == "tcp"
    }
    for r in rows:
        if r["workload"] == "bulk" and r["transport"] == "unix":
            t = tcp.get((r["impl"], r["size"], r["direction"]))
            if t is not None and t["gib_per_second"] > 0:
                r["unix_over_tcp"] = r["gib_per_second"] / t["gib_per_second"]


SERVER_TITLES = {
    "seq": "sequential noop calls (server and client in the same progress mode); ratio: ops/s over raw's",
    "sat": "server saturated by blaster processes (server: its CPU per call and how busy it was); ratio: ops/s "
    "over raw's",
    "bulk": "self-test bulk, median (min-max) (pull: the server reads the client); ratio: over raw's",
    "overhead": "saturated noop rate by monitoring setting",
}


def server_tables(workload: str, rows: list[dict[str, Any]]) -> list[Table]:
    """The table of one server workload's rows (``seq``, ``sat``, ``bulk`` or ``overhead``), figures in one
    notation (``svcframe.units``), within 80 columns on a terminal."""
    cells: list[tuple[str, ...]] = []
    columns: tuple[str, ...]
    for r in rows:
        ops = quantity(r["ops_per_second"], "ops/s") if "ops_per_second" in r else "-"
        if workload == "seq":
            columns = ("implementation", "progress", "ops/s", "latency", "ratio")
            latency = f"p50 {quantity(r['p50_usec'], 'usec')}, p99 {quantity(r['p99_usec'], 'usec')}"
            cells.append((r["impl"], r["mode"], ops, latency, ratio_cell(r)))
        elif workload == "sat":
            columns = ("implementation", "ops/s", "server", "ratio")
            busy = f"{100 * r['server_utilization']:.0f}% busy"
            server = f"{quantity(r['server_cpu_usec_per_call'], 'usec')}/call, {busy}"
            cells.append((r["impl"], ops, server, ratio_cell(r)))
        elif workload == "overhead":
            columns = ("implementation", "ops/s", "of off")
            cells.append((r["impl"], ops, f"{r['ratio_to_off']:.3f}"))
        else:
            columns = ("implementation", "setting", "GiB/s", "ratio", "unix/tcp")
            setting = f"{r['transport']} {r['direction']} {quantity(r['size'], 'B')} ({r['flow']})"
            unix_tcp = f"{r['unix_over_tcp']:.2f}" if "unix_over_tcp" in r else "-"
            cells.append((r["impl"], setting, spread(r, "gib_per_second", "GiB/s"), ratio_cell(r), unix_tcp))
    return [(f"{workload}: {SERVER_TITLES[workload]}", columns, cells)]


def print_table(result: dict[str, Any]) -> None:
    """One table per workload (client-read: two) through ``svcframe.cli.common.print_table``: within 80 columns
    on a terminal (folding, never cutting), plain columns one row per line in a pipe; figures in one notation."""
    from svcframe.cli.common import output_console, print_lines
    from svcframe.cli.common import print_table as table

    console = output_console()
    build = result.get("environment", {}).get("svcframe_build")  # (not in results of before it was recorded)
    print_lines("svcframe bench: server on one core, clients on the others, loopback", console=console)
    if build:
        print_lines(f"svcframe's hot paths: {build}", console=console)
    for workload in WORKLOADS:
        rows = [r for r in result["rows"] if r["workload"] == workload]
        if not rows:
            continue
        specs = tables(workload, rows) if workload in CLIENT_WORKLOADS else server_tables(workload, rows)
        for title, columns, cells in specs:
            numeric = [c for c in columns if c not in TEXT_COLUMNS]
            table(columns, cells, title=title, numeric=numeric, console=console)
