"""The compiled twin of the decoder's loop (svcframe/_speedups.c, issue 14): built where a compiler is, built from
this source, and deciding exactly as the pure-Python decoder does on valid, cut and hostile streams."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svcframe import wire
from svcframe.wire import HEADER_SIZE, Frame, FrameDecoder, Kind, encode_frame, encode_header

ROOT = Path(__file__).resolve().parent.parent
COMPILER = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
compiled = pytest.mark.skipif(wire.PURE, reason="the pure-Python decoder was asked for or built (SVCFRAME_PURE)")


def test_the_extension_is_built_where_a_compiler_is() -> None:
    """pip install compiles it (hatch_build.py): a silent fall-back to pure Python would hide a broken build."""
    if os.environ.get("SVCFRAME_PURE", "") not in ("", "0"):
        assert wire.PURE and wire._parse_inline is None
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
    parse = wire._parse_inline
    assert parse is not None
    buf = bytearray(encode_frame(Kind.RESPONSE, 1, b"\xc0"))
    frames: list[Frame] = []
    assert parse(buf, 0, len(buf), 4096, wire.ALL_KINDS_MASK, frames, Frame, wire.ZERO_TRACE_ID) == len(buf)
    assert frames == [Frame(3, 0, 0, 0, 1, 0, 0, 0xFFFF, 0, 0, wire.ZERO_TRACE_ID, 0, 0, b"\xc0")]
    for start, end in ((0, len(buf) + 1), (5, 4), (-1, 10)):
        with pytest.raises(ValueError, match="start <= end"):
            parse(buf, start, end, 4096, wire.ALL_KINDS_MASK, [], Frame, wire.ZERO_TRACE_ID)
    with pytest.raises(TypeError):
        parse(buf, 0, len(buf), 4096, wire.ALL_KINDS_MASK, (), Frame, wire.ZERO_TRACE_ID)
    with pytest.raises(TypeError):
        parse(buf, 0, len(buf), 4096, wire.ALL_KINDS_MASK, [], dict, wire.ZERO_TRACE_ID)
    with pytest.raises(TypeError):
        parse(buf, 0, len(buf))


@compiled
def test_it_leaves_what_is_not_a_complete_inline_frame_to_the_python_loop() -> None:
    parse = wire._parse_inline
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
    for what, tail in cases.items():
        frames: list[Frame] = []
        buf = one + tail
        assert parse(buf, 0, len(buf), 4096, legal, frames, Frame, wire.ZERO_TRACE_ID) == len(one), what
        assert len(frames) == 1 and frames[0].trace_id == b"t" * 16 and frames[0].body == b"\x91\x01", what


def _decode(stream: bytes, cuts: list[int], compiled_loop: bool, legal: int) -> Iterator[object]:
    """What a decoder makes of ``stream`` received in pieces cut at ``cuts``: its frames (bulk data frames
    with the data their sink received), then its error, if any."""
    saved = wire._parse_inline
    if not compiled_loop:
        wire._parse_inline = None  # the pure-Python loop: the definition
    try:
        sunk: list[bytearray] = []

        def sink(kind: int, request_id: int, length: int) -> memoryview:
            sunk.append(bytearray(length))
            return memoryview(sunk[-1])

        decoder = FrameDecoder(max_body_bytes=4096, bulk_sink=sink, buffer_bytes=1024)
        decoder.legal_kinds = legal
        pos = 0
        try:
            for cut in [*sorted(set(cuts)), len(stream)]:
                if cut <= pos or cut > len(stream):
                    continue
                for frame in decoder.feed(stream[pos:cut]):
                    yield tuple(frame)
                    if frame.body is None:
                        yield bytes(sunk[-1])
                pos = cut
        except Exception as exc:  # the decision, compared: type and message
            yield (type(exc).__name__, str(exc))
    finally:
        wire._parse_inline = saved


_kinds = st.sampled_from(list(Kind))
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


@compiled
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(st.one_of(_frame, _frame, _frame, _noise), min_size=1, max_size=12),
    cuts=st.lists(st.integers(1, 20_000), max_size=8),
    hello_legal=st.booleans(),
)
def test_the_compiled_loop_decides_as_the_pure_one(parts: list[bytes], cuts: list[int], hello_legal: bool) -> None:
    """Frames of every kind, traced or not, bodies up to and over the receive buffer, bulk data, noise and a
    header over the size limit, received in random pieces: the same frames, data and error either way."""
    stream = b"".join(parts)
    legal = wire.ALL_KINDS_MASK if hello_legal else wire.ALL_KINDS_MASK & ~(1 << Kind.HELLO)
    assert list(_decode(stream, cuts, True, legal)) == list(_decode(stream, cuts, False, legal))


@compiled
def test_parse_inline_keeps_no_reference() -> None:
    """Every object it makes belongs to the frames it appends: 20,000 parses of a traced and an untraced frame,
    the frames dropped each time, leave the traced memory where it was (a leaked reference would keep 14
    objects per frame: megabytes)."""
    import gc
    import tracemalloc

    parse = wire._parse_inline
    assert parse is not None
    stream = encode_frame(Kind.RESPONSE, 2**63, b"\x91\xa3abc", trace_id=b"\x07" * 16, span_id=2**40) + encode_frame(
        Kind.REQUEST, 1, b"", provider_id=7, rpc=2**31
    )

    def parse_many(n: int) -> None:
        for _ in range(n):
            frames: list[Frame] = []
            assert parse(stream, 0, len(stream), 4096, wire.ALL_KINDS_MASK, frames, Frame, wire.ZERO_TRACE_ID) == len(
                stream
            )
            assert len(frames) == 2

    parse_many(100)  # caches (small ints, the empty bytes) settled
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        parse_many(20_000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes still held after 20,000 parses"
