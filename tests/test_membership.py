"""The membership protocol, sans-IO (svcframe.membership): the order of what is said about a member, refutation,
identity at an address, the Lifeguard timeouts, and whole groups on a simulated network (tests/membership_kit.py):
convergence, a killed or stopped member removed within the stated bound, no false removal under loss, a partition
that heals. The wire form is fuzzed: garbage raises only MalformedMessage."""

from __future__ import annotations

import contextlib
import math
import random

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from membership_kit import Link, Network, percentile

from svcframe.membership import (
    ALIVE,
    DEAD,
    LEFT,
    SUSPECT,
    Ack,
    MalformedMessage,
    MemberInfo,
    Nack,
    Ping,
    PingReq,
    Reply,
    Send,
    Swim,
    SwimSettings,
    Sync,
    Update,
    decode_message,
    encode_message,
)

FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def member(name: str, rank: int | None = None, port: int = 1) -> MemberInfo:
    return MemberInfo(f"id-{name}", f"tcp://{name}:{port}", 7, rank=rank, host=name, pid=100)


def alive(info: MemberInfo, incarnation: int = 0, origin: str | None = None) -> Update:
    return Update(ALIVE, info.member_id, incarnation, origin or info.member_id, info)


def gossip(*updates: Update, sender: str = "id-other") -> Ping:
    return Ping(1, sender, None, updates)


# -- what is said about a member ---------------------------------------------------------------------------------
def test_incarnations_order_what_is_said_about_a_member() -> None:
    me, b = member("a"), member("b")
    swim = Swim(me, now=0.0)
    swim.receive(gossip(alive(b, 3)), 0.0)
    assert swim.status_of(b.member_id) == ALIVE and swim.view().version == 1
    swim.receive(gossip(Update(SUSPECT, b.member_id, 2, "id-c")), 0.1)  # older news: ignored
    assert swim.status_of(b.member_id) == ALIVE
    swim.receive(gossip(Update(SUSPECT, b.member_id, 3, "id-c")), 0.2)  # same incarnation: suspect wins
    assert swim.status_of(b.member_id) == SUSPECT
    assert [m.member_id for m in swim.view().members] == [me.member_id, b.member_id]  # a suspect stays a member
    swim.receive(gossip(alive(b, 3)), 0.3)  # alive at the same incarnation does not clear it
    assert swim.status_of(b.member_id) == SUSPECT
    swim.receive(gossip(alive(b, 4)), 0.4)  # its refutation does
    assert swim.status_of(b.member_id) == ALIVE
    version = swim.view().version
    swim.receive(gossip(Update(DEAD, b.member_id, 4, "id-c")), 0.5)
    assert swim.status_of(b.member_id) == DEAD
    assert [m.member_id for m in swim.view().members] == [me.member_id]
    assert swim.view().version == version + 1
    swim.receive(gossip(alive(b, 4)), 0.6)  # stale gossip never revives a dead member
    assert swim.status_of(b.member_id) == DEAD
    swim.receive(gossip(alive(b, 5)), 0.7)  # its own alive at a higher incarnation does
    assert swim.status_of(b.member_id) == ALIVE
    changes = [(c.status, c.member.member_id) for c in swim.take_changes()]
    assert changes == [(ALIVE, "id-b"), (DEAD, "id-b"), (ALIVE, "id-b")]


def test_news_of_an_unknown_member_s_end_is_ignored() -> None:
    swim = Swim(member("a"), now=0.0)
    swim.receive(gossip(Update(DEAD, "id-x", 9, "id-c"), Update(SUSPECT, "id-y", 0, "id-c")), 0.0)
    assert swim.status_of("id-x") is None and swim.status_of("id-y") is None
    assert swim.view().version == 0


