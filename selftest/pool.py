"""Client processes started once and reused by every self-test run of a suite.

``run_selftest`` (``selftest/driver.py``) spawns its client processes for one measurement and joins them
afterwards: simple, but on a small machine starting Python processes costs about as much as a
two-second measurement. Carns et al. (papers/carns2025-data-service-roofline.txt, section 5) name process
launch as what dominated their 4-hour parameter job. A :class:`ClientPool` starts its workers once; each
run sends every worker a job over its own pipe, and the two barriers of a run (warmed up; go) are
messages on those pipes, never sleeps::

    driver                                 worker i (one per client rank)
    ("run", rank, server, params,   ->     engine (the secret: the driver's), connect, warm-up
     secret)
                                    <-     ("barrier",)          # warmed up
    (sample server CPU)
    ("pass",)                       ->
                                    <-     ("barrier",)          # ready
    ("pass",)                       ->     timed loop             # go
                                    <-     ("result", {...}) or ("error", rank, "Type: message")

The results document is the one of ``run_selftest`` (``summarize``), so callers cannot tell the two
apart. Workers ignore SIGINT: on Ctrl-C the driver decides, and :meth:`ClientPool.close` ends them
(a job in flight is cut short with SIGTERM after ``grace_seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import time
from multiprocessing.connection import Connection, wait
from typing import Any

from svcframe.engine import SECRET_ENV

from .driver import SelftestError, SelftestParams, _server_stats, summarize

BARRIER_TIMEOUT_SECONDS = 120.0
"""How long a run waits for every client to reach a barrier before it gives up."""


class _PipeBarrier:
    """The client side of a barrier over the worker's pipe (``wait`` and ``abort`` like ``mp.Barrier``)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def wait(self, timeout: float | None = None) -> None:
        self.conn.send(("barrier",))
        if not self.conn.poll(timeout):
            raise TimeoutError(f"the driver did not release the barrier within {timeout} s")
        msg = self.conn.recv()
        if msg[0] != "pass":
            raise SelftestError("the run was aborted by the driver")

    def abort(self) -> None:
        pass  # the driver learns of the failure from the ("error", ...) message


