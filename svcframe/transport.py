"""Transports: ``tcp://HOST:PORT`` and ``unix:///path`` as asyncio ``BufferedProtocol`` pumps.

A ``Connection`` owns one socket and one sans-IO ``FrameDecoder``. It receives straight into the
decoder's buffer (or, for bulk data, into the destination buffer), performs the connection handshake
(engine identities and, with a shared secret, the HMAC challenge), and hands complete frames in batches
to its *owner* (the engine). Everything a connection sends while a received batch is being dispatched
leaves in one ``writelines`` call at the end of the batch.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import cma
from .errors import AuthenticationFailed, ConfigError, ConnectionLost, ProtocolError, RemoteProtocolError
from .wire import (
    DEFAULT_MAX_BODY_BYTES,
    Frame,
    FrameDecoder,
    Kind,
    Status,
    auth_mac,
    encode_frame,
    pack_body,
    unpack_body,
)

log = logging.getLogger("svcframe.transport")

SCHEMES = ("tcp", "unix")
#: Largest output buffer a connection may hold before its peer is considered a slow reader and
#: disconnected (bytes). Bulk transfers wait for the buffer to drain instead of filling it.
DEFAULT_MAX_OUTPUT_BYTES = 8 * 1024 * 1024
#: A peer must complete the handshake within this time, or it is disconnected (seconds).
DEFAULT_HANDSHAKE_TIMEOUT_SECONDS = 10.0
#: Replies of one received batch are written as soon as they pass this many bytes (bounded memory).
BATCH_FLUSH_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Address:
    """A parsed endpoint address. ``str(addr)`` gives the canonical form peers dial."""

    scheme: str
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        if self.scheme == "unix":
            return True
        import ipaddress

        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


def parse_address(text: str) -> Address:
    """Parse ``tcp://HOST:PORT`` (port 0 = ephemeral; ``[v6]`` hosts) or ``unix:///absolute/path``.

    Raises:
        ConfigError: the address is not of either form.
    """
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ConfigError(f"address {text!r}: expected tcp://HOST:PORT or unix:///path")
    if scheme == "unix":
        if not rest.startswith("/"):
            raise ConfigError(f"address {text!r}: a unix socket path must be absolute (unix:///tmp/x.sock)")
        if len(rest.encode()) > 107:
            raise ConfigError(f"address {text!r}: unix socket paths are limited to 107 bytes")
        return Address("unix", path=rest)
    host, sep, port_text = rest.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"address {text!r}: expected tcp://HOST:PORT with PORT in 0..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return Address("tcp", host=host, port=int(port_text))


class ConnectionOwner(Protocol):
    """What a connection reports to (the engine)."""

    def on_frames(self, conn: Connection, frames: list[Frame]) -> None: ...
    def on_open(self, conn: Connection) -> None: ...
    def on_close(self, conn: Connection, exc: BaseException | None) -> None: ...
    def admit(self, conn: Connection) -> str | None: ...
    def bulk_sink(self, conn: Connection, kind: int, request_id: int, length: int) -> memoryview: ...


@dataclass(frozen=True)
class Identity:
    """This side of the handshake: who we are and how we authenticate."""

    engine_id: str
    address: str | None  # where peers can dial us (None for a client-only engine)
    secret: bytes | None = None
    cma: bool = False  # we serve and make same-node bulk transfers by cross-memory attach (svcframe.cma)


class Connection(asyncio.BufferedProtocol):
    """One connection, either dialled (``server_side=False``) or accepted (``server_side=True``).

    Attributes:
        peer_engine_id / peer_address: learnt from the peer's HELLO.
        ready: resolved when the handshake completed (or failed, with the error).
        pending: the owner's outgoing calls on this connection, by request id.
        state: free per-connection state for the owner.
    """

    def __init__(
        self,
        owner: ConnectionOwner,
        identity: Identity,
        *,
        server_side: bool,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        handshake_timeout_seconds: float = DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
    ) -> None:
        self.owner = owner
        self.handshake_timeout_seconds = handshake_timeout_seconds
        self.authenticated = False  # the peer proved the shared secret (server side) / we proved it (client side)
        self.last_activity = 0.0  # monotonic time the last frame completed
        self.frame_started = 0.0  # monotonic time the frame under way began arriving (0: none known)
        self.reading_paused = False
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._batch_bytes = 0
        self.writes = 0  # calls into the transport's write path (a received batch's replies make one)
        self.records: dict[Any, Any] = {}  # the owner's per-connection statistics cache
        self.identity = identity
        self.server_side = server_side
        self.max_output_bytes = max_output_bytes
        self.decoder = FrameDecoder(max_body_bytes, self._bulk_sink)
        self.transport: asyncio.Transport | None = None
        self.peer_engine_id: str | None = None
        self.peer_address: str | None = None
        self.peername: str = "?"
        self.peer_pid: int | None = None  # the peer's pid, from the kernel (unix sockets only)
        self.peer_start_time: int | None = None  # its start time then (pids are reused: svcframe.cma)
        self.peer_cma = False  # the peer serves bulk transfers by cross-memory attach (from its HELLO)
        self.peer_label: str = "?"
        self.peer_host: str | None = None  # the peer's IP address (tcp); None for unix sockets
        self.admitted = False  # counted against the owner's connection caps (server side)
        self.close_reason: ConnectionLost | None = None  # why the peer closed, when it said so
        self.peer_max_body_bytes = DEFAULT_MAX_BODY_BYTES  # the largest body the peer accepts (from HELLO)
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.pending: dict[int, Any] = {}
        self.serving: dict[int, Any] = {}
        self.state: dict[str, Any] = {}
        self._next_id = 0
        self._nonce = b""  # the server's nonce (ours on the server side)
        self._client_nonce = b""  # the client's nonce of a mutual handshake (client side, once sent)
        self._open = False
        self._batch: list[bytes | memoryview] | None = None
        self._paused = False
        self._writelines_pauses = False  # set per transport in connection_made
        self._drain: asyncio.Future[None] | None = None

    # -- ids -----------------------------------------------------------------------------------------
    def next_request_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- asyncio.BufferedProtocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.last_activity = time.monotonic()
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # half-open peers are found by the OS
        self.peer_pid = cma.peer_pid(sock)
        self.peer_start_time = cma.start_time(self.peer_pid) if self.peer_pid is not None else None
        peer = transport.get_extra_info("peername")
        self.peername = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else (str(peer) if peer else "local")
        self.peer_label = self.peername  # the peer's address once known, for statistics
        self.peer_host = peer[0] if isinstance(peer, tuple) else None
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        # uvloop's writelines pauses the protocol over the high-water mark; the stdlib's does not on CPython
        # 3.12.0-3.12.8 and 3.13.0-3.13.1 (gh-127655: 32 MiB queued behind 4 MiB, then healthy peers dropped
        # as slow readers), so there one write() per part, each of which checks the mark.
        self._writelines_pauses = type(transport).__module__.startswith("uvloop")
        if self.server_side:
            refusal = self.owner.admit(self)
            if refusal is not None:  # over a connection cap: say why and close; the peer pays its descriptor
                self.closed = True
                transport.write(encode_frame(Kind.GOODBYE, 0, pack_body(refusal), status=Status.OVERLOADED))
                transport.close()
                return
            self._nonce = secrets.token_bytes(16)
            hello = {
                "engine_id": self.identity.engine_id,
                "address": self.identity.address,
                "nonce": self._nonce,
                "auth": self.identity.secret is not None,
                "max_body_bytes": self.decoder.max_body_bytes,
                "cma": self.identity.cma,
            }
            transport.write(encode_frame(Kind.HELLO, 0, pack_body(hello)))
            loop = asyncio.get_running_loop()
            self._handshake_timer = loop.call_later(self.handshake_timeout_seconds, self._handshake_deadline)

    def _handshake_deadline(self) -> None:
        if not self._open and not self.closed:
            self.abort(RemoteProtocolError(f"no handshake within {self.handshake_timeout_seconds:g} s"))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self.decoder.buffer_updated(nbytes)
            if not frames:
                if not self.frame_started:  # a frame is under way: the owner's sweep bounds how long it takes
                    self.frame_started = time.monotonic()
                return
            self.last_activity = time.monotonic()  # activity = a frame completed, not a byte received
            self.frame_started = 0.0
            if not self._open:
                frames = self._handshake(frames) or self.decoder.more()
                if not frames or not self._open:
                    return
            self._batch = batch = []
            self._batch_bytes = 0
            decoder = self.decoder
            try:
                while frames:
                    self.owner.on_frames(self, frames)
                    frames = decoder.more() if decoder.held else None
            finally:
                self._batch = None
                if batch and not self.closed:
                    self._write(batch)
        except ProtocolError as exc:
            self.abort(exc)

    def pause_reading(self) -> None:
        """Stop reading requests (per-connection in-flight cap reached): TCP backpressure to the peer."""
        if not self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = False
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()  # else it keeps the connection (and its buffers) alive
        if exc is None and not self.decoder.idle:
            exc = ConnectionLost("peer closed the connection in the middle of a frame")
        self.decoder.close()  # drop the buffers, the bulk destination and the sink (a reference cycle)
        if not self.ready.done():
            self.ready.set_exception(exc or ConnectionLost(f"connection to {self.peername} closed in handshake"))
            self.ready.exception()  # mark retrieved; the dialler re-raises it
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self.owner.on_close(self, exc)

    @property
    def writing_paused(self) -> bool:
        """The output buffer is above its high-water mark: wait (``drain``) before writing bulk data."""
        return self._paused

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- sending -------------------------------------------------------------------------------------
    def send(self, data: bytes | memoryview) -> None:
        """Send one encoded frame (or a part of one). Coalesced while a received batch is dispatched."""
        batch = self._batch
        if batch is not None:
            batch.append(data)
            self._batch_bytes += len(data)
            if self._batch_bytes > BATCH_FLUSH_BYTES:
                self._flush_batch()
        elif not self.closed:
            assert self.transport is not None
            self.writes += 1
            self.transport.write(data)
            if self._paused:
                self._check_output()

    def _flush_batch(self) -> None:
        """Write what a large batch has produced so far (bounds its memory; checks the output cap)."""
        batch = self._batch
        if batch and not self.closed:
            self._write(batch)
        if batch is not None:
            batch.clear()
        self._batch_bytes = 0

    def send_many(self, parts: Sequence[bytes | memoryview]) -> None:
        batch = self._batch
        if batch is not None:
            batch.extend(parts)
            self._batch_bytes += sum(len(p) for p in parts)
            if self._batch_bytes > BATCH_FLUSH_BYTES:
                self._flush_batch()
        elif not self.closed:
            self._write(parts)

    def _write(self, parts: Sequence[bytes | memoryview]) -> None:
        assert self.transport is not None
        self.writes += 1
        if len(parts) == 1:
            self.transport.write(parts[0])
        elif self._writelines_pauses:
            self.transport.writelines(parts)
        else:  # each write() checks the high-water mark (the stdlib's writelines may not: CPython gh-127655)
            write = self.transport.write
            for part in parts:
                write(part)
        if self._paused:  # over the high-water mark: is it over the cap?
            self._check_output()

    def _check_output(self) -> None:
        if (
            self._paused
            and self.transport is not None
            and self.transport.get_write_buffer_size() > self.max_output_bytes
        ):
            self.abort(ConnectionLost(f"peer {self.peername} does not read its data (slow reader)"))

    async def drain(self) -> None:
        """Wait until the output buffer is below its high-water mark (write-side backpressure).

        Several senders (concurrent bulk transfers) may wait together; when writing resumes each one
        re-checks before returning, so they refill the buffer one chunk at a time instead of all at once
        (which would overshoot the output cap and look like a slow reader).
        """
        while True:
            if self.closed:
                raise ConnectionLost(f"connection to {self.peername} is closed")
            if not self._paused:
                return
            if self._drain is None or self._drain.done():
                self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    def goodbye(self, status: Status, reason: str) -> None:
        """Tell the peer why we close, then close after the output is flushed."""
        if not self.closed and self.transport is not None:
            self.send(encode_frame(Kind.GOODBYE, 0, pack_body(reason), status=status))
            self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def abort(self, exc: BaseException, *, expected: bool = False) -> None:
        """Drop the connection at once (protocol violation, slow reader). ``expected``: our own decision
        that needs no warning (a dial nobody waits for any more), logged at debug level."""
        if not self.closed:
            log.log(logging.DEBUG if expected else logging.WARNING, "dropping connection %s: %s", self.peername, exc)
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- handshake -----------------------------------------------------------------------------------
    def _handshake(self, frames: list[Frame]) -> list[Frame]:
        first, rest = frames[0], frames[1:]
        if first.kind == Kind.GOODBYE:
            if not self.ready.done():
                self.ready.set_exception(goodbye_error(self, first))
            self.close()
            return []
        if first.kind != Kind.HELLO:
            raise RemoteProtocolError(f"expected HELLO first, got frame kind {first.kind}")
        hello = unpack_body(first.body or b"")
        if not isinstance(hello, dict):
            raise RemoteProtocolError("malformed HELLO")
        if self._client_nonce:  # the server's proof, second HELLO of a mutual handshake
            return self._check_server_proof(hello, rest)
        if not isinstance(hello.get("engine_id"), str):
            raise RemoteProtocolError("malformed HELLO")
        self.peer_engine_id = hello["engine_id"]
        addr = hello.get("address")
        self.peer_address = addr if isinstance(addr, str) else None
        # Statistics are kept per peer label: a server's address, or for client-only peers (no address) one
        # label per client host, so churn of short connections from ephemeral ports adds no record (issue 13).
        self.peer_label = self.peer_address or f"clients@{self.peer_host or 'local'}"
        self.peer_cma = hello.get("cma") is True and self.peer_pid is not None
        limit = hello.get("max_body_bytes")
        if isinstance(limit, int) and limit > 0:
            self.peer_max_body_bytes = limit
        secret = self.identity.secret
        assert self.transport is not None
        if self.server_side:
            if secret is not None:
                mac, client_nonce = hello.get("mac"), hello.get("nonce")
                via = hello.get("via")
                ok = isinstance(mac, bytes) and isinstance(client_nonce, bytes) and len(client_nonce) == 16
                ok = ok and via == self._local_endpoint()  # a relay's client dialled another endpoint
                if ok:
                    expect = auth_mac(secret, "client", self._nonce, client_nonce, self.identity.engine_id,
                                      self.peer_engine_id, via)  # fmt: skip
                    ok = hmac.compare_digest(mac, expect)
                if not ok:
                    log.warning("refused connection from %s: authentication failed", self.peername)
                    self.goodbye(Status.UNAUTHENTICATED, "authentication failed (shared secret)")
                    return []
                proof = auth_mac(secret, "server", self._nonce, client_nonce, self.identity.engine_id,
                                 self.peer_engine_id, self._remote_endpoint())  # fmt: skip
                self.transport.write(encode_frame(Kind.HELLO, 0, pack_body({"mac": proof})))
                self.authenticated = True
        else:
            nonce = hello.get("nonce")
            if not isinstance(nonce, bytes) or len(nonce) != 16:
                raise RemoteProtocolError("HELLO without a 16-byte nonce")
            reply: dict[str, Any] = {
                "engine_id": self.identity.engine_id,
                "address": self.identity.address,
                "max_body_bytes": self.decoder.max_body_bytes,
                "cma": self.identity.cma,
            }
            if secret is not None:
                if not hello.get("auth"):  # a holder of the secret talks only to servers that prove it
                    self._refuse_server(f"{self.peername} does not authenticate (no shared secret configured)")
                    return []
                self._nonce, self._client_nonce = nonce, secrets.token_bytes(16)
                via = self._remote_endpoint()
                reply.update(nonce=self._client_nonce, via=via, mac=auth_mac(
                    secret, "client", nonce, self._client_nonce, self.peer_engine_id, self.identity.engine_id, via
                ))  # fmt: skip
                self.transport.write(encode_frame(Kind.HELLO, 0, pack_body(reply)))
                return self._handshake(rest) if rest else []  # open once the server's proof arrives
            if hello.get("auth"):
                self._refuse_server(f"{self.peername} requires a shared secret and none is configured")
                return []
            self.transport.write(encode_frame(Kind.HELLO, 0, pack_body(reply)))
        return self._opened(rest)

    def _check_server_proof(self, hello: dict[str, Any], rest: list[Frame]) -> list[Frame]:
        mac = hello.get("mac")
        expect = auth_mac(self.identity.secret or b"", "server", self._nonce, self._client_nonce,
                          self.peer_engine_id or "", self.identity.engine_id, self._local_endpoint())  # fmt: skip
        if not isinstance(mac, bytes) or not hmac.compare_digest(mac, expect):
            self._refuse_server(f"{self.peername} did not prove the shared secret (an impostor or a relay?)")
            return []
        self.authenticated = True
        return self._opened(rest)

    def _opened(self, rest: list[Frame]) -> list[Frame]:
        self._open = True
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self.owner.on_open(self)
        if not self.ready.done():
            self.ready.set_result(None)
        return rest

    def _refuse_server(self, reason: str) -> None:
        if not self.ready.done():
            self.ready.set_exception(AuthenticationFailed(reason))
        self.close()

    def _local_endpoint(self) -> str:
        """Our end of the connection: "host:port" (tcp) or the socket path (unix)."""
        return _endpoint(self.transport.get_extra_info("sockname") if self.transport is not None else None)

    def _remote_endpoint(self) -> str:
        """The peer's end of the connection as our socket sees it."""
        return _endpoint(self.transport.get_extra_info("peername") if self.transport is not None else None)

    def _bulk_sink(self, kind: int, request_id: int, length: int) -> memoryview:
        return self.owner.bulk_sink(self, kind, request_id, length)


