"""The engine end to end: real engines over loopback TCP and unix sockets, on uvloop and the stdlib loop.

Every error kind comes back as its own exception and never stops the server; timeouts, cancellation,
shutdown with calls in flight, malformed input on the wire, authentication and the callpath."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from conftest import WAIT_SECONDS, register_test_rpcs, short_socket_path, wait_until

from svcframe import (
    AuthenticationFailed,
    Cancelled,
    ConfigError,
    ConnectionLost,
    Engine,
    NoSuchProvider,
    NoSuchRPC,
    Refused,
    RemoteError,
    Request,
    RPCError,
    TimeoutError_,
    wire,
)
from svcframe.engine import current_callpath
from svcframe.errors import AppError, DeadlineExceeded, Dropped, LocalProtocolError, MutationsDisabled, ResultTooLarge
from svcframe.wire import HEADER, HEADER_SIZE, Kind, encode_frame, pack_body, rpc_id, unpack_body

pytestmark = pytest.mark.asyncio

MakeEngine = Callable[..., Awaitable[Engine]]

VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 2**63 - 1, 2**64 - 1, -(2**63), 0.0, -2.5, 1e300, float("inf"),
    "", "hello", "ünïcödé ✓", "x" * 70000, b"", b"\x00\xff" * 5000, [], [1, "a", b"b", None, [2.5, [[]]]],
    {}, {"k": "v", "nested": {"list": [1, 2, {"deep": b"bytes"}]}, "": None},
]  # fmt: skip


async def call1(client: Engine, server: Engine, name: str, arg: Any = None, **kw: Any) -> Any:
    return await client.call(server.address, name, arg, provider_id=1, **kw)  # type: ignore[arg-type]


async def assert_serves(client: Engine, server: Engine) -> None:
    """The server still answers (after an error, a dropped connection, ...)."""
    assert await call1(client, server, "echo", {"still": "serving"}, timeout_seconds=WAIT_SECONDS) == {
        "still": "serving"
    }


def rpc_stats(engine: Engine, side: str, name: str) -> dict[str, Any]:
    rows = [r for r in engine.statistics()["rpcs"][side] if r["rpc"] == name and r["provider_id"] == 1]
    assert len(rows) == 1, f"no {side} statistics for {name!r}: {engine.statistics()['rpcs'][side]}"
    return rows[0]


def path_exists(path: str) -> bool:
    return os.path.exists(path)  # a local stat: fine in a test, kept out of the async functions for lint


# --- round trips -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("rpc", ["echo", "aecho"])
async def test_round_trip_of_msgpack_values(server: Engine, client: Engine, rpc: str) -> None:
    for value in VALUES:
        assert await call1(client, server, rpc, value) == value


async def test_empty_and_large_inline_args(server: Engine, client: Engine) -> None:
    assert await call1(client, server, "echo") is None
    assert await call1(client, server, "echo", b"") == b""
    big = os.urandom(3 * 1024 * 1024)
    assert await call1(client, server, "echo", big) == big
    text = "y" * (3 * 1024 * 1024)
    assert await call1(client, server, "aecho", text) == text


async def test_concurrent_calls_all_get_their_own_result(server: Engine, client: Engine) -> None:
    calls = [call1(client, server, "echo" if i % 2 else "aecho", {"i": i, "s": "x" * i}) for i in range(200)]
    results = await asyncio.gather(*calls)
    assert results == [{"i": i, "s": "x" * i} for i in range(200)]


async def test_handler_sees_the_request(server: Engine, client: Engine) -> None:
    def whoami(req: Request, arg: Any) -> Any:
        return {
            "remaining": req.remaining_seconds(),
            "peer": req.peer_address,
            "rpc": req.rpc_name,
            "provider": req.provider_id,
        }

    server.register(1, "whoami", whoami)
    seen = await call1(client, server, "whoami", timeout_seconds=5.0)
    assert 4.0 < seen["remaining"] <= 5.0
    assert seen["peer"] is None  # a client-only engine has no address
    assert (seen["rpc"], seen["provider"]) == ("whoami", 1)


# --- errors: each kind is its own exception and the server keeps serving ----------------------------------------


async def test_no_such_rpc(server: Engine, client: Engine) -> None:
    with pytest.raises(NoSuchRPC, match="nope"):
        await call1(client, server, "nope")
    await assert_serves(client, server)


async def test_no_such_provider(server: Engine, client: Engine) -> None:
    with pytest.raises(NoSuchProvider):
        await client.call(server.address, "echo", 1, provider_id=2)  # type: ignore[arg-type]
    await assert_serves(client, server)


@pytest.mark.parametrize("rpc", ["boom", "aboom"])
async def test_handler_exception_is_a_remote_error(server: Engine, client: Engine, rpc: str) -> None:
    async def aboom(req: Request, arg: Any) -> Any:
        await asyncio.sleep(0)
        raise ValueError("boom")

    server.register(1, "aboom", aboom)
    with pytest.raises(RemoteError) as info:
        await call1(client, server, rpc)
    err = info.value
    assert not isinstance(err, NoSuchRPC | NoSuchProvider | TimeoutError_ | ConnectionLost)
    assert err.remote_type == "ValueError"
    assert err.remote_message == "boom"
    assert "Traceback" in err.remote_traceback and f"in {rpc}" in err.remote_traceback  # an authenticated caller
    assert "ValueError: boom" in str(err)
    await assert_serves(client, server)


async def test_tracebacks_go_only_to_authenticated_callers(address: str, make_engine: MakeEngine) -> None:
    server = await make_engine(address, secret=None)
    register_test_rpcs(server)
    client = await make_engine(None, secret=None)
    with pytest.raises(RemoteError) as info:
        await call1(client, server, "boom")
    assert info.value.remote_type == "ValueError" and info.value.remote_traceback == ""
    assert "Traceback" not in str(info.value) and "conftest.py" not in str(info.value)
    server.send_tracebacks = True  # configured: now it does
    with pytest.raises(RemoteError) as info:
        await call1(client, server, "boom")
    assert "Traceback" in info.value.remote_traceback


async def test_app_error_reaches_the_caller_with_code_and_details(server: Engine, client: Engine) -> None:
    class NotFound(AppError):
        code = "NotFound"

    async def find(req: Request, arg: Any) -> Any:
        raise NotFound(f"no key {arg!r}", details={"key": arg})

    def refuse(req: Request, arg: Any) -> Any:
        raise MutationsDisabled("read-only server")

    server.register(1, "find", find)
    server.register(1, "refuse", refuse)
    with pytest.raises(AppError) as info:
        await call1(client, server, "find", "k1")
    assert (info.value.code, info.value.message, info.value.details) == ("NotFound", "no key 'k1'", {"key": "k1"})
    assert not isinstance(info.value, RemoteError) and "Traceback" not in str(info.value)
    with pytest.raises(MutationsDisabled, match="read-only server"):
        await call1(client, server, "refuse")
    assert rpc_stats(server, "target", "find")["errors"] == 1
    await assert_serves(client, server)


async def test_a_deadline_that_passes_before_the_handler_runs_is_dropped(server: Engine, client: Engine) -> None:
    """Dropped (safe to retry) only when the handler never started; once it ran, DeadlineExceeded says the
    outcome is unknown (a write applied and reported as dropped would be written twice)."""
    ran: list[str] = []

    async def slow_write(req: Request, arg: Any) -> Any:
        ran.append(arg)
        await asyncio.sleep(30)

    def hog(req: Request, arg: Any) -> Any:
        end = time.perf_counter() + 0.05  # blocks the loop past the next request's deadline, before it starts
        while time.perf_counter() < end:
            pass

    server.register(1, "slow_write", slow_write)
    server.register(1, "hog", hog)
    server.register(1, "noop", lambda req, arg: None)
    with pytest.raises(DeadlineExceeded) as info:
        await call1(client, server, "slow_write", "a", timeout_seconds=0.05)
    assert not isinstance(info.value, Dropped) and ran == ["a"]
    conn = await client.connection(server.address)  # type: ignore[arg-type]
    # The first call of a turn leaves at once and the calls behind it leave together at the end of the turn
    # (corked), so the server reads the hog and "b" in one batch: "b" is dispatched after the hog, its
    # deadline passed (had "b" come in a later read, its budget would count from that read, and a handler
    # starts at once: its first step runs as it is dispatched)
    outcomes = await asyncio.gather(
        call1(client, server, "noop", timeout_seconds=5.0),
        call1(client, server, "hog", timeout_seconds=5.0),
        call1(client, server, "slow_write", "b", timeout_seconds=0.01),
        return_exceptions=True,
    )
    assert outcomes[:2] == [None, None] and isinstance(outcomes[2], DeadlineExceeded), outcomes
    assert ran == ["a"], "the handler ran although its deadline had passed before it started"
    assert conn is await client.connection(server.address)  # type: ignore[arg-type]
    await assert_serves(client, server)


async def test_unencodable_result_is_a_remote_error(server: Engine, client: Engine) -> None:
    server.register(1, "bad_result", lambda req, arg: object())
    with pytest.raises(RemoteError) as info:
        await call1(client, server, "bad_result")
    assert info.value.remote_type == "LocalProtocolError"
    await assert_serves(client, server)


async def test_unencodable_argument_is_a_local_error(server: Engine, client: Engine) -> None:
    await assert_serves(client, server)
    with pytest.raises(LocalProtocolError):
        await call1(client, server, "echo", {"x": object()})
    await assert_serves(client, server)


async def test_non_strict_argument_is_refused_by_the_receiver_or_in_debug_mode_by_the_sender(
    server: Engine, client: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An int map key is not strict msgpack. In debug mode (``svcframe.wire.DEBUG_WIRE``) the caller's
    pack_body refuses it and nothing is sent; otherwise the server's strict decoder refuses it (BadRequest,
    and that connection is closed) and the client's next call works on a new connection."""
    await assert_serves(client, server)
    conn = await client.connection(server.address)  # type: ignore[arg-type]
    monkeypatch.setattr(wire, "DEBUG_WIRE", True)
    with pytest.raises(LocalProtocolError, match="map key"):
        await call1(client, server, "echo", {1: "x"})
    await assert_serves(client, server)
    assert await client.connection(server.address) is conn and not conn.closed  # type: ignore[arg-type]
    monkeypatch.setattr(wire, "DEBUG_WIRE", False)
    with pytest.raises(RemoteError) as info:
        await call1(client, server, "echo", {1: "x"}, timeout_seconds=WAIT_SECONDS)
    assert info.value.remote_type == "BadRequest" and "map key" in info.value.remote_message
    await assert_serves(client, server)


