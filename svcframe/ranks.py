"""Rank and size from the field's launchers, and a group file published once every rank is ready.

svcframe never starts processes on other nodes itself (DESIGN.md section 7): ``srun`` or ``mpiexec``
does, and each process learns who it is from the launcher's environment:

==================  =======================  ======================  ==========================  ===========
launcher            rank                     size                    node-local rank             node
==================  =======================  ======================  ==========================  ===========
Open MPI (mpirun)   OMPI_COMM_WORLD_RANK     OMPI_COMM_WORLD_SIZE    OMPI_COMM_WORLD_LOCAL_RANK  -
PMIx (prrte, srun)  PMIX_RANK                OMPI_COMM_WORLD_SIZE,   PMIX_LOCAL_RANK             -
                                             PMI_SIZE, SLURM_NTASKS
MPICH/Hydra, Intel  PMI_RANK                 PMI_SIZE                MPI_LOCALRANKID             -
Slurm (srun)        SLURM_PROCID             SLURM_NTASKS            SLURM_LOCALID               SLURM_NODEID
==================  =======================  ======================  ==========================  ===========

The MPI launchers' variables win over Slurm's, because ``mpiexec`` inside an ``sbatch`` script inherits
the batch step's ``SLURM_PROCID=0``. Without any of them, ``mpi4py`` (when importable) asks MPI itself;
otherwise the process is rank 0 of 1.

Group file (``publish_group``): every rank of ``svcframe serve CONFIG --group-file F`` reports its address
once it accepts calls; rank 0 writes ``F`` (``svcframe.group.write_group_file``: atomic, the shape
``svcframe launch`` writes) when all ``size`` ranks have; each member carries ``ready``, when it accepted calls,
so a reader can check the file came after every member was ready. The barrier is MPI's own (``gather`` to
rank 0, then ``barrier``) when mpi4py is importable, else the filesystem: each rank writes ``F.d/rank-<r>.json``
(a group file of one member, its job in the metadata) and rank 0 waits for ``size`` of them by bounded
polling of that condition (no fixed sleep; it also answers within milliseconds), checks
that each member answers an admin ``status`` call with its pid (so a stale file of an earlier job cannot
complete the group), writes ``F`` and removes ``F.d``.

Errors: :class:`GroupError` (a :class:`~svcframe.errors.SvcframeError`) when the group is not complete
within ``timeout_seconds`` (the message lists the missing ranks) or the environment is inconsistent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import GroupError, SvcframeError
from .group import Member, read_group_file, write_group_file


@dataclass(frozen=True)
class RankInfo:
    """Who this process is in its job.

    Attributes:
        rank: 0 <= rank < size.
        size: processes in the job, >= 1.
        local_rank: rank among the job's processes on this node (None if the launcher does not say).
        node_id: index of this node in the job (Slurm only; None otherwise).
        source: where it came from: ``"ompi"``, ``"pmix"``, ``"pmi"``, ``"slurm"``, ``"mpi4py"`` or ``"none"``.
        job: an identifier of the job step when the launcher gives one (Slurm, Open MPI, PMIx), else None.
    """

    rank: int
    size: int
    local_rank: int | None = None
    node_id: int | None = None
    source: str = "none"
    job: str | None = None

    @property
    def launched(self) -> bool:
        """True when a launcher (or MPI) named this process's rank."""
        return self.source != "none"


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
    """Rank, size, node-local rank and node from launcher variables (table in the module docstring).

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
    candidates: list[tuple[str, int | None, int | None, int | None, int | None, str | None]] = [
        ("ompi", _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
         _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), None,
         f"ompi:{env['OMPI_MCA_ess_base_jobid']}" if env.get("OMPI_MCA_ess_base_jobid") else None),
        ("pmix", _int(env, "PMIX_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"),
         _int(env, "PMIX_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"), _int(env, "SLURM_NODEID"),
         f"pmix:{env['PMIX_NAMESPACE']}" if env.get("PMIX_NAMESPACE") else slurm_step),
        ("pmi", _int(env, "PMI_RANK"), _int(env, "PMI_SIZE"), _int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
         None, None),
        ("slurm", _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS", "SLURM_NPROCS"), _int(env, "SLURM_LOCALID"),
         _int(env, "SLURM_NODEID"), slurm_step),
    ]  # fmt: skip
    for source, rank, size, local_rank, node_id, job in candidates:
        if rank is None:
            continue
        if size is None:
            raise GroupError(f"{source}: the launcher gave rank {rank} but no size")
        if not 0 <= rank < size:
            raise GroupError(f"{source}: rank {rank} is outside 0..{size - 1}")
        return RankInfo(rank, size, local_rank, node_id, source, job)
    return None


def mpi_comm() -> Any | None:
    """``mpi4py.MPI.COMM_WORLD`` when mpi4py is importable (initialising MPI), else None.
    ``SVCFRAME_NO_MPI4PY=1`` turns it off."""
    if os.environ.get("SVCFRAME_NO_MPI4PY"):
        return None
    try:
        from mpi4py import MPI
    except Exception:  # not installed, or no MPI library behind it
        return None
    return MPI.COMM_WORLD


def detect(env: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank: the launcher's environment, else mpi4py when importable, else rank 0 of 1.

    Raises:
        GroupError: inconsistent launcher variables (see :func:`from_environment`).
    """
    info = from_environment(env)
    if info is not None:
        return info
    comm = mpi_comm() if env is None else None
    if comm is not None and comm.Get_size() > 1:
        return RankInfo(comm.Get_rank(), comm.Get_size(), None, None, "mpi4py")
    return RankInfo(0, 1)


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


