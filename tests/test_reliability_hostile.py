"""Hostile or slow peers cannot crash or exhaust a server; secure by default.

* the decoder, fuzzed with valid frames mutated and split at every byte: typed protocol errors only;
* live malformed frames from several attacker connections against a real server process: no crash,
  bounded memory, file descriptors back to baseline, a good client's health call fast throughout;
* a malformed or non-strict body is a bad frame: answered with BAD_REQUEST, then a GOODBYE, and the connection
  is dropped (nothing pipelined after it runs); requests that merely cannot be served are answered and keep it;
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
import gc
import json
import logging
import re
import secrets
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from conftest import ahead_of_the_machine, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_kit import (
    BAD_BODY_CASES,
    HTTP_REQUEST,
    MIB,
    RELTEST_ID,
    SELFTEST_ID,
    Procs,
    Sampler,
    after_bad,
    bad_body_outcome,
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
    soft_cases,
    tls_client_hello,
    wait_closed_by_peer,
)

from svcframe import AuthenticationFailed, ConfigError, ConnectionLost, Engine, Refused, RemoteError
from svcframe.admin import ServiceHandle
from svcframe.decoder import FrameDecoder
from svcframe.errors import RemoteProtocolError
from svcframe.wire import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    WIRE_VERSION,
    Frame,
    Kind,
    Status,
    encode_frame,
    pack_body,
    unpack_body,
)

pytestmark = pytest.mark.timeout(scaled(120, 1200))


# --- decoder fuzzing: valid frames, mutated, split at every byte ------------------------------------------------

FUZZ_EXAMPLES = scaled(10_000, 100_000)  # 10,000: about 14 s in CI; SVCFRAME_LONG=1 for the long run
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


MAX_FIELDS: dict[str, Any] = {
    "provider_id": 0xFFFF, "rpc": 0xFFFFFFFF, "flags": 0xFFFF, "status": 0xFFFF, "deadline_usec": 0xFFFFFFFF,
    "callpath": 2**64 - 1, "trace_id": b"\xff" * 16, "span_id": 2**64 - 1, "lamport": 2**64 - 1,
}  # fmt: skip
BODIES: list[Any] = [None, 0, -1, 2**64 - 1, -(2**63), 1.5, "", "ünï", b"", b"\x00" * 40, [1, [2, [3]]], {"k": {"n": [None]}},
                     {"": b"x"}, [True, False, None], "x" * 200]  # fmt: skip


def _frame_pool() -> list[tuple[bytes, int | None]]:
    """Valid frames of every kind with small and maximal header fields: (bytes, bulk request id or None)."""
    pool: list[tuple[bytes, int | None]] = []
    for n, kind in enumerate(Kind):
        for m, fields in enumerate(({}, MAX_FIELDS, {"provider_id": 1, "rpc": 7, "deadline_usec": 1000})):
            request_id = (n * 3 + m) % 5 + 1 if m != 1 else 2**64 - 1
            if kind in BULK_KINDS:
                for size in (0, 1, 57, FUZZ_MAX_BODY):
                    pool.append((encode_frame(kind, request_id, (bytes(range(256)) * 2)[:size], **fields), request_id))
            else:
                for body in BODIES[m::3]:
                    pool.append((encode_frame(kind, request_id, pack_body(body), **fields), None))
    return pool


FRAME_POOL = _frame_pool()


def _build(blob: bytes) -> tuple[bytes, set[int], int | None]:
    """Valid frames picked from FRAME_POOL by the first bytes of ``blob``, then mutated by the rest: set,
    insert, delete, flip a bit, overwrite a header's body length, truncate. Returns (data, bulk request ids the
    sink expects, the number of frames when nothing was mutated, else None). One compact ``st.binary`` keeps generation cheap (20,000
    examples in seconds) while Hypothesis still shrinks failures to a minimal blob."""
    count = blob[0] % 3 + 1
    picks = [FRAME_POOL[b % len(FRAME_POOL)] for b in blob[1 : 1 + count]]
    data = bytearray(b"".join(frame for frame, _ in picks))
    ids = {rid for _, rid in picks if rid is not None}
    mutated = False
    edits = blob[1 + count :]
    for i in range(0, len(edits) - 3, 4):
        op, pos, value = edits[i] % 6, int.from_bytes(edits[i + 1 : i + 3], "little"), edits[i + 3]
        if not data:
            break
        mutated = True
        pos %= len(data)
        if op == 0:
            data[pos] = value
        elif op == 1:
            data.insert(pos, value)
        elif op == 2:
            del data[pos]
        elif op == 3:
            data[pos] ^= 1 << (value % 8)
        elif op == 4:  # a header's body_length (offset 12) set to a byte-scaled value, up to 4 GiB - 1
            start = (pos // HEADER_SIZE) * HEADER_SIZE
            if start + 16 <= len(data):
                data[start + 12 : start + 16] = min(2**32 - 1, value << (value % 25)).to_bytes(4, "little")
        else:
            del data[len(data) - 1 - value % len(data) :]
    return bytes(data), ids, None if mutated else len(picks)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(blob=st.binary(min_size=2, max_size=40))
def _fuzz_one(blob: bytes) -> None:
    data, ids, intact = _build(blob)
    whole = _decode(data, ids, bytewise=False)
    split = _decode(data, ids, bytewise=True)
    # the same bytes give the same outcome in any split: the same frames, or a protocol error either way
    assert whole[0] == split[0], (whole, split)
    if whole[0] == "ok":
        assert whole[1] == split[1]
        assert whole[2] == split[2]
    if intact is not None:
        assert whole[0] == "ok" and len(whole[1]) == intact  # unmutated: every frame decodes
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


@pytest.mark.one_interpreter
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


# --- live malformed frames against a real server process -------------------------------------------------------

ATTACK = {
    "soft_frames": scaled(40_000, 200_000),  # requests that cannot be served (answered, connection kept)
    # bad frames (broken framing or handshake, malformed or non-strict bodies): one per connection, dropped
    "hard_frames": scaled(10_000, 50_000),
    "soft_connections": 4,
    "hard_connections": 4,
}


async def _health_probe(address: str, stop: asyncio.Event, latencies: list[float], failures: list[str]) -> None:
    """A good client's health call (the reltest no-op) every 10 ms until ``stop``."""
    async with Engine(None) as engine:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                assert await engine.call(address, "noop", "ping", provider_id=RELTEST_ID, timeout_seconds=2.0) == "ping"
            except Exception as exc:  # a failed health call is a finding, not a crash of the probe
                failures.append(f"{type(exc).__name__}: {exc}")
            latencies.append(time.perf_counter() - t0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.01)


