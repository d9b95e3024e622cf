"""From the outside: an attacker and a careless operator against real ``svcframe serve``
processes, with hand-made frames (svcframe.wire) and the public testing kit (svcframe.testing), written from
the issue's table and its "Must show" lines, not from the project's other tests.

Every row of the issue's table and every "Must show" line 1-6 has a test here, plus the variants an adversary
tries next (a partial frame behind a complete one, pre-authentication bodies that expand when decoded, calls
kept in flight to dodge eviction, short query expressions whose answers explode, statistics keys the caller
chooses, bulk data for requests never made, relays that forward nonces and rewrite endpoints, impostors at a
stale address, unix addresses that are links, FIFOs or directories...). Each test records its figure with the
``figures`` fixture. A test marked ``xfail(strict=True)`` asserts what the issue promises and fails because
svcframe does not do it yet; its reason names the defect.

The servers are started together once (``farm``), so the file stays in CI's budget; SVCFRAME_LONG=1 runs the
issue's full sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
from conftest import settled_rss

from svcframe import Engine
from svcframe.errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectionLost,
    DeadlineExceeded,
    RemoteProtocolError,
    RPCError,
    Status,
)
from svcframe.monitoring import MAX_TARGET_RECORDS
from svcframe.testing import RawPeer, ServerProcess
from svcframe.wire import (
    HEADER,
    HEADER_SIZE,
    Kind,
    auth_mac,
    encode_frame,
    encode_header,
    pack_body,
    rpc_id,
    unpack_body,
)

LONG = os.environ.get("SVCFRAME_LONG") == "1"
MIB = 1 << 20
TESTS = Path(__file__).resolve().parent
SECRET = b"hostile-outside-secret-0123456789"
KV_ID, SELFTEST_ID, BLOB_ID, VICTIM_ID = 1, 2, 3, 1

uvloop_test = pytest.mark.asyncio(loop_factories=["uvloop"])


def scaled(ci: int, long: int) -> int:
    return long if LONG else ci


# -- servers ---------------------------------------------------------------------------------------------------


def server_env(secret: bytes | None) -> dict[str, str]:
    """This process's environment with the tests directory importable and exactly ``secret`` (conftest sets one
    for the whole suite)."""
    env = dict(os.environ)
    env.pop("SVCFRAME_SECRET", None)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [env.get("PYTHONPATH")])])
    if secret is not None:
        env["SVCFRAME_SECRET"] = secret.decode()
    return env


def kv(provider_id: int = KV_ID) -> dict[str, Any]:
    return {"name": "kv", "type": "kv", "provider_id": provider_id, "config": {"path": ":memory:"}}


def selftest(provider_id: int = SELFTEST_ID, **config: Any) -> dict[str, Any]:
    return {"name": "st", "type": "selftest", "provider_id": provider_id, "config": config}


@dataclass
class Spec:
    config: dict[str, Any]
    secret: bytes | None = None
    nofile: int | None = None  # the server's descriptor limit (RLIMIT_NOFILE)


def farm_specs(root: Path) -> dict[str, Spec]:
    secret_file = root / "world-readable.secret"
    secret_file.write_bytes(SECRET + b"\n")
    secret_file.chmod(0o644)
    libs = ["providers.kv", "selftest.provider"]
    return {
        # shared by the protocol, trickle, deadline, bulk-capability and traceback tests
        "plain": Spec(
            {
                "engine": {"frame_timeout_seconds": 1.0, "handshake_timeout_seconds": 2.0},
                "libraries": libs,
                "providers": [kv(), selftest()],
            }
        ),
        "auth": Spec({"engine": {"auth": {"secret_file": str(secret_file)}}, "libraries": libs, "providers": [kv()]}),
        "victim": Spec(
            {
                "libraries": ["hostile_outside_lib"],
                "providers": [{"name": "victim", "type": "outside_victim", "provider_id": VICTIM_ID}],
            }
        ),
        # one per memory or cap figure, so that nothing another test did hides what this one measures
        "mem": Spec({"engine": {"max_connections_per_host": 4096}}, SECRET),
        "preauth_hello": Spec({}, SECRET),
        "preauth_goodbye": Spec({}, SECRET),
        "bufkeep": Spec({"engine": {"max_connections_per_host": 4096}}),
        "flood_secret": Spec({}, SECRET, nofile=1024),
        "flood_inflight": Spec({"libraries": libs, "providers": [kv()]}, nofile=1024),
        "forged": Spec({"libraries": libs, "providers": [kv(), selftest()]}),
        "same_id": Spec({"libraries": libs, "providers": [kv()]}),
        "blob": Spec(
            {
                "libraries": ["providers.kv", "providers.blob"],
                "providers": [
                    kv(),
                    {
                        "name": "blobs",
                        "type": "blob",
                        "provider_id": BLOB_ID,
                        "config": {"path": str(root / "blobs")},
                        "dependencies": {"index": "kv@local"},
                    },
                ],
            }
        ),
        "st_responses": Spec({"libraries": libs, "providers": [selftest()]}),
        "st_storage": Spec({"libraries": libs, "providers": [selftest(storage_dir=str(root))]}),
        "query": Spec({}),
        "query_stall": Spec({}),
        "stats_parent": Spec({"libraries": libs, "providers": [selftest()]}),
        "stats_churn": Spec({"libraries": libs, "providers": [selftest()]}),
        "stats_unix": Spec(
            {"engine": {"address": f"unix://{root / 'stats.sock'}"}, "libraries": libs, "providers": [selftest()]}
        ),
    }


@pytest.fixture(scope="module")
def descriptors() -> Iterator[None]:
    """Room for a few thousand sockets in this process and in the servers it starts (they inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    if want < 2600:
        pytest.skip(f"needs 2,600 descriptors (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory, descriptors: None) -> Iterator[dict[str, ServerProcess]]:
    """Every server of this file, started at once and ready (one ``svcframe serve`` process each)."""
    root = Path(tempfile.mkdtemp(prefix="sfo", dir="/tmp"))  # unix socket paths stay short
    servers: dict[str, ServerProcess] = {}
    try:
        for name, spec in farm_specs(root).items():
            limits = resource.getrlimit(resource.RLIMIT_NOFILE)
            if spec.nofile:  # the server inherits this process's limit
                resource.setrlimit(resource.RLIMIT_NOFILE, (spec.nofile, limits[1]))
            try:
                servers[name] = ServerProcess.start(
                    spec.config, root / name, name=name, env=server_env(spec.secret), wait=False
                )
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        for server in servers.values():
            server.wait_ready(90.0)
        yield servers
    finally:
        for server in servers.values():
            with contextlib.suppress(ProcessLookupError):
                server.proc.send_signal(signal.SIGKILL)
        for server in servers.values():
            server.proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


class PeakRSS:
    """Samples a server's RSS every 2 ms in a thread; ``peak`` after the ``with``."""

    def __init__(self, server: ServerProcess) -> None:
        self.process = psutil.Process(server.pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.002)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class GoodClient:
    """A well-behaved client in a process of its own, calling the server every 10 ms while a test attacks it
    (``python -m hostile_outside_lib``); ``result`` after the ``with``: calls, max_ms, p99_ms, failures."""

    def __init__(self, server: ServerProcess, secret: bytes | None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hostile_outside_lib", server.address], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=server_env(secret),
        )  # fmt: skip
        self.result: dict[str, Any] = {}

    def __enter__(self) -> GoodClient:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60.0)
        assert ready and self.proc.stdout.readline().strip() == b"ready", "the good client did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        out = self.proc.stdout.read()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.result = json.loads(out.decode().strip().splitlines()[-1]) if out.strip() else {"failures": ["died"]}


# -- hand-made frames ------------------------------------------------------------------------------------------


async def raw(
    server: ServerProcess | str,
    *,
    secret: bytes | None = None,
    handshake: bool = True,
    engine_id: str = "attacker",
    peer_address: str | None = None,
    local_host: str | None = None,
) -> RawPeer:
    """A RawPeer to ``server``, from ``local_host`` when given (another loopback address)."""
    address = server if isinstance(server, str) else server.address
    if local_host is None:
        return await RawPeer.connect(
            address, secret=secret, handshake=handshake, engine_id=engine_id, peer_address=peer_address
        )
    host, _, port = address[len("tcp://") :].rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(local_host, 0))
    peer = RawPeer(reader, writer)
    if handshake:
        try:
            await peer.handshake(secret, engine_id=engine_id, peer_address=peer_address)
        except BaseException:
            await peer.close()
            raise
    return peer


