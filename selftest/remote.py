"""Server and client processes on other nodes, started by ``srun`` or ``mpiexec`` and coordinated over RPC.

svcframe never starts remote processes itself (DESIGN.md section 7). For a node set whose launcher is
``mpiexec`` or ``srun`` (``selftest/nodes.py``), ``roofline collect`` is the *coordinator*: it runs one
svcframe engine (:class:`Coordinator`) and starts one launcher command per node group:

* **servers** (:class:`ServerGroup`): ``LAUNCHER ... python -m svcframe serve CONFIG --group-file F
  --multi-node``, CONFIG listening on ``tcp://HOST:0`` (the node's name; with ``--interface NAME``,
  ``tcp://*:0`` and the plumber on that interface). Each server learns its rank and size from the launcher's environment
  (``svcframe/ranks.py``); rank 0 writes ``F`` once every rank accepts calls (MPI's barrier or the
  filesystem's; never a sleep). ``F`` lives in the output directory, which must be on a filesystem the
  nodes share. The coordinator waits for ``F`` (bounded polling of that condition, stopped early when the
  launcher exits), then checks at once that every member answers an admin ``status`` call with its pid.
* **clients** (:class:`RemoteClientPool`): ``LAUNCHER ... python -m selftest.remote COORDINATOR --node J``.
  Each client process dials the coordinator's engine and registers; the coordinator waits for all of them
  (an event set by the last registration, raced against the launchers' exits; never a sleep). Work and
  results travel as svcframe RPCs of the coordinator's provider (:data:`COORDINATOR_PROVIDER_ID`)::

      client process (rank r of node J)               coordinator
      register {node, rank, size, source, pid, host} ->  id
      next id                                        ->  (long poll) {"run", "rank", "server", "params"} | None
      barrier {id, run}                              ->  "pass" once every client of the run arrived, | "abort"
      barrier {id, run}                              ->  "pass" (go)
      done {id, run, "result" | "error"}             ->  None

  The two barriers bracket the coordinator's server CPU samples, as in ``selftest/pool.py``; the results
  document is ``summarize``'s, so collect cannot tell the pools apart. ``next`` answering None ends a
  client; a lost coordinator connection ends it too (the launcher then exits).

The shared secret (``SVCFRAME_SECRET``) reaches every process through the launcher's environment
(Hydra and srun propagate it by default); servers on non-loopback addresses refuse to start without one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from svcframe.config import ServiceConfig
from svcframe.errors import GroupError, LaunchError, SvcframeError
from svcframe.group import Member, read_group_file

from .driver import SelftestError, SelftestParams, _server_stats, summarize
from .nodes import Node, NodeSet, launcher_command

T = TypeVar("T")

COORDINATOR_PROVIDER_ID = 60
"""Provider id of the coordinator's RPCs (register, next, barrier, done) on its engine."""

MAX_BODY_BYTES = 256 * 1024 * 1024
"""Largest message between a client and the coordinator (a result carries 8 bytes of latency per op)."""

BARRIER_TIMEOUT_SECONDS = 120.0
"""How long a run waits for every client at a barrier, and for their results after the measurement."""

JOB_WAIT_SECONDS = 3000.0
"""Deadline of a client's ``next`` long poll (a call deadline travels in microseconds in 32 bits, < 4295 s).
The coordinator answers with work, None (end) or, after ``JOB_WAIT_SECONDS - 60`` idle seconds, "again"."""


