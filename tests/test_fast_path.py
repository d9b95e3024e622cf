"""The properties that make the RPC path fast, pinned by counting (never by timing).

* replies that are ready while one received batch is dispatched leave in one write;
* a handler that completes without awaiting creates no Task;
* a bulk payload is received straight into the destination and sent from the source, not copied
  through Python-allocated memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import tracemalloc
from typing import Any

import pytest
from test_engine import client_hello, open_raw, read_frame

from svcframe.bulk import BulkHandle
from svcframe.engine import Request
from svcframe.wire import HEADER_SIZE, Kind, encode_frame, pack_body, rpc_id

pytestmark = pytest.mark.asyncio


async def test_replies_of_one_batch_leave_in_one_write(make_engine: Any) -> None:
    server = await make_engine("tcp://127.0.0.1:0", secret=None)
    server.register(1, "echo", lambda req, arg: arg)
    reader, writer = await open_raw(server.address)
    try:
        await read_frame(reader)
        writer.write(client_hello())
        await writer.drain()
        probe = encode_frame(Kind.REQUEST, 1, pack_body(0), provider_id=1, rpc=rpc_id("echo"))
        writer.write(probe)
        assert (await read_frame(reader))[0] == Kind.RESPONSE
        (conn,) = [c for c in server.connections.all if c.server_side]
        before = conn.writes
        batch = b"".join(
            encode_frame(Kind.REQUEST, i, pack_body(i), provider_id=1, rpc=rpc_id("echo")) for i in range(2, 52)
        )
        writer.write(batch)  # 50 requests in one segment (64 bytes each: one recv)
        for _ in range(50):
            assert (await read_frame(reader))[0] == Kind.RESPONSE
        assert conn.writes - before <= 2  # one write per received batch (the kernel may split the batch in two)
    finally:
        writer.close()


async def test_sync_handler_creates_no_task(make_engine: Any) -> None:
    loop = asyncio.get_running_loop()
    created: list[Any] = []
    default_factory = loop.get_task_factory()

    def counting_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        created.append(coro)
        return default_factory(loop, coro, **kw) if default_factory else asyncio.Task(coro, loop=loop, **kw)

    server = await make_engine("tcp://127.0.0.1:0")
    client = await make_engine(None)

    async def aecho(req: Request, arg: Any) -> Any:
        return arg

    server.register(1, "echo", lambda req, arg: arg)
    server.register(1, "aecho", aecho)
    await client.call(server.address, "echo", 0, provider_id=1)  # connect first (dialling uses a task)
    loop.set_task_factory(counting_factory)
    try:
        for i in range(100):
            assert await client.call(server.address, "echo", i, provider_id=1) == i
        assert created == []
        await client.call(server.address, "aecho", 1, provider_id=1)
        assert len(created) == 1  # the control: an async handler runs as a Task
    finally:
        loop.set_task_factory(default_factory)


@pytest.mark.asyncio(loop_factories=["uvloop"])
@pytest.mark.parametrize("direction", ["pull", "push"])
async def test_bulk_payload_is_not_copied(make_engine: Any, direction: str) -> None:
    size = 64 << 20
    server = await make_engine("tcp://127.0.0.1:0")
    client = await make_engine(None)
    dest = bytearray(size)
    src = bytearray(b"\x5a" * size)

    async def transfer(req: Request, wire: Any) -> None:
        handle = BulkHandle.from_wire(wire)
        if direction == "pull":
            await req.engine.pull(handle, dest)
        else:
            await req.engine.push(handle, memoryview(src)[: handle.size])

    server.register(1, "transfer", transfer)
    theirs = bytearray(b"\xa5" * size) if direction == "pull" else bytearray(size)
    handle = client.expose(theirs, "r" if direction == "pull" else "w")
    warm = client.expose(bytearray(16), "r" if direction == "pull" else "w")
    await client.call(server.address, "transfer", warm.to_wire(), provider_id=1)  # connections up first
    tracemalloc.start()
    try:
        await client.call(server.address, "transfer", handle.to_wire(), provider_id=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20  # well under one chunk's worth: 64 MiB moved without Python-side copies
    expected = hashlib.sha256(b"\xa5" * size if direction == "pull" else b"\x5a" * size).digest()
    assert hashlib.sha256(dest if direction == "pull" else theirs).digest() == expected


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_large_bytes_result_is_sent_without_a_copy(make_engine: Any) -> None:
    """A handler's large ``bytes`` result goes out as a msgpack bin header plus the object itself: the
    server allocates nothing near the result's size to send it (the raw client reads in small pieces)."""
    size = 3 << 20
    result = b"\x7e" * size
    server = await make_engine("tcp://127.0.0.1:0", secret=None)
    server.register(1, "big", lambda req, arg: result)
    server.register(1, "small", lambda req, arg: b"\x7e" * arg)
    reader, writer = await open_raw(server.address)
    try:
        await read_frame(reader)
        writer.write(client_hello())
        await writer.drain()
        for rid, (rpc, length) in enumerate((("small", 100), ("big", size), ("small", 70_000)), start=1):
            frame_bytes = HEADER_SIZE + len(pack_body(b"\x7e" * length))
            tracemalloc.start()
            try:
                writer.write(encode_frame(Kind.REQUEST, rid, pack_body(length), provider_id=1, rpc=rpc_id(rpc)))
                received = 0
                while received < frame_bytes:
                    chunk = await asyncio.wait_for(reader.read(64 << 10), 10.0)
                    assert chunk, "the server closed the connection"
                    received += len(chunk)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert received == frame_bytes
            if rpc == "big":
                assert peak < 1 << 20, peak  # a copy of the result would be 3 MiB
    finally:
        writer.close()


async def test_a_finished_calls_result_is_not_kept_by_the_engine(make_engine: Any) -> None:
    """Once the caller has dropped a result, nothing of the engine holds it: the deadline heap names a call
    by its connection's waiting table and request id, not by its future (it held every future, with its
    result, until compaction at 1,024 calls: 20 reads of 1 MiB kept 20 MiB and faulted each read in anew)."""
    server = await make_engine("tcp://127.0.0.1:0", secret=None)
    data = bytes(MiB := 1 << 20)
    server.register(1, "read", lambda req, _: data)
    client = await make_engine(None, secret=None)
    assert len(await client.call(server.address, "read", provider_id=1)) == MiB
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(20):
            result = await client.call(server.address, "read", provider_id=1)
            assert len(result) == MiB
        del result
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert kept < 2 * MiB, f"{kept / MiB:.1f} MiB kept after 20 reads of 1 MiB were dropped"
