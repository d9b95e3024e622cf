"""The admin provider (Bedrock analogue): in every server, at a reserved provider id, and its clients.

Every server hosts one admin provider at ``admin.provider_id`` (0 by default, as Bedrock's; no other
provider may use that id, and every server of a service should use the same one). Its RPCs take one
msgpack argument, shown here as its fields:

==================  ==========================  ==================================================
RPC                 argument                    result
==================  ==========================  ==================================================
get_config          -                           the live bootstrap document (re-launchable)
query_config        expression (JMESPath)       the expression evaluated on the live document
status              -                           bound address, pid, providers, closing, plumber
list_rpcs           -                           the registration table: [{provider_id, name, provider}]
statistics          {"reset": bool}             engine statistics (progress loop, per-callpath steps, samples),
                                                the admin provider id and whether each handler is async
trace_events        {"clear": bool}             recorded Chrome Trace events (engine.monitoring.tracing)
lookup_provider     ``NAME`` or ``TYPE:ID``     {name, type, provider_id}, or None when absent
patch_config        JSON Patch (RFC 6902)       the new live document; live settings only  (mutation)
add_provider        provider description        the provider id assigned                   (mutation)
remove_provider     name                        null, once in-flight calls completed      (mutation)
load_library        module name                 provider types the module defines          (mutation)
shutdown            -                           null; the server drains and exits          (mutation)
==================  ==========================  ==================================================

Mutations need an authenticated connection (a shared secret on both ends, see svcframe.wire.auth_mac)
unless ``admin.require_authentication`` is false. Mutations are refused with ``MutationsDisabled`` (a ``Refused``) when ``admin.allow_mutations`` is false (switch it off live with
``patch_config``; it cannot be switched on again remotely). Invalid input gives a ``RemoteError`` whose
``remote_type`` is ``"ConfigError"`` and whose message says what was wrong. Queries run JMESPath on the
server (a query language, never ``eval``; expressions of at most 4,096 characters).

Retries after ``DeadlineExceeded`` (whose outcome is unknown; ``Dropped`` never ran): the read-only RPCs,
``patch_config`` with ``replace`` operations, ``load_library`` and ``shutdown`` are safe to repeat;
``add_provider`` without a ``provider_id`` and ``remove_provider`` are not (look the provider up first).

*Re-launchable configuration.* ``get_config`` returns what the server was started with, every default
filled in, plus every change since (providers added or removed with their assigned ids and filled-in
configs, libraries loaded, patched settings). The listen address stays as configured (``tcp://HOST:0``
stays port 0), so a server launched from the document is equal to this one, and its ``get_config`` is
equal too; the address actually bound is in ``status``.

Clients: ``ServiceHandle`` (one server) and ``ServiceGroupHandle`` (every member of a group file, results
keyed by address); ``wait_for_group`` waits until a group file names a live group (``svcframe wait``). ``lookup_remote`` is the bounded-wait remote lookup the server uses to resolve
``...@ADDRESS`` dependencies (Bedrock's ``bedrock_lookup_provider`` with ``dependency_resolution_timeout``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import jmespath
from jmespath.exceptions import JMESPathError
from jmespath.visitor import TreeInterpreter

from .control import ServerControl
from .engine import Engine, Request
from .errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectionLost,
    GroupError,
    MutationsDisabled,
    NoSuchProvider,
    Refused,
    RemoteError,
    RPCError,
    TimeoutError_,
    Unauthenticated,
)
from .group import Group, read_group_file
from .provider import Provider, rpc

log = logging.getLogger("svcframe.admin")

#: Time the admin keeps for itself when a caller's deadline bounds a dependency wait: the error must
#: reach the caller before the caller gives up.
_REPLY_MARGIN_SECONDS = 0.5
#: Longest JMESPath expression query_config evaluates. jmespath keeps up to 128 parsed expressions in a
#: process-wide cache, so this also bounds what callers can make the server keep (a few expressions of
#: hundreds of KB each would keep the loop busy for seconds and hundreds of MiB in that cache).
MAX_QUERY_CHARS = 4096


#: The work a query may do (JMESPath AST nodes visited, plus elements of the lists and maps it builds) and the
#: size of its answer (values, counting each time a shared one recurs): a short expression can still do
#: exponential work (``[@,@][][@,@][]...`` doubles a list per step) or return a graph whose serialisation
#: explodes (``[@,@]|[@,@]|...``: 40 steps, 2^40 copies), so both are counted and bounded.
MAX_QUERY_STEPS = 20_000


def _too_costly() -> ConfigError:
    return ConfigError(
        f"the JMESPath expression does more than {MAX_QUERY_STEPS:,} steps of work or gives an answer of more than "
        f"{MAX_QUERY_STEPS:,} values: narrow it (the live config itself is small; svcframe config get gives all of it)"
    )


class _BoundedInterpreter(TreeInterpreter):
    """jmespath's tree interpreter with a budget: every node visited and every element of a list or map it
    produces counts one step; past MAX_QUERY_STEPS the query is refused."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def visit(self, node: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().visit(node, *args, **kwargs)
        self.steps += 1 + (len(result) if isinstance(result, list | dict) else 0)
        if self.steps > MAX_QUERY_STEPS:
            raise _too_costly()
        return result


