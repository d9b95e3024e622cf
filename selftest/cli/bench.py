"""``svcframe bench``: svcframe against the raw uvloop limit and other RPC stacks (a plugin of the ``svcframe``
command line, registered in pyproject.toml's ``svcframe.cli`` entry points)."""

from __future__ import annotations

import json

import click

from svcframe.cli.common import StepProgress, echo_json, json_option, output_path, write_output

from ..bench import WORKLOAD_GROUPS, WORKLOADS


@click.command()
@click.option("--quick", is_flag=True, help="Short measurements (for CI: figures printed, no pass/fail).")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=3.0, show_default=True,
              help="Length of each measurement.")  # fmt: skip
@click.option(
    "--workload", "workloads", multiple=True, type=click.Choice((*WORKLOADS, *WORKLOAD_GROUPS)),
    help="Repeatable; " + "; ".join(f"{k} = {', '.join(v)}" for k, v in WORKLOAD_GROUPS.items()) + ". Default: all.",
)  # fmt: skip
@click.option(
    "--output", "-o", callback=output_path, type=click.Path(dir_okay=False), default="out/bench.json", show_default=True
)
@json_option
def bench(quick: bool, seconds: float, workloads: tuple[str, ...], output: str, as_json: bool) -> None:
    """Measure svcframe against the raw uvloop limit (and pyzmq / grpcio when installed).

    Progress goes to stderr (a bar on a terminal, a line per workload in a pipe); --json prints the results
    document (the file of -o: {"kind": "svcframe-bench", "options", "environment", "rows", "wall_seconds"})."""
    from ..bench import BenchOptions, bench_steps, print_table, run_bench

    opts = BenchOptions(quick=quick, seconds=seconds, workloads=workloads or WORKLOADS)
    with StepProgress("bench", len(bench_steps(opts.workloads))) as progress:
        result = run_bench(opts, lambda description, done, total: progress.step(description, done))
        progress.finish()
    write_output(output, json.dumps(result, indent=2), "the benchmark's results")
    if as_json:
        echo_json(result)
        return
    print_table(result)
    click.echo(f"results: {output}")
