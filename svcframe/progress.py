"""The progress loop: when the event loop polls and when it blocks.

Source: Carns et al., "A data-service roofline" (papers/carns2025-data-service-roofline.txt), section
4.1.2, and Margo's ``__margo_hg_progress_fn`` (``progress_timeout_ub_msec``, ``progress_spindown_msec``).

Modes (the registry ``PROGRESS_MODES``):

* ``block``: the loop waits in the selector until a socket or timer is ready (lowest idle CPU).
* ``busy``: the loop never blocks: the selector always runs with a zero timeout (lowest latency).
* ``spindown``: poll while operations are in flight and for ``progress_spindown_msec`` after the last
  one completed, then block. Default, with 10 ms.

How "poll" is done on any asyncio loop: an asyncio loop computes its selector timeout as zero whenever
its ready queue is not empty. While polling, a callback that re-schedules itself with ``call_soon``
keeps the ready queue non-empty, so every iteration runs ``select(0)`` (stdlib) or ``uv_run`` with a
zero poll timeout (uvloop, whose idle handles do the same). When polling stops, the callback is not
re-scheduled and the loop blocks; ``progress_timeout_ub_msec`` then bounds how long a blocking wait
lasts (a periodic wake-up, as Margo bounds ``HG_Progress``).
"""

from __future__ import annotations

import asyncio
import os
import time

_yield_cpu = os.sched_yield

PROGRESS_MODES = ("block", "busy", "spindown")


class Progress:
    """Drives polling vs blocking for one engine's loop.

    The engine calls ``activity()`` whenever work starts or completes (unless ``blocking``) and keeps
    ``inflight`` (operations in progress: outgoing calls, running handlers, bulk transfers) up to date.

    Args:
        mode: one of PROGRESS_MODES.
        spindown_msec: how long to keep polling after the last operation completed (spindown mode).
        timeout_ub_msec: upper bound on one blocking wait, in ms (0 = no periodic wake-up).

    Raises:
        ValueError: unknown mode or negative times.
    """

    def __init__(self, mode: str = "spindown", spindown_msec: float = 10.0, timeout_ub_msec: float = 100.0) -> None:
        self.inflight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._spinning = False
        self._last = 0.0
        self._polled = 0.0  # self._last as the previous poll saw it
        self._tick: asyncio.TimerHandle | None = None
        self.polls = 0  # loop iterations run with a zero selector timeout because of us
        self.blocks = 0  # times we let the loop block
        self.wakeups = 0  # periodic wake-ups from progress_timeout_ub_msec
        self.configure(mode, spindown_msec, timeout_ub_msec)

    def configure(self, mode: str, spindown_msec: float, timeout_ub_msec: float) -> None:
        """Change the mode and times (allowed while running)."""
        if mode not in PROGRESS_MODES:
            raise ValueError(f"unknown progress mode {mode!r}; choose one of {list(PROGRESS_MODES)}")
        if spindown_msec < 0 or timeout_ub_msec < 0:
            raise ValueError("progress_spindown_msec and progress_timeout_ub_msec must be >= 0")
        self.mode = mode
        #: block mode: work starting or finishing changes nothing (callers skip ``activity()``: a call saved
        #: per RPC on a client-only engine, which blocks by default)
        self.blocking = mode == "block"
        self.spindown_seconds = spindown_msec / 1000.0
        self.timeout_ub_seconds = timeout_ub_msec / 1000.0
        if self._loop is not None:
            self._reschedule_tick()
            self.activity()

    @property
    def spinning(self) -> bool:
        return self._spinning

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._last = time.monotonic()
        self._reschedule_tick()
        self.activity()

    def stop(self) -> None:
        self._loop = None
        self._spinning = False
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    def activity(self) -> None:
        """Work started or completed: start polling (unless in block mode)."""
        self._last = last = time.monotonic()
        if not self._spinning and self.mode != "block" and self._loop is not None:
            self._spinning = True
            self._polled = last
            self._loop.call_soon(self._poll)

    def _poll(self) -> None:
        loop = self._loop
        if loop is None:
            self._spinning = False
            return
        mode = self.mode
        last = self._last
        if mode == "busy" or (
            mode == "spindown" and (self.inflight > 0 or time.monotonic() - last < self.spindown_seconds)
        ):
            self.polls += 1
            if last == self._polled:  # nothing happened since the previous poll: an idle spin
                _yield_cpu()  # like Margo's ABT_thread_yield: let another runnable process have the core
            self._polled = last
            loop.call_soon(self._poll)
        else:
            self._spinning = False
            self.blocks += 1

    def _reschedule_tick(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if self._loop is not None and self.timeout_ub_seconds > 0:
            self._tick = self._loop.call_later(self.timeout_ub_seconds, self._on_tick)

    def _on_tick(self) -> None:
        self.wakeups += 1
        self._tick = None
        self._reschedule_tick()

    def statistics(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "progress_spindown_msec": self.spindown_seconds * 1000.0,
            "progress_timeout_ub_msec": self.timeout_ub_seconds * 1000.0,
            "spinning": self._spinning,
            "inflight": self.inflight,
            "polls": self.polls,
            "blocks": self.blocks,
            "wakeups": self.wakeups,
        }
