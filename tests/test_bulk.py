"""Bulk transfers (the RDMA analogue) between real engines: pull and push in both directions, checked
with sha256, over TCP and unix sockets; numpy buffers; every bulk error; timeouts; local transfers."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from conftest import WAIT_SECONDS, register_test_rpcs, wait_until

from svcframe import BulkError, BulkHandle, Engine, Request, TimeoutError_
from svcframe.eager import DONE
from svcframe.errors import BulkUsageError

pytestmark = pytest.mark.asyncio

MakeEngine = Callable[..., Awaitable[Engine]]
KiB, MiB = 1024, 1024 * 1024
SIZES = [0, 1, 64 * KiB, 4 * MiB + 3]  # 4 MiB + 3: several chunks and a ragged last one


def sha(data: Any) -> str:
    return hashlib.sha256(memoryview(data).cast("B")).hexdigest()


def pattern(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


class Exposer:
    """Server-side RPCs that expose buffers (kept alive here) and report on them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.buffers: dict[int, bytearray] = {}
        self.handles: dict[int, BulkHandle] = {}
        engine.register(1, "expose", self.expose)
        engine.register(1, "digest", lambda req, bulk_id: sha(self.buffers[bulk_id]))
        engine.register(1, "unexpose", self.unexpose)
        engine.register(1, "pull_digest", self.pull_digest)
        engine.register(1, "push_pattern", self.push_pattern)
        engine.register(1, "roundtrip_array", self.roundtrip_array)

    def expose(self, req: Request, arg: dict[str, Any]) -> list[Any]:
        buf = bytearray(pattern(arg["size"], arg.get("seed", 1)))
        handle = self.engine.expose(buf, arg["mode"])
        self.buffers[handle.bulk_id] = buf
        self.handles[handle.bulk_id] = handle
        return handle.to_wire()

    def unexpose(self, req: Request, bulk_id: bytes) -> None:
        self.engine.unexpose(self.handles[bulk_id])

    async def pull_digest(self, req: Request, wire: list[Any]) -> str:
        data = await req.engine.pull(BulkHandle.from_wire(wire))
        assert isinstance(data, bytearray) and len(data) == wire[3]
        return sha(data)

    async def push_pattern(self, req: Request, arg: dict[str, Any]) -> str:
        handle = BulkHandle.from_wire(arg["handle"])
        data = pattern(handle.size, arg["seed"])
        await req.engine.push(handle, data)
        return sha(data)

    async def roundtrip_array(self, req: Request, wire: list[Any]) -> float:
        """Pull a float64 array from the caller, push back twice its values, return the sum."""
        handle = BulkHandle.from_wire(wire)
        arr = np.empty(handle.size // 8, dtype=np.float64)
        await req.engine.pull(handle, arr)
        await req.engine.push(handle, arr * 2)
        return float(arr.sum())


async def setup(address: str, make_engine: MakeEngine, **server_options: Any) -> tuple[Engine, Engine, Exposer]:
    server = await make_engine(address, **server_options)
    register_test_rpcs(server)
    exposer = Exposer(server)
    client = await make_engine(None)
    return server, client, exposer


async def call1(client: Engine, server: Engine, name: str, arg: Any = None, **kw: Any) -> Any:
    return await client.call(server.address, name, arg, provider_id=1, **kw)  # type: ignore[arg-type]


async def remote_handle(client: Engine, server: Engine, size: int, mode: str, seed: int = 1) -> BulkHandle:
    return BulkHandle.from_wire(await call1(client, server, "expose", {"size": size, "mode": mode, "seed": seed}))


# --- both directions, both operations, checksummed -----------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
async def test_server_pulls_from_client(address: str, make_engine: MakeEngine, size: int) -> None:
    server, client, _ = await setup(address, make_engine)
    data = bytearray(pattern(size, 7))
    handle = client.expose(data, "r")
    assert handle.address is None and handle.size == size and handle.engine_id == client.engine_id
    assert await call1(client, server, "pull_digest", handle.to_wire()) == sha(data)


@pytest.mark.parametrize("size", SIZES)
async def test_server_pushes_to_client(address: str, make_engine: MakeEngine, size: int) -> None:
    server, client, _ = await setup(address, make_engine)
    buf = bytearray(size)
    handle = client.expose(buf, "w")
    expected = await call1(client, server, "push_pattern", {"handle": handle.to_wire(), "seed": 3})
    assert expected == sha(pattern(size, 3)) == sha(buf)


@pytest.mark.parametrize("size", SIZES)
async def test_client_pulls_from_server(address: str, make_engine: MakeEngine, size: int) -> None:
    server, client, exposer = await setup(address, make_engine)
    handle = await remote_handle(client, server, size, "r", seed=5)
    assert handle.address == server.address and handle.engine_id == server.engine_id
    data = await client.pull(handle)
    assert len(data) == size and sha(data) == sha(pattern(size, 5)) == sha(exposer.buffers[handle.bulk_id])


@pytest.mark.parametrize("size", SIZES)
async def test_client_pushes_to_server(address: str, make_engine: MakeEngine, size: int) -> None:
    server, client, exposer = await setup(address, make_engine)
    handle = await remote_handle(client, server, size, "w")
    data = pattern(size, 11)
    await client.push(handle, data)
    assert await call1(client, server, "digest", handle.bulk_id) == sha(data)
    assert exposer.buffers[handle.bulk_id] == data


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_64_mib_both_directions(address: str, make_engine: MakeEngine) -> None:
    size = 64 * MiB
    server, client, exposer = await setup(address, make_engine)
    # client exposes, server pulls then pushes
    buf = bytearray(pattern(size, 21))
    handle = client.expose(buf, "rw")
    assert await call1(client, server, "pull_digest", handle.to_wire(), timeout_seconds=60) == sha(buf)
    assert await call1(
        client, server, "push_pattern", {"handle": handle.to_wire(), "seed": 22}, timeout_seconds=60
    ) == sha(buf)
    # server exposes, client pulls then pushes
    remote = await remote_handle(client, server, size, "rw", seed=23)
    assert sha(await client.pull(remote, timeout_seconds=60)) == sha(exposer.buffers[remote.bulk_id])
    await client.push(remote, buf, timeout_seconds=60)
    assert exposer.buffers[remote.bulk_id] == buf


async def test_concurrent_transfers_do_not_mix(address: str, make_engine: MakeEngine) -> None:
    server, client, exposer = await setup(address, make_engine, bulk_chunk_bytes=64 * KiB)
    handles = [await remote_handle(client, server, 1 * MiB + i, "rw", seed=i) for i in range(8)]
    pulled = await asyncio.gather(*(client.pull(h) for h in handles))
    assert [sha(p) for p in pulled] == [sha(pattern(1 * MiB + i, i)) for i in range(8)]
    await asyncio.gather(*(client.push(h, pattern(h.size, 100 + i)) for i, h in enumerate(handles)))
    assert [exposer.buffers[h.bulk_id] for h in handles] == [pattern(h.size, 100 + i) for i, h in enumerate(handles)]


async def test_partial_ranges(address: str, make_engine: MakeEngine) -> None:
    server, client, exposer = await setup(address, make_engine)
    handle = await remote_handle(client, server, 1000, "rw", seed=9)
    source = pattern(1000, 9)
    dest = bytearray(b"-" * 120)
    assert await client.pull(handle, dest, offset=100, size=100, dest_offset=10) is dest
    assert dest == b"-" * 10 + source[100:200] + b"-" * 10
    await client.push(handle, b"ABCDE", offset=995)
    assert exposer.buffers[handle.bulk_id] == source[:995] + b"ABCDE"
    assert await client.pull(handle, offset=990) == source[990:995] + b"ABCDE"


# --- numpy --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1000,), (64, 33)])
async def test_numpy_array_round_trip(server: Engine, client: Engine, shape: tuple[int, ...]) -> None:
    Exposer(server)
    arr = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) / 3.0
    assert arr.flags.c_contiguous
    original = arr.copy()
    handle = client.expose(arr, "rw")
    assert handle.size == arr.nbytes
    total = await client.call(server.address, "roundtrip_array", handle.to_wire(), provider_id=1)  # type: ignore[arg-type]
    assert total == pytest.approx(float(original.sum()))
    np.testing.assert_array_equal(arr, original * 2)