async def test_timeout(server: Engine, client: Engine) -> None:
    loop = asyncio.get_running_loop()
    for timeout in (0.05, 0.2):
        start = loop.time()
        with pytest.raises(TimeoutError_) as info:
            await call1(client, server, "sleep", 30, timeout_seconds=timeout)
        elapsed = loop.time() - start
        # a deadline is an RPCError, never an OSError (an `except OSError` must not swallow it)
        assert isinstance(info.value, RPCError) and not isinstance(info.value, OSError)
        assert timeout - 0.002 <= elapsed < timeout + 0.1
        await assert_serves(client, server)


async def test_many_short_timeouts_are_all_timeout_errors(server: Engine, client: Engine) -> None:
    """Every expired deadline surfaces as TimeoutError_, never as a bare CancelledError, whatever the
    loop's clock granularity (uvloop's clock has millisecond resolution)."""
    await assert_serves(client, server)  # connected: only the deadlines are under test
    calls = [call1(client, server, "sleep", 30, timeout_seconds=0.005 + i / 1000) for i in range(60)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    wrong = [(i, type(o).__name__) for i, o in enumerate(outcomes) if not isinstance(o, TimeoutError_)]
    assert wrong == [], f"{len(wrong)} of 60 expired calls did not raise TimeoutError_: {wrong[:5]}"
    await assert_serves(client, server)


class SilentListener:
    """A socket that accepts connections and never says a word (a hung peer). Counts the connections
    accepted and those the other side has hung up."""

    def __init__(self) -> None:
        self.accepted = 0
        self.hung_up = 0
        self.address = ""
        self._server: asyncio.AbstractServer | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.append(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            with contextlib.suppress(ConnectionError):
                await reader.read()
            self.hung_up += 1
        finally:
            writer.close()
            self._tasks.discard(task)

    async def __aenter__(self) -> SilentListener:
        return self

    async def start(self, address: str) -> str:
        if address.startswith("unix://"):
            self._server = await asyncio.start_unix_server(self._hold, address[len("unix://") :])
            self.address = address
        else:
            self._server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
            self.address = f"tcp://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.address

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for writer in self._writers:
            writer.close()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=WAIT_SECONDS)


async def test_connect_timeout_is_timeout_error(address: str, client: Engine) -> None:
    async with SilentListener() as hung:
        target = await hung.start(address)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError_):
            await client.call(target, "echo", 1, provider_id=1, timeout_seconds=0.1)
        assert loop.time() - start < 0.2
        assert hung.accepted == 1


