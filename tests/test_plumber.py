"""The plumber (Carns 2025 §4.1.1, Figures 2 and 5): every policy on described nodes, the paper's three
client-binding scenarios, round robin across real processes started at once, and the choice applied by a
server (listen address, live configuration, status) and by a client (outgoing connections)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from roofline_kit import layout_problems

from selftest.nic_dispersion import SCENARIOS, dispersion_figure, plan_choices, scenario_placements
from svcframe import Engine
from svcframe.config import parse_config
from svcframe.errors import ConfigError
from svcframe.plumber import (
    Placement,
    buckets,
    choose_local_host,
    control_dir,
    control_file,
    plumb_address,
    select_nic,
    take_roundrobin,
)
from svcframe.server import Server
from svcframe.settings import PlumberConfig
from svcframe.topology import Topology, load_topology

DATA = Path(__file__).resolve().parent / "data"
AURORA = load_topology(DATA / "aurora-like.json")
ONE_PACKAGE = load_topology(DATA / "one-package-4nics.json")
PKG0 = AURORA.packages[0].cpus
PKG1 = AURORA.packages[1].cpus


@pytest.fixture(autouse=True)
def private_control_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own round-robin control directory (no state shared with other runs)."""
    path = tmp_path / "plumber"
    monkeypatch.setenv("SVCFRAME_PLUMBER_DIR", str(path))
    return path


def _names(choices: list[Any]) -> Counter[str]:
    return Counter(c.nic for c in choices)


# -- tier one: buckets ---------------------------------------------------------------------------------------
def test_buckets_aurora_like() -> None:
    (everything,) = buckets(AURORA, "all")
    assert [n.name for n in everything.nics] == [f"hsn{i}" for i in range(8)]
    pkgs = buckets(AURORA, "package")
    assert [b.name for b in pkgs] == ["package 0", "package 1"]
    assert [[n.name for n in b.nics] for b in pkgs] == [
        ["hsn0", "hsn1", "hsn2", "hsn3"],
        ["hsn4", "hsn5", "hsn6", "hsn7"],
    ]
    numa = buckets(AURORA, "numa")
    assert [[n.name for n in b.nics] for b in numa] == [[n.name for n in b.nics] for b in pkgs]
    with pytest.raises(ConfigError):
        buckets(AURORA, "passthrough")


def test_buckets_one_package() -> None:
    for policy in ("all", "package", "numa"):
        (bucket,) = buckets(ONE_PACKAGE, policy)
        assert [n.name for n in bucket.nics] == ["eth0", "eth1", "eth2", "eth3"]  # "package" = "all" here (§4.1.1)


def test_numa_buckets_within_a_package() -> None:
    """Two NUMA nodes in one package: numa buckets split what the package bucket keeps together."""
    doc = {
        "packages": [{"os_index": 0, "cpus": "0-7"}],
        "numa_nodes": [{"os_index": 0, "cpus": "0-3"}, {"os_index": 1, "cpus": "4-7"}],
        "nics": [{"name": f"ib{i}", "addresses": [f"10.98.0.{i + 1}"], "local_cpus": "0-3" if i < 2 else "4-7"}
                 for i in range(4)],
    }  # fmt: skip
    topo = Topology.from_dict(doc)
    assert [len(b.nics) for b in buckets(topo, "package")] == [4]
    assert [[n.name for n in b.nics] for b in buckets(topo, "numa")] == [["ib0", "ib1"], ["ib2", "ib3"]]
    choice = select_nic(topo, "numa", "bycore", placement=Placement(frozenset({5}), 5))
    assert choice.bucket == "numa 1" and choice.nic == "ib3"  # 5 % 2 = 1 -> second NIC of numa 1


# -- tier two: every NIC policy ---------------------------------------------------------------------------------
def test_byset_and_bycore_formulas() -> None:
    # package 1, bound to CPUs {57, 58}, running on 58: byset -> 57 % 4 = 1, bycore -> 58 % 4 = 2
    p = Placement(frozenset({57, 58}), 58)
    assert select_nic(AURORA, "package", "byset", placement=p).nic == "hsn5"
    assert select_nic(AURORA, "package", "bycore", placement=p).nic == "hsn6"
    assert select_nic(AURORA, "all", "byset", placement=p).nic == "hsn1"  # 57 % 8
    assert select_nic(AURORA, "all", "bycore", placement=p).nic == "hsn2"  # 58 % 8
    choice = select_nic(AURORA, "package", "byset", placement=p)
    assert choice.bucket == "package 1" and choice.bucket_nics == ("hsn4", "hsn5", "hsn6", "hsn7")
    assert choice.address == "10.98.5.1" and "byset" in choice.reason and choice.topology.startswith("file")


