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
a running server reports as its live configuration. A provider's ``config`` is checked by its type's
``Config`` model once its library is imported (``svcframe.composition``, which also gives the JSON Schema
with each provider's config by type).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from .errors import ConfigError
from .registration import MAX_PROVIDER_ID
from .settings import (  # the engine's section; re-exported: svcframe.config is where configs are read
    EngineConfig,
    StrictModel,
    format_validation_error,
)

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

    @field_validator("provider_id")
    @classmethod
    def _choose_one(cls, value: int | None) -> int | None:
        return None if value == ANY_PROVIDER_ID else value


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
