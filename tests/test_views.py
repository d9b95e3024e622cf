"""Every view of a server's statistics tells the same, exact call count: after a self-test of N timed calls (and
W warm-up calls) run through the CLI, ``svcframe monitor`` (one snapshot, in a pipe and as JSON), ``svcframe stats
diagnose``, ``svcframe stats dump`` (JSON and Prometheus ``calls_total``) and the admin ``statistics`` RPC all
report the ``work`` calls they counted before, plus W + N; the diagnosis the self-test prints reports N, its timed
window. Measuring the live service changed nothing its users see: the statistics were never reset (their
``since`` is unchanged) and no counter went down."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from selftest import SELFTEST_CONFIG
from svcframe.admin import ServiceHandle
from svcframe.config import load_config
from svcframe.engine import Engine
from svcframe.launch import Launch
from svcframe.loops import run

# the results views: our logic, not the Python version's (CI's first interpreter only)
pytestmark = pytest.mark.one_interpreter


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with Launch(load_config(SELFTEST_CONFIG), 1) as job:
        yield job.members[0].address


def svcframe(*args: str) -> str:
    """Run the CLI as a user does in a pipe: its stdout (and its exit status checked)."""
    proc = subprocess.run([sys.executable, "-m", "svcframe", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _work_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    (row,) = [r for r in rows if r["rpc"] == "work"]
    return row


async def _statistics(server: str) -> dict[str, Any]:
    async with Engine(None, secret=b"svcframe-test-secret") as engine:
        return await ServiceHandle(engine, server).statistics()


def _work_calls(stats: dict[str, Any]) -> int:
    return sum(r["calls"] for r in stats["rpcs"]["target"] if r["rpc"] == "work")


def test_every_view_reports_the_selftests_call_count(server: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    svcframe("selftest", "run", "-t", server, "--clients", "1", "--duration-seconds", "0.2")  # an earlier user's
    before = run(_statistics(server))
    printed = svcframe("selftest", "run", "-t", server, "--clients", "2", "--duration-seconds", "0.5", "-o", str(out))
    results = json.loads(out.read_text())
    n = results["aggregate"]["ops"]
    assert n == sum(c["ops"] for c in results["clients"]) > 100
    total = _work_calls(before) + results["aggregate"]["warmup_ops"] + n  # what every view now counts
    assert _work_calls(before) > 0 and results["aggregate"]["warmup_ops"] == 2 * 10
    # the diagnosis the self-test printed: exact calls of its timed window, and not the tool's own statistics call
    assert re.search(rf"target: work\[1\] from \S+: {n:,} calls, \d+% of target time", printed), printed
    (diagnosis,) = results["diagnosis"].values()
    assert [f["calls"] for f in diagnosis["findings"] if f["callpath"] == "work[1]"] == [n]
    assert all(f["callpath"] != "statistics[0]" for f in diagnosis["findings"])
    after = run(_statistics(server))
    assert after["rpcs"]["since"] == before["rpcs"]["since"]  # never reset: the service's users see no change
    assert _work_calls(after) == total
    n = total  # the views below count every call since the server started

    # monitor, one snapshot: as JSON lines, and as the table a pipe gets
    (line,) = svcframe("monitor", server, "--count", "1", "--json").splitlines()
    (row,) = [r for r in json.loads(line)["rows"] if r["callpath"] == "work[1]" and r["side"] == "target"]
    assert row["calls"] == n and row["errors"] == 0
    table = svcframe("monitor", server, "--count", "1")
    (work_line,) = [ln for ln in table.splitlines() if "work[1]" in ln]
    assert f" {n:,} " in work_line, table

    # stats diagnose, as text and JSON
    text = svcframe("stats", "diagnose", server)
    assert f"work[1] from clients@127.0.0.1: {n:,} calls" in text, text
    assert "not counted: admin provider calls" in text and "statistics[0]" in text.split("not counted")[1]
    found = json.loads(svcframe("stats", "diagnose", server, "--json"))[server]["findings"]
    assert [f["calls"] for f in found if f["callpath"] == "work[1]"] == [n]

    # stats dump: Prometheus calls_total and the JSON document
    prom = svcframe("stats", "dump", server, "--format", "prometheus")
    (total,) = [
        float(value)
        for labels, value in re.findall(r"^svcframe_rpc_calls_total\{([^}]*)\} (\S+)$", prom, re.M)
        if 'rpc="work"' in labels and 'side="target"' in labels
    ]
    assert total == n
    dumped = json.loads(svcframe("stats", "dump", server))[server]
    assert _work_row(dumped["rpcs"]["target"])["calls"] == n
    assert _work_row(dumped["rpcs"]["target"])["handler_usec"]["count"] < n  # timing is sampled, and says so
    assert dumped["rpcs"]["timing_sample_every"] == 16 and dumped["rpcs"]["always_timed"] == 64

    # the admin statistics RPC itself
    assert _work_row(run(_statistics(server))["rpcs"]["target"])["calls"] == n
