"""The self-test provider (Quintain analogue): synthetic server load any service can host.

Config: ``{"type": "selftest"}`` in a bootstrap config, with ``libraries: ["selftest.provider"]``.

RPCs:

* ``work``: ``[resp_buffer_size, bulk_direction, bulk_handle, req_buffer]`` -> ``resp_buffer`` (bytes of
  ``resp_buffer_size``). ``bulk_direction`` is ``"pull"`` (the server reads ``bulk_handle``'s bytes from
  the client) or ``"push"`` (the server writes into the client's buffer) or None for no bulk. Without
  bulk the handler runs inline (no Task). (Quintain's ``qtn_work_rpc``, without its inverted-direction
  bug: here ``pull`` is a pull.)
* ``stat``: no argument -> ``{"user_seconds", "system_seconds", "cpu_seconds", "wall_seconds",
  "max_rss_bytes", "pid"}`` from ``getrusage(RUSAGE_SELF)`` (Quintain's ``qtn_stat_rpc``).

Server bulk buffers are kept per size and reused (Quintain's poolset), so a bulk workload measures the
transfer, not the allocator.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

from svcframe import BulkHandle, Provider, Request, register_provider_type, rpc
from svcframe.errors import ConfigError

PULL = "pull"
PUSH = "push"
DIRECTIONS = (PULL, PUSH)


def work_arg(
    resp_buffer_size: int, bulk_direction: str | None, bulk: BulkHandle | None, req_buffer: bytes
) -> list[Any]:
    """The argument of the ``work`` RPC (a positional list keeps the request small and fast to decode)."""
    return [resp_buffer_size, bulk_direction, bulk.to_wire() if bulk is not None else None, req_buffer]


@register_provider_type
class SelftestProvider(Provider):
    """Synthetic work for benchmarks. Config: ``max_response_bytes`` (default 64 MiB), ``max_bulk_bytes``
    (default 1 GiB): requests above them are refused with an error."""

    type_name = "selftest"

    def __init__(self, engine: Any, provider_id: int, **kwargs: Any) -> None:
        super().__init__(engine, provider_id, **kwargs)
        self.config.setdefault("max_response_bytes", 64 * 1024 * 1024)
        self.config.setdefault("max_bulk_bytes", 1 << 30)
        unknown = set(self.config) - {"max_response_bytes", "max_bulk_bytes"}
        if unknown:
            raise ConfigError(f"selftest provider: unknown config key(s) {sorted(unknown)}")
        self._responses: dict[int, bytes] = {}
        self._buffers: dict[int, bytearray] = {}

    def _response(self, size: int) -> bytes:
        resp = self._responses.get(size)
        if resp is None:
            if not 0 <= size <= self.config["max_response_bytes"]:
                raise ValueError(f"resp_buffer_size {size} is outside 0..{self.config['max_response_bytes']}")
            resp = self._responses[size] = bytes(size)
        return resp

    @rpc
    def work(self, req: Request, arg: Any) -> Any:
        resp_size, direction, handle, _req_buffer = arg
        if direction is None:
            return self._response(resp_size)
        return self._work_bulk(req, resp_size, direction, BulkHandle.from_wire(handle))

    async def _work_bulk(self, req: Request, resp_size: int, direction: str, handle: BulkHandle) -> bytes:
        size = handle.size
        if direction not in DIRECTIONS:
            raise ValueError(f"bulk_direction {direction!r}: expected 'pull' or 'push'")
        if size > self.config["max_bulk_bytes"]:
            raise ValueError(f"bulk of {size} bytes exceeds max_bulk_bytes {self.config['max_bulk_bytes']}")
        buf = self._buffers.pop(size, None) or bytearray(size)
        try:
            if direction == PULL:
                await req.engine.pull(handle, buf)
            else:
                await req.engine.push(handle, buf)
        finally:
            self._buffers[size] = buf
        return self._response(resp_size)

    @rpc
    def stat(self, req: Request, _: Any) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "user_seconds": usage.ru_utime,
            "system_seconds": usage.ru_stime,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "wall_seconds": time.monotonic(),
            "max_rss_bytes": usage.ru_maxrss * 1024,
            "pid": os.getpid(),
        }
