"""Hostile peers against a group (svcframe.group_provider), with frames made by hand (svcframe.testing.RawPeer):
with a shared secret, a peer that cannot prove it changes nothing (a forged "member X is dead" never reaches the
protocol, nor does a join or a leave for another); a member that proves it but sends garbage gets one clear error
per message and the view stays as it was; even an authenticated member's lie that a live member is dead is undone
by that member's refutation (SWIM section 5)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgpack
import pytest
from test_group import GROUP_ID, start_group, stop_all, view_of, wait_for_view

from svcframe import AuthenticationFailed, Engine
from svcframe.membership import DEAD, LEFT, Gossip, Ping, Update, encode_message
from svcframe.testing import RawPeer
from svcframe.wire import Kind, Status

uvloop_test = pytest.mark.asyncio(loop_factories=["uvloop"])
SECRET = os.environ["SVCFRAME_SECRET"].encode()


def forged_death(view: dict[str, Any], victim: str, origin: str = "id-mallory") -> dict[str, Any]:
    """A gossip message saying the member at ``victim`` is dead (and has left), at a high incarnation."""
    member_id = next(m["member_id"] for m in view["members"] if m["address"] == victim)
    updates = (Update(DEAD, member_id, 2**40, origin), Update(LEFT, member_id, 2**40, origin))
    return encode_message(Gossip(origin, updates))


async def unchanged(engine: Engine, address: str, before: dict[str, Any]) -> None:
    after = await view_of(engine, address)
    assert (after["version"], after["digest"]) == (before["version"], before["digest"]), after
    stats = await engine.call(address, "stats", None, provider_id=GROUP_ID)
    assert stats["deaths"] == 0 and stats["members"]["left"] == 0 and stats["suspicions"] == 0


@uvloop_test
async def test_a_peer_without_the_secret_changes_nothing(tmp_path: Path) -> None:
    _, servers = start_group(tmp_path, 3)
    try:
        async with Engine(None) as engine:
            target, victim = servers[0].address, servers[1].address
            before = await wait_for_view(engine, target, lambda v: len(v["members"]) == 3, 15.0, "3 members")
            forged = forged_death(before, victim)
            # 1. no secret: the handshake's answer is a GOODBYE; the forged frame that follows is never read
            peer = await RawPeer.connect(target, secret=None)
            try:
                peer.request(1, GROUP_ID, "swim", forged)
                peer.request(2, GROUP_ID, "leave", {"address": victim})
                peer.request(3, GROUP_ID, "join", {"members": [["tcp://127.0.0.1:1", GROUP_ID]]})
                try:
                    goodbye = await peer.read_frame()
                except (BrokenPipeError, ConnectionResetError):  # our writes met the socket the server closed:
                    goodbye = None  # the reset can discard the GOODBYE before we read it (the view is checked below)
                if goodbye is not None:
                    assert (goodbye.kind, goodbye.status) == (Kind.GOODBYE, Status.UNAUTHENTICATED)
                    assert await peer.wait_closed() == b""  # and no answer to any of the three
            finally:
                await peer.close()
            # 2. a wrong secret: refused the same way
            with pytest.raises(AuthenticationFailed):
                await RawPeer.connect(target, secret=b"not-the-secret-" * 2)
            # 3. no handshake at all: a request frame first is a protocol error, the connection dropped
            peer = await RawPeer.connect(target, handshake=False)
            try:
                await peer.read_frame()  # the server's HELLO
                peer.request(1, GROUP_ID, "swim", forged)
                await peer.wait_closed()
            finally:
                await peer.close()
            await unchanged(engine, target, before)
            await unchanged(engine, victim, before)
    finally:
        stop_all(servers)


@uvloop_test
async def test_garbage_from_a_member_is_refused_message_by_message(tmp_path: Path) -> None:
    """An authenticated peer's malformed messages: each gets AppError MalformedMessage (or a type error for the
    other RPCs), the connection stays usable, the view does not move."""
    _, servers = start_group(tmp_path, 2)
    try:
        async with Engine(None) as engine:
            target = servers[0].address
            before = await wait_for_view(engine, target, lambda v: len(v["members"]) == 2, 15.0, "2 members")
            garbage: list[Any] = [
                None,
                7,
                "ping",
                [],
                {},
                {"k": "ping"},
                {"k": "ping", "s": "x", "q": -1, "t": None},
                {"k": "ping", "s": "x" * 10_000, "q": 1, "t": None},
                {"k": "gossip", "s": "x", "u": [[1, "y", 0, "x", None]] * 1000},
                {"k": "sync", "s": "x", "e": [[0, "y", 0, "x", ["y", "a" * 600, 1, None, None, None, 0]]], "w": True},
                {"k": "sync", "s": "x", "e": [[0, "y", 0, "x", None]], "w": True},
                {"k": "ping_req", "s": "x", "q": 1, "t": ["y", "tcp://h:1", 2**20, None, None, None, 0]},
                {"k": "ack", "s": "x", "q": 1.5, "r": "y"},
            ]
            async with await RawPeer.connect(target, secret=SECRET) as peer:
                for i, message in enumerate(garbage, start=1):
                    peer.request(i, GROUP_ID, "swim", message)
                    frame, body = await peer.read_response()
                    assert frame.request_id == i
                    assert frame.status in (Status.APP_ERROR, Status.BAD_REQUEST), (message, frame.status, body)
                    if frame.status == Status.APP_ERROR:
                        assert body[0] == "MalformedMessage", body
                for i, (rpc, arg) in enumerate([("join", {"members": "all"}), ("leave", {"address": 5}),
                                                ("watch", {"version": 0, "timeout_seconds": -1})], start=100):  # fmt: skip
                    peer.request(i, GROUP_ID, rpc, arg)
                    frame, body = await peer.read_response()
                    assert frame.status == Status.HANDLER_ERROR and body[0] in ("TypeError", "ValueError"), body
                # a msgpack body that is not even msgpack: a bad request, the connection dropped
                peer.request(200, GROUP_ID, "swim", body=b"\xc1")
                frame, _ = await peer.read_response()
                assert frame.status == Status.BAD_REQUEST
            await unchanged(engine, target, before)
    finally:
        stop_all(servers)


@uvloop_test
async def test_a_members_lie_that_a_live_member_is_dead_is_refuted(tmp_path: Path) -> None:
    """Authenticated members are trusted to speak, not to be right: the member declared dead hears of it and
    refutes at a higher incarnation, and every view has it again."""
    _, servers = start_group(tmp_path, 3)
    try:
        async with Engine(None) as engine:
            target, victim = servers[0].address, servers[2].address
            before = await wait_for_view(engine, target, lambda v: len(v["members"]) == 3, 15.0, "3 members")
            member_id = next(m["member_id"] for m in before["members"] if m["address"] == victim)
            lie = encode_message(Ping(1, "id-mallory", None, (Update(DEAD, member_id, 0, "id-mallory"),)))
            async with await RawPeer.connect(target, secret=SECRET) as peer:
                peer.request(1, GROUP_ID, "swim", lie)
                frame, body = await peer.read_response()
                assert frame.status == Status.OK and isinstance(body, list)
            await wait_for_view(engine, target, lambda v: victim in {m["address"] for m in v["members"]}
                                and v["version"] > before["version"], 15.0, "the refutation")  # fmt: skip
            stats = await engine.call(victim, "stats", None, provider_id=GROUP_ID)
            assert stats["refutations"] >= 1 and stats["incarnation"] >= 1
            after = await view_of(engine, target)
            assert member_id in {m["member_id"] for m in after["members"]}
    finally:
        stop_all(servers)


def test_the_hand_made_frames_are_what_the_protocol_reads() -> None:
    """The forged message is a valid one (so the tests above refuse it for who sent it, not for its form)."""
    from svcframe.membership import decode_message

    message = forged_death({"members": [{"address": "a", "member_id": "m"}]}, "a")
    decoded = decode_message(msgpack.unpackb(msgpack.packb(message), raw=False))
    assert [u.status for u in decoded.updates] == [DEAD, LEFT]