def _server_log_problems(log: str) -> list[str]:
    """Lines of a server log that show a crash or an unhandled error (warnings about dropped peers are fine)."""
    bad = ("Traceback", " ERROR ", " CRITICAL ", "never awaited", "was never retrieved", "Exception in callback")
    problems, in_handler_failure = [], False
    for line in log.splitlines():
        if re.match(r"\d{4}-\d\d-\d\d ", line):  # a new record: is it a handler failure (logged on purpose)?
            in_handler_failure = bool(re.search(r" ERROR handler '\w+' of provider \d+ failed ", line))
        if not in_handler_failure and any(b in line for b in bad):
            problems.append(line)
    return problems[:20]


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_live_malformed_frames_from_several_attackers(procs: Procs, tmp_path: Path, figures: Any) -> None:
    """>= 50,000 malformed frames from several attacker connections (a separate process): requests that cannot
    be served on long-lived connections, and bad frames (framing, handshake, bodies) that each cost the attacker
    its connection. The server never crashes, its memory stays within 16 MiB of its baseline, its file
    descriptors return to baseline, and a good client's health call stays under 100 ms throughout (or, on a busy
    machine, under the time the server took to serve 2,000 of the attacker's frames in the same run)."""
    server = procs.spawn(service_config(tmp_path, kv=None))
    warmup = {**ATTACK, "soft_frames": 2_000, "hard_frames": 200}
    await asyncio.to_thread(run_peer, "attack", {"address": server.address, **warmup})  # first-use allocations
    await wait_for_fds(server, None)
    fds_before, rss_before = server.num_fds(), server.rss()
    stop, latencies, failures = asyncio.Event(), [], []
    # The probe measures the server: this process's heap (the whole test session's) is frozen out of the cyclic
    # collector meanwhile, whose full collections here paused the probe itself 8-31 ms (its worst cases)
    gc.collect()
    gc.freeze()
    probe = asyncio.create_task(_health_probe(server.address, stop, latencies, failures))
    server.reset_peak_rss()
    try:
        with Sampler(server) as sampler:
            report = await asyncio.to_thread(run_peer, "attack", {"address": server.address, **ATTACK}, 600.0)
    finally:
        stop.set()
        await probe
        gc.unfreeze()
    peak_growth = max(server.peak_rss(), *sampler.samples) - rss_before
    fds_after = await wait_for_fds(server, fds_before)
    frames = report["soft_frames"] + report["hard_frames"]
    figures.record("hostile: live malformed frames sent", frames, "frames")
    figures.record("hostile: live bad frames (each cost its connection)", report["hard_frames"], "frames")
    figures.record("hostile: live bad bodies among them (answered BAD_REQUEST)", report["bad_body_frames"], "frames")
    figures.record("hostile: live attack rate", round(frames / report["seconds"]), "frames/s")
    figures.record("hostile: live attack server RSS peak growth", round(peak_growth / MIB, 1), "MiB")
    figures.record(
        "hostile: live attack server RSS growth at the end", round((server.rss() - rss_before) / MIB, 1), "MiB"
    )
    figures.record("hostile: live attack server fds before", fds_before, "")
    figures.record("hostile: live attack server fds after", fds_after, "")
    figures.record("hostile: health call p50 during attack", round(percentile(latencies, 50) * 1e3, 2), "ms")
    figures.record("hostile: health call max during attack", round(max(latencies) * 1e3, 2), "ms")
    figures.record("hostile: bad-framing connection dropped, p99", round(report["close_p99_seconds"] * 1e3, 2), "ms")
    assert report["errors"] == [] and report["anomalies"] == [], report
    assert frames >= ATTACK["soft_frames"] + ATTACK["hard_frames"] >= 50_000
    assert report["hard_frames"] == ATTACK["hard_frames"] and report["bad_body_frames"] >= ATTACK["hard_frames"] // 3
    assert journal_counts(tmp_path) == {}  # no request pipelined after a bad frame ever ran
    assert server.alive(), server.log_tail()
    assert _server_log_problems(server.log()) == []
    assert failures == []
    # A fair server answers a good client within a few turns of its loop whatever the flood (256 requests a turn,
    # then the other connections'): at most 100 ms, or the time it took to serve 2,000 of the attacker's frames in
    # this very run, whichever is longer (a busy machine serves the flood slower and schedules the probe later). A
    # server that served the flood first would keep the call for all of its 50,000 frames.
    bound = max(0.100, 2_000 * report["seconds"] / frames)
    figures.record(
        "hostile: health call bound (100 ms, or 2,000 frames at this run's rate)", round(bound * 1e3, 2), "ms"
    )
    assert len(latencies) >= 10 and max(latencies) < bound, f"health call took {max(latencies) * 1e3:.1f} ms"
    assert fds_after == fds_before
    assert peak_growth <= 16 * MIB, f"server RSS grew by {peak_growth / MIB:.1f} MiB under attack (limit 16 MiB)"


