"""Node topology for the plumber: CPU packages, NUMA nodes, cores, and network interfaces with their PCI
locality (the cores "close" to each NIC), as hwloc's ``lstopo`` shows them (Carns et al. 2025, Figure 3).

Sources, best first (``discover(backend="auto")``):

* ``hwloc``: the hwloc library through ``pyhwloc``, when it imports. A NIC is an OS device of type
  *network*; its locality is the cpuset of its first non-I/O ancestor (what Mochi's plumber uses).
* ``sysfs``: Linux ``/sys`` (``/sys/devices/system/cpu/cpu*/topology/{physical_package_id,core_id}``,
  ``/sys/devices/system/node/node*/cpulist``, ``/sys/class/net/*/device/{local_cpulist,numa_node}``).

Both backends add the interfaces the other cannot see as PCI devices (veth, bridges, tunnels) as *virtual*
NICs local to every core, and take IP addresses and link state from ``psutil`` (hwloc knows none). The
loopback interface is never a NIC.

* A *described* topology (``load_topology(path)``) for tests and for planning a deployment elsewhere: a
  JSON document in the shape of ``Topology.to_dict()`` (below), or an hwloc XML file (``lstopo foo.xml``
  on the target machine) read through pyhwloc. A described topology carries no live process state.

JSON shape (CPU sets in the Linux list format, ``"0-51,104-155"``)::

    {"host": "aurora-like", "source": "...",
     "packages":   [{"os_index": 0, "cpus": "0-51,104-155"}, ...],
     "numa_nodes": [{"os_index": 0, "cpus": "0-51,104-155"}, ...],        (optional: one per package)
     "cores":      [{"os_index": 0, "package": 0, "cpus": "0,104"}, ...], (optional: one per CPU)
     "nics": [{"name": "hsn0", "addresses": ["10.98.0.1"], "local_cpus": "0-51,104-155",
               "numa_node": 0, "pci": "0000:18:00.0", "virtual": false, "up": true}, ...]}

``local_cpus`` omitted means local to every CPU; ``up`` defaults to true, ``virtual`` to false.
"""

from __future__ import annotations

import contextlib
import fnmatch
import ipaddress
import json
import os
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

#: The topology backends, by name (``svcframe topology --backend`` choices).
BACKENDS = ("auto", "hwloc", "sysfs")

SYS = Path("/sys")
_PCI_BUSID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