async def test_connect_timeout_does_not_leak_the_socket(address: str, client: Engine) -> None:
    """A connection attempt abandoned at its deadline is closed, not kept open until engine.close()."""
    async with SilentListener() as hung:
        target = await hung.start(address)
        with pytest.raises(TimeoutError_):
            await client.call(target, "echo", 1, provider_id=1, timeout_seconds=0.05)
        await wait_until(lambda: hung.hung_up == 1, within=1.0, what="the client to close the abandoned socket")
        assert client.statistics()["connections"] == 0


async def test_one_callers_connect_timeout_does_not_fail_others(address: str, client: Engine) -> None:
    """Calls waiting for the same connection to be set up each keep their own deadline."""
    async with SilentListener() as hung:
        target = await hung.start(address)
        loop = asyncio.get_running_loop()
        start = loop.time()
        short = asyncio.create_task(client.call(target, "echo", 1, provider_id=1, timeout_seconds=0.05))
        long = asyncio.create_task(client.call(target, "echo", 1, provider_id=1, timeout_seconds=0.5))
        outcomes = await asyncio.wait_for(asyncio.gather(short, long, return_exceptions=True), WAIT_SECONDS)
        assert [type(o).__name__ for o in outcomes] == ["DeadlineExceeded", "DeadlineExceeded"]
        assert loop.time() - start >= 0.45  # the long call waited for its own deadline


