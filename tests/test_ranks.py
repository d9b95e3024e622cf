"""Ranks from the launchers' environments, and group files published by a barrier (filesystem or MPI),
with real server processes and a real ``mpiexec``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from selftest import SELFTEST_CONFIG
from svcframe.group import read_group_file
from svcframe.ranks import (
    GroupError,
    RankInfo,
    address_problem,
    check_reachable,
    detect,
    from_environment,
    rank_address,
)

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
        # srun --mpi=pmi2: the job from PMI_JOBID, the node-local rank and node from Slurm, the step's nodes
        ({"PMI_RANK": "1", "PMI_SIZE": "2", "PMI_JOBID": "4.0", "PMI_FD": "11", "SLURM_PROCID": "1",
          "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_JOB_ID": "4", "SLURM_STEP_ID": "0",
          "SLURM_STEP_NUM_NODES": "1"}, RankInfo(1, 2, 1, 0, "pmi", "pmi:4.0", 1)),
        # MPICH's mpiexec inside an allocation (its proxies started by srun): Hydra's local rank wins
        ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
          "SLURM_JOB_ID": "9", "SLURM_STEP_ID": "2", "SLURM_STEP_NUM_NODES": "2"},
         RankInfo(3, 4, 1, 1, "pmi", "slurm:9.2", 2)),
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


def test_addresses_other_nodes_cannot_reach() -> None:
    assert "loopback" in address_problem("tcp://127.0.0.1:0")
    assert "loopback" in address_problem("tcp://localhost:5000")
    assert "loopback" in address_problem("tcp://[::1]:5000")
    assert "unix socket" in address_problem("unix:///tmp/s.sock")
    assert "its host no-such-node.invalid does not resolve on" in address_problem("tcp://no-such-node.invalid:0")
    for reachable in ("tcp://10.200.0.11:0", "tcp://*:0", "tcp://0.0.0.0:7000", "tcp://[::]:0"):
        assert address_problem(reachable) is None, reachable


def test_a_loopback_address_is_refused_only_in_a_multi_node_job() -> None:
    two_nodes = RankInfo(2, 4, 0, 1, "slurm", "slurm:5.0", nodes=2)
    with pytest.raises(GroupError, match=r"rank 2 of 4: tcp://127.0.0.1:0 is a loopback address.* a job step over "
                                         r"2 nodes: listen on an address the other nodes reach: engine.address "
                                         r"tcp://\*:0"):  # fmt: skip
        check_reachable("tcp://127.0.0.1:0", two_nodes)
    check_reachable("tcp://127.0.0.1:0", RankInfo(2, 4, 0, 0, "slurm", "slurm:5.0", nodes=1))
    check_reachable("tcp://127.0.0.1:0", two_nodes, multi_node=False)
    with pytest.raises(GroupError, match="a multi-node job"):
        check_reachable("unix:///tmp/s", RankInfo(0, 2), multi_node=True)


def test_rank_zero_refuses_members_on_several_hosts_at_loopback_addresses() -> None:
    """MPICH's mpiexec says nothing of nodes: rank 0 sees them in the members' hosts."""
    from svcframe.group import Member
    from svcframe.ranks import _spanning_problem

    local = [Member(0, "tcp://127.0.0.1:1", 0, 1, "a"), Member(1, "tcp://127.0.0.1:2", 0, 2, "a")]
    assert _spanning_problem(local) is None  # one host: loopback is fine
    spread = [Member(0, "tcp://10.0.0.1:1", 0, 1, "a"), Member(1, "tcp://127.0.0.1:2", 0, 2, "b")]
    problem = _spanning_problem(spread)
    assert problem is not None and "run on 2 hosts" in problem and "rank 1 on b: tcp://127.0.0.1:2" in problem


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


def _serve_rank(
    rank: int, size: int, group: Path | None, *extra: str, config: Path = SELFTEST_CONFIG, **env_extra: str
) -> subprocess.Popen:
    """One rank of an MPICH-style launch (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID), the filesystem barrier."""
    env = {**ENV, "PMI_RANK": str(rank), "PMI_SIZE": str(size), "MPI_LOCALRANKID": str(rank),
           "SVCFRAME_NO_MPI4PY": "1", **env_extra}  # fmt: skip
    grouping = ["--group-file", str(group)] if group is not None else []
    return subprocess.Popen([*CLI, "serve", str(config), *grouping, *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def _free_port_pair() -> tuple[int, socket.socket]:
    """A port P with P + 1 free too, and a socket holding P + 1 (close it to free it)."""
    for _ in range(100):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        holder = socket.socket()
        try:
            holder.bind(("127.0.0.1", port + 1))
        except OSError:
            holder.close()
            continue
        holder.listen()
        return port, holder
    raise AssertionError("no two consecutive free ports")


def _fixed_port_config(tmp_path: Path, port: int) -> Path:
    doc = json.loads(SELFTEST_CONFIG.read_text())
    doc.setdefault("engine", {})["address"] = f"tcp://127.0.0.1:{port}"
    path = tmp_path / "fixed.json"
    path.write_text(json.dumps(doc))
    return path


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


def test_ranks_take_their_own_ports_without_a_group_file(tmp_path) -> None:
    """srun -n 2 svcframe serve fixed-port.json: each rank offsets the fixed port by its node-local rank, with
    or without --group-file (they bound the same port twice)."""
    port, holder = _free_port_pair()
    holder.close()
    config = _fixed_port_config(tmp_path, port)
    procs = [_serve_rank(r, 2, None, config=config) for r in (0, 1)]
    try:
        ready = [json.loads(p.stdout.readline() or "{}") for p in procs]  # one readiness line each
        assert sorted(r.get("address") for r in ready) == [f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"], (
            ready
        )
        for p in procs:
            p.send_signal(signal.SIGTERM)
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
    finally:
        _kill(procs)


def test_a_rank_that_fails_ends_the_filesystem_barrier_at_once(tmp_path) -> None:
    """Rank 1's port is taken: it tells the others (F.d/abort.json), and ranks 0 and 2 stop waiting and exit
    naming it and its reason, long before rank 0's timeout (600 s here); nothing is left behind."""
    port, holder = _free_port_pair()
    group = tmp_path / "group.json"
    config = _fixed_port_config(tmp_path, port)
    procs = [_serve_rank(r, 3, group, "--group-timeout-seconds", "600", config=config) for r in (0, 1, 2)]
    try:
        codes = [p.wait(timeout=60) for p in procs]
        outs = [p.stdout.read() for p in procs]
    finally:
        holder.close()
        _kill(procs)
    assert codes == [1, 1, 1], outs
    assert "rank 1 of 3 (pmi) failed to start; the other ranks stop waiting" in outs[1]
    assert f"group {group}: rank 1 on " in outs[0] and "address already in use" in outs[0], outs[0]
    assert "rank 2 of 3: the group" in outs[2] and "was abandoned: rank 1 on" in outs[2], outs[2]
    assert not group.exists() and not (tmp_path / "group.json.d").exists()


