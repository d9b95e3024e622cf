"""The membership benchmark's short run, as CI runs it (tools/group_faults.py; the whole run is a benchmark of about
30 minutes, not a test): four members on two network-namespace nodes, a member killed, 5% loss (nftables or
netem), 1 ms delay (an NFQUEUE or netem), a partition that heals, and a short soak at 5% loss. What must hold
whatever the timings: every fault detected, nothing acknowledged lost, nothing reported "dropped" that was
applied, no false removal, one view after the heal.

Needs root, iproute2, and tc netem or nftables and iptables; skipped with the reason otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.one_interpreter,
    pytest.mark.skipif(sys.platform != "linux", reason="network namespaces are Linux-only"),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces, link state and packet filters need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="the ip command (iproute2) is not installed"),
    pytest.mark.timeout(300),
]


def skip_without_fault_tools() -> None:
    """Skip unless this machine can make the faults: tc netem (tried in a scratch namespace, as the benchmark
    does), else nftables and iptables."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from netfaults import netem_available, tools_missing
    finally:
        sys.path.remove(str(ROOT / "tools"))
    netem = shutil.which("tc") is not None and netem_available()
    missing = tools_missing(netem)
    if missing:
        why = "tc netem" if netem else "this kernel has no sch_netem; its stand-in (nftables, iptables)"
        pytest.skip(f"{why}: missing command(s) {', '.join(missing)} (apt-get install iproute2 nftables iptables)")


def test_the_short_fault_run_loses_nothing_and_removes_only_the_failed(tmp_path: Path) -> None:
    skip_without_fault_tools()
    out = tmp_path / "faults.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "group_faults.py"), "--faults", "kill,loss5,delay1,partition",
         "--trials", "2", "--partition-trials", "1", "--partition-hold", "2", "--soak-seconds", "10",
         "--protocol-period-ms", "500", "--suspicion-timeout-ms", "2000", "-o", str(out)],
        capture_output=True, text=True, timeout=280, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    faults = {(r["fault"].split(" (")[0], r["condition"]): r for r in doc["results"]}
    assert set(faults) == {("member killed", "quiet"), ("member killed", "loss5"), ("member killed", "delay1"),
                           ("partition", "quiet"), ("soak, no failure", "loss5")}, faults  # fmt: skip
    for key, r in faults.items():
        assert r["undetected"] == 0 and r["false_removals"] == 0, (key, r)
        assert r["acked_lost"] == 0 and r["dropped_applied"] == 0, (key, r)
        if key[0] != "soak, no failure":
            assert r["detect_seconds"], (key, r)
    assert faults[("partition", "quiet")]["heal_seconds"], faults[("partition", "quiet")]
    assert doc["totals"]["acked_lost"] == 0 and doc["totals"]["dropped_applied"] == 0 and doc["totals"]["ok"] > 0
    # the table, in a log: one row per fault, the mechanism named
    assert "membership under faults" in proc.stdout and "acknowledged lost" in proc.stdout
    assert ("tc netem" in proc.stdout) or ("no sch_netem" in proc.stdout)
