"""Handlers started eagerly (svcframe.eager): a coroutine handler's first step runs as its
request is dispatched, and one that finishes there is answered in its batch's write, without a turn of the
loop. What a handler can see must not change: it runs as its own task, in its own context; a request read
together with its CANCEL never runs; a handler that suspends carries on as a task."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
from conftest import WAIT_SECONDS
from reliability_kit import open_raw, raw_handshake, secret

from svcframe import Engine, Request
from svcframe.eager import DONE, Done, start_eagerly
from svcframe.errors import Cancelled, RemoteError
from svcframe.wire import HEADER, HEADER_SIZE, Kind, Status, encode_frame, pack_body, rpc_id, unpack_body

pytestmark = pytest.mark.asyncio

_seen: contextvars.ContextVar[str] = contextvars.ContextVar("_seen", default="")


def server_connection(server: Engine) -> Any:
    (conn,) = [c for c in server.connections.all if c.server_side]
    return conn


async def test_a_handler_that_finishes_at_once_is_answered_in_its_batchs_write(server: Engine, client: Engine) -> None:
    """64 calls of an ``async def`` handler that never suspends, sent in two writes (the first call at once,
    the others corked behind it): the server answers them in a few writes, not one write per answer (as it
    did when each handler ran as a task, answered a turn later, alone)."""

    async def quick(req: Request, arg: Any) -> Any:
        return arg

    server.register(1, "quick", quick)
    assert await client.call(server.address, "quick", -1, provider_id=1) == -1  # (connected)
    conn = server_connection(server)
    writes = conn.writes
    results = await asyncio.gather(*(client.call(server.address, "quick", n, provider_id=1) for n in range(64)))
    assert results == list(range(64))
    assert conn.writes - writes <= 8, f"{conn.writes - writes} writes for 64 answers"


async def test_a_handlers_first_step_runs_as_its_own_task_in_its_own_context(server: Engine, client: Engine) -> None:
    """In its first step (eager or not) a handler is the loop's current task, a different one for each call,
    ``asyncio.timeout`` works, and what it sets in a context variable is its own: the next handler of the
    same batch does not see it."""
    tasks: list[asyncio.Task[Any] | None] = []

    async def first_step(req: Request, arg: Any) -> Any:
        before = _seen.get()
        _seen.set(f"call {arg}")
        tasks.append(asyncio.current_task())
        async with asyncio.timeout(WAIT_SECONDS):  # noqa: ASYNC100  (entered in the first step: that it finds
            pass  # the current task is the point)
        return before

    server.register(1, "first_step", first_step)
    assert await client.call(server.address, "first_step", -1, provider_id=1) == ""
    results = await asyncio.gather(*(client.call(server.address, "first_step", n, provider_id=1) for n in range(8)))
    assert results == [""] * 8
    assert None not in tasks and len(set(map(id, tasks))) == len(tasks) == 9


async def test_a_handler_that_suspends_carries_on_as_a_task(server: Engine, client: Engine) -> None:
    """A handler that awaits something not ready finishes when it is: its answer comes then, and the server
    serves meanwhile."""
    release = asyncio.Event()

    async def waits(req: Request, arg: Any) -> Any:
        await release.wait()
        return arg

    server.register(1, "waits", waits)
    call = asyncio.ensure_future(client.call(server.address, "waits", "done", provider_id=1))
    assert await client.call(server.address, "echo", 1, provider_id=1) == 1
    assert not call.done()
    release.set()
    assert await asyncio.wait_for(call, WAIT_SECONDS) == "done"


async def test_what_a_first_step_asks_of_its_task_holds_once_it_suspends(server: Engine, client: Engine) -> None:
    """The task a handler's first step sees is the task that carries it on (on 3.11 it is made a Task only
    when the step suspends): the same object after the suspension, with the done callback, the timeout and
    the task group the step set up on it; and a handler that cancels itself in its first step is cancelled
    at its first await and answered CANCELLED."""
    seen: dict[str, Any] = {}
    called_back = asyncio.Event()

    async def suspends(req: Request, arg: Any) -> Any:
        task = asyncio.current_task()
        assert task is not None
        task.add_done_callback(lambda t: called_back.set())
        async with asyncio.TaskGroup() as group:
            child = group.create_task(asyncio.sleep(0, result="child"))
        try:
            async with asyncio.timeout(0.05):
                await asyncio.Event().wait()  # only the timeout ends it
        except TimeoutError:
            seen["timed out"] = True
        seen["same task"] = asyncio.current_task() is task
        return child.result()

    async def cancels_itself(req: Request, arg: Any) -> Any:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)
        seen["ran on"] = True

    server.register(1, "suspends", suspends)
    server.register(1, "cancels_itself", cancels_itself)
    assert await client.call(server.address, "suspends", None, provider_id=1) == "child"
    await asyncio.wait_for(called_back.wait(), WAIT_SECONDS)
    assert seen == {"timed out": True, "same task": True}
    with pytest.raises(Cancelled):
        await client.call(server.address, "cancels_itself", None, provider_id=1)
    assert "ran on" not in seen
    assert await client.call(server.address, "echo", 1, provider_id=1) == 1


async def test_what_a_first_step_asks_of_its_task_holds_when_it_finishes(server: Engine, client: Engine) -> None:
    """A handler that finishes in its first step sees a whole task there (its coroutine, its repr), and what
    it asked of that task happens: its done callback runs; having cancelled itself, it is answered
    CANCELLED (as a Task whose step cancels it and returns ends cancelled)."""
    seen: dict[str, Any] = {}
    called_back = asyncio.Event()

    async def looks(req: Request, arg: Any) -> Any:
        task = asyncio.current_task()
        assert task is not None
        seen["coro"] = task.get_coro().__qualname__  # type: ignore[union-attr]
        seen["repr"] = "looks" in repr(task)
        task.add_done_callback(lambda t: called_back.set())
        return arg

    async def cancels_and_returns(req: Request, arg: Any) -> Any:
        asyncio.current_task().cancel()  # type: ignore[union-attr]
        return "returned"

    server.register(1, "looks", looks)
    server.register(1, "cancels_and_returns", cancels_and_returns)
    assert await client.call(server.address, "looks", 3, provider_id=1) == 3
    await asyncio.wait_for(called_back.wait(), WAIT_SECONDS)
    assert seen["coro"].endswith("looks") and seen["repr"]
    with pytest.raises(Cancelled):
        await client.call(server.address, "cancels_and_returns", None, provider_id=1)


async def test_a_handler_failing_or_cancelled_in_its_first_step_is_answered_so(server: Engine, client: Engine) -> None:
    """An async handler that raises before it suspends is answered with its error, one that raises
    CancelledError with CANCELLED; the server serves on."""

    async def fails(req: Request, arg: Any) -> Any:
        raise ValueError(f"bad {arg}")

    async def cancelled(req: Request, arg: Any) -> Any:
        raise asyncio.CancelledError

    server.register(1, "fails", fails)
    server.register(1, "cancelled", cancelled)
    with pytest.raises(RemoteError, match="bad 7"):
        await client.call(server.address, "fails", 7, provider_id=1)
    with pytest.raises(Cancelled):
        await client.call(server.address, "cancelled", None, provider_id=1)
    assert await client.call(server.address, "echo", 2, provider_id=1) == 2


async def test_a_request_read_with_its_cancel_never_runs(server: Engine) -> None:
    """A REQUEST and its CANCEL in one write: the handler never runs (its request was cancelled before it
    started); the server answers CANCELLED and serves the next request."""
    ran: list[Any] = []

    async def record(req: Request, arg: Any) -> Any:
        ran.append(arg)
        return arg

    server.register(1, "record", record)
    assert server.address is not None
    reader, writer = await open_raw(server.address)
    try:
        await raw_handshake(reader, writer, secret())
        writer.write(
            encode_frame(Kind.REQUEST, 1, pack_body("cancelled"), provider_id=1, rpc=rpc_id("record"))
            + encode_frame(Kind.CANCEL, 1)
            + encode_frame(Kind.REQUEST, 2, pack_body("after"), provider_id=1, rpc=rpc_id("record"))
        )
        answers: dict[int, tuple[int, Any]] = {}
        while 2 not in answers:
            request_id, status, body = await read_response(reader)
            answers[request_id] = (status, body)
        assert answers[2] == (Status.OK, "after")
        assert answers.get(1, (Status.CANCELLED,))[0] == Status.CANCELLED
        assert ran == ["after"]
    finally:
        writer.close()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, int, Any]:
    """(request id, status, decoded body) of the next RESPONSE."""
    while True:
        header = await asyncio.wait_for(reader.readexactly(HEADER_SIZE), WAIT_SECONDS)
        fields = HEADER.unpack(header)
        body = await reader.readexactly(fields[6])
        if fields[2] == Kind.RESPONSE:
            return fields[7], fields[9], unpack_body(body) if body else None


async def test_a_cancellation_before_the_tasks_first_turn_reaches_the_coroutine() -> None:
    """``start_eagerly`` itself: a coroutine that suspends in its first step, cancelled before its Task's
    first turn, gets CancelledError where it waits, and what it waited on is cancelled with it."""
    loop = asyncio.get_running_loop()
    waited: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def waits() -> None:
        seen.append("started")
        try:
            await waited
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    started: asyncio.Future[asyncio.Task[Any] | None] = loop.create_future()

    def start_and_cancel() -> None:  # (in a callback, as the engine starts handlers: outside any task)
        task = start_eagerly(loop, waits(), contextvars.copy_context())
        assert task is not None and seen == ["started"]
        task.cancel()  # before the loop gives its Task a turn
        started.set_result(task)

    loop.call_soon(start_and_cancel)
    task = await started
    assert task is not None
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["started", "cancelled"] and waited.cancelled()


async def test_a_first_step_that_finishes_returns_no_task() -> None:
    """A coroutine that returns (or raises) in its first step: None, and nothing left to run."""
    loop = asyncio.get_running_loop()
    outcomes: list[Any] = []

    async def returns() -> int:
        outcomes.append("ran")
        return 1

    done: asyncio.Future[Any] = loop.create_future()
    loop.call_soon(lambda: done.set_result(start_eagerly(loop, returns(), contextvars.copy_context())))
    assert await done is None and outcomes == ["ran"]


async def test_no_batch_is_kept_once_dispatched(server: Engine, client: Engine) -> None:
    """The engine keeps its batch of requests (for the CANCELs in it) only while it dispatches it: after, no
    frame of it, nor the buffer a large body lives in, stays referenced from the engine."""
    assert await client.call(server.address, "echo", b"x" * 100_000, provider_id=1) == b"x" * 100_000
    assert len(server.handlers.dispatching) == 0


async def test_done_is_a_finished_coroutine_however_it_is_awaited() -> None:
    """``DONE`` (and any ``Done``): awaited, twice, it gives its value at once; a Task, ``gather`` and
    ``ensure_future`` take it as the coroutine it is."""
    for done, value in ((DONE, None), (Done(7), 7)):
        assert await done == value and await done == value
        assert await asyncio.create_task(done) == value  # type: ignore[arg-type]
        assert list(await asyncio.gather(done, asyncio.ensure_future(done))) == [value, value]
