"""Results taken as data straight into the caller's buffer (``Engine.call(..., into=buffer)``): one round trip,
zero-copy on both sides, over tcp and unix, from sync and async handlers, small and chunked results; a result
larger than the buffer is ResultTooLarge and the connection goes on."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from conftest import WAIT_SECONDS

from svcframe import Engine, Request
from svcframe.bulk import BulkHandle
from svcframe.errors import RemoteError, ResultTooLarge

MakeEngine = Callable[..., Awaitable[Engine]]
MiB = 1024 * 1024

pytestmark = pytest.mark.asyncio


def pattern(size: int, seed: int = 1) -> bytes:
    block = hashlib.sha256(seed.to_bytes(4, "little")).digest() * 32  # 1 KiB
    return (block * (size // len(block) + 1))[:size]


def register(server: Engine) -> None:
    server.register(1, "read", lambda req, size: pattern(size))

    async def aread(req: Request, size: int) -> bytes:
        await asyncio.sleep(0)
        return pattern(size, 2)

    server.register(1, "aread", aread)
    server.register(1, "view", lambda req, size: memoryview(bytearray(pattern(size, 3)))[1:])
    server.register(1, "meta", lambda req, _: {"not": "bytes"})
    server.register(1, "fail", lambda req, _: 1 / 0)


@pytest.mark.parametrize("size", [0, 1000, 64 * 1024, 4 * MiB, 16 * MiB + 5], ids=lambda s: f"{s}B")
async def test_a_result_lands_in_the_callers_buffer(address: str, make_engine: MakeEngine, size: int) -> None:
    server = await make_engine(address, max_body_bytes=4 * MiB)
    register(server)
    client = await make_engine(None)
    buf = bytearray(size + 10)
    n = await client.call(server.address, "read", size, provider_id=1, into=buf, timeout_seconds=WAIT_SECONDS)
    assert n == size and bytes(buf[:size]) == pattern(size) and bytes(buf[size:]) == bytes(10)
    n = await client.call(server.address, "aread", size, provider_id=1, into=buf, timeout_seconds=WAIT_SECONDS)
    assert n == size and bytes(buf[:size]) == pattern(size, 2)
    if size:
        n = await client.call(server.address, "view", size, provider_id=1, into=memoryview(buf), timeout_seconds=10)
        assert n == size - 1 and bytes(buf[: size - 1]) == pattern(size, 3)[1:]


async def test_reads_in_flight_together_each_land_in_their_own_buffer(address: str, make_engine: MakeEngine) -> None:
    server = await make_engine(address)
    register(server)
    client = await make_engine(None)
    buffers = [bytearray(256 * 1024) for _ in range(16)]
    counts = await asyncio.gather(
        *(client.call(server.address, "read", 200_000 + i, provider_id=1, into=b) for i, b in enumerate(buffers))
    )
    for i, (n, b) in enumerate(zip(counts, buffers, strict=True)):
        assert n == 200_000 + i and bytes(b[:n]) == pattern(n)


async def test_a_result_larger_than_the_buffer_is_result_too_large(address: str, make_engine: MakeEngine) -> None:
    server = await make_engine(address)
    register(server)
    client = await make_engine(None)
    buf = bytearray(100)
    with pytest.raises(ResultTooLarge, match="the result is 101 bytes; the buffer given as into= holds 100"):
        await client.call(server.address, "read", 101, provider_id=1, into=buf)
    assert buf == bytearray(100)  # one chunk: it was discarded whole
    assert await client.call(server.address, "read", 100, provider_id=1, into=buf) == 100  # the connection goes on
    big = bytearray(2 * MiB)  # a result of several chunks over it: the rest is discarded, the call fails
    with pytest.raises(ResultTooLarge, match="the result is 3145728 bytes"):
        await client.call(server.address, "read", 3 * MiB, provider_id=1, into=big, timeout_seconds=WAIT_SECONDS)
    assert await client.call(server.address, "read", 1000, provider_id=1, into=big) == 1000


async def test_a_result_that_is_not_bytes_is_returned_as_it_is(server: Engine, client: Engine) -> None:
    register(server)
    buf = bytearray(64)
    assert await client.call(server.address, "meta", None, provider_id=1, into=buf) == {"not": "bytes"}  # type: ignore[arg-type]
    with pytest.raises(RemoteError, match="division by zero"):
        await client.call(server.address, "fail", None, provider_id=1, into=buf)  # type: ignore[arg-type]
    assert buf == bytearray(64)


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_the_data_is_not_copied_on_the_way_in() -> None:
    """The caller's buffer is where the data is received (the protocol's pull table names it), so taking a
    result of any size allocates nothing in proportion to it."""
    import tracemalloc

    async with Engine("tcp://127.0.0.1:0", secret=None) as server, Engine(None, secret=None) as client:
        data = bytes(8 * MiB)
        server.register(1, "big", lambda req, _: data)
        buf = bytearray(8 * MiB)
        await client.call(server.address, "big", None, provider_id=1, into=buf)  # type: ignore[arg-type]
        tracemalloc.start()
        try:
            for _ in range(4):
                n = await client.call(server.address, "big", None, provider_id=1, into=buf)  # type: ignore[arg-type]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert n == 8 * MiB and peak < 1 * MiB, f"{peak / MiB:.1f} MiB allocated to take 4 x 8 MiB"


async def read_pull_and_push(server: Engine, client: Engine, size: int) -> None:
    """``size`` bytes from ``server`` to ``client`` three ways, each checked: a result read into the client's
    buffer, a pull of a region the server exposes, and a handler's push into a buffer the client exposes."""

    async def push(req: Request, wire: list[object]) -> None:
        await server.push(BulkHandle.from_wire(wire), pattern(size, 5))

    register(server)
    server.register(1, "push", push)
    buf = bytearray(size)
    n = await client.call(server.address, "read", size, provider_id=1, into=buf, timeout_seconds=WAIT_SECONDS)
    assert n == size and buf == pattern(size)
    handle = server.expose(pattern(size, 4), "r")
    assert await client.pull(handle, buf, timeout_seconds=WAIT_SECONDS) == pattern(size, 4)
    mine = client.expose(buf, "w", peer=server.address)
    await client.call(server.address, "push", mine.to_wire(), provider_id=1, timeout_seconds=WAIT_SECONDS)
    assert buf == pattern(size, 5)


