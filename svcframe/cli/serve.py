"""``svcframe serve`` (one server in the foreground) and ``svcframe launch`` (N servers on this machine).

Both WRITE a group file with ``--group-file FILE`` (``-g`` always names a group file to read, in every verb).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from ..config import parse_config, read_document
from ..errors import SvcframeError
from ..group import GROUP_ENV
from ..ranks import BARRIERS
from .common import fail, import_from_cwd, output_path, read_secret


def _not_a_reader(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> None:
    if value:
        raise click.BadParameter(
            f"-g/--group names a group file to read; {ctx.command.name} writes its group file with --group-file FILE",
            ctx, param,
        )  # fmt: skip


def _no_group_flag(fn: Any) -> Any:
    """``-g`` on a command that writes a group file: a clear error (it once meant "write" there)."""
    return click.option("-g", "group_flag", multiple=True, hidden=True, expose_value=False, callback=_not_a_reader)(fn)


@click.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--ready-fd", type=int, default=None, help="Write one readiness JSON line to this fd.")
@click.option("--secret-file", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--address", default=None, help="Override engine.address.")
@click.option("--group-file", callback=output_path, type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Rank 0 writes this group file once every rank accepts calls, and removes it as it exits.")  # fmt: skip
@_no_group_flag
@click.option("--group-timeout-seconds", type=float, default=120.0, show_default=True,
              help="How long rank 0 waits for the other ranks, and any rank for MPI_Init.")  # fmt: skip
@click.option("--barrier", type=click.Choice(BARRIERS), default="auto", show_default=True,
              help="How ranks meet before the group file: mpi (mpi4py), filesystem (member files in FILE.d/, on a "
              "filesystem every node sees), auto (mpi when mpi4py loads an MPI that speaks the launcher's PMI).")  # fmt: skip
@click.option("--multi-node/--single-node", default=None,
              help="Clients on other nodes call these servers: refuse an address only this node reaches "
              "[default: when the launcher's step spans several nodes].")  # fmt: skip
@click.option("--lifeline-fd", type=int, default=None,
              help="Shut down when this pipe's write end closes (the launcher exited).")  # fmt: skip
@click.option("--config-name", default=None, hidden=True, help="What errors name CONFIG by (svcframe launch).")
@click.option("--rank", type=click.IntRange(min=0), default=None, hidden=True,
              help="This process's rank among --procs (svcframe launch; else the launcher's).")  # fmt: skip
@click.option("--procs", type=click.IntRange(min=1), default=1, hidden=True,
              help="Processes started from CONFIG on this machine (svcframe launch).")  # fmt: skip
def serve(
    config: str, ready_fd: int | None, secret_file: str | None, address: str | None, group_file: str | None,
    group_timeout_seconds: float, barrier: str, multi_node: bool | None, lifeline_fd: int | None,
    config_name: str | None, rank: int | None, procs: int,
) -> None:  # fmt: skip
    """Run one server from a JSON bootstrap CONFIG until SIGTERM / Ctrl-C / admin shutdown.

    Under a launcher (srun, mpiexec, mpirun) each process learns its rank and size from the launcher's
    environment, with or without --group-file: a fixed TCP port of CONFIG is offset by the node-local rank
    and a unix path gets .RANK, so that the ranks of one node do not collide. With --group-file the group is
    published when all ranks accept calls (mpi4py, when it loads an MPI, tells the rank too); a rank that
    fails ends every rank's wait, naming itself (svcframe/ranks.py). A provider config may name per-rank
    files with {rank} (kv: "path": "kv-{rank}.sqlite").

    Libraries are imported as ``python -m`` would: the current directory first."""
    from .. import ranks
    from ..server import run_server

    import_from_cwd()
    source = config_name or config

    def refuse(message: str) -> NoReturn:
        if ready_fd is not None:
            os.write(ready_fd, (json.dumps({"ok": False, "error": message}) + "\n").encode())
        fail(message)

    try:
        data = read_document(config)
        cfg = parse_config(data, source)
        if address:
            cfg.engine.address = address
        info = ranks.from_environment() or (ranks.detect() if group_file is not None else ranks.RankInfo(0, 1))
    except SvcframeError as exc:
        refuse(str(exc))
    cfg.engine.address = ranks.rank_address(cfg.engine.address, info)
    comm = None
    try:
        ranks.check_reachable(cfg.engine.address, info, multi_node=multi_node)
        if group_file is not None:
            ranks.remove_stale_group_file(group_file, info, ranks.process_start())
            comm, _ = ranks.choose_barrier(info, barrier, init_timeout_seconds=group_timeout_seconds)
    except SvcframeError as exc:
        if group_file is not None:
            ranks.report_failure(group_file, info, str(exc))
        refuse(str(exc))
    on_ready = None
    if group_file is not None:
        started = ranks.process_start()
        os.environ[GROUP_ENV] = str(Path(group_file).resolve())  # a group provider keeps this job's file

        async def on_ready(server: Any) -> None:
            member = ranks.member_record(info, server.address, cfg.admin.provider_id)
            members = await ranks.publish_group(group_file, member, info, engine=server.engine, comm=comm,
                                                timeout_seconds=group_timeout_seconds, started=started)  # fmt: skip
            if members is not None:
                click.echo(f"svcframe: group of {len(members)} published to {group_file}", err=True)

    def on_failure(reason: str) -> None:  # the start-up failed: end the job's wait at once, naming this rank
        if info.size <= 1:
            return
        click.echo(f"svcframe: error: {info} ({info.source}) failed to start; "
                   f"{'aborting the MPI job' if comm is not None else 'the other ranks stop waiting'}", err=True)  # fmt: skip
        if comm is not None:
            ranks.abort_job(comm)
        elif group_file is not None:
            ranks.report_failure(group_file, info, reason)

    code = run_server(cfg, ready_fd=ready_fd, secret=read_secret(secret_file), on_ready=on_ready,
                      lifeline_fd=lifeline_fd, source=source, rank=info.rank if rank is None else rank,
                      procs=procs, on_failure=on_failure)  # fmt: skip
    if group_file is not None:
        ranks.remove_own_group_file(group_file, info)
        if code != 0 and comm is not None:  # the group failed after start-up (a rank missing, refused)
            click.echo(f"svcframe: error: {info} ({info.source}): the group failed; aborting the MPI job", err=True)
            ranks.abort_job(comm)
    sys.exit(code)


@click.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--procs", "-n", type=int, default=1, show_default=True, help="Server processes to start.")
@click.option("--group-file", callback=output_path, type=click.Path(dir_okay=False), default="svcframe.group.json",
              show_default=True, envvar=GROUP_ENV, show_envvar=True, metavar="FILE",
              help="Write the group file here once every server is ready (removed when they stop).")  # fmt: skip
@_no_group_flag
@click.option("--pin/--no-pin", default=False, help="Pin rank i to usable core i (mod cores).")
@click.option("--start-timeout-seconds", type=float, default=60.0, show_default=True)
@click.option("--secret-file", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--kill-on-bad-exit", "-K", is_flag=True, default=False,
              help="Stop every server when one exits with an error or a signal (srun -K); by default the others "
              "serve on and the group file lists the live ones.")  # fmt: skip
def launch(
    config: str, procs: int, group_file: str, pin: bool, start_timeout_seconds: float, secret_file: str | None,
    kill_on_bad_exit: bool,
) -> None:  # fmt: skip
    """Start N server processes from CONFIG, write the group file when all are ready, and stop them all
    cleanly on Ctrl-C or SIGTERM.

    A server that exits meanwhile is reported at once (its rank, pid and how it ended); the group file is
    written again without it, and the launcher's exit status is 1 when any server ended with an error or a
    signal."""
    from ..launch import Launch, describe_exit, usable_cores

    import_from_cwd()  # the config's libraries are checked here before any server starts, as serve imports them
    stop = {"now": False}

    def on_signal(signum: int, frame: Any) -> None:
        stop["now"] = True

    try:
        job = Launch(
            config, procs, cores=usable_cores() if pin else None, group_file=group_file,
            start_timeout_seconds=start_timeout_seconds, secret_file=secret_file,
        )  # fmt: skip
        members = job.start()
    except SvcframeError as exc:
        fail(str(exc))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    old_wakeup = signal.set_wakeup_fd(wake_w)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        click.echo(f"svcframe: {procs} server(s) ready; group file {group_file}; logs in {job.workdir}", err=True)
        for m in members:
            click.echo(f"  rank {m.rank}: {m.address} (pid {m.pid})", err=True)
        while not stop["now"] and len(job.departed) < procs:
            for rank, code in sorted(job.wait_for_exits(wake_fd=wake_r).items()):
                live = procs - len(job.departed)
                note = f"; {job.group_notes[rank]}" if rank in job.group_notes else ""
                click.echo(f"svcframe: rank {rank} (pid {job.departed[rank]['pid']}) {describe_exit(code)}; "
                           f"{live} of {procs} server(s) left{'; group file rewritten' if live else ''}{note}",
                           err=True)  # fmt: skip
                if code != 0 and kill_on_bad_exit:
                    click.echo("svcframe: stopping the others (--kill-on-bad-exit)", err=True)
                    stop["now"] = True
    finally:
        codes = job.stop()
        for s, h in old.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(old_wakeup)
        os.close(wake_r)
        os.close(wake_w)
    bad = {r: c for r, c in codes.items() if c != 0}
    if bad:
        which = "; ".join(f"rank {r} {describe_exit(c)}" for r, c in sorted(bad.items()))
        fail(f"{which}; logs kept in {job.workdir}")
    click.echo("svcframe: all servers stopped cleanly", err=True)
