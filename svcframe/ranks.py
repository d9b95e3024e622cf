"""Rank and size from the field's launchers, and a group file published once every rank is ready.

svcframe never starts processes on other nodes itself (DESIGN.md section 7): ``srun`` or ``mpiexec``
does, and each process learns who it is from the launcher's environment:

==================  =================  =====================  =========================  ============  ==================
launcher            rank               size                   node-local rank            node          job
==================  =================  =====================  =========================  ============  ==================
Open MPI (mpirun)   OMPI_COMM_WORLD_   OMPI_COMM_WORLD_SIZE   OMPI_COMM_WORLD_LOCAL_     -             OMPI_MCA_ess_base_
                    RANK                                      RANK                                     jobid
PMIx (prrte,        PMIX_RANK          OMPI_COMM_WORLD_SIZE,  PMIX_LOCAL_RANK,           SLURM_NODEID  PMIX_NAMESPACE,
srun --mpi=pmix)                       PMI_SIZE, SLURM_NTASKS SLURM_LOCALID                            Slurm's step
MPICH/Hydra,        PMI_RANK           PMI_SIZE               MPI_LOCALRANKID,           SLURM_NODEID  PMI_JOBID,
Intel, srun                                                   PMI_LOCAL_RANK,                          Slurm's step
--mpi=pmi2                                                    SLURM_LOCALID
Slurm (srun)        SLURM_PROCID       SLURM_NTASKS           SLURM_LOCALID              SLURM_NODEID  Slurm's step
==================  =================  =====================  =========================  ============  ==================

(Slurm's step is ``SLURM_JOB_ID.SLURM_STEP_ID``; the nodes of the step, ``SLURM_STEP_NUM_NODES``, tell a
multi-node job.) The MPI launchers' variables win over Slurm's, because ``mpiexec`` inside an ``sbatch``
script inherits the batch step's ``SLURM_PROCID=0``. Without any of them, mpi4py (when it loads an MPI
library) asks MPI itself; otherwise the process is rank 0 of 1.

Group file (:func:`publish_group`): every rank of ``svcframe serve CONFIG --group-file F`` reports its address
once it accepts calls; rank 0 writes ``F`` (``svcframe.group.write_group_file``: atomic, the shape
``svcframe launch`` writes) when all ``size`` ranks have; each member carries ``ready``, when it accepted calls,
so a reader can check the file came after every member was ready. Two barriers (:func:`choose_barrier`):

* **MPI** (mpi4py loads an MPI library that speaks the launcher's PMI): each rank sends its member to rank 0
  and waits for rank 0's verdict, by non-blocking point-to-point messages polled from the event loop, so
  rank 0 gives up after ``timeout_seconds`` like the filesystem barrier. MPI is finalized once the group is
  published; a rank that fails before (a port taken, a missing rank, a refused address) aborts the whole
  MPI job (``MPI_Abort``, :func:`abort_job`): no rank hangs in a collective call or in ``MPI_Finalize``.
* **filesystem** (otherwise): each rank writes ``F.d/rank-<r>.json`` (a group file of one member, its job in
  the metadata); rank 0 waits for ``size`` of them by bounded polling of that condition (no fixed sleep; it
  also answers within milliseconds), checks that each member answers an admin ``status`` call with its pid
  (so a stale file of an earlier job cannot complete the group), removes ``F.d`` and writes ``F``. The other
  ranks wait until ``F`` lists them. A rank that fails writes ``F.d/abort.json`` (its rank and reason), which
  ends every rank's wait at once; without it rank 0 names the missing ranks after ``timeout_seconds``, and
  the others give up ``FOLLOWER_GRACE_SECONDS`` later. Each rank removes its own file when it gives up, and
  the last rank of the job to leave removes ``F.d``.

Before either, :func:`address_problem` refuses an address other nodes cannot reach (loopback, a unix socket,
a host name that resolves to a loopback address, as Debian's ``127.0.1.1 <hostname>`` line makes it) in a job
whose ranks span several nodes: rank 0 checks the members' hosts, and each rank of a Slurm step over several
nodes checks its own address before it starts.

Errors: :class:`GroupError` (a :class:`~svcframe.errors.SvcframeError`) when the group is not complete
within ``timeout_seconds`` (the message lists the missing ranks), a rank failed (the message names it), or
the environment is inconsistent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

from .errors import GroupError, SvcframeError
from .group import Member, read_group_file, write_group_file

log = logging.getLogger("svcframe.ranks")

BARRIERS = ("auto", "mpi", "filesystem")
"""Choices of ``svcframe serve --barrier``."""

NO_MPI4PY_ENV = "SVCFRAME_NO_MPI4PY"
"""Set (to anything) to never import mpi4py: ``--barrier filesystem`` for every server of a job."""

FOLLOWER_GRACE_SECONDS = 30.0
"""How much longer than rank 0 the other ranks wait for the group (their start-ups are not simultaneous)."""

_TAG_MEMBER, _TAG_VERDICT = 0x5F01, 0x5F02  # MPI tags of the barrier's two messages


@dataclass(frozen=True)
class RankInfo:
    """Who this process is in its job.

    Attributes:
        rank: 0 <= rank < size.
        size: processes in the job, >= 1.
        local_rank: rank among the job's processes on this node (None if the launcher does not say).
        node_id: index of this node in the job (Slurm only; None otherwise).
        source: where it came from: ``"ompi"``, ``"pmix"``, ``"pmi"``, ``"slurm"``, ``"mpi4py"`` or ``"none"``.
        job: an identifier of the job step when the launcher gives one (Slurm, Open MPI, PMIx, PMI_JOBID),
            else None.
        nodes: nodes the job step spans when the launcher says (Slurm's ``SLURM_STEP_NUM_NODES``), else None.
    """

    rank: int
    size: int
    local_rank: int | None = None
    node_id: int | None = None
    source: str = "none"
    job: str | None = None
    nodes: int | None = None

    @property
    def launched(self) -> bool:
        """True when a launcher (or MPI) named this process's rank."""
        return self.source != "none"

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.size}"


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise GroupError(f"launcher variable {name}={value!r} is not an integer") from None
    return None


