"""Transports: ``tcp://HOST:PORT`` and ``unix:///path`` as asyncio ``BufferedProtocol`` pumps.

A ``Connection`` owns one socket and pumps bytes through one sans-IO ``svcframe.protocol.Protocol``,
which holds the connection's whole state (phase, handshake, tables). It receives straight into the
protocol's buffer (or, for bulk data, into the destination buffer), writes what the protocol produces,
and hands complete frames in batches to its *owner* (the engine). Everything a connection sends while a
received batch is being dispatched leaves in one write at the end of the batch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import cma
from .errors import ConfigError, ConnectionLost, ProtocolError, RemoteProtocolError, Status
from .protocol import Closed, Identity, Opened, Role
from .protocol import Protocol as ProtocolState
from .wire import (
    DEFAULT_BULK_CHUNK_BYTES,
    DEFAULT_MAX_BODY_BYTES,
    Frame,
    Kind,
    encode_frame,
    encode_header,
    pack_body,
)

try:
    import cython
except ModuleNotFoundError:  # interpreted where Cython is not installed
    from . import _cython as cython

if not cython.compiled:  # (compiled: wire.pxd's C constants)
    from .wire import F_NO_REPLY

log = logging.getLogger("svcframe.transport")

SCHEMES = ("tcp", "unix")
#: Largest output buffer a connection may hold before its peer is considered a slow reader and
#: disconnected (bytes). Bulk transfers wait for the buffer to drain instead of filling it.
DEFAULT_MAX_OUTPUT_BYTES = 8 * 1024 * 1024
#: A peer must complete the handshake within this time, or it is disconnected (seconds).
DEFAULT_HANDSHAKE_TIMEOUT_SECONDS = 10.0
if not cython.compiled:  # (compiled: transport.pxd's C constants, which this module also exports as ints)
    #: Replies of one received batch are written as soon as they pass this many bytes (bounded memory).
    BATCH_FLUSH_BYTES = 1024 * 1024
    #: Frames of one connection dispatched in one turn of the loop; the rest wait for the next turn, reading
    #: paused (Connection._dispatch): a peer's pipelined flood does not hold up the other connections (a
    #: read of 256 KiB holds about 2,600 small requests, tens of milliseconds of handlers; 256 are a tenth).
    FRAMES_PER_TURN = 256


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


class ConnectionOwner:
    """What a connection reports to (the engine's ``svcframe.connections.Connections``): the interface, whose
    methods a subclass defines."""

    def on_frames(self, conn: Connection, frames: list[Frame]) -> None:
        """A batch of frames received on ``conn``: dispatch them, in order."""
        raise NotImplementedError

    def on_answers(self, conn: Connection) -> None:
        """A read of ``conn`` completed frames its decoder completed itself (answers to our calls)."""
        raise NotImplementedError

    def on_open(self, conn: Connection) -> None:
        """``conn`` completed its handshake."""
        raise NotImplementedError

    def on_close(self, conn: Connection, exc: BaseException | None) -> None:
        """``conn`` is gone (``exc``: why, when the transport knows)."""
        raise NotImplementedError

    def admit(self, conn: Connection) -> str | None:
        """An accepted ``conn``: None to take it, else the refusal sent to its peer."""
        raise NotImplementedError


class Connection:
    """The asyncio pump around one connection's sans-IO ``svcframe.protocol.Protocol``: it receives into
    the protocol's buffers, writes what the protocol and the owner produce, reports the handshake's outcome
    and hands the frames of each received batch to its *owner* (the engine). Everything sent while a
    batch is dispatched leaves in one write at the end of the batch. ``ConnectionProtocol`` is the asyncio
    protocol class that listeners and dials make.

    Attributes:
        protocol: the connection's state (phase, handshake, tables).
        pending / serving: the protocol's tables of outgoing calls and served requests, by request id.
        peer_engine_id / peer_address / peer_max_body_bytes / peer_cma / peer_cma_write / authenticated: from the handshake
            (``protocol.peer``), copied here once it completes.
        ready: resolved when the handshake completed (or failed, with the error).
        records: the owner's per-connection statistics cache.
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
        max_inflight: int = 1024,
        bulk_chunk_bytes: int = DEFAULT_BULK_CHUNK_BYTES,
        dialled_address: str | None = None,
    ) -> None:
        self.owner = owner
        self.dialled_address = dialled_address
        self.bulk_chunk_bytes = bulk_chunk_bytes
        self.server_side = server_side
        self.protocol = proto = ProtocolState(
            Role.SERVER if server_side else Role.CLIENT, identity, max_body_bytes=max_body_bytes,
            max_pushes=max_inflight,
        )  # fmt: skip
        self._decoder = proto.decoder
        self.pending = proto.pending
        self.serving = proto.serving
        self.max_output_bytes = max_output_bytes
        self.handshake_timeout_seconds = handshake_timeout_seconds
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.close_reason: ConnectionLost | None = None  # why the peer closed, when it said so
        self.reading_paused = False
        self.last_activity = 0.0  # monotonic time the last frame completed
        self.frame_started = 0.0  # monotonic time the frame under way began arriving (0: none known)
        self.writes = 0  # calls into the transport's write path (a received batch's replies make one)
        self.records: dict[Any, Any] = {}
        # who the peer is: the socket's view now, the handshake's once it completes
        self.peername = "?"
        self.peer_label = "?"  # the statistics key: the peer's address, or clients@HOST
        self.peer_host: str | None = None  # the peer's IP address (tcp); None for unix sockets
        self.peer_pid: int | None = None  # the peer's pid, from the kernel (unix sockets only)
        self.peer_process: cma.PeerProcess | None = None  # that process (pids are reused: svcframe.cma)
        self.peer_engine_id: str | None = None
        self.peer_address: str | None = None
        self.peer_max_body_bytes = DEFAULT_MAX_BODY_BYTES
        self.peer_cma = False
        self.peer_cma_write = False
        self.peer_cma_offer = False
        self.peer_cma_split_push = False
        self.peer_push_ahead = False  # a handler of ours may push into its caller's buffer ahead of its answer
        #: the share of a split read the peer writes, asked after its answer (svcframe.bulk._cma_read) and
        #: offered before it (svcframe.bulk._offer_write), each adapted per read (0: not yet)
        self.split_share = 0.0
        self.offer_share = 0.0
        #: split-read writes this peer may still ask of us now, in seconds of writing (svcframe.bulk), and
        #: when that was reckoned (time.monotonic())
        self.cma_write_allowance = 0.0
        self.cma_write_reckoned = 0.0
        self.authenticated = False
        self.admitted = False  # counted against the owner's connection caps (server side)
        self._open = False
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._batch: list[bytes | memoryview] | None = None
        self._batch_bytes = 0
        self._paused = False
        self._writelines_pauses = False  # set per transport in connection_made
        self._drain: asyncio.Future[None] | None = None
        self._cork: list[bytes | memoryview] | None = None  # requests held until the loop's next turn
        self._backlog: list[Frame] | None = None  # frames received beyond one turn's share (FRAMES_PER_TURN)

    # -- asyncio.BufferedProtocol ---------------------------------------------------------------------
    # a stream protocol is given its stream's transport, which writes (typeshed: any BaseTransport)
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.last_activity = time.monotonic()
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # half-open peers are found by the OS
        self.peer_pid = cma.peer_pid(sock)
        self.peer_process = cma.PeerProcess(self.peer_pid) if self.peer_pid is not None else None
        peer = transport.get_extra_info("peername")
        self.peername = self.peer_label = (
            f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else (str(peer) if peer else "local")
        )
        self.peer_host = peer[0] if isinstance(peer, tuple) else None
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        # uvloop's writelines pauses the protocol over the high-water mark; the stdlib's does not on CPython
        # 3.12.0-3.12.8 and 3.13.0-3.13.1 (gh-127655: the buffer grows far past the mark, then healthy peers
        # are dropped as slow readers), so there one write() per part, each of which checks the mark.
        self._writelines_pauses = type(transport).__module__.startswith("uvloop")
        if self.server_side:
            refusal = self.owner.admit(self)
            if refusal is not None:  # over a connection cap: say why and close; the peer pays its descriptor
                self.closed = True
                transport.write(self.protocol.goodbye(Status.OVERLOADED, refusal))
                transport.close()
                return
        self.protocol.connection_made(
            _endpoint(transport.get_extra_info("sockname")), _endpoint(peer), peer_on_node=self.peer_pid is not None
        )
        self._write_protocol_output()
        if self.server_side:
            loop = asyncio.get_running_loop()
            self._handshake_timer = loop.call_later(self.handshake_timeout_seconds, self._handshake_deadline)

    def _handshake_deadline(self) -> None:
        if not self._open and not self.closed:
            self.abort(RemoteProtocolError(f"no handshake within {self.handshake_timeout_seconds:g} s"))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(sizehint)  # (in every phase: the handshake's frames too)

    def next_request_id(self) -> int:
        """A fresh request id for an outgoing call or bulk transfer (``Protocol.next_request_id``).

        Raises:
            LocalProtocolError: the connection failed or was never opened.
        """
        return self.protocol.next_request_id()

    def buffer_updated(self, nbytes: int) -> None:
        if self.closed:
            return
        proto = self.protocol
        frames: list[Frame] | None
        try:
            # open: the decoder itself (what Protocol.receive does in OPEN, one call fewer per read)
            frames = self._decoder.buffer_updated(nbytes) if self._open else self._handshake_step(proto.receive(nbytes))
            if not frames:
                if frames is None:  # the decoder answered our calls itself (FrameDecoder.answers): frames completed
                    self.last_activity = now = time.monotonic()
                    self.frame_started = 0.0 if proto.decoder.idle else now
                    self.owner.on_answers(self)
                elif not self.frame_started:  # a frame is under way: the owner's sweep bounds how long it takes
                    self.frame_started = time.monotonic()
                return
            # activity = a frame completed, not a byte received; a frame begun behind it is timed from now
            self.last_activity = now = time.monotonic()
            self.frame_started = 0.0 if proto.decoder.idle else now
            self._dispatch(frames)
        except ProtocolError as exc:
            proto.fail(exc)
            self.abort(exc)

    def _dispatch(self, frames: list[Frame] | None) -> None:
        """Hand received frames to the owner, at most FRAMES_PER_TURN in this turn of the loop (the rest wait,
        reading paused, for the next: a peer's pipelined flood does not hold up the other connections); the
        replies they produce leave in one write."""
        proto = self.protocol
        batch: list[bytes | memoryview]
        self._batch = batch = []
        self._batch_bytes = 0
        try:
            while frames:
                if len(frames) > FRAMES_PER_TURN:
                    frames = self._defer(frames)
                self.owner.on_frames(self, frames)
                frames = proto.more() if proto.decoder.held and self._backlog is None else None
        finally:
            self._batch = None
            if batch and not self.closed:
                self._write(batch)

    def _defer(self, frames: list[Frame]) -> list[Frame]:
        """Keep the frames past this turn's share for the next turn (reading paused meanwhile); return the share."""
        self._backlog = frames[FRAMES_PER_TURN:]
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
        asyncio.get_running_loop().call_soon(self._next_turn)
        return frames[:FRAMES_PER_TURN]

    def _next_turn(self) -> None:
        frames, self._backlog = self._backlog, None
        if self.closed or not frames:
            return
        try:
            self._dispatch(frames)
        except ProtocolError as exc:
            self.protocol.fail(exc)
            self.abort(exc)
            return
        if self._backlog is None and not self.reading_paused and self.transport is not None and not self.closed:
            self.transport.resume_reading()  # (unless backpressure paused it: resume_reading then)

    def _handshake_step(self, events: list[Any] | None) -> list[Frame]:
        """Send what the handshake produced and act on its outcome (the protocol's Opened / Closed events);
        return the frames after it."""
        self._write_protocol_output()
        if not events:
            return []
        self.last_activity = time.monotonic()
        event = events[0]
        if isinstance(event, Opened):
            peer = event.peer
            self.peer_engine_id, self.peer_address = peer.engine_id, peer.address
            self.peer_max_body_bytes, self.authenticated = peer.max_body_bytes, peer.authenticated
            self.peer_cma, self.peer_cma_write, self.peer_cma_offer = peer.cma, peer.cma_write, peer.cma_offer
            self.peer_cma_split_push, self.peer_push_ahead = peer.cma_split_push, peer.push_ahead
            # Statistics are kept per peer label: a server's address, or for client-only peers (no address) one
            # label per client host, so churn of short connections from ephemeral ports adds no record.
            self.peer_label = peer.address or f"clients@{self.peer_host or 'local'}"
            self._open = True
            # our calls' futures, which the decoder answers itself (what on_frames would do), and the into= calls'
            # pulls, whose one data frame is their answer
            self._decoder.answers = self.pending
            self._decoder.into_pulls = self.protocol.pulls
            if self._handshake_timer is not None:
                self._handshake_timer.cancel()
                self._handshake_timer = None
            self.owner.on_open(self)
            if not self.ready.done():
                self.ready.set_result(None)
            return events[1:] or self.protocol.more()
        if isinstance(event, Closed):
            if event.by_us and self.server_side:
                log.warning("refused connection from %s: %s", self.peername, event.error)
            self.close_reason = event.error
            if not self.ready.done():
                self.ready.set_exception(event.error)
                self.ready.exception()  # mark retrieved: only a dialler awaits it (and re-raises it)
            self.close()
        return []

    def _write_protocol_output(self) -> None:
        out = self.protocol.data_to_send()
        if out and self.transport is not None and not self.closed:
            for data in out:
                self.transport.write(data)

    @property
    def whole_frame_bytes(self) -> int:
        """The largest data that leaves as one frame in one write, with no drain: what the peer takes in one
        frame (its max_body_bytes), and at most half our slow-reader cap (max_output_bytes), so that one write
        never trips it. Larger data goes in chunks behind backpressure."""
        return min(self.peer_max_body_bytes, self.max_output_bytes // 2)

    def pause_reading(self) -> None:
        """Stop reading requests (per-connection in-flight cap reached): TCP backpressure to the peer."""
        if not self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = False
            if self._backlog is None:  # (else the backlog's last turn resumes it)
                self.transport.resume_reading()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.peer_process is not None:
            self.peer_process.close()
        # Frames still waiting for their turn are dropped, as a batch's frames behind a GOODBYE or a bad frame
        # always were. (The peer's end cannot overtake them: its EOF is read only once reading resumes.)
        self._backlog = None
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()  # else it keeps the connection (and its buffers) alive
        cut = self.protocol.connection_lost()  # releases the buffers, bulk destinations and the sink
        if exc is None:
            exc = cut
        if not self.ready.done():
            if exc is not None and not isinstance(exc, OSError):
                self.ready.set_exception(exc)
            else:  # a reset from the peer's kernel (an OSError) reaches the dialler as ConnectionLost, as any loss
                lost = ConnectionLost(
                    f"connection to {self.peername} closed in handshake" + (f": {exc}" if exc else "")
                )
                lost.__cause__ = exc
                self.ready.set_exception(lost)
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
            transport = self.transport
            assert transport is not None
            self.writes += 1
            transport.write(data)
            if transport.get_write_buffer_size() > self.max_output_bytes:  # the slow-reader cap (see _write)
                self._slow_reader()

    def send_request(self, data: bytes, corked: bool) -> None:
        """Send a request. ``corked`` (other requests of ours are in flight here): hold it until the loop's
        next turn, so the requests a batch of responses sets off leave in one write (one system call where
        there were as many as requests: the client's largest cost per call at depth > 1)."""
        if not corked or self._batch is not None or self.closed:
            self.send(data)  # (one call deeper than a direct write: measured, not worth a second copy of send)
            return
        cork = self._cork
        if cork is None:
            self._cork = cork = []
            asyncio.get_running_loop().call_soon(self._uncork)
        cork.append(data)

    def _uncork(self) -> None:
        cork, self._cork = self._cork, None
        if cork and not self.closed:
            self._write(cork)

    def flush(self) -> None:
        """Write what was sent so far now, even inside a received batch (before a long synchronous step that
        the peer should not wait for, as ``svcframe.bulk_serving._lend``'s write of an offered part)."""
        if self._batch:
            self._flush_batch()

    def _flush_batch(self) -> None:
        """Write what a large batch has produced so far (bounds its memory; checks the output cap)."""
        batch = self._batch
        if batch and not self.closed:
            self._write(batch)
        if batch is not None:
            batch.clear()
        self._batch_bytes = 0

    def cancel(self, request_id: int) -> None:
        """Tell the peer that nobody waits for our request ``request_id`` any more (a CANCEL: a call, a bulk
        transfer, a read it lent us), unless the connection is closed."""
        if not self.closed:
            self.send(encode_frame(Kind.CANCEL, request_id))

    def send_many(self, parts: Sequence[bytes | memoryview]) -> None:
        batch = self._batch
        if batch is not None:
            batch.extend(parts)
            self._batch_bytes += sum(map(len, parts))  # (no generator: fewer bytecodes per reply)
            if self._batch_bytes > BATCH_FLUSH_BYTES:
                self._flush_batch()
        elif not self.closed:
            self._write(parts)

    def _write(self, parts: Sequence[bytes | memoryview]) -> None:
        transport = self.transport
        assert transport is not None
        self.writes += 1
        if len(parts) == 1:
            transport.write(parts[0])
        elif self._writelines_pauses:
            transport.writelines(parts)
        else:  # each write() checks the high-water mark (the stdlib's writelines may not: CPython gh-127655)
            write = transport.write
            for part in parts:
                write(part)
        # The slow-reader cap, checked on the buffer's size after every write: it does not depend on the loop
        # calling pause_writing (CPython gh-127655: the stdlib's writelines did not, on 3.12.0-3.12.8 and
        # 3.13.0-3.13.1). One C call per write: a batch's replies make one write.
        if transport.get_write_buffer_size() > self.max_output_bytes:
            self._slow_reader()

    def _slow_reader(self) -> None:
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

    async def flushed(self) -> None:
        """Wait until everything sent so far is written to the socket: the batch being built (``flush``), then
        the transport's buffer, which keeps what it has not written by reference (a sender may then change the
        buffers it sent). The write limits are set to zero meanwhile, so the transport pauses us and resumes us
        once its buffer is empty (``drain``).

        Raises:
            ConnectionLost: the connection closed before.
        """
        self.flush()
        transport = self.transport
        if transport is None or self.closed:
            raise ConnectionLost(f"connection to {self.peername} is closed")
        if not transport.get_write_buffer_size():
            return
        low, high = transport.get_write_buffer_limits()  # (asyncio gives them so)
        transport.set_write_buffer_limits(0, 0)
        try:
            await self.drain()
        finally:
            if not self.closed:
                transport.set_write_buffer_limits(high, low)

    def reply(self, frame: Frame, status: int, body: bytes) -> None:
        """Answer the peer's request ``frame`` with ``status`` and the msgpack ``body`` (unless it takes no
        answer: flagged NO_REPLY)."""
        if not frame.flags & F_NO_REPLY:
            self.send(encode_frame(Kind.RESPONSE, frame.request_id, body, status=status))

    def reply_error(self, frame: Frame, status: int, message: str) -> None:
        """Answer the peer's request ``frame`` with a non-OK ``status`` and ``message`` saying why."""
        self.reply(frame, status, pack_body(message))

    def bad_body(self, frame: Frame, problem: str) -> RemoteProtocolError:
        """A well-framed request or bulk request whose body a conforming peer never sends (malformed or
        non-strict msgpack) is a bad frame: answer it with BAD_REQUEST (a buggy client learns why) and send a
        GOODBYE. The caller raises the error returned: the pump then writes what this batch produced, drops
        the connection, dispatches none of the peer's later frames and logs one warning naming the peer and
        the problem."""
        self.reply_error(frame, Status.BAD_REQUEST, problem)
        self.send(encode_frame(Kind.GOODBYE, 0, pack_body(f"bad frame: {problem}"), status=Status.BAD_REQUEST))
        if problem.startswith("map key "):  # the log names the problem, never the body (the key's repr)
            problem = "map key is a " + problem.rpartition(" is a ")[2]
        return RemoteProtocolError(
            f"bad {Kind(frame.kind).name} body ({len(frame.body or b'')} bytes, request {frame.request_id}): {problem}"
        )

    async def send_data(
        self,
        kind: Kind,
        request_id: int,
        src: memoryview,
        first: bytes | None = None,
        until: asyncio.Future[Any] | None = None,
    ) -> None:
        """Send ``src`` (after ``first``, the request it belongs to, if any) as data frames of ``kind`` for
        ``request_id``, respecting write backpressure: one frame when the peer takes it whole
        (``whole_frame_bytes``), in the same write as ``first``; else frames of ``bulk_chunk_bytes`` (never
        over the peer's max_body_bytes), each behind a drain (concurrent transfers share the output buffer).
        Stops early when the connection closes or ``until`` is done. A large pull served as one frame is
        faster than in chunks behind a drain each; a handler's push gains nothing from it (its second round
        trip, the owner's completion, is what it pays).

        Raises:
            ConnectionLost: the connection closed while waiting to write.
        """
        size = len(src)
        whole = self.whole_frame_bytes
        chunk = max(size, 1) if size <= whole else min(self.bulk_chunk_bytes, whole)  # never over the peer's limit
        for pos in range(0, size, chunk):
            if self.closed or (until is not None and until.done()):
                return
            await self.drain()  # before each chunk: concurrent transfers share the buffer
            if self.closed or (until is not None and until.done()):
                return
            part = src[pos : pos + chunk]
            data_header = encode_header(kind, request_id, len(part))
            if first is not None:
                self.send_many((first, data_header, part))
                first = None
            else:
                self.send_many((data_header, part))
        if first is not None and not self.closed:
            self.send(first)  # no data: the request alone

    def fail_pending(self, error: BaseException) -> None:
        """End every call of ours still waiting on this connection with ``error``."""
        pending = list(self.pending.values())
        self.pending.clear()
        for waiter in pending:
            if not waiter.done():
                waiter.set_exception(error)

    def goodbye(self, status: Status, reason: str) -> None:
        """Tell the peer why we close, then close after the output is flushed."""
        if not self.closed and self.transport is not None:
            self.send(self.protocol.goodbye(status, reason))
            self.close()

    def goodbye_received(self, frame: Frame) -> None:
        """The peer said GOODBYE: its reason becomes the error of the calls pending here; close."""
        self.close_reason = self.protocol.goodbye_received(frame)
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


class ConnectionProtocol(Connection, asyncio.BufferedProtocol):  # type: ignore[misc]  # (connection_made's transport)
    """A ``Connection`` as asyncio's buffered protocol (the selector loop reads into ``get_buffer`` only for a
    ``BufferedProtocol``; uvloop for any protocol that has it): what listeners and dials make; everything is
    ``Connection``'s."""

    __slots__ = ()


def _endpoint(name: Any) -> str:
    """One end of a connection as the handshake names it: "host:port" (tcp) or the socket path (unix)."""
    if isinstance(name, tuple):
        return f"{name[0]}:{name[1]}"
    if isinstance(name, bytes):
        return name.decode(errors="replace")
    return str(name or "")


ConnFactory = Callable[[], ConnectionProtocol]


async def listen(
    address: Address, factory: ConnFactory, *, backlog: int = 1024, start_serving: bool = True
) -> tuple[asyncio.AbstractServer, Address]:
    """Start listening; return the server and the address actually bound (port 0 resolved). With
    ``start_serving=False`` the address is bound but no connection is accepted until ``start_serving()``.

    Raises:
        ConnectionLost: the address cannot be bound (in use, permission, no such interface).
    """
    loop = asyncio.get_running_loop()
    try:
        if address.scheme == "unix":
            _remove_stale_socket(address.path)
            server = await loop.create_unix_server(factory, address.path, backlog=backlog, start_serving=start_serving)
            return server, address
        server = await loop.create_server(factory, address.host, address.port, backlog=backlog, reuse_address=True,
                                          start_serving=start_serving)  # fmt: skip
    except OSError as exc:
        raise ConnectionLost(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    port = server.sockets[0].getsockname()[1]
    return server, Address("tcp", address.host, port)


def _remove_stale_socket(path: str) -> None:
    """Remove a unix socket file left by a dead process; refuse to steal a live one, and never remove
    anything that is not a socket (a mistyped address must not delete a user's file)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConnectionLost(f"cannot listen on unix://{path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        kinds = ((stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symbolic link"), (stat.S_ISFIFO, "FIFO"),
                 (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))  # fmt: skip
        kind = next((name for test, name in kinds if test(mode)), "file")
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


async def dial(address: Address, factory: ConnFactory, *, local_host: str | None = None) -> ConnectionProtocol:
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
