"""The progress loop (svcframe.progress): busy, block and spindown modes on a real event loop, live
reconfiguration, and (stdlib loop) proof that the selector really runs with a zero timeout while polling."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import FAVOURED_PRIORITY, WAIT_SECONDS, ahead_of_the_machine, wait_until

from svcframe import Engine, RemoteError, TimeoutError_
from svcframe.progress import PROGRESS_MODES, Progress

pytestmark = pytest.mark.asyncio


@pytest.fixture
def progress_factory() -> Iterator[Any]:
    """``make(mode, spindown_msec, timeout_ub_msec, backoff)``: a Progress started on the running loop, stopped at
    teardown. Without the contention back-off unless asked: on a loaded machine (CI) it would rightly stop the
    polling that the tests of the window observe."""
    made: list[Progress] = []

    def make(mode: str, spindown_msec: float = 10.0, timeout_ub_msec: float = 10.0, backoff: bool = False) -> Progress:
        p = Progress(mode, spindown_msec, timeout_ub_msec, backoff=backoff)
        p.start(asyncio.get_running_loop())
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


async def wait_for_wakeups(p: Progress, n: int) -> None:
    """Let the loop run through ``n`` periodic wake-ups (time passing, without a fixed sleep)."""
    target = p.wakeups + n
    await wait_until(lambda: p.wakeups >= target, what=f"{n} progress wake-ups")


async def test_busy_mode_polls_while_idle(progress_factory: Any) -> None:
    p = progress_factory("busy")
    assert p.spinning
    before = p.polls
    await wait_until(lambda: p.polls >= before + 200, what="busy polling")
    await wait_for_wakeups(p, 3)
    assert p.spinning and p.blocks == 0
    assert p.statistics()["mode"] == "busy"


async def test_block_mode_never_polls(progress_factory: Any) -> None:
    p = progress_factory("block", timeout_ub_msec=5.0)
    p.activity()
    p.inflight = 1
    p.activity()
    await wait_for_wakeups(p, 5)
    assert (p.polls, p.spinning) == (0, False)
    p.inflight = 0


async def test_spindown_polls_for_the_window_then_blocks(progress_factory: Any) -> None:
    p = progress_factory("spindown", spindown_msec=50.0, timeout_ub_msec=10.0)
    await wait_until(lambda: not p.spinning, what="the start-up spin to end")
    blocks = p.blocks
    assert blocks >= 1
    t0 = time.monotonic()
    p.activity()
    assert p.spinning
    await wait_until(lambda: not p.spinning, within=2.0, what="spindown to stop polling")
    elapsed = time.monotonic() - t0
    assert 0.05 <= elapsed < 0.5, f"polled for {elapsed * 1000:.1f} ms with a 50 ms spindown"
    assert p.blocks == blocks + 1
    polls = p.polls
    assert polls > 0
    await wait_for_wakeups(p, 3)
    assert p.polls == polls and not p.spinning  # blocked: no more polling while idle


async def test_spindown_keeps_polling_while_operations_are_in_flight(progress_factory: Any) -> None:
    p = progress_factory("spindown", spindown_msec=10.0, timeout_ub_msec=5.0)
    p.inflight = 1
    p.activity()
    t0 = time.monotonic()
    await wait_until(lambda: time.monotonic() - t0 > 0.05 and p.wakeups >= 5, what="time to pass")
    assert p.spinning  # 5x the spindown window, still polling: an operation is in flight
    p.inflight = 0
    p.activity()
    await wait_until(lambda: not p.spinning, within=2.0, what="polling to stop once idle")


async def test_configure_switches_mode_live(progress_factory: Any) -> None:
    p = progress_factory("block", timeout_ub_msec=5.0)
    await wait_for_wakeups(p, 2)
    assert p.polls == 0
    p.configure("busy", 10.0, 5.0)
    await wait_until(lambda: p.polls > 50, what="polling after switching to busy")
    p.configure("block", 10.0, 5.0)
    await wait_until(lambda: not p.spinning, what="polling to stop after switching to block")
    polls = p.polls
    await wait_for_wakeups(p, 3)
    assert p.polls == polls
    p.configure("spindown", 20.0, 5.0)
    assert p.spinning  # a reconfiguration counts as activity
    await wait_until(lambda: not p.spinning, what="spindown to stop")
    assert p.polls > polls
    assert p.statistics()["progress_spindown_msec"] == pytest.approx(20.0)
    p.configure("block", 10.0, 0.0)  # no periodic wake-up any more
    wakeups = p.wakeups
    ev = asyncio.Event()
    asyncio.get_running_loop().call_later(0.03, ev.set)
    await asyncio.wait_for(ev.wait(), WAIT_SECONDS)
    assert p.wakeups == wakeups


async def test_invalid_mode_or_times_raise_value_error() -> None:
    with pytest.raises(ValueError, match="unknown progress mode"):
        Progress("sometimes")
    p = Progress("block")
    with pytest.raises(ValueError, match="unknown progress mode"):
        p.configure("poll", 10.0, 100.0)
    assert p.mode == "block"  # unchanged after a refused change
    for spindown, ub in ((-1.0, 100.0), (10.0, -1.0)):
        with pytest.raises(ValueError, match=">= 0"):
            Progress("spindown", spindown, ub)
    assert set(PROGRESS_MODES) == {"block", "busy", "spindown"}


async def test_stop_ends_polling(progress_factory: Any) -> None:
    p = progress_factory("busy")
    await wait_until(lambda: p.polls > 10, what="polling")
    p.stop()
    assert not p.spinning
    polls = p.polls
    ev = asyncio.Event()
    asyncio.get_running_loop().call_later(0.02, ev.set)
    await asyncio.wait_for(ev.wait(), WAIT_SECONDS)
    assert p.polls <= polls + 1  # at most the one poll already queued


# --- the selector really runs with timeout 0 while spinning (stdlib loop only) --------------------------------


class SelectRecorder:
    """Records (timeout, progress.spinning) for every ``select`` the stdlib loop makes."""

    def __init__(self, progress: Progress) -> None:
        loop = asyncio.get_running_loop()
        self.selector = loop._selector  # type: ignore[attr-defined]
        self.progress = progress
        self.calls: list[tuple[float | None, bool]] = []
        self._original = self.selector.select

    def __enter__(self) -> SelectRecorder:
        def select(timeout: float | None = None) -> Any:
            self.calls.append((timeout, self.progress.spinning))
            return self._original(timeout)

        self.selector.select = select
        return self

    def __exit__(self, *exc: object) -> None:
        del self.selector.select


@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_selector_timeout_is_zero_while_spinning_then_blocks(progress_factory: Any) -> None:
    p = progress_factory("spindown", spindown_msec=30.0, timeout_ub_msec=0.0)
    await wait_until(lambda: not p.spinning, what="the start-up spin to end")
    with SelectRecorder(p) as rec:
        p.activity()
        await wait_until(lambda: not p.spinning, within=2.0, what="spindown to stop polling")
        spinning = [t for t, s in rec.calls if s]
        assert len(spinning) >= 10
        assert all(t == 0 for t in spinning), f"non-zero selector timeouts while spinning: {set(spinning)}"
        mark = len(rec.calls)
        ev = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, ev.set)
        await asyncio.wait_for(ev.wait(), WAIT_SECONDS)
    blocked = [t for t, s in rec.calls[mark:] if not s]
    assert any(t is None or t > 0.01 for t in blocked), f"the loop never blocked: {blocked}"
    assert not any(s for _, s in rec.calls[mark:])


@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_selector_timeout_is_always_zero_in_busy_mode(progress_factory: Any) -> None:
    p = progress_factory("busy")
    with SelectRecorder(p) as rec:
        ev = asyncio.Event()
        asyncio.get_running_loop().call_later(0.03, ev.set)
        await asyncio.wait_for(ev.wait(), WAIT_SECONDS)
    assert len(rec.calls) >= 10
    assert {t for t, _ in rec.calls} == {0}


@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_selector_blocks_in_block_mode(progress_factory: Any) -> None:
    p = progress_factory("block", timeout_ub_msec=0.0)
    with SelectRecorder(p) as rec:
        p.activity()
        ev = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, ev.set)
        await asyncio.wait_for(ev.wait(), WAIT_SECONDS)
    assert len(rec.calls) < 10, f"{len(rec.calls)} selects for one 50 ms wait: the loop did not block"
    assert any(t is None or t > 0.01 for t, _ in rec.calls)
    assert p.polls == 0


# --- the engine drives the progress loop ---------------------------------------------------------------------------


async def test_engine_progress_returns_to_idle_after_calls(server: Engine, client: Engine) -> None:
    for engine in (server, client):
        engine.progress.configure("spindown", 10.0, 100.0)
        engine.progress.backoff = False  # the test watches the polling itself (see progress_factory)
    assert await client.call(server.address, "echo", 1, provider_id=1) == 1  # type: ignore[arg-type]
    with pytest.raises(RemoteError):
        await client.call(server.address, "boom", provider_id=1)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError_):
        await client.call(server.address, "sleep", 0.3, provider_id=1, timeout_seconds=0.05)  # type: ignore[arg-type]
    started = asyncio.Event()

    async def wait_forever(req: Any, arg: Any) -> None:
        started.set()
        await asyncio.Event().wait()

    server.register(1, "wait_forever", wait_forever)
    task = asyncio.create_task(client.call(server.address, "wait_forever", provider_id=1))  # type: ignore[arg-type]
    await asyncio.wait_for(started.wait(), WAIT_SECONDS)
    assert client.progress.spinning and client.progress.inflight >= 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    handle = server.expose(bytearray(3 * 1024 * 1024), "rw")
    await client.pull(handle)
    await client.push(handle, bytes(1024))
    assert client.progress.inflight == 0
    await wait_until(lambda: server.progress.inflight == 0, what="the server's work to finish")
    for engine in (server, client):
        await wait_until(lambda e=engine: not e.progress.spinning, what="polling to stop")  # type: ignore[misc]
        stats = engine.statistics()["progress"]
        assert stats["inflight"] == 0 and stats["blocks"] >= 1 and stats["polls"] > 0, stats


async def test_engine_in_block_mode_serves_without_polling(address: str, make_engine: Any) -> None:
    server = await make_engine(address, progress_mode="block")
    server.register(1, "echo", lambda req, arg: arg)
    client = await make_engine(None, progress_mode="block")
    assert await asyncio.gather(*(client.call(server.address, "echo", i, provider_id=1) for i in range(50))) == list(
        range(50)
    )
    assert server.progress.polls == 0 and client.progress.polls == 0


# --- spindown on a shared core ---------------------------------------------------------------------


@contextlib.contextmanager
def pinned(core: int) -> Iterator[None]:
    """This process on ``core`` alone for the time of the block."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, [core])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def burning(core: int) -> Iterator[None]:
    """Another process that wants ``core`` all the time (a CPU-bound loop pinned to it)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, [{core}])\nwhile True: pass"],
        stdin=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


async def test_spindown_blocks_while_another_process_needs_its_core(progress_factory: Any) -> None:
    core = max(os.sched_getaffinity(0))
    p = progress_factory("spindown", spindown_msec=600_000.0, backoff=True)  # only contention ends this window
    p.inflight = 1  # work in flight: spindown polls whatever the time
    assert p.spinning
    with pinned(core), burning(core):
        await wait_until(lambda: p.contended >= 1, what="spindown to find the process on its core")
    stats = p.statistics()
    assert stats["contended"] >= 1 and stats["blocks"] >= 1, stats
    # the hold-off ends: work starting polls again
    await wait_until(lambda: (p.activity(), p.spinning)[1], what="polling to resume after the hold-off")
    p.inflight = 0


async def test_busy_mode_never_backs_off(progress_factory: Any) -> None:
    core = max(os.sched_getaffinity(0))
    p = progress_factory("busy", backoff=True)
    with pinned(core), burning(core):
        target = p.polls + 50  # yields that each gave the core to the burner
        await wait_until(lambda: p.polls >= target, what="busy polling beside the burner")
        assert p.spinning and p.contended == 0


@contextlib.contextmanager
def bursting(
    core: int, bursts: int, burn_seconds: float, rest_seconds: float, *, real_time: bool = False
) -> Iterator[subprocess.Popen[bytes]]:
    """Another process on ``core`` that wants it in ``bursts`` short bursts, far apart (a schedule), then exits.
    ``real_time``: it runs as :func:`ahead_of_the_machine` runs the test (SCHED_FIFO, the same priority), and
    hands the core back every 200 µs of its burn (``sched_yield``, as time slices do between ordinary
    processes): the two meet on the core as equals, the machine's other load does not get between them."""
    burn = (
        "    while time.monotonic() < end:\n"
        "        t = time.perf_counter()\n"
        "        while time.perf_counter() - t < 200e-6: pass\n"
        "        os.sched_yield()\n"
        if real_time
        else "    while time.monotonic() < end: pass\n"
    )
    code = (
        f"import os, time; os.sched_setaffinity(0, [{core}])\n"
        + (f"os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param({FAVOURED_PRIORITY}))\n" if real_time else "")
        + f"for _ in range({bursts}):\n"
        f"    end = time.monotonic() + {burn_seconds}\n" + burn + f"    time.sleep({rest_seconds})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


async def test_rare_bursts_of_contention_do_not_escalate_the_hold_off(progress_factory: Any) -> None:
    """Under a steady load (the spindown window never ends), bursts of contention far apart are new episodes:
    each holds off the minimum. (They doubled it each time: 50, 100, 200, 400 ms, until a server under load
    blocked most of the time; 64 KiB reads lost 40%.) The hold-off of one persistent competitor still doubles
    (test above: the core stays contended when it polls again)."""
    from svcframe.progress import HOLDOFF_MIN_SECONDS, RECONTENDED_SECONDS

    core = max(os.sched_getaffinity(0))
    p = progress_factory("spindown", spindown_msec=600_000.0, backoff=True)
    p.inflight = 1
    seen: list[float] = []
    with (
        pinned(core),
        ahead_of_the_machine() as real_time,
        bursting(core, bursts=4, burn_seconds=0.06, rest_seconds=0.45, real_time=real_time) as proc,
    ):
        while proc.poll() is None or len(seen) < p.contended:
            if p.contended > len(seen):
                seen.append(p.last_holdoff)
            if not p.spinning:
                p.activity()  # polls again once the hold-off is over (work goes on)
            await asyncio.sleep(0.005)  # the loop turns: polling, and the burner's bursts, run meanwhile
    p.inflight = 0
    assert len(seen) >= 3, f"the 4 bursts were found {len(seen)} times"
    assert max(seen) <= 2 * HOLDOFF_MIN_SECONDS, (seen, RECONTENDED_SECONDS)
