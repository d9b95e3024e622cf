"""Group membership and failure detection, sans-IO: SWIM with Lifeguard's local-health extensions.

The protocol is a state machine that takes messages and time and gives messages and view changes; it does no
I/O, reads no clock and imports no event loop (the group provider, ``svcframe.group_provider``, is its asyncio
pump). It is tested with plain values: a list of ``Swim`` objects, a fake clock and a lossy in-memory network.

Sources:

- SWIM: Das, Gupta, Motivala, "SWIM: Scalable Weakly-consistent Infection-style Process Group Membership
  Protocol", DSN 2002. Section 3 (failure detector: one probe per protocol period, a direct ``ping``, then
  ``ping-req`` through k members), section 4.2 (suspicion before removal), 4.3 (round-robin probe order),
  section 5 (updates piggybacked on the protocol's messages, incarnation numbers).
- Lifeguard: Dadgar, Phillips, Currey, "Lifeguard: Local Health Awareness for More Accurate Failure
  Detection", 2018 (HashiCorp memberlist): section 4.1 (a local health multiplier that stretches the probe
  interval and timeout of a member that is itself slow: missed nacks and refutations raise it, answered
  probes lower it), 4.2 (a suspicion timeout that starts long and shrinks with independent confirmations:
  ``max - (max - min) * log(c + 1) / log(k + 1)``), 4.3 (``nack``: a helper that got no answer says so).
  The constants are memberlist's (``DefaultLANConfig``): suspicion multiplier 4, maximum timeout 6 times
  the minimum, awareness up to 8, updates retransmitted ``4 * ceil(log10(n + 1))`` times.
- The ping timeout when none is configured: RFC 6298 section 2, ``SRTT + 4 * RTTVAR`` of the measured round
  trips of direct probes, within ``[ping_timeout_min, protocol_period / 2]``.
- Merging a peer's full state (push-pull, ``Sync``): memberlist's ``mergeState`` (another member's "dead" is
  taken as "suspect", so the member concerned can refute it).

Identity. A member is a ``member_id`` (random, new for each start of a group provider): a process that
comes back at the same address is a new member, never the old one. Two members cannot listen at one address:
a probe answered at a member's address by another member id proves the old one gone (it is declared dead).
Each member's ``incarnation`` orders what is said about it (SWIM section 5): ``alive`` at a higher
incarnation beats anything; ``suspect`` and ``dead`` beat ``alive`` at the same incarnation. Only the member
itself raises its incarnation, to refute a suspicion or a death it hears of (``left`` about itself is obeyed:
it is how an operator removes a member, and the member may join again at a higher incarnation).

The view is ``(version, members)``: the members neither dead nor left, with ``version`` raised by one at each
change of that set on this member, and ``digest`` a hash of the set equal on every member that agrees.

Errors: ``MalformedMessage`` (a ``ValueError``) from ``decode_message`` for anything that is not a message.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALIVE",
    "DEAD",
    "LEFT",
    "SUSPECT",
    "UPDATED",
    "Ack",
    "Change",
    "Gossip",
    "MalformedMessage",
    "MemberInfo",
    "Message",
    "Nack",
    "Ping",
    "PingReq",
    "Reply",
    "RoundTrip",
    "Send",
    "Swim",
    "SwimSettings",
    "Sync",
    "Update",
    "View",
    "decode_message",
    "encode_message",
]

ALIVE, SUSPECT, DEAD, LEFT = "alive", "suspect", "dead", "left"
#: A ``Change`` of a member that stays in the view (its rank, learnt later).
UPDATED = "updated"
_STATUSES = (ALIVE, SUSPECT, DEAD, LEFT)
#: Statuses of a member that is in the view.
_IN_VIEW = (ALIVE, SUSPECT)


class MalformedMessage(ValueError):
    """Bytes decoded to something that is not a membership message (the text says what is wrong)."""


# -- what is said about members --------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemberInfo:
    """What a member is: fixed for its life, gossiped with every ``alive`` about it.

    Attributes:
        member_id: random, new each time a group provider starts (1-64 characters).
        address: the address its engine listens on.
        provider_id: its group provider's id.
        rank: its rank in the job that launched it (None for a member that joined at run time).
        host: the host it runs on; pid: its process id (None when unknown).
        admin_provider_id: its server's admin provider id (what a group file lists as ``provider_id``).
    """

    member_id: str
    address: str
    provider_id: int
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    admin_provider_id: int = 0

    @property
    def endpoint(self) -> tuple[str, int]:
        """Where its group provider answers: ``(address, provider_id)``."""
        return self.address, self.provider_id


@dataclass(frozen=True)
class Update:
    """One piece of gossip: ``member_id`` is ``status`` at ``incarnation``, as ``origin`` (a member id) says.
    ``info`` comes with every ``alive`` (a receiver may not know the member yet) and is None otherwise."""

    status: str
    member_id: str
    incarnation: int
    origin: str
    info: MemberInfo | None = None


# -- messages ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ping:
    """A probe (SWIM's ``ping``); answered by an ``Ack`` from the member probed. ``target_id`` is who the
    prober expects at that address (a different member there proves the expected one gone)."""

    seq: int
    sender: str
    target_id: str | None
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True)
class Ack:
    """The answer to ``Ping`` ``seq``, from ``responder`` (a helper forwards its target's)."""

    seq: int
    sender: str
    responder: str
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True)
class Nack:
    """A helper's answer to ``PingReq`` ``seq`` when its target did not answer in time (Lifeguard 4.3)."""

    seq: int
    sender: str
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True)
class PingReq:
    """Ask a helper to probe ``target`` (SWIM's ``ping-req``); answered by ``Ack`` or ``Nack`` with ``seq``."""

    seq: int
    sender: str
    target: MemberInfo
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True)
class Sync:
    """A member's whole state (push-pull): the join of a new member, the anti-entropy exchange and the
    reconnection that heals a partition. ``wants_reply``: answer with a ``Sync`` of one's own."""

    sender: str
    entries: tuple[Update, ...]
    wants_reply: bool
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True)
class Gossip:
    """Updates alone, sent every ``gossip_interval`` to ``gossip_members`` members while there are any to pass on
    (memberlist's gossip timer): news spreads in a fraction of a protocol period. Not answered."""

    sender: str
    updates: tuple[Update, ...] = ()