@pytest.mark.parametrize("status", [SUSPECT, DEAD])
def test_a_member_refutes_its_suspicion_or_death_at_a_higher_incarnation(status: str) -> None:
    me = member("a")
    swim = Swim(me, now=0.0, incarnation=2)
    answers = swim.receive(gossip(Update(status, me.member_id, 5, "id-c")), 0.0)
    assert swim.incarnation == 6 and swim.status_of(me.member_id) == ALIVE and swim.awareness == 1
    # the refutation rides on the answer, and on what it sends next
    (ack,) = answers
    assert isinstance(ack, Ack)
    assert Update(ALIVE, me.member_id, 6, me.member_id, me) in ack.updates
    swim.receive(gossip(Update(status, me.member_id, 4, "id-c")), 0.1)  # older: nothing to refute
    assert swim.incarnation == 6 and swim.stats.refutations == 1


def test_a_removal_is_obeyed_and_join_comes_back_at_a_higher_incarnation() -> None:
    me, b = member("a"), member("b")
    swim = Swim(me, now=0.0)
    swim.receive(gossip(alive(b)), 0.0)
    swim.receive(gossip(Update(LEFT, me.member_id, 0, b.member_id)), 0.1)
    assert swim.left and swim.view().members == ()
    assert swim.next_deadline() is None  # a member out of the group probes nobody
    (nack,) = swim.receive(Ping(9, b.member_id, me.member_id), 0.2)  # a prober that has not heard is told
    assert isinstance(nack, Nack) and nack.updates[0].status == LEFT
    swim.join([b.endpoint], 0.3)
    assert not swim.left and swim.incarnation == 1
    (send,) = [o for o in swim.take_outputs() if isinstance(o, Send)]
    assert isinstance(send.message, Sync) and send.address == b.address


def test_a_member_that_leaves_tells_others_and_its_view_empties() -> None:
    me, b, c = member("a"), member("b"), member("c")
    swim = Swim(me, now=0.0, rng=random.Random(1))
    swim.receive(gossip(alive(b), alive(c)), 0.0)
    swim.take_outputs()
    swim.take_changes()
    swim.leave(0.1)
    sends = [o for o in swim.take_outputs() if isinstance(o, Send)]
    assert {s.address for s in sends} == {b.address, c.address}
    assert all(Update(LEFT, me.member_id, 1, me.member_id) in s.message.updates for s in sends)
    assert swim.view().members == ()
    # a change like any other, for the logs and for the watchers of this member's view (a watch waits on them)
    assert [(c.status, c.member.member_id) for c in swim.take_changes()] == [(LEFT, me.member_id)]


# -- identity at an address ------------------------------------------------------------------------------------
def test_a_process_that_comes_back_at_the_same_address_is_a_new_member_never_the_old_one() -> None:
    me, old = member("a"), member("b")
    new = MemberInfo("id-b-restarted", old.address, old.provider_id, rank=old.rank)
    swim = Swim(me, now=0.0, rng=random.Random(3))
    swim.receive(gossip(alive(old)), 0.0)
    swim.tick(0.0)
    (ping,) = [o for o in swim.take_outputs() if isinstance(o, Send) and isinstance(o.message, Ping)]
    assert ping.message.target_id == old.member_id  # the prober says whom it expects there
    # the restarted process answers at that address with its own id: the old member is gone, for sure
    swim.receive(Ack(ping.message.seq, new.member_id, new.member_id), 0.01)
    assert swim.status_of(old.member_id) == DEAD
    (change,) = [c for c in swim.take_changes() if c.status == DEAD]
    assert "another member" in change.why
    # the new one joins as itself; news of the old one (even a late alive) never makes it the new one
    swim.receive(gossip(alive(new)), 0.02)
    swim.receive(gossip(alive(old, 0)), 0.03)
    assert swim.status_of(new.member_id) == ALIVE and swim.status_of(old.member_id) == DEAD
    assert [m.member_id for m in swim.view().members] == [me.member_id, new.member_id]


def test_a_second_member_at_an_address_makes_the_first_a_suspect_probed_next() -> None:
    me, old = member("a"), member("b")
    new = MemberInfo("id-b-restarted", old.address, old.provider_id)
    swim = Swim(me, now=0.0)
    swim.receive(gossip(alive(old)), 0.0)
    swim.receive(gossip(alive(new)), 0.1)
    assert swim.status_of(old.member_id) == SUSPECT
    swim.tick(1.1)
    (ping,) = [o for o in swim.take_outputs() if isinstance(o, Send) and isinstance(o.message, Ping)]
    assert ping.message.target_id == old.member_id