def from_environment(env: Mapping[str, str] | None = None) -> RankInfo | None:
    """Rank, size, node-local rank, node, job and the step's nodes from launcher variables (table in the
    module docstring).

    Args:
        env: the environment to read (default ``os.environ``).

    Returns:
        A :class:`RankInfo`, or None when no launcher variable is set.

    Raises:
        GroupError: a variable is not an integer, or rank is not in ``0..size-1``.
    """
    env = os.environ if env is None else env
    slurm_job = env.get("SLURM_JOB_ID")
    slurm_step = f"slurm:{slurm_job}.{env.get('SLURM_STEP_ID', '')}" if slurm_job else None
    node_id = _int(env, "SLURM_NODEID")
    candidates: list[tuple[str, int | None, int | None, int | None, int | None, str | None]] = [
        ("ompi", _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
         _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), None,
         f"ompi:{env['OMPI_MCA_ess_base_jobid']}" if env.get("OMPI_MCA_ess_base_jobid") else None),
        ("pmix", _int(env, "PMIX_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"),
         _int(env, "PMIX_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"), node_id,
         f"pmix:{env['PMIX_NAMESPACE']}" if env.get("PMIX_NAMESPACE") else slurm_step),
        ("pmi", _int(env, "PMI_RANK"), _int(env, "PMI_SIZE"),
         _int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"), node_id,
         f"pmi:{env['PMI_JOBID']}" if env.get("PMI_JOBID") else slurm_step),
        ("slurm", _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS", "SLURM_NPROCS"), _int(env, "SLURM_LOCALID"),
         node_id, slurm_step),
    ]  # fmt: skip
    for source, rank, size, local_rank, node, job in candidates:
        if rank is None:
            continue
        if size is None:
            raise GroupError(f"{source}: the launcher gave rank {rank} but no size")
        if not 0 <= rank < size:
            raise GroupError(f"{source}: rank {rank} is outside 0..{size - 1}")
        nodes = _int(env, "SLURM_STEP_NUM_NODES") if slurm_job else None
        return RankInfo(rank, size, local_rank, node, source, job, nodes)
    return None