Message = Ping | Ack | Nack | PingReq | Sync | Gossip


@dataclass(frozen=True)
class Send:
    """An output: deliver ``message`` to the group provider at ``(address, provider_id)``; the messages it
    returns go to ``Swim.receive`` (as a reply: without ``token``). ``member_id``: who is expected there
    (None: a seed, a member not known yet)."""

    address: str
    provider_id: int
    message: Message
    member_id: str | None = None


@dataclass(frozen=True)
class Reply:
    """An output: the deferred answer to the message received with ``token`` (a helper's ``Ack``/``Nack``)."""

    token: int
    message: Message


@dataclass(frozen=True)
class Change:
    """A change of the view, for logs and watchers: ``member`` joined (``status`` alive) or left the view
    (``status`` dead or left); ``why`` says what decided it."""

    status: str
    member: MemberInfo
    incarnation: int
    why: str


@dataclass(frozen=True)
class View:
    """The group as one member sees it: ``version`` (this member's count of changes), ``members`` (those
    neither dead nor left, rank order then address) and ``digest`` (equal on members that agree)."""

    version: int
    members: tuple[MemberInfo, ...]
    digest: str


def view_digest(members: Iterable[MemberInfo]) -> str:
    """16 hex digits of SHA-256 over the sorted member ids, endpoints and ranks: equal on every member that sees
    the same members."""
    text = "\n".join(sorted(f"{m.member_id} {m.address} {m.provider_id} {m.rank}" for m in members))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def view_order(m: MemberInfo) -> tuple[int, int, str, str]:
    """The order of a view's members: ranked ones by rank, then the others by address (then id)."""
    return (0 if m.rank is not None else 1, m.rank or 0, m.address, m.member_id)


# -- settings ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SwimSettings:
    """The protocol's settings, in seconds (the provider's config gives them in milliseconds).

    Attributes:
        protocol_period: time between two probes (SWIM's T'), before the health multiplier.
        ping_timeout: how long a direct probe waits; None: from the measured round trip (RFC 6298,
            ``SRTT + 4 RTTVAR``) within ``[ping_timeout_min, protocol_period / 2]``, ``initial_ping_timeout``
            until a round trip was measured.
        ping_req_timeout: how long the indirect probes wait; None: twice the ping timeout.
        ping_req_members: helpers asked to probe a member that missed a direct probe (SWIM's k).
        suspicion_timeout: Lifeguard's minimum suspicion time; None: ``suspicion_multiplier *
            max(1, log10(n)) * protocol_period`` for n members (memberlist's ``suspicionTimeout``).
        suspicion_multiplier: memberlist's SuspicionMult (4); also sets the confirmations that shorten a
            suspicion, ``suspicion_multiplier - 2``.
        suspicion_max_multiplier: the longest suspicion as a multiple of the shortest (memberlist: 6).
        awareness_max: the largest local health multiplier (Lifeguard: 8).
        retransmit_multiplier: each update is sent ``retransmit_multiplier * ceil(log10(n + 1))`` times.
        max_piggyback: at most this many updates ride on one message.
        gossip_interval: while there are updates to pass on, send them this often (memberlist: 200 ms)...
        gossip_members: ...to this many random members (memberlist's GossipNodes: 3).
        push_pull_interval: a full-state exchange with a random member this often (0: never).
        reconnect_interval: how often one member declared dead is tried again (partitions heal; 0: never).
        reconnect_timeout: how long a dead member is tried again.
        max_tombstones: dead or left members remembered (to refuse stale news of them, and to reconnect).
    """

    protocol_period: float = 1.0
    ping_timeout: float | None = None
    ping_timeout_min: float = 0.05
    initial_ping_timeout: float = 0.5
    ping_req_timeout: float | None = None
    ping_req_members: int = 3
    suspicion_timeout: float | None = None
    suspicion_multiplier: int = 4
    suspicion_max_multiplier: float = 6.0
    awareness_max: int = 8
    retransmit_multiplier: int = 4
    max_piggyback: int = 16
    gossip_interval: float = 0.2
    gossip_members: int = 3
    push_pull_interval: float = 30.0
    reconnect_interval: float = 2.0
    reconnect_timeout: float = 3600.0
    max_tombstones: int = 1024