async def test_nothing_listening_is_connection_lost(address: str, client: Engine) -> None:
    if address.startswith("tcp"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            target = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    else:
        target = f"unix://{address[len('unix://') :]}"  # the fixture's path: nobody listens there
        assert not path_exists(target[len("unix://") :])
    with pytest.raises(ConnectionLost):
        await client.call(target, "echo", 1, provider_id=1, timeout_seconds=WAIT_SECONDS)


async def test_call_after_server_closed_is_connection_lost(address: str, make_engine: MakeEngine) -> None:
    server = await make_engine(address)
    register_test_rpcs(server)
    client = await make_engine(None)
    await assert_serves(client, server)
    await server.close()
    for _ in range(3):  # the old connection is gone; redialling fails too
        with pytest.raises(ConnectionLost):
            await call1(client, server, "echo", 1, timeout_seconds=WAIT_SECONDS)


async def test_server_learns_the_caller_cancelled(server: Engine, client: Engine) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def wait_forever(req: Request, arg: Any) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    server.register(1, "wait_forever", wait_forever)
    task = asyncio.create_task(call1(client, server, "wait_forever", timeout_seconds=60))
    await asyncio.wait_for(started.wait(), WAIT_SECONDS)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(cancelled.wait(), WAIT_SECONDS)
    await wait_until(lambda: server.statistics()["handlers_running"] == 0, what="the handler to end")
    await assert_serves(client, server)


async def test_server_learns_the_callers_deadline_passed(server: Engine, client: Engine) -> None:
    """The deadline travels with the request "so the server knows when nobody waits any more": a
    handler still running after its caller timed out is cancelled instead of running on for nobody."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def wait_forever(req: Request, arg: Any) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    server.register(1, "wait_forever", wait_forever)
    with pytest.raises(TimeoutError_):
        await call1(client, server, "wait_forever", timeout_seconds=0.1)
    assert started.is_set()
    await asyncio.wait_for(cancelled.wait(), 2.0)
    await assert_serves(client, server)


# --- bad input on the wire ------------------------------------------------------------------------------------


async def open_raw(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if address.startswith("unix://"):
        return await asyncio.open_unix_connection(address[len("unix://") :])
    host, _, port = address[len("tcp://") :].rpartition(":")
    return await asyncio.open_connection(host, int(port))


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    header = await asyncio.wait_for(reader.readexactly(HEADER_SIZE), WAIT_SECONDS)
    fields = HEADER.unpack(header)
    return fields[2], await reader.readexactly(fields[6])


async def assert_closed_by_peer(reader: asyncio.StreamReader) -> None:
    async def drain() -> None:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while await reader.read(65536):
                pass

    await asyncio.wait_for(drain(), WAIT_SECONDS)


def client_hello() -> bytes:
    return encode_frame(Kind.HELLO, 0, pack_body({"engine_id": "raw-client", "address": None}))


MALFORMED = {
    "http": b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: test\r\nAccept: */*\r\nConnection: close\r\n\r\n",
    "zeros": bytes(HEADER_SIZE * 2),
    "request-before-hello": encode_frame(Kind.REQUEST, 1, pack_body(1), provider_id=1, rpc=rpc_id("echo")),
    "bad-kind-after-hello": client_hello() + b"SF\x01\x63" + bytes(HEADER_SIZE - 4),
    "bad-magic-after-hello": client_hello() + b"XX" + encode_frame(Kind.REQUEST, 1)[2:],
    "malformed-hello": encode_frame(Kind.HELLO, 0, b"\xc1"),
    "bulk-data-nobody-expects": client_hello() + encode_frame(Kind.BULK_DATA_PUSH, 5, b"abc"),
    "oversized-after-hello": client_hello()
    + HEADER.pack(b"SF", 1, Kind.REQUEST, 0, 1, 0, 2**32 - 1, 1, 0, 0, 0, 0, 0, 0, bytes(16), 0, 0),
}


async def test_oversized_argument_is_refused_before_sending(address: str, make_engine: MakeEngine) -> None:
    """The server announces its frame limit in its HELLO: an argument over it fails locally, and the
    connection is not disturbed."""
    server = await make_engine(address, max_body_bytes=4096, bulk_chunk_bytes=4096)
    register_test_rpcs(server)
    client = await make_engine(None)
    await assert_serves(client, server)
    conn = await client.connection(server.address)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="bulk"):
        await call1(client, server, "echo", b"x" * 8192, timeout_seconds=WAIT_SECONDS)
    await assert_serves(client, server)
    assert await client.connection(server.address) is conn and not conn.closed  # type: ignore[arg-type]


async def test_result_over_the_callers_limit_is_result_too_large(
    address: str, make_engine: MakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller with a small frame limit gets ResultTooLarge naming its limit and both fixes, not a dropped
    connection, and the server does not log it as a handler failure (the handler did nothing wrong)."""
    server = await make_engine(address)
    server.register(1, "big", lambda req, n: b"r" * n)
    client = await make_engine(None, max_body_bytes=4096, bulk_chunk_bytes=4096)
    assert await call1(client, server, "big", 100) == b"r" * 100
    conn = await client.connection(server.address)  # type: ignore[arg-type]
    with pytest.raises(ResultTooLarge, match=r"over the caller's 4096-byte limit .*max_body_bytes.*into=buffer"):
        await call1(client, server, "big", 16384, timeout_seconds=WAIT_SECONDS)
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    assert await call1(client, server, "big", 10) == b"r" * 10
    assert await client.connection(server.address) is conn and not conn.closed  # type: ignore[arg-type]


async def test_oversized_request_frame_closes_only_that_connection(address: str, make_engine: MakeEngine) -> None:
    # no shared secret on either end: the raw socket below speaks an unauthenticated handshake
    server = await make_engine(address, max_body_bytes=4096, bulk_chunk_bytes=4096, secret=None)
    register_test_rpcs(server)
    bystander = await make_engine(None, secret=None)
    await assert_serves(bystander, server)
    bystander_conn = await bystander.connection(server.address)  # type: ignore[arg-type]
    reader, writer = await open_raw(server.address)  # type: ignore[arg-type]
    try:
        await read_frame(reader)
        writer.write(client_hello())
        fits = pack_body(b"x" * 3600)
        writer.write(encode_frame(Kind.REQUEST, 1, fits, provider_id=1, rpc=rpc_id("echo"), deadline_usec=10**7))
        kind, body = await read_frame(reader)
        assert kind == Kind.RESPONSE and unpack_body(body) == b"x" * 3600  # under the limit: served
        too_big = pack_body(b"x" * 8192)
        writer.write(encode_frame(Kind.REQUEST, 2, too_big, provider_id=1, rpc=rpc_id("echo")))
        await assert_closed_by_peer(reader)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            await writer.wait_closed()
    await assert_serves(bystander, server)
    assert await bystander.connection(server.address) is bystander_conn and not bystander_conn.closed  # type: ignore[arg-type]


@pytest.mark.parametrize("payload", list(MALFORMED), ids=list(MALFORMED))
async def test_malformed_bytes_close_that_connection_only(server: Engine, client: Engine, payload: str) -> None:
    await assert_serves(client, server)
    reader, writer = await open_raw(server.address)  # type: ignore[arg-type]
    try:
        kind, _ = await read_frame(reader)  # the server speaks first
        assert kind == Kind.HELLO
        writer.write(MALFORMED[payload])
        await assert_closed_by_peer(reader)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            await writer.wait_closed()
    await assert_serves(client, server)
    assert await client.call(server.address, "aecho", [1], provider_id=1) == [1]  # type: ignore[arg-type]


async def test_raw_client_that_hangs_up_mid_frame_does_not_disturb_the_server(server: Engine, client: Engine) -> None:
    reader, writer = await open_raw(server.address)  # type: ignore[arg-type]
    await read_frame(reader)
    writer.write(client_hello() + encode_frame(Kind.REQUEST, 1, pack_body("x" * 100))[:90])
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    await wait_until(lambda: server.statistics()["connections"] == 0, what="the server to drop the connection")
    await assert_serves(client, server)


# --- shutdown ------------------------------------------------------------------------------------------------


async def test_client_close_fails_calls_in_flight_and_leaves_no_task(address: str, make_engine: MakeEngine) -> None:
    server = await make_engine(address)
    register_test_rpcs(server)
    client = await make_engine(None)
    calls = [asyncio.create_task(call1(client, server, "sleep", 30, timeout_seconds=60)) for _ in range(5)]
    await wait_until(lambda: server.statistics()["handlers_running"] == 5, what="5 running handlers")
    await asyncio.wait_for(client.close(), WAIT_SECONDS)
    outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT_SECONDS)
    assert all(isinstance(o, ConnectionLost) for o in outcomes), outcomes
    await wait_until(lambda: server.statistics()["handlers_running"] == 0, what="the server to cancel handlers")
    await asyncio.wait_for(server.close(), WAIT_SECONDS)
    assert asyncio.all_tasks() == {asyncio.current_task()}
    with pytest.raises(ConnectionLost):
        await call1(client, server, "echo")  # a closed engine makes no new connection


