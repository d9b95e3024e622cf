"""Eager start: a coroutine's first step runs at once, in the caller's turn of the loop, and its Task carries it
on only if it suspends (CPython >= 3.12: ``asyncio.Task(..., eager_start=True)``, the mechanism behind
``asyncio.eager_task_factory``). During that step the coroutine runs in its own context and is the loop's
current task, so ``asyncio.current_task()``, ``asyncio.timeout`` and task groups work as in any task.

The engine starts handlers this way (svcframe.handlers). Most handlers finish without suspending (an answer
computed, a push ahead written): such a handler costs no turn of the loop and no Task bookkeeping, and its
answer leaves with the other answers of its batch in one write, where a Task's answer was written alone a
turn later. ``python tools/profile_server.py --async-handler`` (a noop ``async def`` handler, 64 requests in
flight), Python 3.13: 11.3-11.7 µs of server CPU per call before, 5.7-7.0 after (a sync handler: 2.5-3.2).

On 3.11 a handler starts as a Task, as before. Emulating the eager step there (the Task made first, entered
as current for the step, its first turn handed the step's outcome) ran, but a server whose handler pulled
256 MiB from a client killed mid-transfer kept the 256 MiB (tests/test_reliability_faults.py), held by
nothing the garbage collector could see; that emulation is not shipped.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Coroutine
from typing import Any

__all__ = ["EAGER", "start_eagerly"]

#: Whether ``start_eagerly`` runs first steps at once (CPython >= 3.12).
EAGER = sys.version_info >= (3, 12)


def start_eagerly(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], context: contextvars.Context
) -> asyncio.Task[Any] | None:
    """Run ``coro``'s first step now, in ``context``, as ``loop``'s current task (on 3.11, or when the loop has
    a task factory of its own: schedule it, as ``loop.create_task`` does). Returns None when it finished in that step (its result or exception stays
    with its Task, which nobody awaits: give the outcome elsewhere, as the engine's handler runner does),
    else the running Task. The loop must be running (we are in one of its callbacks or tasks)."""
    if not EAGER or loop.get_task_factory() is not None:  # (a loop's own task factory makes its tasks)
        return loop.create_task(coro, context=context)
    task = asyncio.Task(coro, loop=loop, context=context, eager_start=True)  # type: ignore[call-arg,unused-ignore]
    return None if task.done() else task