def _worker_main(conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver owns Ctrl-C
    from svcframe.loops import run

    from .driver import _client

    conn.send(("hello", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        _, rank, server, params_json, secret = msg
        # the driver's shared secret now, not the forkserver's environment of when it started (an earlier pool)
        if secret is None:
            os.environ.pop(SECRET_ENV, None)
        else:
            os.environ[SECRET_ENV] = secret
        params = SelftestParams.model_validate_json(params_json)
        try:
            if params.client_cores:
                os.sched_setaffinity(0, [params.client_cores[rank % len(params.client_cores)]])
            out = run(_client(rank, server, params, _PipeBarrier(conn)), params.event_loop)
        except BaseException as exc:  # report, never hang the driver
            conn.send(("error", rank, f"{type(exc).__name__}: {exc}"))
            continue
        conn.send(("result", out))


def _context() -> Any:
    """``forkserver`` with the client's modules preloaded: each worker is a fork of a clean, single-threaded
    process that imported them once (milliseconds instead of a Python start-up each); ``spawn`` where
    forkserver is unavailable."""
    try:
        ctx = mp.get_context("forkserver")
    except ValueError:
        return mp.get_context("spawn")
    ctx.set_forkserver_preload([__name__, f"{__package__}.driver", "svcframe.engine", "svcframe.loops"])
    return ctx


class ClientPool:
    """``size`` client processes (forked from a preloaded ``forkserver``) that serve many self-test runs.

    Args:
        size: workers to start; :meth:`run` starts more when a run needs more clients.
        event_loop: loop of the driver's own engine (server CPU samples), as in ``SelftestParams``.

    Use as a context manager, or :meth:`start` / :meth:`close`.

    Raises:
        SelftestError: from :meth:`start` when a worker does not come up within ``start_timeout_seconds``,
            from :meth:`run` as ``run_selftest`` does.
    """

    def __init__(self, size: int = 1, *, event_loop: str = "auto", start_timeout_seconds: float = 60.0) -> None:
        self.size = max(1, size)
        self.event_loop = event_loop
        self.start_timeout_seconds = start_timeout_seconds
        self._ctx = _context()
        self._workers: list[tuple[Any, Connection]] = []
        self._starting: list[tuple[Any, Connection]] = []
        self._runner: asyncio.Runner | None = None
        self._engine: Any = None
        self.runs = 0
        self.start_seconds = 0.0

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> ClientPool:
        """Start the driver's engine and spawn ``size`` workers; return at once (the workers import in the
        background, so launching servers meanwhile overlaps the two). :meth:`run` waits for them."""
        from svcframe.engine import Engine
        from svcframe.loops import loop_factory

        self._runner = asyncio.Runner(loop_factory=loop_factory(self.event_loop))
        self._engine = Engine(None)
        self._runner.run(self._engine.start())
        self._spawn(self.size)
        return self

    def _spawn(self, size: int) -> None:
        for _ in range(size - len(self._workers) - len(self._starting)):
            parent, child = self._ctx.Pipe(duplex=True)
            proc = self._ctx.Process(target=_worker_main, args=(child,), daemon=True)
            proc.start()
            child.close()
            self._starting.append((proc, parent))

    def wait_ready(self) -> None:
        """Wait until every spawned worker has said hello.

        Raises:
            SelftestError: a worker died or did not start within ``start_timeout_seconds``.
        """
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout_seconds
        while self._starting:
            proc, conn = self._starting[0]
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise SelftestError(
                    f"client worker pid {proc.pid} did not start within {self.start_timeout_seconds:g} s"
                )
            try:
                conn.recv()
            except EOFError:
                raise SelftestError(
                    f"client worker pid {proc.pid} died while starting (exit code {proc.exitcode})"
                ) from None
            self._workers.append(self._starting.pop(0))
        self.start_seconds += time.monotonic() - t0

    def _grow(self, size: int) -> None:
        self._spawn(size)
        self.wait_ready()

    def close(self, grace_seconds: float = 5.0) -> None:
        """Ask every worker to exit; SIGTERM those still busy after ``grace_seconds``; close the engine."""
        self._workers += self._starting
        self._starting = []
        for _, conn in self._workers:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        deadline = time.monotonic() + grace_seconds
        for proc, conn in self._workers:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
            conn.close()
        self._workers = []
        if self._runner is not None:
            with contextlib.suppress(Exception):
                self._runner.run(self._engine.close())
            self._runner.close()
            self._runner = None

    def __enter__(self) -> ClientPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close(grace_seconds=0.5 if exc[0] is not None else 5.0)

    def pids(self) -> list[int]:
        """Process ids of the workers (for tests and for ``ps``)."""
        return [p.pid for p, _ in self._workers + self._starting if p.pid is not None]

    def statistics(self) -> dict[str, Any]:
        """``{"workers", "runs", "start_seconds"}``: ready workers, runs served, seconds spent waiting for
        workers to start."""
        return {"workers": len(self._workers), "runs": self.runs, "start_seconds": self.start_seconds}

    # -- one run -----------------------------------------------------------------------------------------
    def _recv(self, conns: list[Connection], expect: str, what: str, state: list[str]) -> dict[int, Any]:
        """One message of kind ``expect`` from each of ``conns``; SelftestError on an error or a timeout.

        ``state[rank]`` tracks each worker for :meth:`_abort`: "waiting" (at a barrier, owed a reply),
        "done" (its result or error was read) or "running".
        """
        pending = {id(c): i for i, c in enumerate(conns)}
        got: dict[int, Any] = {}
        deadline = time.monotonic() + BARRIER_TIMEOUT_SECONDS
        while pending:
            ready = wait([conns[i] for i in pending.values()], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise SelftestError(f"{len(pending)} of {len(conns)} clients did not {what} in time")
            for ready_conn in ready:
                rank = pending.pop(id(ready_conn))
                conn = conns[rank]
                try:
                    msg = conn.recv()
                except EOFError:
                    state[rank] = "dead"
                    raise SelftestError(f"client {rank} died before it could {what}") from None
                state[rank] = {"barrier": "waiting", "result": "done", "error": "done"}.get(msg[0], "running")
                if msg[0] == "error":
                    raise SelftestError(f"client {msg[1]} failed: {msg[2]}")
                if msg[0] != expect:
                    raise SelftestError(f"client {rank}: expected {expect!r}, got {msg[0]!r}")
                got[rank] = msg[1] if len(msg) > 1 else None
        return got

    def _release(self, conns: list[Connection], state: list[str]) -> None:
        for rank, conn in enumerate(conns):
            conn.send(("pass",))
            state[rank] = "running"

    def _abort(self, conns: list[Connection], state: list[str]) -> None:
        """Bring every worker of a failed run back to idle: answer barriers with "abort", drain to the
        result or error; a worker that does not get there within 10 s is killed and replaced."""
        for rank, conn in enumerate(conns):
            if state[rank] == "done":
                continue
            try:
                if state[rank] == "waiting":
                    conn.send(("abort",))
                deadline = time.monotonic() + 10.0
                while True:
                    if state[rank] == "dead" or not conn.poll(max(0.0, deadline - time.monotonic())):
                        raise TimeoutError
                    msg = conn.recv()
                    if msg[0] == "barrier":
                        conn.send(("abort",))
                    elif msg[0] in ("result", "error"):
                        break
            except (TimeoutError, EOFError, OSError):
                self._replace(rank)

    def _replace(self, index: int) -> None:
        proc, conn = self._workers[index]
        proc.kill()
        proc.join()
        conn.close()
        parent, child = self._ctx.Pipe(duplex=True)
        fresh = self._ctx.Process(target=_worker_main, args=(child,), daemon=True)
        fresh.start()
        child.close()
        if not parent.poll(self.start_timeout_seconds):
            raise SelftestError(f"client worker pid {fresh.pid} did not start within {self.start_timeout_seconds:g} s")
        parent.recv()
        self._workers[index] = (fresh, parent)

    def run(self, params: SelftestParams, servers: list[str], *, admin_provider_id: int = 0) -> dict[str, Any]:
        """One self-test run on the pool's workers: the same sequence and results document as
        ``run_selftest(params, servers)`` (see ``selftest/driver.py``).

        Raises:
            SelftestError: no servers, a client failed or timed out, or a server cannot be reached.
        """
        from svcframe.errors import SvcframeError

        if not servers:
            raise SelftestError("no servers to test")
        if self._runner is None:
            raise SelftestError("the client pool is not started")
        self._grow(params.clients)
        runner, engine = self._runner, self._engine
        conns = [conn for _, conn in self._workers[: params.clients]]
        assignment = [servers[i % len(servers)] for i in range(params.clients)]
        try:
            server_config = runner.run(engine.call(servers[0], "get_config", None, provider_id=admin_provider_id))
        except SvcframeError:
            server_config = None
        params_json = params.model_dump_json()
        for rank, conn in enumerate(conns):
            conn.send(("run", rank, assignment[rank], params_json, os.environ.get(SECRET_ENV)))
        state = ["running"] * len(conns)
        try:
            self._recv(conns, "barrier", "finish warm-up", state)
            try:
                before = runner.run(_server_stats(engine, servers, params.provider_id))
            except SvcframeError as exc:
                raise SelftestError(f"cannot sample server CPU: {exc}") from exc
            self._release(conns, state)
            self._recv(conns, "barrier", "start", state)
            wall0 = time.monotonic()
            self._release(conns, state)
            outs = list(self._recv(conns, "result", "report results", state).values())
            wall1 = time.monotonic()
            try:
                after = runner.run(_server_stats(engine, servers, params.provider_id))
            except SvcframeError as exc:
                raise SelftestError(f"cannot sample server CPU: {exc}") from exc
        except KeyboardInterrupt:
            raise  # the caller closes the pool, which ends busy workers
        except BaseException:
            self._abort(conns, state)
            raise
        self.runs += 1
        return summarize(params, servers, server_config, outs, before, after, wall1 - wall0)