# -- probes --------------------------------------------------------------------------------------------------------
def test_a_helper_probes_for_another_and_answers_later() -> None:
    helper, target = member("h"), member("t")
    swim = Swim(helper, now=0.0)
    swim.receive(gossip(alive(target)), 0.0)
    swim.take_outputs()
    assert swim.receive(PingReq(41, "id-asker", target), 0.0, token=5) == []
    (send,) = swim.take_outputs()
    assert isinstance(send, Send) and send.address == target.address and isinstance(send.message, Ping)
    swim.receive(Ack(send.message.seq, target.member_id, target.member_id), 0.01)
    (reply,) = swim.take_outputs()
    assert isinstance(reply, Reply) and reply.token == 5
    assert isinstance(reply.message, Ack) and reply.message.seq == 41 and reply.message.responder == target.member_id
    # a target that does not answer in time: the helper says so (Lifeguard's nack)
    swim.receive(PingReq(42, "id-asker", target), 1.0, token=6)
    swim.take_outputs()
    swim.tick(1.0 + swim.ping_timeout() + 1e-6)
    (nack,) = [o for o in swim.take_outputs() if isinstance(o, Reply)]
    assert nack.token == 6 and isinstance(nack.message, Nack) and nack.message.seq == 42


def test_the_ping_timeout_follows_the_measured_round_trip() -> None:
    """RFC 6298's SRTT + 4 RTTVAR, within [ping_timeout_min, protocol_period / 2]; a late answer counts too."""
    settings_ = SwimSettings(protocol_period=1.0, ping_timeout_min=0.01)
    net = Network(seed=4, settings=settings_, default_link=Link(latency=0.06, jitter=0.004))
    net.group(3)
    net.run(20.0)
    for swim in net.nodes.values():
        assert swim.round_trip.samples >= 5
        assert 0.12 <= swim.round_trip.srtt <= 0.13  # type: ignore[operator]
        assert 0.12 < swim.ping_timeout() < 0.2
    assert net.total("suspicions") == 0
    # a fast link: the floor
    net = Network(seed=5, settings=SwimSettings(ping_timeout_min=0.05), default_link=Link(latency=0.0002))
    net.group(3)
    net.run(10.0)
    assert all(s.ping_timeout() == 0.05 for s in net.nodes.values())


def test_suspicion_timeouts_shrink_with_confirmations() -> None:
    """Lifeguard 4.2 with memberlist's constants: k = 4 - 2 confirmations take it from 6x to 1x the minimum."""
    net = Network(seed=6)
    swims = net.group(12)
    net.run(3.0)
    shortest, longest, k = swims[0].suspicion_bounds()  # memberlist's 4 x max(1, log10(n)) periods
    assert shortest == pytest.approx(4 * math.log10(12)) and longest == pytest.approx(6 * shortest) and k == 2
    target = swims[5].member_id
    swims[0].receive(gossip(Update(SUSPECT, target, 0, "id-c1")), 100.0)
    record = swims[0].members[target].suspicion
    assert record is not None and record.deadline == pytest.approx(100.0 + longest)
    swims[0].receive(gossip(Update(SUSPECT, target, 0, "id-c1")), 100.5)  # the same suspecter counts once
    assert record.deadline == pytest.approx(100.0 + longest)
    swims[0].receive(gossip(Update(SUSPECT, target, 0, "id-c2")), 101.0)
    assert record.deadline == pytest.approx(100.0 + longest - math.log(2) / math.log(3) * (longest - shortest))
    swims[0].receive(gossip(Update(SUSPECT, target, 0, "id-c3")), 101.5)
    assert record.deadline == pytest.approx(100.0 + shortest)


# -- whole groups --------------------------------------------------------------------------------------------------
def test_members_that_join_one_by_one_reach_a_single_view() -> None:
    net = Network(seed=7)
    net.group(8)
    assert net.run(10.0, until=lambda: net.single_view(8))
    views = {s.view().digest for s in net.nodes.values()}
    assert len(views) == 1
    assert net.total("suspicions") == 0


