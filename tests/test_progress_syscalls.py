"""Polling is real on uvloop too: a server process's epoll_wait timeouts, observed with strace.

busy mode: every wait has a zero timeout; block mode and idle spindown: the loop blocks, each wait bounded
by progress_timeout_ub_msec.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess

import pytest

from selftest import SELFTEST_CONFIG
from svcframe.admin import ServiceHandle
from svcframe.config import load_config
from svcframe.engine import Engine
from svcframe.launch import Launch
from svcframe.loops import run

WAIT = re.compile(r"epoll_p?wait\(\d+, .*?, (\d+), (-?\d+)")

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")


@pytest.fixture(scope="module")
def server():
    cfg = load_config(SELFTEST_CONFIG)
    cfg.engine.event_loop = "uvloop"
    with Launch(cfg, 1) as job:
        yield job.members[0]


def _timeouts(pid: int, seconds: float) -> list[int]:
    """The timeout argument of every epoll_wait the process makes during ``seconds``."""
    proc = subprocess.run(
        ["timeout", "-s", "INT", str(seconds), "strace", "-f", "-e", "trace=epoll_wait,epoll_pwait", "-p", str(pid)],
        capture_output=True,
        text=True,
    )
    if "Operation not permitted" in proc.stderr:
        pytest.skip("ptrace is not permitted here")
    return [int(m.group(2)) for m in WAIT.finditer(proc.stderr)]


def _set_mode(address: str, mode: str) -> None:
    async def go() -> None:
        async with Engine(None) as engine:
            await ServiceHandle(engine, address).set_progress(mode)

    run(go())


def test_busy_mode_polls_with_zero_timeout(server) -> None:
    _set_mode(server.address, "busy")
    waits = _timeouts(server.pid, 0.5)
    assert len(waits) > 100  # it really iterates without blocking
    assert set(waits) == {0}


@pytest.mark.parametrize("mode", ["block", "spindown"])
def test_idle_block_and_spindown_wait_in_the_selector(server, mode: str) -> None:
    _set_mode(server.address, mode)
    waits = _timeouts(server.pid, 0.6)
    # spindown may still be inside its window (the admin call was activity); after that the loop
    # blocks: waits bounded by progress_timeout_ub_msec. A wait that ends is followed by a few zero-timeout
    # polls, never a spin: uvloop runs its expired-timer callbacks in one extra non-blocking iteration, and the
    # task a timer wakes (the launcher's rank watch) takes one more.
    first_block = next(i for i, t in enumerate(waits) if t != 0)
    tail = waits[first_block:]
    blocking = sum(1 for t in tail if t != 0)
    assert blocking >= 3, waits
    zero_runs = [len(list(stretch)) for zero, stretch in itertools.groupby(tail, key=lambda t: t == 0) if zero]
    assert max(zero_runs, default=0) <= 3, tail
    assert sum(zero_runs) <= 2 * blocking + 3, tail
    assert all(t == 0 or 0 < t <= 100 for t in tail), tail  # bounded by progress_timeout_ub_msec
