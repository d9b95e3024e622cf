"""Eager start: a coroutine's first step runs at once, in the caller's turn of the loop, and its Task carries it
on only if it suspends. CPython 3.12 has this (``asyncio.Task(..., eager_start=True)``, the mechanism behind
``asyncio.eager_task_factory``); this module gives 3.11 the same, with the guarantees a handler can see:
during its first step the coroutine runs in its own context and is the loop's current task (so
``asyncio.current_task()``, ``asyncio.timeout`` and task groups work), and a cancellation that comes before
its Task's first turn reaches the coroutine where its first step left it.

The engine starts handlers this way (svcframe.handlers). Most handlers finish without suspending (an answer
computed, a push ahead written): such a handler costs no Task bookkeeping, and its answer leaves with the
other answers of its batch in one write, where a Task's answer would be written alone a turn later. This
about halves the server CPU per call of a noop ``async def`` handler (``python tools/profile_server.py
--async-handler``; on 3.11 the Task is still made: the step needs it as the current task).

``first_step`` gives the step's outcome to the engine instead of a wrapper coroutine's, and on 3.11 makes the
step's current task a Task only if the step suspends (``_StepTask``), which saves a large share of the server
instructions per call of such a handler (``bash tools/instructions_per_call.sh --async-handler``).
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["DONE", "FINISHED", "RAISED", "SUSPENDED", "Done", "first_step", "start_eagerly"]

FINISHED, RAISED, SUSPENDED = 0, 1, 2  # what first_step's outcome says


def _first_step(coro: Coroutine[Any, Any, Any]) -> tuple[int, Any]:
    """Run ``coro`` to its first suspension: (SUSPENDED, what it yielded), (FINISHED, its result) or
    (RAISED, its exception)."""
    try:
        return SUSPENDED, coro.send(None)
    except StopIteration as stop:
        return FINISHED, stop.value
    except BaseException as exc:  # (its Task raises it at its first turn: as a Task's own step would)
        return RAISED, exc


class _CarryOn(Coroutine[Any, Any, Any]):
    """What the Task of a coroutine started eagerly on 3.11 runs: at its first send, the outcome of the first
    step (its result, its exception, or the future it waits on, which the Task then waits on); after that,
    the coroutine itself. A throw before the first send (a cancellation) goes to the coroutine, and cancels
    the future it waits on, as a Task's cancel does.

    Its methods drop their references to exceptions before they return or raise: a frame of theirs held by
    a traceback and holding the exception is a reference cycle, which kept a failed 256 MiB pull's buffer
    until the cyclic collector ran (tests/test_reliability_faults.py, the killed client)."""

    __slots__ = ("coro", "first")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.first: tuple[int, Any] | None = None  # (set by start_eagerly once the first step ran)

    def send(self, value: Any) -> Any:
        first = self.first
        if first is None:
            return self.coro.send(value)
        self.first = None
        kind, outcome = first
        first = None
        if kind == SUSPENDED:
            return outcome
        if kind == FINISHED:
            raise StopIteration(outcome)
        try:
            raise outcome
        finally:
            del outcome

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if isinstance(typ, BaseException):  # (a Task throws an instance: the one-argument form)
            exc = typ
        else:  # the older three-argument form
            exc = val if isinstance(val, BaseException) else typ() if val is None else typ(val)
        typ = val = None  # (this frame keeps no exception: see the class docstring)
        first, self.first = self.first, None
        try:
            if first is not None:
                if first[0] != SUSPENDED:  # it finished already: the exception is the Task's alone
                    first = None
                    raise exc
                if isinstance(first[1], asyncio.Future):
                    first[1].cancel()
                first = None
            return self.coro.throw(exc)
        finally:
            del exc

    def close(self) -> None:
        self.first = None
        self.coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self  # type: ignore[return-value]

    def __next__(self) -> Any:
        return self.send(None)

    @property
    def cr_code(self) -> Any:  # (a Task's repr names the coroutine's function)
        return getattr(self.coro, "cr_code", None)

    @property
    def cr_frame(self) -> Any:
        return getattr(self.coro, "cr_frame", None)

    def __repr__(self) -> str:
        return repr(self.coro)


class Done(Coroutine[Any, Any, Any]):
    """A coroutine that finished when it was made, with ``value``: what an operation done at once returns (the
    engine's ``push`` into a buffer of its own, or ahead of a handler's answer in one write), so that awaiting
    it costs two calls (``DONE``: none), and a sync handler that returns it (``return req.engine.push(...)``) is answered at once
    (``Handlers._handled``), with no coroutine frame, Task or eager start. A ``collections.abc.Coroutine``:
    ``asyncio.create_task``, ``gather`` and ``ensure_future`` take it. Awaiting it twice gives ``value``
    twice. (A 64 KiB push read's server CPU: ``python tools/profile_client.py --read 65536 --method push
    --server-mode block``; figures in the README, "Reading large results".)"""

    __slots__ = ("value",)

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def send(self, value: Any) -> Any:
        raise StopIteration(self.value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if isinstance(typ, BaseException):
            raise typ
        raise val if isinstance(val, BaseException) else typ() if val is None else typ(val)

    def close(self) -> None:
        pass

    def __await__(self) -> Generator[Any, None, Any]:
        return self  # type: ignore[return-value]

    def __next__(self) -> Any:
        raise StopIteration(self.value)

    def __repr__(self) -> str:
        return f"Done({self.value!r})"


class _DoneWithNone(Done):
    """``DONE``'s class: ``await DONE`` runs no Python code (its ``__await__`` is an empty tuple's iterator, which
    stops at once with None), where ``Done``'s runs two methods and raises StopIteration: a saving on every
    ``await req.engine.push(...)`` written ahead."""

    __slots__ = ()
    __await__ = staticmethod(().__iter__)  # type: ignore[assignment]  # (called with no argument: a staticmethod)


#: The finished coroutine of an operation that returns None (``await DONE`` is None at once).
DONE: Done = _DoneWithNone()


if sys.version_info >= (3, 12):

    def _first_step_task(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], context: contextvars.Context
    ) -> tuple[int, Any]:
        task = asyncio.Task(coro, loop=loop, context=context, eager_start=True)  # type: ignore[call-arg,unused-ignore]
        if not task.done():
            return SUSPENDED, task
        if task.cancelled():
            return RAISED, asyncio.CancelledError()
        exc = task.exception()  # (retrieved: a failed first step is its caller's to report, not the loop's)
        return (FINISHED, task.result()) if exc is None else (RAISED, exc)

else:
    from asyncio.tasks import _enter_task, _leave_task

    _C_TASK = asyncio.Task is getattr(asyncio.tasks, "_CTask", None)  # (the pure-Python Task: fields from __init__)
    _task_coro = asyncio.Task._coro.__get__  # type: ignore[attr-defined]  # (the C getter: None before __init__)

    class _StepTask(asyncio.Task):  # type: ignore[type-arg]
        """The current task of a coroutine's first step on 3.11: made, but initialised as a Task (scheduled,
        registered, named) only if the step suspends; a pending future until then, nothing to undo when the
        step finishes. A Task made for the step and dropped after it would be a large share of the
        instructions of a call to an ``async def`` handler (its scheduled first turn, the WeakSet of all tasks,
        its name): ``bash tools/instructions_per_call.sh --async-handler``. Until then it gives the step's coroutine to
        ``get_coro`` and ``repr`` (the C Task's ``get_coro`` reads a field ``__init__`` sets)."""

        __slots__ = ("step_coro",)
        step_coro: Coroutine[Any, Any, Any]

        def get_coro(self) -> Any:
            coro = _task_coro(self)
            return self.step_coro if coro is None else coro

        _coro = property(get_coro)

    _new_task, _init_future, _init_task = _StepTask.__new__, asyncio.Future.__init__, asyncio.Task.__init__

    def _first_step_task(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], context: contextvars.Context
    ) -> tuple[int, Any]:
        if asyncio.current_task(loop) is not None or not _C_TASK:  # inside a task (3.11 cannot swap it out), or
            return SUSPENDED, loop.create_task(coro, context=context)  # no C Task: started as usual
        task = _new_task(_StepTask)
        _init_future(task, loop=loop)
        task.step_coro = coro
        _enter_task(loop, task)
        try:
            first = context.run(_first_step, coro)
        finally:
            _leave_task(loop, task)
        kind, outcome = first
        if kind != SUSPENDED:
            if kind == RAISED and isinstance(outcome, (KeyboardInterrupt, SystemExit)):
                raise outcome
            # (a step that cancelled itself and returned is cancelled, as a Task's step ends)
            if task._must_cancel:  # type: ignore[attr-defined]
                kind, outcome = RAISED, asyncio.CancelledError()
            if task._callbacks is not None:  # (the step asked to hear when its task is done: it is, now; a
                if kind == FINISHED:  # Task refuses set_result and set_exception: Future's own are called)
                    asyncio.Future.set_result(task, outcome)
                elif isinstance(outcome, asyncio.CancelledError):
                    asyncio.Future.cancel(task)
                else:
                    asyncio.Future.set_exception(task, outcome)
                    task.exception()  # (retrieved: the caller reports it)
            return kind, outcome
        # It suspended: this object becomes its Task (what the step saw as its current task, which an
        # asyncio.timeout or a TaskGroup may hold), keeping what the step asked of it: cancellations, callbacks.
        cancelling, callbacks = task.cancelling(), task._callbacks
        carry = _CarryOn(coro)
        carry.first = first  # its first turn waits on what the step yielded
        _init_task(task, carry, loop=loop, context=context)
        for callback, callback_context in callbacks or ():
            task.add_done_callback(callback, context=callback_context)
        for _ in range(cancelling):
            task.cancel()
        return SUSPENDED, task