# -- MPI ----------------------------------------------------------------------------------------------------------
def load_mpi() -> tuple[Any | None, str]:
    """The ``mpi4py.MPI`` module, imported without initialising MPI, or None and why.

    ``SVCFRAME_NO_MPI4PY`` set means None. mpi4py's wheels look for the MPI library at run time (the
    MPICH ABI ``libmpi.so.12``, or Open MPI's); a site MPI that installs it under another name (Debian's and
    Ubuntu's MPICH: ``libmpich.so.12``) is not found, and the reason says so.
    """
    if os.environ.get(NO_MPI4PY_ENV):
        return None, f"{NO_MPI4PY_ENV} is set"
    try:
        import mpi4py
    except ImportError:
        return None, "mpi4py is not installed"
    try:
        mpi4py.rc.initialize = False  # MPI_Init only once the barrier is chosen (choose_barrier)
        mpi4py.rc.finalize = False
        from mpi4py import MPI
    except Exception as exc:  # any failure to load the library behind mpi4py
        return None, f"mpi4py cannot load an MPI library ({' '.join(str(exc).split())})"
    return MPI, "mpi4py"


def _speaks_pmix(mpi: Any) -> bool:
    """Does this MPI library talk to a PMIx server (Open MPI always; MPICH only when built with PMIx)?"""
    try:
        version = str(mpi.Get_library_version())
    except Exception:
        return False
    return "Open MPI" in version or "pmix" in version.lower()


def choose_barrier(
    info: RankInfo, barrier: str = "auto", env: Mapping[str, str] | None = None, *, init_timeout_seconds: float = 120.0
) -> tuple[Any, str]:
    """The barrier of a group: ``(COMM_WORLD, "mpi")`` with MPI initialised, or ``(None, "filesystem")``.

    ``auto`` uses MPI when mpi4py loads an MPI library that can talk to the launcher: not under ``srun`` without
    ``--mpi`` (no PMI at all: each MPI process would be a job of its own); under a PMIx launch
    (``srun --mpi=pmix``, ``PMIX_RANK`` without ``PMI_RANK``) only a library built with PMIx (Open MPI, an
    MPICH configured with PMIx); MPICH's wheel would abort every rank ("unsupported PMI version PMIx").
    ``mpi`` insists, ``filesystem`` never imports mpi4py. ``MPI_Init`` is bounded by ``init_timeout_seconds``
    (:func:`_init_within`).

    Raises:
        GroupError: ``mpi`` and no usable MPI, or MPI's rank and size differ from the launcher's (mpi4py
            loads another MPI than the one that launched the job).
    """
    env = os.environ if env is None else env
    if barrier not in BARRIERS:
        raise GroupError(f"--barrier {barrier!r}: choose one of {', '.join(BARRIERS)}")
    if barrier == "filesystem" or info.size <= 1:
        return None, "filesystem"
    if barrier == "auto" and info.source == "slurm":
        return None, "filesystem"  # srun without --mpi gives no PMI: MPI would see a job of one process
    mpi, why = load_mpi()
    if mpi is None:
        if barrier == "mpi":
            raise GroupError(f"--barrier mpi: {why}")
        if why.startswith("mpi4py cannot load"):  # installed for a reason: say why it is not used
            log.warning("%s: %s uses the filesystem barrier (see svcframe serve --help, --barrier)", why, info)
        return None, "filesystem"
    pmix_only = env.get("PMIX_RANK") is not None and env.get("PMI_RANK") is None and env.get("PMI_FD") is None
    if barrier == "auto" and pmix_only and not _speaks_pmix(mpi):
        log.info("the launcher speaks PMIx and mpi4py's MPI does not: the filesystem barrier is used")
        return None, "filesystem"
    if not mpi.Is_initialized():
        _init_within(mpi, info, init_timeout_seconds)
    comm = mpi.COMM_WORLD
    if (comm.Get_size(), comm.Get_rank()) != (info.size, info.rank):
        message = (f"MPI says rank {comm.Get_rank()} of {comm.Get_size()}, the launcher {info} ({info.source}): "
                   "mpi4py loads another MPI than the one that launched the job")  # fmt: skip
        if barrier == "mpi":
            raise GroupError(f"--barrier mpi: {message}")
        log.warning("%s; the filesystem barrier is used", message)
        with contextlib.suppress(Exception):
            mpi.Finalize()
        return None, "filesystem"
    return comm, "mpi"


