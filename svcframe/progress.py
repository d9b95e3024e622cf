"""The progress loop: when the event loop polls and when it blocks.

Source: Carns et al., "A data-service roofline" (papers/carns2025-data-service-roofline.txt), section
4.1.2, and Margo's ``__margo_hg_progress_fn`` (``progress_timeout_ub_msec``, ``progress_spindown_msec``).

Modes (the registry ``PROGRESS_MODES``):

* ``block``: the loop waits in the selector until a socket or timer is ready (lowest idle CPU).
* ``busy``: the loop never blocks: the selector always runs with a zero timeout (lowest latency).
* ``spindown``: poll while operations are in flight and for ``progress_spindown_msec`` after the last
  one completed, then block. Default, with 10 ms. Polling pays only on a core of its own: spindown blocks
  instead, for a while, as soon as it finds it is starving another process (below).

How "poll" is done on any asyncio loop: an asyncio loop computes its selector timeout as zero whenever
its ready queue is not empty. While polling, a callback that re-schedules itself with ``call_soon``
keeps the ready queue non-empty, so every iteration runs ``select(0)`` (stdlib) or ``uv_run`` with a
zero poll timeout (uvloop, whose idle handles do the same). When polling stops, the callback is not
re-scheduled and the loop blocks; ``progress_timeout_ub_msec`` then bounds how long a blocking wait
lasts (a periodic wake-up, as Margo bounds ``HG_Progress``).

Contention (not in Margo, whose progress threads usually own their cores): a poll that finds nothing to do
yields the core (``sched_yield``, as Margo's ``ABT_thread_yield``). The yield reaches only tasks
of the caller's scheduling group: with the kernel's autogroups (``kernel.sched_autogroup_enabled``, on in most
distributions), a session is a group, so a server started in a session of its own (by ``svcframe.launch``, srun,
systemd or its own shell) does not give its core to a client from another session by yielding, and busy mode
keeps the core until the scheduler preempts it (client and server on one core, both busy: the server polls about
twice as often per call in a session of its own as in its client's, and every call takes longer). Spindown's back-off,
below, finds the contention in either placement. A yield that returns more than ``YIELD_LOST_SECONDS`` later,
with the process's involuntary context switches grown meanwhile (``getrusage``'s ``ru_nivcsw``: another task
took our core, not the hypervisor), shows another runnable process on the core. One such yield is a blip (a
kernel worker, a few a second even on an idle core); ``CONTENDED_STRIKES`` within
``STRIKE_WINDOW_SECONDS`` is a process that keeps needing our core: typically the very peer whose reply we wait
for, or whose request we serve (a strike per round trip), or a CPU-bound process we take half the core from (a
strike per time slice). Spinning there only delays it, so spindown then stops polling and blocks, and does not
poll again for a hold-off that starts at ``HOLDOFF_MIN_SECONDS`` and doubles, up to ``HOLDOFF_MAX_SECONDS``,
each time the next try finds the core contended again (within ``RECONTENDED_SECONDS`` of the hold-off's end); a
spindown window that ends without contention resets it, and so does contention found later than that: a new
episode, not the same competitor (under a steady load the window never ends, and rare bursts of kernel work
would otherwise double the hold-off each time, until the server blocked all the time and its throughput
dropped: ``svcframe bench --workload client-read``). (A short first hold-off matters: a connection's start,
with the processes setting it up on our core, can look like contention for a moment.) With client and server
on one core (server spindown, client block), backing off gives the latency of two blocking processes, where
spinning is slower (``svcframe bench --workload client-seq``). ``busy`` mode never backs off: it is the
explicit request to poll whatever it costs."""

from __future__ import annotations

import asyncio
import os
import resource
import time

_yield_cpu = os.sched_yield
_clock = time.perf_counter

#: A ``sched_yield`` that returns later than this gave the core to another task; one that does not switch
#: takes a few microseconds at most, well below it.
YIELD_LOST_SECONDS = 20e-6
#: Long yields (each with another task on our core) within STRIKE_WINDOW_SECONDS that make spindown block.
CONTENDED_STRIKES = 3
STRIKE_WINDOW_SECONDS = 0.02
#: How long spindown blocks after it found itself starving another process, before it polls again: the
#: first time, and at most (doubling while each new try finds contention again).
HOLDOFF_MIN_SECONDS = 0.05
HOLDOFF_MAX_SECONDS = 2.0
#: Contention found within this long after a hold-off ended is the same competitor (the hold-off doubles);
#: later, a new episode (it starts again at HOLDOFF_MIN_SECONDS).
RECONTENDED_SECONDS = 0.1