# -- CPU sets ---------------------------------------------------------------------------------------------
def parse_cpulist(text: str) -> frozenset[int]:
    """Parse the Linux CPU list format (``"0-3,8,10-11"``; empty string = no CPU).

    Raises:
        ValueError: malformed text.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep:
            first, last = int(lo), int(hi)
            if last < first:
                raise ValueError(f"bad CPU range {part!r} in {text!r}")
            cpus.update(range(first, last + 1))
        else:
            cpus.add(int(part))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The Linux CPU list format of a set of CPU numbers (``{0, 1, 2, 5}`` -> ``"0-2,5"``)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


# -- the model --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Package:
    """A CPU package (socket): its OS index and CPUs (processing units, OS numbering)."""

    os_index: int
    cpus: frozenset[int]


@dataclass(frozen=True)
class NumaNode:
    """A NUMA node: its OS index and CPUs."""

    os_index: int
    cpus: frozenset[int]


@dataclass(frozen=True)
class Core:
    """A physical core: its OS index (unique within its package only), package and CPUs (hardware threads)."""

    os_index: int
    package: int | None
    cpus: frozenset[int]


@dataclass(frozen=True)
class Nic:
    """A network interface.

    Attributes:
        name: interface name (``hsn0``, ``eth0``, ``ib0``).
        addresses: its IP addresses, IPv4 first, without link-local ones (an empty tuple when unknown).
        local_cpus: PCI locality, the CPUs of its first non-I/O ancestor (every CPU when not known).
        numa_node: the NUMA node it is attached to, None when unknown or several.
        pci: PCI bus id (``0000:18:00.0``) or None (virtual interface, or unknown).
        virtual: not a PCI device (veth, bridge, tunnel, ...).
        up: the link is up (operational state up or unknown).
    """

    name: str
    addresses: tuple[str, ...] = ()
    local_cpus: frozenset[int] = frozenset()
    numa_node: int | None = None
    pci: str | None = None
    virtual: bool = False
    up: bool = True

    def address_for(self, family: int | None = None) -> str | None:
        """The first address of ``family`` (``socket.AF_INET`` / ``AF_INET6``; None = IPv4 first), or None."""
        for addr in self.addresses:
            version = ipaddress.ip_address(addr).version
            if (
                family is None
                or (family == socket.AF_INET and version == 4)
                or (family == socket.AF_INET6 and version == 6)
            ):
                return addr
        return None


@dataclass(frozen=True)
class Topology:
    """One node: packages, NUMA nodes, cores, NICs, where they came from (``source``) and the host name."""

    packages: tuple[Package, ...]
    numa_nodes: tuple[NumaNode, ...] = ()
    cores: tuple[Core, ...] = ()
    nics: tuple[Nic, ...] = ()
    host: str = ""
    source: str = "described"
    _cpu_package: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    _cpu_numa: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.packages:
            raise ConfigError("a topology needs at least one package")
        for pkg in self.packages:
            for cpu in pkg.cpus:
                self._cpu_package.setdefault(cpu, pkg.os_index)
        for node in self.numa_nodes:
            for cpu in node.cpus:
                self._cpu_numa.setdefault(cpu, node.os_index)

    @property
    def cpus(self) -> frozenset[int]:
        """Every CPU (processing unit) of the node."""
        return frozenset(self._cpu_package)

    def package_of(self, cpu: int) -> int | None:
        """OS index of the package holding ``cpu`` (None if the topology does not list that CPU)."""
        return self._cpu_package.get(cpu)

    def numa_of(self, cpu: int) -> int | None:
        """OS index of the NUMA node holding ``cpu`` (None if unknown)."""
        return self._cpu_numa.get(cpu)

    def nic(self, name: str) -> Nic:
        """The NIC called ``name``. Raises KeyError."""
        for nic in self.nics:
            if nic.name == name:
                return nic
        raise KeyError(name)

    def candidate_nics(self, interfaces: list[str] | None = None) -> list[Nic]:
        """The NICs the plumber may choose from, in name order.

        Args:
            interfaces: shell patterns (``fnmatch``) of interface names. None: every physical NIC that is
                up and has an address (any address: when no NIC of the topology has one, it describes
                another machine and NICs are chosen by name); virtual interfaces only when there is no such physical NIC (a
                container or network namespace with veth pairs only). Given: exactly the matching NICs
                that are up and have an address, physical or virtual.

        Returns:
            the candidates, sorted by name (natural order: ``hsn2`` before ``hsn10``).
        """
        # A described topology from another machine (an hwloc XML export) has no addresses at all: plan by name.
        planning = not any(n.addresses for n in self.nics)
        usable = [n for n in self.nics if n.up and (n.addresses or planning)]
        if interfaces is not None:
            chosen = [n for n in usable if any(fnmatch.fnmatchcase(n.name, p) for p in interfaces)]
        else:
            chosen = [n for n in usable if not n.virtual] or usable
        return sorted(chosen, key=lambda n: _natural_key(n.name))

    # -- JSON ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON document of this topology (the described-topology file format)."""
        return {
            "host": self.host,
            "source": self.source,
            "packages": [{"os_index": p.os_index, "cpus": format_cpulist(p.cpus)} for p in self.packages],
            "numa_nodes": [{"os_index": n.os_index, "cpus": format_cpulist(n.cpus)} for n in self.numa_nodes],
            "cores": [
                {"os_index": c.os_index, "package": c.package, "cpus": format_cpulist(c.cpus)} for c in self.cores
            ],
            "nics": [
                {
                    "name": n.name,
                    "addresses": list(n.addresses),
                    "local_cpus": format_cpulist(n.local_cpus),
                    "numa_node": n.numa_node,
                    "pci": n.pci,
                    "virtual": n.virtual,
                    "up": n.up,
                }
                for n in self.nics
            ],
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "described") -> Topology:
        """Build a topology from its JSON document (see the module docstring).

        Raises:
            ConfigError: a missing or malformed field, named by its JSON path.
        """
        path = "topology"
        try:
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            path = "packages"
            packages = tuple(Package(int(p["os_index"]), parse_cpulist(str(p["cpus"]))) for p in data["packages"])
            all_cpus = frozenset().union(*(p.cpus for p in packages))
            path = "numa_nodes"
            numa = tuple(
                NumaNode(int(n["os_index"]), parse_cpulist(str(n["cpus"]))) for n in data.get("numa_nodes") or []
            )
            if not numa:
                numa = tuple(NumaNode(p.os_index, p.cpus) for p in packages)
            path = "cores"
            cores = tuple(
                Core(int(c["os_index"]), None if c.get("package") is None else int(c["package"]),
                     parse_cpulist(str(c["cpus"])))
                for c in data.get("cores") or []
            )  # fmt: skip
            if not cores:
                cpu_pkg = {cpu: p.os_index for p in packages for cpu in p.cpus}
                cores = tuple(Core(cpu, cpu_pkg[cpu], frozenset({cpu})) for cpu in sorted(all_cpus))
            nics = []
            for i, n in enumerate(data.get("nics") or []):
                path = f"nics[{i}]"
                local = n.get("local_cpus")
                addresses = tuple(str(a) for a in n.get("addresses") or [])
                for a in addresses:
                    ipaddress.ip_address(a)
                nics.append(
                    Nic(
                        name=str(n["name"]),
                        addresses=addresses,
                        local_cpus=parse_cpulist(str(local)) if local else all_cpus,
                        numa_node=None if n.get("numa_node") is None else int(n["numa_node"]),
                        pci=n.get("pci"),
                        virtual=bool(n.get("virtual", False)),
                        up=bool(n.get("up", True)),
                    )
                )
            return cls(packages, numa, cores, tuple(nics), host=str(data.get("host", "")), source=source)
        except KeyError as exc:
            raise ConfigError(f"{source}: {path}: missing field {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {path}: {exc}") from None


