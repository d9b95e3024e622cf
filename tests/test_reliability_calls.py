"""Calls are answered or fail clearly, and none is lost, call by call, against real server processes (conformance cases in the
spirit of gRPC's interop suite):

* empty and large calls, unknown RPC and provider, a handler error, a 1 ms deadline;
* cancellation before and after the handler starts: the server sees it within 100 ms (its own clock,
  CLOCK_MONOTONIC, is comparable with ours) and a handler cancelled before it started never runs;
* every call ends by its deadline + 100 ms: an RPC, a bulk transfer and admin operations against a SIGSTOPped
  server, a new connection to it, and the engine's default deadline;
* an idempotent call is retried across a server restart at the same address; a non-idempotent one is
  reported as ConnectionLost and never executed twice (executions counted by the server's journal).
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import WAIT_SECONDS, check_until, wait_until
from reliability_kit import (
    KV_ID,
    MIB,
    RELTEST_ID,
    Procs,
    ServerProcess,
    address_port,
    journal_counts,
    scaled,
    service_config,
    with_port,
)

from svcframe import (
    BulkHandle,
    ConnectionLost,
    Engine,
    NoSuchProvider,
    NoSuchRPC,
    RemoteError,
    TimeoutError_,
)
from svcframe.admin import ServiceHandle
from svcframe.errors import LocalProtocolError

pytestmark = [pytest.mark.asyncio(loop_factories=["uvloop"]), pytest.mark.timeout(scaled(120, 600))]

#: What "on time" allows beyond a deadline, and how fast the server must learn of a cancellation.
SLACK_SECONDS = 0.100


@pytest.fixture
def server(procs: Procs, tmp_path: Path) -> ServerProcess:
    return procs.spawn(service_config(tmp_path, kv="fast"))


async def call(engine: Engine, server: ServerProcess, name: str, arg: Any = None, **kw: Any) -> Any:
    return await engine.call(server.address, name, arg, provider_id=kw.pop("provider_id", RELTEST_ID), **kw)


async def server_events(engine: Engine, server: ServerProcess) -> list[list[Any]]:
    return await call(engine, server, "events", timeout_seconds=5.0)  # type: ignore[no-any-return]


# --- conformance -----------------------------------------------------------------------------------------------


async def test_empty_and_large_calls(server: ServerProcess, figures: Any) -> None:
    """Empty arguments and results of every kind; an inline argument just under the 4 MiB frame limit; one
    over it fails locally (LocalProtocolError) without disturbing the connection; 16 MiB through a bulk
    transfer arrives intact (SHA-256 checked by the server)."""
    async with Engine(None) as engine:
        for empty in (None, b"", "", [], {}, 0, False):
            assert await call(engine, server, "noop", empty) == empty
        large = bytes(range(256)) * ((4 * MIB - 64 * 1024) // 256)
        t0 = time.perf_counter()
        assert await call(engine, server, "noop", large, timeout_seconds=10.0) == large
        figures.record("calls: 4 MiB inline echo round trip", round((time.perf_counter() - t0) * 1e3, 1), "ms")
        conn = await engine.connection(server.address)
        with pytest.raises(LocalProtocolError, match="bulk"):
            await call(engine, server, "noop", large + bytes(128 * 1024))
        assert await call(engine, server, "noop", "after") == "after"
        assert await engine.connection(server.address) is conn and not conn.closed
        data = bytearray(hashlib.sha256(b"seed").digest()) * (16 * MIB // 32)
        handle = engine.expose(data, "r")
        t0 = time.perf_counter()
        digest = await call(engine, server, "sha_pull", {"bulk": handle.to_wire()}, timeout_seconds=30.0)
        figures.record("calls: 16 MiB bulk pull by the server", round((time.perf_counter() - t0) * 1e3, 1), "ms")
        assert digest == hashlib.sha256(data).hexdigest()


async def test_unknown_rpc_and_provider_and_handler_error(server: ServerProcess) -> None:
    """Each comes back as its own error type with a message that names what was wrong; the connection and
    the server carry on."""
    async with Engine(None) as engine:
        with pytest.raises(NoSuchRPC, match="no RPC named 'no_such_rpc'"):
            await call(engine, server, "no_such_rpc", 1)
        with pytest.raises(NoSuchProvider, match="no provider with id 999"):
            await call(engine, server, "noop", 1, provider_id=999)
        with pytest.raises(RemoteError) as info:
            await call(engine, server, "fail", "on purpose")
        assert info.value.remote_type == "ValueError"
        assert info.value.remote_message == "requested failure: on purpose"
        assert "requested failure" in info.value.remote_traceback and "Traceback" in info.value.remote_traceback
        assert await call(engine, server, "noop", "still serving") == "still serving"


async def test_one_millisecond_deadline(server: ServerProcess, figures: Any) -> None:
    """A 1 ms deadline ends with TimeoutError_ within 1 ms + 100 ms, on an open connection and on a new one;
    the server drops the work nobody waits for (a handler that would run forever is cancelled)."""
    elapsed, errors = [], []

    async def one(engine: Engine, rid: str) -> None:
        t0 = time.monotonic()
        try:
            await call(engine, server, "hold", {"id": rid}, timeout_seconds=0.001)
        except Exception as exc:  # the type is checked below
            errors.append(type(exc).__name__)
        else:
            errors.append("a result")
        elapsed.append(time.monotonic() - t0)

    async with Engine(None) as engine, Engine(None) as observer:
        await call(engine, server, "noop")  # connected
        for n in range(scaled(50, 500)):
            await one(engine, f"1ms-{n}")
        for n in range(5):
            async with Engine(None) as fresh:  # the deadline covers connecting too
                await one(fresh, f"1ms-new-{n}")

        def all_ended(events: list[list[Any]]) -> bool:
            started = {rid for what, rid, _ in events if what == "start"}
            ended = {rid for what, rid, _ in events if what in ("cancelled", "done")}
            return started <= ended

        deadline = time.monotonic() + WAIT_SECONDS  # until the server has ended every handler (polled, bounded)
        while not all_ended(events := await server_events(observer, server)) and time.monotonic() < deadline:
            pass  # each poll is a round trip to the server
        figures.record("calls: 1 ms deadline, worst time to an error", round(max(elapsed) * 1e3, 2), "ms")
        deadline_names = ("DeadlineExceeded", "Dropped")  # Dropped: the server says the handler never ran
        wrong = sum(1 for e in errors if e not in deadline_names)
        figures.record("calls: 1 ms deadline, calls ending other than DeadlineExceeded", wrong, f"of {len(errors)}")
        assert max(elapsed) <= 0.001 + SLACK_SECONDS
        assert wrong == 0, sorted(set(errors))
        assert all_ended(events), "a handler whose caller gave up 1 ms after calling is still running"
        assert await call(engine, server, "noop", "ok") == "ok"


async def test_cancel_after_the_handler_started_reaches_the_server_within_100_ms(
    server: ServerProcess, figures: Any
) -> None:
    """The caller cancels a call whose handler runs: the handler is cancelled on the server within 100 ms
    (CANCEL frame), and the server keeps serving."""
    lags = []
    async with Engine(None) as engine, Engine(None) as observer:
        for n in range(scaled(10, 100)):
            rid = f"cancel-after-{n}"
            task = asyncio.create_task(call(engine, server, "hold", {"id": rid}, timeout_seconds=30.0))
            events: list[list[Any]] = []

            async def refresh(_rid: str = rid, _events: list[list[Any]] = events) -> bool:
                _events[:] = await server_events(observer, server)
                return any(e[0] == "start" and e[1] == _rid for e in _events)

            await check_until(refresh, what=f"the server to start {rid}")
            cancelled_at = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            seen = None
            while seen is None and time.monotonic() - cancelled_at < 5.0:
                await refresh()
                seen = next((t for what, r, t in events if what == "cancelled" and r == rid), None)
            assert seen is not None, f"the server never saw {rid} cancelled"
            lags.append(seen - cancelled_at)
        figures.record("calls: cancel after start, server sees it (max)", round(max(lags) * 1e3, 2), "ms")
        assert max(lags) < SLACK_SECONDS
        assert await call(engine, server, "noop", 1) == 1


async def test_cancel_before_the_handler_started_means_it_never_runs(
    procs: Procs, tmp_path: Path, figures: Any
) -> None:
    """The server takes 2 calls per connection at a time (max_inflight_per_connection=2, then it stops
    reading). A third call waits in the socket; the caller cancels it; when the first two finish, the
    server reads the request and its CANCEL together: the handler never runs, the server logs no warning
    (no un-awaited coroutine), and it keeps serving."""
    server = procs.spawn(service_config(tmp_path, kv=None, max_inflight_per_connection=2))
    async with Engine(None) as engine, Engine(None) as observer:
        busy = [
            asyncio.create_task(call(engine, server, "hold", {"id": f"busy-{n}", "seconds": 0.5})) for n in range(2)
        ]

        async def started(rid: str) -> bool:
            return any(e[0] == "start" and e[1] == rid for e in await server_events(observer, server))

        async def both_started() -> bool:
            return await started("busy-0") and await started("busy-1")

        await check_until(both_started, what="the server to start both busy calls")
        conn = await engine.connection(server.address)
        before = set(conn.pending)
        waiting = asyncio.create_task(call(engine, server, "hold", {"id": "never", "seconds": 0.0}, timeout_seconds=30))
        await wait_until(lambda: len(set(conn.pending) - before) == 1, what="the third request to be sent")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await asyncio.gather(*busy) == ["busy-0", "busy-1"]
        assert await call(engine, server, "noop", "after") == "after"  # the server read past the cancelled one
        events = await server_events(observer, server)
    figures.record("calls: cancel before start, handler runs", sum(e[1] == "never" for e in events), "times")
    assert not any(e[1] == "never" for e in events), events
    log = server.log()
    assert "never awaited" not in log and "Traceback" not in log, server.log_tail()


# --- every call ends on time ----------------------------------------------------------------------------------


async def test_every_call_ends_by_its_deadline_against_a_stopped_server(
    procs: Procs, tmp_path: Path, figures: Any
) -> None:
    """SIGSTOP: the server accepts TCP connections (the kernel does) but answers nothing. An RPC, a key-value
    write, a bulk pull from the server's buffer, an RPC that makes the server pull, admin status and
    add_provider, a call on a new connection and a call relying on the engine's default deadline all end
    with TimeoutError_ by their deadline + 100 ms. After SIGCONT the server serves again."""
    server = procs.spawn(service_config(tmp_path, kv="fast"))
    deadline = 1.0
    async with Engine(None) as engine, Engine(None, default_timeout_seconds=deadline) as defaulted:
        exposed = await call(engine, server, "expose", {"size": 4 * MIB, "seed": 1})
        handle = BulkHandle.from_wire(exposed["bulk"])
        mine = engine.expose(bytearray(4 * MIB), "r")
        await call(defaulted, server, "noop")
        admin = ServiceHandle(engine, server.address, timeout_seconds=deadline)
        server.signal(signal.SIGSTOP)
        try:
            fresh = Engine(None)
            await fresh.start()
            operations = {
                "rpc": call(engine, server, "noop", 1, timeout_seconds=deadline),
                "kv put": call(engine, server, "put", {"key": "k", "value": b"v"}, provider_id=KV_ID,
                               timeout_seconds=deadline),
                "bulk pull": engine.pull(handle, timeout_seconds=deadline),
                "rpc with a server-side pull": call(engine, server, "sha_pull", {"bulk": mine.to_wire()},
                                                    timeout_seconds=deadline),
                "admin status": admin.status(),
                "admin add_provider": admin.add_provider({"name": "late", "type": "reltest"}),
                "new connection": call(fresh, server, "noop", 1, timeout_seconds=deadline),
                "default deadline": call(defaulted, server, "noop", 1),
            }  # fmt: skip

            async def timed(aw: Any) -> tuple[BaseException | None, float]:
                t0 = time.monotonic()
                try:
                    await aw
                except BaseException as exc:  # recorded and checked below
                    return exc, time.monotonic() - t0
                return None, time.monotonic() - t0

            results = dict(zip(operations, await asyncio.gather(*map(timed, operations.values())), strict=True))
            await fresh.close()
        finally:
            server.signal(signal.SIGCONT)
        worst = max(seconds for _, seconds in results.values())
        figures.record("calls: stopped server, worst end of a 1 s-deadline operation", round(worst * 1e3, 1), "ms")
        for name, (exc, seconds) in results.items():
            assert isinstance(exc, TimeoutError_), f"{name}: {exc!r}"
            assert seconds <= deadline + SLACK_SECONDS, f"{name} ended after {seconds:.3f} s"
        assert await call(engine, server, "noop", "back", timeout_seconds=5.0) == "back"
        assert (await admin.status())["pid"] == server.pid


# --- retries: idempotent only ----------------------------------------------------------------------------------


async def test_idempotent_call_is_retried_across_a_restart_and_others_never_run_twice(
    procs: Procs, tmp_path: Path, figures: Any
) -> None:
    """Two calls are running when the server is killed (-9) and a replacement starts at the same address
    (a warm standby: it binds within milliseconds). The one marked idempotent is retried (jittered back-off,
    within its deadline) and succeeds on the new server; the other fails with ConnectionLost at once and is
    never re-sent: the journal shows it executed exactly once."""
    first = procs.spawn(service_config(tmp_path, kv=None))
    config = with_port(service_config(tmp_path, kv=None), address_port(first.address))
    config["providers"][0]["config"]["hold_cap_seconds"] = 0  # the replacement answers at once
    standby = procs.spawn(config, name="standby", standby=True)
    async with Engine(None) as engine:
        idem = asyncio.create_task(
            call(engine, first, "record", {"id": "idem", "hold_seconds": 30}, idempotent=True, timeout_seconds=10)
        )
        once = asyncio.create_task(
            call(engine, first, "record", {"id": "once", "hold_seconds": 30}, timeout_seconds=10)
        )
        await wait_until(lambda: journal_counts(tmp_path) == {"idem": 1, "once": 1}, what="both calls to run")
        first.kill()  # (returns once the process is gone; it blocks our loop, as go() does: neither is timed)
        killed_at = time.monotonic()
        with pytest.raises(ConnectionLost):
            await once
        once_failed = time.monotonic() - killed_at
        standby.go()
        assert await idem == "idem"
        idem_done = time.monotonic() - killed_at
        assert await call(engine, standby, "noop", "new server") == "new server"
    counts = journal_counts(tmp_path)
    figures.record("calls: non-idempotent call reported lost after kill -9", round(once_failed * 1e3, 1), "ms")
    figures.record("calls: idempotent call answered after kill -9 and restart", round(idem_done * 1e3, 1), "ms")
    assert once_failed < SLACK_SECONDS
    assert counts == {"idem": 2, "once": 1}, counts  # retried once on the new server; the other never re-sent
