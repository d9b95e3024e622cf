"""The node set of a roofline collection, and the launcher command that starts processes on one node.

Carns et al. (papers/carns2025-data-service-roofline.txt, sections 4.3 and 5) measure on N nodes: one
server node fully populated and the others as client nodes (saturation, ``Ps``), every unordered pair of
nodes (``Pc``, N(N-1)/2 pairs), the server-process sweep on one node (Figures 9 and 10) and a grid of
server nodes x client nodes (validation). A :class:`NodeSet` is the list of those nodes; where it comes
from (:func:`resolve`):

=====================  ==========================================================================
source                 nodes
=====================  ==========================================================================
``--nodes local:K``    this machine's usable cores split into K local "nodes" (node 0 gets
                       ``n // K`` cores, the remainder goes to the last nodes); all bind 127.0.0.1
``--hostfile FILE``    Open MPI (``host slots=N``) or MPICH (``host:N``) lines; ``#`` comments;
                       a host listed twice adds its slots; no slot count = 1 slot
Slurm allocation       ``SLURM_JOB_NODELIST`` expanded by python-hostlist (``scontrol show hostnames``
                       for a list it cannot parse); slots from ``SLURM_JOB_CPUS_PER_NODE``; with
                       ``--launcher srun`` or ``mpiexec`` (MPICH's Hydra starts its proxies by srun)
PBS / PALS allocation  ``PBS_NODEFILE`` (one line per slot, as mpiexec reads it)
nothing                ``local:2``: the single-machine default (server node, client node)
=====================  ==========================================================================

Launchers (DESIGN.md section 7: svcframe never starts remote processes itself). A command for ``n``
processes of one node (:func:`launcher_command`):

* ``local``: no launcher; collect forks the processes on this machine (``svcframe.launch`` and
  ``selftest.pool``). Only for local nodes.
* ``mpiexec``: MPICH/Hydra ``mpiexec -hosts HOST -n N CMD`` (the environment is propagated, Hydra's
  default); Open MPI ``mpiexec --host HOST:N -n N CMD``.
* ``srun``: ``srun --nodes=1 --ntasks=N --nodelist=HOST --overlap --overcommit --kill-on-bad-exit=1 CMD``,
  one job step per node group; ``--overlap`` because a node's server step and client step run at the same
  time, ``--overcommit`` because saturation runs more client processes than the node has cores.

``auto`` picks ``srun`` inside a Slurm allocation, ``mpiexec`` when a hostfile (or ``PBS_NODEFILE``) gives
the nodes, ``local`` otherwise.

Errors: :class:`NodeError` (a :class:`~svcframe.errors.SvcframeError`) for an empty or malformed
hostfile, a bad ``--nodes`` value, too few nodes, a launcher that is not installed or does not fit the
node source.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from svcframe.errors import SvcframeError

LAUNCHERS = ("auto", "local", "mpiexec", "srun")
"""Choices of ``--launcher``."""

MIN_NODES = 2
"""A roofline needs a server node and at least one client node."""


class NodeError(SvcframeError):
    """The node set or the launcher cannot be used (the message says what was wrong and what to do)."""


@dataclass(frozen=True)
class Node:
    """One node of the set.

    Attributes:
        name: what reports call it (``"local0"``, the host name).
        host: where processes are started (the launcher's host name) and the host servers bind to.
        slots: usable cores (processes a fully populated node runs), >= 1.
        cores: core ids to pin processes to (local nodes only; None = let the launcher place them).
    """

    name: str
    host: str
    slots: int
    cores: tuple[int, ...] | None = None


@dataclass(frozen=True)
class NodeSet:
    """The nodes of one collection, where they came from, and the launcher that starts their processes.

    Attributes:
        nodes: node 0 is the server node of the saturation test and the sweep.
        source: ``"local"``, ``"hostfile:PATH"``, ``"slurm"`` or ``"pbs"``.
        launcher: ``"local"``, ``"mpiexec"`` or ``"srun"`` (never ``"auto"``: resolved).
    """

    nodes: tuple[Node, ...]
    source: str
    launcher: str
    launcher_path: str | None = field(default=None, compare=False)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """Every unordered pair ``(i, j)``, ``i < j``, of node indices: N(N-1)/2 pairs (section 4.3, Figure 8)."""
        n = len(self.nodes)
        return [(i, j) for i in range(n) for j in range(i + 1, n)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"source", "launcher", "launcher_path", "nodes": [{"name", "host", "slots", "cores"}]}``."""
        return {
            "source": self.source,
            "launcher": self.launcher,
            "launcher_path": self.launcher_path,
            "nodes": [{**asdict(n), "cores": list(n.cores) if n.cores is not None else None} for n in self.nodes],
        }


# -- sources -----------------------------------------------------------------------------------------------
def local_nodes(count: int, cores: Sequence[int] | None = None) -> list[Node]:
    """This machine's usable cores split into ``count`` local nodes.

    Node 0 (the server node) gets ``n // count`` cores and the remainder goes to the last nodes, so
    ``local:2`` is the historical split (first half servers, second half clients). With fewer cores than
    nodes, nodes share cores round-robin (one core each).

    Raises:
        NodeError: ``count`` < 2.
    """
    if count < MIN_NODES:
        raise NodeError(f"--nodes local:{count}: a roofline needs at least {MIN_NODES} nodes (a server node and a "
                        "client node); use local:2 or more")  # fmt: skip
    usable = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
    if not usable:
        raise NodeError("this process may run on no core (empty CPU affinity)")
    if len(usable) < count:
        groups = [[usable[i % len(usable)]] for i in range(count)]
    else:
        base, extra = divmod(len(usable), count)
        sizes = [base + (1 if i >= count - extra else 0) for i in range(count)]
        groups, start = [], 0
        for size in sizes:
            groups.append(usable[start : start + size])
            start += size
    return [Node(f"local{i}", "127.0.0.1", len(g), tuple(g)) for i, g in enumerate(groups)]


def parse_local_spec(spec: str) -> int:
    """``"local:K"`` -> K.

    Raises:
        NodeError: anything else.
    """
    m = re.fullmatch(r"local:(\d+)", spec.strip())
    if m is None:
        raise NodeError(f"--nodes {spec!r}: expected local:K (K local nodes on this machine, K >= 2); for other "
                        "machines give --hostfile FILE or run inside a Slurm allocation")  # fmt: skip
    return int(m.group(1))


_OMPI_LINE = re.compile(r"^(?P<host>[^\s:#]+)(?:\s+(?P<opts>.*))?$")
_MPICH_LINE = re.compile(r"^(?P<host>[^\s:#]+):(?P<slots>\S+)$")


def parse_hostfile(text: str, origin: str = "hostfile") -> list[Node]:
    """Nodes of a hostfile in Open MPI (``host slots=N [max_slots=M]``) or MPICH (``host:N``) format.

    Blank lines and ``#`` comments are skipped; a host without a count has 1 slot; a host listed again
    adds its slots (an ``mpiexec -f`` file may list a host once per slot). Order of first appearance is
    kept: the first host is node 0, the server node.

    Raises:
        NodeError: no host, or a malformed line (named by number, with the formats expected).
    """
    slots: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        count: int | None = None
        m = _MPICH_LINE.match(line)
        if m is not None:
            host, value = m.group("host"), m.group("slots")
            if not value.isdigit():
                raise NodeError(f"{origin}, line {lineno}: {raw.strip()!r}: the count after ':' must be a positive "
                                "integer (MPICH format host:N)")  # fmt: skip
            count = int(value)
        else:
            m = _OMPI_LINE.match(line)
            if m is None:
                raise NodeError(f"{origin}, line {lineno}: {raw.strip()!r} is not 'host', 'host slots=N' (Open MPI) "
                                "or 'host:N' (MPICH)")  # fmt: skip
            host = m.group("host")
            for opt in (m.group("opts") or "").split():
                key, _, value = opt.partition("=")
                if key in ("slots", "cpu", "cpus") and value.isdigit():
                    count = int(value)
                elif key in ("max_slots", "max-slots") and value.isdigit():
                    pass
                else:
                    raise NodeError(f"{origin}, line {lineno}: {raw.strip()!r}: unknown or malformed {opt!r} "
                                    "(expected slots=N)")  # fmt: skip
        if count is not None and count < 1:
            raise NodeError(f"{origin}, line {lineno}: {raw.strip()!r}: a host needs at least 1 slot")
        slots[host] = slots.get(host, 0) + (count if count is not None else 1)
    if not slots:
        raise NodeError(f"{origin} lists no host: give one host per line ('host slots=N' or 'host:N')")
    return [Node(host, host, n) for host, n in slots.items()]


def read_hostfile(path: str | os.PathLike[str]) -> list[Node]:
    """:func:`parse_hostfile` of a file.

    Raises:
        NodeError: the file cannot be read, is empty or malformed.
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise NodeError(f"cannot read hostfile {path}: {exc.strerror or exc}") from None
    return parse_hostfile(text, f"hostfile {path}")


def expand_hostlist(hostlist: str) -> list[str]:
    """A Slurm compressed host list (``nid[001-003,010],login1``) as host names, in order.

    python-hostlist first (pure Python: no daemon, no slurm.conf needed); a list it cannot parse goes to
    ``scontrol show hostnames`` (Slurm's own parser), when scontrol is on PATH and Slurm is configured here
    (``SLURM_CONF``, ``/etc/slurm/slurm.conf``, or inside an allocation; without a configuration scontrol
    retries for about a minute), within ``SCONTROL_TIMEOUT_SECONDS``.

    Raises:
        NodeError: the list cannot be expanded (what each parser said).
    """
    import hostlist as _hostlist

    try:
        return list(_hostlist.expand_hostlist(hostlist))
    except _hostlist.BadHostlist as exc:
        problem = f"bad Slurm host list {hostlist!r}: {exc}"
    scontrol = shutil.which("scontrol")
    configured = os.environ.get("SLURM_CONF") or os.environ.get("SLURM_JOB_ID") or os.path.exists(SLURM_CONF_PATH)
    if scontrol is None or not configured:
        raise NodeError(problem)
    try:
        done = subprocess.run([scontrol, "show", "hostnames", hostlist], capture_output=True, text=True,
                              timeout=SCONTROL_TIMEOUT_SECONDS)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NodeError(f"{problem}; scontrol show hostnames did not answer: {exc}") from None
    if done.returncode == 0 and done.stdout.split():
        return done.stdout.split()
    raise NodeError(f"{problem}; scontrol show hostnames: {done.stderr.strip() or 'no host'}")


SLURM_CONF_PATH = "/etc/slurm/slurm.conf"
SCONTROL_TIMEOUT_SECONDS = 10.0
"""How long ``expand_hostlist`` waits for scontrol (only for a list python-hostlist cannot parse)."""


def slurm_nodes(env: Mapping[str, str]) -> list[Node]:
    """Nodes of the current Slurm allocation: ``SLURM_JOB_NODELIST`` (or ``SLURM_NODELIST``), slots per
    node from ``SLURM_JOB_CPUS_PER_NODE`` (``"36(x2),72"``; 1 each when absent).

    Raises:
        NodeError: no node list, or counts that do not match the nodes.
    """
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise NodeError("not inside a Slurm allocation (no SLURM_JOB_NODELIST): run under salloc/sbatch, or give "
                        "--hostfile FILE or --nodes local:K")  # fmt: skip
    hosts = expand_hostlist(nodelist)
    cpus = env.get("SLURM_JOB_CPUS_PER_NODE")
    if cpus:
        import hostlist as _hostlist

        try:
            counts = list(_hostlist.parse_slurm_tasks_per_node(cpus))
        except (ValueError, _hostlist.BadHostlist) as exc:
            raise NodeError(f"SLURM_JOB_CPUS_PER_NODE={cpus!r} is not understood: {exc}") from None
        if len(counts) != len(hosts):
            raise NodeError(f"SLURM_JOB_CPUS_PER_NODE={cpus!r} gives {len(counts)} counts for {len(hosts)} nodes "
                            f"of SLURM_JOB_NODELIST={nodelist!r}")  # fmt: skip
    else:
        counts = [1] * len(hosts)
    return [Node(h, h, max(1, c)) for h, c in zip(hosts, counts, strict=True)]


def resolve(
    nodes: str | None = None,
    hostfile: str | os.PathLike[str] | None = None,
    launcher: str = "auto",
    env: Mapping[str, str] | None = None,
    *,
    check_launcher: bool = True,
) -> NodeSet:
    """The node set and launcher of a collection.

    Args:
        nodes: ``"local:K"`` (exclusive with ``hostfile``).
        hostfile: Open MPI or MPICH hostfile.
        launcher: one of :data:`LAUNCHERS`.
        env: the environment (default ``os.environ``): Slurm and PBS allocations.
        check_launcher: find the launcher program on PATH (False for a plan that starts nothing).

    Returns:
        The :class:`NodeSet` (``launcher`` resolved; ``launcher_path`` the program when not local).

    Raises:
        NodeError: conflicting sources, fewer than 2 nodes, an unknown launcher, ``local`` for remote
            nodes, or a launcher that is not installed.
    """
    env = os.environ if env is None else env
    if launcher not in LAUNCHERS:
        raise NodeError(f"--launcher {launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    if nodes is not None and hostfile is not None:
        raise NodeError("give --nodes local:K or --hostfile FILE, not both")
    in_slurm = bool(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"))
    if nodes is not None and launcher == "mpiexec" and in_slurm:
        raise NodeError(f"--nodes {nodes} --launcher mpiexec inside a Slurm allocation: MPICH's mpiexec starts "
                        "processes through srun, which has no node named 127.0.0.1; leave out --nodes to use the "
                        "allocation's nodes, or use --launcher local for local nodes")  # fmt: skip
    if nodes is not None:
        found, source = local_nodes(parse_local_spec(nodes)), "local"
    elif hostfile is not None:
        found, source = read_hostfile(hostfile), f"hostfile:{hostfile}"
    elif launcher in ("auto", "srun", "mpiexec") and (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")):
        found, source = slurm_nodes(env), "slurm"
    elif launcher in ("auto", "mpiexec") and env.get("PBS_NODEFILE"):
        found, source = read_hostfile(env["PBS_NODEFILE"]), "pbs"
    else:
        found, source = local_nodes(2), "local"
    if len(found) < MIN_NODES:
        raise NodeError(f"{source} gives {len(found)} node ({found[0].name}); a roofline needs at least {MIN_NODES}: "
                        "a server node and a client node (on one machine: --nodes local:2)")  # fmt: skip
    if launcher == "auto":
        launcher = "srun" if source == "slurm" else "local" if source == "local" else "mpiexec"
    if launcher == "local" and source != "local":
        raise NodeError(f"--launcher local starts processes on this machine only, but the nodes come from {source}; "
                        "use --launcher mpiexec or srun (svcframe never starts remote processes itself)")  # fmt: skip
    path = None
    if launcher != "local" and check_launcher:
        path = find_launcher(launcher)
    return NodeSet(tuple(found), source, launcher, path)


def find_launcher(launcher: str) -> str:
    """The launcher program: on PATH, or beside this Python (the MPICH wheel's ``mpiexec`` in a venv).

    Raises:
        NodeError: not found.
    """
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    path = shutil.which(launcher, path=search)
    if path is None:
        hint = "pip install mpich (or your site's MPI module)" if launcher == "mpiexec" else "run inside salloc/sbatch"
        raise NodeError(f"--launcher {launcher}: no {launcher} on PATH ({hint})")
    return path


def mpiexec_flavour(path: str) -> str:
    """``"hydra"`` (MPICH, Intel MPI) or ``"openmpi"``, from ``mpiexec --version``."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "hydra"
    text = done.stdout + done.stderr
    return "openmpi" if ("Open MPI" in text or "OpenRTE" in text or "prterun" in text) else "hydra"


def launcher_command(
    node_set: NodeSet, node: Node, count: int, argv: Sequence[str], *, flavour: str = "hydra"
) -> list[str]:
    """The one command that starts ``count`` processes of ``argv`` on ``node`` through the node set's launcher.

    Args:
        flavour: for mpiexec, ``"hydra"`` (MPICH/Intel: ``-hosts``) or ``"openmpi"`` (``--host H:N``).

    Raises:
        NodeError: ``count`` < 1, or the ``local`` launcher (it has no command).
    """
    if count < 1:
        raise NodeError(f"cannot start {count} processes on {node.name}")
    program = node_set.launcher_path or node_set.launcher
    if node_set.launcher == "mpiexec":
        if flavour == "openmpi":
            return [program, "--host", f"{node.host}:{count}", "-n", str(count), *argv]
        return [program, "-hosts", node.host, "-n", str(count), *argv]
    if node_set.launcher == "srun":
        return [program, "--nodes=1", f"--ntasks={count}", f"--nodelist={node.host}", "--overlap", "--overcommit",
                "--kill-on-bad-exit=1", *argv]  # fmt: skip
    raise NodeError("the local launcher has no command: collect starts local processes itself")
