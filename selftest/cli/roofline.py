"""``svcframe roofline collect|plot``: the whole parameter suite of the data-service roofline over a node set,
and its plots redrawn from a model; ``place|io|workflow`` (``models.py``) put measured workloads on the three
rooflines (a plugin of the ``svcframe`` command line, registered in pyproject.toml's ``svcframe.cli`` entry
points)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import click

from svcframe.cli.common import StepProgress, echo_json, fail, int_list, json_option, output_path, writable
from svcframe.config import load_config
from svcframe.errors import SvcframeError

from ..collect import ALL_METRICS
from ..nodes import LAUNCHERS
from ..plotting import PlottingUnavailable
from ..provider import STORAGE_OPS
from .history import open_store, store_option
from .models import io_command, place_command, workflow_command


@click.group()
def roofline() -> None:
    """Measure and draw the data-service roofline; place workloads on it and on the I/O and workflow
    rooflines."""


@roofline.command("collect")
@click.option(
    "--output",
    "-o",
    "out",
    callback=output_path,
    type=click.Path(file_okay=False),
    default="out/roofline",
    show_default=True,
)
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Server config hosting the self-test provider (default: the shipped one, see: svcframe selftest config).")  # fmt: skip
@click.option("--duration-seconds", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Samples of Pc and Ps.")
@click.option("--paper", is_flag=True, help="The paper's settings: 5-second measurements, five samples.")
@click.option("--metric", "metrics", multiple=True,
              type=click.Choice(ALL_METRICS),
              help="Metric to measure (repeatable; default all four).")  # fmt: skip
@click.option("--bulk-size", type=click.IntRange(min=1), default=1024 * 1024, show_default=True)
@click.option("--saturation-depth", type=click.IntRange(min=1), default=16, show_default=True,
              help="Ps: the load ramp's most calls in flight per client process (from 1, 4x a step).")  # fmt: skip
@click.option("--max-clients-per-core", type=click.IntRange(min=1), default=4, show_default=True,
              help="Ps: the load ramp's most client processes per client-node core (from 2, doubling).")  # fmt: skip
@click.option("--grid-servers", default="1,2", show_default=True, callback=int_list)
@click.option("--grid-clients", default="1,2,4,8", show_default=True, callback=int_list)
@click.option("--sweep-max-servers", type=click.IntRange(min=0), default=None,
              help="Server-process sweep 1..N (default: the server cores; 0 = no sweep).")  # fmt: skip
@click.option("--storage-dir", type=click.Path(file_okay=False), default=None,
              help="Directory of the servers' storage files (default: the system temporary directory).")  # fmt: skip
@click.option(
    "--storage-block-size",
    type=click.IntRange(min=1),
    default=4096,
    show_default=True,
    help="Bytes per op, storage_iops.",
)
@click.option("--storage-bandwidth-block-size", type=click.IntRange(min=1), default=1024 * 1024, show_default=True,
              help="Bytes per op, storage_bandwidth.")  # fmt: skip
@click.option("--storage-op", type=click.Choice(STORAGE_OPS), default="write", show_default=True)
@click.option("--storage-fsync", is_flag=True, help="fdatasync after every storage write.")
@click.option("--service", default=None, help="Name history compares under (default: the config's file stem).")
@click.option("--platform", "platform_name", default=None,
              help="Platform name for history (default: $SLURM_CLUSTER_NAME or the host name).")  # fmt: skip
@click.option("--weight", "weights", multiple=True, help="METRIC=W: weight in the combined score (default 1).")
@click.option("--nodes", "nodes_spec", default=None, metavar="local:K",
              help="Split this machine's usable cores into K local nodes (default local:2 outside an allocation).")  # fmt: skip
@click.option("--hostfile", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Nodes from an Open MPI ('host slots=N') or MPICH ('host:N') hostfile; first host = server node.")  # fmt: skip
@click.option("--launcher", type=click.Choice(LAUNCHERS), default="auto", show_default=True,
              help="What starts processes: srun inside Slurm, mpiexec with a hostfile, local otherwise.")  # fmt: skip
@click.option("--grid-server-nodes", default=None, callback=int_list,
              help="Validation grid in fully populated nodes, e.g. 1,2 (with --grid-client-nodes).")  # fmt: skip
@click.option("--grid-client-nodes", default=None, callback=int_list, help="Validation grid client nodes, e.g. 1,2,3.")
@click.option("--coordinator-host", default=None,
              help="Host this process's engine binds to for remote client processes (default: the address of "
              "--interface, else the host name).")  # fmt: skip
@click.option("--interface", default=None, metavar="NAME",
              help="Nodes from srun/mpiexec: servers and this process listen on this network interface's address "
              "of their node (e.g. ib0, eth0), not on their node name's (which may not resolve, or resolve to "
              "127.0.1.1).")  # fmt: skip
@store_option
@click.option("--no-store", is_flag=True, help="Do not record the run in the results store.")
@click.option("--resume", default=None, help="Continue an interrupted run (id, 'latest' or -N) from the store.")
@json_option
def roofline_collect(
    out: str, config_file: str | None, duration_seconds: float, repeats: int, paper: bool, metrics: tuple[str, ...],
    bulk_size: int, saturation_depth: int, max_clients_per_core: int, grid_servers: list[int],
    grid_clients: list[int], sweep_max_servers: int | None,
    storage_dir: str | None, storage_block_size: int, storage_bandwidth_block_size: int, storage_op: str,
    storage_fsync: bool,
    service: str | None, platform_name: str | None, weights: tuple[str, ...], nodes_spec: str | None,
    hostfile: str | None, launcher: str, grid_server_nodes: list[int] | None, grid_client_nodes: list[int] | None,
    coordinator_host: str | None, interface: str | None, store_path: str | None, no_store: bool, resume: str | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Run the whole suite over a node set: launch, Pc over every pair of nodes, the load ramp that saturates the
    server node, Ps under its load, server sweep, validation grid, teardown; write plots + JSON and record the run
    in the results store. A Pc or Ps measured short of its definition is marked a lower bound, with what was
    measured (CPU of servers and clients, the ramp). Ctrl-C stops cleanly; --resume continues. On a cluster:
    inside salloc/sbatch (--launcher srun) or with --hostfile (mpiexec).

    Progress goes to stderr: a bar on a terminal, one line per measurement in a pipe or a log. --json prints
    the summary as one JSON document: {"kind": "svcframe-roofline-summary", "run_id", "store", "metrics": {NAME:
    {"unit", "parameters", "pc", "ps" (each with "lower_bound"), "pc_saturation", "ps_saturation", "ridge",
    "scores", "above_ceiling", "findings", "plot"}}, "combined_score", "weights", "validity", "overhead", "model",
    "sweep_plot"} (the whole model is in the roofline.json it names)."""
    from .. import SELFTEST_CONFIG
    from ..collect import CollectOptions, collect, plan
    from ..report import collect_summary_json, print_collect_summary
    from ..store import default_store_path

    store_file = None if no_store else (Path(store_path) if store_path else default_store_path())
    resume_id = None
    if resume is not None:
        if store_file is None:
            fail("--resume needs the results store (drop --no-store)")
        try:
            with open_store(str(store_file)) as st:
                resume_id = st.resolve(resume)
                run = st.run(resume_id, with_samples=False)
        except SvcframeError as exc:
            fail(str(exc))
        if run["status"] == "complete":
            fail(f"run {resume_id} is already complete")
        opts = CollectOptions.from_dict(run["options"])
        opts.store = store_file
    else:
        if paper:
            duration_seconds, repeats = 5.0, 5
        try:
            weight_map = {k: float(v) for k, v in (w.split("=", 1) for w in weights)}
        except ValueError:
            fail(f"--weight takes METRIC=NUMBER, got {weights}")
        opts = CollectOptions(
            out=Path(out), config=Path(config_file) if config_file else SELFTEST_CONFIG,
            metrics=list(metrics) or list(ALL_METRICS), duration_seconds=duration_seconds, repeats=repeats,
            bulk_size=bulk_size, saturation_depth=saturation_depth, max_clients_per_core=max_clients_per_core,
            grid_servers=grid_servers,
            grid_clients=grid_clients, sweep_max_servers=sweep_max_servers,
            storage_dir=Path(storage_dir) if storage_dir else None, storage_block_size=storage_block_size,
            storage_bandwidth_block_size=storage_bandwidth_block_size, storage_op=storage_op,
            storage_fsync=storage_fsync, store=store_file, service=service, platform=platform_name,
            weights=weight_map or None, nodes=nodes_spec, hostfile=Path(hostfile) if hostfile else None,
            launcher=launcher, coordinator_host=coordinator_host, interface=interface,
            grid_server_nodes=grid_server_nodes,
            grid_client_nodes=grid_client_nodes,
        )  # fmt: skip
    try:
        total = len(plan(opts))
        load_config(opts.config)  # a bad config is one line before anything starts
    except (ValueError, SvcframeError) as exc:
        fail(str(exc))

    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # tear down as for Ctrl-C

    old_term = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with StepProgress("roofline collect", total) as progress:
            progress.note("launching servers and clients")

            def on_step(description: str, index: int, todo: int) -> None:
                progress.step(description, total - todo + index - 1)

            doc = collect(opts, on_step, resume=resume_id)
            progress.finish()
    except KeyboardInterrupt:
        hint = ""
        if store_file is not None and store_file.exists():
            with open_store(str(store_file)) as st:
                runs = st.runs()
            rid = resume_id if resume_id is not None else (runs[-1]["id"] if runs else None)
            if rid is not None:
                hint = f"; resume with: svcframe roofline collect --resume {rid} --store {store_file}"
        click.echo(f"svcframe: interrupted, servers and clients stopped{hint}", err=True)
        sys.exit(130)
    except (SvcframeError, PlottingUnavailable) as exc:
        fail(str(exc))
    finally:
        signal.signal(signal.SIGTERM, old_term)
    if as_json:
        echo_json(collect_summary_json(doc, Path(opts.out)))
    else:
        print_collect_summary(doc, Path(opts.out))
    if doc.get("unwritten"):  # the disk filled or the directory went away during the run: nothing is lost
        where = (
            [f"run {doc['run_id']} in {doc['store']} (svcframe report {doc['run_id']})"] if doc.get("run_id") else []
        )
        where += [f"the model in {doc['kept']}"] if doc.get("kept") else []
        fail(f"cannot write {len(doc['unwritten'])} file(s), first {doc['unwritten'][0]}; the measurements are kept: "
             f"{'; '.join(where) or 'the summary above'}")  # fmt: skip