async def test_pull_into_numpy_destination(server: Engine, client: Engine) -> None:
    Exposer(server)
    values = np.linspace(-1, 1, 4096)
    handle = await remote_handle(client, server, values.nbytes, "w")
    await client.push(handle, values)
    rhandle = BulkHandle(handle.address, handle.engine_id, handle.bulk_id, handle.size, "rw")
    with pytest.raises(BulkError):  # exposed write-only: the owner refuses a pull
        await client.pull(rhandle, np.empty_like(values))
    readable = await remote_handle(client, server, values.nbytes, "rw")
    await client.push(readable, values)
    out = np.zeros_like(values)
    assert await client.pull(readable, out) is out
    np.testing.assert_array_equal(out, values)


async def test_unsuitable_buffers_are_refused(client: Engine) -> None:
    arr = np.arange(100, dtype=np.float64)
    with pytest.raises(BulkUsageError, match="contiguous"):
        client.expose(arr[::2], "r")
    with pytest.raises(BulkUsageError, match="read-only"):
        client.expose(b"immutable", "w")
    with pytest.raises(BulkUsageError):
        client.expose("not a buffer", "r")
    with pytest.raises(BulkUsageError, match="mode"):
        client.expose(bytearray(4), "x")
    with pytest.raises(BulkError):
        BulkHandle.from_wire(["addr", "id", 1, -1, "r"])
    with pytest.raises(BulkError):
        BulkHandle.from_wire({"not": "a handle"})


