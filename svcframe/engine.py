"""The engine (Margo analogue): one per process, on one event loop.

An engine listens on one address, keeps the *registration table* of RPC handlers keyed by
``(provider_id, rpc_name)``, forwards calls to other engines, serves and performs bulk transfers, and
drives the progress loop. It is built of parts, one concept per file, that this class composes:

    svcframe/engine.py        the facade: lifecycle, connections (cache, caps, sweep), dispatch, statistics
    svcframe/registration.py  the registration table
    svcframe/calls.py         outgoing calls: encoding, callpath, retries (Calls)
    svcframe/deadlines.py     the deadlines of outgoing calls and transfers, behind one loop timer
    svcframe/handlers.py      running handlers: Request, current_request, replies, cancellation (Handlers)
    svcframe/bulk.py          bulk handles, expose / pull / push, the CMA policy (BulkTransfers)
    svcframe/bulk_serving.py  serving the transfers peers make on our buffers, lending results (BulkServing)
    svcframe/protocol.py      one connection's state, sans-IO: phase, handshake, tables
    svcframe/transport.py     the asyncio pump around it, tcp:// and unix://
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
import time
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from . import cma
from .bulk import BulkTransfers
from .bulk_serving import BulkServing
from .calls import Calls
from .deadlines import Deadlines
from .errors import ConfigError, ConnectionLost, DeadlineExceeded, ProtocolError, RemoteProtocolError, RPCError
from .handlers import Handlers, Request, current_callpath, current_request, serve_request
from .monitoring import Monitor, ProcessSampler
from .progress import Progress
from .protocol import Identity
from .registration import Handler, Registration, RegistrationTable
from .settings import EngineConfig, MonitoringConfig, format_validation_error
from .slots import EngineState
from .tracing import Tracer
from .transport import (
    FRAMES_PER_TURN,
    Address,
    Connection,
    dial,
    listen,
    parse_address,
)
from .wire import (
    F_INTO,
    K_BULK_DATA_PUSH,
    K_BULK_DATA_REPLY,
    K_BULK_PULL,
    K_BULK_PUSH,
    K_CANCEL,
    K_GOODBYE,
    K_REQUEST,
    K_RESPONSE,
    PURE,
    Frame,
    Status,
    answer_call,
    check_secret,
)

__all__ = ["FROM_ENVIRONMENT", "SECRET_ENV", "Engine", "Registration", "Request", "current_callpath", "current_request"]

log = logging.getLogger("svcframe.engine")

perf_ns = time.perf_counter_ns
_NO_FRAMES: tuple[Frame, ...] = ()  # (what _dispatching holds between batches)
#: The environment variable engines take their shared secret from unless given one explicitly.
SECRET_ENV = "SVCFRAME_SECRET"
FROM_ENVIRONMENT = object()
_NIL = b"\xc0"  # msgpack's nil: the body of a None result


class Engine(Calls, Handlers, BulkTransfers, BulkServing, EngineState):
    """One process's RPC engine: the facade over its parts (calls, handlers, bulk) and what they share.

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
    slows both: issue 14). Settings the engine does not use (event loop, CPU affinity, plumber, auth source,
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
        self.default_timeout_seconds = cfg.default_timeout_seconds
        self.max_body_bytes = cfg.max_body_bytes
        self.bulk_chunk_bytes = cfg.bulk_chunk_bytes
        self.bulk_cma = cfg.bulk_cma and cma.supported()
        self.cma_bytes = 0  # bulk bytes moved by cross-memory attach (pulls made, pushes served)
        self.local_host = local_host
        self.max_inflight_per_connection = cfg.max_inflight_per_connection
        self.max_output_bytes = cfg.max_output_bytes
        self.idle_timeout_seconds = cfg.idle_timeout_seconds
        self.handshake_timeout_seconds = cfg.handshake_timeout_seconds
        self.send_tracebacks = cfg.send_tracebacks
        self.frame_timeout_seconds = cfg.frame_timeout_seconds
        self.max_connections = default_max_connections() if cfg.max_connections is None else cfg.max_connections
        per_host = cfg.max_connections_per_host
        self.max_connections_per_host = max(1, self.max_connections // 2) if per_host is None else per_host
        self.allow_third_party_bulk = cfg.allow_third_party_bulk
        self._accepted = 0  # accepted connections counted against the caps
        self._per_host: dict[str, int] = {}
        self._handshaking: dict[Connection, None] = {}  # accepted, handshake not complete, oldest first
        self._last_refusal_log = 0.0
        self._peer_labels: set[str] = set()  # distinct peer labels in the statistics (at most MAX_PEER_LABELS)
        self._sweeper: asyncio.TimerHandle | None = None
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
        self.table = RegistrationTable(self.monitor.names)
        self._rows, self._refused, self._rpc_ids = (
            self.table.rows,
            self.table.refused,
            self.table.ids,
        )  # hot-path aliases
        self._server: asyncio.AbstractServer | None = None
        self._bound: Address | None = None
        self._conns: dict[str, Connection] = {}  # dialled, by address
        self._dialing: dict[str, list[Any]] = {}  # address -> [dial task, callers waiting]
        self._peers: dict[str, Connection] = {}  # any open connection, by peer engine id
        self._all_conns: set[Connection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._dispatching: Sequence[Frame] = _NO_FRAMES  # the batch of requests being dispatched (Handlers._start)
        self._dispatching_cancels: set[int] | None = None  # and the request ids its CANCELs name, once needed
        # bulk id (16 random bytes) -> (buffer, mode, address of the only peer allowed, or None)
        self._exposed: dict[bytes, tuple[memoryview, str, str | None]] = {}
        self._push_sources: dict[bytes, int] = {}  # our pushes' sources exposed meanwhile (svcframe.bulk)
        self._lent_bytes = 0  # results lent by address to callers that have not read them yet (bulk.MAX_LENT_BYTES)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._root_callpaths: dict[tuple[int, int], int] = {}
        self._deadlines = Deadlines()  # of outgoing calls and bulk transfers, behind one loop timer
        self.tracer: Tracer | None = None
        self.apply_monitoring(monitoring)
        self._epoch_offset_us = time.time() * 1e6 - time.perf_counter_ns() / 1e3
        self._closing = False
        self._closed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifecycle -----------------------------------------------------------------------------------
    @property
    def address(self) -> str | None:
        """The address peers dial (with the ephemeral port resolved), None for a client-only engine."""
        return str(self._bound) if self._bound else None

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
        self._loop = asyncio.get_running_loop()
        self._deadlines.start(self._loop)
        if self._listen_address is not None:
            self._server, self._bound = await listen(self._listen_address, self._accept, start_serving=serving)
        self.progress.start(self._loop)
        self._sweeper = self._loop.call_later(self._sweep_interval(), self._sweep)
        if self.sampler is not None:
            self.sampler.start(
                self._loop, lambda: self.progress.inflight + sum(len(c.pending) for c in self._all_conns)
            )
        return self

    async def start_serving(self) -> None:
        """Accept peers on the address bound by ``start(serving=False)`` (a no-op when already serving)."""
        if self._server is not None and not self._server.is_serving():
            await self._server.start_serving()

    async def __aenter__(self) -> Engine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _new_connection(self, server_side: bool) -> Connection:
        conn = Connection(
            self, self.identity, server_side=server_side, max_body_bytes=self.max_body_bytes,
            max_output_bytes=self.max_output_bytes, handshake_timeout_seconds=self.handshake_timeout_seconds,
            max_inflight=self.max_inflight_per_connection,
        )  # fmt: skip
        self._all_conns.add(conn)
        return conn

    def _accept(self) -> Connection:
        return self._new_connection(server_side=True)

    def _sweep_interval(self) -> float:
        idle = self.idle_timeout_seconds if self._server is not None and self.idle_timeout_seconds > 0 else 1e9
        return min(idle, self.frame_timeout_seconds) / 10

    def _sweep(self) -> None:
        """Drop connections whose current frame did not complete within frame_timeout_seconds (a peer
        trickling bytes), and close accepted connections that completed no frame for idle_timeout_seconds
        and have no work in flight (half-open or forgotten peers); runs every tenth of the shorter one, so a
        stalled frame is cut within 1.1 frame timeouts."""
        now = time.monotonic()
        idle_timeout = self.idle_timeout_seconds if self._server is not None else 0
        for conn in list(self._all_conns):
            if now - conn.last_activity > self._sweep_interval():  # idle since the last sweep:
                conn.protocol.decoder.release_idle()  # no large buffer nor receive pages kept
            started = conn.frame_started
            if started and now - started > self.frame_timeout_seconds and not conn.protocol.idle:
                conn.abort(RemoteProtocolError(f"a frame did not complete within {self.frame_timeout_seconds:g} s"))
            elif (
                idle_timeout > 0 and conn.server_side and not conn.pending and not conn.serving
                and now - conn.last_activity > idle_timeout
            ):  # fmt: skip
                log.info("closing idle connection from %s", conn.peer_label)
                conn.goodbye(Status.REFUSED, f"idle for more than {idle_timeout:g} s")
        if self._loop is not None and not self._closing:
            self._sweeper = self._loop.call_later(self._sweep_interval(), self._sweep)

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
        self._closing = True
        if self._server is not None:
            self._server.close()
        handlers = [t for t in self._tasks if not t.done()]
        if handlers:
            _, late = await asyncio.wait(handlers, timeout=drain_timeout_seconds)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        for conn in list(self._all_conns):
            self._fail_pending(conn, ConnectionLost("the engine is shutting down"))
            conn.close()
        leftovers = [t for t in self._tasks if not t.done()]
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
        self._deadlines.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
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

    # -- the connection cache -----------------------------------------------------------------------------
    async def connection(self, address: str, timeout_seconds: float | None = None) -> Connection:
        """An open, handshaken connection to ``address`` (dialled once, then reused).

        Concurrent callers share one dial; each waits up to its own ``timeout_seconds`` (default: the
        engine's default deadline). When the last waiting caller gives up, the dial is abandoned and its
        socket closed.

        Raises:
            DeadlineExceeded: the dial or the handshake did not complete in time.
            ConnectionLost: the address could not be reached (AuthenticationFailed: the handshake was refused).
            ConfigError: a malformed address.
        """
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        if self._closing:
            raise ConnectionLost("the engine is shutting down")
        entry = self._dialing.get(address)
        if entry is None:
            task = asyncio.get_running_loop().create_task(self._dial(address))
            task.add_done_callback(_retrieve)
            entry = self._dialing[address] = [task, 0]
        task = entry[0]
        entry[1] += 1
        timeout = self.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(timeout, 0.0))
        except TimeoutError:
            raise DeadlineExceeded(f"connecting to {address} took longer than {timeout:g} s") from None
        finally:
            entry[1] -= 1
            if entry[1] == 0 and not task.done():
                task.cancel()  # nobody waits for this dial any more

    def disconnect(self, address: str, reason: str = "dropped by the caller") -> bool:
        """Drop the connection dialled to ``address``, if any: its pending calls fail with ConnectionLost and the
        next call dials again. For a caller that finds it stuck (a failure detector whose calls time out: after a
        path comes back, TCP's retransmission backoff can keep an old connection silent for seconds). Returns
        whether there was one."""
        conn = self._conns.get(address)
        if conn is None or conn.closed:
            return False
        conn.abort(ConnectionLost(f"connection to {address}: {reason}"), expected=True)
        return True

    async def _dial(self, address: str) -> Connection:
        target = parse_address(address)
        made: list[Connection] = []

        def factory() -> Connection:
            conn = self._new_connection(server_side=False)
            made.append(conn)
            return conn

        try:
            await dial(target, factory, local_host=self.local_host)
            await made[0].ready
            self._conns[address] = made[0]
            return made[0]
        except BaseException:
            for conn in made:
                conn.abort(ConnectionLost("dial abandoned"), expected=True)
                self._all_conns.discard(conn)
            raise
        finally:
            self._dialing.pop(address, None)

    # -- ConnectionOwner: what connections report ----------------------------------------------------------
    def admit(self, conn: Connection) -> str | None:
        """An accepted connection counts against ``max_connections`` and, over tcp, ``max_connections_per_host``.

        Over a cap, room is made, in this order: the oldest connection of that scope still in its handshake
        (it has proved nothing; a flood of them never locks a new client out for more than one handshake
        timeout); else the longest-idle unauthenticated one with no call in flight (its engine redials when it
        needs to); else, over the total cap, an unauthenticated connection of the host that holds the most,
        when the newcomer's host holds fewer (calls in flight or not: a flood from one address costs that
        address, not everyone). When none is left, the new connection is refused.
        Returns None when admitted, else the refusal sent to the peer."""
        host = conn.peer_host
        over_total = self._accepted >= self.max_connections
        if over_total or (host is not None and self._per_host.get(host, 0) >= self.max_connections_per_host):
            victim = next((c for c in self._handshaking if over_total or c.peer_host == host), None)
            if victim is None:  # then the longest-idle connection that proved nothing and has no work
                idle = [
                    c for c in self._all_conns
                    if c.admitted and not c.authenticated and not c.pending and not c.serving
                    and (over_total or c.peer_host == host)
                ]  # fmt: skip
                victim = min(idle, key=lambda c: c.last_activity, default=None)
            if victim is None and over_total and self._per_host:  # then the largest host gives way to a smaller one
                largest, held = max(self._per_host.items(), key=lambda item: item[1])
                if largest != host and held > self._per_host.get(host or "", 0) + 1:
                    theirs = [
                        c for c in self._all_conns if c.admitted and not c.authenticated and c.peer_host == largest
                    ]
                    victim = min(theirs, key=lambda c: c.last_activity, default=None)
            if victim is None:
                now = time.monotonic()
                if now - self._last_refusal_log >= 1.0:
                    self._last_refusal_log = now
                    log.warning("refusing connections (from %s): %d connections, caps %d total / %d per host",
                                conn.peername, self._accepted, self.max_connections, self.max_connections_per_host)  # fmt: skip
                return (f"too many connections ({self._accepted}; caps: {self.max_connections} in all, "
                        f"{self.max_connections_per_host} per host): try again later")  # fmt: skip
            self._release(victim)
            victim.abort(ConnectionLost("evicted: a connection cap was reached"), expected=True)
        self._accepted += 1
        if host is not None:
            self._per_host[host] = self._per_host.get(host, 0) + 1
        conn.admitted = True
        self._handshaking[conn] = None
        return None

    def _release(self, conn: Connection) -> None:
        """Stop counting ``conn`` against the connection caps (closed or evicted)."""
        if conn.admitted:
            conn.admitted = False
            self._accepted -= 1
            host = conn.peer_host
            if host is not None:
                left = self._per_host[host] - 1
                if left:
                    self._per_host[host] = left
                else:
                    del self._per_host[host]
        self._handshaking.pop(conn, None)

    def on_open(self, conn: Connection) -> None:
        self._handshaking.pop(conn, None)
        label = conn.peer_label  # statistics key: a peer's claimed address, or clients@HOST
        if label not in self._peer_labels:
            if len(self._peer_labels) >= MAX_PEER_LABELS:
                conn.peer_label = "other"  # peers may claim any address: past the cap they share one record
            else:
                self._peer_labels.add(label)
        # An engine id in a HELLO is a claim: only connections we dialled (we chose the address) or whose peer
        # proved the shared secret are found by it (bulk transfers to that engine, _peer_connection).
        if conn.peer_engine_id is not None and (not conn.server_side or conn.authenticated):
            self._peers[conn.peer_engine_id] = conn
        conn.protocol.decoder.place_ahead = self._placer(conn)  # (decoder.close drops it)

    def on_close(self, conn: Connection, exc: BaseException | None) -> None:
        self._release(conn)
        self._all_conns.discard(conn)
        if self._peers.get(conn.peer_engine_id or "") is conn:
            del self._peers[conn.peer_engine_id or ""]
        for address, c in list(self._conns.items()):
            if c is conn:
                del self._conns[address]
                for bulk_id, entry in list(self._exposed.items()):
                    if entry[2] == address:  # bound to the peer of this connection: revoked with it
                        del self._exposed[bulk_id]
                        entry[0].release()
        error = conn.close_reason
        if error is None:
            reason = f"connection to {conn.peer_address or conn.peername} lost" + (f": {exc}" if exc else "")
            error = ConnectionLost(reason)
        self._fail_pending(conn, error)
        for request_id in list(conn.protocol.lent):
            self._release_lent(conn, request_id)
        for task in list(conn.serving.values()):
            if isinstance(task, asyncio.Task):
                task.cancel()  # nobody can receive the answer any more
        conn.serving.clear()

    def _fail_pending(self, conn: Connection, error: RPCError) -> None:
        pending = list(conn.pending.values())
        conn.pending.clear()
        for waiter in pending:
            if not waiter.done():
                waiter.set_exception(error)

    def on_answers(self, conn: Connection) -> None:
        """A read of ``conn`` completed only answers to our calls, given to their futures by its decoder (see
        svcframe.decoder.FrameDecoder.answers): activity, as a batch of frames is."""
        if not self.progress.blocking:
            self.progress.activity()

    def on_frames(self, conn: Connection, frames: list[Frame]) -> None:
        if not self.progress.blocking:
            self.progress.activity()
        arrival_ns, arrival = 0, 0.0  # the batch's arrival (ns; loop time, for deadlines), read at its first request
        for frame in frames:
            kind = frame[0]
            if kind == K_REQUEST:  # (first: the compiled decoder answers most responses itself)
                if not arrival_ns:  # (a batch of responses reads no clock: two C calls per call saved on a client)
                    arrival_ns, arrival = perf_ns(), self._loop.time()  # type: ignore[union-attr]
                    self._dispatching, self._dispatching_cancels = frames, None  # (see Handlers._start)
                serve_request(self, conn, frame, arrival_ns, arrival)
            elif kind == K_RESPONSE:
                waiter = conn.pending.get(frame[4])
                if waiter is None:
                    conn.protocol.check_late_answer(frame[4])
                elif not waiter.done():
                    # decoded here, while the body's buffer is this frame's (the decoder reuses large ones)
                    answer_call(waiter, frame[6], frame[13])  # type: ignore[arg-type]  # None: bulk data only
            elif kind == K_BULK_DATA_PUSH:
                self._on_push_data(conn, frame)
            elif kind == K_BULK_DATA_REPLY:  # already written into the destination by the protocol's bulk sink
                if frame[1] & F_INTO:  # the whole result of an into= call, and its answer
                    self._into_answered(conn, frame[4])
            elif kind == K_BULK_PULL:
                self._on_pull_request(conn, frame)
            elif kind == K_BULK_PUSH:
                self._on_push_request(conn, frame)
            elif kind == K_CANCEL:
                task = conn.serving.get(frame.request_id)
                if isinstance(task, asyncio.Task):
                    task.cancel()
                elif conn.protocol.lent:  # the caller has read a result lent by address: take it back
                    self._release_lent(conn, frame.request_id)
                if conn.protocol.offers:  # a cancelled into= call: its write offer is declined
                    self._withdraw_offer(conn, frame.request_id)
                if conn.protocol.pushes:  # a push given up on before all its data came: forget it
                    conn.protocol.pushes.pop(frame.request_id, None)
            elif kind == K_GOODBYE:
                conn.goodbye_received(frame)
                break
        if arrival_ns:  # the batch is dispatched: keep none of its frames (a large body's buffer goes with them)
            self._dispatching = _NO_FRAMES

    @staticmethod
    def _into_answered(conn: Connection, request_id: int) -> None:
        """A data frame flagged INTO answered our into= call ``request_id``: its result is the byte count
        (what the pull received, or was announced when it overflowed the caller's buffer). Data flagged so for
        any other request answers nothing (its bytes went to the sink's discard)."""
        pull = conn.protocol.pulls.get(request_id)
        waiter = conn.pending.get(request_id)
        if pull is not None and pull.overflow_ok and waiter is not None and not waiter.done():
            waiter.set_result((0, pull.cursor, pull.cursor))

    def statistics(self) -> dict[str, Any]:
        """Counters of this engine: connections, in-flight work, progress loop, per-RPC statistics."""
        return {
            "address": self.address,
            "engine_id": self.engine_id,
            "connections": len(self._all_conns),
            "handlers_running": sum(1 for t in self._tasks if not t.done()),
            "exposed_bulk_buffers": len(self._exposed),
            "bulk_cma_bytes": self.cma_bytes,
            "progress": self.progress.statistics(),
            "rpcs": self.monitor.to_dict(),
            "samples": list(self.sampler.samples) if self.sampler is not None else [],
            "tracing": self.tracer is not None,
        }


#: Distinct peers the statistics keep records for; later ones are counted under "other" (issue 13).
MAX_PEER_LABELS = 1024


def default_max_connections() -> int:
    """4096 accepted connections, or fewer when the process's descriptor limit (RLIMIT_NOFILE) leaves less
    than that after 64 for listeners, files and outgoing connections."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 4096
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, min(4096, soft - 64))


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # a dial nobody awaited any more: its error is not "never retrieved"


if not PURE:  # Connection.buffer_updated's compiled twin: on_frames' and on_answers' work for an Engine
    from ._speedups import configure_read

    configure_read(Engine.on_frames, Engine.on_answers, ProtocolError, FRAMES_PER_TURN, _NO_FRAMES, globals())
