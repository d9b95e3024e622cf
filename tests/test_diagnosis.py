"""``svcframe stats diagnose`` on real runs: shares from exact counts x sampled means, the tool's own
admin calls left out, parent RPCs of other processes named, a callpath from several peers shown once with its
peers, and advice that fits the step and the handler (bulk, nested calls, async vs sync)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from selftest import SELFTEST_CONFIG
from selftest.driver import SelftestParams, run_selftest
from svcframe.config import load_config, parse_config
from svcframe.diagnosis import diagnose, format_diagnosis
from svcframe.engine import Engine, Request
from svcframe.launch import Launch

#: A front provider whose async ``fetch`` calls ``lookup`` on a back provider in another process; ``lookup``
#: is async and waits (an await, not the event loop); ``crunch`` is a sync handler that holds the loop.
LIBRARY = textwrap.dedent(
    """
    import asyncio
    import time

    from svcframe import Provider, register_provider_type, rpc


    @register_provider_type
    class Front(Provider):
        type_name = "front"

        @rpc
        async def fetch(self, req, n):
            return await self.engine.call(self.settings.back, "lookup", n, provider_id=1)


    @register_provider_type
    class Back(Provider):
        type_name = "back"

        @rpc
        async def lookup(self, req, n):
            await asyncio.sleep(0.003)
            return n

        @rpc
        def crunch(self, req, n):
            end = time.perf_counter() + 0.0005
            while time.perf_counter() < end:
                pass
    """
)


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One back server (providers of type back) and two front servers calling it: three processes."""
    lib = tmp_path_factory.mktemp("composedlib")
    (lib / "composed_provider.py").write_text(LIBRARY)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{lib}:{old}" if old else str(lib)
    try:
        back_cfg = parse_config(
            {"libraries": ["composed_provider"], "providers": [{"name": "back", "type": "back", "provider_id": 1}]}
        )
        with Launch(back_cfg, 1) as back:
            address = back.members[0].address
            front_cfg = parse_config(
                {"libraries": ["composed_provider"],
                 "providers": [{"name": "front", "type": "front", "provider_id": 1, "config": {"back": address}}]}
            )  # fmt: skip
            with Launch(front_cfg, 2) as fronts:
                yield {"back": address, "fronts": [m.address for m in fronts.members]}
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def svcframe(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "svcframe", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _finding(diagnosis: dict[str, Any], callpath: str, side: str = "target") -> dict[str, Any]:
    (found,) = [f for f in diagnosis["findings"] if f["callpath"] == callpath and f["side"] == side]
    return found


def test_composed_service_parents_peers_and_async_advice(composed: dict[str, Any]) -> None:
    back, fronts = composed["back"], composed["fronts"]
    svcframe("stats", "dump", back, *fronts, "--reset", "-o", os.devnull)

    async def load() -> None:
        async with Engine(None, secret=b"svcframe-test-secret") as engine:
            await asyncio.gather(*(engine.call(f, "fetch", i, provider_id=1) for f in fronts for i in range(20)))

    from svcframe.loops import run

    run(load())
    # the back server alone: its parent RPC ran in the front processes, which name it
    found = json.loads(svcframe("stats", "diagnose", back, "--json"))[back]
    lookup = _finding(found, "fetch[1] -> lookup[1]")
    assert lookup["peers"] == sorted(fronts) and lookup["calls"] == 40  # one callpath, both peers named
    assert lookup["dominant_step"] == "handler"
    assert "make it async" not in lookup["advice"] and "async handler" in lookup["advice"]
    text = svcframe("stats", "diagnose", back)
    assert f"fetch[1] -> lookup[1] from 2 peers ({', '.join(sorted(fronts))}): 40 calls" in text, text
    assert "#" not in text.split("(time =")[0]
    # a front server: its handler waits for the call it makes
    front = json.loads(svcframe("stats", "diagnose", fronts[0], "--json"))[fronts[0]]
    fetch = _finding(front, "fetch[1]")
    assert fetch["calls"] == 20 and fetch["dominant_step"] == "nested", fetch
    assert "diagnose the servers they go to" in fetch["advice"]
    assert _finding(front, "fetch[1] -> lookup[1]", side="origin")["peers"] == [back]


def test_sync_handler_is_told_about_the_event_loop(composed: dict[str, Any]) -> None:
    back = composed["back"]

    async def load() -> dict[str, Any]:
        from svcframe.admin import ServiceHandle

        async with Engine(None, secret=b"svcframe-test-secret") as engine:
            admin = ServiceHandle(engine, back)
            await admin.statistics(reset=True)
            for _ in range(30):
                await engine.call(back, "crunch", 0, provider_id=1)
            return await admin.statistics()

    from svcframe.loops import run

    crunch = _finding(diagnose(run(load())), "crunch[1]")
    assert crunch["calls"] == 30 and crunch["dominant_step"] == "handler"
    assert "sync handler holds the event loop" in crunch["advice"]


@pytest.fixture(scope="module")
def selftest_server() -> Iterator[str]:
    with Launch(load_config(SELFTEST_CONFIG), 1) as job:
        yield job.members[0].address


def test_bulk_workload_gets_bulk_advice(selftest_server: str) -> None:
    params = SelftestParams(workload="bulk", bulk_size=1 << 20, duration_seconds=0.5, warmup_iterations=2)
    results = run_selftest(params, [selftest_server])
    (diagnosis,) = results["diagnosis"].values()
    work = _finding(diagnosis, "work[1]")
    assert work["calls"] == results["aggregate"]["ops"]
    assert work["dominant_step"] == "bulk" and "bandwidth" in work["advice"], format_diagnosis(diagnosis)
    assert diagnosis["excluded"] == [{"callpath": "statistics[0]", "calls": 1}]


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_shares_weigh_exact_counts_not_timed_samples() -> None:
    """57,171 sampled-down ``work`` calls against one fully timed call made the one call look like 27%
    of the time. Here 2,000 short calls (about 180 of them timed) and one call as long as ~100 short ones: by
    calls x mean the short ones dominate; by the sampled sums the long call would weigh about 7 times more. (The
    long call is 5% of the time on an idle machine: on a busy one, whose preemptions lengthen the short calls
    more, it stays above the 1% a finding needs.)"""
    async with Engine("tcp://127.0.0.1:0") as server, Engine(None) as client:

        def spin(req: Request, usec: int) -> None:
            import time

            end = time.perf_counter() + usec * 1e-6
            while time.perf_counter() < end:
                pass

        server.register(1, "spin", spin)
        server.register(2, "spin", spin)
        for _ in range(2000):
            await client.call(server.address, "spin", 50, provider_id=1)
        await client.call(server.address, "spin", 5000, provider_id=2)
        stats = server.statistics()
    diagnosis = diagnose(stats)
    short, long = _finding(diagnosis, "spin[1]"), _finding(diagnosis, "spin[2]")
    assert short["calls"] == 2000 and long["calls"] == 1
    rows = {r["provider_id"]: r for r in stats["rpcs"]["target"]}

    def step_sum(row: dict[str, Any], of: str) -> float:
        return sum(
            row[f"{s}_usec"][of] * (row["calls"] if of == "mean" else 1) for s in ("queue", "handler", "respond")
        )

    by_count = step_sum(rows[2], "mean") / (step_sum(rows[1], "mean") + step_sum(rows[2], "mean"))
    by_samples = step_sum(rows[2], "sum") / (step_sum(rows[1], "sum") + step_sum(rows[2], "sum"))
    assert long["share"] == pytest.approx(by_count) and short["share"] == pytest.approx(1 - by_count)
    assert by_samples > 4 * by_count  # what the old, mixed sums said: about 7x too much
    assert "exact calls x sampled mean" in diagnosis["method"]


def _stats(calls: int, handler_sum: float, timed: int, since: float = 1.0, polls: int = 0) -> dict[str, Any]:
    row = {"parent_rpc": "", "parent_provider_id": None, "rpc": "work", "provider_id": 1, "peer": "clients@h",
           "calls": calls, "errors": 0,
           "handler_usec": {"count": timed, "sum": handler_sum, "min": 1.0, "max": 9.0, "mean": handler_sum / timed,
                            "p50": 4.0, "p90": 8.0, "p99": 9.0}}  # fmt: skip
    return {"rpcs": {"since": since, "origin": [], "target": [row], "bulk": [],
                     "names": {}, "timing_sample_every": 16, "always_timed": 64},
            "progress": {"mode": "spindown", "polls": polls, "blocks": 2}}  # fmt: skip


def test_a_window_of_two_reads_is_their_difference_and_needs_no_reset() -> None:
    """How the self-test diagnoses a live service without resetting its statistics."""
    from svcframe.diagnosis import window

    before, after = _stats(1_000, 4_000.0, 100, polls=10), _stats(1_600, 7_000.0, 150, polls=25)
    (row,) = window(before, after)["rpcs"]["target"]
    assert row["calls"] == 600 and row["errors"] == 0
    assert row["handler_usec"] == {"count": 50, "sum": 3_000.0, "mean": 60.0}  # no percentile of a window
    assert window(before, after)["progress"]["polls"] == 15 and not window(before, after)["window"]["reset"]
    assert window(after, after)["rpcs"]["target"] == []  # nothing happened in between
    reset = window(before, _stats(50, 200.0, 50, since=2.0))  # reset in between: all the later read holds
    assert reset["window"]["reset"] and reset["rpcs"]["target"][0]["calls"] == 50
    (finding,) = diagnose(window(before, after))["findings"]
    assert finding["calls"] == 600 and finding["mean_usec"] == pytest.approx(60.0)