class RoundTrip:
    """The smoothed round trip of direct probes and its variation (RFC 6298 section 2), in seconds."""

    def __init__(self) -> None:
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.samples = 0

    def add(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.samples += 1

    def timeout(self) -> float | None:
        """``SRTT + 4 RTTVAR`` (RFC 6298 eq. 2.3), None before the first sample."""
        return None if self.srtt is None else self.srtt + 4 * self.rttvar


# -- the state machine's records ---------------------------------------------------------------------------
@dataclass
class _Suspicion:
    """Lifeguard 4.2: a suspicion timer that shrinks from ``longest`` to ``shortest`` with ``k`` confirmations."""

    start: float
    k: int
    shortest: float
    longest: float
    confirmations: set[str]
    deadline: float

    def confirm(self, origin: str) -> bool:
        """Count ``origin``'s independent confirmation; True when it is new (and so worth passing on)."""
        if origin in self.confirmations or len(self.confirmations) - 1 >= self.k:
            return False
        self.confirmations.add(origin)
        n = len(self.confirmations) - 1  # the first suspecter is not a confirmation
        fraction = math.log(n + 1) / math.log(self.k + 1)
        timeout = max(self.shortest, self.longest - fraction * (self.longest - self.shortest))
        self.deadline = self.start + timeout
        return True


@dataclass
class _Member:
    info: MemberInfo
    incarnation: int
    status: str
    since: float
    suspicion: _Suspicion | None = None
    next_reconnect: float = 0.0


@dataclass
class _Probe:
    seq: int
    target: str
    sent: float
    direct_deadline: float
    end: float  # when the probe gives up (indirect probes included)
    helpers: int = 0
    nacks: int = 0
    indirect: bool = False


@dataclass
class _Relay:
    """A ping made for another member's ``PingReq``: answer ``token`` with ``Ack``/``Nack`` ``seq``."""

    token: int
    seq: int
    target: str
    deadline: float


@dataclass
class _Statistics:
    probes: int = 0
    direct_failures: int = 0
    indirect_probes: int = 0
    suspicions: int = 0
    refutations: int = 0
    deaths: int = 0
    messages_in: int = 0
    messages_out: int = 0
    stale_updates: int = 0


class Swim:
    """One member's side of the protocol (see the module docstring).

    Drive it with the current time (seconds, any monotonic clock): ``receive`` a message (returning the
    immediate replies), ``send_failed`` when a ``Send`` could not be delivered, and ``tick`` at
    ``next_deadline()`` at the latest; take the outputs with ``take_outputs()`` (``Send`` and ``Reply``) and the
    view changes with ``take_changes()``.

    Args:
        me: this member.
        settings: the protocol's settings.
        now: the current time.
        rng: the randomness (probe order, helpers, gossip targets); a seeded ``random.Random`` in tests.
        incarnation: this member's first incarnation.
    """

    def __init__(
        self,
        me: MemberInfo,
        settings: SwimSettings | None = None,
        *,
        now: float,
        rng: random.Random | None = None,
        incarnation: int = 0,
    ) -> None:
        self.settings = settings or SwimSettings()
        self.rng = rng or random.Random()
        self.me = me
        self.members: dict[str, _Member] = {me.member_id: _Member(me, incarnation, ALIVE, now)}
        self.left = False
        self.awareness = 0
        self.round_trip = RoundTrip()
        self.stats = _Statistics()
        self._version = 0
        self._view: View | None = None
        self._seq = 0
        self._outputs: list[Send | Reply] = []
        self._changes: list[Change] = []
        self._broadcasts: dict[str, list[Any]] = {}  # member id -> [Update, times sent]
        self._probe: _Probe | None = None
        self._recent_probes: dict[int, tuple[str, float]] = {}  # seq -> (target, sent): late acks still time it
        self._relays: dict[int, _Relay] = {}
        self._probe_order: list[str] = []
        self._next_probe = now
        self._next_push_pull = now + self.settings.push_pull_interval
        self._next_reconnect = now + self.settings.reconnect_interval
        self._next_gossip = now
        self._seeds: list[tuple[str, int]] = []  # tried again, one each reconnect_interval, until reached
        self._seeds_until = now

    # -- reading ---------------------------------------------------------------------------------------------
    @property
    def member_id(self) -> str:
        return self.me.member_id

    @property
    def incarnation(self) -> int:
        return self.members[self.me.member_id].incarnation

    def view(self) -> View:
        """The current view (see ``View``): empty once this member left the group."""
        if self._view is None:
            members = () if self.left else tuple(
                sorted((m.info for m in self.members.values() if m.status in _IN_VIEW), key=view_order)
            )  # fmt: skip
            self._view = View(self._version, members, view_digest(members))
        return self._view

    def status_of(self, member_id: str) -> str | None:
        m = self.members.get(member_id)
        return None if m is None else m.status

    def ping_timeout(self) -> float:
        """The direct probe's timeout before the health multiplier (configured, or from the round trip)."""
        s = self.settings
        if s.ping_timeout is not None:
            return s.ping_timeout
        measured = self.round_trip.timeout()
        if measured is None:
            return min(s.initial_ping_timeout, s.protocol_period / 2)
        return min(max(measured, s.ping_timeout_min), s.protocol_period / 2)

    def ping_req_timeout(self) -> float:
        s = self.settings
        return s.ping_req_timeout if s.ping_req_timeout is not None else 2 * self.ping_timeout()

    def suspicion_bounds(self) -> tuple[float, float, int]:
        """(shortest, longest suspicion in seconds, confirmations k that bring it to the shortest) for the
        group's current size (Lifeguard 4.2 with memberlist's ``suspicionTimeout``)."""
        s = self.settings
        n = self._alive_count()
        if s.suspicion_timeout is not None:
            shortest = s.suspicion_timeout
        else:
            shortest = s.suspicion_multiplier * max(1.0, math.log10(max(1, n))) * s.protocol_period
        k = s.suspicion_multiplier - 2
        if n - 2 < k:
            k = 0
        return shortest, shortest * s.suspicion_max_multiplier, k

    def detection_bound(self) -> float:
        """An upper bound, in seconds, on the time from a member's failure to its removal from this member's
        view, with every member healthy (health multiplier 1): every live member probes it within ``n - 1``
        periods; a probe takes the ping and ping-req timeouts; then the longest suspicion runs."""
        shortest, longest, k = self.suspicion_bounds()
        n = max(2, self._alive_count())
        return (
            (n - 1) * self.settings.protocol_period
            + self.ping_timeout()
            + self.ping_req_timeout()
            + (longest if k else shortest)
        )

    def statistics(self) -> dict[str, Any]:
        """Counts and the live timeouts (seconds), as JSON."""
        shortest, longest, k = self.suspicion_bounds()
        return {
            "member_id": self.member_id,
            "incarnation": self.incarnation,
            "awareness": self.awareness,
            "round_trip_seconds": self.round_trip.srtt,
            "round_trip_variation_seconds": self.round_trip.rttvar if self.round_trip.samples else None,
            "ping_timeout_seconds": self.ping_timeout() * (self.awareness + 1),
            "ping_req_timeout_seconds": self.ping_req_timeout() * (self.awareness + 1),
            "probe_interval_seconds": self.settings.protocol_period * (self.awareness + 1),
            "suspicion_timeout_seconds": [shortest, longest],
            "suspicion_confirmations": k,
            "detection_bound_seconds": self.detection_bound(),
            "members": {status: sum(m.status == status for m in self.members.values()) for status in _STATUSES},
            **vars(self.stats),
        }

    def next_deadline(self) -> float | None:
        """The earliest time ``tick`` has something to do."""
        if self.left:
            return None
        probe = self._probe  # (while one runs, the next starts once it is over)
        times = [self._next_probe if probe is None else probe.end if probe.indirect else probe.direct_deadline]
        times += [r.deadline for r in self._relays.values()]
        times += [m.suspicion.deadline for m in self.members.values() if m.suspicion is not None]
        if self.settings.push_pull_interval:
            times.append(self._next_push_pull)
        if self.settings.reconnect_interval:
            times.append(self._next_reconnect)
        if self._broadcasts and self.settings.gossip_interval:
            times.append(self._next_gossip)
        return min(times)

    def take_outputs(self) -> list[Send | Reply]:
        out, self._outputs = self._outputs, []
        self.stats.messages_out += len(out)
        return out

    def take_changes(self) -> list[Change]:
        out, self._changes = self._changes, []
        return out

    # -- starting, joining, leaving -----------------------------------------------------------------------------
    def join(self, seeds: Iterable[tuple[str, int]], now: float) -> None:
        """Contact the group providers at ``seeds`` (``(address, provider_id)``; this member's own endpoint is
        skipped) with this member's state; their replies bring theirs."""
        if self.left:
            self._rejoin(now)
        self._seeds = [s for s in dict.fromkeys(seeds) if s != self.me.endpoint]
        self._seeds_until = now + self.settings.reconnect_timeout
        for address, provider_id in self._seeds:
            self._send(address, provider_id, self._sync(wants_reply=True), None)

    def leave(self, now: float) -> None:
        """Leave the group: ``left`` at a new incarnation, told to up to ``ping_req_members`` members (the
        caller delivers these sends before it stops). The view becomes empty; ``join`` comes back."""
        if self.left:
            return
        me = self.members[self.member_id]
        me.incarnation += 1
        update = Update(LEFT, self.member_id, me.incarnation, self.member_id)
        self._queue(update)
        targets = self._random_members(self.settings.ping_req_members, exclude=set())
        for m in targets:
            self._send(m.info.address, m.info.provider_id, Ping(self._next_seq(), self.member_id, m.info.member_id,
                                                                (update, *self._piggyback())), m.info.member_id)  # fmt: skip
        self.left = True
        me.status = LEFT
        self._probe = None
        self._relays.clear()
        self._changes.append(Change(LEFT, self.me, me.incarnation, "it left"))
        self._view_changed()

    def update_me(self, info: MemberInfo, now: float) -> None:
        """Change what this member is (its rank, once the group file says it): a new incarnation tells the others."""
        if info.member_id != self.member_id:
            raise ValueError("a member's id never changes")
        me = self.members[self.member_id]
        self.me = me.info = info
        me.incarnation += 1
        self._queue(Update(ALIVE, self.member_id, me.incarnation, self.member_id, info))
        self._changes.append(Change(UPDATED, info, me.incarnation, "its description changed"))
        self._view_changed()

    def _rejoin(self, now: float) -> None:
        me = self.members[self.member_id]
        self.left = False
        me.status, me.since = ALIVE, now
        me.incarnation += 1
        self._queue(Update(ALIVE, self.member_id, me.incarnation, self.member_id, self.me))
        self._view_changed()

    def remove(self, member_id: str, now: float, why: str = "removed by request") -> bool:
        """Declare another member ``left`` (an operator's decision, or a launcher that saw it exit); True
        when it was in the view."""
        m = self.members.get(member_id)
        if m is None or member_id == self.member_id or m.status not in _IN_VIEW:
            return False
        self._apply(Update(LEFT, member_id, m.incarnation, self.member_id), now, why=why)
        return True

    def find(self, address: str, provider_id: int | None = None) -> MemberInfo | None:
        """The member of the view at ``address`` (and ``provider_id`` when given)."""
        for m in self.members.values():
            if m.status in _IN_VIEW and m.info.address == address and provider_id in (None, m.info.provider_id):
                return m.info
        return None

    # -- inputs ------------------------------------------------------------------------------------------------
    def receive(self, message: Message, now: float, token: int | None = None) -> list[Message]:
        """Take a message; return the immediate replies (to send back to its sender). ``token``: how a deferred
        answer (``Reply``) names this message; None when the message was itself a reply."""
        self.stats.messages_in += 1
        for update in message.updates:
            self._apply(update, now)
        if isinstance(message, Ping):
            if self.left:  # tell the prober, who has not heard yet
                me = self.members[self.member_id]
                return [
                    Nack(message.seq, self.member_id, (Update(LEFT, self.member_id, me.incarnation, self.member_id),))
                ]
            # (a prober that expects another member here learns from the responder's id that it is gone)
            return [Ack(message.seq, self.member_id, self.member_id, self._piggyback())]
        if isinstance(message, Ack):
            self._on_ack(message, now)
            return []
        if isinstance(message, Gossip):
            return []
        if isinstance(message, Nack):
            if self._probe is not None and self._probe.seq == message.seq:
                self._probe.nacks += 1
            return []
        if isinstance(message, PingReq):
            if self.left or token is None:
                return []
            target = message.target
            seq = self._next_seq()
            deadline = now + self.ping_timeout() * (self.awareness + 1)
            self._relays[seq] = _Relay(token, message.seq, target.member_id, deadline)
            self._send(target.address, target.provider_id, Ping(seq, self.member_id, target.member_id,
                                                                self._piggyback()), target.member_id)  # fmt: skip
            return []
        # Sync
        for entry in message.entries:
            self._merge(entry, message.sender, now)
        return [self._sync(wants_reply=False)] if message.wants_reply and not self.left else []

    def send_failed(self, send: Send, now: float) -> None:
        """``send`` could not be delivered (the connection was refused or lost): a direct probe goes on to the
        indirect ones at once (memberlist's ``failedRemote``); a relayed probe answers ``Nack`` now."""
        message = send.message
        if not isinstance(message, Ping):
            return
        probe = self._probe
        if probe is not None and probe.seq == message.seq and not probe.indirect:
            self._start_indirect(probe, now)
        relay = self._relays.pop(message.seq, None)
        if relay is not None:
            self._outputs.append(Reply(relay.token, Nack(relay.seq, self.member_id, self._piggyback())))

    def tick(self, now: float) -> None:
        """Run what is due at ``now``: probes and their timeouts, suspicions, relays, push-pull, reconnection."""
        if self.left:
            return
        for seq, relay in list(self._relays.items()):
            if now >= relay.deadline:
                del self._relays[seq]
                self._outputs.append(Reply(relay.token, Nack(relay.seq, self.member_id, self._piggyback())))
        for m in list(self.members.values()):
            if m.suspicion is not None and now >= m.suspicion.deadline and m.status == SUSPECT:
                confirmations = len(m.suspicion.confirmations) - 1
                self._apply(Update(DEAD, m.info.member_id, m.incarnation, self.member_id), now,
                            why=f"suspected, not refuted within {now - m.suspicion.start:.1f} s "
                            f"({confirmations} confirmation(s))")  # fmt: skip
        probe = self._probe
        if probe is not None:
            if not probe.indirect and now >= probe.direct_deadline:
                self._start_indirect(probe, now)
            elif probe.indirect and now >= probe.end:
                self._probe_failed(probe, now)
        if now >= self._next_probe and self._probe is None:
            self._start_probe(now)
        if self.settings.push_pull_interval and now >= self._next_push_pull:
            self._next_push_pull = now + self.settings.push_pull_interval
            for m in self._random_members(1, exclude=set()):
                self._send(m.info.address, m.info.provider_id, self._sync(wants_reply=True), m.info.member_id)
        if self.settings.reconnect_interval and now >= self._next_reconnect:
            self._next_reconnect = now + self.settings.reconnect_interval
            self._reconnect(now)
        if self._broadcasts and self.settings.gossip_interval and now >= self._next_gossip:
            self._next_gossip = now + self.settings.gossip_interval
            for m in self._random_members(self.settings.gossip_members, exclude=set()):
                updates = self._piggyback()
                if not updates:
                    break
                self._send(m.info.address, m.info.provider_id, Gossip(self.member_id, updates), m.info.member_id)

    # -- probing -------------------------------------------------------------------------------------------------
    def _start_probe(self, now: float) -> None:
        interval = self.settings.protocol_period * (self.awareness + 1)
        self._next_probe = now + interval
        target = self._next_target()
        if target is None:
            return
        seq = self._next_seq()
        updates = self._piggyback()
        if target.status == SUSPECT:  # Lifeguard's buddy system: tell a suspect so that it can refute
            updates = (Update(SUSPECT, target.info.member_id, target.incarnation, self.member_id), *updates)
        timeout = self.ping_timeout() * (self.awareness + 1)
        self._probe = _Probe(seq, target.info.member_id, now, now + timeout, now + timeout)
        self._recent_probes[seq] = (target.info.member_id, now)
        if len(self._recent_probes) > 16:
            del self._recent_probes[next(iter(self._recent_probes))]
        self.stats.probes += 1
        self._send(target.info.address, target.info.provider_id, Ping(seq, self.member_id, target.info.member_id,
                                                                      updates), target.info.member_id)  # fmt: skip

    def _next_target(self) -> _Member | None:
        """Round robin over a shuffled list of the others in the view (SWIM 4.3), reshuffled each pass."""
        while True:
            if not self._probe_order:
                others = [i for i, m in self.members.items() if i != self.member_id and m.status in _IN_VIEW]
                if not others:
                    return None
                self.rng.shuffle(others)
                self._probe_order = others
            candidate = self.members.get(self._probe_order.pop())
            if candidate is not None and candidate.status in _IN_VIEW:
                return candidate

    def _start_indirect(self, probe: _Probe, now: float) -> None:
        probe.indirect = True
        self.stats.direct_failures += 1
        target = self.members.get(probe.target)
        if target is None or target.status not in _IN_VIEW:
            self._probe = None
            return
        helpers = self._random_members(self.settings.ping_req_members, exclude={probe.target}, alive_only=True)
        probe.helpers = len(helpers)
        probe.end = now + self.ping_req_timeout() * (self.awareness + 1)
        for h in helpers:
            self.stats.indirect_probes += 1
            self._send(h.info.address, h.info.provider_id, PingReq(probe.seq, self.member_id, target.info,
                                                                   self._piggyback()), h.info.member_id)  # fmt: skip

    def _probe_failed(self, probe: _Probe, now: float) -> None:
        self._probe = None
        # Lifeguard 4.1/4.3: each helper that did not even nack counts against our own health; with no helper,
        # the failed probe itself does
        self._adjust_awareness(probe.helpers - probe.nacks if probe.helpers else 1)
        target = self.members.get(probe.target)
        if target is None or target.status not in _IN_VIEW:
            return
        self._apply(Update(SUSPECT, probe.target, target.incarnation, self.member_id), now)

    def _on_ack(self, ack: Ack, now: float) -> None:
        relay = self._relays.pop(ack.seq, None)
        if relay is not None:
            if ack.responder == relay.target:
                self._outputs.append(Reply(relay.token, Ack(relay.seq, self.member_id, relay.target,
                                                            self._piggyback())))  # fmt: skip
            else:
                self._superseded(relay.target, ack.responder, now)
                self._outputs.append(Reply(relay.token, Nack(relay.seq, self.member_id, self._piggyback())))
            return
        sent = self._recent_probes.pop(ack.seq, None)
        if sent is not None and ack.sender == ack.responder == sent[0]:
            # the direct answer, even one that came after the direct timeout: the timeout must learn it
            self.round_trip.add(now - sent[1])
        probe = self._probe
        if probe is None or probe.seq != ack.seq:
            return  # late: the probe is over
        self._probe = None
        if ack.responder != probe.target:
            self._superseded(probe.target, ack.responder, now)
            return
        self._adjust_awareness(-1)

    def _superseded(self, old: str, new: str, now: float) -> None:
        """Another member answered at ``old``'s address: ``old`` no longer listens there."""
        m = self.members.get(old)
        if m is not None and m.status in _IN_VIEW and old != new:
            self._apply(Update(DEAD, old, m.incarnation, self.member_id), now,
                        why=f"another member ({new}) answers at its address")  # fmt: skip

    def _adjust_awareness(self, delta: int) -> None:
        self.awareness = min(max(self.awareness + delta, 0), self.settings.awareness_max - 1)

    # -- gossip --------------------------------------------------------------------------------------------------
    def _apply(self, update: Update, now: float, *, why: str | None = None) -> bool:
        """Apply one update (SWIM section 5's order by incarnation); True when it changed our state (it is then
        passed on)."""
        member_id, inc, status = update.member_id, update.incarnation, update.status
        m = self.members.get(member_id)
        if member_id == self.member_id:
            return self._about_me(update, now)
        if m is None:
            if status not in _IN_VIEW or update.info is None or update.info.member_id != member_id:
                return False  # news of a member we never knew, or of its end: nothing to act on
            self._add(update.info, inc, now)
            if status == ALIVE:
                self._queue(update)
                return True
            m = self.members[member_id]
        if status == ALIVE:
            if inc <= m.incarnation:
                self.stats.stale_updates += 1
                return False
            was, old_info = m.status, m.info
            m.incarnation, m.status, m.since, m.suspicion = inc, ALIVE, now, None
            if update.info is not None and update.info.member_id == member_id:
                m.info = update.info
            self._queue(update)
            if was not in _IN_VIEW:
                self._changes.append(Change(ALIVE, m.info, inc, "came back at a higher incarnation"))
                self._check_address(m, now)
                self._view_changed()
            elif m.info != old_info:
                self._changes.append(Change(UPDATED, m.info, inc, "its description changed"))
                self._view_changed()
            return True
        if inc < m.incarnation:
            self.stats.stale_updates += 1
            return False
        if status == SUSPECT:
            if m.status == SUSPECT and m.suspicion is not None and inc == m.incarnation:
                if m.suspicion.confirm(update.origin):
                    self._queue(update)
                return False
            if m.status not in _IN_VIEW:
                return False  # dead or left: only its own alive, at a higher incarnation, brings it back
            shortest, longest, k = self.suspicion_bounds()
            m.incarnation, m.status, m.since = inc, SUSPECT, now
            m.suspicion = _Suspicion(now, k, shortest, longest, {update.origin}, now + (longest if k else shortest))
            self.stats.suspicions += 1
            self._queue(update)
            if update.origin != self.member_id:
                self._probe_order.append(member_id)  # probed next: our own verdict confirms or refutes sooner
            return True
        # dead or left
        if m.status not in _IN_VIEW:
            if status == LEFT and m.status == DEAD:
                m.status = LEFT  # stop trying to reconnect to it
            return False
        m.incarnation, m.status, m.since, m.suspicion = inc, status, now, None
        m.next_reconnect = now + self.settings.reconnect_interval
        self._queue(update)
        if status == DEAD:
            self.stats.deaths += 1
        reason = why or (f"declared {status} by {update.origin}" if update.origin != member_id else "left the group")
        self._changes.append(Change(status, m.info, inc, reason))
        self._view_changed()
        self._trim_tombstones()
        return True

    def _about_me(self, update: Update, now: float) -> bool:
        me = self.members[self.member_id]
        if update.incarnation < me.incarnation or update.status == ALIVE:
            return False
        if update.status == LEFT and update.origin != self.member_id and not self.left:
            # an operator's (or a launcher's) removal: obeyed; join brings this member back
            self.left = True
            me.status, me.incarnation = LEFT, update.incarnation
            self._probe, self._relays = None, {}
            self._changes.append(Change(LEFT, self.me, me.incarnation, f"removed by {update.origin}"))
            self._view_changed()
            return True
        if self.left:
            return False
        # suspect or dead: refute (SWIM 5), and count it against our own health (Lifeguard 4.1)
        me.incarnation = update.incarnation + 1
        self.stats.refutations += 1
        self._adjust_awareness(1)
        self._queue(Update(ALIVE, self.member_id, me.incarnation, self.member_id, self.me))
        return True

    def _merge(self, entry: Update, sender: str, now: float) -> None:
        """A ``Sync`` entry: alive and left as they are; suspect and dead as a suspicion by the sender
        (memberlist's mergeState), so that the member concerned can refute what the other side decided. The
        end of a member this one never knew is nothing to act on."""
        if entry.status in (DEAD, LEFT) and entry.member_id not in self.members:
            return
        if entry.status in (ALIVE, LEFT):
            self._apply(entry, now)
        else:
            self._apply(Update(SUSPECT, entry.member_id, entry.incarnation, sender), now)

    def _add(self, info: MemberInfo, incarnation: int, now: float) -> None:
        m = _Member(info, incarnation, ALIVE, now)
        self.members[info.member_id] = m
        self._probe_order.insert(0, info.member_id)  # probed at its turn in the current pass
        self._changes.append(Change(ALIVE, info, incarnation, "joined"))
        self._check_address(m, now)
        self._view_changed()

    def _check_address(self, new: _Member, now: float) -> None:
        """Two members at one endpoint: the one known before is suspected (a probe at that address tells)."""
        for other in list(self.members.values()):
            if other is not new and other.status == ALIVE and other.info.endpoint == new.info.endpoint:
                if other.info.member_id == self.member_id:
                    continue
                self._apply(Update(SUSPECT, other.info.member_id, other.incarnation, self.member_id), now)
                self._probe_order.append(other.info.member_id)  # probed next

    def _queue(self, update: Update) -> None:
        self._broadcasts[update.member_id] = [update, 0]

    def _piggyback(self) -> tuple[Update, ...]:
        """Up to ``max_piggyback`` updates, the least sent first; each is dropped after its
        ``retransmit_multiplier * ceil(log10(n + 1))`` sends (memberlist's ``retransmitLimit``)."""
        if not self._broadcasts:
            return ()
        limit = self.settings.retransmit_multiplier * max(1, math.ceil(math.log10(self._alive_count() + 1)))
        chosen = sorted(self._broadcasts.values(), key=lambda entry: entry[1])[: self.settings.max_piggyback]
        for entry in chosen:
            entry[1] += 1
            if entry[1] >= limit:
                del self._broadcasts[entry[0].member_id]
        return tuple(entry[0] for entry in chosen)

    def _sync(self, wants_reply: bool) -> Sync:
        entries = tuple(Update(m.status, i, m.incarnation, self.member_id, m.info) for i, m in self.members.items())
        return Sync(self.member_id, entries, wants_reply, self._piggyback())

    def _reconnect(self, now: float) -> None:
        """Try one member declared dead again (its address not taken by a member of the view): if a partition
        healed, the exchange of states brings both sides back together. Also try the next seed this member
        joined through and has not met (a join that was not answered)."""
        taken = {m.info.endpoint for m in self.members.values() if m.status in _IN_VIEW}
        self._seeds = [s for s in self._seeds if s not in taken] if now < self._seeds_until else []
        if self._seeds:
            address, provider_id = self._seeds[0]
            self._seeds.append(self._seeds.pop(0))
            self._send(address, provider_id, self._sync(wants_reply=True), None)
        horizon = now - self.settings.reconnect_timeout
        candidates = [
            m for m in self.members.values()
            if m.status == DEAD and m.since >= horizon and m.info.endpoint not in taken and now >= m.next_reconnect
        ]  # fmt: skip
        if not candidates:
            return
        m = self.rng.choice(candidates)
        m.next_reconnect = now + self.settings.reconnect_interval * max(1, len(candidates))
        self._send(m.info.address, m.info.provider_id, self._sync(wants_reply=True), m.info.member_id)

    def _trim_tombstones(self) -> None:
        gone = [m for m in self.members.values() if m.status not in _IN_VIEW and m.info.member_id != self.member_id]
        excess = len(gone) - self.settings.max_tombstones
        if excess > 0:
            for m in sorted(gone, key=lambda m: m.since)[:excess]:
                del self.members[m.info.member_id]

    # -- helpers -----------------------------------------------------------------------------------------------
    def _alive_count(self) -> int:
        return sum(m.status in _IN_VIEW for m in self.members.values())

    def _random_members(self, count: int, *, exclude: set[str], alive_only: bool = False) -> list[_Member]:
        wanted = (ALIVE,) if alive_only else _IN_VIEW
        pool = [
            m for i, m in self.members.items() if i != self.member_id and i not in exclude and m.status in wanted
        ]  # fmt: skip
        return self.rng.sample(pool, min(count, len(pool)))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, address: str, provider_id: int, message: Message, member_id: str | None) -> None:
        self._outputs.append(Send(address, provider_id, message, member_id))

    def _view_changed(self) -> None:
        self._version += 1
        self._view = None