def first_step(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], context: contextvars.Context
) -> tuple[int, Any]:
    """Run ``coro``'s first step now, in ``context``, as the current task of a Task of its own (as
    ``start_eagerly`` does), and give its outcome to the caller rather than to that Task: ``(FINISHED,
    result)``, ``(RAISED, exception)`` (a CancelledError for a step that cancelled itself), or ``(SUSPENDED,
    task)``, the Task that carries it on (started as usual, not eagerly, inside another task on 3.11 or with a
    loop's task factory). The engine runs ``async def`` handlers this way: one that finishes in its first step
    costs its Task and no wrapper coroutine (``bash tools/instructions_per_call.sh --async-handler``)."""
    if loop.get_task_factory() is not None:
        return SUSPENDED, loop.create_task(coro, context=context)
    return _first_step_task(loop, coro, context)


def start_eagerly(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], context: contextvars.Context
) -> asyncio.Task[Any] | None:
    """Run ``coro``'s first step now, in ``context``, as ``loop``'s current task. Returns None when it finished
    in that step (its result or exception is dropped: give the outcome elsewhere, as the engine's handler
    runner does), else the running Task: ``first_step`` without the outcome. A loop with a task factory of
    its own makes the task instead, started as usual (returned). The loop must be running (we are in one
    of its callbacks)."""
    kind, outcome = first_step(loop, coro, context)
    return outcome if kind == SUSPENDED else None