def test_bucket_follows_the_current_cpu() -> None:
    """Mochi picks the bucket from the CPU the process runs on (hwloc_get_last_cpu_location)."""
    unbound = frozenset(AURORA.cpus)
    assert select_nic(AURORA, "package", "bycore", placement=Placement(unbound, 3)).bucket == "package 0"
    assert select_nic(AURORA, "package", "bycore", placement=Placement(unbound, 160)).bucket == "package 1"


def test_random_is_seeded_by_pid_and_stays_in_the_bucket() -> None:
    picks = [select_nic(AURORA, "package", "random", placement=Placement(PKG1, 60, pid)).nic for pid in range(200)]
    assert set(picks) == {"hsn4", "hsn5", "hsn6", "hsn7"}
    again = [select_nic(AURORA, "package", "random", placement=Placement(PKG1, 60, pid)).nic for pid in range(200)]
    assert picks == again


def test_roundrobin_cycles_per_bucket(private_control_dir: Path) -> None:
    p0, p1 = Placement(PKG0, 0), Placement(PKG1, 52)
    seq0 = [select_nic(AURORA, "package", "roundrobin", placement=p0) for _ in range(6)]
    seq1 = [select_nic(AURORA, "package", "roundrobin", placement=p1) for _ in range(2)]
    assert [c.nic for c in seq0] == ["hsn0", "hsn1", "hsn2", "hsn3", "hsn0", "hsn1"]
    assert [c.selection for c in seq0] == [1, 2, 3, 4, 5, 6]
    assert [c.nic for c in seq1] == ["hsn4", "hsn5"]  # the other package has its own counter
    files = sorted(p.name for p in private_control_dir.glob("rr-*.json"))
    assert len(files) == 2
    state = json.loads((private_control_dir / files[0]).read_text())
    assert state in ({"last_index": 1, "selections": 6}, {"last_index": 1, "selections": 2})
    assert private_control_dir.stat().st_mode & 0o777 == 0o700
    peek = select_nic(AURORA, "package", "roundrobin", placement=p0, dry_run=True)
    assert peek.nic == "hsn2" and select_nic(AURORA, "package", "roundrobin", placement=p0).nic == "hsn2"


def test_passthrough_in_either_slot_means_no_choice() -> None:
    p = Placement(PKG0, 0)
    for bucket_policy, nic_policy in (("passthrough", "roundrobin"), ("package", "passthrough")):
        choice = select_nic(AURORA, bucket_policy, nic_policy, placement=p)
        assert choice.nic is None and choice.address is None and "passthrough" in choice.reason


def test_every_policy_on_both_nodes() -> None:
    """Each policy pair gives a NIC of the process's bucket, on the Aurora-like and the one-package node."""
    for topo, placement in ((AURORA, Placement(PKG1, 70, 7)), (ONE_PACKAGE, Placement(frozenset({9}), 9, 7))):
        for bucket_policy in ("all", "package", "numa"):
            own = next(b for b in buckets(topo, bucket_policy) if placement.current_cpu in b.cpus)
            for nic_policy in ("byset", "bycore", "random", "roundrobin"):
                choice = select_nic(topo, bucket_policy, nic_policy, placement=placement)
                assert choice.nic in {n.name for n in own.nics}, (bucket_policy, nic_policy)
                assert choice.address == topo.nic(choice.nic).addresses[0]


def test_empty_bucket_and_no_nic_fall_back_to_the_os() -> None:
    doc = {"packages": [{"os_index": 0, "cpus": "0-3"}, {"os_index": 1, "cpus": "4-7"}],
           "nics": [{"name": "eth0", "addresses": ["10.98.0.1"], "local_cpus": "0-3"}]}  # fmt: skip
    topo = Topology.from_dict(doc)
    choice = select_nic(topo, "package", "roundrobin", placement=Placement(frozenset({6}), 6))
    assert choice.nic is None and choice.bucket == "package 1" and "holds no NIC" in choice.reason
    assert select_nic(topo, "all", "roundrobin", placement=Placement(frozenset({6}), 6)).nic == "eth0"
    bare = Topology.from_dict({"packages": [{"os_index": 0, "cpus": "0-3"}]})
    assert "no candidate NIC" in select_nic(bare, "all", "byset", placement=Placement(frozenset({0}), 0)).reason


