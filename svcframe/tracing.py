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
        lamport: int, peer: str, status: int, provider_id: int = 0,
    ) -> None:  # fmt: skip
        """A call made (``peer``: the callee's address), with its status."""
        if self.otel is not None:
            attributes = {"svcframe.provider_id": provider_id, "svcframe.status": status, **endpoint_attributes(peer)}
            self.otel.emit(name, "origin", start_us, dur_us, trace_id, span_id, parent_span, attributes)
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
        registration: Any = None, address: object = None, root: bool = False,
    ) -> None:  # fmt: skip
        """A handler run (``peer``: the caller's statistics label; ``registration``: its
        ``svcframe.registration.Registration``; ``address``: this server's, an address or its text; ``root``:
        the call came untraced and this server started its trace, so its span has no remote parent)."""
        if self.otel is not None:
            attributes: dict[str, Any] = {**endpoint_attributes(str(address) if address else None),
                                          "client.address": peer}  # fmt: skip
            if registration is not None:
                owner = registration.owner
                attributes["rpc.service"] = getattr(owner, "type_name", None) or f"provider {registration.provider_id}"
                attributes["svcframe.provider_id"] = registration.provider_id
                if getattr(owner, "name", None):
                    attributes["svcframe.provider"] = owner.name
            self.otel.emit(name, "target", start_us, dur_us, trace_id, span_id, 0, attributes, root=root)
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


#: The W3C trace-context / OpenTelemetry RPC semantic conventions this bridge writes (semconv 1.26+).
RPC_SYSTEM = "svcframe"
#: How a target (SERVER) span's OpenTelemetry id derives from the call's svcframe span id (the CLIENT span
#: keeps it): an odd 64-bit constant, so the two never collide and a nested call finds its parent's id.
_SERVER_SPAN_MIX = 0x5EC0_5EC0_5EC0_5EC1


def server_span_id(span_id: int) -> int:
    """The OpenTelemetry span id of the handler (SERVER) span of the call whose svcframe span id is ``span_id``."""
    return (span_id ^ _SERVER_SPAN_MIX) or 1


def endpoint_attributes(address: str | None, prefix: str = "server") -> dict[str, Any]:
    """``server.address`` / ``server.port`` and ``network.transport`` of an svcframe address
    (``tcp://HOST:PORT`` or ``unix:///path``); ``prefix`` ``client`` for the peer of a server span."""
    if not address or "://" not in address:
        return {f"{prefix}.address": address} if address else {}
    scheme, _, rest = address.partition("://")
    if scheme == "unix":
        return {f"{prefix}.address": rest, "network.transport": "unix"}
    host, _, port = rest.rpartition(":")
    out: dict[str, Any] = {f"{prefix}.address": host.strip("[]") or rest, "network.transport": "tcp"}
    if port.isdigit():
        out[f"{prefix}.port"] = int(port)
    return out


