"""Server CPU per noop call at saturation, and where it goes.

A real svcframe engine serves in this process; a separate process (a raw socket, pre-encoded frames,
responses counted by bytes) keeps ``--depth`` requests in flight, so the client costs the server
nothing. Prints the server's CPU µs per call (process CPU time / calls) and, with ``--profile``, the
top of a cProfile of the server.

    python tools/profile_server.py [--calls 200000] [--depth 64] [--profile] [--loop uvloop|asyncio]
                                   [--mode block|spindown|busy] [--no-monitoring] [--selftest]
                                   [--async-handler]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import socket
import sys
import time
from multiprocessing import get_context
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from svcframe.engine import Engine
from svcframe.loops import run
from svcframe.progress import PROGRESS_MODES
from svcframe.wire import HEADER_SIZE, Kind, encode_frame, pack_body, rpc_id


def blaster(address: str, calls: int, depth: int, core: int | None) -> None:
    """Keep ``depth`` noop requests in flight over a raw socket until ``calls`` answers arrived."""
    if core is not None:
        os.sched_setaffinity(0, [core])
    host, port = address[6:].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    hello = sock.recv(65536)  # server HELLO
    assert len(hello) >= HEADER_SIZE
    sock.sendall(encode_frame(Kind.HELLO, 0, pack_body({"engine_id": "blaster", "address": None})))
    body = pack_body([0, None, None, b""])
    rid = rpc_id("work")
    # a ring of request ids, sent in turn: an id comes back round only long after its answer (ids are unique
    # among a peer's requests in flight; a server that runs handlers as tasks checks that)
    ring = 16 * depth
    frames = [encode_frame(Kind.REQUEST, i + 1, body, provider_id=1, rpc=rid) for i in range(ring)]
    batch = b"".join(frames[:depth])
    at = depth
    response_size = HEADER_SIZE + len(pack_body(b""))
    got = 0
    sent = 0
    sock.sendall(batch)
    sent += depth
    pending = b""
    while got < calls:
        data = sock.recv(1 << 20)
        if not data:
            raise SystemExit("server closed")
        pending += data
        n = len(pending) // response_size
        pending = pending[n * response_size :]
        got += n
        if sent < calls and n:
            k = min(n, calls - sent)
            sock.sendall(b"".join(frames[(at + i) % ring] for i in range(k)))
            at = (at + k) % ring
            sent += k
    sock.close()


async def serve(
    calls: int,
    depth: int,
    profile: bool,
    client_core: int | None,
    mode: str,
    monitoring: bool,
    selftest: bool,
    async_handler: bool,
) -> None:
    engine = await Engine("tcp://127.0.0.1:0", progress_mode=mode, monitoring=monitoring, secret=None).start()
    if selftest:  # the self-test provider's ``work`` RPC, as `svcframe bench` serves it
        from selftest.provider import SelftestProvider

        SelftestProvider(engine, 1).register()
    elif async_handler:  # a noop written as a coroutine function (as Mochi-style handlers that await are)

        async def work(req: Any, arg: Any) -> bytes:
            return b""

        engine.register(1, "work", work)
    else:
        engine.register(1, "work", lambda req, arg: b"")
    ctx = get_context("spawn")
    proc = ctx.Process(target=blaster, args=(engine.address, calls, depth, client_core))
    profiler = cProfile.Profile() if profile else None
    t0, w0 = time.process_time(), time.perf_counter()
    if profiler:
        profiler.enable()
    proc.start()
    await asyncio.get_running_loop().run_in_executor(None, proc.join)
    if profiler:
        profiler.disable()
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    print(
        f"{calls} calls, depth {depth}: {calls / wall:,.0f} calls/s, server CPU {cpu / calls * 1e6:.2f} µs/call"
        f" (utilisation {cpu / wall:.0%})"
    )
    writes = sum(c.writes for c in engine.connections.all if c.server_side)
    print(
        f"replies left in {writes} writes ({calls / max(writes, 1):.1f} calls per write); "
        f"progress: {engine.progress.polls} polls, {engine.progress.blocks} blocks"
    )
    await engine.close()
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--loop", default="uvloop")
    parser.add_argument("--mode", default="spindown", choices=PROGRESS_MODES)
    parser.add_argument("--no-monitoring", action="store_true")
    parser.add_argument("--selftest", action="store_true", help="serve the self-test provider's work RPC")
    parser.add_argument("--async-handler", action="store_true", help="a noop handler written as async def")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(0, [cores[0]])
    client_core = cores[1] if len(cores) > 1 else None
    run(
        serve(
            args.calls,
            args.depth,
            args.profile,
            client_core,
            args.mode,
            not args.no_monitoring,
            args.selftest,
            args.async_handler,
        ),
        args.loop,
    )


if __name__ == "__main__":
    main()
