"""Request tracing: spans of calls and handlers across processes, as Chrome Trace Event JSON.

Off by default; ``Engine.set_tracing(True)`` (or the admin RPC) switches it on at runtime. A traced
call carries, in its frame header, the trace id (W3C, 16 bytes), its span id (8 bytes, chosen by the
caller) and the caller's Lamport clock. The caller records an origin span, the target a handler span
with the same span id; flow events (``ph: "s"`` / ``"f"`` sharing the span id) draw the arrow from
caller to callee in the Perfetto UI (ui.perfetto.dev) or chrome://tracing. Times are microseconds
since the epoch, so traces of several processes on synchronised clocks merge by concatenation.

Lamport clock (Lamport 1978): incremented on every send and receive; a receive sets it to
max(local, received) + 1, so causally related spans are ordered even across clock skew.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from pathlib import Path
from typing import Any


def new_trace_id() -> bytes:
    return secrets.token_bytes(16)


def new_span_id() -> int:
    return secrets.randbits(63) | 1


class Tracer:
    """Collects the trace events of one engine (bounded: the oldest events are dropped past ``max_events``)."""

    def __init__(self, max_events: int = 1_000_000) -> None:
        self.events: list[dict[str, Any]] = []
        self.max_events = max_events
        self.lamport = 0
        self.pid = os.getpid()
        self.dropped = 0

    def tick(self, received: int = 0) -> int:
        """Advance the Lamport clock (past ``received`` when a message arrives) and return it."""
        self.lamport = max(self.lamport, received) + 1
        return self.lamport

    def _add(self, *events: dict[str, Any]) -> None:
        self.events.extend(events)
        excess = len(self.events) - self.max_events
        if excess > 0:
            del self.events[:excess]
            self.dropped += excess

    def origin(
        self, name: str, start_us: float, dur_us: float, trace_id: bytes, span_id: int, parent_span: int,
        lamport: int, peer: str, status: int,
    ) -> None:  # fmt: skip
        tid = threading.get_native_id()
        args = {"trace_id": trace_id.hex(), "span_id": f"{span_id:016x}", "parent_span_id": f"{parent_span:016x}",
                "lamport": lamport, "peer": peer, "status": status, "side": "origin"}  # fmt: skip
        self._add(
            {"name": name, "cat": "rpc", "ph": "X", "ts": start_us, "dur": dur_us, "pid": self.pid, "tid": tid,
             "args": args},
            {"name": name, "cat": "rpc", "ph": "s", "id": f"{span_id:x}", "ts": start_us, "pid": self.pid, "tid": tid},
        )  # fmt: skip

    def target(
        self, name: str, start_us: float, dur_us: float, trace_id: bytes, span_id: int, lamport: int, peer: str,
    ) -> None:  # fmt: skip
        tid = threading.get_native_id()
        args = {"trace_id": trace_id.hex(), "span_id": f"{span_id:016x}", "lamport": lamport, "peer": peer,
                "side": "target"}  # fmt: skip
        self._add(
            {"name": name, "cat": "rpc", "ph": "f", "bp": "e", "id": f"{span_id:x}", "ts": start_us, "pid": self.pid,
             "tid": tid},
            {"name": name, "cat": "handler", "ph": "X", "ts": start_us, "dur": dur_us, "pid": self.pid, "tid": tid,
             "args": args},
        )  # fmt: skip

    def take(self, clear: bool = False) -> list[dict[str, Any]]:
        events = list(self.events)
        if clear:
            self.events.clear()
        return events


def chrome_trace(events: list[dict[str, Any]], process_names: dict[int, str] | None = None) -> dict[str, Any]:
    """A Chrome Trace Event document (``{"traceEvents": [...], "displayTimeUnit": "ms"}``)."""
    meta = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
        for pid, name in (process_names or {}).items()
    ]
    return {"traceEvents": meta + sorted(events, key=lambda e: e["ts"]), "displayTimeUnit": "ms"}


def write_chrome_trace(path: str | os.PathLike[str], events: list[dict[str, Any]], **kw: Any) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(chrome_trace(events, **kw)))
    return out
