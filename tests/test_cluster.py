"""svcframe under a real Slurm and a real MPI: the launches a cluster user runs, and the failure paths.

Needs the cluster ``.ci/cluster.sh`` starts on this machine (Debian's slurmctld, slurmd and munge; MPICH's
mpiexec, Debian's and the mpi-wheel extra's; two namespace nodes, svcf-node1 and svcf-node2, in partition
``netns``): it sets ``SVCF_CLUSTER`` and ``SLURM_CONF``. Without them every case skips, naming the reason;
``SVCFRAME_CLUSTER_REQUIRED=1`` (what the CI job sets) turns a skip into a failure, so that CI never passes
without running them. Every command has a hard time limit (a Slurm time limit too), and every server a test
starts is shut down or its job cancelled whatever happens.

    srun / salloc / sbatch with group files, status of every rank, a self-test, shutdown, scancel --signal=TERM
    srun --mpi=pmi2 (MPI's barrier) and --mpi=pmix (MPICH's wheel does not speak PMIx: the filesystem's)
    mpiexec (the wheel's and Debian's) inside and outside an allocation
    the cluster guide's job script (docs/guides/cluster.md), as written, from sbatch on two nodes
    failures: a taken port under MPI's barrier ends the job within the group timeout, naming the rank; a
    loopback address in a step over two nodes is refused with a hint; fixed ports without a group file
    roofline collect over the two namespace nodes (servers on svcf-node1, clients on svcf-node2) with
    --launcher srun and --launcher mpiexec (the allocation's nodes; --interface eth0), stored and plotted
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from selftest import SELFTEST_CONFIG
from svcframe.group import read_group_file

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = os.environ.get("SVCF_CLUSTER")
REQUIRED = os.environ.get("SVCFRAME_CLUSTER_REQUIRED") == "1"
CLI = [sys.executable, "-m", "svcframe"]
#: One secret for the servers and the CLI: admin calls (shutdown) need an authenticated connection.
SECRET = secrets.token_hex(16)
#: Slurm's time limit of every job and step (minutes): nothing a test starts outlives a stuck test by long.
SLURM_MINUTES = "5"

pytestmark = [pytest.mark.one_interpreter, pytest.mark.timeout(300)]


def need(ok: bool, reason: str) -> None:
    """Skip (fail, under ``SVCFRAME_CLUSTER_REQUIRED=1``) unless ``ok``."""
    if not ok:
        if REQUIRED:
            pytest.fail(f"required by the CI job, but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module", autouse=True)
def cluster() -> None:
    need(CLUSTER is not None and bool(os.environ.get("SLURM_CONF")),
         "no Slurm cluster (bash .ci/cluster.sh starts one and runs this file)")  # fmt: skip
    need(shutil.which("srun") is not None, "no srun on PATH")
    sinfo = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %P %T"], capture_output=True, text=True, timeout=30)
    nodes = {tuple(line.split()) for line in sinfo.stdout.splitlines()}
    need(sinfo.returncode == 0 and len(nodes) >= 3, f"sinfo does not show the cluster's 3 nodes: {sinfo.stderr}")


@pytest.fixture(autouse=True)
def no_stale_mpich_segments() -> Iterator[None]:
    """MPICH's shared-memory segments (/dev/shm/mpich_shm_*) that ranks killed by srun or the MPI_Init watchdog
    leave behind are removed after each case (its jobs have ended): with them left, a later job's MPI_Init hung."""
    yield
    for segment in Path("/dev/shm").glob("mpich_shm_*"):
        segment.unlink(missing_ok=True)


def env(**extra: str) -> dict[str, str]:
    """This process's environment (PATH with the venv, SLURM_CONF), the secret, no launcher's variables."""
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_JOB", "SLURM_STEP"))
    }
    return {**base, "SVCFRAME_SECRET": SECRET, "SLURM_CONF": os.environ.get("SLURM_CONF", ""), **extra}


def run(
    cmd: list[str], timeout: float = 120, cwd: Path | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env(**extra))


