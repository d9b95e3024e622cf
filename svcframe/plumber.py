"""The plumber: choose the network interface (NIC) a process uses, once, at start-up.

Source: Carns et al. 2025, section 4.1.1 and Figure 5 (``papers/carns2025-data-service-roofline.txt``), and
Mochi's ``mochi-plumber`` (``notes/mochi-facts.md`` §4). Figure 2 of the paper shows why: on a node with eight
NICs, choosing by the process's cpuset overloads some NICs and leaves others idle as soon as processes are
bound to several cores or not bound at all. The plumber has two tiers:

1. The **bucket policy** splits the node's NICs into buckets by locality; the process's bucket is the one
   holding the CPU it runs on (Mochi: ``hwloc_get_last_cpu_location``).

   ===============  =================================================================================
   ``all``          one bucket holding every NIC
   ``package``      one bucket per CPU package (socket): the NICs local to that package
   ``numa``         one bucket per NUMA node: the NICs local to that node
   ``passthrough``  no choice: the OS routes
   ===============  =================================================================================

2. The **NIC policy** picks one NIC inside the bucket (a bucket of one NIC gives it directly):

   ===============  =================================================================================
   ``byset``        ``first CPU of the process's cpuset % n`` (Mochi; Mercury's default is cpuset-based)
   ``bycore``       ``CPU the process runs on % n``
   ``random``       a pseudo-random index seeded by the pid (Mochi: ``srand(getpid()); rand() % n``)
   ``roundrobin``   the index after the last one any process took from this bucket: a counter in a
                    control file under an exclusive lock, shared by unrelated processes of one user
   ``passthrough``  no choice: the OS routes
   ===============  =================================================================================

Defaults are ``package`` + ``roundrobin`` (the paper's choice after experiments on every platform of its
study). ``passthrough`` in either slot, a bucket with no NIC, or no NIC at all means no choice.

Unlike Mochi (CXI/Slingshot only), any NIC with an IP address is a candidate (``Topology.candidate_nics``).
A NIC belongs to every bucket whose CPUs its locality cpuset touches: for a NIC under a package that is
that package (as in Mochi), and a NIC local to no single package (a virtual interface, or one attached
above the packages) joins them all.

Round-robin control files live in ``$SVCFRAME_PLUMBER_DIR`` or else ``/tmp/svcframe-plumber-<uid>/``
(mode 0700, checked to belong to this user): one fixed place per user and node, like Mochi's
``/tmp/<user>-mochi-plumber/``. ``$XDG_RUNTIME_DIR`` and ``$TMPDIR`` are not used on purpose: they differ
between a login shell and a batch job, and processes that disagree on the directory are not arbitrated.
A file is named after the bucket's NICs, so processes that see the same bucket share one counter. Locking
is ``filelock`` (``flock`` on Linux); the file holds ``{"last_index": i, "selections": k}``.

Applying the choice (``plumb_address``): a server whose ``engine.address`` has a wildcard host
(``tcp://0.0.0.0:PORT``, ``tcp://[::]:PORT`` or ``tcp://*:PORT``, the analogue of Mochi's generic
``cxi://``) listens on the chosen NIC's address and binds its outgoing connections there; an address that
names a host (the default ``tcp://127.0.0.1:0`` included) is used as given. A client engine binds its
outgoing connections to ``choose_local_host(...).address`` (``Engine(None, local_host=...)``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .errors import ConfigError
from .topology import Nic, Topology, discover, load_topology

log = logging.getLogger("svcframe.plumber")

#: Environment variable naming the round-robin control directory (default ``/tmp/svcframe-plumber-<uid>``).
CONTROL_DIR_ENV = "SVCFRAME_PLUMBER_DIR"
#: Hosts of ``tcp://HOST:PORT`` that ask the plumber to choose the NIC.
WILDCARD_HOSTS = ("0.0.0.0", "::", "*")
#: Longest wait for a round-robin control file held by another process (seconds).
LOCK_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Placement:
    """Where a process runs, as the plumber sees it.

    Attributes:
        cpuset: the CPUs the process may run on (its affinity mask).
        current_cpu: the CPU it last ran on.
        pid: its process id (seeds the ``random`` policy).
    """

    cpuset: frozenset[int]
    current_cpu: int
    pid: int = 0

    @classmethod
    def this_process(cls) -> Placement:
        """The calling process: ``sched_getaffinity`` and the CPU it runs on now (``psutil cpu_num``)."""
        import psutil

        cpuset = frozenset(os.sched_getaffinity(0))
        try:
            cpu = psutil.Process().cpu_num()
        except (AttributeError, psutil.Error):
            cpu = min(cpuset)
        return cls(cpuset, cpu, os.getpid())


@dataclass(frozen=True)
class Bucket:
    """A group of NICs (tier one). ``name`` is ``all``, ``package N`` or ``numa N``."""

    name: str
    cpus: frozenset[int]
    nics: tuple[Nic, ...]


@dataclass(frozen=True)
class NicChoice:
    """The plumber's answer.

    Attributes:
        bucket_policy, nic_policy: the policies applied.
        nic: the chosen interface name, None for no choice (the OS routes).
        address: the chosen NIC's IP address, None for no choice.
        bucket: the process's bucket (``package 1``), None when no bucket was formed.
        bucket_nics: names of the NICs in that bucket.
        index: the chosen NIC's index in ``bucket_nics``.
        selection: for ``roundrobin``, the number of selections made in this bucket so far (this one included).
        reason: one sentence saying why.
        topology: where the topology came from (``hwloc``, ``sysfs``, ``file ...``).
    """

    bucket_policy: str
    nic_policy: str
    nic: str | None
    address: str | None
    bucket: str | None
    bucket_nics: tuple[str, ...]
    index: int | None
    reason: str
    topology: str | None = None
    selection: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the ``engine.plumber.chosen`` section of a live configuration)."""
        return {
            "nic": self.nic,
            "address": self.address,
            "bucket": self.bucket,
            "bucket_nics": list(self.bucket_nics),
            "index": self.index,
            "selection": self.selection,
            "reason": self.reason,
            "topology": self.topology,
        }