def put_frame(request_id: int, key: str, *, deadline_usec: int = 10_000_000) -> bytes:
    """A kv ``put`` of ``key`` (the side effect that shows whether a frame after an attack ran)."""
    body = pack_body({"key": key, "value": b"written"})
    return encode_frame(
        Kind.REQUEST, request_id, body, provider_id=KV_ID, rpc=rpc_id("put"), deadline_usec=deadline_usec
    )


async def call(
    server: ServerProcess, provider_id: int, name: str, arg: Any = None, *, secret: bytes | None = None
) -> tuple[int, Any]:
    """One call on a fresh raw connection: (status, decoded body)."""
    async with await raw(server, secret=secret) as peer:
        peer.request(1, provider_id, name, arg)
        frame, body = await peer.read_response()
        return frame.status, body


async def stored(server: ServerProcess, key: str, secret: bytes | None = None) -> bool:
    status, found = await call(server, KV_ID, "exists", {"key": key}, secret=secret)
    assert status == Status.OK, found
    return bool(found)


async def stored_many(server: ServerProcess, keys: list[str]) -> list[bool]:
    """``exists`` of every key, pipelined on one connection (no secret)."""
    async with await raw(server) as peer:
        for i, key in enumerate(keys):
            peer.request(i + 1, KV_ID, "exists", {"key": key})
        answers = dict([(f.request_id, body) for f, body in [await peer.read_response() for _ in keys]])
    return [bool(answers[i + 1]) for i in range(len(keys))]


async def closed_within(peer: RawPeer, seconds: float) -> bool:
    try:
        await peer.wait_closed(seconds)
    except TimeoutError:
        return False
    return True


def bulk_frame(kind: int, request_id: int, bulk_id: bytes, size: int, offset: int = 0) -> bytes:
    return encode_frame(kind, request_id, pack_body([bulk_id, offset, size]))


# == Must show 1: memory before trust is bounded by what was received ===========================================


