"""``roofline collect`` beyond Pc/Ps/grid: server sweep, storage metrics, combined score, the wall-time
split, the client pool, and Ctrl-C + resume from the results store."""

from __future__ import annotations

import json
import math
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import psutil
import pytest
from conftest import alive_pids, poll_until

from selftest import SELFTEST_CONFIG
from selftest.collect import CollectOptions, collect, plan, step_keys
from selftest.driver import SelftestError, SelftestParams
from selftest.pool import ClientPool
from selftest.roofline import combine_scores
from selftest.store import ResultsStore
from svcframe.config import load_config
from svcframe.launch import Launch

# roofline collection variants: our logic, not the Python version's (CI's first interpreter only)
pytestmark = pytest.mark.one_interpreter


PNG = b"\x89PNG\r\n\x1a\n"


def test_sweep_storage_scores_and_overhead(tmp_path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    opts = CollectOptions(
        out=tmp_path / "rl", metrics=["rpc_rate", "storage_iops"], duration_seconds=0.2, repeats=1,
        warmup_iterations=5, grid_servers=[1], grid_clients=[1, 2], saturation_depth=2, sweep_max_servers=2,
        storage_dir=disk, store=tmp_path / "r.sqlite", weights={"rpc_rate": 2.0},
    )  # fmt: skip
    steps = plan(opts)
    assert {s[0] for s in steps} == {"Pc", "ramp", "Ps", "sweep", "grid"}
    assert len(set(step_keys(steps))) == len(steps)
    seen: list[str] = []
    (tmp_path / "rl" / "roofline.json").mkdir(parents=True)  # a file that cannot be written late in the run
    doc = collect(opts, lambda desc, i, n: seen.append(desc))
    # nothing is lost to it: the run is complete in the store, the model kept in a temporary file, and said so
    assert doc["unwritten"] == [f"{tmp_path / 'rl' / 'roofline.json'}: Is a directory"]
    kept = Path(doc["kept"])
    assert json.loads(kept.read_text())["metrics"].keys() == set(opts.metrics)
    kept.unlink()
    assert len(seen) == len(doc["runs"]) <= len(steps)  # the ramp's loads after the rate stopped growing are skipped
    for metric in opts.metrics:  # the ramp, then Ps under the load of its highest rate
        ramp = [r for r in doc["runs"] if r["metric"] == metric and r["stage"] == "ramp"]
        best = max(ramp, key=lambda r: r["aggregate"])
        assert all((r["clients"], r["depth"]) == (best["clients"], best["depth"])
                   for r in doc["runs"] if r["metric"] == metric and r["stage"] in ("Ps", "sweep"))  # fmt: skip
        saturation = doc["metrics"][metric]["ps_saturation"]
        assert [step["rate"] for step in saturation["ramp"]] == [r["aggregate"] for r in ramp]
        for r in doc["runs"]:  # every Pc and Ps records its server's and its clients' CPU
            if r["stage"] in ("Pc", "Ps"):
                assert r["server_utilization"] > 0 and r["client_core_utilization"] > 0

    # (c) the sweep: 1..2 server processes for both metrics; its Ps point comes from the Ps samples
    for metric in opts.metrics:
        points = doc["sweep"][metric]
        assert [p["servers"] for p in points] == [1, 2]
        assert all(p["min"] <= p["median"] <= p["max"] and p["max"] > 0 for p in points)
    assert (tmp_path / "rl" / "sweep.png").read_bytes()[:8] == PNG

    # (d) storage IOPS: a roofline like the others; the servers' files are gone after teardown
    iops = doc["metrics"]["storage_iops"]
    assert iops["metric"]["unit"] == "ops/s" and iops["pc"]["min"] > 0 and len(iops["samples"]) == 2
    assert list(disk.iterdir()) == []

    # scores: per metric (geometric mean of samples) and across metrics, weighted (eq. 12)
    per_metric = {m: d["scores"]["overall"]["score"] for m, d in doc["metrics"].items()}
    expected = combine_scores(per_metric, {"rpc_rate": 2.0, "storage_iops": 1.0})
    assert doc["combined_score"] == pytest.approx(expected)
    assert 0 < doc["combined_score"] <= 1
    # each sample records its processes per core; those above one are excluded from the regions' errors
    slots = [n["slots"] for n in doc["nodes"]["nodes"]]
    assert len(slots) == 2  # local:2, the default: a server node and a client node
    for d in doc["metrics"].values():
        regions = d["scores"]["regions"]
        rows = d["scores"]["samples"]
        for row in rows:
            assert row["server_processes_per_core"] == row["servers"] / slots[0]
            assert row["client_processes_per_core"] == row["clients"] / slots[1]
            assert row["oversubscribed"] == (
                row["server_processes_per_core"] > 1 or row["client_processes_per_core"] > 1
            )
        assert sum(r["count"] for r in regions.values()) == sum(not r["oversubscribed"] for r in rows)
        assert d["scores"]["excluded"]["count"] == sum(r["oversubscribed"] for r in rows)

    # the wall-time split adds up, and measurement is the sum of the measurement intervals
    o = doc["overhead"]
    parts = [v for k, v in o.items() if k.endswith("_seconds") and k != "wall_seconds"]
    assert math.fsum(parts) == pytest.approx(o["wall_seconds"], rel=0.02)
    assert o["measurement_seconds"] == pytest.approx(sum(r["elapsed_seconds"] for r in doc["runs"]))
    assert o["measurement_seconds"] >= 0.2 * len(doc["runs"]) * 0.99  # each measured run took its duration
    assert o["outside_fraction"] == pytest.approx(1 - o["measurement_seconds"] / o["wall_seconds"])
    assert o["launch_seconds"] > 0 and o["teardown_seconds"] > 0

    with ResultsStore(tmp_path / "r.sqlite") as store:
        run = store.run(doc["run_id"])
        assert run["status"] == "complete" and len(run["samples"]) == len(doc["runs"])
        assert run["summary"]["combined_score"] == pytest.approx(expected)


def test_client_pool_reuses_processes_and_recovers_from_a_failed_run() -> None:
    with Launch(load_config(SELFTEST_CONFIG), 1) as job, ClientPool(2) as pool:
        address = [job.members[0].address]
        pids = set(pool.pids())
        first = pool.run(SelftestParams(clients=2, duration_seconds=0.2, warmup_iterations=2), address)
        with pytest.raises(SelftestError, match="no provider with id 9"):
            pool.run(SelftestParams(clients=2, duration_seconds=0.2, provider_id=9), address)
        again = pool.run(SelftestParams(clients=2, duration_seconds=0.2, warmup_iterations=2), address)
        assert set(pool.pids()) == pids  # the same processes served every run
        assert first["aggregate"]["ops"] > 0 and again["aggregate"]["ops"] > 0
        assert pool.statistics()["runs"] == 2
        bigger = pool.run(SelftestParams(clients=3, duration_seconds=0.2, warmup_iterations=2), address)
        assert len(bigger["clients"]) == 3 and pids < set(pool.pids())
    assert alive_pids(pids) == []


def _samples(db, within: float = 60.0, at_least: int = 1) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with closing(sqlite3.connect(db)) as con:
                n = con.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
        except sqlite3.OperationalError:  # not created yet
            n = 0
        if n >= at_least:
            return n
        time.sleep(0.05)
    pytest.fail(f"no {at_least} sample(s) stored within {within} s")


def test_ctrl_c_tears_down_and_resume_completes_the_run(tmp_path) -> None:
    db = tmp_path / "r.sqlite"
    cmd = [sys.executable, "-m", "svcframe", "roofline", "collect", "-o", str(tmp_path / "out"), "--store", str(db),
           "--metric", "rpc_rate", "--duration-seconds", "0.4", "--repeats", "2", "--grid-servers", "1",
           "--grid-clients", "1,2"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _samples(db, at_least=1)
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert children  # servers and client workers
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "resume with: svcframe roofline collect --resume 1" in err
    poll_until(lambda: not alive_pids(children), what="the servers and clients of the interrupted collect to exit")
    with ResultsStore(db) as store:
        run = store.run(1)
        assert run["status"] == "interrupted"
        before = {s["key"]: s["created"] for s in run["samples"]}
        assert 0 < len(before) < len(run["plan"])

    resumed = subprocess.run([sys.executable, "-m", "svcframe", "roofline", "collect", "--store", str(db),
                              "--resume", "latest"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed: {len(before)} measurements" in resumed.stdout
    with ResultsStore(db) as store:
        run = store.run(1)
        assert run["status"] == "complete"
        keys = [s["key"] for s in run["samples"]]
        assert keys == [k for k in run["plan"] if k in keys]  # each measured once, in plan order
        assert {k for k in run["plan"] if not k.startswith("ramp/")} <= set(keys)  # only ramp loads are skipped
        assert {k: c for k, c in ((s["key"], s["created"]) for s in run["samples"]) if k in before} == before
        assert run["summary"]["overhead"]["resumed_measurements"] == len(before)
    again = subprocess.run([sys.executable, "-m", "svcframe", "roofline", "collect", "--store", str(db), "--resume",
                            "1"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert again.returncode != 0 and "already complete" in again.stderr