# -- tier one: buckets ------------------------------------------------------------------------------------
def _bucket_all(topology: Topology, nics: list[Nic]) -> list[Bucket]:
    return [Bucket("all", topology.cpus, tuple(nics))]


def _bucket_package(topology: Topology, nics: list[Nic]) -> list[Bucket]:
    return [
        Bucket(f"package {p.os_index}", p.cpus, tuple(n for n in nics if n.local_cpus & p.cpus))
        for p in topology.packages
    ]


def _bucket_numa(topology: Topology, nics: list[Nic]) -> list[Bucket]:
    return [
        Bucket(f"numa {node.os_index}", node.cpus, tuple(n for n in nics if n.local_cpus & node.cpus))
        for node in topology.numa_nodes
    ] or _bucket_package(topology, nics)


#: Bucket policies (tier one), by name; None = passthrough. Carns 2025 §4.1.1 / Figure 5; Mochi plumber.
BUCKET_POLICIES: dict[str, Callable[[Topology, list[Nic]], list[Bucket]] | None] = {
    "all": _bucket_all,
    "package": _bucket_package,
    "numa": _bucket_numa,
    "passthrough": None,
}


def buckets(topology: Topology, bucket_policy: str, interfaces: list[str] | None = None) -> list[Bucket]:
    """The buckets of ``topology`` under ``bucket_policy`` (Carns 2025 §4.1.1, Figure 5).

    Args:
        topology: the node.
        bucket_policy: ``all``, ``package`` or ``numa``.
        interfaces: name patterns restricting the candidate NICs (``Topology.candidate_nics``).

    Returns:
        the buckets in package/NUMA order; each holds its NICs in name order (possibly none).

    Raises:
        ConfigError: unknown or passthrough policy.
    """
    fn = BUCKET_POLICIES.get(bucket_policy)
    if fn is None:
        forming = ", ".join(name for name, policy in BUCKET_POLICIES.items() if policy is not None)
        raise ConfigError(f"bucket_policy {bucket_policy!r} forms no buckets; choose from {forming}")
    return fn(topology, topology.candidate_nics(interfaces))


# -- tier two: one NIC of the bucket --------------------------------------------------------------------------
@dataclass
class _Pick:
    index: int
    how: str
    selection: int | None = None


def _nic_byset(bucket: Bucket, placement: Placement, control: Path | None, dry_run: bool) -> _Pick:
    first = min(placement.cpuset)
    n = len(bucket.nics)
    return _Pick(first % n, f"byset: first CPU of the cpuset {first} % {n}")