async def wait_for_fds(server: Any, target: int | None, within: float = 10.0) -> int:
    """Wait until the server's open file descriptors equal ``target`` (or stop changing, for None)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last, same_since = server.num_fds(), loop.time()
    while loop.time() < deadline:
        await asyncio.sleep(0.02)
        now = server.num_fds()
        if target is not None and now == target:
            return now
        if now != last:
            last, same_since = now, loop.time()
        elif target is None and loop.time() - same_since > 0.2:
            return now
    return server.num_fds()


# --- bad bodies and soft errors, case by case ---------------------------------------------------------------------


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_a_bad_body_is_answered_then_costs_the_connection(procs: Procs, tmp_path: Path, figures: Any) -> None:
    """Each malformed or non-strict body (never-used byte, extension types, a timestamp, int and bytes map keys,
    truncated, trailing bytes, deep nesting; malformed BULK_PULL/BULK_PUSH bodies) in a well-formed frame is a bad
    frame: the server answers it with BAD_REQUEST naming the problem (nothing for a one-way request), says GOODBYE
    with status BAD_REQUEST and drops the connection; the request pipelined right after it never runs; the
    server logs one warning line naming the peer and the problem, never the body; other clients carry on."""
    server = procs.spawn(service_config(tmp_path, kv=None))
    closes: list[float] = []
    async with Engine(None) as bystander:
        assert await bystander.call(server.address, "noop", 1, provider_id=RELTEST_ID) == 1
        bystander_conn = await bystander.connection(server.address)
        for name, (replied, frame) in BAD_BODY_CASES.items():
            log_before = server.log()
            reader, writer = await open_raw(server.address)
            try:
                await raw_handshake(reader, writer, secret())
                port = writer.get_extra_info("sockname")[1]
                t0 = time.perf_counter()
                writer.write(frame + after_bad(name))
                received = await wait_closed_by_peer(reader, 5.0)
                closes.append(time.perf_counter() - t0)
            finally:
                await close_writer(writer)
            assert bad_body_outcome(name, received) is None, bad_body_outcome(name, received)
            frames = FrameDecoder().feed(received)
            if replied:  # the reply names the problem, for an honest but buggy client
                assert any(w in unpack_body(frames[0].body) for w in ("msgpack", "map key", "bulk request")), frames
            assert unpack_body(frames[-1].body).startswith("bad frame: ")
            new_lines = server.log()[len(log_before) :].splitlines()
            assert len(new_lines) == 1 and " WARNING " in new_lines[0], new_lines
            assert f"127.0.0.1:{port}" in new_lines[0] and " body (" in new_lines[0], new_lines
        assert await bystander.call(server.address, "noop", 2, provider_id=RELTEST_ID) == 2
        assert await bystander.connection(server.address) is bystander_conn and not bystander_conn.closed
    assert journal_counts(tmp_path) == {}  # nothing pipelined after a bad frame ran
    assert "BODY-MARKER" not in server.log()
    assert server.alive() and _server_log_problems(server.log()) == []
    figures.record(f"hostile: {len(BAD_BODY_CASES)} bad-body cases, answered and dropped in (max)",
                   round(max(closes) * 1e3, 2), "ms")  # fmt: skip


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_soft_errors_are_answered_and_keep_the_connection(procs: Procs, tmp_path: Path) -> None:
    """An unknown provider or RPC, a wrong argument type or another handler exception, an expired deadline, an
    unknown bulk handle (pull, push, push with its data), and frames the protocol ignores (cancel, response or bulk
    data nobody waits for; unknown flag bits on a one-way request): each is answered with its own status (or
    ignored), and the same connection serves a good request right after."""
    server = procs.spawn(service_config(tmp_path, kv=None))
    reader, writer = await open_raw(server.address)
    decoder = FrameDecoder()
    try:
        await raw_handshake(reader, writer, secret())
        rid = 0
        for name, status, build in soft_cases():
            rid += 2
            writer.write(build(rid) + request(rid + 1, RELTEST_ID, "noop", pack_body(name)))
            got: dict[int, Frame] = {}
            while rid + 1 not in got or (status is not None and rid not in got):  # async handlers answer later
                chunk = await asyncio.wait_for(reader.read(1 << 20), 10.0)
                assert chunk, f"the server closed the connection after {name}"
                got.update((f.request_id, f) for f in decoder.feed(chunk))
            assert all(f.kind == Kind.RESPONSE for f in got.values()), (name, got)
            assert sorted(got) == ([rid] if status is not None else []) + [rid + 1], (name, got)
            if status is not None:
                assert got[rid].status in (status if isinstance(status, tuple) else (status,)), (name, got[rid])
            assert (got[rid + 1].status, unpack_body(got[rid + 1].body)) == (Status.OK, name)
    finally:
        await close_writer(writer)
    assert " WARNING " not in server.log() and _server_log_problems(server.log()) == []


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_a_buggy_client_sees_bad_request_not_connection_lost(
    procs: Procs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client whose encoder lets a non-strict body through (an int map key) gets RemoteError("BadRequest")
    naming the problem, because the reply arrives before the server closes; another call in flight on that
    connection gets ConnectionLost saying why (its handler is cancelled, never answered twice); the client's
    next call, with a sound encoder, works on a new connection."""
    import msgpack

    import svcframe.calls

    server = procs.spawn(service_config(tmp_path, kv=None))
    async with Engine(None) as engine:
        first = await engine.connection(server.address)
        held = asyncio.create_task(
            engine.call(server.address, "hold", {"id": "held", "seconds": 30}, provider_id=RELTEST_ID,
                        timeout_seconds=20.0)
        )  # fmt: skip
        await wait_until(lambda: len(first.pending) == 1, what="the held call to be sent")
        monkeypatch.setattr(svcframe.calls, "pack_body", lambda value: msgpack.packb(value, use_bin_type=True))
        with pytest.raises(RemoteError) as info:
            await engine.call(server.address, "noop", {1: "int key"}, provider_id=RELTEST_ID, timeout_seconds=5.0)
        monkeypatch.undo()
        assert info.value.remote_type == "BadRequest"
        assert "map key" in info.value.remote_message, info.value.remote_message
        with pytest.raises(ConnectionLost, match="bad frame"):
            await held
        await wait_until(lambda: first.closed, what="the client to see the connection closed")
        assert await engine.call(server.address, "noop", "again", provider_id=RELTEST_ID) == "again"
        assert await engine.connection(server.address) is not first
    assert server.log().count("bad REQUEST body") == 1


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_announced_pushes_without_data_do_not_accumulate(procs: Procs, tmp_path: Path, figures: Any) -> None:
    """An authenticated peer announces 100,000 bulk pushes (BULK_PUSH headers, 30 bytes of body each) and
    never sends their data. Per-connection state must stay bounded (the in-flight cap, or the requests'
    deadlines): the server's peak RSS may grow by at most 16 MiB, and it keeps answering that peer."""
    server = procs.spawn(service_config(tmp_path, kv=None))
    announcements = scaled(100_000, 1_000_000)
    rss_before = server.rss()
    server.reset_peak_rss()
    reader, writer = await open_raw(server.address)
    decoder = FrameDecoder()
    got: Any = None
    answered = 0

    progress = asyncio.Event()

    async def read_replies() -> None:  # a well-behaved peer reads its replies (else it is a slow reader)
        nonlocal got, answered
        while got is None:
            chunk = await asyncio.wait_for(reader.read(1 << 20), 30)
            assert chunk, "the server closed the connection"
            for f in decoder.feed(chunk):
                answered += 1
                if f.request_id == 2**40:
                    got = f
            progress.set()

    try:
        await raw_handshake(reader, writer, secret())
        replies = asyncio.ensure_future(read_replies())
        for start in range(0, announcements, 1_000):  # small writes: our reader keeps pace with the replies
            writer.write(b"".join(encode_frame(Kind.BULK_PUSH, start + i + 1, pack_body([bytes(16), 0, 1000]),
                                               deadline_usec=1_000_000) for i in range(1_000)))  # fmt: skip
            await writer.drain()
            while answered < start + 1_000:  # in step with the replies: we test state, not our reading speed
                progress.clear()
                await asyncio.wait_for(progress.wait(), 30)
        writer.write(request(2**40, RELTEST_ID, "noop", pack_body("still there?")))
        await replies
    finally:
        await close_writer(writer)
    assert answered == announcements + 1  # every announced push was refused at once (unknown bulk handle)
    cost = server.peak_rss() - rss_before
    figures.record(f"hostile: {announcements:,} pushes announced without data, server peak RSS cost",
                   round(cost / MIB, 1), "MiB")  # fmt: skip
    assert unpack_body(got.body) == "still there?"
    assert cost <= 16 * MIB, f"{announcements} announced pushes cost the server {cost / MIB:.0f} MiB"


