"""Paired A/B of one bulk-read mechanism: a change of a few per cent, through this VM's noise.

Run-to-run noise on a shared VM is 20-30%; a 5% change is seen only when the two variants run in the same pair
of processes, in alternate batches, and are compared batch by batch. A server process (first usable core) and
a client process (last usable core) move ``--size`` bytes over ``--transport`` per read, ``--batch`` reads a
batch, each round one batch with the mechanism on and one with it off (in alternating order), for
``--rounds`` rounds. Prints the median GiB/s of each side and the median (and range) of the per-round
ratios on / off.

    python tools/paired_ab.py [--method into|pull|push] [--transport unix|tcp]
                              [--toggle vm|address|offers|split-push|push-ahead|eager|place-ahead|
                                        compiled-push|inline]
                              [--size BYTES] [--batch N] [--rounds N] [--async-handler]

Methods: ``into`` (a call whose bytes result lands in the caller's buffer), ``pull`` (the client pulls a
region the server exposed once), ``push`` (a handler pushes into the caller's exposed buffer). Toggles,
each set in both processes: ``offers`` the reader's write offers
(Connection.peer_cma_offer); ``split-push`` a pusher naming its source for a split read
(Connection.peer_cma_split_push); ``push-ahead`` a handler's push sent ahead of its answer
(Connection.peer_push_ahead: over the socket, so over tcp, or over unix below 256 KiB); ``eager`` handlers
started eagerly (svcframe.eager) or as tasks (``loop.create_task``: what the engine did before);
``place-ahead`` a push ahead placed by the caller's decoder (FrameDecoder.place_ahead) or dispatched as frames;
``inline`` the method ("on") or the same bytes returned as the call's ``bytes`` result ("off"): does a bulk read
beat the inline result? ``--async-handler``: the server's push handler written ``async def ... await
req.engine.push(...)`` instead of a sync one returning ``req.engine.push(...)``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

METHODS = ("into", "pull", "push")
TOGGLES = ("offers", "split-push", "push-ahead", "eager", "place-ahead", "inline")


def set_toggle(engine: Any, toggle: str, on: bool) -> None:
    """Switch ``toggle`` in this process (its engine's connections; ``inline`` switches the client's operation,
    in ``measure``)."""
    if toggle == "eager":
        from svcframe import eager, handlers

        started = eager.start_eagerly if on else lambda loop, coro, context: loop.create_task(coro, context=context)
        stepped = (
            eager.first_step if on else lambda loop, coro, ctx: (eager.SUSPENDED, loop.create_task(coro, context=ctx))
        )
        setattr(handlers, "start_eagerly", started)  # noqa: B010  (the names the engine calls, in this process)
        setattr(handlers, "first_step", stepped)  # noqa: B010
    for conn in engine.connections.all:
        if toggle == "offers":
            conn.peer_cma_offer = on
        elif toggle == "split-push":
            conn.peer_cma_split_push = on
        elif toggle == "push-ahead":
            conn.peer_push_ahead = on
        elif toggle == "place-ahead":
            conn.protocol.decoder.place_ahead = engine.serving.placer(conn) if on else None


def body_limit(size: int) -> int:
    """Both engines' max_body_bytes: the default (4 MiB), or room for a result of ``size`` bytes returned inline
    (``--toggle inline``: a 4 MiB result and its header are over the default)."""
    return max(4 << 20, size + (64 << 10))


async def serve(address: str, size: int, toggle: str, async_handler: bool) -> None:
    from svcframe.bulk import BulkHandle
    from svcframe.engine import Engine

    engine = await Engine(address, max_body_bytes=body_limit(size)).start()
    data = os.urandom(size)
    exposed = engine.expose(data, "r").to_wire()

    def push(req: Any, wire: Any) -> Any:  # as the self-test provider's read: done at once, or a coroutine
        return engine.push(BulkHandle.from_wire(wire), data)

    async def push_awaited(req: Any, wire: Any) -> None:  # the same written the Mochi way (--async-handler)
        await req.engine.push(BulkHandle.from_wire(wire), data)

    engine.register(1, "push", push_awaited if async_handler else push)
    engine.register(1, "read", lambda req, arg: data)
    engine.register(1, "handle", lambda req, arg: exposed)
    engine.register(1, "toggle", lambda req, on: set_toggle(engine, toggle, bool(on)))
    print("ready", engine.address, flush=True)
    await asyncio.Event().wait()


async def measure(address: str, args: argparse.Namespace) -> None:
    from svcframe.bulk import BulkHandle
    from svcframe.engine import Engine

    engine = await Engine(None, max_body_bytes=body_limit(args.size)).start()
    await engine.connection(address)
    buf = bytearray(args.size)
    sink = engine.expose(buf, "w", peer=address).to_wire()
    source = BulkHandle.from_wire(await engine.call(address, "handle", None, provider_id=1))
    call = engine.call
    if args.method == "push":
        op = lambda: call(address, "push", sink, provider_id=1)  # noqa: E731
    elif args.method == "into":
        op = lambda: call(address, "read", None, provider_id=1, into=buf)  # noqa: E731
    else:
        op = lambda: engine.pull(source, buf)  # noqa: E731
    inline = lambda: call(address, "read", None, provider_id=1)  # noqa: E731
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for on in (bool(r % 2), not r % 2):
            await call(address, "toggle", on, provider_id=1)
            set_toggle(engine, args.toggle, on)
            read = inline if args.toggle == "inline" and not on else op
            for _ in range(max(args.batch // 10, 5)):  # warm up this variant
                await read()
            start = time.perf_counter()
            for _ in range(args.batch):
                await read()
            rates[on].append(args.batch * args.size / (time.perf_counter() - start) / 2**30)
    ratios = [a / b for a, b in zip(rates[True], rates[False], strict=True)]
    print(f"{args.method}, {args.size} bytes over {args.transport}, {args.toggle} on/off, "
          f"{args.rounds} rounds of {args.batch}:")  # fmt: skip
    print(f"  on   {statistics.median(rates[True]):6.2f} GiB/s (median)")
    print(f"  off  {statistics.median(rates[False]):6.2f} GiB/s")
    print(f"  on/off {statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})")
    await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=METHODS, default="into")
    parser.add_argument("--transport", choices=("unix", "tcp"), default="unix")
    parser.add_argument("--toggle", choices=TOGGLES, default="place-ahead")
    parser.add_argument("--size", type=int, default=4 << 20)
    parser.add_argument("--batch", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--async-handler", action="store_true", help="the server's push handler as async def")
    parser.add_argument("--role", choices=("server", "client"), help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.size < 1 or args.batch < 1 or args.rounds < 1:
        parser.error("--size, --batch and --rounds must be positive")
    from svcframe import cma
    from svcframe.loops import run

    if not cma.supported():
        sys.exit("paired_ab: cross-memory attach is not supported here (Linux process_vm_readv)")
    cores = sorted(os.sched_getaffinity(0))
    if args.role == "server":
        os.sched_setaffinity(0, {cores[0]})
        run(serve(args.address, args.size, args.toggle, args.async_handler))
    elif args.role == "client":
        os.sched_setaffinity(0, {cores[-1]})
        run(measure(args.address, args))
    else:
        with tempfile.TemporaryDirectory(prefix="sfab", dir="/tmp") as tmp:
            listen = f"unix://{tmp}/s.sock" if args.transport == "unix" else "tcp://127.0.0.1:0"
            common = ["--size", str(args.size), "--toggle", args.toggle, "--transport", args.transport]
            common += ["--async-handler"] if args.async_handler else []
            server = subprocess.Popen(
                [sys.executable, __file__, "--role", "server", "--address", listen, *common],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                ready = server.stdout.readline().split() if server.stdout is not None else []
                if len(ready) != 2 or ready[0] != "ready":
                    sys.exit("paired_ab: the server process did not start")
                rest = ["--method", args.method, "--batch", str(args.batch), "--rounds", str(args.rounds)]
                client = [sys.executable, __file__, "--role", "client", "--address", ready[1], *common, *rest]
                sys.exit(subprocess.run(client).returncode)
            finally:
                server.kill()
                server.wait()


if __name__ == "__main__":
    main()
