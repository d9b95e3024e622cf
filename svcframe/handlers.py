"""Running handlers: the server side of a call, from a decoded REQUEST frame to its RESPONSE.

A request is looked up in the registration table (``svcframe.registration``), its argument decoded, and
its handler run: a sync handler inline on the event loop (answered in the same received batch), an async
one (or a sync one that returns an awaitable) as a task, cancelled by the caller's CANCEL or its deadline.
The handler learns about its call from its ``Request`` (first argument) and, for nested calls, from
``current_request``. Errors become statuses through ``svcframe.errors.status_for``; a handler reports an
expected failure by raising an ``AppError``.

Deadlines are honest: a request whose handler never started is answered ``DROPPED`` (safe to
send again); once it started, ``DEADLINE_EXCEEDED`` (the outcome is unknown).

``Handlers`` is the engine's part that does this (``svcframe.engine.Engine`` holds one): it owns the handler
tasks running and the batch of requests being dispatched; what it needs of the rest of the engine is given to
it when it is made.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
import traceback
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from .bulk_handles import as_byte_view
from .eager import DONE, FINISHED, SUSPENDED, Done, first_step, start_eagerly
from .errors import (
    AppError,
    BulkUsageError,
    ConnectionLost,
    ProtocolError,
    RemoteProtocolError,
    ResultTooLarge,
    Status,
    status_for,
)
from .monitoring import ALWAYS_TIMED, FOLD_AT, Monitor
from .registration import Registration, RegistrationTable, row_key
from .request import EngineAPI, Request, _sync, _task_request
from .tracing import Tracer, new_span_id, new_trace_id
from .wire import (
    ZERO_COPY_BYTES,
    Frame,
    Kind,
    bin_header,
    ok_response,
    pack_body,
    pack_data_reply_header_flags,
    pack_ok_response_header,
    pack_ok_response_header_flags,
    unpack_body,
)

try:
    import cython
except ModuleNotFoundError:  # interpreted where Cython is not installed
    from . import _cython as cython

if not cython.compiled:  # (compiled: wire.pxd's and handlers.pxd's C constants)
    from .wire import F_CMA, F_INTO, F_NO_REPLY, F_TRACE_STARTED_HERE, F_TRACED, HEADER_SIZE, K_CANCEL

    #: Results up to this size are answered in serve itself (under any peer's limit).
    _SMALL_RESULT_BYTES = 4096
    #: Request flags the inline fast path leaves to _finish: no reply, or the result goes as data.
    _NOT_FAST = F_NO_REPLY | F_INTO

if TYPE_CHECKING:
    from .bulk_serving import BulkServing
    from .progress import Progress
    from .settings import EngineConfig
    from .transport import Address, Connection

log = logging.getLogger("svcframe.engine")

perf_ns = time.perf_counter_ns
#: Results of these types are never awaitable: a sync handler returning one needs no isawaitable check.
_PLAIN = frozenset({bytes, str, int, float, bool, list, dict, tuple, bytearray})
#: Results of these types are never sent as data (``_reply_into``) though some offer a buffer.
_NOT_BUFFERS = frozenset({str, int, float, bool, list, dict, tuple})
_NO_FRAMES: tuple[Frame, ...] = ()  # (what dispatching holds between batches)


class Handlers:
    """The engine's part that runs incoming requests (see the module docstring).

    Args:
        api: the engine whose API a handler reaches through ``Request.engine`` (nested calls, bulk transfers).
        table: the registration table requests are looked up in.
        serving: the part that lends a result by address (``Engine.call(..., into=)`` over ``unix://``).
        monitor, progress: the engine's statistics and progress loop.
        config: the engine's settings (``max_inflight_per_connection``, ``send_tracebacks``).

    Attributes:
        tracer: the engine's request tracer, or None (``Engine.set_tracing`` sets it).
        closing: the engine is shutting down: requests are refused with SHUTTING_DOWN.
        tasks: the handlers running as tasks (the engine drains them when it closes).
        dispatching: the batch of frames whose requests are being served (empty between batches).
        address: the engine's listening address (traces name it), set by ``start``.
    """

    def __init__(
        self,
        api: EngineAPI,
        table: RegistrationTable,
        serving: BulkServing,
        monitor: Monitor,
        progress: Progress,
        config: EngineConfig,
    ) -> None:
        self.api = api
        self.table = table
        self._rows = table.rows  # (read once per request)
        self._refused = table.refused
        self.serving = serving
        self.monitor = monitor
        self.progress = progress
        self.tracer: Tracer | None = None
        self.closing = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self.address: Address | None = None
        self.max_inflight_per_connection = config.max_inflight_per_connection
        self.send_tracebacks = config.send_tracebacks
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dispatching: Sequence[Frame] = _NO_FRAMES  # the batch being dispatched, and the request ids
        self._dispatching_cancels: set[int] | None = None  # its CANCELs name, once _start needs them
        self._epoch_offset_us = time.time() * 1e6 - time.perf_counter_ns() / 1e3

    def start(self, loop: asyncio.AbstractEventLoop, address: Address | None) -> None:
        """The engine started on ``loop``, listening at ``address`` (None: a client-only engine)."""
        self._loop = loop
        self.address = address

    def batch_begins(self, frames: Sequence[Frame]) -> None:
        """The requests of ``frames`` are about to be served (a request cancelled in its own batch never runs)."""
        self.dispatching, self._dispatching_cancels = frames, None

    def batch_ends(self) -> None:
        """The batch is served: keep none of its frames (a large body's buffer goes with them)."""
        self.dispatching = _NO_FRAMES

    def inflight_for(self, provider_id: int) -> list[asyncio.Task[Any]]:
        """The handler tasks of ``provider_id`` still running (a provider being removed waits for them)."""
        return [t for t in self.tasks if getattr(t, "svcframe_provider_id", None) == provider_id]

    def serve(self, conn: Connection, frame: Frame, arrival_ns: int, arrival: float) -> None:
        """Serve the request ``frame`` received on ``conn`` (its batch arrived at ``arrival_ns``, perf_counter_ns,
        and ``arrival``, loop time): answered in this batch when its handler finishes in its first step, else
        run as a task."""
        reg = self._rows.get(row_key(frame.provider_id, frame.rpc_id))
        if reg is None or self.closing or self._refused:
            if self._refuse(conn, frame, reg):
                return
            assert reg is not None
        try:
            arg = unpack_body(frame.body)  # type: ignore[arg-type]  # a request's body is bytes (None: bulk data)
        except ProtocolError as exc:
            raise conn.bad_body(frame, str(exc)) from None
        rec = None
        monitor = self.monitor
        if monitor.enabled:
            rec = (
                conn.records.get(reg) if not frame.parent_rpc_id else None
            )  # calls from outside any handler: no key tuple
            if rec is None:
                rec = self._target_record(frame, reg, conn)
            n = rec.calls = rec.calls + 1
            if n > ALWAYS_TIMED and n % monitor.sample_every:
                rec = None  # counted, not timed
        tracer = self.tracer
        start_ns = perf_ns() if rec is not None or tracer is not None else 0
        if tracer is not None:
            if frame.flags & F_TRACED:
                tracer.tick(frame.lamport)
            else:  # a tracing server starts the trace of an untraced call: its handler's calls join it
                flags = frame.flags | F_TRACED | F_TRACE_STARTED_HERE  # (its server span has no remote parent)
                frame = frame.replace(flags=flags, trace_id=new_trace_id(), span_id=new_span_id())
        req = _new_request(self.api, conn, reg, frame, arrival)
        if reg.is_coroutine:  # its context is a copy of this one: the request travels in the contextvar
            answer: tuple[int, int, Any] | None = None
            token = _task_request.set(req)
            try:
                coro = reg.handler(req, arg)
                if not self._runs_now(conn, frame, arrival_ns):  # started as usual: it may never run
                    task = self._start(conn, frame, reg, req, arrival_ns, start_ns, rec, coro)
                else:  # its first step now, in a Task of its own (no wrapper coroutine): svcframe.eager.first_step
                    kind, outcome = first_step(self._loop, coro, contextvars.copy_context())  # type: ignore[arg-type]
                    if (
                        kind == FINISHED
                        and (outcome is None or (type(outcome) is bytes and len(outcome) <= _SMALL_RESULT_BYTES))
                        and not (start_ns or frame.flags & _NOT_FAST)
                    ):  # (as a sync handler's common case)
                        conn.send(ok_response(frame.request_id, outcome))
                        return
                    if kind != SUSPENDED:
                        self._answer_first_step(conn, frame, reg, arrival_ns, start_ns, rec, kind, outcome, coro)
                        return
                    task, answer = outcome, (arrival_ns, start_ns, rec)  # answered by _task_done
            except Exception as exc:
                self._finish_error(conn, frame, reg, exc)
                return
            finally:
                _task_request.reset(token)
            if task is not None:
                self._track_task(conn, frame, reg, req, task, coro, answer)
            return
        sync = _sync
        sync.request = req
        try:
            result = reg.handler(req, arg)
            if result is DONE:  # a push ahead written at once (svcframe.eager.DONE): its value, None
                result = None
            if (result is None or (type(result) is bytes and len(result) <= _SMALL_RESULT_BYTES)) and not (
                start_ns or frame.flags & _NOT_FAST
            ):  # the common case, untimed and untraced: None or small bytes, answered here
                conn.send(ok_response(frame.request_id, result))
                return
            task = self._handled(conn, frame, reg, req, arrival_ns, start_ns, rec, result)
        except Exception as exc:
            self._finish_error(conn, frame, reg, exc)
            return
        finally:
            sync.request = None
        if task is not None:
            self._track_task(conn, frame, reg, req, task, result)

    def _answer_first_step(
        self,
        conn: Connection,
        frame: Frame,
        reg: Registration,
        arrival_ns: int,
        start_ns: int,
        rec: Any,
        kind: int,
        outcome: Any,
        coro: Any,
    ) -> None:
        """Answer an async handler that finished in its first step (``first_step``: FINISHED with its result, or
        RAISED), as ``_run_async`` answers one that finished later."""
        if kind == FINISHED:
            self._finish(conn, frame, reg, arrival_ns, start_ns, rec, outcome)
        else:
            self._answer_failure(conn, frame, reg, outcome, coro, None)

    def _handled(
        self,
        conn: Connection,
        frame: Frame,
        reg: Registration,
        req: Request,
        arrival_ns: int,
        start_ns: int,
        rec: Any,
        result: Any,
    ) -> asyncio.Task[Any] | None:
        """A sync handler's result other than the common one: sent (``_finish``), or, an awaitable, run as a
        task, returned for ``_track_task``."""
        if isinstance(result, Done):  # finished when made (a push ahead written at once): answered now, no task
            result = result.value
            if result is None and not (start_ns or frame.flags & _NOT_FAST):  # (as serve's common case)
                conn.send(ok_response(frame.request_id, None))
                return None
        if result is None or type(result) in _PLAIN or not inspect.isawaitable(result):
            self._finish(conn, frame, reg, arrival_ns, start_ns, rec, result)
            return None
        token = _task_request.set(req)  # a sync handler returned an awaitable: it runs as a handler task does
        try:
            return self._start(conn, frame, reg, req, arrival_ns, start_ns, rec, result)
        finally:
            _task_request.reset(token)

    def _start(
        self,
        conn: Connection,
        frame: Frame,
        reg: Registration,
        req: Request,
        arrival_ns: int,
        start_ns: int,
        rec: Any,
        aw: Awaitable[Any],
    ) -> asyncio.Task[Any] | None:
        """Run a handler's awaitable, started eagerly (svcframe.eager): its first step runs now, and one that
        finishes there is answered now, in this batch's write, with no Task. Returns the Task (for
        ``_track_task``) when it suspends; also, started as usual, when this batch also cancels it (it then
        never runs), its request id is still being served (``_track_task`` refuses it), or its deadline has
        passed (``_track_task`` drops it unrun)."""
        loop = self._loop
        assert loop is not None
        runner = self._run_async(conn, frame, reg, arrival_ns, start_ns, rec, aw)
        if self._runs_now(conn, frame, arrival_ns):
            return start_eagerly(loop, runner, contextvars.copy_context())
        return loop.create_task(runner)

    def _runs_now(self, conn: Connection, frame: Frame, arrival_ns: int) -> bool:
        """Whether a handler's first step may run now: False when its batch also cancels it (it then never runs),
        its request id is still being served (``_track_task`` refuses it), or its deadline has passed
        (``_track_task`` drops it unrun). Its deadline (``usec`` after arrival) is checked by the clock: the
        loop's time stands still during a turn."""
        request_id, usec = frame.request_id, frame.deadline_usec
        cancels = self._dispatching_cancels
        if cancels is None:  # the requests its batch cancels (a request read with its CANCEL never runs)
            cancels = self._dispatching_cancels = {f.request_id for f in self.dispatching if f.kind == K_CANCEL}
        return not (
            (usec and perf_ns() - arrival_ns >= usec * 1000) or request_id in cancels or request_id in conn.serving
        )

    def _track_task(
        self,
        conn: Connection,
        frame: Frame,
        reg: Registration,
        req: Request,
        task: asyncio.Task[Any],
        result: Any,
        answer: tuple[int, int, Any] | None = None,
    ) -> None:
        """Bookkeeping of a handler running as a task: cancellation by CANCEL or its deadline, backpressure.
        With ``answer`` (arrival_ns, start_ns, rec), the task runs the handler's coroutine itself (not
        ``_run_async``): ``_task_done`` answers from its outcome."""
        loop = self._loop
        assert loop is not None
        task.svcframe_provider_id = reg.provider_id  # type: ignore[attr-defined]
        task.svcframe_frame = frame  # type: ignore[attr-defined]
        try:
            conn.protocol.serve(frame.request_id, task)
        except RemoteProtocolError:  # a request id reused while in flight: nothing of this request runs
            task.cancel()
            if inspect.iscoroutine(result):
                result.close()
            raise
        self.tasks.add(task)
        if len(conn.serving) >= self.max_inflight_per_connection:
            conn.pause_reading()  # backpressure: this peer's further requests wait in its socket buffer
        self.progress.inflight += 1
        deadline = req.deadline
        if deadline is not None and deadline <= loop.time():  # it waited past its deadline (behind a blocking
            _expire_handler(task)  # handler): dropped before its first step, answered DROPPED by _task_done
        timer = loop.call_at(deadline, _expire_handler, task) if deadline is not None else None
        task.add_done_callback(lambda t: self._task_done(conn, frame.request_id, t, timer, result, reg, answer))

    def _refuse(self, conn: Connection, frame: Frame, reg: Registration | None) -> bool:
        """Answer a request that will not run (unknown target, shutting down, provider removed)."""
        if reg is None:
            status = Status.NO_SUCH_RPC if frame.provider_id in self.table.providers else Status.NO_SUCH_PROVIDER
            conn.reply_error(frame, status, "")
        elif self.closing:
            conn.reply_error(frame, Status.SHUTTING_DOWN, "the server is shutting down")
        elif frame.provider_id in self._refused:
            conn.reply_error(frame, Status.REFUSED, self._refused[frame.provider_id])
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
        reg: Registration | None = None,
        answer: tuple[int, int, Any] | None = None,
    ) -> None:
        if deadline is not None:
            deadline.cancel()
        unrun = False
        if inspect.iscoroutine(handler_result):
            unrun = task.cancelled() and inspect.getcoroutinestate(handler_result) == inspect.CORO_CREATED
            if (
                unrun and not conn.closed and conn.serving.get(request_id) is task
            ):  # cancelled before its first step: nothing ran and nothing answered yet
                frame = task.svcframe_frame
                self._count_error(conn, frame, self._rows.get(row_key(frame.provider_id, frame.rpc_id)))
                if self.closing:
                    conn.reply_error(frame, Status.SHUTTING_DOWN, "the server shut down before it ran")
                elif getattr(task, "svcframe_deadline_passed", False):
                    conn.reply_error(frame, Status.DROPPED, "the deadline passed before the handler ran")
                else:
                    conn.reply_error(frame, Status.CANCELLED, "the request was cancelled before it ran")
            handler_result.close()  # cancelled before it first ran: never awaited, so close it (no-op otherwise)
        self.tasks.discard(task)
        if conn.serving.get(request_id) is task:
            del conn.serving[request_id]
        if conn.reading_paused and len(conn.serving) <= self.max_inflight_per_connection // 2:
            conn.resume_reading()
        self.progress.inflight -= 1
        if not self.progress.blocking:
            self.progress.activity()
        if answer is not None and not unrun:  # the handler's own coroutine (not _run_async): answer its outcome
            assert reg is not None
            frame = task.svcframe_frame  # type: ignore[attr-defined]
            try:
                failure = asyncio.CancelledError() if task.cancelled() else task.exception()
                if failure is not None:
                    self._answer_failure(conn, frame, reg, failure, handler_result, task)
                else:
                    self._finish(conn, frame, reg, *answer, task.result())
            except Exception as exc:
                self._finish_error(conn, frame, reg, exc)

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
        except asyncio.CancelledError as exc:
            self._answer_failure(conn, frame, reg, exc, aw, asyncio.current_task())
            raise
        except Exception as exc:
            self._finish_error(conn, frame, reg, exc)
        else:
            self._finish(conn, frame, reg, arrival_ns, start_ns, rec, result)

    def _answer_failure(
        self,
        conn: Connection,
        frame: Frame,
        reg: Registration,
        exc: BaseException,
        aw: Any,
        task: asyncio.Task[Any] | None,
    ) -> None:
        """Answer a handler that raised ``exc`` (``_finish_error``), or was cancelled (a CancelledError): by its
        ``task``'s deadline, its caller's CANCEL or a shutdown; no result."""
        if not isinstance(exc, asyncio.CancelledError):
            self._finish_error(conn, frame, reg, exc)
            return
        self._count_error(conn, frame, reg)
        if conn.closed:
            return
        if self.closing:
            conn.reply_error(frame, Status.SHUTTING_DOWN, "the server shut down before the handler finished")
        elif getattr(task, "svcframe_deadline_passed", False):
            if inspect.iscoroutine(aw) and inspect.getcoroutinestate(aw) == inspect.CORO_CREATED:
                conn.reply_error(frame, Status.DROPPED, "the deadline passed before the handler ran")
            else:  # it ran: whatever it changed may have been applied
                conn.reply_error(frame, Status.DEADLINE_EXCEEDED, "the deadline passed as it ran")
        else:
            conn.reply_error(frame, Status.CANCELLED, "the request was cancelled (caller or deadline)")

    def _finish(
        self, conn: Connection, frame: Frame, reg: Registration, arrival_ns: int, start_ns: int, rec: Any, result: Any
    ) -> None:
        """Send the result. ``rec`` is the statistics record when this call is timed (else None)."""
        end_ns = perf_ns() if start_ns else 0
        large = False
        try:
            if frame.flags & F_INTO and self._reply_into(conn, frame, reg, result):
                body_len = 0  # sent as data: its statistics count the header's body only
            else:
                reply = None  # the whole frame, when its body is built with it
                if result is None or (type(result) is bytes and len(result) < ZERO_COPY_BYTES):
                    reply = ok_response(frame.request_id, result)  # (msgpack cannot fail on bytes: nothing to verify)
                    body_len = len(reply) - HEADER_SIZE
                elif type(result) is bytes:
                    large = True  # sent as it is, not copied
                    body = bin_header(len(result))
                    body_len = len(body) + len(result)
                else:
                    body = pack_body(result)
                    body_len = len(body)
                if body_len > conn.peer_max_body_bytes:
                    raise ResultTooLarge(
                        f"the result of {reg.name!r} encodes to {body_len} bytes, over the caller's "
                        f"{conn.peer_max_body_bytes}-byte limit (its engine.max_body_bytes, or Engine(max_body_bytes="
                        "...)): the caller can raise that limit, or take the result into its own buffer "
                        "(Engine.call(..., into=buffer))"
                    )
                if not frame.flags & F_NO_REPLY:
                    if reply is not None:
                        conn.send(reply)
                    elif large:
                        conn.send_many((pack_ok_response_header(body_len, frame.request_id) + body, result))
                    else:
                        conn.send(pack_ok_response_header(body_len, frame.request_id) + body)
        except (ProtocolError, ResultTooLarge) as exc:  # the caller's error, not a handler failure: not logged
            self._finish_error(conn, frame, reg, exc)
            return
        if rec is not None:
            buf = rec.buffer
            sent_ns = perf_ns()
            buf.extend((start_ns - arrival_ns, end_ns - start_ns, sent_ns - end_ns, len(frame.body or b""), body_len))
            if len(buf) > FOLD_AT:
                rec.fold()
        tracer = self.tracer
        if tracer is not None:  # the trace and span of an untraced call were started in serve
            traced = frame.flags & F_TRACED
            tracer.target(reg.name, start_ns / 1e3 + self._epoch_offset_us, (end_ns - start_ns) / 1e3,
                          frame.trace_id if traced else new_trace_id(), frame.span_id if traced else new_span_id(),
                          tracer.lamport, conn.peer_label, reg, self.address,
                          root=bool(frame.flags & F_TRACE_STARTED_HERE))  # fmt: skip

    def _reply_into(self, conn: Connection, frame: Frame, reg: Registration, result: Any) -> bool:
        """The caller takes the result as data into its own buffer (``Engine.call(..., into=...)``): a bytes-like
        result goes as BULK_DATA_REPLY data (zero-copy, straight into the caller's buffer): one frame flagged
        INTO, which is also the answer, or (over one frame's size) chunks behind write backpressure (a task)
        then a RESPONSE flagged INTO whose body is the byte count (as is an empty result's). One round trip
        and no task on either side, as a handler's HG_BULK_PUSH into the caller's memory is in Margo. False for
        a result that is not bytes-like (it is answered inline).

        The caller checks the size against its buffer (its protocol discards what would overflow it, and the
        call raises ResultTooLarge): nothing about it travels in the request, so the request path of every
        call pays nothing for this one (even a flag test there adds measurably to every call).
        """
        if type(result) is bytes:  # the common result: sent as it is (no view made: fewer bytecodes per read)
            view: bytes | memoryview = result
        elif result is None or type(result) in _NOT_BUFFERS:
            return False
        else:
            try:
                view = as_byte_view(result, writable=False)
            except BulkUsageError:
                return False
        size = len(view)
        if frame.flags & F_NO_REPLY:
            return True
        # the caller can copy it from our memory (same node, unix://): lend an immutable result by address
        if (
            frame.flags & F_CMA
            and type(result) is bytes
            and self.serving.lend(conn, frame.request_id, memoryview(result))
        ):
            return True
        # A result that fits one frame (Connection.whole_frame_bytes: the caller's limit, half our output cap)
        # leaves as one data frame flagged INTO, which is also the answer (its length the count), with no task
        # and no copy (faster than chunks behind a drain each, and a RESPONSE after the data would be a third
        # buffer in the write, a cost to both sides: svcframe bench --workload client-read); larger ones are
        # chunked, then answered by a RESPONSE.
        if 0 < size <= conn.whole_frame_bytes:
            conn.send_many((pack_data_reply_header_flags(F_INTO, size, frame.request_id), view))
            return True
        body = pack_body(size)
        answer = pack_ok_response_header_flags(F_INTO, len(body), frame.request_id) + body  # (fast encoders: wire.py)
        if not size:
            conn.send(answer)
        else:
            task = asyncio.get_running_loop().create_task(self._send_into(conn, frame, memoryview(view), answer))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return True

    async def _send_into(self, conn: Connection, frame: Frame, view: memoryview, answer: bytes) -> None:
        try:
            await conn.send_data(Kind.BULK_DATA_REPLY, frame.request_id, view)
        except ConnectionLost:
            return
        conn.send(answer)

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
            conn.reply(frame, Status.APP_ERROR, body)
        elif status != Status.HANDLER_ERROR:
            conn.reply_error(frame, status, str(exc))
            return
        else:
            tb = "".join(traceback.format_exception(exc)) if conn.authenticated or self.send_tracebacks else ""
            conn.reply(frame, Status.HANDLER_ERROR, pack_body([type(exc).__qualname__, str(exc)[:10000], tb[-20000:]]))
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


def _new_request(engine: EngineAPI, conn: Connection, reg: Registration, frame: Frame, arrival: float) -> Request:
    """A handler's Request, made without running an ``__init__`` (one per call)."""
    req = Request.__new__(Request)
    req.engine = engine
    req.conn = conn
    req.reg = reg
    req.frame = frame
    req.arrival = arrival
    return req


def _expire_handler(task: asyncio.Task[Any]) -> None:
    """The caller's deadline passed: stop its handler, answered as DEADLINE_EXCEEDED."""
    task.svcframe_deadline_passed = True  # type: ignore[attr-defined]
    task.cancel()
