"""Providers: the unit a service is composed of, and the client-side handle to one.

A provider type is a ``Provider`` subclass with a ``type_name`` and methods marked ``@rpc``::

    from svcframe import Provider, rpc, register_provider_type

    @register_provider_type
    class Counter(Provider):
        type_name = "counter"

        def __init__(self, engine, provider_id, *, name="counter", config=None, dependencies=None):
            super().__init__(engine, provider_id, name=name, config=config, dependencies=dependencies)
            self.value = int(self.config.get("start", 0))

        @rpc
        def add(self, req, n):          # sync handlers run inline, with no Task
            self.value += n
            return self.value

        @rpc(name="get")
        async def read(self, req, _):   # async handlers may await (nested calls, bulk transfers)
            return self.value

A *library* is a Python module that registers provider types when imported; the bootstrap config's
``libraries`` lists them. ``ProviderHandle(engine, address, provider_id)`` calls a provider remotely.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, overload

from pydantic import BaseModel

from .engine import Engine, Request
from .errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])
P = TypeVar("P", bound="type[Provider]")

_RPC_ATTR = "__svcframe_rpc__"

#: Provider types by type name: the registry bootstrap configs name in ``providers[].type``.
PROVIDER_TYPES: dict[str, type[Provider]] = {}


@dataclass(frozen=True)
class Dependency:
    """A dependency a provider type expects (Bedrock's ``{name, type, is_required, is_array}``).

    A provider class lists them in ``DEPENDENCIES``; the server then checks a provider's
    ``dependencies`` against them: an unknown name, a missing required one, or a provider of another
    type is a ConfigError naming it. A scalar is accepted for an array dependency and a one-element
    list for a scalar one, as in Bedrock.

    Attributes:
        name: the key in the provider's ``dependencies`` object.
        type: the provider type it must resolve to (None: any type).
        required: whether the key must be given.
        array: whether it takes a list of providers (resolved to a list).
    """

    name: str
    type: str | None = None
    required: bool = True
    array: bool = False


@overload
def rpc(fn: F, *, name: str | None = None) -> F: ...
@overload
def rpc(fn: None = None, *, name: str | None = None) -> Callable[[F], F]: ...
def rpc(fn: F | None = None, *, name: str | None = None) -> Any:
    """Mark a provider method ``(self, req, arg) -> result`` as an RPC (``name`` defaults to its name)."""

    def mark(f: F) -> F:
        setattr(f, _RPC_ATTR, name or f.__name__)
        return f

    return mark(fn) if fn is not None else mark


def register_provider_type(cls: P) -> P:
    """Class decorator: make ``cls`` available to bootstrap configs under ``cls.type_name``.

    Raises:
        ConfigError: no type_name, or another class already registered that name.
    """
    type_name = getattr(cls, "type_name", None)
    if not type_name:
        raise ConfigError(f"provider class {cls.__name__} needs a type_name")
    existing = PROVIDER_TYPES.get(type_name)
    if existing is not None and existing.__qualname__ != cls.__qualname__:
        raise ConfigError(f"provider type {type_name!r} is already registered by {existing.__module__}")
    PROVIDER_TYPES[type_name] = cls
    return cls


def load_library(module: str) -> list[str]:
    """Import a provider library (a Python module name) and return the provider types it registered.

    Raises:
        ConfigError: the module cannot be imported (the message says why).
    """
    before = set(PROVIDER_TYPES)
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"library {module!r} cannot be imported: {exc}") from exc
    return sorted(set(PROVIDER_TYPES) - before)


def provider_type(type_name: str) -> type[Provider]:
    """Raises ConfigError naming the known types when ``type_name`` is not registered."""
    try:
        return PROVIDER_TYPES[type_name]
    except KeyError:
        known = ", ".join(sorted(PROVIDER_TYPES)) or "none"
        raise ConfigError(
            f"unknown provider type {type_name!r} (known: {known}); list the module that defines it in 'libraries'"
        ) from None


class Provider:
    """Base class of providers. Subclasses set ``type_name`` and mark RPC methods with ``@rpc``.

    Args:
        engine: the engine to register with.
        provider_id: 0..65535, unique within the process.
        name: the provider's name in the configuration.
        config: the provider's JSON config (a dict).
        dependencies: resolved dependencies, by dependency name: a ``Provider`` of this process
            (``NAME`` / ``TYPE:ID``, optionally ``@local``) or a ``ProviderHandle`` (``...@ADDRESS``);
            a list of them for an array dependency.
    """

    type_name: ClassVar[str] = ""
    #: The provider's config schema (a pydantic model; unknown keys are errors). None accepts any dict.
    Config: ClassVar[type[BaseModel] | None] = None
    #: The dependencies this type expects; None (the default) accepts any, unchecked.
    DEPENDENCIES: ClassVar[tuple[Dependency, ...] | None] = None

    def __init__(
        self,
        engine: Engine,
        provider_id: int,
        *,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        dependencies: dict[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.provider_id = provider_id
        self.name = name or self.type_name
        self.config: dict[str, Any] = dict(config or {})
        if self.Config is not None:
            self.config = self.validate_config(self.config)
        self.dependencies: dict[str, Any] = dict(dependencies or {})
        self._registered = False

    def validate_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """Validate ``config`` with ``Config`` and return it with every default filled in.

        Raises:
            ConfigError: one line per problem, naming the key, the value and what was expected.
        """
        from pydantic import ValidationError

        from .config import format_validation_error

        assert self.Config is not None
        try:
            return self.Config.model_validate(config).model_dump(mode="json")
        except ValidationError as exc:
            source = f"{self.type_name} provider {self.name!r} (id {self.provider_id}) config"
            raise ConfigError(format_validation_error(exc, source)) from None

    @classmethod
    def rpc_methods(cls) -> dict[str, str]:
        """RPC name -> method name, for every ``@rpc`` method of the class."""
        out: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                rpc_name = getattr(value, _RPC_ATTR, None)
                if rpc_name is not None:
                    out[rpc_name] = attr
        return out

    def register(self) -> None:
        """Add this provider's RPCs to the engine's registration table."""
        for rpc_name, attr in self.rpc_methods().items():
            self.engine.register(self.provider_id, rpc_name, getattr(self, attr), owner=self)
        self._registered = True

    def get_config(self) -> dict[str, Any]:
        """The provider's live config, with defaults filled in (override to add them)."""
        return self.config

    async def start(self) -> None:
        """Called after registration; acquire resources here (files, databases, connections)."""

    async def close(self) -> None:
        """Called after the provider's RPCs are removed and its in-flight calls completed."""


class ProviderHandle:
    """Client side of a provider: ``address`` + ``provider_id`` on an engine.

    ``await handle.call("rpc", arg)`` forwards through the engine, with its errors (see svcframe.errors).
    """

    __slots__ = ("address", "engine", "provider_id", "timeout_seconds")

    def __init__(self, engine: Engine, address: str, provider_id: int, *, timeout_seconds: float | None = None) -> None:
        self.engine = engine
        self.address = address
        self.provider_id = provider_id
        self.timeout_seconds = timeout_seconds

    def call(
        self,
        name: str,
        arg: Any = None,
        *,
        timeout_seconds: float | None = None,
        idempotent: bool = False,
        into: Any = None,
    ) -> Coroutine[Any, Any, Any]:
        """``await handle.call(name, arg)``: ``Engine.call`` on this provider (see it for the arguments and
        errors). Returns the call's coroutine (one coroutine per call, not two)."""
        return self.engine.call(
            self.address,
            name,
            arg,
            provider_id=self.provider_id,
            timeout_seconds=timeout_seconds if timeout_seconds is not None else self.timeout_seconds,
            idempotent=idempotent,
            into=into,
        )

    def __repr__(self) -> str:
        return f"ProviderHandle({self.address!r}, provider_id={self.provider_id})"


__all__ = [
    "PROVIDER_TYPES",
    "Dependency",
    "Provider",
    "ProviderHandle",
    "Request",
    "load_library",
    "provider_type",
    "register_provider_type",
    "rpc",
]
