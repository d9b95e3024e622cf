"""A two-stage workflow that writes then reads through the kv provider, run and measured as Ding et al. measure
a workflow (papers/ding2024-workflow-roofline.txt, section III-B: makespan from the first task's start to the
last task's end; throughput = tasks / makespan), to be placed on its workflow roofline::

    python examples/kv_workflow.py examples/kv-workflow.json -g kv-group.json --parallel-tasks 2 --runs runs.json
    svcframe roofline workflow examples/kv-workflow.json --runs runs.json

The workflow file (``svcframe roofline workflow``'s format) names the stages: ``write`` (each task puts
``rpcs_per_task`` keys of ``bytes_per_task / rpcs_per_task`` bytes) and ``read`` (each task gets the keys a
write task wrote, and checks their length). ``--parallel-tasks`` client processes run the tasks, at most one
each at a time; a stage starts when the one before it has ended; task ``i`` talks to server ``i mod S``. The
processes start and connect before the clock starts. The run is appended to ``--runs`` (a JSON list).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
import uuid
from pathlib import Path
from typing import Any

import click

from providers.kv import KVClient
from selftest.roofline import WorkflowSpec
from svcframe.engine import Engine
from svcframe.group import read_group_file

OPERATIONS = ("write", "read")
"""The stage names this workflow knows: a stage named otherwise is an error."""

_worker: dict[str, Any] = {}  # per client process: its event loop, engine and kv clients


def _start(servers: list[str], provider_id: int, ready: Any) -> None:
    """Pool initializer: an engine connected to every server, then one token on ``ready``."""
    loop = asyncio.new_event_loop()
    engine = loop.run_until_complete(Engine(None).start())
    for address in servers:
        loop.run_until_complete(engine.connection(address))
    _worker.update(loop=loop, engine=engine, clients=[KVClient(engine, a, provider_id) for a in servers])
    ready.put(True)


def _task(job: tuple[str, str, int, int, int]) -> int:
    """One task of a stage: ``rpcs`` puts or gets of ``value_bytes``; returns the bytes it moved."""
    operation, prefix, task, rpcs, value_bytes = job
    kv = _worker["clients"][task % len(_worker["clients"])]

    async def run() -> int:
        if operation == "write":
            value = bytes(value_bytes)
            for i in range(rpcs):
                await kv.put(f"{prefix}-{task}-{i}", value)
            return rpcs * value_bytes
        moved = 0
        for i in range(rpcs):
            value = await kv.get(f"{prefix}-{task}-{i}")
            if value is None or len(value) != value_bytes:
                raise RuntimeError(f"task {task}: key {prefix}-{task}-{i} does not hold what stage write wrote")
            moved += len(value)
        return moved

    return int(_worker["loop"].run_until_complete(run()))


@click.command()
@click.argument("workflow", type=click.Path(exists=True, dir_okay=False))
@click.option("--group", "-g", required=True, type=click.Path(exists=True, dir_okay=False), help="Group file.")
@click.option("--provider", default="store", show_default=True, help="The kv provider's name on the servers.")
@click.option("--parallel-tasks", type=click.IntRange(min=1), required=True, help="Tasks run at once.")
@click.option("--runs", "runs_file", type=click.Path(dir_okay=False), required=True, help="JSON list to append to.")
@click.option("--label", default=None, help="The run's label (default: 'N at once').")
def main(workflow: str, group: str, provider: str, parallel_tasks: int, runs_file: str, label: str | None) -> None:
    """Run the write-then-read workflow once and append the measured run to RUNS."""
    spec = WorkflowSpec.load(workflow)
    unknown = [s.name for s in spec.stages if s.name not in OPERATIONS]
    if unknown:
        raise click.ClickException(f"{workflow}: stages must be named {' or '.join(OPERATIONS)}, not {unknown}")
    servers = [m.address for m in read_group_file(group).select(None)]
    provider_id = asyncio.run(_lookup(servers[0], provider))
    prefix = uuid.uuid4().hex[:8]  # this run's keys
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    with ctx.Pool(parallel_tasks, initializer=_start, initargs=(servers, provider_id, ready)) as pool:
        for _ in range(parallel_tasks):
            ready.get(timeout=60)  # every process connected: the clock starts now
        start = time.monotonic()
        moved = 0
        for stage in spec.stages:  # one after the other: map returns when the stage's last task ended
            jobs = [(stage.name, prefix, t, stage.rpcs_per_task, stage.bytes_per_task // max(stage.rpcs_per_task, 1))
                    for t in range(stage.tasks)]  # fmt: skip
            moved += sum(pool.map(_task, jobs, chunksize=1))
        makespan = time.monotonic() - start
    run = {"label": label or f"{parallel_tasks} at once", "parallel_tasks": parallel_tasks,
           "makespan_seconds": makespan, "tasks": spec.tasks}  # fmt: skip
    path = Path(runs_file)
    runs = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps([*runs, run], indent=2) + "\n")
    click.echo(f"{run['label']}: {spec.tasks} tasks, makespan {makespan:.2f} s, {spec.tasks / makespan:.2f} tasks/s, "
               f"{moved / 2**20:.1f} MiB moved; added to {runs_file}")  # fmt: skip


async def _lookup(address: str, provider: str) -> int:
    """The provider id of ``provider`` at ``address`` (the admin provider's lookup)."""
    from svcframe.admin import ServiceHandle

    async with Engine(None) as engine:
        found = await ServiceHandle(engine, address).lookup_provider(provider)
    if found is None:
        raise click.ClickException(f"{address} has no provider {provider!r}")
    return int(found["provider_id"])


if __name__ == "__main__":
    main()
