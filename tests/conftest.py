"""Shared fixtures: real engines on loopback TCP and unix sockets, on both uvloop and the stdlib loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_asyncio
import uvloop

from svcframe import Engine, Request

#: Every async test (and its async fixtures) runs once per loop; ``mark.asyncio(loop_factories=[...])``
#: narrows a test to some of them.
LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}

#: The whole suite runs authenticated, as a production service would: every engine, server process and
#: CLI call the tests start reads this shared secret (tests of the unauthenticated cases unset it).
os.environ["SVCFRAME_SECRET"] = "svcframe-test-secret"

# Ctrl-C as a terminal delivers it: a shell without job control starts its background jobs with SIGINT ignored
# (POSIX), and an ignored signal stays ignored across exec, so a CI runner that starts us so would have every
# child ignore the tests' SIGINT (the Ctrl-C tests of roofline collect). A handled signal is reset to the
# default at exec: the children then install Python's KeyboardInterrupt handler, as under a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: Bound on any wait in a test for something that should happen "soon" (seconds).
WAIT_SECONDS = 10.0


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(pytest-xdist, on the controller) the terminal's environment, for the worker to restore: GNU readline,
    loaded in a worker, exports ``COLUMNS`` and ``LINES``, and the CLI's output follows ``$COLUMNS``."""
    node.workerinput["terminal_environment"] = {name: os.environ.get(name) for name in ("COLUMNS", "LINES")}


def pytest_configure(config: pytest.Config) -> None:
    for name, value in getattr(config, "workerinput", {}).get("terminal_environment", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    return dict(LOOP_FACTORIES)


class Figures:
    """Measured figures (rates, latencies, memory) that tests record; printed in a table after the run, in the
    order of the tests that recorded them (under pytest-xdist too)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, Any, str]] = []  # (test node id, name, value, unit)

    def record(self, name: str, value: Any, unit: str = "") -> None:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        self.rows.append((test, name, value, unit))


FIGURES = Figures()


@pytest.fixture(scope="session")
def figures() -> Figures:
    """``figures.record(name, value, unit)``: a figure for the table printed at the end of the run."""
    return FIGURES


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist, a worker hands its figures to the controller, which prints them all."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["figures"] = [[test, name, value if isinstance(value, (int, float)) else str(value), unit]
                                   for test, name, value, unit in FIGURES.rows]  # fmt: skip


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """(pytest-xdist, on the controller) a worker's figures, collected as it ends."""
    FIGURES.rows.extend(tuple(row) for row in getattr(node, "workeroutput", {}).get("figures", ()))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES.rows:
        return
    terminalreporter.write_sep("=", f"figures ({len(FIGURES.rows)})")
    width = max(len(name) for _, name, _, _ in FIGURES.rows)
    for _, name, value, unit in sorted(FIGURES.rows, key=lambda row: row[0]):
        if isinstance(value, float):
            shown = f"{value:,.6g}"
        elif isinstance(value, int):
            shown = f"{value:,}"
        else:
            shown = str(value)
        terminalreporter.write_line(f"{name:<{width}}  {shown:>14} {unit}")


#: The real-time priority of :func:`ahead_of_the_machine` (SCHED_FIFO, the lowest): above every ordinary process.
FAVOURED_PRIORITY = 1


@contextlib.contextmanager
def ahead_of_the_machine() -> Iterator[bool]:
    """This thread (the test's event loop) ahead of every ordinary process on the machine, for the time of the
    block (SCHED_FIFO), so the machine's other load does not get between a test and what it measures: a test that
    stages its own competitor for a core (tests/test_progress.py runs it at the same priority; neither a nice value
    nor an autogroup's puts a thread ahead of a process of another scheduling group), or one that counts what a
    server sent while it waited (read at once, not in heaps when the machine let it run). Yields True; False where
    real-time scheduling is not permitted (no CAP_SYS_NICE or RLIMIT_RTPRIO), and the block runs as it is."""
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(FAVOURED_PRIORITY))  # Linux: this thread
    except PermissionError:
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, *before)


def short_socket_path(name: str = "e.sock") -> str:
    """A unix socket path in a fresh directory under /tmp, well inside the 107-byte AF_UNIX limit.

    The caller removes the directory (``shutil.rmtree(os.path.dirname(path))``).
    """
    return os.path.join(tempfile.mkdtemp(prefix="sf", dir="/tmp"), name)


def is_uvloop() -> bool:
    return isinstance(asyncio.get_running_loop(), uvloop.Loop)


