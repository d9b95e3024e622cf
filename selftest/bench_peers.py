"""Reference peers for ``svcframe bench``: the raw uvloop limit, and optional third-party RPC stacks.

``raw``: an ``asyncio.Protocol`` server on uvloop that handles length-prefixed frames without decoding
them. A frame is ``<u32 length><u8 op><payload>``; op 0 echoes the frame back (noop RPC), op 1 asks
for ``<u64 n>`` bytes back (a pull), op 2 carries data and is acknowledged by a 1-byte frame (a push).
This is the fastest an asyncio RPC server can be in Python: the limit svcframe is measured against.

``zmq`` (pyzmq DEALER/ROUTER + msgpack) and ``grpc`` (grpcio asyncio unary, generic handler, raw bytes)
are used when installed (``pip install svcframe[bench]``).

Run a server: ``python -m selftest.bench_peers raw|zmq|grpc --ready-fd FD [--unix PATH]``; it writes
``{"ok": true, "address": ...}`` on FD once it accepts connections.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import sys
from typing import Any

LEN = struct.Struct("<I")
OP_ECHO, OP_PULL, OP_PUSH = 0, 1, 2
CHUNK = 1 << 20  # a pull reply leaves in 1 MiB pieces (uvloop sends large single buffers slowly)


class RawServer(asyncio.BufferedProtocol):
    """Echo / pull / push over length-prefixed frames, with no decoding beyond the length and op."""

    def __init__(self, blob: memoryview) -> None:
        self.buf = bytearray(8 << 20)
        self.view = memoryview(self.buf)
        self.end = 0
        self.blob = blob
        self.transport: Any = None
        self.skip = 0  # bytes of a push payload still to receive
        self.scratch = memoryview(bytearray(4 << 20))

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.skip:  # a push payload: straight into scratch space, no copy
            return self.scratch[: min(self.skip, len(self.scratch))]
        return self.view[self.end : self.end + 65536]

    def buffer_updated(self, n: int) -> None:
        if self.skip:
            self.skip -= n
            if not self.skip:
                self.transport.write(b"\x01\x00\x00\x00\x02")  # push acknowledged
            return
        self.end += n
        view, pos, end = self.view, 0, self.end
        out = []
        while True:
            if self.skip:
                take = min(self.skip, end - pos)
                self.skip -= take
                pos += take
                if self.skip:
                    break
                out.append(b"\x01\x00\x00\x00\x02")  # push acknowledged
                continue
            if end - pos < 5:
                break
            (length,) = LEN.unpack_from(view, pos)
            op = view[pos + 4]
            if op == OP_PUSH:
                self.skip = length - 1
                pos += 5
                continue
            if end - pos < 4 + length:
                break
            if op == OP_ECHO:
                out.append(bytes(view[pos : pos + 4 + length]))
            else:
                (size,) = struct.unpack_from("<Q", view, pos + 5)
                out.append(LEN.pack(size + 1) + b"\x01")
                out.extend(self.blob[i : min(i + CHUNK, size)] for i in range(0, size, CHUNK))
            pos += 4 + length
        if pos:
            self.buf[: end - pos] = self.view[pos:end]
            self.end = end - pos
        if out:
            self.transport.writelines(out)


async def serve_raw(unix: str | None, ready_fd: int) -> None:
    loop = asyncio.get_running_loop()
    blob = memoryview(bytearray(64 << 20))
    if unix:
        server = await loop.create_unix_server(lambda: RawServer(blob), unix)
        address = f"unix://{unix}"
    else:
        server = await loop.create_server(lambda: RawServer(blob), "127.0.0.1", 0)
        address = f"tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    _ready(ready_fd, address)
    await _until_terminated()
    server.close()


class RawClient(asyncio.BufferedProtocol):
    """Client side of the raw protocol: one request at a time per ``request`` call, or pipelined."""

    def __init__(self) -> None:
        self.buf = bytearray(8 << 20)
        self.view = memoryview(self.buf)
        self.end = 0
        self.waiters: list[asyncio.Future[None]] = []
        self.transport: Any = None
        self.sink: memoryview | None = None
        self.sink_pos = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.sink is not None:
            return self.sink[self.sink_pos :]
        return self.view[self.end : self.end + 65536]

    def buffer_updated(self, n: int) -> None:
        if self.sink is not None:
            self.sink_pos += n
            if self.sink_pos == len(self.sink):
                self.sink = None
                self.waiters.pop(0).set_result(None)
            return
        self.end += n
        pos, end, view = 0, self.end, self.view
        while end - pos >= 4:
            (length,) = LEN.unpack_from(view, pos)
            if view[pos + 4 : pos + 5] == b"\x01" and length > 1 and self.pending_pull:
                # a pull reply: receive the payload straight into the destination
                have = min(end - pos - 5, length - 1)
                dest = self.pending_pull.pop(0)
                dest[:have] = view[pos + 5 : pos + 5 + have]
                pos += 5 + have
                if have < length - 1:
                    self.sink, self.sink_pos = dest, have
                    break
                self.waiters.pop(0).set_result(None)
                continue
            if end - pos < 4 + length:
                break
            pos += 4 + length
            self.waiters.pop(0).set_result(None)
        self.buf[: end - pos] = self.view[pos:end]
        self.end = end - pos

    pending_pull: list[memoryview]

    def request(self, frame: bytes, dest: memoryview | None = None) -> asyncio.Future[None]:
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        if dest is not None:
            self.pending_pull.append(dest)
        self.transport.write(frame)
        return fut


async def raw_connect(address: str) -> RawClient:
    loop = asyncio.get_running_loop()

    def factory() -> RawClient:
        c = RawClient()
        c.pending_pull = []
        return c

    if address.startswith("unix://"):
        _, proto = await loop.create_unix_connection(factory, address[7:])
    else:
        host, port = address[6:].rsplit(":", 1)
        _, proto = await loop.create_connection(factory, host, int(port))
    return proto


def raw_noop_frame(payload: int = 0) -> bytes:
    return LEN.pack(1 + payload) + bytes([OP_ECHO]) + bytes(payload)


def raw_pull_frame(size: int) -> bytes:
    return LEN.pack(9) + bytes([OP_PULL]) + struct.pack("<Q", size)


def raw_push_header(size: int) -> bytes:
    return LEN.pack(1 + size) + bytes([OP_PUSH])


# -- optional peers ------------------------------------------------------------------------------------------
async def serve_zmq(ready_fd: int) -> None:
    import msgpack
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    _ready(ready_fd, f"tcp://127.0.0.1:{port}")
    stop = asyncio.ensure_future(_until_terminated())
    while not stop.done():
        ident, body = await sock.recv_multipart()
        msgpack.unpackb(body)
        await sock.send_multipart([ident, msgpack.packb(None)])


async def serve_grpc(ready_fd: int) -> None:
    import grpc

    def noop(request: bytes, context: Any) -> bytes:
        return b""

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("bench.Bench", {"Noop": grpc.unary_unary_rpc_method_handler(noop)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    _ready(ready_fd, f"127.0.0.1:{port}")
    await _until_terminated()
    await server.stop(0)


def _ready(fd: int, address: str) -> None:
    os.write(fd, (json.dumps({"ok": True, "address": address, "pid": os.getpid()}) + "\n").encode())
    os.close(fd)


async def _until_terminated() -> None:
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def main(argv: list[str]) -> None:
    import argparse

    from svcframe.loops import run

    parser = argparse.ArgumentParser(prog="python -m selftest.bench_peers")
    parser.add_argument("kind", choices=["raw", "zmq", "grpc"])
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--unix", default=None)
    parser.add_argument("--cpu", type=int, default=None)
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, [args.cpu])
    if args.kind == "raw":
        run(serve_raw(args.unix, args.ready_fd))
    elif args.kind == "zmq":
        run(serve_zmq(args.ready_fd), "asyncio")
    else:
        run(serve_grpc(args.ready_fd), "asyncio")


if __name__ == "__main__":
    main(sys.argv[1:])


def blast(kind: str, address: str, depth: int, seconds: float, core: int | None, barrier: Any, out: Any) -> None:
    """Keep ``depth`` noop requests in flight on a raw socket for ``seconds`` and report the replies.

    The client side costs almost nothing (pre-encoded frames, replies counted by size), so the server is
    the bottleneck: what a saturation measurement needs. ``kind`` is "raw" (the echo protocol above) or
    "svcframe" (handshake with the shared secret from SVCFRAME_SECRET, then ``work`` requests to provider 1).
    """
    import socket
    import time

    if core is not None:
        os.sched_setaffinity(0, [core])
    if address.startswith("unix://"):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(address[7:])
    else:
        host, port = address[6:].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if kind == "raw":
        frame, reply_size = raw_noop_frame(), 5
    else:
        from svcframe.wire import HEADER_SIZE, Kind, auth_mac, encode_frame, pack_body, rpc_id, unpack_body

        hello = b""
        while len(hello) < HEADER_SIZE or len(hello) < HEADER_SIZE + LEN.unpack_from(hello, 12)[0]:
            hello += sock.recv(65536)
        info = unpack_body(hello[HEADER_SIZE:])
        assert isinstance(info, dict)
        me = f"blaster-{os.getpid()}"
        reply: dict[str, Any] = {"engine_id": me, "address": None}
        secret = os.environ.get("SVCFRAME_SECRET")
        if secret:
            reply["mac"] = auth_mac(secret.encode(), info["nonce"], info["engine_id"], me)
        sock.sendall(encode_frame(Kind.HELLO, 0, pack_body(reply)))
        frame = encode_frame(Kind.REQUEST, 1, pack_body([0, None, None, b""]), provider_id=1, rpc=rpc_id("work"))
        reply_size = HEADER_SIZE + len(pack_body(b""))
    window = frame * depth
    sock.sendall(window[: len(frame) * 10])  # warm up: 10 calls
    got = pending = 0
    while got < 10:
        pending += len(sock.recv(1 << 20))
        got, pending = got + pending // reply_size, pending % reply_size
    barrier.wait(60)
    done = pending = 0
    end = time.perf_counter() + seconds
    sock.sendall(window)
    while time.perf_counter() < end:
        pending += len(sock.recv(1 << 20))
        n, pending = pending // reply_size, pending % reply_size
        done += n
        if n:
            sock.sendall(window[: len(frame) * n])
    sock.close()
    out.put(done)
