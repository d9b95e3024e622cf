"""The topology model: CPU lists, described topologies (JSON, hwloc XML), the sysfs and hwloc backends, the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svcframe.errors import ConfigError
from svcframe.topology import (
    Topology,
    discover,
    format_cpulist,
    from_hwloc,
    from_sysfs,
    hwloc_available,
    load_topology,
    parse_cpulist,
)

DATA = Path(__file__).resolve().parent / "data"
AURORA = DATA / "aurora-like.json"
ONE_PACKAGE = DATA / "one-package-4nics.json"
AURORA_XML = DATA / "aurora-like.xml"

needs_hwloc = pytest.mark.skipif(
    not hwloc_available() and os.environ.get("CI") != "true",
    reason="pyhwloc does not import here (install it with pip install --ignore-requires-python pyhwloc)",
)


# -- CPU lists -----------------------------------------------------------------------------------------------
def test_cpulist_examples() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert parse_cpulist("") == frozenset()
    assert format_cpulist({5, 0, 1, 2}) == "0-2,5"
    assert format_cpulist([]) == ""
    with pytest.raises(ValueError):
        parse_cpulist("3-1")
    with pytest.raises(ValueError):
        parse_cpulist("a")


@given(st.frozensets(st.integers(0, 300)))
def test_cpulist_round_trip(cpus: frozenset[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == cpus


# -- described topologies -------------------------------------------------------------------------------------
def test_aurora_like_json() -> None:
    topo = load_topology(AURORA)
    assert [p.os_index for p in topo.packages] == [0, 1]
    assert len(topo.cpus) == 208 and len(topo.cores) == 104
    assert topo.package_of(0) == 0 and topo.package_of(104) == 0 and topo.package_of(52) == 1
    assert topo.numa_of(207) == 1
    names = [n.name for n in topo.candidate_nics()]
    assert names == [f"hsn{i}" for i in range(8)]
    for nic in topo.nics:
        pkg = int(nic.name[3:]) // 4
        assert nic.local_cpus == topo.packages[pkg].cpus  # four NICs local to each package
    assert Topology.from_dict(topo.to_dict(), source=topo.source) == topo  # the JSON round-trips


def test_one_package_candidates() -> None:
    topo = load_topology(ONE_PACKAGE)
    assert len(topo.packages) == 1 and len(topo.numa_nodes) == 1  # NUMA nodes default to one per package
    # docker0 is virtual (skipped while physical NICs exist); eth9 is down and has no address
    assert [n.name for n in topo.candidate_nics()] == ["eth0", "eth1", "eth2", "eth3"]
    assert [n.name for n in topo.candidate_nics(["docker*", "eth1"])] == ["docker0", "eth1"]
    assert topo.nic("docker0").local_cpus == topo.cpus  # no local_cpus = local to every CPU


def test_natural_order_of_nic_names() -> None:
    doc = {"packages": [{"os_index": 0, "cpus": "0-3"}],
           "nics": [{"name": f"hsn{i}", "addresses": [f"10.98.0.{i + 1}"]} for i in (10, 2, 1)]}  # fmt: skip
    assert [n.name for n in Topology.from_dict(doc).candidate_nics()] == ["hsn1", "hsn2", "hsn10"]


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ({}, "packages: missing field 'packages'"),
        ({"packages": [{"os_index": 0, "cpus": "3-1"}]}, "packages: bad CPU range"),
        ({"packages": [{"os_index": 0, "cpus": "0-3"}], "nics": [{"addresses": []}]}, "nics[0]: missing field 'name'"),
        (
            {"packages": [{"os_index": 0, "cpus": "0-3"}], "nics": [{"name": "x", "addresses": ["not-an-ip"]}]},
            "nics[0]:",
        ),
        ({"packages": []}, "at least one package"),
    ],
)
def test_described_topology_errors_name_the_field(doc: dict, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        Topology.from_dict(doc, source="t.json")
    assert where in str(info.value)


def test_load_topology_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="invalid JSON at line 1"):
        load_topology(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_topology(tmp_path / "missing.json")


# -- sysfs backend -------------------------------------------------------------------------------------------------
def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def test_sysfs_backend_on_a_two_package_tree(tmp_path: Path) -> None:
    """A fake /sys of a two-package node: package ids, NUMA cpulists, a PCI NIC's locality, a virtual NIC."""
    root = tmp_path / "sys"
    _write(root / "devices/system/cpu/online", "0-7")
    for cpu in range(8):
        _write(root / f"devices/system/cpu/cpu{cpu}/topology/physical_package_id", str(cpu // 4))
        _write(root / f"devices/system/cpu/cpu{cpu}/topology/core_id", str(cpu % 4))
    _write(root / "devices/system/node/node0/cpulist", "0-3")
    _write(root / "devices/system/node/node1/cpulist", "4-7")
    pci = root / "devices/pci0000:80/0000:81:00.0"
    _write(pci / "local_cpulist", "4-7")
    _write(pci / "numa_node", "1")
    (pci / "net").mkdir()
    net = root / "class/net"
    net.mkdir(parents=True)
    (net / "fake0").mkdir()
    (net / "fake0/device").symlink_to(pci)
    (net / "fakev").mkdir()  # virtual: no device link
    (net / "lo").mkdir()
    topo = from_sysfs(root)
    assert [(p.os_index, format_cpulist(p.cpus)) for p in topo.packages] == [(0, "0-3"), (1, "4-7")]
    assert [format_cpulist(n.cpus) for n in topo.numa_nodes] == ["0-3", "4-7"]
    assert len(topo.cores) == 8 and {c.package for c in topo.cores} == {0, 1}
    fake0, fakev = topo.nic("fake0"), topo.nic("fakev")
    assert format_cpulist(fake0.local_cpus) == "4-7" and fake0.numa_node == 1
    assert fake0.pci == "0000:81:00.0" and not fake0.virtual
    assert fakev.virtual and fakev.local_cpus == topo.cpus and fakev.pci is None
    with pytest.raises(KeyError):
        topo.nic("lo")  # loopback is never a NIC


def test_sysfs_backend_on_this_host() -> None:
    topo = from_sysfs()
    assert topo.source == "sysfs"
    assert set(os.sched_getaffinity(0)) <= topo.cpus
    assert all(n.name != "lo" for n in topo.nics)
    for nic in topo.nics:
        assert nic.local_cpus and nic.local_cpus <= topo.cpus


# -- hwloc backend ---------------------------------------------------------------------------------------------
def test_ci_installs_pyhwloc() -> None:
    """CI installs pyhwloc (tools/env.sh with CI=true) so that the hwloc backend is exercised there."""
    if os.environ.get("CI") != "true":
        pytest.skip("not CI: pyhwloc is optional (it declares Python >= 3.12)")
    assert hwloc_available()


@needs_hwloc
def test_hwloc_xml_aurora_like() -> None:
    """An hwloc XML export of a (scaled-down) two-package node with four NICs per package."""
    topo = load_topology(AURORA_XML)
    assert topo.source.startswith("hwloc xml")
    assert [format_cpulist(p.cpus) for p in topo.packages] == ["0-3", "4-7"]
    assert [n.os_index for n in topo.numa_nodes] == [0, 1]
    assert len(topo.cores) == 8
    assert [n.name for n in topo.candidate_nics()] == [f"hsn{i}" for i in range(8)]  # planned by name
    for nic in topo.nics:
        pkg = int(nic.name[3:]) // 4
        assert nic.local_cpus == topo.packages[pkg].cpus and nic.numa_node == pkg
        assert nic.addresses == () and nic.pci is not None


@needs_hwloc
def test_hwloc_backend_agrees_with_sysfs() -> None:
    hw, fs = from_hwloc(), from_sysfs()
    assert hw.source == "hwloc" and discover("auto").source == "hwloc"
    assert hw.cpus == fs.cpus
    assert [p.cpus for p in hw.packages] == [p.cpus for p in fs.packages]
    assert {n.name for n in hw.nics} == {n.name for n in fs.nics}
    for nic in hw.nics:
        assert nic.addresses == fs.nic(nic.name).addresses


def test_hwloc_missing_is_a_clear_error(tmp_path: Path) -> None:
    if hwloc_available():
        with pytest.raises(ConfigError, match="hwloc could not load"):
            load_topology(tmp_path / "absent.xml")
    else:
        with pytest.raises(ConfigError, match="needs pyhwloc"):
            load_topology(AURORA_XML)


def test_unknown_backend() -> None:
    with pytest.raises(ConfigError, match="unknown topology backend"):
        discover("lstopo")


# -- CLI -----------------------------------------------------------------------------------------------------------
def _cli(*args: str) -> Any:
    from click.testing import CliRunner

    from svcframe.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_cli_topology_json_and_table() -> None:
    out = _cli("topology", "--json", "--from", str(AURORA), "--policies")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["packages"] == load_topology(AURORA).to_dict()["packages"]
    assert len(doc["policies"]) == 12 and all(row["nic"] for row in doc["policies"])
    table = _cli("topology", "--from", str(ONE_PACKAGE))
    assert table.exit_code == 0, table.output
    assert "eth3" in table.output and "docker0" in table.output
    here = _cli("topology", "--json", "--backend", "sysfs")
    assert here.exit_code == 0 and json.loads(here.output)["source"] == "sysfs"
    bad = _cli("topology", "--backend", "nope")
    assert bad.exit_code != 0