def _init_within(mpi: Any, info: RankInfo, timeout_seconds: float) -> None:
    """``MPI_Init_thread``, or this process is ended with one line naming its rank, ``timeout_seconds`` later.

    ``MPI_Init`` waits on the launcher's PMI exchange with no time limit of its own, holding the GIL: a PMI
    server that never answers, or a rank that never joins the exchange, holds every rank in it, silently, until
    the job's time limit. No thread of this process can run meanwhile, so a small watchdog process does: it
    exits when this process closes its pipe (MPI_Init returned, or this process died), else it prints the line
    and kills this process (SIGKILL); each rank's own watchdog ends the others.
    """
    message = (f"svcframe: error: {info} ({info.source}): MPI_Init did not return within {timeout_seconds:g} s "
               "(the launcher's PMI exchange stalled); --barrier filesystem does without MPI\n")  # fmt: skip
    watchdog = ("import os, select, sys\n"
                "if not select.select([0], [], [], float(sys.argv[1]))[0]:\n"
                "    sys.stderr.write(sys.argv[3]); sys.stderr.flush(); os.kill(int(sys.argv[2]), 9)\n")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", watchdog, str(timeout_seconds), str(os.getpid()), message],
                            stdin=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        mpi.Init_thread(mpi.THREAD_MULTIPLE)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()


