"""Reference peers for ``svcframe bench``: the raw uvloop limit, the machine limit, and third-party RPC stacks.

``raw``: an ``asyncio.BufferedProtocol`` server on uvloop that handles length-prefixed frames without
decoding them. A frame is ``<u32 length><u8 op><payload>``; op 0 echoes the frame back (noop RPC), op 1
asks for ``<u64 n>`` bytes back (the client pulls: data flows server -> client), op 2 carries data and
is acknowledged by a 1-byte frame (the client pushes: client -> server). Frames are received whole into
one preallocated buffer and used in place (bulk bytes are written there by ``recv_into`` and never
copied); replies leave as memoryviews of a preallocated blob in one ``writelines``. This is the fastest
an asyncio RPC peer can be in Python: the limit svcframe is measured against.

``block``: the same protocol on blocking sockets in a plain thread (``recv_into`` exact lengths,
``sendmsg`` of memoryviews): the machine's limit for the same exchange, with no event loop.

``msgpack``: the RPC an engineer writes in an afternoon: asyncio streams, ``<u32 length><msgpack body>``
frames, msgpack-rpc's ``[msgid, method, args]`` requests and ``[msgid, error, result]`` responses, one
request at a time per connection on the server, a dict of futures and a reader task on the client. Methods
``noop()`` -> None and ``read(size)`` -> ``size`` bytes (real data, as the self-test provider's ``read``).
It runs on the same event loop as svcframe (uvloop where installed).

``zmq`` (pyzmq DEALER/ROUTER + msgpack) and ``grpc`` (grpcio asyncio unary, generic handler, raw bytes)
are used when installed (``pip install svcframe[bench]``).

Run a server: ``python -m selftest.bench_peers raw|block|msgpack|zmq|grpc --ready-fd FD [--unix PATH]``; it writes
``{"ok": true, "address": ...}`` on FD once it accepts connections.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from svcframe.progress import Progress

LEN = struct.Struct("<I")
SIZE = struct.Struct("<Q")
OP_ECHO, OP_PULL, OP_PUSH = 0, 1, 2  # the client's view: pull = server -> client, push = client -> server
ACK = b"\x01\x00\x00\x00\x02"
RECV_BYTES = 256 * 1024  # initial receive buffer (as svcframe's decoder); grows once to the largest frame


def peer_progress(msec: float, backoff: bool = True) -> Progress:
    """svcframe's progress loop driving a plain uvloop loop: the same code (``svcframe.progress.Progress``), so
    a raw row and a svcframe row progress alike, contention back-off included. ``msec=0``: block (asyncio's
    default); ``msec=inf``: busy; else spindown with a window of ``msec``. No periodic wake-up. Started on the
    running loop unless it blocks (call it from a protocol factory or a coroutine); ``stop()`` it at the
    connection's end. A
    reply then finds its peer polling instead of asleep in ``epoll_wait`` on an idle core, whose wake-up
    costs tens of µs on a VM."""
    mode = "block" if not msec else "busy" if msec == float("inf") else "spindown"
    progress = Progress(mode, msec if mode == "spindown" else 0.0, 0.0, backoff=backoff)
    if mode != "block":  # (a blocking one needs no loop: protocols built outside one, in unit tests)
        progress.start(asyncio.get_running_loop())
    return progress


class FrameReceiver(asyncio.BufferedProtocol):
    """Receives frames whole into one preallocated buffer and consumes them in place (no decode, no copy).

    ``get_buffer`` hands the kernel all the free space after the bytes received so far, so a bulk
    payload is written by ``recv_into`` exactly where it is consumed. The buffer restarts at offset 0
    whenever every received byte has been consumed (each request/response exchange), and grows once,
    to the largest frame seen, when a frame cannot fit. Only then, or when a partial frame has to move
    to the front, are received bytes copied: ``copied`` counts them (0 in a steady bulk exchange).
    ``reads`` counts the receives. Subclasses implement ``frames(view, pos, end)``.
    """

    def __init__(self, size: int = RECV_BYTES, spindown_msec: float = 0.0) -> None:
        self.spin = peer_progress(spindown_msec)
        self.buf = bytearray(size)
        self.view = memoryview(self.buf)
        self.start = 0  # first byte not consumed
        self.end = 0  # first byte not received
        self.need = 5  # bytes from ``start`` that complete the frame being received (5: its header)
        self.copied = 0
        self.reads = 0
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.spin.stop()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.start + self.need > len(self.buf):
            self._make_room()
        return self.view[self.end :]

    def buffer_updated(self, n: int) -> None:
        self.reads += 1
        self.spin.activity()
        self.end = end = self.end + n
        if end - self.start < self.need:  # the middle of a payload: nothing to look at
            return
        self.start = self.frames(self.view, self.start, end)
        if self.start == end:
            self.start = self.end = 0

    def _make_room(self) -> None:
        kept = self.end - self.start
        if self.need > len(self.buf):
            buf = bytearray(max(self.need, 2 * len(self.buf)))
            buf[:kept] = self.view[self.start : self.end]
            self.view.release()
            self.buf, self.view = buf, memoryview(buf)
        else:
            self.buf[:kept] = self.view[self.start : self.end]
        self.copied += kept
        self.start, self.end = 0, kept

    def frames(self, view: memoryview, pos: int, end: int) -> int:
        """Handle the complete frames in ``view[pos:end]``; set ``need``; return the first unconsumed byte."""
        raise NotImplementedError


class RawServer(FrameReceiver):
    """Echo / pull / push over length-prefixed frames, with no decoding beyond the length and op.

    A push payload is received in place and acknowledged with a 1-byte frame; a pull is answered with
    the header and a memoryview of ``blob`` (one ``writelines``: a single ``writev``, no copy).
    """

    def __init__(self, blob: memoryview, spindown_msec: float = 0.0) -> None:
        super().__init__(spindown_msec=spindown_msec)
        self.blob = blob

    def frames(self, view: memoryview, pos: int, end: int) -> int:
        out: list[bytes | memoryview] = []
        self.need = 5
        while end - pos >= 5:
            total = 4 + LEN.unpack_from(view, pos)[0]
            if end - pos < total:
                self.need = total
                break
            op = view[pos + 4]
            if op == OP_ECHO:
                out.append(bytes(view[pos : pos + total]))
            elif op == OP_PULL:
                (size,) = SIZE.unpack_from(view, pos + 5)
                out.append(LEN.pack(size + 1) + b"\x01")
                out.append(self.blob[:size])
            else:
                out.append(ACK)
            pos += total
        if out:
            self.transport.writelines(out)
        return pos


async def serve_raw(unix: str | None, ready_fd: int, spindown_msec: float = 0.0) -> None:
    loop = asyncio.get_running_loop()
    blob = memoryview(bytearray(os.urandom(1 << 16) * 256))  # 16 MiB of data (a bytearray: touched pages)
    if unix:
        server = await loop.create_unix_server(lambda: RawServer(blob, spindown_msec), unix)
        address = f"unix://{unix}"
    else:
        server = await loop.create_server(lambda: RawServer(blob, spindown_msec), "127.0.0.1", 0)
        address = f"tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    _ready(ready_fd, address)
    await _until_terminated()
    server.close()


class RawClient(FrameReceiver):
    """Client side of the raw protocol: requests answered in order (one at a time, or pipelined).

    A reply is consumed in place: after a pull completes, ``payload`` is a view of its bytes in the
    receive buffer (valid until the next receive), written there by the kernel.
    """

    def __init__(self, spindown_msec: float = 0.0) -> None:
        super().__init__(spindown_msec=spindown_msec)
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.payload = memoryview(b"")

    def frames(self, view: memoryview, pos: int, end: int) -> int:
        self.need = 5
        while end - pos >= 5:
            total = 4 + LEN.unpack_from(view, pos)[0]
            if end - pos < total:
                self.need = total
                break
            self.payload = view[pos + 5 : pos + total]
            pos += total
            self.waiters.popleft().set_result(None)
        return pos

    def request(self, *parts: bytes | memoryview) -> asyncio.Future[None]:
        """Send a frame (its parts in one ``writelines``: header and payload leave in one ``writev``)."""
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        self.spin.activity()
        if len(parts) == 1:
            self.transport.write(parts[0])
        else:
            self.transport.writelines(parts)
        return fut


async def raw_connect(address: str, spindown_msec: float = 0.0) -> RawClient:
    loop = asyncio.get_running_loop()
    factory = functools.partial(RawClient, spindown_msec)
    if address.startswith("unix://"):
        _, proto = await loop.create_unix_connection(factory, address[7:])
    else:
        host, port = address[6:].rsplit(":", 1)
        _, proto = await loop.create_connection(factory, host, int(port))
    return proto


def raw_noop_frame(payload: int = 0) -> bytes:
    return LEN.pack(1 + payload) + bytes([OP_ECHO]) + bytes(payload)


def raw_pull_frame(size: int) -> bytes:
    return LEN.pack(9) + bytes([OP_PULL]) + SIZE.pack(size)


def raw_push_header(size: int) -> bytes:
    return LEN.pack(1 + size) + bytes([OP_PUSH])


# -- a peer's server process ---------------------------------------------------------------------------------
class PeerServer:
    """A reference server process (``raw``, ``block``, ``msgpack``, ``zmq``, ``grpc``) pinned to a core; its address
    and pid once it accepts connections.

    It runs in a session of its own, as a svcframe server started by ``svcframe.launch`` does (and as a service
    started from its own shell, by srun or by systemd does): with the kernel's autogroups
    (``kernel.sched_autogroup_enabled=1``, most distributions' default) a session is a scheduling group, and on a
    core shared with its client a server in another group is scheduled differently (``sched_yield`` gives the core
    only to tasks of its own group): on a core shared with its client, a server in a session of its own costs more
    per call than one in its client's session, busy or blocking, so a peer compared with svcframe's server must run
    as it does. Out of the terminal's reach, it is killed when the thread that started it ends
    (``svcframe.testing.die_with_parent``): a busy peer left behind by a killed bench would spin on."""

    def __init__(self, kind: str, core: int, unix: str | None = None, spindown_msec: float = 0.0) -> None:
        r, w = os.pipe()
        cmd = [sys.executable, "-m", __spec__.name, kind, "--ready-fd", str(w), "--cpu", str(core)]
        if unix:
            cmd += ["--unix", unix]
        if spindown_msec:
            cmd += ["--spindown-msec", str(spindown_msec)]
        from svcframe.testing import die_with_parent  # (here: a peer's own process imports no more than it runs)

        self.proc = subprocess.Popen(
            cmd, pass_fds=(w,), stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent
        )  # fmt: skip
        os.close(w)
        with os.fdopen(r) as f:
            line = f.readline()
        if not line:
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            self.proc.wait()
            raise RuntimeError(f"{kind} server failed to start: {err[-500:]}")
        info = json.loads(line)
        self.address = info["address"]
        self.pid = info["pid"]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        if self.proc.stderr:
            self.proc.stderr.close()

    def __enter__(self) -> PeerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the machine limit: blocking sockets ---------------------------------------------------------------------
def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    """``recv_into`` until ``view`` is full; on a non-blocking socket, poll (``sched_yield`` between tries)."""
    pos, n = 0, len(view)
    while pos < n:
        try:
            got = sock.recv_into(view[pos:])
        except BlockingIOError:
            os.sched_yield()
            continue
        if not got:
            raise EOFError
        pos += got


def _send_parts(sock: socket.socket, parts: list[memoryview]) -> None:
    """``sendmsg`` (gathered, no copy) until all has left; on a non-blocking socket, poll."""
    while parts:
        try:
            sent = sock.sendmsg(parts)
        except BlockingIOError:
            os.sched_yield()
            continue
        while sent:
            if sent >= len(parts[0]):
                sent -= len(parts[0])
                parts.pop(0)
            else:
                parts[0] = parts[0][sent:]
                sent = 0


def serve_block(unix: str | None, ready_fd: int, poll: bool = False) -> None:
    """The raw protocol's pull and push on blocking sockets: what the kernel and memory allow, with no
    event loop (a C ping-pong's figure: Python's cost per syscall is small next to a 64 KiB copy).

    Each connection on its own thread; headers are read exactly (no over-read), payloads are received
    with ``recv_into`` into a preallocated buffer and sent as memoryviews of ``blob``. ``poll``: the
    sockets are non-blocking and polled (no sleep in the kernel, so no wake-up to pay for)."""
    import signal
    import threading

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # for sigwait, below
    blob = memoryview(bytearray(os.urandom(1 << 16) * 256))
    if unix:
        lsock = socket.socket(socket.AF_UNIX)
        lsock.bind(unix)
        address = f"unix://{unix}"
    else:
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{lsock.getsockname()[1]}"
    lsock.listen()

    def handle(sock: socket.socket) -> None:
        dest = memoryview(bytearray(RECV_BYTES))
        head = memoryview(bytearray(13))
        sock.setblocking(not poll)
        with sock:
            try:
                while True:
                    _recv_exact(sock, head[:5])
                    (length,) = LEN.unpack_from(head)
                    if head[4] == OP_PULL:
                        _recv_exact(sock, head[5:13])
                        (size,) = SIZE.unpack_from(head, 5)
                        _send_parts(sock, [memoryview(LEN.pack(size + 1) + b"\x01"), blob[:size]])
                        continue
                    if length - 1 > len(dest):
                        dest = memoryview(bytearray(length - 1))
                    _recv_exact(sock, dest[: length - 1])
                    reply = [memoryview(ACK)] if head[4] == OP_PUSH else [head[:5], dest[: length - 1]]
                    _send_parts(sock, reply)
            except (EOFError, ConnectionError):
                pass

    def accept() -> None:
        while True:
            sock, _ = lsock.accept()
            if sock.family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=handle, args=(sock,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    _ready(ready_fd, address)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


def block_bulk(address: str, size: int, direction: str, seconds: float, warmup: int = 10, poll: bool = False) -> float:
    """Pull or push ``size`` bytes one request at a time on a blocking socket for ``seconds``: GiB/s.

    The client side of ``serve_block`` (the machine limit): ``recv_into`` a preallocated buffer,
    header and payload in one ``sendmsg``; ``poll``: a non-blocking socket, polled."""

    sock = connect_blocking(address)
    sock.setblocking(not poll)
    data = memoryview(bytearray(os.urandom(1 << 16) * (size // (1 << 16) + 1)))[:size]
    dest = memoryview(bytearray(size + 5))
    ack = memoryview(bytearray(5))
    if direction == "pull":
        request = memoryview(raw_pull_frame(size))

        def op() -> None:
            _send_parts(sock, [request])
            _recv_exact(sock, dest)
    else:
        header = memoryview(raw_push_header(size))

        def op() -> None:
            _send_parts(sock, [header, data])
            _recv_exact(sock, ack)

    with sock:
        for _ in range(warmup):
            op()
        n = 0
        perf = time.perf_counter
        start = perf()
        end = start + seconds
        while perf() < end:
            op()
            n += 1
        elapsed = perf() - start
    return n * size / elapsed / 2**30


# -- the hand-written msgpack RPC ------------------------------------------------------------------------------
def read_data(size: int) -> bytes:
    """``size`` bytes of written data (a repeated random block), what every peer's ``read`` returns."""
    block = os.urandom(4096)
    return (block * (size // len(block) + 1))[:size]


async def serve_msgpack(unix: str | None, ready_fd: int) -> None:
    """The server of the hand-written msgpack RPC (module docstring): read a frame, call, write the reply."""
    import msgpack

    data: dict[int, bytes] = {}

    def read(size: int) -> bytes:
        if size not in data:
            data[size] = read_data(size)
        return data[size]

    methods: dict[str, Callable[..., Any]] = {"noop": lambda: None, "read": read}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (length,) = LEN.unpack(await reader.readexactly(4))
                msgid, method, args = msgpack.unpackb(await reader.readexactly(length))
                try:
                    result, error = methods[method](*args), None
                except Exception as exc:
                    result, error = None, repr(exc)
                body = msgpack.packb([msgid, error, result])
                writer.write(LEN.pack(len(body)) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    if unix:
        server = await asyncio.start_unix_server(handle, unix)
        address = f"unix://{unix}"
    else:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        address = f"tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    _ready(ready_fd, address)
    await _until_terminated()
    server.close()


class MsgpackClient:
    """The client of the hand-written msgpack RPC: ``await client.call(method, *args)``; many calls may be
    in flight (a future per message id, resolved by one reader task)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 0
        self.reading = asyncio.ensure_future(self._read_replies())

    @classmethod
    async def connect(cls, address: str) -> MsgpackClient:
        if address.startswith("unix://"):
            reader, writer = await asyncio.open_unix_connection(address[7:])
        else:
            host, port = address[6:].rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    async def call(self, method: str, *args: Any) -> Any:
        import msgpack

        msgid = self.next_id = self.next_id + 1
        future = self.pending[msgid] = asyncio.get_running_loop().create_future()
        body = msgpack.packb([msgid, method, args])
        self.writer.write(LEN.pack(len(body)) + body)
        return await future

    async def _read_replies(self) -> None:
        import msgpack

        while True:
            (length,) = LEN.unpack(await self.reader.readexactly(4))
            msgid, error, result = msgpack.unpackb(await self.reader.readexactly(length))
            future = self.pending.pop(msgid)
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(RuntimeError(error))

    async def close(self) -> None:
        self.reading.cancel()
        self.writer.close()
        await asyncio.gather(self.reading, self.writer.wait_closed(), return_exceptions=True)


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

    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}")
    parser.add_argument("kind", choices=["raw", "block", "msgpack", "zmq", "grpc"])
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--unix", default=None)
    parser.add_argument("--cpu", type=int, default=None)
    parser.add_argument(
        "--spindown-msec",
        type=float,
        default=0.0,
        help="raw: poll this long after activity (inf: busy); block: poll (any value > 0)",
    )
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, [args.cpu])
    if args.kind == "raw":
        run(serve_raw(args.unix, args.ready_fd, args.spindown_msec))
    elif args.kind == "block":
        serve_block(args.unix, args.ready_fd, poll=args.spindown_msec > 0)
    elif args.kind == "msgpack":
        run(serve_msgpack(args.unix, args.ready_fd))
    elif args.kind == "zmq":
        run(serve_zmq(args.ready_fd), "asyncio")
    else:
        run(serve_grpc(args.ready_fd), "asyncio")


if __name__ == "__main__":
    main(sys.argv[1:])


def connect_blocking(address: str) -> socket.socket:
    """A blocking socket connected to ``tcp://HOST:PORT`` (with TCP_NODELAY) or ``unix:///path``."""
    if address.startswith("unix://"):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(address[7:])
        return sock
    host, port = address[6:].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def blast(kind: str, address: str, depth: int, seconds: float, core: int | None, barrier: Any, out: Any) -> None:
    """Keep ``depth`` noop requests in flight on a raw socket for ``seconds`` and report the replies.

    The client side costs almost nothing (pre-encoded frames, replies counted by size), so the server is
    the bottleneck: what a saturation measurement needs. ``kind`` is "raw" (the echo protocol above) or
    "svcframe" (handshake with the shared secret from SVCFRAME_SECRET, then ``work`` requests to provider 1).
    """

    if core is not None:
        os.sched_setaffinity(0, [core])
    sock = connect_blocking(address)
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
        if secret and info.get("auth"):  # the mutual handshake (svcframe.wire): our proof, then the server's
            peer = sock.getpeername()
            via = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
            nonce = os.urandom(16)
            mac = auth_mac(secret.encode(), "client", info["nonce"], nonce, info["engine_id"], me, via)
            reply.update(nonce=nonce, via=via, mac=mac)
        sock.sendall(encode_frame(Kind.HELLO, 0, pack_body(reply)))
        if secret and info.get("auth"):
            proof = hello[HEADER_SIZE + LEN.unpack_from(hello, 12)[0] :]
            while len(proof) < HEADER_SIZE or len(proof) < HEADER_SIZE + LEN.unpack_from(proof, 12)[0]:
                proof += sock.recv(65536)
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
