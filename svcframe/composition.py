"""How providers compose into a service, checked before anything runs; and the schema of such a service.

One check serves ``svcframe config check`` (offline, the whole of it) and ``svcframe serve`` (before it starts
anything, and for every provider added at run time): ``check_service`` over a bootstrap config, made of
``check_provider`` for each ``providers[]`` entry in list order. For each provider:

- its type is known (the config's ``libraries`` are imported first);
- its provider id is free, or chosen when absent or 65535: the lowest free one (Bedrock's rule);
- its ``config`` is valid for its type's ``Config`` model, validated with a ``ConfigContext`` (its id, name
  and the engine's settings), every default filled in;
- its ``dependencies`` match what the type declares (``Provider.DEPENDENCIES``: names, required ones, one or
  many) and, in Bedrock's grammar, name providers of this process that come before it and have the declared
  type. A dependency on another server (``...@ADDRESS``) is resolved when the server starts (it waits up to
  ``admin.dependency_resolution_timeout_seconds`` for it); offline it is a note: "not checked".

Every problem is reported, one line each, naming its JSON path: ``svc.json: providers[1].config.max_value_bytes:
Input should be less than or equal to 1000000000 (got 2000000000)``.

Bedrock's dependency grammar (mochi-bedrock, include/bedrock/DependencyFinder.hpp)::

    SPEC       := IDENTIFIER ['@' LOCATION]
    IDENTIFIER := NAME | TYPE ':' ID
    LOCATION   := ADDRESS | "local"

``service_model(types)`` is the bootstrap config's model with ``providers[]`` a union discriminated on
``type``, each member's ``config`` its type's ``Config``: its JSON Schema lets an editor check a provider's
config by its type (``svcframe config schema``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NamedTuple, Union

from pydantic import BaseModel, Field, ValidationError, create_model

from .config import ProviderSpec, ServiceConfig, check_depth, format_validation_error
from .errors import ConfigError
from .provider import BUILTIN_TYPES, PROVIDER_TYPES, ConfigContext, Provider, load_library, provider_type
from .registration import MAX_PROVIDER_ID
from .settings import EngineConfig, json_path

__all__ = [
    "CheckedProvider",
    "Findings",
    "LocalProvider",
    "Needed",
    "Reference",
    "check_document",
    "check_provider",
    "check_service",
    "choose_provider_id",
    "parse_dependency",
    "service_model",
    "service_schema",
]

#: What ``taken`` maps the admin provider's id to (not a valid provider name, so no provider is mistaken for it).
ADMIN = "(admin)"


class Reference(NamedTuple):
    """One dependency value: ``NAME`` or ``TYPE:ID``; ``location`` None for this process (``@local``, or none)."""

    name: str | None
    type: str | None
    provider_id: int | None
    location: str | None


def parse_dependency(spec: str | int) -> Reference:
    """Parse Bedrock's dependency grammar: ``NAME`` | ``TYPE:ID``, optionally ``@local`` or ``@ADDRESS``.

    Raises:
        ConfigError: a malformed reference.
    """
    text = str(spec)
    ident, _, location = text.partition("@")
    if location == "local":
        location = ""
    if ":" in ident:
        type_name, _, id_text = ident.partition(":")
        if not id_text.isdigit() or not type_name:
            raise ConfigError(f"dependency {text!r}: expected NAME or TYPE:ID, optionally @local or @ADDRESS")
        return Reference(None, type_name, int(id_text), location or None)
    if not ident:
        raise ConfigError(f"dependency {text!r} is empty")
    return Reference(ident, None, None, location or None)


@dataclass(frozen=True)
class LocalProvider:
    """A provider of this process a dependency may name (running, or listed before the one checked)."""

    name: str
    type: str
    provider_id: int

    def named_by(self, ref: Reference) -> bool:
        return self.name == ref.name or (self.type == ref.type and self.provider_id == ref.provider_id)

    def __str__(self) -> str:
        return f"{self.name} ({self.type}:{self.provider_id})"


@dataclass(frozen=True)
class Needed:
    """One dependency value that passed the check.

    Attributes:
        path: its JSON path (``providers[1].dependencies.index``, ``...index[0]`` in a list).
        text: the value as written.
        local: the provider of this process it names; None when it is on another server (``location``).
        location: the other server's address (None when local).
        expected_type: the type the dependency must have (None: any).
    """

    path: str
    text: str
    local: LocalProvider | None
    location: str | None
    expected_type: str | None


@dataclass
class CheckedProvider:
    """A ``providers[]`` entry that passed the check: what the server needs to create it.

    Attributes:
        spec: the entry, with its provider id (chosen when it was absent).
        cls: the provider class of its type.
        settings: its ``Config``, validated.
        dependencies: dependency name -> (takes a list, its values).
    """

    spec: ProviderSpec
    cls: type[Provider]
    settings: BaseModel
    dependencies: dict[str, tuple[bool, list[Needed]]]


@dataclass
class Findings:
    """What a check found, one line each: ``problems`` refuse the config; ``notes`` say what an offline check
    could not check."""

    source: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def problem(self, loc: Sequence[str | int], message: str) -> None:
        self.problems.append(f"{self.source}: {json_path(loc) or '(top level)'}: {message}")

    def raise_problems(self) -> None:
        """Raises ConfigError (every problem, one per line) when there is one."""
        if self.problems:
            raise ConfigError("\n".join(self.problems))


def choose_provider_id(
    spec: ProviderSpec, taken: Mapping[int, str], findings: Findings, at: tuple[str | int, ...] = ()
) -> int | None:
    """``spec``'s provider id, or the lowest free one when it has none (Bedrock). ``taken``: id -> the name of
    the provider that has it (``ADMIN`` for the admin provider's). None when no id is left."""
    if spec.provider_id is None:
        free = next((i for i in range(MAX_PROVIDER_ID + 1) if i not in taken), None)
        if free is None:
            findings.problem((*at, "provider_id"), f"no provider id is free (0..{MAX_PROVIDER_ID} are all taken)")
        return free
    owner = taken.get(spec.provider_id)
    if owner is not None:
        whose = "reserved for the admin provider" if owner == ADMIN else f"already used by {owner!r}"
        findings.problem((*at, "provider_id"), f"provider_id {spec.provider_id} of {spec.name!r} is {whose}")
    return spec.provider_id


def check_provider(
    spec: ProviderSpec,
    provider_id: int,
    findings: Findings,
    *,
    engine: EngineConfig,
    local: Sequence[LocalProvider],
    running: bool,
    own_address: str | None = None,
    at: tuple[str | int, ...] = (),
    rank: int = 0,
    procs: int = 1,
) -> CheckedProvider | None:
    """Check one provider (see the module docstring); its problems and notes go to ``findings``.

    Args:
        provider_id: its id (``choose_provider_id``).
        engine: the engine settings its config is validated with.
        local: the providers of this process its dependencies may name.
        running: ``local`` are running providers (at run time), not the ones listed before it (a config).
        own_address: this server's address: ``NAME@`` it is local.
        at: the JSON path of ``spec`` in its document (``("providers", 1)``).
        rank, procs: the server process's rank among the ``procs`` started from this config on one machine
            (``ConfigContext``).

    Returns:
        what creating it takes, or None when a problem was found.
    """
    before = len(findings.problems)
    if any(p.name == spec.name for p in local):
        findings.problem((*at, "name"), f"a provider named {spec.name!r} already exists")
    try:
        cls = provider_type(spec.type)
    except ConfigError as exc:
        findings.problem((*at, "type"), str(exc))
        return None
    settings = None
    try:
        settings = cls.validate_config(
            spec.config, ConfigContext(provider_id, spec.name, engine, rank, procs), source=findings.source,
            at=(*at, "config"),
        )  # fmt: skip
    except ConfigError as exc:
        findings.problems += str(exc).splitlines()
    dependencies = _check_dependencies(spec, cls, findings, local, running, own_address, at)
    if len(findings.problems) > before or settings is None:
        return None
    return CheckedProvider(spec.model_copy(update={"provider_id": provider_id}), cls, settings, dependencies)


def _check_dependencies(
    spec: ProviderSpec,
    cls: type[Provider],
    findings: Findings,
    local: Sequence[LocalProvider],
    running: bool,
    own_address: str | None,
    at: tuple[str | int, ...],
) -> dict[str, tuple[bool, list[Needed]]]:
    declared = {d.name: d for d in cls.DEPENDENCIES} if cls.DEPENDENCIES is not None else None
    where = (*at, "dependencies")
    if declared is not None:
        for key in spec.dependencies:
            if key not in declared:
                declares = ", ".join(map(repr, declared)) or "none"
                findings.problem((*where, key), f"unknown dependency {key!r}; type {spec.type!r} declares {declares}")
        for missing in (d.name for d in declared.values() if d.required and d.name not in spec.dependencies):
            findings.problem(
                where,
                f"missing required dependency {missing!r} (give it as NAME or TYPE:ID, optionally @local or @ADDRESS)",
            )
    if running:
        searched = f"in this process (running: {', '.join(map(str, local)) or 'none'})"
    else:
        searched = f"listed before {spec.name!r} (before it: {', '.join(map(str, local)) or 'none'})"
    out: dict[str, tuple[bool, list[Needed]]] = {}
    for key, value in spec.dependencies.items():
        dep = declared.get(key) if declared is not None else None
        array = dep.array if dep is not None else isinstance(value, list)
        values = value if isinstance(value, list) else [value]
        if dep is not None and not dep.array and len(values) != 1:
            findings.problem((*where, key), f"dependency {key!r} takes one provider, not {len(values)}")
            continue
        expected = dep.type if dep is not None else None
        needed = []
        for i, item in enumerate(values):
            loc = (*where, key, i) if isinstance(value, list) else (*where, key)
            try:
                ref = parse_dependency(item)
            except ConfigError as exc:
                findings.problem(loc, str(exc))
                continue
            text = str(item)
            if ref.location is not None and ref.location != own_address:
                findings.notes.append(
                    f"{findings.source}: {json_path(loc)}: {text!r} is on another server: not checked offline "
                    "(the server resolves it when it starts)"
                )
                needed.append(Needed(json_path(loc), text, None, ref.location, expected))
                continue
            found = next((p for p in local if p.named_by(ref)), None)
            if found is None:
                findings.problem(
                    loc,
                    f"{text!r}: no such provider {searched}; providers start in list order, so list it before "
                    "the providers that depend on it",
                )
            elif expected is not None and found.type != expected:
                findings.problem(loc, f"{text!r} is a provider of type {found.type!r}; expected type {expected!r}")
            else:
                needed.append(Needed(json_path(loc), text, found, None, expected))
        out[key] = (array, needed)
    return out


def check_service(
    config: ServiceConfig,
    *,
    source: str = "config",
    own_address: str | None = None,
    rank: int = 0,
    procs: int = 1,
    positions: Sequence[int] | None = None,
) -> tuple[list[CheckedProvider], Findings]:
    """Import the config's libraries and check every provider in list order (see the module docstring).

    Args:
        own_address: this server's address (default: ``engine.address``, as configured).
        rank, procs: the server process's rank among the ``procs`` started from this config on one machine
            (``ConfigContext``; a server of its own: 0 of 1).
        positions: the index in the user's document of each of ``config.providers`` (default: the same), for
            the JSON paths of problems when entries were left out of ``config`` (:func:`check_document`).

    Returns:
        the providers that passed, in list order, and the findings (``findings.raise_problems()``).
    """
    findings = Findings(source)
    for i, library in enumerate(config.libraries):
        try:
            load_library(library)
        except ConfigError as exc:
            findings.problem(("libraries", i), str(exc))
    explicit = {p.provider_id: p.name for p in config.providers if p.provider_id is not None}
    taken = {**explicit, config.admin.provider_id: ADMIN}
    local: list[LocalProvider] = []
    checked = []
    for i, spec in enumerate(config.providers):
        at = ("providers", positions[i] if positions is not None else i)
        others = {pid: name for pid, name in taken.items() if name != spec.name}
        provider_id = choose_provider_id(spec, others, findings, at)
        if provider_id is None:
            continue
        taken[provider_id] = spec.name
        result = check_provider(
            spec, provider_id, findings, engine=config.engine, local=local, running=False,
            own_address=own_address if own_address is not None else config.engine.address, at=at, rank=rank,
            procs=procs,
        )  # fmt: skip
        local.append(LocalProvider(spec.name, spec.type, provider_id))
        if result is not None:
            checked.append(result)
    return checked, findings


#: A bootstrap document's sections that can be left out when invalid, to check the rest (each has defaults).
_SECTIONS = {"engine": ("engine", "margo"), "margo": ("engine", "margo"), "admin": ("admin", "bedrock"),
             "bedrock": ("admin", "bedrock"), "libraries": ("libraries",)}  # fmt: skip


def check_document(
    data: Any, source: str = "config", *, procs: int = 1
) -> tuple[ServiceConfig | None, list[CheckedProvider], Findings]:
    """Every problem of a decoded bootstrap document, in one pass, each naming its JSON path in ``source``: what
    ``svcframe config check`` prints and ``svcframe launch`` refuses before it starts anything.

    The sections are validated first; when some are invalid, those (and the ``providers[]`` entries that are
    invalid as entries) are reported and left out, and the rest is checked all the same: the libraries and each
    remaining provider, its config by its type (an engine typo no longer hides a provider config's errors).
    With ``procs`` above 1 each provider is checked as each of the ``procs`` processes of ``svcframe launch
    --procs N`` checks it (``ConfigContext.rank``; a problem found for several ranks is reported once).

    Returns:
        the config (None when not even a part of it validates), the providers that passed (as rank 0 sees
        them), and the findings.
    """
    findings = Findings(source)
    try:
        check_depth(data, source)
    except ConfigError as exc:
        findings.problems.append(str(exc))
        return None, [], findings
    positions: list[int] | None = None
    try:
        config: ServiceConfig | None = ServiceConfig.model_validate(data, context={"source": source})
    except ValidationError as exc:
        findings.problems += format_validation_error(exc, source).splitlines()
        config, positions = _salvage(data, exc, source)
    if config is None:
        return None, [], findings
    checked: list[CheckedProvider] = []
    for rank in range(max(1, procs)):
        passed, found = check_service(config, source=source, rank=rank, procs=procs, positions=positions)
        findings.problems += [line for line in found.problems if line not in findings.problems]
        findings.notes += [line for line in found.notes if line not in findings.notes]
        checked = checked or passed
    return config, checked, findings


def _salvage(data: Any, exc: Any, source: str) -> tuple[ServiceConfig | None, list[int] | None]:
    """The part of a document that validates once the sections and ``providers[]`` entries that did not are left
    out, with the index in the document of each provider kept; (None, None) when nothing can be kept so."""
    if not isinstance(data, dict):
        return None, None
    drop: set[str] = set()
    bad_entries: set[int] = set()
    for err in exc.errors():
        loc = err["loc"]
        if loc and loc[0] in _SECTIONS:
            drop.update(_SECTIONS[str(loc[0])])
        elif loc and loc[0] == "providers":
            if len(loc) > 1 and isinstance(loc[1], int):
                bad_entries.add(loc[1])
            else:
                drop.add("providers")
        else:
            return None, None  # a problem of the whole document (two providers of one name): no part to keep
    kept = {k: v for k, v in data.items() if k not in drop}
    providers = kept.get("providers")
    positions = None
    if isinstance(providers, list):
        positions = [i for i in range(len(providers)) if i not in bad_entries]
        kept["providers"] = [providers[i] for i in positions]
    mochi = logging.getLogger("svcframe.config")  # its one warning of Mochi settings was logged the first time
    was, mochi.disabled = mochi.disabled, True
    try:
        return ServiceConfig.model_validate(kept, context={"source": source}), positions
    except ValidationError:
        return None, None
    finally:
        mochi.disabled = was


# -- the schema ----------------------------------------------------------------------------------------------------
def service_model(types: Mapping[str, type[Provider]]) -> type[ServiceConfig]:
    """The bootstrap config's model with ``providers[]`` a union discriminated on ``type`` over ``types``
    (type name -> provider class), each member's ``config`` that type's ``Config``. For the JSON Schema:
    configs are validated by ``check_service``."""
    if not types:
        return ServiceConfig
    members = []
    for type_name, cls in sorted(types.items()):
        title = "".join(part.capitalize() for part in type_name.replace("-", "_").split("_"))
        settings = create_model(f"{title}Config", __base__=cls.Config, __doc__=cls.Config.__doc__)
        required = any(f.is_required() for f in cls.Config.model_fields.values())
        members.append(
            create_model(
                f"{title}ProviderSpec",
                __base__=ProviderSpec,
                __doc__=f"A provider of type {type_name!r} ({cls.__module__}.{cls.__qualname__}).",
                type=(Literal[type_name], ...),  # type: ignore[arg-type]  # a Literal built at run time
                config=(settings, ... if required else Field(default_factory=settings)),
            )
        )
    entry = Annotated[Union[tuple(members)], Field(discriminator="type")]  # type: ignore[valid-type]  # noqa: UP007
    return create_model(
        "ServiceConfig", __base__=ServiceConfig, __doc__=ServiceConfig.__doc__,
        providers=(list[entry], Field(default_factory=list)),  # type: ignore[valid-type]
    )  # fmt: skip


def service_schema(libraries: Sequence[str]) -> dict[str, Any]:
    """The JSON Schema of a bootstrap config whose providers are of svcframe's own types (``BUILTIN_TYPES``) and
    the types ``libraries`` define (``service_model``; the libraries are imported).

    Raises:
        ConfigError: a library cannot be imported.
    """
    builtin = list(dict.fromkeys(BUILTIN_TYPES.values()))  # svcframe's own types, available to every config
    types = {t: PROVIDER_TYPES[t] for library in [*builtin, *libraries] for t in load_library(library)}
    return service_model(types).model_json_schema()
