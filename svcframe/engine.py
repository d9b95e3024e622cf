"""The engine (Margo analogue): one per process, on one event loop.

An engine listens on one address, keeps the *registration table* of RPC handlers keyed by
``(provider_id, rpc_name)``, forwards calls to other engines, serves and performs bulk transfers, and
drives the progress loop. Providers use only this public API::

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
import contextvars
import inspect
import logging
import operator
import os
import random
import secrets
import struct
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from . import cma
from .bulk import BULK_ID_BYTES, MODES, READ, WRITE, BulkHandle, as_byte_view
from .errors import (
    AppError,
    AuthenticationFailed,
    BulkError,
    BulkUsageError,
    ConfigError,
    ConnectionLost,
    DeadlineExceeded,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RPCError,
    ShuttingDown,
    error_from_status,
    status_for,
)
from .monitoring import ALWAYS_TIMED, FOLD_AT, Monitor, ProcessSampler
from .progress import Progress
from .tracing import Tracer, new_span_id, new_trace_id
from .transport import (
    DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
    DEFAULT_MAX_OUTPUT_BYTES,
    Address,
    Connection,
    Identity,
    dial,
    goodbye_error,
    listen,
    parse_address,
)
from .wire import (
    DEFAULT_MAX_BODY_BYTES,
    F_CMA,
    F_IDEMPOTENT,
    F_NO_REPLY,
    F_TRACED,
    HEADER,
    K_BULK_DATA_PUSH,
    K_BULK_DATA_REPLY,
    K_BULK_PULL,
    K_BULK_PUSH,
    K_CANCEL,
    K_GOODBYE,
    K_REQUEST,
    K_RESPONSE,
    MAGIC,
    NO_PARENT_PROVIDER,
    S_OK,
    WIRE_VERSION,
    ZERO_COPY_BYTES,
    ZERO_TRACE_ID,
    Frame,
    Kind,
    Status,
    _new_tuple,
    bin_header,
    callpath_extend,
    check_secret,
    encode_frame,
    encode_header,
    pack_body,
    rpc_id,
    unpack_body,
)

log = logging.getLogger("svcframe.engine")

perf_ns = time.perf_counter_ns
#: The environment variable engines take their shared secret from unless given one explicitly.
SECRET_ENV = "SVCFRAME_SECRET"
FROM_ENVIRONMENT = object()
#: Results of these types are never awaitable: a sync handler returning one needs no isawaitable check.
_NIL = pack_body(None)
_SMALL_RESULT_BYTES = 4096  # results up to this size are answered in _on_request itself (under any peer's limit)
_pack_bytes = msgpack.Packer(use_bin_type=True, autoreset=True).pack  # results that are bytes (bin)
_PLAIN = frozenset({bytes, str, int, float, bool, list, dict, tuple, bytearray})
# A successful response header is constant but for the body length and request id.
_RESPONSE_OK_PREFIX = MAGIC + bytes([WIRE_VERSION, K_RESPONSE]) + bytes(8)  # flags, provider id, rpc id

_RESPONSE_OK = struct.Struct("<12sIQIH" + "50x")  # the prefix, body length, request id, deadline, status, zeros
assert len(_RESPONSE_OK_PREFIX) == 12 and _RESPONSE_OK.size == HEADER.size

Handler = Callable[["Request", Any], Any]


@dataclass(slots=True, eq=False)  # identity semantics: hashable, used as a cache key
class Registration:
    """One row of the registration table."""

    provider_id: int
    name: str
    rpc_id: int
    handler: Handler
    is_coroutine: bool
    owner: object = None  # the provider object, when registered by one
    last_logged: float = -1e9  # monotonic time of the last handler failure logged (one traceback a second)


class Request(tuple):
    """What a handler learns about the call it serves (its first argument).

    Attributes:
        engine: the engine serving the call (make nested calls and bulk transfers through it).
        conn: the connection the request arrived on.
        arrival: loop time (seconds) when the request was received.
    """

    # A tuple underneath: one is built per call, and building a tuple costs a third of running an __init__.
    __slots__ = ()

    engine: Engine = property(operator.itemgetter(0))  # type: ignore[assignment]
    conn: Connection = property(operator.itemgetter(1))  # type: ignore[assignment]
    reg: Registration = property(operator.itemgetter(2))  # type: ignore[assignment]
    frame: Frame = property(operator.itemgetter(3))  # type: ignore[assignment]
    arrival: float = property(operator.itemgetter(4))  # type: ignore[assignment]

    def __new__(cls, engine: Engine, conn: Connection, reg: Registration, frame: Frame, arrival: float) -> Request:
        return _new_tuple(cls, (engine, conn, reg, frame, arrival))  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Request({self.reg.name!r}, provider_id={self.reg.provider_id}, request_id={self.frame.request_id})"

    @property
    def provider_id(self) -> int:
        return self.reg.provider_id

    @property
    def rpc_name(self) -> str:
        return self.reg.name

    @property
    def request_id(self) -> int:
        return self.frame.request_id

    @property
    def callpath(self) -> int:
        """The 64-bit chained hash of this call's ancestry."""
        return self.frame.callpath

    @property
    def deadline(self) -> float | None:
        """Loop time (seconds) after which the caller no longer waits; None when it set no deadline."""
        usec = self.frame.deadline_usec
        return self.arrival + usec / 1e6 if usec else None

    @property
    def peer_address(self) -> str | None:
        """The caller's listening address (None for a client-only engine)."""
        return self.conn.peer_address

    def remaining_seconds(self) -> float | None:
        """Time left before the caller gives up (None when it set no deadline)."""
        deadline = self.deadline
        return None if deadline is None else deadline - asyncio.get_running_loop().time()


#: The request of the async handler whose task runs in this context, and of the tasks it spawns.
_task_request: contextvars.ContextVar[Request | None] = contextvars.ContextVar("svcframe_request", default=None)


class _SyncRequest(threading.local):
    """The request of the sync handler running on this thread (set and cleared around the call: a sync
    handler runs to completion, and two never nest). A thread-local costs a tenth of a contextvar."""

    request: Request | None = None


_sync = _SyncRequest()


class CurrentRequest:
    """``current_request.get()``: the request whose handler is running here, None outside any handler.
    Nested calls read their parent (callpath, RPC, provider, trace context) from it.

    Inside a sync handler it is that handler's request; inside an async handler's task (and the tasks it
    spawns, which copy its context) it is that handler's. Tasks a *sync* handler spawns run after it has
    returned and start a new callpath (as a ULT spawned from a Margo handler does); spawn them from an
    async handler to keep the parent.
    """

    __slots__ = ()

    def get(self) -> Request | None:
        req = _sync.request
        return req if req is not None else _task_request.get()


current_request = CurrentRequest()


def current_callpath() -> int:
    """The callpath of the handler running in this context (0 outside any handler)."""
    req = current_request.get()
    return req.frame.callpath if req is not None else 0


class _Pending:
    """An outgoing call or bulk transfer waiting for its response."""

    __slots__ = ("cursor", "dest", "future")

    def __init__(self, future: asyncio.Future[tuple[int, Any]]) -> None:
        self.future = future
        self.dest: memoryview | None = None
        self.cursor = 0


class _LazyDest:
    """The destination of ``pull(dest=None)``: its bytearray is allocated when the owner's first bytes
    arrive (or its address, for cross-memory attach), not when the request leaves, so a size a peer merely
    claims costs nothing (issue 13). Quacks like the memoryview a bulk sink slices."""

    __slots__ = ("buf", "size", "view")

    def __init__(self, size: int) -> None:
        self.size = size
        self.buf: bytearray | None = None
        self.view: memoryview | None = None

    def __len__(self) -> int:
        return self.size

    def materialize(self) -> memoryview:
        if self.view is None:
            self.buf = bytearray(self.size)
            self.view = memoryview(self.buf)
        return self.view

    def __getitem__(self, key: slice) -> memoryview:
        return self.materialize()[key]

    def result(self) -> bytearray:
        return self.buf if self.buf is not None else bytearray(self.size)


class _IncomingPush:
    __slots__ = ("cursor", "dest", "error", "frame", "size")

    def __init__(self, dest: memoryview | None, error: str | None, frame: Frame, size: int) -> None:
        self.dest = dest
        self.error = error
        self.frame = frame
        self.size = size  # bytes announced (data for a refused push is received and discarded)
        self.cursor = 0


