"""The svcframe wire format: the header, frame and body encoders, the strict body decoder and the handshake's MAC,
sans-IO.

Nothing here touches sockets or an event loop: bytes go in, frames come out, so the codec can be tested
and fuzzed with plain bytes. The asyncio transport (``svcframe.transport``) is a thin pump around it.

Frame = 80-byte header + body. Header, little-endian (``HEADER``)::

    offset size field              meaning
    0      2    magic              b"SF": rejects HTTP, TLS and other cross-protocol input at once
    2      1    version            WIRE_VERSION
    3      1    kind               Kind (request, response, bulk data, ...)
    4      2    flags              Flag bits
    6      2    provider_id        target provider (uint16, as Margo)
    8      4    rpc_id             rpc_id(name): CRC-32 of the RPC name
    12     4    body_length        bytes of body after the header; checked against the maximum before buffering
    16     8    request_id         chosen by the sender of a request; echoed by its response and bulk data
    24     4    deadline_usec      caller's remaining time budget when sent, in microseconds (0 = none)
    28     2    status             Status of a response (0 = ok)
    30     2    parent_provider_id provider of the handler that made this call (0xFFFF = none)
    32     4    parent_rpc_id      RPC of the handler that made this call (0 = a call from outside any handler)
    36     4    reserved           must be 0
    40     8    callpath           64-bit chained hash of the whole RPC ancestry (SYMBIOSYS-style)
    48     16   trace_id           W3C trace id (zero when not traced)
    64     8    span_id            caller's span id (zero when not traced)
    72     8    lamport            sender's Lamport clock (0 when not traced)

The immediate parent (``parent_rpc_id``, ``parent_provider_id``) keys per-callpath statistics as in
Margo's monitoring ("parent_rpc:parent_provider:rpc:provider"); the chained hash distinguishes deeper
ancestries that share a parent.

Bodies: msgpack (strict: no extension types, string map keys only) for ``HELLO``, ``REQUEST``,
``RESPONSE``, ``BULK_PULL``, ``BULK_PUSH`` and ``GOODBYE``; raw bytes for ``BULK_DATA_REPLY`` and
``BULK_DATA_PUSH``, which the decoder writes straight into the destination buffer a *bulk sink* names,
so bulk payloads never pass through msgpack nor through an intermediate Python copy.

Connection set-up (authentication happens once, here; mutual when a shared secret is configured): the
listening side sends ``HELLO`` with a fresh nonce first; the dialling side answers with its own ``HELLO``
carrying its own nonce, the endpoint it connected to as its socket sees it (``via``), and
``auth_mac(secret, "client", ...)`` over both nonces, both engine ids and that endpoint. The server checks
``via`` against its own end of the connection and the MAC, then proves the secret in turn with a second
``HELLO`` carrying ``auth_mac(secret, "server", ...)`` over the same nonces and ids and the client's end as
the server sees it; the client checks it before it sends anything else. The direction label stops a
reflection, the endpoints stop a relay (an impostor at a stale address cannot pass a client's proof on to
the real server, nor the server's back), the nonces stop a replay. A refused handshake is answered by
``GOODBYE`` with status ``UNAUTHENTICATED``. Without a secret on either side nothing is proved.

The receiving side, an incremental decoder that receives straight into its own buffer, is
``svcframe.decoder``.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import hmac
import mmap
import os
import struct
import zlib
from typing import Any

import msgpack

from .errors import (  # Status: errors owns the table
    ConfigError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    Status,
)

try:
    import cython
except ModuleNotFoundError:  # interpreted where Cython is not installed
    from . import _cython as cython

if not cython.compiled:  # the C functions the compiled branches call (wire.pxd): never reached interpreted
    PyBytes_FromStringAndSize: Any = None
    PyBytes_AS_STRING: Any = None
    PyUnicode_DecodeUTF8: Any = None
    PyFloat_Unpack4: Any = None
    PyFloat_Unpack8: Any = None
    memcpy: Any = None
    memset: Any = None
    _put16: Any = None  # (these four: svcframe/_bytes.pxd)
    _put64be: Any = None
    _put32: Any = None
    _put64: Any = None

__all__ = [
    "DEBUG_WIRE",
    "DEFAULT_MAX_BODY_BYTES",
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "WIRE_VERSION",
    "Flag",
    "Frame",
    "Kind",
    "Status",
    "auth_mac",
    "callpath_extend",
    "encode_frame",
    "encode_header",
    "pack_body",
    "rpc_id",
    "unpack_body",
]

MAGIC = b"SF"
HEADER = struct.Struct("<2sBBHHIIQIHHIIQ16sQQ")

# The header's constants, and plain-int copies of the kinds, flags and statuses for the hot paths (IntEnum and
# IntFlag operations run Python code; comparisons with these ints do not). Compiled, they are C constants
# (wire.pxd's ``cpdef enum``, which this module also exports as ints); interpreted, they are these.
if not cython.compiled:
    WIRE_VERSION = 1
    HEADER_SIZE = 80
    NO_PARENT_PROVIDER = 0xFFFF
    K_HELLO, K_REQUEST, K_RESPONSE, K_CANCEL = 1, 2, 3, 4
    K_BULK_PULL, K_BULK_PUSH, K_BULK_DATA_REPLY, K_BULK_DATA_PUSH, K_GOODBYE = 5, 6, 7, 8, 9
    F_TRACED, F_IDEMPOTENT, F_NO_REPLY, F_CMA, F_INTO, F_TRACE_STARTED_HERE = 1, 2, 4, 8, 16, 0x8000
    S_OK = 0
assert HEADER.size == HEADER_SIZE

#: Default cap on an inline (msgpack) body: 4 MiB, like gRPC's default receive limit. Large payloads
#: belong in bulk transfers, which are chunked and never limited by this.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: Bulk data larger than one frame the receiver takes travels in frames of this size by default.
DEFAULT_BULK_CHUNK_BYTES = 1024 * 1024
#: The smallest frame body limit an engine may have, and a peer may announce in its HELLO: bulk data is sent
#: in frames of at most the receiver's limit, so a smaller one would cost a frame header per few bytes.
MIN_MAX_BODY_BYTES = 4096

ZERO_TRACE_ID = bytes(16)


class Kind(enum.IntEnum):
    HELLO = 1
    REQUEST = 2
    RESPONSE = 3
    CANCEL = 4
    BULK_PULL = 5  # request: body [bulk_id, offset, length]; answered by BULK_DATA_REPLY frames + RESPONSE
    # (flagged CMA: answered by the range's address; with [.., destination, expires_ns, mark address] added,
    # by writing the range there: svcframe.bulk, split reads; flagged CMA and INTO, no pull but an offer for
    # the sender's next request: [request id, destination, size, expires_ns, mark address, share])
    BULK_PUSH = 6  # request: body [bulk_id, offset, length]; followed by BULK_DATA_PUSH frames
    # (flagged CMA: [.., source address], which the owner reads)
    BULK_DATA_REPLY = 7  # raw data for the receiver's own request `request_id` (a pull)
    BULK_DATA_PUSH = 8  # raw data for the sender's request `request_id` (a push)
    GOODBYE = 9  # the sender closes or drains; status says why


_KIND_MAX = int(max(Kind))
#: Every kind set: what a decoder accepts unless its connection's phase says otherwise.
ALL_KINDS_MASK = sum(1 << k for k in Kind)


class Flag(enum.IntFlag):
    NONE = 0
    TRACED = 1  # trace_id / span_id / lamport are meaningful
    IDEMPOTENT = 2  # the caller may retry this request
    NO_REPLY = 4  # one-way request: the server sends no response
    CMA = 8  # a BULK_PUSH whose data the receiver reads from the sender's memory (svcframe.cma): no data frames
    INTO = 16  # REQUEST: the caller takes a bytes-like result as raw data into its own buffer; RESPONSE: the
    #            result went so (BULK_DATA_REPLY frames before it), its body the byte count; BULK_DATA_REPLY:
    #            the whole result, and the call's answer (no RESPONSE follows; the count is its length)
    TRACE_STARTED_HERE = 0x8000  # local, never sent: this server started the trace of a call that came untraced


class Frame:
    """One decoded frame: the header's fields (``HEADER``, without magic, version and the reserved word) and its
    body: ``bytes`` (msgpack, or empty), a ``memoryview`` of a body received into a buffer of its own, a ``BinBody``,
    or ``None`` for bulk data, which was written into the buffer the bulk sink returned. Immutable; equal to a
    frame of equal fields. ``trace_id`` is 16 bytes; the other header fields are unsigned ints.
    """

    __slots__ = (  # noqa: RUF023  (the constructor's order)
        "kind", "flags", "provider_id", "rpc_id", "request_id", "deadline_usec", "status", "parent_provider_id",
        "parent_rpc_id", "callpath", "trace_id", "span_id", "lamport", "body",
    )  # fmt: skip

    kind: int
    flags: int
    provider_id: int
    rpc_id: int
    request_id: int
    deadline_usec: int
    status: int
    parent_provider_id: int
    parent_rpc_id: int
    callpath: int
    trace_id: bytes
    span_id: int
    lamport: int
    body: bytes | bytearray | memoryview | BinBody | None

    def __init__(
        self, kind: int, flags: int, provider_id: int, rpc_id: int, request_id: int, deadline_usec: int,
        status: int, parent_provider_id: int, parent_rpc_id: int, callpath: int, trace_id: bytes, span_id: int,
        lamport: int, body: bytes | bytearray | memoryview | BinBody | None,
    ) -> None:  # fmt: skip
        self.kind = kind
        self.flags = flags
        self.provider_id = provider_id
        self.rpc_id = rpc_id
        self.request_id = request_id
        self.deadline_usec = deadline_usec
        self.status = status
        self.parent_provider_id = parent_provider_id
        self.parent_rpc_id = parent_rpc_id
        self.callpath = callpath
        self.trace_id = trace_id
        self.span_id = span_id
        self.lamport = lamport
        self.body = body

    def fields(self) -> tuple[Any, ...]:
        """The fields, in the order of the constructor's arguments."""
        return (self.kind, self.flags, self.provider_id, self.rpc_id, self.request_id, self.deadline_usec,
                self.status, self.parent_provider_id, self.parent_rpc_id, self.callpath, self.trace_id, self.span_id,
                self.lamport, self.body)  # fmt: skip

    def replace(self, **changes: Any) -> Frame:
        """A copy of this frame with the fields named by ``changes`` replaced (``flags=..., trace_id=...``).

        Raises:
            TypeError: a name that is not a field.
        """
        fields = dict(zip(_FRAME_FIELDS, self.fields(), strict=True))
        unknown = set(changes) - fields.keys()
        if unknown:
            raise TypeError(f"Frame has no field {sorted(unknown)[0]!r}")
        fields.update(changes)
        return Frame(**fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return self.fields() == other.fields()

    __hash__ = None  # type: ignore[assignment]  # (compared by value; a body may be a buffer)

    def __repr__(self) -> str:
        named = ", ".join(f"{name}={value!r}" for name, value in zip(_FRAME_FIELDS, self.fields(), strict=True))
        return f"Frame({named})"


_FRAME_FIELDS = Frame.__slots__


def rpc_id(name: str) -> int:
    """The 32-bit id of an RPC name on the wire (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(name.encode())


_MASK64 = (1 << 64) - 1


def callpath_extend(parent: int, rpc: int, provider_id: int) -> int:
    """The callpath of a call made under ``parent``: a chained 64-bit FNV-1a style hash.

    Source: Ramesh et al., SYMBIOSYS, section III (callpath ancestry as a chained 64-bit hash).
    0 is the root (a call made outside any handler).
    """
    h = (parent ^ 0xCBF29CE484222325) & _MASK64
    h = ((h ^ rpc) * 0x100000001B3) & _MASK64
    h = ((h ^ provider_id) * 0x100000001B3) & _MASK64
    return h or 1


def encode_header(
    kind: int,
    request_id: int,
    body_length: int,
    *,
    provider_id: int = 0,
    rpc: int = 0,
    flags: int = 0,
    status: int = 0,
    deadline_usec: int = 0,
    parent_provider_id: int = NO_PARENT_PROVIDER,
    parent_rpc: int = 0,
    callpath: int = 0,
    trace_id: bytes = ZERO_TRACE_ID,
    span_id: int = 0,
    lamport: int = 0,
) -> bytes:
    """Pack one frame header. Raises LocalProtocolError when a field does not fit its width."""
    if len(trace_id) != 16:
        raise LocalProtocolError(f"trace_id must be 16 bytes, got {len(trace_id)}")
    try:
        return HEADER.pack(
            MAGIC, WIRE_VERSION, kind, flags, provider_id, rpc, body_length, request_id, deadline_usec, status,
            parent_provider_id, parent_rpc, 0, callpath, trace_id, span_id, lamport,
        )  # fmt: skip
    except struct.error as exc:
        raise LocalProtocolError(f"frame header field out of range: {exc}") from exc


def encode_frame(kind: int, request_id: int, body: bytes = b"", **fields: int | bytes) -> bytes:
    """Header + body as one bytes object (for small bodies; send big ones as separate buffers)."""
    return encode_header(kind, request_id, len(body), **fields) + body  # type: ignore[arg-type]


# Fast encoders for the per-call hot path: the constant leading bytes are packed once, the rest by one C
# call through a partial (no keyword arguments, no range checks in Python): a keyword call of encode_header
# costs many more instructions per call (tools/instructions_per_call.sh).
_REQUEST = struct.Struct("<4sHHIIQIHHIIQ16sQQ")  # HEADER without magic, version and kind
_RESPONSE_OK = struct.Struct("<4s8xIQ56x")  # HEADER of an OK response: all zeros but body length and request id
_RESPONSE_FLAGS = struct.Struct("<4sH6xIQ56x")  # the same with flags
assert _REQUEST.size == _RESPONSE_OK.size == _RESPONSE_FLAGS.size == HEADER_SIZE

#: ``pack_request_header(flags, provider_id, rpc_id, body_length, request_id, deadline_usec, status,
#: parent_provider_id, parent_rpc_id, 0, callpath, trace_id, span_id, lamport) -> bytes``: a REQUEST header.
pack_request_header = functools.partial(_REQUEST.pack, MAGIC + bytes([WIRE_VERSION, 2]))

# A bulk frame's header: kind and flags, body length and request id, no parent provider, zeros elsewhere.
_BULK_HEADER = struct.Struct("<4sH6xIQ6xH48x")
assert _BULK_HEADER.size == HEADER_SIZE
_pack_bulk_push = functools.partial(_BULK_HEADER.pack, MAGIC + bytes([WIRE_VERSION, K_BULK_PUSH]))
_pack_bulk_data_push = functools.partial(_BULK_HEADER.pack, MAGIC + bytes([WIRE_VERSION, K_BULK_DATA_PUSH]))


#: A push ahead's BULK_PUSH body with a 16-byte bulk id: msgpack ``[bulk id (bin 8), offset, size, call id]``,
#: each unsigned int in its 8-byte form (valid msgpack, not the shortest: msgpack reads it, and so do
#: decoder._ahead_body and its compiled twin). One C call, not pack_body's Python work and list.
_AHEAD_BODY = struct.Struct(">3s16sBQBQBQ")
if not cython.compiled:
    _AHEAD_BODY_BYTES = _AHEAD_BODY.size  # 46
_pack_ahead_body = functools.partial(_AHEAD_BODY.pack, b"\x94\xc4\x10")  # (then 0xCF: uint 64, before each)


def push_ahead_frames(
    request_id: int, bulk_id: bytes, offset: int, size: int, call_id: int, *, data: bool = True
) -> bytes:
    """A push ahead of the answer to call ``call_id`` (svcframe.bulk): its BULK_PUSH flagged NO_REPLY, body
    msgpack ``[bulk_id, offset, size, call_id]``, and with ``data`` (when ``size`` > 0) the header of its one
    data frame of ``size`` bytes, as one bytes object; the data follows. Without ``data``, the BULK_PUSH
    alone (its data then goes in chunks). The bytes of ``encode_frame`` and ``encode_header``, in three C
    calls instead of their Python work.

    Raises:
        struct.error: a field does not fit (callers pass a request id of ours and a range they checked).
    """
    if (
        cython.compiled
        and type(bulk_id) is bytes
        and len(bulk_id) == 16
        and 0 <= request_id <= _MASK64
        and 0 <= offset <= _MASK64
        and 0 <= size <= 0xFFFFFFFF
        and 0 <= call_id <= _MASK64
    ):  # (anything else is packed below, and a field out of range raises there)
        with_data = data and size > 0
        out = PyBytes_FromStringAndSize(cython.NULL, 2 * HEADER_SIZE + _AHEAD_BODY_BYTES if with_data else
                                        HEADER_SIZE + _AHEAD_BODY_BYTES)  # fmt: skip
        p = _frame_data(out)
        _put_header(p, K_BULK_PUSH, F_NO_REPLY, _AHEAD_BODY_BYTES, request_id)
        _put16(p + 30, NO_PARENT_PROVIDER)  # (encode_frame's default)
        q = p + HEADER_SIZE
        q[0], q[1], q[2] = 0x94, 0xC4, 0x10
        memcpy(q + 3, _bytes_data(bulk_id), 16)
        q[19] = q[28] = q[37] = 0xCF
        _put64be(q + 20, offset)
        _put64be(q + 29, size)
        _put64be(q + 38, call_id)
        if with_data:
            _put_header(q + _AHEAD_BODY_BYTES, K_BULK_DATA_PUSH, 0, size, request_id)
            _put16(q + _AHEAD_BODY_BYTES + 30, NO_PARENT_PROVIDER)
        return out  # type: ignore[no-any-return]  # (a new bytes object)
    if len(bulk_id) == 16:
        body = _pack_ahead_body(bulk_id, 0xCF, offset, 0xCF, size, 0xCF, call_id)
    else:  # (a handle made by hand: its owner refuses it, but it goes as given)
        body = pack_body([bulk_id, offset, size, call_id])
    frames = _pack_bulk_push(F_NO_REPLY, len(body), request_id, NO_PARENT_PROVIDER) + body
    if data and size:
        return frames + _pack_bulk_data_push(0, size, request_id, NO_PARENT_PROVIDER)
    return frames


def request_frame(
    flags: int,
    provider_id: int,
    rpc_id: int,
    request_id: int,
    deadline_usec: int,
    parent_provider_id: int,
    parent_rpc_id: int,
    callpath: int,
    trace_id: bytes,
    span_id: int,
    lamport: int,
    body: bytes,
) -> bytes:
    """A REQUEST frame, header and body in one bytes object (status and reserved bits 0).

    Raises:
        struct.error (interpreted), OverflowError (compiled): a field out of its range (``HEADER``: 16, 32 or
            64 bits, unsigned).
    """
    if cython.compiled and type(body) is bytes and len(trace_id) == 16:
        n = len(body)
        out = _new_frame_bytes(n)
        p = _frame_data(out)
        _put_header(p, K_REQUEST, flags, n, request_id)
        _put16(p + 6, provider_id)
        _put32(p + 8, rpc_id)
        _put32(p + 24, deadline_usec)
        _put16(p + 30, parent_provider_id)
        _put32(p + 32, parent_rpc_id)
        _put64(p + 40, callpath)
        memcpy(p + 48, _bytes_data(trace_id), 16)
        _put64(p + 64, span_id)
        _put64(p + 72, lamport)
        memcpy(p + HEADER_SIZE, _bytes_data(body), n)
        return out
    return pack_request_header(flags, provider_id, rpc_id, len(body), request_id, deadline_usec, 0,
                               parent_provider_id, parent_rpc_id, 0, callpath, trace_id, span_id, lamport) + body  # fmt: skip


def ok_response(request_id: int, result: bytes | None) -> bytes:
    """An OK RESPONSE frame whose body is ``result`` (None or bytes) packed as msgpack (nil, or bin 8/16/32:
    what ``pack_body`` makes of it).

    Raises:
        TypeError: ``result`` is neither None nor bytes. struct.error: a field out of its range.
    """
    if result is not None and type(result) is not bytes:
        raise TypeError(f"ok_response takes None or bytes, not {type(result).__name__}")
    if cython.compiled:
        if result is None:
            out = _new_frame_bytes(1)
            p = _frame_data(out)
            _put_header(p, K_RESPONSE, 0, 1, request_id)
            p[HEADER_SIZE] = 0xC0
            return out
        n = len(result)
        head = 2 if n < 0x100 else 3 if n < 0x10000 else 5  # bin 8, 16, 32 (bin_header)
        out = _new_frame_bytes(head + n)
        p = _frame_data(out)
        _put_header(p, K_RESPONSE, 0, head + n, request_id)
        q = p + HEADER_SIZE
        if head == 2:
            q[0], q[1] = 0xC4, n
        elif head == 3:
            q[0], q[1], q[2] = 0xC5, n >> 8, n & 0xFF
        else:
            q[0], q[1], q[2], q[3], q[4] = 0xC6, n >> 24, (n >> 16) & 0xFF, (n >> 8) & 0xFF, n & 0xFF
        memcpy(q + head, _bytes_data(result), n)
        return out
    body = b"\xc0" if result is None else bin_header(len(result)) + result
    return pack_ok_response_header(len(body), request_id) + body


def data_reply_header(flags: int, length: int, request_id: int) -> bytes:
    """The header of a BULK_DATA_REPLY of ``length`` bytes of data for ``request_id``, with ``flags``."""
    if cython.compiled:
        out = _new_frame_bytes(0)
        _put_header(_frame_data(out), K_BULK_DATA_REPLY, flags, length, request_id)
        return out
    return pack_data_reply_header_flags(flags, length, request_id)


# -- the compiled build's leaf byte loops (wire.pxd declares them inline): a frame's bytes written in place --
def _new_frame_bytes(body_length: int) -> bytes:
    """A new, uninitialised bytes object of a header and ``body_length`` bytes (filled by the caller)."""
    return PyBytes_FromStringAndSize(cython.NULL, HEADER_SIZE + body_length)  # type: ignore[no-any-return]


def _frame_data(out: bytes) -> Any:
    """The first byte of ``out``, a bytes object just made by ``_new_frame_bytes`` and not yet shared."""
    return cython.cast(cython.p_uchar, PyBytes_AS_STRING(out))


def _bytes_data(b: bytes) -> Any:
    """The first byte of the bytes object ``b``."""
    return cython.cast(cython.p_uchar, PyBytes_AS_STRING(b))


def _put_header(p: Any, kind: int, flags: int, body_length: int, request_id: int) -> None:
    """The header at ``p`` of a frame of ``kind``: magic, version, kind, flags, body length, request id, zeros
    elsewhere (as the interpreted build's header structs: ``_RESPONSE_OK``)."""
    memset(p, 0, HEADER_SIZE)
    p[0], p[1], p[2], p[3] = 0x53, 0x46, WIRE_VERSION, kind  # b"SF"
    _put16(p + 4, flags)
    _put32(p + 12, body_length)
    _put64(p + 16, request_id)


#: ``pack_ok_response_header(body_length, request_id) -> bytes``: the header of a RESPONSE with status OK.
pack_ok_response_header = functools.partial(_RESPONSE_OK.pack, MAGIC + bytes([WIRE_VERSION, 3]))
#: ``pack_ok_response_header_flags(flags, body_length, request_id) -> bytes``: the same, with flags.
pack_ok_response_header_flags = functools.partial(_RESPONSE_FLAGS.pack, MAGIC + bytes([WIRE_VERSION, 3]))
#: ``pack_data_reply_header_flags(flags, body_length, request_id) -> bytes``: a BULK_DATA_REPLY header.
pack_data_reply_header_flags = functools.partial(_RESPONSE_FLAGS.pack, MAGIC + bytes([WIRE_VERSION, 7]))


_packer = msgpack.Packer(use_bin_type=True, strict_types=False, autoreset=True)


_TYPES_HINT = (
    "use msgpack types (None, bool, int, float, str, bytes, list, dict with str keys); pass a bulk handle as "
    "handle.to_wire()"
)


#: Check every outgoing msgpack body with the receiver's own strict decoder (``unpack_body``), so a value
#: every peer refuses (an extension type, a non-str map key) fails at the sender, with the caller's line in
#: the traceback, instead of as a remote BadRequest that also closes the connection. Off by default: the
#: receiver's strictness is the guarantee, and the check decodes every body again (several times the cost of
#: a pack_body of a small dict). On when the environment has
#: ``SVCFRAME_DEBUG_WIRE=1`` as this module is imported, or set ``svcframe.wire.DEBUG_WIRE = True`` (read at
#: every call).
DEBUG_WIRE = os.environ.get("SVCFRAME_DEBUG_WIRE", "") not in ("", "0")


def pack_body(obj: object) -> bytes:
    """msgpack-encode an RPC argument or result.

    Bodies are strict msgpack (no extension types, str map keys only); the receiver refuses anything else
    (``unpack_body``). The sender checks it too only in debug mode (``DEBUG_WIRE``).

    Raises:
        LocalProtocolError: msgpack cannot encode the value (a type it does not know, an int beyond 64
            bits); in debug mode, also a value every receiver would refuse.
    """
    try:
        body: bytes = _packer.pack(obj)
    except (TypeError, ValueError, OverflowError) as exc:
        _packer.reset()
        raise LocalProtocolError(f"cannot encode {type(obj).__name__} as an RPC body: {exc}; {_TYPES_HINT}") from exc
    if DEBUG_WIRE:
        try:
            unpack_body(body)
        except RemoteProtocolError as exc:
            raise LocalProtocolError(f"cannot send this RPC body: {exc}; {_TYPES_HINT}") from None
    return body


#: Byte strings at least this long are sent as a msgpack bin header followed by the object itself
#: (``bin_header``), never copied into an encoded body.
ZERO_COPY_BYTES = 64 * 1024


def bin_header(length: int) -> bytes:
    """The msgpack header of a bin value of ``length`` bytes (bin 8/16/32, msgpack spec "bin format
    family"): ``bin_header(len(b)) + b == msgpack.packb(b)``. Lets a large bytes body go out as two
    buffers instead of one copy."""
    if length < 0x100:
        return b"\xc4" + length.to_bytes(1, "big")
    if length < 0x10000:
        return b"\xc5" + length.to_bytes(2, "big")
    return b"\xc6" + length.to_bytes(4, "big")


class BinBody:
    """A body that was one msgpack bin 32 (a large ``bytes`` result), already decoded: the frame decoder
    received its bytes straight into ``value`` (svcframe.decoder: a RESPONSE on a dialled connection, compiled
    builds), so ``unpack_body`` returns ``value`` without the copy decoding would make. ``len()`` is the
    body's length on the wire (header included), as for any body."""

    __slots__ = ("size", "value")

    def __init__(self, value: bytes, size: int) -> None:
        self.value = value
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __eq__(self, other: object) -> bool:
        if type(other) is not BinBody:
            return NotImplemented
        return self.size == other.size and self.value == other.value

    __hash__ = None  # type: ignore[assignment]  # (compared by value, as the bytes it stands for)

    def __repr__(self) -> str:
        return f"BinBody({len(self.value)} bytes)"


def unpack_body(body: bytes | bytearray | memoryview | BinBody) -> object:
    """Decode a msgpack body strictly (no extension types, str map keys). Container and string sizes
    are bounded by the body's length (msgpack's default), and the body by the frame size limit.

    Raises RemoteProtocolError for anything malformed.
    """
    if type(body) is BinBody:
        return body.value
    if not body:
        return None
    if cython.compiled and type(body) is bytes:  # a small body is decoded here, without msgpack's call
        n = len(body)
        pos = 0
        value = _small_item(_bytes_data(body), cython.address(pos), n, 0)
        if value is not _NOT_SMALL and pos == n:
            return value
    try:
        value = msgpack.unpackb(  # raw=False, strict_map_key=True, use_list=True are msgpack's defaults
            body,
            ext_hook=_refuse_ext,
            max_ext_len=0,  # refuses every extension with data, including timestamps (ext -1, never hooked)
            object_pairs_hook=_str_keyed_dict,
        )
    except RemoteProtocolError:
        raise
    except Exception as exc:  # msgpack raises many types (FormatError, ExtraData, ValueError, ...)
        if "max_ext_len" in str(exc) or "timestamp" in str(exc):
            raise RemoteProtocolError(f"msgpack extension types are not allowed on the wire ({exc})") from None
        raise RemoteProtocolError(f"malformed msgpack body: {type(exc).__name__}: {exc}") from exc
    return value


_NIL = b"\xc0"  # msgpack's nil: the body of a None result
_NOT_SMALL = object()  # what _small_item gives for an item it leaves to msgpack


def _small_item(b: Any, at: Any, end: int, depth: int) -> object:
    """The compiled build's decoder of one small msgpack item at ``b[at[0]]``, below ``end``, as
    ``msgpack.unpackb`` decodes it with svcframe's options (raw=False, strict UTF-8, lists, str map keys): nil,
    a bool, an int of any width, a float, a str or a bin up to 255 bytes, and, ``depth`` below 2, a fixarray or a
    fixmap with str keys (up to 15 entries) of such items; ``at[0]`` moves past it. ``_NOT_SMALL`` for anything
    else (a truncated item, another type, a key that is not a str, invalid UTF-8): ``unpack_body`` then calls
    msgpack, which decodes it or raises its error. A noop call's ``[0, None, None, b""]`` costs msgpack's call
    more than its decoding (its keyword arguments)."""
    pos = at[0]
    if pos >= end:
        return _NOT_SMALL
    c = b[pos]
    pos += 1
    if c <= 0x7F:  # positive fixint
        value: object = c
    elif c >= 0xE0:  # negative fixint
        value = cython.cast(cython.int, c) - 256
    elif c == 0xC0:
        value = None
    elif c == 0xC2:
        value = False
    elif c == 0xC3:
        value = True
    elif 0xA0 <= c <= 0xBF or c == 0xD9 or c == 0xC4:  # fixstr, str 8, bin 8
        if 0xA0 <= c <= 0xBF:
            n = c & 0x1F
        elif pos < end:
            n = b[pos]
            pos += 1
        else:
            return _NOT_SMALL
        if n > end - pos:
            return _NOT_SMALL
        if c == 0xC4:
            value = b[pos : pos + n]
        else:
            try:
                value = PyUnicode_DecodeUTF8(cython.cast(cython.p_char, b + pos), n, cython.NULL)
            except UnicodeDecodeError:
                return _NOT_SMALL
        pos += n
    elif 0xCC <= c <= 0xD3:  # uint 8-64, int 8-64
        width = 1 << ((c - 0xCC) & 3)
        if end - pos < width:
            return _NOT_SMALL
        u = 0
        for i in range(width):
            u = (u << 8) | b[pos + i]
        pos += width
        if c <= 0xCF:
            value = u
        else:  # sign-extended from its width
            shift = 64 - 8 * width
            value = cython.cast(cython.longlong, u << shift) >> shift
    elif c == 0xCA or c == 0xCB:  # float 32, float 64 (as msgpack reads them)
        width = 4 if c == 0xCA else 8
        if end - pos < width:
            return _NOT_SMALL
        if width == 4:
            value = PyFloat_Unpack4(cython.cast(cython.p_char, b + pos), 0)
        else:
            value = PyFloat_Unpack8(cython.cast(cython.p_char, b + pos), 0)
        pos += width
    elif 0x80 <= c <= 0x9F and depth < 2:  # fixmap, fixarray
        n = c & 0x0F
        at[0] = pos
        if c <= 0x8F:
            mapping = {}
            for _ in range(n):
                key = _small_item(b, at, end, depth + 1)
                if type(key) is not str:  # (_NOT_SMALL too; a key that is not a str is msgpack's to refuse)
                    return _NOT_SMALL
                item = _small_item(b, at, end, depth + 1)
                if item is _NOT_SMALL:
                    return _NOT_SMALL
                mapping[key] = item
            return mapping
        items = []
        for _ in range(n):
            item = _small_item(b, at, end, depth + 1)
            if item is _NOT_SMALL:
                return _NOT_SMALL
            items.append(item)
        return items
    else:
        return _NOT_SMALL
    at[0] = pos
    return value


def answer_call(waiter: Any, status: int, body: bytes | bytearray | memoryview | BinBody) -> None:
    """Give the future ``waiter`` of a call (not done) its answer, a RESPONSE's ``status`` and ``body``:
    ``(status, value, len(body))``, the value decoded by ``unpack_body`` (``decode_status_body`` for a non-OK
    status), or the RemoteProtocolError of a body it refuses. The engine's dispatch answers calls with it;
    the compiled core answers OK ones the same way (FrameDecoder.answers)."""
    if status:
        waiter.set_result((status, decode_status_body(body), len(body)))
    elif body == _NIL:  # None, the commonest result: no decoder call
        waiter.set_result((0, None, 1))
    else:
        try:
            value = unpack_body(body)
        except ProtocolError as exc:
            waiter.set_exception(exc)
        else:
            waiter.set_result((0, value, len(body)))


def decode_status_body(body: bytes | bytearray | memoryview | BinBody | None) -> object:
    """The body of a non-OK RESPONSE, decoded (``svcframe.errors.error_from_status`` reads it); None when it
    is malformed: the status alone still says what failed."""
    try:
        return unpack_body(body or b"")
    except RemoteProtocolError:
        return None


def _refuse_ext(code: int, data: bytes) -> object:
    raise RemoteProtocolError(f"msgpack extension type {code} is not allowed on the wire")


def _str_keyed_dict(pairs: list[tuple[object, object]]) -> dict[str, object]:
    for key, _ in pairs:
        if type(key) is not str:
            raise RemoteProtocolError(f"map key {key!r:.40} is a {type(key).__name__}; only str keys are allowed")
    return dict(pairs)  # type: ignore[arg-type]


#: The shortest shared secret accepted (bytes): 128 bits, as the nonces.
MIN_SECRET_BYTES = 16


def check_secret(secret: bytes, source: str) -> bytes:
    """``secret`` when it can serve as a shared secret, else ConfigError naming ``source`` (a file, a
    variable, an option): an empty, blank or short key would let anyone authenticate."""
    if len(secret.strip()) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"the shared secret from {source} is {'empty' if not secret.strip() else 'too short'}: it needs at "
            f"least {MIN_SECRET_BYTES} bytes (e.g. python -c 'import secrets; print(secrets.token_hex(16))')"
        )
    return secret


def auth_mac(
    secret: bytes, direction: str, server_nonce: bytes, client_nonce: bytes, server_engine_id: str,
    client_engine_id: str, endpoint: str,
) -> bytes:  # fmt: skip
    """HMAC-SHA256 proof of the shared secret over the handshake's transcript.

    Args:
        direction: "client" (the dialling side proves) or "server" (the listening side proves).
        server_nonce, client_nonce: the 16 random bytes each side sent in its HELLO.
        server_engine_id, client_engine_id: the engine ids of the two HELLOs.
        endpoint: for "client", the server's end of the connection as the client's socket sees it
            ("host:port", or the unix socket path); for "server", the client's end as the server sees it.
    """
    msg = b"\0".join((b"svcframe-auth-v2", direction.encode(), server_nonce, client_nonce,
                      server_engine_id.encode(), client_engine_id.encode(), endpoint.encode()))  # fmt: skip
    return hmac.new(secret, msg, hashlib.sha256).digest()


def lazy_buffer(size: int) -> mmap.mmap:
    """A writable, zero-filled buffer of ``size`` bytes (> 0) whose pages the kernel commits only when they
    are written (an anonymous mapping): the memory a connection costs follows the bytes its peer sent, not
    the size a header declared nor the room a receive buffer offers. Slicing it gives ``bytes``; it is
    unmapped when the last reference goes."""
    return mmap.mmap(-1, size)