@pytest.mark.parametrize("fault", ["killed", "stopped"])
def test_a_failed_member_leaves_every_view_within_the_stated_bound(fault: str) -> None:
    """kill -9 (connections refused) and SIGSTOP (no answer): 20 trials, each within ``detection_bound()``."""
    times = []
    for seed in range(20):
        net = Network(seed=seed)
        swims = net.group(5)
        net.run(3.0)
        bound = swims[0].detection_bound()
        victim = net.address("n2")
        gone = net.nodes[victim].member_id
        getattr(net, fault).add(victim)
        start = net.now
        assert net.run(bound, until=lambda gone=gone, net=net: all(gone not in v for v in net.views().values()))
        times.append(net.now - start)
        assert net.total("deaths") == 4  # one each, of that member only
    assert percentile(times, 50) < 8.0  # the shortest suspicion (4 s) plus a probe or two
    assert max(times) <= bound


def test_no_false_removal_in_ten_minutes_at_five_percent_loss() -> None:
    """Messages lost at random (the worst case: TCP retransmits what the simulated network drops)."""
    for seed in (1, 2):
        net = Network(seed=seed, default_link=Link(latency=0.001, jitter=0.002, loss=0.05))
        net.group(6)
        net.run(600.0)
        assert net.total("deaths") == 0, net.views()
        assert net.single_view(6)


def test_a_slow_member_stretches_its_own_timeouts_and_is_not_removed() -> None:
    """Lifeguard 4.1: a member whose own answers come late (a loaded process) misses probes of others; its health
    multiplier rises, and the others, who are healthy, keep it."""
    net = Network(seed=8)
    net.group(5)
    net.run(3.0)
    slow = net.address("n4")
    net.slow[slow] = 0.3  # every message it handles waits 300 ms
    net.run(120.0)
    assert net.total("deaths") == 0
    assert net.single_view(5)
    assert net.nodes[slow].stats.refutations + net.nodes[slow].awareness > 0
    assert max(s.awareness for a, s in net.nodes.items() if a != slow) <= 1


def test_a_partition_that_heals_becomes_a_single_view_again() -> None:
    net = Network(seed=9)
    net.group(6)
    net.run(3.0)
    a = {net.address(f"n{i}") for i in range(3)}
    b = {net.address(f"n{i}") for i in range(3, 6)}
    net.partition = [a, b]
    assert net.run(60.0, until=lambda: all(len(v) == 3 for v in net.views().values()))  # each side alone
    net.run(30.0)
    net.partition = None
    start = net.now
    assert net.run(60.0, until=lambda: net.single_view(6))
    assert net.now - start < 10.0  # a reconnection (every 2 s) then a refutation or two
    ids = {m for v in net.views().values() for m in v}
    assert len(ids) == 6  # the same members: nobody had to start again


def test_a_member_restarted_at_its_address_replaces_the_old_one_in_every_view() -> None:
    net = Network(seed=10)
    net.group(4)
    net.run(3.0)
    victim = net.address("n1")
    old = net.nodes[victim].member_id
    net.killed.add(victim)
    del net.nodes[victim]
    net.killed.discard(victim)
    new = net.add("n1", rank=1, seeds=[net.address("n0")]).member_id
    assert new != old
    assert net.run(30.0, until=lambda: net.single_view(4))
    assert all(new in v and old not in v for v in net.views().values())


@given(
    seed=st.integers(0, 2**32),
    n=st.integers(2, 6),
    loss=st.sampled_from([0.0, 0.01, 0.05]),
    faults=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["kill", "stop", "leave"])), max_size=2),
)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_views_stay_consistent_under_random_faults(
    seed: int, n: int, loss: float, faults: list[tuple[int, str]]
) -> None:
    """Whatever fails: versions only grow, every live member sees itself, a member that failed never comes back
    into a view, and the survivors end with one view of exactly the survivors."""
    net = Network(seed=seed, default_link=Link(latency=0.001, jitter=0.003, loss=loss))
    net.group(n)
    net.run(3.0)
    gone: set[str] = set()
    for index, kind in faults:
        address = net.address(f"n{index % n}")
        swim = net.nodes[address]
        if swim.member_id in gone:
            continue
        gone.add(swim.member_id)
        if kind == "kill":
            net.killed.add(address)
        elif kind == "stop":
            net.stopped.add(address)
        else:
            swim.leave(net.now)
            net._pump(address)
            net.stopped.add(address)
    versions = {a: s.view().version for a, s in net.nodes.items()}
    bound = max(s.detection_bound() for s in net.nodes.values()) + 10.0
    survivors = {s.member_id for a, s in net.nodes.items() if net._live(a)}
    ok = net.run(bound, until=lambda: net.single_view() and set(next(iter(net.views().values()))) == survivors)
    assert ok or not survivors, net.views()
    for address, swim in net.nodes.items():
        assert swim.view().version >= versions[address]
        if net._live(address):
            assert swim.member_id in {m.member_id for m in swim.view().members}
            assert not gone & {m.member_id for m in swim.view().members}