class Coordinator:
    """The coordinating process's engine (one event loop, driven with :meth:`run` between measurements).

    Args:
        host: the host the engine binds to; client processes on every node dial it.
    """

    def __init__(self, host: str) -> None:
        self.host = host
        self.runner: asyncio.Runner | None = None
        self.engine: Any = None

    def start(self) -> Coordinator:
        from svcframe.engine import Engine
        from svcframe.loops import loop_factory

        self.runner = asyncio.Runner(loop_factory=loop_factory("auto"))
        self.engine = Engine(f"tcp://{self.host}:0", max_body_bytes=MAX_BODY_BYTES, idle_timeout_seconds=0)
        self.runner.run(self.engine.start())
        return self

    @property
    def address(self) -> str:
        return str(self.engine.address)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self.runner is not None, "the coordinator is not started"
        return self.runner.run(coro)

    def close(self) -> None:
        if self.runner is not None:
            with contextlib.suppress(Exception):
                self.runner.run(self.engine.close(0.5))
            self.runner.close()
            self.runner = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    """PR_SET_PDEATHSIG: a launcher (mpiexec, srun) gets SIGTERM when the thread that started it exits
    (collect starts them from its main thread, so: when collect exits); it then ends its job step."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _popen(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent)  # fmt: skip


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    tail = "\n".join(text.splitlines()[-lines:])
    return f"\n--- last lines of {path} ---\n{tail}" if tail else ""


def _end(proc: subprocess.Popen[bytes], grace_seconds: float) -> int:
    """Wait up to ``grace_seconds`` for a launcher to exit, then SIGTERM its process group, then SIGKILL."""
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=grace_seconds if sig is None else 5.0)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


class ServerGroup:
    """``count`` server processes on one node, started by one launcher command, published as a group file.

    Args:
        node_set: gives the launcher.
        index: the node's index in ``node_set.nodes``.
        count: server processes on that node.
        config: the bootstrap config (written beside the group file, so every node reads the same).
        workdir: a directory every node sees (group file, config, launcher log).
        flavour: mpiexec flavour (``selftest.nodes.mpiexec_flavour``).
        interface: listen on this network interface's address of the node (``tcp://*:0`` and the plumber),
            instead of the node's name.
        multi_node: clients on other hosts will call (``svcframe serve --multi-node``: an address only the
            node reaches is refused, with the hint).
    """

    def __init__(self, node_set: NodeSet, index: int, count: int, config: ServiceConfig, workdir: Path, *,
                 flavour: str = "hydra", start_timeout_seconds: float = 120.0,
                 interface: str | None = None, multi_node: bool = True) -> None:  # fmt: skip
        self.node: Node = node_set.nodes[index]
        self.index = index
        self.count = count
        self.group_file = workdir / f"servers-node{index}.json"
        self.config_file = workdir / f"servers-node{index}.config.json"
        self.log = workdir / f"servers-node{index}.log"
        cfg = config.model_copy(deep=True)
        if interface is None:
            cfg.engine.address = f"tcp://{self.node.host}:0"
        else:  # the plumber puts a wildcard on the interface's address of each server's node
            cfg.engine.address = "tcp://*:0"
            cfg.engine.plumber.bucket_policy = "all"
            cfg.engine.plumber.interfaces = [interface]
        self.config_file.write_text(cfg.model_dump_json())
        self.admin_provider_id = cfg.admin.provider_id
        # --multi-node: clients on other hosts call them, so an address only their node reaches is refused
        argv = [sys.executable, "-m", "svcframe", "serve", str(self.config_file), "--group-file", str(self.group_file),
                "--group-timeout-seconds", str(start_timeout_seconds), "--multi-node" if multi_node else "--single-node"]  # fmt: skip
        self.command = launcher_command(node_set, self.node, count, argv, flavour=flavour)
        self.start_timeout_seconds = start_timeout_seconds
        self.members: list[Member] = []
        self.publication: dict[str, Any] = {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Run the launcher command (returns at once; :meth:`wait_ready` waits for the group)."""
        with contextlib.suppress(FileNotFoundError):
            self.group_file.unlink()  # a stale group must not pass for this one
        self.proc = _popen(self.command, self.log)

    async def wait_ready(self, engine: Any) -> list[Member]:
        """Wait for the group file, then check every member answers ``status`` with its pid.

        ``publication`` records ``{"node", "servers", "launcher", "barrier", "created", "last_ready",
        "answered"}``: the rank source the servers found in their environment (``"pmi"``, ``"slurm"``...),
        the barrier used, when the file was written and when the last member became ready (seconds since
        the epoch), and how many members answered the check.

        Raises:
            LaunchError: the launcher exited first (its log tail is in the message), the file did not
                appear within ``start_timeout_seconds``, or members do not answer.
        """
        assert self.proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_seconds
        interval = 0.005
        while not self.group_file.exists():  # bounded polling of a condition on a shared filesystem
            if self.proc.poll() is not None:
                raise LaunchError(f"the server launcher for node {self.node.name} exited with {self.proc.returncode} "
                                  f"before the group file appeared{_log_tail(self.log)}")  # fmt: skip
            if loop.time() > deadline:
                raise LaunchError(f"no group file {self.group_file} from the {self.count} server(s) of node "
                                  f"{self.node.name} within {self.start_timeout_seconds:g} s{_log_tail(self.log)}")  # fmt: skip
            await asyncio.sleep(interval)
            interval = min(2 * interval, 0.05)
        try:
            group = read_group_file(self.group_file)
        except GroupError as exc:
            raise LaunchError(f"{exc}{_log_tail(self.log)}") from None
        self.members = group.members
        statuses = await asyncio.gather(
            *(engine.call(m.address, "status", None, provider_id=m.provider_id, timeout_seconds=10.0)
              for m in self.members), return_exceptions=True)  # fmt: skip
        answered = sum(1 for m, s in zip(self.members, statuses, strict=True)
                       if isinstance(s, dict) and s.get("pid") == m.pid)  # fmt: skip
        meta = group.metadata
        ready = [m.ready for m in self.members if m.ready is not None]
        self.publication = {"node": self.node.name, "servers": len(self.members), "launcher": meta.get("launcher"),
                            "barrier": meta.get("barrier"), "created": meta.get("created"),
                            "last_ready": max(ready) if ready else None, "answered": answered}  # fmt: skip
        if len(self.members) != self.count or answered != self.count:
            raise LaunchError(f"group file {self.group_file}: {len(self.members)} member(s), {answered} answering; "
                              f"expected {self.count}{_log_tail(self.log)}")  # fmt: skip
        return self.members

    async def shutdown(self, engine: Any) -> None:
        """Ask every member to shut down (admin ``shutdown``, authenticated by the shared secret)."""
        await asyncio.gather(*(engine.call(m.address, "shutdown", None, provider_id=m.provider_id, timeout_seconds=5.0)
                               for m in self.members), return_exceptions=True)  # fmt: skip

    def stop(self, grace_seconds: float = 10.0) -> int | None:
        """Wait for the launcher to exit (after :meth:`shutdown`), else signal its process group."""
        if self.proc is None:
            return None
        code = _end(self.proc, grace_seconds)
        with contextlib.suppress(FileNotFoundError):
            self.group_file.unlink()
        return code