def _involuntary_switches() -> int:
    """Context switches of this process the kernel forced (preemption, or a yield that ran another task)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


PROGRESS_MODES = ("block", "busy", "spindown")


class Progress:
    """Drives polling vs blocking for one engine's loop.

    The engine calls ``activity()`` whenever work starts or completes (unless ``blocking``) and keeps
    ``inflight`` (operations in progress: outgoing calls, running handlers, bulk transfers) up to date.

    Args:
        mode: one of PROGRESS_MODES.
        spindown_msec: how long to keep polling after the last operation completed (spindown mode).
        timeout_ub_msec: upper bound on one blocking wait, in ms (0 = no periodic wake-up).
        backoff: spindown blocks while it starves another process on its core (see the module); False gives
            Margo's plain spindown (the attribute of the same name may be changed at any time).

    Raises:
        ValueError: unknown mode or negative times.
    """

    def __init__(
        self,
        mode: str = "spindown",
        spindown_msec: float = 10.0,
        timeout_ub_msec: float = 100.0,
        *,
        backoff: bool = True,
    ) -> None:
        self.backoff = backoff
        self.inflight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._spinning = False
        self._last = 0.0
        self._polled = 0.0  # self._last as the previous poll saw it
        self._tick: asyncio.TimerHandle | None = None
        self.polls = 0  # loop iterations run with a zero selector timeout because of us
        self.blocks = 0  # times we let the loop block
        self.wakeups = 0  # periodic wake-ups from progress_timeout_ub_msec
        self.contended = 0  # times spindown found itself starving another process on its core, and blocked
        self.last_holdoff = 0.0  # seconds: how long it held off (blocked) the last time
        self._switches = 0  # _involuntary_switches() at the last long yield (or when polling started)
        self._strikes = 0  # long yields, each with another task on our core, since _first_strike
        self._first_strike = 0.0
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
        # a new setting polls again at once: no hold-off, and the next one, should contention be found, short
        self._holdoff_until = 0.0  # spindown: no polling before this time.monotonic() (contention seen)
        self._holdoff = HOLDOFF_MIN_SECONDS
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
        """Work started or completed: start polling (unless in block mode, or holding off after contention)."""
        self._last = last = time.monotonic()
        if (
            not self._spinning
            and self.mode != "block"
            and self._loop is not None
            and (last >= self._holdoff_until or not self.backoff)
        ):
            self._spinning = True
            self._polled = last
            self._switches = _involuntary_switches()
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
                t = _clock()
                _yield_cpu()  # like Margo's ABT_thread_yield: let another runnable process have the core
                if _clock() - t > YIELD_LOST_SECONDS and mode == "spindown" and self.backoff and self._starving():
                    return
            self._polled = last
            loop.call_soon(self._poll)
        else:
            self._spinning = False
            self.blocks += 1
            self._holdoff = HOLDOFF_MIN_SECONDS  # a window ended without contention

    def _starving(self) -> bool:
        """A long yield: a strike if another task took our core meanwhile; at CONTENDED_STRIKES within
        STRIKE_WINDOW_SECONDS, stop polling and hold off (see the module)."""
        switches = _involuntary_switches()
        if switches == self._switches:
            return False  # the hypervisor, not a process of this machine
        self._switches = switches
        now = time.monotonic()
        if now - self._first_strike > STRIKE_WINDOW_SECONDS:
            self._first_strike, self._strikes = now, 0
        self._strikes = strikes = self._strikes + 1
        if strikes < CONTENDED_STRIKES:
            return False
        self._strikes = 0
        self.contended += 1
        if now - self._holdoff_until > RECONTENDED_SECONDS:
            self._holdoff = HOLDOFF_MIN_SECONDS  # a new episode, not the competitor of the last hold-off
        self.last_holdoff = self._holdoff
        self._holdoff_until = now + self._holdoff
        self._holdoff = min(2 * self._holdoff, HOLDOFF_MAX_SECONDS)
        self._spinning = False
        self.blocks += 1
        return True

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
            "contended": self.contended,
            "holding_off": self.mode == "spindown" and time.monotonic() < self._holdoff_until,
            "last_holdoff_msec": self.last_holdoff * 1000.0,
        }