@uvloop_test
async def test_idle_connections_and_announced_bodies_cost_what_was_received(
    farm: dict[str, ServerProcess], figures: Any
) -> None:
    """Rows 1 and 3: 1,000 idle (handshaken) connections, then 50 connections announcing a 4 MiB HELLO before
    the handshake and 50 announcing a 4 MiB request after it, 100 bytes of body each: the server grows by at
    most 64 MiB, gives it back when they close, and a good client's calls answer within 100 ms throughout."""
    server = farm["mem"]
    n_idle, n_announce = 1000, scaled(50, 100)
    with GoodClient(server, SECRET) as good:
        before = await settled_rss(server.pid)
        idle: list[RawPeer] = []
        for _ in range(n_idle // 100):
            idle += await asyncio.gather(*(raw(server, secret=SECRET) for _ in range(100)))
        announcers: list[RawPeer] = []
        for i in range(n_announce):
            peer = await raw(server, handshake=False)
            await peer.read_frame()  # the server's HELLO
            peer.send(encode_header(Kind.HELLO, 0, 4 * MIB - 1) + b"\x81" + b"x" * 99)
            announcers.append(peer)
            peer = await raw(server, secret=SECRET)
            peer.send(encode_header(Kind.REQUEST, i + 1, 4 * MIB - 1, provider_id=0, rpc=rpc_id("status")) + b"x" * 100)
            announcers.append(peer)
        held = await settled_rss(server.pid) - before
        for peer in idle + announcers:
            await peer.close()
        returned = await settled_rss(server.pid) - before
    figures.record(
        f"outside: {n_idle} idle + {2 * n_announce} announced 4 MiB bodies, server growth", held / MIB, "MiB"
    )
    figures.record("outside: ... after they closed", returned / MIB, "MiB")
    figures.record("outside: ... good client's worst call", good.result["max_ms"], "ms")
    assert held <= 64 * MIB
    assert returned <= 16 * MIB
    assert not good.result["failures"], good.result
    assert good.result["max_ms"] <= 100.0, good.result


@pytest.mark.parametrize("kind", [Kind.HELLO, Kind.GOODBYE], ids=["hello", "goodbye"])
@uvloop_test
async def test_pre_authentication_bodies_cost_what_was_received(
    farm: dict[str, ServerProcess], figures: Any, kind: Kind
) -> None:
    """A peer that knows no secret sends one HELLO (or GOODBYE) whose body is a msgpack array of empty arrays:
    the server's peak growth stays within 16 MiB of the bytes received and it drops the peer at once, while a
    good client keeps answering within 100 ms."""
    server = farm[f"preauth_{kind.name.lower()}"]
    n = scaled(1, 4) * MIB - 16
    body = b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n
    before = await settled_rss(server.pid)
    with GoodClient(server, SECRET) as good, PeakRSS(server) as peak:
        peer = await raw(server, handshake=False)
        await peer.read_frame()
        t0 = time.perf_counter()
        peer.send(encode_frame(kind, 0, body))
        await peer.wait_closed(60.0)
        dropped = time.perf_counter() - t0
        await peer.close()
    growth = peak.peak - before
    figures.record(f"outside: pre-auth {kind.name} of {len(body) / MIB:.0f} MiB, peak growth", growth / MIB, "MiB")
    figures.record(f"outside: pre-auth {kind.name}, time to drop", dropped, "s")
    figures.record(f"outside: pre-auth {kind.name}, good client's worst call", good.result["max_ms"], "ms")
    assert growth <= len(body) + 16 * MIB
    assert good.result["max_ms"] <= 100.0


@uvloop_test
async def test_partial_frame_behind_a_complete_one_meets_the_frame_deadline(
    farm: dict[str, ServerProcess], figures: Any
) -> None:
    """One write: a complete request, then the header and 10 bytes of a 4 MiB request, then nothing. The server
    (frame timeout 1 s) answers the first and drops the connection within 2.5 s."""
    server = farm["plain"]
    async with await raw(server) as peer:
        t0 = time.perf_counter()
        whole = encode_frame(Kind.REQUEST, 1, pack_body(None), rpc=rpc_id("status"))
        partial = encode_header(Kind.REQUEST, 2, 4 * MIB - 100, rpc=rpc_id("status")) + b"x" * 10
        peer.send(whole + partial)
        frame, _ = await peer.read_response()
        assert frame.status == Status.OK
        dropped = await closed_within(peer, 2.5)
        figures.record("outside: partial frame behind a complete one, open after", time.perf_counter() - t0, "s")
    assert dropped


@uvloop_test
async def test_trickled_frames_are_dropped_at_their_deadline(farm: dict[str, ServerProcess], figures: Any) -> None:
    """Row 2: a byte of an unfinished frame every 0.45 s after the handshake, every 0.95 s (just under the 1 s
    frame timeout), and a HELLO trickled before it (2 s handshake timeout): each connection is dropped within
    its timeout plus a quarter (the sweep) plus 0.5 s."""
    server = farm["plain"]

    async def trickle(handshake: bool, every: float) -> float:
        peer = await raw(server, handshake=handshake)
        if not handshake:
            await peer.read_frame()
        head = encode_header(Kind.HELLO if not handshake else Kind.REQUEST, 1, 4 * MIB - 1, rpc=rpc_id("status"))
        t0 = time.perf_counter()
        try:
            for byte in head + b"x" * 100:
                peer.send(bytes([byte]))
                if await closed_within(peer, every):
                    return time.perf_counter() - t0
            return float("inf")
        finally:
            await peer.close()

    fast, slow, pre = await asyncio.gather(trickle(True, 0.45), trickle(True, 0.95), trickle(False, 0.5))
    figures.record("outside: trickle every 0.45 s, dropped after (frame timeout 1 s)", fast, "s")
    figures.record("outside: trickle every 0.95 s, dropped after (frame timeout 1 s)", slow, "s")
    figures.record("outside: HELLO trickled, dropped after (handshake timeout 2 s)", pre, "s")
    assert fast <= 1.75 and slow <= 1.75 + 0.95
    assert pre <= 3.0


@uvloop_test
async def test_receive_buffers_shrink_back_when_idle(farm: dict[str, ServerProcess], figures: Any) -> None:
    """Connections that each sent one 250 KB request (to an RPC that does not exist), read the answer and went
    idle cost the server at most 64 KiB each (the issue's 1,000 idle connections in 64 MiB)."""
    server = farm["bufkeep"]
    n, size = scaled(400, 1000), 250_000
    before = await settled_rss(server.pid)
    peers = []
    for _ in range(n // 50):
        batch = await asyncio.gather(*(raw(server) for _ in range(50)))
        for peer in batch:
            peer.request(1, 0, "no_such_rpc", body=b"\xc6" + size.to_bytes(4, "big") + b"x" * size)
        for peer in batch:
            frame, _ = await peer.read_response()
            assert frame.status == Status.NO_SUCH_RPC
        peers += batch
    per_connection = (await settled_rss(server.pid) - before) / n
    for peer in peers:
        await peer.close()
    figures.record("outside: idle connection after one 250 KB frame", per_connection / 1024, "KiB")
    assert per_connection <= 64 * 1024


@uvloop_test
async def test_flood_of_handshakeless_connections_never_locks_out_a_client(
    farm: dict[str, ServerProcess], figures: Any
) -> None:
    """Row 4 at a 1,024-descriptor limit, with a secret: 1,100 connections that never say HELLO; a good client
    still gets in (within one handshake timeout, in fact at once) and the server stays under its limit."""
    server = farm["flood_secret"]
    host, _, port = server.address[len("tcp://") :].rpartition(":")
    flood = []
    try:
        for _ in range(1100):
            flood.append(socket.create_connection((host, int(port))))
        t0 = time.perf_counter()
        async with Engine(None, secret=SECRET) as good:
            await good.call(server.address, "status", provider_id=0, timeout_seconds=10.0)
        first_call = time.perf_counter() - t0
        fds = psutil.Process(server.pid).num_fds()
    finally:
        for sock in flood:
            sock.close()
    figures.record("outside: 1,100 handshakeless connections at 1,024 fds, good client's first call", first_call, "s")
    figures.record("outside: ... server descriptors", fds, "")
    assert first_call <= 10.0
    assert fds < 1024


@uvloop_test
async def test_flood_with_calls_in_flight_from_one_address_never_locks_out_a_client(
    farm: dict[str, ServerProcess], figures: Any
) -> None:
    """Row 4 without a secret, at a 1,024-descriptor limit: one address (127.0.0.2) opens 1,000 connections and
    keeps a kv ``put_bulk`` in flight on each (it never answers the server's pull). A client from another
    address (127.0.0.1) is still served."""
    server = farm["flood_inflight"]
    flood: list[RawPeer] = []
    held = 0
    try:
        for i in range(1000):
            try:
                peer = await raw(server, local_host="127.0.0.2", engine_id=f"flood{i}")
            except (AssertionError, ConnectionError, asyncio.IncompleteReadError):
                break  # refused: the server is full
            flood.append(peer)
            handle = [None, f"flood{i}", secrets.token_bytes(16), 1024, "r"]
            peer.request(1, KV_ID, "put_bulk", {"key": f"k{i}", "bulk": handle}, deadline_usec=0)
        for peer in flood:
            if (await peer.read_frame()).kind == Kind.BULK_PULL:
                held += 1
        try:
            async with Engine(None, secret=None) as good:
                await good.call(server.address, "status", provider_id=0, timeout_seconds=5.0)
            outcome = "served"
        except ConnectionLost as exc:
            outcome = f"refused: {exc}"
    finally:
        for peer in flood:
            await peer.close()
    figures.record("outside: connections one address held with a call in flight", held, "")
    assert outcome == "served", outcome


@uvloop_test
async def test_reusing_one_request_id_does_not_bypass_the_in_flight_cap(
    farm: dict[str, ServerProcess], figures: Any
) -> None:
    """One connection sends 5,000 kv ``put_bulk`` calls that all carry request id 1 and never answers the pulls:
    at most max_inflight_per_connection (1,024) plus one received batch of handlers run at once (svcframe
    drops the connection at the first reused id: a protocol error)."""
    server = farm["same_id"]
    n = scaled(5000, 20000)
    before = await settled_rss(server.pid)
    dropped = False
    async with await raw(server, engine_id="reuser") as peer:
        try:
            for i in range(n):
                handle = [None, "reuser", secrets.token_bytes(16), MIB, "r"]
                peer.request(1, KV_ID, "put_bulk", {"key": "k", "bulk": handle}, deadline_usec=5_000_000)
                if i % 1000 == 999:
                    await peer.writer.drain()
            await peer.wait_closed(timeout_seconds=5.0)
            dropped = True
        except (ConnectionError, TimeoutError):
            dropped = not isinstance(sys.exc_info()[1], TimeoutError)
        _, stats = await call(server, 0, "statistics", {})
        growth = await settled_rss(server.pid) - before
    running = stats["handlers_running"]
    figures.record(f"outside: {n} calls reusing request id 1, handlers running", running, "")
    figures.record(f"outside: {n} calls reusing request id 1, server growth", growth / MIB, "MiB")
    figures.record(f"outside: {n} calls reusing request id 1, connection dropped", dropped, "")
    assert running <= 1024 + 512


# == Must show 2: bulk handles are capabilities =================================================================


@uvloop_test
async def test_bulk_handles_are_unguessable_bound_and_revocable(farm: dict[str, ServerProcess], figures: Any) -> None:
    """Row 5 and "HELLO claiming another engine's id then a bulk pull": handle ids are 128 random bits; small
    sequential ids (bytes or integers) read and write nothing; a handle bound to a server is refused to a peer
    that claims that server's engine id and address in its HELLO; an unbound handle works for whoever holds it
    until ``unexpose``."""
    victim, plain = farm["victim"], farm["plain"]
    status, ids = await call(victim, VICTIM_ID, "handles", 1000)
    assert status == Status.OK
    assert len(set(ids)) == 1000 and {len(i) for i in ids} == {16}
    assert len({i[:4] for i in ids}) == 1000  # no counter, no shared prefix
    figures.record("outside: bulk id bits", 8 * len(ids[0]), "bits")

    async with await raw(victim) as peer:  # guesses, as 16-byte ids
        for n in range(256):
            peer.send(bulk_frame(Kind.BULK_PULL, 2 * n + 1, bytes(15) + bytes([n]), 16))
            peer.send(bulk_frame(Kind.BULK_PUSH, 2 * n + 2, bytes(15) + bytes([n]), 0))
        kinds = {(await peer.read_frame()).kind for _ in range(512)}
        assert kinds == {Kind.RESPONSE}  # refusals only: no BULK_DATA_REPLY
    async with await raw(victim) as peer:  # guesses, as the small integers of old
        peer.send(encode_frame(Kind.BULK_PULL, 1, pack_body([1, 0, 16])))
        answer = await peer.read_frame()
        assert (answer.kind, answer.status) == (Kind.RESPONSE, Status.BAD_REQUEST)
        assert await closed_within(peer, 5.0)

    _, stats = await call(plain, 0, "statistics", {})
    plain_id = stats["engine_id"]
    status, bound = await call(
        victim, VICTIM_ID, "expose", {"size": 64, "mode": "rw", "peer": plain.address, "fill": 1}
    )
    assert status == Status.OK, bound
    async with await raw(victim, engine_id=plain_id, peer_address=plain.address) as claimant:
        claimant.send(bulk_frame(Kind.BULK_PULL, 1, bound[2], 64))
        claimant.send(bulk_frame(Kind.BULK_PUSH, 2, bound[2], 64) + encode_frame(Kind.BULK_DATA_PUSH, 2, b"\xee" * 64))
        answers = [await claimant.read_frame() for _ in range(2)]
    assert [(f.kind, f.status) for f in answers] == [(Kind.RESPONSE, Status.BULK_ERROR)] * 2
    assert (await call(victim, VICTIM_ID, "content", bound))[1] == b"\x01" * 64

    status, leaked = await call(victim, VICTIM_ID, "expose", {"size": 64, "mode": "r", "fill": 2})
    async with await raw(victim) as holder:
        holder.send(bulk_frame(Kind.BULK_PULL, 1, leaked[2], 64))
        assert (await holder.read_frame()).body == b"\x02" * 64  # a capability: whoever holds it
        await call(victim, VICTIM_ID, "unexpose", leaked)
        holder.send(bulk_frame(Kind.BULK_PULL, 2, leaked[2], 64))
        frames = [await holder.read_frame() for _ in range(2)]
        assert frames[1].kind == Kind.RESPONSE and frames[1].status == Status.BULK_ERROR


@uvloop_test
async def test_no_confused_deputy_through_kv_put_bulk(farm: dict[str, ServerProcess], figures: Any) -> None:
    """Row 6: an attacker hands the kv provider a (leaked) handle of another engine: the server refuses, stores
    nothing and never dials the victim."""
    victim, plain = farm["victim"], farm["plain"]

    async def connections() -> int:  # the victim's, counting the one asking
        _, stats = await call(victim, 0, "statistics", {})
        return int(stats["connections"])

    _, handle = await call(victim, VICTIM_ID, "expose", {"size": 4096, "mode": "r", "fill": 0x41})
    before = await connections()
    status, body = await call(plain, KV_ID, "put_bulk", {"key": "deputy", "bulk": handle})
    dialled = await connections() - before
    figures.record("outside: connections the deputy opened to the victim", dialled, "")
    assert status == Status.BULK_ERROR and "not to the caller" in str(body), (status, body)
    assert not await stored(plain, "deputy")
    assert dialled == 0


@uvloop_test
async def test_hello_claiming_another_engines_id_gets_none_of_its_bulk_traffic(
    farm: dict[str, ServerProcess], figures: Any
) -> None:
    """Row 7: an attacker connects saying HELLO with a real client's engine id and address, and answers any pull
    it is sent. The client then stores a value large enough to travel by bulk: the server pulls it from the
    client, the attacker is asked for nothing, and the stored value is the client's."""
    from providers.kv import KVClient

    server = farm["plain"]
    async with Engine("tcp://127.0.0.1:0", secret=None) as client:
        attacker = await raw(server, engine_id=client.engine_id, peer_address=client.address)
        pulls = 0

        async def answer_pulls() -> None:
            nonlocal pulls
            while True:
                frame = await attacker.read_frame(60.0)
                if frame.kind == Kind.BULK_PULL:
                    pulls += 1
                    _, _, size = unpack_body(frame.body)  # type: ignore[misc]
                    attacker.send(encode_frame(Kind.BULK_DATA_REPLY, frame.request_id, b"\x66" * size))
                    attacker.send(encode_frame(Kind.RESPONSE, frame.request_id, b""))

        answering = asyncio.create_task(answer_pulls())
        try:
            value = secrets.token_bytes(512 * 1024)
            store = KVClient(client, server.address, KV_ID)
            await store.put("claimed", value)
            got = await store.get("claimed")
        finally:
            answering.cancel()
            with contextlib.suppress(asyncio.CancelledError, asyncio.IncompleteReadError):
                await answering
            await attacker.close()
    figures.record("outside: pulls sent to the engine-id claimant", pulls, "")
    assert pulls == 0
    assert got == value


@uvloop_test
async def test_forged_bulk_sizes_allocate_nothing_before_the_owner_answers(
    farm: dict[str, ServerProcess], figures: Any
) -> None:
    """Row 8: 4 kv ``put_bulk`` claiming 256 MiB and 4 self-test ``work`` pulls claiming 1 GiB, whose pulls the
    attacker never answers, plus 4 claims over ``max_value_bytes``: the server grows by at most 16 MiB."""
    server = farm["forged"]
    before = await settled_rss(server.pid)
    async with await raw(server, engine_id="forger") as peer:
        for i in range(4):
            handle = [None, "forger", secrets.token_bytes(16), 256 * MIB, "r"]
            peer.request(10 + i, KV_ID, "put_bulk", {"key": f"f{i}", "bulk": handle}, deadline_usec=0)
            handle = [None, "forger", secrets.token_bytes(16), 1 << 30, "r"]
            peer.request(20 + i, SELFTEST_ID, "work", [0, "pull", handle, b""], deadline_usec=0)
            handle = [None, "forger", secrets.token_bytes(16), 512 * MIB, "r"]
            peer.request(30 + i, KV_ID, "put_bulk", {"key": f"g{i}", "bulk": handle}, deadline_usec=0)
        kinds = [(await peer.read_frame()).kind for _ in range(12)]
        growth = await settled_rss(server.pid) - before
    figures.record("outside: 12 forged bulk sizes (2.5 GiB claimed), server growth", growth / MIB, "MiB")
    assert kinds.count(Kind.BULK_PULL) == 8 and kinds.count(Kind.RESPONSE) == 4
    assert growth <= 16 * MIB


@uvloop_test
async def test_blob_put_allocates_nothing_before_the_owner_answers(
    farm: dict[str, ServerProcess], figures: Any
) -> None:
    """Row 8 for the blob provider: 50 ``put`` calls claiming 512 MiB each, whose pulls are never answered: the
    server grows by at most 16 MiB and 8 descriptors."""
    server = farm["blob"]
    n = scaled(50, 100)
    before, fds = await settled_rss(server.pid), psutil.Process(server.pid).num_fds()
    async with await raw(server, engine_id="forger") as peer:
        for i in range(n):
            handle = [None, "forger", secrets.token_bytes(16), 512 * MIB, "r"]
            peer.request(i + 1, BLOB_ID, "put", {"name": f"b{i}", "bulk": handle}, deadline_usec=5_000_000)
        for _ in range(n):
            assert (await peer.read_frame()).kind == Kind.BULK_PULL
        growth = await settled_rss(server.pid) - before
        more_fds = psutil.Process(server.pid).num_fds() - fds
    figures.record(f"outside: {n} blob puts never answered, server growth", growth / MIB, "MiB")
    figures.record(f"outside: {n} blob puts never answered, descriptors", more_fds, "")
    assert growth <= 16 * MIB
    assert more_fds <= 8


@uvloop_test
async def test_selftest_responses_are_not_kept_per_size(farm: dict[str, ServerProcess], figures: Any) -> None:
    """Row 8 for the self-test's response sizes: 1,000 ``work`` calls, each naming another response size, leave
    the server at most 16 MiB larger."""
    server = farm["st_responses"]
    n = scaled(1000, 4000)
    before = await settled_rss(server.pid)
    async with await raw(server) as peer:
        for i in range(n):
            peer.request(i + 1, SELFTEST_ID, "work", [120_000 + i, None, None, b""])
            frame, _ = await peer.read_response()
            assert frame.status == Status.OK
    growth = await settled_rss(server.pid) - before
    figures.record(f"outside: {n} self-test response sizes, server growth", growth / MIB, "MiB")
    assert growth <= 16 * MIB


@uvloop_test
async def test_selftest_storage_reads_keep_no_buffers(farm: dict[str, ServerProcess], figures: Any) -> None:
    """Four self-test ``storage`` reads of four block sizes leave the server at most 64 MiB larger."""
    server = farm["st_storage"]
    block = scaled(64, 256) * MIB
    before = await settled_rss(server.pid)
    async with await raw(server) as peer:
        for i in range(4):
            peer.request(i + 1, SELFTEST_ID, "storage", ["read", block - 4096 * i, False], deadline_usec=0)
            frame, _ = await peer.read_response(60.0)
            assert frame.status == Status.OK
    growth = await settled_rss(server.pid) - before
    figures.record(f"outside: 4 self-test storage reads of {block // MIB} MiB, kept", growth / MIB, "MiB")
    assert growth <= 64 * MIB


# == Must show 3: mutual, bound authentication ==================================================================


@uvloop_test
async def test_a_relay_at_a_stale_address_gets_nowhere(farm: dict[str, ServerProcess], figures: Any) -> None:
    """Row 11: a byte relay (both directions) in front of the real server, dialled by a client with the secret:
    the handshake fails and the client's write never reaches the store."""
    server = farm["auth"]
    host, _, port = server.address[len("tcp://") :].rpartition(":")
    relayed = 0

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal relayed
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                relayed += len(data)
                writer.write(data)
        writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    relay_server = await asyncio.start_server(relay, "127.0.0.1", 0)
    stale = f"tcp://127.0.0.1:{relay_server.sockets[0].getsockname()[1]}"
    try:
        async with Engine(None, secret=SECRET) as client:
            with pytest.raises(AuthenticationFailed):
                await client.call(stale, "put", {"key": "relayed", "value": b"x"}, provider_id=KV_ID, timeout_seconds=5)
    finally:
        relay_server.close()
        await relay_server.wait_closed()
    figures.record("outside: bytes relayed before the handshake failed", relayed, "B")
    assert not await stored(server, "relayed", SECRET)


@pytest.mark.parametrize("rewrite_via", [False, True], ids=["as-sent", "via-rewritten"])
@uvloop_test
async def test_a_relay_that_forwards_the_servers_nonce_gets_nowhere(
    farm: dict[str, ServerProcess], figures: Any, rewrite_via: bool
) -> None:
    """An impostor opens a connection to the server, shows a client the server's own HELLO (its nonce and engine
    id) and passes the client's proof on, as sent or with ``via`` rewritten to the server's endpoint: the
    server refuses with UNAUTHENTICATED and runs nothing pipelined after it; the client never opens."""
    server = farm["auth"]
    upstream = await raw(server, handshake=False)
    server_hello_frame = await upstream.read_frame()
    server_hello = unpack_body(server_hello_frame.body)
    forwarded: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(encode_frame(Kind.HELLO, 0, pack_body(server_hello)))
        head = await reader.readexactly(HEADER_SIZE)
        hello = unpack_body(await reader.readexactly(HEADER.unpack(head)[6]))
        if rewrite_via:
            hello["via"] = upstream.remote_endpoint  # type: ignore[index]
        forwarded.set_result(encode_frame(Kind.HELLO, 0, pack_body(hello)))
        await reader.read()  # hold the client until it gives up
        writer.close()

    stale_server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    stale = f"tcp://127.0.0.1:{stale_server.sockets[0].getsockname()[1]}"
    try:
        async with Engine(None, secret=SECRET) as client:
            dial = asyncio.create_task(client.call(stale, "status", provider_id=0, timeout_seconds=1.0))
            upstream.send(await forwarded + put_frame(1, f"nonce-relay-{rewrite_via}"))
            answer = await upstream.read_frame()
            with pytest.raises((DeadlineExceeded, ConnectionLost)):
                await dial
    finally:
        await upstream.close()
        stale_server.close()
        await stale_server.wait_closed()
    figures.record(f"outside: nonce relay ({'via rewritten' if rewrite_via else 'as sent'}), server's answer",
                   Kind(answer.kind).name, "")  # fmt: skip
    assert (answer.kind, answer.status) == (Kind.GOODBYE, Status.UNAUTHENTICATED)
    assert not await stored(server, f"nonce-relay-{rewrite_via}", SECRET)


@uvloop_test
async def test_a_replayed_client_hello_is_refused(farm: dict[str, ServerProcess]) -> None:
    """A client HELLO captured from a good connection (same server, same endpoint) replayed on a new one, with a
    write pipelined behind it: refused, and the write does not run."""
    server = farm["auth"]
    async with await raw(server, secret=SECRET) as good:
        captured = good.hello_reply(SECRET)
    async with await raw(server, handshake=False) as replay:
        await replay.read_frame()
        replay.send(captured + put_frame(1, "replayed"))
        answer = await replay.read_frame()
        assert (answer.kind, answer.status) == (Kind.GOODBYE, Status.UNAUTHENTICATED)
        assert await closed_within(replay, 5.0)
    assert not await stored(server, "replayed", SECRET)


IMPOSTORS = ["no-auth", "wrong-proof", "response-instead-of-proof", "proof-for-another-endpoint", "silent"]


@pytest.mark.parametrize("behaviour", IMPOSTORS)
@uvloop_test
async def test_an_impostor_server_gets_no_request_from_a_secret_holding_client(figures: Any, behaviour: str) -> None:
    """A server impostor at a stale address, towards a client with the secret: it never proves the secret, so
    the client fails (AuthenticationFailed, or its deadline when the impostor is silent) and sends it nothing
    after its HELLO."""
    received: list[int] = []
    nonce = secrets.token_bytes(16)

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = {"engine_id": "impostor", "address": None, "nonce": nonce, "auth": behaviour != "no-auth",
                 "max_body_bytes": 4 * MIB, "cma": False}  # fmt: skip
        writer.write(encode_frame(Kind.HELLO, 0, pack_body(hello)))
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            head = HEADER.unpack(await reader.readexactly(HEADER_SIZE))
            client = unpack_body(await reader.readexactly(head[6]))
            received.append(head[2])
            if behaviour == "wrong-proof":
                writer.write(encode_frame(Kind.HELLO, 0, pack_body({"mac": bytes(32)})))
            elif behaviour == "response-instead-of-proof":
                writer.write(encode_frame(Kind.RESPONSE, 1, pack_body(None)))
            elif behaviour == "proof-for-another-endpoint":
                mac = auth_mac(SECRET, "server", nonce, client["nonce"], "impostor", client["engine_id"], "10.0.0.1:1")
                writer.write(encode_frame(Kind.HELLO, 0, pack_body({"mac": mac})))
            while True:
                head = HEADER.unpack(await reader.readexactly(HEADER_SIZE))
                await reader.readexactly(head[6])
                received.append(head[2])
        writer.close()

    stale_server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    stale = f"tcp://127.0.0.1:{stale_server.sockets[0].getsockname()[1]}"
    try:
        async with Engine(None, secret=SECRET) as client:
            expected = DeadlineExceeded if behaviour == "silent" else ConnectionLost  # AuthenticationFailed is one
            with pytest.raises(expected):
                await client.call(stale, "put", {"key": "k", "value": b"v"}, provider_id=KV_ID, timeout_seconds=1.0)
    finally:
        stale_server.close()
        await stale_server.wait_closed()
    figures.record(f"outside: impostor ({behaviour}), frames it got from the client", len(received), "")
    assert received in ([], [Kind.HELLO])


def _run_cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "svcframe", *args], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _one_line_errors(runs: dict[str, subprocess.Popen[bytes]], timeout: float = 60.0) -> dict[str, str]:
    """Wait for every run; each must exit non-zero with exactly one line on stderr and no traceback."""
    out = {}
    for name, proc in runs.items():
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"{name}: still running after {timeout:g} s")
        lines = [line for line in err.decode().splitlines() if line.strip()]
        assert proc.returncode != 0, f"{name}: exit 0"
        assert len(lines) == 1 and "Traceback" not in err.decode(), f"{name}: {err.decode()}"
        out[name] = lines[0]
    return out