# -- the wire form -------------------------------------------------------------------------------------------------
#: Bounds on what a message may hold (beyond them it is malformed, whatever the frame's size allows).
MAX_ID_CHARS = 64
MAX_ADDRESS_CHARS = 512
MAX_HOST_CHARS = 255
MAX_UPDATES = 256
MAX_ENTRIES = 65536
_MAX_U64 = (1 << 64) - 1
_KINDS = {"ping": Ping, "ack": Ack, "nack": Nack, "ping_req": PingReq, "sync": Sync, "gossip": Gossip}
_STATUS_CODES = {status: i for i, status in enumerate(_STATUSES)}


def _info_to_wire(info: MemberInfo) -> list[Any]:
    return [info.member_id, info.address, info.provider_id, info.rank, info.host, info.pid, info.admin_provider_id]


def _update_to_wire(u: Update) -> list[Any]:
    return [
        _STATUS_CODES[u.status],
        u.member_id,
        u.incarnation,
        u.origin,
        None if u.info is None else _info_to_wire(u.info),
    ]


def encode_message(message: Message) -> dict[str, Any]:
    """A message as a msgpack-ready map (``decode_message`` is its inverse)."""
    out: dict[str, Any] = {"k": next(k for k, cls in _KINDS.items() if isinstance(message, cls)), "s": message.sender}
    if message.updates:
        out["u"] = [_update_to_wire(u) for u in message.updates]
    if isinstance(message, Ping):
        out["q"], out["t"] = message.seq, message.target_id
    elif isinstance(message, Ack):
        out["q"], out["r"] = message.seq, message.responder
    elif isinstance(message, Nack):
        out["q"] = message.seq
    elif isinstance(message, PingReq):
        out["q"], out["t"] = message.seq, _info_to_wire(message.target)
    elif isinstance(message, Sync):
        out["e"], out["w"] = [_update_to_wire(e) for e in message.entries], message.wants_reply
    return out


