"""A group that knows who is alive, under faults between nodes: the membership benchmark.

Four servers, two on each node of tools/netns_nodes.sh's bed (a bed of its own: svcg-node1/2 on 10.201.0.0/24,
beside the default one), each hosting a group provider (svcframe.group_provider, default settings unless
--protocol-period-ms...) and a durable kv store; a client on the host side writes to the members of the group's
view through a GroupHandle, and watches every member's view. Per fault it prints:

- detect p50 / p99: from the fault to the moment every surviving member it can reach has removed the failed one
  (kill -9, SIGSTOP; a partition: the reachable side removed the other);
- false removals: members removed from a view without having failed;
- in flight: the writes to a failed member that the fault caught (sent before the group removed it, not answered
  before the fault), by status, and whether each was applied (read back at the end): "dropped" must never be an
  applied write;
- acked lost: acknowledged writes missing when read back (goal: 0);
- single view after heal: from the link's return to every member showing the same four members.

Faults: a member killed (kill -9, then started again at its address: a new member) and stopped (SIGSTOP, then
SIGCONT), each on a quiet network and under packet loss 1% and 5% and delay 1 ms and 50 ms (with jitter, on both
nodes' links); a partition (node 2's link down, then up); and the soak: --soak-seconds at 5% loss with no
failure, where every removal is a false one (goal: 0).

    sudo .venv/bin/python tools/group_faults.py                          # the whole run (about 25 minutes)
    sudo .venv/bin/python tools/group_faults.py --trials 2 --soak-seconds 30 --faults kill,loss5,partition
    ... -o faults.json                                                    # every sample too

Needs root, iproute2, and tc netem or (a kernel without sch_netem) nftables and iptables (tools/netfaults.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

from netfaults import NodeFaults, mechanism, netem_available, tools_missing  # noqa: E402

from svcframe import Engine, SvcframeError  # noqa: E402
from svcframe.cli.common import print_lines, print_table  # noqa: E402
from svcframe.errors import ConnectionLost, DeadlineExceeded, Dropped, Refused  # noqa: E402
from svcframe.group_provider import GroupHandle  # noqa: E402
from svcframe.loops import run  # noqa: E402
from svcframe.testing import ServerProcess  # noqa: E402

BED = {
    "SVCF_BRIDGE": "svcg-br", "SVCF_BRIDGE_ADDRESS": "10.201.0.1", "SVCF_NODES": "svcg-node1 svcg-node2",
    "SVCF_NODE_ADDRESSES": "10.201.0.11 10.201.0.12", "SVCF_VETH": "svcg-veth", "SVCF_NODES_DIR": "/run/svcg-nodes",
}  # fmt: skip
NODES = {"svcg-node1": "10.201.0.11", "svcg-node2": "10.201.0.12"}
GROUP_ID, KV_ID = 10, 1
PORTS = (7101, 7102)
FAULTS = ("kill", "stop", "loss1", "loss5", "delay1", "delay50", "partition")
CONDITIONS = {  # name -> (what, apply on a node)
    "quiet": ("no fault on the links", None),
    "loss1": ("1% packet loss", ("loss", 1.0)),
    "loss5": ("5% packet loss", ("loss", 5.0)),
    "delay1": ("1 ms +- 0.5 ms delay", ("delay", 1.0, 0.5)),
    "delay50": ("50 ms +- 10 ms delay", ("delay", 50.0, 10.0)),
}


def bed(command: str) -> None:
    subprocess.run(["bash", str(ROOT / "tools" / "netns_nodes.sh"), command], check=True, env={**os.environ, **BED},
                   capture_output=True, timeout=60)  # fmt: skip


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


# -- the servers ---------------------------------------------------------------------------------------------------
@dataclass
class Member:
    name: str
    node: str
    port: int
    workdir: Path
    swim: dict[str, Any]
    env: dict[str, str]
    process: ServerProcess | None = None

    @property
    def address(self) -> str:
        return f"tcp://{NODES[self.node]}:{self.port}"

    def config(self, bootstrap: str) -> dict[str, Any]:
        return {
            "engine": {"address": self.address, "default_timeout_seconds": 10.0},
            "libraries": ["providers.kv"],
            "providers": [
                {"name": "store", "type": "kv", "provider_id": KV_ID,
                 "config": {"path": str(self.workdir / f"kv-{self.name}.sqlite"), "durability": "durable"}},
                {"name": "group", "type": "group", "provider_id": GROUP_ID,
                 "config": {"bootstrap": bootstrap, "file": str(self.workdir / "group.json"),
                            "group": {"type": "swim", "config": self.swim}}},
            ],
        }  # fmt: skip

    def start(self, bootstrap: str = "join") -> None:
        prefix = ["bash", str(ROOT / "tools" / "netns_nodes.sh"), "run", self.node]
        self.process = ServerProcess.start(self.config(bootstrap), self.workdir, name=self.name, prefix=prefix,
                                           env={**self.env, **BED}, timeout_seconds=60)  # fmt: skip

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


# -- the client's writes ---------------------------------------------------------------------------------------
@dataclass
class Call:
    member: str
    key: str
    start: float
    end: float = 0.0
    status: str = ""


@dataclass
class Workload:
    """Writers that put a new key each time, to the members of the group's view, round robin."""

    engine: Engine
    handle: GroupHandle
    writers: int = 4
    interval_seconds: float = 0.1
    calls: list[Call] = field(default_factory=list)

    async def writer(self, index: int, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        seq = 0
        while not stop.is_set():
            members = self.handle.members
            if members:
                member = members[(seq + index) % len(members)]["address"]
                call = Call(member, f"bench-{index}-{seq}", loop.time())
                self.calls.append(call)
                try:
                    await self.engine.call(member, "put", {"key": call.key, "value": b"v" * 64}, provider_id=KV_ID,
                                           timeout_seconds=2.0)  # fmt: skip
                    call.status = "ok"
                except Dropped:
                    call.status = "dropped"
                except DeadlineExceeded:
                    call.status = "deadline (unknown)"
                    self.engine.disconnect(member, "a write timed out")
                except ConnectionLost:
                    call.status = "connection lost (unknown)"
                except Refused as exc:
                    call.status = f"refused ({type(exc).__name__})"
                except SvcframeError as exc:
                    call.status = type(exc).__name__
                call.end = loop.time()
                seq += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_seconds)


