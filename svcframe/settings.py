"""The engine's settings: one model, one owner (Margo's JSON ``margo`` section; Bedrock's config ``engine``).

``EngineConfig`` is the only place an engine setting is named, defaulted, bounded and described: the engine
is built from it (``Engine(address, config=EngineConfig(...))``, or its fields by name:
``Engine(address, progress_mode="busy")``), the bootstrap config (``svcframe.config``) embeds it, and the
JSON Schema and the live configuration show it. Names of pluggable parts come from their registries
(``OneOf``), never typed twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import core_schema

from .loops import EVENT_LOOPS
from .plumber import BUCKET_POLICIES, DEFAULT_BUCKET_POLICY, DEFAULT_NIC_POLICY, NIC_POLICIES
from .progress import PROGRESS_MODES
from .wire import DEFAULT_BULK_CHUNK_BYTES, DEFAULT_MAX_BODY_BYTES, MIN_MAX_BODY_BYTES

__all__ = [
    "AuthConfig",
    "EngineConfig",
    "MonitoringConfig",
    "OneOf",
    "PlumberChoice",
    "PlumberConfig",
    "StrictModel",
    "format_validation_error",
    "json_path",
]


class OneOf:
    """pydantic metadata for a ``str`` setting whose value is a name of a registry: ``Annotated[str,
    OneOf(REGISTRY)]`` validates and exports (JSON Schema ``enum``) exactly as ``Literal[...]`` of the
    registry's names would, with the names taken from the registry, never typed again."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.literal_schema(list(self.names))


ProgressMode = Annotated[str, OneOf(PROGRESS_MODES)]  # svcframe.progress
EventLoop = Annotated[str, OneOf(EVENT_LOOPS)]  # svcframe.loops
BucketPolicy = Annotated[str, OneOf(BUCKET_POLICIES)]  # svcframe.plumber
NicPolicy = Annotated[str, OneOf(NIC_POLICIES)]  # svcframe.plumber


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PlumberChoice(StrictModel):
    """Output only: the NIC the plumber chose when this server started (``svcframe.plumber.NicChoice``).

    A running server fills it in; in a config given to a server it is ignored and replaced by a fresh
    choice, so a live configuration stays re-launchable. A patch cannot change it.
    """

    nic: str | None = None
    address: str | None = None
    bucket: str | None = None
    bucket_nics: list[str] = Field(default_factory=list)
    index: int | None = None
    selection: int | None = None
    reason: str = ""
    topology: str | None = None


class PlumberConfig(StrictModel):
    """NIC selection (Carns 2025 §4.1.1, Figure 5; Mochi plumber names; see ``svcframe.plumber``).

    Applied when ``engine.address`` has a wildcard host (``tcp://0.0.0.0:PORT``, ``tcp://[::]:PORT``,
    ``tcp://*:PORT``): the server listens on the chosen NIC's address. ``passthrough`` in either slot lets
    the OS route. Defaults are the paper's: ``package`` + ``roundrobin``.
    """

    bucket_policy: BucketPolicy = DEFAULT_BUCKET_POLICY
    nic_policy: NicPolicy = DEFAULT_NIC_POLICY
    interfaces: list[str] | None = Field(
        None, description="interface-name patterns (fnmatch) to choose from; None = physical NICs with an address"
    )
    topology_file: str | None = Field(
        None, description="a described topology (JSON or hwloc XML) instead of this host's; tests and rehearsals"
    )
    chosen: PlumberChoice | None = Field(None, description="output only: filled in by a running server")


class MonitoringConfig(StrictModel):
    """Statistics (on by default), request tracing (off by default) and process samples."""

    enabled: bool = True
    tracing: bool = False
    otel: bool = Field(
        False,
        description="export traced spans through OpenTelemetry (the otel extra; turns tracing on); the exporter "
        "comes from OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_ENDPOINT, the console without them (svcframe.tracing)",
    )
    sample_interval_seconds: float | None = Field(
        1.0, gt=0, description="how often to sample loop lag, tasks, in-flight calls, CPU and RSS (null: never)"
    )
    timing_sample_every: int = Field(
        16, ge=1, description="after a callpath's first 64 calls, time one call in this many (1 = every call)"
    )

    @model_validator(mode="before")
    @classmethod
    def _otel_needs_tracing(cls, value: Any) -> Any:
        """``otel: true`` records spans: tracing is on unless given, and cannot be off beside it."""
        if not isinstance(value, dict) or not value.get("otel"):
            return value
        if value.get("tracing") is False:
            raise ValueError("otel true exports traced spans: it needs tracing true (switch otel off to stop tracing)")
        return {**value, "tracing": True}