def test_unknown_policy_names() -> None:
    with pytest.raises(ConfigError, match="unknown bucket_policy"):
        select_nic(AURORA, "socket", "byset")
    with pytest.raises(ConfigError, match="unknown nic_policy"):
        select_nic(AURORA, "all", "fastest")


# -- the paper's three client-binding scenarios (Figure 2) -------------------------------------------------------
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_roundrobin_spreads_16_processes_over_8_nics(scenario: str) -> None:
    counts = _names(plan_choices(AURORA, scenario, "roundrobin", 16))
    assert counts == Counter({f"hsn{i}": 2 for i in range(8)})


def test_byset_spreads_only_single_core_processes() -> None:
    """Mercury's cpuset rule: fine with one core per process, four NICs overloaded and four idle with two
    cores per process, one NIC for everyone when unbound (Carns 2025 §4.1.1, Figure 2)."""
    assert _names(plan_choices(AURORA, "one-core", "byset", 16)) == Counter({f"hsn{i}": 2 for i in range(8)})
    assert _names(plan_choices(AURORA, "two-cores", "byset", 16)) == Counter(
        {"hsn0": 4, "hsn2": 4, "hsn4": 4, "hsn6": 4}
    )
    assert _names(plan_choices(AURORA, "unbound", "byset", 16)) == Counter({"hsn0": 16})


def test_scenario_placements_shapes() -> None:
    one = scenario_placements(AURORA, "one-core", 16)
    assert [min(p.cpuset) for p in one] == list(range(16)) and all(len(p.cpuset) == 2 for p in one)  # 2 threads
    two = scenario_placements(AURORA, "two-cores", 16)
    assert [min(p.cpuset) for p in two] == list(range(0, 32, 2)) and all(len(p.cpuset) == 4 for p in two)
    unbound = scenario_placements(AURORA, "unbound", 16)
    assert all(p.cpuset == AURORA.cpus for p in unbound)
    assert {AURORA.package_of(p.current_cpu) for p in unbound} == {0, 1}
    with pytest.raises(ValueError):
        scenario_placements(AURORA, "pinned", 1)


def test_package_buckets_keep_locality_and_balance() -> None:
    """Default policies (package + roundrobin): processes spread over both packages get two per NIC, each
    on a NIC local to its package; byset with one core per process keeps package 0's four NICs only."""
    spread = [Placement(frozenset({c}), c, i) for i, c in enumerate([*range(0, 8), *range(52, 60)])]
    choices = [select_nic(AURORA, "package", "roundrobin", placement=p) for p in spread]
    assert _names(choices) == Counter({f"hsn{i}": 2 for i in range(8)})
    for p, c in zip(spread, choices, strict=True):
        assert AURORA.nic(c.nic).local_cpus >= p.cpuset
    packed = _names(plan_choices(AURORA, "one-core", "byset", 16, bucket_policy="package"))
    assert packed == Counter({"hsn0": 4, "hsn1": 4, "hsn2": 4, "hsn3": 4})


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_one_package_node_scenarios(scenario: str) -> None:
    counts = _names(plan_choices(ONE_PACKAGE, scenario, "roundrobin", 16, bucket_policy="package"))
    assert counts == Counter({f"eth{i}": 4 for i in range(4)})
    byset = _names(plan_choices(ONE_PACKAGE, scenario, "byset", 16, bucket_policy="package"))
    assert (byset == Counter({f"eth{i}": 4 for i in range(4)})) == (scenario == "one-core")


# -- round robin across real processes started at once ------------------------------------------------------------
#: A client process: load the node, report readiness, block on the shared start pipe, take one selection.
_TAKE_ONCE = """
import json, os, sys
from svcframe.plumber import select_nic
from svcframe.topology import load_topology
topo = load_topology(sys.argv[1])
print("ready", flush=True)
os.read(int(sys.argv[2]), 1)
c = select_nic(topo, "all", "roundrobin")  # this process's own placement
print(json.dumps([os.getpid(), c.selection, c.index, c.nic]), flush=True)
"""


