"""The bootstrap configuration (Bedrock analogue): one JSON document describes one server process.

Structure (names follow Bedrock; ``engine`` is Bedrock's ``margo`` section and ``admin`` its ``bedrock``
section, and a document may use those names: see ``from_mochi``)::

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
a running server reports as its live configuration. A provider's ``config`` is checked by its type's
``Config`` model once its library is imported (``svcframe.composition``, which also gives the JSON Schema
with each provider's config by type).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .errors import ConfigError
from .registration import MAX_PROVIDER_ID
from .settings import (  # the engine's section; re-exported: svcframe.config is where configs are read
    EngineConfig,
    StrictModel,
)
from .settings import format_validation_error as format_validation_error

log = logging.getLogger("svcframe.config")

#: The admin provider's reserved provider id (Bedrock's default is 0 as well).
ADMIN_PROVIDER_ID = 0

#: In a ``providers[]`` entry, Bedrock's "choose one": the server assigns the lowest free provider id.
ANY_PROVIDER_ID = 0xFFFF

#: A provider id a provider can have: 0..65534 (65535 is reserved: Bedrock's "choose one", the wire's "none").
ProviderId = Annotated[int, Field(ge=0, le=MAX_PROVIDER_ID)]


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
    """One provider: Bedrock's ``providers[]`` entry. ``provider_id`` absent, None or 65535 (Bedrock's "choose
    one") = the server assigns the lowest free id (None in the model)."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: str = Field(min_length=1)
    provider_id: Annotated[int, Field(ge=0, le=ANY_PROVIDER_ID)] | None = Field(
        None, description=f"0..{MAX_PROVIDER_ID}; absent, null or {ANY_PROVIDER_ID}: the lowest free id"
    )
    config: dict[str, Any] = Field(default_factory=dict)
    dependencies: dict[str, DependencyValue] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    engine: Literal[0] = Field(
        0, exclude=True, description="Bedrock's engine index; svcframe runs one engine per process: 0, that one"
    )

    @field_validator("provider_id")
    @classmethod
    def _choose_one(cls, value: int | None) -> int | None:
        return None if value == ANY_PROVIDER_ID else value


# -- Mochi's names ------------------------------------------------------------------------------------------
#: Margo settings (mochi-margo 0.24, src/margo-config.c, and names its older docs still show) that svcframe has
#: no equivalent for: ignored, named in one warning. Margo's ``progress_timeout_ub_msec``,
#: ``progress_spindown_msec`` and ``plumber`` (``bucket_policy``, ``nic_policy``) are svcframe's names for the
#: same settings and apply as they are. In ``margo``, Margo's meaning of a name wins (``monitoring`` is
#: Margo's ``{name, config}`` there, not svcframe's).
MARGO_IGNORED = frozenset(
    {
        "argobots", "progress_pool", "rpc_pool", "use_progress_thread", "rpc_thread_count", "handle_cache_size",
        "enable_abt_profiling", "monitoring", "version", "enable_profiling", "enable_diagnostics",
        "profile_sparkline_timeslice_msec",
    }
)  # fmt: skip
#: Bedrock's ``bedrock`` section: ``provider_id`` is the admin provider's; these are renamed; ``pool`` (the
#: Argobots pool of Bedrock's RPCs) is ignored.
BEDROCK_RENAMED = {"dependency_resolution_timeout": "dependency_resolution_timeout_seconds"}
BEDROCK_IGNORED = frozenset({"pool"})


def _mochi_sections_schema(schema: dict[str, Any]) -> None:
    """Bedrock's section names in the JSON Schema (pydantic shows a field under its own name only)."""
    schema["properties"]["margo"] = {
        "description": "Bedrock's name for 'engine' (give one of them): svcframe's engine settings and Margo's; "
        "Margo settings svcframe has no equivalent for are ignored with a warning",
        "anyOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}, "minItems": 1, "maxItems": 1}],
    }
    schema["properties"]["bedrock"] = {
        "description": "Bedrock's name for 'admin' (give one of them): provider_id, dependency_resolution_timeout "
        "(seconds); pool is ignored",
        "type": "object",
    }


