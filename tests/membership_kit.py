"""A simulated network for ``svcframe.membership.Swim`` state machines: a fake clock, messages delivered after a
latency (with jitter), lost with a probability, held by a partition, refused by a killed member and ignored by a
stopped one. Everything is deterministic for a given seed: a failure replays.

Delivery follows the group provider's: a ``Send`` is a call whose answers go back to the sender's ``receive``;
a ``Reply`` answers the call that carried the message it was deferred for; a refused call is ``send_failed``.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from svcframe.membership import MemberInfo, Message, Reply, Send, Swim, SwimSettings


@dataclass
class Link:
    latency: float = 0.001  # one way, seconds
    jitter: float = 0.0  # uniform extra delay, seconds
    loss: float = 0.0  # probability that one message is lost


@dataclass
class Network:
    seed: int = 0
    settings: SwimSettings = field(default_factory=SwimSettings)
    default_link: Link = field(default_factory=Link)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.now = 0.0
        self.nodes: dict[str, Swim] = {}
        self.killed: set[str] = set()  # refuse connections: the sender learns at once
        self.stopped: set[str] = set()  # accept, never answer (SIGSTOP)
        self.partition: list[set[str]] | None = None  # messages between different sets are lost
        self.links: dict[tuple[str, str], Link] = {}
        self.slow: dict[str, float] = {}  # address -> extra delay before it handles anything (a slow process)
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._count = 0
        self._pending: dict[tuple[str, int], Callable[[Message], None]] = {}
        self.delivered = 0

    # -- building ------------------------------------------------------------------------------------------------
    def add(self, name: str, *, rank: int | None = None, seeds: list[str] | None = None) -> Swim:
        address = f"tcp://{name}:1"
        info = MemberInfo(f"id-{name}-{len(self.nodes)}", address, 7, rank=rank, host=name)
        swim = Swim(info, self.settings, now=self.now, rng=random.Random(self.rng.random()))
        self.nodes[address] = swim
        swim.join([(s, 7) for s in (seeds if seeds is not None else list(self.nodes))], self.now)
        self._pump(address)
        return swim

    def group(self, n: int) -> list[Swim]:
        names = [f"n{i}" for i in range(n)]
        for i, name in enumerate(names):
            self.add(name, rank=i, seeds=[f"tcp://{x}:1" for x in names[:i]])
        return list(self.nodes.values())

    def link(self, a: str, b: str) -> Link:
        return self.links.get((a, b), self.default_link)

    def address(self, name: str) -> str:
        return f"tcp://{name}:1"

    # -- running ---------------------------------------------------------------------------------------------------
    def _at(self, when: float, fn: Callable[[], None]) -> None:
        self._count += 1
        heapq.heappush(self._events, (when, self._count, fn))

    def _cut(self, a: str, b: str) -> bool:
        if self.partition is None:
            return False
        side = next((s for s in self.partition if a in s), None)
        return side is None or b not in side

    def _delay(self, a: str, b: str) -> float | None:
        """The delay of one message from a to b, None when it is lost."""
        link = self.link(a, b)
        if self._cut(a, b) or self.rng.random() < link.loss:
            return None
        return link.latency + self.rng.random() * link.jitter + self.slow.get(b, 0.0)

    def _live(self, address: str) -> bool:
        return address not in self.killed and address not in self.stopped

    def _pump(self, address: str) -> None:
        swim = self.nodes[address]
        for out in swim.take_outputs():
            if isinstance(out, Reply):
                answer = self._pending.pop((address, out.token), None)
                if answer is not None:
                    answer(out.message)
            else:
                self._send(address, out)

    def _send(self, src: str, send: Send) -> None:
        dst = send.address
        if dst in self.killed or dst not in self.nodes:
            self._at(self.now + self.link(src, dst).latency, lambda: self._failed(src, send))
            return
        delay = self._delay(src, dst)
        if delay is not None:
            self._at(self.now + delay, lambda: self._arrive(src, send))

    def _failed(self, src: str, send: Send) -> None:
        if self._live(src):
            self.nodes[src].send_failed(send, self.now)
            self._pump(src)

    def _arrive(self, src: str, send: Send) -> None:
        dst = send.address
        if not self._live(dst):
            if dst in self.killed:
                self._failed(src, send)
            return
        self.delivered += 1
        self._count += 1
        token = self._count

        def answer(message: Message) -> None:
            delay = self._delay(dst, src)
            if delay is not None:
                self._at(self.now + delay, lambda: self._answered(src, message))

        self._pending[(dst, token)] = answer
        answers = self.nodes[dst].receive(send.message, self.now, token)
        if answers:
            self._pending.pop((dst, token), None)
            for a in answers:
                answer(a)
        self._pump(dst)

    def _answered(self, src: str, message: Message) -> None:
        if self._live(src):
            self.nodes[src].receive(message, self.now)
            self._pump(src)

    def run(self, seconds: float, *, until: Callable[[], bool] | None = None, step: float = 0.05) -> bool:
        """Advance the clock by ``seconds`` (or until ``until()``, checked every ``step``); True if ``until``
        held."""
        end = self.now + seconds
        next_check = self.now
        while True:
            if until is not None and self.now >= next_check:
                if until():
                    return True
                next_check = self.now + step
            for address, swim in self.nodes.items():
                if self._live(address):
                    deadline = swim.next_deadline()
                    if deadline is not None and deadline <= self.now:
                        swim.tick(self.now)
                        self._pump(address)
            times = [d for a, s in self.nodes.items() if self._live(a) and (d := s.next_deadline()) is not None]
            if self._events:
                times.append(self._events[0][0])
            if until is not None:
                times.append(next_check)
            when = min(times, default=end)
            if when > end:
                self.now = end
                return until() if until is not None else False
            self.now = max(self.now, when)
            while self._events and self._events[0][0] <= self.now:
                heapq.heappop(self._events)[2]()

    # -- reading ---------------------------------------------------------------------------------------------------
    def views(self, *, live_only: bool = True) -> dict[str, tuple[str, ...]]:
        """Member ids in each node's view, by address."""
        return {
            a: tuple(sorted(m.member_id for m in s.view().members))
            for a, s in self.nodes.items()
            if not live_only or self._live(a)
        }

    def single_view(self, expected: int | None = None) -> bool:
        views = set(self.views().values())
        return len(views) == 1 and (expected is None or len(next(iter(views))) == expected)

    def total(self, counter: str) -> int:
        return sum(getattr(s.stats, counter) for a, s in self.nodes.items() if self._live(a))

    def member_id(self, name: str) -> str:
        return self.nodes[self.address(name)].member_id


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


__all__ = ["Link", "Network", "percentile"]