def _nic_bycore(bucket: Bucket, placement: Placement, control: Path | None, dry_run: bool) -> _Pick:
    n = len(bucket.nics)
    return _Pick(placement.current_cpu % n, f"bycore: current CPU {placement.current_cpu} % {n}")


def _nic_random(bucket: Bucket, placement: Placement, control: Path | None, dry_run: bool) -> _Pick:
    n = len(bucket.nics)
    return _Pick(random.Random(placement.pid).randrange(n), f"random: seeded by pid {placement.pid}")


def _nic_roundrobin(bucket: Bucket, placement: Placement, control: Path | None, dry_run: bool) -> _Pick:
    n = len(bucket.nics)
    path = control_file(bucket, control)
    index, selection = (peek_roundrobin if dry_run else take_roundrobin)(path, n)
    verb = "would take" if dry_run else "took"
    return _Pick(index, f"roundrobin: {verb} selection {selection} of this bucket ({path})", selection)


#: NIC policies (tier two), by name; None = passthrough. Carns 2025 §4.1.1 / Figure 5; Mochi plumber.
NIC_POLICIES: dict[str, Callable[[Bucket, Placement, Path | None, bool], _Pick] | None] = {
    "byset": _nic_byset,
    "bycore": _nic_bycore,
    "random": _nic_random,
    "roundrobin": _nic_roundrobin,
    "passthrough": None,
}


#: The paper's choice after experiments on every platform of its study (Carns 2025 §4.1.1).
DEFAULT_BUCKET_POLICY = "package"
DEFAULT_NIC_POLICY = "roundrobin"


class PlumberSettings(Protocol):
    """The plumber's settings as it reads them: ``svcframe.config.PlumberConfig`` (the ``engine.plumber``
    section of a bootstrap config) has them; the plumber does not import the config layer above it."""

    @property
    def bucket_policy(self) -> str: ...
    @property
    def nic_policy(self) -> str: ...
    @property
    def interfaces(self) -> list[str] | None: ...
    @property
    def topology_file(self) -> str | None: ...


@dataclass(frozen=True)
class _Defaults:
    bucket_policy: str = DEFAULT_BUCKET_POLICY
    nic_policy: str = DEFAULT_NIC_POLICY
    interfaces: list[str] | None = None
    topology_file: str | None = None


# -- the round-robin control files ------------------------------------------------------------------------------
def control_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    """The round-robin control directory, created (mode 0700) if missing.

    Args:
        directory: explicit directory; default ``$SVCFRAME_PLUMBER_DIR`` or ``/tmp/svcframe-plumber-<uid>``.

    Raises:
        ConfigError: the directory is a symlink, belongs to another user, or is open to group/others (a
            shared counter another user could tamper with).
    """
    if directory is None:
        directory = os.environ.get(CONTROL_DIR_ENV) or f"/tmp/svcframe-plumber-{os.getuid()}"
    path = Path(directory)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    st = path.lstat()
    if path.is_symlink() or not path.is_dir():
        raise ConfigError(
            f"plumber control directory {path} is not a plain directory; remove it or set {CONTROL_DIR_ENV}"
        )
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ConfigError(
            f"plumber control directory {path} must belong to uid {os.getuid()} with mode 0700 "
            f"(found uid {st.st_uid}, mode {st.st_mode & 0o777:o}); fix it or set {CONTROL_DIR_ENV}"
        )
    return path


def control_file(bucket: Bucket, directory: Path | None = None) -> Path:
    """The control file of ``bucket``: named after its NICs, so every process seeing that bucket shares it."""
    names = [n.name for n in bucket.nics]
    digest = hashlib.sha1("\0".join(names).encode()).hexdigest()[:10]
    return (directory or control_dir()) / f"rr-{names[0]}-{names[-1]}-{len(names)}-{digest}.json"


def _read_counter(path: Path) -> tuple[int, int]:
    try:
        data = json.loads(path.read_text())
        return int(data["last_index"]), int(data["selections"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1, 0  # missing (first use) or unreadable: start over, as Mochi does


def take_roundrobin(path: Path, n: int) -> tuple[int, int]:
    """Take the next index of a bucket of ``n`` NICs under an exclusive lock; return (index, selection number).

    Raises:
        ConfigError: the lock could not be taken within ``LOCK_TIMEOUT_SECONDS``.
    """
    from filelock import FileLock, Timeout

    lock = FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_SECONDS, mode=0o600)
    try:
        with lock:
            last, selections = _read_counter(path)
            index = (last + 1) % n if 0 <= last < n else 0
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"last_index": index, "selections": selections + 1}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except Timeout:
        raise ConfigError(f"could not lock {path}.lock within {LOCK_TIMEOUT_SECONDS:g} s") from None
    return index, selections + 1