class RemoteClientPool:
    """Client processes on client nodes, started by one launcher command per node, driven over RPC.

    The same interface as :class:`selftest.pool.ClientPool` (``start``, ``wait_ready``, ``run``,
    ``close``, ``statistics``), plus the node of each client of a run.

    Args:
        coordinator: a started :class:`Coordinator`.
        node_set: nodes and launcher.
        clients_per_node: client processes to start per node index.
        workdir: where the launchers' logs go.
    """

    def __init__(self, coordinator: Coordinator, node_set: NodeSet, clients_per_node: dict[int, int], workdir: Path,
                 *, flavour: str = "hydra", start_timeout_seconds: float = 120.0) -> None:  # fmt: skip
        self.coordinator = coordinator
        self.node_set = node_set
        self.clients_per_node = {j: n for j, n in clients_per_node.items() if n > 0}
        self.workdir = workdir
        self.flavour = flavour
        self.start_timeout_seconds = start_timeout_seconds
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.clients: list[dict[str, Any]] = []  # registrations, index = client id
        self._queues: list[asyncio.Queue[Any]] = []
        self._registered: asyncio.Event | None = None
        self._arrivals: dict[int, dict[int, asyncio.Future[str]]] = {}
        self._done: dict[int, dict[int, dict[str, Any]]] = {}
        self._changed: asyncio.Event | None = None
        self._run_id = 0
        self._exits: list[asyncio.Future[tuple[int, int]]] = []
        self.runs = 0
        self.start_seconds = 0.0

    @property
    def expected(self) -> int:
        return sum(self.clients_per_node.values())

    # -- the coordinator's RPCs ------------------------------------------------------------------------
    def _register_rpcs(self) -> None:
        engine = self.coordinator.engine
        pid = COORDINATOR_PROVIDER_ID
        engine.register(pid, "register", self._rpc_register)
        engine.register(pid, "next", self._rpc_next)
        engine.register(pid, "barrier", self._rpc_barrier)
        engine.register(pid, "done", self._rpc_done)

    def _rpc_register(self, req: Any, info: dict[str, Any]) -> int:
        cid = len(self.clients)
        self.clients.append(dict(info))
        self._queues.append(asyncio.Queue())
        if len(self.clients) >= self.expected and self._registered is not None:
            self._registered.set()
        return cid

    async def _rpc_next(self, req: Any, cid: int) -> Any:
        try:
            return await asyncio.wait_for(self._queues[cid].get(), JOB_WAIT_SECONDS - 60.0)
        except TimeoutError:
            return "again"  # answered well before the caller's deadline, so no job is lost to a race

    async def _rpc_barrier(self, req: Any, arg: dict[str, Any]) -> str:
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._arrivals.setdefault(arg["run"], {})[arg["id"]] = fut
        self._poke()
        return await fut

    def _rpc_done(self, req: Any, arg: dict[str, Any]) -> None:
        self._done.setdefault(arg["run"], {})[arg["id"]] = arg
        self._poke()

    def _poke(self) -> None:
        if self._changed is not None:
            self._changed.set()

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> RemoteClientPool:
        """Register the coordinator's RPCs and run one launcher command per client node (returns at once)."""
        self._register_rpcs()
        self.coordinator.run(self._make_events())
        for j, count in sorted(self.clients_per_node.items()):
            argv = [sys.executable, "-m", __spec__.name, self.coordinator.address, "--node", str(j)]
            cmd = launcher_command(self.node_set, self.node_set.nodes[j], count, argv, flavour=self.flavour)
            self.procs[j] = _popen(cmd, self.workdir / f"clients-node{j}.log")
        self.coordinator.run(self._watch_launchers())
        return self

    async def _watch_launchers(self) -> None:
        """One executor thread per launcher waits for its exit, for the pool's lifetime (ended by close)."""
        loop = asyncio.get_running_loop()
        self._exits = [loop.run_in_executor(None, _wait_quietly, p, j) for j, p in self.procs.items()]

    async def _make_events(self) -> None:
        self._registered = asyncio.Event()
        self._changed = asyncio.Event()
        if len(self.clients) >= self.expected:
            self._registered.set()

    async def _launcher_exit(self) -> tuple[int, int]:
        """(node, exit code) of the first client launcher to exit (the watchers are never cancelled here)."""
        if not self._exits:
            await asyncio.get_running_loop().create_future()  # no launcher: never
        done, _ = await asyncio.wait(self._exits, return_when=asyncio.FIRST_COMPLETED)
        return next(iter(done)).result()

    def wait_ready(self) -> None:
        """Wait until every client process registered.

        Raises:
            SelftestError: a launcher exited first (its log tail is in the message), or the clients did
                not all register within ``start_timeout_seconds``.
        """
        t0 = time.monotonic()
        self.coordinator.run(self._wait_registered())
        self.start_seconds += time.monotonic() - t0

    async def _wait_registered(self) -> None:
        assert self._registered is not None
        registered = asyncio.ensure_future(self._registered.wait())
        exited = asyncio.ensure_future(self._launcher_exit())
        try:
            done, _ = await asyncio.wait({registered, exited}, timeout=self.start_timeout_seconds,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            registered.cancel()
            exited.cancel()
        if registered in done:
            return
        if exited in done:
            j, code = exited.result()
            raise SelftestError(f"the client launcher for node {self.node_set.nodes[j].name} exited with {code} after "
                                f"{len(self.clients)} of {self.expected} registrations"
                                f"{_log_tail(self.workdir / f'clients-node{j}.log')}")  # fmt: skip
        raise SelftestError(f"{len(self.clients)} of {self.expected} client processes registered within "
                            f"{self.start_timeout_seconds:g} s")  # fmt: skip

    def close(self, grace_seconds: float = 5.0) -> None:
        """End every client (``next`` answers None), wait for the launchers, signal those still running."""
        if self.coordinator.runner is not None and self._queues:
            for q in self._queues:
                q.put_nowait(None)
            self.coordinator.run(self._settle())
        for p in self.procs.values():
            _end(p, grace_seconds)

    async def _settle(self) -> None:
        await asyncio.sleep(0)  # let the pending ``next`` handlers answer before the loop stops

    def pids(self) -> list[int]:
        return [int(c["pid"]) for c in self.clients]

    def statistics(self) -> dict[str, Any]:
        """``{"workers", "runs", "start_seconds", "launchers"}``."""
        return {"workers": len(self.clients), "runs": self.runs, "start_seconds": self.start_seconds,
                "launchers": len(self.procs)}  # fmt: skip

    # -- one run -----------------------------------------------------------------------------------------
    def choose(self, client_nodes: Sequence[int]) -> list[int]:
        """Client ids for a run whose rank r runs on node ``client_nodes[r]`` (lowest launcher rank first).

        Raises:
            SelftestError: a node has fewer client processes than asked.
        """
        by_node: dict[int, list[int]] = {}
        for cid, c in sorted(enumerate(self.clients), key=lambda ic: (ic[1]["node"], ic[1]["rank"])):
            by_node.setdefault(int(c["node"]), []).append(cid)
        taken: dict[int, int] = {}
        out = []
        for j in client_nodes:
            k = taken.get(j, 0)
            if k >= len(by_node.get(j, [])):
                raise SelftestError(f"node {self.node_set.nodes[j].name} has {len(by_node.get(j, []))} client "
                                    f"process(es), the run needs more")  # fmt: skip
            out.append(by_node[j][k])
            taken[j] = k + 1
        return out

    def run(self, params: SelftestParams, servers: list[str], *, client_nodes: Sequence[int],
            admin_provider_id: int = 0) -> dict[str, Any]:  # fmt: skip
        """One self-test run: client rank r on node ``client_nodes[r]`` calls ``servers[r % len(servers)]``.

        Returns:
            the results document of ``selftest.driver.summarize``.

        Raises:
            SelftestError: a client failed or timed out, or a server cannot be reached.
        """
        if len(client_nodes) != params.clients:
            raise SelftestError(f"{params.clients} clients but {len(client_nodes)} client nodes given")
        chosen = self.choose(client_nodes)
        result = self.coordinator.run(self._run(params, servers, chosen, admin_provider_id))
        self.runs += 1
        return result

    async def _wait_for(self, what: str, count: Any, chosen: list[int]) -> None:
        """Until ``count()`` reaches ``len(chosen)``; a client error or a launcher exit ends it early."""
        assert self._changed is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BARRIER_TIMEOUT_SECONDS
        exited = asyncio.ensure_future(self._launcher_exit())
        try:
            while True:
                errors = [d for d in self._done.get(self._run_id, {}).values() if "error" in d]
                if errors:
                    raise SelftestError(f"client {errors[0]['rank']} failed: {errors[0]['error']}")
                if count() >= len(chosen):
                    return
                self._changed.clear()
                changed = asyncio.ensure_future(self._changed.wait())
                done, _ = await asyncio.wait({changed, exited}, timeout=max(0.0, deadline - loop.time()),
                                             return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                changed.cancel()
                if exited in done:
                    j, code = exited.result()
                    raise SelftestError(f"the client launcher for node {self.node_set.nodes[j].name} exited with "
                                        f"{code} while clients should {what}")  # fmt: skip
                if not done:
                    raise SelftestError(f"{len(chosen) - count()} of {len(chosen)} clients did not {what} in time")
        finally:
            exited.cancel()

    def _release(self, answer: str) -> None:
        for fut in self._arrivals.pop(self._run_id, {}).values():
            if not fut.done():
                fut.set_result(answer)

    async def _run(self, params: SelftestParams, servers: list[str], chosen: list[int],
                   admin_provider_id: int) -> dict[str, Any]:  # fmt: skip
        engine = self.coordinator.engine
        self._run_id += 1
        run = self._run_id
        try:
            server_config = await engine.call(servers[0], "get_config", None, provider_id=admin_provider_id)
        except SvcframeError:
            server_config = None
        params_json = params.model_dump_json()
        for rank, cid in enumerate(chosen):
            self._queues[cid].put_nowait({"run": run, "rank": rank, "server": servers[rank % len(servers)],
                                          "params": params_json})  # fmt: skip

        def arrived() -> int:
            return len(self._arrivals.get(run, {}))

        def reported() -> int:
            return len(self._done.get(run, {}))

        try:
            await self._wait_for("finish warm-up", arrived, chosen)
            try:
                before = await _server_stats(engine, servers, params.provider_id)
            except SvcframeError as exc:
                raise SelftestError(f"cannot sample server CPU: {exc}") from exc
            self._release("pass")
            await self._wait_for("start", arrived, chosen)
            wall0 = time.monotonic()
            self._release("pass")
            await self._wait_for("report results", reported, chosen)
            wall1 = time.monotonic()
            try:
                after = await _server_stats(engine, servers, params.provider_id)
            except SvcframeError as exc:
                raise SelftestError(f"cannot sample server CPU: {exc}") from exc
        except BaseException:
            await self._abort(run, chosen)
            raise
        outs = [self._done[run][cid]["result"] for cid in chosen]
        self._done.pop(run, None)
        return summarize(params, servers, server_config, outs, before, after, wall1 - wall0)

    async def _abort(self, run: int, chosen: list[int]) -> None:
        """Answer barriers with "abort" until every client of the run reported (10 s at most)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        assert self._changed is not None
        while len(self._done.get(run, {})) < len(chosen) and loop.time() < deadline:
            self._release("abort")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(0.0, deadline - loop.time()))
        self._release("abort")
        self._done.pop(run, None)


def _wait_quietly(proc: subprocess.Popen[bytes], node: int) -> tuple[int, int]:
    return node, proc.wait()


# -- the client process ------------------------------------------------------------------------------------
class _RpcBarrier:
    """The client side of a coordinator barrier, called from ``_client``'s executor thread."""

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop, coordinator: str, cid: int, run: int) -> None:
        self.engine, self.loop, self.coordinator, self.cid, self.run = engine, loop, coordinator, cid, run

    def wait(self, timeout: float | None = None) -> None:
        call = self.engine.call(self.coordinator, "barrier", {"id": self.cid, "run": self.run},
                                provider_id=COORDINATOR_PROVIDER_ID, timeout_seconds=timeout or BARRIER_TIMEOUT_SECONDS)  # fmt: skip
        answer = asyncio.run_coroutine_threadsafe(call, self.loop).result()
        if answer != "pass":
            raise SelftestError("the run was aborted by the coordinator")

    def abort(self) -> None:
        pass  # the coordinator learns of the failure from the "done" error


async def client_main(coordinator: str, node: int) -> int:
    """A client process: register with the coordinator, run the jobs it hands out, report each result.

    Returns:
        the process exit code (0 when the coordinator ended the pool).
    """
    from svcframe.engine import Engine
    from svcframe.ranks import RankInfo, from_environment

    from .driver import _client

    info = from_environment() or RankInfo(0, 1)
    engine = Engine(None, max_body_bytes=MAX_BODY_BYTES)
    await engine.start()
    loop = asyncio.get_running_loop()
    pid = COORDINATOR_PROVIDER_ID
    try:
        me = await engine.call(coordinator, "register", {
            "node": node, "rank": info.rank, "size": info.size, "local_rank": info.local_rank, "source": info.source,
            "job": info.job, "pid": os.getpid(), "host": socket.gethostname()}, provider_id=pid)  # fmt: skip
        while True:
            job = await engine.call(coordinator, "next", me, provider_id=pid, timeout_seconds=JOB_WAIT_SECONDS)
            if job is None:
                return 0
            if job == "again":
                continue
            params = SelftestParams.model_validate_json(job["params"])
            barrier = _RpcBarrier(engine, loop, coordinator, me, job["run"])
            report: dict[str, Any] = {"id": me, "run": job["run"], "rank": job["rank"]}
            try:
                report["result"] = await _client(job["rank"], job["server"], params, barrier)
            except Exception as exc:  # report, never hang the coordinator
                report["error"] = f"{type(exc).__name__}: {exc}"
            await engine.call(coordinator, "done", report, provider_id=pid)
    finally:
        await engine.close(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m selftest.remote COORDINATOR_ADDRESS --node J``: one client process (started by a launcher)."""
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=main.__doc__)
    parser.add_argument("coordinator", help="the coordinator engine's address (tcp://HOST:PORT)")
    parser.add_argument("--node", type=int, required=True, help="index of this node in the collection's node set")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator owns Ctrl-C and ends the pool
    from svcframe.loops import run

    try:
        return run(client_main(args.coordinator, args.node))
    except SvcframeError as exc:  # coordinator gone: the launcher sees a non-zero exit
        print(f"selftest.remote: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
