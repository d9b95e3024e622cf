"""The ``svcframe`` command line (click). Every command prints JSON or a rich table; errors exit non-zero
with the reason on stderr.

    svcframe serve CONFIG                         one server process in the foreground
    svcframe launch CONFIG --procs N [--group-file F] [--pin]
    svcframe status|shutdown (ADDRESS | --group F)
    svcframe config check FILE | schema | get (ADDRESS | --group F) | query ... EXPR
    svcframe call ADDRESS RPC [ARG_JSON] --provider-id N
    svcframe selftest run (--group F | --target ADDRESS ...) [--clients C] [--workload noop|bulk] ...
    svcframe roofline collect [-o DIR] [--duration-seconds S] [--repeats R] [--paper]
    svcframe roofline plot MODEL.json [-o DIR]
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .config import ADMIN_PROVIDER_ID, config_schema, load_config
from .errors import SvcframeError
from .loops import LOOP_FACTORIES


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"svcframe: error: {message}", err=True)
    sys.exit(code)


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def _read_secret(secret_file: str | None) -> bytes | None:
    if secret_file:
        return Path(secret_file).read_bytes().strip()
    env = os.environ.get("SVCFRAME_SECRET")
    return env.encode() if env else None


def _targets(addresses: tuple[str, ...], group: str | None) -> list[tuple[str, int]]:
    from .launch import read_group_file

    out = [(a, ADMIN_PROVIDER_ID) for a in addresses]
    if group:
        out += [(m.address, m.provider_id) for m in read_group_file(group)]
    if not out:
        _fail("give at least one ADDRESS or --group FILE")
    return out


def _describe(exc: BaseException) -> str:
    """One line for an error; a remote handler's traceback only with -vv."""
    from .errors import RemoteError

    if isinstance(exc, RemoteError):
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            return str(exc)
        return f"{exc.remote_type}: {exc.remote_message}"
    return f"{type(exc).__name__}: {exc}"


def _run_admin(targets: list[tuple[str, int]], method: str, *args: Any, timeout: float = 10.0) -> dict[str, Any]:
    from .admin import ServiceGroupHandle
    from .engine import Engine
    from .loops import run

    async def go() -> dict[str, Any]:
        async with Engine(None, secret=_read_secret(None), default_timeout_seconds=timeout) as engine:
            return await ServiceGroupHandle(engine, targets).call(method, *args)

    results = run(go())
    failed = {a: r for a, r in results.items() if isinstance(r, BaseException)}
    for address, exc in failed.items():
        click.echo(f"svcframe: {address}: {_describe(exc)}", err=True)
    if failed:
        _echo_json({a: r for a, r in results.items() if a not in failed})
        sys.exit(1)
    return results


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """svcframe: an asyncio runtime for HPC data services, with a self-test and the data-service roofline."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)


# -- servers ------------------------------------------------------------------------------------------------
@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--ready-fd", type=int, default=None, help="Write one readiness JSON line to this fd.")
@click.option("--secret-file", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--address", default=None, help="Override engine.address.")
def serve(config: str, ready_fd: int | None, secret_file: str | None, address: str | None) -> None:
    """Run one server from a JSON bootstrap CONFIG until SIGTERM / Ctrl-C / admin shutdown."""
    from .server import run_server

    try:
        cfg = load_config(config)
        if address:
            cfg.engine.address = address
    except SvcframeError as exc:
        if ready_fd is not None:
            os.write(ready_fd, (json.dumps({"ok": False, "error": str(exc)}) + "\n").encode())
        _fail(str(exc))
        return
    sys.exit(run_server(cfg, ready_fd=ready_fd, secret=_read_secret(secret_file)))


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--procs", "-n", type=int, default=1, show_default=True, help="Server processes to start.")
@click.option("--group-file", "-g", type=click.Path(dir_okay=False), default="svcframe.group.json", show_default=True)
@click.option("--pin/--no-pin", default=False, help="Pin rank i to usable core i (mod cores).")
@click.option("--start-timeout-seconds", type=float, default=60.0, show_default=True)
@click.option("--secret-file", type=click.Path(exists=True, dir_okay=False), default=None)
def launch(
    config: str, procs: int, group_file: str, pin: bool, start_timeout_seconds: float, secret_file: str | None
) -> None:
    """Start N server processes from CONFIG, write the group file when all are ready, and stop them all
    cleanly on Ctrl-C or SIGTERM."""
    from .launch import Launch, usable_cores

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
        _fail(str(exc))
        return
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        click.echo(f"svcframe: {procs} server(s) ready; group file {group_file}", err=True)
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
        _fail(f"server(s) exited with non-zero codes: {bad}")
    click.echo("svcframe: all servers stopped cleanly", err=True)


def _target_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.argument("address", nargs=-1)(fn)
    fn = click.option("--group", "-g", type=click.Path(exists=True, dir_okay=False), default=None)(fn)
    return fn


@main.command()
@_target_options
def status(address: tuple[str, ...], group: str | None) -> None:
    """Show each server's address, pid and providers."""
    _echo_json(_run_admin(_targets(address, group), "status"))