# --- errors: local misuse is a BulkUsageError, the owner's refusal a BulkError; the connection keeps working ------------------------------------------------


async def test_wrong_mode_is_bulk_error(server: Engine, client: Engine) -> None:
    exposer = Exposer(server)
    readonly = await remote_handle(client, server, 100, "r")
    with pytest.raises(BulkUsageError, match="push"):
        await client.push(readonly, b"x" * 10)  # refused before sending: the handle says "r"
    writeonly = await remote_handle(client, server, 100, "w")
    with pytest.raises(BulkUsageError, match="pull"):
        await client.pull(writeonly)
    # A handle that lies about its mode: the owner refuses it too
    forged = BulkHandle(readonly.address, readonly.engine_id, readonly.bulk_id, readonly.size, "rw")
    with pytest.raises(BulkError, match="push"):
        await client.push(forged, b"y" * 100)
    assert exposer.buffers[readonly.bulk_id] == pattern(100, 1)  # untouched
    assert await client.pull(forged) == pattern(100, 1)  # and the connection still serves
    assert await client.call(server.address, "echo", "ok", provider_id=1) == "ok"  # type: ignore[arg-type]


async def test_out_of_range_is_bulk_error(server: Engine, client: Engine) -> None:
    exposer = Exposer(server)
    handle = await remote_handle(client, server, 100, "rw")
    for kwargs in ({"offset": 99, "size": 2}, {"offset": -1, "size": 1}, {"offset": 0, "size": 101}, {"offset": 101}):
        with pytest.raises(BulkUsageError, match=r"range|outside"):  # checked locally: nothing sent
            await client.pull(handle, **kwargs)
    with pytest.raises(BulkUsageError):
        await client.push(handle, b"z" * 10, offset=95)
    with pytest.raises(BulkUsageError):
        await client.pull(handle, bytearray(10))  # destination too small
    # A handle that claims more bytes than exposed: the owner checks the range itself
    forged = BulkHandle(handle.address, handle.engine_id, handle.bulk_id, 10_000, "rw")
    with pytest.raises(BulkError, match="outside"):
        await client.pull(forged, offset=50, size=100)
    with pytest.raises(BulkError, match="outside"):
        await client.push(forged, b"q" * 5000)
    assert exposer.buffers[handle.bulk_id] == pattern(100, 1)
    assert await client.pull(handle) == pattern(100, 1)


