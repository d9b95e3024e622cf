"""A server process built from a bootstrap config (Bedrock analogue), and its lifecycle.

``Server(config)`` checks the config as ``svcframe config check`` does (``svcframe.composition.check_service``:
libraries, every provider's config, ids and dependencies; every problem at once), then creates the engine,
starts the admin provider and then every provider in list order, resolving dependencies. If anything fails,
everything started so far is closed again and the error raised: a config error never leaves a
half-configured server behind.

``run_server(config, ready_fd=...)`` is a process's main: it pins the CPU if asked, runs the server on
the configured event loop, reports readiness (one JSON line on ``ready_fd``) once it accepts calls,
and shuts down cleanly on SIGTERM / SIGINT or an admin ``shutdown`` (drain, then exit 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.metadata
import json
import logging
import os
import platform
import signal
import stat
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from . import compiled
from .composition import (
    ADMIN,
    CheckedProvider,
    Findings,
    LocalProvider,
    check_provider,
    check_service,
    choose_provider_id,
    parse_dependency,
)
from .config import ProviderSpec, ServiceConfig, format_validation_error
from .engine import Engine
from .errors import ConfigError, SvcframeError
from .loops import loop_factory
from .provider import Provider, ProviderHandle, load_library
from .transport import parse_address
from .wire import check_secret

log = logging.getLogger("svcframe.server")


def read_secret(auth: Any) -> bytes | None:
    """The shared secret from ``auth.secret_file`` or the ``auth.secret_env`` variable (None if neither).

    Raises:
        ConfigError: the secret file cannot be read or is empty.
    """
    if auth.secret_file:
        return read_secret_file(auth.secret_file, "engine.auth.secret_file")
    value = os.environ.get(auth.secret_env)
    return None if value is None else check_secret(value.encode(), f"the {auth.secret_env} variable")


#: A secret file holds a key, not a document: anything larger is refused before it is read whole.
MAX_SECRET_FILE_BYTES = 4096


def read_secret_file(path: str, what: str = "--secret-file") -> bytes:
    """The shared secret in the file at ``path`` (surrounding whitespace stripped). Warns when other users
    may read the file.

    Raises:
        ConfigError: the file cannot be read, or holds an empty, blank or short secret.
    """
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):  # a FIFO or a device would block or never end (a secret is a small file)
            raise ConfigError(f"{what} {path!r}: not a regular file")
        with open(path, "rb") as f:
            secret = f.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{what} {path!r}: cannot read: {exc.strerror}") from None
    if len(secret) > MAX_SECRET_FILE_BYTES:
        raise ConfigError(f"{what} {path!r}: larger than {MAX_SECRET_FILE_BYTES} bytes: not a shared secret")
    secret = secret.strip()
    check_secret(secret, f"{what} {path}")
    if mode & 0o077:
        log.warning("%s %s can be read by other users (mode %o): chmod 600 it", what, path, mode & 0o777)
    return secret


#: Settings a JSON Patch may change while the server runs (JSON paths), and who applies them:
#: the progress loop, the engine's default deadline, the server's drain time, the monitor, the admin.
LIVE_SETTINGS = {
    ("engine", "progress_mode"),
    ("engine", "progress_spindown_msec"),
    ("engine", "progress_timeout_ub_msec"),
    ("engine", "default_timeout_seconds"),
    ("engine", "drain_timeout_seconds"),
    ("engine", "monitoring", "enabled"),
    ("engine", "monitoring", "tracing"),
    ("engine", "monitoring", "otel"),
    ("engine", "monitoring", "timing_sample_every"),
    ("admin", "allow_mutations"),
    ("admin", "dependency_resolution_timeout_seconds"),
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
    """One svcframe server: an engine, the admin provider and the configured providers. It implements
    ``svcframe.control.ServerControl``, the interface its admin provider is written against.

    Args:
        config: the validated bootstrap config.
        secret: shared secret for connection authentication (never stored in the config).
        source: what start-up errors name the config by (its file).
        rank, procs: this process's rank among the ``procs`` started from this config on one machine
            (``svcframe launch``), for its providers' configs (``ConfigContext``); a server of its own: 0 of 1.
    """

    def __init__(
        self, config: ServiceConfig, *, secret: bytes | None = None, source: str = "config", rank: int = 0,
        procs: int = 1,
    ) -> None:  # fmt: skip
        self.config = config.model_copy(deep=True)
        self.source = source
        self.rank, self.procs = rank, procs
        self._secret = secret if secret is not None else read_secret(self.config.engine.auth)
        self.engine: Engine | None = None
        self.providers: dict[str, Provider] = {}
        self._adding: dict[str, int] = {}  # name -> provider id of providers being added
        self._removing: set[str] = set()  # names of providers being removed
        self._shutdown = asyncio.Event()
        #: Called (from another thread) with the reason when a provider's start-up blocks the event loop past
        #: admin.provider_start_timeout_seconds; a server process that has not reported ready sets it to fail
        #: its start-up (svcframe serve reports the reason and exits). None: the blocked start is logged.
        self.on_blocked_start: Callable[[str], None] | None = None

    async def start(self) -> Server:
        """Check the config, then start everything; on any failure close what was started and raise
        (ConfigError, every problem one line, or the cause). The engine binds its address first and accepts
        peers only once every provider has started."""
        checked, findings = check_service(self.config, source=self.source, rank=self.rank, procs=self.procs)
        findings.raise_problems()
        ec = self.config.engine
        # The plumber (Carns 2025 §4.1.1): a wildcard host becomes the chosen NIC's address, recorded
        # (output only) under engine.plumber.chosen; any other address is used as given.
        from .plumber import plumb_address
        from .settings import PlumberChoice

        plumbed = plumb_address(ec.address, ec.plumber)
        ec.plumber.chosen = PlumberChoice.model_validate(plumbed.choice.to_dict())
        self.engine = Engine(plumbed.listen_address, config=ec, secret=self._secret, local_host=plumbed.local_host)
        listen = parse_address(plumbed.listen_address)
        if not listen.is_loopback and self._secret is None and not ec.trusted_network:
            raise ConfigError(
                f"refusing to listen on {plumbed.listen_address} (not loopback) without a shared secret: anyone "
                "on the network could call, reconfigure or load code into this server. Configure "
                "engine.auth.secret_file (or SVCFRAME_SECRET), or set engine.trusted_network to true if the "
                "network is trusted."
            )
        await self.engine.start(serving=False)  # bound (providers may need the address), answering nobody yet
        try:
            from .admin import AdminProvider

            admin = AdminProvider(self.engine, self.config.admin.provider_id, server=self)
            admin.register()
            self.config.providers = []
            for provider in checked:
                await self._start_provider(provider, self.source)
            await self.engine.start_serving()
        except BaseException:
            await self.close()
            raise
        return self

    @property
    def address(self) -> str:
        assert self.engine is not None and self.engine.address is not None
        return self.engine.address

    # -- providers -----------------------------------------------------------------------------------
    async def add_provider(self, spec: ProviderSpec | dict[str, Any], *, timeout_seconds: float | None = None) -> int:
        """Check (``svcframe.composition.check_provider``, against the running providers), create, register
        and start one provider; returns its provider id.

        Remote dependencies are retried for up to ``admin.dependency_resolution_timeout_seconds`` (or
        ``timeout_seconds`` when that is shorter).

        Raises:
            ConfigError: invalid description, duplicate name or id, unknown type, invalid config, missing
                dependency (every problem, one line each).
        """
        assert self.engine is not None
        if isinstance(spec, dict):
            try:
                spec = ProviderSpec.model_validate(spec)
            except ValidationError as exc:
                raise ConfigError(format_validation_error(exc, "provider description")) from None
        source = f"provider {spec.name!r} (type {spec.type!r})"
        findings = Findings(source)
        running = [LocalProvider(p.name, p.type_name, p.provider_id) for p in self.providers.values()]
        taken = {p.provider_id: p.name for p in running} | {i: n for n, i in self._adding.items()}
        taken[self.config.admin.provider_id] = ADMIN
        if spec.name in self._adding:
            findings.problem(("name",), f"a provider named {spec.name!r} already exists")
        provider_id = choose_provider_id(spec, taken, findings)
        checked = None
        if provider_id is not None:
            checked = check_provider(
                spec, provider_id, findings, engine=self.config.engine, local=running, running=True,
                own_address=self.engine.address, rank=self.rank, procs=self.procs,
            )  # fmt: skip
        findings.raise_problems()
        assert checked is not None
        return await self._start_provider(checked, source, timeout_seconds=timeout_seconds)

    async def _start_provider(
        self, checked: CheckedProvider, source: str, *, timeout_seconds: float | None = None
    ) -> int:
        """Resolve the dependencies of a checked provider, create, register and start it; its provider id."""
        assert self.engine is not None
        spec = checked.spec
        provider_id = spec.provider_id
        assert provider_id is not None
        self._adding[spec.name] = provider_id  # reserved while dependencies resolve and the provider starts
        try:
            deps = await self._resolve(checked, source, timeout_seconds)
            limit = self.config.admin.provider_start_timeout_seconds
            watchdog = _StartWatchdog(f"provider {spec.name!r} (type {spec.type!r})", limit, self.on_blocked_start)
            try:
                provider = checked.cls(
                    self.engine, provider_id, name=spec.name, config=checked.settings, dependencies=deps
                )
                provider.register()
                await asyncio.wait_for(provider.start(), limit)
            except TimeoutError:
                self.engine.deregister_provider(provider_id)
                raise ConfigError(
                    f"provider {spec.name!r} (type {spec.type!r}) did not start within {limit:g} s "
                    "(admin.provider_start_timeout_seconds)"
                ) from None
            except BaseException:
                self.engine.deregister_provider(provider_id)
                raise
            finally:
                watchdog.cancel()
        finally:
            del self._adding[spec.name]
        self.providers[spec.name] = provider
        self.config.providers.append(spec.model_copy(update={"config": provider.get_config()}))
        return provider_id

    def lookup_provider(self, spec: str) -> Provider | None:
        """The running provider that ``NAME`` or ``TYPE:ID`` (optionally ``@local``) names, or None.

        Raises:
            ConfigError: malformed spec, or a remote location (``@ADDRESS``).
        """
        ref = parse_dependency(spec)
        if ref.location is not None and ref.location != (self.engine.address if self.engine else None):
            raise ConfigError(f"{spec!r}: lookup_provider takes NAME or TYPE:ID (optionally @local), not a remote one")
        for provider in self.providers.values():
            if LocalProvider(provider.name, provider.type_name, provider.provider_id).named_by(ref):
                return provider
        return None

    async def _resolve(self, checked: CheckedProvider, source: str, timeout_seconds: float | None) -> dict[str, Any]:
        """The dependencies of a checked provider: name -> ``Provider`` of this process (running: the check
        found it) or ``ProviderHandle`` of another server's, looked up on that server's admin provider (at this
        server's admin provider id) and retried until the deadline; lists for array dependencies.

        Raises:
            ConfigError: a remote one not found in time, or of the wrong type (naming its JSON path).
        """
        assert self.engine is not None
        limit = self.config.admin.dependency_resolution_timeout_seconds
        if timeout_seconds is not None:
            limit = min(limit, timeout_seconds)
        deadline = asyncio.get_running_loop().time() + limit
        out: dict[str, Any] = {}
        for key, (array, needed) in checked.dependencies.items():
            found: list[Provider | ProviderHandle] = []
            for dep in needed:
                if dep.local is not None:
                    found.append(self.providers[dep.local.name])
                    continue
                assert dep.location is not None
                from .admin import lookup_remote

                what = f"{source}: {dep.path}: {dep.text!r}"
                info = await lookup_remote(
                    self.engine, dep.location, dep.text.partition("@")[0],
                    admin_provider_id=self.config.admin.provider_id, deadline=deadline, what=what,
                )  # fmt: skip
                if dep.expected_type is not None and info["type"] != dep.expected_type:
                    raise ConfigError(
                        f"{what} is a provider of type {info['type']!r}; expected type {dep.expected_type!r}"
                    )
                found.append(ProviderHandle(self.engine, dep.location, int(info["provider_id"])))
            out[key] = found if array else found[0]
        return out

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
        """Refuse new calls to the provider at once (``Refused``), let in-flight calls finish (for up to
        ``drain_timeout_seconds``, default ``engine.drain_timeout_seconds``; later ones are cancelled),
        remove its RPCs (``NoSuchProvider`` from then on), then release its resources (``close()``).

        Raises:
            ConfigError: no such provider, being removed already, or other providers of this process
                depend on it (they are named).
        """
        assert self.engine is not None
        provider = self.providers.get(name)
        if provider is None:
            hint = "; the admin provider cannot be removed" if name == "admin" else ""
            raise ConfigError(f"no provider named {name!r} (running: {', '.join(self.providers) or 'none'}){hint}")
        if name in self._removing:
            raise ConfigError(f"provider {name!r} is already being removed")
        users = self.dependents(name)
        if users:
            raise ConfigError(f"cannot remove {name!r}: {', '.join(users)} depend(s) on it; remove them first")
        self._removing.add(name)
        try:
            # refused first, so that no call starts while its before_close() (which may call out) runs
            self.engine.refuse_provider(provider.provider_id, f"provider {name!r} is being removed")
            await self._before_close([provider])
            running = self.engine.inflight_for(provider.provider_id)
            if running:
                timeout = (
                    self.config.engine.drain_timeout_seconds if drain_timeout_seconds is None else drain_timeout_seconds
                )
                _, late = await asyncio.wait(running, timeout=timeout)
                if late:
                    log.warning("removing %s: cancelling %d call(s) still running after %g s", name, len(late), timeout)
                    for task in late:
                        task.cancel()
                    await asyncio.wait(late, timeout=1.0)
            self.engine.deregister_provider(provider.provider_id)
            del self.providers[name]
            self.config.providers = [p for p in self.config.providers if p.name != name]
        finally:
            self._removing.discard(name)
        await provider.close()

    def load_library(self, module: str) -> list[str]:
        """Import a provider library (``svcframe.provider.load_library``) and record it in the live config.

        Returns:
            the provider types the module defines (sorted).

        Raises:
            ConfigError: the module cannot be imported.
        """
        types = load_library(module)
        if module not in self.config.libraries:
            self.config.libraries = [*self.config.libraries, module]
        return types

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
        self.engine.apply_monitoring(ec.monitoring)
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
            "plumber": self.config.engine.plumber.chosen.model_dump() if self.config.engine.plumber.chosen else None,
        }

    def request_shutdown(self) -> None:
        self._shutdown.set()

    async def _before_close(self, providers: list[Provider]) -> None:
        """Each provider's ``before_close``, at most ``engine.drain_timeout_seconds`` in all."""

        async def one(provider: Provider) -> None:
            try:
                await provider.before_close()
            except Exception:
                log.exception("provider %s: before_close failed", provider.name)

        if providers:
            tasks = [asyncio.ensure_future(one(p)) for p in providers]
            _, late = await asyncio.wait(tasks, timeout=self.config.engine.drain_timeout_seconds)
            for task in late:
                task.cancel()

    async def serve(self) -> None:
        """Serve until ``request_shutdown`` (admin RPC or signal), then close."""
        await self._shutdown.wait()
        await self.close()

    async def close(self) -> None:
        """Drain and stop: the engine refuses new calls, running handlers get drain_timeout_seconds,
        providers are closed in reverse order of creation (each told first, while the engine still runs:
        ``Provider.before_close``)."""
        if self.engine is not None and not self.engine.closing:
            await self._before_close(list(reversed(list(self.providers.values()))))
        if self.engine is not None:
            await self.engine.close(self.config.engine.drain_timeout_seconds)
        for provider in reversed(list(self.providers.values())):
            try:
                await provider.close()
            except Exception:
                log.exception("closing provider %s failed", provider.name)
        self.providers.clear()


async def _main(
    config: ServiceConfig,
    ready_fd: int | None,
    secret: bytes | None,
    on_ready: Callable[[Server], Awaitable[None]] | None = None,
    lifeline_fd: int | None = None,
    source: str = "config",
    rank: int = 0,
    procs: int = 1,
    on_failure: Callable[[str], None] | None = None,
) -> bool:
    server = Server(config, secret=secret, source=source, rank=rank, procs=procs)
    loop = asyncio.get_running_loop()

    def blocked(reason: str) -> None:  # from the watchdog's thread: the loop is stuck in a provider's start-up
        log.critical("server failed to start: %s", reason)
        address = server.engine.address if server.engine is not None else None
        if address and address.startswith("unix://"):  # the loop cannot close the listener: free the path here
            with contextlib.suppress(OSError):
                os.unlink(address[len("unix://") :])
        _report(ready_fd, {"ok": False, "error": reason})
        if on_failure is not None:
            on_failure(reason)
        os._exit(1)

    server.on_blocked_start = blocked
    try:
        await server.start()
    except (SvcframeError, OSError) as exc:
        _report(ready_fd, {"ok": False, "error": str(exc)})
        raise
    server.on_blocked_start = None
    # What start-up made (modules, config, providers) lives as long as the process: frozen out of the cyclic
    # collector, so a full collection scans only what serving made since. Full collections of the whole heap
    # would pause the loop for milliseconds each under a hostile load (the worst case of a good client's
    # health call); the garbage of start-up is collected first.
    gc.collect()
    gc.freeze()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_shutdown)
    if lifeline_fd is not None:
        loop.add_reader(lifeline_fd, _on_lifeline, loop, lifeline_fd, server)
    try:
        _report(ready_fd, {"ok": True, "address": server.address, "pid": os.getpid()})
        # e.g. the group-file barrier under srun/mpiexec (svcframe/ranks.py); it must not delay serving
        hook = asyncio.create_task(_run_hook(on_ready, server)) if on_ready is not None else None
        await server.serve()
        if hook is not None:
            hook.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                return await hook
        return True
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _on_lifeline(loop: asyncio.AbstractEventLoop, fd: int, server: Server) -> None:
    """The launcher's end of the lifeline pipe closed (it exited, however it died): shut down."""
    if os.read(fd, 64):
        return  # nothing is ever written; ignore anything that is
    loop.remove_reader(fd)
    log.warning("the launcher is gone (lifeline closed); shutting down")
    server.request_shutdown()