def _check_answer_size(value: Any) -> None:
    """ConfigError when ``value`` holds more than MAX_QUERY_STEPS values once shared ones are counted as often as
    they appear (what serialising it would write); stops as soon as it is over."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > MAX_QUERY_STEPS:
            raise _too_costly()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


class AdminProvider(Provider):
    """The admin provider of one server (type ``"admin"``, name ``"admin"``), written against the small
    ``ServerControl`` interface the server implements (``svcframe.control``)."""

    type_name = "admin"

    def __init__(self, engine: Engine, provider_id: int, *, server: ServerControl) -> None:
        super().__init__(engine, provider_id, name="admin")
        self.server = server

    def _mutation(self, what: str, req: Request) -> None:
        admin = self.server.config.admin
        if not admin.allow_mutations:
            raise MutationsDisabled(
                f"{what} refused: admin.allow_mutations is false in this server's config "
                "(read-only RPCs still work; stop the server with SIGTERM)"
            )
        if admin.require_authentication and not req.conn.authenticated:
            raise Unauthenticated(
                f"{what} refused: admin mutations and library loading need an authenticated connection; start "
                "the server and the client with the same shared secret (SVCFRAME_SECRET or "
                "engine.auth.secret_file), or set admin.require_authentication to false on a trusted machine"
            )

    # -- read-only ---------------------------------------------------------------------------------
    @rpc(name="get_config")  # not Provider.get_config (this provider's own config), hence the method name
    def get_live_config(self, req: Request, _: Any) -> dict[str, Any]:
        return self.server.live_config()

    @rpc
    def query_config(self, req: Request, expression: Any) -> Any:
        if not isinstance(expression, str):
            raise ConfigError("query_config takes a JMESPath expression (a string)")
        if len(expression) > MAX_QUERY_CHARS:  # bounds parse and evaluation time and the parser's cache
            raise ConfigError(f"a JMESPath expression of {len(expression)} characters: the limit is {MAX_QUERY_CHARS}")
        try:
            parsed = jmespath.compile(expression)
            result = _BoundedInterpreter().visit(parsed.parsed, self.server.live_config())
            _check_answer_size(result)
            return result
        except JMESPathError as exc:
            raise ConfigError(f"invalid JMESPath expression {expression[:200]!r}: {exc}") from None
        except RecursionError:
            raise ConfigError("the JMESPath expression nests too deeply") from None

    @rpc
    def status(self, req: Request, _: Any) -> dict[str, Any]:
        return self.server.status()

    @rpc
    def list_rpcs(self, req: Request, _: Any) -> list[dict[str, Any]]:
        return [
            {"provider_id": r.provider_id, "name": r.name, "provider": getattr(r.owner, "name", None)}
            for r in self.engine.registrations()
        ]

    @rpc
    def statistics(self, req: Request, arg: Any) -> dict[str, Any]:
        reset = isinstance(arg, dict) and arg.get("reset")
        if reset:  # forgetting what was measured changes the server: an admin mutation
            self._mutation("statistics reset", req)
        stats = self.engine.statistics()
        # for svcframe.diagnosis: which calls are the tools' own, and which handlers are async
        stats["admin_provider_id"] = self.provider_id
        stats["handlers"] = [
            {"provider_id": r.provider_id, "rpc": r.name, "async": r.is_coroutine} for r in self.engine.registrations()
        ]
        if reset:
            self.engine.monitor.reset()
        return stats

    @rpc
    def trace_events(self, req: Request, arg: Any) -> list[dict[str, Any]]:
        """Chrome Trace events recorded so far (empty when tracing is off); ``{"clear": true}`` empties them."""
        tracer = self.engine.tracer
        if tracer is None:
            return []
        clear = bool(isinstance(arg, dict) and arg.get("clear"))
        if clear:
            self._mutation("trace_events clear", req)
        return tracer.take(clear=clear)

    @rpc
    def lookup_provider(self, req: Request, spec: Any) -> dict[str, Any] | None:
        """``NAME`` or ``TYPE:ID`` -> ``{name, type, provider_id}``, None when no such provider runs."""
        if not isinstance(spec, str | int):
            raise ConfigError("lookup_provider takes NAME or TYPE:ID (a string)")
        provider = self.server.lookup_provider(str(spec))
        if provider is None:
            return None
        return {"name": provider.name, "type": provider.type_name, "provider_id": provider.provider_id}

    # -- mutations ---------------------------------------------------------------------------------
    @rpc
    def patch_config(self, req: Request, patch: Any) -> dict[str, Any]:
        self._mutation("patch_config", req)
        if not isinstance(patch, list):
            raise ConfigError("patch_config takes a JSON Patch: a list of operations")
        return self.server.patch_config(patch)

    @rpc
    async def add_provider(self, req: Request, description: Any) -> int:
        self._mutation("add_provider", req)
        if not isinstance(description, dict):
            raise ConfigError("add_provider takes a provider description (a JSON object)")
        remaining = req.remaining_seconds()
        timeout = None if remaining is None else max(0.0, remaining - _REPLY_MARGIN_SECONDS)
        return await self.server.add_provider(description, timeout_seconds=timeout)

    @rpc
    async def remove_provider(self, req: Request, name: Any) -> None:
        self._mutation("remove_provider", req)
        if not isinstance(name, str):
            raise ConfigError("remove_provider takes a provider name (a string)")
        await self.server.remove_provider(name)

    @rpc
    def load_library(self, req: Request, module: Any) -> list[str]:
        self._mutation("load_library", req)
        if not isinstance(module, str) or not module:
            raise ConfigError("load_library takes a module name (a string such as 'providers.kv')")
        return self.server.load_library(module)

    @rpc
    def shutdown(self, req: Request, _: Any) -> None:
        self._mutation("shutdown", req)
        # Answer first: the response leaves with this batch, then the server drains and exits.
        asyncio.get_running_loop().call_soon(self.server.request_shutdown)


class ServiceHandle:
    """Client side of one server's admin provider (Bedrock's ``ServiceHandle``).

    Args:
        engine: a started local engine (a client-only ``Engine(None)`` is enough).
        address: the server's address.
        provider_id: the server's admin provider id (``admin.provider_id``, 0 by default).
        timeout_seconds: deadline of each call (default: the engine's).

    Every method raises the errors of ``Engine.call``: ``Refused`` when mutations are disabled,
    ``RemoteError`` (``remote_type == "ConfigError"``) for invalid input, ``ConnectionLost``...
    """

    def __init__(self, engine: Engine, address: str, provider_id: int = 0, *, timeout_seconds: float | None = None):
        self.engine = engine
        self.address = address
        self.provider_id = provider_id
        self.timeout_seconds = timeout_seconds

    def __repr__(self) -> str:
        return f"ServiceHandle({self.address!r}, provider_id={self.provider_id})"

    async def _call(self, name: str, arg: Any = None, timeout_seconds: float | None = None) -> Any:
        return await self.engine.call(
            self.address,
            name,
            arg,
            provider_id=self.provider_id,
            timeout_seconds=self.timeout_seconds if timeout_seconds is None else timeout_seconds,
        )

    async def trace_events(self, clear: bool = False) -> list[dict[str, Any]]:
        """The server's recorded trace events (Chrome Trace Event dicts)."""
        return await self._call("trace_events", {"clear": clear})  # type: ignore[no-any-return]

    async def set_tracing(self, enabled: bool) -> dict[str, Any]:
        """Switch request tracing on or off live (a patch of engine.monitoring.tracing)."""
        return await self.patch_config([{"op": "replace", "path": "/engine/monitoring/tracing", "value": enabled}])

    async def get_config(self) -> dict[str, Any]:
        """The live configuration (re-launchable; see the module docstring)."""
        return await self._call("get_config")  # type: ignore[no-any-return]

    async def query_config(self, expression: str) -> Any:
        """A JMESPath ``expression`` evaluated on the server's live configuration."""
        return await self._call("query_config", expression)

    async def status(self) -> dict[str, Any]:
        return await self._call("status")  # type: ignore[no-any-return]

    async def list_rpcs(self) -> list[dict[str, Any]]:
        return await self._call("list_rpcs")  # type: ignore[no-any-return]

    async def statistics(self, reset: bool = False) -> dict[str, Any]:
        return await self._call("statistics", {"reset": reset})  # type: ignore[no-any-return]

    async def lookup_provider(self, spec: str, *, timeout_seconds: float | None = None) -> dict[str, Any] | None:
        """``{name, type, provider_id}`` of the provider ``NAME`` or ``TYPE:ID`` names, None when absent."""
        return await self._call("lookup_provider", spec, timeout_seconds)  # type: ignore[no-any-return]

    async def patch_config(self, patch: list[dict[str, Any]]) -> dict[str, Any]:
        """Apply a JSON Patch to the live configuration (live settings only); returns the new one."""
        return await self._call("patch_config", patch)  # type: ignore[no-any-return]

    async def set_progress(self, mode: str, spindown_msec: float | None = None) -> dict[str, Any]:
        """Switch the server's progress mode (and optionally its spindown window) live."""
        patch: list[dict[str, Any]] = [{"op": "replace", "path": "/engine/progress_mode", "value": mode}]
        if spindown_msec is not None:
            patch.append({"op": "replace", "path": "/engine/progress_spindown_msec", "value": spindown_msec})
        return await self.patch_config(patch)

    async def add_provider(self, description: dict[str, Any]) -> int:
        """Start a provider from a ``providers[]`` entry; returns its provider id (assigned when absent)."""
        return await self._call("add_provider", description)  # type: ignore[no-any-return]

    async def remove_provider(self, name: str) -> None:
        """Remove a provider: refused at once for new calls, returns when in-flight ones completed."""
        await self._call("remove_provider", name)

    async def load_library(self, module: str) -> list[str]:
        """Import a provider library on the server; returns the provider types it defines."""
        return await self._call("load_library", module)  # type: ignore[no-any-return]

    async def shutdown(self) -> None:
        """Ask the server to drain and exit (it answers first)."""
        await self._call("shutdown")


class ServiceGroupHandle:
    """Fan admin calls out to every member of a group; results keyed by address (Bedrock's
    ``ServiceGroupHandle``, with every admin call, not only the config ones).

    A member that fails contributes its exception object instead of a result, so one unreachable
    member never hides the others' answers: check with ``isinstance(result, BaseException)``.

    Args:
        engine: a started local engine.
        members: ``(address, admin provider id)`` pairs.
        timeout_seconds: deadline of each call.
    """

    def __init__(self, engine: Engine, members: list[tuple[str, int]], *, timeout_seconds: float | None = None):
        self.engine = engine
        self.timeout_seconds = timeout_seconds
        self.group_file: Path | None = None
        self.handles = [ServiceHandle(engine, a, pid, timeout_seconds=timeout_seconds) for a, pid in members]

    @classmethod
    def from_group_file(
        cls, engine: Engine, path: str | os.PathLike[str], *, timeout_seconds: float | None = None
    ) -> ServiceGroupHandle:
        """A handle over the members of a group file (``svcframe.group``: svcframe's or Flock's).

        Raises:
            GroupError: the file cannot be read or is not a group file.
        """
        group = cls(engine, _admin_targets(path), timeout_seconds=timeout_seconds)
        group.group_file = Path(path)
        return group

    def refresh(self) -> None:
        """Re-read the group file (after the group changed). Raises GroupError."""
        if self.group_file is None:
            raise GroupError("this group handle was not made from a group file")
        members = _admin_targets(self.group_file)
        self.handles = [ServiceHandle(self.engine, a, p, timeout_seconds=self.timeout_seconds) for a, p in members]

    @property
    def addresses(self) -> list[str]:
        return [h.address for h in self.handles]

    def __len__(self) -> int:
        return len(self.handles)

    def __getitem__(self, index: int) -> ServiceHandle:
        return self.handles[index]

    async def call(self, method: str, *args: Any) -> dict[str, Any]:
        """Run ``ServiceHandle.<method>(*args)`` on every member concurrently; results keyed by address."""
        if not callable(getattr(ServiceHandle, method, None)) or method.startswith("_"):
            raise AttributeError(f"ServiceHandle has no admin call {method!r}")
        outs = await asyncio.gather(*(getattr(h, method)(*args) for h in self.handles), return_exceptions=True)
        return {h.address: out for h, out in zip(self.handles, outs, strict=True)}

    async def get_config(self) -> dict[str, Any]:
        return await self.call("get_config")

    async def query_config(self, expression: str) -> dict[str, Any]:
        return await self.call("query_config", expression)

    async def status(self) -> dict[str, Any]:
        return await self.call("status")

    async def list_rpcs(self) -> dict[str, Any]:
        return await self.call("list_rpcs")

    async def lookup_provider(self, spec: str) -> dict[str, Any]:
        return await self.call("lookup_provider", spec)

    async def patch_config(self, patch: list[dict[str, Any]]) -> dict[str, Any]:
        return await self.call("patch_config", patch)

    async def add_provider(self, description: dict[str, Any]) -> dict[str, Any]:
        return await self.call("add_provider", description)

    async def remove_provider(self, name: str) -> dict[str, Any]:
        return await self.call("remove_provider", name)

    async def load_library(self, module: str) -> dict[str, Any]:
        return await self.call("load_library", module)

    async def shutdown(self) -> dict[str, Any]:
        return await self.call("shutdown")


async def wait_for_group(
    engine: Engine, path: str | os.PathLike[str], *, timeout_seconds: float, poll_seconds: float = 0.01
) -> tuple[Group, dict[str, Any]]:
    """Wait until the group file exists and every member answers an admin ``status`` call with its own pid:
    proof that the file names the live group, not one left by an earlier run (whose addresses are dead, or
    taken by other processes). A client started beside its servers (an sbatch script) waits with it.

    Bounded polling of that condition (the interval doubles from ``poll_seconds`` up to 0.25 s; no fixed
    sleep), each member's call bounded by the time left.

    Returns:
        The group and each member's status, keyed by address.

    Raises:
        GroupError: the file did not appear, or some members did not answer as theirs, within
            ``timeout_seconds`` (the message names the ranks and why).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    interval = poll_seconds
    why = f"group file {path} did not appear within {timeout_seconds:g} s"
    while True:
        group = _read_if_there(path)
        if isinstance(group, GroupError):
            why = f"{group} (within {timeout_seconds:g} s)"
        elif group is not None:
            left = max(0.1, min(5.0, deadline - loop.time()))
            handles = [ServiceHandle(engine, m.address, m.provider_id, timeout_seconds=left) for m in group.members]
            outs = await asyncio.gather(*(h.status() for h in handles), return_exceptions=True)
            wrong = []
            for m, out in zip(group.members, outs, strict=True):
                if isinstance(out, BaseException):
                    wrong.append(f"rank {m.rank} at {m.address}: {type(out).__name__}: {out}")
                elif m.pid is not None and out.get("pid") != m.pid:
                    wrong.append(f"rank {m.rank} at {m.address} answers with pid {out.get('pid')}, not {m.pid}")
            if not wrong:
                return group, {m.address: out for m, out in zip(group.members, outs, strict=True)}
            why = (f"group file {path}: {len(wrong)} of {len(group.members)} member(s) do not answer as theirs "
                   f"within {timeout_seconds:g} s, a file left by an earlier run? ({'; '.join(wrong[:3])}"
                   f"{'; ...' if len(wrong) > 3 else ''})")  # fmt: skip
        if loop.time() >= deadline:
            raise GroupError(why)
        await asyncio.sleep(min(interval, max(0.0, deadline - loop.time())))  # bounded polling of a condition
        interval = min(interval * 2, 0.25)


def _read_if_there(path: str | os.PathLike[str]) -> Group | GroupError | None:
    """The group file; None while it does not exist; the error when it exists but cannot be read as one."""
    try:
        return read_group_file(path)
    except GroupError as exc:
        return exc if Path(path).exists() else None


def _admin_targets(path: str | os.PathLike[str]) -> list[tuple[str, int]]:
    return [(m.address, m.provider_id) for m in read_group_file(path).members]


async def lookup_remote(
    engine: Engine,
    address: str,
    spec: str,
    *,
    admin_provider_id: int,
    deadline: float,
    what: str | None = None,
) -> dict[str, Any]:
    """Look ``spec`` (``NAME`` or ``TYPE:ID``) up on the server at ``address``, retrying until ``deadline``
    (loop time) while the server is unreachable, starting, or does not have it yet.

    Returns:
        ``{name, type, provider_id}`` of the remote provider.

    Raises:
        ConfigError: not found by the deadline (with the last reason), or an answer that waiting cannot
            change (authentication refused, not an svcframe admin provider, malformed spec).
    """
    loop = asyncio.get_running_loop()
    what = what or f"dependency {spec!r}@{address}"
    waited_from = loop.time()
    handle = ServiceHandle(engine, address, admin_provider_id)
    delay = 0.02
    while True:
        remaining = deadline - loop.time()
        try:
            found = await handle.lookup_provider(spec, timeout_seconds=max(0.1, min(remaining, 5.0)))
        except AuthenticationFailed as exc:
            raise ConfigError(f"{what}: {address} refused our connection: {exc}") from exc
        except RemoteError as exc:
            raise ConfigError(f"{what}: {address} cannot look it up: {exc.remote_message}") from exc
        except (ConnectionLost, TimeoutError_, NoSuchProvider, Refused) as exc:  # not up (yet), or going away
            reason = f"{type(exc).__name__}: {exc}"
        except RPCError as exc:  # NoSuchRPC: something else listens there
            raise ConfigError(
                f"{what}: {address} has no svcframe admin provider at id {admin_provider_id}: {exc}"
            ) from exc
        else:
            if found is not None:
                return found
            reason = f"{address} has no provider {spec!r}"
        remaining = deadline - loop.time()
        if delay == 0.02 and remaining > 0:  # say once that we wait, and why
            log.warning("%s: not available yet (%s); retrying for up to %.3g s", what, reason, remaining)
        if remaining <= 0:
            raise ConfigError(
                f"{what}: not found within {loop.time() - waited_from:.3g} s "
                f"(admin.dependency_resolution_timeout_seconds); last answer: {reason}"
            )
        await asyncio.sleep(min(delay, remaining))
        delay = min(2 * delay, 0.5)
