"""The sans-IO codec (svcframe.wire): encoding, incremental decoding in any split, and the decoder
invariant (fuzzed): valid input decodes to the frames encoded, anything else raises RemoteProtocolError,
and no body over ``max_body_bytes`` is ever allocated."""

from __future__ import annotations

import contextlib
import itertools
import os
import ssl
import struct
import subprocess
import sys
import tracemalloc
from collections.abc import Iterable, Sequence

import msgpack
import pytest
from conftest import memory_counted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svcframe import decoder as decoder_module
from svcframe import wire
from svcframe.compiled import compiled_modules
from svcframe.decoder import FrameDecoder
from svcframe.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from svcframe.wire import (
    DEFAULT_MAX_BODY_BYTES,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    WIRE_VERSION,
    Flag,
    Frame,
    Kind,
    Status,
    callpath_extend,
    encode_frame,
    encode_header,
    pack_body,
    rpc_id,
    unpack_body,
)

BULK_KINDS = (Kind.BULK_DATA_REPLY, Kind.BULK_DATA_PUSH)
MSGPACK_KINDS = tuple(k for k in Kind if k not in BULK_KINDS and k != Kind.CANCEL)
FUZZ = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ONE_INTERPRETER = pytest.mark.one_interpreter  # the codec is ours: fuzzed on CI's first interpreter only
DECODER_COMPILED = compiled_modules().get(
    "svcframe.decoder", False
)  # (a large bytes result is received into its bytes)

MAX_FIELDS: dict[str, int | bytes] = {
    "provider_id": 0xFFFF,
    "rpc": 0xFFFFFFFF,
    "flags": 0xFFFF,
    "status": 0xFFFF,
    "deadline_usec": 0xFFFFFFFF,
    "callpath": 2**64 - 1,
    "trace_id": b"\xff" * 16,
    "span_id": 2**64 - 1,
    "lamport": 2**64 - 1,
}
MAX_REQUEST_ID = 2**64 - 1


class Sink:
    """A bulk sink writing each bulk data body into a bytearray of its own (kept in ``received``)."""

    def __init__(self, limit: int | None = None) -> None:
        self.received: list[tuple[int, int, bytearray]] = []
        self.limit = limit

    def __call__(self, kind: int, request_id: int, length: int) -> memoryview:
        if self.limit is not None and length > self.limit:
            raise RemoteProtocolError(f"unexpected {length}-byte bulk data")
        buf = bytearray(length)
        self.received.append((kind, request_id, buf))
        return memoryview(buf)


def expected_frame(kind: int, request_id: int, body: bytes, **fields: int | bytes) -> Frame:
    f: dict[str, int | bytes] = {
        "provider_id": 0, "rpc": 0, "flags": 0, "status": 0, "deadline_usec": 0, "callpath": 0,
        "parent_provider_id": 0xFFFF, "parent_rpc": 0, "trace_id": bytes(16), "span_id": 0, "lamport": 0, **fields,
    }  # fmt: skip
    return Frame(
        kind, f["flags"], f["provider_id"], f["rpc"], request_id, f["deadline_usec"], f["status"],  # type: ignore[arg-type]
        f["parent_provider_id"], f["parent_rpc"], f["callpath"], f["trace_id"], f["span_id"], f["lamport"],  # type: ignore[arg-type]
        None if kind in BULK_KINDS else body,
    )  # fmt: skip


def feed_in_pieces(decoder: FrameDecoder, data: bytes, cuts: Iterable[int]) -> list[Frame]:
    """Deliver ``data`` the way asyncio's BufferedProtocol does: each received piece is written into
    ``get_buffer()`` (possibly over several calls when the buffer is smaller), then ``buffer_updated``;
    held-back frames are fetched with ``more()`` after each non-empty batch."""
    frames: list[Frame] = []
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(data))), len(data)]
    for lo, hi in itertools.pairwise(bounds):
        piece = memoryview(data)[lo:hi]
        while piece:
            buf = decoder.get_buffer()
            assert len(buf) > 0, "get_buffer() returned an empty buffer"
            n = min(len(buf), len(piece))
            buf[:n] = piece[:n]
            piece = piece[n:]
            got = decoder.buffer_updated(n)
            while got:
                frames.extend(got)
                got = decoder.more()
    return frames


# --- encoding round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name)
def test_every_kind_round_trips_with_fields_at_max_width(kind: Kind) -> None:
    body = os.urandom(100) if kind in BULK_KINDS else pack_body({"x": [1, "two", b"three", None, 4.5]})
    sink = Sink()
    decoder = FrameDecoder(bulk_sink=sink)
    frames = decoder.feed(encode_frame(kind, MAX_REQUEST_ID, body, **MAX_FIELDS))
    assert frames == [expected_frame(kind, MAX_REQUEST_ID, body, **MAX_FIELDS)]
    if kind in BULK_KINDS:
        assert sink.received == [(kind, MAX_REQUEST_ID, bytearray(body))]
    else:
        assert sink.received == []
        assert unpack_body(frames[0].body) == {"x": [1, "two", b"three", None, 4.5]}
    assert decoder.idle


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name)
def test_every_kind_round_trips_with_minimal_fields_and_empty_body(kind: Kind) -> None:
    sink = Sink()
    frames = FrameDecoder(bulk_sink=sink).feed(encode_frame(kind, 0))
    assert frames == [expected_frame(kind, 0, b"")]
    assert len(sink.received) == (1 if kind in BULK_KINDS else 0)