async def _run_hook(on_ready: Callable[[Server], Awaitable[None]], server: Server) -> bool:
    """Run the hook; False (and a shutdown) if it raised."""
    try:
        await on_ready(server)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.error("%s; shutting down", exc, exc_info=not isinstance(exc, SvcframeError))
        server.request_shutdown()
        return False
    return True


def _report(fd: int | None, message: dict[str, Any]) -> None:
    if fd is None:
        if message.get("ok"):
            print(json.dumps(message), flush=True)
        return
    os.write(fd, (json.dumps(message) + "\n").encode())
    os.close(fd)


def run_server(
    config: ServiceConfig,
    *,
    ready_fd: int | None = None,
    secret: bytes | None = None,
    on_ready: Callable[[Server], Awaitable[None]] | None = None,
    lifeline_fd: int | None = None,
    source: str = "config",
    rank: int = 0,
    procs: int = 1,
    on_failure: Callable[[str], None] | None = None,
) -> int:
    """A server process's main. Returns the exit code (0 after a clean shutdown, 1 on a start-up error).

    ``on_ready(server)`` runs as a task once the server accepts calls (cancelled at shutdown; an exception
    in it is logged and shuts the server down). ``lifeline_fd``: the read end of a pipe whose write end
    only the launcher holds; when it closes (the launcher exited, even by SIGKILL) the server shuts down.
    ``source``: what start-up errors name the config by (its file). ``rank``, ``procs``: see :class:`Server`.
    ``on_failure(reason)`` is called when the start-up fails (a config error, an address that cannot be bound, a
    provider that does not start), before the process exits (a rank of a job tells the others with it:
    ``svcframe.ranks.report_failure``)."""
    _log_build()
    if config.engine.cpu_affinity:
        os.sched_setaffinity(0, config.engine.cpu_affinity)
    try:
        with asyncio.Runner(loop_factory=loop_factory(config.engine.event_loop)) as runner:
            ok = runner.run(_main(config, ready_fd, secret, on_ready, lifeline_fd, source, rank, procs, on_failure))
    except (SvcframeError, OSError) as exc:
        for line in str(exc).splitlines():  # one record per problem (a config check finds them all)
            log.error("server failed to start: %s", line)
        if on_failure is not None:
            on_failure(" ".join(str(exc).split()))
        return 1
    return 0 if ok else 1