def cli(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = run([*CLI, *args], timeout=timeout, cwd=cwd)
    assert done.returncode == 0, f"svcframe {' '.join(args)}: {done.stderr[-3000:]}"
    return done


class Background:
    """A launch (srun, mpiexec...) in the background: its output in a file, ended whatever happens."""

    def __init__(self, cmd: list[str], workdir: Path, name: str = "launch", **extra: str) -> None:
        self.log = workdir / f"{name}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env(**extra),
                                         start_new_session=True)  # fmt: skip

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def where(self) -> str:
        """What a launch that did not end was doing: its output, Slurm's queue, and the state and kernel wait
        channel of every process whose command line names its directory (srun, slurmstepd, the ranks)."""
        queue = run(["squeue", "-h", "-o", "%i %T %R %j"], timeout=30).stdout
        ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,etimes,wchan:28,args", "--forest"], capture_output=True,
                            text=True, timeout=30).stdout  # fmt: skip
        lines = ps.splitlines()[1:]
        parent = {line.split()[0]: line.split()[1] for line in lines}
        shown = {line.split()[0] for line in lines
                 if str(self.log.parent) in line or "srun" in line or "slurmstepd" in line}  # fmt: skip
        for pid in parent:  # and every descendant of those, whatever its command line
            ancestor = parent[pid]
            while ancestor in parent and pid not in shown:
                shown |= {pid} if ancestor in shown else set()
                ancestor = parent[ancestor]
        mine = [line for line in lines if line.split()[0] in shown]
        return (f"output:\n{self.output[-3000:]}\nsqueue:\n{queue}\nprocesses:\n" + "\n".join(mine))[-6000:]

    def end(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)  # srun forwards it to the tasks; mpiexec too
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=30)


@pytest.fixture
def launches(tmp_path: Path) -> Iterator[list[Background]]:
    started: list[Background] = []
    try:
        yield started
    finally:
        for launch in started:
            launch.end()


def serve_group(group: Path, count_ranks: int) -> dict[str, Any]:
    """Wait for the group (``svcframe wait``), check every rank answers ``status`` with its pid, run a short
    self-test against the group, and return the group file's metadata."""
    waited = cli("wait", "-g", str(group), "--timeout-seconds", "120")
    statuses = json.loads(waited.stdout)
    members = read_group_file(group).members
    assert [m.rank for m in members] == list(range(count_ranks))
    assert sorted(s["pid"] for s in statuses.values()) == sorted(m.pid for m in members)
    status = json.loads(cli("status", "-g", str(group)).stdout)  # a call to every rank
    assert sorted(s["pid"] for s in status.values()) == sorted(m.pid for m in members)
    out = group.with_name(group.stem + "-noop.json")
    cli("selftest", "run", "-g", str(group), "--clients", "2", "--duration-seconds", "0.3", "-o", str(out))
    result = json.loads(out.read_text())
    assert result["aggregate"]["rate_ops_per_second"] > 0
    return read_group_file(group).metadata


def shut_down(group: Path, launch: Background) -> None:
    """Admin shutdown of every member; the launcher exits 0 and rank 0 has removed the group file."""
    cli("shutdown", "-g", str(group))
    assert launch.wait(60) == 0, launch.output[-3000:]
    assert not group.exists() and not group.with_name(group.name + ".d").exists()


