"""Providers: the unit a service is composed of, and the client-side handle to one.

A provider type is a ``Provider`` subclass with a ``type_name``, a ``Config`` model (its settings, a pydantic
model: validated when the provider is created, by ``svcframe config check`` offline, and shown in
``svcframe config schema``) and methods marked ``@rpc``::

    from svcframe import Provider, ProviderConfig, rpc, register_provider_type

    @register_provider_type
    class Counter(Provider):
        type_name = "counter"

        class Config(ProviderConfig):   # unknown keys are errors
            start: int = 0

        def __init__(self, engine, provider_id, **kwargs):
            super().__init__(engine, provider_id, **kwargs)
            self.value = self.settings.start   # self.settings: a Counter.Config

        @rpc
        def add(self, req, n):          # sync handlers run inline, with no Task
            self.value += n
            return self.value

        @rpc(name="get")
        async def read(self, req, _):   # async handlers may await (nested calls, bulk transfers)
            return self.value

A ``Config`` model's validators may read a ``ConfigContext`` (the provider's id, name and engine settings) as
pydantic's validation context, to fill defaults that depend on them or check limits the engine sets. A type
without its own ``Config`` takes any JSON object (``Provider.Config``: its keys become attributes).

A *library* is a Python module that registers provider types when imported; the bootstrap config's
``libraries`` lists them. ``ProviderHandle(engine, address, provider_id)`` calls a provider remotely.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, ClassVar, TypeVar, overload

from pydantic import BaseModel, ConfigDict, ValidationError

from .engine import Engine, Request
from .errors import ConfigError
from .packages import import_module
from .settings import EngineConfig, format_validation_error

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
    """Import a provider library (a Python module name) and return the provider types it defines: those it
    registered on import, and those whose class it holds (when it was imported before).

    The libraries svcframe ships answer to their repository names and their installed ones alike
    (``"providers.kv"`` or ``"svcframe_providers.kv"``: ``svcframe.packages``).

    Raises:
        ConfigError: the module cannot be imported (the message says why; a Bedrock module, a ``.so``
            file, is named as such).
    """
    before = set(PROVIDER_TYPES)
    module = MOCHI_LIBRARIES.get(module, module)
    try:
        imported = import_module(module).__name__
    except ImportError as exc:
        hint = " (a Bedrock C++ module; svcframe libraries are Python modules)" if module.endswith(".so") else ""
        raise ConfigError(f"library {module!r} cannot be imported{hint}: {exc}") from exc
    held = {t for t, cls in PROVIDER_TYPES.items() if cls.__module__ == imported}
    return sorted((set(PROVIDER_TYPES) - before) | held)


#: The entry-point group naming installed provider libraries (``name = "module"``; svcframe's own: kv, blob,
#: selftest, in pyproject.toml).
LIBRARY_ENTRY_POINTS = "svcframe.providers"


def installed_libraries() -> list[str]:
    """The provider libraries installed packages name in the ``svcframe.providers`` entry-point group (module
    names, sorted; nothing is imported)."""
    return sorted({ep.value for ep in entry_points(group=LIBRARY_ENTRY_POINTS)})


#: Provider types svcframe itself provides, by type name: the module that registers them, imported the first time
#: a config names one (no ``libraries`` entry needed).
BUILTIN_TYPES = {"group": "svcframe.group_provider", "flock": "svcframe.group_provider"}
#: Mochi's C++ module libraries whose provider types svcframe provides itself (a config listing one loads ours).
MOCHI_LIBRARIES = {"libflock-bedrock-module.so": "svcframe.group_provider"}


def provider_type(type_name: str) -> type[Provider]:
    """Raises ConfigError naming the known types when ``type_name`` is not registered."""
    if type_name not in PROVIDER_TYPES and type_name in BUILTIN_TYPES:
        import_module(BUILTIN_TYPES[type_name])
    try:
        return PROVIDER_TYPES[type_name]
    except KeyError:
        known = ", ".join(sorted(PROVIDER_TYPES)) or "none"
        raise ConfigError(
            f"unknown provider type {type_name!r} (known: {known}); list the module that defines it in 'libraries'"
        ) from None


class ProviderConfig(BaseModel):
    """A base for a provider type's ``Config``: an unknown key is an error, not a silent no-op."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class ConfigContext:
    """What a provider's ``Config`` validators may read: pydantic's validation context (``info.context``),
    given wherever a provider's config is validated (creating it, ``svcframe config check``, ``serve``).

    Attributes:
        provider_id: the provider's id (assigned, when the config let the server choose).
        name: the provider's name.
        engine: the engine's settings (e.g. ``max_body_bytes``, the largest inline message).
        rank: the server process's rank among those started from this config (``svcframe launch --procs N``,
            or the rank ``srun``/``mpiexec`` gave it); 0 for a server of its own.
        procs: how many server processes this config starts on one machine, in one working directory
            (``svcframe launch --procs N``; ``svcframe config check --procs N``); 1 elsewhere. A provider whose
            files cannot be shared (a database one process opens) names a per-rank file when it is above 1.
    """

    provider_id: int
    name: str
    engine: EngineConfig
    rank: int = 0
    procs: int = 1


