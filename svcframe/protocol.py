"""One connection's protocol, sans-IO: bytes in, events out, bytes to send.

A ``Protocol`` is the whole state of one svcframe connection, and nothing else: its ``phase``, the
handshake and mutual authentication, request-id allocation, the typed tables of outgoing calls
(``pending``), served requests (``serving``) and incoming bulk pushes, and the rule of which frame kind is
legal in which phase. It imports nothing from asyncio and touches no socket or clock (after h11's
``_connection.py`` + ``_state.py`` and grpclib's ``EventsProcessor``), so it is tested with bytes alone.
The asyncio ``BufferedProtocol`` in ``svcframe.transport`` is a thin pump around it, and the engine keeps
its bookkeeping in the tables defined here rather than on the connection.

Phases (``Phase``)::

    SERVER  AWAIT_HELLO --client HELLO (proved, or no secret)--------------------------> OPEN
                        --client HELLO not proved: GOODBYE(UNAUTHENTICATED) sent-------> CLOSING
    CLIENT  AWAIT_HELLO --server HELLO, no secret: our HELLO sent-------------------------> OPEN
                        --server HELLO, secret: our HELLO with our proof sent-----------> AWAIT_PROOF
            AWAIT_PROOF --server's proof checked-----------------------------------------> OPEN
    any     --peer's GOODBYE, a refused handshake, connection lost------------------------> CLOSED
            --our GOODBYE (``goodbye``)------------------------------------------------------> CLOSING
            --a frame that breaks the protocol (RemoteProtocolError)------------------------> ERROR

Only ``HELLO`` and ``GOODBYE`` are legal before ``OPEN``; everything but ``HELLO`` in ``OPEN``; frames that
arrive while ``CLOSING`` are dropped; nothing is accepted once ``CLOSED``. In ``OPEN`` the decoder itself
enforces the rule (a bit mask of legal kinds, so the hot path pays nothing for it). After an error every
further use raises ``LocalProtocolError``: the connection must be dropped.

Handshake (the bytes are in ``svcframe.wire``): the listening side speaks first, a ``HELLO`` with its engine
id, its address, a 16-byte nonce, whether it authenticates, its body limit and whether it serves bulk by
cross-memory attach. The dialling side answers with its own ``HELLO``; with a shared secret it adds its
nonce, the endpoint it dialled (``via``) and ``auth_mac(secret, "client", ...)`` over both nonces, both
engine ids and that endpoint, and waits for the server's ``HELLO`` with ``auth_mac(secret, "server", ...)``
over the same nonces and ids and the client's end as the server sees it. The endpoints bind the proof to
this connection (a relay at a stale address gets nowhere), the direction label stops a reflection, the
nonces a replay. A holder of the secret talks only to a peer that proves it.

Events: ``receive`` returns the frames for the engine (``svcframe.wire.Frame``, dispatched by kind) and,
while the handshake completes or fails, an ``Opened`` or ``Closed`` event before them.
"""

from __future__ import annotations

import enum
import hmac
import secrets
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from .decoder import FrameDecoder
from .errors import (
    AuthenticationFailed,
    ConnectionLost,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    Status,
)
from .wire import (
    DEFAULT_MAX_BODY_BYTES,
    K_BULK_DATA_PUSH,
    K_BULK_DATA_REPLY,
    K_GOODBYE,
    K_HELLO,
    MIN_MAX_BODY_BYTES,
    BinBody,
    Frame,
    Kind,
    auth_mac,
    encode_frame,
    pack_body,
    unpack_body,
)

__all__ = ["Closed", "Identity", "IncomingPull", "IncomingPush", "Opened", "Peer", "Phase", "Protocol", "Role"]


class Role(enum.Enum):
    CLIENT = "client"  # we dialled
    SERVER = "server"  # we accepted


class Phase(enum.Enum):
    AWAIT_HELLO = "awaiting HELLO"
    AWAIT_PROOF = "awaiting the server's proof"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    ERROR = "error"


_OPEN = Phase.OPEN  # hot-path comparisons read a module global, not an enum class attribute

#: Which frame kinds a peer may send in each phase (the rule, in one place).
LEGAL_KINDS: dict[Phase, frozenset[int]] = {
    Phase.AWAIT_HELLO: frozenset({Kind.HELLO, Kind.GOODBYE}),
    Phase.AWAIT_PROOF: frozenset({Kind.HELLO, Kind.GOODBYE}),
    Phase.OPEN: frozenset(k for k in Kind if k != Kind.HELLO),
    Phase.CLOSING: frozenset(Kind),  # received and dropped: we are closing
    Phase.CLOSED: frozenset(),
    Phase.ERROR: frozenset(),
}