# -- the wire form -------------------------------------------------------------------------------------------------
ids = st.text(min_size=1, max_size=64)
infos = st.builds(
    MemberInfo, ids, st.text(min_size=1, max_size=80), st.integers(0, 65535), st.none() | st.integers(0, 2**31 - 1),
    st.none() | st.text(min_size=1, max_size=40), st.none() | st.integers(0, 2**31 - 1), st.integers(0, 65535),
)  # fmt: skip
updates = st.one_of(
    infos.flatmap(
        lambda i: st.builds(Update, st.just(ALIVE), st.just(i.member_id), st.integers(0, 2**64 - 1), ids, st.just(i))
    ),
    st.builds(Update, st.sampled_from([SUSPECT, DEAD, LEFT]), ids, st.integers(0, 2**64 - 1), ids, st.none() | infos),
)
update_lists = st.lists(updates, max_size=5).map(tuple)
seqs = st.integers(0, 2**64 - 1)
messages = st.one_of(
    st.builds(Ping, seqs, ids, st.none() | ids, update_lists),
    st.builds(Ack, seqs, ids, ids, update_lists),
    st.builds(Nack, seqs, ids, update_lists),
    st.builds(PingReq, seqs, ids, infos, update_lists),
    st.builds(Sync, ids, update_lists, st.booleans(), update_lists),
)


@FUZZ
@given(messages)
def test_every_message_survives_the_wire(message: object) -> None:
    wire = msgpack.unpackb(msgpack.packb(encode_message(message), use_bin_type=True), raw=False)  # type: ignore[arg-type]
    assert decode_message(wire) == message


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats()
    | st.text(max_size=70)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=3), inner, max_size=6),
    max_leaves=30,
)


@FUZZ
@given(st.one_of(json_like, messages.map(encode_message).flatmap(lambda m: st.sampled_from(sorted(m)).flatmap(
    lambda k: json_like.map(lambda v: {**m, k: v})))))  # fmt: skip
def test_garbage_raises_only_malformed_message(value: object) -> None:
    """Any decoded value, and any valid message with one field replaced by anything: a message or
    MalformedMessage, never another exception."""
    with contextlib.suppress(MalformedMessage):
        decode_message(value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"k": "ping", "s": "x" * 65, "q": 1, "t": None}, "sender"),
        ({"k": "ping", "s": "a", "q": -1, "t": None}, "seq"),
        ({"k": "ping", "s": "a", "q": 1, "t": None, "extra": 1}, "unexpected key"),
        ({"k": "sync", "s": "a", "e": [[0, "b", 0, "b", None]], "w": False}, "alive update carries"),
        ({"k": "ack", "s": "a", "q": 1, "r": "b", "u": [[9, "b", 0, "b", None]]}, "status"),
        ({"k": "nack", "s": "a", "q": 1, "u": [[1, "b", 0, "b", None]] * 257}, "at most 256"),
        ({"k": "ping_req", "s": "a", "q": 1, "t": ["b", "tcp://b:1", 70000, None, None, None, 0]}, "provider_id"),
        ({"k": "who", "s": "a"}, "expected one of"),
    ],
)
def test_a_malformed_message_says_what_is_wrong(value: object, problem: str) -> None:
    with pytest.raises(MalformedMessage, match=problem):
        decode_message(value)