async def test_unexposed_handle_is_bulk_error(server: Engine, client: Engine) -> None:
    Exposer(server)
    handle = await remote_handle(client, server, 1000, "rw")
    assert len(await client.pull(handle)) == 1000
    await client.call(server.address, "unexpose", handle.bulk_id, provider_id=1)  # type: ignore[arg-type]
    with pytest.raises(BulkError, match="not exposed"):
        await client.pull(handle)
    with pytest.raises(BulkError, match="not exposed"):
        await client.push(handle, b"x" * 1000)
    never = BulkHandle(handle.address, handle.engine_id, bytes(16), 10, "rw")
    with pytest.raises(BulkError, match="not exposed"):
        await client.pull(never)
    other = await remote_handle(client, server, 10, "r", seed=4)
    assert await client.pull(other) == pattern(10, 4)


async def test_handle_of_a_restarted_engine_is_bulk_error(address: str, make_engine: MakeEngine) -> None:
    server, client, _ = await setup(address, make_engine)
    handle = await remote_handle(client, server, 10, "r")
    stale = BulkHandle(handle.address, "0" * 32, handle.bulk_id, handle.size, handle.mode)
    with pytest.raises(BulkError, match="no longer owns"):
        await client.pull(stale)


async def test_timed_out_pull_leaves_the_connection_usable(address: str, make_engine: MakeEngine) -> None:
    server, client, exposer = await setup(address, make_engine)
    handle = await remote_handle(client, server, 48 * MiB, "r", seed=2)
    conn = await client.connection(server.address)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError_):
        await client.pull(handle, timeout_seconds=0.002)
    timed_out = loop.time() - start
    small = await remote_handle(client, server, 1000, "r", seed=3)
    for _ in range(3):
        assert await client.pull(small, timeout_seconds=WAIT_SECONDS) == pattern(1000, 3)
    start = loop.time()  # the whole pull, in the same run: the timed-out one ended well before it would have
    assert await client.pull(handle, timeout_seconds=WAIT_SECONDS) == pattern(48 * MiB, 2)
    assert timed_out < max(0.1, loop.time() - start)
    assert sha(await client.pull(handle, timeout_seconds=60)) == sha(exposer.buffers[handle.bulk_id])
    assert await client.connection(server.address) is conn and not conn.closed  # type: ignore[arg-type]


@pytest.mark.parametrize("chunk", [1 * MiB, 8 * MiB], ids=["1MiB-chunks", "8MiB-chunks"])
async def test_abandoned_pull_leaves_the_connection_usable(address: str, make_engine: MakeEngine, chunk: int) -> None:
    """Data of a pull the caller gave up on still arrives; it is dropped, whatever the chunk size
    (here one chunk: the owner sends it as soon as it reads the request)."""
    options = {"max_body_bytes": 16 * MiB, "bulk_chunk_bytes": chunk}
    server, _, _ = await setup(address, make_engine, **options)
    client = await make_engine(None, **options)
    handle = await remote_handle(client, server, 6 * MiB if chunk > 6 * MiB else chunk, "r", seed=2)
    conn = await client.connection(server.address)  # type: ignore[arg-type]
    task = asyncio.create_task(client.pull(handle, timeout_seconds=WAIT_SECONDS))
    for _ in range(1000):  # until the request is on its way (a few loop iterations), then give up
        if conn.pending:
            break
        await asyncio.sleep(0)
    assert conn.pending
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    small = await remote_handle(client, server, 1000, "r", seed=3)
    for _ in range(3):
        assert await client.pull(small, timeout_seconds=WAIT_SECONDS) == pattern(1000, 3)
    assert await client.connection(server.address) is conn and not conn.closed  # type: ignore[arg-type]


