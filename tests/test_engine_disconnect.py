"""Two engine behaviours a failure detector leans on: ``Engine.disconnect`` drops a dialled connection (its pending
calls fail with ConnectionLost, the next call dials again), and a peer whose kernel resets the connection during
the handshake is a ConnectionLost to the dialler, never a raw OSError."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
from conftest import register_test_rpcs

from svcframe import ConnectionLost, Engine


@pytest.mark.asyncio
async def test_disconnect_drops_the_connection_and_the_next_call_dials_again() -> None:
    async with Engine("tcp://127.0.0.1:0") as server, Engine(None) as client:
        release = asyncio.Event()

        async def hang(req: object, arg: object) -> None:
            await release.wait()

        register_test_rpcs(server)
        server.register(1, "hang", hang)
        assert server.address is not None
        assert await client.call(server.address, "echo", 1, provider_id=1) == 1
        pending = asyncio.ensure_future(client.call(server.address, "hang", None, provider_id=1, timeout_seconds=30))
        await asyncio.sleep(0)  # (the call is sent)
        assert client.disconnect(server.address, "stuck") is True
        with pytest.raises(ConnectionLost):
            await pending
        assert client.disconnect(server.address) is False  # nothing left to drop
        assert await client.call(server.address, "echo", 2, provider_id=1) == 2  # a new connection
        release.set()


@pytest.mark.asyncio
async def test_a_reset_during_the_handshake_is_connection_lost() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    loop = asyncio.get_running_loop()

    async def reset_each() -> None:
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # an RST, not a FIN: the dialler's read fails with ECONNRESET

    resetter = asyncio.ensure_future(reset_each())
    try:
        async with Engine(None) as client:
            for _ in range(3):
                with pytest.raises(ConnectionLost):
                    await client.call(f"tcp://127.0.0.1:{port}", "echo", 1, provider_id=1, timeout_seconds=5)
    finally:
        resetter.cancel()
        listener.close()
