"""Deadlines of an engine's outgoing calls and bulk transfers, and how a deadline travels on the wire.

Every outgoing operation has a deadline (loop time); the caller waits for its answer or the deadline,
whichever comes first. ``Deadlines`` keeps all of them behind one loop timer. ``wire_deadline`` turns the
time left into the header's ``deadline_usec``, so the server can drop work nobody waits for.
"""

from __future__ import annotations

import asyncio
import heapq
from typing import Any


class Deadlines:
    """The deadlines of one engine's outgoing calls and bulk transfers, behind ONE loop timer.

    A loop timer per call (``loop.call_at`` + ``cancel``) costs about as much as the rest of a call's Python
    work, even on uvloop; here a call costs a heap push. An entry names its call by the
    connection's table of waiting futures and the request id, never by the future itself: a finished call's
    future (and its result, perhaps megabytes) is not kept alive by the heap. Finished calls (gone from
    their table) are not removed; the timer skips them, and the heap is compacted when it holds more than
    twice the unfinished calls, so its memory stays in proportion to the calls in flight.

    On expiry, a waiting future gets ``DeadlineExpired`` (its caller raises DeadlineExceeded).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, dict[int, asyncio.Future[Any]], int]] = []
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def add(self, deadline: float, waiting: dict[int, asyncio.Future[Any]], request_id: int) -> None:
        """Expire the future ``waiting[request_id]`` at ``deadline`` (loop time, seconds) unless by then it is
        done or no longer in ``waiting`` (the caller removes it when the call ends)."""
        heap = self._heap
        self._seq = seq = self._seq + 1
        heapq.heappush(heap, (deadline, seq, waiting, request_id))
        if deadline < self._timer_at:
            self._arm(deadline)
        elif len(heap) > 1024 and not seq & 1023:
            self._compact()

    def _compact(self) -> None:
        """Drop finished calls when they are more than half the heap (amortised O(1) per call); ``_idle()``
        when none is left."""
        heap = self._heap
        live = [entry for entry in heap if (f := entry[2].get(entry[3])) is not None and not f.done()]
        if len(live) * 2 < len(heap):
            heapq.heapify(live)
            self._heap = live
            if not live:
                self._idle()

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        heap = self._heap
        now = self._loop.time() if self._loop is not None else 0.0
        while heap:
            deadline, _, waiting, request_id = heap[0]
            future = waiting.get(request_id)
            if deadline > now and future is not None and not future.done():
                break
            heapq.heappop(heap)
            if future is not None and not future.done():
                future.set_exception(DeadlineExpired())
        if heap:
            self._arm(heap[0][0])

    def _idle(self) -> None:
        """No call is waiting any more (``_compact`` found none): the timer goes."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, float("inf")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at, self._heap = None, float("inf"), []

    def __len__(self) -> int:
        return len(self._heap)


class DeadlineExpired(Exception):
    """Set on a pending call's future by its deadline timer (turned into DeadlineExceeded by the caller)."""


_MAX_WIRE_DEADLINE_USEC = 0xFFFF_FFFF  # the header's 32-bit deadline: about 71 minutes


def wire_deadline(remaining_seconds: float) -> int:
    """The header's ``deadline_usec`` for a caller that waits ``remaining_seconds`` more: at least 1 µs;
    0 ("no deadline") beyond what 32 bits of microseconds hold, so a longer wait is never cut short by the
    server (the caller's own timer still ends the call)."""
    usec = int(remaining_seconds * 1e6)
    return max(1, usec) if usec <= _MAX_WIRE_DEADLINE_USEC else 0
