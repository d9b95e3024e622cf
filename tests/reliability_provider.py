"""A provider library for the reliability tests, loaded by real server processes.

Config: ``{"type": "reltest", "config": {"journal": "/path/journal.txt", "hold_cap_seconds": 0}}`` with ``libraries:
["reliability_provider"]`` and the tests directory on the server's ``PYTHONPATH``.

It lets a test see from outside what the server did:

* ``record``: ``{"id": str, "hold_seconds": float}`` -> id. Appends the id to the journal file (one line,
  ``O_APPEND``, before any wait), so a test counts executions per request id, across restarts. The wait is
  capped by ``hold_cap_seconds`` when configured (a replacement server that answers at once).
* ``hold``: ``{"id": str, "seconds": float | None}`` -> id. Waits (forever when None), noting when it
  started and when it was cancelled (``time.monotonic()``: CLOCK_MONOTONIC, comparable across processes).
* ``events``: -> ``[[what, id, monotonic_seconds], ...]`` noted by ``hold``.
* ``sleep``: seconds -> None, keeping no state (cancelled at the caller's deadline like any handler).
* ``noop``: echoes its argument (sync, no Task); ``fail``: raises ``ValueError``.
* ``expose``: ``{"size", "seed"}`` -> ``{"bulk": handle, "sha256": hex}``: a server buffer clients pull.
* ``sha_pull``: ``{"bulk": handle, "id"?: str}`` -> SHA-256 of the bytes the server pulled from the caller.
* ``push_pattern``: ``{"bulk": handle, "seed": int}`` -> SHA-256 of the bytes the server pushed.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from typing import Any

import numpy as np

from svcframe import BulkHandle, Provider, ProviderConfig, Request, register_provider_type, rpc


def pattern(size: int, seed: int) -> bytes:
    """``size`` deterministic pseudo-random bytes."""
    return np.random.default_rng(seed).bytes(size)


@register_provider_type
class ReliabilityTestProvider(Provider):
    type_name = "reltest"

    class Config(ProviderConfig):
        journal: str | None = None
        hold_cap_seconds: float | None = None

    settings: Config

    def __init__(self, engine: Any, provider_id: int, **kwargs: Any) -> None:
        super().__init__(engine, provider_id, **kwargs)
        journal = self.settings.journal
        self._journal = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if journal else None
        self._events: list[list[Any]] = []
        self._exposed: dict[int, tuple[bytes, BulkHandle]] = {}

    async def close(self) -> None:
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None
        for _, handle in self._exposed.values():
            self.engine.unexpose(handle)
        self._exposed.clear()

    @rpc
    def noop(self, req: Request, arg: Any) -> Any:
        return arg

    @rpc
    def fail(self, req: Request, arg: Any) -> None:
        raise ValueError(f"requested failure: {arg}")

    @rpc
    async def record(self, req: Request, arg: Any) -> str:
        rid = str(arg["id"])
        if self._journal is None:
            raise RuntimeError("reltest provider has no journal configured")
        os.write(self._journal, rid.encode() + b"\n")
        hold = float(arg.get("hold_seconds") or 0)
        if self.settings.hold_cap_seconds is not None:
            hold = min(hold, self.settings.hold_cap_seconds)
        if hold:
            await asyncio.sleep(hold)
        return rid

    @rpc
    async def hold(self, req: Request, arg: Any) -> str:
        rid = str(arg["id"])
        self._events.append(["start", rid, time.monotonic()])
        try:
            seconds = arg.get("seconds")
            if seconds is None:
                await asyncio.Event().wait()
            else:
                await asyncio.sleep(float(seconds))
        except asyncio.CancelledError:
            self._events.append(["cancelled", rid, time.monotonic()])
            raise
        self._events.append(["done", rid, time.monotonic()])
        return rid

    @rpc
    async def sleep(self, req: Request, arg: Any) -> None:
        await asyncio.sleep(float(arg))

    @rpc
    def events(self, req: Request, arg: Any) -> list[list[Any]]:
        return self._events

    @rpc
    def expose(self, req: Request, arg: Any) -> dict[str, Any]:
        data = pattern(int(arg["size"]), int(arg["seed"]))
        handle = self.engine.expose(data, "r")
        self._exposed[handle.bulk_id] = (data, handle)
        return {"bulk": handle.to_wire(), "sha256": hashlib.sha256(data).hexdigest()}

    @rpc
    def read(self, req: Request, arg: Any) -> bytes:
        """``pattern(size, seed)`` as the result (bytes): a read the caller may take into its own buffer."""
        return pattern(int(arg["size"]), int(arg["seed"]))

    @rpc
    def bulk_state(self, req: Request, arg: Any) -> dict[str, int]:
        """This engine's exposed buffers and the bytes it moved by cross-memory attach."""
        stats = self.engine.statistics()
        return {"exposed": stats["exposed_bulk_buffers"], "cma_bytes": stats["bulk_cma_bytes"]}

    @rpc
    async def sha_pull(self, req: Request, arg: Any) -> str:
        handle = BulkHandle.from_wire(arg["bulk"])
        data = await req.engine.pull(handle, timeout_seconds=req.remaining_seconds())
        if arg.get("id") is not None and self._journal is not None:
            os.write(self._journal, str(arg["id"]).encode() + b"\n")
        return hashlib.sha256(data).hexdigest()

    @rpc
    async def push_pattern(self, req: Request, arg: Any) -> str:
        handle = BulkHandle.from_wire(arg["bulk"])
        data = pattern(handle.size, int(arg["seed"]))
        await req.engine.push(handle, data, timeout_seconds=req.remaining_seconds())
        return hashlib.sha256(data).hexdigest()
