"""Server-side cost of one noop call without the kernel: decode, dispatch, handler, encode.

Feeds batches of pre-encoded ``work`` requests (the self-test provider, as ``svcframe bench`` serves it)
straight into an accepted connection's receive buffer, with a transport that counts and discards what
would be written. What remains is the Python work per call that the saturation benchmark's server CPU
time is made of, minus system calls; it is stable enough to compare two versions of the engine.

    python tools/dispatch_bench.py [--batch 64] [--batches 4000] [--profile] [--no-monitoring]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from selftest.provider import SelftestProvider, work_arg
from svcframe.engine import Engine
from svcframe.loops import run
from svcframe.wire import Kind, encode_frame, pack_body, rpc_id


class SinkTransport(asyncio.Transport):
    """Discards writes; counts them (the kernel's part of the call is not measured here)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: Any) -> None:
        self.writes += 1

    def writelines(self, parts: Any) -> None:
        self.writes += 1

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def main(batch: int, batches: int, profile: bool, monitoring: bool) -> None:
    engine = await Engine("tcp://127.0.0.1:0", monitoring=monitoring, secret=None, progress_mode="block").start()
    SelftestProvider(engine, 1).register()
    conn = engine.connections.accept()
    conn.connection_made(SinkTransport())
    hello = encode_frame(Kind.HELLO, 0, pack_body({"engine_id": "bench", "address": None}))
    body = pack_body(work_arg(0, None, None, b""))
    data = b"".join(encode_frame(Kind.REQUEST, i + 1, body, provider_id=1, rpc=rpc_id("work")) for i in range(batch))

    def feed(chunk: bytes) -> None:
        buf = conn.get_buffer(len(chunk))
        buf[: len(chunk)] = chunk
        conn.buffer_updated(len(chunk))

    feed(hello)
    for _ in range(200):
        feed(data)  # warm up: records, caches
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    t0 = time.perf_counter()
    for _ in range(batches):
        feed(data)
    seconds = time.perf_counter() - t0
    if profiler:
        profiler.disable()
    calls = batch * batches
    print(f"{calls} calls in batches of {batch}: {seconds / calls * 1e9:.0f} ns per call (Python work, no kernel)")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(16)
    await engine.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=4000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--no-monitoring", action="store_true")
    args = parser.parse_args()
    run(main(args.batch, args.batches, args.profile, not args.no_monitoring), "uvloop")
