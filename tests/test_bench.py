"""`svcframe bench` runs end to end (its figures are read by people, never asserted on time): its steps reported
as they start, its tables one row per line in a pipe, figures in one notation."""

from __future__ import annotations

import os

import pytest

from selftest.bench import BenchOptions, add_ratios, bench_steps, expand_workloads, print_table, run_bench
from svcframe.units import quantity


@pytest.mark.one_interpreter
def test_bench_runs_and_reports_ratios(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SVCFRAME_SECRET", raising=False)  # the bench brings its own secret for its servers
    before = os.sched_getaffinity(0)
    steps: list[tuple[str, int, int]] = []
    result = run_bench(BenchOptions(quick=True, seconds=0.3, workloads=("seq", "sat")),
                       lambda description, done, total: steps.append((description, done, total)))  # fmt: skip
    assert os.sched_getaffinity(0) == before  # the caller's CPU affinity is restored
    assert steps == [("seq", 0, 2), ("sat", 1, 2)] and set(result["wall_seconds"]) == {"seq", "sat"}
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
    monkeypatch.delenv("COLUMNS", raising=False)
    print_table(result)  # in a pipe: one line per row, nothing cut, figures in one notation
    lines = capsys.readouterr().out.splitlines()
    assert "…" not in "\n".join(lines)
    for r in rows:
        figure = quantity(r["ops_per_second"], "ops/s")
        assert any(line.startswith(r["impl"]) and r.get("mode", "") in line and figure in line for line in lines), r


def test_the_client_workloads_are_one_step() -> None:
    assert bench_steps(expand_workloads(("client-read", "seq", "client-cpu"))) == ["seq", "client"]
    assert bench_steps(expand_workloads(("client",))) == ["client"] and bench_steps(("bulk",)) == ["bulk"]


def test_ratios_are_to_the_raw_row_of_the_same_setting() -> None:
    rows = [
        {"workload": "bulk", "impl": "raw", "transport": "tcp", "size": 1, "direction": "pull", "gib_per_second": 2.0},
        {"workload": "bulk", "impl": "sf", "transport": "tcp", "size": 1, "direction": "pull", "gib_per_second": 1.5},
        {"workload": "bulk", "impl": "sf", "transport": "tcp", "size": 1, "direction": "push", "gib_per_second": 1.0},
    ]
    add_ratios(rows)
    assert rows[1]["ratio_to_raw"] == 0.75
    assert "ratio_to_raw" not in rows[2]  # no raw figure for that setting: no ratio
