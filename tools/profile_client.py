"""Client CPU per noop call, and where it goes: the client's side of tools/profile_server.py.

A server runs in its own process, pinned to the first usable core: for ``--impl svcframe`` a svcframe server
with the self-test provider (selftest/selftest.json, its ``work`` RPC), for ``raw`` and ``msgpack`` the bench's
reference peers (selftest/bench_peers.py). The client runs in this process, on the last usable core:
``--calls`` noop calls (or reads of ``--read`` bytes by ``--method``) with ``--depth`` in flight, in progress
mode ``--mode``, with the same client code as ``svcframe bench --workload client`` (selftest/bench_client.py). Prints the client's CPU µs per call (its
process CPU time over the calls) and, with ``--profile``, the ``--top`` functions by own time (cProfile),
per call; with ``--bytecodes``, the Python bytecodes the calls ran, per call, in all and by function (a trace
of every opcode: exact and independent of the machine, slow).
``--in-process`` runs the server in this process instead, on the client's loop, so that both count both sides.
cProfile and the bytecode trace see Python frames only: where svcframe's hot paths run compiled (``svcframe
--version``) they show as the one line that calls them; ``SVCFRAME_PURE=1`` profiles their definitions, and
callgrind (tools/instructions_per_client_call.sh) counts the compiled build's instructions.

    python tools/profile_client.py [--impl svcframe|raw|msgpack] [--calls 20000] [--depth 1]
                                   [--mode block|spindown|busy] [--transport tcp|unix]
                                   [--read BYTES [--method inline|into|push|pull]] [--profile]
                                   [--bytecodes] [--top 15] [--in-process]

Under callgrind (tools/instructions_per_client_call.sh) only this process is counted: valgrind does not
follow the server child (``--trace-children=no``, its default), and ``callgrind_mark`` brackets the timed
calls.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import os
import pstats
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from selftest import SELFTEST_CONFIG
from selftest.bench_client import IMPLS, MSGPACK, RAW, READ_METHODS, SIDES, SVCFRAME, Operation, spin_msec
from selftest.bench_peers import PeerServer
from svcframe.compiled import compiled_modules
from svcframe.loops import run
from svcframe.progress import PROGRESS_MODES

NAMES = {"svcframe": SVCFRAME, "raw": RAW, "msgpack": MSGPACK}
assert set(NAMES.values()) == set(IMPLS)


@contextlib.contextmanager
def server(impl: str, transport: str, core: int, mode: str | None) -> Iterator[tuple[str, int]]:
    """The address and pid of ``impl``'s server, in progress mode ``mode`` (None: its default), for the time of
    the block."""
    with tempfile.TemporaryDirectory(prefix="sfpc", dir="/tmp") as tmp:
        unix = f"{tmp}/s.sock" if transport == "unix" else None
        if impl == SVCFRAME:
            from svcframe.config import load_config  # here: the raw and msgpack clients load no more than they
            from svcframe.launch import Launch  # run (under callgrind, start-up is most of a run's time)

            cfg = load_config(SELFTEST_CONFIG)
            if unix:
                cfg.engine.address = f"unix://{unix}"
            if mode is not None:
                cfg.engine.progress_mode = mode
            with Launch(cfg, 1, cores=[core]) as job:
                member = job.members[0]
                assert member.pid is not None  # (a launched member reports its pid when it is ready)
                yield member.address, member.pid
        else:
            spin = spin_msec(mode or "spindown") if impl == RAW else 0.0
            with PeerServer("raw" if impl == RAW else "msgpack", core, unix, spin) as peer:
                assert peer.pid is not None  # (known once it accepts connections: PeerServer's __enter__)
                yield peer.address, peer.pid


async def client_and_server(args: argparse.Namespace) -> None:
    """``--in-process``: a svcframe server with the self-test provider on this loop, and the client against it,
    so that ``--bytecodes`` and ``--profile`` count both sides of each call."""
    from svcframe.config import load_config
    from svcframe.server import Server

    with tempfile.TemporaryDirectory(prefix="sfpc", dir="/tmp") as tmp:
        cfg = load_config(SELFTEST_CONFIG)
        cfg.engine.address = "tcp://127.0.0.1:0" if args.transport == "tcp" else f"unix://{tmp}/s.sock"
        if args.server_mode is not None:
            cfg.engine.progress_mode = args.server_mode
        served = await Server(cfg).start()
        try:
            assert served.engine is not None and served.engine.address is not None  # (started)
            await client(SVCFRAME, served.engine.address, None, args)
        finally:
            await served.close()


def cpu_seconds(pid: int) -> float:
    """A process's CPU time (user + system), in seconds, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def callgrind_mark() -> None:
    """Where callgrind dumps its counts (``--dump-before=getsid``, tools/instructions_per_client_call.sh): the
    second dump holds the timed calls alone. ``getsid`` because nothing else in a client calls it."""
    os.getsid(0)


async def counted(operation: Operation, calls: int, depth: int) -> None:
    """Exactly ``calls`` calls of ``operation``, ``depth`` at a time."""
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await operation()

    if depth == 1:
        await worker()
    else:
        await asyncio.gather(*(worker() for _ in range(depth)))