def _log_build() -> None:
    """Say at start-up whether the hot paths run compiled (svcframe.compiled): a build without a C compiler is
    pure Python, which works and costs more CPU per call, worth a warning unless asked for."""
    build = compiled.build()
    version = f"svcframe {importlib.metadata.version('svcframe')}, Python {platform.python_version()}"
    if build == "compiled" or compiled.pure_requested():
        log.info("%s: %s build%s", version, build, f" ({compiled.PURE_ENV}=1)" if compiled.pure_requested() else "")
    else:
        log.warning("%s: %s build: the hot paths run interpreted, at more CPU per call (reinstall where a C "
                    "compiler is found: svcframe --version tells)", version, build)  # fmt: skip


class _StartWatchdog:
    """Watches a provider's construction and ``start()`` from a thread. ``asyncio.wait_for`` bounds a start
    that awaits, but not one that blocks the event loop (a ``time.sleep``, a lock, a slow filesystem): past
    ``limit_seconds`` the loop is still inside it, so the thread reports it, through ``on_blocked`` (a server
    that has not reported ready fails its start-up) or else as an error logged once per ``limit_seconds``."""

    def __init__(self, what: str, limit_seconds: float, on_blocked: Callable[[str], None] | None) -> None:
        self.what, self.limit_seconds, self.on_blocked = what, limit_seconds, on_blocked
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="svcframe-start-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        # past the limit, a start that awaits is ended by asyncio.wait_for on the loop, which then cancels us:
        # the grace keeps the two from racing when the loop is not blocked
        waited, grace = 0.0, max(0.5, 0.25 * self.limit_seconds)
        while not self._done.wait(self.limit_seconds + grace if not waited else self.limit_seconds):
            waited += self.limit_seconds + (grace if not waited else 0.0)
            reason = (f"{self.what} did not start within {self.limit_seconds:g} s "
                      f"(admin.provider_start_timeout_seconds): it has blocked the event loop for {waited:g} s")  # fmt: skip
            if self.on_blocked is not None:
                self.on_blocked(reason)
                return
            log.error("%s: the server does not answer meanwhile", reason)

    def cancel(self) -> None:
        self._done.set()