@pytest.mark.one_interpreter  # (long, and about our logic: CI's first interpreter only)
def test_roundrobin_across_16_processes_started_together() -> None:
    """16 unrelated processes released at once (one write on a pipe they all block on): every selection
    number is taken exactly once, and no NIC is used twice before all eight are used (the lock works)."""
    n = 16
    go_r, go_w = os.pipe()
    procs = [
        subprocess.Popen([sys.executable, "-c", _TAKE_ONCE, str(DATA / "aurora-like.json"), str(go_r)],
                         pass_fds=(go_r,), stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]  # fmt: skip
    os.close(go_r)
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        os.write(go_w, b"g" * n)  # the barrier: everyone is released by one write
        rows = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    finally:
        os.close(go_w)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert all(p.returncode == 0 for p in procs)
    rows.sort(key=lambda r: r[1])
    assert [r[1] for r in rows] == list(range(1, n + 1))  # no two processes took the same selection
    assert [r[2] for r in rows] == [i % 8 for i in range(n)]
    assert len({r[3] for r in rows[:8]}) == 8  # the first eight are eight distinct NICs
    assert Counter(r[3] for r in rows) == Counter({f"hsn{i}": 2 for i in range(8)})


# -- control files --------------------------------------------------------------------------------------------
def test_control_dir_must_be_private(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(ConfigError, match="mode 0700"):
        control_dir(shared)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a plain directory"):
        control_dir(link)


def test_control_file_garbage_restarts_the_count(private_control_dir: Path) -> None:
    (bucket,) = buckets(AURORA, "all")
    path = control_file(bucket, control_dir())
    path.write_text("garbage")
    assert take_roundrobin(path, 8) == (0, 1)
    path.write_text(json.dumps({"last_index": 42, "selections": 3}))  # from a larger bucket: out of range
    assert take_roundrobin(path, 8) == (0, 4)
    assert take_roundrobin(path, 8) == (1, 5)


# -- applied by a server and a client -------------------------------------------------------------------------
def _loopback_node(tmp_path: Path) -> str:
    """A described node whose two NICs have loopback addresses: the choice can be applied without root."""
    doc = {"host": "two-nic-rehearsal", "packages": [{"os_index": 0, "cpus": "0-1023"}],
           "nics": [{"name": "nic0", "addresses": ["127.0.0.2"]}, {"name": "nic1", "addresses": ["127.0.0.3"]}]}  # fmt: skip
    path = tmp_path / "node.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_plumb_address_cases(tmp_path: Path, private_control_dir: Path) -> None:
    node = _loopback_node(tmp_path)
    cfg = PlumberConfig(bucket_policy="all", nic_policy="roundrobin", topology_file=node)
    default = plumb_address("tcp://127.0.0.1:0", PlumberConfig())
    assert default.listen_address == "tcp://127.0.0.1:0" and default.local_host is None
    assert not private_control_dir.exists()  # a named host: the plumber did not even run
    assert default.choice.nic is None and "names host 127.0.0.1" in default.choice.reason
    unix = plumb_address("unix:///tmp/x.sock", cfg)
    assert unix.listen_address == "unix:///tmp/x.sock" and "unix socket" in unix.choice.reason
    star = plumb_address("tcp://*:5000", cfg)
    assert (star.listen_address, star.local_host, star.choice.nic) == ("tcp://127.0.0.2:5000", "127.0.0.2", "nic0")
    v4 = plumb_address("tcp://0.0.0.0:0", cfg)
    assert v4.listen_address == "tcp://127.0.0.3:0"
    v6 = plumb_address("tcp://[::]:0", cfg)  # the NICs have no IPv6 address: stay on the wildcard
    assert v6.listen_address == "tcp://[::]:0" and v6.local_host is None and "no IPv6 address" in v6.choice.reason
    passthrough = plumb_address("tcp://*:7", PlumberConfig(nic_policy="passthrough"))
    assert passthrough.listen_address == "tcp://0.0.0.0:7" and passthrough.choice.nic is None
    with pytest.raises(ConfigError):
        plumb_address("tcp://*:0", PlumberConfig(topology_file=str(tmp_path / "missing.json")))


def test_config_defaults_are_the_papers() -> None:
    cfg = parse_config({})
    assert (cfg.engine.plumber.bucket_policy, cfg.engine.plumber.nic_policy) == ("package", "roundrobin")
    assert cfg.engine.address == "tcp://127.0.0.1:0"  # loopback by default: the plumber does not apply
    with pytest.raises(ConfigError, match=r"engine\.plumber\.chosen\.nics"):
        parse_config({"engine": {"plumber": {"chosen": {"nics": "x"}}}})


@pytest.mark.asyncio
async def test_server_listens_on_the_chosen_nic(tmp_path: Path) -> None:
    node = _loopback_node(tmp_path)
    doc = {"engine": {"address": "tcp://*:0", "plumber": {"bucket_policy": "all", "topology_file": node}}}
    servers = [Server(parse_config(doc)), Server(parse_config(doc))]
    try:
        for s in servers:
            await s.start()
        assert [s.address.rsplit(":", 1)[0] for s in servers] == ["tcp://127.0.0.2", "tcp://127.0.0.3"]
        live = servers[1].live_config()
        chosen = live["engine"]["plumber"]["chosen"]
        assert chosen["nic"] == "nic1" and chosen["address"] == "127.0.0.3" and chosen["bucket"] == "all"
        assert "roundrobin" in chosen["reason"] and chosen["selection"] == 2
        assert live["engine"]["address"] == "tcp://*:0"  # the configured address; the choice is beside it
        assert servers[1].status()["plumber"] == chosen
        with pytest.raises(ConfigError, match="/engine/plumber/chosen/nic cannot change"):
            servers[1].patch_config([{"op": "replace", "path": "/engine/plumber/chosen/nic", "value": "nic0"}])
        servers[1].patch_config([{"op": "replace", "path": "/engine/progress_mode", "value": "busy"}])  # still fine
        # The live configuration re-launches through the same model; the stale choice is replaced by a fresh one.
        again = Server(parse_config(live))
        servers.append(again)
        await again.start()
        assert again.address.startswith("tcp://127.0.0.2:")
        assert again.live_config()["engine"]["plumber"]["chosen"]["selection"] == 3
        # A client bound by the plumber: its connection comes from its NIC's address.
        servers[0].engine.register(9, "peer", lambda req, arg: req.conn.peername)
        client_choice = choose_local_host(PlumberConfig(bucket_policy="all", topology_file=node))
        assert client_choice.address == "127.0.0.3"  # selection 4
        async with Engine(None, local_host=client_choice.address) as client:
            peer = await client.call(servers[0].address, "peer", None, provider_id=9, timeout_seconds=5)
        assert peer.split(":")[0] == "127.0.0.3"
    finally:
        for s in servers:
            await s.close()


@pytest.mark.asyncio
async def test_default_server_stays_on_loopback() -> None:
    server = Server(parse_config({}))
    await server.start()
    try:
        assert server.address.startswith("tcp://127.0.0.1:")
        chosen = server.live_config()["engine"]["plumber"]["chosen"]
        assert chosen["nic"] is None and "used as given" in chosen["reason"]
    finally:
        await server.close()


# -- the Figure 2 self-test ------------------------------------------------------------------------------------
@pytest.mark.one_interpreter  # (long, and about our logic: CI's first interpreter only)
def test_nic_dispersion_command(tmp_path: Path) -> None:
    """``svcframe selftest nic-dispersion`` on a described two-NIC node rehearsed on loopback aliases: one
    server per NIC, the plumber's mapping per scenario and policy, bandwidth measured, a chart written."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "svcframe", "selftest", "nic-dispersion", "--from", _loopback_node(tmp_path),
           "--loopback-aliases", "--clients", "2", "--scenario", "unbound", "--duration-seconds", "0.2",
           "--bulk-size", "65536", "-o", str(out)]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    doc = json.loads((out / "nic-dispersion.json").read_text())
    assert [n["name"] for n in doc["nics"]] == ["nic0", "nic1"]
    assert [n["server"].rsplit(":", 1)[0] for n in doc["nics"]] == ["tcp://127.0.0.2", "tcp://127.0.0.3"]
    runs = {r["nic_policy"]: r for r in doc["runs"]}
    assert runs["byset"]["clients_per_nic"] == {"nic0": 2, "nic1": 0}  # unbound: one cpuset, one NIC
    assert runs["roundrobin"]["clients_per_nic"] == {"nic0": 1, "nic1": 1}
    for r in runs.values():
        assert r["bandwidth_gib_per_second"] > 0
        servers = [c["server"] for c in r["results"]["clients"]]
        assert servers == [doc["nics"][int(c["nic"][-1])]["server"] for c in r["choices"]]  # client -> its NIC
    assert (out / "nic-dispersion.png").stat().st_size > 0
    assert "unbound" in run.stdout and "roundrobin" in run.stdout
    # progress lines on stderr as the runs go; the plot states its parameters and that the NICs were stand-ins
    assert [ln.split(",")[0] for ln in run.stderr.splitlines()[:2]] == [
        "selftest nic-dispersion: [1/2] unbound / byset", "selftest nic-dispersion: [2/2] unbound / roundrobin",
    ]  # fmt: skip
    fig = dispersion_figure(doc)
    assert layout_problems(fig) == []  # nothing cut at the edges, no legend over the bars
    (ax,) = fig.axes
    assert ax.get_title().endswith("\n64 KiB bulk pulls, 200 ms per run, bucket policy all")
    assert any("loopback aliases: NIC k is stood in for by 127.0.0.(k+2)" in t.get_text() for t in ax.texts)
