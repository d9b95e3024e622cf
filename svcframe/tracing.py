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

    def __init__(self, max_events: int = 1_000_000, otel: bool = False) -> None:
        self.otel = OTelBridge() if otel else None
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
        if self.otel is not None:
            self.otel.emit(name, "origin", start_us, dur_us, trace_id, span_id, parent_span, peer)
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
        if self.otel is not None:
            self.otel.emit(name, "target", start_us, dur_us, trace_id, span_id, 0, peer)
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


class OTelBridge:
    """Also emit every recorded span through the OpenTelemetry API (optional: ``pip install svcframe[otel]``).

    Library code uses the API only; the SDK and its exporters are the application's choice (without an SDK
    the API is a no-op). The API cannot adopt svcframe's caller-assigned span ids, so each call's origin and
    target spans are children of a remote parent whose span id is the call's svcframe span id, in the call's
    trace: a request stays one trace, and ``svcframe.span_id`` / ``svcframe.parent_span_id`` attributes
    carry the exact links. Attributes follow the RPC semantic conventions (``rpc.system``, ``rpc.method``,
    ``rpc.service``, ``server.address``).

    Raises:
        ImportError: opentelemetry-api is not installed.
    """

    def __init__(self) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = trace.get_tracer("svcframe")

    def emit(
        self, name: str, side: str, start_us: float, dur_us: float, trace_id: bytes, span_id: int,
        parent_span: int, peer: str,
    ) -> None:  # fmt: skip
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, set_span_in_context

        trace_int = int.from_bytes(trace_id, "big")
        if not trace_int or not span_id:
            return
        parent = SpanContext(trace_int, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        start_ns = int(start_us * 1000)
        span = self._tracer.start_span(
            name,
            context=set_span_in_context(NonRecordingSpan(parent)),
            kind=SpanKind.CLIENT if side == "origin" else SpanKind.SERVER,
            attributes={
                "rpc.system": "svcframe",
                "rpc.method": name,
                "server.address": peer,
                "svcframe.side": side,
                "svcframe.span_id": f"{span_id:016x}",
                "svcframe.parent_span_id": f"{parent_span:016x}",
            },
            start_time=start_ns,
        )
        span.end(end_time=start_ns + int(dur_us * 1000))