# --- oversize and cross-protocol input -------------------------------------------------------------------------


def _announce(length: int, kind: int = Kind.REQUEST) -> bytes:
    """A frame header announcing a ``length``-byte body (nothing follows)."""
    return HEADER.pack(MAGIC, WIRE_VERSION, kind, 0, RELTEST_ID, 0, length, 1, 0, 0, 0xFFFF, 0, 0, 0, bytes(16), 0, 0)


OVERSIZE = {  # name -> (handshake first, bytes, what the server's log must say)
    "length-4MiB+1": (True, _announce(4 * MIB + 1), "over the 4194304-byte limit"),
    "length-16MiB": (True, _announce(16 * MIB), "over the 4194304-byte limit"),
    "length-256MiB": (True, _announce(256 * MIB), "over the 4194304-byte limit"),
    "length-2GiB": (True, _announce(2**31), "over the 4194304-byte limit"),
    "length-4GiB-1": (True, _announce(2**32 - 1), "over the 4194304-byte limit"),
    "hello-length-4GiB-1": (False, _announce(2**32 - 1, Kind.HELLO), "over the 4194304-byte limit"),
    "http-request": (False, HTTP_REQUEST, "peer speaks HTTP"),
    "tls-client-hello": (False, tls_client_hello(), "peer started a TLS handshake"),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", list(OVERSIZE), ids=list(OVERSIZE))
async def test_oversize_and_cross_protocol_input_rejected_fast_and_cheaply(
    case: str, caplog: pytest.LogCaptureFixture, figures: Any
) -> None:
    """The frame size is checked before anything is allocated for the body: a 4 GiB length prefix, an HTTP
    request or a TLS ClientHello is rejected in < 50 ms with < 1 MiB allocated (tracemalloc, everything this
    process allocates from connect to close), and the server's log says clearly what was wrong."""
    handshake, data, message = OVERSIZE[case]
    caplog.set_level(logging.WARNING, logger="svcframe")
    async with Engine("tcp://127.0.0.1:0") as server:
        server.register(RELTEST_ID, "noop", lambda req, arg: arg)
        tracemalloc.start()
        try:
            reader, writer = await open_raw(server.address)  # type: ignore[arg-type]
            try:
                if handshake:
                    await raw_handshake(reader, writer, secret())
                else:
                    await read_frame(reader)  # the server's HELLO
                t0 = time.perf_counter()
                writer.write(data)
                await wait_closed_by_peer(reader, 5.0)
                seconds = time.perf_counter() - t0
            finally:
                await close_writer(writer)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert server.statistics()["connections"] == 0
    figures.record(f"hostile: {case} rejected in", round(seconds * 1e3, 2), "ms")
    figures.record(f"hostile: {case} allocated (peak)", round(peak / 1024, 1), "KiB")
    assert seconds < 0.050
    assert peak < MIB
    assert message in caplog.text, caplog.text


# --- slow reader ------------------------------------------------------------------------------------------------

SLOW_SIZE = MIB
TAIL_NOISE_SECONDS = 0.010  # a p99 may grow this much from scheduling noise alone (see the test)


async def _normal_clients(address: str, seconds: float, clients: int = 8) -> list[float]:
    """``clients`` engines (one connection each) calling selftest ``work`` (1 KiB each way) in closed
    loops for ``seconds``; returns every call's latency."""
    from selftest.provider import work_arg

    arg = work_arg(1024, None, None, b"r" * 1024)
    latencies: list[float] = []

    async def one() -> None:
        async with Engine(None) as engine:
            await engine.call(address, "work", arg, provider_id=SELFTEST_ID)  # connect outside the window
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                await engine.call(address, "work", arg, provider_id=SELFTEST_ID, timeout_seconds=5.0)
                latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(one() for _ in range(clients)))
    return latencies


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_slow_reader_is_disconnected_at_the_cap_and_others_keep_their_latency(
    procs: Procs, tmp_path: Path, figures: Any
) -> None:
    """A peer that pipelines 1 MiB requests (1 MiB replies) and never reads is disconnected when its output
    reaches the 16 MiB cap, costing the server at most 16 MiB (peak RSS, VmHWM), while 8 normal clients keep
    their p50 latency within 2x of their baseline, and their p99 within 2x or 10 ms of it."""
    from selftest.provider import work_arg

    server = procs.spawn(service_config(tmp_path, kv=None, selftest=True))
    window = scaled(2.0, 10.0)
    await _normal_clients(server.address, 0.3)  # warm up, with small calls and with the large ones below
    async with Engine(None) as engine:
        large = work_arg(SLOW_SIZE, None, None, b"q" * SLOW_SIZE)
        for _ in range(4):
            await asyncio.gather(
                *(engine.call(server.address, "work", large, provider_id=SELFTEST_ID) for _ in range(8))
            )
    baseline = await _normal_clients(server.address, window)
    rounds = scaled(3, 10)
    rss_before = server.rss()
    server.reset_peak_rss()
    slow = {"address": server.address, "size": SLOW_SIZE, "rounds": rounds, "max_requests": 2000, "wait_for_go": True}
    peer = procs.peer("slowreader", slow)
    assert peer.stdin is not None and peer.stdout is not None
    assert await asyncio.to_thread(peer.stdout.readline) == "ready\n", peer.stderr.read() if peer.stderr else ""
    peer.stdin.write("go\n")
    peer.stdin.flush()
    loaded = await _normal_clients(server.address, window)
    out, err = await asyncio.to_thread(peer.communicate, None, 60.0)
    assert peer.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    cost = server.peak_rss() - rss_before
    p99_base, p99_loaded = percentile(baseline, 99), percentile(loaded, 99)
    figures.record("hostile: slow reader, server peak RSS cost", round(cost / MIB, 1), "MiB")
    figures.record("hostile: slow reader, requests sent before disconnect (median)",
                   sorted(r["requests"] for r in report["rounds"])[rounds // 2], "x 1 MiB")  # fmt: skip
    figures.record("hostile: 8 normal clients p99, baseline", round(p99_base * 1e3, 2), "ms")
    figures.record("hostile: 8 normal clients p99, with slow readers", round(p99_loaded * 1e3, 2), "ms")
    figures.record("hostile: 8 normal clients calls/s, with slow readers", round(len(loaded) / window), "calls/s")
    assert all(r["ended_by"] in ("ConnectionResetError", "BrokenPipeError") for r in report["rounds"]), report
    assert server.log().count("does not read its data (slow reader)") >= rounds
    assert server.alive() and _server_log_problems(server.log()) == []
    assert cost <= 16 * MIB, f"a slow reader cost the server {cost / MIB:.1f} MiB (cap 16 MiB)"
    p50_base, p50_loaded = percentile(baseline, 50), percentile(loaded, 50)
    figures.record("hostile: 8 normal clients p50, baseline / with slow readers",
                   f"{p50_base * 1e3:.2f} / {p50_loaded * 1e3:.2f}", "ms")  # fmt: skip
    # The typical call keeps its latency; the tail may grow by this machine's scheduling noise (ten processes
    # on two cores: a p99 of 0.4 ms went to 6.5 ms with or without the slow reader's fixes, in local runs),
    # but not by a stall: a server that waited on the slow reader would hold every call for the whole round.
    assert p50_loaded <= 2 * p50_base, f"p50 {p50_loaded * 1e3:.2f} ms vs baseline {p50_base * 1e3:.2f} ms"
    assert p99_loaded <= max(2 * p99_base, p99_base + TAIL_NOISE_SECONDS), (
        f"p99 {p99_loaded * 1e3:.2f} ms vs baseline {p99_base * 1e3:.2f} ms"
    )


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_small_pipelined_requests_with_large_replies_stay_within_the_output_cap(
    procs: Procs, tmp_path: Path, figures: Any
) -> None:
    """Amplification: 200 small requests (90 bytes each, one write) for 1 MiB replies each. The output
    cap must bound what the server buffers for this peer: its peak RSS may not grow by more than the 16 MiB
    cap, however the replies are batched."""
    from selftest.provider import work_arg

    server = procs.spawn(service_config(tmp_path, kv=None, selftest=True))
    frames = b"".join(
        request(i + 1, SELFTEST_ID, "work", pack_body(work_arg(SLOW_SIZE, None, None, b""))) for i in range(200)
    )
    rss_before = server.rss()
    server.reset_peak_rss()
    reader, writer = await open_raw(server.address)
    try:
        await raw_handshake(reader, writer, secret())
        writer.write(frames)  # and never read
        await writer.drain()
        await wait_until(lambda: "slow reader" in server.log(), what="the server to drop the slow reader")
    finally:
        await close_writer(writer)
    cost = server.peak_rss() - rss_before
    figures.record(
        "hostile: 18 KB of requests for 200 MiB of replies, server peak RSS cost", round(cost / MIB, 1), "MiB"
    )
    assert "slow reader" in server.log()
    assert server.alive()
    assert cost <= 16 * MIB, f"{len(frames)} bytes of requests made the server buffer {cost / MIB:.0f} MiB"


# --- authentication -----------------------------------------------------------------------------------------------


class _RecordingProxy:
    """A loopback TCP proxy that records what the first client sends (to replay a real handshake)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.client_bytes = bytearray()
        self.server: asyncio.AbstractServer | None = None
        self.address = ""

    async def start(self) -> _RecordingProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"tcp://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await open_raw(self.target)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, record: bool) -> None:
            with contextlib.suppress(ConnectionError):
                while chunk := await src.read(65536):
                    if record:
                        self.client_bytes.extend(chunk)
                    dst.write(chunk)
            dst.close()

        await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def _intrude(address: str, first_bytes: Any) -> tuple[bool, float]:
    """One raw attempt: read the server's HELLO, send ``first_bytes(server_hello)``, read until the server
    closes. Returns (a RESPONSE came back: a success for the intruder, seconds until the connection closed)."""
    reader, writer = await open_raw(address)
    try:
        _, body = await read_frame(reader)
        t0 = time.perf_counter()
        writer.write(first_bytes(unpack_body(body)))
        rest = await wait_closed_by_peer(reader, 5.0)
        seconds = time.perf_counter() - t0
    finally:
        await close_writer(writer)
    decoder = FrameDecoder()
    frames = decoder.feed(rest)
    assert frames and frames[0].kind == Kind.GOODBYE and frames[0].status == Status.UNAUTHENTICATED, frames
    return any(f.kind == Kind.RESPONSE for f in frames), seconds


ATTEMPTS = scaled(50, 200)


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_authentication_refuses_missing_wrong_and_replayed_handshakes(
    procs: Procs, tmp_path: Path, caplog: pytest.LogCaptureFixture, figures: Any
) -> None:
    """A server whose secret comes from a file: >= 50 attempts each without a secret, with a wrong secret and
    with a replayed handshake (a good client's HELLO, captured by a relaying proxy, through which the good
    client itself cannot authenticate, then replayed with a request on new connections) get 0 successes: no response, no execution (the provider's journal). The secret is then
    absent from the server's log (at debug level), this process's log records, and every config and status
    output of the admin provider."""
    caplog.set_level(logging.DEBUG, logger="svcframe")
    key = b"file-secret-" + secrets.token_hex(16).encode()
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(key + b"\n")
    config = service_config(tmp_path, kv="fast")
    config["engine"]["auth"] = {"secret_file": str(secret_file)}
    server = procs.spawn(config, verbose=True, env=server_env(secret=False))

    async with Engine(None, secret=key) as good:
        proxy = await _RecordingProxy(server.address).start()
        try:  # a relay fails: the client's proof names the endpoint it dialled, the proxy's
            with pytest.raises(AuthenticationFailed):
                await good.call(proxy.address, "record", {"id": "good-1"}, provider_id=RELTEST_ID, timeout_seconds=5)
        finally:
            await good.close()
            await proxy.close()
    # the good client's HELLO as the proxy saw it, and the request it would have sent: replayed below
    captured = bytes(proxy.client_bytes) + request(1, RELTEST_ID, "record", pack_body({"id": "good-1"}))
    assert captured.startswith(MAGIC)

    def forged(n: int, mac_key: bytes | None) -> Any:
        def build(hello: dict) -> bytes:
            intruder = request(1, RELTEST_ID, "record", pack_body({"id": f"intruder-{n}"}))
            return hello_reply(hello, mac_key, f"intruder-{n}") + intruder

        return build

    results: dict[str, list[tuple[bool, float]]] = {"no-secret": [], "wrong-secret": [], "replayed": []}
    for n in range(ATTEMPTS):
        results["no-secret"].append(await _intrude(server.address, forged(n, None)))
        results["wrong-secret"].append(await _intrude(server.address, forged(n, b"wrong-" + key)))
        results["replayed"].append(await _intrude(server.address, lambda hello: captured))
    engine_refusals = 0
    for client_key in (None, b"wrong-" + key):  # the real client as well: refused, typed
        for _ in range(5):
            async with Engine(None, secret=client_key) as intruder:
                with pytest.raises(AuthenticationFailed):
                    await intruder.call(server.address, "record", {"id": "engine-intruder"}, provider_id=RELTEST_ID,
                                        timeout_seconds=5.0)  # fmt: skip
                engine_refusals += 1

    async with Engine(None, secret=key) as good:
        admin = ServiceHandle(good, server.address, timeout_seconds=10.0)
        outputs = [await admin.get_config(), await admin.status(), await admin.query_config("@"),
                   await admin.statistics(), await admin.list_rpcs()]  # fmt: skip
        assert await good.call(server.address, "noop", "ok", provider_id=RELTEST_ID) == "ok"  # still serving
    executed = journal_counts(tmp_path)
    successes = {name: sum(ok for ok, _ in rows) for name, rows in results.items()}
    for name, rows in results.items():
        figures.record(f"hostile: auth attempts {name}", len(rows), "")
        figures.record(f"hostile: auth successes {name}", successes[name], "")
        figures.record(f"hostile: auth {name} refused in (max)", round(max(s for _, s in rows) * 1e3, 2), "ms")
    assert all(len(rows) >= 50 for rows in results.values())
    assert successes == {"no-secret": 0, "wrong-secret": 0, "replayed": 0}
    assert executed == {}, executed  # no intruder ran anything; neither the relay nor the replays ran good-1
    assert engine_refusals == 10
    texts = {"server log": server.log(), "client log records": caplog.text,
             "admin outputs": json.dumps(outputs, default=str)}  # fmt: skip
    assert "authentication failed" in texts["server log"]  # the refusals were logged ...
    for what, text in texts.items():  # ... without the secret, in any form
        for form in (key.decode(), key.hex(), key.decode()[12:]):
            assert form not in text, f"the secret appears in the {what}"
    assert str(secret_file) in texts["admin outputs"]  # where the secret comes from is fine to show


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_admin_mutations_need_an_authenticated_connection(procs: Procs, tmp_path: Path) -> None:
    """A loopback server started without any secret serves reads to anyone, but refuses every admin
    mutation and library loading (admin.require_authentication defaults to true)."""
    server = procs.spawn(service_config(tmp_path, kv=None), env=server_env(secret=False))
    async with Engine(None, secret=None) as anyone:
        admin = ServiceHandle(anyone, server.address, timeout_seconds=10.0)
        assert (await admin.status())["pid"] == server.pid
        attempts = [
            admin.load_library("providers.kv"),
            admin.add_provider({"name": "x", "type": "reltest"}),
            admin.remove_provider("rel"),
            admin.patch_config([{"op": "replace", "path": "/engine/default_timeout_seconds", "value": 1}]),
            admin.shutdown(),
        ]
        for attempt in attempts:
            with pytest.raises(Refused, match="authenticated connection"):
                await attempt
        assert await anyone.call(server.address, "noop", 1, provider_id=RELTEST_ID) == 1
    assert server.alive()


@pytest.mark.asyncio
async def test_non_loopback_listening_without_a_secret_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Secure by default: asked to listen on a non-loopback address without a secret, the server refuses to
    start (nothing is bound), naming both ways out; with engine.trusted_network it would try to bind."""
    from svcframe.config import parse_config
    from svcframe.server import Server

    monkeypatch.delenv("SVCFRAME_SECRET")
    config = parse_config({"engine": {"address": "tcp://10.213.0.1:0"}})
    with pytest.raises(ConfigError, match=r"without a shared secret.*trusted_network"):
        await Server(config, secret=None).start()


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_a_pipelined_flood_shares_the_loop_with_other_connections(procs: Procs, tmp_path: Path) -> None:
    """One connection writes 40,000 noop requests at once (reads of up to 256 KiB: some 2,600 requests each);
    health calls on another connection, sent while the flood is served, are typically answered within a
    few hundred of the flood's answers: the server dispatches at most FRAMES_PER_TURN frames of a connection per
    turn of its loop. (A whole read was dispatched at once: a health call waited behind up to one read's
    requests, some 25 ms; 127 ms once under the attack above.)"""
    from svcframe.transport import FRAMES_PER_TURN

    server = procs.spawn(service_config(tmp_path, kv=None))
    answer = encode_frame(Kind.RESPONSE, 1, pack_body("x"))  # every flood answer has this size
    async with Engine(None) as engine:
        assert await engine.call(server.address, "noop", "ping", provider_id=RELTEST_ID) == "ping"  # connected
        reader, writer = await open_raw(server.address)
        await raw_handshake(reader, writer, secret())
        flood = 40_000
        writer.write(b"".join(request(i + 1, RELTEST_ID, "noop", pack_body("x")) for i in range(flood)))
        received = 0

        async def count() -> None:
            nonlocal received
            while received < flood * len(answer):
                chunk = await reader.read(1 << 20)
                assert chunk, "the server closed the flooding connection"
                received += len(chunk)

        counter = asyncio.create_task(count())
        await wait_until(lambda: received > 0, what="the server to start answering the flood")
        waits = []  # flood answers that arrived while one health call was under way
        with ahead_of_the_machine():  # this process reads answers as they come, not in heaps when it gets a core
            while received < flood * len(answer) // 2:
                before = received
                assert await engine.call(server.address, "noop", "ping", provider_id=RELTEST_ID) == "ping"
                waits.append((received - before) // len(answer))
        await asyncio.wait_for(counter, 60)
        await close_writer(writer)
    # (counted as this process reads them: a late read can bring a few turns' answers at once, so the typical
    # wait is compared; before, it was 1,024-2,172 answers, one read's worth, now one or two turns')
    assert len(waits) >= 3, waits
    assert statistics.median(waits) <= 2 * FRAMES_PER_TURN, f"health calls waited behind {waits} flood answers"
