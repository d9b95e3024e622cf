"""Split reads: two processes' cores copy one cross-memory read.

A reader of a peer's memory (``svcframe.cma``) has the peer write the first part of the range into the
reader's buffer (one ``process_vm_writev``, then a mark) while it copies the rest itself. It asks after the
peer's answer gave the range's address (a *split read's request*), or, when its buffer is known before it
asks (an ``into=`` call, a pull into a caller's buffer), it sends an *offer* with its request and the peer
writes as its answer leaves. The peer may decline (busy, out of its time budget, expired): the reader then
copies all of it. The rules for writing into a peer's memory are svcframe.cma's.

This module holds the reader's side (``SplitWrite``), the share rule (``next_share``) and the figures both
sides use; the writer's side, which is an engine's (its time budget, whether it is busy), is
``svcframe.bulk_serving.BulkServing``.
"""

from __future__ import annotations

import asyncio
import platform
import time
from typing import TYPE_CHECKING, Any

from . import cma
from .errors import DeadlineExceeded, Status
from .wire import F_CMA, F_INTO, Kind, encode_frame, pack_body

if TYPE_CHECKING:
    from .monitoring import Monitor
    from .transport import Connection

#: A cross-memory read of at least this many bytes is split between the two processes; a smaller one is
#: copied whole by the reader (one copy of 512 KiB takes about what the extra message costs).
SPLIT_MIN_BYTES = 1024 * 1024
#: The writer's part of a split read: at first (it starts later than the reader: its request crosses the
#: socket), then adapted per connection by SPLIT_SHARE_STEP a read, up when the writer had ended when the
#: reader did, down when not (``next_share``): the two end together, whatever each copy's speed.
SPLIT_WRITER_SHARE = 0.45
#: ... and of a read by offer (the writer starts first, as its answer leaves)
SPLIT_OFFER_SHARE = 0.55
SPLIT_SHARE_STEP = 0.01
SPLIT_SHARE_MIN, SPLIT_SHARE_MAX = 0.2, 0.8
#: The most one split-read write may copy, in bytes: it runs on the writer's event loop (about 1 ms at most).
SPLIT_MAX_PART_BYTES = 8 * 1024 * 1024
#: The share of our time one peer's split-read writes may take, and the most they may take in one burst,
#: in seconds: a reader at full speed takes about half (the writer copies while the reader does).
SPLIT_WRITE_SHARE_OF_TIME = 0.75
SPLIT_WRITE_BURST_SECONDS = 0.005
SPLIT_ALIGN = 64 * 1024  # the parts meet on a page boundary (a multiple of every page size in use)
SHARE_ONE = 1 << 16  # an offer's share travels in 1/65536ths
#: The peer's mark shows its part is in place only where the CPU keeps the order of stores (x86-64's TSO:
#: the kernel copies the mark after the data); elsewhere the reader waits for the peer's answer.
MARK_ORDERED = platform.machine().lower() in ("x86_64", "amd64")
#: A split read's write request expires this long after it was sent (a writer that reads it later declines:
#: it is busy; it reads one at once otherwise, within tens of µs)...
SPLIT_EXPIRY_NS = 20_000_000
#: ... and without the writer's answer the reader keeps its caller's buffer until this long after that (a
#: writer that checked the expiry just before it is still writing).
SPLIT_GRACE_NS = 200_000_000
#: Before that wait, the reader polls the writer's mark for this long (the writer usually ends within tens
#: of µs of the reader).
SPLIT_SPIN_SECONDS = 100e-6
#: Copies up to this size run on the event loop (a few hundred µs at most); larger ones in a worker thread,
#: in pieces of _CMA_PIECE_BYTES with the deadline checked between them.
_CMA_INLINE_BYTES = 8 * 1024 * 1024
_CMA_PIECE_BYTES = 8 * 1024 * 1024


def next_share(share: float, writer_first: bool) -> float:
    """The writer's share of the next split read on a connection: a step more when the writer had ended by
    the time the reader did (``writer_first``), a step less when the reader had to wait for it, within
    [SPLIT_SHARE_MIN, SPLIT_SHARE_MAX]."""
    return min(max(share + (SPLIT_SHARE_STEP if writer_first else -SPLIT_SHARE_STEP), SPLIT_SHARE_MIN), SPLIT_SHARE_MAX)


def marked(mark: bytearray, request_id: int) -> bool:
    """True once the peer has written ``request_id`` into ``mark``: its part of a split read is in place.
    Polls for up to SPLIT_SPIN_SECONDS: a part that ends a little after ours is then taken without a trip
    through the event loop (its answer wakes a blocking loop later than that)."""
    if int.from_bytes(mark, "little") == request_id:
        return True
    clock = time.perf_counter
    end = clock() + SPLIT_SPIN_SECONDS
    while clock() < end:
        if int.from_bytes(mark, "little") == request_id:
            return True
    return False