def test_a_loopback_address_in_a_multi_node_step_is_refused_with_a_hint(tmp_path) -> None:
    """srun -N 2 with the shipped loopback config: each rank refuses at once, saying why and what to do,
    instead of rank 0 timing out on members it cannot reach."""
    group = tmp_path / "group.json"
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
             "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2", "SVCFRAME_NO_MPI4PY": "1"}  # fmt: skip
    env = {k: v for k, v in ENV.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    done = subprocess.run([*CLI, "serve", str(SELFTEST_CONFIG), "--group-file", str(group)], env={**env, **slurm},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "rank 1 of 2: tcp://127.0.0.1:0 is a loopback address" in lines[0]
    assert "a job step over 2 nodes" in lines[0] and "engine.address tcp://*:0" in lines[0]


def test_a_stale_group_file_is_never_trusted_and_the_new_one_is_removed_at_exit(tmp_path) -> None:
    """A group file left by an earlier run: `svcframe wait` does not take it for the group (its members do not
    answer as theirs), rank 0 replaces it, the wait returns the new servers, and rank 0 removes its file as
    it exits."""
    group = tmp_path / "group.json"
    group.write_text(json.dumps({"members": [{"rank": 0, "address": "tcp://127.0.0.1:1", "provider_id": 0,
                                              "pid": 1}], "metadata": {"created": 1.0}}))  # fmt: skip
    waiter = subprocess.Popen([*CLI, "wait", "-g", str(group), "--timeout-seconds", "120"], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    procs: list[subprocess.Popen] = []
    try:
        procs = [_serve_rank(r, 2, group) for r in (0, 1)]
        out, err = waiter.communicate(timeout=120)
        assert waiter.returncode == 0, err
        statuses = json.loads(out)
        assert sorted(s["pid"] for s in statuses.values()) == sorted(p.pid for p in procs)
        assert _shutdown_and_wait(group, procs) == [0, 0]
        assert not group.exists()
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
        _kill(procs)


def test_wait_names_the_members_that_do_not_answer(tmp_path) -> None:
    group = tmp_path / "group.json"
    group.write_text(json.dumps({"members": [{"rank": 0, "address": "tcp://127.0.0.1:1", "provider_id": 0}]}))
    done = subprocess.run([*CLI, "wait", "-g", str(group), "--timeout-seconds", "0.5"], env=ENV,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith(f"svcframe: error: group file {group}: 1 of 1 member(s) do not answer as theirs")
    assert "rank 0 at tcp://127.0.0.1:1: ConnectionLost" in done.stderr and "Traceback" not in done.stderr
    missing = subprocess.run([*CLI, "wait", "-g", str(tmp_path / "none.json"), "--timeout-seconds", "0.2"], env=ENV,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 1 and "did not appear within 0.2 s" in missing.stderr, missing.stderr


def test_pmix_with_an_mpi_that_does_not_speak_it_uses_the_filesystem() -> None:
    """srun --mpi=pmix with MPICH's wheel: MPI_Init would abort every rank ('unsupported PMI version PMIx');
    the barrier is chosen before MPI is initialised, from what the library says it is."""
    if not _has_mpi4py():
        pytest.skip("mpi4py is not installed (pip install mpi4py)")
    probe = (
        "import mpi4py, sys\n"
        "from svcframe.ranks import RankInfo, choose_barrier, load_mpi\n"
        "mpi, why = load_mpi()\n"
        "if mpi is None: print('skip', why); sys.exit(0)\n"
        "comm, barrier = choose_barrier(RankInfo(1, 2, source='pmix'), env={'PMIX_RANK': '1'})\n"
        "print(barrier, 'pmix' in mpi.Get_library_version().lower() or 'Open MPI' in mpi.Get_library_version(),"
        " mpi.Is_initialized())\n"
    )
    env = {k: v for k, v in ENV.items() if k != "SVCFRAME_NO_MPI4PY"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    if done.stdout.startswith("skip"):
        pytest.skip(done.stdout)
    barrier, speaks_pmix, initialised = done.stdout.split()
    assert (barrier, initialised) == (("mpi", "True") if speaks_pmix == "True" else ("filesystem", "False"))


@pytest.mark.skipif(_mpiexec() is None, reason="no mpiexec (pip install mpich mpi4py, or apt-get install mpich)")
@pytest.mark.parametrize("barrier", ["mpi", "filesystem"])
def test_a_taken_port_under_mpiexec_ends_the_job_and_names_the_rank(tmp_path, barrier) -> None:
    """Rank 1 cannot bind its port: with MPI's barrier the job is aborted at once (rank 0 spun in a gather and
    rank 1 blocked in MPI_Finalize, past --group-timeout-seconds), with the filesystem's the others stop
    waiting; either way the output names rank 1 and no group file appears."""
    if barrier == "mpi" and not _has_mpi4py():
        pytest.skip("mpi4py is not installed (pip install mpi4py)")
    port, holder = _free_port_pair()
    group = tmp_path / "group.json"
    config = _fixed_port_config(tmp_path, port)
    mpiexec = _mpiexec()
    assert mpiexec is not None
    env = {k: v for k, v in ENV.items() if k != "SVCFRAME_NO_MPI4PY"}
    try:
        done = subprocess.run([mpiexec, "-n", "3", *CLI, "serve", str(config), "--group-file", str(group), "--barrier",
                               barrier, "--group-timeout-seconds", "600"], env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    finally:
        holder.close()
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "rank 1 of 3 (pmi) failed to start" in output and "address already in use" in output, output
    if barrier == "mpi":
        assert "aborting the MPI job" in output
    assert not group.exists() and not (tmp_path / "group.json.d").exists()


def test_an_mpi_init_that_never_returns_ends_the_rank_and_names_it(tmp_path) -> None:
    """A PMI server that takes MPICH's first request and never answers (as a stalled PMI exchange does) holds
    MPI_Init with no limit of its own: the rank is ended after --group-timeout-seconds with one line naming it,
    instead of hanging, silent, until the job's time limit."""
    if not _has_mpi4py():
        pytest.skip("mpi4py is not installed (pip install mpi4py)")
    pmi_server, pmi_client = socket.socketpair()
    env = {k: v for k, v in ENV.items()
           if k != "SVCFRAME_NO_MPI4PY" and not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_"))}  # fmt: skip
    env.update(PMI_RANK="1", PMI_SIZE="2", PMI_FD=str(pmi_client.fileno()))
    with pmi_server, pmi_client:
        done = subprocess.run([*CLI, "serve", str(SELFTEST_CONFIG), "--group-file", str(tmp_path / "group.json"),
                               "--barrier", "mpi", "--group-timeout-seconds", "3"], env=env, capture_output=True,
                              text=True, timeout=120, pass_fds=[pmi_client.fileno()])  # fmt: skip
        asked = pmi_server.recv(4096, socket.MSG_DONTWAIT)
    assert b"cmd=init" in asked  # MPI_Init did talk to this PMI server
    assert done.returncode == -signal.SIGKILL, done.stderr  # by its watchdog: MPI_Init holds the GIL
    assert "svcframe: error: rank 1 of 2 (pmi): MPI_Init did not return within 3 s" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "group.json").exists()