async def test_server_close_fails_calls_in_flight_and_leaves_no_task(address: str, make_engine: MakeEngine) -> None:
    server = await make_engine(address)
    register_test_rpcs(server)
    client = await make_engine(None)
    calls = [asyncio.create_task(call1(client, server, "sleep", 30, timeout_seconds=60)) for _ in range(5)]
    await wait_until(lambda: server.statistics()["handlers_running"] == 5, what="5 running handlers")
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.wait_for(server.close(drain_timeout_seconds=0.2), WAIT_SECONDS)
    outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT_SECONDS)
    assert loop.time() - start < 2.0
    assert all(isinstance(o, ConnectionLost | Cancelled | Refused) for o in outcomes), outcomes
    await client.close()
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_server_close_lets_running_handlers_finish(address: str, make_engine: MakeEngine) -> None:
    server = await make_engine(address)
    register_test_rpcs(server)
    client, late = await make_engine(None), await make_engine(None)
    await assert_serves(late, server)
    running = asyncio.create_task(call1(client, server, "sleep", 0.3, timeout_seconds=WAIT_SECONDS))
    await wait_until(lambda: server.statistics()["handlers_running"] == 1, what="the handler to start")
    closing = asyncio.create_task(server.close(drain_timeout_seconds=WAIT_SECONDS))
    await wait_until(lambda: server.closing, what="the server to start closing")
    with pytest.raises(Refused):
        await call1(late, server, "echo", 1, timeout_seconds=WAIT_SECONDS)  # new work is refused while draining
    assert await running == 0.3
    await asyncio.wait_for(closing, WAIT_SECONDS)