async def wait_until(predicate: Callable[[], bool], within: float = WAIT_SECONDS, what: str = "condition") -> None:
    """Poll ``predicate`` (yielding to the loop) until true; fail after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            pytest.fail(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(0.001)


async def check_until(
    check: Callable[[], Awaitable[bool]], within: float = WAIT_SECONDS, what: str = "condition"
) -> None:
    """``wait_until`` for a condition that takes a call to check (an RPC, say): await ``check()`` until true;
    fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:g} s waiting for {what}")


def poll_until(predicate: Callable[[], bool], within: float = WAIT_SECONDS, what: str = "condition") -> None:
    """``wait_until`` for code without an event loop: poll ``predicate`` every 10 ms until true; fail after
    ``within`` seconds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:g} s waiting for {what}")
        time.sleep(0.01)


async def settled_rss(pid: int, within: float = 5.0) -> int:
    """Process ``pid``'s RSS (bytes) once it moved by less than 1 MiB over 100 ms (the allocator and the
    kernel settling after a burst), or its last reading after ``within`` seconds."""
    process = psutil.Process(pid)
    last = int(process.memory_info().rss)
    for _ in range(max(1, int(within / 0.1))):
        await asyncio.sleep(0.1)  # the interval the stability is judged over, not a wait for an event
        now = int(process.memory_info().rss)
        if abs(now - last) < 1 << 20:
            return now
        last = now
    return last


def alive_pids(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` whose process still runs (a zombie has exited)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(params=["tcp", "unix"])
def address(request: pytest.FixtureRequest) -> Iterator[str]:
    """A listening address of each transport (TCP: ephemeral loopback port)."""
    if request.param == "tcp":
        yield "tcp://127.0.0.1:0"
        return
    path = short_socket_path()
    try:
        yield f"unix://{path}"
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


@pytest_asyncio.fixture
async def make_engine() -> AsyncIterator[Callable[..., Awaitable[Engine]]]:
    """``await make_engine(address, **options)``: a started engine, closed at teardown (newest first)."""
    engines: list[Engine] = []

    async def make(address: str | None = None, **options: Any) -> Engine:
        engine = Engine(address, **options)
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in reversed(engines):
        await engine.close(drain_timeout_seconds=1.0)


def register_test_rpcs(engine: Engine, provider_id: int = 1) -> None:
    """echo (sync), aecho (async), boom (raises ValueError("boom")), sleep (async, sleeps arg seconds)."""

    def echo(req: Request, arg: Any) -> Any:
        return arg

    async def aecho(req: Request, arg: Any) -> Any:
        await asyncio.sleep(0)
        return arg

    def boom(req: Request, arg: Any) -> Any:
        raise ValueError("boom")

    async def sleep(req: Request, arg: float) -> float:
        await asyncio.sleep(arg)
        return arg

    for name, handler in (("echo", echo), ("aecho", aecho), ("boom", boom), ("sleep", sleep)):
        engine.register(provider_id, name, handler)


@pytest_asyncio.fixture
async def server(address: str) -> AsyncIterator[Engine]:
    """A started engine listening on ``address`` (tcp and unix) with the test RPCs on provider 1."""
    engine = Engine(address)
    await engine.start()
    register_test_rpcs(engine)
    try:
        yield engine
    finally:
        await engine.close(drain_timeout_seconds=1.0)


@pytest_asyncio.fixture
async def client() -> AsyncIterator[Engine]:
    """A started client-only engine."""
    engine = Engine(None)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close(drain_timeout_seconds=1.0)


@pytest.fixture
def procs(tmp_path: Any) -> Iterator[Any]:
    """Server and peer processes of the reliability tests (``reliability_kit.Procs``), all stopped at the end."""
    from reliability_kit import Procs

    group = Procs(tmp_path)
    try:
        yield group
    finally:
        group.close()


def readme_quickstart() -> tuple[str, str]:
    """The README's quick start: (counter.py source, counter.json text), taken from README.md itself so
    the tests that run them keep the README true."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"```python[^\n]*\n(# counter\.py\n.*?)```", readme, re.S)
    config = re.search(r"```json[^\n]*\n(\{\"libraries\": \[\"counter\"\].*?)```", readme, re.S)
    assert code and config, "README.md lost its quick start"
    return code.group(1), config.group(1)


#: Tests that count a process's memory (RSS, page faults) skip under tools/sanitize.sh: AddressSanitizer's shadow
#: memory and quarantine are in those counts, not svcframe's.
memory_counted = pytest.mark.skipif(
    os.environ.get("SVCFRAME_SANITIZERS") == "1", reason="memory under AddressSanitizer is its own, not svcframe's"
)
