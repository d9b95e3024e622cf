"""Promise 3 and 5 of issue 9: hostile or slow peers cannot crash or exhaust a server; secure by default.

* the decoder, fuzzed with valid frames mutated and split at every byte: typed protocol errors only;
* live malformed frames from several attacker connections against a real server process: no crash,
  bounded memory, file descriptors back to baseline, a good client's health call fast throughout;
* oversize and cross-protocol input (length prefixes up to 4 GiB, HTTP, a TLS ClientHello) rejected at
  once, with a clear error, allocating almost nothing;
* a slow reader is disconnected at the output cap, costing the server at most that cap, while normal
  clients keep their latency;
* authentication: no secret, a wrong secret and a replayed handshake all fail; the secret shows up in no
  log and no config output; admin mutations need it; non-loopback listening without it is refused.

Figures are recorded with the ``figures`` fixture and printed at the end of the run. SVCFRAME_LONG=1 runs
the larger counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_kit import (
    HTTP_REQUEST,
    MIB,
    RELTEST_ID,
    SELFTEST_ID,
    Procs,
    Sampler,
    close_writer,
    hello_reply,
    journal_counts,
    open_raw,
    percentile,
    raw_handshake,
    read_frame,
    request,
    run_peer,
    scaled,
    secret,
    server_env,
    service_config,
    tls_client_hello,
    wait_closed_by_peer,
)

from svcframe import AuthenticationFailed, ConfigError, Engine, Refused
from svcframe.admin import ServiceHandle
from svcframe.errors import FrameTooLarge, RemoteProtocolError
from svcframe.wire import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    WIRE_VERSION,
    Frame,
    FrameDecoder,
    Kind,
    Status,
    encode_frame,
    pack_body,
    unpack_body,
)

pytestmark = pytest.mark.timeout(scaled(120, 1200))


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    group = Procs(tmp_path)
    try:
        yield group
    finally:
        group.close()


# --- decoder fuzzing: valid frames, mutated, split at every byte ------------------------------------------------

FUZZ_EXAMPLES = scaled(20_000, 100_000)
BULK_KINDS = (Kind.BULK_DATA_REPLY, Kind.BULK_DATA_PUSH)
FUZZ_MAX_BODY = 512
_fuzz_runs = {"examples": 0, "errors": 0, "frames": 0, "bytes": 0}


class _Sink:
    """A bulk sink like the engine's: data for request ids it expects lands in buffers of its own; data
    for any other id is a RemoteProtocolError."""

    def __init__(self, expected: set[int]) -> None:
        self.expected = expected
        self.received: list[tuple[int, int, bytearray]] = []

    def __call__(self, kind: int, request_id: int, length: int) -> memoryview:
        if request_id not in self.expected:
            raise RemoteProtocolError(f"bulk data for unknown request {request_id}")
        buf = bytearray(length)
        self.received.append((kind, request_id, buf))
        return memoryview(buf)


def _decode(data: bytes, expected: set[int], *, bytewise: bool) -> tuple[str, list[Frame], list[Any]]:
    """('ok' | 'protocol-error', frames, bulk data received). Any other exception propagates (a failure)."""
    sink = _Sink(expected)
    decoder = FrameDecoder(max_body_bytes=FUZZ_MAX_BODY, bulk_sink=sink, buffer_bytes=256)
    frames: list[Frame] = []
    try:
        if bytewise:  # every byte boundary is a split, the way a BufferedProtocol receives it
            for i in range(len(data)):
                buf = decoder.get_buffer()
                assert len(buf) > 0
                buf[0] = data[i]
                got = decoder.buffer_updated(1)
                while got:
                    frames.extend(got)
                    got = decoder.more()
        else:
            frames = decoder.feed(data)
    except RemoteProtocolError:  # FrameTooLarge included
        return "protocol-error", frames, [(k, r, bytes(b)) for k, r, b in sink.received]
    return "ok", frames, [(k, r, bytes(b)) for k, r, b in sink.received]


MSGPACK_INTS = st.integers(-(2**63), 2**64 - 1)
frame_spec = st.tuples(
    st.sampled_from(list(Kind)),
    st.integers(0, 2**64 - 1),  # request id
    st.one_of(st.none(), MSGPACK_INTS, st.text(max_size=20), st.binary(max_size=40),
              st.lists(MSGPACK_INTS, max_size=4), st.dictionaries(st.text(max_size=5), MSGPACK_INTS, max_size=3)),
    st.binary(max_size=60),  # raw body for bulk data kinds
    st.integers(0, 0xFFFF),  # provider id
    st.integers(0, 0xFFFF),  # flags
)  # fmt: skip

edit = st.tuples(st.sampled_from(["set", "insert", "delete", "flip", "length"]), st.integers(0, 10_000),
                 st.integers(0, 2**32 - 1))  # fmt: skip


def _build(specs: list[tuple[Any, ...]]) -> tuple[bytes, set[int]]:
    parts, ids = [], set()
    for kind, request_id, value, raw, provider_id, flags in specs:
        body = raw if kind in BULK_KINDS else pack_body(value)
        parts.append(encode_frame(kind, request_id, body, provider_id=provider_id, flags=flags))
        if kind in BULK_KINDS:
            ids.add(request_id)
    return b"".join(parts), ids


def _mutate(data: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for op, pos, value in edits:
        if not out:
            break
        pos %= len(out)
        if op == "set":
            out[pos] = value & 0xFF
        elif op == "insert":
            out.insert(pos, value & 0xFF)
        elif op == "delete":
            del out[pos]
        elif op == "flip":
            out[pos] ^= 1 << (value % 8)
        else:  # overwrite a header's body_length field (offset 12 of the frame at a header boundary)
            start = (pos // HEADER_SIZE) * HEADER_SIZE
            if start + 16 <= len(out):
                out[start + 12 : start + 16] = value.to_bytes(4, "little")
    return bytes(out)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
@given(specs=st.lists(frame_spec, min_size=1, max_size=3), edits=st.lists(edit, max_size=4),
       truncate=st.integers(0, 64))  # fmt: skip
def _fuzz_one(specs: list[tuple[Any, ...]], edits: list[tuple[str, int, int]], truncate: int) -> None:
    valid, ids = _build(specs)
    data = _mutate(valid, edits)
    if truncate and edits:
        data = data[: max(0, len(data) - truncate)]
    whole = _decode(data, ids, bytewise=False)
    split = _decode(data, ids, bytewise=True)
    # the same bytes give the same outcome in any split: the same frames, or a protocol error either way
    assert whole[0] == split[0], (whole, split)
    if whole[0] == "ok":
        assert whole[1] == split[1]
        assert whole[2] == split[2]
    if not edits and not truncate:
        assert whole[0] == "ok" and len(whole[1]) == len(specs)  # unmutated: every frame decodes
    for frame in split[1]:
        if frame.kind in BULK_KINDS:
            assert frame.body is None
        else:
            with contextlib.suppress(RemoteProtocolError):  # the body codec: typed errors only too
                unpack_body(frame.body or b"")
    _fuzz_runs["examples"] += 1
    _fuzz_runs["errors"] += whole[0] != "ok"
    _fuzz_runs["frames"] += len(split[1])
    _fuzz_runs["bytes"] += len(data)


def test_decoder_fuzz_mutated_frames_split_at_every_byte(figures: Any) -> None:
    """Garbage in raises only RemoteProtocolError (FrameTooLarge included); any split of the same bytes
    decodes the same way. Any other exception fails the test (Hypothesis reports the input)."""
    t0 = time.perf_counter()
    _fuzz_one()
    seconds = time.perf_counter() - t0
    figures.record("hostile: decoder fuzz examples (mutated, split at every byte)", _fuzz_runs["examples"], "")
    figures.record("hostile: decoder fuzz examples rejected with a protocol error", _fuzz_runs["errors"], "")
    figures.record("hostile: decoder fuzz bytes fed one at a time", _fuzz_runs["bytes"], "B")
    figures.record("hostile: decoder fuzz duration", round(seconds, 2), "s")
    assert _fuzz_runs["examples"] >= FUZZ_EXAMPLES
    assert 0 < _fuzz_runs["errors"] < _fuzz_runs["examples"]  # both outcomes were exercised