# --- callpath, authentication, registration, statistics ----------------------------------------------------------


async def test_nested_call_extends_the_callpath(server: Engine, client: Engine) -> None:
    def inner(req: Request, arg: Any) -> Any:
        return {"ctx": current_callpath(), "req": req.callpath}

    async def outer(req: Request, arg: Any) -> Any:
        child = await req.engine.call(req.engine.address, "inner", None, provider_id=1)  # type: ignore[arg-type]
        return {"ctx": current_callpath(), "req": req.callpath, "child": child}

    server.register(1, "inner", inner)
    server.register(1, "outer", outer)
    assert current_callpath() == 0
    got = await call1(client, server, "outer")
    assert got["ctx"] == got["req"] != 0
    assert got["child"]["ctx"] == got["child"]["req"] != 0
    assert got["child"]["req"] != got["req"]
    direct = await call1(client, server, "inner")
    assert direct["req"] != got["child"]["req"]  # same RPC, different ancestry
    assert current_callpath() == 0


SECRET_S = b"s" * 32


async def test_short_or_empty_secrets_are_refused() -> None:
    for bad in (b"", b"   ", b"short"):
        with pytest.raises(ConfigError, match="shared secret"):
            Engine(None, secret=bad)


async def test_a_client_with_a_secret_refuses_a_server_that_cannot_prove_it(
    address: str, make_engine: MakeEngine
) -> None:
    server = await make_engine(address, secret=None)
    register_test_rpcs(server)
    holder = await make_engine(None, secret=SECRET_S)
    with pytest.raises(AuthenticationFailed, match="does not authenticate"):
        await call1(holder, server, "echo", 1, timeout_seconds=WAIT_SECONDS)