def test_empty_or_short_secrets_are_refused_everywhere(farm: dict[str, ServerProcess], tmp_path: Path) -> None:
    """Row 12: an empty, newline-only, blank or 15-byte secret from a file, the environment or the config is one
    clear error everywhere (server and client command line, the Engine itself); a world-readable secret file
    is a warning."""
    from svcframe.server import read_secret_file

    (tmp_path / "c.json").write_text("{}")
    files = {"empty": b"", "newline": b"\n", "blank": b" \t \r\n", "short": b"0123456789abcde\n"}
    for name, data in files.items():
        (tmp_path / f"{name}.secret").write_bytes(data)
        with pytest.raises(ConfigError):
            read_secret_file(str(tmp_path / f"{name}.secret"))
    (tmp_path / "blank.json").write_text(json.dumps({"engine": {"auth": {"secret_file": "blank.secret"}}}))
    env = server_env(None)
    runs = {f"serve --secret-file {n}": _run_cli("serve", "c.json", "--secret-file", f"{n}.secret", env=env,
                                                 cwd=tmp_path) for n in ("newline", "short")}  # fmt: skip
    runs["config auth.secret_file blank"] = _run_cli("serve", "blank.json", env=env, cwd=tmp_path)
    runs["serve, SVCFRAME_SECRET=''"] = _run_cli("serve", "c.json", env={**env, "SVCFRAME_SECRET": ""}, cwd=tmp_path)
    short = {**env, "SVCFRAME_SECRET": "0123456789abcde"}
    runs["status, SVCFRAME_SECRET short"] = _run_cli("status", farm["auth"].address, env=short, cwd=tmp_path)
    for name, line in _one_line_errors(runs).items():
        assert "secret" in line, f"{name}: {line}"
    for value in (b"", b"\n", b" " * 32, b"0123456789abcde"):
        with pytest.raises(ConfigError):
            Engine(None, secret=value)
    assert "can be read by other users" in farm["auth"].log()


