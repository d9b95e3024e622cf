"""Observability: step statistics, callpaths across processes, trace export, samples, Prometheus, diagnosis."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import wait_until

from svcframe.admin import ServiceHandle
from svcframe.config import parse_config
from svcframe.diagnosis import diagnose
from svcframe.engine import Engine, Request
from svcframe.errors import DeadlineExceeded
from svcframe.launch import Launch
from svcframe.loops import run
from svcframe.monitoring import BULK_STEPS, FOLD_AT, Record, bucket_of, bucket_value, to_prometheus
from svcframe.wire import callpath_extend, rpc_id

RELAY = textwrap.dedent(
    """
    from svcframe import Provider, register_provider_type, rpc
    from svcframe.engine import current_callpath


    @register_provider_type
    class Relay(Provider):
        type_name = "relay"

        @rpc
        async def hop(self, req, hops):
            here = {"callpath": req.callpath, "ctx": current_callpath()}
            if not hops:
                return [here]
            (address, provider_id), rest = hops[0], hops[1:]
            below = await self.engine.call(address, "hop", rest, provider_id=provider_id)
            return [here, *below]
    """
)


# -- histogram math ---------------------------------------------------------------------------------------
def test_buckets_are_log_linear_within_a_64th() -> None:
    """Integers below 64 have a bucket each; above, 32 buckets per power of two, whose middle is within
    1/64 of any value in them; buckets grow with the values."""
    rng = np.random.default_rng(7)
    values = sorted(
        {0, 1, 2, 3, 31, 32, 33, 63, 64, 65, 1000, 2**40, 2**64 - 1, *rng.integers(1, 2**62, 5000).tolist()}
    )
    buckets = [bucket_of(value) for value in values]
    assert buckets == sorted(buckets) and buckets[0] == 0 and bucket_of(-5) == 0
    assert all(bucket_value(bucket_of(v)) == v for v in range(64))
    assert [bucket_of(v) for v in (992, 1007, 1008)] == [bucket_of(992)] * 2 + [bucket_of(992) + 1]  # 512 + 16 k
    for value, bucket in zip(values, buckets, strict=True):
        assert bucket_value(bucket) == pytest.approx(value, rel=1 / 64)


@pytest.mark.parametrize("sigma", [0.25, 0.5, 1.0, 2.0])
def test_percentiles_of_lognormal_latencies_are_within_3_percent(sigma: float) -> None:
    """p50/p90/p99 of lognormal latencies (median 20 µs, in ns) against numpy's exact percentiles, folded
    as the engine folds them: two steps interleaved in one buffer, in batches of FOLD_AT values."""
    rng = np.random.default_rng(int(sigma * 100))
    durations = np.rint(rng.lognormal(np.log(20_000), sigma, 50_000)).astype(np.int64)
    sizes = rng.integers(0, 1 << 20, durations.size)
    rec = Record(BULK_STEPS)  # ("bytes", "duration")
    interleaved = np.column_stack([sizes, durations]).ravel().tolist()
    for start in range(0, len(interleaved), FOLD_AT):
        rec.buffer.extend(interleaved[start : start + FOLD_AT])
        rec.fold()
    for step, values in (("duration", durations), ("bytes", sizes)):
        summary = rec.summaries[step]
        assert (summary.count, summary.sum) == (values.size, int(values.sum()))
        assert (summary.min, summary.max) == (int(values.min()), int(values.max()))
        for q in (50, 90, 99):
            assert summary.percentile(q) == pytest.approx(np.percentile(values, q), rel=0.03), (step, q)


# -- callpaths across three processes, and traces -------------------------------------------------------------
@pytest.fixture(scope="module")
def relays(
    tmp_path_factory: pytest.TempPathFactory,
):
    lib = tmp_path_factory.mktemp("relaylib")
    (lib / "relay_provider.py").write_text(RELAY)
    import os

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{lib}:{old}" if old else str(lib)
    try:
        cfg = parse_config(
            {"libraries": ["relay_provider"], "providers": [{"name": "relay", "type": "relay", "provider_id": 1}]}
        )
        with Launch(cfg, 3) as job:
            yield [m.address for m in job.members]
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


async def _admin_all(engine: Engine, addresses: list[str], method: str, *args: Any) -> list[Any]:
    return await asyncio.gather(*(getattr(ServiceHandle(engine, a), method)(*args) for a in addresses))


def test_callpath_chain_across_three_processes(relays: list[str]) -> None:
    a, b, c = relays

    async def go() -> tuple[list[dict[str, int]], list[dict[str, Any]]]:
        async with Engine(None) as engine:
            await _admin_all(engine, relays, "statistics", True)
            for _ in range(5):
                seen = await engine.call(a, "hop", [[b, 1], [c, 1]], provider_id=1)
            return seen, await _admin_all(engine, relays, "statistics")

    seen, stats = run(go())
    hop = rpc_id("hop")
    # the chained hash: each hop's callpath extends its parent's; the handler's context carries it
    assert seen[0]["callpath"] == callpath_extend(0, hop, 1)
    assert seen[1]["callpath"] == callpath_extend(seen[0]["callpath"], hop, 1)
    assert seen[2]["callpath"] == callpath_extend(seen[1]["callpath"], hop, 1)
    assert [s["ctx"] for s in seen] == [s["callpath"] for s in seen]
    assert len({s["callpath"] for s in seen}) == 3

    def target_rows(st: dict[str, Any]) -> list[dict[str, Any]]:
        return [r for r in st["rpcs"]["target"] if r["rpc"] in ("hop", f"#{hop:08x}")]

    (root,) = target_rows(stats[0])
    assert root["parent_rpc"] == "" and root["handler_usec"]["count"] == 5
    for st in (stats[1], stats[2]):
        (row,) = target_rows(st)
        assert row["parent_rpc"] == "hop" and row["parent_provider_id"] == 1  # parent RPC -> RPC
        assert row["handler_usec"]["count"] == 5
        assert row["queue_usec"]["min"] >= 0
    # the origin side of the middle hop: a nested call, keyed by its parent
    (nested,) = [r for r in stats[1]["rpcs"]["origin"] if r["rpc"] == "hop"]
    assert nested["parent_rpc"] == "hop" and nested["peer"] == c and nested["total_usec"]["count"] == 5
    # times nest: a hop's handler contains the whole round trip of the hop below it
    assert target_rows(stats[1])[0]["handler_usec"]["sum"] >= nested["total_usec"]["sum"] > 0
    assert nested["total_usec"]["sum"] >= target_rows(stats[2])[0]["handler_usec"]["sum"]


#: Trace timestamps are wall-clock µs, from each process's own epoch offset (time.time() against
#: perf_counter, read once at start): two processes' clocks may disagree by a few µs. Spans here last ms.
CLOCK_SKEW_USEC = 50


def test_trace_export_is_valid(relays: list[str], tmp_path: Path) -> None:
    a, b, c = relays

    async def go() -> list[dict[str, Any]]:
        async with Engine(None) as engine:
            await _admin_all(engine, relays, "set_tracing", True)
            await _admin_all(engine, relays, "trace_events", True)
            engine.set_tracing(True)
            for _ in range(3):
                await engine.call(a, "hop", [[b, 1], [c, 1]], provider_id=1)
            server_events = await _admin_all(engine, relays, "trace_events", True)
            await _admin_all(engine, relays, "set_tracing", False)
            assert engine.tracer is not None
            return engine.tracer.take() + [e for evs in server_events for e in evs]

    events = run(go())
    spans = [e for e in events if e["ph"] == "X" and e["name"] == "hop"]  # admin calls are traced too
    origin = {e["args"]["span_id"]: e for e in spans if e["args"]["side"] == "origin"}
    target = {e["args"]["span_id"]: e for e in spans if e["args"]["side"] == "target"}
    assert len(origin) == 9 and len(target) == 9  # 3 calls x 3 hops, each seen from both sides
    assert origin.keys() == target.keys()
    assert all(e["dur"] >= 0 for e in spans)  # every span closed
    assert len({e["args"]["trace_id"] for e in spans}) == 3  # one trace per top-level call
    for span_id, o in origin.items():
        t = target[span_id]
        assert o["args"]["trace_id"] == t["args"]["trace_id"]
        # callee inside caller (µs), up to the error of each process's wall-clock epoch (CLOCK_SKEW_USEC)
        assert o["ts"] <= t["ts"] + CLOCK_SKEW_USEC and t["ts"] + t["dur"] <= o["ts"] + o["dur"] + CLOCK_SKEW_USEC
        assert t["args"]["lamport"] > o["args"]["lamport"]  # causality, whatever the clocks
        parent = o["args"]["parent_span_id"]
        assert parent == "0" * 16 or parent in target  # parent links resolve to a handler span
    flows = defaultdict(list)
    for e in events:
        if e["ph"] in ("s", "f") and e["name"] == "hop":
            flows[e["id"]].append(e["ph"])
    assert len(flows) == 9 and all(sorted(v) == ["f", "s"] for v in flows.values())  # caller -> callee arrows
    by_pid = defaultdict(list)
    for e in spans:
        by_pid[e["pid"]].append(e)
    assert len(by_pid) == 4  # the client and three servers
    for evs in by_pid.values():  # within a process, later Lamport stamps never start earlier
        ordered = sorted(evs, key=lambda e: e["args"]["lamport"])
        assert all(
            x["ts"] <= y["ts"] + 1
            for x, y in itertools.pairwise(ordered)
            if x["args"]["side"] == y["args"]["side"] == "origin"
        )
    from svcframe.tracing import write_chrome_trace

    doc = json.loads(write_chrome_trace(tmp_path / "t.json", events).read_text())
    assert doc["displayTimeUnit"] == "ms" and len(doc["traceEvents"]) == len(events)


# -- samples, Prometheus, diagnosis -----------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_process_samples() -> None:
    async with Engine("tcp://127.0.0.1:0", monitoring={"sample_interval_seconds": 0.02}) as engine:
        engine.register(1, "x", lambda req, arg: None)
        await wait_until(lambda: len(engine.statistics()["samples"]) >= 3, what="3 process samples")
        sample = engine.statistics()["samples"][-1]
        assert set(sample) == {"time", "loop_lag_seconds", "tasks", "inflight", "cpu_utilization", "rss_bytes"}
        assert sample["rss_bytes"] > 1 << 20 and sample["tasks"] >= 1 and sample["loop_lag_seconds"] >= 0


@pytest.mark.asyncio
async def test_prometheus_text_parses_without_duplicates() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async with Engine("tcp://127.0.0.1:0") as server:
        server.register(1, "echo", lambda req, arg: arg)
        clients = [await Engine(None).start() for _ in range(2)]  # two peers: rows must merge per label set
        for c in clients:
            for _ in range(4):
                await c.call(server.address, "echo", b"x" * 10, provider_id=1)
            await c.close()
        text = to_prometheus(server.statistics(), {"server": "s0"}).decode()
    seen = set()
    counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in seen
            seen.add(key)
            if sample.name == "svcframe_rpc_handler_seconds_count" and sample.labels["rpc"] == "echo":
                counts[sample.labels["side"]] = sample.value
    assert counts == {"target": 8.0}


@pytest.mark.asyncio
async def test_diagnosis_names_the_dominant_step() -> None:
    async with Engine("tcp://127.0.0.1:0") as server, Engine(None) as client:

        async def slow(req: Request, arg: Any) -> None:
            await asyncio.sleep(0.02)

        def busy(req: Request, arg: Any) -> None:  # holds the loop: queued requests wait
            import time

            end = time.perf_counter() + 0.002
            while time.perf_counter() < end:
                pass

        server.register(1, "slow", slow)
        server.register(1, "busy", busy)
        await asyncio.gather(*(client.call(server.address, "slow", None, provider_id=1) for _ in range(3)))
        found = {f["callpath"]: f for f in diagnose(server.statistics())["findings"]}
        assert found["slow[1]"]["dominant_step"] == "handler"
        server.monitor.reset()
        await asyncio.gather(*(client.call(server.address, "busy", None, provider_id=1) for _ in range(20)))
        found = {f["callpath"]: f for f in diagnose(server.statistics())["findings"]}
        assert found["busy[1]"]["dominant_step"] == "queue"
        assert "add server processes" in found["busy[1]"]["advice"]


def test_cli_stats_trace_and_monitor(relays: list[str], tmp_path: Path) -> None:
    a = relays[0]
    cli = [sys.executable, "-m", "svcframe"]

    def svc(*args: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out

    svc("trace", "on", a)
    svc("call", a, "hop", "[]", "-p", "1")
    svc("trace", "dump", a, "-o", str(tmp_path / "t.json"), "--clear")
    svc("trace", "off", a)
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert any(e.get("name") == "hop" and e["ph"] == "X" for e in events)
    svc("stats", "dump", a, "-o", str(tmp_path / "s.json"))
    assert json.loads((tmp_path / "s.json").read_text())[a]["rpcs"]["target"]
    prom = svc("stats", "dump", a, "--format", "prometheus").stdout
    assert "svcframe_rpc_handler_seconds_count" in prom
    assert "dominates" in svc("stats", "diagnose", a).stdout
    assert "callpath" in svc("monitor", a, "--count", "1", "--interval-seconds", "0.2").stdout


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_monitor_counts_every_call_not_the_timed_sample() -> None:
    """``svcframe monitor`` showed about 1/16 of the calls (the timed sample's count)."""
    from svcframe.cli.observe import stats_rows

    async with Engine("tcp://127.0.0.1:0", monitoring={"timing_sample_every": 16}) as server, Engine(None) as client:
        server.register(1, "noop", lambda req, arg: None)
        before = {server.address: server.statistics()}
        for _ in range(1000):
            await client.call(server.address, "noop", provider_id=1)  # type: ignore[arg-type]
        rows = stats_rows(before, {server.address: server.statistics()}, 1.0)
    (row,) = [r for r in rows if r[1] == "target" and r[2] == "noop[1]"]
    assert row[5] == 1000 and row[4] == 1000.0  # calls, calls/s over the 1 s window given


@pytest.mark.asyncio
async def test_prometheus_exposition_of_many_servers_is_valid() -> None:
    """One HELP/TYPE per metric name over several servers, Prometheus names (no _bytes_bytes, no
    usec), checked by promtool (Debian's prometheus package; .ci/run installs it) where it is installed."""
    import re
    import shutil

    from svcframe.monitoring import to_prometheus_many

    snapshots = []
    for n in range(2):
        async with Engine("tcp://127.0.0.1:0") as server, Engine(None) as client:
            server.register(1, "echo", lambda req, arg: arg)
            for _ in range(5):
                await client.call(server.address, "echo", b"x" * 10, provider_id=1)  # type: ignore[arg-type]
            snapshots.append(({"server": f"s{n}"}, server.statistics()))
    text = to_prometheus_many(snapshots).decode()
    types = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert len(types) == len(set(types)) and types
    assert "_bytes_bytes" not in text and "usec" not in text
    assert re.search(r'^svcframe_rpc_calls_total\{.*server="s1".*\} 5\.0$', text, re.M), text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    check = await asyncio.to_thread(
        subprocess.run, [promtool, "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.asyncio
async def test_calls_dropped_at_their_deadline_are_errors() -> None:
    """Calls ended by their deadline on the server were counted with errors: 0. (Whichever comes
    first, the server's deadline timer or the caller's CANCEL at the same deadline, the call is an error.)"""
    from conftest import wait_until

    async with Engine("tcp://127.0.0.1:0") as server, Engine(None) as client:

        async def slow(req: Request, arg: Any) -> None:
            await asyncio.Event().wait()

        server.register(1, "slow", slow)
        for _ in range(3):
            with pytest.raises(DeadlineExceeded):
                await client.call(server.address, "slow", provider_id=1, timeout_seconds=0.02)  # type: ignore[arg-type]

        def errors() -> int:
            return sum(r["errors"] for r in server.statistics()["rpcs"]["target"] if r["rpc"] == "slow")

        await wait_until(lambda: errors() == 3, what="3 errors in the server's statistics")


def test_traces_connect_across_processes_for_an_untraced_client(relays: list[str]) -> None:
    """With tracing on in the servers but not in the client, the first server's handler span
    and the calls it makes had different trace ids and a zero parent. Now the first server starts the
    trace: every hop of one call shares its trace id, and each nested call's parent is its caller's span."""
    a, b, c = relays

    async def go() -> list[dict[str, Any]]:
        async with Engine(None) as engine:  # never traces
            await _admin_all(engine, relays, "set_tracing", True)
            await _admin_all(engine, relays, "trace_events", True)
            for _ in range(3):
                await engine.call(a, "hop", [[b, 1], [c, 1]], provider_id=1)
            server_events = await _admin_all(engine, relays, "trace_events", True)
            await _admin_all(engine, relays, "set_tracing", False)
            assert engine.tracer is None
            return [e for evs in server_events for e in evs]

    events = run(go())
    spans = [e for e in events if e["ph"] == "X" and e["name"] == "hop"]
    target = {e["args"]["span_id"]: e for e in spans if e["args"]["side"] == "target"}
    origin = {e["args"]["span_id"]: e for e in spans if e["args"]["side"] == "origin"}
    assert len(target) == 9 and len(origin) == 6  # 3 calls x 3 hops served; the 2 nested hops made by servers
    assert len({e["args"]["trace_id"] for e in spans}) == 3  # one trace per top-level call, all hops in it
    for o in origin.values():
        parent = o["args"]["parent_span_id"]
        assert parent in target, "a nested call's parent is not the handler span that made it"
        assert (
            target[parent]["args"]["trace_id"]
            == o["args"]["trace_id"]
            == target[o["args"]["span_id"]]["args"]["trace_id"]
        )
