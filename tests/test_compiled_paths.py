"""The compiled request, read and call paths (svcframe._speedups.serve_request, ConnectionState.buffer_updated and
begin_call) against their definitions (Handlers._on_request, Connection.buffer_updated and
Calls._call_once): the same calls, made through each, end the same way for the caller, count the same in both
engines' statistics and leave nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from conftest import wait_until

from svcframe import AppError, Engine, Request
from svcframe import engine as engine_module
from svcframe import handlers as handlers_module
from svcframe.bulk import CMA_MIN_BYTES
from svcframe.calls import Calls
from svcframe.handlers import current_request
from svcframe.monitoring import ALWAYS_TIMED
from svcframe.transport import Connection
from svcframe.wire import PURE

pytestmark = pytest.mark.skipif(PURE, reason="the compiled paths are not built (or SVCFRAME_PURE is set)")

#: Calls per case: past the first ALWAYS_TIMED of a callpath, most calls are untimed (the compiled paths' case).
REPEAT = ALWAYS_TIMED + 40


def _register(server: Engine) -> None:
    """Handlers whose results and errors take every branch of the request path."""
    sync: dict[str, Callable[[Request, Any], Any]] = {
        "none": lambda req, arg: None,
        "small": lambda req, arg: arg,  # bytes up to 4 KiB: answered in the request path itself
        "over_small": lambda req, arg: b"x" * 4097,
        "large": lambda req, arg: b"y" * 200_000,
        "huge": lambda req, arg: bytes(range(250)) * 1_200,  # (300,000: over one frame of this server's)
        "obj": lambda req, arg: {"a": [1, 2], "arg": arg},
        "text": lambda req, arg: "hi",
        "awaitable": lambda req, arg: asyncio.sleep(0, result=b"later"),
        "whoami": lambda req, arg: [req.rpc_name, current_request.get() is req, req.provider_id],
        "nested": lambda req, arg: req.engine.call(server.address or "", "small", b"n", provider_id=1),
    }

    def app_error(req: Request, arg: Any) -> Any:
        raise AppError("not here", code="NotHere", details={"k": 1})

    def fails(req: Request, arg: Any) -> Any:
        raise ValueError("bad value")

    async def aecho(req: Request, arg: Any) -> Any:
        return arg

    async def slow(req: Request, arg: Any) -> Any:
        await asyncio.sleep(30)

    async def acancelled(req: Request, arg: Any) -> Any:
        raise asyncio.CancelledError

    async def asuspends(req: Request, arg: Any) -> Any:
        await asyncio.sleep(0)
        return [arg, current_request.get() is req]

    def as_async(fn: Callable[[Request, Any], Any]) -> Callable[[Request, Any], Any]:
        async def handler(req: Request, arg: Any) -> Any:  # the same result from an async def's first step
            result = fn(req, arg)
            return await result if inspect.isawaitable(result) else result

        return handler

    plain = {**sync, "app_error": app_error, "fails": fails}
    for name, fn in [*plain.items(), ("aecho", aecho), ("slow", slow), ("acancelled", acancelled),
                     ("asuspends", asuspends), *((f"async {n}", as_async(f)) for n, f in plain.items())]:  # fmt: skip
        server.register(1, name, fn)


def _shown(value: object, address: str) -> object:
    """A call's outcome, comparable across runs (the server's address differs)."""
    if isinstance(value, BaseException):  # (a remote traceback shows the frames of the path it took: not compared)
        return (type(value).__name__, str(value).replace(address, "<server>").partition("\n--- remote")[0])
    return value


async def _outcomes(make_engine: Callable[..., Awaitable[Engine]], compiled: bool, transport: str) -> dict[str, Any]:
    """Every case REPEAT times through one implementation; what the caller saw and both engines counted."""
    from conftest import short_socket_path

    listen = "tcp://127.0.0.1:0" if transport == "tcp" else f"unix://{short_socket_path()}"
    server = await make_engine(listen, max_output_bytes=512 * 1024)  # (one frame: up to 256 KiB)
    _register(server)
    client = await make_engine(None)
    address = server.address or ""
    seen: dict[str, list[object]] = {}

    async def outcome(case: str, call: Awaitable[Any], buf: bytearray | None = None) -> None:
        try:
            value: object = await call
        except Exception as exc:
            value = exc
        shown = _shown(value, address) if buf is None else (_shown(value, address), hash(bytes(buf)))
        if shown not in seen.setdefault(case, []):
            seen[case].append(shown)

    async def into(case: str, name: str, arg: Any, size: int) -> None:  # the result, and the buffer it went to
        buf = bytearray(size)
        await outcome(case, client.call(address, name, arg, provider_id=1, into=buf), buf)

    for _ in range(REPEAT):
        for name in ("none", "over_small", "large", "obj", "text", "awaitable", "whoami", "nested", "app_error",
                     "fails", "aecho", "acancelled", "asuspends"):  # fmt: skip
            await outcome(name, client.call(address, name, None, provider_id=1))
            if name not in ("aecho", "acancelled", "asuspends"):  # (and the same from an async def handler)
                await outcome(f"async {name}", client.call(address, f"async {name}", None, provider_id=1))
        await outcome("small", client.call(address, "small", b"abc", provider_id=1))
        await outcome("async small", client.call(address, "async small", b"abc", provider_id=1))
        await outcome("dict arg", client.call(address, "obj", {"x": 1}, provider_id=1))
        await outcome("no such rpc", client.call(address, "nope", provider_id=1))
        await outcome("no such provider", client.call(address, "small", provider_id=9))
        await outcome("cannot encode", client.call(address, "small", object(), provider_id=1))
        await outcome("idempotent", client.call(address, "none", provider_id=1, idempotent=True))
        await into("into", "small", b"into", 8)
        await into("into, one frame", "large", None, 200_000)
        await into("into, over the buffer", "large", None, 100)
        await into("into, chunked", "huge", None, 300_000)
        await into("into, empty", "small", b"", 8)
        for name in ("none", "text", "awaitable", "fails", "async none", "async small"):
            await into(f"into, {name}", name, None, 16)
        assert current_request.get() is None
    for _ in range(3):
        await outcome("deadline", client.call(address, "slow", provider_id=1, timeout_seconds=0.005))
    for _ in range(3):  # cancelled by its caller once the server runs it: the server is told (a CANCEL)
        await wait_until(lambda: not server.inflight_for(1), what="the server's earlier handlers ended")
        task = asyncio.ensure_future(client.call(address, "slow", provider_id=1))
        await wait_until(lambda: any(not t.done() for t in server.inflight_for(1)), what="the handler running")
        task.cancel()
        await asyncio.wait([task])
        seen.setdefault("cancelled", []).append(task.cancelled())
        await wait_until(lambda: not server.inflight_for(1), what="the server cancelling its handler")
    conn = client._conns[address]
    assert not conn.pending and client.progress.inflight == 0  # nothing left behind
    await wait_until(lambda: not server.progress.inflight, what="the server's handlers done")

    def counts(monitor: Any) -> dict[str, tuple[int, int]]:
        rows = {**monitor.origin, **monitor.target}
        return {f"{key[2]}/{key[3]}/{key[0]}": (rec.calls, rec.errors) for key, rec in sorted(rows.items(), key=str)}

    return {"seen": seen, "client": counts(client.monitor), "server": counts(server.monitor)}


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_the_compiled_paths_end_every_call_as_their_definitions(
    make_engine: Callable[..., Awaitable[Engine]], monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """(Over unix, an into= buffer of CMA_MIN_BYTES or more takes its result by cross-memory attach: the
    definitions' path; a smaller one, the compiled paths'.)"""
    compiled = await _outcomes(make_engine, True, transport)
    monkeypatch.setattr(engine_module, "serve_request", handlers_module.Handlers._on_request)
    monkeypatch.setattr(Calls, "_call", Calls._call_once)
    monkeypatch.setattr(Connection, "buffer_updated", Connection._buffer_updated_definition)
    definitions = await _outcomes(make_engine, False, transport)
    for run in (compiled, definitions):  # which deadline passes first, the caller's or the server's, is a race
        deadline = run["seen"].pop("deadline")
        assert {message.partition(": ")[2] for _, message in deadline} <= {
            "no response within 0.005 s",
            "the deadline passed while the handler ran; its outcome is unknown",
        }, deadline
    assert compiled["seen"] == definitions["seen"]
    assert compiled["client"] == definitions["client"]
    assert compiled["server"] == definitions["server"]
    seen = compiled["seen"]
    assert seen["small"] == [b"abc"] and seen["whoami"] == [["whoami", True, 1]] and seen["nested"] == [b"n"]
    assert seen["async small"] == [b"abc"] and seen["async whoami"] == [["async whoami", True, 1]]
    assert seen["asuspends"] == [[None, True]] and [s[0] for s in seen["acancelled"]] == ["Cancelled"]
    assert [s[0] for s in seen["async fails"]] == ["RemoteError"] and seen["async nested"] == [b"n"]
    assert seen["cancelled"] == [True] * 3
    assert [s[0] for s in seen["app_error"]] == ["AppError"] and [s[0] for s in seen["into"]] == [4]
    assert [s[0] for s in seen["into, one frame"]] == [200_000] and [s[0] for s in seen["into, chunked"]] == [300_000]
    assert [s[0][0] for s in seen["into, over the buffer"]] == ["ResultTooLarge"]


def test_the_state_types_have_the_names_of_their_python_twins() -> None:
    import types

    from svcframe import _speedups, slots

    for name in ("EngineState", "ConnectionState", "MonitorState", "ProgressState", "RecordState"):
        compiled = getattr(_speedups, name)
        members = {n for n, v in vars(compiled).items() if isinstance(v, types.MemberDescriptorType)}
        assert members == set(getattr(slots, f"_Py{name}").__slots__), name


@pytest.mark.asyncio
async def test_begin_call_makes_the_common_call_and_declines_the_others_untouched(
    make_engine: Callable[..., Awaitable[Engine]],
) -> None:
    from svcframe._speedups import begin_call

    server = await make_engine("tcp://127.0.0.1:0")
    server.register(1, "small", lambda req, arg: arg)
    client = await make_engine(None)
    address = server.address or ""
    for _ in range(REPEAT):  # past the always-timed calls
        assert await client.call(address, "small", b"warm", provider_id=1) == b"warm"
    conn = client._conns[address]
    ((_, rec),) = client.monitor.origin.items()

    def state() -> tuple[object, ...]:
        return (dict(conn.pending), rec.calls, rec.errors, client.progress.inflight, conn.protocol._next_id)

    while (rec.calls + 1) % client.monitor.sample_every == 0:  # the next call is untimed
        await client.call(address, "small", b"warm", provider_id=1)
    before = state()
    declined = [
        ("into a read-only buffer", (address, "small", b"x", 1, None, 0, bytes(8))),
        ("unknown address", ("tcp://127.0.0.1:1", "small", b"x", 1, None, 0, None)),
        ("unknown name", (address, "never-called", b"x", 1, None, 0, None)),
        ("provider id out of range", (address, "small", b"x", 70000, None, 0, None)),
        ("cannot encode", (address, "small", object(), 1, None, 0, None)),
        ("timeout not a number", (address, "small", b"x", 1, "soon", 0, None)),
    ]
    for what, args in declined:
        assert begin_call(client, *args) is None, what
        assert state() == before, what
    client.monitor.enabled = False
    client.tracer = object()  # type: ignore[assignment]  # (any tracer: begin_call declines a traced call)
    assert begin_call(client, address, "small", b"x", 1, None, 0, None) is None
    client.tracer = None
    client.monitor.enabled = True
    assert state() == before
    call = begin_call(client, address, "small", b"made", 1, None, 0, None)
    assert call is not None and rec.calls == before[1] + 1 and len(conn.pending) == 1
    assert call.answered(await call.future) == b"made"
    assert state()[:4] == (before[0], before[1] + 1, before[2], before[3])
    while (rec.calls + 1) % client.monitor.sample_every == 0:
        await client.call(address, "small", b"warm", provider_id=1)
    into = bytearray(8)  # a result taken into the caller's buffer (over tcp: no cross-memory attach)
    call = begin_call(client, address, "small", b"made", 1, None, 0, into)
    assert call is not None and list(conn.protocol.pulls) == [next(iter(conn.pending))]
    assert call.answered(await call.future) == 4 and into[:4] == b"made" and not conn.protocol.pulls


@pytest.mark.asyncio
async def test_begin_call_times_a_sampled_call_as_its_definition(
    make_engine: Callable[..., Awaitable[Engine]],
) -> None:
    """A sampled call (the first ALWAYS_TIMED of a callpath, then one in sample_every) is made by begin_call too:
    its record takes the four values Calls._call_once gives it (the round trip and the sending of the request
    in ns, the argument's and the answer's sizes), read from the record's buffer when the call ends (a fold
    meanwhile gave it a new one), and is folded past FOLD_AT; an unsampled call adds nothing."""
    from svcframe._speedups import begin_call
    from svcframe.monitoring import FOLD_AT

    server = await make_engine("tcp://127.0.0.1:0")
    server.register(1, "small", lambda req, arg: arg)
    client = await make_engine(None)
    address = server.address or ""
    assert await client.call(address, "small", b"first", provider_id=1) == b"first"  # (makes the record)
    ((_, rec),) = client.monitor.origin.items()

    async def compiled(arg: bytes) -> list[int]:
        before = list(rec.buffer)
        call = begin_call(client, address, "small", arg, 1, None, 0, None)
        assert call is not None
        assert call.answered(await call.future) == arg
        return rec.buffer[len(before) :] if rec.buffer[: len(before)] == before else rec.buffer

    async def definition(arg: bytes) -> list[int]:
        before = len(rec.buffer)
        assert await client._call_once(address, "small", arg, 1, None, 0) == arg
        return rec.buffer[before:]

    for make in (compiled, definition):  # (the first calls of a callpath: always timed)
        total, sent, arg_bytes, answer_bytes = await make(b"abc")
        assert 0 < sent < total and arg_bytes == answer_bytes == 5, make  # (b"abc" packs as a bin 8: 5 bytes)

    async def next_sampled() -> None:
        while (rec.calls + 1) <= ALWAYS_TIMED or (rec.calls + 1) % client.monitor.sample_every:
            await client.call(address, "small", b"warm", provider_id=1)

    await next_sampled()
    assert len(await compiled(b"sampled")) == 4
    assert await compiled(b"not sampled") == []
    await next_sampled()
    call = begin_call(client, address, "small", b"folded", 1, None, 0, None)
    assert call is not None
    old = rec.buffer
    rec.fold()  # (while the call is under way: the record gets a new buffer, which fills up to FOLD_AT)
    rec.buffer.extend([1000, 10, 3, 3] * (FOLD_AT // 4))
    assert call.answered(await call.future) == b"folded"
    assert rec.buffer == [] and old is not rec.buffer and len(old) % 4 == 0  # (folded, with the call's values)


@pytest.mark.asyncio
async def test_calls_begun_while_others_are_in_flight_leave_in_one_write(
    make_engine: Callable[..., Awaitable[Engine]],
) -> None:
    """Calls that begin_call makes while another of ours is in flight on the connection are corked: held
    (``Connection._cork``) and written together on the loop's next turn (``_uncork``), as
    ``Connection.send_request(frame, True)`` does; each gets its own answer, in the order sent."""
    from svcframe._speedups import begin_call

    server = await make_engine("tcp://127.0.0.1:0")
    server.register(1, "small", lambda req, arg: arg)
    client = await make_engine(None)
    address = server.address or ""
    for _ in range(REPEAT):
        assert await client.call(address, "small", b"warm", provider_id=1) == b"warm"
    conn = client._conns[address]
    client.monitor.enabled = False  # (every call untimed: all made by begin_call)
    writes = conn.writes
    calls = [begin_call(client, address, "small", i.to_bytes(2, "big"), 1, None, 0, None) for i in range(20)]
    assert all(call is not None for call in calls)
    assert conn.writes == writes + 1 and conn._cork is not None and len(conn._cork) == 19  # the first went out
    answers = [call.answered(await call.future) for call in calls if call is not None]
    assert answers == [i.to_bytes(2, "big") for i in range(20)]
    assert conn._cork is None and conn.writes == writes + 2 and not conn.pending


@pytest.mark.asyncio
async def test_begin_call_packs_the_argument_itself_unless_in_debug_mode(
    make_engine: Callable[..., Awaitable[Engine]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """begin_call packs an argument with the packer itself, as pack_body does; in debug mode
    (``svcframe.wire.DEBUG_WIRE``) through pack_body, whose check refuses what every receiver would (an int
    map key: LocalProtocolError, nothing sent); an argument msgpack cannot encode is declined and then
    refused by the definition, and the packer is left clean for the next call."""
    from svcframe import wire
    from svcframe._speedups import begin_call
    from svcframe.errors import LocalProtocolError

    server = await make_engine("tcp://127.0.0.1:0")
    server.register(1, "small", lambda req, arg: arg)
    client = await make_engine(None)
    address = server.address or ""
    await client.call(address, "small", 1, provider_id=1)
    client.monitor.enabled = False  # (every call untimed: begin_call's case)
    conn = client._conns[address]
    call = begin_call(client, address, "small", {"k": [1, b"2"]}, 1, None, 0, None)
    assert call is not None and call.answered(await call.future) == {"k": [1, b"2"]}
    writes = conn.writes
    monkeypatch.setattr(wire, "DEBUG_WIRE", True)
    with pytest.raises(LocalProtocolError, match="map key"):
        await client.call(address, "small", {1: "x"}, provider_id=1)
    assert conn.writes == writes and not conn.pending
    monkeypatch.setattr(wire, "DEBUG_WIRE", False)
    with pytest.raises(LocalProtocolError, match="cannot encode"):
        await client.call(address, "small", [1, object()], provider_id=1)
    assert await client.call(address, "small", [3, "x"], provider_id=1) == [3, "x"]


@pytest.mark.asyncio
async def test_begin_call_leaves_a_read_that_may_use_cross_memory_attach_to_its_definition(
    make_engine: Callable[..., Awaitable[Engine]],
) -> None:
    from conftest import short_socket_path

    from svcframe._speedups import begin_call

    server = await make_engine(f"unix://{short_socket_path()}")
    server.register(1, "small", lambda req, arg: arg)
    client = await make_engine(None)
    address = server.address or ""
    for _ in range(REPEAT):
        assert await client.call(address, "small", b"warm", provider_id=1, into=bytearray(8)) == 4
    conn = client._conns[address]
    assert conn.peer_cma
    ((_, rec),) = client.monitor.origin.items()
    while (rec.calls + 1) % client.monitor.sample_every == 0:
        await client.call(address, "small", b"warm", provider_id=1)
    calls = rec.calls
    assert begin_call(client, address, "small", b"x", 1, None, 0, bytearray(CMA_MIN_BYTES)) is None
    assert rec.calls == calls and not conn.pending
    into = bytearray(CMA_MIN_BYTES - 1)  # (a smaller buffer takes its result over the socket: made)
    call = begin_call(client, address, "small", b"x", 1, None, 0, into)
    assert call is not None and call.answered(await call.future) == 1 and into[:1] == b"x"
    while (rec.calls + 1) % client.monitor.sample_every == 0:
        await client.call(address, "small", b"warm", provider_id=1)
    call = begin_call(client, address, "small", b"x", 1, None, 0, None)  # (without into=: made)
    assert call is not None and call.answered(await call.future) == b"x"


class _Interrupt(BaseException):
    """Not an Exception (as KeyboardInterrupt is not), raised once while an argument is encoded."""


class _InterruptedOnce(dict[str, int]):
    fired = False

    def items(self) -> Any:  # (msgpack reads a dict subclass's items)
        if not self.fired:
            self.fired = True
            raise _Interrupt
        return super().items()


@pytest.mark.asyncio
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "definition"])
async def test_an_interrupt_while_a_call_is_made_is_raised_not_swallowed(
    make_engine: Callable[..., Awaitable[Engine]], monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    """begin_call hands a call it cannot make to _call_once; an Exception it met on the way is _call_once's to
    raise again, but a KeyboardInterrupt or SystemExit is raised at once, as _call_once raises it."""
    if not compiled:
        monkeypatch.setattr(Calls, "_call", Calls._call_once)
    server = await make_engine("tcp://127.0.0.1:0")
    server.register(1, "obj", lambda req, arg: arg)
    client = await make_engine(None)
    client.monitor.enabled = False  # (every call untimed: begin_call's case)
    address = server.address or ""
    assert await client.call(address, "obj", {"a": 1}, provider_id=1) == {"a": 1}
    with pytest.raises(_Interrupt):
        await client.call(address, "obj", _InterruptedOnce(a=1), provider_id=1)
    assert not client._conns[address].pending and client.progress.inflight == 0


_ABANDONED = """
import asyncio, gc, logging, warnings, weakref
from svcframe import Engine
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