# == Must show 4: expensive reads are bounded ===================================================================


@uvloop_test
async def test_query_expressions_of_the_limit_keep_nothing(farm: dict[str, ServerProcess], figures: Any) -> None:
    """Row 9: 300 distinct expressions of 4,096 characters leave at most 16 MiB in the server (the parse cache);
    one character more is refused."""
    server = farm["query"]
    n = scaled(300, 1000)
    before = await settled_rss(server.pid)
    async with await raw(server) as peer:
        for i in range(n):
            expression = f"engine.address || '{i:06d}{'x' * 4000}'"
            expression += " " * (4096 - len(expression))
            peer.request(i + 1, 0, "query_config", expression)
            frame, body = await peer.read_response()
            assert frame.status == Status.OK, body
        peer.request(99999, 0, "query_config", "@" + " " * 4096)
        frame, _ = await peer.read_response()
    growth = await settled_rss(server.pid) - before
    figures.record(f"outside: {n} distinct 4,096-character queries, server growth", growth / MIB, "MiB")
    assert frame.status != Status.OK
    assert growth <= 16 * MIB


@uvloop_test
async def test_short_query_expressions_cannot_stall_the_server(farm: dict[str, ServerProcess], figures: Any) -> None:
    """A query of under 100 characters is answered (or refused) within 0.5 s and a good client's calls keep
    answering within 100 ms."""
    server = farm["query_stall"]
    stages = scaled(15, 17)
    expression = "|".join(["[@,@]"] * stages)
    with GoodClient(server, None) as good:
        async with await raw(server) as peer:
            t0 = time.perf_counter()
            peer.request(1, 0, "query_config", expression, deadline_usec=0)
            await peer.read_response(120.0)
            took = time.perf_counter() - t0
    figures.record(f"outside: query of {len(expression)} characters, answered after", took, "s")
    figures.record(f"outside: query of {len(expression)} characters, good client's worst call",
                   good.result["max_ms"], "ms")  # fmt: skip
    assert took <= 0.5
    assert good.result["max_ms"] <= 100.0


