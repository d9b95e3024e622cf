"""``svcframe history [show RUN]`` and ``svcframe report RUN``: the runs of the results store, a run against its
history ("is that normal?") and a run's HTML page (a plugin of the ``svcframe`` command line, registered in
pyproject.toml's ``svcframe.cli`` entry points)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from svcframe.cli.common import echo_json, fail, json_option, output_path, writable, write_output
from svcframe.errors import SvcframeError

from ..plotting import PlottingUnavailable


def store_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--store", "store_path", type=click.Path(dir_okay=False), default=None,
        help="Results store (SQLite). Default: $SVCFRAME_RESULTS or ~/.local/share/svcframe/results.sqlite.",
    )(fn)  # fmt: skip


def open_store(store_path: str | None, *, must_exist: bool = True) -> Any:
    """The results store of ``--store`` (else the default one); a user error when it does not exist or is not
    a results store."""
    from ..store import ResultsStore, default_store_path

    path = Path(store_path) if store_path else default_store_path()
    if must_exist and not path.exists():
        fail(f"no results store at {path}: run `svcframe roofline collect` first, or give --store PATH")
    try:
        return ResultsStore(path)
    except SvcframeError as exc:
        fail(str(exc))


@click.group(invoke_without_command=True)
@store_option
@click.option("--service", default=None, help="Only runs of this service.")
@click.option("--platform", "platform_name", default=None, help="Only runs on this platform.")
@json_option
@click.pass_context
def history(
    ctx: click.Context, store_path: str | None, service: str | None, platform_name: str | None, as_json: bool
) -> None:
    """List the runs of the results store (or `history show RUN`: a run against its history).

    --json: {"store": PATH, "runs": [{"id", "created" (Unix time), "status", "service", "platform",
    "measurements", "planned", "metrics", "wall_seconds", "outside_fraction", "combined_score"}, ...]}."""
    ctx.ensure_object(dict)
    ctx.obj["store_path"] = store_path
    if ctx.invoked_subcommand is not None:
        return
    from ..report import history_rows, print_history

    with open_store(store_path) as st:
        runs = st.runs(service=service, platform=platform_name)
        if as_json:
            echo_json({"store": str(st.path), "runs": history_rows(runs)})
        else:
            print_history(runs, st.path)


@history.command("show")
@click.argument("run_ref", metavar="RUN", default="latest")
@store_option
@click.option("--output", "-o", "out", callback=output_path, type=click.Path(dir_okay=False), default=None,
              help="Box-plot PNG (default: out/history/run-ID.png).")  # fmt: skip
@json_option
@click.pass_context
def history_show(ctx: click.Context, run_ref: str, store_path: str | None, out: str | None, as_json: bool) -> None:
    """Is that normal? RUN's Pc, Ps, scores and overhead against the earlier runs of the same service and
    platform: a table, and box plots of the history with RUN as a marker (UMAMI).

    --json: {"run": ID, "service", "platform", "history": [IDs], "rows": [{"quantity", "unit", "value", "count",
    "min", "q1", "median", "q3", "max", "percentile", "verdict"}, ...], "plot": PATH}."""
    from ..report import print_comparison
    from ..store import compare, history_png

    try:
        with open_store(store_path or ctx.obj.get("store_path")) as st:
            run = st.run(run_ref, with_samples=False)
            hist = [h for h in st.history(run["id"]) if h["id"] != run["id"] and h["created"] <= run["created"]]
        rows = compare(run, hist)
        image = history_png(run, hist)
    except (SvcframeError, PlottingUnavailable) as exc:
        fail(str(exc))
    dest = Path(out) if out else Path("out/history") / f"run-{run['id']}.png"
    if out is None and (problem := writable(dest)) is not None:
        fail(problem)
    png = write_output(dest, image, "the plot")
    if as_json:
        echo_json({"run": run["id"], "service": run["service"], "platform": run["platform"],
                   "history": [h["id"] for h in hist], "rows": rows, "plot": str(png)})  # fmt: skip
        return
    print_comparison(run, rows)
    click.echo(f"plot: {png}")


@click.command()
@click.argument("run_ref", metavar="RUN", default="latest")
@store_option
@click.option("--output", "-o", "out", callback=output_path, type=click.Path(dir_okay=False), default=None,
              help="HTML file (default: out/report/run-ID.html).")  # fmt: skip
def report(run_ref: str, store_path: str | None, out: str | None) -> None:
    """Write one self-contained HTML page of a run from the results store: every plot and table."""
    from ..report import report_html

    try:
        with open_store(store_path) as st:
            run = st.run(run_ref)
            hist = [h for h in st.history(run["id"]) if h["id"] != run["id"] and h["created"] <= run["created"]]
        dest = Path(out) if out else Path("out/report") / f"run-{run['id']}.html"
        if out is None and (problem := writable(dest)) is not None:
            fail(problem)
        text = report_html(run, hist)
    except (SvcframeError, PlottingUnavailable) as exc:
        fail(str(exc))
    write_output(dest, text, "the report")
    click.echo(f"report: {dest}")
