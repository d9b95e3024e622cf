"""The compiled build against its own source run interpreted, and the defects a hand-kept C twin had.

svcframe's hot paths are Python modules that Cython compiles (setup.py); ``SVCFRAME_PURE=1`` runs the same
source interpreted. tests/compiled_kit.py records what the decoder and the encoders do with seeded random
streams, hostile mutations and the reads where a caller's decoder completes frames itself (answers, pushes ahead,
into= data), cut at every byte; here the compiled build's record is compared with the interpreted one's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import compiled_kit
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import svcframe
import svcframe.compiled
from svcframe.decoder import FrameDecoder
from svcframe.wire import F_INTO, F_NO_REPLY, Frame, Kind, encode_frame, ok_response, pack_body, push_ahead_frames

ROOT = Path(__file__).resolve().parents[1]
COMPILED = svcframe.compiled.build() == "compiled"
needs_compiled = pytest.mark.skipif(not COMPILED, reason="svcframe runs interpreted here: nothing to compare")


def _interpreted(*args: str) -> str:
    """Run ``args`` (a Python command line) with every svcframe module interpreted."""
    env = {**os.environ, "SVCFRAME_PURE": "1", "PYTHONPATH": str(ROOT / "tests")}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=True).stdout  # fmt: skip


@needs_compiled
@pytest.mark.parametrize("seed", [1, 2])
def test_the_compiled_build_decodes_and_encodes_as_its_source_interpreted(seed: int) -> None:
    """Every frame, error message, sink request, placed push, answered call and encoded byte is the same."""
    compiled = json.loads(json.dumps(compiled_kit.record(seed, 400)))
    interpreted = json.loads(_interpreted("tests/compiled_kit.py", str(seed), "400"))
    assert (compiled.pop("build"), interpreted.pop("build")) == ("compiled", "pure")
    for part, records in compiled.items():
        theirs = interpreted[part]
        assert len(records) == len(theirs), part
        for i, (ours, other) in enumerate(zip(records, theirs, strict=True) if isinstance(records, list) else
                                          [(records, theirs)]):  # fmt: skip
            assert ours == other, f"{part}[{i}]: compiled {ours!r}\n interpreted {other!r}"


#: Pieces of a caller's receive stream: pushes ahead (one whose size lies, one without its data), OK answers to
#: waiting calls and to none, an error answer, data replies (one larger than the receive buffer), into= data.
_AHEAD = push_ahead_frames(900, bytes(range(16)), 3, 10, 5) + b"0123456789"
_ANSWER = ok_response(5, b"done")
_DATA = compiled_kit.data_reply_header(0, 6, 9) + b"xxxxxx"
_PIECES = [
    _AHEAD, push_ahead_frames(901, bytes(16), 20, 4, 6) + b"abcd", push_ahead_frames(902, bytes(16), 0, 9, 6, data=False),
    encode_frame(Kind.BULK_PUSH, 903, pack_body([bytes(16), 0, 99, 5]), flags=F_NO_REPLY) + b"short",
    _ANSWER, ok_response(6, None), ok_response(77, b"nobody waits"), ok_response(6, bytes(9000)),
    encode_frame(Kind.RESPONSE, 5, pack_body("no"), status=3), _DATA,
    compiled_kit.data_reply_header(0, 5000, 9) + bytes(5000), compiled_kit.data_reply_header(F_INTO, 5, 8) + b"intoo",
]  # fmt: skip


@needs_compiled
@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@example(pieces=[_AHEAD, _ANSWER, _DATA], junk=b"", flips=[], cuts=[])  # a push, an answer, data: in one read
@example(pieces=[_DATA, _AHEAD, _ANSWER], junk=b"", flips=[], cuts=[])  # a push ahead behind a data reply
@given(
    pieces=st.lists(st.sampled_from(_PIECES), min_size=1, max_size=6),
    junk=st.binary(max_size=90),
    flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=3),
    cuts=st.lists(st.integers(0, 1 << 16), max_size=4),
)
def test_fuzzed_receive_streams_decode_alike_compiled_and_interpreted(
    pieces: list[bytes], junk: bytes, flips: list[tuple[int, int]], cuts: list[int]
) -> None:
    """Hypothesis, a fixed number of examples from a fixed seed (and the two streams above): a caller's decoder
    compiled and the same source interpreted, in this process, give the same reads, batches, placed pushes,
    sunk data, answers and errors for streams of these pieces, a tail of junk and bytes flipped, cut anywhere."""
    stream = bytearray(b"".join(pieces) + junk)
    for at, value in flips:
        stream[at % len(stream)] = value
    cut_at = sorted({c % (len(stream) + 1) for c in cuts})
    interpreted = compiled_kit.interpreted("decoder").FrameDecoder
    assert interpreted.__module__ == "svcframe_interpreted.decoder" and not hasattr(interpreted, "__pyx_vtable__")
    ours = compiled_kit._placement(bytes(stream), cut_at, calls=[5, 6, 8], into=8)
    theirs = compiled_kit._placement(bytes(stream), cut_at, calls=[5, 6, 8], into=8, decoder_class=interpreted)
    assert ours == theirs


@needs_compiled
def test_an_engine_serves_and_calls_as_its_source_interpreted() -> None:
    """A server and a client engine, compiled and then interpreted (SVCFRAME_PURE=1): every kind of call (sync,
    async, failing, unknown, pipelined, into=) and bulk transfer (pushes ahead and not, chunked, a pull) has the
    same outcome, and both engines' statistics have the same counts and bytes (a push counted once)."""
    ours = json.loads(json.dumps(compiled_kit.engine_record()))
    theirs = json.loads(_interpreted("tests/compiled_kit.py", "engine"))
    assert ours["outcomes"] == theirs["outcomes"]
    assert all(o[1:] in ([True], ["ok"]) or o[1] == "ok" or o[0] in ("fail", "unknown rpc", "unknown provider")
               for o in ours["outcomes"]), ours["outcomes"]  # fmt: skip
    assert ours["statistics"] == theirs["statistics"]
    bulk = {b["direction"]: b for b in ours["statistics"]["client"]["rpcs"]["bulk"]}
    served = [bulk[d] for d in ("served_push", "served_cma_push") if d in bulk]  # (over unix, 3 MiB may be CMA's)
    assert sum(b["calls"] for b in served) == 4, bulk  # four pushes, each counted once
    assert sum(b["bytes"][1] for b in served) == 4096 + 65536 + (3 << 20) + 1024, bulk


