"""Node sets (``selftest/nodes.py``): hostfile formats, Slurm host lists, local splits, errors, the launcher
command lines, and the measurement plan they give over N nodes (Carns et al. sections 4.3 and 5)."""

from __future__ import annotations

import os
import socket

import pytest

from selftest.collect import CollectOptions, plan, step_keys
from selftest.nodes import (
    Node,
    NodeError,
    NodeSet,
    expand_hostlist,
    launcher_command,
    local_nodes,
    parse_hostfile,
    read_hostfile,
    resolve,
    slurm_nodes,
)


def test_hostfile_formats_open_mpi_and_mpich() -> None:
    text = """
    # Open MPI
    node01 slots=4 max_slots=8
    node02 slots=2
    # MPICH
    node03:3
    node04          # no count: one slot
    node02 slots=1  # listed again: slots add up
    """
    nodes = parse_hostfile(text)
    assert [(n.name, n.host, n.slots, n.cores) for n in nodes] == [
        ("node01", "node01", 4, None), ("node02", "node02", 3, None), ("node03", "node03", 3, None),
        ("node04", "node04", 1, None)]  # fmt: skip


def test_hostfile_one_line_per_slot_as_mpiexec_f_reads_it(tmp_path) -> None:
    path = tmp_path / "nodefile"
    path.write_text("a\na\nb\nb\nc\n")
    assert [(n.name, n.slots) for n in read_hostfile(path)] == [("a", 2), ("b", 2), ("c", 1)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "lists no host"),
        ("# only a comment\n\n", "lists no host"),
        ("node01 slots=x\n", r"line 1: 'node01 slots=x': unknown or malformed 'slots=x'"),
        ("ok slots=1\nnode02:two\n", r"line 2: 'node02:two': the count after ':' must be a positive integer"),
        ("node01 slots=0\n", "needs at least 1 slot"),
        ("node01 colour=blue\n", "unknown or malformed 'colour=blue'"),
    ],
)
def test_bad_hostfiles_are_named_by_line(text, message) -> None:
    with pytest.raises(NodeError, match=message):
        parse_hostfile(text)


def test_missing_hostfile(tmp_path) -> None:
    with pytest.raises(NodeError, match="cannot read hostfile"):
        read_hostfile(tmp_path / "nope")


def test_slurm_host_lists_through_python_hostlist() -> None:
    """python-hostlist expands the lists, whether or not Slurm's scontrol is installed (it used to be asked
    first, and failed or retried for a minute without a slurm.conf)."""
    assert expand_hostlist("nid[001-003,010],login1") == ["nid001", "nid002", "nid003", "nid010", "login1"]
    env = {"SLURM_JOB_NODELIST": "c[1-3]", "SLURM_JOB_CPUS_PER_NODE": "36(x2),72", "SLURM_JOB_ID": "7"}
    assert [(n.host, n.slots) for n in slurm_nodes(env)] == [("c1", 36), ("c2", 36), ("c3", 72)]
    with pytest.raises(NodeError, match="gives 1 counts for 3 nodes"):
        slurm_nodes({"SLURM_JOB_NODELIST": "c[1-3]", "SLURM_JOB_CPUS_PER_NODE": "4"})
    with pytest.raises(NodeError, match="bad Slurm host list"):
        expand_hostlist("c[3-1")
    with pytest.raises(NodeError, match="not inside a Slurm allocation"):
        slurm_nodes({})


def test_local_split_generalises_the_server_client_halves() -> None:
    two = local_nodes(2, [0, 1, 2])
    assert [n.cores for n in two] == [(0,), (1, 2)]  # as before: first half servers, the rest clients
    four = local_nodes(4, list(range(10)))
    assert [n.cores for n in four] == [(0, 1), (2, 3), (4, 5, 6), (7, 8, 9)]
    assert all(n.host == "127.0.0.1" for n in four) and [n.slots for n in four] == [2, 2, 3, 3]
    assert [n.cores for n in local_nodes(3, [5])] == [(5,), (5,), (5,)]  # fewer cores than nodes: shared
    with pytest.raises(NodeError, match="at least 2 nodes"):
        local_nodes(1)