def _endpoint(name: Any) -> str:
    if isinstance(name, tuple):
        return f"{name[0]}:{name[1]}"
    if isinstance(name, bytes):
        return name.decode(errors="replace")
    return str(name or "")


def goodbye_error(conn: Connection, frame: Frame) -> ConnectionLost:
    """The error a GOODBYE frame means for the calls pending on its connection."""
    reason = _safe_text(frame.body)
    if frame.status == Status.UNAUTHENTICATED:
        return AuthenticationFailed(f"{conn.peername} refused the connection: {reason}")
    return ConnectionLost(f"{conn.peername} closed the connection: {reason}")


def _safe_text(body: bytes | bytearray | None) -> str:
    try:
        value = unpack_body(body or b"")
    except ProtocolError:
        return "(unreadable reason)"
    return str(value)[:500]


ConnFactory = Callable[[], Connection]


async def listen(
    address: Address, factory: ConnFactory, *, backlog: int = 1024
) -> tuple[asyncio.AbstractServer, Address]:
    """Start listening; return the server and the address actually bound (port 0 resolved).

    Raises:
        ConnectionLost: the address cannot be bound (in use, permission, no such interface).
    """
    loop = asyncio.get_running_loop()
    try:
        if address.scheme == "unix":
            _remove_stale_socket(address.path)
            server = await loop.create_unix_server(factory, address.path, backlog=backlog)
            return server, address
        server = await loop.create_server(factory, address.host, address.port, backlog=backlog, reuse_address=True)
    except OSError as exc:
        raise ConnectionLost(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    port = server.sockets[0].getsockname()[1]
    return server, Address("tcp", address.host, port)


def _remove_stale_socket(path: str) -> None:
    """Remove a unix socket file left by a dead process; refuse to steal a live one, and never remove
    anything that is not a socket (a mistyped address must not delete a user's file: issue 13)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConnectionLost(f"cannot listen on unix://{path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        kind = "directory" if stat.S_ISDIR(mode) else "symbolic link" if stat.S_ISLNK(mode) else "file"
        raise ConnectionLost(f"cannot listen on unix://{path}: a {kind} is there, not a stale socket (left as it is)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise ConnectionLost(f"cannot listen on unix://{path}: another process is listening there")


async def dial(address: Address, factory: ConnFactory, *, local_host: str | None = None) -> Connection:
    """Open a connection (not yet handshaken: await ``conn.ready``).

    Raises:
        ConnectionLost: the peer cannot be reached.
    """
    loop = asyncio.get_running_loop()
    try:
        if address.scheme == "unix":
            _, conn = await loop.create_unix_connection(factory, address.path)
        else:
            local = (local_host, 0) if local_host else None
            _, conn = await loop.create_connection(factory, address.host, address.port, local_addr=local)
    except OSError as exc:
        raise ConnectionLost(f"cannot connect to {address}: {exc.strerror or exc}") from exc
    return conn