def test_a_push_ahead_in_one_read_with_an_answer_and_data_is_placed_once() -> None:
    """One read: a push ahead, the OK answer to a waiting call, then a bulk data frame (or a second push ahead):
    each push is placed once (by the decoder, or returned as its BULK_PUSH for the dispatch to place), the call
    answered once, the data given to its sink once; cut anywhere, the same."""
    ahead = push_ahead_frames(900, bytes(range(16)), 3, 10, 5) + b"0123456789"
    answer = ok_response(5, b"done")
    for tail, pushes in ((compiled_kit.data_reply_header(0, 6, 9) + b"xxxxxx", [900]),
                         (push_ahead_frames(901, bytes(16), 20, 4, 6) + b"abcd", [900, 901])):  # fmt: skip
        stream = ahead + answer + tail
        for cut in [[]] + [[c] for c in range(1, len(stream))]:
            reads, placed, sunk, results = compiled_kit._placement(stream, cut, calls=[5, 6])
            assert reads[-1][0] == "end", reads[-1]
            frames = [frame for read in reads[:-1] for batch in read for frame in batch]
            as_frames = [int(f[4]) for f in frames if f[0] == "6"]  # (BULK_PUSH)
            assert sorted([p[0] for p in placed] + as_frames) == pushes, (cut, placed, as_frames)
            assert all(p[4] == b"0123456789".hex() for p in placed if p[0] == 900)
            answered = [f for f in frames if f[0] == "3" and f[4] == "5"]  # (the RESPONSE, when not answered)
            assert (results[5] == [0, "(b'done', 6)"]) != bool(answered) and len(answered) <= 1, cut
            data = [f for f in frames if f[0] == "7"]
            assert len(data) == (tail[3] == 7) == len([s for s in sunk if s[0] == 7]), (cut, sunk)