def test_resolve_sources_launchers_and_errors(tmp_path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=2\nb slots=2\n")
    assert resolve(env={}).launcher == "local" and len(resolve(env={})) == 2
    assert resolve("local:3", env={}).source == "local" and len(resolve("local:3", env={})) == 3
    ns = resolve(hostfile=hosts, env={}, check_launcher=False)
    assert (ns.source, ns.launcher, ns.pairs) == (f"hostfile:{hosts}", "mpiexec", [(0, 1)])
    slurm = {"SLURM_JOB_NODELIST": "c[1-4]", "SLURM_JOB_CPUS_PER_NODE": "8(x4)", "SLURM_JOB_ID": "1"}
    ns = resolve(env=slurm, check_launcher=False)
    assert (ns.source, ns.launcher, len(ns), len(ns.pairs)) == ("slurm", "srun", 4, 6)
    pbs = tmp_path / "pbs"
    pbs.write_text("x\nx\ny\n")
    assert resolve(env={"PBS_NODEFILE": str(pbs)}, check_launcher=False).launcher == "mpiexec"
    one = tmp_path / "one"
    one.write_text("lonely slots=8\n")
    with pytest.raises(NodeError, match=r"gives 1 node .*needs at least 2"):
        resolve(hostfile=one, env={}, check_launcher=False)
    with pytest.raises(NodeError, match="not both"):
        resolve("local:2", hosts, env={})
    with pytest.raises(NodeError, match="expected local:K"):
        resolve("remote:2", env={})
    with pytest.raises(NodeError, match="never starts remote processes itself"):
        resolve(hostfile=hosts, launcher="local", env={})
    with pytest.raises(NodeError, match="choose one of"):
        resolve(launcher="ssh", env={})


def test_mpiexec_inside_an_allocation_uses_its_nodes(tmp_path) -> None:
    """MPICH's mpiexec inside salloc/sbatch starts its proxies through srun: the node set is the allocation's,
    never the local default (whose 127.0.0.1 srun does not know: collect hung for its whole timeout)."""
    slurm = {"SLURM_JOB_NODELIST": "svcf-node[1-2]", "SLURM_JOB_CPUS_PER_NODE": "4(x2)", "SLURM_JOB_ID": "3"}
    ns = resolve(launcher="mpiexec", env=slurm, check_launcher=False)
    assert (ns.source, ns.launcher, [n.host for n in ns.nodes]) == ("slurm", "mpiexec", ["svcf-node1", "svcf-node2"])
    with pytest.raises(NodeError, match="leave out --nodes to use the allocation's nodes"):
        resolve("local:2", launcher="mpiexec", env=slurm, check_launcher=False)
    assert resolve("local:2", launcher="local", env=slurm).source == "local"  # local nodes, forked here


def test_srun_is_required_when_chosen_but_absent(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun there (nor beside this Python)
    with pytest.raises(NodeError, match="no srun on PATH"):
        resolve(env={"SLURM_JOB_NODELIST": "c[1-2]"}, launcher="srun")


def test_launcher_command_lines() -> None:
    nodes = (Node("c1", "c1", 8), Node("c2", "c2", 8))
    argv = ["python", "-m", "selftest.remote", "tcp://c0:1234", "--node", "1"]
    srun = launcher_command(NodeSet(nodes, "slurm", "srun", "/usr/bin/srun"), nodes[1], 16, argv)
    assert srun == ["/usr/bin/srun", "--nodes=1", "--ntasks=16", "--nodelist=c2", "--overlap", "--overcommit",
                    "--kill-on-bad-exit=1", *argv]  # fmt: skip
    mpich = launcher_command(NodeSet(nodes, "hostfile:h", "mpiexec", "mpiexec"), nodes[0], 8, argv)
    assert mpich == ["mpiexec", "-hosts", "c1", "-n", "8", *argv]
    ompi = launcher_command(NodeSet(nodes, "hostfile:h", "mpiexec", "mpiexec"), nodes[0], 8, argv, flavour="openmpi")
    assert ompi == ["mpiexec", "--host", "c1:8", "-n", "8", *argv]
    with pytest.raises(NodeError, match="no command"):
        launcher_command(NodeSet(nodes, "local", "local"), nodes[0], 1, argv)


def test_plan_over_four_nodes(tmp_path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("s0 slots=4\nc1 slots=2\nc2 slots=2\nc3 slots=2\n")
    ns = resolve(hostfile=hosts, env={}, check_launcher=False)
    opts = CollectOptions(metrics=["rpc_rate"], repeats=2, hostfile=hosts, sweep_max_servers=4,
                          grid_server_nodes=[1, 2], grid_client_nodes=[1, 2, 3])  # fmt: skip
    steps = plan(opts, ns)
    pc = [s for s in steps if s.stage == "Pc"]
    assert len(pc) == 2 * 6 and {s.tag for s in pc} == {"n0-1", "n0-2", "n0-3", "n1-2", "n1-3", "n2-3"}
    assert all(s.server_nodes == (int(s.tag[1]),) and s.client_nodes == (int(s.tag[3]),) for s in pc)
    ps = [s for s in steps if s.stage == "Ps"]
    assert len(ps) == 2 and ps[0].server_nodes == (0, 0, 0, 0)  # node 0 fully populated
    assert ps[0].clients == 12 and sorted(ps[0].client_nodes) == [1] * 4 + [2] * 4 + [3] * 4  # 2 per slot
    assert [s.servers for s in steps if s.stage == "sweep"] == [1, 2, 3]  # 4 is Ps itself
    grid = {s.tag: (s.servers, s.clients) for s in steps if s.stage == "grid"}
    assert grid == {"nodes1x1": (4, 2), "nodes1x2": (4, 4), "nodes1x3": (4, 6), "nodes2x1": (6, 2),
                    "nodes2x2": (6, 4)}  # s + c <= 4 nodes  # fmt: skip
    assert len(set(step_keys(steps))) == len(steps)


def test_default_local_plan_is_unchanged_in_shape() -> None:
    cores = sorted(os.sched_getaffinity(0))
    opts = CollectOptions(metrics=["rpc_rate"], repeats=3, nodes="local:2")
    steps = plan(opts)
    half = len(cores) // 2 if len(cores) > 1 else 1
    ps = [s for s in steps if s.stage == "Ps"]
    assert [s.stage for s in steps].count("Pc") == 3 and all(s.tag == "n0-1" for s in steps if s.stage == "Pc")
    assert ps[0].servers == half and ps[0].clients == max(2, 2 * (len(cores) - half if len(cores) > 1 else 1))
    assert [(s.servers, s.clients) for s in steps if s.stage == "grid"] == [(1, 1), (1, 2), (1, 4), (1, 8),
                                                                           (2, 1), (2, 2), (2, 4), (2, 8)]  # fmt: skip


def test_addresses_are_checked_before_anything_starts_on_other_nodes() -> None:
    """Servers on remote nodes listen on their node's name unless --interface says otherwise: a name that does
    not resolve, or a coordinator host only this node reaches, is one error naming the option that fixes it."""
    from selftest.collect import check_addresses, interface_address

    remote = NodeSet((Node("c1", "no-such-node.invalid", 4), Node("c2", "no-such-node-2.invalid", 4)), "slurm", "srun")
    with pytest.raises(NodeError, match=r"node c1 \(slurm\): its name 'no-such-node.invalid' does not resolve here.*"
                                        r"give --interface NAME"):  # fmt: skip
        check_addresses(remote, "10.0.0.1", None)
    with pytest.raises(NodeError, match=r"the coordinator would listen on tcp://127.0.0.1:0 is a loopback address.*"
                                        r"give --coordinator-host ADDRESS or --interface NAME"):  # fmt: skip
        check_addresses(remote, "127.0.0.1", None)
    with pytest.raises(NodeError, match=r"does not resolve .*the client processes could not dial the coordinator"):
        check_addresses(remote, "no-such-coordinator.invalid", None)
    assert interface_address("lo") == "127.0.0.1"
    with pytest.raises(NodeError, match="--interface nope0: this node has no such interface"):
        interface_address("nope0")
    # with --interface, node names need not resolve here: each server takes its interface's address
    assert check_addresses(remote, "10.0.0.1", "lo") == "10.0.0.1"
    # this machine under several names (a hostfile of localhost, 127.0.0.1...): loopback is what they share
    here = NodeSet((Node("a", "localhost", 1), Node("b", "127.0.0.1", 1)), "hostfile:h", "mpiexec")
    assert check_addresses(here, None, None) == socket.gethostname()