def _text(value: Any, what: str, limit: int, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise MalformedMessage(f"{what}: expected a string of 1-{limit} characters")
    return value


def _int(value: Any, what: str, high: int, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if type(value) is not int or not 0 <= value <= high:
        raise MalformedMessage(f"{what}: expected an integer in 0..{high}")
    return value


def _info_from_wire(value: Any, what: str) -> MemberInfo:
    if not isinstance(value, list) or len(value) != 7:
        raise MalformedMessage(f"{what}: expected a member (a list of 7 items)")
    member_id, address, provider_id, rank, host, pid, admin = value
    return MemberInfo(
        _text(member_id, f"{what}.member_id", MAX_ID_CHARS),
        _text(address, f"{what}.address", MAX_ADDRESS_CHARS),
        _int(provider_id, f"{what}.provider_id", 65535),
        _int(rank, f"{what}.rank", 2**31 - 1, optional=True),
        _text(host, f"{what}.host", MAX_HOST_CHARS, optional=True),
        _int(pid, f"{what}.pid", 2**31 - 1, optional=True),
        _int(admin, f"{what}.admin_provider_id", 65535),
    )


def _update_from_wire(value: Any, what: str) -> Update:
    if not isinstance(value, list) or len(value) != 5:
        raise MalformedMessage(f"{what}: expected an update (a list of 5 items)")
    code, member_id, incarnation, origin, info = value
    if type(code) is not int or not 0 <= code < len(_STATUSES):
        raise MalformedMessage(f"{what}.status: expected 0..{len(_STATUSES) - 1}")
    status = _STATUSES[code]
    member_id = _text(member_id, f"{what}.member_id", MAX_ID_CHARS)
    parsed = None if info is None else _info_from_wire(info, f"{what}.info")
    if status == ALIVE and (parsed is None or parsed.member_id != member_id):
        raise MalformedMessage(f"{what}: an alive update carries the member it is about")
    return Update(status, member_id, _int(incarnation, f"{what}.incarnation", _MAX_U64),
                  _text(origin, f"{what}.origin", MAX_ID_CHARS), parsed)  # fmt: skip


def _updates_from_wire(value: Any, what: str, limit: int) -> tuple[Update, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > limit:
        raise MalformedMessage(f"{what}: expected a list of at most {limit} updates")
    return tuple(_update_from_wire(u, f"{what}[{i}]") for i, u in enumerate(value))


def decode_message(value: Any) -> Message:
    """A message from its decoded wire form (``encode_message``'s output), checked item by item.

    Raises:
        MalformedMessage: anything else (a wrong type, a missing or extra key, a value out of bounds).
    """
    if not isinstance(value, dict):
        raise MalformedMessage("expected a map")
    kind = value.get("k")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MalformedMessage(f"k: expected one of {', '.join(_KINDS)}")
    allowed = {"k", "s", "u", *{Ping: "qt", Ack: "qr", Nack: "q", PingReq: "qt", Sync: "ew", Gossip: ""}[cls]}
    extra = set(value) - allowed
    if extra:
        raise MalformedMessage(f"unexpected key(s) for {kind}: {', '.join(sorted(map(str, extra)))}")
    sender = _text(value.get("s"), "s (sender)", MAX_ID_CHARS)
    updates = _updates_from_wire(value.get("u"), "u", MAX_UPDATES)
    if cls is Gossip:
        return Gossip(sender, updates)
    if cls is Sync:
        entries = _updates_from_wire(value.get("e"), "e", MAX_ENTRIES)
        wants_reply = value.get("w")
        if not isinstance(wants_reply, bool):
            raise MalformedMessage("w: expected a boolean")
        return Sync(sender, entries, wants_reply, updates)
    seq = _int(value.get("q"), "q (seq)", _MAX_U64)
    if cls is Ping:
        return Ping(seq, sender, _text(value.get("t"), "t (target id)", MAX_ID_CHARS, optional=True), updates)
    if cls is Ack:
        return Ack(seq, sender, _text(value.get("r"), "r (responder)", MAX_ID_CHARS), updates)
    if cls is Nack:
        return Nack(seq, sender, updates)
    return PingReq(seq, sender, _info_from_wire(value.get("t"), "t (target)"), updates)