def test_a_push_ahead_behind_a_data_reply_waits_for_the_next_batch() -> None:
    """Data first in a read, then a push ahead: the data frame is dispatched in its batch, the push is held
    and placed, first, in the next (the data's sink may be what the push's placer needs)."""
    data = compiled_kit.data_reply_header(0, 6, 9) + b"xxxxxx"
    ahead = push_ahead_frames(900, bytes(range(16)), 3, 10, 5) + b"0123456789"
    reads, placed, sunk, results = compiled_kit._placement(data + ahead + ok_response(5, None), [], calls=[5])
    (batches, end) = reads
    assert end == ["end", True]
    assert [len(batch) for batch in batches] == [1, 0] and batches[0][0][0] == "7"  # (BULK_DATA_REPLY)
    assert [p[0] for p in placed] == [900] and sunk == [[7, 9, 6]] and results[5] == [0, "(None, 1)"]


def test_a_large_bytes_answer_owns_its_bytes() -> None:
    """A bytes result larger than the receive buffer is received into the bytes the call returns: they stay
    whole once the decoder is closed and collected, and nothing hands out a writable view of a bytes object."""
    assert not hasattr(svcframe.wire, "receive_bytes")
    loop = asyncio.new_event_loop()
    try:
        payload = bytes(range(256)) * 1024
        decoder = FrameDecoder(buffer_bytes=4096)
        decoder.reuse_large = True
        waiter = loop.create_future()
        decoder.answers = {5: waiter}
        frames = ok_response(5, payload)
        got = []
        for at in range(0, len(frames), 1000):
            got += decoder.feed(frames[at : at + 1000])
        decoder.close()
        del decoder
        gc.collect()
        value = waiter.result()[1] if waiter.done() else svcframe.wire.unpack_body(got[0].body)
        assert type(value) is bytes and value == payload
    finally:
        loop.close()


def test_deleting_a_decoders_state_is_an_error_not_a_crash() -> None:
    """``del decoder.answers`` (or its buffers) then a read: an exception or carrying on, never a signal."""
    script = (
        "import sys\nfrom svcframe.decoder import FrameDecoder\nfrom svcframe.wire import ok_response\n"
        "for name in ('answers', 'into_pulls', 'place_ahead', 'bulk_sink', '_buf', '_view'):\n"
        "    d = FrameDecoder()\n"
        "    try:\n        delattr(d, name)\n    except (AttributeError, TypeError):\n        continue\n"
        "    try:\n        d.feed(ok_response(1, b'x'))\n    except Exception as exc:\n"
        "        print(name, type(exc).__name__)\n"
        "print('done')\n"
    )
    for pure in ("0", "1"):
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "SVCFRAME_PURE": pure},
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0 and done.stdout.endswith("done\n"), (pure, done.returncode, done.stderr[-500:])


def test_a_frames_fields_are_its_slots_in_order() -> None:
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, bytes(16), 12, 13, b"body"]
    frame = Frame(*values)
    assert list(frame.fields()) == values == [getattr(frame, name) for name in Frame.__slots__]
    assert frame.replace(status=99).fields()[Frame.__slots__.index("status")] == 99
    with pytest.raises(TypeError, match="no field 'nope'"):
        frame.replace(nope=1)


@needs_compiled
def test_the_compiled_modules_do_not_abort_on_an_assertion() -> None:
    """Built with the interpreter's flags (-DNDEBUG): no C assert()s that would abort a server, and no
    hand-written C module left."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    libraries = sorted((ROOT / "svcframe").glob("*.so"))
    assert libraries and not list((ROOT / "svcframe").glob("_speedups*"))
    for library in libraries:
        symbols = subprocess.run([nm, "-D", "--undefined-only", str(library)], capture_output=True, text=True,
                                 check=True).stdout  # fmt: skip
        if "__asan_" not in symbols:  # (tools/sanitize.sh's build has the sanitizers' own checks)
            assert "__assert_fail" not in symbols, library.name


def test_the_compiled_and_interpreted_runs_report_their_build() -> None:
    """``svcframe --version`` names the build: compiled where the modules were built, pure with SVCFRAME_PURE=1."""
    from importlib.machinery import EXTENSION_SUFFIXES

    built = any((ROOT / "svcframe" / f"decoder{suffix}").exists() for suffix in EXTENSION_SUFFIXES)
    assert "(pure, SVCFRAME_PURE=1, Python" in _interpreted("-m", "svcframe", "--version")
    ours = subprocess.run([sys.executable, "-m", "svcframe", "--version"], capture_output=True, text=True,
                          check=True, env={**os.environ, "SVCFRAME_PURE": "0"}).stdout  # fmt: skip
    assert ("(compiled, Python" in ours) == built and ("(pure, Python" in ours) != built, ours