def peek_roundrobin(path: Path, n: int) -> tuple[int, int]:
    """The index ``take_roundrobin`` would return next, without taking it (no lock: advisory only)."""
    last, selections = _read_counter(path)
    return ((last + 1) % n if 0 <= last < n else 0), selections + 1


# -- the choice -------------------------------------------------------------------------------------------------
def select_nic(
    topology: Topology,
    bucket_policy: str = DEFAULT_BUCKET_POLICY,
    nic_policy: str = DEFAULT_NIC_POLICY,
    *,
    placement: Placement | None = None,
    interfaces: list[str] | None = None,
    family: int | None = None,
    control: str | os.PathLike[str] | None = None,
    dry_run: bool = False,
) -> NicChoice:
    """Choose this process's NIC (Carns 2025 §4.1.1, Figure 5; Mochi ``mochi_plumber_resolve_nic``).

    Args:
        topology: the node.
        bucket_policy: ``all`` | ``package`` | ``numa`` | ``passthrough``.
        nic_policy: ``byset`` | ``bycore`` | ``random`` | ``roundrobin`` | ``passthrough``.
        placement: the process's cpuset and current CPU (default: the calling process).
        interfaces: interface-name patterns restricting the candidates (``Topology.candidate_nics``).
        family: ``socket.AF_INET`` / ``AF_INET6`` to pick the NIC's address of that family (None: IPv4 first).
        control: round-robin control directory (default ``control_dir()``).
        dry_run: ``roundrobin`` reports the index it would take without taking it.

    Returns:
        the choice; ``nic`` None when there is none (passthrough, no NIC, empty bucket), with the reason.

    Raises:
        ConfigError: an unknown policy name; an unusable control directory; a lock timeout.
    """
    if bucket_policy not in BUCKET_POLICIES:
        raise ConfigError(f"unknown bucket_policy {bucket_policy!r}; choose from {', '.join(BUCKET_POLICIES)}")
    if nic_policy not in NIC_POLICIES:
        raise ConfigError(f"unknown nic_policy {nic_policy!r}; choose from {', '.join(NIC_POLICIES)}")

    def none(reason: str, bucket: Bucket | None = None) -> NicChoice:
        return NicChoice(
            bucket_policy, nic_policy, None, None, bucket.name if bucket else None,
            tuple(n.name for n in bucket.nics) if bucket else (), None, reason, topology.source,
        )  # fmt: skip

    if bucket_policy == "passthrough" or nic_policy == "passthrough":
        return none("passthrough policy: no choice, the OS routes")
    placement = placement or Placement.this_process()
    all_buckets = buckets(topology, bucket_policy, interfaces)
    if not any(b.nics for b in all_buckets):
        return none(f"no candidate NIC on {topology.host or 'this node'} (up, with an address): the OS routes")
    cpu = placement.current_cpu
    bucket = next((b for b in all_buckets if cpu in b.cpus), None)
    if bucket is None:
        cpu = min(placement.cpuset & topology.cpus, default=-1)
        bucket = next((b for b in all_buckets if cpu in b.cpus), None)
    if bucket is None:
        return none(f"the process's CPUs are not in the topology ({topology.source}): the OS routes")
    if not bucket.nics:
        return none(f"{bucket.name} (CPU {cpu}) holds no NIC: the OS routes", bucket)
    if len(bucket.nics) == 1:
        pick = _Pick(0, "the only NIC of the bucket")
    else:
        policy = NIC_POLICIES[nic_policy]
        assert policy is not None
        pick = policy(bucket, placement, Path(control) if control else None, dry_run)
    nic = bucket.nics[pick.index]
    address = nic.address_for(family)
    names = tuple(n.name for n in bucket.nics)
    reason = (
        f"{bucket.name} (process on CPU {placement.current_cpu}) holds {', '.join(names)}; {pick.how} -> {nic.name}"
    )
    if address is None:
        wanted = "IPv4 " if family == socket.AF_INET else "IPv6 " if family == socket.AF_INET6 else ""
        reason += f", which has no {wanted}address: the OS routes"
    return NicChoice(
        bucket_policy, nic_policy, nic.name, address, bucket.name, names, pick.index, reason, topology.source,
        pick.selection,
    )  # fmt: skip