def test_header_is_80_bytes_little_endian() -> None:
    header = encode_header(Kind.REQUEST, 0x0102030405060708, 9, provider_id=0x0A0B, parent_rpc=0x11223344)
    assert len(header) == HEADER_SIZE == 80
    assert header[32:36] == (0x11223344).to_bytes(4, "little")
    assert header[30:32] == b"\xff\xff"  # no parent provider
    assert header[:2] == MAGIC and header[2] == WIRE_VERSION and header[3] == Kind.REQUEST
    assert header[6:8] == b"\x0b\x0a"
    assert header[12:16] == (9).to_bytes(4, "little")
    assert header[16:24] == (0x0102030405060708).to_bytes(8, "little")


OUT_OF_RANGE = [
    *[(name, 1 << (8 * size)) for name, size in [("provider_id", 2), ("rpc", 4), ("flags", 2), ("status", 2),
      ("deadline_usec", 4), ("callpath", 8), ("span_id", 8), ("lamport", 8), ("parent_provider_id", 2),
      ("parent_rpc", 4)]],
    ("provider_id", -1), ("request_id", 2**64), ("body_length", 2**32), ("kind", 256),
    ("trace_id", b"\xff" * 17),  # does not fit its 16-byte field: must not be silently truncated
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE, ids=[f"{n}={v!r:.12}" for n, v in OUT_OF_RANGE])
def test_header_field_out_of_range_is_a_local_protocol_error(field: str, value: int | bytes) -> None:
    args: dict[str, int | bytes] = {"kind": Kind.REQUEST, "request_id": 1, "body_length": 0, field: value}
    kind, request_id, length = args.pop("kind"), args.pop("request_id"), args.pop("body_length")
    with pytest.raises(LocalProtocolError):
        encode_header(kind, request_id, length, **args)  # type: ignore[arg-type]


def test_encode_frame_body_length_matches() -> None:
    frame = encode_frame(Kind.RESPONSE, 7, b"abc", status=Status.HANDLER_ERROR)
    assert len(frame) == HEADER_SIZE + 3
    assert HEADER.unpack_from(frame)[6] == 3


def test_rpc_id_and_callpath() -> None:
    assert rpc_id("echo") == rpc_id("echo") != rpc_id("echo2")
    assert 0 <= rpc_id("x" * 1000) < 2**32
    root = callpath_extend(0, rpc_id("a"), 1)
    child = callpath_extend(root, rpc_id("a"), 1)
    assert root != 0 and child != 0 and child != root
    assert callpath_extend(0, rpc_id("a"), 2) != root
    assert all(0 < callpath_extend(p, r, 3) < 2**64 for p in (0, 1, 2**64 - 1) for r in (0, 2**32 - 1))


# --- any split yields the same frames ----------------------------------------------------------------------


def sample_stream() -> tuple[bytes, list[Frame], list[tuple[int, int, bytes]]]:
    """A multi-frame stream mixing every kind, empty bodies, bodies bigger than the receive buffer and
    consecutive bulk data frames; with the frames and bulk payloads it must decode to."""
    parts: list[bytes] = []
    frames: list[Frame] = []
    bulk: list[tuple[int, int, bytes]] = []

    def add(kind: Kind, request_id: int, body: bytes, **fields: int | bytes) -> None:
        parts.append(encode_frame(kind, request_id, body, **fields))
        frames.append(expected_frame(kind, request_id, body, **fields))
        if kind in BULK_KINDS:
            bulk.append((kind, request_id, body))

    add(Kind.HELLO, 0, pack_body({"engine_id": "e" * 32, "address": None, "nonce": b"n" * 16, "auth": False}))
    add(Kind.REQUEST, 1, pack_body(list(range(50))), provider_id=3, rpc=rpc_id("echo"), deadline_usec=5)
    add(Kind.REQUEST, 2, b"", flags=Flag.NO_REPLY)
    add(Kind.BULK_DATA_PUSH, 2, bytes(range(256)) * 3)
    add(Kind.BULK_DATA_PUSH, 2, b"")
    add(Kind.BULK_DATA_PUSH, 2, b"z")
    add(Kind.RESPONSE, 1, pack_body("x" * 700), status=Status.OK)  # bigger than the 144-byte buffer
    add(Kind.CANCEL, 9, b"")
    add(Kind.BULK_PULL, 3, pack_body([1, 0, 10]), **MAX_FIELDS)
    add(Kind.BULK_DATA_REPLY, 3, os.urandom(10), **MAX_FIELDS)
    add(Kind.BULK_PUSH, 4, pack_body([1, 0, 5]))
    add(Kind.GOODBYE, 0, pack_body("bye"), status=Status.SHUTTING_DOWN)
    return b"".join(parts), frames, bulk


