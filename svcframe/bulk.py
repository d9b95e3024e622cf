"""Bulk transfers: the RDMA analogue (Margo's ``margo_bulk_create`` / ``margo_bulk_transfer``).

A process *exposes* a buffer and gets a small, serialisable ``BulkHandle`` to pass in an RPC argument.
The peer *pulls* from it (reads the owner's bytes) or *pushes* into it (writes the owner's buffer) with
``Engine.pull`` / ``Engine.push``; the owner's engine serves the transfer in chunks without running any
user code, and the bytes move between the socket and the buffers without passing through msgpack.

This module makes transfers (``pull``, ``push``, and reads into the caller's buffer of results lent by
address); ``svcframe.bulk_serving`` serves them on the owner's side (``BULK_PULL`` answered by data frames,
``BULK_PUSH`` whose data frames land in the exposed buffer). Between processes of one node (``unix://``)
transfers of at least ``CMA_MIN_BYTES`` move by cross-memory attach (``svcframe.cma`` holds the system
calls; the policy of when to use it and when to fall back to the socket is here).

Handles are capabilities: 128 random bits, optionally bound to the one peer they were given to,
revoked by ``unexpose`` (and a bound one when its connection ends); a handler moves bulk data only for the
caller that exposed the handle; a pull into a new buffer allocates nothing before the owner has answered.

``BulkTransfers`` is the engine's part that makes transfers (``svcframe.engine.Engine`` holds one): what it
needs of the rest of the engine is given to it when it is made.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from . import cma
from .bulk_handles import BULK_ID_BYTES, MODES, READ, READ_WRITE, WRITE, BulkHandle, as_byte_view, short_id
from .cma import CMA_MIN_BYTES
from .deadlines import DeadlineExpired, Deadlines, wire_deadline
from .eager import DONE
from .errors import (
    BulkError,
    BulkUsageError,
    ConnectionLost,
    DeadlineExceeded,
    RemoteProtocolError,
    ResultTooLarge,
    Status,
    error_from_status,
)
from .monitoring import Monitor
from .protocol import IncomingPull
from .request import current_request
from .split_read import (
    SPLIT_MIN_BYTES,
    SPLIT_OFFER_SHARE,
    SplitWrite,
    cma_read,
)
from .wire import (
    Frame,
    Kind,
    encode_frame,
    pack_body,
    push_ahead_frames,
)

try:
    import cython
except ModuleNotFoundError:  # interpreted where Cython is not installed
    from . import _cython as cython

if not cython.compiled:  # (compiled: wire.pxd's C constants)
    from .wire import F_CMA, F_NO_REPLY

if TYPE_CHECKING:
    from .bulk_serving import BulkServing
    from .connections import Connections
    from .progress import Progress
    from .settings import EngineConfig
    from .transport import Connection

__all__ = ["MODES", "READ", "READ_WRITE", "WRITE", "BulkHandle", "BulkTransfers", "as_byte_view"]

log = logging.getLogger("svcframe.engine")


class _LazyDest:
    """The destination of ``pull(dest=None)``: its bytearray is allocated when the owner's first bytes
    arrive (or its address, for cross-memory attach), not when the request leaves, so a size a peer merely
    claims costs nothing. Quacks like the memoryview a bulk sink slices."""

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


class BulkTransfers:
    """The engine's part that moves bulk data (see the module docstring): pulling from and pushing into the
    buffers peers expose (``svcframe.bulk_serving.BulkServing`` exposes ours and serves the transfers peers
    make on them).

    Args:
        engine_id: the engine's id (a handle of its own is a local copy).
        connections: where connections to the owners come from.
        serving: the engine's exposed buffers (a transfer on one of ours is a local copy; the sources of our
            pushes by cross-memory attach are exposed there meanwhile).
        deadlines: the deadlines of the engine's outgoing operations.
        monitor, progress: the engine's statistics and progress loop.
        config: the engine's settings (``default_timeout_seconds``, ``allow_third_party_bulk``).
        bulk_cma: cross-memory attach is on for this engine (and supported here).

    Attributes:
        cma_bytes: bulk bytes moved by cross-memory attach by our transfers (pulls made).
    """

    def __init__(
        self,
        engine_id: str,
        connections: Connections,
        serving: BulkServing,
        deadlines: Deadlines,
        monitor: Monitor,
        progress: Progress,
        config: EngineConfig,
        bulk_cma: bool,
    ) -> None:
        self.engine_id = engine_id
        self.connections = connections
        self.serving = serving
        self.deadlines = deadlines
        self.monitor = monitor
        self.progress = progress
        self.default_timeout_seconds = config.default_timeout_seconds
        self.allow_third_party_bulk = config.allow_third_party_bulk
        self.bulk_cma = bulk_cma
        self.cma_bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The engine started on ``loop``."""
        self._loop = loop

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
            BulkUsageError: a bad range or mode, checked locally before anything is sent.
            BulkError: the owner refused the transfer.
            DeadlineExceeded: the deadline passed.
            ConnectionLost: the owner went away.
        """
        size = handle.size - offset if size is None else size
        _check_range(handle, offset, size, READ)
        if dest is None and handle.engine_id != self.engine_id and size:
            lazy = _LazyDest(size)  # allocated once the owner answers
            await self._pull_into(handle, offset, size, lazy, timeout_seconds)
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
        self, handle: BulkHandle, offset: int, size: int, target: memoryview | _LazyDest, timeout_seconds: float | None
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
        status, info, _ = await self._bulk_op(handle, Kind.BULK_PULL, offset, size, target, None, timeout_seconds)
        if status != Status.OK:
            raise error_from_status(status, info, "bulk pull", 0, _owner(handle))

    def push(
        self,
        handle: BulkHandle,
        src: Any,
        *,
        offset: int = 0,
        timeout_seconds: float | None = None,
        ahead: bool = True,
    ) -> Coroutine[Any, Any, None]:
        """Write all of ``src`` into the remote buffer at ``offset``; await what it returns.

        A handler's push into its own caller's buffer over the socket goes *ahead of the answer* (``ahead``,
        when the caller's engine takes it: HELLO ``push_ahead``): its data frames leave on the caller's
        connection before the handler's answer, and the push returns once they are written (``src`` may then
        be reused: the transport keeps what it has not written by reference, so a source other than ``bytes``
        is copied when it goes in one write, and waited for until the transport has written it when it goes
        in chunks), without waiting for the caller's acknowledgement. The caller places the bytes before it
        reads the answer, so its call returns with them in place, one round trip for the read as with a
        Margo handler's ``HG_BULK_PUSH``; a push the caller refuses (the handle revoked, out of range) fails
        the caller's call with BulkError, not the push. ``ahead=False`` waits for the owner's answer, as every
        other push does.

        The range is checked when ``push`` is called. A push that can be done at once (into a buffer of this
        engine's, or ahead of the answer in one write, the common read) is done then, and ``push`` returns a
        coroutine already finished (``svcframe.eager.DONE``), so a sync handler may ``return
        req.engine.push(...)`` and be answered in its batch (64 KiB push reads: ``python
        tools/profile_client.py --read 65536 --method push``, the server's CPU per read, in the README). Any
        other push runs when awaited. Either way ``src`` must not change until what ``push`` returned has
        completed.

        Raises (when called): BulkUsageError (bad range or mode, checked locally).
        Raises (when awaited): BulkError (refused by the owner), DeadlineExceeded, ConnectionLost.
        """
        view = as_byte_view(src, writable=False)
        size = len(view)
        _check_range(handle, offset, size, WRITE)
        if handle.engine_id == self.engine_id:
            self._local_source(handle, offset, size, WRITE)[:] = view
            return DONE
        if ahead:  # (cross-memory attach first, when the caller's connection may take it: see _cma_push)
            req = current_request.get()
            if (
                req is not None
                and (size < CMA_MIN_BYTES or not (self.bulk_cma and req.conn.peer_cma))
                and self._push_ahead_now(req, handle, offset, view)
            ):
                return DONE
        return self._push(handle, offset, view, timeout_seconds, ahead)

    async def _push(
        self, handle: BulkHandle, offset: int, view: memoryview, timeout_seconds: float | None, ahead: bool
    ) -> None:
        """``push``'s part that waits: by cross-memory attach, ahead of the answer in chunks, or answered."""
        size = len(view)
        if self.bulk_cma and size >= CMA_MIN_BYTES:
            loop = self._loop or asyncio.get_running_loop()
            deadline = loop.time() + (self.default_timeout_seconds if timeout_seconds is None else timeout_seconds)
            if await self._cma_push(handle, offset, view, timeout_seconds):
                return
            timeout_seconds = deadline - loop.time()  # the socket path gets what is left, not the full time
            if timeout_seconds <= 0:
                raise DeadlineExceeded(f"push of {size} bytes to {handle.address}: the deadline passed")
        if ahead and await self._push_ahead(handle, offset, view, timeout_seconds):
            return
        status, info, _ = await self._bulk_op(handle, Kind.BULK_PUSH, offset, size, None, view, timeout_seconds)
        if status != Status.OK:
            raise error_from_status(status, info, "bulk push", 0, _owner(handle))

    def _push_ahead_now(self, req: Any, handle: BulkHandle, offset: int, src: memoryview) -> bool | None:
        """A push into ``handle`` by the handler of ``req`` (a ``svcframe.request.Request``), ahead of its
        answer in one write (see ``_push_ahead``): True when written; False when it goes ahead but not now
        (over one frame, the socket paused or closed: ``_push_ahead``'s chunks); None when it does not go
        ahead: the handle is not the caller's, the caller does not take pushes ahead, or the request takes no
        answer."""
        conn: Connection = req.conn
        frame: Frame = req.frame
        if conn.peer_engine_id != handle.engine_id or not conn.peer_push_ahead or frame.flags & F_NO_REPLY:
            return None
        size = len(src)
        if size > conn.whole_frame_bytes or conn.writing_paused or conn.closed:
            return False
        frames = push_ahead_frames(conn.next_request_id(), handle.bulk_id, offset, size, frame.request_id)
        if size:  # (a mutable source is copied: the caller may change it once we return, before it is written)
            conn.send_many((frames, src if type(src.obj) is bytes else bytes(src)))
        else:  # (announced only: no data frame follows)
            conn.send(frames)
        self.monitor.record_bulk("push", conn.peer_label, size, 0)  # (written in this turn: no time passed)
        return True

    async def _push_ahead(
        self, handle: BulkHandle, offset: int, src: memoryview, timeout_seconds: float | None
    ) -> bool:
        """A handler's push into its caller's buffer, ahead of its answer (see ``push``): a BULK_PUSH flagged
        NO_REPLY, body ``[bulk id, offset, size, the call's request id]``, and its data frames, on the caller's
        connection. False (push as usual) outside a handler, for a handle of another engine's, for a request
        that takes no answer, or for a caller that does not take pushes ahead.

        Raises:
            DeadlineExceeded: the data could not be written in time (a reader that does not read);
            ConnectionLost.
        """
        req = current_request.get()
        now = None if req is None else self._push_ahead_now(req, handle, offset, src)
        if now is None or now:  # not ahead (pushed as usual), or written
            return now is not None
        assert req is not None  # (now is False: a handler's push that goes ahead, later)
        conn: Connection = req.conn
        if conn.closed:
            raise conn.close_reason or ConnectionLost(f"connection to {handle.address} is closed")
        loop = self._loop or asyncio.get_running_loop()
        start = loop.time()
        timeout = self.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        size = len(src)
        request_id = conn.next_request_id()
        header = push_ahead_frames(request_id, handle.bulk_id, offset, size, req.frame.request_id, data=False)
        try:
            async with asyncio.timeout(timeout):
                await conn.send_data(Kind.BULK_DATA_PUSH, request_id, src, header)
                if type(src.obj) is not bytes:  # the transport keeps what it has not written by reference: the
                    await conn.flushed()  # caller may change its source once we return (no copy: 64 MiB pushes)
        except TimeoutError:
            conn.cancel(request_id)  # (the owner forgets the push it will not get the rest of)
            raise DeadlineExceeded(f"push of {size} bytes: not written within {timeout:g} s") from None
        except asyncio.CancelledError:
            conn.cancel(request_id)
            raise
        if conn.closed:
            raise conn.close_reason or ConnectionLost(f"connection to {handle.address} is closed")
        self.monitor.record_bulk("push", conn.peer_label, size, int((loop.time() - start) * 1e9))
        return True

    def _local_source(self, handle: BulkHandle, offset: int, size: int, need: str) -> memoryview:
        entry = self.serving.exposed.get(handle.bulk_id)
        if entry is None or need not in entry[1] or offset + size > len(entry[0]):
            raise BulkError(f"bulk handle {short_id(handle.bulk_id)} is not exposed for {need!r} here, or out of range")
        return entry[0][offset : offset + size]

    async def _cma_pull(
        self, handle: BulkHandle, offset: int, target: memoryview | _LazyDest, timeout_seconds: float | None
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
        offer = None  # the owner may write part of the range into a buffer of the caller's as it answers
        if conn.peer_cma_offer and isinstance(target, memoryview) and len(target) >= SPLIT_MIN_BYTES:
            offer = SplitWrite(loop, conn, conn.offer_share or SPLIT_OFFER_SHARE, dest=target)
        try:
            status, answer, _ = await self._bulk_op(
                handle,
                Kind.BULK_PULL,
                offset,
                len(target),
                None,
                None,
                deadline - loop.time(),
                by_cma=True,
                offer=offer,
            )
        except BaseException:
            if offer is not None:  # no answer: the owner may still write
                await offer.settle()
            raise
        if status != Status.OK:  # (answered: an offer the owner did not take it will not take)
            if offer is not None:
                offer.drop()
            if _cma_refused(status, answer):
                conn.peer_cma = False  # the owner cannot serve it: the socket from now on
                return False
            raise error_from_status(status, answer, "bulk pull", 0, _owner(handle))
        address, part = answer if offer is not None and isinstance(answer, list) and len(answer) == 2 else (answer, 0)
        if not (isinstance(address, int) and address > 0 and isinstance(part, int) and 0 <= part <= len(target)):
            if offer is not None:  # the owner may be writing all the same
                await offer.settle()
            raise RemoteProtocolError(f"a cross-memory pull was answered with {answer!r:.40}, not an address")
        if isinstance(target, _LazyDest):
            target = target.materialize()  # the owner answered: now the destination is allocated
        try:
            await cma_read(loop, self.monitor, conn, handle.bulk_id, offset, address, target, deadline, offer, part)
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

    def offer_write(self, conn: Connection, request_id: int, dest: memoryview, request: bytes) -> SplitWrite | None:
        """Send an ``into=`` request ``request_id`` over ``unix://`` (the encoded frame ``request``), and, when
        the peer takes offers (``Connection.peer_cma_offer``) and ``dest`` is SPLIT_MIN_BYTES or more, before it
        in the same write an offer to write the first part of the result it will lend into ``dest`` (a
        BULK_PULL flagged CMA and INTO, body ``[request id, destination, size, expires_ns, mark address, share
        in 1/65536ths]``): its write then starts as its answer leaves, a round trip before a split read's
        request would reach it. Returns the offer, or None when none was made. The caller ends the offer:
        ``_take_lent`` with it, ``drop()`` when the request was answered without a lend, ``settle()`` when it
        was not answered (cancelled, timed out, connection lost)."""
        size = len(dest)
        if not conn.peer_cma_offer or size < SPLIT_MIN_BYTES:
            conn.send(request)
            return None
        share = conn.offer_share or SPLIT_OFFER_SHARE
        offer = SplitWrite(self._loop or asyncio.get_running_loop(), conn, share, dest=dest)
        conn.send_many((offer.offer_frame(request_id), request))
        return offer

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
        status, info, _ = await self._bulk_op(
            handle, Kind.BULK_PUSH, offset, len(src), None, src, timeout_seconds, by_cma=True
        )
        if status == Status.OK:
            return True
        if _cma_refused(status, info):
            conn.peer_cma = False  # the kernel refused the owner: the socket from now on
            return False
        raise error_from_status(status, info, "bulk push", 0, _owner(handle))

    async def _peer_connection(self, handle: BulkHandle, timeout_seconds: float) -> Connection:
        """The connection to the handle's owner. Inside a handler, a handle of the caller's own engine is
        reached over the connection the caller called on: the transfer is made on behalf of whoever
        presented the handle, never of another peer that merely claims the same engine id in its HELLO.
        Otherwise: a connection we dialled, or an authenticated accepted one, to that engine;
        else the handle's address is dialled and the engine found there must be the owner."""
        req = current_request.get()  # the handler's request, if we run inside one (svcframe.request)
        if req is not None:
            caller: Connection = req.conn
            if caller.peer_engine_id == handle.engine_id and not caller.closed:
                return caller
            if not self.allow_third_party_bulk:  # no confused deputy: a caller cannot aim us at another engine
                raise BulkError(
                    f"the bulk handle belongs to engine {handle.engine_id[:8]}…, not to the caller "
                    f"({(caller.peer_engine_id or '?')[:8]}…): a handler moves bulk data only for the caller that "
                    "exposed it (engine.allow_third_party_bulk allows handles passed on by others)"
                )
        conn = self.connections.peers.get(handle.engine_id)
        if conn is not None and not conn.closed:
            return conn
        if handle.address is None:
            raise BulkError("the bulk handle's owner has no address and no connection to us")
        conn = await self.connections.connection(handle.address, timeout_seconds)
        if conn.peer_engine_id != handle.engine_id:
            raise BulkError(f"the engine at {handle.address} no longer owns this bulk handle (it restarted)")
        return conn

    async def take_lent(
        self,
        conn: Connection,
        address: str,
        request_id: int,
        fields: Any,
        into: memoryview,
        deadline: float,
        offer: SplitWrite | None = None,
    ) -> int:
        """Copy a result lent by address (see ``_lend``) into ``into`` and release it; over the socket when the
        kernel refuses the copy. Returns the result's size. With ``offer`` (``_offer_write``) the answer says
        how many of the first bytes the peer is writing itself.

        Raises:
            RemoteProtocolError: the answer is not [size, address, bulk id] (and, to an offer, the bytes the
            peer writes, at most the size); ResultTooLarge: the result is larger than ``into``; BulkError,
            DeadlineExceeded, ConnectionLost (the socket fallback).
        """
        try:
            if (
                not isinstance(fields, list)
                or len(fields) != (3 if offer is None else 4)
                or not all(isinstance(v, int) and v > 0 for v in fields[:2])
                or not isinstance(fields[2], bytes)
                or len(fields[2]) != BULK_ID_BYTES
                or (offer is not None and not (isinstance(fields[3], int) and 0 <= fields[3] <= fields[0]))
            ):
                raise RemoteProtocolError(f"a result lent by address was answered with {fields!r:.60}")
            size: int = fields[0]
            source: int = fields[1]
            bulk_id: bytes = fields[2]
            part: int = fields[3] if offer is not None else 0
            if size > len(into):
                raise ResultTooLarge(f"the result is {size} bytes; the buffer given as into= holds {len(into)}")
            loop = self._loop or asyncio.get_running_loop()
            dest = into[:size]
            try:
                ending, offer = offer, None  # (ended by cma_read, whatever happens there)
                await cma_read(loop, self.monitor, conn, bulk_id, 0, source, dest, deadline, ending, part)
                self.cma_bytes += size
                return size
            except OSError as exc:
                if exc.errno in _CMA_REFUSED:
                    conn.peer_cma = False  # the kernel will keep refusing: the socket from now on
                    log.warning("cross-memory read from pid %s refused (%s); this connection uses the socket",
                                conn.peer_pid, exc)  # fmt: skip
            handle = BulkHandle(address, conn.peer_engine_id or "", bulk_id, size, READ)
            await self.pull(handle, dest, timeout_seconds=max(deadline - loop.time(), 0.0))
            return size
        finally:
            if offer is not None:  # a bad answer: the peer may be writing all the same
                await offer.settle()
            conn.cancel(request_id)  # read (or given up): the owner may let it go

    async def _bulk_op(
        self,
        handle: BulkHandle,
        kind: Kind,
        offset: int,
        size: int,
        dest: memoryview | _LazyDest | None,
        src: memoryview | None,
        timeout_seconds: float | None,
        *,
        by_cma: bool = False,
        offer: SplitWrite | None = None,
    ) -> tuple[int, Any, int]:
        """Send a BULK_PULL or BULK_PUSH and wait for its completion. A push sends its data frames, or with
        ``by_cma`` the address of ``src`` for the owner to read; a pull with ``by_cma`` asks for the
        range's address instead of its data, after ``offer`` when given (``SplitWrite.offer_frame``)."""
        loop = self._loop or asyncio.get_running_loop()
        timeout = self.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        start = loop.time()
        conn = await self._peer_connection(handle, timeout)
        if conn.closed:
            raise conn.close_reason or ConnectionLost(f"connection to {handle.address} is closed")
        request_id = conn.next_request_id()
        future: asyncio.Future[tuple[int, Any, int]] = loop.create_future()
        conn.pending[request_id] = future
        if dest is not None:
            conn.protocol.pulls[request_id] = IncomingPull(dest)
        self.progress.inflight += 1
        if not self.progress.blocking:
            self.progress.activity()
        self.deadlines.add(start + timeout, conn.pending, request_id)
        deadline_usec = wire_deadline(timeout - (loop.time() - start))
        source_id = None
        if by_cma:  # a pull asks for the range's address; a push gives its source's (kept until answered)
            fields: list[Any] = [handle.bulk_id, offset, size]
            if src is not None:
                fields.append(cma.buffer_address(src))
                if conn.peer_cma_split_push and size >= SPLIT_MIN_BYTES:  # and exposes it for a split read
                    source_id = secrets.token_bytes(BULK_ID_BYTES)
                    self.serving.exposed[source_id] = (src, READ, None)
                    self.serving.push_sources[source_id] = 1 if current_request.get() is None else 2
                    fields.append(source_id)
            body = pack_body(fields)
            header = encode_frame(kind, request_id, body, deadline_usec=deadline_usec, flags=F_CMA)
        else:
            header = encode_frame(
                kind, request_id, pack_body([handle.bulk_id, offset, size]), deadline_usec=deadline_usec
            )
        try:
            if offer is not None:
                conn.send_many((offer.offer_frame(request_id), header))
            elif src is None or by_cma:
                conn.send(header)
            else:
                await conn.send_data(Kind.BULK_DATA_PUSH, request_id, src, header, future)
            return await future
        except DeadlineExpired:
            conn.cancel(request_id)
            raise DeadlineExceeded(f"bulk {kind.name} of {size} bytes: no completion within {timeout:g} s") from None
        except asyncio.CancelledError:
            conn.cancel(request_id)
            raise
        finally:
            conn.pending.pop(request_id, None)
            conn.protocol.pulls.pop(request_id, None)
            if source_id is not None:  # (the view is the caller's: not released)
                self.serving.exposed.pop(source_id, None)
                self.serving.push_sources.pop(source_id, None)
            self.progress.inflight -= 1
            if not self.progress.blocking:
                self.progress.activity()
            if not (by_cma and kind == Kind.BULK_PULL):  # a cross-memory pull is recorded with its copy
                what = ("cma_" if by_cma else "") + ("pull" if kind == Kind.BULK_PULL else "push")
                self.monitor.record_bulk(what, conn.peer_label, size, int((loop.time() - start) * 1e9))


#: errno values after which a connection stops trying cross-memory attach (permission, no such process,
#: not implemented); other errors (EFAULT: a stale handle) only fall back for that one transfer.
_CMA_REFUSED = frozenset({1, 3, 38})


def _owner(handle: BulkHandle) -> str:
    """Where a handle's buffer lives, for messages: its owner's address, or its engine id when it has none."""
    return handle.address or f"engine {handle.engine_id[:8]}…"


def _cma_refused(status: int, info: Any) -> bool:
    """A BULK_ERROR whose message starts with "cma:": the owner cannot take part in cross-memory attach
    on this connection (the transfer itself may still go over the socket)."""
    return status == Status.BULK_ERROR and str(info).startswith("cma:")


def _check_range(handle: BulkHandle, offset: int, size: int, need: str) -> None:
    if need not in handle.mode:
        raise BulkUsageError(
            f"bulk handle is exposed as {handle.mode!r}; it cannot be {'pulled' if need == READ else 'pushed'}"
        )
    if offset < 0 or size < 0 or offset + size > handle.size:
        raise BulkUsageError(f"range {offset}+{size} is outside the {handle.size}-byte bulk handle")