async def client(impl: str, address: str, server_pid: int | None, args: argparse.Namespace) -> None:
    side = await SIDES[impl].open(address, args.mode)
    what = "noop" if not args.read else "read"
    operation = side.operation(what, args.read, args.method)
    await counted(operation, 200, args.depth)  # warm up: connection, caches
    profiler = cProfile.Profile() if args.profile else None
    opcodes: collections.Counter[tuple[str, int, str]] = collections.Counter()
    callgrind_mark()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    server0 = cpu_seconds(server_pid) if server_pid is not None else 0.0
    if profiler:
        profiler.enable()
    with counting_bytecodes(opcodes) if args.bytecodes else contextlib.nullcontext():
        await counted(operation, args.calls, args.depth)
    if profiler:
        profiler.disable()
    callgrind_mark()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    server_cpu = cpu_seconds(server_pid) - server0 if server_pid is not None else None
    await side.close()
    what = "noop" if not args.read else f"{args.read}-byte {args.method} read"
    cpus = (
        f"client CPU {cpu / args.calls * 1e6:.2f} µs/call (utilisation {cpu / wall:.0%}), "
        f"server CPU {server_cpu / args.calls * 1e6:.1f} µs/call"
        if server_cpu is not None
        else f"CPU of both {cpu / args.calls * 1e6:.2f} µs/call (server in this process)"
    )
    print(
        f"{impl} client, {args.calls} {what} calls, depth {args.depth}, {args.mode}: {args.calls / wall:,.0f} calls/s, {cpus}"
    )
    if profiler:
        print_profile(pstats.Stats(profiler), args.calls, args.top)
    if args.bytecodes:
        print_bytecodes(opcodes, args.calls, args.top)


@contextlib.contextmanager
def counting_bytecodes(counts: collections.Counter[tuple[str, int, str]]) -> Iterator[None]:
    """Count every bytecode this thread runs in the block, by function (file, first line, name): through
    ``sys.monitoring``'s INSTRUCTION events (Python >= 3.12, PEP 669), else ``sys.settrace`` opcode events
    (3.11; on 3.12.1 they counted nothing here)."""
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        tool = monitoring.PROFILER_ID

        def on_instruction(code: Any, offset: int) -> None:
            counts[code.co_filename, code.co_firstlineno, code.co_name] += 1

        monitoring.use_tool_id(tool, "profile_client")
        monitoring.register_callback(tool, monitoring.events.INSTRUCTION, on_instruction)
        monitoring.set_events(tool, monitoring.events.INSTRUCTION)
        try:
            yield
        finally:
            monitoring.set_events(tool, 0)
            monitoring.register_callback(tool, monitoring.events.INSTRUCTION, None)
            monitoring.free_tool_id(tool)
        return

    def trace(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes, frame.f_trace_lines = True, False
        if event == "opcode":
            code = frame.f_code
            counts[code.co_filename, code.co_firstlineno, code.co_name] += 1
        return trace

    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(None)


def print_bytecodes(counts: collections.Counter[tuple[str, int, str]], calls: int, top: int) -> None:
    """Bytecodes per noop call, in all and for the ``top`` functions."""
    print(f"bytecodes per call: {sum(counts.values()) / calls:.0f} (Python frames run by the calls); top {top}:")
    for (path, line, name), n in counts.most_common(top):
        print(f"{n / calls:8.1f}  {os.path.basename(path)}:{line}({name})")


def print_profile(stats: pstats.Stats, calls: int, top: int) -> None:
    """The ``top`` functions by own time: own and cumulative µs per noop call, calls per noop call."""
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for _, _, tt, _, _ in entries.values())
    print(f"profiled time {total / calls * 1e6:.2f} µs per call (cProfile adds its own); top {top} by own time:")
    if any(compiled_modules().values()):
        print("(svcframe's compiled modules are not profiled: SVCFRAME_PURE=1 profiles their definitions)")
    print(f"{'own µs':>8} {'own %':>6} {'cum µs':>8} {'calls':>6}  function (per noop call)")
    ranked = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    for (path, line, name), (_, ncalls, tt, ct, _) in ranked:
        where = f"{os.path.basename(path)}:{line}" if line else "~"
        own, cum = tt / calls * 1e6, ct / calls * 1e6
        print(f"{own:8.2f} {100 * tt / total:5.1f}% {cum:8.2f} {ncalls / calls:6.2f}  {where}({name})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=sorted(NAMES), default="svcframe")
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--depth", type=int, default=1, help="calls in flight")
    parser.add_argument("--mode", choices=PROGRESS_MODES, default="block", help="the client's progress mode")
    parser.add_argument(
        "--server-mode", choices=PROGRESS_MODES, help="the server's progress mode (default: its own, spindown)"
    )
    parser.add_argument("--transport", choices=["tcp", "unix"], default="tcp")
    parser.add_argument("--read", type=int, default=0, metavar="BYTES", help="read BYTES per call instead of a noop")
    parser.add_argument("--method", choices=READ_METHODS, default="inline", help="how --read reads")
    parser.add_argument("--profile", action="store_true", help="cProfile the calls; print the top functions")
    parser.add_argument("--bytecodes", action="store_true", help="count the bytecodes per call, by function")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the svcframe server in this process, so that --bytecodes and --profile count both sides",
    )
    args = parser.parse_args()
    if args.in_process and args.impl != "svcframe":
        parser.error("--in-process runs a svcframe server (--impl svcframe)")
    if args.impl == "msgpack" and args.mode != "block":
        parser.error("the msgpack peer only blocks (--mode block)")
    os.environ.setdefault("SVCFRAME_SECRET", secrets.token_hex(16))  # authenticated, as `svcframe bench`
    cores = sorted(os.sched_getaffinity(0))
    impl = NAMES[args.impl]
    if args.in_process:
        run(client_and_server(args))
        return
    with server(impl, args.transport, cores[0], args.server_mode) as (address, server_pid):
        os.sched_setaffinity(0, cores[-1:])
        run(client(impl, address, server_pid, args))


if __name__ == "__main__":
    main()