@uvloop_test
async def test_statistics_do_not_grow_with_caller_chosen_parents(farm: dict[str, ServerProcess], figures: Any) -> None:
    """5,000 calls of one RPC, each claiming another parent RPC id and parent provider id: the server keeps at
    most svcframe.monitoring.MAX_TARGET_RECORDS (4,096) records and their "other" records, grows by at most
    16 MiB, and its statistics stay readable."""
    server = farm["stats_parent"]
    n = scaled(5000, 20000)
    before = await settled_rss(server.pid)
    async with await raw(server) as peer:
        noop = pack_body([0, None, None, b""])
        for i in range(n):
            peer.send(encode_frame(Kind.REQUEST, i + 1, noop, provider_id=SELFTEST_ID, rpc=rpc_id("work"),
                                   parent_rpc=i + 1, parent_provider_id=i % 65535))  # fmt: skip
            if i % 500 == 499:
                for _ in range(500):
                    await peer.read_response()
        growth = await settled_rss(server.pid) - before
        peer.request(n + 1, 0, "statistics", {})
        frame, stats = await peer.read_response()
    records = len(stats["rpcs"]["target"]) if frame.status == Status.OK else -1
    figures.record(f"outside: {n} calls with chosen parents, server growth", growth / MIB, "MiB")
    figures.record(f"outside: {n} calls with chosen parents, statistics records", records, "")
    assert 0 <= records <= MAX_TARGET_RECORDS + 2
    assert growth <= 16 * MIB