class OTelBridge:
    """Also emit every recorded span through OpenTelemetry (``engine.monitoring.otel``; the ``otel`` extra).

    Set-up, no user code: when the application has not set a tracer provider and the SDK is installed, the
    first bridge of the process installs one (``install_sdk``) whose exporters come from the standard
    variables: ``OTEL_TRACES_EXPORTER`` (names of the ``opentelemetry_traces_exporter`` entry points:
    ``console``, ``otlp`` with ``opentelemetry-exporter-otlp``...; ``none``), else ``otlp`` when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, else ``console``
    (stdout); ``OTEL_SERVICE_NAME`` names the process (default ``svcframe``). Spans are batched and flushed
    when the process exits.

    Spans (RPC semantic conventions): a CLIENT span per call and a SERVER span per handler, named
    ``rpc.method``, with ``rpc.system`` = ``svcframe``, ``rpc.method``, ``rpc.service`` (server side: the
    provider's type, e.g. ``kv``; the caller knows only the provider id, ``svcframe.provider_id``),
    ``server.address`` / ``server.port`` / ``network.transport`` (the callee's endpoint on both sides) and
    ``client.address`` (the peer) on server spans. The trace is the call's svcframe trace. With svcframe's
    own provider the ids form the call tree: a CLIENT span's id is the call's svcframe span id, its SERVER
    span's is ``server_span_id`` of it and its parent the CLIENT span, and a nested call's CLIENT span is a
    child of the SERVER span of the handler that made it. Under an application's own provider, which chooses
    its own ids, both spans of a call are children of a remote parent whose id is the call's svcframe span
    id (``svcframe.span_id`` / ``svcframe.parent_span_id`` attributes keep the exact links).

    Raises:
        ImportError: opentelemetry-api is not installed.
        ConfigError: an exporter named by ``OTEL_TRACES_EXPORTER`` is not installed.
    """

    def __init__(self) -> None:
        from opentelemetry import trace

        install_sdk()
        self._ids = _SPAN_IDS if _SPAN_IDS is not None and trace.get_tracer_provider() is _SDK_PROVIDER else None
        self._tracer = trace.get_tracer("svcframe")

    def emit(
        self, name: str, side: str, start_us: float, dur_us: float, trace_id: bytes, span_id: int,
        parent_span: int, attributes: dict[str, Any], *, root: bool = False,
    ) -> None:  # fmt: skip
        from opentelemetry.context import Context
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, set_span_in_context

        trace_int = int.from_bytes(trace_id, "big")
        if not trace_int or not span_id:
            return
        origin = side == "origin"
        if self._ids is None:  # an application's provider: a remote parent standing for the call
            parent_id: int | None = span_id
        elif origin:  # the call's own id; its parent the SERVER span of the handler that made it (if any)
            self._ids.next = span_id
            parent_id = server_span_id(parent_span) if parent_span else None
        else:
            self._ids.next = server_span_id(span_id)
            parent_id = None if root else span_id
        if parent_id is not None:
            parent = SpanContext(trace_int, parent_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
            context = set_span_in_context(NonRecordingSpan(parent))
        else:  # a root: in the call's trace, whatever span the application has open
            assert self._ids is not None
            context = Context()
            self._ids.trace = trace_int
        start_ns = int(start_us * 1000)
        span = self._tracer.start_span(
            name,
            context=context,
            kind=SpanKind.CLIENT if origin else SpanKind.SERVER,
            attributes={
                "rpc.system": RPC_SYSTEM,
                "rpc.method": name,
                **attributes,
                "svcframe.span_id": f"{span_id:016x}",
                "svcframe.parent_span_id": f"{parent_span:016x}",
            },
            start_time=start_ns,
        )
        span.end(end_time=start_ns + int(dur_us * 1000))


class _SpanIds:
    """svcframe's id generator: the next span (and root trace) id when the bridge chose one, else random.
    Spans are started synchronously right after the choice, on the engine's one thread."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        self.random = RandomIdGenerator()
        self.next = 0
        self.trace = 0

    def generate_span_id(self) -> int:
        chosen, self.next = self.next, 0
        return chosen or self.random.generate_span_id()

    def generate_trace_id(self) -> int:
        chosen, self.trace = self.trace, 0
        return chosen or self.random.generate_trace_id()

    def is_trace_id_random(self) -> bool:
        return True  # svcframe's trace ids are 16 random bytes (new_trace_id)


_SPAN_IDS: _SpanIds | None = None
_SDK_PROVIDER: Any = None


def exporter_names() -> list[str]:
    """The trace exporters the standard variables ask for (``OTEL_TRACES_EXPORTER``, else ``otlp`` when an OTLP
    endpoint is set, else ``console``); ``[]`` for ``none``. ``otlp`` is the exporter of the OTLP protocol the
    variables name (``OTLP_PROTOCOLS``)."""
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not names:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else ["console"]
    return [] if names.lower() == "none" else [n.strip() for n in names.split(",") if n.strip()]


def sdk_tracer_provider(exporters: list[Any]) -> Any:
    """An SDK tracer provider with svcframe's span ids (the call tree, see ``OTelBridge``), a batch processor
    per exporter and the resource of ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (default service
    name ``svcframe``). Tests pass an in-memory exporter; ``install_sdk`` passes those of the variables."""
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    global _SPAN_IDS
    ids = _SpanIds()
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "svcframe")}).merge(
        OTELResourceDetector().detect()
    )
    provider = TracerProvider(resource=resource, id_generator=ids)  # type: ignore[arg-type]
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _SPAN_IDS = ids
    return provider


def install_sdk(provider: Any = None) -> bool:
    """Make ``provider`` (default: ``sdk_tracer_provider`` with the exporters of the standard variables) the
    process's tracer provider, unless one is already set or the SDK is not installed. Returns True if set.

    Raises:
        ConfigError: an exporter the variables name is not installed (e.g. ``otlp`` without
            ``opentelemetry-exporter-otlp``).
    """
    from opentelemetry import trace

    global _SDK_PROVIDER
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # the application's, or ours from an earlier engine
    if provider is None:
        try:
            import opentelemetry.sdk.trace  # noqa: F401
        except ImportError:
            return False  # the API alone: spans go nowhere, as the application chose
        provider = sdk_tracer_provider([_exporter(name) for name in exporter_names()])
    trace.set_tracer_provider(provider)
    _SDK_PROVIDER = provider
    return True


#: ``otlp`` by ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` (the specification's
#: default: ``http/protobuf``, as the otel extra installs): the exporter package's entry point and the package.
OTLP_PROTOCOLS = {
    "http/protobuf": ("otlp_proto_http", "opentelemetry-exporter-otlp-proto-http"),
    "grpc": ("otlp_proto_grpc", "opentelemetry-exporter-otlp-proto-grpc"),
}


def _exporter(name: str) -> Any:
    from importlib.metadata import entry_points

    from .errors import ConfigError

    package, what = None, repr(name)
    if name == "otlp":  # the protocol's own exporter, as the specification says (the SDK's ``otlp`` is gRPC's)
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        if protocol not in OTLP_PROTOCOLS:
            raise ConfigError(f"OTLP protocol {protocol!r} is not supported here (use: {', '.join(OTLP_PROTOCOLS)})")
        name, package = OTLP_PROTOCOLS[protocol]
        what = f"'otlp' (protocol {protocol}: exporter {name!r})"
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        installed = sorted(ep.name for ep in entry_points(group="opentelemetry_traces_exporter"))
        hint = f" (pip install {package})" if package else ""
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER names {what}, which is not installed{hint}; installed: {', '.join(installed)}"
        )
    return next(iter(found)).load()()