class AuthConfig(StrictModel):
    """Where the shared secret comes from (never the secret itself: it must not appear in any config).

    The secret authenticates every connection with an HMAC challenge at set-up (svcframe.wire.auth_mac).
    A ``svcframe serve --secret-file`` option or the ``SVCFRAME_SECRET`` environment variable also work.
    """

    secret_file: str | None = Field(None, description="a file holding the shared secret")
    secret_env: str = Field("SVCFRAME_SECRET", description="an environment variable holding the shared secret")


class EngineConfig(StrictModel):
    """The engine section (Margo analogue). Times carry their unit in their name."""

    address: str = Field("tcp://127.0.0.1:0", description="tcp://HOST:PORT (port 0 = ephemeral) or unix:///path")
    event_loop: EventLoop = "auto"
    progress_mode: ProgressMode = "spindown"
    progress_spindown_msec: float = Field(10.0, ge=0)
    progress_timeout_ub_msec: float = Field(100.0, ge=0)
    default_timeout_seconds: float = Field(30.0, gt=0)
    drain_timeout_seconds: float = Field(5.0, ge=0)
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=MIN_MAX_BODY_BYTES, le=1 << 30)
    bulk_chunk_bytes: int = Field(
        DEFAULT_BULK_CHUNK_BYTES,
        ge=4096,
        le=1 << 30,
        description="bulk data too large for one frame of the receiving peer travels in frames of this size "
        "(or of the peer's max_body_bytes, when smaller)",
    )
    bulk_cma: bool = Field(
        True, description="same-node bulk over unix:// by cross-memory attach (one kernel copy; Linux)"
    )
    cpu_affinity: list[int] | None = Field(None, description="pin the server process to these cores")
    max_inflight_per_connection: int = Field(
        1024, ge=1, description="running handlers per connection before its further requests wait (backpressure)"
    )
    max_output_bytes: int = Field(
        8 * 1024 * 1024, ge=65536, description="a peer that lets this much output pile up is disconnected"
    )
    idle_timeout_seconds: float = Field(
        300.0, ge=0, description="close accepted connections idle this long (0 = never)"
    )
    handshake_timeout_seconds: float = Field(10.0, gt=0)
    frame_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="a frame must complete this long after its first bytes arrived, else the "
        "connection is dropped (a peer trickling bytes or stalling mid-frame cannot hold it open)",
    )
    max_connections: int | None = Field(
        None, ge=1, description="accepted connections at once (default: 4096, or the descriptor limit less 64)"
    )
    max_connections_per_host: int | None = Field(
        None,
        ge=1,
        description="accepted tcp connections at once from one IP address (default: half of max_connections)",
    )
    allow_third_party_bulk: bool = Field(
        False, description="let handlers move bulk data for handles that are not their caller's (passed on by others)"
    )
    send_tracebacks: bool = Field(
        False,
        description="send a failed handler's traceback (it names server source paths) to unauthenticated "
        "callers too; authenticated callers always get it",
    )
    auth: AuthConfig = AuthConfig()
    trusted_network: bool = Field(
        False, description="allow listening on a non-loopback address without a shared secret"
    )
    monitoring: MonitoringConfig = MonitoringConfig()
    plumber: PlumberConfig = PlumberConfig()

    @field_validator("monitoring", mode="before")
    @classmethod
    def _monitoring_switch(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value  # "monitoring": false switches it off

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        from .transport import parse_address

        parse_address(value)  # raises ConfigError (a ValueError) with the reason
        return value

    @model_validator(mode="after")
    def _chunk_fits(self) -> EngineConfig:
        if self.bulk_chunk_bytes > self.max_body_bytes:
            raise ValueError("bulk_chunk_bytes must not exceed max_body_bytes")
        return self


def json_path(loc: Iterable[str | int]) -> str:
    """``("providers", 1, "config", "path")`` -> ``providers[1].config.path`` (how errors name a place)."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def format_validation_error(exc: ValidationError, source: str = "config", *, at: tuple[str | int, ...] = ()) -> str:
    """One line per problem: ``source: path.to[3].key: message (got VALUE)``; ``at``: the JSON path of what
    was validated in its document, put before each problem's path."""
    lines = []
    for err in exc.errors():
        path = json_path((*at, *err["loc"]))
        got = err.get("input")
        shown = json.dumps(got, default=str)[:80] if err["type"] != "missing" else None
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {path or '(top level)'}: {msg}" + (f" (got {shown})" if shown else ""))
    return "\n".join(lines)