async def test_timed_out_push_leaves_the_connection_usable(address: str, make_engine: MakeEngine) -> None:
    server, client, exposer = await setup(address, make_engine)
    handle = await remote_handle(client, server, 48 * MiB, "w")
    conn = await client.connection(server.address)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError_):
        await client.push(handle, pattern(48 * MiB, 8), timeout_seconds=0.002)
    small = await remote_handle(client, server, 1000, "w")
    for seed in range(3):
        await client.push(small, pattern(1000, seed), timeout_seconds=WAIT_SECONDS)
        assert exposer.buffers[small.bulk_id] == pattern(1000, seed)
    assert await client.call(server.address, "echo", "ok", provider_id=1) == "ok"  # type: ignore[arg-type]
    assert await client.connection(server.address) is conn and not conn.closed  # type: ignore[arg-type]


# --- local transfers (the owner pulls / pushes its own handle) -------------------------------------------------


@pytest.mark.parametrize("engine_kind", ["server", "client"])
async def test_local_pull_and_push(server: Engine, client: Engine, engine_kind: str) -> None:
    engine = server if engine_kind == "server" else client
    buf = bytearray(pattern(10_000, 6))
    handle = engine.expose(buf, "rw")
    assert await engine.pull(handle) == buf
    assert await engine.pull(handle, offset=10, size=20) == buf[10:30]
    await engine.push(handle, b"\x00" * 100, offset=50)
    assert buf[50:150] == bytes(100) and buf[:50] == pattern(10_000, 6)[:50]
    ro = engine.expose(bytearray(10), "r")
    with pytest.raises(BulkUsageError):
        await engine.push(ro, b"x")
    with pytest.raises(BulkUsageError):
        await engine.pull(handle, offset=9_999, size=2)
    engine.unexpose(handle)
    with pytest.raises(BulkError):
        await engine.pull(handle)
    assert engine.statistics()["connections"] == 0  # nothing went over a socket


async def test_concurrent_bulk_transfers_share_one_connection_without_tripping_the_output_cap(
    make_engine: Any,
) -> None:
    """16 pulls of 1 MiB in flight on one connection (the roofline's bandwidth saturation): the owner's
    replies are flushed and paced by write backpressure, so the 8 MiB output cap never mistakes it for
    a slow reader."""
    server = await make_engine("tcp://127.0.0.1:0")
    client = await make_engine(None)

    async def pull(req: Request, wire: Any) -> int:
        data = await req.engine.pull(BulkHandle.from_wire(wire))
        return len(data)

    server.register(1, "pull", pull)
    handle = client.expose(bytearray(b"\x42" * (1 << 20)), "r")

    async def worker() -> None:
        for _ in range(10):
            assert await client.call(server.address, "pull", handle.to_wire(), provider_id=1) == 1 << 20

    await asyncio.gather(*(worker() for _ in range(16)))
    assert not any(c.closed for c in client.connections.all)


async def test_a_bound_handle_serves_only_its_peer_and_dies_with_the_connection(
    address: str, make_engine: MakeEngine
) -> None:
    """Expose(..., peer=ADDRESS) lets only that server use the handle, over the connection this
    engine dialled to it, and revokes the handle when that connection ends."""
    server, client, _ = await setup(address, make_engine)
    other, _, _ = await setup("tcp://127.0.0.1:0", make_engine)
    data = bytearray(pattern(4096, 3))
    handle = client.expose(data, "r", peer=server.address)
    assert await call1(client, server, "pull_digest", handle.to_wire()) == sha(data)  # the bound server: yes
    with pytest.raises(BulkError, match="bound to another peer"):
        await call1(client, other, "pull_digest", handle.to_wire())  # another server, even with the handle
    conn = await client.connection(server.address)  # type: ignore[arg-type]
    conn.close()
    await wait_until(lambda: server.address not in client.connections.dialled, what="the connection to be gone")
    with pytest.raises(BulkError, match="not exposed"):  # revoked with its connection
        await call1(client, server, "pull_digest", handle.to_wire())


