"""The per-connection protocol with bytes alone (svcframe.protocol): no socket, no event loop.

A connection pair exchanges the handshake and frames through in-memory byte queues; the same exchange
replayed in every split (two chunks at every offset, and one byte at a time) gives the same events; the
handshake's refusals (wrong secret, a relay, a server that does not prove the secret) and the rule of which
frame kind is legal in which phase are checked frame by frame; and a Hypothesis rule-based state machine
drives two protocols through random interleavings of calls, answers, cancels, bulk pushes and pulls,
goodbyes, partial deliveries and corruption, checking the tables and phases against a model.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from svcframe.errors import AuthenticationFailed, ConnectionLost, LocalProtocolError, RemoteProtocolError, Status
from svcframe.protocol import Closed, Identity, IncomingPull, Opened, Phase, Protocol, Role
from svcframe.wire import MIN_MAX_BODY_BYTES, Frame, Kind, encode_frame, encode_header, pack_body, rpc_id

SECRET = b"s" * 32
CLIENT_END, SERVER_END = "127.0.0.1:50000", "127.0.0.1:7000"
SERVER_NONCE, CLIENT_NONCE = bytes(range(16)), bytes(range(16, 32))


def make_pair(
    secret: bytes | None = None, client_secret: bytes | str | None = "same", *, fixed_nonces: bool = True
) -> tuple[Protocol, Protocol]:
    """A server and a client protocol, connected (the server's HELLO queued), not yet pumped."""
    csecret = secret if client_secret == "same" else client_secret
    server = Protocol(Role.SERVER, Identity("server-engine", "tcp://127.0.0.1:7000", secret),
                      nonce=SERVER_NONCE if fixed_nonces else None)  # fmt: skip
    client = Protocol(Role.CLIENT, Identity("client-engine", None, csecret),  # type: ignore[arg-type]
                      nonce=CLIENT_NONCE if fixed_nonces else None)  # fmt: skip
    server.connection_made(SERVER_END, CLIENT_END)
    client.connection_made(CLIENT_END, SERVER_END)
    return server, client


def pump(src: Protocol, dst: Protocol, *extra: bytes) -> list[Any]:
    """Move what ``src`` produced (and ``extra`` bytes) into ``dst``; return ``dst``'s events."""
    data = b"".join([*src.data_to_send(), *extra])
    return dst.feed(data) if data else []


def handshake(server: Protocol, client: Protocol) -> tuple[list[Any], list[Any]]:
    """Run the handshake to its end; the events each side produced."""
    server_events: list[Any] = []
    client_events: list[Any] = []
    for _ in range(4):
        client_events += pump(server, client)
        server_events += pump(client, server)
    return server_events, client_events


def request(request_id: int, arg: object = None, name: str = "echo") -> bytes:
    return encode_frame(Kind.REQUEST, request_id, pack_body(arg), provider_id=1, rpc=rpc_id(name))


@pytest.mark.parametrize("secret", [None, SECRET], ids=["open", "authenticated"])
def test_a_pair_completes_the_handshake_and_exchanges_frames(secret: bytes | None) -> None:
    server, client = make_pair(secret)
    assert server.phase is Phase.AWAIT_HELLO and client.phase is Phase.AWAIT_HELLO
    server_events, client_events = handshake(server, client)
    assert server.phase is Phase.OPEN and client.phase is Phase.OPEN
    assert [type(e) for e in server_events] == [Opened] and [type(e) for e in client_events] == [Opened]
    assert server.peer is not None and server.peer.engine_id == "client-engine" and server.peer.address is None
    assert client.peer is not None and client.peer.engine_id == "server-engine"
    assert server.peer.authenticated is client.peer.authenticated is (secret is not None)
    rid = client.next_request_id()
    client.pending[rid] = "waiter"
    frames = server.feed(request(rid, {"x": 1}))
    assert [(f.kind, f.request_id) for f in frames] == [(Kind.REQUEST, rid)]
    answers = client.feed(encode_frame(Kind.RESPONSE, rid, pack_body({"x": 1})))
    assert [(f.kind, f.request_id, f.status) for f in answers] == [(Kind.RESPONSE, rid, 0)]


def test_request_ids_are_fresh_per_connection_and_refused_before_open() -> None:
    server, client = make_pair()
    with pytest.raises(LocalProtocolError, match="awaiting HELLO"):
        client.next_request_id()
    handshake(server, client)
    assert [client.next_request_id() for _ in range(3)] == [1, 2, 3]


def _recorded_exchange(secret: bytes | None) -> tuple[bytes, bytes]:
    """The bytes each side receives in a full exchange (fixed nonces: deterministic)."""
    server, client = make_pair(secret)
    to_client = b"".join(server.data_to_send())
    client.feed(to_client)
    to_server = b"".join(client.data_to_send())
    server.feed(to_server)
    proof = b"".join(server.data_to_send())  # the server's proof (authenticated), else nothing
    to_client += proof
    to_server += b"".join(
        [
            request(1, {"k": "v" * 300}),
            request(2, list(range(50)), name="put"),
            encode_frame(Kind.CANCEL, 2),
            encode_frame(Kind.BULK_PUSH, 3, pack_body([b"\0" * 16, 0, 5000])),
            encode_header(Kind.BULK_DATA_PUSH, 3, 3000) + b"a" * 3000,
            encode_header(Kind.BULK_DATA_PUSH, 3, 2000) + b"b" * 2000,
            encode_frame(Kind.BULK_PULL, 4, pack_body([b"\1" * 16, 0, 100])),
            request(5, b"x" * 70000),
            encode_frame(Kind.GOODBYE, 0, pack_body("bye"), status=Status.SHUTTING_DOWN),
        ]
    )
    return to_server, to_client


def _serve(chunks: list[bytes], secret: bytes | None) -> tuple[list[tuple[Any, ...]], bytearray]:
    """Feed ``chunks`` to a fresh server protocol as the engine would (dispatch, then ``more``); the
    events it gave and the bytes its bulk push received."""
    server = Protocol(Role.SERVER, Identity("server-engine", "tcp://127.0.0.1:7000", secret), nonce=SERVER_NONCE)
    server.connection_made(SERVER_END, CLIENT_END)
    server.data_to_send()
    pushed = bytearray(5000)
    seen: list[tuple[Any, ...]] = []

    def dispatch(events: list[Any]) -> None:
        for e in events:
            if isinstance(e, Opened | Closed):
                seen.append((type(e).__name__,))
                continue
            seen.append((e.kind, e.request_id, bytes(e.body) if e.body is not None else None))
            if e.kind == Kind.BULK_PUSH:
                server.expect_push(e, memoryview(pushed), 5000, None)
            elif e.kind == Kind.BULK_DATA_PUSH and server.push_complete(e.request_id) is not None:
                seen.append(("push complete", e.request_id))
            elif e.kind == Kind.GOODBYE:
                seen.append(("goodbye", str(server.goodbye_received(e))))

    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            buf = server.get_buffer()
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            events = server.receive(n)
            while events:
                dispatch(events)
                events = server.more()
    return seen, pushed


@pytest.mark.parametrize("secret", [None, SECRET], ids=["open", "authenticated"])
def test_every_split_of_a_valid_exchange_gives_the_same_events(secret: bytes | None) -> None:
    to_server, _ = _recorded_exchange(secret)
    whole, pushed = _serve([to_server], secret)
    assert whole[0] == ("Opened",) and whole[-1][0] == "goodbye"
    assert ("push complete", 3) in whole and bytes(pushed) == b"a" * 3000 + b"b" * 2000
    step = max(1, len(to_server) // 400)  # every offset in the handshake and the first frames, then strided
    offsets = list(range(1, min(len(to_server), 1200))) + list(range(1200, len(to_server), step))
    for k in offsets:
        split, split_pushed = _serve([to_server[:k], to_server[k:]], secret)
        assert split == whole, f"split at byte {k}"
        assert split_pushed == pushed
    bytewise, _ = _serve([to_server[i : i + 1] for i in range(min(len(to_server), 20000))], secret)
    assert bytewise == _serve([to_server[:20000]], secret)[0]


def test_every_split_of_the_servers_side_gives_the_same_events() -> None:
    _, to_client = _recorded_exchange(SECRET)
    answers = encode_frame(Kind.RESPONSE, 1, pack_body("ok")) + encode_frame(Kind.RESPONSE, 2, b"", status=5)

    def run(chunks: list[bytes]) -> list[Any]:
        client = Protocol(Role.CLIENT, Identity("client-engine", None, SECRET), nonce=CLIENT_NONCE)
        client.connection_made(CLIENT_END, SERVER_END)
        out: list[Any] = []
        for chunk in chunks:
            out += [e if isinstance(e, Opened) else (e.kind, e.request_id, e.status) for e in client.feed(chunk)]
        return out

    stream = to_client + answers
    whole = run([stream])
    assert isinstance(whole[0], Opened) and whole[0].peer.authenticated and len(whole) == 3
    for k in range(1, len(stream)):
        assert run([stream[:k], stream[k:]]) == whole, f"split at byte {k}"


def test_a_wrong_secret_is_refused_with_a_goodbye_and_both_sides_close() -> None:
    server, client = make_pair(SECRET, client_secret=b"t" * 32)
    pump(server, client)  # the client answers with a proof made with the wrong secret
    events = pump(client, server)
    assert len(events) == 1 and isinstance(events[0], Closed) and events[0].by_us
    assert isinstance(events[0].error, AuthenticationFailed) and server.phase is Phase.CLOSING
    events = pump(server, client)  # the GOODBYE(UNAUTHENTICATED)
    assert isinstance(events[0], Closed) and isinstance(events[0].error, AuthenticationFailed)
    assert client.phase is Phase.CLOSED


def test_a_relayed_proof_is_refused() -> None:
    """The client dialled a relay (its proof names the relay's endpoint): the real server refuses it."""
    server = Protocol(Role.SERVER, Identity("server-engine", None, SECRET))
    client = Protocol(Role.CLIENT, Identity("client-engine", None, SECRET))
    server.connection_made(SERVER_END, "127.0.0.1:40000")  # the relay's connection to the server
    client.connection_made(CLIENT_END, "127.0.0.1:6999")  # the client dialled the relay
    pump(server, client)
    events = pump(client, server)
    assert isinstance(events[0], Closed) and isinstance(events[0].error, AuthenticationFailed)


def test_a_server_that_cannot_prove_the_secret_is_refused_by_the_client() -> None:
    server, client = make_pair(SECRET, client_secret=SECRET)
    pump(server, client)
    client.data_to_send()
    forged = encode_frame(Kind.HELLO, 0, pack_body({"mac": b"\0" * 32}))
    events = client.feed(forged)
    assert isinstance(events[0], Closed) and "did not prove" in str(events[0].error)
    assert client.phase is Phase.CLOSED
    with pytest.raises(LocalProtocolError, match="closed"):
        client.feed(request(1))


@pytest.mark.parametrize(
    ("server_secret", "client_secret", "why"),
    [(None, SECRET, "does not authenticate"), (SECRET, None, "requires a shared secret")],
)
def test_a_secret_on_one_side_only_is_refused_by_the_client(
    server_secret: bytes | None, client_secret: bytes | None, why: str
) -> None:
    server, client = make_pair(server_secret, client_secret=client_secret)
    events = pump(server, client)
    assert isinstance(events[0], Closed) and why in str(events[0].error)
    assert client.data_to_send() == []  # nothing was sent to that server


def test_a_goodbye_in_the_handshake_ends_the_connection_with_its_reason() -> None:
    client = Protocol(Role.CLIENT, Identity("client-engine", None, None))
    client.connection_made(CLIENT_END, SERVER_END)
    events = client.feed(encode_frame(Kind.GOODBYE, 0, pack_body("too many connections"), status=Status.OVERLOADED))
    assert isinstance(events[0], Closed) and isinstance(events[0].error, ConnectionLost)
    assert "too many connections" in str(events[0].error) and client.phase is Phase.CLOSED


@pytest.mark.parametrize("kind", [k for k in Kind if k not in (Kind.HELLO, Kind.GOODBYE)])
def test_only_hello_and_goodbye_are_legal_before_the_handshake(kind: Kind) -> None:
    server, _ = make_pair()
    frame = encode_header(kind, 1, 0)
    with pytest.raises(RemoteProtocolError, match=r"HELLO first|bulk data"):
        server.feed(frame)
    assert server.phase is Phase.ERROR


def test_a_second_hello_after_the_handshake_is_a_protocol_error_and_the_connection_refuses_further_use() -> None:
    server, client = make_pair()
    handshake(server, client)
    with pytest.raises(RemoteProtocolError, match="HELLO frame is not allowed"):
        server.feed(encode_frame(Kind.HELLO, 0, pack_body({"engine_id": "again"})))
    assert server.phase is Phase.ERROR and isinstance(server.error, RemoteProtocolError)
    with pytest.raises(LocalProtocolError, match="error"):
        server.feed(request(1))
    with pytest.raises(LocalProtocolError):
        server.next_request_id()


def test_hello_and_requests_in_one_batch_are_all_delivered_after_open() -> None:
    server, client = make_pair()
    pump(server, client)
    hello = b"".join(client.data_to_send())
    events = server.feed(hello + request(1) + request(2))
    assert isinstance(events[0], Opened) and [f.request_id for f in events[1:]] == [1, 2]


def test_malformed_hellos_are_protocol_errors() -> None:
    for body in (pack_body([1, 2]), pack_body({"engine_id": 5}), b"\xc1"):
        server, _ = make_pair()
        with pytest.raises(RemoteProtocolError):
            server.feed(encode_frame(Kind.HELLO, 0, body))
        assert server.phase is Phase.ERROR
    client = Protocol(Role.CLIENT, Identity("c", None))
    client.connection_made(CLIENT_END, SERVER_END)
    with pytest.raises(RemoteProtocolError, match="nonce"):
        client.feed(encode_frame(Kind.HELLO, 0, pack_body({"engine_id": "s", "nonce": b"short"})))


@pytest.mark.parametrize("secret", [None, SECRET], ids=["open", "authenticated"])
def test_cross_memory_attach_and_split_reads_are_announced_in_the_hellos(secret: bytes | None) -> None:
    """Both sides announce cross-memory attach, split-read writes, write offers and split pushes
    (svcframe.bulk); each takes them up only for a peer of its node (a unix socket), and an older peer, whose
    HELLO has no "cma_write" (or no "cma_offer", no "cma_split_push"), is never asked to write (or sent an
    offer, which it would take for a malformed pull, or a push naming its source's bulk id, a bad frame to it)."""
    for on_node in (True, False):
        server = Protocol(Role.SERVER, Identity("server-engine", None, secret, cma=True), nonce=SERVER_NONCE)
        client = Protocol(Role.CLIENT, Identity("client-engine", None, secret, cma=True), nonce=CLIENT_NONCE)
        server.connection_made(SERVER_END, CLIENT_END, peer_on_node=on_node)
        client.connection_made(CLIENT_END, SERVER_END, peer_on_node=on_node)
        handshake(server, client)
        assert server.phase is Phase.OPEN and client.phase is Phase.OPEN
        assert server.peer is not None and client.peer is not None
        assert server.peer.authenticated is client.peer.authenticated is (secret is not None)
        for peer in (server.peer, client.peer):
            assert (peer.cma, peer.cma_write, peer.cma_offer, peer.cma_split_push) == (on_node,) * 4
            assert peer.push_ahead  # (pushes ahead of an answer: any transport)
    older = {"engine_id": "s", "nonce": SERVER_NONCE, "auth": False, "max_body_bytes": 1 << 20, "cma": True}
    writes = {**older, "cma_write": True}
    for hello, cma_write, cma_offer, cma_split_push in (
        (older, False, False, False),
        (writes, True, False, False),
        ({**writes, "cma_offer": True}, True, True, False),
        ({**older, "cma_offer": True}, False, False, False),  # (offers are a part of writes)
        ({**writes, "cma_offer": 1}, True, False, False),
        ({**writes, "cma_offer": True, "cma": 1}, False, False, False),
        ({**writes, "cma_split_push": True}, True, False, True),
        ({**older, "cma_split_push": True}, False, False, False),  # (so are split pushes)
        ({**writes, "cma_split_push": "yes"}, True, False, False),
    ):
        client = Protocol(Role.CLIENT, Identity("c", None, cma=True))
        client.connection_made(CLIENT_END, SERVER_END, peer_on_node=True)
        client.feed(encode_frame(Kind.HELLO, 0, pack_body(hello)))
        assert client.peer is not None and client.peer.push_ahead is False  # (none of these says it)
        assert (client.peer.cma_write, client.peer.cma_offer, client.peer.cma_split_push) == (
            cma_write, cma_offer, cma_split_push,
        )  # fmt: skip


@pytest.mark.parametrize("limit", [0, 1, 4095, -5, "4 MiB", 2.5e6, True])
def test_a_hello_announcing_a_frame_limit_below_the_minimum_is_refused(limit: object) -> None:
    """We send a peer bulk data in frames of at most its announced max_body_bytes: a limit of 1 byte would
    make a 4 MiB pull four million frames. Below MIN_MAX_BODY_BYTES (or not an int) is a protocol error."""
    server, _ = make_pair()
    with pytest.raises(RemoteProtocolError, match="max_body_bytes"):
        server.feed(encode_frame(Kind.HELLO, 0, pack_body({"engine_id": "c", "max_body_bytes": limit})))
    assert server.phase is Phase.ERROR
    server, _ = make_pair()  # the smallest allowed is fine (and one left out means the default)
    server.feed(encode_frame(Kind.HELLO, 0, pack_body({"engine_id": "c", "max_body_bytes": MIN_MAX_BODY_BYTES})))
    assert server.phase is not Phase.ERROR


def test_bulk_data_beyond_what_was_asked_is_a_protocol_error() -> None:
    server, client = make_pair()
    handshake(server, client)
    rid = client.next_request_id()
    dest = bytearray(10)
    client.pulls[rid] = IncomingPull(memoryview(dest))
    client.feed(encode_header(Kind.BULK_DATA_REPLY, rid, 6) + b"abcdef")
    with pytest.raises(RemoteProtocolError, match="12 bytes for a 10-byte pull"):
        client.feed(encode_header(Kind.BULK_DATA_REPLY, rid, 6) + b"ghijkl")
    assert dest[:6] == b"abcdef"


def test_push_data_for_an_unknown_request_and_too_many_pushes_are_protocol_errors() -> None:
    server, client = make_pair()
    handshake(server, client)
    with pytest.raises(RemoteProtocolError, match="unknown request"):
        server.feed(encode_header(Kind.BULK_DATA_PUSH, 9, 4) + b"data")
    server, client = make_pair()
    server.max_pushes = 2
    handshake(server, client)
    pushes = server.feed(b"".join(encode_frame(Kind.BULK_PUSH, i, pack_body([b"\0" * 16, 0, 8])) for i in (1, 2, 3)))
    server.expect_push(pushes[0], memoryview(bytearray(8)), 8, None)
    server.expect_push(pushes[1], memoryview(bytearray(8)), 8, None)
    with pytest.raises(RemoteProtocolError, match="more than 2 bulk pushes"):
        server.expect_push(pushes[2], memoryview(bytearray(8)), 8, None)


def test_a_refused_push_has_its_data_discarded_and_no_more() -> None:
    server, client = make_pair()
    handshake(server, client)
    (push,) = server.feed(encode_frame(Kind.BULK_PUSH, 1, pack_body([b"\0" * 16, 0, 8])))
    assert server.expect_push(push, None, 8, "not exposed") is None
    frames = server.feed(encode_header(Kind.BULK_DATA_PUSH, 1, 8) + b"12345678")
    assert [f.kind for f in frames] == [Kind.BULK_DATA_PUSH]
    with pytest.raises(RemoteProtocolError, match="unknown request"):
        server.feed(encode_header(Kind.BULK_DATA_PUSH, 1, 1) + b"9")


def test_our_goodbye_makes_the_connection_closing_and_later_frames_are_dropped() -> None:
    server, client = make_pair()
    handshake(server, client)
    data = server.goodbye(Status.SHUTTING_DOWN, "draining")
    assert server.phase is Phase.CLOSING
    assert server.feed(request(1)) == []
    (bye,) = client.feed(data)
    error = client.goodbye_received(bye)
    assert isinstance(error, ConnectionLost) and "draining" in str(error) and client.phase is Phase.CLOSED


def test_connection_lost_in_the_middle_of_a_frame_says_so() -> None:
    server, client = make_pair()
    handshake(server, client)
    server.feed(request(1)[:50])
    error = server.connection_lost()
    assert isinstance(error, ConnectionLost) and "middle of a frame" in str(error)
    assert server.phase is Phase.CLOSED
    assert client.connection_lost() is None


# -- a rule-based state machine over random interleavings ------------------------------------------------
class PairMachine(RuleBasedStateMachine):
    """Two protocols joined by two byte queues that deliver in arbitrary pieces. The model: the calls the
    client has pending, what the server has received, the bytes each push delivered."""

    def __init__(self) -> None:
        super().__init__()
        self.server: Protocol
        self.client: Protocol
        self.to_server = bytearray()
        self.to_client = bytearray()
        self.server_frames: list[Frame] = []
        self.client_frames: list[Frame] = []
        self.sent_requests: list[int] = []
        self.answered: set[int] = set()
        self.pushes: dict[int, tuple[bytearray, bytes]] = {}
        self.pulls: dict[int, tuple[bytearray, bytes]] = {}
        self.failed = False

    @rule(secret=st.sampled_from([None, SECRET]))
    @precondition(lambda self: not hasattr(self, "server") or self.failed)
    def connect(self, secret: bytes | None) -> None:
        """A new connection (the first, or after the last one was corrupted)."""
        self.__init__()  # type: ignore[misc]
        self.server, self.client = make_pair(secret, fixed_nonces=False)
        self.to_client += b"".join(self.server.data_to_send())

    def _ready(self) -> bool:
        return hasattr(self, "server") and not self.failed

    def _open(self) -> bool:
        return self._ready() and self.client.phase is Phase.OPEN and self.server.phase is Phase.OPEN

    def _deliver(self, queue: bytearray, dst: Protocol, k: int, out: list[Frame]) -> None:
        data, queue[:] = bytes(queue[:k]), queue[k:]
        view = memoryview(data)
        while view:
            buf = dst.get_buffer()
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            events = dst.receive(n)
            while events:
                for e in events:
                    if isinstance(e, Opened | Closed):
                        continue
                    out.append(e)
                    self._dispatch(dst, e)
                events = dst.more()
        other_queue = self.to_client if dst is self.server else self.to_server
        other_queue += b"".join(dst.data_to_send())

    def _dispatch(self, proto: Protocol, frame: Frame) -> None:
        if proto is self.server and frame.kind == Kind.BULK_PUSH:
            if frame.request_id in self.pushes:
                dest, _ = self.pushes[frame.request_id]
                proto.expect_push(frame, memoryview(dest), len(dest), None)
            else:  # only a corrupted stream announces a push the client never made: refuse it
                proto.expect_push(frame, None, 0, "unknown push")
        elif proto is self.server and frame.kind == Kind.BULK_DATA_PUSH:
            proto.push_complete(frame.request_id)
        elif proto is self.client and frame.kind == Kind.RESPONSE:
            self.answered.add(frame.request_id)
            self.client.pending.pop(frame.request_id, None)

    @rule(k=st.integers(1, 5000))
    @precondition(lambda self: self._ready() and bool(self.to_server))
    def deliver_to_server(self, k: int) -> None:
        self._deliver(self.to_server, self.server, k, self.server_frames)

    @rule(k=st.integers(1, 5000))
    @precondition(lambda self: self._ready() and bool(self.to_client))
    def deliver_to_client(self, k: int) -> None:
        self._deliver(self.to_client, self.client, k, self.client_frames)

    @rule(arg=st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=20), st.binary(max_size=3000)))
    @precondition(lambda self: self._open())
    def call(self, arg: object) -> None:
        rid = self.client.next_request_id()
        self.client.pending[rid] = "waiter"
        self.sent_requests.append(rid)
        self.to_server += request(rid, arg)

    @rule(data=st.binary(min_size=1, max_size=9000), chunk=st.integers(1, 4000))
    @precondition(lambda self: self._open())
    def push(self, data: bytes, chunk: int) -> None:
        rid = self.client.next_request_id()
        self.pushes[rid] = (bytearray(len(data)), data)
        self.to_server += encode_frame(Kind.BULK_PUSH, rid, pack_body([b"\0" * 16, 0, len(data)]))
        for pos in range(0, len(data), chunk):
            part = data[pos : pos + chunk]
            self.to_server += encode_header(Kind.BULK_DATA_PUSH, rid, len(part)) + part

    @rule(data=st.binary(min_size=1, max_size=9000))
    @precondition(lambda self: self._open())
    def pull(self, data: bytes) -> None:
        rid = self.client.next_request_id()
        dest = bytearray(len(data))
        self.client.pulls[rid] = IncomingPull(memoryview(dest))
        self.pulls[rid] = (dest, data)
        self.to_client += encode_header(Kind.BULK_DATA_REPLY, rid, len(data)) + data
        self.to_client += encode_frame(Kind.RESPONSE, rid)

    @rule()
    @precondition(lambda self: self._open() and any(f.kind == Kind.REQUEST for f in self.server_frames))
    def answer_all(self) -> None:
        for f in self.server_frames:
            if f.kind == Kind.REQUEST and f.request_id not in self.answered:
                self.to_client += encode_frame(Kind.RESPONSE, f.request_id, pack_body("ok"))

    @rule(pos=st.integers(0, 10_000), byte=st.integers(0, 255))
    @precondition(lambda self: self._ready() and len(self.to_server) > 0)
    def corrupt(self, pos: int, byte: int) -> None:
        """A corrupted stream either still decodes (into frames the model no longer predicts) or raises
        RemoteProtocolError, never anything else; after an error the protocol refuses further use. Either
        way this connection's run ends here (``connect`` starts a new one)."""
        pos %= len(self.to_server)
        self.to_server[pos] = byte
        self.failed = True
        try:
            self._deliver(self.to_server, self.server, len(self.to_server), self.server_frames)
        except RemoteProtocolError:
            assert self.server.phase is Phase.ERROR
            with pytest.raises(LocalProtocolError):
                self.server.receive(0)

    @invariant()
    def requests_arrive_in_order_and_once(self) -> None:
        if self.failed or not hasattr(self, "server"):
            return
        got = [f.request_id for f in self.server_frames if f.kind == Kind.REQUEST]
        assert got == self.sent_requests[: len(got)]

    @invariant()
    def bulk_bytes_land_where_they_belong(self) -> None:
        if self.failed or not hasattr(self, "server"):
            return
        for rid, (dest, data) in self.pushes.items():
            if not self.to_server and self.server.phase is Phase.OPEN:
                assert bytes(dest) == data, f"push {rid}"
        for rid, (dest, data) in self.pulls.items():
            if rid in self.answered:
                assert bytes(dest) == data, f"pull {rid}"

    @invariant()
    def phases_agree(self) -> None:
        if not hasattr(self, "server") or self.failed:
            return
        if self.server.phase is Phase.OPEN:
            assert self.client.phase in (Phase.OPEN, Phase.AWAIT_PROOF)
        assert self.client.phase is not Phase.ERROR


TestPairMachine = PairMachine.TestCase
TestPairMachine.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
