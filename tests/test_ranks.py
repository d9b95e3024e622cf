"""Ranks from the launchers' environments, and group files published by a barrier (filesystem or MPI),
with real server processes and a real ``mpiexec``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from selftest import SELFTEST_CONFIG
from svcframe.group import read_group_file
from svcframe.ranks import GroupError, RankInfo, detect, from_environment, rank_address

CLI = [sys.executable, "-m", "svcframe"]
# servers and CLI share a secret, so the admin shutdown is an authenticated call
ENV = {**os.environ, "SVCFRAME_SECRET": "test-ranks-secret"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
          "OMPI_MCA_ess_base_jobid": "77"}, RankInfo(3, 8, 1, None, "ompi", "ompi:77")),
        ({"PMIX_RANK": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_JOB_ID": "9",
          "SLURM_STEP_ID": "1", "SLURM_PROCID": "2"}, RankInfo(2, 4, 0, 2, "pmix", "slurm:9.1")),
        ({"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "1"}, RankInfo(1, 3, 1, None, "pmi")),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_JOB_ID": "9"},
         RankInfo(5, 6, 1, 2, "slurm", "slurm:9.")),
        # mpiexec inside an sbatch script: the batch step's SLURM_PROCID=0 must not win over the MPI rank
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "PMI_RANK": "2", "PMI_SIZE": "4"}, RankInfo(2, 4, None, None, "pmi")),
    ],
)  # fmt: skip
def test_rank_from_each_launcher(env, expected) -> None:
    assert from_environment(env) == expected
    assert expected.launched


@pytest.mark.parametrize(
    ("env", "message"),
    [({"PMI_RANK": "1"}, "rank 1 but no size"), ({"PMI_RANK": "4", "PMI_SIZE": "4"}, "outside 0..3"),
     ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"}, "SLURM_PROCID='x' is not an integer")],
)  # fmt: skip
def test_inconsistent_launcher_variables(env, message) -> None:
    with pytest.raises(GroupError, match=message):
        from_environment(env)


def test_no_launcher_is_rank_zero_of_one() -> None:
    assert from_environment({}) is None
    info = detect({})
    assert info == RankInfo(0, 1) and not info.launched


def test_rank_addresses() -> None:
    info = RankInfo(3, 4, local_rank=1)
    assert rank_address("tcp://0.0.0.0:5000", info) == "tcp://0.0.0.0:5001"
    assert rank_address("tcp://127.0.0.1:0", info) == "tcp://127.0.0.1:0"
    assert rank_address("unix:///tmp/s.sock", info) == "unix:///tmp/s.sock.3"
    assert rank_address("tcp://h:5000", RankInfo(0, 1)) == "tcp://h:5000"


def _wait_for(path: Path, procs: list[subprocess.Popen], within: float = 60.0) -> None:
    """Until ``path`` exists (bounded polling); fail early, with output, if a process exits."""
    deadline = time.monotonic() + within
    while not path.exists():
        for p in procs:
            if p.poll() is not None:
                out = p.stdout.read() if p.stdout else ""
                pytest.fail(f"process exited with {p.returncode} before {path} appeared:\n{out}")
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {within} s")
        time.sleep(0.02)


def _shutdown_and_wait(group: Path, procs: list[subprocess.Popen]) -> list[int]:
    shut = subprocess.run([*CLI, "shutdown", "-g", str(group)], capture_output=True, text=True, timeout=60, env=ENV)
    assert shut.returncode == 0, shut.stderr
    return [p.wait(timeout=60) for p in procs]


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
        if p.stdout:
            p.stdout.close()


def _serve_rank(rank: int, size: int, group: Path, *extra: str) -> subprocess.Popen:
    env = {**ENV, "PMI_RANK": str(rank), "PMI_SIZE": str(size), "SVCFRAME_NO_MPI4PY": "1"}
    return subprocess.Popen([*CLI, "serve", str(SELFTEST_CONFIG), "--group-file", str(group), *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def test_filesystem_barrier_publishes_when_all_ranks_are_ready(tmp_path) -> None:
    group = tmp_path / "group.json"
    procs = [_serve_rank(r, 3, group) for r in (2, 0, 1)]  # any start order
    try:
        _wait_for(group, procs)
        doc = json.loads(group.read_text())
        assert doc["metadata"]["barrier"] == "filesystem" and doc["metadata"]["size"] == 3
        members = read_group_file(group).members
        assert [m.rank for m in members] == [0, 1, 2]
        assert {m.pid for m in members} == {p.pid for p in procs}
        assert not (tmp_path / "group.json.d").exists()  # member files cleaned up
        status = subprocess.run([*CLI, "status", "-g", str(group)], capture_output=True, text=True, timeout=60, env=ENV)
        assert status.returncode == 0, status.stderr
        assert sorted(v["pid"] for v in json.loads(status.stdout).values()) == sorted(p.pid for p in procs)
        assert _shutdown_and_wait(group, procs) == [0, 0, 0]
    finally:
        _kill(procs)


@pytest.mark.one_interpreter  # (long, and about our logic: CI's first interpreter only)
def test_stale_member_file_does_not_complete_the_group(tmp_path) -> None:
    group = tmp_path / "group.json"
    (tmp_path / "group.json.d").mkdir()
    stale = {"rank": 1, "address": "tcp://127.0.0.1:1", "provider_id": 0, "pid": 1, "job": None}
    (tmp_path / "group.json.d" / "rank-1.json").write_text(json.dumps(stale))
    procs = [_serve_rank(0, 3, group, "--group-timeout-seconds", "3"), _serve_rank(2, 3, group)]
    try:
        assert procs[0].wait(timeout=60) == 1  # rank 0 gives up, naming the missing rank
        out = procs[0].stdout.read()
        assert "rank(s) [1] of 3 did not report within 3 s" in out
        assert not group.exists()
    finally:
        _kill(procs)


def _mpiexec() -> str | None:
    return shutil.which("mpiexec", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))


def _has_mpi4py() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(_mpiexec() is None, reason="no mpiexec (pip install mpich mpi4py, or apt-get install mpich)")
@pytest.mark.parametrize("barrier", ["mpi4py", "filesystem"])
def test_mpiexec_servers_publish_group_file(tmp_path, barrier) -> None:
    if barrier == "mpi4py" and not _has_mpi4py():
        pytest.skip("mpi4py is not installed (pip install mpi4py)")
    group = tmp_path / "group.json"
    env = {**ENV}
    if barrier == "filesystem":
        env["SVCFRAME_NO_MPI4PY"] = "1"
    mpiexec = _mpiexec()
    assert mpiexec is not None
    proc = subprocess.Popen([mpiexec, "-n", "3", *CLI, "serve", str(SELFTEST_CONFIG), "--group-file", str(group)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        _wait_for(group, [proc])
        doc = json.loads(group.read_text())
        assert doc["metadata"]["barrier"] == barrier
        assert doc["metadata"]["launcher"] in ("pmi", "ompi", "pmix")
        members = read_group_file(group).members
        assert [m.rank for m in members] == [0, 1, 2] and len({m.pid for m in members}) == 3
        status = subprocess.run([*CLI, "status", "-g", str(group)], capture_output=True, text=True, timeout=60, env=ENV)
        assert status.returncode == 0, status.stderr
        assert sorted(v["pid"] for v in json.loads(status.stdout).values()) == sorted(m.pid for m in members)
        assert _shutdown_and_wait(group, [proc]) == [0]
    finally:
        _kill([proc])