async def test_shared_secret_accepts_the_same_secret(address: str, make_engine: MakeEngine) -> None:
    server = await make_engine(address, secret=SECRET_S)
    register_test_rpcs(server)
    good = await make_engine(None, secret=SECRET_S)
    assert await call1(good, server, "echo", "authenticated") == "authenticated"
    assert await call1(good, server, "aecho", "again") == "again"


@pytest.mark.parametrize("secret", [None, b"wrong-secret-of-16+bytes"], ids=["no-secret", "wrong-secret"])
async def test_shared_secret_refuses_others(address: str, make_engine: MakeEngine, secret: bytes | None) -> None:
    server = await make_engine(address, secret=SECRET_S)
    register_test_rpcs(server)
    good = await make_engine(None, secret=SECRET_S)
    assert await call1(good, server, "echo", "authenticated") == "authenticated"
    intruder = await make_engine(None, secret=secret)
    with pytest.raises(AuthenticationFailed):
        await call1(intruder, server, "echo", 1, timeout_seconds=WAIT_SECONDS)
    with pytest.raises(AuthenticationFailed):  # and again: no state left behind that lets it in
        await call1(intruder, server, "echo", 1, timeout_seconds=WAIT_SECONDS)
    assert await call1(good, server, "echo", "still") == "still"


async def test_registration_table(server: Engine) -> None:
    assert [(r.provider_id, r.name) for r in server.registrations()] == [
        (1, "aecho"), (1, "boom"), (1, "echo"), (1, "sleep"),
    ]  # fmt: skip
    assert all(r.rpc_id == rpc_id(r.name) for r in server.registrations())
    assert {r.name: r.is_coroutine for r in server.registrations()} == {
        "aecho": True, "boom": False, "echo": False, "sleep": True,
    }  # fmt: skip
    with pytest.raises(ConfigError, match="already registered"):
        server.register(1, "echo", lambda req, arg: arg)
    server.register(2, "echo", lambda req, arg: arg)  # the same name under another provider is fine
    for bad in (-1, 65536):
        with pytest.raises(ConfigError):
            server.register(bad, "x", lambda req, arg: arg)
    assert [(r.provider_id, r.name) for r in server.registrations()][-1] == (2, "echo")


async def test_deregistered_provider_is_no_such_provider(server: Engine, client: Engine) -> None:
    await assert_serves(client, server)
    server.deregister_provider(1)
    assert server.registrations() == []
    with pytest.raises(NoSuchProvider):
        await call1(client, server, "echo", 1)