async def start():
    server = await Engine("tcp://127.0.0.1:0", secret=None).start()
    never = asyncio.Event()
    async def slow(req, arg):
        await never.wait()
    server.register(1, "slow", slow)
    client = await Engine(None, secret=None, monitoring=False).start()
    address = server.address
    try:  # (the RPC's id and callpath cached: the next call is begin_call's)
        await client.call(address, "slow", provider_id=1, timeout_seconds=0.01)
    except Exception:
        pass
    task = asyncio.ensure_future(client.call(address, "slow", provider_id=1, timeout_seconds=3600))
    while not server.inflight_for(1):
        await asyncio.sleep(0)
    return weakref.ref(client), weakref.ref(task)

loop = asyncio.new_event_loop()
client, task = loop.run_until_complete(start())
loop.close()  # (its tasks and transports abandoned, the call still waiting)
del loop
gc.collect()
print(client() is None, task() is None)
"""


@pytest.mark.parametrize("pure", ["0", "1"], ids=["compiled", "definition"])
def test_an_abandoned_call_is_collected_with_its_engine(pure: str) -> None:
    """A call waiting when its loop is abandoned (closed without ending its tasks) is a reference cycle: call,
    future, task, coroutine. The collector frees it, and the engine behind it, whichever path made the call (a
    compiled Call it could not see through kept the whole engine alive)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "SVCFRAME_PURE": pure}
    done = subprocess.run([sys.executable, "-c", _ABANDONED], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"], done.stdout


async def _push_outcomes(make_engine: Callable[..., Awaitable[Engine]], transport: str) -> dict[str, Any]:
    """Every push case through ``svcframe.bulk._push_ahead_compiled`` as it is set now (the compiled function, or
    the definition's): what the caller saw and found in its buffer, the bulk statistics of both engines, the
    request ids both used, and how often the compiled function wrote a push."""
    from conftest import short_socket_path

    from svcframe import bulk
    from svcframe.bulk import BulkHandle

    listen = "tcp://127.0.0.1:0" if transport == "tcp" else f"unix://{short_socket_path()}"
    server = await make_engine(listen, max_output_bytes=512 * 1024)  # (one frame: up to 256 KiB)
    client = await make_engine(None)
    address = server.address or ""
    own = server.expose(bytearray(64), "rw")  # a buffer of the server's: a local copy
    written = [0]
    inner = bulk._push_ahead_compiled

    def counted(*args: Any) -> bool:
        done = inner(*args)
        written[0] += done
        return done

    def push(req: Request, arg: Any) -> Any:  # (sync: the push returned, answered in its batch when done at once)
        handle, offset, size, kind = arg
        data: Any = bytes(range(256)) * (size // 256) + bytes(size % 256)
        data = bytearray(data) if kind == "bytearray" else memoryview(data) if kind == "memoryview" else data
        target = own if handle is None else BulkHandle.from_wire(handle)
        return req.engine.push(target, data, offset=offset, ahead=kind != "not ahead")

    async def apush(req: Request, arg: Any) -> Any:
        await push(req, arg)
        return "pushed"

    server.register(1, "push", push)
    server.register(1, "apush", apush)
    seen: dict[str, list[object]] = {}
    size = 64 * 1024
    cases = [
        ("one frame", size, 0, size, "bytes"),
        ("nothing", size, 0, 0, "bytes"),
        ("at an offset", size, 1000, 3000, "bytes"),
        ("to the end", size, size - 7, 7, "bytes"),
        ("past the end", size, size - 7, 8, "bytes"),
        ("bytearray", size, 0, size, "bytearray"),
        ("memoryview", size, 0, size, "memoryview"),
        ("not ahead", size, 0, 100, "not ahead"),
        ("over one frame", 300_000, 0, 300_000, "bytes"),
        ("cross-memory attach's size", CMA_MIN_BYTES, 0, CMA_MIN_BYTES, "bytes"),  # (one frame: 256 KiB)
        ("read-only", size, 0, 10, "bytes"),
        ("the server's own buffer", None, 0, 64, "bytes"),
    ]
    bulk.__dict__["_push_ahead_compiled"] = counted
    try:
        for _ in range(3):
            for name in ("push", "apush"):
                for case, buffer_size, offset, n, kind in cases:
                    buf = bytearray(buffer_size or 1)
                    handle = None
                    if buffer_size is not None:
                        handle = client.expose(buf, "r" if case == "read-only" else "w", peer=address).to_wire()
                    try:
                        value: object = await client.call(address, name, [handle, offset, n, kind], provider_id=1)
                    except Exception as exc:
                        value = _shown(exc, address)
                    if handle is not None:
                        client.unexpose(BulkHandle.from_wire(handle))
                    shown = (value, hash(bytes(buf)))
                    if shown not in seen.setdefault(f"{name}: {case}", []):
                        seen[f"{name}: {case}"].append(shown)
    finally:
        bulk.__dict__["_push_ahead_compiled"] = inner

    def counts(engine: Engine) -> dict[str, tuple[int, int]]:
        return {key[0]: (rec.calls, len(rec.buffer)) for key, rec in engine.monitor.bulk.items()}

    conn = client._conns[address]
    return {
        "seen": seen,
        "client": counts(client),
        "server": counts(server),
        "ids": (conn.protocol._next_id, server._peers[client.engine_id].protocol._next_id),
        "written": written[0],
    }


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_push_ahead_now_pushes_as_its_definition(
    make_engine: Callable[..., Awaitable[Engine]], monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """svcframe._speedups.push_ahead_now (a handler's push of bytes ahead of its answer, in one call) against
    ``Engine.push``'s definition: every case ends the same for the caller, leaves the same bytes in its
    buffer, counts the same bulk transfers and uses the same request ids; the compiled function wrote the
    pushes of bytes that fit one frame (sync and async handlers), and left every other case untouched to the
    definition. Its frames are the definition's, byte for byte."""
    import os

    from svcframe import _speedups, bulk, wire

    bulk_id = os.urandom(16)
    for n in (0, 1, 65536):
        frames = _speedups.push_ahead_frames(2**64 - 1, bulk_id, 3, n, 2**63)
        assert frames == wire.push_ahead_frames(2**64 - 1, bulk_id, 3, n, 2**63)
    with pytest.raises(ValueError):
        _speedups.push_ahead_frames(1, b"short", 0, 1, 1)
    assert bulk._push_ahead_compiled is _speedups.push_ahead_now
    compiled = await _push_outcomes(make_engine, transport)
    monkeypatch.setattr(bulk, "_push_ahead_compiled", bulk._push_ahead_definition)
    definitions = await _push_outcomes(make_engine, transport)
    assert compiled["seen"] == definitions["seen"]
    assert compiled["client"] == definitions["client"] and compiled["server"] == definitions["server"]
    assert compiled["ids"] == definitions["ids"]
    assert definitions["written"] == 0
    # one frame, nothing, at an offset, to the end (sync and async handlers); and, over tcp, CMA_MIN_BYTES (over
    # unix, cross-memory attach's: the definition's path)
    assert compiled["written"] == 3 * 2 * (4 if transport == "unix" else 5)
    seen = compiled["seen"]
    data = bytes(range(256)) * 256
    assert seen["push: one frame"] == [(None, hash(data))] and seen["apush: one frame"] == [("pushed", hash(data))]
    ((past, _),) = seen["push: past the end"]
    assert "range 65529+8 is outside the 65536-byte bulk handle" in past[1]
    ((read_only, _),) = seen["apush: read-only"]
    assert "is exposed as 'r'" in read_only[1]
    assert seen["push: over one frame"] == [(None, hash(bytes(range(256)) * 1171 + bytes(224)))]  # (300,000)


@pytest.mark.asyncio
async def test_place_ahead_places_as_its_definition(make_engine: Callable[..., Awaitable[Engine]]) -> None:
    """svcframe._speedups.place_ahead (a push ahead's destination, found by the caller's decoder) against
    ``BulkServing._place_ahead``, on a real engine and connection: the same range of the same buffer, or None,
    for every case a hostile server may make (a handle not exposed, bound to another peer, read-only, out of
    range, a request id of a push under way, sizes and offsets at the edges, a view its owner released); the same
    bulk statistics; and None where it meets what it does not expect (the frames are then dispatched)."""
    from svcframe import _speedups
    from svcframe.monitoring import Monitor

    server = await make_engine("tcp://127.0.0.1:0")
    other = await make_engine("tcp://127.0.0.1:0")
    server.register(1, "small", lambda req, arg: arg)
    other.register(1, "small", lambda req, arg: arg)
    client = await make_engine(None)
    address, elsewhere = server.address or "", other.address or ""
    for peer in (address, elsewhere):
        assert await client.call(peer, "small", b"x", provider_id=1) == b"x"
    conn = client._conns[address]
    buf, ro = bytearray(range(256)) * 4, bytearray(100)
    handles = {
        "bound": client.expose(buf, "w", peer=address),
        "bound elsewhere": client.expose(buf, "rw", peer=elsewhere),
        "unbound": client.expose(buf, "rw"),
        "read-only": client.expose(ro, "r"),
        "not exposed": client.expose(bytearray(8), "w"),
    }
    client.unexpose(handles["not exposed"])
    released = memoryview(bytearray(64))
    handles["released"] = client.expose(released, "w")
    released.release()  # (the engine keeps its own view: still usable)
    cases = [
        (name, rid, offset, size)
        for name in handles
        for rid in (5, 2**64 - 1)
        for offset, size in ((0, 0), (0, 1), (0, 1024), (1, 1023), (1, 1024), (1023, 1), (1024, 0), (1024, 1), (2**62, 1))
    ]  # fmt: skip
    conn.protocol.pushes[7] = conn.protocol.pushes.get(7)  # type: ignore[assignment]  # (a push under way)
    cases += [("unbound", 7, 0, 8)]

    def place_both(name: str, rid: int, offset: int, size: int) -> tuple[object, object]:
        bulk_id = handles[name].bulk_id
        outcomes = []
        for place in (client._place_ahead, lambda *a: _speedups.place_ahead(client, *a)):
            before = {key: (rec.calls, list(rec.buffer)) for key, rec in client.monitor.bulk.items()}
            try:
                view = place(conn, rid, bulk_id, offset, size)
                shown: object = None if view is None else (view.obj is not None, bytes(view), len(view))
            except Exception as exc:
                shown = type(exc).__name__
            counted = {  # what this call added to each record: calls, samples
                key: (rec.calls - before.get(key, (0, []))[0], rec.buffer[len(before.get(key, (0, []))[1]) :])
                for key, rec in client.monitor.bulk.items()
            }
            outcomes.append((shown, {key: added for key, added in counted.items() if added != (0, [])}))
        return outcomes[0], outcomes[1]

    placed = 0
    for case in cases:
        definition, compiled = place_both(*case)
        assert compiled == definition, case
        placed += definition[0] is not None
    assert placed == 2 * 2 * 6 + 2 * 2  # bound, unbound: six ranges in 1024 bytes; released: two in its 64
    conn.protocol.pushes.pop(7)
    assert _speedups.place_ahead(client, conn, 5, "not bytes", 0, 1) is None  # what it does not expect
    assert _speedups.place_ahead(object(), conn, 5, handles["unbound"].bulk_id, 0, 1) is None
    assert _speedups.place_ahead(client, conn, 5, handles["unbound"].bulk_id, -1, 1) is None
    client.monitor = Monitor(enabled=False)  # statistics off: placed, not counted
    view = _speedups.place_ahead(client, conn, 5, handles["unbound"].bulk_id, 0, 4)
    assert view is not None and bytes(view) == bytes(buf[:4]) and not client.monitor.bulk


async def _raw_peer(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A peer that speaks the wire by hand: connected, its HELLO sent and the server's read."""
    from svcframe.wire import HEADER, HEADER_SIZE, Kind, encode_frame, pack_body

    if address.startswith("unix://"):
        reader, writer = await asyncio.open_unix_connection(address[len("unix://") :])
    else:
        host, _, port = address[len("tcp://") :].rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(encode_frame(Kind.HELLO, 0, pack_body({"engine_id": "raw-peer", "address": None})))
    header = await asyncio.wait_for(reader.readexactly(HEADER_SIZE), 10)
    await reader.readexactly(HEADER.unpack(header)[6])
    return reader, writer


async def _received(reader: asyncio.StreamReader, frames: int | None) -> list[tuple[int, int, int, bytes]]:
    """``frames`` frames from the server (kind, request id, status, body), or all until it closes (None)."""
    from svcframe.wire import HEADER, HEADER_SIZE

    out = []
    while frames is None or len(out) < frames:
        try:
            header = await asyncio.wait_for(reader.readexactly(HEADER_SIZE), 10)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            assert frames is None, f"closed after {len(out)} of {frames} frames"
            return out
        fields = HEADER.unpack(header)
        out.append((fields[2], fields[7], fields[4], await reader.readexactly(fields[6])))
    return out


async def _read_outcomes(make_engine: Callable[..., Awaitable[Engine]], transport: str) -> dict[str, Any]:
    """What a hand-written peer receives for reads that take each branch of Connection.buffer_updated, and what
    the server's connection records of them."""
    from conftest import short_socket_path

    from svcframe.transport import FRAMES_PER_TURN
    from svcframe.wire import Kind, encode_frame, encode_header, pack_body, rpc_id

    listen = "tcp://127.0.0.1:0" if transport == "tcp" else f"unix://{short_socket_path()}"
    server = await make_engine(listen, secret=None)  # (the peer below speaks an unauthenticated handshake)
    server.register(1, "echo", lambda req, arg: arg)
    server.register(1, "big", lambda req, arg: b"z" * 600_000)  # (replies over BATCH_FLUSH_BYTES: flushed early)
    address = server.address or ""
    out: dict[str, Any] = {}

    def request(rid: int, arg: Any, name: str = "echo") -> bytes:
        return encode_frame(Kind.REQUEST, rid, pack_body(arg), provider_id=1, rpc=rpc_id(name))

    def server_conn() -> Any:
        (conn,) = [c for c in server._all_conns if c.peer_engine_id == "raw-peer"]
        return conn

    async def case(name: str, data: bytes, frames: int | None, *, drip: bool = False) -> None:
        reader, writer = await _raw_peer(address)
        try:
            await wait_until(
                lambda: any(c.peer_engine_id == "raw-peer" for c in server._all_conns), what="the server's handshake"
            )
            await exchange(name, data, frames, reader, writer, drip)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await wait_until(lambda: not server._all_conns, what="the connection closed")

    async def exchange(
        name: str,
        data: bytes,
        frames: int | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        drip: bool,
    ) -> None:
        conn = server_conn()
        writes = conn.writes
        if drip:  # one byte per write: a frame under way is timed from its first byte
            for i in range(len(data) - 1):
                writer.write(data[i : i + 1])
                await writer.drain()
            await wait_until(lambda: conn.protocol.decoder._end > 0, what="all but the last byte received")
            started = conn.frame_started
            assert started > 0 and conn.last_activity < started
            writer.write(data[-1:])
        else:
            writer.write(data)
        got = await _received(reader, frames)
        if frames is not None:  # (the server's read is over: it runs in this process's loop, as this test does)
            if name != "pipelined":  # (how a flood splits into reads is the kernel's)
                out[f"{name}: writes"] = conn.writes - writes
            out[f"{name}: frame under way"] = conn.frame_started != 0.0
            assert conn.last_activity > 0
        out[name] = got

    await case("one request", request(7, b"abc"), 1)
    await case("dripped", request(8, b"one byte at a time"), 1, drip=True)
    many = 2 * FRAMES_PER_TURN + 5  # three turns of the loop
    await case("pipelined", b"".join(request(i, i) for i in range(1, many + 1)), many)
    await case("requests and a cancel", request(1, 1) + encode_frame(Kind.CANCEL, 99) + request(2, 2), 2)
    await case("large replies", b"".join(request(i, None, "big") for i in range(1, 4)), 3)
    await case("a frame under way", request(1, 1) + request(2, 2)[:50], 1)
    await case("a bad frame behind requests", request(1, 1) + b"XX" + request(2, 2)[2:], None)
    await case("over the body limit", request(1, 1) + encode_header(Kind.REQUEST, 2, 2**31, provider_id=1), None)
    await case("goodbye", request(1, 1) + encode_frame(Kind.GOODBYE, 0, pack_body({"reason": "bye"})), None)
    return out


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_the_compiled_read_serves_as_its_definition(
    make_engine: Callable[..., Awaitable[Engine]], monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """ConnectionState.buffer_updated (an open connection's read, and an engine's batch of requests served and
    answered in one write) against Connection.buffer_updated's definition, on a real server and a peer that
    writes the wire by hand: the same frames come back, in the same number of writes, for one request, a
    request dripped a byte at a time, a pipelined flood over two turns' share, requests around a CANCEL,
    replies over the batch's flush size, a frame left under way; and a bad frame, an announced body over the
    limit and a GOODBYE behind requests end the connection the same way."""
    definition = Connection._buffer_updated_definition
    assert Connection.buffer_updated is not definition  # type: ignore[comparison-overlap]
    handed: list[int] = []

    def counted(conn: Connection, nbytes: int) -> None:
        handed.append(nbytes)
        definition(conn, nbytes)

    monkeypatch.setattr(Connection, "_buffer_updated_definition", counted)
    compiled = await _read_outcomes(make_engine, transport)
    assert len(handed) == 9  # (each connection's handshake: a HELLO, read before the case's bytes are sent)
    monkeypatch.setattr(Connection, "buffer_updated", definition)
    definitions = await _read_outcomes(make_engine, transport)
    assert compiled == definitions
    assert compiled["one request"] == [(3, 7, 0, b"\xc4\x03abc")]
    assert compiled["one request: writes"] == 1 and compiled["large replies: writes"] == 2
    assert [f[1] for f in compiled["pipelined"]] == list(range(1, 2 * 256 + 6))
    assert compiled["a frame under way: frame under way"] is True
    assert compiled["dripped: frame under way"] is False
    # (a bad frame fails the whole read; a GOODBYE closes the connection before the batch's answers are written)
    assert compiled["a bad frame behind requests"] == [] and compiled["goodbye"] == []


@pytest.mark.asyncio
async def test_the_compiled_read_leaves_an_engine_that_overrides_on_frames_to_it(
    make_engine: Callable[..., Awaitable[Engine]],
) -> None:
    """An engine whose on_frames is replaced (on the instance here) sees every batch: the compiled read serves
    requests itself only for an engine that keeps Engine.on_frames."""
    server = await make_engine("tcp://127.0.0.1:0")
    server.register(1, "echo", lambda req, arg: arg)
    client = await make_engine(None)
    address = server.address or ""
    assert await client.call(address, "echo", b"before", provider_id=1) == b"before"
    batches: list[int] = []
    inner = server.on_frames

    def on_frames(conn: Any, frames: list[Any]) -> None:
        batches.append(len(frames))
        inner(conn, frames)

    server.on_frames = on_frames  # type: ignore[method-assign]
    assert await client.call(address, "echo", b"after", provider_id=1) == b"after"
    assert batches == [1]
