"""The incremental frame decoder: the receiving side of the wire format (``svcframe.wire``), sans-IO.

Bytes go in (copied by ``feed``, or received straight into the decoder's own buffer through ``get_buffer`` and
``buffer_updated``, as ``asyncio.BufferedProtocol`` does), frames come out; a bulk data body is received
straight into the destination its *bulk sink* names. Three kinds of frame never come out as frames, because
the decoder completes them itself where a dispatch would only copy or answer:

* the OK answer to one of our calls (``answers``): its future gets ``(0, value, body length)``;
* the data frame that completes a call taking its result into its own buffer (``into_pulls``): its future gets
  the byte count;
* a push ahead of our call's answer (``place_ahead``): its data is copied where the placer says.

Decoder invariant (fuzzed in tests/test_wire.py): any byte string fed in any split either yields the
frames that were encoded, or raises ``RemoteProtocolError`` (never another exception), and never
allocates more than ``max_body_bytes`` for a body it has not yet validated.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from typing import Any

from .errors import FrameTooLarge, ProtocolError, RemoteProtocolError
from .wire import (
    _KIND_MAX,
    ALL_KINDS_MASK,
    DEFAULT_MAX_BODY_BYTES,
    HEADER,
    MAGIC,
    ZERO_TRACE_ID,
    BinBody,
    Frame,
    Kind,
    lazy_buffer,
    unpack_body,
)

try:
    import cython
except ModuleNotFoundError:  # interpreted where Cython is not installed
    from . import _cython as cython

if not cython.compiled:  # (compiled: wire.pxd's C constants, and the C functions decoder.pxd names)
    from .wire import (
        F_INTO,
        F_NO_REPLY,
        HEADER_SIZE,
        K_BULK_DATA_PUSH,
        K_BULK_DATA_REPLY,
        K_BULK_PUSH,
        K_RESPONSE,
        WIRE_VERSION,
    )

    PyBytes_FromStringAndSize: Any = None
    PyBytes_AS_STRING: Any = None
    PyBuffer_FillInfo: Any = None
    PyObject_GetBuffer: Any = None
    PyBuffer_Release: Any = None
    PyBUF_WRITABLE: Any = None
    memcpy: Any = None
    Py_buffer: Any = None
    _u16: Any = None  # (these four: svcframe/_bytes.pxd)
    _u32: Any = None
    _u64: Any = None
    _u32be: Any = None

__all__ = ["KEEP_RECEIVE_BYTES", "BulkSink", "FrameDecoder", "PlaceAhead"]

#: The header as the decoder reads it: the same 80 bytes as HEADER, with the magic as an int and the
#: trace id as two words (no bytes objects are created for an untraced frame).
_DECODE = struct.Struct("<HBBHHIIQIHHIIQQQQQ")
_MAGIC_INT = int.from_bytes(MAGIC, "little")
assert _DECODE.size == HEADER.size and struct.calcsize("<HBBHHIIQIHHIIQ") == 48  # trace id at bytes 48-63

#: Receive-buffer bytes an idle connection keeps committed; pages above are given back (FrameDecoder).
KEEP_RECEIVE_BYTES = 32 * 1024
#: After a bulk data chunk of HEADER_FIRST_AFTER_BYTES or more, the next read takes the next header and
#: AFTER_DATA_TAIL_BYTES more (FrameDecoder.get_buffer), so that more data is received into its destination,
#: not copied, and a read by into=, pull or push ends with its RESPONSE in one read, not a header read and a
#: body read. After a smaller chunk, reads go on into the receive buffer (its copy costs less than the reads).
HEADER_FIRST_AFTER_BYTES = 128 * 1024
AFTER_DATA_TAIL_BYTES = 256

#: A bulk sink maps (kind, request_id, body_length) to the buffer the data goes into, or raises
#: RemoteProtocolError when nobody expects that data.
BulkSink = Callable[[int, int, int], memoryview]
#: A push ahead's placer maps (the BULK_PUSH's request id, the bulk id, offset and size its body names, the size
#: being its data's length) to the buffer of exactly that length the data goes into, or None: the frames are then
#: decoded as usual (FrameDecoder.place_ahead).
PlaceAhead = Callable[[int, bytes, int, int], "memoryview | None"]


class FrameDecoder:
    """Incremental frame decoder with a zero-copy receive interface.

    Two ways to feed it:

    * ``feed(data) -> list[Frame]``: copies ``data`` in (tests, fuzzing, any byte source);
    * ``get_buffer() -> memoryview`` then ``buffer_updated(n) -> list[Frame] | None``: the caller receives
      straight into the decoder's buffer (``asyncio.BufferedProtocol``). While a bulk data body is being
      received, ``get_buffer`` returns the destination itself, so bulk bytes land in the user's buffer.
      None: the read completed frames, all of which the decoder completed itself (see the module docstring).

    Args:
        max_body_bytes: largest body accepted (inline or one bulk data chunk); a larger announced
            length raises FrameTooLarge before any of it is buffered.
        bulk_sink: where bulk data bodies go (see ``BulkSink``); None rejects bulk data frames.
        buffer_bytes: size of the receive buffer for headers and small bodies.

    Attributes:
        legal_kinds: bit k set: frames of kind k are accepted (the connection's phase sets it:
            svcframe.protocol); any other kind raises RemoteProtocolError before its body is buffered.
        answers: calls waiting for their answer, by request id (the connection's pending futures), or None. An
            OK RESPONSE first in its batch for one of them that is not done is not returned as a frame: its
            future gets what ``svcframe.wire.answer_call`` would give it.
        into_pulls: the pulls of ``answers``' calls that take their result into a buffer of their own
            (``svcframe.protocol.IncomingPull`` by request id): the data frame flagged INTO that completes one,
            first in its batch, answers its call with the byte count, and is not returned as a frame.
        place_ahead: places a push ahead of our call's answer (``PlaceAhead``: a BULK_PUSH flagged NO_REPLY
            alone, its one data frame right behind it), first in its batch and whole in the receive buffer,
            without a Frame for either (see ``_push_ahead``). None: decoded as usual.
        reuse_large: our own, dialled connections keep one buffer for bodies larger than the receive buffer,
            and the receive buffer's pages between reads (``release_idle`` gives both back); accepted ones map
            a fresh buffer per large body and give the pages back after every batch.
        held: frames are buffered behind the ones returned last: call ``more()``.

    Raises (from feed / buffer_updated): RemoteProtocolError (bad magic, version, kind, reserved
    bits), FrameTooLarge. After an error the decoder is unusable: drop the connection.
    """

    _buf: mmap.mmap | bytes
    _view: memoryview
    _head: memoryview
    _direct: memoryview | None
    _direct_frame: Frame | None
    _direct_value: BinBody | None
    _large: mmap.mmap | None
    bulk_sink: BulkSink | None
    place_ahead: PlaceAhead | None
    answers: dict[int, Any] | None
    into_pulls: dict[int, Any] | None

    def __init__(
        self,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        bulk_sink: BulkSink | None = None,
        buffer_bytes: int = 256 * 1024,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.bulk_sink = bulk_sink
        self._set_buffer(lazy_buffer(max(buffer_bytes, 2 * HEADER_SIZE)))
        self._start = 0
        self._end = 0
        # Direct mode: a body is being received straight into its own buffer.
        self._direct = None
        self._direct_pos = 0
        self._direct_frame = None  # the frame being received (its body set when complete)
        self._direct_value = None  # the bytes result it is received into (a large bytes answer: see _parse)
        self.held = False
        # Whole bulk data frames under this many bytes are taken from the receive buffer; 0 after a large bulk
        # data chunk, when the next read takes a header and a little more (get_buffer)
        self._data_max = HEADER_FIRST_AFTER_BYTES
        self._high = 0  # the highest offset of the receive buffer written since its pages were last released
        self.reuse_large = False
        self._large = None
        self.legal_kinds = ALL_KINDS_MASK
        self.answers = None
        self.into_pulls = None
        self.place_ahead = None

    def _set_buffer(self, buf: mmap.mmap | bytes) -> None:
        """Receive into ``buf`` from now on (the views of it kept; compiled, its address)."""
        self._buf = buf
        self._view = memoryview(buf)
        self._head = self._view[:KEEP_RECEIVE_BYTES]  # what a read into the empty buffer gets (see get_buffer)
        self._size = len(buf)
        if cython.compiled:
            self._base = _address(self._view)

    # -- receive interface --------------------------------------------------------------------------
    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes should be written (never empty). ``sizehint`` is ignored (asyncio's
        ``BufferedProtocol.get_buffer`` passes one: the pump calls this directly)."""
        direct = self._direct
        if direct is not None:
            return direct[self._direct_pos :]
        end = self._end
        if not self._data_max:  # the next frame is likely more bulk data: its bytes belong in its destination
            header_end = self._start + HEADER_SIZE
            if header_end > end:
                if header_end + AFTER_DATA_TAIL_BYTES > self._size:
                    self._compact()
                    header_end = self._start + HEADER_SIZE
                # the header and a few bytes more: the small frame that usually ends the data (the call's
                # RESPONSE) comes in the same read, and more data costs at most this many bytes copied
                return self._view[self._end : header_end + AFTER_DATA_TAIL_BYTES]
            self._data_max = HEADER_FIRST_AFTER_BYTES
        if not end:  # nothing buffered: a read from the start takes at most KEEP_RECEIVE_BYTES, so the pages
            # above them stay untouched unless a frame needs them (one view, made once); a dialled connection,
            # which keeps its pages (reuse_large), reads into the whole buffer: a 64 KiB result is one read
            return self._view if self.reuse_large else self._head
        if end == self._size:
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> list[Frame] | None:
        """``nbytes`` were written into the last ``get_buffer()``: the frames now complete, or None when the read
        completed frames and the decoder completed all of them itself (see the module docstring).

        Raises:
            ValueError: ``nbytes`` is negative, or more than the buffer given holds.
        """
        direct = self._direct
        if direct is not None:  # a body received into its own destination
            if nbytes < 0 or nbytes > len(direct) - self._direct_pos:
                raise ValueError(f"buffer_updated({nbytes}): the buffer given holds {len(direct) - self._direct_pos}")
            self._direct_pos += nbytes
            if self._direct_pos < len(direct):
                return []
            frames = [self._finish_direct()]
            self._parse(frames)
            return frames
        if nbytes < 0 or nbytes > self._size - self._end:
            raise ValueError(f"buffer_updated({nbytes}): the buffer given holds {self._size - self._end}")
        self._end = end = self._end + nbytes
        if end > self._high:
            self._high = end
        frames = []
        if self._parse(frames) and not frames:
            return None
        return frames

    def more(self) -> list[Frame]:
        """Frames already buffered but held back: the decoder stops before a bulk data frame, or a push
        ahead it places (``place_ahead``), while earlier frames are undelivered (their dispatch may create the
        data's sink, or answer the call the push is for). Call after dispatching a non-empty batch, until it
        returns an empty list."""
        frames: list[Frame] = []
        if self.held:
            self.held = False
            self._parse(frames)
        return frames

    @property
    def idle(self) -> bool:
        """True when no partial frame is buffered (a clean place to close the stream)."""
        return self._direct is None and self._start == self._end

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Copy ``data`` in and return the frames completed by it."""
        frames: list[Frame] = []
        data = memoryview(data).cast("B")
        while data:
            buf = self.get_buffer()
            n = min(len(buf), len(data))
            buf[:n] = data[:n]
            data = data[n:]
            got = self.buffer_updated(n)
            while got:
                frames.extend(got)
                got = self.more()
        return frames

    def close(self) -> None:
        """Release the buffers, any bulk destination and the sink (the connection is gone)."""
        self._direct = None
        self._direct_frame = None
        self._direct_value = None
        self.bulk_sink = None
        self.place_ahead = None
        self.answers = None
        self.into_pulls = None
        self._large = None
        self._head.release()
        self._view.release()
        self._set_buffer(b"")  # closed: the mapping goes with the frames sliced from it
        self._start = self._end = 0

    def release_idle(self) -> None:
        """An idle connection (the engine's sweep): drop the kept large-body buffer (unmapped once no frame
        refers to it) and, when nothing is buffered, give back the receive buffer's pages above
        KEEP_RECEIVE_BYTES."""
        self._large = None
        if not self._end and self._high > KEEP_RECEIVE_BYTES:
            self._release_pages()

    # -- internals -----------------------------------------------------------------------------------
    def _large_view(self, length: int) -> memoryview:
        large = self._large
        if large is None or len(large) < length:
            large = self._large = lazy_buffer(length)  # grows to the largest body seen (at most max_body_bytes)
        return memoryview(large)[:length]

    def _emptied(self) -> None:
        """Every buffered byte was taken: the next read starts at the buffer's beginning, and an accepted
        connection gives back the pages above KEEP_RECEIVE_BYTES (a dialled one keeps them: release_idle)."""
        self._start = self._end = 0
        if self._high > KEEP_RECEIVE_BYTES and not self.reuse_large:
            self._release_pages()

    def _release_pages(self) -> None:
        """Give the kernel back the receive buffer's pages above KEEP_RECEIVE_BYTES (the buffer is empty): an
        idle connection that once received a large batch costs what a small one does. One ``madvise`` per batch
        that went past the mark; the pages fault back in, zeroed, if used again."""
        size = min(self._size, -(-self._high // mmap.PAGESIZE) * mmap.PAGESIZE)
        self._high = 0
        if isinstance(self._buf, mmap.mmap) and size > KEEP_RECEIVE_BYTES:
            self._buf.madvise(mmap.MADV_DONTNEED, KEEP_RECEIVE_BYTES, size - KEEP_RECEIVE_BYTES)

    def _compact(self) -> None:
        """Move the buffered bytes to the start of the receive buffer (the two ranges may overlap)."""
        start, end = self._start, self._end
        if start:
            if isinstance(self._buf, mmap.mmap):
                self._buf.move(0, start, end - start)
            self._start, self._end = 0, end - start

    def _parse(self, frames: list[Frame]) -> bool:
        """Decode the complete frames buffered from ``_start``, appending them to ``frames``, until a frame is
        incomplete, one must wait for the frames before it to be dispatched (``held``), or a body goes to its
        own destination. Returns True when it completed frames itself (answers, pushes ahead placed).

        Raises:
            RemoteProtocolError, FrameTooLarge: a bad frame (``_start`` is left at it).
        """
        base: Any = self._base if cython.compiled else self._buf  # (bytes are read from it and sliced out of it)
        end, max_body, legal = self._end, self.max_body_bytes, self.legal_kinds
        start = self._start
        completed = False
        while self._direct is None:
            if end - start < HEADER_SIZE:
                self._start = start
                avail = end - start
                if avail >= 4 and base[start : start + 2] != MAGIC:
                    raise RemoteProtocolError(_describe_bad_header(base[start : start + avail]))
                if avail == 0:
                    self._emptied()
                elif start + HEADER_SIZE > self._size:
                    self._compact()
                return completed
            if cython.compiled:
                h = base + start
                bad = h[0] != 0x53 or h[1] != 0x46 or h[2] != WIRE_VERSION or _u32(h + 36) != 0
                kind, flags, length, request_id, status = h[3], _u16(h + 4), _u32(h + 12), _u64(h + 16), _u16(h + 28)
            else:
                fields = _DECODE.unpack_from(base, start)
                bad = fields[0] != _MAGIC_INT or fields[1] != WIRE_VERSION or fields[12] != 0
                kind, flags, length, request_id, status = fields[2], fields[3], fields[6], fields[7], fields[9]
            if bad or kind >= 64 or not (legal >> kind) & 1:
                self._start = start
                raise RemoteProtocolError(_describe_bad_header(base[start : start + HEADER_SIZE]))
            if length > max_body:
                self._start = start
                raise FrameTooLarge(
                    f"frame announces a {length}-byte body, over the {max_body}-byte limit "
                    "(send large payloads with a bulk transfer, or raise engine.max_body_bytes)"
                )
            body_start = start + HEADER_SIZE
            body_end = body_start + length
            if kind == K_BULK_PUSH and flags == F_NO_REPLY and body_end <= end and self.place_ahead is not None:
                if frames:  # a push ahead, held as data is (see more()): placed first in the next batch
                    self._start = start
                    self.held = True
                    return completed
                taken = self._push_ahead(base, start, body_end, request_id)
                if taken > 0:  # placed: no frame for it
                    start = taken
                    completed = True
                    continue
                if taken < 0:  # its data still arriving
                    self._start = start
                    return completed
            if (
                kind == K_RESPONSE
                and not status
                and body_end <= end
                and not frames
                and self.answers is not None
                and self._answer(request_id, base[body_start:body_end] if length else b"")
            ):
                start = body_end
                completed = True
                continue
            if kind in (K_BULK_DATA_REPLY, K_BULK_DATA_PUSH):
                self._start = start
                if frames:
                    self.held = True
                    return completed  # the frames before it may set up its sink: dispatch them first (see more())
                if self.bulk_sink is None:
                    raise RemoteProtocolError("bulk data frame on a connection that expects none")
                if body_end > end and length < self._data_max and length + HEADER_SIZE <= self._size:
                    # small data still arriving: wait for all of it here, as for an inline body, so the frame
                    # behind it (the call's RESPONSE) comes in the same read
                    if body_end > self._size:
                        self._compact()
                    return completed
                dest = self.bulk_sink(kind, request_id, length)
                if len(dest) != length:
                    raise RemoteProtocolError(f"bulk sink returned {len(dest)} bytes for {length}")
                frame = _new_frame(base, start, None)
                if body_end <= end:  # all of it here: copied, and complete
                    if cython.compiled:
                        _copy_into(dest, base + body_start, length)
                    else:
                        dest[:] = self._view[body_start:body_end]
                    start = body_end
                    self._data_max = 0 if length >= HEADER_FIRST_AFTER_BYTES else HEADER_FIRST_AFTER_BYTES
                    if flags & F_INTO and kind == K_BULK_DATA_REPLY and self._into_answered(request_id):
                        completed = True
                        continue
                    frames.append(frame)
                    continue
                self._start_direct(dest, frame, body_start, frames)
                end, start = self._end, self._start
                base = self._base if cython.compiled else self._buf
                continue
            if body_end <= end:
                frames.append(_new_frame(base, start, base[body_start:body_end] if length else b""))
                start = body_end
                continue
            self._start = start
            if length + HEADER_SIZE <= self._size:
                if body_end > self._size:
                    self._compact()
                return completed
            # A body larger than the receive buffer gets a buffer of its own, whose memory the kernel commits
            # only as its bytes arrive: a peer that announces 4 MiB and sends 80 bytes costs a page. With
            # reuse_large (our own, dialled connections), one such buffer is kept and reused, so a client that
            # reads large results does not map and fault a fresh one per result; the frames of a batch are
            # dispatched before it is written again.
            if self.reuse_large:
                if frames:
                    self.held = True  # the frames before it are dispatched (and their bodies decoded) first
                    return completed
                if (
                    cython.compiled
                    and kind == K_RESPONSE
                    and not status
                    and length > 5
                    and body_start + 5 <= end
                    and base[body_start] == 0xC6
                    and _u32be(base + body_start + 1) == length - 5
                ):  # a large bytes result (one bin 32, its header here): received into the bytes the call returns
                    value = PyBytes_FromStringAndSize(cython.NULL, length - 5)
                    self._direct_value = BinBody(value, length)
                    dest = memoryview(_BytesFiller(value))  # type: ignore[arg-type]  # (compiled: a buffer)
                    body_start += 5
                else:
                    dest = self._large_view(length)
            else:
                dest = memoryview(lazy_buffer(length))
            self._start_direct(dest, _new_frame(base, start, None), body_start, frames)
            end, start = self._end, self._start
            base = self._base if cython.compiled else self._buf
        self._start = start
        return completed

    def _answer(self, request_id: int, body: bytes) -> bool:
        """The OK answer ``body`` to our call ``request_id``: given to its waiting future (``answers``) as
        ``svcframe.wire.answer_call`` gives it. False when it is not ours to give (no such call, its future done,
        or a body the decoder refuses: the dispatch has the whole of the semantics and the error)."""
        waiter = self.answers.get(request_id)  # type: ignore[union-attr]  # (checked by the caller)
        if waiter is None or waiter.done():
            return False
        try:
            value = unpack_body(body)
        except ProtocolError:
            return False
        waiter.set_result((0, value, len(body)))
        return True

    def _into_answered(self, request_id: int) -> bool:
        """A data frame flagged INTO, just written into its buffer, answered our into= call ``request_id``: its
        future gets the byte count, as the dispatch gives it. False when it is not ours to give (no such call or
        pull, a pull that is not an into= call's, its future done)."""
        answers, pulls = self.answers, self.into_pulls
        if answers is None or pulls is None:
            return False
        waiter = answers.get(request_id)
        pull = pulls.get(request_id)
        if waiter is None or pull is None or not pull.overflow_ok or waiter.done():
            return False
        waiter.set_result((0, pull.cursor, pull.cursor))
        return True

    def _push_ahead(self, base: Any, start: int, body_end: int, request_id: int) -> int:
        """The push ahead of our call's answer whose BULK_PUSH (flagged NO_REPLY alone, first in its batch: one
        behind other frames is held until they are dispatched) is whole at ``start`` up to ``body_end``: once
        its one data frame (BULK_DATA_PUSH, the same request id, flags 0, under ``_data_max`` bytes) is whole
        right behind it, and its body is ``[bulk id, offset, size, call id]`` as pushers pack it (``_ahead_body``)
        with ``size`` its data's length, ``place_ahead(request_id, bulk id, offset, size)`` names the data's
        destination, the data is copied there and both frames are taken without a Frame: the caller's read
        costs no dispatch of either, no sink and no held batch.

        Returns the offset after its data; -1 while the rest is still arriving (some of it here) and both
        frames fit the receive buffer, so no frame of it is returned yet; 0 when the usual decoding takes it
        (nothing of its data here yet, data that is not its one small frame, a body in another form, or
        ``place_ahead`` returned None, as for a push it refuses: the usual dispatch has its errors).

        Raises:
            RemoteProtocolError: ``place_ahead`` returned a buffer that is not ``length`` bytes.
        """
        end, size = self._end, self._size
        data_start = body_end + HEADER_SIZE
        if data_start > end:
            return -1 if end > body_end and data_start - start <= size else 0
        if cython.compiled:
            d = base + body_end
            ok = d[0] == 0x53 and d[1] == 0x46 and d[2] == WIRE_VERSION and _u32(d + 36) == 0
            kind, flags, length, data_id = d[3], _u16(d + 4), _u32(d + 12), _u64(d + 16)
        else:
            header = _DECODE.unpack_from(base, body_end)
            ok = header[0] == _MAGIC_INT and header[1] == WIRE_VERSION and header[12] == 0
            kind, flags, length, data_id = header[2], header[3], header[6], header[7]
        if not (
            ok
            and kind == K_BULK_DATA_PUSH
            and not flags
            and (self.legal_kinds >> kind) & 1
            and data_id == request_id
            and length <= self.max_body_bytes
            and length < self._data_max
        ):
            return 0
        data_end = data_start + length
        if data_end > end:
            return -1 if data_end - start <= size else 0
        named = _ahead_body(base, start + HEADER_SIZE, body_end)
        if named is None or named[2] != length:
            return 0
        assert self.place_ahead is not None
        dest = self.place_ahead(request_id, named[0], named[1], length)
        if dest is None:
            return 0
        if len(dest) != length:
            raise RemoteProtocolError(f"push ahead placed in {len(dest)} bytes for {length}")
        if cython.compiled:
            _copy_into(dest, base + data_start, length)
        else:
            dest[:] = self._view[data_start:data_end]
        return data_end  # type: ignore[no-any-return]  # (an int: a header field plus offsets)

    def _start_direct(self, dest: memoryview, frame: Frame, body_start: int, frames: list[Frame]) -> None:
        """Receive ``frame``'s body straight into ``dest``, starting with the bytes already buffered."""
        have = min(self._end - body_start, len(dest))
        if have:
            dest[:have] = self._view[body_start : body_start + have]
        self._start = body_start + have
        if self._start == self._end:
            self._start = self._end = 0
        self._direct, self._direct_pos, self._direct_frame = dest, have, frame
        if have == len(dest):
            frames.append(self._finish_direct())

    def _finish_direct(self) -> Frame:
        dest, frame, value = self._direct, self._direct_frame, self._direct_value
        self._direct = self._direct_frame = self._direct_value = None
        assert dest is not None and frame is not None
        kind = frame.kind
        if value is not None:  # received into the bytes the call returns: nothing writes them from now on
            dest.release()
            frame.body = value
        elif kind in (K_BULK_DATA_REPLY, K_BULK_DATA_PUSH):
            # after a large chunk, more is likely: its bytes go straight to their destination; after a small one,
            # reads go on into the receive buffer (a 64 KiB read by into= is then one read and one copy, where
            # the header-first reads took three)
            self._data_max = 0 if len(dest) >= HEADER_FIRST_AFTER_BYTES else HEADER_FIRST_AFTER_BYTES
        else:  # a large inline body keeps its own buffer, as a memoryview (msgpack decodes it without a copy)
            frame.body = dest
        return frame


def _new_frame(b: Any, start: int, body: bytes | bytearray | memoryview | BinBody | None) -> Frame:
    """The Frame of the header at ``b[start:]`` (bytes of the receive buffer; compiled, their address) and
    ``body``."""
    if cython.compiled:
        h = b + start
        f = Frame.__new__(Frame)
        f.kind = h[3]
        f.flags = _u16(h + 4)
        f.provider_id = _u16(h + 6)
        f.rpc_id = _u32(h + 8)
        f.request_id = _u64(h + 16)
        f.deadline_usec = _u32(h + 24)
        f.status = _u16(h + 28)
        f.parent_provider_id = _u16(h + 30)
        f.parent_rpc_id = _u32(h + 32)
        f.callpath = _u64(h + 40)
        f.trace_id = h[48:64] if _u64(h + 48) | _u64(h + 56) else ZERO_TRACE_ID
        f.span_id = _u64(h + 64)
        f.lamport = _u64(h + 72)
        f.body = body
        return f
    (_, _, kind, flags, provider_id, rpc, _, request_id, deadline, status, parent_provider, parent_rpc, _,
     callpath, trace_lo, trace_hi, span_id, lamport) = _DECODE.unpack_from(b, start)  # fmt: skip
    trace_id = bytes(b[start + 48 : start + 64]) if trace_lo or trace_hi else ZERO_TRACE_ID
    return Frame(kind, flags, provider_id, rpc, request_id, deadline, status, parent_provider, parent_rpc, callpath,
                 trace_id, span_id, lamport, body)  # fmt: skip


# -- the compiled build's own ------------------------------------------------------------------------------
def _copy_into(dest: Any, p: Any, n: int) -> int:
    """Copy the ``n`` received bytes at ``p`` into ``dest``, a writable buffer of ``n`` bytes or more; 0."""
    pybuf = cython.declare(Py_buffer)
    PyObject_GetBuffer(dest, cython.address(pybuf), PyBUF_WRITABLE)
    memcpy(pybuf.buf, p, n)
    PyBuffer_Release(cython.address(pybuf))
    return 0


def _address(view: memoryview) -> Any:
    """The address of ``view``'s first byte (NULL when it is empty); ``view`` keeps the buffer in place."""
    if not len(view):
        return cython.NULL
    mv = view
    return cython.address(mv[0])


class _BytesFiller:
    """A writable buffer over a new bytes object (compiled build): what a large bytes result is received into,
    so the bytes the call returns are the bytes received, not a copy. It holds the bytes object, so a view of it
    never outlives them; nobody but the decoder has the view, which it releases before it hands the bytes out."""

    def __init__(self, value: bytes) -> None:
        self.value = value

    @cython.annotation_typing(True)  # type: ignore[untyped-decorator]  # (the buffer protocol's C signature)
    def __getbuffer__(self, view: cython.pointer[Py_buffer], flags: cython.int) -> None:
        PyBuffer_FillInfo(view, self, PyBytes_AS_STRING(self.value), len(self.value), 0, flags)

    @cython.annotation_typing(True)  # type: ignore[untyped-decorator]
    def __releasebuffer__(self, view: cython.pointer[Py_buffer]) -> None:
        pass


def _describe_bad_header(header: bytes | memoryview) -> str:
    raw = bytes(header)
    if raw[:4] in (b"GET ", b"POST", b"HEAD", b"PUT ", b"PRI "):
        return "peer speaks HTTP, not the svcframe protocol (wrong port?)"
    if raw[:1] == b"\x16" and raw[1:2] == b"\x03":
        return "peer started a TLS handshake; svcframe speaks its own protocol (no TLS)"
    if raw[:2] != MAGIC:
        return f"bad frame magic {raw[:2]!r} (expected {MAGIC!r}): not a svcframe peer"
    if raw[2] != WIRE_VERSION:
        return f"unsupported wire version {raw[2]} (this is version {WIRE_VERSION})"
    if raw[36:40] != b"\0\0\0\0":
        return "reserved header bits are set"
    if 0 < raw[3] <= _KIND_MAX:
        return f"a {Kind(raw[3]).name} frame is not allowed in this phase of the connection"
    return f"unknown frame kind {raw[3]}"


def _ahead_body(b: Any, pos: int, end: int) -> tuple[bytes, int, int] | None:
    """A push ahead's BULK_PUSH body ``b[pos:end]`` in the form its pushers pack it (svcframe.bulk: msgpack
    ``[bulk id, offset, size, call id]``, the bulk id a bin 8, the others unsigned ints): (bulk id, offset,
    size); None for any other body (decoded as usual: ``_on_push_ahead`` has the whole of the semantics)."""
    if end - pos < 3 or b[pos] != 0x94 or b[pos + 1] != 0xC4 or pos + 3 + b[pos + 2] > end:
        return None
    n = b[pos + 2]
    bulk_id = b[pos + 3 : pos + 3 + n]
    pos += 3 + n
    offset = size = 0
    for i in range(3):  # offset, size, call id: each a positive fixint or a uint 8, 16, 32 or 64
        if pos >= end:
            return None
        c = b[pos]
        width = 0 if c <= 0x7F else (1 << (c - 0xCC)) if 0xCC <= c <= 0xCF else -1
        if width < 0 or pos + 1 + width > end:
            return None
        value = c
        if width:
            value = 0
            for k in range(1, width + 1):
                value = (value << 8) | b[pos + k]
        if i == 0:
            offset = value
        elif i == 1:
            size = value
        pos += 1 + width
    return (bulk_id, offset, size) if pos == end else None