async def test_a_pull_allocates_nothing_before_the_owner_answers(address: str, make_engine: MakeEngine) -> None:
    """Pull(dest=None) allocated the claimed size before the owner said anything; a caller that
    claims 256 MiB and exposes 16 bytes made the server allocate 256 MiB. Now the destination is allocated
    when the owner's first bytes (or address) arrive."""
    import tracemalloc

    server, client, _ = await setup(address, make_engine)
    small = client.expose(bytearray(16), "r")
    forged = BulkHandle(small.address, small.engine_id, small.bulk_id, 256 * 1024 * 1024, "r")
    tracemalloc.start()
    try:
        with pytest.raises(BulkError, match="outside"):
            await call1(client, server, "pull_digest", forged.to_wire())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024, f"{peak / 2**20:.0f} MiB allocated for a transfer the owner refused"
    data = bytearray(pattern(300_000, 5))  # and a real pull(dest=None) still returns its bytearray
    assert await call1(client, server, "pull_digest", client.expose(data, "r").to_wire()) == sha(data)


# --- a handler's push into its caller's buffer, ahead of its answer ------------------------------------------


def _bulk_counts(engine: Engine) -> dict[str, int]:
    """Transfers per direction recorded by the engine's monitor (summed over peers)."""
    out: dict[str, int] = {}
    for (direction, _), rec in engine.monitor.bulk.items():
        out[direction] = out.get(direction, 0) + len(rec.buffer) // 2 + rec.summaries[rec.steps[0]].count
    return out


async def test_a_handlers_push_to_its_caller_goes_ahead_of_the_answer(server: Engine, client: Engine) -> None:
    """Over the socket, a handler's push into its caller's buffer is sent ahead of its answer and not
    answered: the call returns with the bytes in place and the caller wrote nothing but its requests (one
    round trip for the read); ``ahead=False``, and a caller whose HELLO lacks ``push_ahead``, get the push that
    waits for the owner's answer. A push the caller refuses fails the call with BulkError once the handler
    went on (it saw no error), and the connection serves on."""
    address = server.address or ""
    server.bulk_cma = client.bulk_cma = False  # (over unix, 3 MiB would move by cross-memory attach: test_cma)
    after: list[str] = []

    async def push_into(req: Request, arg: list[Any]) -> int:
        await req.engine.push(BulkHandle.from_wire(arg[0]), pattern(arg[1], arg[1]), ahead=arg[2])
        after.append("pushed")
        return arg[1]

    server.register(1, "push_into", push_into)
    await client.call(address, "push_into", [client.expose(bytearray(1), "w").to_wire(), 1, True], provider_id=1)
    conn = client.connections.dialled[address]
    buf = bytearray(5 * MiB)
    handle = client.expose(buf, "w").to_wire()
    writes = conn.writes
    for size in (64 * KiB, 3 * MiB + 1, 0):
        buf[:] = bytes(len(buf))
        assert await client.call(address, "push_into", [handle, size, True], provider_id=1) == size
        assert buf[:size] == pattern(size, size) and buf[size : size + 8] == bytes(min(8, len(buf) - size))
    assert conn.writes == writes + 3  # our three requests, and no answer to a push
    assert _bulk_counts(server).get("push") == 4 and _bulk_counts(client).get("served_push") == 4
    await client.call(address, "push_into", [handle, 1000, False], provider_id=1)  # waits for our answer
    server.connections.peers[client.engine_id].peer_push_ahead = False  # a caller from before: the same
    await client.call(address, "push_into", [handle, 2000, True], provider_id=1)
    assert buf[:2000] == pattern(2000, 2000) and _bulk_counts(server).get("push") == 6
    assert conn.writes == writes + 3 + 2 * 2  # each a request and an answer to its push
    server.connections.peers[client.engine_id].peer_push_ahead = True
    gone = client.expose(bytearray(100), "w")
    client.unexpose(gone)
    after.clear()
    with pytest.raises(BulkError, match=r"refused here: bulk handle .* is not exposed"):
        await client.call(address, "push_into", [gone.to_wire(), 100, True], provider_id=1)
    await wait_until(lambda: after == ["pushed"], what="the handler to go on past its push")
    assert await client.call(address, "push_into", [handle, 10, True], provider_id=1) == 10
    assert not conn.protocol.pushes and not conn.pending