async def wait_written(answer: asyncio.Future[tuple[int, Any, int]], until_ns: int) -> bool:
    """Wait for the peer's answer to a split read's write request: True when it wrote its part. Until the
    answer or ``until_ns`` (``time.monotonic_ns``) the peer may be writing into our caller's buffer
    (svcframe.cma), so the wait goes on through a cancellation of the caller (re-raised after) and through
    the connection's end (the future fails: a peer that has not read the request yet still may), to
    ``until_ns`` at most."""
    cancelled = False
    while not (answer.done() and not answer.cancelled() and answer.exception() is None):
        left = (until_ns - time.monotonic_ns()) / 1e9
        if left <= 0:
            break
        try:
            if answer.done():  # ended without an answer
                await asyncio.sleep(left)
            else:
                await asyncio.wait((answer,), timeout=left)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    if not answer.done():
        answer.cancel()
        return False
    return not answer.cancelled() and answer.exception() is None and answer.result()[0] == Status.OK


class SplitWrite:
    """The reader's side of one write the peer makes into our buffer (a split read's first part): the
    request id its answer comes under, the mark it writes once its part is in place, when the request
    expires, and the share of the read it was asked for (``offered``: by an offer, else by a split read's request). Every one is ended by ``written``, ``drop`` or ``settle``."""

    __slots__ = ("answer", "conn", "dest", "expires_ns", "mark", "offered", "request_id", "share")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: Connection,
        share: float,
        *,
        dest: memoryview | None = None,
        offered: bool = True,
    ) -> None:
        self.conn = conn
        self.dest = dest  # an offer's: the buffer it offers to have written
        self.share = share
        self.offered = offered
        self.request_id = conn.next_request_id()
        self.answer: asyncio.Future[tuple[int, Any, int]] = loop.create_future()
        conn.pending[self.request_id] = self.answer
        self.mark = bytearray(8)  # the peer writes our request id here once its part is all in place (svcframe.cma)
        self.expires_ns = time.monotonic_ns() + SPLIT_EXPIRY_NS

    def offer_frame(self, request_id: int) -> bytes:
        """The offer to write our share of the answer to our request ``request_id`` into ``dest``, sent just
        before that request (BULK_PULL flagged CMA and INTO, its body ``[request id, destination, size,
        expires_ns, mark address, share in 1/65536ths]``: ``svcframe.bulk_serving.BulkServing._on_write_offer``)."""
        dest = self.dest
        assert dest is not None
        fields = [request_id, cma.buffer_address(dest), len(dest), self.expires_ns, self.mark_address(),
                  int(self.share * SHARE_ONE)]  # fmt: skip
        return encode_frame(Kind.BULK_PULL, self.request_id, pack_body(fields), flags=F_CMA | F_INTO)

    def request_frame(self, bulk_id: bytes, offset: int, part: int, dest: memoryview) -> bytes:
        """The request to write the first ``part`` bytes of the peer's exposed range ``bulk_id[offset:]`` into
        ``dest``, sent after its answer gave the range's address (BULK_PULL flagged CMA, its body ``[bulk id,
        offset, part, destination, expires_ns, mark address]``: ``svcframe.bulk_serving.BulkServing._serve_cma_write``)."""
        fields = [bulk_id, offset, part, cma.buffer_address(dest), self.expires_ns, self.mark_address()]
        return encode_frame(Kind.BULK_PULL, self.request_id, pack_body(fields), flags=F_CMA)

    def mark_address(self) -> int:
        """Where the peer writes its mark; 0 (no mark: wait for its answer) where stores may be reordered."""
        return cma.buffer_address(memoryview(self.mark)) if MARK_ORDERED else 0

    async def written(self) -> bool:
        """Once our own part is copied: True when the peer wrote its part (its mark is there, or it answered
        so), False when it did not and will not (it declined, or the request is ``SPLIT_GRACE_NS`` past its
        expiry). Waits through a cancellation of our caller (re-raised after: see ``wait_written``). Moves the
        connection's share a step (``next_share``) toward where the two copies end together."""
        conn, request_id = self.conn, self.request_id
        first = MARK_ORDERED and int.from_bytes(self.mark, "little") == request_id
        try:
            written = (
                first
                or (MARK_ORDERED and marked(self.mark, request_id))
                or await wait_written(self.answer, self.expires_ns + SPLIT_GRACE_NS)
            )
        finally:
            conn.pending.pop(request_id, None)  # (an answer after the mark is dropped when it comes)
        if written and MARK_ORDERED:
            if self.offered:
                conn.offer_share = next_share(self.share, first)
            else:
                conn.split_share = next_share(self.share, first)
        return written

    def drop(self) -> None:
        """The peer will not write (its request was answered without a lend, or it declined): forget it."""
        self.conn.pending.pop(self.request_id, None)

    async def settle(self) -> None:
        """The offer's request was not answered (cancelled, timed out, connection lost) or answered wrongly: wait
        until the peer cannot be writing (its mark or answer, or the grace after the expiry; through a
        cancellation of our caller, re-raised after)."""
        try:
            if not (MARK_ORDERED and int.from_bytes(self.mark, "little") == self.request_id):
                await wait_written(self.answer, self.expires_ns + SPLIT_GRACE_NS)
        finally:
            self.conn.pending.pop(self.request_id, None)