class Engine:
    """One process's RPC engine.

    Args:
        address: where to listen, ``tcp://HOST:PORT`` (port 0 = ephemeral) or ``unix:///path``; None
            for a client-only engine (it can call, expose buffers and serve bulk on its own connections).
        progress_mode / progress_spindown_msec / progress_timeout_ub_msec: see ``svcframe.progress``; the mode
            defaults to "spindown" for an engine that listens and "block" for a client-only one (a client
            spinning on a core it shares with its server slows both: issue 14).
        default_timeout_seconds: deadline of calls that give none.
        max_body_bytes: largest inline frame body accepted (default 4 MiB).
        bulk_chunk_bytes: size of the data frames bulk transfers are cut into.
        bulk_cma: move bulk data between processes of one node (``unix://`` connections) by cross-memory
            attach, one kernel copy (``svcframe.cma``); falls back to the socket path when the kernel
            refuses. Linux only; ignored elsewhere.
        secret: shared secret for connection authentication; by default taken from the SVCFRAME_SECRET
            environment variable when it is set; None = no authentication.
        monitoring: keep per-callpath statistics (see svcframe.monitoring).
        frame_timeout_seconds: a frame whose first bytes arrived must be complete this long after, or its
            connection is dropped (a peer trickling a byte now and then cannot hold a connection open).
        max_connections: accepted connections at once (default: 4096, or the descriptor limit less 64 when
            lower); see ``admit`` for what happens over the cap.
        max_connections_per_host: accepted tcp connections at once from one IP address.
        allow_third_party_bulk: let a handler pull from or push to a bulk handle that is not its caller's
            (one passed on by another engine). Off by default: a caller could otherwise make a server read
            or overwrite a third party's buffer on its behalf (a confused deputy).
        send_tracebacks: send a failed handler's traceback to unauthenticated callers too (it names the
            server's source paths); authenticated callers always get it.
        sample_interval_seconds: how often to sample loop lag, tasks, in-flight calls, CPU and RSS
            (None = never).

    Raises:
        ConfigError: an invalid address or setting.
    """

    def __init__(
        self,
        address: str | None = "tcp://127.0.0.1:0",
        *,
        progress_mode: str | None = None,
        progress_spindown_msec: float = 10.0,
        progress_timeout_ub_msec: float = 100.0,
        default_timeout_seconds: float = 30.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        bulk_chunk_bytes: int = 1024 * 1024,
        bulk_cma: bool = True,
        secret: bytes | object | None = FROM_ENVIRONMENT,
        monitoring: bool = True,
        sample_interval_seconds: float | None = 1.0,
        timing_sample_every: int = 16,
        local_host: str | None = None,
        max_inflight_per_connection: int = 1024,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        idle_timeout_seconds: float = 300.0,
        handshake_timeout_seconds: float = DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
        frame_timeout_seconds: float = 30.0,
        send_tracebacks: bool = False,
        max_connections: int | None = None,
        max_connections_per_host: int = 1024,
        allow_third_party_bulk: bool = False,
    ) -> None:
        self._listen_address = parse_address(address) if address else None
        if default_timeout_seconds <= 0:
            raise ConfigError("default_timeout_seconds must be > 0")
        if not 0 < bulk_chunk_bytes <= max_body_bytes:
            raise ConfigError("bulk_chunk_bytes must be in 1..max_body_bytes")
        if progress_mode is None:  # a client-only engine must not burn a core it may share with its server
            progress_mode = "spindown" if address else "block"
        try:
            self.progress = Progress(progress_mode, progress_spindown_msec, progress_timeout_ub_msec)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.engine_id = uuid.uuid4().hex
        self.default_timeout_seconds = default_timeout_seconds
        self.max_body_bytes = max_body_bytes
        self.bulk_chunk_bytes = bulk_chunk_bytes
        self.bulk_cma = bulk_cma and cma.supported()
        self.cma_bytes = 0  # bulk bytes moved by cross-memory attach (pulls made, pushes served)
        self.local_host = local_host
        self.max_inflight_per_connection = max_inflight_per_connection
        self.max_output_bytes = max_output_bytes
        self.idle_timeout_seconds = idle_timeout_seconds
        self.handshake_timeout_seconds = handshake_timeout_seconds
        self.send_tracebacks = send_tracebacks
        if frame_timeout_seconds <= 0:
            raise ConfigError("frame_timeout_seconds must be > 0")
        self.frame_timeout_seconds = frame_timeout_seconds
        self.max_connections = default_max_connections() if max_connections is None else max_connections
        self.max_connections_per_host = max_connections_per_host
        self.allow_third_party_bulk = allow_third_party_bulk
        if self.max_connections < 1 or max_connections_per_host < 1:
            raise ConfigError("max_connections and max_connections_per_host must be >= 1")
        self._accepted = 0  # accepted connections counted against the caps
        self._per_host: dict[str, int] = {}
        self._handshaking: dict[Connection, None] = {}  # accepted, handshake not complete, oldest first
        self._last_refusal_log = 0.0
        self._peer_labels: set[str] = set()  # distinct peer labels in the statistics (at most MAX_PEER_LABELS)
        self._sweeper: asyncio.TimerHandle | None = None
        self.monitor = Monitor(monitoring, timing_sample_every)
        self.sampler = ProcessSampler(sample_interval_seconds) if sample_interval_seconds else None
        if secret is FROM_ENVIRONMENT:
            env = os.environ.get(SECRET_ENV)
            secret = None if env is None else check_secret(env.encode(), f"the {SECRET_ENV} variable")
        elif secret is not None:
            check_secret(secret, "Engine(secret=...)")  # type: ignore[arg-type]
        self._secret: bytes | None = secret  # type: ignore[assignment]
        self._table: dict[tuple[int, int], Registration] = {}
        self._providers: dict[int, set[str]] = {}
        self._refused: dict[int, str] = {}  # provider ids being removed -> reason
        self._rpc_ids: dict[str, int] = {}
        self._server: asyncio.AbstractServer | None = None
        self._bound: Address | None = None
        self._conns: dict[str, Connection] = {}  # dialled, by address
        self._dialing: dict[str, list[Any]] = {}  # address -> [dial task, callers waiting]
        self._peers: dict[str, Connection] = {}  # any open connection, by peer engine id
        self._all_conns: set[Connection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        # bulk id (16 random bytes) -> (buffer, mode, address of the only peer allowed, or None)
        self._exposed: dict[bytes, tuple[memoryview, str, str | None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scratch = memoryview(bytearray(0))
        self._root_callpaths: dict[tuple[int, int], int] = {}
        self.tracer: Tracer | None = None
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

    async def start(self) -> Engine:
        """Bind the listener (if any) and start the progress loop.

        Raises:
            ConnectionLost: the address cannot be bound.
        """
        self._loop = asyncio.get_running_loop()
        if self._listen_address is not None:
            self._server, self._bound = await listen(self._listen_address, self._accept)
        self.progress.start(self._loop)
        self._sweeper = self._loop.call_later(self._sweep_interval(), self._sweep)
        if self.sampler is not None:
            self.sampler.start(
                self._loop, lambda: self.progress.inflight + sum(len(c.pending) for c in self._all_conns)
            )
        return self

    async def __aenter__(self) -> Engine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _new_connection(self, server_side: bool) -> Connection:
        conn = Connection(
            self, self.identity, server_side=server_side, max_body_bytes=self.max_body_bytes,
            max_output_bytes=self.max_output_bytes, handshake_timeout_seconds=self.handshake_timeout_seconds,
        )  # fmt: skip
        self._all_conns.add(conn)
        return conn

    def _accept(self) -> Connection:
        return self._new_connection(server_side=True)

    def _sweep_interval(self) -> float:
        idle = self.idle_timeout_seconds if self._server is not None and self.idle_timeout_seconds > 0 else 1e9
        return min(idle, self.frame_timeout_seconds) / 4

    def _sweep(self) -> None:
        """Drop connections whose current frame did not complete within frame_timeout_seconds (a peer
        trickling bytes), and close accepted connections that completed no frame for idle_timeout_seconds
        and have no work in flight (half-open or forgotten peers); runs every quarter of the shorter one."""
        now = time.monotonic()
        idle_timeout = self.idle_timeout_seconds if self._server is not None else 0
        for conn in list(self._all_conns):
            started = conn.frame_started
            if started and now - started > self.frame_timeout_seconds and not conn.decoder.idle:
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
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.sampler is not None:
            self.sampler.stop()
        self._closed.set()

    # -- registration table --------------------------------------------------------------------------
    def register(self, provider_id: int, name: str, handler: Handler, *, owner: object = None) -> Registration:
        """Register ``handler(request, arg) -> result`` (sync or async) as RPC ``name`` of ``provider_id``.

        Raises:
            ConfigError: provider id out of 0..65535, name already registered for that provider, or a
                CRC-32 collision between two names of the same provider.
        """
        if not 0 <= provider_id <= 0xFFFF:
            raise ConfigError(f"provider_id {provider_id} is outside 0..65535")
        rid = self._rpc_id(name)
        existing = self._table.get((provider_id, rid))
        if existing is not None:
            what = "already registered" if existing.name == name else f"collides with {existing.name!r}"
            raise ConfigError(f"RPC {name!r} of provider {provider_id} {what}")
        reg = Registration(provider_id, name, rid, handler, inspect.iscoroutinefunction(handler), owner)
        self._table[(provider_id, rid)] = reg
        self._providers.setdefault(provider_id, set()).add(name)
        self._refused.pop(provider_id, None)
        return reg

    def deregister_provider(self, provider_id: int) -> None:
        """Remove every RPC of ``provider_id``; new calls to it get NoSuchProvider."""
        for name in self._providers.pop(provider_id, set()):
            self._table.pop((provider_id, self._rpc_id(name)), None)
        self._refused.pop(provider_id, None)

    def refuse_provider(self, provider_id: int, reason: str) -> None:
        """Refuse new calls to ``provider_id`` with Refused(reason), while in-flight ones complete."""
        self._refused[provider_id] = reason

    def registrations(self) -> list[Registration]:
        """The registration table, sorted by provider id and name."""
        return sorted(self._table.values(), key=lambda r: (r.provider_id, r.name))

    def inflight_for(self, provider_id: int) -> list[asyncio.Task[Any]]:
        return [t for t in self._tasks if getattr(t, "svcframe_provider_id", None) == provider_id]

    def _rpc_id(self, name: str) -> int:
        rid = self._rpc_ids.get(name)
        if rid is None:
            rid = self._rpc_ids[name] = rpc_id(name)
            self.monitor.names[rid] = name
        return rid

    def _root_callpath(self, rid: int, provider_id: int) -> int:
        cp = self._root_callpaths[(rid, provider_id)] = callpath_extend(0, rid, provider_id)
        return cp

    def set_tracing(self, enabled: bool, *, otel: bool = False) -> None:
        """Switch request tracing on or off at runtime (events are kept in ``self.tracer``); with
        ``otel``, spans also go through the OpenTelemetry API (ImportError if it is not installed)."""
        if enabled and (self.tracer is None or (self.tracer.otel is not None) != otel):
            self.tracer = Tracer(otel=otel)
        elif not enabled:
            self.tracer = None

    # -- outgoing calls ------------------------------------------------------------------------------
    async def connection(self, address: str, timeout_seconds: float | None = None) -> Connection:
        """An open, handshaken connection to ``address`` (dialled once, then reused).

        Concurrent callers share one dial; each waits up to its own ``timeout_seconds`` (default: the
        engine's default deadline). When the last waiting caller gives up, the dial is abandoned and its
        socket closed.

        Raises:
            DeadlineExceeded, ConnectionLost, AuthenticationFailed; ConfigError for a malformed address.
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

    async def call(
        self,
        address: str,
        name: str,
        arg: Any = None,
        *,
        provider_id: int = 0,
        timeout_seconds: float | None = None,
        idempotent: bool = False,
        max_attempts: int = 5,
    ) -> Any:
        """Call RPC ``name`` of provider ``provider_id`` at ``address`` and return its result.

        Args:
            arg: the RPC argument (msgpack types; put large buffers in a bulk handle).
            timeout_seconds: deadline from now for the whole call, retries included (default: the
                engine's default_timeout_seconds); it travels with the request so the server can drop
                work nobody waits for.
            idempotent: the call may safely run more than once. Only such calls are retried, on a lost
                connection or a server shutting down, at most ``max_attempts`` (<= 5) times in all, with
                jittered exponential back-off, always within the deadline. Other calls are never
                re-sent: a lost connection is reported, never silently re-executed.

        Raises:
            DeadlineExceeded, ConnectionLost, AuthenticationFailed, NoSuchProvider, NoSuchRPC, RemoteError,
            Refused, Cancelled (see svcframe.errors); LocalProtocolError when ``arg`` cannot be encoded.
        """
        if not idempotent:
            return await self._call_once(address, name, arg, provider_id, timeout_seconds, 0)
        loop = self._loop or asyncio.get_running_loop()
        timeout = self.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        deadline = loop.time() + timeout
        attempts = max(1, min(max_attempts, 5))
        for attempt in range(attempts):
            try:
                return await self._call_once(address, name, arg, provider_id, deadline - loop.time(), F_IDEMPOTENT)
            except (ConnectionLost, ShuttingDown) as exc:
                if isinstance(exc, AuthenticationFailed) or attempt == attempts - 1:
                    raise
                pause = min(0.05 * 2**attempt * random.uniform(0.5, 1.5), deadline - loop.time())
                if pause <= 0:
                    raise
                await asyncio.sleep(pause)
        raise AssertionError("unreachable")

    async def _call_once(
        self,
        address: str,
        name: str,
        arg: Any,
        provider_id: int,
        timeout_seconds: float | None,
        flags: int,
    ) -> Any:
        loop = self._loop or asyncio.get_running_loop()
        timeout = self.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        start = loop.time()
        conn = self._conns.get(address)
        if conn is None or conn.closed:
            conn = await self.connection(address, timeout)
        body = pack_body(arg)
        if len(body) > conn.peer_max_body_bytes:
            raise LocalProtocolError(
                f"the argument of {name!r} encodes to {len(body)} bytes, over the {conn.peer_max_body_bytes}-byte "
                f"limit of {address}; pass large data as a bulk handle (engine.expose)"
            )
        rid = self._rpc_ids.get(name) or self._rpc_id(name)
        parent = current_request.get()
        if parent is None:
            parent_rpc, parent_provider = 0, NO_PARENT_PROVIDER
            callpath = self._root_callpaths.get((rid, provider_id)) or self._root_callpath(rid, provider_id)
        else:
            pf = parent.frame
            parent_rpc, parent_provider = pf.rpc_id, pf.provider_id
            callpath = callpath_extend(pf.callpath, rid, provider_id)
        tracer = self.tracer
        trace_id, span_id, lamport = ZERO_TRACE_ID, 0, 0
        if tracer is not None or (parent is not None and parent.frame.flags & F_TRACED):
            flags |= F_TRACED
            trace_id = parent.frame.trace_id if parent is not None and parent.frame.flags & F_TRACED else new_trace_id()
            span_id = new_span_id()
            lamport = tracer.tick() if tracer is not None else 0
        rec = None
        monitor = self.monitor
        if monitor.enabled:
            key = (parent_rpc, parent_provider, rid, provider_id, address)
            rec = monitor.origin.get(key)
            if rec is None:
                rec = monitor.origin_record(key)
                monitor.names[rid] = name
            n = rec.calls = rec.calls + 1
            timed = n <= ALWAYS_TIMED or not n % monitor.sample_every
        else:
            timed = False
        t0 = perf_ns() if timed or flags & F_TRACED else 0
        request_id = conn.next_request_id()
        future: asyncio.Future[tuple[int, Any]] = loop.create_future()
        if conn.closed:  # closed (e.g. refused by the peer) after we got it: fail now, not at the deadline
            raise conn.close_reason or ConnectionLost(f"connection to {address} is closed")
        conn.pending[request_id] = _Pending(future)
        remaining = timeout - (loop.time() - start)
        conn.send(
            HEADER.pack(
                MAGIC, WIRE_VERSION, K_REQUEST, flags, provider_id, rid, len(body), request_id,
                wire_deadline(remaining), 0, parent_provider, parent_rpc, 0, callpath, trace_id, span_id, lamport,
            )
            + body
        )  # fmt: skip
        t1 = perf_ns() if t0 else 0
        progress = self.progress
        progress.inflight += 1
        progress.activity()
        timer = loop.call_at(start + timeout, _expire, future)
        status = -1
        try:
            status, payload = await future
        except _DeadlineExpired:
            if not conn.closed:
                conn.send(encode_frame(K_CANCEL, request_id))  # nobody waits any more: tell the server
            raise DeadlineExceeded(
                f"{name!r} (provider {provider_id}) at {address}: no response within {timeout:g} s"
            ) from None
        except asyncio.CancelledError:
            if not conn.closed:
                conn.send(encode_frame(K_CANCEL, request_id))  # the caller gave up: tell the server
            raise
        finally:
            timer.cancel()
            conn.pending.pop(request_id, None)
            progress.inflight -= 1
            progress.activity()
            if rec is not None:
                if status != S_OK:
                    rec.errors += 1
                if timed:
                    buf = rec.buffer
                    buf.extend((perf_ns() - t0, t1 - t0, len(body), len(payload) if status >= 0 and payload else 0))
                    if len(buf) > FOLD_AT:
                        rec.fold()
            if flags & F_TRACED and tracer is not None:
                parent_span = parent.frame.span_id if parent is not None else 0
                tracer.origin(name, t0 / 1e3 + self._epoch_offset_us, (perf_ns() - t0) / 1e3, trace_id, span_id,
                              parent_span, lamport, address, status)  # fmt: skip
        if status == S_OK:
            return unpack_body(payload)
        raise error_from_status_body(status, payload, name, provider_id, address)

    # -- bulk ----------------------------------------------------------------------------------------
    def expose(self, buffer: Any, mode: str = "r", *, peer: str | None = None) -> BulkHandle:
        """Expose ``buffer`` (bytes-like or C-contiguous numpy array) for remote pull ("r"), push ("w")
        or both ("rw"). Keep the buffer alive and unchanged in size until ``unexpose``.

        The handle is a capability (128 random bits): whoever holds it may move its bytes. With ``peer``
        (the address of the server it is given to) only that server, over the connection this engine
        dialled to it, may use it, and the handle is revoked when that connection ends (issue 13).

        Raises:
            BulkUsageError: not a contiguous buffer, read-only with a writable mode, or an unknown mode.
        """
        if mode not in MODES:
            raise BulkUsageError(f"bulk mode {mode!r}: expected one of {MODES}")
        view = as_byte_view(buffer, writable=WRITE in mode)
        bulk_id = secrets.token_bytes(BULK_ID_BYTES)
        self._exposed[bulk_id] = (view, mode, peer)
        return BulkHandle(self.address, self.engine_id, bulk_id, len(view), mode)

    def unexpose(self, handle: BulkHandle) -> None:
        """Stop serving ``handle``; transfers that start later fail with BulkError. A transfer already
        under way finishes with the buffer: do not reuse the buffer until it has (or its call failed)."""
        entry = self._exposed.pop(handle.bulk_id, None)
        if entry is not None:
            entry[0].release()

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
        """Read ``size`` bytes (default: the rest of the handle) from ``offset`` of the remote buffer
        into ``dest`` at ``dest_offset`` (a new bytearray when ``dest`` is None). Returns ``dest``.

        Raises:
            BulkUsageError (bad range or mode, checked locally), BulkError (refused by the owner), DeadlineExceeded, ConnectionLost.
        """
        size = handle.size - offset if size is None else size
        _check_range(handle, offset, size, READ)
        if dest is None and handle.engine_id != self.engine_id and size:
            lazy = _LazyDest(size)  # allocated once the owner answers
            await self._pull_into(handle, offset, size, lazy, timeout_seconds)  # type: ignore[arg-type]
            return lazy.result()
        if dest is None:
            dest = bytearray(size)
        view = as_byte_view(dest, writable=True)
        if dest_offset < 0 or dest_offset + size > len(view):
            raise BulkUsageError(f"destination of {len(view)} bytes cannot take {size} bytes at {dest_offset}")
        target = view[dest_offset : dest_offset + size]
        if handle.engine_id == self.engine_id:
            target[:] = self._local_source(handle, offset, size, READ)
            return dest
        await self._pull_into(handle, offset, size, target, timeout_seconds)
        return dest

    async def _pull_into(
        self, handle: BulkHandle, offset: int, size: int, target: memoryview, timeout_seconds: float | None
    ) -> None:
        """A remote pull into ``target`` (a memoryview, or a _LazyDest): cross-memory attach when it
        applies, else the socket."""
        if self.bulk_cma and size >= CMA_MIN_BYTES:
            loop = self._loop or asyncio.get_running_loop()
            deadline = loop.time() + (self.default_timeout_seconds if timeout_seconds is None else timeout_seconds)
            if await self._cma_pull(handle, offset, target, timeout_seconds):
                return
            timeout_seconds = deadline - loop.time()  # the socket path gets what is left, not the full time
            if timeout_seconds <= 0:
                raise DeadlineExceeded(f"pull of {size} bytes from {handle.address}: the deadline passed")
        status, payload = await self._bulk_op(handle, Kind.BULK_PULL, offset, size, target, None, timeout_seconds)
        if status != Status.OK:
            raise error_from_status_body(status, payload, "pull", 0, handle.address)

    async def push(
        self,
        handle: BulkHandle,
        src: Any,
        *,
        offset: int = 0,
        timeout_seconds: float | None = None,
    ) -> None:
        """Write all of ``src`` into the remote buffer at ``offset``.

        Raises:
            BulkUsageError (bad range or mode, checked locally), BulkError (refused by the owner), DeadlineExceeded, ConnectionLost.
        """
        view = as_byte_view(src, writable=False)
        size = len(view)
        _check_range(handle, offset, size, WRITE)
        if handle.engine_id == self.engine_id:
            self._local_source(handle, offset, size, WRITE)[:] = view
            return
        if self.bulk_cma and size >= CMA_MIN_BYTES:
            loop = self._loop or asyncio.get_running_loop()
            deadline = loop.time() + (self.default_timeout_seconds if timeout_seconds is None else timeout_seconds)
            if await self._cma_push(handle, offset, view, timeout_seconds):
                return
            timeout_seconds = deadline - loop.time()  # the socket path gets what is left, not the full time
            if timeout_seconds <= 0:
                raise DeadlineExceeded(f"push of {size} bytes to {handle.address}: the deadline passed")
        status, payload = await self._bulk_op(handle, Kind.BULK_PUSH, offset, size, None, view, timeout_seconds)
        if status != Status.OK:
            raise error_from_status_body(status, payload, "push", 0, handle.address)

    def _local_source(self, handle: BulkHandle, offset: int, size: int, need: str) -> memoryview:
        entry = self._exposed.get(handle.bulk_id)
        if entry is None or need not in entry[1] or offset + size > len(entry[0]):
            raise BulkError(f"bulk handle {_short(handle.bulk_id)} is not exposed for {need!r} here, or out of range")
        return entry[0][offset : offset + size]

    async def _cma_pull(
        self, handle: BulkHandle, offset: int, target: memoryview, timeout_seconds: float | None
    ) -> bool:
        """Pull by cross-memory attach when the owner is a process of this node on a unix connection: the
        owner checks the handle and answers with the range's address, then we read it into ``target`` (one
        kernel copy). False when that path is not available: the caller then pulls over the socket.

        Raises:
            BulkError etc.: the owner refused the handle (the socket path would be refused too).
        """
        loop = self._loop or asyncio.get_running_loop()
        start = loop.time()
        timeout = self.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        deadline = start + timeout
        conn = await self._peer_connection(handle, timeout)
        pid = conn.peer_pid
        if pid is None or not conn.peer_cma:
            return False
        status, payload = await self._bulk_op(
            handle, Kind.BULK_PULL, offset, len(target), None, None, deadline - loop.time(), by_cma=True
        )
        if status != Status.OK:
            if _cma_refused(status, payload):
                conn.peer_cma = False  # the owner cannot serve it: the socket from now on
                return False
            raise error_from_status_body(status, payload, "pull", 0, handle.address)
        address = unpack_body(payload or b"")
        if not isinstance(address, int) or address <= 0:
            raise RemoteProtocolError(f"a cross-memory pull was answered with {address!r:.40}, not an address")
        if isinstance(target, _LazyDest):
            target = target.materialize()  # the owner answered: now the destination is allocated
        try:
            await _cma_copy(loop, conn, address, target, deadline)
        except OSError as exc:
            if exc.errno in _CMA_REFUSED:  # the kernel will keep refusing: the socket path from now on
                conn.peer_cma = False
                log.warning("cross-memory pull from pid %s refused (%s); this connection uses the socket", pid, exc)
            else:
                log.info("cross-memory pull from pid %s failed (%s); pulling over the socket", pid, exc)
            return False
        self.cma_bytes += len(target)
        self.monitor.record_bulk("cma_pull", conn.peer_label, len(target), int((loop.time() - start) * 1e9))
        return True

    async def _cma_push(self, handle: BulkHandle, offset: int, src: memoryview, timeout_seconds: float | None) -> bool:
        """Push by cross-memory attach when the owner is a process of this node on a unix connection: the
        owner reads ``src`` itself (no data frames). False when that path is not available or the owner's
        kernel refused: the caller then pushes over the socket.

        Raises:
            BulkError etc.: the owner refused the transfer (the socket path would be refused too).
        """
        conn = await self._peer_connection(handle, timeout_seconds or self.default_timeout_seconds)
        if not conn.peer_cma:
            return False
        status, payload = await self._bulk_op(
            handle, Kind.BULK_PUSH, offset, len(src), None, src, timeout_seconds, by_cma=True
        )
        if status == Status.OK:
            return True
        if _cma_refused(status, payload):
            conn.peer_cma = False  # the kernel refused the owner: the socket from now on
            return False
        raise error_from_status_body(status, payload, "push", 0, handle.address)

    async def _peer_connection(self, handle: BulkHandle, timeout_seconds: float) -> Connection:
        """The connection to the handle's owner. Inside a handler, a handle of the caller's own engine is
        reached over the connection the caller called on: the transfer is made on behalf of whoever
        presented the handle, never of another peer that merely claims the same engine id in its HELLO
        (issue 13). Otherwise: a connection we dialled, or an authenticated accepted one, to that engine;
        else the handle's address is dialled and the engine found there must be the owner."""
        req = current_request.get()
        if req is not None:
            conn = req[1]
            if conn.peer_engine_id == handle.engine_id and not conn.closed:
                return conn
            if not self.allow_third_party_bulk:  # no confused deputy: a caller cannot aim us at another engine
                raise BulkError(
                    f"the bulk handle belongs to engine {handle.engine_id[:8]}…, not to the caller "
                    f"({(conn.peer_engine_id or '?')[:8]}…): a handler moves bulk data only for the caller that "
                    "exposed it (engine.allow_third_party_bulk allows handles passed on by others)"
                )
        conn = self._peers.get(handle.engine_id)
        if conn is not None and not conn.closed:
            return conn
        if handle.address is None:
            raise BulkError("the bulk handle's owner has no address and no connection to us")
        conn = await self.connection(handle.address, timeout_seconds)
        if conn.peer_engine_id != handle.engine_id:
            raise BulkError(f"the engine at {handle.address} no longer owns this bulk handle (it restarted)")
        return conn

    async def _bulk_op(
        self,
        handle: BulkHandle,
        kind: Kind,
        offset: int,
        size: int,
        dest: memoryview | None,
        src: memoryview | None,
        timeout_seconds: float | None,
        *,
        by_cma: bool = False,
    ) -> tuple[int, Any]:
        """Send a BULK_PULL or BULK_PUSH and wait for its completion. A push sends its data frames, or with
        ``by_cma`` the address of ``src`` for the owner to read; a pull with ``by_cma`` asks for the
        range's address instead of its data."""
        loop = self._loop or asyncio.get_running_loop()
        timeout = self.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        start = loop.time()
        conn = await self._peer_connection(handle, timeout)
        request_id = conn.next_request_id()
        future: asyncio.Future[tuple[int, Any]] = loop.create_future()
        pending = _Pending(future)
        pending.dest = dest
        if conn.closed:
            raise conn.close_reason or ConnectionLost(f"connection to {handle.address} is closed")
        conn.pending[request_id] = pending
        self.progress.inflight += 1
        self.progress.activity()
        timer = loop.call_at(start + timeout, _expire, future)
        deadline_usec = wire_deadline(timeout - (loop.time() - start))
        if by_cma:  # a pull asks for the range's address; a push gives its source's (kept until answered)
            fields = (
                [handle.bulk_id, offset, size]
                if src is None
                else [handle.bulk_id, offset, size, cma.buffer_address(src)]
            )
            body = pack_body(fields)
            header = encode_frame(kind, request_id, body, deadline_usec=deadline_usec, flags=F_CMA)
        else:
            header = encode_frame(
                kind, request_id, pack_body([handle.bulk_id, offset, size]), deadline_usec=deadline_usec
            )
        try:
            if src is None or by_cma:
                conn.send(header)
            else:
                await self._send_chunks(conn, Kind.BULK_DATA_PUSH, request_id, src, header, future)
            return await future
        except _DeadlineExpired:
            if not conn.closed:
                conn.send(encode_frame(Kind.CANCEL, request_id))
            raise DeadlineExceeded(f"bulk {kind.name} of {size} bytes: no completion within {timeout:g} s") from None
        except asyncio.CancelledError:
            if not conn.closed:
                conn.send(encode_frame(Kind.CANCEL, request_id))
            raise
        finally:
            timer.cancel()
            conn.pending.pop(request_id, None)
            self.progress.inflight -= 1
            self.progress.activity()
            if not (by_cma and kind == Kind.BULK_PULL):  # a cross-memory pull is recorded with its copy
                what = ("cma_" if by_cma else "") + ("pull" if kind == Kind.BULK_PULL else "push")
                self.monitor.record_bulk(what, conn.peer_label, size, int((loop.time() - start) * 1e9))

    async def _send_chunks(
        self,
        conn: Connection,
        kind: Kind,
        request_id: int,
        src: memoryview,
        first: bytes | None,
        until: asyncio.Future[Any] | None,
    ) -> None:
        """Send ``src`` as data frames of at most bulk_chunk_bytes, respecting write backpressure."""
        chunk = self.bulk_chunk_bytes
        size = len(src)
        if first is not None:
            conn.send(first)
        for pos in range(0, size, chunk):
            if conn.closed or (until is not None and until.done()):
                return
            await conn.drain()  # before each chunk: concurrent transfers share the buffer
            if conn.closed or (until is not None and until.done()):
                return
            part = src[pos : pos + chunk]
            conn.send_many((encode_header(kind, request_id, len(part)), part))

    # -- ConnectionOwner: incoming frames ---------------------------------------------------------------
    def admit(self, conn: Connection) -> str | None:
        """An accepted connection counts against ``max_connections`` and, over tcp, ``max_connections_per_host``.
        Over a cap, the oldest connection of that scope still in its handshake is dropped to make room (it
        has proved nothing; a flood of them never locks a new client out for more than one handshake
        timeout), else the longest-idle unauthenticated one with no call in flight (its engine redials when
        it needs to); when none is left, the new connection is refused.
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
            if victim is None:
                now = time.monotonic()
                if now - self._last_refusal_log >= 1.0:
                    self._last_refusal_log = now
                    log.warning("refusing connections (from %s): %d connections, caps %d total / %d per host",
                                conn.peername, self._accepted, self.max_connections, self.max_connections_per_host)  # fmt: skip
                return (f"too many connections ({self._accepted}; caps: {self.max_connections} in all, "
                        f"{self.max_connections_per_host} per host): try again later")  # fmt: skip
            self._release(victim)
            victim.abort(ConnectionLost("evicted: a connection cap was reached during its handshake"), expected=True)
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
        for task in list(conn.serving.values()):
            if isinstance(task, asyncio.Task):
                task.cancel()  # nobody can receive the answer any more
        conn.serving.clear()

    def _fail_pending(self, conn: Connection, error: RPCError) -> None:
        pending, conn.pending = conn.pending, {}
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(error)

    def on_frames(self, conn: Connection, frames: list[Frame]) -> None:
        self.progress.activity()
        arrival_ns = perf_ns()
        arrival = self._loop.time()  # type: ignore[union-attr]  # the batch's arrival, in loop time (deadlines)
        for frame in frames:
            kind = frame[0]
            if kind == K_RESPONSE:
                p = conn.pending.get(frame[4])
                if p is not None and not p.future.done():
                    p.future.set_result((frame[6], frame[13]))
            elif kind == K_REQUEST:
                self._on_request(conn, frame, arrival_ns, arrival)
            elif kind == K_BULK_DATA_PUSH:
                self._on_push_data(conn, frame)
            elif kind == K_BULK_DATA_REPLY:
                pass  # already written into the destination by bulk_sink
            elif kind == K_BULK_PULL:
                self._on_pull_request(conn, frame)
            elif kind == K_BULK_PUSH:
                self._on_push_request(conn, frame)
            elif kind == K_CANCEL:
                task = conn.serving.get(frame.request_id)
                if isinstance(task, asyncio.Task):
                    task.cancel()
            elif kind == K_GOODBYE:
                conn.close_reason = goodbye_error(conn, frame)
                conn.close()
            else:
                raise RemoteProtocolError(f"unexpected frame kind {kind} after the handshake")

    def _reply(self, conn: Connection, frame: Frame, status: int, body: bytes) -> None:
        if not frame.flags & F_NO_REPLY:
            conn.send(encode_frame(K_RESPONSE, frame.request_id, body, status=status))

    def _reply_error(self, conn: Connection, frame: Frame, status: int, message: str) -> None:
        self._reply(conn, frame, status, pack_body(message))

    def _on_request(self, conn: Connection, frame: Frame, arrival_ns: int, arrival: float) -> None:
        reg = self._table.get((frame[2], frame[3]))
        if reg is None or self._closing or self._refused:
            if self._refuse(conn, frame, reg):
                return
            assert reg is not None
        try:
            arg = unpack_body(frame[13])
        except ProtocolError as exc:
            raise self._bad_body(conn, frame, str(exc)) from None
        rec = None
        monitor = self.monitor
        if monitor.enabled:
            rec = conn.records.get(reg) if not frame[8] else None  # calls from outside any handler: no key tuple
            if rec is None:
                rec = self._target_record(frame, reg, conn)
            n = rec.calls = rec.calls + 1
            if n > ALWAYS_TIMED and n % monitor.sample_every:
                rec = None  # counted, not timed
        tracer = self.tracer
        start_ns = perf_ns() if rec is not None or tracer is not None else 0
        if tracer is not None:
            if frame[1] & F_TRACED:
                tracer.tick(frame.lamport)
            else:  # a tracing server starts the trace of an untraced call: its handler's calls join it (issue 15)
                frame = frame._replace(flags=frame[1] | F_TRACED, trace_id=new_trace_id(), span_id=new_span_id())
        req = _new_tuple(Request, (self, conn, reg, frame, arrival))
        loop = self._loop
        assert loop is not None
        if reg.is_coroutine:  # its task copies this context: the request travels in the contextvar
            token = _task_request.set(req)
            try:
                coro = reg.handler(req, arg)
                task = loop.create_task(self._run_async(conn, frame, reg, arrival_ns, start_ns, rec, coro))
            except Exception as exc:
                self._finish_error(conn, frame, reg, exc)
                return
            finally:
                _task_request.reset(token)
            self._track_task(conn, frame, reg, req, task, coro)
            return
        sync = _sync
        sync.request = req
        try:
            result = reg.handler(req, arg)
            if result is None or type(result) in _PLAIN or not inspect.isawaitable(result):
                if (
                    start_ns
                    or frame[1] & F_NO_REPLY
                    or not (result is None or (type(result) is bytes and len(result) <= _SMALL_RESULT_BYTES))
                ):
                    self._finish(conn, frame, reg, arrival_ns, start_ns, rec, result)
                else:  # the common case, untimed and untraced: None or small bytes, answered here
                    body = _NIL if result is None else _pack_bytes(result)
                    conn.send(_RESPONSE_OK.pack(_RESPONSE_OK_PREFIX, len(body), frame[4], 0, 0) + body)
                return
            token = _task_request.set(req)  # a sync handler returned an awaitable: it runs as a task
            try:
                task = loop.create_task(self._run_async(conn, frame, reg, arrival_ns, start_ns, rec, result))
            finally:
                _task_request.reset(token)
        except Exception as exc:
            self._finish_error(conn, frame, reg, exc)
            return
        finally:
            sync.request = None
        self._track_task(conn, frame, reg, req, task, result)

    def _track_task(
        self, conn: Connection, frame: Frame, reg: Registration, req: Request, task: asyncio.Task[Any], result: Any
    ) -> None:
        """Bookkeeping of a handler running as a task: cancellation by CANCEL or its deadline, backpressure."""
        loop = self._loop
        assert loop is not None
        task.svcframe_provider_id = reg.provider_id  # type: ignore[attr-defined]
        task.svcframe_frame = frame  # type: ignore[attr-defined]
        self._tasks.add(task)
        conn.serving[frame.request_id] = task
        if len(conn.serving) >= self.max_inflight_per_connection:
            conn.pause_reading()  # backpressure: this peer's further requests wait in its socket buffer
        self.progress.inflight += 1
        deadline = req.deadline
        if deadline is not None and deadline <= loop.time():  # it waited past its deadline (behind a blocking
            _expire_handler(task)  # handler): dropped before its first step, answered DROPPED by _task_done
        timer = loop.call_at(deadline, _expire_handler, task) if deadline is not None else None
        task.add_done_callback(lambda t: self._task_done(conn, frame.request_id, t, timer, result))

    def _bad_body(self, conn: Connection, frame: Frame, problem: str) -> RemoteProtocolError:
        """A well-framed request or bulk request whose body a conforming peer never sends (malformed or
        non-strict msgpack) is a bad frame: answer it with BAD_REQUEST (a buggy client learns why) and send a
        GOODBYE. The caller raises the error returned: the transport then writes what this batch produced,
        drops the connection, dispatches none of the peer's later frames and logs one warning naming the
        peer and the problem."""
        self._reply_error(conn, frame, Status.BAD_REQUEST, problem)
        conn.send(encode_frame(K_GOODBYE, 0, pack_body(f"bad frame: {problem}"), status=Status.BAD_REQUEST))
        if problem.startswith("map key "):  # the log names the problem, never the body (the key's repr)
            problem = "map key is a " + problem.rpartition(" is a ")[2]
        return RemoteProtocolError(
            f"bad {Kind(frame[0]).name} body ({len(frame[13] or b'')} bytes, request {frame[4]}): {problem}"
        )

    def _refuse(self, conn: Connection, frame: Frame, reg: Registration | None) -> bool:
        """Answer a request that will not run (unknown target, shutting down, provider removed)."""
        if reg is None:
            status = Status.NO_SUCH_RPC if frame.provider_id in self._providers else Status.NO_SUCH_PROVIDER
            self._reply_error(conn, frame, status, "")
        elif self._closing:
            self._reply_error(conn, frame, Status.SHUTTING_DOWN, "the server is shutting down")
        elif frame.provider_id in self._refused:
            self._reply_error(conn, frame, Status.REFUSED, self._refused[frame.provider_id])
        else:
            return False
        return True

    def _task_done(
        self,
        conn: Connection,
        request_id: int,
        task: asyncio.Task[Any],
        deadline: asyncio.TimerHandle | None,
        handler_result: Any,
    ) -> None:
        if deadline is not None:
            deadline.cancel()
        if inspect.iscoroutine(handler_result):
            if (
                task.cancelled()
                and inspect.getcoroutinestate(handler_result) == inspect.CORO_CREATED
                and not conn.closed
                and conn.serving.get(request_id) is task
            ):  # cancelled before its first step: nothing ran and nothing answered yet
                frame = task.svcframe_frame  # type: ignore[attr-defined]
                self._count_error(conn, frame, self._table.get((frame[2], frame[3])))
                if self._closing:
                    self._reply_error(conn, frame, Status.SHUTTING_DOWN, "the server shut down before it ran")
                elif getattr(task, "svcframe_deadline_passed", False):
                    self._reply_error(conn, frame, Status.DROPPED, "the deadline passed before the handler ran")
                else:
                    self._reply_error(conn, frame, Status.CANCELLED, "the request was cancelled before it ran")
            handler_result.close()  # cancelled before it first ran: never awaited, so close it (no-op otherwise)
        self._tasks.discard(task)
        if conn.serving.get(request_id) is task:
            del conn.serving[request_id]
        if conn.reading_paused and len(conn.serving) <= self.max_inflight_per_connection // 2:
            conn.resume_reading()
        self.progress.inflight -= 1
        self.progress.activity()

    async def _run_async(
        self,
        conn: Connection,
        frame: Frame,
        reg: Registration,
        arrival_ns: int,
        start_ns: int,
        rec: Any,
        aw: Awaitable[Any],
    ) -> None:
        try:
            result = await aw
        except asyncio.CancelledError:
            self._count_error(conn, frame, reg)  # no result: by its deadline, its caller's CANCEL or a shutdown
            if not conn.closed:
                if self._closing:
                    self._reply_error(
                        conn, frame, Status.SHUTTING_DOWN, "the server shut down before the handler finished"
                    )
                elif getattr(asyncio.current_task(), "svcframe_deadline_passed", False):
                    if inspect.iscoroutine(aw) and inspect.getcoroutinestate(aw) == inspect.CORO_CREATED:
                        self._reply_error(conn, frame, Status.DROPPED, "the deadline passed before the handler ran")
                    else:  # it ran: whatever it changed may have been applied
                        self._reply_error(conn, frame, Status.DEADLINE_EXCEEDED, "the deadline passed as it ran")
                else:
                    self._reply_error(conn, frame, Status.CANCELLED, "the request was cancelled (caller or deadline)")
            raise
        except Exception as exc:
            self._finish_error(conn, frame, reg, exc)
        else:
            self._finish(conn, frame, reg, arrival_ns, start_ns, rec, result)

    def _finish(
        self, conn: Connection, frame: Frame, reg: Registration, arrival_ns: int, start_ns: int, rec: Any, result: Any
    ) -> None:
        """Send the result. ``rec`` is the statistics record when this call is timed (else None)."""
        end_ns = perf_ns() if start_ns else 0
        large = False
        try:
            if result is None:
                body = _NIL
            elif type(result) is bytes:  # msgpack cannot fail on bytes: no verification needed
                large = len(result) >= ZERO_COPY_BYTES  # then sent as it is, not copied
                body = bin_header(len(result)) if large else _pack_bytes(result)
            else:
                body = pack_body(result)
            body_len = len(body) + len(result) if large else len(body)
            if body_len > conn.peer_max_body_bytes:
                raise LocalProtocolError(
                    f"the result of {reg.name!r} encodes to {body_len} bytes, over the {conn.peer_max_body_bytes}-"
                    "byte limit of the caller (its engine.max_body_bytes, or Engine(max_body_bytes=...)): the "
                    "caller can raise that limit, or expose a buffer the handler pushes the data into"
                )
        except ProtocolError as exc:
            self._finish_error(conn, frame, reg, exc)
            return
        if not frame[1] & F_NO_REPLY:
            if large:
                conn.send_many((_RESPONSE_OK.pack(_RESPONSE_OK_PREFIX, body_len, frame[4], 0, 0) + body, result))
            else:
                conn.send(_RESPONSE_OK.pack(_RESPONSE_OK_PREFIX, body_len, frame[4], 0, 0) + body)
        if rec is not None:
            buf = rec.buffer
            sent_ns = perf_ns()
            buf.extend((start_ns - arrival_ns, end_ns - start_ns, sent_ns - end_ns, len(frame[13] or b""), body_len))
            if len(buf) > FOLD_AT:
                rec.fold()
        tracer = self.tracer
        if tracer is not None:  # the trace and span of an untraced call were started in _on_request
            traced = frame[1] & F_TRACED
            tracer.target(reg.name, start_ns / 1e3 + self._epoch_offset_us, (end_ns - start_ns) / 1e3,
                          frame.trace_id if traced else new_trace_id(), frame.span_id if traced else new_span_id(),
                          tracer.lamport, conn.peer_label)  # fmt: skip

    def _target_record(self, frame: Frame, reg: Registration, conn: Connection) -> Any:
        key = (frame.parent_rpc_id, frame.parent_provider_id, reg.rpc_id, reg.provider_id, conn.peer_label)
        rec = self.monitor.target.get(key) or self.monitor.target_record(key)
        if not frame.parent_rpc_id:
            conn.records[reg] = rec
        return rec

    def _finish_error(self, conn: Connection, frame: Frame, reg: Registration, exc: BaseException) -> None:
        """Answer a handler's exception: a refusal or an ``AppError`` as the status the errors table gives
        (svcframe.errors.status_for), anything else as HANDLER_ERROR with the type and message, and the
        traceback only to an authenticated peer or when ``send_tracebacks`` is set (it names server paths).
        Unexpected exceptions are logged here, at most one traceback per RPC a second."""
        status = status_for(exc)
        if status == Status.APP_ERROR:
            assert isinstance(exc, AppError)
            try:
                body = pack_body([exc.code, exc.message, exc.details])
            except ProtocolError:
                body = pack_body([exc.code, exc.message, None])
            self._reply(conn, frame, Status.APP_ERROR, body)
        elif status != Status.HANDLER_ERROR:
            self._reply_error(conn, frame, status, str(exc))
            return
        else:
            tb = "".join(traceback.format_exception(exc)) if conn.authenticated or self.send_tracebacks else ""
            self._reply(
                conn, frame, Status.HANDLER_ERROR, pack_body([type(exc).__qualname__, str(exc)[:10000], tb[-20000:]])
            )
            now = time.monotonic()
            if now - reg.last_logged >= 1.0:
                reg.last_logged = now
                log.error("handler %r of provider %d failed (peer %s)", reg.name, reg.provider_id, conn.peer_label,
                          exc_info=exc)  # fmt: skip
        self._count_error(conn, frame, reg)

    def _count_error(self, conn: Connection, frame: Frame, reg: Registration | None) -> None:
        """One more error in the target statistics of the call ``frame`` (failed, dropped, cancelled)."""
        if self.monitor.enabled and reg is not None:
            key = (frame.parent_rpc_id, frame.parent_provider_id, reg.rpc_id, reg.provider_id, conn.peer_label)
            (self.monitor.target.get(key) or self.monitor.target_record(key)).errors += 1

    # -- serving bulk transfers (no user code runs here) ------------------------------------------------
    def _bulk_request(
        self, conn: Connection, frame: Frame, need: str
    ) -> tuple[memoryview | None, str | None, int, int | None]:
        """Parse a BULK_PULL / BULK_PUSH body ``[bulk id, offset, size]`` (a push flagged CMA adds the
        address of the pusher's source) and find the exposed range: (view or None, error or None, size,
        source address or None)."""
        by_cma = bool(frame[1] & F_CMA) and frame[0] == K_BULK_PUSH
        try:
            fields = unpack_body(frame.body or b"")
            if (
                not isinstance(fields, list)
                or len(fields) != (4 if by_cma else 3)
                or not isinstance(fields[0], bytes)
                or not all(isinstance(v, int) for v in fields[1:])
                or min(fields[1:]) < 0
            ):
                raise ValueError
        except (ProtocolError, ValueError, TypeError) as exc:
            why = str(exc) if isinstance(exc, ProtocolError) else "expected [bulk id (bytes), offset >= 0, size >= 0]"
            raise self._bad_body(conn, frame, f"malformed bulk request: {why}") from None
        bulk_id, offset, size = fields[:3]
        source = fields[3] if by_cma else None
        entry = self._exposed.get(bulk_id)
        if entry is None:
            return None, f"bulk handle {_short(bulk_id)} is not exposed (revoked, or never existed)", size, source
        view, mode, bound = entry
        if bound is not None and self._conns.get(bound) is not conn:
            return None, f"bulk handle {_short(bulk_id)} is bound to another peer", size, source
        if need not in mode:
            return (
                None,
                f"bulk handle {_short(bulk_id)} is exposed as {mode!r}, not for {'pull' if need == READ else 'push'}",
                size,
                source,
            )
        if offset + size > len(view):
            return None, f"range {offset}+{size} is outside the {len(view)}-byte bulk buffer", size, source
        return view[offset : offset + size], None, size, source

    def _on_pull_request(self, conn: Connection, frame: Frame) -> None:
        view, error, size, _ = self._bulk_request(conn, frame, READ)
        if view is None:
            self._reply_error(conn, frame, Status.BULK_ERROR, error or "")
            return
        if frame[1] & F_CMA:  # the puller reads the range itself (svcframe.cma): answer with its address
            if conn.peer_pid is None or not self.bulk_cma:
                self._reply_error(conn, frame, Status.BULK_ERROR, "cma: not available on this connection")
            else:
                self.monitor.record_bulk("served_cma_pull", conn.peer_label, size, 0)
                self._reply(conn, frame, Status.OK, pack_body(cma.buffer_address(view)))
            return
        self.monitor.record_bulk("served_pull", conn.peer_label, size, 0)
        if size <= self.bulk_chunk_bytes and not conn.writing_paused:  # small, and room to write: inline
            if size:
                conn.send_many((encode_header(Kind.BULK_DATA_REPLY, frame.request_id, size), view))
            self._reply(conn, frame, Status.OK, b"")
            return
        task = asyncio.get_running_loop().create_task(self._serve_pull(conn, frame, view))
        self._tasks.add(task)
        conn.serving[frame.request_id] = task
        task.add_done_callback(self._tasks.discard)

    async def _serve_pull(self, conn: Connection, frame: Frame, view: memoryview) -> None:
        try:
            await self._send_chunks(conn, Kind.BULK_DATA_REPLY, frame.request_id, view, None, None)
        except ConnectionLost:
            return
        finally:
            conn.serving.pop(frame.request_id, None)
        self._reply(conn, frame, Status.OK, b"")

    def _on_push_request(self, conn: Connection, frame: Frame) -> None:
        view, error, size, source = self._bulk_request(conn, frame, WRITE)
        if source is not None:
            self._serve_cma_push(conn, frame, view, error, source)
            return
        incoming = _IncomingPush(view, error, frame, size)
        if size == 0:
            self._reply_push(conn, incoming)
            return
        pushes = conn.state.setdefault("pushes", {})
        if len(pushes) >= self.max_inflight_per_connection:
            raise RemoteProtocolError(
                f"more than {self.max_inflight_per_connection} bulk pushes announced and not sent on one connection"
            )
        if error:
            self._reply_push(conn, incoming)  # refused at once; only its byte count is kept, to discard its data
            refused = conn.state.setdefault("refused_pushes", {})
            refused[frame.request_id] = size
            if len(refused) > self.max_inflight_per_connection:
                del refused[next(iter(refused))]  # the oldest: its data, if it ever comes, is a protocol error
            return
        pushes[frame.request_id] = incoming
        self.monitor.record_bulk("served_push", conn.peer_label, size, 0)

    def _serve_cma_push(
        self, conn: Connection, frame: Frame, view: memoryview | None, error: str | None, source: int
    ) -> None:
        """A push by cross-memory attach: read the pusher's source (its pid from the kernel, the address
        from its request) into the exposed range, then answer. Errors starting with "cma:" tell the pusher
        to send the data over the socket instead."""
        if view is None:
            self._reply_error(conn, frame, Status.BULK_ERROR, error or "")
            return
        pid = conn.peer_pid
        if pid is None or not self.bulk_cma:
            self._reply_error(conn, frame, Status.BULK_ERROR, "cma: not available on this connection")
            return
        loop = self._loop or asyncio.get_running_loop()

        deadline = loop.time() + frame[5] / 1e6 if frame[5] else None

        async def serve() -> None:
            try:
                await _cma_copy(loop, conn, source, view, deadline)
            except DeadlineExceeded as exc:  # first: a deadline is never a kernel refusal (issue 12)
                self._reply_error(conn, frame, Status.DEADLINE_EXCEEDED, str(exc))
                return
            except OSError as exc:
                self._reply_error(conn, frame, Status.BULK_ERROR, f"cma: {exc}")
                return
            finally:
                conn.serving.pop(frame.request_id, None)
            self.cma_bytes += len(view)
            self.monitor.record_bulk("served_cma_push", conn.peer_label, len(view), 0)
            self._reply(conn, frame, Status.OK, b"")

        task = loop.create_task(serve())
        self._tasks.add(task)
        conn.serving[frame.request_id] = task
        task.add_done_callback(self._tasks.discard)

    def _on_push_data(self, conn: Connection, frame: Frame) -> None:
        pushes = conn.state.get("pushes", {})
        incoming = pushes.get(frame.request_id)
        if incoming is not None and incoming.cursor >= incoming.size:
            del pushes[frame.request_id]
            self._reply_push(conn, incoming)

    def _reply_push(self, conn: Connection, incoming: _IncomingPush) -> None:
        if incoming.error:
            self._reply_error(conn, incoming.frame, Status.BULK_ERROR, incoming.error)
        else:
            self._reply(conn, incoming.frame, Status.OK, b"")

    def bulk_sink(self, conn: Connection, kind: int, request_id: int, length: int) -> memoryview:
        """Where a bulk data frame's bytes go (called by the decoder before receiving them)."""
        if kind == Kind.BULK_DATA_REPLY:
            p = conn.pending.get(request_id)
            if p is None or p.dest is None:
                return self._discard(length)  # a transfer we gave up on: drop its late data
            end = p.cursor + length
            if end > len(p.dest):
                raise RemoteProtocolError(f"peer sent {end} bytes for a {len(p.dest)}-byte pull")
            view = p.dest[p.cursor : end]
            p.cursor = end
            return view
        incoming = conn.state.get("pushes", {}).get(request_id)
        if incoming is None:
            refused = conn.state.get("refused_pushes", {})
            remaining = refused.get(request_id)
            if remaining is None or length > remaining:
                raise RemoteProtocolError(f"push data for unknown request {request_id}")
            if remaining == length:
                del refused[request_id]
            else:
                refused[request_id] = remaining - length
            return self._discard(length)  # data of a refused push (answered already)
        end = incoming.cursor + length
        size = incoming.size
        if end > size:
            raise RemoteProtocolError(f"peer pushed {end} bytes for a {size}-byte push")
        start, incoming.cursor = incoming.cursor, end
        if incoming.dest is None:
            return self._discard(length)
        return incoming.dest[start:end]

    def _discard(self, length: int) -> memoryview:
        """Scratch space for bulk data nobody waits for (length <= max_body_bytes, checked by the decoder)."""
        if len(self._scratch) < length:
            self._scratch = memoryview(bytearray(length))
        return self._scratch[:length]

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


class _DeadlineExpired(Exception):
    """Set on a pending call's future by its deadline timer (turned into DeadlineExceeded by the caller)."""


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(_DeadlineExpired())


_MAX_WIRE_DEADLINE_USEC = 0xFFFF_FFFF  # the header's 32-bit deadline: about 71 minutes


#: Distinct peers the statistics keep records for; later ones are counted under "other" (issue 13).
MAX_PEER_LABELS = 1024


def _short(bulk_id: object) -> str:
    """A bulk id in messages and logs: its first 4 bytes in hex (enough to tell handles apart, not to use one)."""
    return bulk_id[:4].hex() + "…" if isinstance(bulk_id, bytes) else repr(bulk_id)[:20]


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


def wire_deadline(remaining_seconds: float) -> int:
    """The header's ``deadline_usec`` for a caller that waits ``remaining_seconds`` more: at least 1 µs;
    0 ("no deadline") beyond what 32 bits of microseconds hold, so a longer wait is never cut short by the
    server (the caller's own timer still ends the call)."""
    usec = int(remaining_seconds * 1e6)
    return max(1, usec) if usec <= _MAX_WIRE_DEADLINE_USEC else 0


def _expire_handler(task: asyncio.Task[Any]) -> None:
    """The caller's deadline passed: stop its handler, answered as DEADLINE_EXCEEDED."""
    task.svcframe_deadline_passed = True  # type: ignore[attr-defined]
    task.cancel()


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # a dial nobody awaited any more: its error is not "never retrieved"


#: Same-node transfers of at least this size use cross-memory attach; smaller ones are cheaper over the
#: socket (the address round trip and the pid check cost about what copying 64 KiB twice does).
CMA_MIN_BYTES = 256 * 1024
#: errno values after which a connection stops trying cross-memory attach (permission, no such process,
#: not implemented); other errors (EFAULT: a stale handle) only fall back for that one transfer.
_CMA_REFUSED = frozenset({1, 3, 38})
#: Copies up to this size run on the event loop (a few hundred µs at most); larger ones in a worker thread,
#: in pieces of _CMA_PIECE_BYTES with the deadline checked between them.
_CMA_INLINE_BYTES = 8 * 1024 * 1024
_CMA_PIECE_BYTES = 8 * 1024 * 1024


def _cma_refused(status: int, payload: Any) -> bool:
    """A BULK_ERROR whose message starts with "cma:": the owner cannot take part in cross-memory attach
    on this connection (the transfer itself may still go over the socket)."""
    return status == Status.BULK_ERROR and str(unpack_body(payload or b"")).startswith("cma:")


async def _cma_copy(
    loop: asyncio.AbstractEventLoop, conn: Connection, address: int, dest: memoryview, deadline: float | None
) -> None:
    """``cma.read`` inline when small, else piece by piece in the loop's default executor (the copy
    releases the GIL). Nothing is written into ``dest`` after this returns or raises.

    Raises:
        OSError (see cma.read); DeadlineExceeded when ``deadline`` (loop time) passes between two pieces.
    """
    pid = conn.peer_pid
    if pid is None or cma.start_time(pid) != conn.peer_start_time:
        raise OSError(3, f"the peer's process {pid} is gone (its pid may now be another process's)")  # ESRCH
    size = len(dest)
    if size <= _CMA_INLINE_BYTES:
        cma.read(pid, address, dest)
        return
    for pos in range(0, size, _CMA_PIECE_BYTES):
        if deadline is not None and loop.time() > deadline:
            raise DeadlineExceeded(f"cross-memory transfer of {size} bytes: the deadline passed after {pos} bytes")
        await loop.run_in_executor(None, cma.read, pid, address + pos, dest[pos : pos + _CMA_PIECE_BYTES])


def _check_range(handle: BulkHandle, offset: int, size: int, need: str) -> None:
    if need not in handle.mode:
        raise BulkUsageError(
            f"bulk handle is exposed as {handle.mode!r}; it cannot be {'pulled' if need == READ else 'pushed'}"
        )
    if offset < 0 or size < 0 or offset + size > handle.size:
        raise BulkUsageError(f"range {offset}+{size} is outside the {handle.size}-byte bulk handle")


def error_from_status_body(status: int, payload: Any, name: str, provider_id: int, address: str | None) -> RPCError:
    """The exception for a non-OK response whose body is ``payload`` (msgpack): svcframe.errors' table."""
    try:
        info = unpack_body(payload or b"")
    except ProtocolError:
        info = None
    return error_from_status(status, info, name, provider_id, address)