def _mask(kinds: frozenset[int]) -> int:
    return sum(1 << k for k in kinds)


#: While the handshake runs the decoder lets every kind through: a batch may hold the HELLO and the first
#: requests after it, and each frame is checked against the phase it arrives in (``_handshake``).
_HANDSHAKE_MASK = _mask(frozenset(Kind))
_OPEN_MASK = _mask(LEGAL_KINDS[Phase.OPEN])


@dataclass(frozen=True, slots=True)
class Identity:
    """This side of the handshake: who we are and how we authenticate."""

    engine_id: str
    address: str | None  # where peers can dial us (None for a client-only engine)
    secret: bytes | None = None
    cma: bool = False  # we serve and make same-node bulk transfers by cross-memory attach (svcframe.cma)


@dataclass(frozen=True, slots=True)
class Peer:
    """What the handshake established about the other side.

    Attributes:
        engine_id: the peer's engine id as its HELLO claims it (a claim: proved only when ``authenticated``).
        address: the address it listens on (None for a client-only engine).
        max_body_bytes: the largest frame body it accepts.
        cma: it serves bulk transfers by cross-memory attach and the kernel told us its pid.
        authenticated: the shared secret was proved (by the peer on the server side, both ways on the client).
        cma_write: with ``cma``, it also writes a range of its own into our memory when we ask (the other half
            of a split read: ``svcframe.split_read``); peers before this field do not.
        cma_offer: with ``cma_write``, it also takes an offer made before a request (a BULK_PULL flagged CMA
            and INTO): it writes its part of the result it lends when it lends it (``svcframe.bulk``).
        cma_split_push: with ``cma_write``, a push into its buffer by cross-memory attach may name the
            pusher's source as a bulk id: it then asks the pusher to write the first part of it (a split
            read of the source) while it copies the rest (``svcframe.bulk``).
        push_ahead: a handler's push into its buffer may come ahead of the handler's answer, unanswered (a
            BULK_PUSH flagged NO_REPLY naming the call: ``svcframe.bulk``); peers before this field do not.
    """

    engine_id: str
    address: str | None
    max_body_bytes: int
    cma: bool
    authenticated: bool
    cma_write: bool = False
    cma_offer: bool = False
    cma_split_push: bool = False
    push_ahead: bool = False


@dataclass(frozen=True, slots=True)
class Opened:
    """The handshake completed: frames may flow."""

    peer: Peer


@dataclass(frozen=True, slots=True)
class Closed:
    """The connection ended in the handshake or by the peer's GOODBYE. ``by_us``: we refused the peer (the
    bytes saying so are in ``data_to_send``)."""

    error: ConnectionLost
    by_us: bool = False


class IncomingPull:
    """Where the data of one of our bulk pulls, or of a result we take into our own buffer, goes
    (``BULK_DATA_REPLY`` frames, in order), by request id in ``Protocol.pulls``.

    ``overflow_ok``: more data than ``dest`` holds is discarded and ``overflowed`` set (a result larger than
    the caller's buffer: its call fails) instead of breaking the protocol (a pull is asked for a size)."""

    def __init__(self, dest: Any, *, overflow_ok: bool = False) -> None:
        self.dest = dest  # a memoryview, or an object that makes one when sliced (bulk's lazy destination)
        self.cursor = 0
        self.overflow_ok = overflow_ok
        self.overflowed = False


class WriteOffer(NamedTuple):
    """The peer's offer for one of its requests over ``unix://``, an ``into=`` call or a pull by address (a
    BULK_PULL flagged CMA and INTO, sent before the request): should we answer that request by address, we
    write its first part into the peer's memory ourselves (``svcframe.split_read``: a split read whose write
    starts when the answer leaves, not a round trip later). Kept in ``Protocol.offers`` under the request's
    id."""

    request_id: int  # the offer's own id: answered once, when its part is written or declined
    dest: int  # the address of the peer's buffer, in its memory
    size: int  # bytes there
    expires_ns: int  # time.monotonic_ns() after which it is declined (the peer may have given the buffer back)
    mark: int  # where our request id goes once the part is in place (0: nowhere)
    share: int  # our part of the result, in 1/65536ths