async def cma_copy(
    loop: asyncio.AbstractEventLoop, conn: Connection, address: int, dest: memoryview, deadline: float | None
) -> None:
    """``cma.read`` inline when small, else piece by piece in the loop's default executor (the copy
    releases the GIL). Nothing is written into ``dest`` after this returns or raises.

    Raises:
        OSError (see cma.read); DeadlineExceeded when ``deadline`` (loop time) passes between two pieces.
    """
    pid, process = conn.peer_pid, conn.peer_process
    if pid is None or process is None or not process.alive():
        raise OSError(3, f"the peer's process {pid} is gone (its pid may now be another process's)")  # ESRCH
    size = len(dest)
    if size <= _CMA_INLINE_BYTES:
        cma.read(pid, address, dest)
        return
    for pos in range(0, size, _CMA_PIECE_BYTES):
        if deadline is not None and loop.time() > deadline:
            raise DeadlineExceeded(f"cross-memory transfer of {size} bytes: the deadline passed after {pos} bytes")
        await loop.run_in_executor(None, cma.read, pid, address + pos, dest[pos : pos + _CMA_PIECE_BYTES])


async def cma_read(
    loop: asyncio.AbstractEventLoop,
    monitor: Monitor,
    conn: Connection,
    bulk_id: bytes,
    offset: int,
    source: int,
    dest: memoryview,
    deadline: float | None,
    offer: SplitWrite | None = None,
    part: int = 0,
) -> None:
    """Copy the peer's exposed range ``bulk_id[offset:offset + len(dest)]``, at address ``source`` in its
    memory, into ``dest``. A range of SPLIT_MIN_BYTES or more is a *split read* when the peer takes part
    (``Connection.peer_cma_write``): we ask it to write the first part of the range (its share of it,
    ``Connection.split_share``) into ``dest`` (a BULK_PULL flagged CMA naming the destination, when the
    request expires and where to put its mark) and copy the rest meanwhile, so that its core and ours copy
    at once; if it declines (busy, or any error) we copy its part too. With ``offer`` the peer was asked
    before it answered (``BulkTransfers.offer_write``) and is writing the first ``part`` bytes already (none: it
    declined, and we ask as without an offer). ``dest`` is not given back before the peer's mark is there, or it answered, or the request
    is ``SPLIT_GRACE_NS`` past its expiry (svcframe.cma), even if our caller is cancelled meanwhile.

    Why split: one core's copy is the limit of a large read (two cores copy about twice what one does), so
    a split read beats the reader copying all of it, and matches or beats ``cma copy`` (one process_vm_readv
    per read and no message) in ``svcframe bench --workload client-read``. An offer gains a few per cent
    more: the owner's write starts as its answer leaves, where a request sent after the answer reaches it
    only after the reader's wake-up, its request and the owner's.

    Raises:
        OSError (svcframe.cma.read), DeadlineExceeded: as ``cma_copy``.
    """
    size = len(dest)
    if offer is not None and not part:  # the peer declined its offer (e.g. it expired: a slow handler)
        offer.drop()
        offer = None
    if offer is None:
        share = conn.split_share or SPLIT_WRITER_SHARE
        if not (conn.peer_cma_write and size >= SPLIT_MIN_BYTES and size * share <= SPLIT_MAX_PART_BYTES):
            await cma_copy(loop, conn, source, dest, deadline)
            return
        part = int(size * share) & -SPLIT_ALIGN  # the peer's: the first bytes
        offer = SplitWrite(loop, conn, share, offered=False)
        conn.send(offer.request_frame(bulk_id, offset, part, dest))
    try:
        await cma_copy(loop, conn, source + part, dest[part:], deadline)  # ours, while the peer writes
    finally:
        written = await offer.written()
    if not written:
        await cma_copy(loop, conn, source, dest[:part], deadline)
    else:
        monitor.record_bulk("cma_written", conn.peer_label, part, 0)