@main.command()
@_target_options
def shutdown(address: tuple[str, ...], group: str | None) -> None:
    """Ask servers to drain and exit."""
    _run_admin(_targets(address, group), "shutdown")
    click.echo("shutdown requested", err=True)


@main.command()
@click.argument("address")
@click.argument("rpc_name")
@click.argument("arg", required=False, default="null")
@click.option("--provider-id", "-p", type=int, default=0, show_default=True)
@click.option("--timeout-seconds", type=float, default=10.0, show_default=True)
def call(address: str, rpc_name: str, arg: str, provider_id: int, timeout_seconds: float) -> None:
    """Call RPC_NAME of a provider with a JSON ARG and print the result."""
    from .engine import Engine
    from .loops import run

    async def go() -> Any:
        async with Engine(None, secret=_read_secret(None)) as engine:
            return await engine.call(
                address, rpc_name, json.loads(arg), provider_id=provider_id, timeout_seconds=timeout_seconds
            )

    try:
        result = run(go())
    except (SvcframeError, ValueError) as exc:
        _fail(_describe(exc))
        return
    _echo_json(result.decode(errors="replace") if isinstance(result, bytes) else result)


# -- configuration ---------------------------------------------------------------------------------------------
@main.group()
def config() -> None:
    """Check, export the schema of, and read live configurations."""


@config.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
def config_check(file: str) -> None:
    """Validate a bootstrap config offline; print it with every default filled in."""
    try:
        cfg = load_config(file)
    except SvcframeError as exc:
        _fail(str(exc))
        return
    _echo_json(cfg.model_dump(mode="json"))


@config.command("schema")
def config_schema_cmd() -> None:
    """Print the JSON Schema of the bootstrap config."""
    _echo_json(config_schema())


@config.command("get")
@_target_options
def config_get(address: tuple[str, ...], group: str | None) -> None:
    """Print the live configuration of each server, keyed by address."""
    _echo_json(_run_admin(_targets(address, group), "get_config"))


@config.command("query")
@click.argument("args", nargs=-1, required=True)
@click.option("--group", "-g", type=click.Path(exists=True, dir_okay=False), default=None)
def config_query(args: tuple[str, ...], group: str | None) -> None:
    """Evaluate a JMESPath expression (the last argument) on each server's live configuration."""
    *addresses, expression = args
    _echo_json(_run_admin(_targets(tuple(addresses), group), "query_config", expression))


@config.command("patch")
@click.argument("args", nargs=-1, required=True)
@click.option("--group", "-g", type=click.Path(exists=True, dir_okay=False), default=None)
def config_patch(args: tuple[str, ...], group: str | None) -> None:
    """Apply a JSON Patch (the last argument: JSON text or @FILE) to each server's live configuration.

    Example: svcframe config patch ADDRESS '[{"op": "replace", "path": "/engine/progress_mode", "value": "busy"}]'
    """
    *addresses, text = args
    try:
        patch = json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except (OSError, ValueError) as exc:
        _fail(f"cannot read the JSON Patch: {exc}")
        return
    _echo_json(_run_admin(_targets(tuple(addresses), group), "patch_config", patch))


# -- self-test -------------------------------------------------------------------------------------------------
@main.group()
def selftest() -> None:
    """Run synthetic workloads against a live service."""


