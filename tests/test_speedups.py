"""The compiled twin of the decoder's loop (svcframe/_speedups.c): built where a compiler is, built from
this source, and deciding exactly as the pure-Python decoder does on valid, cut and hostile streams."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import shlex
import shutil
import sysconfig
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest
from conftest import wait_until
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from svcframe import decoder as decoder_module
from svcframe import wire
from svcframe.decoder import FrameDecoder
from svcframe.errors import RemoteProtocolError
from svcframe.protocol import IncomingPull
from svcframe.wire import HEADER_SIZE, Frame, Kind, encode_frame, encode_header

ROOT = Path(__file__).resolve().parent.parent
COMPILER = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
DATA_MAX = decoder_module.HEADER_FIRST_AFTER_BYTES


def _outcome(fn: Callable[..., object], *args: object) -> object:
    """What ``fn(*args)`` gives: its value, or its error's type and message (how twins are compared)."""
    try:
        return fn(*args)
    except Exception as exc:
        return (type(exc).__name__, str(exc))


def _memory_kept(work: Callable[[], object]) -> int:
    """Bytes of traced memory still held after ``work()`` (run once before, so caches are settled)."""
    work()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        work()
        gc.collect()
        return int(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()


def _reads(
    decoder: FrameDecoder | decoder_module.PyFrameDecoder, stream: bytes, cuts: list[int]
) -> Iterator[list[Frame] | None]:
    """Receive ``stream`` into ``decoder`` in pieces cut at ``cuts`` (and at its free space): what each
    ``buffer_updated`` returns."""
    data = memoryview(stream)
    for cut in [*sorted(set(cuts)), len(stream)]:
        while len(stream) - len(data) < min(cut, len(stream)):
            buf = decoder.get_buffer()
            n = min(len(buf), len(data), cut - (len(stream) - len(data)))
            buf[:n] = data[:n]
            data = data[n:]
            yield decoder.buffer_updated(n)


compiled = pytest.mark.skipif(wire.PURE, reason="the pure-Python decoder was asked for or built (SVCFRAME_PURE)")


def test_the_extension_is_built_where_a_compiler_is() -> None:
    """pip install compiles it (hatch_build.py): a silent fall-back to pure Python would hide a broken build."""
    if os.environ.get("SVCFRAME_PURE", "") not in ("", "0"):
        assert wire.PURE and decoder_module._parse_inline is None
        pytest.skip("SVCFRAME_PURE is set: the pure-Python decoder runs, as asked")
    if not shutil.which(COMPILER):
        pytest.skip(f"no C compiler ({COMPILER}): the package is pure Python here")
    assert not wire.PURE, "svcframe._speedups did not import: was the package installed by pip on this interpreter?"


@compiled
def test_the_extension_is_built_from_this_source() -> None:
    from svcframe import _speedups

    source = (ROOT / "svcframe" / "_speedups.c").read_bytes()
    assert hashlib.sha256(source).hexdigest() == _speedups.SOURCE_SHA256, (
        "svcframe/_speedups.c changed since the build: pip install -e . again"
    )


@compiled
def test_parse_inline_checks_its_bounds() -> None:
    parse = decoder_module._parse_inline
    assert parse is not None
    buf = bytearray(encode_frame(Kind.RESPONSE, 1, b"\xc0"))
    frames: list[Frame] = []
    assert parse(buf, 0, len(buf), 4096, wire.ALL_KINDS_MASK, frames, Frame, wire.ZERO_TRACE_ID, None, DATA_MAX) == len(
        buf
    )
    assert frames == [Frame(3, 0, 0, 0, 1, 0, 0, 0xFFFF, 0, 0, wire.ZERO_TRACE_ID, 0, 0, b"\xc0")]
    for start, end in ((0, len(buf) + 1), (5, 4), (-1, 10)):
        with pytest.raises(ValueError, match="start <= end"):
            parse(buf, start, end, 4096, wire.ALL_KINDS_MASK, [], Frame, wire.ZERO_TRACE_ID, None, DATA_MAX)
    with pytest.raises(TypeError):
        parse(buf, 0, len(buf), 4096, wire.ALL_KINDS_MASK, (), Frame, wire.ZERO_TRACE_ID, None, DATA_MAX)
    with pytest.raises(TypeError):
        parse(buf, 0, len(buf), 4096, wire.ALL_KINDS_MASK, [], dict, wire.ZERO_TRACE_ID, None, DATA_MAX)
    with pytest.raises(TypeError):
        parse(buf, 0, len(buf))


@compiled
def test_it_leaves_what_is_not_a_complete_inline_frame_to_the_python_loop() -> None:
    parse = decoder_module._parse_inline
    assert parse is not None
    one = encode_frame(Kind.REQUEST, 7, b"\x91\x01", provider_id=3, rpc=99, trace_id=b"t" * 16, span_id=5)
    cases = {
        "a cut header": one[: HEADER_SIZE - 1],
        "a cut body": one[:-1],
        "bulk data": encode_header(Kind.BULK_DATA_REPLY, 1, 8) + bytes(8),
        "over max_body": encode_frame(Kind.RESPONSE, 1, bytes(5000)),
        "bad magic": b"XX" + one[2:],
        "reserved bits": one[:36] + b"\x01" + one[37:],
        "an illegal kind": encode_frame(Kind.HELLO, 0, b"\xc0"),
        "an unknown kind": one[:3] + b"\xc8" + one[4:],
    }
    legal = wire.ALL_KINDS_MASK & ~(1 << Kind.HELLO)
    called: list[tuple[int, int, int]] = []

    def sink(kind: int, request_id: int, length: int) -> memoryview:
        called.append((kind, request_id, length))
        return memoryview(bytearray(length))

    for what, tail in cases.items():
        frames: list[Frame] = []
        buf = one + tail
        assert parse(buf, 0, len(buf), 4096, legal, frames, Frame, wire.ZERO_TRACE_ID, None, DATA_MAX) == len(one), what
        assert len(frames) == 1 and frames[0].trace_id == b"t" * 16 and frames[0].body == b"\x91\x01", what
    # bulk data behind another frame (its sink may come from that frame's dispatch), or with no sink, or as
    # large as the chunks after which the decoder reads header first: the Python loop's
    data = encode_header(Kind.BULK_DATA_REPLY, 1, 8) + bytes(8)
    for what, buf, sink_given, data_max in (
        ("behind a frame", one + data, sink, DATA_MAX),
        ("without a sink", data, None, DATA_MAX),
        ("a large chunk", data, sink, 8),
    ):
        frames = []
        assert parse(buf, 0, len(buf), 4096, legal, frames, Frame, wire.ZERO_TRACE_ID, sink_given, data_max) == len(
            buf
        ) - len(data), what
    assert called == []


@compiled
def test_it_takes_small_bulk_data_into_the_sinks_buffer() -> None:
    """A complete bulk data frame first in the batch: the sink is asked for its destination (kind, request id,
    length) and gets exactly its bytes; its Frame has the body None, and what follows is taken too."""
    parse = decoder_module._parse_inline
    assert parse is not None
    dests: list[bytearray] = []
    called: list[tuple[int, int, int]] = []

    def sink(kind: int, request_id: int, length: int) -> memoryview:
        called.append((kind, request_id, length))
        dests.append(bytearray(length))
        return memoryview(dests[-1])

    payload = bytes(range(256)) * 4
    answer = encode_frame(Kind.RESPONSE, 2**40, b"\xcd\x04\x00")
    buf = bytearray(encode_header(Kind.BULK_DATA_REPLY, 2**40, len(payload)) + payload + answer)
    frames: list[Frame] = []
    assert parse(buf, 0, len(buf), 4096, wire.ALL_KINDS_MASK, frames, Frame, wire.ZERO_TRACE_ID, sink, DATA_MAX) == len(
        buf
    )
    assert called == [(Kind.BULK_DATA_REPLY, 2**40, len(payload))] and dests == [bytearray(payload)]
    assert [(f.kind, f.request_id, f.body) for f in frames] == [
        (Kind.BULK_DATA_REPLY, 2**40, None),
        (Kind.RESPONSE, 2**40, b"\xcd\x04\x00"),
    ]
    # a sink's error propagates, nothing taken; a destination of the wrong size or read-only is refused
    bad_sinks = {
        "raises": (lambda k, r, n: (_ for _ in ()).throw(wire.RemoteProtocolError("no such pull")), "no such pull"),
        "short": (lambda k, r, n: memoryview(bytearray(n - 1)), "returned 1023 bytes for 1024"),
        "read-only": (lambda k, r, n: bytes(n), "writable"),
    }
    for what, (bad, message) in bad_sinks.items():
        frames = []
        with pytest.raises((wire.RemoteProtocolError, BufferError), match=message):
            parse(buf, 0, len(buf), 4096, wire.ALL_KINDS_MASK, frames, Frame, wire.ZERO_TRACE_ID, bad, DATA_MAX)
        assert frames == [], what


def _decode(stream: bytes, cuts: list[int], compiled_loop: bool, legal: int) -> list[object]:
    """What a decoder makes of ``stream`` received in pieces cut at ``cuts``, in order: the batches of frames
    each read and each ``more()`` return (bulk data frames with the data their sink received), the sink's calls
    between them, then the error, if any."""
    saved = decoder_module._parse_inline
    if not compiled_loop:
        decoder_module._parse_inline = None  # the pure-Python loop: the definition
    events: list[object] = []
    placed: list[bytearray] = []
    try:
        sunk: list[bytearray] = []

        def sink(kind: int, request_id: int, length: int) -> memoryview:
            events.append(("sink", kind, request_id, length))
            if request_id % 7 == 3:  # as the protocol's sink refuses data for an unknown request
                raise wire.RemoteProtocolError(f"data for unknown request {request_id}")
            sunk.append(bytearray(length))
            return memoryview(sunk[-1])

        decoder_type = FrameDecoder if compiled_loop else decoder_module.PyFrameDecoder
        decoder = decoder_type(max_body_bytes=4096, bulk_sink=sink, buffer_bytes=1024)
        decoder.legal_kinds = legal
        decoder.place_ahead = _placer(events, placed)
        for got in _reads(decoder, stream, cuts):
            while got:  # a batch, as the transport dispatches it
                events.append([(tuple(f), None if f.body is not None else bytes(sunk[-1])) for f in got])
                got = decoder.more()
    except Exception as exc:  # the decision, compared: type and message
        events.append((type(exc).__name__, str(exc)))
    finally:
        decoder_module._parse_inline = saved
    events.append(("placed", [bytes(p) for p in placed]))
    return events


def _placer(events: list[object], placed: list[bytearray]) -> Callable[[int, bytes, int, int], memoryview | None]:
    """A decoder's ``place_ahead`` for the twin tests: records each call; declines some (None, as the engine
    does for a push it refuses), gives a buffer of the wrong size to others, places the rest."""

    def place(request_id: int, bulk_id: bytes, offset: int, length: int) -> memoryview | None:
        events.append(("place", request_id, bulk_id, offset, length))
        if request_id % 3 == 1:
            return None
        if request_id % 11 == 5:
            return memoryview(bytearray(length + 1))
        placed.append(bytearray(length))
        return memoryview(placed[-1])

    return place


def _ahead(rid: int, size: int | None, data_rid: int, flags: int, body: bytes | None) -> bytes:
    """A push ahead (svcframe.bulk): a BULK_PUSH flagged ``flags`` with ``body`` (None: as pushers pack it, naming
    ``size``) and, unless ``size`` is None, its data frame of ``size`` bytes for request ``data_rid``."""
    if body is None:
        body = msgpack.packb([b"k" * 16, 3, size or 0, rid])
    push = encode_frame(Kind.BULK_PUSH, rid, body, flags=flags)
    if size is None:
        return push
    return push + encode_header(Kind.BULK_DATA_PUSH, data_rid, size) + (bytes(range(251)) * (size // 251 + 1))[:size]


_ahead_body = st.one_of(
    st.none(),
    st.none(),
    st.none(),
    st.builds(  # another size, offset or call id than the data's, negative ones, a bulk id of any length
        lambda bulk_id, offset, size, call_id: msgpack.packb([bulk_id, offset, size, call_id]),
        st.binary(max_size=300),
        st.integers(-3, 2**64 - 1),
        st.integers(-1, 1300),
        st.integers(-1, 2**64 - 1),
    ),
    st.sampled_from([b"\x94\xc4\x01k\xd0\x05\x0a\x01", b"\x94\xc4\x01k\x00\x0a\x01\xc0", b"\x93\xc4\x01k\x00\x0a"]),
    st.binary(max_size=40),
)
_push_ahead = st.builds(
    lambda rid, size, other, flags, body: _ahead(rid, size, rid + other, flags, body),
    st.integers(0, 20),
    st.one_of(st.integers(0, 1200), st.none()),
    st.sampled_from([0, 0, 0, 1]),
    st.sampled_from([wire.F_NO_REPLY] * 4 + [wire.F_NO_REPLY | wire.F_CMA, 0]),
    _ahead_body,
)


_kinds = st.sampled_from(list(Kind))
_data = st.builds(
    lambda kind, rid, body: encode_header(kind, rid, len(body)) + body,
    st.sampled_from([Kind.BULK_DATA_REPLY, Kind.BULK_DATA_PUSH]),
    st.integers(0, 20),
    st.binary(max_size=3000),
)
_frame = st.builds(
    lambda kind, rid, body, traced, status: encode_frame(
        kind, rid, body, status=status, trace_id=b"\x01" * 16 if traced else bytes(16)
    ),
    _kinds,
    st.integers(0, 2**64 - 1),
    st.binary(max_size=1500),
    st.booleans(),
    st.integers(0, 0xFFFF),
)
_noise = st.one_of(st.binary(min_size=1, max_size=100), st.just(encode_header(Kind.RESPONSE, 1, 10_000)))


_AHEAD = _ahead(6, 100, 6, wire.F_NO_REPLY, b"\x94\xc4\x01x\x00\x64\x07")  # (its BULK_PUSH ends at 87)
_ANSWER = encode_frame(Kind.RESPONSE, 7, b"\xc0")


@compiled
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(parts=[_AHEAD, _ANSWER], cuts=[87], hello_legal=True)  # nothing of its data yet: dispatched as usual
@example(parts=[_AHEAD, _ANSWER], cuts=[100], hello_legal=True)  # its data's header cut: waits, then placed
@example(parts=[_AHEAD, _ANSWER], cuts=[200], hello_legal=True)  # its data cut: waits, then placed
@example(parts=[_ANSWER, _AHEAD], cuts=[], hello_legal=True)  # behind a frame: dispatched as usual
@example(parts=[_ahead(3, 1000, 3, wire.F_NO_REPLY, None)], cuts=[200], hello_legal=True)  # over the buffer
@example(parts=[_ahead(3, 10, 4, wire.F_NO_REPLY, None), _ANSWER], cuts=[], hello_legal=True)  # another's data
@example(parts=[_ahead(4, 10, 4, wire.F_NO_REPLY, None), _ANSWER], cuts=[], hello_legal=True)  # declined
@example(parts=[_ahead(5, 10, 5, wire.F_NO_REPLY, None), _ANSWER], cuts=[], hello_legal=True)  # a wrong-sized buffer
@example(  # a body in another form (an int 8), with a byte more, naming another size: dispatched as usual
    parts=[_ahead(6, 10, 6, wire.F_NO_REPLY, b"\x94\xc4\x01k\xd0\x05\x0a\x01"),
           _ahead(6, 10, 6, wire.F_NO_REPLY, b"\x94\xc4\x01k\x00\x0a\x03\xc0"),
           _ahead(6, 10, 6, wire.F_NO_REPLY, msgpack.packb([b"k", 0, 11, 3]))],
    cuts=[], hello_legal=True,
)  # fmt: skip
@given(
    parts=st.lists(st.one_of(_frame, _frame, _frame, _data, _push_ahead, _noise), min_size=1, max_size=12),
    cuts=st.lists(st.integers(1, 20_000), max_size=8),
    hello_legal=st.booleans(),
)
def test_the_compiled_loop_decides_as_the_pure_one(parts: list[bytes], cuts: list[int], hello_legal: bool) -> None:
    """Frames of every kind, traced or not, bodies up to and over the receive buffer, bulk data (small and over
    the receive buffer, first in a batch or behind other frames, some refused by the sink), pushes ahead (with
    their data or without, the data another request's, over the receive buffer; placed, declined or given a
    wrong-sized buffer by the placer), noise and a header over the size limit, received in random pieces: the
    same frames, data, sink and placer calls and error either way."""
    stream = b"".join(parts)
    legal = wire.ALL_KINDS_MASK if hello_legal else wire.ALL_KINDS_MASK & ~(1 << Kind.HELLO)
    assert _decode(stream, cuts, True, legal) == _decode(stream, cuts, False, legal)


@compiled
def test_parse_inline_keeps_no_reference() -> None:
    """Every object it makes belongs to the frames it appends: 20,000 parses of a traced and an untraced frame,
    and a bulk data frame, the frames dropped each time, leave the traced memory where it was (a leaked reference would keep 14
    objects per frame: megabytes)."""
    parse = decoder_module._parse_inline
    assert parse is not None
    dest = memoryview(bytearray(100))
    stream = (
        encode_header(Kind.BULK_DATA_REPLY, 9, 100)
        + bytes(100)
        + encode_frame(Kind.RESPONSE, 2**63, b"\x91\xa3abc", trace_id=b"\x07" * 16, span_id=2**40)
        + encode_frame(Kind.REQUEST, 1, b"", provider_id=7, rpc=2**31)
    )

    def parse_many(n: int) -> None:
        for _ in range(n):
            frames: list[Frame] = []
            taken = parse(
                stream, 0, len(stream), 4096, wire.ALL_KINDS_MASK, frames, Frame, wire.ZERO_TRACE_ID,
                lambda k, r, n: dest, DATA_MAX,
            )  # fmt: skip
            assert taken == len(stream) and len(frames) == 3

    grown = _memory_kept(lambda: parse_many(20_000))
    assert grown < 64 * 1024, f"{grown} bytes still held after 20,000 parses"


def _answered(
    stream: bytes,
    cuts: list[int],
    compiled: bool,
    waiting: set[int],
    done: set[int],
    pulls: dict[int, tuple[int, bool]],
) -> list[object]:
    """What a decoder with calls ``waiting`` (by request id; those in ``done`` already cancelled) and pulls
    (request id: the size of its buffer, whether it is an into= call's) makes of ``stream`` cut at ``cuts``, each
    returned frame dispatched as the engine does (``wire.answer_call`` for an answer to a waiting call,
    ``Engine._into_answered``'s rule for data flagged INTO): the frames left over, then each call's end (result,
    error or still waiting), then each pull's buffer."""
    loop = asyncio.new_event_loop()
    events: list[object] = []
    placed: list[bytearray] = []
    try:
        calls = {rid: loop.create_future() for rid in sorted(waiting)}
        for rid in done & waiting:
            calls[rid].cancel()
        incoming = {
            rid: IncomingPull(memoryview(bytearray(size)), overflow_ok=into) for rid, (size, into) in pulls.items()
        }

        def sink(kind: int, request_id: int, length: int) -> memoryview:  # Protocol._bulk_sink's data replies
            pull = incoming.get(request_id)
            if pull is None or kind != Kind.BULK_DATA_REPLY:
                return memoryview(bytearray(length))  # (discarded)
            start = pull.cursor
            pull.cursor = end = start + length
            if end > len(pull.dest) or pull.overflowed:
                if pull.overflow_ok:
                    pull.overflowed = True
                    return memoryview(bytearray(length))
                raise RemoteProtocolError(f"peer sent {end} bytes for a {len(pull.dest)}-byte pull")
            return pull.dest[start:end]  # type: ignore[no-any-return]

        decoder = (FrameDecoder if compiled else decoder_module.PyFrameDecoder)(
            max_body_bytes=4096, bulk_sink=sink, buffer_bytes=1024
        )
        decoder.answers = calls  # the pure core leaves answers to the dispatch
        decoder.into_pulls = incoming
        decoder.place_ahead = _placer(events, placed)

        def batches(got: list[Frame] | None) -> Iterator[Frame]:  # and those held behind them (as the transport)
            while got:
                yield from got
                got = decoder.more()

        try:
            for got in _reads(decoder, stream, cuts):
                for frame in batches(got):
                    call = calls.get(frame.request_id)
                    pull = incoming.get(frame.request_id)
                    if frame.kind == Kind.RESPONSE and call is not None and not call.done():
                        wire.answer_call(call, frame.status, frame.body)  # type: ignore[arg-type]
                    elif frame.kind == Kind.BULK_DATA_REPLY and frame.flags & wire.F_INTO:
                        if pull is not None and pull.overflow_ok and call is not None and not call.done():
                            call.set_result((0, pull.cursor, pull.cursor))  # (its data is in the pull: no event)
                    else:
                        events.append(tuple(frame))
        except Exception as exc:
            events.append((type(exc).__name__, str(exc)))
        events.extend((rid, bytes(p.dest), p.cursor, p.overflowed) for rid, p in incoming.items())
        for rid, call in calls.items():
            if not call.done():
                events.append((rid, "waiting"))
            elif call.cancelled():
                events.append((rid, "cancelled"))
            elif call.exception() is not None:
                events.append((rid, type(call.exception()).__name__, str(call.exception())))
            else:
                events.append((rid, "result", call.result()))
        events.append(("placed", [bytes(p) for p in placed]))
    finally:
        loop.close()
    return events


_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20) | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_body = st.one_of(
    _value.map(msgpack.packb),
    st.sampled_from([b"", b"\xc0", b"\xd4\x01\x00", b"\x81\x01\x02", b"\x92\x01", b"\xc1", b"\x01\x02"]),
    st.sampled_from(
        [b"\xc2", b"\xc3", b"\x7f", b"\xe0", b"\xff", b"\xc4\x00", b"\xc4\x02ab", b"\xc4\x03ab", b"\xc4\x01ab"]
    ),
    st.sampled_from(  # the small items the compiled decoder takes itself, and their near misses
        [
            b"\x94\x00\xc0\xc0\xc4\x00",
            b"\x94\x00\xc0\xc0\xc4",
            b"\x94\x00\xc0\xc0\xc4\x00\x00",
            b"\x91\x91\x91\x01",
            b"\x81\xa1k\x92\x01\x02",
            b"\x82\xa1k\x01\xa1k\x02",
            b"\x81\x01\x02",
            b"\x81\xc4\x01k\x02",
            b"\x81\xa1\xff\x01",
            b"\xa2\xc3\xa9",
            b"\xa2\xc3",
            b"\xd9\x03abc",
            b"\xd9\x04abc",
            b"\xa3\xed\xa0\x80",
            b"\xcc\xff",
            b"\xcd\xff\xff",
            b"\xce\xff\xff\xff\xff",
            b"\xcf" + b"\xff" * 8,
            b"\xcf" + b"\xff" * 7,
            b"\xd0\x80",
            b"\xd1\x80\x00",
            b"\xd2\x80\x00\x00\x00",
            b"\xd3\x80" + bytes(7),
            b"\xd3\x7f" + b"\xff" * 7,
            b"\xca\x3f\xc0\x00\x00",
            b"\xcb\x40\x09\x21\xfb\x54\x44\x2d\x18",
            b"\xca\x3f\xc0",
            b"\x9f" + b"\x01" * 15,
            b"\x8f" + b"\xa1a\x01" * 15,
            b"\x90",
            b"\x80",
            b"\x92\xcb" + bytes(8) + b"\x91\xa0",
        ]
    ),
    st.binary(max_size=60),  # mostly malformed
)
_answer = st.builds(
    lambda rid, body, status: encode_frame(Kind.RESPONSE, rid, body, status=status),
    st.integers(0, 7),
    _body,
    st.sampled_from([0, 0, 0, 0, 3, 0xFFFF]),
)


def _data_reply(rid: int, size: int, into: bool) -> bytes:
    data = (bytes(range(251)) * (size // 251 + 1))[:size]
    return encode_frame(Kind.BULK_DATA_REPLY, rid, data, flags=wire.F_INTO if into else 0)


_reply = st.builds(_data_reply, st.integers(0, 7), st.integers(0, 300), st.booleans())


@compiled
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(parts=[_data_reply(7, 10, True)], cuts=[], waiting={7}, done=set(), pulls={7: (20, True)})
@example(  # two in one read, the second over the buffer
    parts=[_data_reply(7, 10, True), _data_reply(7, 5, True)], cuts=[], waiting={7}, done=set(), pulls={7: (12, True)}
)
@example(  # an into= call's data, then an answer; an answer, then an into= call's data; a pull's data flagged INTO
    parts=[_data_reply(3, 10, True), encode_frame(Kind.RESPONSE, 2, b"\xc0"), _data_reply(5, 4, True),
           encode_frame(Kind.RESPONSE, 6, b"\x01"), _data_reply(4, 3, True)],
    cuts=[90, 200], waiting={2, 3, 4, 5, 6}, done={5}, pulls={3: (10, True), 4: (8, False), 5: (4, True)},
)  # fmt: skip
@example(  # an into= call's data, an answer, then data over a pull's buffer: the answers are given before it fails
    parts=[_data_reply(7, 10, True), encode_frame(Kind.RESPONSE, 2, b"\xc0"), _data_reply(4, 10, False)],
    cuts=[], waiting={2, 7}, done=set(), pulls={7: (20, True), 4: (5, False)},
)  # fmt: skip
@example(  # an answer, then a push ahead; an into= call's data, then a push ahead
    parts=[encode_frame(Kind.RESPONSE, 2, b"\xc0"), _AHEAD, _data_reply(7, 10, True), _AHEAD, _ANSWER],
    cuts=[], waiting={2, 7}, done=set(), pulls={7: (20, True)},
)  # fmt: skip
@example(  # an into= call's empty data, then data and a bad frame (found by CI's run of this test)
    parts=[_data_reply(6, 0, True), b"SF\x01\x07" + bytes(12), encode_frame(Kind.RESPONSE, 0, b"\xc0")],
    cuts=[], waiting={6}, done=set(), pulls={0: (0, False), 6: (0, True)},
)  # fmt: skip
@given(
    parts=st.lists(
        st.one_of(_answer, _answer, _answer, _reply, _reply, _push_ahead, _frame, _noise), min_size=1, max_size=12
    ),
    cuts=st.lists(st.integers(1, 4000), max_size=6),
    waiting=st.sets(st.integers(0, 7), min_size=1),
    done=st.sets(st.integers(0, 7), max_size=2),
    pulls=st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 400), st.booleans()), max_size=4),
)
def test_the_compiled_core_answers_calls_as_the_dispatch_would(
    parts: list[bytes], cuts: list[int], waiting: set[int], done: set[int], pulls: dict[int, tuple[int, bool]]
) -> None:
    """Answers to waiting, cancelled and unknown calls, OK or not, with valid, refused (extension types, int map
    keys) and malformed bodies, and data replies flagged INTO or not for into= calls, pulls and nobody, within
    their buffers or over them, among other frames and noise, received in random pieces: each call ends the
    same (the same result, or the same error), each buffer holds the same bytes, and the same frames are left
    to the dispatch, with the compiled core answering calls itself or the pure-Python dispatch doing it."""
    stream = b"".join(parts)
    assert _answered(stream, cuts, True, waiting, done, pulls) == _answered(stream, cuts, False, waiting, done, pulls)


@compiled
def test_a_read_of_answers_only_returns_none() -> None:
    """A read that completed only answers returns None (the transport then dispatches nothing); an answer behind
    another frame, to an unknown call, or not OK is a frame, for the dispatch."""
    loop = asyncio.new_event_loop()
    try:
        calls = {1: loop.create_future(), 2: loop.create_future(), 3: loop.create_future()}
        decoder = FrameDecoder()
        decoder.answers = calls
        answers = encode_frame(Kind.RESPONSE, 1, b"\xc0") + encode_frame(Kind.RESPONSE, 2, msgpack.packb({"a": [1]}))
        assert decoder.feed(answers) == [] and decoder.idle
        assert calls[1].result() == (0, None, 1) and calls[2].result() == (0, {"a": [1]}, 5)
        request, unknown = encode_frame(Kind.REQUEST, 9, b"\xc0"), encode_frame(Kind.RESPONSE, 5, b"\xc0")
        failed = encode_frame(Kind.RESPONSE, 3, b"\xa4oops", status=3)
        buf = decoder.get_buffer()
        stream = request + encode_frame(Kind.RESPONSE, 3, b"\xc0") + unknown + failed
        buf[: len(stream)] = stream
        frames = decoder.buffer_updated(len(stream))
        assert frames is not None and [(f.kind, f.request_id) for f in frames] == [(2, 9), (3, 3), (3, 5), (3, 3)]
        assert not calls[3].done()  # behind the request: the dispatch answers it, in order
        buf = decoder.get_buffer()
        buf[: len(answers)] = answers  # calls 1 and 2 are done: their answers go to the dispatch
        assert [f.request_id for f in decoder.buffer_updated(len(answers)) or []] == [1, 2]
    finally:
        loop.close()


@compiled
def test_the_compiled_core_keeps_no_reference() -> None:
    """20,000 answered calls (futures, results, decoded bodies) and refused bodies: traced memory unchanged."""
    loop = asyncio.new_event_loop()
    stream = (
        encode_frame(Kind.RESPONSE, 1, msgpack.packb([1, "two", {"three": b"3"}]))
        + encode_frame(Kind.RESPONSE, 2, b"\x81\x01\x02")  # refused: left to the dispatch
        + encode_frame(Kind.REQUEST, 3, b"\xc0")
    )
    decoder = FrameDecoder()

    def answer_many(n: int) -> None:
        for _ in range(n):
            calls = {1: loop.create_future(), 2: loop.create_future()}
            decoder.answers = calls
            buf = decoder.get_buffer()
            buf[: len(stream)] = stream
            frames = decoder.buffer_updated(len(stream))
            assert frames is not None and len(frames) == 2 and calls[1].done() and not calls[2].done()

    try:
        grown = _memory_kept(lambda: answer_many(20_000))
        assert grown < 64 * 1024, f"{grown} bytes still held after 20,000 reads"
    finally:
        loop.close()


_field = st.one_of(
    st.integers(0, 0xFFFF), st.integers(0, 2**64 - 1), st.integers(-5, -1), st.integers(2**64, 2**66), st.booleans()
)


@compiled
@settings(max_examples=500, deadline=None)
@given(
    fields=st.lists(_field, min_size=10, max_size=10),
    trace_id=st.one_of(st.binary(min_size=16, max_size=16), st.binary(max_size=20)),
    body=st.one_of(st.binary(max_size=300), st.builds(bytearray, st.binary(max_size=10))),
)
def test_the_compiled_request_frame_is_its_twin(fields: list[int], trace_id: bytes, body: bytes) -> None:
    """In-range and out-of-range fields (16-, 32- and 64-bit), trace ids of any length, bytes and bytearray
    bodies: the compiled request_frame gives the same bytes, or the same error, as the Python definition; and
    a frame decodes to the fields it was given."""
    from svcframe import _speedups

    args = (*fields[:8], trace_id, *fields[8:], body)

    compiled_frame = _outcome(_speedups.request_frame, *args)
    assert compiled_frame == _outcome(wire._request_frame_py, *args)
    if isinstance(compiled_frame, bytes):
        (frame,) = FrameDecoder().feed(compiled_frame)
        assert (frame.kind, frame.flags, frame.provider_id, frame.rpc_id, frame.request_id) == (
            Kind.REQUEST, *fields[:4],
        )  # fmt: skip
        assert (frame.deadline_usec, frame.status, frame.parent_provider_id, frame.parent_rpc_id) == (
            fields[4], 0, fields[5], fields[6],
        )  # fmt: skip
        assert (frame.callpath, frame.trace_id, frame.span_id, frame.lamport, frame.body) == (
            fields[7], trace_id[:16].ljust(16, b"\0"), fields[8], fields[9], bytes(body),  # (struct's 16s)
        )  # fmt: skip


@compiled
@settings(max_examples=300, deadline=None)
@given(
    request_id=st.one_of(st.integers(0, 2**64 - 1), st.integers(-3, -1), st.integers(2**64, 2**65)),
    result=st.one_of(
        st.none(),
        st.binary(max_size=300),
        st.integers(0, 70_000).map(bytes),  # bin 8, 16 and 32
        st.builds(bytearray, st.binary(max_size=4)),
        st.integers(),
        st.text(max_size=3),
    ),
)
def test_the_compiled_ok_response_is_its_twin(request_id: int, result: object) -> None:
    """None, bytes of every bin size, and what it does not take (a bytearray, an int, a str, ids out of range):
    the compiled ok_response gives the same bytes, or the same error, as the Python definition; a frame decodes
    to the request id and ``pack_body(result)``."""
    from svcframe import _speedups

    compiled_frame = _outcome(_speedups.ok_response, request_id, result)
    assert compiled_frame == _outcome(wire._ok_response_py, request_id, result)
    if isinstance(compiled_frame, bytes):
        (frame,) = FrameDecoder().feed(compiled_frame)
        assert (frame.kind, frame.status, frame.request_id) == (Kind.RESPONSE, 0, request_id)
        assert frame.body == wire.pack_body(result)


def _deadlines_types() -> list[type]:
    """Deadlines as built (compiled core where it was built) and on the pure-Python core, the definition."""
    from svcframe import deadlines

    methods = ("__init__", "start", "_arm", "_fire", "_idle", "close", "__len__")
    pure = type(
        "PureDeadlines",
        (deadlines._PyDeadlinesCore,),
        {"__slots__": ("_loop", "_timer"), **{name: deadlines.Deadlines.__dict__[name] for name in methods}},
    )
    return [deadlines.Deadlines, pure]


@pytest.mark.asyncio
@pytest.mark.parametrize("make", _deadlines_types(), ids=["built", "pure"])
async def test_deadlines_expire_exactly_the_calls_still_waiting(make: type) -> None:
    """Calls with mixed and equal deadlines, some answered, some forgotten by their caller before their
    deadline: exactly those still waiting get DeadlineExpired, none before its deadline, and the heap is empty
    once every deadline passed."""
    from svcframe.deadlines import DeadlineExpired

    loop = asyncio.get_running_loop()
    dl = make()
    dl.start(loop)
    tables: list[dict[int, asyncio.Future[object]]] = [{}, {}]
    start = loop.time()
    expired_at: dict[tuple[int, int], float] = {}
    for i in range(60):
        table, rid = tables[i % 2], i
        future = table[rid] = loop.create_future()
        deadline = start + 0.02 + (i % 7) * 0.005
        future.add_done_callback(lambda f, key=(i % 2, rid), d=deadline: expired_at.setdefault(key, loop.time() - d))
        dl.add(deadline, table, rid)
        if i % 3 == 0:
            future.set_result("answered")
        elif i % 3 == 1 and i % 2:
            del table[rid]  # its caller gave up (the future stays pending, unseen by the deadlines)
    waiting = {(t, rid) for t, table in enumerate(tables) for rid, f in table.items() if not f.done()}
    await wait_until(
        lambda: waiting <= expired_at.keys(), what="the waiting calls' expiry"
    )  # (done callbacks run a loop turn later)
    for t, table in enumerate(tables):
        for rid, future in table.items():
            if (t, rid) in waiting:
                assert isinstance(future.exception(), DeadlineExpired)
                assert expired_at[(t, rid)] >= -0.001  # never before its deadline (loop time)
            else:
                assert future.result() == "answered"
    await wait_until(lambda: len(dl) == 0, what="an empty heap")
    dl.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("make", _deadlines_types(), ids=["built", "pure"])
async def test_deadlines_keep_in_step_with_sequential_calls(make: type) -> None:
    """10,000 calls one after another (each answered before the next): the heap holds at most 2,048 entries
    (compacted when finished calls are more than half of it); and 20,000 more, the heap then compacted, leave
    traced memory where it was."""
    loop = asyncio.get_running_loop()
    dl = make()
    dl.start(loop)
    table: dict[int, asyncio.Future[object]] = {}

    def calls(n: int, first: int) -> int:
        most = 0
        for rid in range(first, first + n):
            future = table[rid] = loop.create_future()
            dl.add(loop.time() + 30.0, table, rid)
            most = max(most, len(dl))
            future.set_result(None)
            del table[rid]
        return most

    assert calls(10_000, 0) <= 2048

    def calls_then_compact() -> None:  # (the heap's own entries, up to 2,048 of them, are not what is measured)
        calls(20_000, 10_000)
        dl._compact()

    grown = _memory_kept(calls_then_compact)
    assert grown < 64 * 1024, f"{grown} bytes still held after 20,000 calls"
    dl.close()


@compiled
@settings(max_examples=500, deadline=None)
@given(body=st.one_of(_body, _body.map(bytearray), _body.map(memoryview)))
def test_the_compiled_unpack_body_is_its_twin(body: bytes | bytearray | memoryview) -> None:
    """Valid, refused (extension types, int map keys) and malformed bodies, simple items and not, as bytes,
    bytearray or memoryview: the compiled unpack_body gives the same value, or the same error, as the Python
    definition."""
    from svcframe import _speedups

    assert _outcome(_speedups.unpack_body, body) == _outcome(wire._unpack_body_py, body)


@compiled
def test_cross_memory_attach_takes_addresses_and_copies_from_the_twins() -> None:
    """svcframe.cma.buffer_address, read and write are the compiled twins where they were built (on Linux;
    tests/test_cma.py checks both)."""
    from svcframe import _speedups, cma

    assert cma.buffer_address is _speedups.buffer_address
    if cma.supported():
        assert cma.read is _speedups.vm_read and cma.write is _speedups.vm_write


@settings(max_examples=500, deadline=None)
@given(
    fields=st.tuples(
        st.binary(max_size=300), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)
    ),
    other=st.one_of(_ahead_body.filter(lambda b: b is not None), st.binary(max_size=60)),
)
def test_a_push_aheads_body_is_read_as_msgpack_reads_it(fields: tuple[bytes, int, int, int], other: bytes) -> None:
    """The decoder's reading of a push ahead's body (svcframe.decoder._ahead_body, whose twin the compiled loop
    runs): what pushers pack is read, as msgpack reads it; any other body it reads at all, it reads as msgpack
    does (four items: a bin, then unsigned ints), and the rest is left to the usual decoding."""
    packed = msgpack.packb(list(fields))
    got = decoder_module._ahead_body(memoryview(packed), 0, len(packed))
    assert got == (fields[:3] if len(fields[0]) < 256 else None)  # (a bin 8's bulk id: 16 bytes, in practice)
    read = decoder_module._ahead_body(memoryview(b"pad" + other + b"pad"), 3, 3 + len(other))
    if read is not None:
        value = msgpack.unpackb(other)
        assert type(value) is list and len(value) == 4 and type(value[0]) is bytes
        assert all(type(v) is int and v >= 0 for v in value[1:]) and read == tuple(value[:3])
