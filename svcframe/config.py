"""The bootstrap configuration (Bedrock analogue): one JSON document describes one server process.

Structure (names follow Bedrock; ``engine`` is Bedrock's ``margo`` section)::

    {
      "engine":    {"address": "tcp://127.0.0.1:0", "progress_mode": "spindown", ...},
      "admin":     {"provider_id": 0, "allow_mutations": true},
      "libraries": ["providers.kv", "selftest.provider"],
      "providers": [
        {"name": "kv", "type": "kv", "provider_id": 1, "config": {...},
         "dependencies": {"index": "kv@local"}, "tags": []}
      ]
    }

Validation is pydantic v2 with ``extra="forbid"``: an unknown key is an error, not a silent no-op.
``load_config`` turns validation errors into one ``ConfigError`` whose lines name the JSON path, the value
and what was expected. ``ServiceConfig.model_dump()`` is the document with every default filled in: what
a running server reports as its live configuration.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
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

from .errors import ConfigError
from .loops import EVENT_LOOPS
from .plumber import BUCKET_POLICIES, DEFAULT_BUCKET_POLICY, DEFAULT_NIC_POLICY, NIC_POLICIES
from .progress import PROGRESS_MODES

#: The admin provider's reserved provider id (Bedrock's default is 0 as well).
ADMIN_PROVIDER_ID = 0


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

ProviderId = Annotated[int, Field(ge=0, le=65535)]


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
    otel: bool = Field(False, description="also emit traced spans through the OpenTelemetry API (the otel extra)")
    sample_interval_seconds: float = Field(1.0, gt=0)
    timing_sample_every: int = Field(
        16, ge=1, description="after a callpath's first 64 calls, time one call in this many (1 = every call)"
    )


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
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=4096, le=1 << 30)
    bulk_chunk_bytes: int = Field(1024 * 1024, ge=4096, le=1 << 30)
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
        30.0,
        gt=0,
        description="a frame must complete this long after its first bytes arrived, else the "
        "connection is dropped (a peer trickling bytes cannot hold it open)",
    )
    max_connections: int | None = Field(
        None, ge=1, description="accepted connections at once (default: 4096, or the descriptor limit less 64)"
    )
    max_connections_per_host: int = Field(1024, ge=1, description="accepted tcp connections at once from one IP")
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


class AdminConfig(StrictModel):
    """The built-in admin provider (Bedrock's ``bedrock`` section). See ``svcframe.admin`` for its RPCs."""

    provider_id: ProviderId = Field(
        ADMIN_PROVIDER_ID,
        description="the admin provider's id; every server of a service should use the same one (Bedrock: 0)",
    )
    require_authentication: bool = Field(
        True,
        description="admin mutations and library loading need an authenticated connection (a shared secret)",
    )
    allow_mutations: bool = Field(
        True,
        description="false: patch_config, add_provider, remove_provider, load_library and shutdown are refused",
    )
    dependency_resolution_timeout_seconds: float = Field(
        30.0,
        ge=0,
        description="how long a remote dependency (NAME@ADDRESS, TYPE:ID@ADDRESS) is retried before it is an error",
    )
    provider_start_timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="a provider whose start() has not returned after this long fails the server's start-up "
        "(or the add_provider call), instead of leaving a server that never reports ready",
    )


DependencyValue = str | int | list[str | int]


class ProviderSpec(StrictModel):
    """One provider: Bedrock's ``providers[]`` entry. ``provider_id`` None = assign the lowest free id."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: str = Field(min_length=1)
    provider_id: ProviderId | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    dependencies: dict[str, DependencyValue] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)


class ServiceConfig(StrictModel):
    """A whole server process."""

    engine: EngineConfig = EngineConfig()
    admin: AdminConfig = AdminConfig()
    libraries: list[str] = Field(default_factory=list)
    providers: list[ProviderSpec] = Field(default_factory=list)

    @field_validator("libraries", mode="before")
    @classmethod
    def _one_library(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value  # Bedrock accepts a single string too

    @model_validator(mode="after")
    def _unique(self) -> ServiceConfig:
        names: set[str] = set()
        ids: dict[int, str] = {}
        for spec in self.providers:
            if spec.name in names:
                raise ValueError(f"two providers are named {spec.name!r}; names must be unique")
            names.add(spec.name)
            if spec.provider_id is not None:
                if spec.provider_id == self.admin.provider_id:
                    raise ValueError(
                        f"provider {spec.name!r} uses provider_id {spec.provider_id}, reserved for the admin provider"
                    )
                if spec.provider_id in ids:
                    raise ValueError(
                        f"providers {ids[spec.provider_id]!r} and {spec.name!r} share provider_id {spec.provider_id}"
                    )
                ids[spec.provider_id] = spec.name
        return self


def format_validation_error(exc: ValidationError, source: str = "config") -> str:
    """One line per problem: ``source: path.to[3].key: message (got VALUE)``."""
    lines = []
    for err in exc.errors():
        path = ""
        for part in err["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        got = err.get("input")
        shown = json.dumps(got, default=str)[:80] if err["type"] != "missing" else None
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {path or '(top level)'}: {msg}" + (f" (got {shown})" if shown else ""))
    return "\n".join(lines)


#: A config nested deeper than this, or larger than MAX_CONFIG_BYTES, is a config error (not a RecursionError).
MAX_CONFIG_DEPTH = 64
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def check_depth(data: Any, source: str = "config", limit: int = MAX_CONFIG_DEPTH) -> None:
    """ConfigError when ``data`` nests lists/dicts deeper than ``limit``, naming the path where it does
    (iterative: a hostile 100,000-deep document cannot exhaust the stack)."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > limit:
            raise ConfigError(f"{source}: {path or '/'} is nested more than {limit} levels deep")
        if isinstance(value, dict):
            stack.extend((v, f"{path}/{k}", depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{path}/{i}", depth + 1) for i, v in enumerate(value))


def parse_config(data: Any, source: str = "config") -> ServiceConfig:
    """Validate a decoded JSON document. Raises ConfigError naming each bad JSON path."""
    check_depth(data, source)
    try:
        return ServiceConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def load_config(path: str | os.PathLike[str]) -> ServiceConfig:
    """Read and validate a JSON bootstrap config file.

    Raises:
        ConfigError: unreadable file, invalid JSON (with line and column) or invalid content.
    """
    p = Path(path)
    try:
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB: not a bootstrap config")
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply to be a bootstrap config") from None
    return parse_config(data, str(p))


def config_schema() -> dict[str, Any]:
    """The JSON Schema of the bootstrap config."""
    return ServiceConfig.model_json_schema()