class IncomingPush:
    """A bulk push announced by the peer (``BULK_PUSH``), whose data frames are still arriving."""

    def __init__(self, frame: Frame, dest: memoryview | None, size: int, error: str | None) -> None:
        self.frame = frame
        self.dest = dest  # None: refused (``error`` says why); its data is received and discarded
        self.size = size
        self.error = error
        self.cursor = 0


class Protocol:
    """The sans-IO state of one connection.

    Args:
        role: ``Role.CLIENT`` when we dialled, ``Role.SERVER`` when we accepted.
        identity: our side of the handshake.
        max_body_bytes: the largest frame body we accept (announced in our HELLO).
        max_pushes: bulk pushes a peer may have announced and not finished at once.
        nonce: this side's 16-byte handshake nonce (default: fresh random bytes; tests fix it to replay an
            exchange byte for byte).

    Attributes:
        phase: the current ``Phase``.
        peer: what the handshake established (None before ``OPEN``).
        pending: what waits for each of our requests' RESPONSE, by request id (the engine's futures: opaque
            here; the engine adds and removes them).
        pulls: where the data of our bulk pulls (and of results we take as data) goes, by request id.
        serving: requests being served by request id (the engine's handler tasks: opaque here).
        error: the exception that put the connection in ``Phase.ERROR``.
    """

    def __init__(
        self,
        role: Role,
        identity: Identity,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_pushes: int = 1024,
        nonce: bytes | None = None,
    ) -> None:
        self.role = role
        self.identity = identity
        self.max_pushes = max_pushes
        self.phase = Phase.AWAIT_HELLO
        self.peer: Peer | None = None
        self.error: ProtocolError | None = None
        self.pending: dict[int, Any] = {}
        self.pulls: dict[int, IncomingPull] = {}
        self.serving: dict[int, Any] = {}
        self.pushes: dict[int, IncomingPush] = {}
        #: request id -> bulk id of a result lent by address (a read into the caller's buffer by cross-memory
        #: attach), exposed until the caller says it has read it (CANCEL) or the connection ends
        self.lent: dict[int, bytes] = {}
        #: request id -> the peer's offer to have our part of its result written (svcframe.bulk), until that
        #: result is answered or the offer expires
        self.offers: dict[int, WriteOffer] = {}
        self._refused_pushes: dict[int, int] = {}  # request id -> bytes of refused push data still to discard
        self.decoder = FrameDecoder(max_body_bytes, self._bulk_sink)
        self.decoder.legal_kinds = _HANDSHAKE_MASK
        # our own connections reuse one buffer for large bodies (the results we read); accepted ones map a fresh
        # one per frame, so what a peer sent is not kept after it was served
        self.decoder.reuse_large = role is Role.CLIENT
        self._next_id = 0
        own = nonce if nonce is not None else secrets.token_bytes(16)
        if len(own) != 16:
            raise LocalProtocolError("a handshake nonce is 16 bytes")
        self._nonce = own if role is Role.SERVER else b""  # the server's nonce
        self._client_nonce = own if role is Role.CLIENT else b""  # the client's (sent only with a secret)
        self._out: list[bytes] = []
        self._local_endpoint = ""
        self._remote_endpoint = ""
        self._peer_on_node = False

    def __repr__(self) -> str:
        peer = self.peer.address or self.peer.engine_id[:8] if self.peer else self._remote_endpoint or "?"
        return f"<Protocol {self.role.value} {self.phase.name} peer={peer} pending={len(self.pending)}>"

    # -- set-up ---------------------------------------------------------------------------------------
    def connection_made(self, local_endpoint: str, remote_endpoint: str, *, peer_on_node: bool = False) -> None:
        """The transport is connected. The server queues its HELLO (``data_to_send``).

        Args:
            local_endpoint / remote_endpoint: our end and the peer's end of the connection as our socket
                sees them ("host:port", or a unix socket path): the handshake binds its proofs to them.
            peer_on_node: the kernel told us the peer's pid (a unix socket): cross-memory attach may apply.
        """
        self._local_endpoint, self._remote_endpoint, self._peer_on_node = local_endpoint, remote_endpoint, peer_on_node
        if self.role is Role.SERVER:
            hello = {
                "engine_id": self.identity.engine_id,
                "address": self.identity.address,
                "nonce": self._nonce,
                "auth": self.identity.secret is not None,
                "max_body_bytes": self.decoder.max_body_bytes,
                "cma": self.identity.cma,
                "cma_write": self.identity.cma,
                "cma_offer": self.identity.cma,
                "cma_split_push": self.identity.cma,
                "push_ahead": True,
            }
            self._out.append(encode_frame(Kind.HELLO, 0, pack_body(hello)))

    def data_to_send(self) -> list[bytes]:
        """The bytes the protocol itself produced (handshake, refusals) since the last call, in order."""
        out, self._out = self._out, []
        return out

    # -- receiving ------------------------------------------------------------------------------------
    def get_buffer(self) -> memoryview:
        """Where the next received bytes go (the decoder's buffer, or a bulk destination)."""
        return self.decoder.get_buffer()

    def receive(self, nbytes: int) -> list[Any] | None:
        """``nbytes`` were written into the last ``get_buffer()``: the frames and events now complete.

        Returns:
            In ``OPEN``, the decoded frames (any kind but HELLO), or None when the read completed only answers
            to calls, which the decoder gave to their futures (``FrameDecoder.answers``, set by the transport).
            While the handshake completes, an
            ``Opened`` (then the frames that followed the HELLO) or a ``Closed`` event.

        Raises:
            RemoteProtocolError (the peer broke the protocol: the phase becomes ERROR), or
            LocalProtocolError when called after an error.
        """
        if self.phase is _OPEN:  # the hot path: one received batch of an open connection
            try:
                return self.decoder.buffer_updated(nbytes)
            except ProtocolError as exc:
                self.fail(exc)
                raise
        phase = self.phase
        if phase is Phase.ERROR or phase is Phase.CLOSED:
            raise LocalProtocolError(f"the connection is {phase.value}: {self.error or 'no more data expected'}")
        try:
            frames = self.decoder.buffer_updated(nbytes)
            return self._handshake(frames) if frames and phase is not Phase.CLOSING else []
        except ProtocolError as exc:
            self.fail(exc)
            raise

    def more(self) -> list[Frame]:
        """Frames already received but held back behind a bulk data frame (see ``FrameDecoder.more``): call
        after dispatching each non-empty batch, until it returns an empty list."""
        if not self.decoder.held or self.phase is not _OPEN:
            return []
        try:
            return self.decoder.more()
        except ProtocolError as exc:
            self.fail(exc)
            raise

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        """Copy ``data`` in and return every frame and event it completes (tests, fuzzing, any byte source)."""
        out: list[Any] = []
        view = memoryview(data).cast("B")
        while view:
            buf = self.get_buffer()
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            got = self.receive(n)
            while got:
                out.extend(got)
                got = self.more()
        return out

    @property
    def idle(self) -> bool:
        """No partial frame is buffered."""
        return self.decoder.idle

    def fail(self, exc: ProtocolError) -> None:
        """The connection broke the protocol (``exc``): the phase becomes ERROR and nothing more is accepted.
        ``receive`` does this itself; a pump that feeds the decoder directly in OPEN calls it."""
        self.phase = Phase.ERROR
        self.error = exc
        self.decoder.legal_kinds = 0

    # -- the handshake ------------------------------------------------------------------------------
    def _handshake(self, frames: list[Frame]) -> list[Any]:
        """Run the handshake frames of a batch; return events, then the frames that follow the handshake."""
        for i, frame in enumerate(frames):
            if self.phase is Phase.OPEN:  # frames the peer sent right after its HELLO (the caller dispatches
                rest = [f for f in frames[i:] if self._legal_after_open(f)]  # them, then calls more())
                return [Opened(self.peer), *rest]  # type: ignore[arg-type]
            kind = frame.kind
            if kind == K_GOODBYE:
                return [Closed(self.goodbye_received(frame))]
            if kind != K_HELLO:
                raise RemoteProtocolError(f"a {Kind(kind).name} frame before the handshake completed (HELLO first)")
            hello = _decode_small(frame, "HELLO")
            if not isinstance(hello, dict):
                raise RemoteProtocolError("malformed HELLO: its body is not a map")
            if self.phase is Phase.AWAIT_PROOF:
                event = self._check_server_proof(hello)
            elif self.role is Role.SERVER:
                event = self._server_hello(hello)
            else:
                event = self._client_hello(hello)
            if isinstance(event, Closed):
                return [event]
        if self.phase is Phase.OPEN:
            return [Opened(self.peer)]  # type: ignore[arg-type]
        return []

    def _legal_after_open(self, frame: Frame) -> bool:
        if frame.kind == K_HELLO:
            raise RemoteProtocolError("a second HELLO after the handshake completed")
        return True

    def _peer_from(self, hello: dict[str, Any], authenticated: bool) -> Peer:
        engine_id = hello.get("engine_id")
        if not isinstance(engine_id, str) or not engine_id:
            raise RemoteProtocolError("malformed HELLO: no engine id")
        address = hello.get("address")
        limit = hello.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)
        if type(limit) is not int or limit < MIN_MAX_BODY_BYTES:  # we send bulk data in frames of its limit
            raise RemoteProtocolError(
                f"malformed HELLO: max_body_bytes {limit!r} (a peer takes frames of at least {MIN_MAX_BODY_BYTES} bytes)"
            )
        return Peer(
            engine_id=engine_id,
            address=address if isinstance(address, str) else None,
            max_body_bytes=limit,
            cma=(cma := hello.get("cma") is True and self._peer_on_node),
            authenticated=authenticated,
            cma_write=(cma_write := cma and hello.get("cma_write") is True),
            cma_offer=cma_write and hello.get("cma_offer") is True,
            cma_split_push=cma_write and hello.get("cma_split_push") is True,
            push_ahead=hello.get("push_ahead") is True,
        )

    def _server_hello(self, hello: dict[str, Any]) -> Closed | None:
        """The client's HELLO, on the server: check its proof (when we hold a secret), prove ours, open."""
        peer = self._peer_from(hello, authenticated=False)
        secret = self.identity.secret
        if secret is None:
            self._open(peer)
            return None
        mac, client_nonce, via = hello.get("mac"), hello.get("nonce"), hello.get("via")
        ok = isinstance(mac, bytes) and isinstance(client_nonce, bytes) and len(client_nonce) == 16
        ok = ok and via == self._local_endpoint  # a relay's client dialled another endpoint
        if ok:
            expect = auth_mac(secret, "client", self._nonce, client_nonce, self.identity.engine_id,  # type: ignore[arg-type]
                              peer.engine_id, via)  # type: ignore[arg-type]  # fmt: skip
            ok = hmac.compare_digest(mac, expect)  # type: ignore[arg-type]
        if not ok:
            self._out.append(self.goodbye(Status.UNAUTHENTICATED, "authentication failed (shared secret)"))
            return Closed(AuthenticationFailed(f"{self._remote_endpoint}: authentication failed"), by_us=True)
        proof = auth_mac(secret, "server", self._nonce, client_nonce, self.identity.engine_id,  # type: ignore[arg-type]
                         peer.engine_id, self._remote_endpoint)  # fmt: skip
        self._out.append(encode_frame(Kind.HELLO, 0, pack_body({"mac": proof})))
        self._open(replace(peer, authenticated=True))
        return None

    def _client_hello(self, hello: dict[str, Any]) -> Closed | None:
        """The server's HELLO, on the client: answer with ours (and our proof), then open or await its proof."""
        peer = self._peer_from(hello, authenticated=False)
        nonce = hello.get("nonce")
        if not isinstance(nonce, bytes) or len(nonce) != 16:
            raise RemoteProtocolError("malformed HELLO: no 16-byte nonce")
        reply: dict[str, Any] = {
            "engine_id": self.identity.engine_id,
            "address": self.identity.address,
            "max_body_bytes": self.decoder.max_body_bytes,
            "cma": self.identity.cma,
            "cma_write": self.identity.cma,
            "cma_offer": self.identity.cma,
            "cma_split_push": self.identity.cma,
            "push_ahead": True,
        }
        secret = self.identity.secret
        if secret is None:
            if hello.get("auth"):
                return self._refused(f"{self._remote_endpoint} requires a shared secret and none is configured")
            self._out.append(encode_frame(Kind.HELLO, 0, pack_body(reply)))
            self._open(peer)
            return None
        if not hello.get("auth"):  # a holder of the secret talks only to servers that prove it
            return self._refused(f"{self._remote_endpoint} does not authenticate (no shared secret configured)")
        self._nonce = nonce
        via = self._remote_endpoint
        reply.update(nonce=self._client_nonce, via=via, mac=auth_mac(
            secret, "client", nonce, self._client_nonce, peer.engine_id, self.identity.engine_id, via
        ))  # fmt: skip
        self._out.append(encode_frame(Kind.HELLO, 0, pack_body(reply)))
        self.peer = peer
        self.phase = Phase.AWAIT_PROOF
        return None

    def _check_server_proof(self, hello: dict[str, Any]) -> Closed | None:
        peer = self.peer
        assert peer is not None
        expect = auth_mac(self.identity.secret or b"", "server", self._nonce, self._client_nonce, peer.engine_id,
                          self.identity.engine_id, self._local_endpoint)  # fmt: skip
        mac = hello.get("mac")
        if not isinstance(mac, bytes) or not hmac.compare_digest(mac, expect):
            return self._refused(f"{self._remote_endpoint} did not prove the shared secret (an impostor or a relay?)")
        self._open(replace(peer, authenticated=True))
        return None

    def _open(self, peer: Peer) -> None:
        self.peer = peer
        self.phase = Phase.OPEN
        self.decoder.legal_kinds = _OPEN_MASK

    def _refused(self, reason: str) -> Closed:
        self.phase = Phase.CLOSED
        self.decoder.legal_kinds = 0
        return Closed(AuthenticationFailed(reason), by_us=True)

    # -- in the open phase ----------------------------------------------------------------------------
    def next_request_id(self) -> int:
        """A fresh request id for an outgoing call or bulk transfer (ids are per connection and direction).

        Raises:
            LocalProtocolError: the connection failed or was never opened.
        """
        if self.phase is not _OPEN:
            raise LocalProtocolError(f"cannot send a request on a connection that is {self.phase.value}")
        self._next_id += 1
        return self._next_id

    def check_late_answer(self, request_id: int) -> None:
        """An answer (RESPONSE or pull data) for ``request_id`` found nobody waiting: fine for a request we made
        and gave up on (its late answer is dropped), a protocol error for an id we never sent.

        Raises:
            RemoteProtocolError: ``request_id`` was never one of our requests on this connection.
        """
        if not 0 < request_id <= self._next_id:
            raise RemoteProtocolError(f"an answer to request {request_id}, which was never sent on this connection")

    def serve(self, request_id: int, handle: Any) -> None:
        """Record a request being served (``handle``: the engine's task) until the engine removes it.

        Raises:
            RemoteProtocolError: a request of that id is already being served (ids must be unique among a
                peer's requests in flight; reusing one would also slip past the in-flight cap).
        """
        if request_id in self.serving:
            raise RemoteProtocolError(f"request id {request_id} reused while that request is still being served")
        self.serving[request_id] = handle

    def expect_push(self, frame: Frame, dest: memoryview | None, size: int, error: str | None) -> IncomingPush | None:
        """The peer announced a bulk push (``frame``, a BULK_PUSH): its data frames go into ``dest``, or are
        discarded when it was refused (``error``; answered at once by the caller). Returns the push while data
        is awaited, None when nothing more is (an empty push, or a refused one).

        Raises:
            RemoteProtocolError: more than ``max_pushes`` pushes announced and not finished.
        """
        request_id = frame.request_id
        if error is not None:
            if size:  # only its byte count is kept, to discard its data
                refused = self._refused_pushes
                refused[request_id] = size
                if len(refused) > self.max_pushes:
                    del refused[next(iter(refused))]  # the oldest: its data, if it ever comes, breaks the protocol
            return None
        if not size:
            return None
        if request_id in self.pushes:
            raise RemoteProtocolError(f"bulk push {request_id} announced while a push of that id is under way")
        if len(self.pushes) >= self.max_pushes:
            raise RemoteProtocolError(
                f"more than {self.max_pushes} bulk pushes announced and not sent on one connection"
            )
        incoming = self.pushes[request_id] = IncomingPush(frame, dest, size, None)
        return incoming

    def push_complete(self, request_id: int) -> IncomingPush | None:
        """After a BULK_DATA_PUSH frame: the push it completed (removed from the table), else None."""
        incoming = self.pushes.get(request_id)
        if incoming is not None and incoming.cursor >= incoming.size:
            del self.pushes[request_id]
            return incoming
        return None

    def _bulk_sink(self, kind: int, request_id: int, length: int) -> memoryview:
        """Where a bulk data frame's bytes go (the decoder asks before receiving them)."""
        if self.phase is not _OPEN:
            raise RemoteProtocolError(f"bulk data while the connection is {self.phase.value}")
        if kind == K_BULK_DATA_REPLY:
            p = self.pulls.get(request_id)
            if p is None:
                self.check_late_answer(request_id)
                return _discard(length)  # a transfer we gave up on: drop its late data
            start = p.cursor
            p.cursor = end = start + length
            if end > len(p.dest) or p.overflowed:
                if p.overflow_ok:
                    p.overflowed = True
                    return _discard(length)
                raise RemoteProtocolError(f"peer sent {end} bytes for a {len(p.dest)}-byte pull")
            return p.dest[start:end]  # type: ignore[no-any-return]
        assert kind == K_BULK_DATA_PUSH
        incoming = self.pushes.get(request_id)
        if incoming is None:
            remaining = self._refused_pushes.get(request_id)
            if remaining is None or length > remaining:
                raise RemoteProtocolError(f"push data for unknown request {request_id}")
            if remaining == length:
                del self._refused_pushes[request_id]
            else:
                self._refused_pushes[request_id] = remaining - length
            return _discard(length)  # data of a refused push (answered already)
        end = incoming.cursor + length
        if end > incoming.size:
            raise RemoteProtocolError(f"peer pushed {end} bytes for a {incoming.size}-byte push")
        start, incoming.cursor = incoming.cursor, end
        return _discard(length) if incoming.dest is None else incoming.dest[start:end]

    # -- ending -------------------------------------------------------------------------------------------
    def goodbye(self, status: int, reason: str) -> bytes:
        """Our GOODBYE (``status`` says why, ``reason`` in words): the bytes to send before closing. The
        phase becomes CLOSING; frames received after it are dropped."""
        if self.phase is not Phase.ERROR:
            self.phase = Phase.CLOSING
        return encode_frame(Kind.GOODBYE, 0, pack_body(reason), status=status)

    def goodbye_received(self, frame: Frame) -> ConnectionLost:
        """The peer's GOODBYE: the phase becomes CLOSED; returns the error its pending calls end with."""
        self.phase = Phase.CLOSED
        self.decoder.legal_kinds = 0
        reason = _safe_text(frame.body)
        if frame.status == Status.UNAUTHENTICATED:
            return AuthenticationFailed(f"{self._remote_endpoint} refused the connection: {reason}")
        return ConnectionLost(f"{self._remote_endpoint} closed the connection: {reason}")

    def connection_lost(self) -> ConnectionLost | None:
        """The transport is gone: the phase becomes CLOSED (unless in ERROR) and the buffers are released.
        Returns an error when the stream ended in the middle of a frame."""
        cut = not self.decoder.idle
        if self.phase is not Phase.ERROR:
            self.phase = Phase.CLOSED
        self.decoder.legal_kinds = 0
        self.decoder.close()
        self.pushes.clear()
        self.pulls.clear()
        self._refused_pushes.clear()
        return ConnectionLost("peer closed the connection in the middle of a frame") if cut else None