@uvloop_test
async def test_client_churn_does_not_grow_statistics(farm: dict[str, ServerProcess], figures: Any) -> None:
    """Row 10 and its variants: short connections with one call each (tcp), 20,000 calls to RPCs and providers
    that do not exist, and 1,100 unix-socket peers each claiming another address: the statistics keep at most
    1,025 records per table and the servers grow by at most 16 MiB (churn) and 32 MiB (claimed addresses)."""
    churn, local = farm["stats_churn"], farm["stats_unix"]

    async def one() -> None:
        async with await raw(churn) as peer:
            peer.request(1, SELFTEST_ID, "work", [0, None, None, b""])
            await peer.read_response()

    before = await settled_rss(churn.pid, within=4.0)
    for _ in range(scaled(600, 3000) // 50):
        await asyncio.gather(*(one() for _ in range(50)))
    async with await raw(churn) as peer:
        for i in range(scaled(20000, 100000)):
            peer.send(encode_frame(Kind.REQUEST, i + 1, b"", provider_id=i % 7, rpc=i * 7919 + 1))
            if i % 1000 == 999:
                for _ in range(1000):
                    await peer.read_response()
    churn_growth = await settled_rss(churn.pid, within=4.0) - before

    before = await settled_rss(local.pid, within=4.0)
    await claim_peer_labels(local)
    local_growth = await settled_rss(local.pid, within=4.0) - before
    (_, churn_stats), (_, local_stats) = await call(churn, 0, "statistics", {}), await call(local, 0, "statistics", {})
    records = [len(churn_stats["rpcs"]["target"]), len(local_stats["rpcs"]["target"])]
    figures.record("outside: short connections + unknown RPCs, server growth", churn_growth / MIB, "MiB")
    figures.record("outside: 1,100 claimed addresses over unix, server growth", local_growth / MIB, "MiB")
    figures.record("outside: statistics records (churn, claimed)", str(records), "")
    assert records[0] <= 4 and records[1] <= 1025 + 2
    assert churn_growth <= 16 * MIB and local_growth <= 32 * MIB


async def claim_peer_labels(server: ServerProcess, n: int = 1100) -> None:
    """``n`` short connections, each claiming another listening address in its HELLO, one call each."""

    async def claim(k: int) -> None:
        async with await raw(server, peer_address=f"tcp://10.9.{k // 250}.{k % 250}:1") as peer:
            peer.request(1, SELFTEST_ID, "work", [0, None, None, b""])
            await peer.read_response()

    for base in range(0, n, 50):
        await asyncio.gather(*(claim(base + k) for k in range(50)))


@uvloop_test
async def test_statistics_reads_are_cheap_after_peers_fill_the_labels(
    farm: dict[str, ServerProcess], figures: Any
) -> None:
    """After 1,100 peers that claimed as many addresses, three ``statistics`` calls in a row keep a good client's
    calls within 100 ms."""
    server = farm["stats_unix"]
    await claim_peer_labels(server)
    with GoodClient(server, None) as good:
        async with await raw(server) as peer:
            t0 = time.perf_counter()
            for i in range(3):
                peer.request(i + 1, 0, "statistics", {})
                await peer.read_response()
            each = (time.perf_counter() - t0) / 3
    figures.record("outside: one statistics call with the peer labels full", each * 1e3, "ms")
    figures.record("outside: good client's worst call meanwhile", good.result["max_ms"], "ms")
    assert good.result["max_ms"] <= 100.0


# == Must show 5: honest deadline statuses ======================================================================


@uvloop_test
async def test_dropped_means_the_write_did_not_happen(farm: dict[str, ServerProcess], figures: Any) -> None:
    """Row 14: 300 kv puts with deadlines from 1 µs to 5 ms, pipelined: every one answered DROPPED was not
    applied (a caller may safely resend it); DEADLINE_EXCEEDED says the outcome is unknown."""
    server = farm["plain"]
    deadlines = [1, 10, 50, 100, 200, 500, 1000, 2000, 5000]
    n = scaled(300, 3000)
    statuses: dict[int, int] = {}
    async with await raw(server) as peer:
        peer.send(b"".join(put_frame(i + 1, f"deadline-{i}", deadline_usec=deadlines[i % 9]) for i in range(n)))
        for _ in range(n):
            frame, _ = await peer.read_response()
            statuses[frame.request_id] = frame.status
    present = await stored_many(server, [f"deadline-{i}" for i in range(n)])
    lies = [i for i in range(n) if statuses[i + 1] == Status.DROPPED and present[i]]
    lost = [i for i in range(n) if statuses[i + 1] == Status.OK and not present[i]]
    counts = {Status(s).name: list(statuses.values()).count(s) for s in set(statuses.values())}
    figures.record("outside: puts with 1 µs-5 ms deadlines, answers", json.dumps(counts, sort_keys=True), "")
    figures.record("outside: puts answered DROPPED that were applied", len(lies), "")
    assert not lies and not lost


def test_every_provider_says_which_rpcs_are_safe_to_retry() -> None:
    """Must show 5: the docs of every shipped provider say which of their RPCs are safe to retry."""
    import providers.blob
    import providers.kv
    import selftest.provider
    import svcframe.admin

    for module in (providers.kv, providers.blob, selftest.provider, svcframe.admin):
        doc = module.__doc__ or ""
        assert re.search(r"Retries.*safe to re(try|peat)", doc, re.S), module.__name__


# == Must show 6: operator safety ===============================================================================


def test_unix_addresses_that_are_not_stale_sockets_are_refused_and_kept(tmp_path: Path, figures: Any) -> None:
    """Row 13: a unix address naming a regular file, a FIFO, a directory, a symlink to a live socket, a dangling
    symlink or a live socket is one clear error and everything is left as it was; a stale socket is
    replaced and served."""
    base = Path(tempfile.mkdtemp(prefix="sfu", dir="/tmp"))
    try:
        (base / "file").write_text("precious")
        os.mkfifo(base / "fifo")
        (base / "dir").mkdir()
        live = socket.socket(socket.AF_UNIX)
        live.bind(str(base / "live"))
        live.listen()
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(base / "stale"))
        stale.close()
        for link, target in (("to-live", "live"), ("dangling", "nothing")):
            os.symlink(base / target, base / link)
        before = {p.name: (os.lstat(p).st_mode, os.lstat(p).st_ino) for p in base.iterdir()}
        (tmp_path / "c.json").write_text("{}")
        env = server_env(None)
        names = ["file", "fifo", "dir", "to-live", "dangling", "live"]
        runs = {n: _run_cli("serve", "c.json", "--address", f"unix://{base / n}", env=env, cwd=tmp_path) for n in names}
        with ServerProcess.start({"engine": {"address": f"unix://{base / 'stale'}"}}, tmp_path, env=env) as served:
            assert stat.S_ISSOCK(os.lstat(base / "stale").st_mode) and served.alive()
            errors = _one_line_errors(runs)
        live.close()
        after = {p.name: (os.lstat(p).st_mode, os.lstat(p).st_ino) for p in base.iterdir() if p.name != "stale"}
        figures.record("outside: unix addresses refused and kept", len(errors), "")
        assert after == {k: v for k, v in before.items() if k != "stale"}
        assert (base / "file").read_text() == "precious"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(
    "provider_type",
    ["outside_hang_start", "outside_block_start"],
)
def test_a_provider_start_that_hangs_fails_the_start_up_in_bounded_time(
    tmp_path: Path, figures: Any, provider_type: str
) -> None:
    """Must show 6: a provider whose start() never returns makes the server fail its start-up after
    ``admin.provider_start_timeout_seconds`` (1 s here) with one clear error, and its address is free again."""
    path = Path(tempfile.mkdtemp(prefix="sfh", dir="/tmp")) / "s.sock"
    config = {"engine": {"address": f"unix://{path}"}, "admin": {"provider_start_timeout_seconds": 1.0},
              "libraries": ["hostile_outside_lib"], "providers": [{"name": "slow", "type": provider_type}]}  # fmt: skip
    server = ServerProcess.start(config, tmp_path, env=server_env(None), wait=False)
    t0 = time.perf_counter()
    try:
        with pytest.raises(AssertionError) as failed:
            server.wait_ready(3.5)
        took = time.perf_counter() - t0
        figures.record(f"outside: provider start that hangs ({provider_type}), start-up failed after", took, "s")
        assert "did not start within 1 s" in str(failed.value)
        assert not path.exists()
    finally:
        server.kill()
        shutil.rmtree(path.parent, ignore_errors=True)


def test_config_depth_and_size_are_config_errors(tmp_path: Path) -> None:
    """Also seen: a 100,000-deep config and a 17 MiB config are one-line config errors, never a RecursionError
    traceback; a 200-deep one is a config error naming where it nests."""
    from svcframe.config import parse_config

    (tmp_path / "deep.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    (tmp_path / "huge.json").write_text('{"libraries": [' + ",".join(['"x"'] * (17 * MIB // 4)) + "]}")
    env = server_env(None)
    runs = {name: _run_cli("serve", f"{name}.json", env=env, cwd=tmp_path) for name in ("deep", "huge")}
    errors = _one_line_errors(runs)
    assert "nest" in errors["deep"] and "MiB" in errors["huge"], errors
    with pytest.raises(ConfigError, match="nested more than"):
        parse_config(
            {"providers": [{"name": "x", "type": "kv", "config": {"deep": json.loads("[" * 200 + "]" * 200)}}]}
        )


@uvloop_test
async def test_tracebacks_and_statistics_reset_need_authentication(farm: dict[str, ServerProcess]) -> None:
    """Also seen: a failed handler's traceback (server source paths) goes only to an authenticated caller, and
    an unauthenticated caller cannot reset the statistics."""
    plain, auth = farm["plain"], farm["auth"]
    status, body = await call(plain, KV_ID, "put", {"key": "k", "value": 12})
    assert status == Status.HANDLER_ERROR and body[2] == "" and 'File "' not in body[1], body
    status, body = await call(auth, KV_ID, "put", {"key": "k", "value": 12}, secret=SECRET)
    assert status == Status.HANDLER_ERROR and 'File "' in body[2], body
    await call(plain, 0, "status")
    status, body = await call(plain, 0, "statistics", {"reset": True})
    assert status in (Status.UNAUTHENTICATED, Status.NOT_PERMITTED), (status, body)
    _, stats = await call(plain, 0, "statistics", {})
    assert any(row["rpc"] == "status" for row in stats["rpcs"]["target"])


# == the connection layer: a protocol error drops the connection and nothing after it runs =======================


def _hello(engine_id: str = "attacker") -> bytes:
    return encode_frame(Kind.HELLO, 0, pack_body({"engine_id": engine_id, "address": None}))


def _bad_header(**fields: int) -> bytes:
    head = bytearray(encode_header(Kind.REQUEST, 9, 0, rpc=rpc_id("status")))
    for offset, value in fields.items():
        head[int(offset[1:])] = value
    return bytes(head)


def violation(case: str, handshake: bool, bad: bytes, defect: str | None = None) -> Any:
    """A protocol violation: ``bad`` is sent (after the handshake when ``handshake``) with a kv put of ``case``
    pipelined behind it; ``defect`` marks one svcframe does not refuse yet."""
    marks = [pytest.mark.xfail(strict=True, reason=defect)] if defect else []
    return pytest.param(case, handshake, bad, id=case, marks=marks)