async def test_statistics_count_calls_at_origin_and_target(server: Engine, client: Engine) -> None:
    for i in range(7):
        await call1(client, server, "echo", i)
    await asyncio.gather(*(call1(client, server, "aecho", i) for i in range(5)))
    for _ in range(3):
        with pytest.raises(RemoteError):
            await call1(client, server, "boom")
    for side, engine, step in (("origin", client, "total_usec"), ("target", server, "handler_usec")):
        assert rpc_stats(engine, side, "echo")[step]["count"] == 7
        assert rpc_stats(engine, side, "aecho")[step]["count"] == 5
        assert rpc_stats(engine, side, "echo")["errors"] == 0
        assert rpc_stats(engine, side, "boom")["errors"] == 3
        assert rpc_stats(engine, side, "echo")["parent_rpc"] == ""  # called from outside any handler
    assert rpc_stats(client, "origin", "boom")["total_usec"]["count"] == 3
    origin, target = rpc_stats(client, "origin", "echo"), rpc_stats(server, "target", "echo")
    assert origin["peer"] == server.address
    # the steps nest: the handler and its queueing happen inside the caller's round trip
    assert target["handler_usec"]["max"] < origin["total_usec"]["max"]
    assert 0 < origin["serialize_usec"]["min"] <= origin["serialize_usec"]["p50"] <= origin["total_usec"]["p50"]
    assert target["request_bytes"]["min"] > 0 and origin["response_bytes"]["count"] == 7
    stats = server.statistics()
    assert stats["address"] == server.address and stats["connections"] == 1
    assert stats["handlers_running"] == 0
    assert client.statistics()["rpcs"]["target"] == []
    assert server.statistics()["rpcs"]["origin"] == []


async def test_invalid_configuration_is_config_error() -> None:
    for kwargs in ({"default_timeout_seconds": 0}, {"bulk_chunk_bytes": 0}, {"progress_mode": "sometimes"}):
        with pytest.raises(ConfigError):
            Engine(None, **kwargs)
    for addr in ("http://x:1", "tcp://nohost", "tcp://h:99999", "unix://relative", "unix:///" + "p" * 120):
        with pytest.raises(ConfigError):
            Engine(addr)


async def test_unix_socket_is_removed_on_close(make_engine: MakeEngine) -> None:
    path = short_socket_path()
    try:
        engine = await make_engine(f"unix://{path}")
        assert path_exists(path)
        await engine.close()
        assert not path_exists(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.rmdir(os.path.dirname(path))


@pytest.mark.asyncio
async def test_a_deadline_beyond_the_headers_32_bits_is_carried_as_no_deadline(make_engine: Any) -> None:
    """A caller may wait longer than the header's 32-bit microsecond deadline holds (~71 min): the call
    goes out without a server-side deadline instead of failing to encode."""
    from svcframe.deadlines import wire_deadline

    server = await make_engine("tcp://127.0.0.1:0")
    client = await make_engine(None)
    seen: list[float | None] = []
    server.register(1, "deadline", lambda req, arg: seen.append(req.deadline))
    await client.call(server.address, "deadline", None, provider_id=1, timeout_seconds=10_000.0)
    await client.call(server.address, "deadline", None, provider_id=1, timeout_seconds=60.0)
    assert seen[0] is None and seen[1] is not None
    assert wire_deadline(4294.0) == 4_294_000_000 and wire_deadline(4295.0) == 0 and wire_deadline(-1.0) == 1


async def test_current_request_in_sync_and_async_handlers_and_their_tasks(server: Engine, client: Engine) -> None:
    """``current_request.get()`` is the running handler's request, sync or async; tasks an async handler
    spawns keep it (they copy its context), tasks a sync handler spawns run after it returned and start
    a new callpath (as a ULT spawned from a Margo handler does)."""
    from svcframe.engine import current_request

    seen: dict[str, Any] = {}

    def sync_handler(req: Request, arg: Any) -> None:
        seen["sync"] = current_request.get() is req
        seen["sync_task"] = asyncio.get_running_loop().create_task(_callpath_later())

    async def async_handler(req: Request, arg: Any) -> None:
        seen["async"] = current_request.get() is req
        seen["async_task"] = asyncio.get_running_loop().create_task(_callpath_later())
        seen["async_callpath"] = req.callpath

    async def _callpath_later() -> int:
        await asyncio.sleep(0)
        return current_callpath()

    server.register(1, "sync_handler", sync_handler)
    server.register(1, "async_handler", async_handler)
    await call1(client, server, "sync_handler")
    await call1(client, server, "async_handler")
    assert seen["sync"] and seen["async"]
    assert await seen["sync_task"] == 0
    assert await seen["async_task"] == seen["async_callpath"] != 0
    assert current_request.get() is None