def sbatch(script: Path, workdir: Path, *options: str, timeout: float = 240) -> tuple[str, str]:
    """Submit ``script`` and wait for its end by bounded polling of ``scontrol show job`` (``sbatch --wait``
    polls every few seconds, up to 10: 25 s of a 15 s job). Returns (JobState, its output)."""
    log = workdir / f"{script.stem}.out"
    done = run(["sbatch", "--parsable", f"--time={SLURM_MINUTES}", f"--output={log}", f"--chdir={workdir}", *options,
                str(script)], timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    state = "PENDING"
    try:
        while state in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            assert time.monotonic() < deadline, f"job {job} still {state} after {timeout:g} s"
            shown = run(["scontrol", "show", "job", "-o", job], timeout=30).stdout
            found = re.search(r"\bJobState=(\S+)", shown)
            state = found.group(1) if found else "GONE"
            time.sleep(0.2)  # bounded polling of the job's state
    finally:
        if state in ("PENDING", "CONFIGURING", "RUNNING"):
            run(["scancel", job], timeout=30)
    return state, log.read_text(errors="replace") if log.exists() else ""


# -- launches ------------------------------------------------------------------------------------------------------
def test_srun_servers_publish_a_group_that_answers_and_shuts_down(tmp_path: Path, launches: list[Background]) -> None:
    """srun -n 4 (no --mpi: Slurm's variables give the rank; the filesystem barrier), over the group file of an
    earlier run whose servers are gone: never taken for this one's."""
    group = tmp_path / "group.json"
    group.write_text(json.dumps({"members": [{"rank": r, "address": f"tcp://127.0.0.1:{r + 1}", "provider_id": 0,
                                              "pid": 1} for r in range(4)], "metadata": {"created": 1.0}}))  # fmt: skip
    launches.append(Background(["srun", "-n", "4", "-t", SLURM_MINUTES, "--kill-on-bad-exit", *CLI, "serve",
                                str(SELFTEST_CONFIG), "--group-file", str(group)], tmp_path))  # fmt: skip
    meta = serve_group(group, 4)
    assert (meta["launcher"], meta["barrier"], meta["size"]) == ("slurm", "filesystem", 4)
    assert re.fullmatch(r"slurm:\d+\.\d+", meta["job"])
    shut_down(group, launches[0])


def test_salloc_then_srun_and_a_client_that_waits(tmp_path: Path) -> None:
    """An interactive allocation's script: servers by srun in the background, the client waits for them."""
    script = tmp_path / "alloc.sh"
    script.write_text(f"""set -e
srun --kill-on-bad-exit svcframe serve {SELFTEST_CONFIG} --group-file group.json > servers.log 2>&1 &
svcframe wait -g group.json --timeout-seconds 120 > waited.json
svcframe status -g group.json > status.json
svcframe shutdown -g group.json > /dev/null
wait
""")
    done = run(["salloc", "-n", "3", "-t", SLURM_MINUTES, "bash", str(script)], timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr + (tmp_path / "servers.log").read_text(errors="replace")
    assert len(json.loads((tmp_path / "status.json").read_text())) == 3
    assert not (tmp_path / "group.json").exists()


@pytest.mark.parametrize(("mpi", "barrier"), [("pmi2", "mpi4py"), ("pmix", "filesystem")])
def test_srun_with_pmi2_and_pmix(tmp_path: Path, launches: list[Background], mpi: str, barrier: str) -> None:
    """srun --mpi=pmi2: MPI's barrier (mpi4py and MPICH's wheel). srun --mpi=pmix: that MPICH does not speak
    PMIx (MPI_Init aborted every rank, exit 16); the barrier is chosen before MPI_Init, the filesystem's."""
    group = tmp_path / "group.json"
    launches.append(Background(["srun", f"--mpi={mpi}", "-n", "3", "-t", SLURM_MINUTES, "--kill-on-bad-exit", *CLI,
                                "serve", str(SELFTEST_CONFIG), "--group-file", str(group)], tmp_path))  # fmt: skip
    meta = serve_group(group, 3)
    assert (meta["launcher"], meta["barrier"]) == ({"pmi2": "pmi", "pmix": "pmix"}[mpi], barrier)
    assert meta["job"] is not None  # pmi: PMI_JOBID; pmix: its namespace
    shut_down(group, launches[0])


def _mpiexecs() -> list[str]:
    found = []
    beside = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if beside:
        found.append(beside)  # the mpi-wheel extra's (MPICH 5's Hydra)
    if shutil.which("mpiexec.mpich"):
        found.append(shutil.which("mpiexec.mpich") or "")  # Debian's MPICH 4
    return found


@pytest.mark.parametrize("where", ["inside", "outside"])
@pytest.mark.parametrize("which", ["wheel", "debian"])
def test_mpiexec_inside_and_outside_an_allocation(tmp_path: Path, where: str, which: str) -> None:
    """MPICH's mpiexec (Hydra starts its proxies through srun inside an allocation, by fork outside), the
    wheel's and Debian's; mpi4py is the wheel's, and speaks PMI-1 to either Hydra: MPI's barrier."""
    mpiexec = {"wheel": shutil.which("mpiexec", path=os.path.dirname(sys.executable)),
               "debian": shutil.which("mpiexec.mpich")}[which]  # fmt: skip
    need(mpiexec is not None, f"no {which} mpiexec")
    assert mpiexec is not None
    script = tmp_path / "mpi.sh"
    script.write_text(f"""set -e
{mpiexec} -n 3 svcframe serve {SELFTEST_CONFIG} --group-file group.json > servers.log 2>&1 &
svcframe wait -g group.json --timeout-seconds 120 > waited.json
cp group.json published.json
svcframe shutdown -g group.json > /dev/null
wait
""")
    cmd = ["bash", str(script)]
    if where == "inside":
        cmd = ["salloc", "-n", "3", "-t", SLURM_MINUTES, *cmd]
    done = run(cmd, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr + (tmp_path / "servers.log").read_text(errors="replace")
    meta = json.loads((tmp_path / "published.json").read_text())["metadata"]
    assert (meta["launcher"], meta["barrier"], meta["size"]) == ("pmi", "mpi4py", 3)
    assert (meta["job"] or "").startswith("slurm:") == (where == "inside")  # the proxies' step
    assert len(json.loads((tmp_path / "waited.json").read_text())) == 3
    assert not (tmp_path / "group.json").exists()


def test_scancel_signal_term_ends_the_servers_cleanly(tmp_path: Path) -> None:
    """scancel --signal=TERM: every server drains and exits 0, rank 0 removes its group file, the job ends."""
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
srun svcframe serve {SELFTEST_CONFIG} --group-file group.json
echo "srun exited with $?"
""")
    log = tmp_path / "job.out"
    done = run(["sbatch", "--parsable", "-n", "2", f"--time={SLURM_MINUTES}", f"--output={log}",
                f"--chdir={tmp_path}", str(script)], timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    try:
        cli("wait", "-g", str(tmp_path / "group.json"), "--timeout-seconds", "120")
        cancel = run(["scancel", "--signal=TERM", job], timeout=30)
        assert cancel.returncode == 0, cancel.stderr
        deadline = time.monotonic() + 60
        while "srun exited" not in (log.read_text(errors="replace") if log.exists() else ""):
            assert time.monotonic() < deadline, log.read_text(errors="replace") if log.exists() else "no output"
            time.sleep(0.1)  # bounded polling of the job's output
    finally:
        run(["scancel", job], timeout=30)
    assert "srun exited with 0" in log.read_text(), log.read_text()
    assert not (tmp_path / "group.json").exists()


def test_the_cluster_guides_job_script_runs_as_written_from_sbatch(tmp_path: Path) -> None:
    """The cluster guide's job script, as it is written there: 4 servers on the two namespace nodes
    (partition netns), a client that waits for their group file, a self-test, shutdown; the servers remove
    their files."""
    page = (ROOT / "docs" / "guides" / "cluster.md").read_text()
    blocks = re.findall(r'```sh \{\.file title="job\.sh"\}\n(.*?)```', page, re.S)
    assert blocks, 'docs/guides/cluster.md lost its job script (```sh {.file title="job.sh"})'
    script = tmp_path / "job.sh"
    script.write_text(blocks[0])
    state, output = sbatch(script, tmp_path, "--partition=netns")
    assert state == "COMPLETED", output[-3000:]
    result = json.loads((tmp_path / "noop.json").read_text())
    assert result["aggregate"]["rate_ops_per_second"] > 0
    hosts = sorted(server["address"].rsplit(":", 1)[0] for server in result["servers"])
    assert hosts == ["tcp://10.200.0.11"] * 2 + ["tcp://10.200.0.12"] * 2  # tcp://*:0 became each node's eth0
    assert not (tmp_path / "group.json").exists() and not (tmp_path / "group.json.d").exists()


# -- failures ------------------------------------------------------------------------------------------------------
def _free_port_pair() -> tuple[int, socket.socket]:
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


def test_a_taken_port_under_mpi_barrier_ends_the_job_within_the_group_timeout(tmp_path: Path) -> None:
    """srun --mpi=pmi2, rank 1's port taken: the job ends well within --group-timeout-seconds (it hung: rank 0
    in comm.gather, rank 1 in MPI_Finalize), non-zero, naming rank 1; no group file."""
    port, holder = _free_port_pair()
    group = tmp_path / "group.json"
    config = _fixed_port_config(tmp_path, port)
    t0 = time.monotonic()
    launch = Background(["srun", "--mpi=pmi2", "-n", "3", "-t", SLURM_MINUTES, *CLI, "serve", str(config),
                         "--group-file", str(group), "--group-timeout-seconds", "30"], tmp_path)  # fmt: skip
    try:
        code = launch.wait(90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job did not end within 90 s:\n{launch.where()}")
    finally:
        holder.close()
        launch.end()
    took = time.monotonic() - t0
    output = launch.output
    assert code != 0 and took < 30, (took, output[-3000:])
    assert "rank 1 of 3 (pmi) failed to start; aborting the MPI job" in output, output[-3000:]
    assert not group.exists()


def test_a_loopback_address_over_two_nodes_is_refused_with_a_hint(tmp_path: Path) -> None:
    """srun -N 2 with the shipped loopback config: every rank refuses at once with the hint (rank 0 reported
    ranks 2 and 3 missing after its timeout, and the others served on), and leaves no file behind."""
    group = tmp_path / "group.json"
    done = run(["srun", "-p", "netns", "-N", "2", "-n", "4", "-t", SLURM_MINUTES, *CLI, "serve", str(SELFTEST_CONFIG),
                "--group-file", str(group)], timeout=120, cwd=tmp_path)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert output.count("is a loopback address, reachable on its own node only, in a job step over 2 nodes") == 4
    assert "listen on an address the other nodes reach: engine.address tcp://*:0" in output
    assert "Traceback" not in output
    assert not group.exists() and not group.with_name("group.json.d").exists()


def test_fixed_ports_without_a_group_file(tmp_path: Path, launches: list[Background]) -> None:
    """srun -n 2 svcframe serve fixed-port.json: each rank listens on the port + its node-local rank."""
    port, holder = _free_port_pair()
    holder.close()
    config = _fixed_port_config(tmp_path, port)
    launch = Background(["srun", "-n", "2", "-t", SLURM_MINUTES, *CLI, "serve", str(config)], tmp_path)
    launches.append(launch)
    deadline = time.monotonic() + 120
    while launch.output.count('"ok": true') < 2:
        assert launch.proc.poll() is None and time.monotonic() < deadline, launch.output[-3000:]
        time.sleep(0.05)  # bounded polling of the readiness lines
    ready = [json.loads(line) for line in launch.output.splitlines() if line.startswith("{")]
    assert sorted(r["address"] for r in ready) == [f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"]


# -- two nodes: the roofline across the namespace nodes ---------------------------------------------------------------
COLLECT = ("svcframe roofline collect --metric rpc_rate --metric bandwidth --duration-seconds 0.5 --repeats 2 "
           "--grid-servers 1 --grid-clients 1,2 --sweep-max-servers 0 --service selftest --platform svcf-netns")  # fmt: skip


@pytest.mark.parametrize("launcher", ["srun", "mpiexec --interface eth0"])
def test_roofline_collect_over_two_namespace_nodes(tmp_path: Path, launcher: str) -> None:
    """sbatch -N 2 on the namespace nodes: collect runs on svcf-node1 (the batch script's node), its servers
    there and its client processes on svcf-node2, over the veth bridge; the run goes into the store and is
    plotted like a local one. mpiexec inside the allocation uses the allocation's nodes, and --interface eth0
    puts the servers and the coordinator on that interface's address."""
    script = tmp_path / "collect.sh"
    script.write_text(f"""#!/bin/bash
set -e
{COLLECT} --launcher {launcher} -o rl --store results.sqlite
svcframe history --store results.sqlite > history.txt
svcframe history show latest --store results.sqlite -o normal.png
svcframe roofline plot rl/roofline.json -o replot
""")
    state, output = sbatch(script, tmp_path, "--partition=netns", "--nodes=2", "--ntasks-per-node=1")
    assert state == "COMPLETED", output[-4000:]
    doc = json.loads((tmp_path / "rl" / "roofline.json").read_text())
    nodes = doc["nodes"]
    assert (nodes["source"], nodes["launcher"]) == ("slurm", launcher.split()[0])
    assert [n["host"] for n in nodes["nodes"]] == ["svcf-node1", "svcf-node2"]
    assert [(s["node"], s["answered"]) for s in nodes["processes"]["servers"]] == [("svcf-node1", 1)]
    assert [c["hosts"] for c in nodes["processes"]["clients"]] == [["svcf-node2"]]
    for metric in ("rpc_rate", "bandwidth"):
        model = doc["metrics"][metric]
        assert model["pc"]["min"] > 0 and model["ps"]["min"] > 0
        assert (tmp_path / "rl" / f"{metric}.png").stat().st_size > 10_000
    assert "of the 2 nodes of the Slurm allocation" in output  # the summary names its nodes
    assert "complete" in (tmp_path / "history.txt").read_text()
    assert (tmp_path / "normal.png").stat().st_size > 10_000
    if "--interface" in launcher:
        config = json.loads((tmp_path / "rl" / "launch" / "servers-node0.config.json").read_text())
        assert config["engine"]["address"] == "tcp://*:0" and config["engine"]["plumber"]["interfaces"] == ["eth0"]
