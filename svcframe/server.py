"""A server process built from a bootstrap config (Bedrock analogue), and its lifecycle.

``Server(config)`` creates the engine, loads the libraries, starts the admin provider and then every
provider in list order, resolving dependencies. If anything fails, everything started so far is
closed again and the error raised: a config error never leaves a half-configured server behind.

``run_server(config, ready_fd=...)`` is a process's main: it pins the CPU if asked, runs the server on
the configured event loop, reports readiness (one JSON line on ``ready_fd``) once it accepts calls,
and shuts down cleanly on SIGTERM / SIGINT or an admin ``shutdown`` (drain, then exit 0).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from typing import Any

from .config import ProviderSpec, ServiceConfig
from .engine import Engine
from .errors import ConfigError, SvcframeError
from .loops import loop_factory
from .provider import Provider, ProviderHandle, load_library, provider_type

log = logging.getLogger("svcframe.server")


def parse_dependency(spec: str | int) -> tuple[str | None, str | None, int | None, str | None]:
    """Parse Bedrock's dependency grammar: ``NAME`` | ``TYPE:ID``, optionally ``@local`` or ``@ADDRESS``.

    Returns:
        (name, type, provider_id, location) with location None for local.

    Raises:
        ConfigError: malformed reference.
    """
    text = str(spec)
    ident, _, location = text.partition("@")
    if location == "local":
        location = ""
    if ":" in ident:
        type_name, _, id_text = ident.partition(":")
        if not id_text.isdigit() or not type_name:
            raise ConfigError(f"dependency {text!r}: expected NAME or TYPE:ID, optionally @local or @ADDRESS")
        return None, type_name, int(id_text), location or None
    if not ident:
        raise ConfigError(f"dependency {text!r} is empty")
    return ident, None, None, location or None


#: Settings a JSON Patch may change while the server runs (JSON paths), and who applies them:
#: the progress loop, the engine's default deadline, the server's drain time, the monitor, the admin.
LIVE_SETTINGS = {
    ("engine", "progress_mode"),
    ("engine", "progress_spindown_msec"),
    ("engine", "progress_timeout_ub_msec"),
    ("engine", "default_timeout_seconds"),
    ("engine", "drain_timeout_seconds"),
    ("engine", "monitoring", "enabled"),
    ("admin", "allow_mutations"),
}


def _changed_paths(old: Any, new: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of the leaves (lists count as leaves) that differ between two JSON documents."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[tuple[str, ...]] = []
        for key in sorted(set(old) | set(new)):
            out += _changed_paths(old.get(key), new.get(key), (*path, key))
        return out
    return [] if old == new else [path]


class Server:
    """One svcframe server: an engine, the admin provider and the configured providers.

    Args:
        config: the validated bootstrap config.
        secret: shared secret for connection authentication (never stored in the config).
    """

    def __init__(self, config: ServiceConfig, *, secret: bytes | None = None) -> None:
        self.config = config.model_copy(deep=True)
        self._secret = secret
        self.engine: Engine | None = None
        self.providers: dict[str, Provider] = {}
        self._shutdown = asyncio.Event()

    async def start(self) -> Server:
        """Start everything; on any failure close what was started and raise (ConfigError or the cause)."""
        ec = self.config.engine
        self.engine = Engine(
            ec.address,
            progress_mode=ec.progress_mode,
            progress_spindown_msec=ec.progress_spindown_msec,
            progress_timeout_ub_msec=ec.progress_timeout_ub_msec,
            default_timeout_seconds=ec.default_timeout_seconds,
            max_body_bytes=ec.max_body_bytes,
            bulk_chunk_bytes=ec.bulk_chunk_bytes,
            secret=self._secret,
            monitoring=ec.monitoring.enabled,
        )
        await self.engine.start()
        try:
            for library in self.config.libraries:
                load_library(library)
            from .admin import AdminProvider

            admin = AdminProvider(self.engine, self.config.admin.provider_id, server=self)
            admin.register()
            specs, self.config.providers = list(self.config.providers), []
            for spec in specs:
                await self.add_provider(spec)
        except BaseException:
            await self.close()
            raise
        return self

    @property
    def address(self) -> str:
        assert self.engine is not None and self.engine.address is not None
        return self.engine.address

    # -- providers -----------------------------------------------------------------------------------
    def _free_provider_id(self) -> int:
        used = {p.provider_id for p in self.providers.values()} | {self.config.admin.provider_id}
        return next(i for i in range(1, 65536) if i not in used)

    async def add_provider(self, spec: ProviderSpec | dict[str, Any]) -> int:
        """Create, register and start one provider; returns its provider id.

        Raises:
            ConfigError: invalid description, duplicate name or id, unknown type, missing dependency.
        """
        assert self.engine is not None
        if isinstance(spec, dict):
            try:
                spec = ProviderSpec.model_validate(spec)
            except Exception as exc:
                raise ConfigError(f"invalid provider description: {exc}") from None
        if spec.name in self.providers:
            raise ConfigError(f"a provider named {spec.name!r} already exists")
        provider_id = spec.provider_id if spec.provider_id is not None else self._free_provider_id()
        if provider_id == self.config.admin.provider_id or any(
            p.provider_id == provider_id for p in self.providers.values()
        ):
            raise ConfigError(f"provider_id {provider_id} of {spec.name!r} is already in use")
        cls = provider_type(spec.type)
        deps = {key: await self._resolve(spec.name, value) for key, value in spec.dependencies.items()}
        provider = cls(self.engine, provider_id, name=spec.name, config=spec.config, dependencies=deps)
        provider.register()
        try:
            await provider.start()
        except BaseException:
            self.engine.deregister_provider(provider_id)
            raise
        self.providers[spec.name] = provider
        self.config.providers.append(
            spec.model_copy(update={"provider_id": provider_id, "config": provider.get_config()})
        )
        return provider_id

    async def _resolve(self, owner: str, value: Any) -> Any:
        if isinstance(value, list):
            return [await self._resolve(owner, v) for v in value]
        name, type_name, provider_id, location = parse_dependency(value)
        if location is None:
            for provider in self.providers.values():
                if provider.name == name or (provider.type_name == type_name and provider.provider_id == provider_id):
                    return provider
            raise ConfigError(f"provider {owner!r} depends on {value!r}, which is not running in this process")
        assert self.engine is not None
        if provider_id is None:
            raise ConfigError(f"provider {owner!r}: remote dependency {value!r} must be given as TYPE:ID@ADDRESS")
        return ProviderHandle(self.engine, location, provider_id)

    def dependents(self, name: str) -> list[str]:
        """Names of the local providers that depend on provider ``name``."""
        target = self.providers[name]
        out = []
        for other in self.providers.values():
            for dep in other.dependencies.values():
                deps = dep if isinstance(dep, list) else [dep]
                if any(d is target for d in deps):
                    out.append(other.name)
        return out

    async def remove_provider(self, name: str, *, drain_timeout_seconds: float | None = None) -> None:
        """Refuse new calls to the provider at once, let in-flight calls finish, then release it.

        Raises:
            ConfigError: no such provider, or other providers depend on it (they are named).
        """
        assert self.engine is not None
        provider = self.providers.get(name)
        if provider is None:
            raise ConfigError(f"no provider named {name!r} (running: {', '.join(self.providers) or 'none'})")
        users = self.dependents(name)
        if users:
            raise ConfigError(f"cannot remove {name!r}: {', '.join(users)} depend(s) on it; remove them first")
        self.engine.refuse_provider(provider.provider_id, f"provider {name!r} is being removed")
        running = self.engine.inflight_for(provider.provider_id)
        if running:
            timeout = (
                self.config.engine.drain_timeout_seconds if drain_timeout_seconds is None else drain_timeout_seconds
            )
            await asyncio.wait(running, timeout=timeout)
        self.engine.deregister_provider(provider.provider_id)
        del self.providers[name]
        self.config.providers = [p for p in self.config.providers if p.name != name]
        await provider.close()

    # -- configuration and lifecycle ----------------------------------------------------------------------
    def live_config(self) -> dict[str, Any]:
        """The bootstrap document with every default filled in and every change since start.
        Launching a server from it reproduces this one (its providers, ids, settings)."""
        return self.config.model_dump(mode="json")

    def patch_config(self, patch: list[dict[str, Any]]) -> dict[str, Any]:
        """Apply a JSON Patch (RFC 6902) to the live configuration and return the new one.

        The patched document is validated by the same pydantic models as a bootstrap config; each
        changed setting is then applied by the component that owns it. Settings in ``LIVE_SETTINGS``
        change live; any other change (the listen address, the event loop, the provider list, ...) is
        refused as a whole, with the path named, and nothing is applied.

        Raises:
            ConfigError: malformed patch, invalid result, or a setting that cannot change live.
        """
        import jsonpatch
        import jsonpointer

        from .config import parse_config

        current = self.live_config()
        try:
            patched = jsonpatch.apply_patch(current, patch)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError, ValueError) as exc:
            raise ConfigError(f"cannot apply the JSON Patch: {exc}") from None
        new = parse_config(patched, "patched config")
        changed = _changed_paths(current, new.model_dump(mode="json"))
        frozen = [p for p in changed if p not in LIVE_SETTINGS]
        if frozen:
            names = ", ".join("/" + "/".join(p) for p in frozen)
            raise ConfigError(
                f"{names} cannot change while the server runs (live settings: "
                f"{', '.join('/' + '/'.join(p) for p in sorted(LIVE_SETTINGS))}); "
                "use add_provider/remove_provider for providers, or restart with the new config"
            )
        assert self.engine is not None
        ec = new.engine
        self.engine.progress.configure(ec.progress_mode, ec.progress_spindown_msec, ec.progress_timeout_ub_msec)
        self.engine.default_timeout_seconds = ec.default_timeout_seconds
        self.engine.monitor.enabled = ec.monitoring.enabled
        self.config.engine = ec
        self.config.admin = new.admin
        return self.live_config()

    def status(self) -> dict[str, Any]:
        assert self.engine is not None
        return {
            "address": self.engine.address,
            "pid": os.getpid(),
            "providers": [
                {"name": p.name, "type": p.type_name, "provider_id": p.provider_id} for p in self.providers.values()
            ],
            "closing": self.engine.closing,
        }

    def request_shutdown(self) -> None:
        self._shutdown.set()

    async def serve(self) -> None:
        """Serve until ``request_shutdown`` (admin RPC or signal), then close."""
        await self._shutdown.wait()
        await self.close()

    async def close(self) -> None:
        """Drain and stop: the engine refuses new calls, running handlers get drain_timeout_seconds,
        providers are closed in reverse order of creation."""
        if self.engine is not None:
            await self.engine.close(self.config.engine.drain_timeout_seconds)
        for provider in reversed(list(self.providers.values())):
            try:
                await provider.close()
            except Exception:
                log.exception("closing provider %s failed", provider.name)
        self.providers.clear()


async def _main(config: ServiceConfig, ready_fd: int | None, secret: bytes | None) -> None:
    server = Server(config, secret=secret)
    loop = asyncio.get_running_loop()
    try:
        await server.start()
    except (SvcframeError, OSError) as exc:
        _report(ready_fd, {"ok": False, "error": str(exc)})
        raise
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_shutdown)
    try:
        _report(ready_fd, {"ok": True, "address": server.address, "pid": os.getpid()})
        await server.serve()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _report(fd: int | None, message: dict[str, Any]) -> None:
    if fd is None:
        if message.get("ok"):
            print(json.dumps(message), flush=True)
        return
    os.write(fd, (json.dumps(message) + "\n").encode())
    os.close(fd)


def run_server(config: ServiceConfig, *, ready_fd: int | None = None, secret: bytes | None = None) -> int:
    """A server process's main. Returns the exit code (0 after a clean shutdown, 1 on a start-up error)."""
    if config.engine.cpu_affinity:
        os.sched_setaffinity(0, config.engine.cpu_affinity)
    try:
        with asyncio.Runner(loop_factory=loop_factory(config.engine.event_loop)) as runner:
            runner.run(_main(config, ready_fd, secret))
    except (SvcframeError, OSError) as exc:
        log.error("server failed to start: %s", exc)
        return 1
    return 0
