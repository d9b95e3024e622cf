"""``roofline collect`` over a hostfile of three "hosts" that are all this machine (``localhost``,
``127.0.0.1`` and the host name: MPICH's Hydra starts processes on each of them locally, while it would
ssh to 127.0.0.2), with processes started by the real ``mpiexec`` of the MPICH wheel."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from conftest import alive_pids, poll_until

from selftest.collect import CollectOptions, collect, plan
from selftest.nodes import NodeError, find_launcher
from selftest.store import ResultsStore


def _mpiexec() -> str | None:
    try:
        return find_launcher("mpiexec")
    except NodeError:
        return None


def _descendants() -> set[int]:
    return {c.pid for c in psutil.Process().children(recursive=True)}


def _new_descendants(before: set[int]) -> list[int]:
    """Children of this process still running, other than those of ``before`` (earlier tests' helpers in a
    full run)."""
    return alive_pids(c.pid for c in psutil.Process().children(recursive=True) if c.pid not in before)


@pytest.mark.one_interpreter  # (long, and about our logic: CI's first interpreter only)
@pytest.mark.skipif(_mpiexec() is None, reason="no mpiexec on PATH or beside python (pip install mpich)")
def test_collect_on_three_hosts_launched_by_mpiexec(tmp_path, figures) -> None:
    before = _descendants()  # e.g. multiprocessing's resource tracker, started by an earlier test
    hosts = tmp_path / "hosts"
    # node 0 (the server node) has 2 slots: two servers under one mpiexec, published after MPI's or the
    # filesystem's barrier; Open MPI and MPICH formats mixed
    hosts.write_text(f"localhost slots=2\n127.0.0.1:1\n{socket.gethostname()} slots=1\n")
    opts = CollectOptions(
        out=tmp_path / "rl", metrics=["rpc_rate"], duration_seconds=0.2, repeats=1, warmup_iterations=3,
        saturation_depth=2, max_clients_per_core=2, grid_servers=[1], grid_clients=[2], hostfile=hosts,
        launcher="mpiexec", store=tmp_path / "r.sqlite",
    )  # fmt: skip
    steps = plan(opts)
    seen: list[str] = []
    t0 = time.monotonic()
    doc = collect(opts, lambda desc, i, n: seen.append(desc))
    wall = time.monotonic() - t0
    assert len(seen) == len(doc["runs"]) <= len(steps)  # the ramp's loads past the rate's plateau are skipped

    # (b) Pc over every pair of the 3 nodes: N(N-1)/2 = 3 pairs, one client on j against a server on i
    assert doc["pc_pairs"] == ["n0-1", "n0-2", "n1-2"]
    pc_rows = [r for r in doc["runs"] if r["stage"] == "Pc"]
    assert [(r["server_nodes"], r["client_nodes"]) for r in pc_rows] == [([0], [1]), ([0], [2]), ([1], [2])]
    assert all(r["per_client"] > 0 for r in pc_rows)
    pc = doc["metrics"]["rpc_rate"]["pc"]
    assert pc["min"] == min(r["per_client"] for r in pc_rows) and pc["max"] == max(r["per_client"] for r in pc_rows)

    # (a) saturation: node 0 fully populated (2 servers), clients from nodes 1 and 2 (2 per slot)
    ps = [r for r in doc["runs"] if r["stage"] == "Ps"]
    assert len(ps) == 1 and ps[0]["servers"] == 2 and ps[0]["clients"] == 4 and ps[0]["client_nodes"] == [1, 2]

    # processes were started by mpiexec: each found its PMI rank and size in its environment
    nodes = doc["nodes"]
    assert nodes["launcher"] == "mpiexec" and [n["name"] for n in nodes["nodes"]][:2] == ["localhost", "127.0.0.1"]
    servers = {g["node"]: g for g in nodes["processes"]["servers"]}
    assert set(servers) == {"localhost", "127.0.0.1"}  # node 2 is only ever a client node
    assert servers["localhost"]["servers"] == 2 and servers["127.0.0.1"]["servers"] == 1
    clients = {c["node"]: c for c in nodes["processes"]["clients"]}
    assert set(clients) == {"127.0.0.1", socket.gethostname()}
    for c in clients.values():
        assert c["sources"] == ["pmi"] and c["ranks"] == [0, 1] and c["size"] == 2  # MPICH's PMI_RANK / PMI_SIZE
    for g in servers.values():
        assert g["launcher"] == "pmi" and g["barrier"] in ("mpi4py", "filesystem")
        # the group file was written after every member was ready, and every member answered at once
        assert g["last_ready"] is not None and g["created"] >= g["last_ready"]
        assert g["answered"] == g["servers"]

    # the store has the run with its node set; nothing outlives the collection
    with ResultsStore(tmp_path / "r.sqlite") as store:
        run = store.run(doc["run_id"])
    assert run["status"] == "complete" and len(run["samples"]) == len(doc["runs"])
    assert run["nodes"]["launcher"] == "mpiexec" and [n["slots"] for n in run["nodes"]["nodes"]] == [2, 1, 1]
    assert run["model"]["pc_pairs"] == ["n0-1", "n0-2", "n1-2"]
    assert json.loads((tmp_path / "rl" / "roofline.json").read_text())["run_id"] == doc["run_id"]
    poll_until(lambda: not _new_descendants(before), what="every process the collection started to exit")
    groups = [p for p in (tmp_path / "rl" / "launch").glob("servers-node*.json") if ".config." not in p.name]
    assert groups == []  # group files removed at teardown
    o = doc["overhead"]
    figures.record("collect, 3 mpiexec hosts: wall", wall, "s")
    figures.record("collect, 3 mpiexec hosts: node 0 barrier", servers["localhost"]["barrier"])
    figures.record("collect, 3 mpiexec hosts: outside measurement", 100 * o["outside_fraction"], "%")
    assert wall < 60


@pytest.mark.one_interpreter  # (long, and about our logic: CI's first interpreter only)
@pytest.mark.skipif(_mpiexec() is None, reason="no mpiexec on PATH or beside python (pip install mpich)")
def test_ctrl_c_ends_mpiexec_processes_and_resume_completes(tmp_path) -> None:
    from test_collect_more import _samples

    hosts = tmp_path / "hosts"
    hosts.write_text(f"localhost\n127.0.0.1\n{socket.gethostname()}\n")
    db = tmp_path / "r.sqlite"
    cmd = [sys.executable, "-m", "svcframe", "roofline", "collect", "-o", str(tmp_path / "out"), "--store", str(db),
           "--metric", "rpc_rate", "--duration-seconds", "0.3", "--repeats", "2", "--grid-servers", "1",
           "--grid-clients", "1,2", "--hostfile", str(hosts), "--saturation-depth", "4",
           "--max-clients-per-core", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _samples(db, at_least=1)
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert len(children) >= 6  # mpiexec, its proxies and the servers and clients they started
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    poll_until(lambda: not alive_pids(children), within=15.0,
               what="the launchers, servers and clients of the interrupted collect to exit")  # fmt: skip
    with ResultsStore(db) as store:
        run = store.run(1)
        assert run["status"] == "interrupted" and 0 < len(run["samples"]) < len(run["plan"])
    resumed = subprocess.run([sys.executable, "-m", "svcframe", "roofline", "collect", "--store", str(db),
                              "--resume", "latest"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    with ResultsStore(db) as store:
        run = store.run(1)
        keys = [s["key"] for s in run["samples"]]
        assert run["status"] == "complete" and keys == [k for k in run["plan"] if k in keys]  # in plan order
        assert {k for k in run["plan"] if not k.startswith("ramp/")} <= set(keys)  # only ramp loads are skipped
        assert run["model"]["pc_pairs"] == ["n0-1", "n0-2", "n1-2"]
