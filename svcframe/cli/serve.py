"""``svcframe serve`` (one server in the foreground) and ``svcframe launch`` (N servers on this machine).

Both WRITE a group file with ``--group-file FILE`` (``-g`` always names a group file to read, in every verb).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import click

from ..config import parse_config, read_document
from ..errors import SvcframeError
from ..group import GROUP_ENV
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
              help="Under srun/mpiexec: rank 0 writes this group file once every rank is ready.")  # fmt: skip
@_no_group_flag
@click.option("--group-timeout-seconds", type=float, default=120.0, show_default=True,
              help="How long rank 0 waits for the other ranks.")  # fmt: skip
@click.option("--lifeline-fd", type=int, default=None,
              help="Shut down when this pipe's write end closes (the launcher exited).")  # fmt: skip
@click.option("--config-name", default=None, hidden=True, help="What errors name CONFIG by (svcframe launch).")
@click.option("--rank", type=click.IntRange(min=0), default=None, hidden=True,
              help="This process's rank among --procs (svcframe launch; else the launcher's).")  # fmt: skip
@click.option("--procs", type=click.IntRange(min=1), default=1, hidden=True,
              help="Processes started from CONFIG on this machine (svcframe launch).")  # fmt: skip
def serve(
    config: str, ready_fd: int | None, secret_file: str | None, address: str | None, group_file: str | None,
    group_timeout_seconds: float, lifeline_fd: int | None, config_name: str | None, rank: int | None, procs: int,
) -> None:  # fmt: skip
    """Run one server from a JSON bootstrap CONFIG until SIGTERM / Ctrl-C / admin shutdown.

    Under a launcher (srun, mpiexec) each process learns its rank from the environment (or mpi4py); with
    --group-file the group is published when all ranks accept calls (svcframe/ranks.py). A provider config
    may name per-rank files with {rank} (kv: "path": "kv-{rank}.sqlite").

    Libraries are imported as ``python -m`` would: the current directory first."""
    from ..server import run_server

    import_from_cwd()
    source = config_name or config
    try:
        data = read_document(config)
        cfg = parse_config(data, source)
        if address:
            cfg.engine.address = address
        per_rank = isinstance(data, dict) and "{rank}" in json.dumps(data.get("providers"))
        if rank is None:  # the rank a launcher's environment gives, where the config names per-rank files
            from .. import ranks

            launched = ranks.from_environment() if per_rank else None
            rank = launched.rank if launched is not None else 0
    except SvcframeError as exc:
        if ready_fd is not None:
            os.write(ready_fd, (json.dumps({"ok": False, "error": str(exc)}) + "\n").encode())
        fail(str(exc))
    on_ready = None
    if group_file is not None:
        from .. import ranks

        try:
            info = ranks.detect()
        except SvcframeError as exc:
            fail(str(exc))
        cfg.engine.address = ranks.rank_address(cfg.engine.address, info)
        comm = ranks.mpi_comm() if info.size > 1 else None
        if comm is not None and (comm.Get_size(), comm.Get_rank()) != (info.size, info.rank):
            comm = None  # mpi4py is built against another MPI than the launcher's: use the filesystem

        async def on_ready(server: Any) -> None:
            member = ranks.member_record(info, server.address, cfg.admin.provider_id)
            members = await ranks.publish_group(group_file, member, info, engine=server.engine, comm=comm,
                                                timeout_seconds=group_timeout_seconds)  # fmt: skip
            if members is not None:
                click.echo(f"svcframe: group of {len(members)} published to {group_file}", err=True)

    sys.exit(run_server(cfg, ready_fd=ready_fd, secret=read_secret(secret_file), on_ready=on_ready,
                        lifeline_fd=lifeline_fd, source=source, rank=rank, procs=procs))  # fmt: skip


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
def launch(
    config: str, procs: int, group_file: str, pin: bool, start_timeout_seconds: float, secret_file: str | None
) -> None:
    """Start N server processes from CONFIG, write the group file when all are ready, and stop them all
    cleanly on Ctrl-C or SIGTERM."""
    from ..launch import Launch, usable_cores

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
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        click.echo(f"svcframe: {procs} server(s) ready; group file {group_file}; logs in {job.workdir}", err=True)
        for m in members:
            click.echo(f"  rank {m.rank}: {m.address} (pid {m.pid})", err=True)
        while not stop["now"] and len(job.wait(0.2)) < procs:
            pass  # woken every 0.2 s to notice a signal; exits when every server has exited
    finally:
        codes = job.stop()
        for s, h in old.items():
            signal.signal(s, h)
    bad = {r: c for r, c in codes.items() if c != 0}
    if bad:
        fail(f"server(s) exited with non-zero codes: {bad}; their logs are kept in {job.workdir}")
    click.echo("svcframe: all servers stopped cleanly", err=True)
