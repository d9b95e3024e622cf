"""OpenTelemetry export: ``engine.monitoring.otel: true`` and nothing else. Spans follow the
RPC semantic conventions and form the call tree; in a real server process the exporter comes from the standard
``OTEL_*`` variables (console here), and an exporter that is not installed is a clear start-up error."""

from __future__ import annotations

import gzip
import http.server
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from svcframe import Provider, rpc
from svcframe.engine import Engine, Request
from svcframe.testing import ServerProcess

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

_INSTALLED: list[Any] = []


@pytest.fixture
def otel_spans() -> Iterator[Callable[[], list[Any]]]:
    """svcframe's SDK tracer provider (its span ids: the call tree) with an in-memory exporter, installed once
    per process as ``install_sdk`` would with the exporters of the environment; yields a function returning the
    spans finished so far."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from svcframe.tracing import install_sdk, sdk_tracer_provider

    if not _INSTALLED:
        exporter = InMemorySpanExporter()
        provider = sdk_tracer_provider([exporter])
        if not install_sdk(provider):
            pytest.skip("another tracer provider was installed in this process first")
        _INSTALLED.extend([exporter, provider])
    exporter, provider = _INSTALLED
    exporter.clear()

    def spans() -> list[Any]:
        provider.force_flush()
        return list(exporter.get_finished_spans())

    yield spans


class Front(Provider):
    type_name = "front"

    @rpc
    async def fetch(self, req: Request, arg: list[Any]) -> Any:
        address, n = arg
        return await self.engine.call(address, "lookup", n, provider_id=2)


class Back(Provider):
    type_name = "back"

    @rpc
    def lookup(self, req: Request, n: int) -> int:
        return n + 1


@pytest.mark.asyncio
async def test_spans_follow_rpc_conventions_and_form_the_call_tree(otel_spans: Callable[[], list[Any]]) -> None:
    otel = {"monitoring": {"otel": True}}  # the only setting: tracing is implied
    async with (
        Engine("tcp://127.0.0.1:0", **otel) as a, Engine("tcp://127.0.0.1:0", **otel) as b, Engine(None, **otel) as c,
    ):  # fmt: skip
        assert a.tracer is not None and a.tracer.otel is not None
        Front(a, 1, name="front").register()
        Back(b, 2, name="back").register()
        assert await c.call(a.address, "fetch", [b.address, 41], provider_id=1) == 42
        addresses = {"a": a.address, "b": b.address}
    spans = otel_spans()
    by = {(s.name, s.kind.name): s for s in spans}
    assert set(by) == {("fetch", "CLIENT"), ("fetch", "SERVER"), ("lookup", "CLIENT"), ("lookup", "SERVER")}
    call, fetch, nested, lookup = (by[k] for k in sorted(by, key=lambda k: (k[0] != "fetch", k[1] != "CLIENT")))
    # one trace; each span's parent is the span that caused it
    assert len({s.context.trace_id for s in spans}) == 1
    assert call.parent is None
    assert fetch.parent.span_id == call.context.span_id
    assert nested.parent.span_id == fetch.context.span_id
    assert lookup.parent.span_id == nested.context.span_id
    # RPC semantic conventions
    for s in spans:
        assert s.attributes["rpc.system"] == "svcframe" and s.attributes["rpc.method"] == s.name
        assert s.attributes["network.transport"] == "tcp" and s.attributes["server.address"] == "127.0.0.1"
    for client, server, callee in ((call, fetch, "a"), (nested, lookup, "b")):
        port = int(addresses[callee].rsplit(":", 1)[1])
        assert client.attributes["server.port"] == server.attributes["server.port"] == port
        assert client.attributes["svcframe.provider_id"] == server.attributes["svcframe.provider_id"]
    assert (fetch.attributes["rpc.service"], lookup.attributes["rpc.service"]) == ("front", "back")
    assert lookup.attributes["client.address"] == addresses["a"]  # the caller, as it named itself
    assert call.start_time <= fetch.start_time <= nested.start_time <= lookup.end_time <= call.end_time


def test_otel_setting_implies_tracing_and_refuses_tracing_off() -> None:
    from svcframe.settings import MonitoringConfig

    assert MonitoringConfig.model_validate({"otel": True}).tracing is True
    with pytest.raises(ValueError, match="needs tracing true"):
        MonitoringConfig.model_validate({"otel": True, "tracing": False})


def _console_spans(text: str) -> list[dict[str, Any]]:
    """The JSON spans the SDK's console exporter printed, among the server's log lines."""
    decoder = json.JSONDecoder()
    text = "\n" + text
    spans, at = [], text.find("\n{")
    while at >= 0:
        span, end = decoder.raw_decode(text, at + 1)
        spans.append(span)
        at = text.find("\n{", end)
    return spans


def test_a_server_process_exports_to_the_console_with_no_code(tmp_path: Path) -> None:
    config = {"engine": {"monitoring": {"otel": True}}, "libraries": ["selftest.provider"],
              "providers": [{"name": "st", "type": "selftest", "provider_id": 1}]}  # fmt: skip
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "otel-test-server"}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    with ServerProcess.start(config, tmp_path, env=env) as server:
        from svcframe.loops import run

        async def calls() -> None:
            async with Engine(None, secret=b"svcframe-test-secret") as client:  # an untraced client
                for _ in range(3):
                    await client.call(server.address, "stat", None, provider_id=1)

        run(calls())
        server.stop()
        log = server.log()
    spans = [s for s in _console_spans(log) if s["name"] == "stat"]
    assert len(spans) == 3, log[-3000:]
    for span in spans:
        assert span["kind"] == "SpanKind.SERVER"
        attributes = span["attributes"]
        assert attributes["rpc.system"] == "svcframe" and attributes["rpc.service"] == "selftest"
        assert attributes["server.port"] == int(server.address.rsplit(":", 1)[1])
        assert span["resource"]["attributes"]["service.name"] == "otel-test-server"
    assert len({s["context"]["trace_id"] for s in spans}) == 3  # the server started a trace per call
    assert all(s["parent_id"] is None for s in spans)  # roots: no parent span that exists nowhere


def test_an_exporter_that_is_not_installed_is_a_clear_startup_error(tmp_path: Path) -> None:
    config = {"engine": {"monitoring": {"otel": True}}}
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "no_such_exporter"}
    with pytest.raises(AssertionError, match="OTEL_TRACES_EXPORTER names 'no_such_exporter', which is not installed"):
        ServerProcess.start(config, tmp_path, env=env)


class _Collector(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace collector on loopback: keeps each request's path and spans (protobuf), answers 200."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CollectorRequest)
        self.received: list[tuple[str, list[Any]]] = []
        self.arrived = threading.Event()


class _CollectorRequest(http.server.BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        spans = [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
        self.server.received.append((self.path, spans))
        self.server.arrived.set()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_the_otel_extra_exports_over_otlp_http_with_only_an_endpoint(tmp_path: Path) -> None:
    """pip install 'svcframe[otel]', "otel": true and OTEL_EXPORTER_OTLP_ENDPOINT: spans reach the collector."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra's exporter is not installed")
    collector = _Collector()
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    config = {"engine": {"monitoring": {"otel": True}}, "libraries": ["selftest.provider"],
              "providers": [{"name": "st", "type": "selftest", "provider_id": 1}]}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_port}", OTEL_BSP_SCHEDULE_DELAY="50")
    try:
        with ServerProcess.start(config, tmp_path, env=env) as server:
            from svcframe.loops import run

            async def calls() -> None:
                async with Engine(None, secret=b"svcframe-test-secret") as client:
                    for _ in range(3):
                        await client.call(server.address, "stat", None, provider_id=1)

            run(calls())
            assert collector.arrived.wait(10), server.log()[-3000:]
            server.stop()  # flushes what the batch processor still holds
    finally:
        collector.shutdown()
        collector.server_close()
    assert {path for path, _ in collector.received} == {"/v1/traces"}
    spans = [span for _, batch in collector.received for span in batch if span.name == "stat"]
    assert len(spans) == 3
    attributes = {a.key: a.value.string_value for a in spans[0].attributes}
    assert attributes["rpc.system"] == "svcframe" and attributes["rpc.service"] == "selftest"


def test_otlp_over_a_protocol_whose_exporter_is_missing_names_the_package(tmp_path: Path) -> None:
    from importlib.metadata import entry_points

    if entry_points(group="opentelemetry_traces_exporter", name="otlp_proto_grpc"):
        pytest.skip("the gRPC OTLP exporter is installed here")
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    with pytest.raises(AssertionError, match=r"'otlp' \(protocol grpc: exporter 'otlp_proto_grpc'\), which is not "
                       r"installed \(pip install opentelemetry-exporter-otlp-proto-grpc\)"):  # fmt: skip
        ServerProcess.start({"engine": {"monitoring": {"otel": True}}}, tmp_path, env=env)