async def publish_group(
    path: str | os.PathLike[str],
    member: Member,
    info: RankInfo,
    *,
    engine: Any = None,
    comm: Any = None,
    timeout_seconds: float = 120.0,
    poll_seconds: float = 0.01,
) -> list[Member] | None:
    """Join the group; rank 0 writes the group file when every rank has joined.

    Args:
        path: the group file ``F``.
        member: this rank's entry (``member_record``).
        info: this rank (``detect()``).
        engine: a started engine, used by rank 0 (filesystem barrier) to check each member answers.
        comm: an mpi4py communicator: use MPI's gather + barrier instead of the filesystem.
        timeout_seconds: how long rank 0 waits for the others (filesystem barrier).
        poll_seconds: first interval of rank 0's bounded polling of ``F.d`` (doubles up to 0.1 s).

    Returns:
        On rank 0 the members (rank order), on other ranks None.

    Raises:
        GroupError: ranks missing after ``timeout_seconds`` (filesystem barrier; they are listed).
    """
    target = Path(path)
    loop = asyncio.get_running_loop()
    if comm is not None:

        def gather() -> list[Member] | None:
            members = comm.gather(member, root=0)
            if comm.Get_rank() == 0:
                write_group_file(target, members, _metadata(info, "mpi4py"))
            comm.Barrier()  # every rank returns once the file exists
            return sorted(members, key=lambda m: m.rank) if comm.Get_rank() == 0 else None

        return await loop.run_in_executor(None, gather)

    # Each rank's member file is a group file of one member, with the job in its metadata.
    members_dir = target.with_name(target.name + ".d")
    members_dir.mkdir(parents=True, exist_ok=True)
    write_group_file(members_dir / f"rank-{info.rank}.json", [member], {"job": info.job})
    if info.rank != 0:
        return None
    deadline = loop.time() + timeout_seconds
    verified: dict[int, Member] = {}
    interval = poll_seconds
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
        if loop.time() > deadline:
            missing = sorted(set(range(info.size)) - set(verified))
            raise GroupError(
                f"group {target}: rank(s) {missing} of {info.size} did not report within {timeout_seconds:g} s "
                f"(their member files go to {members_dir})"
            )
        await asyncio.sleep(interval)  # bounded polling of a condition, not a guess at readiness
        interval = min(interval * 2, 0.1)
    members = [verified[r] for r in range(info.size)]
    shutil.rmtree(members_dir, ignore_errors=True)  # first: whoever sees the group file sees no member files
    write_group_file(target, members, _metadata(info, "filesystem"))
    return members


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