@selftest.command("run")
@click.option("--group", "-g", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--target", "-t", multiple=True, help="Server address (repeatable).")
@click.option("--params", "params_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="JSON file of parameters (flags override it).")  # fmt: skip
@click.option("--clients", "-c", type=int, default=None)
@click.option("--depth", type=int, default=None)
@click.option("--workload", type=click.Choice(["noop", "bulk"]), default=None)
@click.option("--duration-seconds", type=float, default=None)
@click.option("--warmup-iterations", type=int, default=None)
@click.option("--req-buffer-size", type=int, default=None)
@click.option("--resp-buffer-size", type=int, default=None)
@click.option("--bulk-size", type=int, default=None)
@click.option("--bulk-direction", type=click.Choice(["pull", "push"]), default=None)
@click.option("--provider-id", type=int, default=None)
@click.option("--progress-mode", type=click.Choice(["block", "busy", "spindown"]), default=None)
@click.option("--client-cores", default=None, help="Comma-separated cores to pin clients to.")
@click.option("--event-loop", type=click.Choice(["auto", *LOOP_FACTORIES]), default=None)
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="Write the results JSON here.")
def selftest_run(
    group: str | None, target: tuple[str, ...], params_file: str | None, output: str | None, **flags: Any
) -> None:
    """Run one self-test; print the results JSON (or a summary when -o is given)."""
    from pydantic import ValidationError

    from selftest.driver import SelftestParams, run_selftest, save_results

    from .config import format_validation_error
    from .launch import read_group_file

    values: dict[str, Any] = json.loads(Path(params_file).read_text()) if params_file else {}
    for key, value in flags.items():
        if value is not None:
            values[key] = [int(c) for c in value.split(",")] if key == "client_cores" else value
    try:
        params = SelftestParams.model_validate(values)
    except ValidationError as exc:
        _fail(format_validation_error(exc, "selftest parameters"))
        return
    servers = list(target) + ([m.address for m in read_group_file(group)] if group else [])
    if not servers:
        _fail("give --group FILE or --target ADDRESS")
    try:
        results = run_selftest(params, servers)
    except SvcframeError as exc:
        _fail(str(exc))
        return
    if output:
        save_results(results, output)
        agg = results["aggregate"]
        lat = agg["latency_usec"]
        click.echo(
            f"{params.workload}: {agg['rate_ops_per_second']:.0f} ops/s "
            f"({agg['bandwidth_gib_per_second']:.3f} GiB/s), p50 {lat['p50']:.1f} us, p99 {lat['p99']:.1f} us, "
            f"server CPU {agg['server_cpu_usec_per_op']:.1f} us/op; results in {output}"
        )
    else:
        _echo_json(results)


@selftest.command("bursts")
@click.option("--group", "-g", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--target", "-t", default=None, help="Server address (default: rank 0 of --group).")
@click.option("--bursts", type=int, default=3, show_default=True)
@click.option("--burst-seconds", type=float, default=10.0, show_default=True)
@click.option("--gap-seconds", type=float, default=20.0, show_default=True)
@click.option("--interval-seconds", type=float, default=1.0, show_default=True)
@click.option("--modes", default="block,busy,spindown", show_default=True)
@click.option("--spindown-msec", type=float, default=10.0, show_default=True)
@click.option("--provider-id", type=int, default=1, show_default=True)
@click.option("--client-core", type=int, default=None, help="Pin the client to this core.")
@click.option("--output", "-o", "out", type=click.Path(file_okay=False), default="out/bursts", show_default=True)
def selftest_bursts(group: str | None, target: str | None, out: str, modes: str, **kw: Any) -> None:
    """Sequential noop bursts separated by idle gaps, once per progress mode (the paper's Figure 6)."""
    from selftest.bursts import BurstParams, plot_bursts, run_bursts

    from .launch import read_group_file
    from .loops import run

    server = target or (read_group_file(group)[0].address if group else None)
    if server is None:
        _fail("give --target ADDRESS or --group FILE")
        return
    try:
        params = BurstParams(modes=modes.split(","), **kw)
        results = run(run_bursts(params, server))
    except (SvcframeError, ValueError) as exc:
        _fail(str(exc))
        return
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "bursts.json").write_text(json.dumps(results, indent=2))
    png = plot_bursts(results, dest / "bursts.png")
    for mode in results["modes"]:
        s = mode["summary"]
        watts = f", {s['idle_package_watts']:.1f} W" if s["idle_package_watts"] is not None else ""
        click.echo(
            f"{mode['mode']:>8}: {s['burst_rate_ops_per_second'] or 0:9.0f} calls/s in bursts, "
            f"server CPU idle {100 * (s['idle_server_cpu_utilization'] or 0):5.1f}%, "
            f"busy {100 * (s['burst_server_cpu_utilization'] or 0):5.1f}%{watts}"
        )
    click.echo(f"plot: {png}\nresults: {dest / 'bursts.json'}")


# -- roofline ----------------------------------------------------------------------------------------------------
@main.group()
def roofline() -> None:
    """Measure and draw the data-service roofline."""


@roofline.command("collect")
@click.option("--output", "-o", "out", type=click.Path(file_okay=False), default="out/roofline", show_default=True)
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Server config hosting the self-test provider (default: configs/selftest.json).")  # fmt: skip
@click.option("--duration-seconds", type=float, default=2.0, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True, help="Samples of Pc and Ps.")
@click.option("--paper", is_flag=True, help="The paper's settings: 5-second measurements, five samples.")
@click.option("--metric", "metrics", multiple=True, type=click.Choice(["rpc_rate", "bandwidth"]))
@click.option("--bulk-size", type=int, default=1024 * 1024, show_default=True)
@click.option("--grid-servers", default="1,2", show_default=True)
@click.option("--grid-clients", default="1,2,4,8", show_default=True)
def roofline_collect(
    out: str, config_file: str | None, duration_seconds: float, repeats: int, paper: bool, metrics: tuple[str, ...],
    bulk_size: int, grid_servers: str, grid_clients: str,
) -> None:  # fmt: skip
    """Run the whole suite on this machine: launch, Pc, Ps, validation grid, teardown; write plots + JSON."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from selftest.collect import DEFAULT_CONFIG, CollectOptions, collect, plan

    if paper:
        duration_seconds, repeats = 5.0, 5
    opts = CollectOptions(
        out=Path(out), config=Path(config_file) if config_file else DEFAULT_CONFIG,
        metrics=list(metrics) or ["rpc_rate", "bandwidth"], duration_seconds=duration_seconds, repeats=repeats,
        bulk_size=bulk_size, grid_servers=[int(x) for x in grid_servers.split(",")],
        grid_clients=[int(x) for x in grid_clients.split(",")],
    )  # fmt: skip
    total = len(plan(opts))
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn(), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("starting", total=total)

        def on_step(description: str, index: int, total: int) -> None:
            bar.update(task, description=description, completed=index - 1)

        try:
            doc = collect(opts, on_step)
        except SvcframeError as exc:
            _fail(str(exc))
            return
        bar.update(task, completed=total, description="done")
    _print_roofline_summary(doc, Path(out))


def _print_roofline_summary(doc: dict[str, Any], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="data-service roofline of this machine")
    for col in ("metric", "Pc (per client)", "Ps (per server proc)", "ridge X*", "score", "median rel. error"):
        table.add_column(col)
    for name, m in doc["metrics"].items():
        unit = m["metric"]["unit"]
        scores = m["scores"]["overall"]
        err = scores.get("median_relative_error")
        table.add_row(
            name,
            f"{m['pc']['min']:.4g}-{m['pc']['max']:.4g} {unit}",
            f"{m['ps']['min']:.4g}-{m['ps']['max']:.4g} {unit}",
            f"{m['ridge']['max']:.3g}",
            f"{scores.get('score') or 0:.3f}",
            f"{err:.1%}" if err is not None else "-",
        )
    console = Console()
    console.print(table)
    measured = doc["measurement_seconds"]
    console.print(f"wall time {doc['wall_seconds']:.0f} s, of which measuring {measured:.0f} s")
    for name in doc["metrics"]:
        console.print(f"plot: {out / (name + '.png')}")
    console.print(f"model: {out / 'roofline.json'}")


@roofline.command("plot")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--output", "-o", "out", type=click.Path(file_okay=False), default=None)
def roofline_plot(model: str, out: str | None) -> None:
    """Redraw the plots of a roofline.json (no service needed)."""
    from selftest.roofline import Roofline, plot

    doc = json.loads(Path(model).read_text())
    dest = Path(out) if out else Path(model).parent
    dest.mkdir(parents=True, exist_ok=True)
    for name, m in doc["metrics"].items():
        click.echo(plot(Roofline.from_dict(m), dest / f"{name}.png"))


if __name__ == "__main__":
    main()