class Provider:
    """Base class of providers. Subclasses set ``type_name``, define a ``Config`` model and mark RPC methods
    with ``@rpc``.

    Args:
        engine: the engine to register with.
        provider_id: 0..65534, unique within the process.
        name: the provider's name in the configuration.
        config: the provider's config: a JSON object (validated by ``Config``) or a ``Config`` instance
            (taken as validated).
        dependencies: resolved dependencies, by dependency name: a ``Provider`` of this process
            (``NAME`` / ``TYPE:ID``, optionally ``@local``) or a ``ProviderHandle`` (``...@ADDRESS``);
            a list of them for an array dependency.

    Attributes:
        settings: the validated config, an instance of ``Config`` (every default filled in).

    Raises:
        ConfigError: an invalid config (one line per problem, naming the key and what was expected).
    """

    type_name: ClassVar[str] = ""

    class Config(BaseModel):
        """Any JSON object (a provider type that declares no ``Config`` of its own); its keys are attributes."""

        model_config = ConfigDict(extra="allow")

    #: The dependencies this type expects; None (the default) accepts any, unchecked.
    DEPENDENCIES: ClassVar[tuple[Dependency, ...] | None] = None
    #: The validated config, an instance of ``Config`` (a subclass may declare ``settings: Config`` for type
    #: checkers).
    settings: Any

    def __init__(
        self,
        engine: Engine,
        provider_id: int,
        *,
        name: str | None = None,
        config: Mapping[str, Any] | BaseModel | None = None,
        dependencies: dict[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.provider_id = provider_id
        self.name = name or self.type_name
        if isinstance(config, self.Config):
            self.settings = config
        else:
            raw = config.model_dump() if isinstance(config, BaseModel) else config or {}
            self.settings = self.validate_config(raw, ConfigContext(provider_id, self.name, engine.config))
        self.dependencies: dict[str, Any] = dict(dependencies or {})
        self._registered = False

    @classmethod
    def validate_config(
        cls, config: Mapping[str, Any], context: ConfigContext, *, source: str | None = None, at: tuple[Any, ...] = ()
    ) -> Any:
        """``config`` validated by ``Config`` (with ``context``), every default filled in.

        Args:
            source: what the error lines start with (default: the provider's type, name and id).
            at: the JSON path of ``config`` in its document, prefixed to each problem's path.

        Raises:
            ConfigError: one line per problem, naming the key, the value and what was expected.
        """
        try:
            return cls.Config.model_validate(dict(config), context=context)
        except ValidationError as exc:
            source = source or f"{cls.type_name} provider {context.name!r} (id {context.provider_id}) config"
            raise ConfigError(format_validation_error(exc, source, at=at)) from None

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
        """The provider's live config: its settings as JSON, every default filled in (a config that creates
        an equal provider)."""
        settings: BaseModel = self.settings  # a Config instance (declared Any so that subclasses may narrow it)
        return settings.model_dump(mode="json")

    async def start(self) -> None:
        """Called after registration; acquire resources here (files, databases, connections)."""

    async def before_close(self) -> None:
        """Called before the provider is stopped, while its engine still serves and calls (Margo's pre-finalize
        callbacks): say goodbye to peers here (a group member leaves its group). Keep it short: the server
        gives it ``engine.drain_timeout_seconds`` at most."""

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
    "LIBRARY_ENTRY_POINTS",
    "PROVIDER_TYPES",
    "ConfigContext",
    "Dependency",
    "Provider",
    "ProviderConfig",
    "ProviderHandle",
    "Request",
    "installed_libraries",
    "load_library",
    "provider_type",
    "register_provider_type",
    "rpc",
]