def abort_job(comm: Any, code: int = 1) -> NoReturn:
    """End every rank of an MPI job (``MPI_Abort``, unless MPI is finalized already), and this process.

    MPICH's ``MPI_Abort`` may return once it has asked the process manager to end the job (the wheel's under
    Hydra does); this process then exits at once, with ``code``, running no clean-up. Should ``MPI_Abort`` never
    return (a network library's exit handler stuck), a timer ends the process ``ABORT_GRACE_SECONDS`` later.
    """
    if comm is not None:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            timer = threading.Timer(ABORT_GRACE_SECONDS, os._exit, (code,))
            timer.daemon = True
            timer.start()
            comm.Abort(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


ABORT_GRACE_SECONDS = 5.0
"""How long :func:`abort_job` lets ``MPI_Abort`` take before this process exits by itself."""


def _finalize_in_background() -> None:
    """``MPI_Finalize`` in a daemon thread: every rank calls it once the group is published, and a process
    never waits at exit for a rank that died meanwhile."""
    from mpi4py import MPI

    def finalize() -> None:
        with contextlib.suppress(Exception):
            if not MPI.Is_finalized():
                MPI.Finalize()

    threading.Thread(target=finalize, name="svcframe-mpi-finalize", daemon=True).start()


def detect(env: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank: the launcher's environment, else MPI's (mpi4py, when it loads a library and
    the job has more than one process), else rank 0 of 1.

    Raises:
        GroupError: inconsistent launcher variables (see :func:`from_environment`).
    """
    info = from_environment(env)
    if info is not None:
        return info
    mpi, _ = load_mpi() if env is None else (None, "")
    if mpi is not None:
        if not mpi.Is_initialized():
            mpi.Init_thread(mpi.THREAD_MULTIPLE)
        comm = mpi.COMM_WORLD
        if comm.Get_size() > 1:
            return RankInfo(comm.Get_rank(), comm.Get_size(), None, None, "mpi4py")
    return RankInfo(0, 1)


# -- addresses ----------------------------------------------------------------------------------------------------
def rank_address(address: str, info: RankInfo) -> str:
    """The address a rank listens on: a fixed TCP port is offset by the node-local rank (so ranks on one
    node do not collide), a unix path gets ``.<rank>``; port 0 (ephemeral) is kept."""
    if info.size <= 1:
        return address
    if address.startswith("unix://"):
        return f"{address}.{info.rank}"
    if address.startswith("tcp://"):
        host, _, port = address[len("tcp://") :].rpartition(":")
        if port.isdigit() and int(port) != 0:
            offset = info.local_rank if info.local_rank is not None else info.rank
            return f"tcp://{host}:{int(port) + offset}"
    return address


def _is_loopback_ip(text: str) -> bool:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def address_problem(address: str) -> str | None:
    """Why peers on other nodes cannot reach ``address`` (None when they can, as far as this node knows):
    a unix socket, a loopback address, a host name that resolves only to loopback addresses here (Debian's
    ``127.0.1.1 <hostname>`` line), or one that does not resolve here at all. A wildcard is the plumber's."""
    if address.startswith("unix://"):
        return f"{address} is a unix socket, reachable on its own node only"
    if not address.startswith("tcp://"):
        return None
    problem = _host_problem(address[len("tcp://") :].rpartition(":")[0].strip("[]"))
    return None if problem is None else f"{address}{problem}"


@functools.lru_cache(maxsize=256)
def _host_problem(host: str) -> str | None:
    """:func:`address_problem` for a host (one name resolution per host, however many ranks share it)."""
    if host in ("", "*", "0.0.0.0", "::"):
        return None
    if host == "localhost" or _is_loopback_ip(host):
        return " is a loopback address, reachable on its own node only"
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError) as exc:
        return f": its host {host} does not resolve on {socket.gethostname()} ({exc})"
    if resolved and all(_is_loopback_ip(str(ip)) for ip in resolved):
        return (f": its host {host} resolves to {', '.join(sorted(map(str, resolved)))} here, a loopback "
                "address (as Debian's '127.0.1.1 <hostname>' line in /etc/hosts makes it)")  # fmt: skip
    return None


LOOPBACK_HINT = (
    "listen on an address the other nodes reach: engine.address tcp://*:0 (the plumber picks a NIC; "
    "engine.plumber.interfaces names one) or --address tcp://$(hostname):0 where that name resolves to the "
    "node's network address"
)


def check_reachable(address: str, info: RankInfo, *, multi_node: bool | None = None) -> None:
    """Refuse an address other nodes cannot reach when the job spans several nodes.

    Args:
        multi_node: True when clients on other nodes will call (``svcframe serve --multi-node``); None to
            decide from the launcher (a Slurm step over more than one node).

    Raises:
        GroupError: the address and the hint, naming this rank.
    """
    spans = multi_node if multi_node is not None else (info.nodes or 1) > 1
    if not spans:
        return
    problem = address_problem(address)
    if problem is not None:
        where = f"a job step over {info.nodes} nodes" if info.nodes and info.nodes > 1 else "a multi-node job"
        raise GroupError(f"{info}: {problem}, in {where}: {LOOPBACK_HINT}")


# -- the group file -----------------------------------------------------------------------------------------------
def remove_stale_group_file(path: str | os.PathLike[str], info: RankInfo, started: float) -> None:
    """Rank 0, before it starts: remove a group file left by an earlier job (its servers are gone or are
    about to be replaced), so that nobody reads it as this job's, and an earlier job's abort marker and
    departures in ``F.d``: those of another job id, or without job ids, older than ``STALE_SECONDS`` before
    this process ``started`` (the other ranks of this job may have written theirs already)."""
    if info.rank != 0:
        return
    target = Path(path)
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    members_dir = _members_dir(target)
    if not members_dir.is_dir():
        return
    for entry in [members_dir / "abort.json", *members_dir.glob("left-*")]:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            doc = json.loads(entry.read_text())
            job, created = doc.get("job"), float(doc.get("created") or 0)
            if (job is not None and job != info.job) or (job is None and created < started - STALE_SECONDS):
                entry.unlink()


STALE_SECONDS = 60.0
"""Without job ids, abort markers and departures older than this before rank 0 started are an earlier job's."""


def remove_own_group_file(path: str | os.PathLike[str], info: RankInfo) -> None:
    """Rank 0, as it exits: remove the group file if it is still the one this process published."""
    if info.rank != 0:
        return
    with contextlib.suppress(GroupError, OSError):
        group = read_group_file(path)
        if group.members and group.members[0].pid == os.getpid():
            Path(path).unlink()


def _members_dir(target: Path) -> Path:
    return target.with_name(target.name + ".d")


def report_failure(path: str | os.PathLike[str], info: RankInfo, reason: str) -> None:
    """A rank that cannot join or gives up: tell the others at once (``F.d/abort.json``, its rank and reason;
    an abort of this job already there is kept, with its first reason), so that the whole job ends now rather
    than at rank 0's timeout, and leave (:func:`_leave`). A no-op for a job of one process."""
    if info.size <= 1:
        return
    members_dir = _members_dir(Path(path))
    with contextlib.suppress(OSError):
        members_dir.mkdir(parents=True, exist_ok=True)
        if _abort_reason(members_dir, info, 0.0) is None:
            tmp = members_dir / f".abort.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({"rank": info.rank, "reason": reason, "job": info.job, "created": time.time(),
                                       "host": socket.gethostname()}))  # fmt: skip
            os.replace(tmp, members_dir / "abort.json")
    _leave(members_dir, info, aborted=True)