def assert_decodes_to_sample(cuts: Iterable[int], buffer_bytes: int) -> None:
    data, frames, bulk = sample_stream()
    sink = Sink()
    decoder = FrameDecoder(bulk_sink=sink, buffer_bytes=buffer_bytes)
    assert feed_in_pieces(decoder, data, cuts) == frames
    assert [(k, r, bytes(b)) for k, r, b in sink.received] == bulk
    assert decoder.idle


@pytest.mark.parametrize("buffer_bytes", [0, 200, 256 * 1024])
def test_byte_at_a_time_yields_identical_frames(buffer_bytes: int) -> None:
    data, _, _ = sample_stream()
    assert_decodes_to_sample(range(1, len(data)), buffer_bytes)


@pytest.mark.parametrize("buffer_bytes", [0, 256 * 1024])
def test_whole_stream_at_once_yields_identical_frames(buffer_bytes: int) -> None:
    assert_decodes_to_sample([], buffer_bytes)


@pytest.mark.parametrize("step", [2, 3, 7, 71, 72, 73, 143, 144, 145, 1000])
def test_fixed_size_pieces_yield_identical_frames(step: int) -> None:
    data, _, _ = sample_stream()
    assert_decodes_to_sample(range(step, len(data), step), 0)


@settings(max_examples=500, deadline=None)
@given(
    cuts=st.lists(st.integers(min_value=1, max_value=5000), max_size=60),
    buffer_bytes=st.sampled_from([0, 150, 1000, 65536]),
)
def test_any_split_yields_identical_frames(cuts: list[int], buffer_bytes: int) -> None:
    assert_decodes_to_sample(cuts, buffer_bytes)


def test_feed_equals_buffer_protocol() -> None:
    data, frames, _ = sample_stream()
    decoder = FrameDecoder(bulk_sink=Sink(), buffer_bytes=0)
    got: list[Frame] = []
    for i in range(0, len(data), 5):
        got.extend(decoder.feed(data[i : i + 5]))
    assert got == frames


def test_large_inline_body_gets_its_own_buffer() -> None:
    body = pack_body(b"\x01" * (3 * 1024 * 1024))
    decoder = FrameDecoder(buffer_bytes=4096)
    data = encode_frame(Kind.REQUEST, 5, body)
    frames = feed_in_pieces(decoder, data, range(65536, len(data), 65536))
    assert len(frames) == 1 and frames[0].body == body
    assert unpack_body(frames[0].body) == b"\x01" * (3 * 1024 * 1024)


def test_idle_only_between_frames() -> None:
    decoder = FrameDecoder(bulk_sink=Sink())
    frame = encode_frame(Kind.REQUEST, 1, b"\x90")
    assert decoder.idle
    assert decoder.feed(frame[:10]) == [] and not decoder.idle
    assert len(decoder.feed(frame[10:])) == 1 and decoder.idle
    bulk = encode_frame(Kind.BULK_DATA_REPLY, 1, b"abcdef")
    assert decoder.feed(bulk[:-2]) == [] and not decoder.idle
    assert len(decoder.feed(bulk[-2:])) == 1 and decoder.idle


# --- bulk data frames --------------------------------------------------------------------------------------


def _receive(decoder: FrameDecoder, data: bytes) -> tuple[list[Frame], int]:
    """Receive ``data`` as a socket would, into each ``get_buffer()`` in turn: the frames and the reads."""
    frames: list[Frame] = []
    reads = 0
    while data:
        buf = decoder.get_buffer()
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        data = data[n:]
        reads += 1
        got = decoder.buffer_updated(n)
        while got:
            frames += got
            got = decoder.more()
    return frames, reads


