"""Serving the bulk transfers peers make on our buffers: the owner's side of ``svcframe.bulk``.

A peer's BULK_PULL is answered with data frames (or, over ``unix://``, with the range's address, or the
range written into the puller's memory: the writer's side of a split read, ``svcframe.split_read``); its
BULK_PUSH's data frames land in the exposed buffer (or, by cross-memory attach, we read the pusher's
source, split with the pusher when it exposed it); a push ahead of an answer (NO_REPLY) is placed and never
answered. A read into the caller's buffer over ``unix://`` is answered by lending the result's address
(``lend``), and a caller's write offer is taken up there. No user code runs on this side.

``BulkServing`` is the engine's part that does this (``svcframe.engine.Engine`` holds one, beside
``svcframe.bulk.BulkTransfers``, which makes transfers): it owns the table of exposed buffers (``expose``),
the sources of our own pushes exposed meanwhile, the results lent, and the tasks serving transfers.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import cma
from .bulk_handles import BULK_ID_BYTES, MODES, READ, WRITE, BulkHandle, as_byte_view, short_id
from .cma import CMA_MIN_BYTES
from .errors import (
    BulkError,
    BulkUsageError,
    ConnectionLost,
    DeadlineExceeded,
    ProtocolError,
    RemoteProtocolError,
    Status,
)
from .monitoring import Monitor
from .protocol import WriteOffer
from .split_read import (
    SHARE_ONE,
    SPLIT_ALIGN,
    SPLIT_MAX_PART_BYTES,
    SPLIT_MIN_BYTES,
    SPLIT_WRITE_BURST_SECONDS,
    SPLIT_WRITE_SHARE_OF_TIME,
    cma_copy,
    cma_read,
)
from .wire import (
    BinBody,
    Frame,
    Kind,
    encode_frame,
    encode_header,
    pack_body,
    unpack_body,
)

try:
    import cython
except ModuleNotFoundError:  # interpreted where Cython is not installed
    from . import _cython as cython

if not cython.compiled:  # (compiled: wire.pxd's C constants)
    from .wire import F_CMA, F_INTO, F_NO_REPLY, K_BULK_PUSH, K_RESPONSE

#: Results lent by address (reads into the caller's buffer by cross-memory attach) that callers have not yet
#: read, in bytes, over all connections; past it results are sent as data (a caller that never reads holds
#: at most this much of the server's memory).
MAX_LENT_BYTES = 256 * 1024 * 1024
#: ... and per connection, in results (a caller that reads as it goes holds one per read in flight).
MAX_LENT_PER_CONNECTION = 16

_AHEAD_FLAGS = F_NO_REPLY | F_CMA
_PUSH_CMA_EXTRA, _PULL_CMA_EXTRA, _NO_EXTRA = (
    frozenset((1, 2)),
    frozenset((0, 3)),
    frozenset((0,)),
)  # a push flagged NO_REPLY alone goes ahead of an answer (``_on_push_ahead``)

if TYPE_CHECKING:
    from .progress import Progress
    from .transport import Connection


class BulkServing:
    """The engine's part that serves the transfers peers make on our buffers (see the module docstring).

    Args:
        engine_id: the engine's id (its bulk handles carry it).
        monitor, progress: the engine's statistics and progress loop.
        bulk_cma: cross-memory attach is on for this engine (and supported here).

    Attributes:
        exposed: bulk id (16 random bytes) -> (buffer, mode, the address of the only peer allowed, or None).
        push_sources: the sources of our pushes by cross-memory attach, exposed for the owner's split read while
            the push lasts: bulk id -> our operations in flight that wait on it (the push, and the handler
            making it). ``svcframe.bulk.BulkTransfers`` keeps it.
        tasks: the transfers being served by a task (the engine waits for them when it closes).
        cma_bytes: bulk bytes moved by cross-memory attach while serving (pushes read, ranges written).
        address: the engine's listening address (its bulk handles carry it), set by ``start``.
    """

    def __init__(self, engine_id: str, monitor: Monitor, progress: Progress, bulk_cma: bool) -> None:
        self.engine_id = engine_id
        self.monitor = monitor
        self.progress = progress
        self.bulk_cma = bulk_cma
        self.exposed: dict[bytes, tuple[memoryview, str, str | None]] = {}
        self.push_sources: dict[bytes, int] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.cma_bytes = 0
        self.address: str | None = None
        self._lent_bytes = 0  # results lent by address to callers that have not read them yet (MAX_LENT_BYTES)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop, address: str | None) -> None:
        """The engine started on ``loop``, listening at ``address`` (None: a client-only engine)."""
        self._loop = loop
        self.address = address

    # -- the exposed buffers ------------------------------------------------------------------------------
    def expose(self, buffer: Any, mode: str = "r", *, peer: str | None = None) -> BulkHandle:
        """Expose ``buffer`` (bytes-like or C-contiguous numpy array) for remote pull ("r"), push ("w")
        or both ("rw"). Keep the buffer alive and unchanged in size until ``unexpose``.

        The handle is a capability (128 random bits): whoever holds it may move its bytes. With ``peer``
        (the address of the server it is given to) only that server, over the connection this engine
        dialled to it, may use it, and the handle is revoked when that connection ends.

        Raises:
            BulkUsageError: not a contiguous buffer, read-only with a writable mode, or an unknown mode.
        """
        if mode not in MODES:
            raise BulkUsageError(f"bulk mode {mode!r}: expected one of {MODES}")
        view = as_byte_view(buffer, writable=WRITE in mode)
        bulk_id = secrets.token_bytes(BULK_ID_BYTES)
        self.exposed[bulk_id] = (view, mode, peer)
        return BulkHandle(self.address, self.engine_id, bulk_id, len(view), mode)

    def unexpose(self, handle: BulkHandle) -> None:
        """Stop serving ``handle``; transfers that start later fail with BulkError. A transfer already
        under way finishes with the buffer: do not reuse the buffer until it has (or its call failed)."""
        entry = self.exposed.pop(handle.bulk_id, None)
        if entry is not None:
            entry[0].release()

    def revoke_bound(self, address: str) -> None:
        """The connection we dialled to ``address`` ended: the handles bound to that peer are revoked."""
        for bulk_id, entry in list(self.exposed.items()):
            if entry[2] == address:
                del self.exposed[bulk_id]
                entry[0].release()

    # -- a read into the caller's buffer by cross-memory attach (Engine.call(..., into=) on unix://) ------------
    def lend(self, conn: Connection, request_id: int, view: memoryview) -> bool:
        """Answer a read into the caller's buffer with the result's address instead of its bytes: the caller
        copies it with one ``process_vm_readv`` and says so (CANCEL of the request id), so the read is one
        round trip and one kernel copy, as a Margo handler's bulk push over ``na+sm`` is. The result (an
        immutable ``bytes``) is exposed meanwhile under a fresh bulk id the answer carries, for the caller to
        pull over the socket should the kernel refuse the copy. False (answer with the data) when this engine
        or connection cannot take part, or results lent and not yet read are MAX_LENT_PER_CONNECTION on this
        connection or hold MAX_LENT_BYTES in all.

        When the caller offered it (``_offer_write``), we write the first part of the result into its buffer
        ourselves once the answer has left, while it copies the rest: the answer then ends with that part's
        size (0: declined, as ``_split_write_declined`` says, and the offer is answered so)."""
        size = len(view)
        offer = conn.protocol.offers.pop(request_id, None) if conn.protocol.offers else None
        if (
            size < CMA_MIN_BYTES
            or not self.bulk_cma
            or conn.peer_pid is None
            or len(conn.protocol.lent) >= MAX_LENT_PER_CONNECTION
            or self._lent_bytes + size > MAX_LENT_BYTES
        ):
            return False
        bulk_id = secrets.token_bytes(BULK_ID_BYTES)
        self.exposed[bulk_id] = (view, READ, None)
        conn.protocol.lent[request_id] = bulk_id
        self._lent_bytes += size
        fields: list[Any] = [size, cma.buffer_address(view), bulk_id]
        # (a handler running as a task is in flight until it answers: its own work is not another's)
        part = self._offered_part(conn, offer, size, 1 if request_id in conn.serving else 0) if offer else 0
        if offer is not None:
            fields.append(part)
        conn.send(encode_frame(K_RESPONSE, request_id, pack_body(fields), flags=F_INTO | F_CMA, status=Status.LENT))
        if part:
            self._write_offered(conn, offer, view[:part])  # type: ignore[arg-type]  # (part: an offer)
        return True

    def release_lent(self, conn: Connection, request_id: int) -> None:
        """The caller has read the result lent for ``request_id`` (or is gone): stop exposing it."""
        bulk_id = conn.protocol.lent.pop(request_id, None)
        entry = self.exposed.pop(bulk_id, None) if bulk_id is not None else None
        if entry is not None:
            self._lent_bytes -= len(entry[0])
            entry[0].release()

    # -- serving the transfers peers make on our buffers ------------------------------------------------
    def _bulk_request(
        self, conn: Connection, frame: Frame, need: str
    ) -> tuple[bytes, memoryview | None, str | None, int, list[Any] | None]:
        """Parse a BULK_PULL / BULK_PUSH body ``[bulk id, offset, size]`` and find the exposed range: (bulk id,
        view or None, error or None, size, the CMA fields or None). Flagged CMA, a push adds the address of
        the pusher's source ``[source]``, and may add the source's bulk id ``[source, source bulk id]`` (for a
        split read of it: ``_serve_cma_push``); a pull may add ``[destination, expires_ns, mark address]``,
        asking us to write the range into the puller's memory (the first part of a split read,
        ``_serve_cma_write``)."""
        by_cma = bool(frame.flags & F_CMA)
        push = frame.kind == K_BULK_PUSH
        # the fields a request may add to the three: a push by CMA its source (and the source's bulk id), a pull
        # by CMA where to write the range; a push ahead is _on_push_ahead's
        extra = _PUSH_CMA_EXTRA if by_cma and push else _PULL_CMA_EXTRA if by_cma else _NO_EXTRA
        try:
            fields = unpack_body(frame.body or b"")
            if (
                not isinstance(fields, list)
                or len(fields) - 3 not in extra
                or not isinstance(fields[0], bytes)
                or not all(isinstance(v, int) for v in fields[1 : 4 if push else None])
                or min(fields[1 : 4 if push else None]) < 0
                or (len(fields) == 5 and push and not (type(fields[4]) is bytes and len(fields[4]) == BULK_ID_BYTES))
            ):
                raise ValueError
        except (ProtocolError, ValueError, TypeError) as exc:
            why = str(exc) if isinstance(exc, ProtocolError) else "expected [bulk id (bytes), offset >= 0, size >= 0]"
            raise conn.bad_body(frame, f"malformed bulk request: {why}") from None
        bulk_id, offset, size = fields[:3]
        view, error = self._exposed_range(conn, bulk_id, offset, size, need)
        return bulk_id, view, error, size, fields[3:] or None

    def _exposed_range(
        self, conn: Connection, bulk_id: bytes, offset: int, size: int, need: str
    ) -> tuple[memoryview | None, str | None]:
        """The range a peer's transfer names in one of our exposed buffers, or why not: (view, None) or
        (None, error): not exposed, bound to another peer, not exposed for ``need``, or out of range."""
        entry = self.exposed.get(bulk_id)
        if entry is None:
            return None, f"bulk handle {short_id(bulk_id)} is not exposed (revoked, or never existed)"
        view, mode, bound = entry
        if bound is not None and conn.dialled_address != bound:  # (only over the connection we dialled to it)
            return None, f"bulk handle {short_id(bulk_id)} is bound to another peer"
        if need not in mode:
            return None, (
                f"bulk handle {short_id(bulk_id)} is exposed as {mode!r}, not for {'pull' if need == READ else 'push'}"
            )
        if offset + size > len(view):
            return None, f"range {offset}+{size} is outside the {len(view)}-byte bulk buffer"
        return view[offset : offset + size], None

    def on_pull_request(self, conn: Connection, frame: Frame) -> None:
        """A peer's BULK_PULL: answered with the range's data frames, its address, or a write into its memory."""
        if frame.flags & F_INTO:  # (flagged CMA too) not a pull: an offer for a request of the peer's
            self._on_write_offer(conn, frame)
            return
        bulk_id, view, error, size, more = self._bulk_request(conn, frame, READ)
        if view is None:
            conn.reply_error(frame, Status.BULK_ERROR, error or "")
            return
        if more is not None:
            self._serve_cma_write(conn, frame, view, *more, own=self.push_sources.get(bulk_id, 0))
            return
        if frame.flags & F_CMA:  # the puller reads the range itself (svcframe.cma): answer with its address
            offer = conn.protocol.offers.pop(frame.request_id, None) if conn.protocol.offers else None
            if conn.peer_pid is None or not self.bulk_cma:
                conn.reply_error(frame, Status.BULK_ERROR, "cma: not available on this connection")
            elif offer is None:
                self.monitor.record_bulk("served_cma_pull", conn.peer_label, size, 0)
                conn.reply(frame, Status.OK, pack_body(cma.buffer_address(view)))
            else:  # and with the part of it we write ourselves (its offer: _offered_part)
                self.monitor.record_bulk("served_cma_pull", conn.peer_label, size, 0)
                part = self._offered_part(conn, offer, size, 0)
                conn.reply(frame, Status.OK, pack_body([cma.buffer_address(view), part]))
                if part:
                    self._write_offered(conn, offer, view[:part])
            return
        self.monitor.record_bulk("served_pull", conn.peer_label, size, 0)
        if size <= conn.whole_frame_bytes and not conn.writing_paused:  # one frame, room to write: inline
            # (not chunked, no task: see _send_chunks for the measurement)
            if size:
                conn.send_many((encode_header(Kind.BULK_DATA_REPLY, frame.request_id, size), view))
            conn.reply(frame, Status.OK, b"")
            return
        self._track_serving(conn, frame, asyncio.get_running_loop().create_task(self._serve_pull(conn, frame, view)))

    async def _serve_pull(self, conn: Connection, frame: Frame, view: memoryview) -> None:
        try:
            await conn.send_data(Kind.BULK_DATA_REPLY, frame.request_id, view)
        except ConnectionLost:
            return
        finally:
            conn.serving.pop(frame.request_id, None)
        conn.reply(frame, Status.OK, b"")

    def on_push_request(self, conn: Connection, frame: Frame) -> None:
        """A peer's BULK_PUSH: its data frames land in the exposed range (or we read its source by CMA)."""
        if frame.flags & _AHEAD_FLAGS == F_NO_REPLY:
            self._on_push_ahead(conn, frame)
            return
        _, view, error, size, more = self._bulk_request(conn, frame, WRITE)
        if more is not None and frame.flags & F_CMA:
            self._serve_cma_push(conn, frame, view, error, *more)
            return
        incoming = conn.protocol.expect_push(frame, view, size, error)
        if incoming is None:  # nothing to wait for: empty, or refused (its data, if any, is discarded)
            self._reply_push(conn, frame, error)
            return
        self.monitor.record_bulk("served_push", conn.peer_label, size, 0)

    def _on_push_ahead(self, conn: Connection, frame: Frame) -> None:
        """A push ahead of the answer to our call (``push``, flagged NO_REPLY, not CMA), dispatched: body
        ``[bulk id, offset, size, the call's request id]``; its data frames follow; never answered. Refused
        (not exposed, out of range), its data is discarded and that call fails with BulkError. (Most are placed
        by the decoder instead: ``_place_ahead``.)"""
        fields = _push_ahead_fields(frame.body or b"")
        if isinstance(fields, str):
            raise conn.bad_body(frame, f"malformed bulk request: {fields}")
        bulk_id, offset, size, call_id = fields
        view, error = self._exposed_range(conn, bulk_id, offset, size, WRITE)
        conn.protocol.expect_push(frame, view, size, error)
        if error is None:
            self.monitor.record_bulk("served_push", conn.peer_label, size, 0)
            return
        waiter = conn.pending.get(call_id)  # refused: that call fails (its data, if any, is discarded)
        if waiter is not None and not waiter.done():
            waiter.set_exception(BulkError(f"the server's push into our buffer was refused here: {error}"))

    def placer(self, conn: Connection) -> Callable[[int, bytes, int, int], memoryview | None]:
        """``conn``'s decoder's ``place_ahead``: ``_place_ahead`` for ``conn``."""
        return functools.partial(self._place_ahead, conn)

    def _place_ahead(
        self, conn: Connection, request_id: int, bulk_id: bytes, offset: int, size: int
    ) -> memoryview | None:
        """``conn``'s decoder's ``place_ahead`` (svcframe.decoder.FrameDecoder): the range of our exposed buffer
        that a push ahead, both of whose frames came in one read, writes (its body names ``bulk_id``,
        ``offset`` and ``size``, its data's length), or None, when the frames are to be dispatched
        (``_on_push_ahead``, which has the errors: a request id of a push under way, a range we refuse). The
        read then costs no Frame, no dispatch and no sink: a 64 KiB push read's client side, ``python
        tools/profile_client.py --read 65536 --method push``, in the README."""
        if request_id in conn.protocol.pushes:
            return None
        view, _ = self._exposed_range(conn, bulk_id, offset, size, WRITE)
        if view is not None:
            self.monitor.record_bulk("served_push", conn.peer_label, size, 0)
        return view

    def _serve_cma_write(
        self,
        conn: Connection,
        frame: Frame,
        view: memoryview,
        dest: int,
        expires_ns: int,
        mark_address: int,
        *,
        own: int = 0,
    ) -> None:
        """The first part of a split read (``_cma_read``): write the exposed range into the puller's
        destination, at once, then the request id at ``mark_address``, and answer; or decline
        (``_split_write_declined``, with ``own`` operations of ours in flight that wait on this read: the
        puller then copies the range itself)."""
        why = self._split_write_declined(conn, len(view), expires_ns, own)
        if why is None:
            self._split_write(conn, frame.request_id, dest, view, mark_address)
        else:
            conn.reply_error(frame, Status.BULK_ERROR, f"cma: write declined: {why}")

    def _split_write_declined(self, conn: Connection, size: int, expires_ns: int, own: int) -> str | None:
        """Why we do not write ``size`` bytes of a split read into the peer's memory now, or None: we do not do
        cross-memory attach; we are busy (more than ``own`` handlers, calls or transfers of ours in flight: our
        core is not idle, and the reader's own copy does not wait for us); the peer asks for more than
        SPLIT_WRITE_SHARE_OF_TIME of our time (a token bucket, in seconds of writing, of at most
        SPLIT_WRITE_BURST_SECONDS: a request costs a few bytes and its write up to a millisecond of our loop, so
        a peer that keeps asking gets what a reader at full speed gets and no more); the part is over
        SPLIT_MAX_PART_BYTES (it would hold the loop); the peer is gone; or it is past ``expires_ns``
        (``time.monotonic_ns``: the reader may have given its buffer back by then: svcframe.cma)."""
        pid, process = conn.peer_pid, conn.peer_process
        now = time.monotonic()
        conn.cma_write_allowance = min(
            conn.cma_write_allowance + (now - conn.cma_write_reckoned) * SPLIT_WRITE_SHARE_OF_TIME,
            SPLIT_WRITE_BURST_SECONDS,
        )
        conn.cma_write_reckoned = now
        if pid is None or process is None or not self.bulk_cma or conn.closed:
            return "not available on this connection"
        if self.progress.inflight > own:
            return "busy"
        if conn.cma_write_allowance <= 0:
            return f"this peer's writes took over {SPLIT_WRITE_SHARE_OF_TIME:.0%} of our time"
        if size > SPLIT_MAX_PART_BYTES:
            return f"{size} bytes is over {SPLIT_MAX_PART_BYTES} for one write"
        if not process.alive():
            return f"the peer's process {pid} is gone"
        if time.monotonic_ns() > expires_ns:
            return "the request expired"
        return None

    def _split_write(self, conn: Connection, request_id: int, dest: int, view: memoryview, mark_address: int) -> None:
        """Write ``view`` at ``dest`` in the peer's memory, then ``request_id`` (8 bytes, little-endian) at
        ``mark_address`` (unless 0), in one ``process_vm_writev``, and answer ``request_id`` (OK, or BULK_ERROR
        "cma: ..." when the kernel refused). Its time counts against the peer's allowance."""
        start = time.monotonic()
        pid = conn.peer_pid
        assert pid is not None  # (peers on this node alone, whose pid the kernel told, take split writes)
        try:
            cma.write(pid, dest, view, mark_address, request_id.to_bytes(8, "little"))
        except OSError as exc:
            conn.send(encode_frame(K_RESPONSE, request_id, pack_body(f"cma: {exc}"), status=Status.BULK_ERROR))
            return
        finally:
            conn.cma_write_allowance -= time.monotonic() - start
        self.cma_bytes += len(view)
        self.monitor.record_bulk("served_cma_write", conn.peer_label, len(view), 0)
        conn.send(encode_frame(K_RESPONSE, request_id, b"", status=Status.OK))

    def _on_write_offer(self, conn: Connection, frame: Frame) -> None:
        """A peer's offer (``_offer_write``: a BULK_PULL flagged CMA and INTO, body ``[request id,
        destination, size, expires_ns, mark address, share]``, ints, the share in 1/65536ths): kept in
        ``Protocol.offers`` for ``_lend`` to use on that request's result. Declined at once (BULK_ERROR) when
        MAX_LENT_PER_CONNECTION offers not yet expired are kept, or one for that request is.

        Raises:
            RemoteProtocolError (after BAD_REQUEST and GOODBYE): a malformed body.
        """
        try:
            fields = unpack_body(frame.body or b"")
            if not (
                isinstance(fields, list)
                and len(fields) == 6
                and all(type(v) is int and v >= 0 for v in fields)
                and fields[0] > 0
                and 0 < fields[5] <= SHARE_ONE
            ):
                raise ValueError
        except (ProtocolError, ValueError, TypeError) as exc:
            why = str(exc) if isinstance(exc, ProtocolError) else (
                "expected [request id > 0, destination, size, expires_ns, mark address, share 1..65536], ints >= 0"
            )  # fmt: skip
            raise conn.bad_body(frame, f"malformed write offer: {why}") from None
        offers = conn.protocol.offers
        if len(offers) >= MAX_LENT_PER_CONNECTION:  # first, forget the expired ones (results answered otherwise)
            now = time.monotonic_ns()
            for request_id in [r for r, offer in offers.items() if offer.expires_ns < now]:
                del offers[request_id]
        if len(offers) >= MAX_LENT_PER_CONNECTION or fields[0] in offers:
            conn.reply_error(frame, Status.BULK_ERROR, "cma: write declined: too many offers")
            return
        offers[fields[0]] = WriteOffer(frame.request_id, *fields[1:])

    def _offered_part(self, conn: Connection, offer: WriteOffer, size: int, own: int) -> int:
        """The bytes of a ``size``-byte answer we write ourselves on ``offer`` (its share of them, on a
        SPLIT_ALIGN boundary); 0 when we decline (``_split_write_declined``, or no such part: the answer is
        under SPLIT_MIN_BYTES, or larger than the offered buffer), the offer then answered so."""
        part = (size * offer.share >> 16) & -SPLIT_ALIGN if size >= SPLIT_MIN_BYTES else 0
        if size > offer.size:  # (its call fails: the caller's buffer is left alone)
            why: str | None = f"the answer's {size} bytes do not fit the offered {offer.size}"
        elif not part:
            why = f"no part of {size} bytes to write at a share of {offer.share / SHARE_ONE:.2f}"
        else:
            why = self._split_write_declined(conn, part, offer.expires_ns, own)
        if why is None:
            return part
        conn.send(
            encode_frame(
                K_RESPONSE, offer.request_id, pack_body(f"cma: write declined: {why}"), status=Status.BULK_ERROR
            )
        )
        return 0

    def _write_offered(self, conn: Connection, offer: WriteOffer, view: memoryview) -> None:
        """Write the part ``_offered_part`` gave, once the answer that names it has left (the reader copies
        the rest meanwhile), and answer the offer."""
        conn.flush()
        self._split_write(conn, offer.request_id, offer.dest, view, offer.mark)

    def withdraw_offer(self, conn: Connection, request_id: int) -> None:
        """The peer cancelled its request ``request_id``: decline its offer, if any (its caller waits for that)."""
        offer = conn.protocol.offers.pop(request_id, None)
        if offer is not None:
            body = pack_body("cma: write declined: the request was cancelled")
            conn.send(encode_frame(K_RESPONSE, offer.request_id, body, status=Status.BULK_ERROR))

    def _serve_cma_push(
        self,
        conn: Connection,
        frame: Frame,
        view: memoryview | None,
        error: str | None,
        source: int,
        source_id: bytes | None = None,
    ) -> None:
        """A push by cross-memory attach: read the pusher's source (its pid from the kernel, the address
        from its request) into the exposed range, then answer. Errors starting with "cma:" tell the pusher
        to send the data over the socket instead.

        When the pusher exposed its source for the push (``source_id``, a pusher that saw ``cma_split_push``
        in our HELLO), the read is a split read of it (``_cma_read``): the pusher, whose handler only waits
        for our answer, writes the first part into our buffer while we copy the rest."""
        if view is None:
            conn.reply_error(frame, Status.BULK_ERROR, error or "")
            return
        pid = conn.peer_pid
        if pid is None or not self.bulk_cma:
            conn.reply_error(frame, Status.BULK_ERROR, "cma: not available on this connection")
            return
        loop = self._loop or asyncio.get_running_loop()

        deadline = loop.time() + frame.deadline_usec / 1e6 if frame.deadline_usec else None

        async def serve() -> None:
            try:
                if source_id is None:
                    await cma_copy(loop, conn, source, view, deadline)
                else:
                    await cma_read(loop, self.monitor, conn, source_id, 0, source, view, deadline)
            except DeadlineExceeded as exc:  # first: a deadline is never a kernel refusal
                conn.reply_error(frame, Status.DEADLINE_EXCEEDED, str(exc))
                return
            except OSError as exc:
                conn.reply_error(frame, Status.BULK_ERROR, f"cma: {exc}")
                return
            finally:
                conn.serving.pop(frame.request_id, None)
            self.cma_bytes += len(view)
            self.monitor.record_bulk("served_cma_push", conn.peer_label, len(view), 0)
            conn.reply(frame, Status.OK, b"")

        self._track_serving(conn, frame, loop.create_task(serve()))

    def _track_serving(self, conn: Connection, frame: Frame, task: asyncio.Task[Any]) -> None:
        """A transfer served by a task: in the connection's table of served requests (a CANCEL finds it)."""
        try:
            conn.protocol.serve(frame.request_id, task)
        except RemoteProtocolError:  # a request id reused while in flight: the connection is dropped
            task.cancel()
            raise
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def on_push_data(self, conn: Connection, frame: Frame) -> None:
        """A BULK_DATA_PUSH frame, already written into its destination: a push it completes is answered."""
        incoming = conn.protocol.push_complete(frame.request_id)
        if incoming is not None and not incoming.frame.flags & F_NO_REPLY:  # (a push ahead is not answered)
            self._reply_push(conn, incoming.frame, incoming.error)

    def _reply_push(self, conn: Connection, frame: Frame, error: str | None) -> None:
        if error:
            conn.reply_error(frame, Status.BULK_ERROR, error)
        else:
            conn.reply(frame, Status.OK, b"")


def _push_ahead_fields(body: bytes | bytearray | memoryview | BinBody) -> tuple[bytes, int, int, int] | str:
    """A push ahead's BULK_PUSH body, ``[bulk id, offset >= 0, size >= 0, call id >= 0]``, decoded: the four
    fields, or what is wrong with it."""
    try:
        fields = unpack_body(body)
    except ProtocolError as exc:
        return str(exc)
    if not (type(fields) is list and len(fields) == 4):
        return "expected [bulk id, offset, size, call id]"
    bulk_id, offset, size, call_id = fields
    if not (
        type(bulk_id) is bytes
        and type(offset) is int
        and type(size) is int
        and type(call_id) is int
        and offset >= 0
        and size >= 0
        and call_id >= 0
    ):
        return "expected [bulk id (bytes), offset >= 0, size >= 0, call id >= 0]"
    return bulk_id, offset, size, call_id