def _abort_reason(members_dir: Path, info: RankInfo, started: float) -> str | None:
    """The reason in ``F.d/abort.json`` if it belongs to this job (same job id; without one, written after this
    process started), else None."""
    try:
        doc = json.loads((members_dir / "abort.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("job") != info.job:
        return None
    if info.job is None and float(doc.get("created") or 0) < started:
        return None  # an earlier job's
    return f"rank {doc.get('rank')} on {doc.get('host')}: {doc.get('reason')}"


def _leave(members_dir: Path, info: RankInfo, *, aborted: bool = False) -> None:
    """Remove this rank's member file. After an abort, also say so (``F.d/left-<rank>``): the rank that finds
    every rank of the job gone removes ``F.d`` (a rank that started late still finds the abort marker; one
    that never comes, killed or never launched, leaves the directory behind, naming who left)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        (members_dir / f"rank-{info.rank}.json").unlink()
    if not aborted:
        return
    with contextlib.suppress(OSError):
        (members_dir / f"left-{info.rank}").write_text(json.dumps({"job": info.job, "created": time.time()}))
        left = {p.name.removeprefix("left-") for p in members_dir.glob("left-*")}
        if left >= {str(r) for r in range(info.size)}:
            shutil.rmtree(members_dir, ignore_errors=True)


def _spanning_problem(members: list[Member]) -> str | None:
    """Members on more than one host, some at addresses only their own node reaches: which and why."""
    if len({m.host for m in members}) <= 1:
        return None
    bad = [(m, address_problem(m.address)) for m in members]
    named = [f"rank {m.rank} on {m.host}: {problem}" for m, problem in bad if problem is not None]
    if not named:
        return None
    return (f"the ranks run on {len({m.host for m in members})} hosts but {len(named)} listen where other nodes "
            f"cannot reach them ({'; '.join(named[:3])}{'; ...' if len(named) > 3 else ''}): {LOOPBACK_HINT}")  # fmt: skip


async def publish_group(
    path: str | os.PathLike[str],
    member: Member,
    info: RankInfo,
    *,
    engine: Any = None,
    comm: Any = None,
    timeout_seconds: float = 120.0,
    poll_seconds: float = 0.01,
    started: float | None = None,
) -> list[Member] | None:
    """Join the group; rank 0 writes the group file when every rank has joined; every rank returns once it is
    written (module docstring).

    Args:
        path: the group file ``F``.
        member: this rank's entry (``member_record``).
        info: this rank (``detect()``).
        engine: a started engine, used by rank 0 (filesystem barrier) to check each member answers.
        comm: an mpi4py communicator (:func:`choose_barrier`): MPI's messages instead of the filesystem.
        timeout_seconds: how long rank 0 waits for the others (the others wait ``FOLLOWER_GRACE_SECONDS`` more).
        poll_seconds: first interval of the bounded polling (doubles up to 0.1 s).
        started: when this process started (seconds since the epoch; default: :func:`process_start`), to tell
            an earlier job's abort marker from this one's when the launcher gives no job id.

    Returns:
        On rank 0 the members (rank order), on other ranks None.

    Raises:
        GroupError: ranks missing after ``timeout_seconds`` (they are listed), a rank that failed (named with
            its reason), members on several hosts at addresses only their own node reaches.
    """
    target = Path(path)
    if comm is not None:
        return await _publish_mpi(target, member, info, comm, timeout_seconds, poll_seconds)
    return await _publish_files(target, member, info, engine, timeout_seconds, poll_seconds,
                                process_start() if started is None else started)  # fmt: skip


async def _publish_mpi(
    target: Path, member: Member, info: RankInfo, comm: Any, timeout_seconds: float, poll_seconds: float
) -> list[Member] | None:
    """The MPI barrier: members to rank 0, rank 0's verdict (None, or the error) back to every rank."""
    from mpi4py import MPI

    loop = asyncio.get_running_loop()
    interval = poll_seconds

    async def pause() -> None:
        nonlocal interval
        await asyncio.sleep(interval)  # bounded polling of MPI's message queue, not a guess at readiness
        interval = min(interval * 2, 0.1)

    if info.rank != 0:
        sent = comm.isend(member, dest=0, tag=_TAG_MEMBER)
        deadline = loop.time() + timeout_seconds + FOLLOWER_GRACE_SECONDS
        while (message := comm.improbe(source=0, tag=_TAG_VERDICT)) is None:
            if loop.time() > deadline:
                raise GroupError(f"{info}: no word from rank 0 within {timeout_seconds + FOLLOWER_GRACE_SECONDS:g} "
                                 f"s; the group {target} is not published")  # fmt: skip
            await pause()
        answer = message.recv()
        sent.wait()
        if answer is not None:
            raise GroupError(f"{info}: rank 0 gave up: {answer}")
        _finalize_in_background()
        return None

    members = {0: member}
    deadline = loop.time() + timeout_seconds
    verdict: str | None = None
    while len(members) < info.size:
        while (message := comm.improbe(source=MPI.ANY_SOURCE, tag=_TAG_MEMBER)) is not None:
            joined = message.recv()
            if isinstance(joined, Member) and 0 < joined.rank < info.size:
                members[joined.rank] = joined
        if len(members) == info.size:
            break
        if loop.time() > deadline:
            missing = sorted(set(range(info.size)) - set(members))
            verdict = (f"group {target}: rank(s) {missing} of {info.size} did not report within "
                       f"{timeout_seconds:g} s (MPI barrier)")  # fmt: skip
            break
        await pause()
    ordered = [members[r] for r in sorted(members)]
    if verdict is None:
        verdict = _spanning_problem(ordered)
    if verdict is not None:
        log.error("%s", verdict)
        for rank in range(1, info.size):
            comm.isend(verdict, dest=rank, tag=_TAG_VERDICT)
        raise GroupError(verdict)
    write_group_file(target, ordered, _metadata(info, "mpi4py"))
    sends = [comm.isend(None, dest=rank, tag=_TAG_VERDICT) for rank in range(1, info.size)]
    MPI.Request.Waitall(sends)
    _finalize_in_background()
    return ordered


async def _publish_files(
    target: Path, member: Member, info: RankInfo, engine: Any, timeout_seconds: float, poll_seconds: float,
    started: float,
) -> list[Member] | None:  # fmt: skip
    """The filesystem barrier: member files in ``F.d``, the group file ``F``, an abort marker."""
    loop = asyncio.get_running_loop()
    members_dir = _members_dir(target)
    members_dir.mkdir(parents=True, exist_ok=True)
    write_group_file(members_dir / f"rank-{info.rank}.json", [member], {"job": info.job})
    interval = poll_seconds
    try:
        if info.rank != 0:
            deadline = loop.time() + timeout_seconds + FOLLOWER_GRACE_SECONDS
            while True:
                with contextlib.suppress(GroupError):
                    listed = read_group_file(target).select([info.rank])[0]
                    if listed.pid == member.pid and listed.address == member.address:
                        return None
                reason = _abort_reason(members_dir, info, started)
                if reason is not None:
                    raise GroupError(f"{info}: the group {target} was abandoned: {reason}")
                if loop.time() > deadline:
                    raise GroupError(f"{info}: the group {target} was not published within "
                                     f"{timeout_seconds + FOLLOWER_GRACE_SECONDS:g} s (rank 0 gone?)")  # fmt: skip
                await asyncio.sleep(interval)  # bounded polling of a condition, not a guess at readiness
                interval = min(interval * 2, 0.1)
        deadline = loop.time() + timeout_seconds
        verified: dict[int, Member] = {}
        while True:
            for entry in members_dir.glob("rank-*.json"):
                with contextlib.suppress(GroupError):
                    joined = read_group_file(entry)
                    m = joined.members[0]
                    if verified.get(m.rank) == m:
                        continue
                    if joined.metadata.get("job") != info.job or not 0 <= m.rank < info.size:
                        continue  # another job's leftover
                    if m.rank == 0 or await _answers(engine, m):
                        verified[m.rank] = m
            if len(verified) == info.size:
                break
            reason = _abort_reason(members_dir, info, started)
            if reason is not None:
                raise GroupError(f"group {target}: {reason}")
            if loop.time() > deadline:
                missing = sorted(set(range(info.size)) - set(verified))
                raise GroupError(
                    f"group {target}: rank(s) {missing} of {info.size} did not report within {timeout_seconds:g} s "
                    f"(their member files go to {members_dir})"
                )
            await asyncio.sleep(interval)  # bounded polling of a condition, not a guess at readiness
            interval = min(interval * 2, 0.1)
        members = [verified[r] for r in range(info.size)]
        problem = _spanning_problem(members)
        if problem is not None:
            raise GroupError(f"group {target}: {problem}")
    except GroupError as exc:
        report_failure(target, info, str(exc))  # the others stop waiting at once (this rank leaves)
        raise
    shutil.rmtree(members_dir, ignore_errors=True)  # first: whoever sees the group file sees no member files
    write_group_file(target, members, _metadata(info, "filesystem"))
    return members


def process_start() -> float:
    """When this process started, seconds since the epoch."""
    import psutil

    return float(psutil.Process().create_time())


def _metadata(info: RankInfo, barrier: str) -> dict[str, Any]:
    return {"host": socket.gethostname(), "created": time.time(), "size": info.size, "launcher": info.source,
            "job": info.job, "barrier": barrier}  # fmt: skip


async def _answers(engine: Any, member: Member) -> bool:
    """Does the member answer an admin ``status`` call with its own pid?"""
    if engine is None:
        return True
    try:
        status = await engine.call(member.address, "status", None, provider_id=member.provider_id,
                                   timeout_seconds=2.0)  # fmt: skip
    except SvcframeError:
        return False
    return isinstance(status, dict) and status.get("pid") == member.pid


def member_record(info: RankInfo, address: str, admin_provider_id: int) -> Member:
    """This rank's entry of the group file; ``ready`` is when it accepted calls (seconds since the epoch), so a
    reader can check the file was written (``metadata.created``) after every member was ready."""
    return Member(info.rank, address, admin_provider_id, os.getpid(), socket.gethostname(), time.time())


def describe(info: RankInfo) -> dict[str, Any]:
    """JSON-ready view of a :class:`RankInfo`."""
    return asdict(info)