def _page_faults(decoder: FrameDecoder, data: bytes, times: int) -> int:
    """Minor page faults (memory mapped in afresh) over ``times`` receptions of ``data``, bodies dropped."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(times):
        frames, _ = _receive(decoder, data)
        assert len(frames) == 1
        del frames
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@memory_counted
def test_a_dialled_connection_reads_a_large_result_in_one_read_and_keeps_its_pages_until_idle() -> None:
    """Our own connections (reuse_large) offer the whole receive buffer to every read: a 64 KiB result is one
    read (it was two: the first read stopped at KEEP_RECEIVE_BYTES), and the buffer's pages stay committed
    between reads (they were given back after each batch and faulted in again: 9 page faults per 64 KiB read
    in the bench) until release_idle(), the engine's sweep of an idle connection. An accepted connection
    still reads at most KEEP_RECEIVE_BYTES into an empty buffer and gives its pages back after every batch."""
    frame = encode_frame(Kind.RESPONSE, 1, pack_body(os.urandom(64 * 1024)))
    dialled, accepted = FrameDecoder(), FrameDecoder()
    dialled.reuse_large = True
    assert [_receive(dialled, frame)[1] for _ in range(3)] == [1, 1, 1]
    assert [_receive(accepted, frame)[1] for _ in range(3)] == [2, 2, 2]
    pages = 32 * 1024 // os.sysconf("SC_PAGE_SIZE")  # the pages of a 64 KiB frame above KEEP_RECEIVE_BYTES
    assert _page_faults(dialled, frame, 100) < 100  # kept: (about) none per read
    assert _page_faults(accepted, frame, 100) >= 100 * pages // 2  # given back and faulted in again each time
    dialled.release_idle()  # idle: the pages go back, and fault in again on the next large read
    assert _page_faults(dialled, frame, 1) >= pages // 2


@pytest.mark.parametrize("cut", [HEADER_SIZE + 3, HEADER_SIZE + 5, HEADER_SIZE + 6, 200_000, None])
def test_a_large_bytes_result_is_received_into_the_bytes_the_call_returns(cut: int | None) -> None:
    """A dialled connection (reuse_large, compiled build) receives an OK RESPONSE whose body is one bin 32
    straight into a new ``bytes`` (wire.BinBody): decoding it makes no second copy (a 4 MiB inline
    read was 0.58x raw uvloop's bandwidth), and two results are two objects (nothing reused under them). Cut
    anywhere, even inside the bin header, the value is the same; what does not qualify (another status,
    another kind, a body that is not one bin 32, an accepted connection) is decoded as before."""
    data = os.urandom(300 * 1024)  # larger than the receive buffer
    dialled = FrameDecoder(buffer_bytes=64 * 1024)
    dialled.reuse_large = True
    stream = encode_frame(Kind.RESPONSE, 7, pack_body(data))
    frames = feed_in_pieces(dialled, stream, [] if cut is None else [cut])
    assert [f.request_id for f in frames] == [7] and unpack_body(frames[0].body) == data
    if DECODER_COMPILED and (cut is None or cut >= HEADER_SIZE + 5):
        assert type(frames[0].body) is wire.BinBody and len(frames[0].body) == len(pack_body(data))
        again = _receive(dialled, stream)[0][0]
        value = unpack_body(again.body)
        assert type(value) is bytes and value == data and value is not unpack_body(frames[0].body)
        assert again == frames[0] and again.body != b"\xc0"  # (a frame compares by its body's value)
    elif cut is not None and cut < HEADER_SIZE + 5:
        assert type(frames[0].body) is not wire.BinBody  # the bin header not yet there: the kept buffer
    others = [
        encode_frame(Kind.RESPONSE, 8, pack_body(data), status=Status.APP_ERROR),
        encode_frame(Kind.REQUEST, 9, pack_body(data)),
        encode_frame(Kind.RESPONSE, 10, pack_body([data])),
        encode_frame(Kind.RESPONSE, 11, pack_body(data)[:-1]),  # a bin 32 that claims one byte more than sent
    ]
    for frame in others:
        got = _receive(dialled, frame)[0]
        assert len(got) == 1 and type(got[0].body) is not wire.BinBody
    assert unpack_body(_receive(dialled, others[2])[0][0].body) == [data]
    with pytest.raises(RemoteProtocolError):
        unpack_body(_receive(dialled, others[3])[0][0].body)
    accepted = FrameDecoder(buffer_bytes=64 * 1024)
    assert type(_receive(accepted, stream)[0][0].body) is not wire.BinBody


def test_the_response_after_bulk_data_comes_in_the_same_read() -> None:
    """A read by into= or pull ends with data then the call's RESPONSE. After a large chunk the next read takes
    the next header and a few bytes more, so a small RESPONSE is one read (it was two: its header, then its
    body), and more data behind the header still goes to its destination (at most those bytes copied). After
    a small chunk, reads go on into the receive buffer: the next small read's data and RESPONSE are one read."""
    sink = Sink()
    decoder = FrameDecoder(bulk_sink=sink, buffer_bytes=64 * 1024)
    decoder.reuse_large = True  # a dialled connection, as a caller's
    data = os.urandom(decoder_module.HEADER_FIRST_AFTER_BYTES + 1000)
    frames, _ = _receive(decoder, encode_frame(Kind.BULK_DATA_REPLY, 3, data))
    assert len(frames) == 1 and sink.received == [(Kind.BULK_DATA_REPLY, 3, bytearray(data))]
    frames, reads = _receive(decoder, encode_frame(Kind.RESPONSE, 3, pack_body(len(data))))
    assert reads == 1 and [f.kind for f in frames] == [Kind.RESPONSE] and unpack_body(frames[0].body) == len(data)
    more = os.urandom(
        decoder_module.HEADER_FIRST_AFTER_BYTES
    )  # its bytes past the tail are received into the destination
    frames, reads = _receive(
        decoder, encode_frame(Kind.BULK_DATA_REPLY, 4, data) + encode_frame(Kind.BULK_DATA_REPLY, 5, more)
    )
    assert [f.request_id for f in frames] == [4, 5] and sink.received[-1] == (Kind.BULK_DATA_REPLY, 5, bytearray(more))
    assert reads <= 6 and decoder.idle
    small = os.urandom(48 * 1024)
    for request_id in (6, 7, 8):
        read = encode_frame(Kind.BULK_DATA_REPLY, request_id, small) + encode_frame(Kind.RESPONSE, request_id, b"\xc0")
        frames, reads = _receive(decoder, read)
        assert [f.kind for f in frames] == [Kind.BULK_DATA_REPLY, Kind.RESPONSE] and sink.received[-1][2] == small
        assert reads == (1 if request_id > 6 else 3)  # (the first follows the large chunk: header first)


def test_small_bulk_data_cut_by_the_network_waits_in_the_receive_buffer() -> None:
    """Loopback TCP delivers a 64 KiB read as a 65,483-byte segment and the rest: the data's frame waits whole
    in the receive buffer (as an inline body does), so the second read brings the data's end and the RESPONSE
    behind it, and both are taken together (going straight into the destination made it three reads: the
    data's last bytes alone, then the RESPONSE). The sink is asked once, when all of the data is there."""
    sink = Sink()
    decoder = FrameDecoder(bulk_sink=sink)
    decoder.reuse_large = True
    data = os.urandom(64 * 1024)
    stream = encode_frame(Kind.BULK_DATA_REPLY, 9, data) + encode_frame(Kind.RESPONSE, 9, pack_body(len(data)))
    mss = 65_483
    buf = decoder.get_buffer()
    buf[:mss] = stream[:mss]
    assert decoder.buffer_updated(mss) == [] and sink.received == []
    buf = decoder.get_buffer()
    assert len(buf) >= len(stream) - mss  # the rest goes into the receive buffer, not the destination
    buf[: len(stream) - mss] = stream[mss:]
    frames = decoder.buffer_updated(len(stream) - mss)
    assert [f.kind for f in frames] == [Kind.BULK_DATA_REPLY, Kind.RESPONSE] and decoder.idle
    assert sink.received == [(Kind.BULK_DATA_REPLY, 9, bytearray(data))]


@pytest.mark.parametrize("kind", BULK_KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("size", [1, 100, 300 * 1024])
def test_bulk_data_lands_in_the_sink_buffer(kind: Kind, size: int) -> None:
    payload = os.urandom(size)
    target = bytearray(size + 20)
    calls: list[tuple[int, int, int]] = []

    def sink(k: int, request_id: int, length: int) -> memoryview:
        calls.append((k, request_id, length))
        return memoryview(target)[10 : 10 + length]

    decoder = FrameDecoder(bulk_sink=sink, buffer_bytes=1024)
    data = encode_frame(kind, 42, payload)
    frames = feed_in_pieces(decoder, data, range(1000, len(data), 1000))
    assert calls == [(kind, 42, size)]
    assert len(frames) == 1 and frames[0].kind == kind and frames[0].request_id == 42
    assert frames[0].body is None
    assert target[10 : 10 + size] == payload
    assert target[:10] == bytes(10) and target[10 + size :] == bytes(10)


def test_decoder_holds_back_bulk_data_until_more() -> None:
    expected: dict[int, bytearray] = {}

    def sink(kind: int, request_id: int, length: int) -> memoryview:
        if request_id not in expected:
            raise RemoteProtocolError(f"nobody expects data for request {request_id}")
        return memoryview(expected[request_id])[:length]

    decoder = FrameDecoder(bulk_sink=sink)
    request = encode_frame(Kind.BULK_PUSH, 7, pack_body([1, 0, 4]))
    data = encode_frame(Kind.BULK_DATA_PUSH, 7, b"DATA")
    after = encode_frame(Kind.CANCEL, 8)
    stream = request + data + after
    buf = decoder.get_buffer()
    buf[: len(stream)] = stream
    first = decoder.buffer_updated(len(stream))
    assert [f.kind for f in first] == [Kind.BULK_PUSH]  # the data frame is held back, not failed
    expected[7] = bytearray(4)  # dispatching the request sets up the data's sink
    second = decoder.more()
    assert [f.kind for f in second] == [Kind.BULK_DATA_PUSH, Kind.CANCEL]
    assert second[0].body is None and expected[7] == b"DATA"
    assert decoder.more() == []
    assert decoder.idle


def test_bulk_data_without_a_sink_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="bulk data"):
        FrameDecoder().feed(encode_frame(Kind.BULK_DATA_REPLY, 1, b"abc"))


def test_sink_returning_the_wrong_size_is_rejected() -> None:
    decoder = FrameDecoder(bulk_sink=lambda kind, rid, length: memoryview(bytearray(length + 1)))
    with pytest.raises(RemoteProtocolError, match="bulk sink returned"):
        decoder.feed(encode_frame(Kind.BULK_DATA_PUSH, 1, b"abc"))


def test_sink_refusal_propagates_as_remote_protocol_error() -> None:
    with pytest.raises(RemoteProtocolError, match="unexpected"):
        FrameDecoder(bulk_sink=Sink(limit=2)).feed(encode_frame(Kind.BULK_DATA_PUSH, 1, b"abc"))


# --- frame size limit: rejected before buffering -----------------------------------------------------------


def traced_peak(func: object) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        func()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", [Kind.REQUEST, Kind.RESPONSE, Kind.BULK_DATA_REPLY, Kind.BULK_DATA_PUSH])
@pytest.mark.parametrize("length", [DEFAULT_MAX_BODY_BYTES + 1, 2**31, 2**32 - 1])
@pytest.mark.parametrize("max_body_bytes", [DEFAULT_MAX_BODY_BYTES, 1024])
def test_oversized_length_is_rejected_before_buffering(kind: Kind, length: int, max_body_bytes: int) -> None:
    sink = Sink()
    decoder = FrameDecoder(max_body_bytes=max_body_bytes, bulk_sink=sink)
    header = encode_header(kind, 1, length)

    def feed() -> None:
        with pytest.raises(FrameTooLarge, match=f"{length}-byte body") as info:
            decoder.feed(header + b"\0" * 1000)
        assert isinstance(info.value, RemoteProtocolError)

    assert traced_peak(feed) < 1024 * 1024
    assert sink.received == []  # no sink was asked for a destination


@settings(max_examples=300, deadline=None)
@given(length=st.integers(min_value=4097, max_value=2**32 - 1), split=st.integers(0, HEADER_SIZE))
def test_any_length_over_the_limit_is_frame_too_large(length: int, split: int) -> None:
    decoder = FrameDecoder(max_body_bytes=4096, bulk_sink=Sink(), buffer_bytes=0)
    header = encode_header(Kind.REQUEST, 3, length)
    with pytest.raises(FrameTooLarge):
        decoder.feed(header[:split])
        decoder.feed(header[split:])


def test_length_at_the_limit_is_accepted() -> None:
    decoder = FrameDecoder(max_body_bytes=4096)
    body = b"\x07" * 4096
    assert decoder.feed(encode_frame(Kind.RESPONSE, 1, body)) == [expected_frame(Kind.RESPONSE, 1, body)]


# --- cross-protocol input ----------------------------------------------------------------------------------

HTTP_REQUEST = (
    b"GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: curl/8.5.0\r\n"
    b"Accept: */*\r\nConnection: close\r\n\r\n"
)


def tls_client_hello() -> bytes:
    """The first flight of a real TLS client (the ssl module's own ClientHello)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="example.org")
    with pytest.raises(ssl.SSLWantReadError):
        conn.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("method", [b"GET ", b"POST", b"HEAD", b"PUT ", b"PRI "])
def test_http_request_is_rejected_with_a_helpful_message(method: bytes) -> None:
    data = method + HTTP_REQUEST[4:]
    assert len(data) >= HEADER_SIZE
    with pytest.raises(RemoteProtocolError, match="HTTP"):
        feed_in_pieces(FrameDecoder(), data, range(1, len(data)))


def test_tls_client_hello_is_rejected_with_a_helpful_message() -> None:
    hello = tls_client_hello()
    assert hello[:2] == b"\x16\x03" and len(hello) >= HEADER_SIZE
    with pytest.raises(RemoteProtocolError, match="TLS"):
        FrameDecoder().feed(hello)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda h: b"XY" + h[2:], "magic"),
        (lambda h: h[:2] + bytes([WIRE_VERSION + 1]) + h[3:], "version"),
        (lambda h: h[:3] + b"\x00" + h[4:], "kind"),
        (lambda h: h[:3] + b"\x0a" + h[4:], "kind"),
        (lambda h: h[:3] + b"\xff" + h[4:], "kind"),
        (lambda h: h[:36] + b"\x00\x01\x00\x00" + h[40:], "reserved"),
    ],
    ids=["magic", "version", "kind0", "kind10", "kind255", "reserved"],
)
def test_bad_headers_are_rejected_with_a_reason(mutate: object, match: str) -> None:
    header = mutate(encode_frame(Kind.REQUEST, 1))  # type: ignore[operator]
    with pytest.raises(RemoteProtocolError, match=match):
        FrameDecoder().feed(header)


# --- fuzzing: garbage and mutated frames ---------------------------------------------------------------------


def decode_or_protocol_error(data: bytes, cuts: Sequence[int], max_body_bytes: int = 4096) -> None:
    """The decoder invariant: decode, or raise RemoteProtocolError; msgpack bodies likewise."""
    decoder = FrameDecoder(max_body_bytes=max_body_bytes, bulk_sink=Sink(limit=max_body_bytes), buffer_bytes=256)
    try:
        frames = feed_in_pieces(decoder, data, cuts)
    except RemoteProtocolError:
        return
    for frame in frames:
        assert frame.kind in set(Kind)
        if frame.kind in BULK_KINDS:
            assert frame.body is None
        else:
            assert frame.body is not None
            with contextlib.suppress(RemoteProtocolError):
                unpack_body(frame.body)


header_like = st.builds(
    lambda kind, rest, body: MAGIC + bytes([WIRE_VERSION, kind]) + rest + body,
    st.integers(0, 12),
    st.binary(min_size=HEADER_SIZE - 4, max_size=HEADER_SIZE - 4),
    st.binary(max_size=200),
)


@ONE_INTERPRETER
@FUZZ
@given(
    chunks=st.lists(st.one_of(st.binary(max_size=300), header_like), max_size=6),
    cuts=st.lists(st.integers(1, 2000), max_size=10),
)
def test_garbage_raises_only_remote_protocol_error(chunks: list[bytes], cuts: list[int]) -> None:
    decode_or_protocol_error(b"".join(chunks), cuts)


VALID_STREAM = sample_stream()[0]


@ONE_INTERPRETER
@FUZZ
@given(
    edits=st.lists(
        st.tuples(
            st.sampled_from(["set", "insert", "delete"]),
            st.integers(0, len(VALID_STREAM) - 1),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=8,
    ),
    truncate=st.integers(0, len(VALID_STREAM)),
    cuts=st.lists(st.integers(1, len(VALID_STREAM)), max_size=10),
)
def test_mutated_valid_frames_raise_only_remote_protocol_error(
    edits: list[tuple[str, int, int]], truncate: int, cuts: list[int]
) -> None:
    data = bytearray(VALID_STREAM)
    for op, pos, value in edits:
        pos = min(pos, len(data) - 1)
        if op == "set":
            data[pos] = value
        elif op == "insert":
            data.insert(pos, value)
        else:
            del data[pos]
    decode_or_protocol_error(bytes(data[: max(truncate, 1)]), cuts)


@ONE_INTERPRETER
@FUZZ
@given(
    kind=st.integers(0, 255),
    fields=st.binary(min_size=HEADER_SIZE - 4, max_size=HEADER_SIZE - 4),
    body=st.binary(max_size=100),
)
def test_mutated_header_fields_raise_only_remote_protocol_error(kind: int, fields: bytes, body: bytes) -> None:
    data = MAGIC + bytes([WIRE_VERSION, kind]) + fields + body
    decode_or_protocol_error(data, [], max_body_bytes=2**20)
    decode_or_protocol_error(data, range(1, len(data)), max_body_bytes=2**20)


@ONE_INTERPRETER
@FUZZ
@given(body=st.binary(max_size=200))
def test_unpack_body_of_garbage_raises_only_remote_protocol_error(body: bytes) -> None:
    with contextlib.suppress(RemoteProtocolError):
        unpack_body(body)


# --- msgpack bodies ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -1, 2**64 - 1, -(2**63), 1.5, float("inf"), "", "ünïcode", b"", b"\x00\xff",
     [], [1, [2, [3]]], {}, {"a": {"b": [None, b"x"]}}],
)  # fmt: skip
def test_pack_unpack_round_trip(value: object) -> None:
    assert unpack_body(pack_body(value)) == value


def test_unpack_body_of_empty_body_is_none() -> None:
    assert unpack_body(b"") is None


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb(msgpack.ExtType(5, b"payload")),
        b"\x92\x01\x81\xa1k\xd4\xf9\x00",  # [1, {"k": ext(-7, b"\0")}] (a reserved negative type)
        msgpack.packb(msgpack.Timestamp(1, 0)),  # ext type -1: msgpack decodes it natively unless refused
    ],
    ids=["ext5", "nested-ext", "timestamp-ext-1"],
)
def test_unpack_body_rejects_extension_types(body: bytes) -> None:
    with pytest.raises(RemoteProtocolError, match="extension type"):
        unpack_body(body)


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb({1: "x"}),
        msgpack.packb({"ok": {2.5: "x"}}),
        msgpack.packb({None: 1}),
        msgpack.packb({b"bytes-key": 1}, use_bin_type=True),
    ],
    ids=["int", "nested-float", "nil", "bytes"],
)
def test_unpack_body_rejects_non_str_map_keys(body: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        unpack_body(body)


@pytest.mark.parametrize(
    "body", [b"\xc1", b"\x92\x01", b"\x01\x02", b"\xdb\xff\xff\xff\xff", b"\xa3ab", b"\xc4\x05ab"],
    ids=["never-used", "short-array", "extra-data", "huge-str", "short-str", "short-bin"],
)  # fmt: skip
def test_unpack_body_rejects_malformed_msgpack(body: bytes) -> None:
    with pytest.raises(RemoteProtocolError, match="malformed"):
        unpack_body(body)


@pytest.mark.parametrize(
    "value",
    [object(), {1, 2}, 1j, 2**64, -(2**63) - 1, [1, object()], {"k": {"nested": object()}}],
    ids=["object", "set", "complex", "uint64-overflow", "int64-underflow", "nested-in-list", "nested-in-map"],
)
def test_pack_body_of_unsupported_type_is_local_protocol_error(value: object) -> None:
    with pytest.raises(LocalProtocolError, match="msgpack types"):
        pack_body(value)
    # the shared packer was reset: the next body is not polluted by the failed one
    assert pack_body([1, "a"]) == msgpack.packb([1, "a"])


NON_STRICT_VALUES = pytest.mark.parametrize(
    "value",
    [msgpack.ExtType(5, b"x"), msgpack.Timestamp(1, 0), {1: "int key"}, {b"k": "bytes key"},
     [1, {"ok": {2.5: "nested float key"}}]],
    ids=["ext", "timestamp", "int-key", "bytes-key", "nested-float-key"],
)  # fmt: skip


@NON_STRICT_VALUES
def test_the_receiver_refuses_what_a_sender_packs_outside_debug_mode(
    value: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bodies are strict msgpack (no extension types, str keys). Outside debug mode the sender does not
    decode its own bodies again: the receiver's strict decoder is the guarantee."""
    monkeypatch.setattr(wire, "DEBUG_WIRE", False)
    body = pack_body(value)
    assert body == msgpack.packb(value, use_bin_type=True)
    with pytest.raises(RemoteProtocolError):
        unpack_body(body)


@NON_STRICT_VALUES
def test_pack_body_refuses_what_unpack_body_refuses_in_debug_mode(
    value: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In debug mode (``DEBUG_WIRE``) the sender refuses what every receiver would refuse, so the caller
    gets a LocalProtocolError at its own line instead of a remote BadRequest."""
    monkeypatch.setattr(wire, "DEBUG_WIRE", True)
    with pytest.raises(LocalProtocolError, match=r"cannot send this RPC body.*msgpack types"):
        pack_body(value)
    assert pack_body({"a": [1, b"x", None]}) == msgpack.packb({"a": [1, b"x", None]}, use_bin_type=True)


@pytest.mark.parametrize(("environ", "expected"), [("1", True), ("0", False), (None, False)])
def test_debug_mode_comes_from_the_environment(environ: str | None, expected: bool) -> None:
    """``SVCFRAME_DEBUG_WIRE=1`` turns the sender-side check on in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "SVCFRAME_DEBUG_WIRE"}
    if environ is not None:
        env["SVCFRAME_DEBUG_WIRE"] = environ
    script = "import svcframe.wire as w; w.pack_body({1: 'x'}); print('packed')"
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    if expected:
        assert result.returncode == 1 and "LocalProtocolError: cannot send this RPC body" in result.stderr
    else:
        assert result.returncode == 0 and result.stdout == "packed\n", result.stderr


@pytest.mark.parametrize("length", [0, 1, 255, 256, 65535, 65536, 1 << 20])
def test_bin_header_is_msgpacks_own(length: int) -> None:
    """The zero-copy reply path sends ``bin_header(n)`` then the bytes; receivers must see plain msgpack."""
    from svcframe.wire import bin_header

    data = b"\x01" * length
    assert bin_header(length) + data == msgpack.packb(data, use_bin_type=True)
    assert unpack_body(bin_header(length) + data) == data


@pytest.mark.parametrize("size", [0, 1, 65536, (1 << 32) - 1])
def test_a_push_aheads_frames_are_what_the_general_encoders_give(size: int) -> None:
    """push_ahead_frames (one pass, the hot path of a handler's push) = encode_frame(BULK_PUSH flagged NO_REPLY,
    body [bulk id, offset, size, call id]) + encode_header(BULK_DATA_PUSH) when there is data, byte for byte;
    the body reads as msgpack reads it, and as a push ahead's receiver reads it (a decoder's placer is given
    its bulk id, offset and size, with a 16-byte id); a field that does not fit is refused."""
    from svcframe.wire import F_NO_REPLY, push_ahead_frames

    def placed(frames: bytes) -> list[tuple[int, bytes, int, int]]:
        """What a decoder's placer is asked for the push ahead ``frames`` (its data follows: zeros)."""
        asked: list[tuple[int, bytes, int, int]] = []
        decoder = FrameDecoder(max_body_bytes=1 << 20)
        decoder.place_ahead = lambda rid, bid, offset, n: asked.append((rid, bid, offset, n)) or bytearray(n)
        decoder.feed(frames + bytes(size))
        return asked

    for bulk_id in (bytes(range(16)), b"short"):  # (a 16-byte id: packed in one call; any other: by pack_body)
        frames = push_ahead_frames(2**64 - 1, bulk_id, 3, size, 2**63)
        data_header = encode_header(Kind.BULK_DATA_PUSH, 2**64 - 1, size) if size else b""
        body = frames[HEADER_SIZE : len(frames) - len(data_header)]
        assert frames == encode_frame(Kind.BULK_PUSH, 2**64 - 1, body, flags=F_NO_REPLY) + data_header
        assert unpack_body(body) == [bulk_id, 3, size, 2**63]
        if len(bulk_id) == 16 and 0 < size < 65536:  # (placed when its one data frame is there, and small)
            assert placed(frames) == [(2**64 - 1, bulk_id, 3, size)]
        assert push_ahead_frames(2**64 - 1, bulk_id, 3, size, 2**63, data=False) == frames[: HEADER_SIZE + len(body)]
    with pytest.raises(struct.error):
        push_ahead_frames(2**64, bytes(16), 0, size, 1)
    with pytest.raises(struct.error):
        push_ahead_frames(1, bytes(16), -1, size, 1)
