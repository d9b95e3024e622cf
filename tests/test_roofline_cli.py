"""``svcframe roofline place | io | workflow`` as a user runs them (``python -m svcframe`` in a pipe): workloads
measured by real ``selftest run --rpc`` runs against a kv server process, and a running service's statistics,
placed on a stored platform; the tables (80 columns, nothing cut) against the JSON, the PNGs as files, the
placement in the report, and every user error as one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from roofline_kit import assert_png, platform_doc

from selftest.roofline import Platform, Workload, WorkloadPoint, place
from selftest.store import ResultsStore
from svcframe.config import parse_config
from svcframe.launch import Launch
from svcframe.units import quantity

# the roofline commands and plots: our logic, not the Python version's (CI's first interpreter only)
pytestmark = pytest.mark.one_interpreter


ROOT = Path(__file__).resolve().parent.parent
# Pc 20,000 and Ps 40,000 calls/s (ridge 1/2); bandwidth Pc 1, Ps 0.5 GiB/s; storage IOPS and bandwidth.
PEAKS = {"rpc_rate": (20_000.0, 40_000.0), "bandwidth": (1.0, 0.5), "storage_iops": (4_000.0, 8_000.0),
         "storage_bandwidth": (0.5, 0.25)}  # fmt: skip


def cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``svcframe ARGS`` in a pipe with ``$COLUMNS`` at 80, as under an 80-column terminal: tables and lines of
    text fold to it (in a pipe without it, a row or a line of text stays one line)."""
    return subprocess.run([sys.executable, "-m", "svcframe", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env={**os.environ, "COLUMNS": "80", **(env or {})})  # fmt: skip


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    """The output of a command that succeeded, whose lines fit in 80 columns (but for the test's own long
    temporary paths, which a user's would not have), nothing cut."""
    assert proc.returncode == 0, proc.stderr
    lines = [re.sub(r"/tmp/pytest-of-[^/]+/pytest-\d+", "/tmp", line) for line in proc.stdout.splitlines()]
    assert all(len(line) <= 80 for line in lines), "\n".join(line for line in lines if len(line) > 80)
    assert "…" not in proc.stdout, proc.stdout
    return proc.stdout


def cells(line: str) -> list[str]:
    """The cells of a table row printed in a pipe (columns two spaces apart or more; ``4.99 k`` is one cell)."""
    return re.split(r"\s{2,}", line.strip())


def one_clear_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("svcframe: error: "), proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A results store holding one complete run whose model is PEAKS (two one-slot nodes)."""
    path = tmp_path_factory.mktemp("store") / "results.sqlite"
    doc = platform_doc(PEAKS, slots=(1, 1))
    with ResultsStore(path) as st:
        rid = st.create_run(kind="svcframe-roofline", service="selftest", platform="here", host="h",
                            options=doc["options"], environment={}, hardware={}, software={}, plan=[])  # fmt: skip
        st.finish_run(rid, model={"metrics": doc["metrics"], "nodes": doc["nodes"]}, summary={})
    return path, rid


@pytest.fixture(scope="module")
def kv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """A kv server process (store at id 1, self-test at id 2), its group file, and the results of two real
    ``selftest run --rpc store:put`` runs (1 and 2 client processes)."""
    tmp = tmp_path_factory.mktemp("kv")
    cfg = parse_config({
        "libraries": ["providers.kv", "selftest.provider"],
        "providers": [
            {"name": "store", "type": "kv", "provider_id": 1,
             "config": {"path": str(tmp / "kv.sqlite"), "durability": "fast"}},
            {"name": "selftest", "type": "selftest", "provider_id": 2},
        ],
    })  # fmt: skip
    with Launch(cfg, 1, group_file=tmp / "group.json") as job:
        results = []
        for clients in (1, 2):
            out = tmp / f"put-1x{clients}.json"
            proc = cli("selftest", "run", "-g", str(tmp / "group.json"), "--rpc", "store:put", "--arg-generator",
                       "selftest.generators:kv_put", "--arg-option", "value_bytes=512", "--clients", str(clients),
                       "--duration-seconds", "0.3", "--warmup-iterations", "3", "-o", str(out))  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            results.append(out)
        assert job.members
        yield tmp / "group.json", results[0], results[1]


def test_place_two_rpc_runs_table_json_png_and_the_report(store: tuple[Path, int], kv: Any, tmp_path: Path) -> None:
    store_path, rid = store
    _, put1, put2 = kv
    out = ok(cli("roofline", "place", str(put1), str(put2), "--store", str(store_path), "-o", str(tmp_path / "pl")))
    doc = json.loads((tmp_path / "pl" / "placement.json").read_text())
    lines = out.splitlines()
    assert lines[0] == f"kv put (store:put) on run {rid}: selftest on here, max ceilings"
    assert lines[1].split() == ["SxC", "X", "calls/s", "roof", "headroom", "limit", "region", "score"]
    for line, point in zip(lines[2:4], doc["points"], strict=True):  # the table says what the JSON holds
        row = cells(line)
        assert row[:2] == [f"1x{point['clients']}", "1" if point["clients"] == 1 else "1/2"]
        assert row[2] == quantity(point["rate_per_client_ops_per_second"])  # calls/s in one notation: 159, 4.99 k
        assert row[3] == "20 k" and point["attainable_ops_per_second"] == pytest.approx(20_000)
        assert row[4] == f"{point['headroom']:.3g}x"
        assert row[5:7] == ["RPC rate", "client-bound"]
    # the server and the clients shared this host's cores: more processes than cores is marked, not claimed
    results = [json.loads(p.read_text()) for p in (put1, put2)]
    cores = results[0]["environment"]["usable_cores"]
    shared = [(1 + clients) / cores > 1 for clients in (1, 2)]
    assert [p["oversubscribed"] for p in doc["points"]] == shared
    assert [line.endswith("*") for line in lines[2:4]] == shared
    flat = " ".join(out.split())  # wrapped lines joined
    assert (f"{sum(shared)} excluded (*: more than one process per core)" in flat) == any(shared)
    assert [p["bytes_per_call"] for p in doc["points"]] == [r["rpc"]["bytes_per_call"] for r in results]
    assert f"kept with run {rid} in {store_path}: svcframe report {rid}" in flat
    assert_png(tmp_path / "pl" / "placement.png")
    # the workload written beside it places again, to the same figures (--json: the document, no table)
    again = json.loads(ok(cli("roofline", "place", str(tmp_path / "pl" / "workload.json"), "--model", str(rid),
                              "--store", str(store_path), "--json", "--no-store")))  # fmt: skip
    assert again["points"] == doc["points"]
    with ResultsStore(store_path) as st:
        kept = st.placements(rid)
    assert [k["workload"] for k in kept] == ["kv put"] and kept[0]["points"] == doc["points"]
    page = tmp_path / "report.html"
    assert ok(cli("report", str(rid), "--store", str(store_path), "-o", str(page))).strip() == f"report: {page}"
    text = page.read_text()
    assert "<h2>Workloads placed on this platform</h2>" in text and "<h3>kv put (store:put), placed" in text
    assert text.count("data:image/png;base64,") >= 3  # two rooflines and the placement


def test_place_on_a_roofline_json_file_with_the_bandwidth_limit(tmp_path: Path) -> None:
    model = tmp_path / "roofline.json"
    model.write_text(json.dumps(platform_doc(PEAKS)))
    workload = Workload(name="blob put 1 MiB", rpc="blobs:put", points=[
        WorkloadPoint(servers=1, clients=4, rate_per_client_ops_per_second=100.0, bytes_per_call=2**20),
        WorkloadPoint(servers=4, clients=4, rate_per_client_ops_per_second=900.0, bytes_per_call=2**20)])  # fmt: skip
    (tmp_path / "w.json").write_text(workload.model_dump_json())
    out = ok(cli("roofline", "place", str(tmp_path / "w.json"), "--model", str(model), "-o", str(tmp_path / "o")))
    expected = place(Platform.load(model), workload)
    rows = [cells(line) for line in out.splitlines()[2:4]]
    # X = 1/4 is server-bound: 0.5 GiB/s x 1/4 per client over 1 MiB per call = 128 calls/s; X = 1: 512
    assert [r[3] for r in rows] == ["128", "512"] and [r[5] for r in rows] == ["bandwidth", "bandwidth"]
    assert [r[6] for r in rows] == ["server-bound", "client-bound"]
    assert [p["attainable_ops_per_second"] for p in expected["points"]] == pytest.approx([128, 512])
    finding = "- 1x4: server-bound (X < X* = 1): up to 4 servers for 4 clients raise the roof"
    assert finding in " ".join(out.split())
    # in a pipe without $COLUMNS (a batch job's log): the same words, each finding one line
    piped = cli("roofline", "place", str(tmp_path / "w.json"), "--model", str(model), "-o", str(tmp_path / "o"),
                env={"COLUMNS": ""})  # fmt: skip
    assert piped.returncode == 0 and sorted(piped.stdout.split()) == sorted(out.split())
    assert finding in piped.stdout.splitlines()
    assert "kept with run" not in out  # a file model: nothing to keep it with
    assert_png(tmp_path / "o" / "placement.png")


def test_place_from_a_running_services_statistics(kv: Any, store: tuple[Path, int], tmp_path: Path) -> None:
    group, _, _ = kv
    store_path, _ = store
    stop = threading.Event()
    calls = _put_in_background(group, stop)
    try:
        proc = cli("roofline", "place", "--from-service", "-g", str(group), "--rpc", "store:put", "--window-seconds",
                   "1", "--clients", "1", "--store", str(store_path), "--no-store", "--json")  # fmt: skip
    finally:
        stop.set()
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("reading kv put on 1 server(s) for 1 s")
    doc = json.loads(proc.stdout)
    (point,) = doc["points"]
    assert (point["servers"], point["clients"]) == (1, 1)
    assert point["rate_per_client_ops_per_second"] > 0 and calls[0] > 0
    assert point["bytes_per_call"] == pytest.approx(len(_PUT_VALUE) + 20, abs=12)  # key + value in msgpack
    assert point["oversubscribed"] is False  # unknown from statistics, and the notes say so
    assert any("processes per core are unknown from statistics" in n for n in doc["notes"])
    assert not any("lower bound" in n for n in doc["notes"])  # --clients given
    lower = cli("roofline", "place", "--from-service", "-g", str(group), "--rpc", "1:put", "--window-seconds",
                "0.2", "--model", str(store[1]), "--store", str(store_path), "--no-store")  # fmt: skip
    assert lower.returncode == 1 and "Traceback" not in lower.stderr  # the progress line, then the error
    (error,) = lower.stderr.splitlines()[1:]
    assert re.fullmatch(r"svcframe: error: no completed call of 1:put on 1 server\(s\) in the 0\.2\d* s window: "
                        r"is the workload running\?", error), error  # fmt: skip


_PUT_VALUE = bytes(300)


def _put_in_background(group: Path, stop: threading.Event) -> list[int]:
    """kv puts from this process until ``stop``, started once the first put returned (a condition, not a sleep);
    returns [calls so far], updated as they complete."""
    from providers.kv import KVClient
    from svcframe.engine import Engine
    from svcframe.group import read_group_file
    from svcframe.loops import run

    address = read_group_file(group).select([0])[0].address
    calls = [0]
    started = threading.Event()

    async def go() -> None:
        async with Engine(None) as engine:
            kv = KVClient(engine, address, 1)
            while not stop.is_set():
                await kv.put(f"bg-{calls[0]}", _PUT_VALUE)
                calls[0] += 1
                started.set()

    thread = threading.Thread(target=lambda: run(go()), daemon=True)
    thread.start()
    assert started.wait(30), "the background workload did not start"
    return calls


def test_io_rooflines_with_workloads_counts_and_samples(store: tuple[Path, int], kv: Any, tmp_path: Path) -> None:
    store_path, rid = store
    _, put1, _ = kv
    out = ok(cli("roofline", "io", str(put1), "--store", str(store_path), "--counts",
                 "storage:checkpoint=1000,4096000000,10", "-o", str(tmp_path / "io")))  # fmt: skip
    doc = json.loads((tmp_path / "io" / "io.json").read_text())
    network, storage = doc["rooflines"]["network"], doc["rooflines"]["storage"]
    # per server process: psi = Ps of rpc_rate, kappa = Ps of bandwidth; ridge = psi / kappa (Zhu eq. 3)
    assert network["psi_ops_per_second"] == 40_000 and network["kappa_bytes_per_second"] == 0.5 * 2**30
    assert network["ridge_intensity_ops_per_byte"] == pytest.approx(40_000 / (0.5 * 2**30))
    assert storage["psi_ops_per_second"] == 8_000
    first = next(cells(line) for line in out.splitlines() if line.startswith("network "))
    assert first[1:5] == [
        "40 k ops/s",
        "0.500 GiB/s",
        f"{40_000 / 2**29:.3g}",
        "13.1 KiB",
    ]  # psi, kappa (GiB/s, as plotted), ridge
    (kv_point,) = doc["points"]["network"]
    result = json.loads(put1.read_text())
    assert kv_point["label"] == "kv put 1x1 (put-1x1)"
    assert kv_point["intensity_ops_per_byte"] == pytest.approx(1 / result["rpc"]["bytes_per_call"])
    (ckpt,) = doc["points"]["storage"]  # 1000 ops of 4,096,000 bytes in 10 s
    assert ckpt["ops_per_second"] == 100 and ckpt["region"] == "bandwidth-bound"
    assert doc["application_scores"]["checkpoint"] == pytest.approx(ckpt["score"])
    assert "on the network roofline:" in out and "on the storage roofline:" in out
    assert_png(tmp_path / "io" / "io.png")
    with_samples = json.loads(ok(cli("roofline", "io", "--model", str(rid), "--store", str(store_path), "--samples",
                                     "--side", "client", "--json")))  # fmt: skip
    assert with_samples["side"] == "client" and with_samples["rooflines"]["network"]["psi_ops_per_second"] == 20_000


def test_workflow_from_a_file_and_from_flags(store: tuple[Path, int], tmp_path: Path) -> None:
    store_path, rid = store
    (tmp_path / "runs.json").write_text(json.dumps([{"label": "one", "parallel_tasks": 1, "makespan_seconds": 2.0}]))
    out = ok(cli("roofline", "workflow", str(ROOT / "examples" / "kv-workflow.json"), "--runs",
                 str(tmp_path / "runs.json"), "--run", "2:8", "--store", str(store_path), "-o", str(tmp_path / "wf")))  # fmt: skip
    doc = json.loads((tmp_path / "wf" / "workflow.json").read_text())
    assert doc["workflow"] == "kv write then read" and doc["roofline"]["wall"] == 1  # one client core
    assert [r["label"] for r in doc["runs"]] == ["one", "2 at once"]
    assert doc["runs"][1]["beyond_wall"] and doc["runs"][1]["tasks_per_second"] == 16 / 8
    flat = " ".join(out.split())
    assert "run 2 at once: 2 parallel, 2 tasks/s against a roof of" in flat and "beyond the wall" in flat
    # 40 RPCs per task at R(1) = min(Pc, Ps) = 20,000 calls/s: 2 ms per task; 40,000 x 1 server / 40 = 1,000 tasks/s
    words = [" ".join(line.split()) for line in out.splitlines()]
    assert "node 2 ms/task node: RPC rate 20,000 ops/s per client process" in words
    assert "system 1 k tasks/s system: RPC rate Ps 40,000 ops/s x 1 servers" in words
    assert_png(tmp_path / "wf" / "workflow.png")
    flags = json.loads(ok(cli("roofline", "workflow", "--servers", "2", "--parallel-tasks", "4", "--tasks", "10",
                              "--rpcs-per-task", "100", "--available-client-processes", "8", "--target-makespan-seconds",
                              "1", "--target-throughput", "3", "--model", str(rid), "--store", str(store_path),
                              "--json")))  # fmt: skip
    assert flags["roofline"]["wall"] == 8 and flags["attainable_tasks_per_second"] == pytest.approx(800.0)
    assert flags["attainable_zone"] == "good makespan, good throughput" and flags["spec"]["stages"][0]["tasks"] == 10


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["place"], "give FILES (self-test results or workloads) or --from-service -g GROUP --rpc PROVIDER:NAME"),
        (["place", "{results}", "--model", "x.json"], "x.json: cannot read a platform roofline model:"),
        (["place", "missing.json", "--model", "x.json"], "missing.json: cannot read a workload:"),  # files first
        (["place", "{results}", "--model", "{results}"], "is not a platform roofline model"),
        (["place", "{results}", "--model", "99"], "no run '99' in"),
        (["place", "{results}", "--rpc", "1:put"], "--rpc, --clients, -g and --ranks go with --from-service"),
        (["place", "--from-service", "-g", "{group}"], "--from-service needs --rpc PROVIDER:NAME"),
        (["place", "--from-service", "-g", "{group}", "--rpc", "store:nope", "--window-seconds", "0.1"],
         "--rpc store:nope: provider 'store' (1) at"),
        (["place", "{notjson}"], "notjson.txt: cannot read a workload:"),
        (["place", "{results}", "{blob}"], "the files measure different RPCs (blobs:put, store:put)"),
        (["place", "{badworkload}"], "bad.json: points: List should have at least 1 item"),
        (["io", "--counts", "network:x=1,2"], "--counts 'network:x=1,2': expected ROOFLINE:LABEL=OPERATIONS,BYTES"),
        (["io", "--counts", "disk:x=1,2,3"], "--counts 'disk:x=1,2,3': ROOFLINE is one of storage, network"),
        (["workflow"], "give WORKFLOW.json, or --servers --parallel-tasks --tasks and --rpcs-per-task"),
        (["workflow", "--servers", "1", "--parallel-tasks", "1", "--tasks", "2", "--rpcs-per-task", "1", "--run",
          "x"], "--run 'x': expected PARALLEL:MAKESPAN[:LABEL]"),
        (["workflow", "{badworkflow}"], "wf.json: stages[0].tasks: Input should be greater than or equal to 1"),
        (["workflow", "{badworkflow}", "--tasks", "3"], "--tasks, --rpcs-per-task and --bytes-per-task describe"),
    ],
)  # fmt: skip
def test_user_errors_are_one_line(
    args: list[str], expected: str, store: tuple[Path, int], kv: Any, tmp_path: Path
) -> None:
    store_path, _ = store
    group, results, _ = kv
    (tmp_path / "notjson.txt").write_text("no")
    (tmp_path / "bad.json").write_text(json.dumps({"name": "w", "points": []}))
    (tmp_path / "wf.json").write_text(json.dumps({"name": "w", "servers": 1, "parallel_tasks": 1, "stages": [
        {"name": "s", "tasks": 0, "rpcs_per_task": 1, "bytes_per_task": 0}]}))  # fmt: skip
    blob = dict(json.loads(results.read_text()))
    blob["rpc"] = {**blob["rpc"], "requested": "blobs:put", "name": "put", "type": "blob"}
    (tmp_path / "blob.json").write_text(json.dumps(blob))
    names = {"results": str(results), "group": str(group), "notjson": str(tmp_path / "notjson.txt"),
             "blob": str(tmp_path / "blob.json"), "badworkload": str(tmp_path / "bad.json"),
             "badworkflow": str(tmp_path / "wf.json")}  # fmt: skip
    line = one_clear_line(cli("roofline", *(a.format(**names) for a in args), "--store", str(store_path)))
    assert expected in line, line


def test_without_matplotlib_a_plot_is_one_line_and_the_json_is_kept(store: tuple[Path, int], tmp_path: Path) -> None:
    store_path, _ = store
    code = "import sys; sys.modules['matplotlib'] = None; from svcframe.cli import main; main(prog_name='svcframe')"
    args = ["roofline", "workflow", "--servers", "1", "--parallel-tasks", "1", "--tasks", "2", "--rpcs-per-task",
            "5", "--store", str(store_path), "-o", str(tmp_path / "wf")]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=60)
    line = one_clear_line(proc)
    assert "plots need matplotlib, an optional dependency: pip install 'svcframe[plot]'" in line
    assert (tmp_path / "wf" / "workflow.json").exists() and not (tmp_path / "wf" / "workflow.png").exists()


def test_an_older_store_gains_the_placements_table(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    with ResultsStore(path) as st:
        rid = st.create_run(kind="k", service="s", platform="p", host="h", options={}, environment={}, hardware={},
                            software={}, plan=[])  # fmt: skip
    db = sqlite3.connect(path)
    db.execute("DROP TABLE placements")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    with ResultsStore(path) as st:
        st.add_placement(rid, {"workload": "w", "points": []})
        assert [p["workload"] for p in st.placements(rid)] == ["w"]
        assert st.run(rid)["placements"][0]["workload"] == "w"