VIOLATIONS = [
    *[violation(f"{k.name}-before-HELLO", False, encode_frame(k, 1, b"")) for k in Kind if k not in (Kind.HELLO, Kind.GOODBYE)],
    violation("HELLO-then-bulk-data-before-any-push", False, _hello() + encode_frame(Kind.BULK_DATA_PUSH, 1, b"x" * 64)),
    violation("HELLO-then-push-data-beyond-a-refused-push", False,
              _hello() + bulk_frame(Kind.BULK_PUSH, 1, bytes(16), 8) + encode_frame(Kind.BULK_DATA_PUSH, 1, b"x" * 64)),
    violation("second-HELLO-in-the-same-read", False, _hello() + _hello()),
    violation("second-HELLO-later", True, _hello()),
    violation("GOODBYE-invalid-msgpack", True, encode_frame(Kind.GOODBYE, 0, b"\xc1\xc1")),
    violation("GOODBYE-deep-nesting", True, encode_frame(Kind.GOODBYE, 0, b"\x91" * 100_000)),
    violation("GOODBYE-int-map-keys", True, encode_frame(Kind.GOODBYE, 0, b"\x81\x01\x02")),
    violation("GOODBYE-before-HELLO-1-MiB-junk", False, encode_frame(Kind.GOODBYE, 0, secrets.token_bytes(MIB))),
    violation("bulk-data-push-for-no-request", True, encode_frame(Kind.BULK_DATA_PUSH, 77, b"x" * 64)),
    violation("bulk-data-reply-for-a-request-never-made", True, encode_frame(Kind.BULK_DATA_REPLY, 1 << 40, b"x" * 64)),
    violation("response-for-a-request-never-made", True, encode_frame(Kind.RESPONSE, 1 << 40, pack_body(None))),
    violation("unknown-kind", True, _bad_header(o3=42)),
    violation("bad-magic", True, _bad_header(o0=ord("X"))),
    violation("wrong-version", True, _bad_header(o2=9)),
    violation("reserved-bits", True, _bad_header(o36=1)),
    violation("over-the-body-limit", True, encode_header(Kind.REQUEST, 9, 64 * MIB, rpc=rpc_id("status"))),
    violation("malformed-request-body", True, encode_frame(Kind.REQUEST, 9, b"\xc1", provider_id=KV_ID, rpc=rpc_id("put"))),
    violation("request-body-with-ext-type", True,
              encode_frame(Kind.REQUEST, 9, b"\xd4\x01\x00", provider_id=KV_ID, rpc=rpc_id("put"))),
    violation("malformed-bulk-request", True, encode_frame(Kind.BULK_PULL, 9, pack_body([1, 2]))),
]  # fmt: skip


@pytest.mark.parametrize(("case", "handshake", "bad"), VIOLATIONS)
@uvloop_test
async def test_a_protocol_violation_drops_the_connection_and_nothing_after_it_runs(
    farm: dict[str, ServerProcess], case: str, handshake: bool, bad: bytes
) -> None:
    """Frames legal in one phase sent in another, a second HELLO, GOODBYEs with garbage bodies, bulk data for
    requests never made, bad headers and bodies, each with a kv put pipelined behind it in the same write: the
    server drops the connection (after a GOODBYE, or at once) and the put never runs."""
    server = farm["plain"]
    async with await raw(server, handshake=handshake) as peer:
        if not handshake:
            await peer.read_frame()
        peer.send(bad + put_frame(1000, case))
        assert await closed_within(peer, 1.5), f"{case}: the connection is still open"
    assert not await stored(server, case), f"{case}: the put behind it ran"


@uvloop_test
async def test_a_bad_proof_with_a_write_behind_it_is_refused(farm: dict[str, ServerProcess]) -> None:
    """With a secret: a HELLO with a wrong proof, or none, with a write pipelined behind it: GOODBYE
    UNAUTHENTICATED, the connection closes and the write never runs."""
    server = farm["auth"]
    for case, secret in (("wrong-proof", b"not-the-secret-but-long-enough"), ("no-proof", None)):
        async with await raw(server, handshake=False) as peer:
            peer.server_hello = unpack_body((await peer.read_frame()).body)  # type: ignore[assignment]
            peer.send(peer.hello_reply(secret) + put_frame(1, case))
            answer = await peer.read_frame()
            assert (answer.kind, answer.status) == (Kind.GOODBYE, Status.UNAUTHENTICATED), case
            assert await closed_within(peer, 5.0)
        assert not await stored(server, case, SECRET)


@uvloop_test
async def test_bulk_pushes_announcing_huge_sizes_cost_nothing(farm: dict[str, ServerProcess], figures: Any) -> None:
    """An unauthenticated peer announces 5,000 bulk pushes of 2^62 bytes into handles that do not exist, then
    sends data for the last one: every push is refused, the data is discarded, and the connection still serves
    calls; the server grows by at most 8 MiB."""
    server = farm["plain"]
    n = scaled(5000, 50000)
    before = await settled_rss(server.pid)
    async with await raw(server) as peer:
        peer.send(b"".join(bulk_frame(Kind.BULK_PUSH, i + 1, secrets.token_bytes(16), 1 << 62) for i in range(n)))
        answers = [await peer.read_frame() for _ in range(n)]
        peer.send(encode_frame(Kind.BULK_DATA_PUSH, n, b"x" * 65536))
        peer.request(n + 1, 0, "status")
        frame, _ = await peer.read_response()
    growth = await settled_rss(server.pid) - before
    figures.record(f"outside: {n} pushes of 2^62 bytes announced, server growth", growth / MIB, "MiB")
    assert {(f.kind, f.status) for f in answers} == {(Kind.RESPONSE, Status.BULK_ERROR)}
    assert frame.status == Status.OK
    assert growth <= 8 * MIB


#: What the lying server answers a call whose argument names the case, and how the call must end.
LIES: dict[str, tuple[list[tuple[int, bytes]], object]] = {
    "nil": ([(0, b"\xc0")], None),
    "value": ([(0, msgpack.packb({"a": [1, "b"]}))], {"a": [1, "b"]}),
    "malformed": ([(0, b"\xc1")], RemoteProtocolError),
    "truncated": ([(0, b"\x92\x01")], RemoteProtocolError),
    "int-map-key": ([(0, b"\x81\x01\x02")], RemoteProtocolError),
    "extension-type": ([(0, b"\xd4\x01\x00")], RemoteProtocolError),
    "trailing-bytes": ([(0, b"\x01\x02")], RemoteProtocolError),
    "answered-twice": ([(0, msgpack.packb("first")), (0, msgpack.packb("second"))], "first"),
    "error-status": ([(Status.HANDLER_ERROR, msgpack.packb("boom"))], RPCError),
    "error-status-malformed-body": ([(Status.HANDLER_ERROR, b"\xc1")], RPCError),
}


@uvloop_test
async def test_a_lying_servers_answers_end_each_call_as_they_should(figures: Any) -> None:
    """A server that answers with malformed, refused (int map keys, extension types), truncated and doubled
    bodies, error statuses, and at last an answer to a request never made: each call ends with its value or
    the right error, one at a time and all in one read (the compiled decoder answers calls itself), the
    connection serves on until the answer to nothing, which drops it; the client never hangs or crashes."""
    nonce = secrets.token_bytes(16)

    async def liar(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = {"engine_id": "liar", "address": None, "nonce": nonce, "auth": False,
                 "max_body_bytes": 4 * MIB, "cma": False}  # fmt: skip
        writer.write(encode_frame(Kind.HELLO, 0, pack_body(hello)))
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            head = HEADER.unpack(await reader.readexactly(HEADER_SIZE))
            await reader.readexactly(head[6])  # the client's HELLO
            while True:
                head = HEADER.unpack(await reader.readexactly(HEADER_SIZE))
                arg = unpack_body(await reader.readexactly(head[6]))
                rid = head[7]
                if arg == "answer-to-nothing":
                    writer.write(encode_frame(Kind.RESPONSE, rid + 1000, b"\xc0"))
                    continue
                writer.write(b"".join(encode_frame(Kind.RESPONSE, rid, body, status=s) for s, body in LIES[arg][0]))
        writer.close()

    liar_server = await asyncio.start_server(liar, "127.0.0.1", 0)
    address = f"tcp://127.0.0.1:{liar_server.sockets[0].getsockname()[1]}"
    try:
        async with Engine(None, secret=None) as client:

            async def call(case: str) -> object:
                try:
                    return await client.call(address, "any", case, timeout_seconds=5.0)
                except Exception as exc:
                    return type(exc)

            for case, (_, expected) in LIES.items():  # one at a time
                assert await call(case) == expected, case
            together = await asyncio.gather(*(call(case) for case in LIES))  # in flight together: answers batched
            assert together == [expected for _, expected in LIES.values()]
            assert await call("answer-to-nothing") is ConnectionLost
            assert await call("nil") is None  # a new connection
    finally:
        liar_server.close()
        await liar_server.wait_closed()
    figures.record("outside: a lying server's answers, cases", len(LIES), "")
