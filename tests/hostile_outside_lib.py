"""A provider library for tests/test_hostile_outside.py, loaded by real ``svcframe serve`` processes (the tests
directory on their ``PYTHONPATH``). Only what an outside test cannot get from the shipped providers.

* ``outside_victim``: an engine that owns bulk buffers, as any client with a listener does.

  - ``expose``: ``{"size": int, "mode": "r"|"w"|"rw", "peer": ADDRESS|None, "fill": int}`` -> the handle's wire
    form; the buffer is ``size`` bytes of ``fill``. With ``peer``, the handle is bound to that server (this
    engine dials it first, as a client that gives it the handle would).
  - ``unexpose``: a handle's wire form -> None.
  - ``content``: a handle's wire form -> the buffer's bytes (what a push changed).
  - ``handles``: n -> the bulk ids of n fresh handles (unexposed again at once).
* ``outside_hang_start``: ``start()`` waits forever (an awaited dependency that never answers).
* ``outside_block_start``: ``start()`` blocks the event loop (a blocking call in an async start).

``python -m hostile_outside_lib ADDRESS`` is a good client in a process of its own (so an attacker in the test
process does not share its interpreter): it calls the admin provider's ``status`` every 10 ms (the secret, if
any, from SVCFRAME_SECRET), prints ``ready`` after its first answer, and when its stdin closes prints one JSON
line ``{"calls", "max_ms", "p99_ms", "failures"}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

from svcframe import BulkHandle, Provider, Request, register_provider_type, rpc


@register_provider_type
class OutsideVictim(Provider):
    type_name = "outside_victim"

    def __init__(self, engine: Any, provider_id: int, **kwargs: Any) -> None:
        super().__init__(engine, provider_id, **kwargs)
        self._buffers: dict[bytes, bytearray] = {}

    @rpc
    async def expose(self, req: Request, arg: Any) -> list[Any]:
        peer = arg.get("peer")
        if peer is not None:
            await self.engine.connection(peer)
        buf = bytearray([arg.get("fill", 0x5A)]) * arg["size"]
        handle = self.engine.expose(buf, arg.get("mode", "r"), peer=peer)
        self._buffers[handle.bulk_id] = buf
        return handle.to_wire()

    @rpc
    def unexpose(self, req: Request, wire: Any) -> None:
        handle = BulkHandle.from_wire(wire)
        self.engine.unexpose(handle)

    @rpc
    def content(self, req: Request, wire: Any) -> bytes:
        return bytes(self._buffers[BulkHandle.from_wire(wire).bulk_id])

    @rpc
    def handles(self, req: Request, n: int) -> list[bytes]:
        out = []
        for _ in range(n):
            handle = self.engine.expose(bytearray(1), "r")
            self.engine.unexpose(handle)
            out.append(handle.bulk_id)
        return out


@register_provider_type
class OutsideHangStart(Provider):
    type_name = "outside_hang_start"

    async def start(self) -> None:
        await asyncio.Event().wait()


@register_provider_type
class OutsideBlockStart(Provider):
    type_name = "outside_block_start"

    async def start(self) -> None:
        time.sleep(3600)  # noqa: ASYNC251 - a blocking call where an await was meant: the loop cannot time it out


async def _probe(address: str) -> dict[str, Any]:
    from svcframe import Engine

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    latencies: list[float] = []
    failures: list[str] = []
    async with Engine(None) as engine:
        await engine.call(address, "status", provider_id=0, timeout_seconds=10.0)
        print("ready", flush=True)
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                await engine.call(address, "status", provider_id=0, timeout_seconds=2.0)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}"[:200])
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0.01)  # the probe's pace: a call every 10 ms (a schedule, not a wait)
    latencies.sort()
    return {
        "calls": len(latencies),
        "max_ms": 1e3 * latencies[-1] if latencies else 0.0,
        "p99_ms": 1e3 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else 0.0,
        "failures": failures[:5],
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_probe(sys.argv[1]))), flush=True)
