"""``svcframe roofline place | io | workflow``: measured workloads on the three rooflines of a stored platform
(DESIGN.md section 6b), registered under ``svcframe roofline`` by ``roofline.py``.

* ``place``: a workload (self-test ``--rpc`` results, a workload JSON, or a running service's statistics over
  a window) on the data-service ceilings: score, region, headroom and limit per point; PNG, JSON, and the
  placement kept with the platform's run for ``svcframe report``;
* ``io``: the I/O rooflines of Zhu & Neuwirth (storage and network): ψ, κ, ridge intensity, system scores,
  and workloads placed by their operations per byte;
* ``workflow``: the workflow roofline of Ding et al. for a workflow JSON (or flags for one stage): ceilings,
  wall, the four zones of the targets, measured runs placed.

The platform (``--model``) is a run of the results store (``latest``, an id, ``-N``) or a ``roofline.json``.
Every command prints its tables through ``svcframe.cli.common.print_table`` (never cutting a value: folded to
a terminal's width, one line per row in a pipe) with figures in one notation (``svcframe.units``), ``--json``
prints the document instead, and a user error is one line (FILES are read before the platform is looked up,
an ``--output`` that cannot be written is refused before anything runs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from svcframe.cli.common import (
    echo_json,
    fail,
    group_members,
    group_option,
    json_argument,
    output_console,
    output_path,
    print_lines,
    print_table,
    quantity,
    ranks_option,
    read_secret,
    writable,
    write_output,
)
from svcframe.errors import SvcframeError

from ..plotting import PlottingUnavailable
from .history import open_store, store_option


# -- shared ---------------------------------------------------------------------------------------------------------
def model_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--model", "model_ref", default="latest", show_default=True, metavar="RUN|FILE",
        help="The platform model: a run of the results store (id, latest, -N) or a roofline.json file.",
    )(fn)  # fmt: skip


def bound_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--bound", type=click.Choice(["max", "min"]), default="max", show_default=True,
        help="Ceilings from the top or the bottom of the measured Pc and Ps ranges.",
    )(fn)  # fmt: skip


def output_options(default_dir: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option("--json", "as_json", is_flag=True, help="Print the JSON document instead of the table.")(fn)
        return click.option(
            "--output", "-o", "out", callback=output_path, type=click.Path(file_okay=False), default=None,
            help=f"Directory for the PNG and JSON (default: {default_dir}; with --json, none unless given).",
        )(fn)  # fmt: skip

    return decorate


def load_platform(ref: str, store_path: str | None) -> tuple[Any, int | None]:
    """The platform of ``--model`` and the id of its stored run (None for a file); a user error when neither."""
    from ..roofline import Platform

    try:
        if ref.endswith(".json") or Path(ref).is_file():
            return Platform.load(ref), None
        with open_store(store_path) as st:
            run = st.run(ref, with_samples=False)
        return Platform.from_document(run, f"run {run['id']}"), int(run["id"])
    except (ValueError, SvcframeError) as exc:
        fail(str(exc))


def out_dir(out: str | None, as_json: bool, default: str) -> Path | None:
    """The directory the command writes in (``-o``, else ``default``; None with ``--json`` and no ``-o``), checked
    before it computes anything (a user error names what is wrong)."""
    if out is None and as_json:
        return None
    path = Path(out or default)
    problem = writable(path, directory=True)
    if problem is not None:
        fail(problem)
    return path


def workload_from_files(files: Sequence[str], name: str | None) -> Any:
    """One workload from self-test results files and workload JSON files (their points, in order)."""
    from ..roofline import Workload

    parts = []
    for f in files:
        try:
            doc = json.loads(Path(f).read_text())
        except (OSError, ValueError) as exc:
            fail(f"{f}: cannot read a workload: {exc}")
        try:
            if isinstance(doc, dict) and doc.get("kind") == "svcframe-selftest":
                parts.append(Workload.from_selftest_results(doc, label=Path(f).stem))
            else:
                parts.append(Workload.from_document(doc, f))
        except ValueError as exc:
            fail(f"{f}: {exc}".replace("\n", "; "))
    rpcs = sorted({w.rpc for w in parts if w.rpc is not None})
    if len(rpcs) > 1:
        fail(f"the files measure different RPCs ({', '.join(rpcs)}): place one workload at a time")
    return Workload(
        name=name or parts[0].name,
        rpc=rpcs[0] if rpcs else None,
        points=[p for w in parts for p in w.points],
        source={"files": list(files), "notes": [n for w in parts for n in w.source.get("notes") or []]},
    )


def write_json(path: Path, doc: Any) -> Path:
    """``doc`` as indented JSON in ``path`` (a late failure keeps it in a temporary file: ``write_output``)."""
    return write_output(path, json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n", f"{path.name}'s data")


def draw(plot: Callable[[], Path], path: Path, written: Sequence[Path]) -> Path:
    """``plot()`` (which writes ``path``): a user error when matplotlib is missing or the file cannot be written,
    naming what was written already."""
    try:
        return plot()
    except PlottingUnavailable as exc:
        fail(f"{exc}: {', '.join(map(str, written))}")
    except OSError as exc:
        fail(f"cannot write {path} ({exc.strerror or exc}); written: {', '.join(map(str, written)) or 'nothing'}")


# -- place ----------------------------------------------------------------------------------------------------------
@click.command("place", short_help="A workload on the data-service rooflines.")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@model_option
@store_option
@click.option("--from-service", is_flag=True,
              help="Measure the workload from a running service: its statistics read twice, a window apart.")  # fmt: skip
@group_option
@ranks_option
@click.option("--rpc", default=None, metavar="PROVIDER:NAME", help="--from-service: the RPC (store:put or 1:put).")
@click.option("--window-seconds", type=float, default=10.0, show_default=True, help="--from-service: the window.")
@click.option("--clients", type=click.IntRange(min=1), default=None,
              help="--from-service: the client processes (default: the distinct calling peers, a lower bound).")  # fmt: skip
@click.option("--name", default=None, help="The workload's name (default: the provider type and the RPC).")
@bound_option
@output_options("out/placement")
@click.option("--no-store", is_flag=True, help="Do not keep the placement with the model's run in the store.")
def place_command(
    files: tuple[str, ...], model_ref: str, store_path: str | None, from_service: bool, group: str | None,
    ranks: list[int] | None, rpc: str | None, window_seconds: float, clients: int | None, name: str | None,
    bound: str, out: str | None, as_json: bool, no_store: bool,
) -> None:  # fmt: skip
    """Place a workload on the platform's data-service rooflines: per point (one service ratio) the calls/s
    per client process measured and attainable, the headroom (attainable / measured), the metric that limits
    it, its region (server-bound: more servers help; client-bound: they do not) and its score.

    FILES are results of `svcframe selftest run --rpc ... -o FILE` (one per service ratio) or workload JSON
    files; or --from-service -g GROUP --rpc PROVIDER:NAME reads a running service's statistics over
    --window-seconds. Writes placement.png, placement.json and workload.json, and keeps the placement with
    the model's run (svcframe report RUN shows it).
    """
    from ..roofline import place
    from ..roofline.plots import plot_placement

    if from_service == bool(files):
        fail("give FILES (self-test results or workloads) or --from-service -g GROUP --rpc PROVIDER:NAME", 2)
    if not from_service and (rpc or clients or group or ranks is not None):
        fail("--rpc, --clients, -g and --ranks go with --from-service", 2)
    if from_service and rpc is None:
        fail("--from-service needs --rpc PROVIDER:NAME (the RPC to read, e.g. store:put)", 2)
    workload = None if from_service else workload_from_files(files, name)  # a bad file is named first
    platform, run_id = load_platform(model_ref, store_path)
    if workload is None:
        assert rpc is not None
        workload = _live_workload(group, ranks, rpc, window_seconds, clients, name)
    try:
        placement = place(platform, workload, bound)  # type: ignore[arg-type]
    except ValueError as exc:
        fail(str(exc))
    dest = out_dir(out, as_json, "out/placement")
    kept = None
    if run_id is not None and not no_store:  # kept with the run first: a file that cannot be written loses nothing
        with open_store(store_path) as st:
            kept = (st.add_placement(run_id, placement), st.path)
    written = []
    if dest is not None:
        written = [write_json(dest / "workload.json", workload.model_dump(mode="json")),
                   write_json(dest / "placement.json", placement)]  # fmt: skip
        png = dest / "placement.png"
        written.insert(0, draw(lambda: plot_placement(platform, placement, png), png, written))
    if as_json:
        echo_json(placement)
        return
    _print_placement(placement, written, run_id, kept)


def _live_workload(
    group: str | None, ranks: list[int] | None, spec: str, window_seconds: float, clients: int | None,
    name: str | None,
) -> Any:  # fmt: skip
    """The workload of ``spec`` on the members of ``group`` from their statistics read twice."""
    from svcframe.admin import ServiceHandle
    from svcframe.engine import Engine
    from svcframe.loops import run

    from ..roofline import Workload
    from ..rpc_workload import resolve_rpc

    if not window_seconds > 0:
        fail(f"--window-seconds must be > 0, got {window_seconds}", 2)
    targets = [(m.address, m.provider_id) for m in group_members(group, ranks)]

    async def read() -> tuple[Any, dict[str, Any], dict[str, Any], float]:
        async with Engine(None, secret=read_secret()) as engine:
            target = await resolve_rpc(engine, targets, spec)
            handles = [ServiceHandle(engine, a, p) for a, p in targets]
            first = [await h.statistics() for h in handles]
            t0 = time.monotonic()
            click.echo(f"reading {target.type} {target.name} on {len(targets)} server(s) for "
                       f"{quantity(window_seconds, 's')}", err=True)  # fmt: skip
            await _sleep(window_seconds)
            second = [await h.statistics() for h in handles]
            elapsed = time.monotonic() - t0
        addresses = [a for a, _ in targets]
        return target, dict(zip(addresses, first, strict=True)), dict(zip(addresses, second, strict=True)), elapsed

    try:
        target, first, second, elapsed = run(read())
        return Workload.from_statistics(
            first, second, rpc=spec, name=name or f"{target.type} {target.name}", rpc_name=target.name,
            provider_id=target.provider_id, window_seconds=elapsed, clients=clients,
        )  # fmt: skip
    except (ValueError, SvcframeError) as exc:
        fail(str(exc))


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)  # the measurement window itself


def _print_placement(
    placement: dict[str, Any], written: Sequence[Path], run_id: int | None, kept: tuple[int, Path] | None
) -> None:
    from ..report import PLACEMENT_COLUMNS, PLACEMENT_FIGURES, placement_table

    console = output_console()
    rpc = f" ({placement['rpc']})" if placement.get("rpc") else ""
    print_table(PLACEMENT_COLUMNS, placement_table(placement), numeric=PLACEMENT_FIGURES, console=console,
                title=f"{placement['workload']}{rpc} on {placement['platform']}, {placement['bound']} ceilings")  # fmt: skip
    summary = placement["summary"]
    if summary["score"] is not None:
        line = f"score {summary['score']:.2f} over {summary['count']} point(s) the model claims"
        if summary["median_headroom"] is not None:
            line += f", median headroom {summary['median_headroom']:.3g}x"
    else:
        line = "no point the model claims"
    if summary["excluded"]:
        line += f"; {summary['excluded']} excluded (*: more than one process per core)"
    lines = [line, *(f"- {finding}" for finding in placement_findings(placement))]
    lines += [f"note: {note}" for note in placement["notes"]]
    lines += [f"{_WRITTEN.get(path.name, path.stem)}: {path}" for path in written]
    if kept is not None:
        lines.append(f"kept with run {run_id} in {kept[1]}: svcframe report {run_id}")
    print_lines(*lines, console=console)


_WRITTEN = {"placement.png": "plot", "placement.json": "placement", "workload.json": "workload (place it again)"}


def placement_findings(placement: dict[str, Any]) -> list[str]:
    """What each point says to change: a point well below its roof is bound by the service's own work; a
    server-bound one needs more servers (up to the ridge), a client-bound one does not."""
    out = []
    for r in placement["points"]:
        where = f"{r['servers']}x{r['clients']}"
        if r["headroom"] is not None and r["headroom"] >= 2:
            out.append(f"{where}: {r['headroom']:.3g}x below the roof: the service's own work per call bounds it, "
                       "not the RPC rate or bandwidth this platform allows (see: svcframe stats diagnose)")  # fmt: skip
        elif r["region"] == "server-bound":
            out.append(f"{where}: server-bound (X < X* = {r['ridge']:.3g}): up to {r['servers_at_ridge']} servers "
                       f"for {r['clients']} clients raise the roof")  # fmt: skip
        else:
            out.append(f"{where}: near the roof, client-bound: each client is at its peak, more servers do not help")
    return out


# -- io -------------------------------------------------------------------------------------------------------------
@click.command("io", short_help="The I/O rooflines (Zhu & Neuwirth).")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@model_option
@store_option
@click.option("--side", type=click.Choice(["server", "client"]), default="server", show_default=True,
              help="Peaks per server process (Ps) or per client process (Pc).")  # fmt: skip
@click.option("--counts", "counts", multiple=True, metavar="ROOFLINE:LABEL=OPS,BYTES,SECONDS",
              help="A workload from characterisation counters of one process (repeatable), e.g. "
                   "storage:checkpoint=1200,4915200000,60.")  # fmt: skip
@click.option("--samples", is_flag=True, help="Also place the self-test's own validation samples.")
@bound_option
@output_options("out/io")
def io_command(
    files: tuple[str, ...], model_ref: str, store_path: str | None, side: str, counts: tuple[str, ...],
    samples: bool, bound: str, out: str | None, as_json: bool,
) -> None:  # fmt: skip
    """The I/O rooflines of the platform (Zhu & Neuwirth eq. 3: attainable ops/s = min(psi, kappa x lambda),
    lambda = operations per byte): for storage and the network, psi, kappa, the ridge intensity and the
    system scores (eqs. 13-14); workloads placed by their operations per byte, with their scores (eqs.
    10-12). FILES (self-test --rpc results, workload JSON) go on the network roofline at 1 / bytes per call.
    """
    from ..roofline import IOPoint, io_rooflines
    from ..roofline.io import IO_METRICS, validation_points
    from ..roofline.placement import io_points
    from ..roofline.plots import plot_io
    from ..roofline.scores import combine_scores

    workloads = [(f, workload_from_files([f], None)) for f in files]  # each its own workload; a bad file first
    platform, _ = load_platform(model_ref, store_path)
    rooflines = io_rooflines(platform, side, bound)  # type: ignore[arg-type]
    if not rooflines:
        fail(f"{platform.label}: the model has no metric pair of an I/O roofline (storage: storage_iops and "
             f"storage_bandwidth; network: rpc_rate and bandwidth)")  # fmt: skip
    points: dict[str, list[Any]] = {name: [] for name in rooflines}
    # psi and kappa are the platform's Ps (server side) or Pc (client side): said when they are lower bounds
    notes = platform.lower_bounds(
        [m for name in rooflines for m in IO_METRICS[name]], ["Ps" if side == "server" else "Pc"]
    )
    if files and "network" not in rooflines:
        fail(f"{platform.label}: the model has no network I/O roofline (rpc_rate and bandwidth) for FILES")
    for f, workload in workloads:  # several RPCs may share the roofline
        placed = io_points(workload, side)  # type: ignore[arg-type]
        points["network"] += placed
        if len(placed) < len(workload.points):
            notes.append(f"{f}: {len(workload.points) - len(placed)} point(s) move no bytes (no I/O intensity)")
    for spec in counts:
        where, _, rest = spec.partition(":")
        label, _, numbers = rest.rpartition("=")
        try:
            ops, nbytes, seconds = (float(x) for x in numbers.split(","))
            point = IOPoint.from_counts(label, ops, nbytes, seconds)
        except ValueError as exc:
            fail(f"--counts {spec!r}: expected ROOFLINE:LABEL=OPERATIONS,BYTES,SECONDS with numbers > 0 ({exc})")
        if where not in rooflines or not label:
            fail(f"--counts {spec!r}: ROOFLINE is one of {', '.join(rooflines)} and LABEL is not empty")
        points[where].append(point)
    if samples:
        for name in rooflines:
            points[name] += validation_points(platform, name, side)  # type: ignore[arg-type]
    placed_rows = {name: [rooflines[name].place(p) for p in pts] for name, pts in points.items()}
    by_label: dict[str, dict[str, float]] = {}
    for name, rows in placed_rows.items():
        for row in rows:
            by_label.setdefault(row["label"], {})[name] = row["score"]
    doc = {
        "kind": "svcframe-io-roofline",
        "platform": platform.label,
        "side": side,
        "bound": bound,
        "rooflines": {name: rl.to_dict() for name, rl in rooflines.items()},
        "points": placed_rows,
        "application_scores": {label: combine_scores(s) for label, s in by_label.items()},
        "notes": notes,
    }
    dest = out_dir(out, as_json, "out/io")
    written = []
    if dest is not None:
        written.append(write_json(dest / "io.json", doc))
        png = dest / "io.png"
        written.insert(0, draw(lambda: plot_io(list(rooflines.values()), png, points), png, written))
    if as_json:
        echo_json(doc)
        return
    _print_io(doc, written)


def _gib(bytes_per_second: float) -> str:
    # a bandwidth in GiB/s, as the plots and the collect tables show one (never rescaled to MiB/s)
    return quantity(bytes_per_second / 2**30, "GiB/s", keep_unit=True)


def _print_io(doc: dict[str, Any], written: Sequence[Path]) -> None:
    console = output_console()
    rows: list[tuple[str, ...]] = []
    for name, rl in doc["rooflines"].items():
        ridge = rl["ridge_intensity_ops_per_byte"]
        rows.append((name, quantity(rl["psi_ops_per_second"], "ops/s"), _gib(rl["kappa_bytes_per_second"]),
                     f"{ridge:.3g}", quantity(1 / ridge, "B"), _gib(rl["system_score_bandwidth_bytes_per_second"])))  # fmt: skip
    columns = ("roofline", "psi", "kappa", "ridge ops/B", "1 op per", "bandwidth score")
    print_table(columns, rows, numeric=columns[1:], console=console,
                title=f"I/O rooflines (Zhu & Neuwirth eq. 3) of {doc['platform']}, per {doc['side']} process, "
                f"{doc['bound']} of the measured ranges")  # fmt: skip
    print_lines("system scores: vector (psi, ridge) eq. 13; bandwidth psi / ridge eq. 14", console=console)
    for name, placed in doc["points"].items():
        if not placed:
            continue
        points = [
            (r["label"], quantity(1 / r["intensity_ops_per_byte"], "B"), quantity(r["ops_per_second"]),
             quantity(r["attainable_ops_per_second"]), "-" if r["headroom"] is None else f"{r['headroom']:.3g}x",
             r["region"].removesuffix("-bound"), f"{r['score']:.2f}")
            for r in placed
        ]  # fmt: skip
        print_table((name, "B/op", "ops/s", "roof", "headroom", "bound by", "score"), points, console=console,
                    numeric=("B/op", "ops/s", "roof", "headroom", "score"), title=f"on the {name} roofline:")  # fmt: skip
    lines = []
    if any(doc["points"].values()):
        combined = ", ".join(f"{label} {s:.2f}" for label, s in doc["application_scores"].items())
        lines.append(f"application scores (eq. 12 over the rooflines each is on): {combined}")
    else:
        lines.append("no workload placed: give self-test results or workload FILES, --counts or --samples")
    lines += [f"note: {note}" for note in doc["notes"]]
    lines += [f"{'plot' if path.suffix == '.png' else 'json'}: {path}" for path in written]
    print_lines(*lines, console=console)


# -- workflow -------------------------------------------------------------------------------------------------------
_SPEC_FLAGS = ("servers", "parallel_tasks", "client_processes_per_task", "available_client_processes",
               "target_makespan_seconds", "target_throughput_tasks_per_second")  # fmt: skip
_STAGE_FLAGS = ("tasks", "rpcs_per_task", "bytes_per_task")


@click.command("workflow", short_help="The workflow roofline (Ding et al.).")
@click.argument("workflow_file", required=False, type=click.Path(dir_okay=False), metavar="[WORKFLOW.json]")
@model_option
@store_option
@click.option("--name", default=None, help="The workflow's name (one stage from flags: default 'workflow').")
@click.option("--servers", type=click.IntRange(min=1), default=None, help="Server processes of the service.")
@click.option("--parallel-tasks", type=click.IntRange(min=1), default=None, help="Tasks run at once.")
@click.option("--tasks", type=click.IntRange(min=1), default=None, help="One stage from flags: its tasks.")
@click.option("--rpcs-per-task", type=click.IntRange(min=0), default=None, help="One stage: RPCs per task.")
@click.option("--bytes-per-task", type=click.IntRange(min=0), default=None, help="One stage: bytes per task.")
@click.option("--client-processes-per-task", type=click.IntRange(min=1), default=None)
@click.option("--available-client-processes", type=click.IntRange(min=1), default=None,
              help="Client processes that can run at once (default: the platform's client cores).")  # fmt: skip
@click.option("--target-makespan-seconds", type=float, default=None, help="The time a task may take.")
@click.option("--target-throughput", "target_throughput_tasks_per_second", type=float, default=None,
              help="Tasks per second wanted.")  # fmt: skip
@click.option("--run", "runs", multiple=True, metavar="PARALLEL:MAKESPAN[:LABEL]",
              help="A measured run: parallel tasks and makespan in seconds (repeatable).")  # fmt: skip
@click.option("--runs", "runs_file", type=click.Path(dir_okay=False), default=None,
              help="Measured runs: a JSON list of {label, parallel_tasks, makespan_seconds[, tasks]}.")  # fmt: skip
@bound_option
@output_options("out/workflow")
def workflow_command(
    workflow_file: str | None, model_ref: str, store_path: str | None, name: str | None, runs: tuple[str, ...],
    runs_file: str | None, bound: str, out: str | None, as_json: bool, **flags: Any,
) -> None:  # fmt: skip
    """The workflow roofline (Ding et al. eq. 1) of a workflow against the service: node ceilings (a task's
    client processes at R(1) = min(Pc, Ps)), system ceilings (Ps x servers, RPC rate and bandwidth), the
    parallelism wall (available client processes / per task), the four zones of the targets (Fig. 2a) and
    the measured runs placed. WORKFLOW.json (configs/ and examples/ hold some), or flags for one stage:
    --servers --parallel-tasks --tasks --rpcs-per-task --bytes-per-task.
    """
    from ..roofline import WorkflowSpec
    from ..roofline.plots import plot_workflow
    from ..roofline.workflow import analyse, from_platform

    stage = {k: flags.pop(k) for k in _STAGE_FLAGS}
    doc: dict[str, Any]
    if workflow_file is not None:
        if any(v is not None for v in stage.values()):
            fail("--tasks, --rpcs-per-task and --bytes-per-task describe one stage without WORKFLOW.json: "
                 "edit the file's stages instead", 2)  # fmt: skip
        doc = json_argument(f"@{workflow_file}", "the workflow file")
        if not isinstance(doc, dict):
            fail(f"{workflow_file}: a workflow is a JSON object")
        source = workflow_file
    else:
        missing = [f"--{k.replace('_', '-')}" for k in ("servers", "parallel_tasks") if flags[k] is None]
        missing += [f"--{k.replace('_', '-')}" for k in ("tasks",) if stage[k] is None]
        if missing or (not stage["rpcs_per_task"] and not stage["bytes_per_task"]):
            fail(f"give WORKFLOW.json, or {' '.join(missing) or 'flags'} and --rpcs-per-task or --bytes-per-task", 2)
        doc = {"name": name or "workflow", "stages": [{"name": "tasks", "tasks": stage["tasks"],
               "rpcs_per_task": stage["rpcs_per_task"] or 0, "bytes_per_task": stage["bytes_per_task"] or 0}]}  # fmt: skip
        source = "the workflow flags"
    if name is not None:
        doc["name"] = name
    doc.update({k: v for k, v in flags.items() if v is not None})
    doc["runs"] = list(doc.get("runs") or []) + _runs(runs, runs_file)
    try:
        spec = WorkflowSpec.from_document(doc, source)
    except ValueError as exc:
        fail(str(exc).replace("\n", "; "))
    platform, _ = load_platform(model_ref, store_path)
    try:
        analysis = analyse(platform, spec, bound)  # type: ignore[arg-type]
        roofline = from_platform(platform, spec, bound)  # type: ignore[arg-type]
    except ValueError as exc:
        fail(str(exc))
    analysis["spec"] = spec.model_dump(mode="json")
    dest = out_dir(out, as_json, "out/workflow")
    written = []
    if dest is not None:
        written.append(write_json(dest / "workflow.json", analysis))
        png = dest / "workflow.png"
        written.insert(0, draw(lambda: plot_workflow(roofline, png, analysis["runs"]), png, written))
    if as_json:
        echo_json(analysis)
        return
    _print_workflow(analysis, written)


def _runs(runs: Sequence[str], runs_file: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if runs_file is not None:
        listed = json_argument(f"@{runs_file}", "the runs file")
        if not isinstance(listed, list):
            fail(f"{runs_file}: the runs file holds a JSON list of runs")
        out += listed
    for text in runs:
        parallel, _, rest = text.partition(":")
        makespan, _, label = rest.partition(":")
        try:
            out.append({"label": label or f"{parallel} at once", "parallel_tasks": int(parallel),
                        "makespan_seconds": float(makespan)})  # fmt: skip
        except ValueError:
            fail(f"--run {text!r}: expected PARALLEL:MAKESPAN[:LABEL], e.g. 2:3.5 or '2:3.5:2 at once'", 2)
    return out


def _print_workflow(analysis: dict[str, Any], written: Sequence[Path]) -> None:
    console = output_console()
    spec, rl = analysis["spec"], analysis["roofline"]
    ceilings = [
        (c["kind"], quantity(c["seconds_per_task"], "s/task") if c["kind"] == "node"
         else quantity(c["tasks_per_second"], "tasks/s"), c["name"])
        for c in rl["ceilings"]
    ]  # fmt: skip
    ceilings.append(("wall", f"{rl['wall']} tasks", "parallel tasks (client processes / those of a task)"))
    print_table(("kind", "ceiling", "what"), ceilings, numeric=("ceiling",), console=console,
                title=f"workflow roofline (Ding et al. eq. 1): {analysis['workflow']}, {len(spec['stages'])} "
                f"stage(s), {sum(s['tasks'] for s in spec['stages'])} tasks, {spec['servers']} server(s), on "
                f"{analysis['platform']}, {analysis['bound']} ceilings")  # fmt: skip
    n = analysis["parallel_tasks"]
    line = f"at {n} parallel task(s): roof {quantity(analysis['attainable_tasks_per_second'], 'tasks/s')}"
    if analysis["beyond_wall"]:
        line += ", beyond the wall"
    if analysis["attainable_zone"] is not None:
        line += f"; best zone reachable: {analysis['attainable_zone']}"
    lines = [line]
    if rl["target_makespan_seconds"] is not None and rl["target_throughput_tasks_per_second"] is not None:
        lines.append(f"zones (Fig. 2a): good makespan when tasks/s >= n / {quantity(rl['target_makespan_seconds'], 's')}"
                     f", good throughput when tasks/s >= {quantity(rl['target_throughput_tasks_per_second'])}")  # fmt: skip
    for s in analysis["stages"]:
        lines.append(f"stage {s['name']}: {s['tasks']} tasks, roof {quantity(s['attainable_tasks_per_second'], 'tasks/s')}"
                     f", makespan >= {quantity(s['makespan_lower_bound_seconds'], 's')}, bound by {s['bound']}")  # fmt: skip
    lines.append(f"makespan >= {quantity(analysis['makespan_lower_bound_seconds'], 's')} (the stages run one after "
                 "the other)")  # fmt: skip
    for r in analysis["runs"]:
        wall = ", beyond the wall" if r["beyond_wall"] else ""
        zone = f", {r['zone']}" if r["zone"] else ""
        lines.append(f"run {r['label']}: {r['parallel_tasks']} parallel, {quantity(r['tasks_per_second'], 'tasks/s')} "
                     f"against a roof of {quantity(r['attainable_tasks_per_second'], 'tasks/s')} ({r['headroom']:.3g}x "
                     f"headroom), {r['bound_kind']}-bound{wall}{zone}")  # fmt: skip
    lines += [f"note: {note}" for note in analysis.get("notes") or []]
    lines += [f"{'plot' if path.suffix == '.png' else 'json'}: {path}" for path in written]
    print_lines(*lines, console=console)
