"""The engine's connections: the ones it dialled, the caps on the ones it accepted, the sweep, and the one place
every connection reports to (its handshake, its frames, its end).

``Connections`` is the engine's part that owns them (``svcframe.engine.Engine`` holds one). It is each
connection's *owner* (``svcframe.transport.ConnectionOwner``): it admits accepted connections under the caps,
learns of completed handshakes and of ends, and dispatches every batch of received frames by kind to the part
that serves it: requests to ``svcframe.handlers.Handlers``, bulk requests and data to
``svcframe.bulk_serving.BulkServing``, answers to the futures of our calls. That dispatch is the engine's one
read/dispatch loop: ``Connection.buffer_updated`` decodes, ``Connections.on_frames`` routes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from .errors import ConnectionLost, DeadlineExceeded, RemoteProtocolError, Status
from .protocol import Identity
from .transport import Connection, ConnectionOwner, ConnectionProtocol, dial, parse_address
from .wire import Frame, answer_call

try:
    import cython
except ModuleNotFoundError:  # interpreted where Cython is not installed
    from . import _cython as cython

if not cython.compiled:  # (compiled: wire.pxd's C constants)
    from .wire import (
        F_INTO,
        K_BULK_DATA_PUSH,
        K_BULK_DATA_REPLY,
        K_BULK_PULL,
        K_BULK_PUSH,
        K_CANCEL,
        K_GOODBYE,
        K_REQUEST,
        K_RESPONSE,
    )

if TYPE_CHECKING:
    from .bulk_serving import BulkServing
    from .handlers import Handlers
    from .progress import Progress
    from .settings import EngineConfig

__all__ = ["MAX_PEER_LABELS", "Connections", "default_max_connections"]

log = logging.getLogger("svcframe.engine")

perf_ns = time.perf_counter_ns

#: Distinct peers the statistics keep records for; later ones are counted under "other".
MAX_PEER_LABELS = 1024


class Connections(ConnectionOwner):
    """The engine's connections, and what each one reports (see the module docstring).

    Args:
        handlers: serves the requests received.
        serving: serves the bulk transfers peers make on our buffers.
        progress: the engine's progress loop (a received batch is activity).
        config: the engine's settings (frame and connection limits, timeouts, caps).
        local_host: the address outgoing connections are made from (the plumber's NIC choice).

    Attributes:
        dialled: the connections we dialled, by the address dialled.
        peers: connections by peer engine id: those we dialled, and accepted ones whose peer proved the shared
            secret (an engine id in a HELLO is otherwise a claim).
        all: every connection not yet closed.
        identity: who we are in the handshakes of new connections (set by ``start``).
        closing: the engine is shutting down: no new dial.
    """

    def __init__(
        self,
        handlers: Handlers,
        serving: BulkServing,
        progress: Progress,
        config: EngineConfig,
        local_host: str | None = None,
    ) -> None:
        self.handlers = handlers
        self.serving = serving
        self.progress = progress
        self.local_host = local_host
        self.dialled: dict[str, Connection] = {}
        self.peers: dict[str, Connection] = {}
        self.all: set[Connection] = set()
        self.closing = False
        self.default_timeout_seconds = config.default_timeout_seconds
        self.max_body_bytes = config.max_body_bytes
        self.max_output_bytes = config.max_output_bytes
        self.max_inflight_per_connection = config.max_inflight_per_connection
        self.bulk_chunk_bytes = config.bulk_chunk_bytes
        self.handshake_timeout_seconds = config.handshake_timeout_seconds
        self.idle_timeout_seconds = config.idle_timeout_seconds
        self.frame_timeout_seconds = config.frame_timeout_seconds
        self.max_connections = default_max_connections() if config.max_connections is None else config.max_connections
        per_host = config.max_connections_per_host
        self.max_connections_per_host = max(1, self.max_connections // 2) if per_host is None else per_host
        self.identity: Identity | None = None
        self._listening = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dialing: dict[str, list[Any]] = {}  # address -> [dial task, callers waiting]
        self._accepted = 0  # accepted connections counted against the caps
        self._per_host: dict[str, int] = {}
        self._handshaking: dict[Connection, None] = {}  # accepted, handshake not complete, oldest first
        self._last_refusal_log = 0.0
        self._peer_labels: set[str] = set()  # distinct peer labels in the statistics (at most MAX_PEER_LABELS)
        self._sweeper: asyncio.TimerHandle | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop, identity: Identity, listening: bool) -> None:
        """The engine started on ``loop`` as ``identity`` (accepting connections when ``listening``): the sweep
        runs from now on."""
        self._loop = loop
        self.identity = identity
        self._listening = listening
        self._sweeper = loop.call_later(self._sweep_interval(), self._sweep)

    def close_all(self) -> None:
        """The engine shuts down: every call still waiting fails, every connection closes, the sweep stops."""
        self.closing = True
        for conn in list(self.all):
            conn.fail_pending(ConnectionLost("the engine is shutting down"))
            conn.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def accept(self) -> ConnectionProtocol:
        """A connection for a socket the listener accepted (its protocol factory)."""
        return self._new_connection(server_side=True)

    def _new_connection(self, server_side: bool, dialled_address: str | None = None) -> ConnectionProtocol:
        assert self.identity is not None, "the engine is not started"
        conn = ConnectionProtocol(
            self, self.identity, server_side=server_side, max_body_bytes=self.max_body_bytes,
            max_output_bytes=self.max_output_bytes, handshake_timeout_seconds=self.handshake_timeout_seconds,
            max_inflight=self.max_inflight_per_connection, bulk_chunk_bytes=self.bulk_chunk_bytes,
            dialled_address=dialled_address,
        )  # fmt: skip
        self.all.add(conn)
        return conn

    # -- the connections we dial --------------------------------------------------------------------------
    async def connection(self, address: str, timeout_seconds: float | None = None) -> Connection:
        """An open, handshaken connection to ``address`` (dialled once, then reused).

        Concurrent callers share one dial; each waits up to its own ``timeout_seconds`` (default: the
        engine's default deadline). When the last waiting caller gives up, the dial is abandoned and its
        socket closed.

        Raises:
            DeadlineExceeded, ConnectionLost, AuthenticationFailed; ConfigError for a malformed address.
        """
        conn = self.dialled.get(address)
        if conn is not None and not conn.closed:
            return conn
        if self.closing:
            raise ConnectionLost("the engine is shutting down")
        entry = self._dialing.get(address)
        if entry is None:
            task = asyncio.get_running_loop().create_task(self._dial(address))
            task.add_done_callback(_retrieve)
            entry = self._dialing[address] = [task, 0]
        task = entry[0]
        entry[1] += 1
        timeout = self.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(timeout, 0.0))
        except TimeoutError:
            raise DeadlineExceeded(f"connecting to {address} took longer than {timeout:g} s") from None
        finally:
            entry[1] -= 1
            if entry[1] == 0 and not task.done():
                task.cancel()  # nobody waits for this dial any more

    async def _dial(self, address: str) -> Connection:
        target = parse_address(address)
        made: list[ConnectionProtocol] = []

        def factory() -> ConnectionProtocol:
            conn = self._new_connection(server_side=False, dialled_address=address)
            made.append(conn)
            return conn

        try:
            await dial(target, factory, local_host=self.local_host)
            await made[0].ready
            self.dialled[address] = made[0]
            return made[0]
        except BaseException:
            for conn in made:
                conn.abort(ConnectionLost("dial abandoned"), expected=True)
                self.all.discard(conn)
            raise
        finally:
            self._dialing.pop(address, None)

    # -- the caps on accepted connections -----------------------------------------------------------------------
    def admit(self, conn: Connection) -> str | None:
        """An accepted connection counts against ``max_connections`` and, over tcp, ``max_connections_per_host``.

        Over a cap, room is made, in this order: the oldest connection of that scope still in its handshake
        (it has proved nothing; a flood of them never locks a new client out for more than one handshake
        timeout); else the longest-idle unauthenticated one with no call in flight (its engine redials when it
        needs to); else, over the total cap, an unauthenticated connection of the host that holds the most,
        when the newcomer's host holds fewer (calls in flight or not: a flood from one address costs that
        address, not everyone). When none is left, the new connection is refused.
        Returns None when admitted, else the refusal sent to the peer."""
        host = conn.peer_host
        over_total = self._accepted >= self.max_connections
        if over_total or (host is not None and self._per_host.get(host, 0) >= self.max_connections_per_host):
            victim = next((c for c in self._handshaking if over_total or c.peer_host == host), None)
            if victim is None:  # then the longest-idle connection that proved nothing and has no work
                idle = [
                    c for c in self.all
                    if c.admitted and not c.authenticated and not c.pending and not c.serving
                    and (over_total or c.peer_host == host)
                ]  # fmt: skip
                victim = min(idle, key=lambda c: c.last_activity, default=None)
            if victim is None and over_total and self._per_host:  # then the largest host gives way to a smaller one
                largest, held = max(self._per_host.items(), key=lambda item: item[1])
                if largest != host and held > self._per_host.get(host or "", 0) + 1:
                    theirs = [c for c in self.all if c.admitted and not c.authenticated and c.peer_host == largest]
                    victim = min(theirs, key=lambda c: c.last_activity, default=None)
            if victim is None:
                now = time.monotonic()
                if now - self._last_refusal_log >= 1.0:
                    self._last_refusal_log = now
                    log.warning("refusing connections (from %s): %d connections, caps %d total / %d per host",
                                conn.peername, self._accepted, self.max_connections, self.max_connections_per_host)  # fmt: skip
                return (f"too many connections ({self._accepted}; caps: {self.max_connections} in all, "
                        f"{self.max_connections_per_host} per host): try again later")  # fmt: skip
            self._release(victim)
            victim.abort(ConnectionLost("evicted: a connection cap was reached"), expected=True)
        self._accepted += 1
        if host is not None:
            self._per_host[host] = self._per_host.get(host, 0) + 1
        conn.admitted = True
        self._handshaking[conn] = None
        return None

    def _release(self, conn: Connection) -> None:
        """Stop counting ``conn`` against the connection caps (closed or evicted)."""
        if conn.admitted:
            conn.admitted = False
            self._accepted -= 1
            host = conn.peer_host
            if host is not None:
                left = self._per_host[host] - 1
                if left:
                    self._per_host[host] = left
                else:
                    del self._per_host[host]
        self._handshaking.pop(conn, None)

    # -- what connections report (svcframe.transport.ConnectionOwner) --------------------------------------------
    def on_open(self, conn: Connection) -> None:
        """``conn`` completed its handshake."""
        self._handshaking.pop(conn, None)
        label = conn.peer_label  # statistics key: a peer's claimed address, or clients@HOST
        if label not in self._peer_labels:
            if len(self._peer_labels) >= MAX_PEER_LABELS:
                conn.peer_label = "other"  # peers may claim any address: past the cap they share one record
            else:
                self._peer_labels.add(label)
        # An engine id in a HELLO is a claim: only connections we dialled (we chose the address) or whose peer
        # proved the shared secret are found by it (bulk transfers to that engine).
        if conn.peer_engine_id is not None and (not conn.server_side or conn.authenticated):
            self.peers[conn.peer_engine_id] = conn
        conn.protocol.decoder.place_ahead = self.serving.placer(conn)  # (decoder.close drops it)

    def on_close(self, conn: Connection, exc: BaseException | None) -> None:
        """``conn`` is gone: its calls fail, what it lent or was served ends, handles bound to it are revoked."""
        self._release(conn)
        self.all.discard(conn)
        if self.peers.get(conn.peer_engine_id or "") is conn:
            del self.peers[conn.peer_engine_id or ""]
        address = conn.dialled_address
        if address is not None and self.dialled.get(address) is conn:
            del self.dialled[address]
            self.serving.revoke_bound(address)  # handles bound to the peer of this connection go with it
        error = conn.close_reason
        if error is None:
            reason = f"connection to {conn.peer_address or conn.peername} lost" + (f": {exc}" if exc else "")
            error = ConnectionLost(reason)
        conn.fail_pending(error)
        for request_id in list(conn.protocol.lent):
            self.serving.release_lent(conn, request_id)
        for task in list(conn.serving.values()):
            if isinstance(task, asyncio.Task):
                task.cancel()  # nobody can receive the answer any more
        conn.serving.clear()

    def on_answers(self, conn: Connection) -> None:
        """A read of ``conn`` completed frames its decoder completed itself (answers to our calls: see
        svcframe.decoder.FrameDecoder): activity, as a batch of frames is."""
        if not self.progress.blocking:
            self.progress.activity()

    def on_frames(self, conn: Connection, frames: list[Frame]) -> None:
        """Dispatch a batch of frames received on ``conn``, in order, each to the part that serves it."""
        progress = self.progress
        if not progress.blocking:
            progress.activity()
        handlers = self.handlers
        serving = self.serving
        arrival_ns, arrival = 0, 0.0  # the batch's arrival (ns; loop time, for deadlines), read at its first request
        for frame in frames:
            kind = frame.kind
            if kind == K_REQUEST:
                if not arrival_ns:  # (a batch of responses reads no clock)
                    arrival_ns, arrival = perf_ns(), self._loop.time()  # type: ignore[union-attr]
                    handlers.batch_begins(frames)
                handlers.serve(conn, frame, arrival_ns, arrival)
            elif kind == K_RESPONSE:
                waiter = conn.pending.get(frame.request_id)
                if waiter is None:
                    conn.protocol.check_late_answer(frame.request_id)
                elif not waiter.done():
                    answer_call(waiter, frame.status, frame.body)  # type: ignore[arg-type]  # None: bulk data only
            elif kind == K_BULK_DATA_PUSH:
                serving.on_push_data(conn, frame)
            elif kind == K_BULK_DATA_REPLY:  # already written into the destination by the protocol's bulk sink
                if frame.flags & F_INTO:  # the whole result of an into= call, and its answer
                    _into_answered(conn, frame.request_id)
            elif kind == K_BULK_PULL:
                serving.on_pull_request(conn, frame)
            elif kind == K_BULK_PUSH:
                serving.on_push_request(conn, frame)
            elif kind == K_CANCEL:
                request_id = frame.request_id
                task = conn.serving.get(request_id)
                if isinstance(task, asyncio.Task):
                    task.cancel()
                elif conn.protocol.lent:  # the caller has read a result lent by address: take it back
                    serving.release_lent(conn, request_id)
                if conn.protocol.offers:  # a cancelled into= call: its write offer is declined
                    serving.withdraw_offer(conn, request_id)
                if conn.protocol.pushes:  # a push given up on before all its data came: forget it
                    conn.protocol.pushes.pop(request_id, None)
            elif kind == K_GOODBYE:
                conn.goodbye_received(frame)
                break
        if arrival_ns:  # the batch is served: none of its frames is kept
            handlers.batch_ends()

    # -- the sweep ---------------------------------------------------------------------------------------------
    def _sweep_interval(self) -> float:
        idle = self.idle_timeout_seconds if self._listening and self.idle_timeout_seconds > 0 else 1e9
        return min(idle, self.frame_timeout_seconds) / 10

    def _sweep(self) -> None:
        """Drop connections whose current frame did not complete within frame_timeout_seconds (a peer
        trickling bytes), and close accepted connections that completed no frame for idle_timeout_seconds
        and have no work in flight (half-open or forgotten peers); runs every tenth of the shorter one, so a
        stalled frame is cut within 1.1 frame timeouts."""
        now = time.monotonic()
        idle_timeout = self.idle_timeout_seconds if self._listening else 0
        for conn in list(self.all):
            if now - conn.last_activity > self._sweep_interval():  # idle since the last sweep:
                conn.protocol.decoder.release_idle()  # no large buffer nor receive pages kept
            started = conn.frame_started
            if started and now - started > self.frame_timeout_seconds and not conn.protocol.idle:
                conn.abort(RemoteProtocolError(f"a frame did not complete within {self.frame_timeout_seconds:g} s"))
            elif (
                idle_timeout > 0 and conn.server_side and not conn.pending and not conn.serving
                and now - conn.last_activity > idle_timeout
            ):  # fmt: skip
                log.info("closing idle connection from %s", conn.peer_label)
                conn.goodbye(Status.REFUSED, f"idle for more than {idle_timeout:g} s")
        if self._loop is not None and not self.closing:
            self._sweeper = self._loop.call_later(self._sweep_interval(), self._sweep)


def _into_answered(conn: Connection, request_id: int) -> None:
    """A data frame flagged INTO answered our into= call ``request_id``: its result is the byte count
    (what the pull received, or was announced when it overflowed the caller's buffer). Data flagged so for
    any other request answers nothing (its bytes went to the sink's discard)."""
    pull = conn.protocol.pulls.get(request_id)
    waiter = conn.pending.get(request_id)
    if pull is not None and pull.overflow_ok and waiter is not None and not waiter.done():
        waiter.set_result((0, pull.cursor, pull.cursor))


def default_max_connections() -> int:
    """4096 accepted connections, or fewer when the process's descriptor limit (RLIMIT_NOFILE) leaves less
    than that after 64 for listeners, files and outgoing connections."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 4096
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, min(4096, soft - 64))


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # a dial nobody awaited any more: its error is not "never retrieved"