async def test_data_over_the_senders_output_cap_is_chunked(address: str, make_engine: MakeEngine) -> None:
    """A caller whose frame limit (64 MiB) is above the server's slow-reader cap (max_output_bytes, 8 MiB): a
    32 MiB result read into its buffer, a 32 MiB pull and a handler's 32 MiB push all arrive. Sent as one frame
    in one write, each would pile 32 MiB up in the server's output buffer and cut the caller off as a slow
    reader."""
    server = await make_engine(address, max_output_bytes=8 * MiB, bulk_cma=False)
    client = await make_engine(None, max_body_bytes=64 * MiB, bulk_cma=False)
    await read_pull_and_push(server, client, 32 * MiB)


async def test_data_to_a_peer_with_a_small_frame_limit_fits_its_frames(address: str, make_engine: MakeEngine) -> None:
    """A caller that takes frames of at most 64 KiB (max_body_bytes) from a server that chunks bulk data by
    1 MiB: a 256 KiB result into its buffer, a pull and a handler's push arrive in frames it accepts."""
    server = await make_engine(address, bulk_chunk_bytes=MiB, bulk_cma=False)
    client = await make_engine(None, max_body_bytes=64 * 1024, bulk_chunk_bytes=64 * 1024, bulk_cma=False)
    await read_pull_and_push(server, client, 256 * 1024)


async def test_data_flagged_as_an_answer_answers_only_an_into_call(make_engine: MakeEngine) -> None:
    """A result that fits one frame comes as one data frame flagged INTO, which is also the call's answer.
    A peer that sends such a frame for a call that is not an into= call (here, a relay that slips one in before
    every RESPONSE) answers nothing: its bytes are dropped and the call gets its real answer."""
    from svcframe.wire import F_INTO, HEADER, HEADER_SIZE, Kind, encode_frame

    server = await make_engine("tcp://127.0.0.1:0", secret=None)
    register(server)
    server.register(1, "echo", lambda req, arg: arg)
    host, port = server.address[len("tcp://") :].rsplit(":", 1)
    slipped = 0

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slip: bool) -> None:
        nonlocal slipped
        try:
            while True:
                header = await reader.readexactly(HEADER_SIZE)
                fields = HEADER.unpack(header)
                body = await reader.readexactly(fields[6])
                if slip and fields[2] == Kind.RESPONSE:
                    writer.write(encode_frame(Kind.BULK_DATA_REPLY, fields[7], b"forged", flags=F_INTO))
                    slipped += 1
                writer.write(header + body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    relays: list[asyncio.Task[Any]] = []

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        relays.append(asyncio.current_task())  # type: ignore[arg-type]
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(forward(reader, up_writer, False), forward(up_reader, writer, True))

    relay_server = await asyncio.start_server(relay, "127.0.0.1", 0)
    via = f"tcp://127.0.0.1:{relay_server.sockets[0].getsockname()[1]}"
    client = Engine(None, secret=None)
    try:
        await client.start()
        assert await client.call(via, "echo", "real", provider_id=1, timeout_seconds=WAIT_SECONDS) == "real"
        buf = bytearray(100)  # an into= call gets its data, whatever comes after its answer
        assert await client.call(via, "read", 50, provider_id=1, into=buf, timeout_seconds=WAIT_SECONDS) == 50
        assert bytes(buf[:50]) == pattern(50)
        assert await client.call(via, "echo", [1, 2], provider_id=1, timeout_seconds=WAIT_SECONDS) == [1, 2]
    finally:
        await client.close()  # then the relay's connections end, both ways
        await asyncio.wait_for(asyncio.gather(*relays), WAIT_SECONDS)
        relay_server.close()
        await relay_server.wait_closed()
    assert slipped == 2