def from_mochi(data: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Read Bedrock's section names in a bootstrap document: ``margo`` is ``engine``, ``bedrock`` is ``admin``.

    In ``margo``, the Margo settings in ``MARGO_IGNORED`` and Margo's ``mercury`` section are dropped, except
    ``mercury.na_no_block: true`` (Mercury busy-polls), which is ``progress_mode: busy`` unless one is given;
    a one-element ``margo`` list (Bedrock 0.16's engines) is its element. In ``bedrock``, ``BEDROCK_RENAMED``
    keys are renamed and ``pool`` dropped. A provider dependency naming an Argobots pool or execution stream
    (Bedrock's ``"pool": "__primary__"``) is dropped. What was dropped is named in one logged warning. The
    sections keep the names they were written with, so a validation error names the key as the user wrote it.

    Raises:
        ValueError: both names of a section.
    """
    out = dict(data)
    for ours, theirs in (("engine", "margo"), ("admin", "bedrock")):
        if ours in out and theirs in out:
            raise ValueError(f"give {ours!r} or {theirs!r} (Bedrock's name for it), not both")
    ignored: list[str] = []
    margo = out.get("margo")
    if isinstance(margo, list) and len(margo) == 1:
        margo = margo[0]
    argobots = margo.get("argobots") if isinstance(margo, dict) else None
    if isinstance(margo, dict):
        ignored += [f"margo.{k}" for k in sorted(margo) if k in MARGO_IGNORED]
        margo = {k: v for k, v in margo.items() if k not in MARGO_IGNORED}
        mercury = margo.pop("mercury", None)
        if isinstance(mercury, dict):
            if mercury.get("na_no_block") is True:
                margo.setdefault("progress_mode", "busy")
            ignored += [f"margo.mercury.{k}" for k in sorted(mercury) if k != "na_no_block"]
        elif mercury is not None:
            ignored.append("margo.mercury")
        out["margo"] = margo
    bedrock = out.get("bedrock")
    if isinstance(bedrock, dict):
        ignored += [f"bedrock.{k}" for k in sorted(bedrock) if k in BEDROCK_IGNORED]
        bedrock = {BEDROCK_RENAMED.get(k, k): v for k, v in bedrock.items() if k not in BEDROCK_IGNORED}
        out["bedrock"] = bedrock
    if isinstance(out.get("providers"), list):
        out["providers"], dropped = _argobots_dependencies(out["providers"], argobots)
        ignored += dropped
    if ignored:
        log.warning("%s: ignoring Mochi settings svcframe has no equivalent for: %s", source, ", ".join(ignored))
    return out


def _argobots_dependencies(providers: list[Any], argobots: Any) -> tuple[list[Any], list[str]]:
    """``providers`` without the dependencies that name an Argobots pool or execution stream (``__primary__``
    or one of ``margo.argobots``' ``pools``/``xstreams``, when no provider has that name): Bedrock's ``pool``
    dependencies, where svcframe runs handlers on its event loop. Also returns the JSON paths dropped."""
    names: set[Any] = {"__primary__"}
    for kind in ("pools", "xstreams"):
        entries = argobots.get(kind) if isinstance(argobots, dict) else None
        names |= {e.get("name") for e in entries if isinstance(e, dict)} if isinstance(entries, list) else set()
    names -= {p.get("name") for p in providers if isinstance(p, dict)}
    out, dropped = [], []
    for i, provider in enumerate(providers):
        deps = provider.get("dependencies") if isinstance(provider, dict) else None
        if not isinstance(deps, dict):
            out.append(provider)
            continue
        pools = [k for k, v in deps.items() if isinstance(v, str) and v in names]
        if pools:
            dropped += [f"providers[{i}].dependencies.{k}" for k in pools]
            provider = {**provider, "dependencies": {k: v for k, v in deps.items() if k not in pools}}
        out.append(provider)
    return out, dropped


class ServiceConfig(StrictModel):
    """A whole server process. Bedrock's section names are accepted: ``margo`` for ``engine`` and ``bedrock``
    for ``admin`` (see ``from_mochi``); the live configuration uses svcframe's."""

    model_config = ConfigDict(json_schema_extra=_mochi_sections_schema)

    engine: EngineConfig = Field(EngineConfig(), validation_alias=AliasChoices("engine", "margo"))
    admin: AdminConfig = Field(AdminConfig(), validation_alias=AliasChoices("admin", "bedrock"))
    libraries: list[str] = Field(default_factory=list)
    providers: list[ProviderSpec] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _mochi_names(cls, data: Any, info: ValidationInfo) -> Any:
        source = (info.context or {}).get("source", "config")
        return from_mochi(data, source) if isinstance(data, dict) else data

    @field_validator("engine", mode="before")
    @classmethod
    def _one_engine(cls, value: Any) -> Any:
        if isinstance(value, list):  # Bedrock 0.16's margo list (one left after from_mochi: one engine)
            raise ValueError(f"svcframe runs one engine per process; give one Margo object, not {len(value)}")
        return value

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
        return ServiceConfig.model_validate(data, context={"source": source})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def load_config(path: str | os.PathLike[str]) -> ServiceConfig:
    """Read and validate a JSON bootstrap config file.

    Raises:
        ConfigError: unreadable file, invalid JSON (with line and column) or invalid content.
    """
    return parse_config(read_document(path), str(path))


def read_document(path: str | os.PathLike[str]) -> Any:
    """The decoded JSON of a bootstrap config file, not yet validated.

    Raises:
        ConfigError: unreadable file, larger than ``MAX_CONFIG_BYTES``, or invalid JSON (with line and column).
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
    return data
