"""The engine (Margo analogue): one per process, on one event loop.

An engine listens on one address, keeps the *registration table* of RPC handlers keyed by
``(provider_id, rpc_name)``, forwards calls to other engines, serves and performs bulk transfers, and
drives the progress loop. It is the facade over parts, one concept per file, that it makes, starts and
closes; each part owns its state and is given the others it uses when it is made:

    svcframe/engine.py        the facade: settings, lifecycle, the public API, statistics
    svcframe/registration.py  the registration table
    svcframe/connections.py   the connections: dialled, accepted under caps, swept; what they report (dispatch)
    svcframe/handlers.py      running handlers: replies, deadlines, cancellation (Handlers)
    svcframe/request.py       what a handler learns of its call (Request, current_request)
    svcframe/calls.py         outgoing calls: encoding, callpath, retries (Calls)
    svcframe/deadlines.py     the deadlines of outgoing calls and transfers, behind one loop timer
    svcframe/bulk.py          bulk handles, pull / push, the CMA policy (BulkTransfers)
    svcframe/bulk_serving.py  exposed buffers, serving the transfers peers make on them, lending (BulkServing)
    svcframe/protocol.py      one connection's state, sans-IO: phase, handshake, tables
    svcframe/transport.py     the asyncio pump around it, tcp:// and unix://
    svcframe/decoder.py       the frames a connection receives
    svcframe/wire.py          frames: the only place that packs or parses a header

Providers use only this public API::

    engine = Engine("tcp://127.0.0.1:0")
    await engine.start()
    engine.register(provider_id=1, name="echo", handler=lambda req, arg: arg)
    result = await engine.call(engine.address, "echo", {"x": 1}, provider_id=1, timeout_seconds=2.0)
    handle = engine.expose(bytearray(1 << 20), "rw")        # -> BulkHandle (send handle.to_wire())
    await engine.pull(handle, dest)                          # dest <- owner's bytes
    await engine.push(handle, src)                           # owner's buffer <- src
    await engine.close(drain_timeout_seconds=5.0)

Errors: see ``svcframe.errors``. Every call ends by its deadline with a result or a typed error; a
lost connection fails every call pending on it at once; an unknown provider or RPC, a malformed
request and a handler exception each come back as their own error type and never stop the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Coroutine
from typing import Any

from pydantic import ValidationError

from . import cma
from .bulk import BulkTransfers
from .bulk_handles import BulkHandle
from .bulk_serving import BulkServing
from .calls import Calls
from .connections import Connections
from .deadlines import Deadlines
from .errors import ConfigError, ConnectionLost
from .handlers import Handlers
from .monitoring import Monitor, ProcessSampler
from .progress import Progress
from .protocol import Identity
from .registration import Handler, Registration, RegistrationTable
from .request import Request, current_callpath, current_request
from .settings import EngineConfig, MonitoringConfig, format_validation_error
from .tracing import Tracer
from .transport import Address, Connection, listen, parse_address
from .wire import check_secret

__all__ = ["FROM_ENVIRONMENT", "SECRET_ENV", "Engine", "Registration", "Request", "current_callpath", "current_request"]

log = logging.getLogger("svcframe.engine")

#: The environment variable engines take their shared secret from unless given one explicitly.
SECRET_ENV = "SVCFRAME_SECRET"
FROM_ENVIRONMENT = object()


class Engine:
    """One process's RPC engine: the facade over its parts (connections, calls, handlers, bulk transfers, bulk
    serving), which it makes, starts and closes.

    Args:
        address: where to listen, ``tcp://HOST:PORT`` (port 0 = ephemeral) or ``unix:///path``; None
            for a client-only engine (it can call, expose buffers and serve bulk on its own connections).
            Given, it takes the place of ``config.address``.
        config: the engine's settings (``svcframe.settings.EngineConfig``: names, defaults, bounds and
            meanings are there, and only there); default: its defaults.
        secret: shared secret for connection authentication; by default taken from the SVCFRAME_SECRET
            environment variable when it is set; None = no authentication. Never part of a config.
        local_host: the address outgoing connections are made from (the plumber's NIC choice).
        settings: ``EngineConfig`` fields by name, over ``config`` (``progress_mode="busy"``,
            ``default_timeout_seconds=2.0``, ``monitoring=False``...), validated as a config would be.

    The progress mode defaults to "spindown" for an engine that listens and "block" for a client-only one
    when neither ``config`` nor ``settings`` sets it (a client spinning on a core it shares with its server
    slows both). Settings the engine does not use (event loop, CPU affinity, plumber, auth source,
    drain time) belong to the server process that runs it (``svcframe.server``).

    Raises:
        ConfigError: an invalid address or setting (the message names it).
    """

    def __init__(
        self,
        address: str | None = "tcp://127.0.0.1:0",
        *,
        config: EngineConfig | None = None,
        secret: bytes | object | None = FROM_ENVIRONMENT,
        local_host: str | None = None,
        **settings: Any,
    ) -> None:
        base = config if config is not None else EngineConfig()
        if settings:
            try:
                cfg = EngineConfig.model_validate({**base.model_dump(exclude_unset=True), **settings})
            except ValidationError as exc:
                raise ConfigError(format_validation_error(exc, "Engine")) from None
        else:
            cfg = base
        self.config = cfg
        self._listen_address = parse_address(address) if address else None
        mode = cfg.progress_mode
        if "progress_mode" not in cfg.model_fields_set and not address:
            mode = "block"  # a client-only engine must not burn a core it may share with its server
        self.progress = Progress(mode, cfg.progress_spindown_msec, cfg.progress_timeout_ub_msec)
        self.engine_id = uuid.uuid4().hex
        self.max_body_bytes = cfg.max_body_bytes
        bulk_cma = cfg.bulk_cma and cma.supported()
        monitoring = cfg.monitoring
        self.monitor = Monitor(monitoring.enabled, monitoring.timing_sample_every)
        interval = monitoring.sample_interval_seconds
        self.sampler = ProcessSampler(interval) if interval else None
        if secret is FROM_ENVIRONMENT:
            env = os.environ.get(SECRET_ENV)
            secret = None if env is None else check_secret(env.encode(), f"the {SECRET_ENV} variable")
        elif secret is not None:
            check_secret(secret, "Engine(secret=...)")  # type: ignore[arg-type]
        self._secret: bytes | None = secret  # type: ignore[assignment]
        # the parts, each given what it uses of the others
        self.table = RegistrationTable(self.monitor.names)
        self.deadlines = Deadlines()  # of outgoing calls and bulk transfers, behind one loop timer
        self.serving = BulkServing(self.engine_id, self.monitor, self.progress, bulk_cma)
        self.handlers = Handlers(self, self.table, self.serving, self.monitor, self.progress, cfg)
        self.connections = Connections(self.handlers, self.serving, self.progress, cfg, local_host)
        self.bulk = BulkTransfers(
            self.engine_id, self.connections, self.serving, self.deadlines, self.monitor, self.progress, cfg, bulk_cma
        )
        self.calls = Calls(
            self.table, self.connections, self.bulk, self.deadlines, self.monitor, self.progress, cfg, bulk_cma
        )
        # The per-call entry points are the parts' own methods, so that a call or a push costs no frame of the
        # facade's (measured: tools/instructions_per_client_call.sh, with --read 65536 --method push for a push)
        self.call = self.calls.call  # type: ignore[method-assign]
        self.push = self.bulk.push  # type: ignore[method-assign]
        self.tracer: Tracer | None = None
        self.apply_monitoring(monitoring)
        self._server: asyncio.AbstractServer | None = None
        self._bound: Address | None = None
        self._closing = False
        self._closed = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------------------------
    @property
    def address(self) -> str | None:
        """The address peers dial (with the ephemeral port resolved), None for a client-only engine."""
        return str(self._bound) if self._bound else None

    # -- settings that change while the engine runs, kept by the parts that use them ------------------------------
    @property
    def default_timeout_seconds(self) -> float:
        """The deadline of a call or transfer made without one (seconds); a live setting."""
        return self.calls.default_timeout_seconds

    @default_timeout_seconds.setter
    def default_timeout_seconds(self, value: float) -> None:
        self.calls.default_timeout_seconds = self.bulk.default_timeout_seconds = value
        self.connections.default_timeout_seconds = value

    @property
    def bulk_cma(self) -> bool:
        """Same-node bulk transfers move by cross-memory attach (configured on, and supported here)."""
        return self.calls.bulk_cma

    @bulk_cma.setter
    def bulk_cma(self, value: bool) -> None:
        self.calls.bulk_cma = self.bulk.bulk_cma = self.serving.bulk_cma = value

    @property
    def send_tracebacks(self) -> bool:
        """A handler's traceback goes to callers that did not prove the shared secret too."""
        return self.handlers.send_tracebacks

    @send_tracebacks.setter
    def send_tracebacks(self, value: bool) -> None:
        self.handlers.send_tracebacks = value

    @property
    def identity(self) -> Identity:
        return Identity(self.engine_id, self.address, self._secret, self.bulk_cma)

    async def start(self, *, serving: bool = True) -> Engine:
        """Bind the listener (if any) and start the progress loop. With ``serving=False`` the address is bound
        (``address`` is known) but no peer is accepted until :meth:`start_serving`: a server starting its
        providers answers nobody before it is ready.

        Raises:
            ConnectionLost: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        self.deadlines.start(loop)
        self.connections.start(loop, self.identity, self._listen_address is not None)
        if self._listen_address is not None:
            self._server, self._bound = await listen(
                self._listen_address, self.connections.accept, start_serving=serving
            )
            self.connections.identity = self.identity  # (with the address bound)
        self.handlers.start(loop, self._bound)
        self.serving.start(loop, self.address)
        self.bulk.start(loop)
        self.calls.start(loop)
        self.progress.start(loop)
        if self.sampler is not None:
            self.sampler.start(loop, lambda: self.progress.inflight + sum(len(c.pending) for c in self.connections.all))
        return self

    async def start_serving(self) -> None:
        """Accept peers on the address bound by ``start(serving=False)`` (a no-op when already serving)."""
        if self._server is not None and not self._server.is_serving():
            await self._server.start_serving()

    async def __aenter__(self) -> Engine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closing(self) -> bool:
        return self._closing

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def close(self, drain_timeout_seconds: float = 5.0) -> None:
        """Shut down: stop accepting, refuse new requests, let running handlers finish for up to
        ``drain_timeout_seconds`` (then cancel them), fail every pending outgoing call with
        ConnectionLost, close every connection. Leaves no task behind."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = self.handlers.closing = self.connections.closing = True
        if self._server is not None:
            self._server.close()
        running = [t for t in self.handlers.tasks | self.serving.tasks if not t.done()]
        if running:
            _, late = await asyncio.wait(running, timeout=drain_timeout_seconds)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        self.connections.close_all()
        leftovers = [t for t in self.handlers.tasks | self.serving.tasks if not t.done()]
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.wait(leftovers, timeout=1.0)
        if self._server is not None:
            await self._server.wait_closed()
        if self._bound is not None and self._bound.scheme == "unix":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._bound.path)
        self.progress.stop()
        self.deadlines.close()
        if self.sampler is not None:
            self.sampler.stop()
        self._closed.set()

    # -- registration table (svcframe.registration) -------------------------------------------------------
    def register(self, provider_id: int, name: str, handler: Handler, *, owner: object = None) -> Registration:
        """Register ``handler(request, arg) -> result`` (sync or async) as RPC ``name`` of ``provider_id``.

        Raises:
            ConfigError: provider id out of 0..65534, name already registered for that provider, or a
                CRC-32 collision between two names of the same provider.
        """
        return self.table.register(provider_id, name, handler, owner=owner)

    def deregister_provider(self, provider_id: int) -> None:
        """Remove every RPC of ``provider_id``; new calls to it get NoSuchProvider."""
        self.table.deregister_provider(provider_id)

    def refuse_provider(self, provider_id: int, reason: str) -> None:
        """Refuse new calls to ``provider_id`` with ProviderUnavailable(reason), while in-flight ones complete."""
        self.table.refuse_provider(provider_id, reason)

    def registrations(self) -> list[Registration]:
        """The registration table, sorted by provider id and name."""
        return self.table.registrations()

    def apply_monitoring(self, monitoring: MonitoringConfig) -> None:
        """Apply the monitoring section (at start, and live when a server's config is patched).

        Raises:
            ConfigError: ``otel`` is on but the OpenTelemetry API is not installed.
        """
        self.monitor.enabled = monitoring.enabled
        self.monitor.sample_every = monitoring.timing_sample_every
        try:
            self.set_tracing(monitoring.tracing, otel=monitoring.otel)
        except ImportError:
            raise ConfigError(
                "engine.monitoring.otel needs the OpenTelemetry API: pip install 'svcframe[otel]'"
            ) from None

    def set_tracing(self, enabled: bool, *, otel: bool = False) -> None:
        """Switch request tracing on or off at runtime (events are kept in ``self.tracer``); with
        ``otel``, spans also go through the OpenTelemetry API (ImportError if it is not installed)."""
        if enabled and (self.tracer is None or (self.tracer.otel is not None) != otel):
            self.tracer = Tracer(otel=otel)
        elif not enabled:
            self.tracer = None
        self.handlers.tracer = self.calls.tracer = self.tracer

    # -- the API providers use: each call goes to the part that owns it ---------------------------------------
    def call(
        self,
        address: str,
        name: str,
        arg: Any = None,
        *,
        provider_id: int = 0,
        timeout_seconds: float | None = None,
        idempotent: bool = False,
        max_attempts: int = 5,
        into: Any = None,
    ) -> Coroutine[Any, Any, Any]:
        """Call RPC ``name`` of provider ``provider_id`` at ``address``; ``await`` what it returns for the result.
        See ``svcframe.calls.Calls.call`` for the arguments, the result and the errors."""
        return self.calls.call(
            address, name, arg, provider_id=provider_id, timeout_seconds=timeout_seconds, idempotent=idempotent,
            max_attempts=max_attempts, into=into,
        )  # fmt: skip

    async def connection(self, address: str, timeout_seconds: float | None = None) -> Connection:
        """An open, handshaken connection to ``address`` (dialled once, then reused): see
        ``svcframe.connections.Connections.connection``."""
        return await self.connections.connection(address, timeout_seconds)

    def expose(self, buffer: Any, mode: str = "r", *, peer: str | None = None) -> BulkHandle:
        """Expose ``buffer`` for remote pull ("r"), push ("w") or both ("rw"): see
        ``svcframe.bulk_serving.BulkServing.expose``."""
        return self.serving.expose(buffer, mode, peer=peer)

    def unexpose(self, handle: BulkHandle) -> None:
        """Stop serving ``handle``: see ``svcframe.bulk_serving.BulkServing.unexpose``."""
        self.serving.unexpose(handle)

    def disconnect(self, address: str, reason: str = "dropped by the caller") -> bool:
        """Drop the connection dialled to ``address``, if any: its pending calls fail with ConnectionLost and the
        next call dials again. For a caller that finds it stuck (a failure detector whose calls time out: after a
        path comes back, TCP's retransmission backoff can keep an old connection silent for seconds). Returns
        whether there was one."""
        conn = self.connections.dialled.get(address)
        if conn is None or conn.closed:
            return False
        conn.abort(ConnectionLost(f"connection to {address}: {reason}"), expected=True)
        return True

    async def pull(
        self,
        handle: BulkHandle,
        dest: Any = None,
        *,
        offset: int = 0,
        size: int | None = None,
        dest_offset: int = 0,
        timeout_seconds: float | None = None,
    ) -> Any:
        """Read from the remote buffer of ``handle`` into ``dest``: see ``svcframe.bulk.BulkTransfers.pull``."""
        return await self.bulk.pull(
            handle, dest, offset=offset, size=size, dest_offset=dest_offset, timeout_seconds=timeout_seconds
        )

    def push(
        self,
        handle: BulkHandle,
        src: Any,
        *,
        offset: int = 0,
        timeout_seconds: float | None = None,
        ahead: bool = True,
    ) -> Coroutine[Any, Any, None]:
        """Write ``src`` into the remote buffer of ``handle``; ``await`` what it returns: see
        ``svcframe.bulk.BulkTransfers.push``."""
        return self.bulk.push(handle, src, offset=offset, timeout_seconds=timeout_seconds, ahead=ahead)

    def inflight_for(self, provider_id: int) -> list[asyncio.Task[Any]]:
        """The handler tasks of ``provider_id`` still running (a provider being removed waits for them)."""
        return self.handlers.inflight_for(provider_id)

    @property
    def cma_bytes(self) -> int:
        """Bulk bytes moved by cross-memory attach: pulls made, pushes served, ranges written for peers."""
        return self.bulk.cma_bytes + self.serving.cma_bytes

    def statistics(self) -> dict[str, Any]:
        """Counters of this engine: connections, in-flight work, progress loop, per-RPC statistics."""
        return {
            "address": self.address,
            "engine_id": self.engine_id,
            "connections": len(self.connections.all),
            "handlers_running": sum(1 for t in self.handlers.tasks if not t.done()),
            "exposed_bulk_buffers": len(self.serving.exposed),
            "bulk_cma_bytes": self.cma_bytes,
            "progress": self.progress.statistics(),
            "rpcs": self.monitor.to_dict(),
            "samples": list(self.sampler.samples) if self.sampler is not None else [],
            "tracing": self.tracer is not None,
        }
