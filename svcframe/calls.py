"""Outgoing calls: a request to a provider of another engine, its deadline, its retries, its answer.

``Engine.call`` encodes the argument (msgpack), sends one REQUEST frame carrying the remaining time budget,
the callpath of the handler it is made from (``svcframe.request.current_request``) and, when tracing, the
trace context, and waits for the RESPONSE or the deadline, whichever comes first. Only calls marked
``idempotent`` are ever sent again (on a lost connection or a server shutting down), always within the
deadline. A non-OK answer becomes an exception through ``svcframe.errors.error_from_status``.

``Calls`` is the engine's part that makes them (``svcframe.engine.Engine`` holds one): it owns the root
callpaths it has computed; what it needs of the rest of the engine is given to it when it is made.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .bulk_handles import as_byte_view
from .cma import CMA_MIN_BYTES
from .deadlines import DeadlineExpired, Deadlines
from .errors import (
    AuthenticationFailed,
    ConnectionLost,
    DeadlineExceeded,
    LocalProtocolError,
    ResultTooLarge,
    ShuttingDown,
    Status,
    error_from_status,
)
from .monitoring import ALWAYS_TIMED, FOLD_AT, Monitor
from .protocol import IncomingPull
from .registration import RegistrationTable, row_key
from .request import _sync, _task_request
from .tracing import Tracer, new_span_id, new_trace_id
from .wire import ZERO_TRACE_ID, callpath_extend, pack_body, request_frame

try:
    import cython
except ModuleNotFoundError:  # interpreted where Cython is not installed
    from . import _cython as cython

if not cython.compiled:  # (compiled: wire.pxd's C constants)
    from .wire import F_CMA, F_IDEMPOTENT, F_INTO, F_TRACED, NO_PARENT_PROVIDER, S_OK

if TYPE_CHECKING:
    from .bulk import BulkTransfers
    from .connections import Connections
    from .monitoring import Record
    from .progress import Progress
    from .settings import EngineConfig
    from .split_read import SplitWrite
    from .transport import Connection

perf_ns = time.perf_counter_ns
_S_LENT = Status.LENT  # an into read's result lent by address (svcframe.bulk_serving._lend): not an error
_NIL = pack_body(None)  # the body of a call without an argument (a pack_body call per such call saved)


class Calls:
    """The engine's part that makes outgoing calls (see the module docstring).

    Args:
        table: the registration table (the RPC ids of names, and the names of ids, for the statistics).
        connections: where connections to other engines come from.
        bulk: the part that reads a result lent by address (``into=`` over ``unix://``).
        deadlines: the deadlines of the engine's outgoing operations.
        monitor, progress: the engine's statistics and progress loop.
        config: the engine's settings (``default_timeout_seconds``).
        bulk_cma: cross-memory attach is on for this engine (and supported here).

    Attributes:
        tracer: the engine's request tracer, or None (``Engine.set_tracing`` sets it).
    """

    def __init__(
        self,
        table: RegistrationTable,
        connections: Connections,
        bulk: BulkTransfers,
        deadlines: Deadlines,
        monitor: Monitor,
        progress: Progress,
        config: EngineConfig,
        bulk_cma: bool,
    ) -> None:
        self.table = table
        self._rpc_ids = table.ids  # (read once per call)
        self.connections = connections
        self._dialled = connections.dialled  # (read once per call)
        self.bulk = bulk
        self.deadlines = deadlines
        self.monitor = monitor
        self.progress = progress
        self.tracer: Tracer | None = None
        self.default_timeout_seconds = config.default_timeout_seconds
        self.bulk_cma = bulk_cma
        self._root_callpaths: dict[int, int] = {}  # the callpath of a call made outside any handler, by row_key
        self._loop: asyncio.AbstractEventLoop | None = None
        self._epoch_offset_us = time.time() * 1e6 - time.perf_counter_ns() / 1e3

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The engine started on ``loop``."""
        self._loop = loop

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
            into: a writable buffer (bytearray, memoryview, C-contiguous numpy array) that takes a bytes-like
                result as raw data, received straight into it: no copy, no allocation, one round trip (Margo's
                read pattern, a handler's bulk push into the caller's memory, without a bulk handle). The call
                then returns the number of bytes written at the start of ``into``; a handler that returns
                something that is not bytes-like has its result returned as usual. A result larger than
                ``into`` raises ResultTooLarge (``into`` may then hold the result's first bytes).

        Returns:
            A coroutine: ``await engine.call(...)`` gives the result. (``call`` itself is not a coroutine
            function, so a call costs one coroutine, not two.)

        Raises:
            DeadlineExceeded: the deadline passed; the handler may have run.
            ConnectionLost: the server could not be reached or went away (AuthenticationFailed: the secret).
            NoSuchProvider: nothing at ``provider_id``.
            NoSuchRPC: the provider has no RPC ``name``.
            AppError: the handler reported an expected failure.
            RemoteError: the handler raised unexpectedly.
            Refused: the server did not take the call (ShuttingDown, Overloaded...).
            Cancelled: the call was cancelled.
            LocalProtocolError: ``arg`` cannot be encoded.
        """
        if not idempotent:
            return self._call_once(address, name, arg, provider_id, timeout_seconds, 0, into)
        return self._call_retrying(address, name, arg, provider_id, timeout_seconds, max_attempts, into)

    async def _call_retrying(
        self,
        address: str,
        name: str,
        arg: Any,
        provider_id: int,
        timeout_seconds: float | None,
        max_attempts: int,
        into: Any,
    ) -> Any:
        loop = self._loop or asyncio.get_running_loop()
        timeout = self.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        deadline = loop.time() + timeout
        attempts = max(1, min(max_attempts, 5))
        for attempt in range(attempts):
            try:
                return await self._call_once(
                    address, name, arg, provider_id, deadline - loop.time(), F_IDEMPOTENT, into
                )
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
        into: Any = None,
    ) -> Any:
        timeout = self.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        call = self._begin(address, name, arg, provider_id, timeout, flags, into, None, 0.0, 0)
        if call is None:  # no open connection to ``address`` yet: its wait is part of the call's round trip
            loop = self._loop or asyncio.get_running_loop()
            start, connect_ns = loop.time(), perf_ns()
            conn = await self.connections.connection(address, timeout)
            call = self._begin(
                address, name, arg, provider_id, timeout, flags, into, conn, start, perf_ns() - connect_ns
            )
            assert call is not None
        status = -1
        payload: Any = None
        payload_bytes = 0
        try:
            status, payload, payload_bytes = await call.future
        except DeadlineExpired:
            call.conn.cancel(call.request_id)  # nobody waits any more: tell the server
            raise no_response(name, provider_id, address, timeout) from None
        except asyncio.CancelledError:
            call.conn.cancel(call.request_id)  # the caller gave up: tell the server
            raise
        finally:
            if call.offer is not None and status < 0:  # no answer: the server may still lend, and write its part
                await call.offer.settle()
            self._end(call, status, payload_bytes)
        if status == _S_LENT and call.flags & F_CMA:
            assert call.into is not None  # (flagged CMA: an into= call)
            return await self.bulk.take_lent(
                call.conn, address, call.request_id, payload, call.into, call.start + timeout, call.offer
            )
        if call.offer is not None:  # answered without a lend: the server will not write
            call.offer.drop()
        if status == S_OK:
            if call.into_pull is not None and call.into_pull.overflowed:
                raise too_large(name, provider_id, address, payload, len(call.into or b""))
            return payload  # (decoded by the connection's decoder or dispatch)
        raise error_from_status(status, payload, name, provider_id, address)

    def _begin(
        self,
        address: str,
        name: str,
        arg: Any,
        provider_id: int,
        timeout: float,
        flags: int,
        into: Any,
        conn: Connection | None,
        start: float,
        connect_ns: int,
    ) -> _Call | None:
        """A call's work before its answer: the request encoded and sent on ``conn`` (the open connection to
        ``address`` when None: None when there is none yet, nothing done), its future in the connection's
        table, its deadline set, its statistics begun. ``start``: loop time the call began (0: now)."""
        loop = self._loop or asyncio.get_running_loop()
        if conn is None:
            conn = self._dialled.get(address)
            if conn is None or conn.closed:
                return None
            start = loop.time()
            remaining = timeout
        else:
            remaining = timeout - (loop.time() - start)
        body = _NIL if arg is None else pack_body(arg)
        into_pull = None
        if into is not None:
            into = as_byte_view(into, writable=True)
            flags |= F_INTO
            if conn.peer_cma and len(into) >= CMA_MIN_BYTES and conn.peer_pid is not None and self.bulk_cma:
                # we can copy the result from the server's memory: one round trip, one copy (a smaller buffer is
                # cheaper over the socket)
                flags |= F_CMA
        if len(body) > conn.peer_max_body_bytes:
            raise LocalProtocolError(
                f"the argument of {name!r} encodes to {len(body)} bytes, over the {conn.peer_max_body_bytes}-byte "
                f"limit of {address}; pass large data as a bulk handle (engine.expose)"
            )
        rid = self._rpc_ids.get(name)
        if rid is None:
            rid = self.table.rpc_id(name)
        parent = _sync.request
        if parent is None:
            parent = _task_request.get()  # (current_request.get(), inlined)
        if parent is None:
            parent_rpc, parent_provider = 0, NO_PARENT_PROVIDER
            callpath = self._root_callpaths.get(row_key(provider_id, rid))
            if callpath is None:
                callpath = self._root_callpaths[row_key(provider_id, rid)] = callpath_extend(0, rid, provider_id)
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
        timed = False
        monitor = self.monitor
        if monitor.enabled:
            key = (parent_rpc, parent_provider, rid, provider_id, address)
            rec = monitor.origin.get(key)
            if rec is None:
                rec = monitor.origin_record(key)
                monitor.names[rid] = name
            rec.calls += 1
            timed = rec.calls <= ALWAYS_TIMED or not rec.calls % monitor.sample_every
        t0 = perf_ns() if timed or flags & F_TRACED else 0
        if conn.closed:  # closed (e.g. refused by the peer) after we got it: fail now, not at the deadline
            raise conn.close_reason or ConnectionLost(f"connection to {address} is closed")
        usec = int(remaining * 1_000_000)  # deadlines.wire_deadline, inlined (a call per RPC saved)
        deadline_usec = (usec if usec > 0 else 1) if usec <= 0xFFFF_FFFF else 0
        request_id = conn.next_request_id()
        future = loop.create_future()
        pending = conn.pending
        pending[request_id] = future
        request = request_frame(
            flags, provider_id, rid, request_id, deadline_usec, parent_provider, parent_rpc, callpath,
            trace_id, span_id, lamport, body,
        )  # fmt: skip
        offer = None
        if into is None:
            conn.send_request(request, len(pending) > 1)
        else:
            conn.protocol.pulls[request_id] = into_pull = IncomingPull(into, overflow_ok=True)
            if flags & F_CMA:  # the server may write part of a lent result itself (svcframe.bulk)
                offer = self.bulk.offer_write(conn, request_id, into, request)
            else:
                conn.send_request(request, len(pending) > 1)
        progress = self.progress
        progress.inflight += 1
        if not progress.blocking:
            progress.activity()
        self.deadlines.add(start + timeout, pending, request_id)
        call = _Call.__new__(_Call)
        call.conn, call.future, call.request_id, call.flags = conn, future, request_id, flags
        call.start, call.t0, call.t1, call.connect_ns = start, t0, perf_ns() if t0 else 0, connect_ns
        call.rec, call.timed, call.body_bytes, call.into, call.into_pull, call.offer = (
            rec,
            timed,
            len(body),
            into,
            into_pull,
            offer,
        )
        call.traced = None
        if tracer is not None or flags & F_TRACED:
            call.traced = (name, address, provider_id, trace_id, span_id, lamport,
                           parent.frame.span_id if parent is not None else 0, tracer)  # fmt: skip
        return call

    def _end(self, call: _Call, status: int, payload_bytes: int) -> None:
        """A call's work after its answer (``status``: -1 when there is none: a deadline, a cancellation, a lost
        connection): its future out of the connection's table, its statistics and trace recorded."""
        conn = call.conn
        conn.pending.pop(call.request_id, None)
        if call.into is not None:
            conn.protocol.pulls.pop(call.request_id, None)
        progress = self.progress
        progress.inflight -= 1
        if not progress.blocking:
            progress.activity()
        rec = call.rec
        if rec is not None:
            if status != S_OK and status != _S_LENT:
                rec.errors += 1
            if call.timed:
                buf = rec.buffer
                buf.extend((perf_ns() - call.t0 + call.connect_ns, call.t1 - call.t0, call.body_bytes,
                            payload_bytes if status >= 0 else 0))  # fmt: skip
                if len(buf) > FOLD_AT:
                    rec.fold()
        traced = call.traced
        if traced is not None and traced[7] is not None:
            name, address, provider_id, trace_id, span_id, lamport, parent_span, tracer = traced
            t0 = call.t0
            tracer.origin(name, t0 / 1e3 + self._epoch_offset_us, (perf_ns() - t0) / 1e3, trace_id, span_id,
                          parent_span, lamport, address, S_OK if status == _S_LENT else status, provider_id)  # fmt: skip


def no_response(name: str, provider_id: int, address: str, timeout: float) -> DeadlineExceeded:
    """The error of a call whose deadline passed without an answer."""
    return DeadlineExceeded(f"{name!r} (provider {provider_id}) at {address}: no response within {timeout:g} s")


def too_large(name: str, provider_id: int, address: str, size: int, room: int) -> ResultTooLarge:
    """The error of an into= call whose result (``size`` bytes) was larger than its buffer (``room`` bytes)."""
    return ResultTooLarge(
        f"{name!r} (provider {provider_id}) at {address}: the result is {size} bytes; the buffer given as into= "
        f"holds {room} (it may hold the result's first bytes)"
    )


class _Call:
    """A call under way (``Calls._begin``): what its ``await`` and its ending need."""

    conn: Connection
    future: asyncio.Future[tuple[int, Any, int]]
    request_id: int
    flags: int
    start: float
    t0: int
    t1: int
    connect_ns: int
    rec: Record | None
    timed: bool
    body_bytes: int
    into: memoryview | None
    into_pull: IncomingPull | None
    offer: SplitWrite | None
    traced: tuple[Any, ...] | None
