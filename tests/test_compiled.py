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

import svcframe
import svcframe.compiled
from svcframe.decoder import FrameDecoder
from svcframe.wire import Frame, ok_response, push_ahead_frames

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
            frames = [frame for read in reads for batch in read for frame in batch]
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
    (batches,) = reads
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
