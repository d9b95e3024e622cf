"""``svcframe bench``: svcframe against the raw uvloop limit and other RPC stacks (a plugin of the ``svcframe``
command line, registered in pyproject.toml's ``svcframe.cli`` entry points)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..bench import WORKLOAD_GROUPS, WORKLOADS


@click.command()
@click.option("--quick", is_flag=True, help="Short measurements (for CI: figures printed, no pass/fail).")
@click.option("--seconds", type=float, default=3.0, show_default=True, help="Length of each measurement.")
@click.option(
    "--workload", "workloads", multiple=True, type=click.Choice((*WORKLOADS, *WORKLOAD_GROUPS)),
    help="Repeatable; " + "; ".join(f"{k} = {', '.join(v)}" for k, v in WORKLOAD_GROUPS.items()) + ". Default: all.",
)  # fmt: skip
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="out/bench.json", show_default=True)
def bench(quick: bool, seconds: float, workloads: tuple[str, ...], output: str) -> None:
    """Measure svcframe against the raw uvloop limit (and pyzmq / grpcio when installed)."""
    from ..bench import BenchOptions, print_table, run_bench

    opts = BenchOptions(quick=quick, seconds=seconds, workloads=workloads or WORKLOADS)
    result = run_bench(opts)
    print_table(result)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(json.dumps(result, indent=2))
    click.echo(f"results: {output}")