#: The largest HELLO body accepted (bytes; a real one is about 200) and the largest GOODBYE reason decoded:
#: they are decoded before the peer proved anything, and msgpack turns a byte into a ~70-byte object at
#: worst (an empty array), so the decoder's 4 MiB frame limit would let 80 bytes of header cost ~300 MB.
MAX_HANDSHAKE_BODY_BYTES = 4096


def _decode_small(frame: Frame, what: str) -> object:
    body = frame.body or b""
    if len(body) > MAX_HANDSHAKE_BODY_BYTES:
        raise RemoteProtocolError(f"a {len(body)}-byte {what} body (at most {MAX_HANDSHAKE_BODY_BYTES})")
    return unpack_body(body)


def _safe_text(body: bytes | bytearray | memoryview | BinBody | None) -> str:
    if body is not None and len(body) > MAX_HANDSHAKE_BODY_BYTES:
        return f"(a {len(body)}-byte reason, not shown)"
    try:
        value = unpack_body(body or b"")
    except ProtocolError:
        return "(unreadable reason)"
    return value[:500] if isinstance(value, str) else "(a reason that is not text)"


class _Discard:
    """Scratch space for bulk data nobody waits for (length <= max_body_bytes, checked by the decoder),
    shared by every connection of the process: it is written and never read."""

    view = memoryview(bytearray(0))


def _discard(length: int) -> memoryview:
    if len(_Discard.view) < length:
        _Discard.view = memoryview(bytearray(length))
    return _Discard.view[:length]