@roofline.command("plot")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--output", "-o", "out", callback=output_path, type=click.Path(file_okay=False), default=None)
def roofline_plot(model: str, out: str | None) -> None:
    """Redraw the plots of a roofline.json (no service needed)."""
    from ..collect import plot_title
    from ..roofline import Roofline, plot

    try:
        doc = json.loads(Path(model).read_text())
    except (OSError, ValueError) as exc:
        fail(f"{model}: cannot read a roofline model: {exc}", 2)
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
        kind = doc.get("kind") if isinstance(doc, dict) else None
        fail(f"{model} is not a roofline model (the roofline.json of `svcframe roofline collect`)"
              + (f"; it is a {kind} document" if kind else ""), 2)  # fmt: skip
    dest = Path(out) if out else Path(model).parent
    if out is None and (problem := writable(dest, directory=True)) is not None:
        fail(problem)
    try:
        for name, m in doc["metrics"].items():
            title = plot_title(name, doc.get("options") or {}) if name in ALL_METRICS else None
            click.echo(plot(Roofline.from_dict(m), dest / f"{name}.png", title=title))
    except (ValueError, PlottingUnavailable) as exc:
        fail(f"{model}: {exc}")
    except OSError as exc:
        fail(f"cannot write in {dest}: {exc.strerror or exc}")


# measured workloads on the three models (models.py)
for _command in (place_command, io_command, workflow_command):
    roofline.add_command(_command)