def topology_for(config: PlumberSettings) -> Topology:
    """The topology a plumber config asks for: ``topology_file`` if set, else this host's (auto backend).

    Raises:
        ConfigError: the described topology cannot be read; this host's cannot be discovered.
    """
    if config.topology_file:
        return load_topology(config.topology_file)
    return discover()


def choose(config: PlumberSettings, *, family: int | None = None, placement: Placement | None = None) -> NicChoice:
    """This process's NIC under a plumber config (policies, ``interfaces``, ``topology_file``).

    Raises:
        ConfigError: see ``select_nic`` and ``topology_for``.
    """
    if config.bucket_policy == "passthrough" or config.nic_policy == "passthrough":
        return NicChoice(config.bucket_policy, config.nic_policy, None, None, None, (), None,
                         "passthrough policy: no choice, the OS routes")  # fmt: skip
    return select_nic(
        topology_for(config), config.bucket_policy, config.nic_policy,
        placement=placement, interfaces=config.interfaces, family=family,
    )  # fmt: skip


def choose_local_host(config: PlumberSettings | None = None) -> NicChoice:
    """For a client engine: the NIC to bind outgoing connections to, ``Engine(None, local_host=c.address)``.

    Best effort, like Margo: when the topology cannot be read, the choice is None with the reason.

    Args:
        config: plumber settings, e.g. a ``svcframe.config.PlumberConfig`` (default: the default policies,
            ``package`` + ``roundrobin``, on this host's topology).
    """
    config = config or _Defaults()
    try:
        return choose(config)
    except ConfigError as exc:
        if config.topology_file:
            raise
        return NicChoice(config.bucket_policy, config.nic_policy, None, None, None, (), None, f"no choice: {exc}")


@dataclass(frozen=True)
class Plumbed:
    """An engine address after the plumber: where to listen, what to bind outgoing connections to, and why."""

    listen_address: str
    local_host: str | None
    choice: NicChoice


def _format_tcp(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def plumb_address(address: str, config: PlumberSettings) -> Plumbed:
    """Apply the plumber to a server's ``engine.address``.

    A wildcard host (``0.0.0.0``, ``::``, ``*``) is replaced by the chosen NIC's address (of the same IP
    family for ``0.0.0.0`` / ``::``), which outgoing connections are bound to as well. Any other address is
    returned unchanged with the reason: naming a host is choosing the NIC yourself, and the default
    ``tcp://127.0.0.1:0`` stays on loopback. With no choice, ``*`` becomes ``0.0.0.0`` (every interface).

    Best effort, like Margo: when this host's topology cannot be read or the control file cannot be used,
    the address stays a wildcard and the reason says why (logged as a warning).

    Raises:
        ConfigError: a malformed address; an unreadable ``topology_file``.
    """
    from .transport import parse_address

    addr = parse_address(address)
    policies = (config.bucket_policy, config.nic_policy)

    def unchanged(listen: str, reason: str) -> Plumbed:
        return Plumbed(listen, None, NicChoice(*policies, None, None, None, (), None, reason))

    if addr.scheme != "tcp":
        return unchanged(address, "unix socket: node-local, no NIC to choose")
    if addr.host not in WILDCARD_HOSTS:
        return unchanged(
            address,
            f"engine.address names host {addr.host}: used as given (the plumber chooses for a wildcard "
            "host only: tcp://0.0.0.0:PORT, tcp://[::]:PORT or tcp://*:PORT)",
        )
    wildcard = "0.0.0.0" if addr.host == "*" else addr.host
    family = {"0.0.0.0": socket.AF_INET, "::": socket.AF_INET6}.get(addr.host)
    try:
        choice = choose(config, family=family)
    except ConfigError as exc:
        if config.topology_file:
            raise
        log.warning("plumber: no NIC chosen, listening on %s: %s", wildcard, exc)
        return unchanged(_format_tcp(wildcard, addr.port), f"no choice ({exc}): listening on every interface")
    if choice.address is None:
        return Plumbed(_format_tcp(wildcard, addr.port), None, choice)
    return Plumbed(_format_tcp(choice.address, addr.port), choice.address, choice)