def _natural_key(name: str) -> tuple[Any, ...]:
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail else -1, name)


# -- addresses and link state (psutil) -----------------------------------------------------------------------
def interface_addresses() -> dict[str, tuple[str, ...]]:
    """IP addresses per interface from ``psutil.net_if_addrs()``: IPv4 first, link-local ones left out."""
    import psutil

    out: dict[str, tuple[str, ...]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        v4, v6 = [], []
        for a in addrs:
            if a.family == socket.AF_INET:
                v4.append(a.address)
            elif a.family == socket.AF_INET6:
                text = a.address.split("%", 1)[0]
                with contextlib.suppress(ValueError):
                    if not ipaddress.ip_address(text).is_link_local:
                        v6.append(text)
        out[name] = tuple(v4 + v6)
    return out


def interface_up() -> dict[str, bool]:
    """Link state per interface (psutil ``isup``)."""
    import psutil

    return {name: st.isup for name, st in psutil.net_if_stats().items()}


def _is_loopback(name: str, addresses: tuple[str, ...], sys_root: Path) -> bool:
    if name == "lo":
        return True
    with contextlib.suppress(OSError, ValueError):
        flags = int((sys_root / "class" / "net" / name / "flags").read_text(), 16)
        if flags & 0x8:  # IFF_LOOPBACK
            return True
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


# -- sysfs backend ---------------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def from_sysfs(sys_root: Path = SYS) -> Topology:
    """The topology of this host from Linux sysfs, with addresses and link state from psutil.

    Args:
        sys_root: the sysfs mount (tests may point it at a copy).

    Raises:
        ConfigError: sysfs is not readable (not Linux).
    """
    cpu_root = sys_root / "devices" / "system" / "cpu"
    online = _read(cpu_root / "online")
    if online is None:
        raise ConfigError(f"cannot read {cpu_root / 'online'}: the sysfs topology backend needs Linux")
    cpus = sorted(parse_cpulist(online))
    pkg_cpus: dict[int, set[int]] = {}
    core_cpus: dict[tuple[int, int], set[int]] = {}
    for cpu in cpus:
        topo = cpu_root / f"cpu{cpu}" / "topology"
        pkg = int(_read(topo / "physical_package_id") or 0)
        pkg = max(pkg, 0)  # -1 on some virtual machines
        core = int(_read(topo / "core_id") or cpu)
        pkg_cpus.setdefault(pkg, set()).add(cpu)
        core_cpus.setdefault((pkg, core), set()).add(cpu)
    packages = tuple(Package(p, frozenset(c)) for p, c in sorted(pkg_cpus.items()))
    numa = []
    node_root = sys_root / "devices" / "system" / "node"
    for node_dir in sorted(node_root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        text = _read(node_dir / "cpulist")
        if text is not None:
            numa.append(NumaNode(int(node_dir.name[4:]), parse_cpulist(text) & frozenset(cpus)))
    cores = tuple(Core(core, pkg, frozenset(c)) for (pkg, core), c in sorted(core_cpus.items()))
    all_cpus = frozenset(cpus)
    nics = _sysfs_nics(sys_root, all_cpus, skip=set())
    return Topology(packages, tuple(numa), cores, tuple(nics), host=socket.gethostname(), source="sysfs")


def _sysfs_nics(sys_root: Path, all_cpus: frozenset[int], skip: set[str]) -> list[Nic]:
    addresses = interface_addresses()
    up = interface_up()
    nics = []
    net_root = sys_root / "class" / "net"
    names = sorted({p.name for p in net_root.glob("*")} | set(addresses)) if net_root.exists() else sorted(addresses)
    for name in names:
        if name in skip:
            continue
        addrs = addresses.get(name, ())
        if _is_loopback(name, addrs, sys_root):
            continue
        device = net_root / name / "device"
        local = numa_node = pci = None
        virtual = not device.exists()
        if not virtual:
            real = Path(os.path.realpath(device))
            pci_dir = next((d for d in (real, *real.parents) if _PCI_BUSID.match(d.name)), None)
            pci = pci_dir.name if pci_dir is not None else None
            places = [device] + ([pci_dir] if pci_dir is not None else [])
            text = next((t for t in (_read(d / "local_cpulist") for d in places) if t), None)
            local = parse_cpulist(text) & all_cpus if text else None
            node = next((t for t in (_read(d / "numa_node") for d in places) if t), None)
            numa_node = int(node) if node and int(node) >= 0 else None
        nics.append(
            Nic(
                name=name,
                addresses=addrs,
                local_cpus=local or all_cpus,
                numa_node=numa_node,
                pci=pci,
                virtual=virtual,
                up=up.get(name, False),
            )
        )
    return nics


# -- hwloc backend (pyhwloc) -------------------------------------------------------------------------------------
def hwloc_available() -> bool:
    """True when pyhwloc imports (and so the hwloc backend and hwloc XML files can be used)."""
    try:
        import pyhwloc  # noqa: F401
    except Exception:  # ImportError, or OSError from a missing libhwloc
        return False
    return True


def _require_pyhwloc() -> Any:
    try:
        import pyhwloc
    except Exception as exc:
        raise ConfigError(
            f"the hwloc backend needs pyhwloc, which does not import here ({type(exc).__name__}: {exc}); "
            "install it (pip install pyhwloc; on Python 3.11 add --ignore-requires-python) or use the sysfs backend"
        ) from None
    return pyhwloc


def from_hwloc(xml_path: str | os.PathLike[str] | None = None) -> Topology:
    """The topology from hwloc (pyhwloc): this host (``xml_path`` None) or an hwloc XML export.

    For this host, addresses and link state come from psutil and the interfaces hwloc does not report
    (virtual ones) are added from sysfs. An XML file describes another machine: no addresses (its NICs can
    be planned for, not bound to).

    Raises:
        ConfigError: pyhwloc does not import, or the XML file cannot be loaded.
    """
    pyhwloc = _require_pyhwloc()
    from pyhwloc.hwloc.core import ObjOsdevType, ObjType, TypeFilter

    try:
        if xml_path is None:
            topo = pyhwloc.Topology.from_this_system().set_io_types_filter(TypeFilter.KEEP_ALL).load()
        else:
            topo = pyhwloc.Topology.from_xml_file(os.fspath(xml_path)).set_io_types_filter(TypeFilter.KEEP_ALL).load()
    except Exception as exc:
        where = xml_path or "this system"
        raise ConfigError(f"hwloc could not load the topology of {where}: {exc}") from None
    try:
        all_cpus = frozenset(topo.cpuset)
        packages = tuple(Package(p.os_index, frozenset(p.cpuset)) for p in topo.iter_packages())
        if not packages:
            packages = (Package(0, all_cpus),)
        numa = tuple(NumaNode(n.os_index, frozenset(n.cpuset)) for n in topo.iter_numa_nodes())
        cores = []
        for c in topo.iter_cores():
            pkg = c.get_ancestor_obj_by_type(ObjType.PACKAGE)
            cores.append(Core(c.os_index, pkg.os_index if pkg is not None else None, frozenset(c.cpuset)))
        nodes_by_index = {n.os_index: n for n in numa}
        nics = []
        for dev in topo.iter_os_devices():
            attr = dev.attr
            if attr is None or not attr.types & ObjOsdevType.NETWORK or not dev.name:
                continue
            anc = dev.parent
            pci = None
            while anc is not None and anc.is_io():
                if pci is None and anc.is_pci_device():
                    a = anc.attr
                    pci = f"{a.domain:04x}:{a.bus:02x}:{a.dev:02x}.{a.func:x}"
                anc = anc.parent
            local = frozenset(anc.cpuset) if anc is not None and anc.cpuset is not None else all_cpus
            node_ids = [
                i for i in (anc.nodeset if anc is not None and anc.nodeset is not None else []) if i in nodes_by_index
            ]
            nics.append(
                Nic(dev.name, (), local or all_cpus, node_ids[0] if len(node_ids) == 1 else None, pci, False, True)
            )
    finally:
        topo.destroy()
    if xml_path is None:
        addresses = interface_addresses()
        up = interface_up()
        nics = [
            Nic(n.name, addresses.get(n.name, ()), n.local_cpus, n.numa_node, n.pci, n.virtual, up.get(n.name, False))
            for n in nics
        ]
        nics += [n for n in _sysfs_nics(SYS, all_cpus, skip={n.name for n in nics}) if n.virtual]
        return Topology(packages, numa, tuple(cores), tuple(nics), host=socket.gethostname(), source="hwloc")
    return Topology(packages, numa, tuple(cores), tuple(nics), host="", source=f"hwloc xml {xml_path}")


# -- entry points --------------------------------------------------------------------------------------------
def discover(backend: str = "auto") -> Topology:
    """This host's topology.

    Args:
        backend: ``auto`` (hwloc when pyhwloc imports, else sysfs), ``hwloc`` or ``sysfs``.

    Raises:
        ConfigError: unknown backend, or the chosen backend cannot read the topology.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown topology backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "hwloc" or (backend == "auto" and hwloc_available()):
        return from_hwloc()
    return from_sysfs()


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """A described topology: a ``.json`` document (module docstring) or an hwloc ``.xml`` export.

    Raises:
        ConfigError: unreadable or malformed file; an XML file without pyhwloc.
    """
    p = Path(path)
    if p.suffix.lower() == ".xml":
        return from_hwloc(p)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    return Topology.from_dict(data, source=f"file {p}")
