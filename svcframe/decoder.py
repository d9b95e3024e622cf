"""The incremental frame decoder: the receiving side of the wire format (``svcframe.wire``), sans-IO.

Bytes go in (copied by ``feed``, or received straight into the decoder's own buffer through ``get_buffer`` and
``buffer_updated``, as ``asyncio.BufferedProtocol`` does), frames come out; a bulk data body is received
straight into the destination its *bulk sink* names. Its state and receive interface are compiled where
svcframe._speedups was built (``DecoderCore``; ``_PyDecoderCore`` is the definition), which also answers our
calls itself (``FrameDecoder.answers``).

Decoder invariant (fuzzed in tests/test_wire.py): any byte string fed in any split either yields the
frames that were encoded, or raises ``RemoteProtocolError`` (never another exception), and never
allocates more than ``max_body_bytes`` for a body it has not yet validated.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import FrameTooLarge, RemoteProtocolError
from .wire import (
    _KIND_MAX,
    ALL_KINDS_MASK,
    DEFAULT_MAX_BODY_BYTES,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    PURE,
    WIRE_VERSION,
    ZERO_TRACE_ID,
    BinBody,
    Flag,
    Frame,
    Kind,
    _new_tuple,
    bin_header,
    lazy_buffer,
    receive_bytes,
)

#: The header as the decoder reads it: the same 80 bytes as HEADER, with the magic as an int and the
#: trace id as two words (no bytes objects are created for an untraced frame).
_DECODE = struct.Struct("<HBBHHIIQIHHIIQQQQQ")
_MAGIC_INT = int.from_bytes(MAGIC, "little")
assert _DECODE.size == HEADER.size and struct.calcsize("<HBBHHIIQIHHIIQ") == 48  # trace id at bytes 48-63
_BULK_DATA_KINDS = frozenset((int(Kind.BULK_DATA_REPLY), int(Kind.BULK_DATA_PUSH)))
_K_RESPONSE = int(Kind.RESPONSE)
_K_BULK_PUSH, _K_BULK_DATA_PUSH, _F_NO_REPLY = int(Kind.BULK_PUSH), int(Kind.BULK_DATA_PUSH), int(Flag.NO_REPLY)

#: The compiled twins of the decoder's per-frame loop and receive interface (svcframe/_speedups.c); None where
#: it was not built or SVCFRAME_PURE is set (the pure-Python decoder is then FrameDecoder).
_parse_inline: Callable[..., int] | None = None
_DecoderCore: type | None = None  # its state and receive interface (FrameDecoder's base), also compiled
if not PURE:
    from ._speedups import DecoderCore, configure_decoder, parse_inline

    _parse_inline, _DecoderCore = parse_inline, DecoderCore

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
_UINT_WIDTHS = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}  # msgpack's uint 8, 16, 32, 64


class _Decoding:
    """FrameDecoder's methods beyond its receive interface (shared by the compiled and the pure-Python core)."""

    if not TYPE_CHECKING:  # (the state's slots are the core's and the final class's; mypy reads them below)
        __slots__ = ()

    # the state, kept by the core (DecoderCore or _PyDecoderCore)
    _buf: mmap.mmap | bytearray
    _view: memoryview
    _head: memoryview
    _direct: memoryview | None
    _direct_frame: tuple[Any, ...] | None
    _direct_value: BinBody | None
    _large: mmap.mmap | None
    bulk_sink: BulkSink | None
    place_ahead: PlaceAhead | None
    answers: dict[int, Any] | None
    into_pulls: dict[int, Any] | None
    _start: int
    _end: int
    _high: int
    _data_max: int
    _direct_pos: int
    max_body_bytes: int
    legal_kinds: int
    reuse_large: bool
    held: bool

    if TYPE_CHECKING:

        def get_buffer(self, sizehint: int = -1) -> memoryview: ...
        def buffer_updated(self, nbytes: int) -> list[Frame] | None: ...

        @property
        def idle(self) -> bool: ...

    def __init__(
        self,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        bulk_sink: BulkSink | None = None,
        buffer_bytes: int = 256 * 1024,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.bulk_sink = bulk_sink
        self._buf = lazy_buffer(max(buffer_bytes, 2 * HEADER_SIZE))
        self._view = memoryview(self._buf)
        self._head = self._view[:KEEP_RECEIVE_BYTES]  # what a read into the empty buffer gets (see get_buffer)
        self._start = 0
        self._end = 0
        # Direct mode: a body is being received straight into its own buffer.
        self._direct: memoryview | None = None
        self._direct_pos = 0
        self._direct_frame: tuple[Any, ...] | None = None  # header fields of the frame being received
        self._direct_value: BinBody | None = None  # the bytes result it is received into (see _parse)
        self.held = False  # a bulk data frame waits behind the frames returned last: call more()
        # The compiled loop takes whole bulk data frames under this many bytes; 0 after a large bulk data chunk,
        # when the next read takes a header and a little more (get_buffer) and _parse takes the data
        self._data_max = HEADER_FIRST_AFTER_BYTES
        self._high = 0  # the highest offset of the receive buffer written since its pages were last released
        # Our own, dialled connections: keep one buffer for bodies larger than the receive buffer (see _parse),
        # and the receive buffer's pages between reads; release_idle() gives both back (the engine's sweep,
        # on an idle connection). Accepted connections give the pages back after every batch (issue 13).
        self.reuse_large = False
        self._large: mmap.mmap | None = None
        #: Bit k set: frames of kind k are accepted (the connection's phase sets it: svcframe.protocol);
        #: any other kind raises RemoteProtocolError before its body is buffered.
        self.legal_kinds = ALL_KINDS_MASK
        #: Calls waiting for their answer, by request id (the connection's pending futures), or None. With the
        #: compiled core, an OK RESPONSE first in its batch for one of them is not returned as a frame: its
        #: future, when not done, gets what ``answer_call`` gives it, once the whole read decoded without an
        #: error, and buffer_updated returns None when that was all the read completed (a client's sequential
        #: call then costs no Frame and no dispatch: tools/instructions_per_client_call.sh). The pure-Python
        #: core returns every frame (the engine's dispatch answers them with ``answer_call``).
        self.answers: dict[int, Any] | None = None
        self.into_pulls: dict[int, Any] | None = None  # (answers' into= calls: their pulls, the compiled core's)
        #: A push ahead of our call's answer (svcframe.bulk: a BULK_PUSH flagged NO_REPLY alone, its one data
        #: frame right behind it), first in its batch and whole in the receive buffer, is placed by this
        #: callable (PlaceAhead) without a Frame for either: see _push_ahead. None: decoded as usual.
        self.place_ahead: PlaceAhead | None = None

    # -- receive interface --------------------------------------------------------------------------
    def _get_buffer_slow(self) -> memoryview:
        """get_buffer while a body is received into its own destination, or when a header-first read is due."""
        direct = self._direct
        if direct is not None:
            return direct[self._direct_pos :]
        if not self._data_max:  # the next frame is likely more bulk data: its bytes belong in its destination
            header_end = self._start + HEADER_SIZE
            if header_end > self._end:
                if header_end + AFTER_DATA_TAIL_BYTES > len(self._buf):
                    self._compact()
                    header_end = self._start + HEADER_SIZE
                # the header and a few bytes more: the small frame that usually ends the data (the call's
                # RESPONSE) comes in the same read, and more data costs at most this many bytes copied
                return self._view[self._end : header_end + AFTER_DATA_TAIL_BYTES]
            self._data_max = HEADER_FIRST_AFTER_BYTES
        return self.get_buffer()

    def _direct_updated(self, nbytes: int) -> list[Frame]:
        """buffer_updated while a body is received into its own destination."""
        assert self._direct is not None
        self._direct_pos += nbytes
        if self._direct_pos < len(self._direct):
            return []
        frames = [self._finish_direct()]
        self._parse(frames)
        return frames

    def more(self) -> list[Frame]:
        """Frames already buffered but held back: the decoder stops before a bulk data frame, or a push
        ahead it places (``place_ahead``), while earlier frames are undelivered (their dispatch may create the
        data's sink, or answer the call the push is for). Call after
        dispatching a non-empty batch, until it returns an empty list."""
        frames: list[Frame] = []
        if self.held:
            self.held = False
            self._parse(frames)
        return frames

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
        self._large = None
        self._head.release()
        self._view.release()
        self._buf = b""  # type: ignore[assignment]  # closed: the mapping goes with the frames sliced from it
        self._view = self._head = memoryview(self._buf)
        self._start = self._end = 0

    # -- internals -----------------------------------------------------------------------------------
    def _large_view(self, length: int) -> memoryview:
        large = self._large
        if large is None or len(large) < length:
            large = self._large = lazy_buffer(length)  # grows to the largest body seen (at most max_body_bytes)
        return memoryview(large)[:length]

    def release_idle(self) -> None:
        """An idle connection (the engine's sweep): drop the kept large-body buffer (unmapped once no frame
        refers to it) and, when nothing is buffered, give back the receive buffer's pages above
        KEEP_RECEIVE_BYTES."""
        self._large = None
        if not self._end and self._high > KEEP_RECEIVE_BYTES:
            self._release_pages()

    def _emptied(self) -> None:
        """Every buffered byte was taken: the next read starts at the buffer's beginning, and an accepted
        connection gives back the pages above KEEP_RECEIVE_BYTES (a dialled one keeps them: release_idle)."""
        self._start = self._end = 0
        if self._high > KEEP_RECEIVE_BYTES and not self.reuse_large:
            self._release_pages()

    def _release_pages(self) -> None:
        """Give the kernel back the receive buffer's pages above KEEP_RECEIVE_BYTES (the buffer is empty): an
        idle connection that once received a large batch costs what a small one does (issue 13). One
        ``madvise`` per batch that went past the mark; the pages fault back in, zeroed, if used again."""
        size = min(len(self._buf), -(-self._high // mmap.PAGESIZE) * mmap.PAGESIZE)
        self._high = 0
        if isinstance(self._buf, mmap.mmap) and size > KEEP_RECEIVE_BYTES:
            self._buf.madvise(mmap.MADV_DONTNEED, KEEP_RECEIVE_BYTES, size - KEEP_RECEIVE_BYTES)

    def _compact(self) -> None:
        start, end = self._start, self._end
        if start:
            self._buf[: end - start] = self._view[start:end]
            self._start, self._end = 0, end - start

    def _parse(self, frames: list[Frame], compiled_ran: bool = False) -> None:
        # The hot loop of every connection: locals only, one tuple per frame (the Frame itself), the magic
        # checked as an int, the trace id materialised only when it is set, small bodies sliced out of the
        # receive buffer as bytearrays (one object, one copy).
        view, buf, end, max_body, legal = self._view, self._buf, self._end, self.max_body_bytes, self.legal_kinds
        unpack_from, append = _DECODE.unpack_from, frames.append
        start = self._start
        if _parse_inline is not None and not compiled_ran:  # the compiled twin of the two branches that take
            # a whole frame below (an inline body; small bulk data, first in the batch): it takes what it can
            start = _parse_inline(buf, start, end, max_body, legal, frames, Frame, ZERO_TRACE_ID, self.bulk_sink,
                                  self._data_max, self.place_ahead)  # fmt: skip
        while self._direct is None:
            if end - start < HEADER_SIZE:
                self._start = start
                avail = end - start
                if avail >= 4 and view[start : start + 2] != MAGIC:
                    raise RemoteProtocolError(self._describe_bad_header(view[start : start + avail]))
                if avail == 0:
                    self._emptied()
                elif start + HEADER_SIZE > len(buf):
                    self._compact()
                return
            (magic, version, kind, flags, provider_id, rpc, length, request_id, deadline, status,
             parent_provider, parent_rpc, reserved, callpath, trace_lo, trace_hi, span_id, lamport) = unpack_from(view, start)  # fmt: skip
            if magic != _MAGIC_INT or version != WIRE_VERSION or reserved or not (legal >> kind) & 1:
                self._start = start
                raise RemoteProtocolError(self._describe_bad_header(view[start : start + HEADER_SIZE]))
            if length > max_body:
                self._start = start
                raise FrameTooLarge(
                    f"frame announces a {length}-byte body, over the {max_body}-byte limit "
                    "(send large payloads with a bulk transfer, or raise engine.max_body_bytes)"
                )
            body_start = start + HEADER_SIZE
            body_end = body_start + length
            if kind == _K_BULK_PUSH and flags == _F_NO_REPLY and body_end <= end and self.place_ahead:
                if frames:  # a push ahead, held as data is (see more()): placed first in the next batch
                    self._start = start
                    self.held = True
                    return
                taken = self._push_ahead(start, body_end, request_id)
                if taken > 0:  # placed: no frame for it
                    start = taken
                    continue
                if taken < 0:  # its data still arriving
                    self._start = start
                    return
            trace_id = bytes(view[start + 48 : start + 64]) if trace_lo or trace_hi else ZERO_TRACE_ID
            if kind in _BULK_DATA_KINDS:
                self._start = start
                if frames:
                    self.held = True
                    return  # the frames before it may set up its sink: dispatch them first (see more())
                if self.bulk_sink is None:
                    raise RemoteProtocolError("bulk data frame on a connection that expects none")
                if body_end > end and length < self._data_max and length + HEADER_SIZE <= len(buf):
                    # small data still arriving: wait for all of it here, as for an inline body, so the frame
                    # behind it (the call's RESPONSE) comes in the same read and the compiled loop takes both (a
                    # 64 KiB read by into= split by loopback's 64 KiB segments took three reads, now two)
                    if body_end > len(buf):
                        self._compact()
                    return
                dest = self.bulk_sink(kind, request_id, length)
                if len(dest) != length:
                    raise RemoteProtocolError(f"bulk sink returned {len(dest)} bytes for {length}")
                self._start_direct(dest, (kind, flags, provider_id, rpc, request_id, deadline, status, parent_provider,
                                          parent_rpc, callpath, trace_id, span_id, lamport), body_start, frames)  # fmt: skip
                view, buf, end, start = self._view, self._buf, self._end, self._start
                if _parse_inline is not None and self._direct is None:  # what follows (the call's RESPONSE)
                    start = _parse_inline(buf, start, end, max_body, legal, frames, Frame, ZERO_TRACE_ID, None,
                                          HEADER_FIRST_AFTER_BYTES)  # fmt: skip
                continue
            if body_end <= end:
                append(_new_tuple(Frame, (kind, flags, provider_id, rpc, request_id, deadline, status, parent_provider,
                                          parent_rpc, callpath, trace_id, span_id, lamport,
                                          buf[body_start:body_end] if length else b"")))  # fmt: skip
                start = body_end
                continue
            self._start = start
            if length + HEADER_SIZE <= len(buf):
                if body_end > len(buf):
                    self._compact()
                return
            # A body larger than the receive buffer gets a buffer of its own, whose memory the kernel commits
            # only as its bytes arrive: a peer that announces 4 MiB and sends 80 bytes costs a page (issue 13).
            # With reuse_large (our own, dialled connections), one such buffer is kept and reused, so a client
            # that reads large results does not map and fault a fresh one per result (issue 14: 1,025 page
            # faults per 4 MiB read); the frames of a batch are dispatched before it is written again.
            # A large bytes result (an OK RESPONSE whose body is one bin 32, its header already here) is received
            # straight into the bytes object the call returns, where decoding the kept buffer made a second copy
            # (issue 14, `svcframe bench --workload client-read`: a 4 MiB inline read went from 0.57-0.58x raw
            # uvloop's bandwidth to 0.86-1.01x, and with glibc's default malloc settings still 0 page faults).
            if self.reuse_large:
                if frames:
                    self._start = start
                    self.held = True  # the frames before it are dispatched (and their bodies decoded) first
                    return
                if (
                    kind == _K_RESPONSE
                    and not status
                    and receive_bytes is not None
                    and body_start + 5 <= end
                    and buf[body_start : body_start + 5] == bin_header(length - 5)  # (a bin 32's is 5 bytes)
                ):
                    value, dest = receive_bytes(length - 5)
                    self._direct_value = BinBody(value, length)
                    body_start += 5
                else:
                    dest = self._large_view(length)
            else:
                dest = memoryview(lazy_buffer(length))
            self._start_direct(dest, (kind, flags, provider_id, rpc, request_id, deadline, status, parent_provider,
                               parent_rpc, callpath, trace_id, span_id, lamport), body_start, frames)  # fmt: skip
            view, buf, end, start = self._view, self._buf, self._end, self._start
        self._start = start

    def _push_ahead(self, start: int, body_end: int, request_id: int) -> int:
        """The push ahead of our call's answer whose BULK_PUSH (flagged NO_REPLY alone, first in its batch: one
        behind other frames is held until they are dispatched) is whole at ``start`` up to ``body_end``: once
        its one data frame (BULK_DATA_PUSH, the same request id, flags 0, under ``_data_max`` bytes) is whole
        right behind it, and its body is ``[bulk id, offset, size, call id]`` as pushers pack it (``_ahead_body``)
        with ``size`` its data's length, ``place_ahead(request_id, bulk id, offset, size)`` names the data's
        destination, the data is copied there and both frames are taken without a Frame: the
        caller's read costs no dispatch of either, no sink and no held batch (a 64 KiB push read:
        ``python tools/profile_client.py --read 65536 --method push``, the README's figures).

        Returns the offset after its data; -1 while the rest is still arriving (some of it here) and both
        frames fit the receive buffer, so no frame of it is returned yet; 0 when the usual decoding takes it
        (nothing of its data here yet, data that is not its one small frame, a body in another form, or
        ``place_ahead`` returned None, as for a push it refuses: the usual dispatch has its errors). The twin of the
        compiled loop's ``push_ahead`` (svcframe/_speedups.c).

        Raises:
            RemoteProtocolError: ``place_ahead`` returned a buffer that is not ``length`` bytes.
        """
        view, end, size = self._view, self._end, len(self._buf)
        data_start = body_end + HEADER_SIZE
        if data_start > end:
            return -1 if end > body_end and data_start - start <= size else 0
        header = _DECODE.unpack_from(view, body_end)
        magic, version, kind, flags, length, data_id, reserved = header[0], *header[1:4], *header[6:8], header[12]
        if not (
            magic == _MAGIC_INT
            and version == WIRE_VERSION
            and kind == _K_BULK_DATA_PUSH
            and not flags
            and not reserved
            and (self.legal_kinds >> kind) & 1
            and data_id == request_id
            and length <= self.max_body_bytes
            and length < self._data_max
        ):
            return 0
        data_end: int = data_start + length
        if data_end > end:
            return -1 if data_end - start <= size else 0
        named = _ahead_body(view, start + HEADER_SIZE, body_end)
        if named is None or named[2] != length:
            return 0
        assert self.place_ahead is not None
        dest = self.place_ahead(request_id, named[0], named[1], length)
        if dest is None:
            return 0
        if len(dest) != length:
            raise RemoteProtocolError(f"push ahead placed in {len(dest)} bytes for {length}")
        dest[:] = view[data_start:data_end]
        return data_end

    def _start_direct(self, dest: memoryview, fields: tuple[Any, ...], body_start: int, frames: list[Frame]) -> None:
        """Receive a body straight into ``dest``, starting with the bytes already buffered."""
        have = min(self._end - body_start, len(dest))
        if have:
            dest[:have] = self._view[body_start : body_start + have]
        self._start = body_start + have
        if self._start == self._end:
            self._start = self._end = 0
        self._direct, self._direct_pos, self._direct_frame = dest, have, fields
        if have == len(dest):
            frames.append(self._finish_direct())

    def _finish_direct(self) -> Frame:
        dest, fields, value = self._direct, self._direct_frame, self._direct_value
        self._direct = self._direct_frame = self._direct_value = None
        assert dest is not None and fields is not None
        if value is not None:
            dest.release()  # (the view does not own the bytes: nothing writes them once they are handed out)
            return _new_tuple(Frame, (*fields, value))
        # A large inline body keeps its own buffer, as a memoryview (msgpack decodes it without another copy).
        if fields[0] in _BULK_DATA_KINDS:
            # after a large chunk, more is likely: its bytes go straight to their destination; after a small one,
            # reads go on into the receive buffer (a 64 KiB read by into= is then one read and one copy, where
            # the header-first reads took three)
            self._data_max = 0 if len(dest) >= HEADER_FIRST_AFTER_BYTES else HEADER_FIRST_AFTER_BYTES
            return _new_tuple(Frame, (*fields, None))
        return _new_tuple(Frame, (*fields, dest))

    @staticmethod
    def _describe_bad_header(header: memoryview) -> str:
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


def _ahead_body(b: memoryview, pos: int, end: int) -> tuple[bytes, int, int] | None:
    """A push ahead's BULK_PUSH body ``b[pos:end]`` in the form its pushers pack it (svcframe.bulk: msgpack
    ``[bulk id, offset, size, call id]``, the bulk id a bin 8, the others unsigned ints): (bulk id, offset,
    size); None for any other body (decoded as usual: ``_on_push_ahead`` has the whole of the semantics). The
    definition of the compiled loop's ``ahead_body``."""
    if end - pos < 3 or b[pos] != 0x94 or b[pos + 1] != 0xC4 or pos + 3 + b[pos + 2] > end:
        return None
    bulk_id = bytes(b[pos + 3 : pos + 3 + b[pos + 2]])
    pos += 3 + b[pos + 2]
    values = []
    for _ in range(3):  # offset, size, call id
        if pos >= end:
            return None
        c = b[pos]
        width = 0 if c <= 0x7F else _UINT_WIDTHS.get(c)
        if width is None or pos + 1 + width > end:
            return None
        values.append(c if not width else int.from_bytes(b[pos + 1 : pos + 1 + width], "big"))
        pos += 1 + width
    return (bulk_id, values[0], values[1]) if pos == end else None


class _PyDecoderCore:
    """FrameDecoder's state and receive interface in Python: the definition, whose compiled twin is
    svcframe._speedups.DecoderCore (the same state and methods; it also runs the compiled loop, answers calls
    (``answers``) and empties the buffer without a Python call). What both leave to ``_Decoding``: a body
    received into its own destination, a header-first read, and every frame the compiled loop does not take."""

    __slots__ = (
        "_buf",
        "_data_max",
        "_direct",
        "_direct_pos",
        "_end",
        "_head",
        "_high",
        "_start",
        "_view",
        "answers",
        "bulk_sink",
        "into_pulls",
        "legal_kinds",
        "max_body_bytes",
        "place_ahead",
        "reuse_large",
    )

    if TYPE_CHECKING:
        _buf: mmap.mmap | bytearray
        _view: memoryview
        _head: memoryview
        _direct: memoryview | None
        _start: int
        _end: int
        _high: int
        _data_max: int
        reuse_large: bool

        def _get_buffer_slow(self) -> memoryview: ...
        def _direct_updated(self, nbytes: int) -> list[Frame]: ...
        def _compact(self) -> None: ...
        def _parse(self, frames: list[Frame], compiled_ran: bool = False) -> None: ...

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes should be written (never empty). ``sizehint`` is ignored (asyncio's
        ``BufferedProtocol.get_buffer`` passes one: the pump calls this directly)."""
        if self._direct is not None or not self._data_max:
            return self._get_buffer_slow()
        end = self._end
        if not end:  # nothing buffered: a read from the start takes at most KEEP_RECEIVE_BYTES, so the pages
            # above them stay untouched unless a frame needs them (one view, made once); a dialled connection,
            # which keeps its pages (reuse_large), reads into the whole buffer: a 64 KiB result is one read
            return self._view if self.reuse_large else self._head
        if end == len(self._buf):
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> list[Frame] | None:
        """``nbytes`` were written into the last ``get_buffer()``; return the frames now complete, or None when
        the read completed only answers to ``answers``' calls (given to their futures: the compiled core only)."""
        if self._direct is not None:
            return self._direct_updated(nbytes)
        self._end = end = self._end + nbytes
        if end > self._high:
            self._high = end
        frames: list[Frame] = []
        self._parse(frames)
        return frames

    @property
    def idle(self) -> bool:
        """True when no partial frame is buffered (a clean place to close the stream)."""
        return self._direct is None and self._start == self._end


class PyFrameDecoder(_Decoding, _PyDecoderCore):
    """FrameDecoder in pure Python (what FrameDecoder is without the compiled core, or with SVCFRAME_PURE=1)."""

    __slots__ = ("_direct_frame", "_direct_value", "_large", "held")


if TYPE_CHECKING or _DecoderCore is None:  # noqa: SIM108  (mypy reads the pure core as the type)
    _Core = _PyDecoderCore
else:
    _Core = _DecoderCore


class FrameDecoder(_Decoding, _Core):
    """Incremental frame decoder with a zero-copy receive interface.

    Two ways to feed it:

    * ``feed(data) -> list[Frame]``: copies ``data`` in (tests, fuzzing, any byte source);
    * ``get_buffer() -> memoryview`` then ``buffer_updated(n) -> list[Frame] | None``: the caller receives
      straight into the decoder's buffer (``asyncio.BufferedProtocol``). While a bulk data body is being
      received, ``get_buffer`` returns the destination itself, so bulk bytes land in the user's buffer.
      None: the read completed only answers to ``answers``' calls, given to their futures (compiled core).

    Its state and receive interface are svcframe._speedups.DecoderCore where it was built (``_PyDecoderCore``,
    the definition, otherwise or with SVCFRAME_PURE=1; ``PyFrameDecoder`` is the pure decoder either way).

    Args:
        max_body_bytes: largest body accepted (inline or one bulk data chunk); a larger announced
            length raises FrameTooLarge before any of it is buffered.
        bulk_sink: where bulk data bodies go (see ``BulkSink``); None rejects bulk data frames.
        buffer_bytes: size of the receive buffer for headers and small bodies.

    Raises (from feed / buffer_updated): RemoteProtocolError (bad magic, version, kind, reserved
    bits), FrameTooLarge. After an error the decoder is unusable: drop the connection.
    """

    __slots__ = ("_direct_frame", "_direct_value", "_large", "held")


if not PURE:
    configure_decoder(KEEP_RECEIVE_BYTES)
