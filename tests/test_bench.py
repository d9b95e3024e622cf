"""`svcframe bench` runs end to end (its figures are read by people, never asserted on time)."""

from __future__ import annotations

import os

import pytest

from selftest.bench import BenchOptions, add_ratios, run_bench


@pytest.mark.one_interpreter
def test_bench_runs_and_reports_ratios(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SVCFRAME_SECRET", raising=False)  # the bench brings its own secret for its servers
    before = os.sched_getaffinity(0)
    result = run_bench(BenchOptions(quick=True, seconds=0.3, workloads=("seq", "sat")))
    assert os.sched_getaffinity(0) == before  # the caller's CPU affinity is restored
    rows = result["rows"]
    assert {(r["workload"], r["impl"]) for r in rows} >= {
        ("seq", "raw uvloop echo"), ("seq", "svcframe"), ("sat", "raw uvloop echo"), ("sat", "svcframe"),
    }  # fmt: skip
    assert {r.get("mode") for r in rows if r["impl"] == "svcframe" and r["workload"] == "seq"} == {
        "block", "spindown", "busy",
    }  # fmt: skip
    for r in rows:
        assert r["ratio_to_raw"] > 0
        if r["workload"] == "sat":
            assert r["ops_per_second"] > 0 and r["server_cpu_usec_per_call"] > 0 and 0 < r["server_utilization"] < 2
        else:
            assert r["p50_usec"] <= r["p99_usec"]


def test_ratios_are_to_the_raw_row_of_the_same_setting() -> None:
    rows = [
        {"workload": "bulk", "impl": "raw", "transport": "tcp", "size": 1, "direction": "pull", "gib_per_second": 2.0},
        {"workload": "bulk", "impl": "sf", "transport": "tcp", "size": 1, "direction": "pull", "gib_per_second": 1.5},
        {"workload": "bulk", "impl": "sf", "transport": "tcp", "size": 1, "direction": "push", "gib_per_second": 1.0},
    ]
    add_ratios(rows)
    assert rows[1]["ratio_to_raw"] == 0.75
    assert "ratio_to_raw" not in rows[2]  # no raw figure for that setting: no ratio