# -- views --------------------------------------------------------------------------------------------------------
class Observer:
    """Every member's view, followed by a watch on each (from the host side), and every removal seen."""

    def __init__(self, engine: Engine, members: list[Member]) -> None:
        self.engine = engine
        self.members = members
        self.views: dict[str, dict[str, Any]] = {}
        self.removals: list[tuple[float, str, str]] = []  # (time, observer address, removed address)
        self.changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.get_running_loop().create_task(self._follow(m)) for m in self.members]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _follow(self, member: Member) -> None:
        loop = asyncio.get_running_loop()
        version = None
        while True:
            try:
                view = await self.engine.call(member.address, "watch", {"version": version, "timeout_seconds": 5.0},
                                              provider_id=GROUP_ID, timeout_seconds=8.0)  # fmt: skip
            except SvcframeError as exc:
                if isinstance(exc, DeadlineExceeded):  # a connection TCP backs off on: dial afresh next time
                    self.engine.disconnect(member.address, "a watch timed out")
                version = None
                await asyncio.sleep(0.2)  # unreachable (stopped, killed, behind a partition): ask again soon
                continue
            old = self.views.get(member.address)
            if old is not None and old.get("member_id") == view.get("member_id"):
                before = {m["address"]: m["member_id"] for m in old["members"]}
                after = {m["address"]: m["member_id"] for m in view["members"]}
                for address, member_id in before.items():
                    if after.get(address) != member_id:
                        self.removals.append((loop.time(), member.address, address))
            self.views[member.address] = view
            version = view["version"]
            self.changed.set()
            self.changed = asyncio.Event()

    def sees(self, observer: str, address: str) -> bool:
        view = self.views.get(observer)
        return view is not None and address in {m["address"] for m in view["members"]}

    def single_view(self, n: int) -> bool:
        views = [self.views.get(m.address) for m in self.members]
        return (
            all(v is not None and len(v["members"]) == n for v in views) and len({v["digest"] for v in views if v}) == 1
        )

    async def until(self, predicate: Any, within_seconds: float) -> float | None:
        """Seconds until ``predicate()`` holds (woken by each view change), None at the timeout."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        while not predicate():
            left = start + within_seconds - loop.time()
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))
        return loop.time() - start


@dataclass
class Result:
    fault: str
    condition: str
    detect: list[float] = field(default_factory=list)
    heal: list[float] = field(default_factory=list)
    false_removals: int = 0
    undetected: int = 0
    inflight: Counter[str] = field(default_factory=Counter)
    acked_lost: int = 0
    dropped_applied: int = 0
    notes: list[str] = field(default_factory=list)


# -- the run ---------------------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(tempfile.mkdtemp(prefix="svcf-group-faults-"))
        self.netem = netem_available() if not args.no_netem else False
        self.faults = {node: NodeFaults(node, netem=self.netem, queue=7 + i) for i, node in enumerate(NODES)}
        secret = secrets.token_hex(16)
        self.env = {**os.environ, "SVCFRAME_SECRET": secret, "PYTHONPATH": str(ROOT)}
        os.environ["SVCFRAME_SECRET"] = secret
        swim = {k: v for k, v in {"protocol_period_ms": args.protocol_period_ms,
                                  "suspicion_timeout_ms": args.suspicion_timeout_ms}.items() if v is not None}  # fmt: skip
        nodes = list(NODES)
        self.members = [Member(f"m{i}", nodes[i // 2], PORTS[i % 2], self.workdir, swim, self.env) for i in range(4)]
        self.results: list[Result] = []
        self.inflight_calls: list[tuple[Call, str]] = []  # (call, result key) in flight at a fault

    def start_members(self) -> None:
        self.members[0].start("self")
        for m in self.members[1:]:
            m.start("join")

    def stop_members(self) -> None:
        for m in self.members:
            if m.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(m.process.pid, signal.SIGCONT)
                m.process.stop(grace_seconds=10)

    def condition(self, name: str) -> None:
        spec = CONDITIONS[name][1]
        for faults in self.faults.values():
            if spec is None:
                faults.clear()
            elif spec[0] == "loss":
                faults.loss(spec[1])
            else:
                faults.delay(spec[1], spec[2])

    def clear(self) -> None:
        for faults in self.faults.values():
            faults.clear()
            with contextlib.suppress(RuntimeError):
                faults.link(True)

    async def trial(self, result: Result, observer: Observer, workload: Workload, kind: str, victim: Member) -> None:
        loop = asyncio.get_running_loop()
        survivors = [m for m in self.members if m is not victim]
        mark = len(observer.removals)
        t0 = loop.time()
        if kind == "kill":
            assert victim.process is not None
            victim.process.kill()
        else:
            os.kill(victim.pid, signal.SIGSTOP)
        gone = await observer.until(lambda: all(not observer.sees(s.address, victim.address) for s in survivors),
                                    self.args.detect_timeout)  # fmt: skip
        if gone is None:
            result.undetected += 1
        else:
            result.detect.append(gone)
        seen = t0 + (gone if gone is not None else self.args.detect_timeout)
        await asyncio.sleep(2.5)  # the writes sent to it meanwhile end within their 2 s deadline
        self.inflight_calls += [(c, f"{result.fault}/{result.condition}") for c in workload.calls
                                if c.member == victim.address and c.start <= seen and (c.end == 0 or c.end > t0)]  # fmt: skip
        if kind == "kill":
            await asyncio.to_thread(victim.start, "join")
        else:
            os.kill(victim.pid, signal.SIGCONT)
        back = await observer.until(lambda: observer.single_view(4), self.args.detect_timeout * 2)
        if back is None:
            result.notes.append(f"{victim.name} not back in every view within {self.args.detect_timeout * 2:g} s")
        result.false_removals += sum(1 for _, _, r in observer.removals[mark:] if r != victim.address)

    async def partition(self, result: Result, observer: Observer, workload: Workload) -> None:
        loop = asyncio.get_running_loop()
        far = [m for m in self.members if m.node == "svcg-node2"]
        near = [m for m in self.members if m.node == "svcg-node1"]
        mark = len(observer.removals)
        t0 = loop.time()
        self.faults["svcg-node2"].link(False)
        gone = await observer.until(lambda: all(not observer.sees(n.address, f.address) for n in near for f in far),
                                    self.args.detect_timeout)  # fmt: skip
        result.detect.append(gone) if gone is not None else result.notes.append("the partition was not detected")
        await asyncio.sleep(self.args.partition_hold)
        seen = t0 + (gone if gone is not None else self.args.detect_timeout)
        self.inflight_calls += [(c, "partition") for c in workload.calls
                                if c.member in {f.address for f in far} and c.start <= seen and (c.end == 0 or c.end > t0)]  # fmt: skip
        for f in far:  # the far side's views, as they were (the watches fail while the link is down)
            observer.views.pop(f.address, None)
        self.faults["svcg-node2"].link(True)
        healed = await observer.until(lambda: observer.single_view(4), self.args.heal_timeout)
        result.heal.append(healed) if healed is not None else result.notes.append("no single view after the heal")
        await observer.until(lambda: observer.single_view(4), self.args.heal_timeout)
        expected = {(n.address, f.address) for n in near for f in far}
        result.false_removals += sum(1 for _, o, r in observer.removals[mark:] if (o, r) not in expected
                                     and not (o in {f.address for f in far} and r in {n.address for n in near}))  # fmt: skip

    async def soak(self, result: Result, observer: Observer, seconds: float) -> None:
        mark = len(observer.removals)
        before = await self.counters()
        await asyncio.sleep(seconds)
        after = await self.counters()
        result.false_removals = len(observer.removals) - mark
        result.notes.append(
            f"{seconds:g} s: {after['suspicions'] - before['suspicions']} suspicions, "
            f"{after['refutations'] - before['refutations']} refutations, "
            f"{after['deaths'] - before['deaths']} deaths declared"
        )

    async def counters(self) -> Counter[str]:
        total: Counter[str] = Counter()
        async with Engine(None) as engine:
            for m in self.members:
                with contextlib.suppress(SvcframeError):
                    stats = await engine.call(m.address, "stats", None, provider_id=GROUP_ID, timeout_seconds=5.0)
                    total.update({k: stats[k] for k in ("suspicions", "refutations", "deaths")})
        return total

    @staticmethod
    def verify(workload: Workload, stored: dict[str, set[str]]) -> dict[str, Any]:
        """Every write against what the members hold: acknowledged ones missing, "dropped" ones applied, and what
        the unknown outcomes turned out to be."""
        calls = workload.calls
        outcomes: Counter[str] = Counter()
        for c in calls:
            if c.status != "ok":
                outcomes[
                    f"{c.status or 'unfinished'}: {'applied' if c.key in stored.get(c.member, set()) else 'not applied'}"
                ] += 1
        return {
            "calls": len(calls), "ok": sum(c.status == "ok" for c in calls),
            "acked_lost": sum(c.status == "ok" and c.key not in stored.get(c.member, set()) for c in calls),
            "dropped_applied": sum(c.status == "dropped" and c.key in stored.get(c.member, set()) for c in calls),
            "outcomes": dict(outcomes),
        }  # fmt: skip

    async def main(self) -> None:
        args = self.args
        async with Engine(None) as engine:
            handle = GroupHandle(engine, [(m.address, GROUP_ID) for m in self.members], timeout_seconds=2.0)
            observer = Observer(engine, self.members)
            observer.start()
            if await observer.until(lambda: observer.single_view(4), 60) is None:
                raise SystemExit(f"the group did not form: {observer.views}")
            await handle.start()
            workload = Workload(engine, handle)
            stop = asyncio.Event()
            writers = [
                asyncio.get_running_loop().create_task(workload.writer(i, stop)) for i in range(workload.writers)
            ]
            try:
                for fault in args.faults:
                    if fault == "partition":
                        result = Result("partition (node 2's link down, then up)", "quiet")
                        for _ in range(args.partition_trials):
                            await self.partition(result, observer, workload)
                        self.results.append(result)
                        self.progress(result)
                        continue
                    # kill -9 and SIGSTOP on a quiet network; under a network fault, kill -9 (half the trials)
                    kind, condition = (fault, "quiet") if fault in ("kill", "stop") else ("kill", fault)
                    self.condition(condition)
                    await asyncio.sleep(1.0)  # the round trips learn the new link
                    result = Result(
                        f"member {'killed (kill -9)' if kind == 'kill' else 'stopped (SIGSTOP)'}", condition
                    )
                    trials = args.trials if condition == "quiet" else max(1, args.trials // 2)
                    for i in range(trials):
                        await self.trial(result, observer, workload, kind, self.members[(i * 3 + 1) % 4])
                    self.condition("quiet")
                    self.results.append(result)
                    self.progress(result)
                if args.soak_seconds:
                    self.condition("loss5")
                    result = Result("soak, no failure (every removal is false)", "loss5")
                    await self.soak(result, observer, args.soak_seconds)
                    self.condition("quiet")
                    self.results.append(result)
                    self.progress(result)
            finally:
                stop.set()
                await asyncio.gather(*writers)
                self.clear()
                await handle.close()
                await observer.until(lambda: observer.single_view(4), 30)
                await observer.stop()
                # the live timeouts on a quiet network, as the members measured it
                self.defaults = await engine.call(self.members[0].address, "stats", None, provider_id=GROUP_ID)
            stored = await self.stored_keys(engine)
            self.totals = self.verify(workload, stored)
            by_key = {("partition" if r.fault.startswith("partition") else f"{r.fault}/{r.condition}"): r
                      for r in self.results}  # fmt: skip
            for call, key in self.inflight_calls:
                result = by_key[key]
                applied = call.key in stored.get(call.member, set())
                result.inflight[f"{call.status or 'unfinished'}{', applied' if applied else ''}"] += 1
                result.acked_lost += call.status == "ok" and not applied
                result.dropped_applied += call.status == "dropped" and applied

    async def stored_keys(self, engine: Engine) -> dict[str, set[str]]:
        """The workload's keys each member holds (read back once every member is in the view again)."""
        stored: dict[str, set[str]] = {}
        for m in self.members:
            keys: set[str] = set()
            after = None
            while True:
                page = await engine.call(m.address, "list_keys", {"prefix": "bench-", "max": 1000,
                                         **({"start_after": after} if after else {})}, provider_id=KV_ID)  # fmt: skip
                if not page:
                    break
                keys |= {k.decode() for k in page}
                after = page[-1]
            stored[m.address] = keys
        return stored

    def progress(self, result: Result) -> None:
        p50, p99 = percentile(result.detect, 50), percentile(result.detect, 99)
        line = f"group_faults: {result.fault} under {CONDITIONS[result.condition][0]}: "
        line += (
            f"detect p50 {p50:.2f} s, p99 {p99:.2f} s (n={len(result.detect)})" if p50 is not None else "no detection"
        )
        print(line + f", false removals {result.false_removals}", file=sys.stderr, flush=True)

    def report(self) -> None:
        d = self.defaults
        print_lines(
            f"membership under faults: 4 members (2 per node), {mechanism(self.netem)}",
            f"settings: protocol period {d['probe_interval_seconds']:g} s, ping timeout {d['ping_timeout_seconds'] * 1000:.0f}"
            f" ms (from the round trip), suspicion {d['suspicion_timeout_seconds'][0]:g}-"
            f"{d['suspicion_timeout_seconds'][1]:g} s, stated bound {d['detection_bound_seconds']:.1f} s",
        )  # fmt: skip
        rows = []
        for r in self.results:
            p50, p99 = percentile(r.detect, 50), percentile(r.detect, 99)
            heal = percentile(r.heal, 50)
            inflight = ", ".join(f"{n} {s}" for s, n in sorted(r.inflight.items())) or "-"
            rows.append([
                r.fault, CONDITIONS[r.condition][0], len(r.detect) + r.undetected or "-",
                "-" if p50 is None else f"{p50:.2f} s", "-" if p99 is None else f"{p99:.2f} s",
                r.false_removals, inflight, r.acked_lost,
                "-" if heal is None else f"{heal:.2f} s (max {max(r.heal):.2f})",
            ])  # fmt: skip
        print_table(["fault", "network", "trials", "detect p50", "detect p99", "false removals", "in flight",
                     "acked lost", "single view after heal"], rows, numeric=("trials", "false removals", "acked lost"))  # fmt: skip
        t = self.totals
        print_lines(
            f"writes: {t['calls']} in all, {t['ok']} acknowledged, {t['acked_lost']} acknowledged lost, "
            f"{t['dropped_applied']} 'dropped' but applied; unknown outcomes: "
            + (", ".join(f"{n} {s}" for s, n in sorted(t["outcomes"].items())) or "none"),
            *[f"note: {r.fault}: {n}" for r in self.results for n in r.notes],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "mechanism": mechanism(self.netem), "settings": self.defaults, "totals": self.totals,
            "results": [{"fault": r.fault, "condition": r.condition, "detect_seconds": r.detect,
                         "heal_seconds": r.heal, "false_removals": r.false_removals, "undetected": r.undetected,
                         "in_flight": dict(r.inflight), "acked_lost": r.acked_lost,
                         "dropped_applied": r.dropped_applied, "notes": r.notes} for r in self.results],
        }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    parser.add_argument("--trials", type=int, default=20, help="kill and stop trials on a quiet network (half under "
                        "each network fault)")  # fmt: skip
    parser.add_argument("--partition-trials", type=int, default=3)
    parser.add_argument("--partition-hold", type=float, default=10.0, help="seconds the partition lasts once seen")
    parser.add_argument("--soak-seconds", type=float, default=600.0, help="the soak at 5%% loss (0: none)")
    parser.add_argument("--detect-timeout", type=float, default=60.0)
    parser.add_argument("--heal-timeout", type=float, default=120.0)
    parser.add_argument("--protocol-period-ms", type=float, default=None, help="(default: the group's)")
    parser.add_argument("--suspicion-timeout-ms", type=float, default=None, help="(default: the group's)")
    parser.add_argument("--no-netem", action="store_true", help="use nftables and the delay queue even with netem")
    parser.add_argument("-o", "--output", default=None, help="write the results, every sample, as JSON")
    args = parser.parse_args()
    args.faults = [f for f in args.faults.split(",") if f]
    unknown = set(args.faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown fault(s): {', '.join(sorted(unknown))} (known: {', '.join(FAULTS)})")
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces, link state, packet filters)")
    bench = Bench(args)
    missing = tools_missing(bench.netem)
    if missing:
        parser.error(f"missing command(s): {', '.join(missing)} (apt-get install iproute2 nftables iptables)")
    bed("up")
    try:
        bench.start_members()
        run(bench.main())
    finally:
        bench.clear()
        bench.stop_members()
        bed("down")
    bench.report()
    if args.output:
        Path(args.output).write_text(json.dumps(bench.to_json(), indent=2) + "\n")
    shutil.rmtree(bench.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
