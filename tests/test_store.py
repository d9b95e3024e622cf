"""The results store: runs and samples in SQLite, history, "is that normal?", and the CLI on real runs."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import psutil
import pytest

from selftest.store import (
    SCHEMA_VERSION,
    ResultsStore,
    StoreError,
    compare,
    default_store_path,
    plot_history,
    quantities,
)
from svcframe.units import quantity, quantity_range

PNG = b"\x89PNG\r\n\x1a\n"
CLI = [sys.executable, "-m", "svcframe"]
TINY = ["--duration-seconds", "0.2", "--repeats", "1", "--grid-servers", "1", "--grid-clients", "1,2",
        "--metric", "rpc_rate"]  # fmt: skip


def _model(pc: float, ps: float, score: float) -> dict:
    metric = {"name": "rpc_rate", "unit": "ops/s", "label": "RPC rate per client process (ops/s)"}
    return {
        "metrics": {
            "rpc_rate": {"metric": metric, "pc": {"min": pc, "max": pc}, "ps": {"min": ps, "max": ps},
                         "scores": {"overall": {"score": score}}}
        }
    }  # fmt: skip


def _new_run(store: ResultsStore, service: str = "svc", platform: str = "plat", keys: tuple = ("a#0", "b#0")) -> int:
    return store.create_run(
        kind="svcframe-roofline", service=service, platform=platform, host="h", options={"metrics": ["rpc_rate"]},
        environment={"python": "3"}, hardware={"cores": 2}, software={"svcframe": "0"}, plan=list(keys),
    )  # fmt: skip


def _row(stage: str = "Pc", value: float = 1.0) -> dict:
    return {"stage": stage, "metric": "rpc_rate", "servers": 1, "clients": 1, "value": value, "per_client": value}


def test_runs_and_samples_round_trip(tmp_path) -> None:
    path = tmp_path / "sub" / "r.sqlite"
    with ResultsStore(path) as store:
        rid = _new_run(store)
        store.add_sample(rid, "a#0", _row(value=5.0), {"aggregate": {"ops": 3}})
        assert store.sample_keys(rid) == {"a#0"}
        with pytest.raises(StoreError, match="already has a sample 'a#0'"):
            store.add_sample(rid, "a#0", _row())
        run = store.run(rid)
        assert run["status"] == "running" and run["plan"] == ["a#0", "b#0"]
        assert run["hardware"] == {"cores": 2} and run["samples"][0]["value"] == 5.0
        assert store.samples(rid, with_results=True)[0]["result"] == {"aggregate": {"ops": 3}}
        store.set_status(rid, "interrupted")
        with pytest.raises(StoreError, match="status must be one of"):
            store.set_status(rid, "bogus")
    # a new connection sees everything that was committed
    with ResultsStore(path) as store:
        assert store.run("latest")["status"] == "interrupted"
        with closing(sqlite3.connect(path)) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_resolve_references(tmp_path) -> None:
    with ResultsStore(tmp_path / "r.sqlite") as store:
        ids = [_new_run(store) for _ in range(3)]
        assert store.resolve("latest") == ids[-1]
        assert store.resolve("-2") == ids[1]
        assert store.resolve(str(ids[0])) == ids[0]
        with pytest.raises(StoreError, match="no run '99'"):
            store.resolve("99")
        with pytest.raises(StoreError, match="an id, 'latest' or -N"):
            store.resolve("yesterday")


def test_not_a_store_and_newer_schema_are_clear_errors(tmp_path) -> None:
    """A file that is not a store, or a newer store, is a StoreError, and the failed store leaves no file
    open: checked while the errors (whose tracebacks hold the half-made stores) are still alive."""

    def open_here(path: Path) -> list[str]:
        return [f.path for f in psutil.Process().open_files() if f.path == str(path)]

    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a usable results store") as junk_error:
        ResultsStore(junk)
    newer = tmp_path / "newer.sqlite"
    with closing(sqlite3.connect(newer)) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer than this svcframe") as newer_error:
        ResultsStore(newer)
    assert junk_error.traceback and newer_error.traceback
    assert open_here(junk) == open_here(newer) == []


def test_default_path_follows_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SVCFRAME_RESULTS", str(tmp_path / "x.sqlite"))
    assert default_store_path() == tmp_path / "x.sqlite"
    monkeypatch.delenv("SVCFRAME_RESULTS")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_store_path() == tmp_path / "data" / "svcframe" / "results.sqlite"


def test_history_is_same_service_and_platform_and_complete(tmp_path) -> None:
    with ResultsStore(tmp_path / "r.sqlite") as store:
        done = []
        for pc in (100.0, 110.0, 105.0, 95.0):
            rid = _new_run(store)
            store.finish_run(rid, _model(pc, 400.0, 0.9), {"combined_score": 0.9})
            done.append(rid)
        _new_run(store)  # running: not history
        other = _new_run(store, platform="elsewhere")
        store.finish_run(other, _model(1.0, 1.0, 0.1), {})
        hist = store.history(done[-1])
        assert [h["id"] for h in hist] == done
        listed = store.runs(platform="plat")
        assert len(listed) == 5 and all("sample_count" in r for r in listed)

        normal = compare(store.run(done[-1]), hist)
        by = {r["quantity"]: r for r in normal}
        assert by["rpc_rate Pc"]["verdict"] == "normal" and by["rpc_rate Pc"]["count"] == 3
        assert by["rpc_rate Pc"]["percentile"] == 0.0  # 95 is below every earlier Pc
        assert by["combined score"]["value"] == 0.9

        slow = _new_run(store)
        store.finish_run(slow, _model(20.0, 400.0, 0.5), {"combined_score": 0.5})
        by = {r["quantity"]: r for r in compare(store.run(slow), store.history(slow))}
        assert by["rpc_rate Pc"]["verdict"] == "low"  # far below the whiskers of four earlier runs
        assert by["rpc_rate Ps"]["verdict"] == "normal"
        assert quantities(store.run(slow))["rpc_rate Pc"] == (20.0, "ops/s")

        png = plot_history(store.run(slow), store.history(slow), tmp_path / "h.png")
        assert png.read_bytes()[:8] == PNG
        with pytest.raises(StoreError, match="has no model"):
            plot_history(store.run(_new_run(store)), [], tmp_path / "x.png")


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """Two real (tiny) collections recorded by the CLI: one with --store, one through $SVCFRAME_RESULTS."""
    tmp = tmp_path_factory.mktemp("store")
    db = tmp / "results.sqlite"
    pipe = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # a pipe as in a batch job's log
    first = subprocess.run([*CLI, "roofline", "collect", "-o", str(tmp / "a"), "--store", str(db), *TINY],
                           capture_output=True, text=True, timeout=120, env=pipe)  # fmt: skip
    env = {**pipe, "SVCFRAME_RESULTS": str(db)}
    second = subprocess.run([*CLI, "roofline", "collect", "-o", str(tmp / "b"), *TINY, "--json"],
                            capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    return tmp, db, first, second, env


@pytest.mark.one_interpreter  # (long, and about our logic: CI's first interpreter only)
def test_collect_records_every_run(collected) -> None:
    tmp, db, first, second, _ = collected
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert "stored as run 1" in first.stdout and "outside measurement intervals" in first.stdout
    # in a pipe: progress lines on stderr as the run goes (stage, sample k/n, elapsed, ETA), the summary whole
    steps = [ln for ln in first.stderr.splitlines() if ln.startswith("roofline collect: [")]
    assert (
        steps[0].startswith("roofline collect: [1/") and "Pc rpc_rate: 1 server(s) x 1 client(s), sample 1" in steps[0]
    )
    assert all(re.search(r", elapsed \d:\d\d:\d\d, ETA (\d:\d\d:\d\d|-)$", ln) for ln in steps), first.stderr
    assert len(steps) == len(json.loads((tmp / "a" / "roofline.json").read_text())["runs"])
    assert first.stderr.splitlines()[-1].startswith("roofline collect: done in ")
    model = json.loads((tmp / "a" / "roofline.json").read_text())["metrics"]["rpc_rate"]
    pc = quantity_range(model["pc"]["min"], model["pc"]["max"], "ops/s")
    assert len([ln for ln in first.stdout.splitlines() if ln.startswith("rpc_rate ") and pc in ln]) == 1, first.stdout
    assert "…" not in first.stdout and "e+0" not in first.stdout, first.stdout
    assert "  rpc_rate: noop RPCs (no payload)" in first.stdout
    # --json: the summary as one document
    summary = json.loads(second.stdout)
    assert summary["kind"] == "svcframe-roofline-summary" and summary["run_id"] == 2
    assert summary["metrics"]["rpc_rate"]["parameters"] == "noop RPCs (no payload)"
    assert summary["model"] == str(tmp / "b" / "roofline.json") and summary["validity"]
    with ResultsStore(db) as store:
        runs = store.runs()
        assert [r["status"] for r in runs] == ["complete", "complete"]
        run = store.run(2)
        doc = json.loads((tmp / "b" / "roofline.json").read_text())
        assert run["plan"] and [s["key"] for s in run["samples"]] == run["plan"]
        assert run["model"]["metrics"] == doc["metrics"]
        assert run["summary"]["combined_score"] == pytest.approx(doc["combined_score"])
        assert run["software"]["svcframe"] and run["hardware"]["usable_cores"]
        assert run["options"]["duration_seconds"] == 0.2
        raw = store.samples(2, with_results=True)[0]["result"]
        assert raw["kind"] == "svcframe-selftest" and raw["aggregate"]["ops"] > 0


@pytest.mark.one_interpreter  # (long, and about our logic: CI's first interpreter only)
def test_history_lists_and_compares(collected) -> None:
    tmp, db, _, _, env = collected
    listing = subprocess.run(
        [*CLI, "history"], capture_output=True, text=True, timeout=60, env={**env, "COLUMNS": "80"}
    )
    assert listing.returncode == 0, listing.stderr
    assert "complete" in listing.stdout and "rpc_rate" in listing.stdout
    runs = json.loads(subprocess.run([*CLI, "history", "--json"], capture_output=True, text=True, env=env).stdout)[
        "runs"
    ]
    assert [(r["id"], r["status"], r["metrics"]) for r in runs] == [
        (1, "complete", ["rpc_rate"]),
        (2, "complete", ["rpc_rate"]),
    ]
    lines = listing.stdout.splitlines()  # COLUMNS=80 in a pipe: every row whole within 80 columns
    assert all(len(ln) <= 80 for ln in lines) and "…" not in listing.stdout
    for r in runs:
        assert any(
            ln.split()[:1] == [str(r["id"])] and "complete" in ln and f"{r['combined_score']:.3f}" in ln for ln in lines
        )
    png = tmp / "h.png"
    show = subprocess.run([*CLI, "history", "show", "latest", "-o", str(png)],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert show.returncode == 0, show.stderr
    assert "rpc_rate Pc" in show.stdout and "too little history" in show.stdout
    assert png.read_bytes()[:8] == PNG
    shown = json.loads(subprocess.run([*CLI, "history", "show", "latest", "-o", str(png), "--json"],
                                      capture_output=True, text=True, timeout=60, env=env).stdout)  # fmt: skip
    (pc,) = [r for r in shown["rows"] if r["quantity"] == "rpc_rate Pc"]
    assert shown["run"] == 2 and shown["history"] == [1] and pc["count"] == 1
    assert any(
        ln.startswith("rpc_rate Pc ") and quantity(pc["value"], "ops/s") in ln for ln in show.stdout.splitlines()
    )
    narrow = subprocess.run([*CLI, "history", "show", "latest", "-o", str(png)], capture_output=True, text=True,
                            timeout=60, env={**env, "COLUMNS": "80"}).stdout  # fmt: skip
    assert all(len(ln) <= 80 for ln in narrow.splitlines()) and "…" not in narrow  # folded at spaces, never cut
    assert sorted(show.stdout.split()) == sorted(narrow.split())
    missing = subprocess.run([*CLI, "history", "show", "42", "--store", str(db)], capture_output=True, text=True)
    assert missing.returncode != 0 and "no run '42'" in missing.stderr
    nostore = subprocess.run([*CLI, "history", "--store", str(tmp / "none.sqlite")], capture_output=True, text=True)
    assert nostore.returncode != 0 and "no results store" in nostore.stderr