async def test_a_sync_handler_returning_its_push_ahead_is_answered_without_a_task(
    server: Engine, client: Engine
) -> None:
    """A push ahead written at once is finished when ``push`` returns: a sync handler that returns it
    (``return req.engine.push(...)``) is answered in its batch with no coroutine run as a task (a task
    factory on the loop sees every task made), and ``await``, ``create_task`` and ``gather`` take what it
    returns. A push that must wait (past one frame) still runs, as a task, and completes."""
    address = server.address or ""
    server.bulk_cma = client.bulk_cma = False

    def fill(req: Request, arg: list[Any]) -> Any:
        return req.engine.push(BulkHandle.from_wire(arg[0]), pattern(arg[1], arg[1]))

    server.register(1, "fill", fill)
    buffers = [bytearray(64 * KiB) for _ in range(16)]
    handles = [client.expose(b, "w").to_wire() for b in buffers]
    await client.call(address, "fill", [handles[0], 1], provider_id=1)  # (connected)
    loop = asyncio.get_running_loop()
    made: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append(getattr(getattr(coro, "cr_code", None), "co_name", type(coro).__name__))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        sizes = [64 * KiB - n for n in range(16)]
        await asyncio.gather(
            *(client.call(address, "fill", [h, s], provider_id=1) for h, s in zip(handles, sizes, strict=True))
        )
        assert "_run_async" not in made, made
        for buf, size in zip(buffers, sizes, strict=True):
            assert buf[:size] == pattern(size, size)
        large = bytearray(server.connections.peers[client.engine_id].whole_frame_bytes + 1)  # over one frame: the push
        # waits for the socket, as a task
        await client.call(address, "fill", [client.expose(large, "w").to_wire(), len(large)], provider_id=1)
        assert large == pattern(len(large), len(large)) and "_run_async" in made
    finally:
        loop.set_task_factory(None)
    local = bytearray(8)
    done = client.push(client.expose(local, "w"), b"12345678")
    assert local == b"12345678"  # (a buffer of its own: done when called)
    assert await done is None and await asyncio.create_task(done) is None
    assert await asyncio.gather(done, done) == [None, None]
    with pytest.raises(BulkUsageError):  # a bad range is refused when called
        client.push(client.expose(bytearray(4), "w"), b"12345678")


async def test_a_push_aheads_source_may_be_changed_once_its_push_completed(server: Engine, client: Engine) -> None:
    """A push completes once its data is written, and the source may then be reused: a handler that changes
    its bytearray once its push ahead completed (a sync one when ``push`` returned it finished, before it
    returns; an async one after its ``await``) still delivers what the buffer held at the push, in one frame
    and in chunks. (Written in the batch, or queued by the transport, the data was sent by reference: the
    caller got the changed bytes. The one-frame cases fail so without the copy.)"""
    address = server.address or ""
    server.bulk_cma = client.bulk_cma = False

    def sync_fill(req: Request, arg: list[Any]) -> Any:
        buf = bytearray(pattern(arg[1], arg[1]))
        pushed = req.engine.push(BulkHandle.from_wire(arg[0]), buf)
        if pushed is DONE:  # (done at once: else it runs once returned, and the buffer must wait for it)
            buf[:] = bytes(len(buf))
        return pushed

    async def async_fill(req: Request, arg: list[Any]) -> None:
        buf = bytearray(pattern(arg[1], arg[1]))
        view = memoryview(buf)
        await req.engine.push(BulkHandle.from_wire(arg[0]), view)
        buf[:] = bytes(len(buf))

    server.register(1, "sync_fill", sync_fill)
    server.register(1, "async_fill", async_fill)
    await client.call(address, "async_fill", [client.expose(bytearray(1), "w").to_wire(), 1], provider_id=1)
    over_one_frame = server.connections.peers[client.engine_id].whole_frame_bytes + 1
    for name in ("sync_fill", "async_fill"):
        for size in (1000, 64 * KiB, over_one_frame):
            dest = bytearray(size)
            await client.call(address, name, [client.expose(dest, "w").to_wire(), size], provider_id=1)
            assert dest == pattern(size, size), (name, size)
