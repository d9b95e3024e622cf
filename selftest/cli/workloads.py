"""``svcframe selftest run|bursts|nic-dispersion|config``: the self-test's workloads against live servers (a plugin
of the ``svcframe`` command line, registered in pyproject.toml's ``svcframe.cli`` entry points)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from svcframe.cli.common import (
    StepProgress,
    echo_json,
    fail,
    group_members,
    group_option,
    int_list,
    json_argument,
    json_option,
    output_console,
    output_path,
    print_lines,
    print_table,
    quantity,
    ranks_option,
    read_secret,
    resolve_targets,
    write_output,
)
from svcframe.errors import SvcframeError
from svcframe.loops import EVENT_LOOPS
from svcframe.plumber import BUCKET_POLICIES, NIC_POLICIES
from svcframe.progress import PROGRESS_MODES

from .. import SELFTEST_CONFIG
from ..driver import WORKLOADS
from ..nic_dispersion import COMPARED_NIC_POLICIES, SCENARIOS
from ..plotting import PlottingUnavailable
from ..provider import DIRECTIONS, STORAGE_OPS


@click.group()
def selftest() -> None:
    """Run synthetic workloads against a live service."""


@selftest.command("run")
@group_option
@ranks_option
@click.option("--target", "-t", multiple=True, help="Server address (repeatable).")
@click.option("--params", "params_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="JSON file of parameters, svcframe's or Quintain's (flags override it).")  # fmt: skip
@click.option("--clients", "-c", type=int, default=None)
@click.option("--depth", type=int, default=None)
@click.option("--workload", type=click.Choice(WORKLOADS), default=None)
@click.option("--duration-seconds", type=float, default=None)
@click.option("--warmup-iterations", type=int, default=None)
@click.option("--req-buffer-size", type=int, default=None)
@click.option("--resp-buffer-size", type=int, default=None)
@click.option("--bulk-size", type=int, default=None)
@click.option("--bulk-direction", type=click.Choice(DIRECTIONS), default=None)
@click.option("--storage-op", type=click.Choice(STORAGE_OPS), default=None)
@click.option("--storage-block-size", type=int, default=None)
@click.option("--storage-fsync", is_flag=True, default=None, help="fdatasync after every storage write.")
@click.option("--provider-id", type=int, default=None)
@click.option("--progress-mode", type=click.Choice(PROGRESS_MODES), default=None)
@click.option("--client-cores", default=None, callback=int_list, help="Comma-separated cores to pin clients to.")
@click.option("--event-loop", type=click.Choice(EVENT_LOOPS), default=None)
@click.option("--trace-samples", type=int, default=None,
              help="Record start and latency of each client's first N calls (results: sample_trace).")  # fmt: skip
@click.option(
    "--output",
    "-o",
    callback=output_path,
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the results JSON here.",
)
@click.option("--keep-provider", is_flag=True,
              help="Keep a self-test provider this command added (default: remove it after the run).")  # fmt: skip
@click.option("--rpc", default=None, metavar="PROVIDER:NAME",
              help="The rpc workload: call RPC NAME of a provider, by id (1:put) or by name (store:put).")  # fmt: skip
@click.option("--arg", "rpc_arg", default=None, metavar="JSON|@FILE", help="--rpc: the argument of every call.")
@click.option("--arg-generator", "rpc_arg_generator", default=None, metavar="MODULE:FUNCTION",
              help="--rpc: function(ctx, call) returning each call's argument, e.g. selftest.generators:kv_put.")  # fmt: skip
@click.option("--arg-option", "rpc_arg_options", multiple=True, metavar="KEY=VALUE",
              help="--arg-generator: an option (repeatable; VALUE is JSON when it parses), e.g. value_bytes=1024.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the results JSON even with -o (instead of the summary).")
def selftest_run(
    group: str | None, ranks: list[int] | None, target: tuple[str, ...], params_file: str | None, output: str | None,
    keep_provider: bool, rpc_arg: str | None, rpc_arg_options: tuple[str, ...], as_json: bool, **flags: Any,
) -> None:  # fmt: skip
    """Run one self-test; print the results JSON (or, with -o, a summary; with -o and --json the JSON too).

    Progress goes to stderr: a bar on a terminal, one line per stage in a pipe or a log.

    Servers without a self-test provider get one through their admin provider (library selftest.provider,
    type selftest) for the run; it is removed afterwards unless --keep-provider (it samples the servers' CPU).

    --rpc runs any provider's RPC the same way (processes, depth, warm-up, barrier, timed loop), with the
    argument of --arg, or of --arg-generator called per call as function(ctx, call): ctx.client is the client
    process's index, call the call's index in it, ctx.options the --arg-option values (selftest/rpc_workload.py).
    """
    from pydantic import ValidationError

    from svcframe.config import format_validation_error
    from svcframe.diagnosis import format_diagnosis

    from ..driver import SelftestParams, quintain_params, run_selftest

    values: dict[str, Any] = json_argument(f"@{params_file}", "the parameters file") if params_file else {}
    if not isinstance(values, dict):
        fail(f"{params_file}: the parameters file must hold a JSON object")
    values, ignored = quintain_params(values)
    if ignored:
        click.echo(f"svcframe: warning: {params_file}: ignoring Quintain settings {', '.join(ignored)}", err=True)
    for key, value in flags.items():
        if value is not None:
            values[key] = value
    _rpc_values(values, rpc_arg, rpc_arg_options, workload_given=flags.get("workload") is not None)
    try:
        params = SelftestParams.model_validate(values)
    except ValidationError as exc:
        fail(format_validation_error(exc, "selftest parameters").replace("\n", "; "))
    targets = resolve_targets(target, group, ranks)
    servers = [a for a, _ in targets]
    with StepProgress("selftest run", 1) as progress:
        try:
            attachment = _selftest_attach(targets, params.provider_id if "provider_id" in values else None)
        except SvcframeError as exc:
            fail(str(exc))
        params = params.model_copy(update={"provider_id": attachment.provider_id})
        step = (f"{params.workload}: {params.clients} client(s) x depth {params.depth} on {len(servers)} server(s) "
                f"for {quantity(params.duration_seconds, 's')}")  # fmt: skip
        try:
            results = run_selftest(params, servers, admin_provider_id=targets[0][1],
                                   on_start=lambda: progress.step(step, 0))  # fmt: skip
            progress.finish()
        except SvcframeError as exc:
            fail(str(exc))
        finally:
            _selftest_detach(attachment, keep_provider)
    if output:
        write_output(output, json.dumps(results, indent=2), "the self-test results")
    if output and not as_json:
        agg = results["aggregate"]
        lat = agg["latency_usec"]
        click.echo(
            f"{params.workload}: {quantity(agg['rate_ops_per_second'], 'ops/s')}"
            + (
                f" ({quantity(agg['bandwidth_gib_per_second'], 'GiB/s', keep_unit=True)})"
                if agg["bandwidth_gib_per_second"]
                else ""
            )
            + f", p50 {quantity(lat['p50'], 'usec')}, "
            f"p99 {quantity(lat['p99'], 'usec')}, server CPU {quantity(agg['server_cpu_usec_per_op'], 'usec/op')}; "
            f"results in {output}"
        )
        if agg["servers_serving"] < len(results["servers"]):
            click.echo(f"{agg['servers_serving']} of {len(results['servers'])} servers served (client i calls server "
                       "i mod S: the others had no client); rates per server are over those that served")  # fmt: skip
        modes = results["progress_modes"]
        servers_modes = ", ".join(sorted(set(map(str, modes["servers"].values()))))
        click.echo(f"progress: clients {modes['client']}, servers {servers_modes}")
        if "rpc" in results:
            print_lines(_rpc_line(results["rpc"]))
        for address, findings in results.get("diagnosis", {}).items():
            click.echo(f"diagnosis of {address}:\n{format_diagnosis(findings)}")
    else:
        echo_json(results)


def _rpc_values(values: dict[str, Any], rpc_arg: str | None, options: tuple[str, ...], *, workload_given: bool) -> None:
    """Fill the rpc workload's parameters from --rpc, --arg, --arg-option (--rpc makes it the rpc workload unless
    --workload says otherwise); check --arg-generator imports here, before any client starts (a user error is one
    line)."""
    from ..rpc_workload import load_generator

    if values.get("rpc") is not None and not workload_given:
        values["workload"] = "rpc"
    if rpc_arg is not None:
        values["rpc_arg"] = json_argument(rpc_arg, "--arg")
    if options:
        parsed: dict[str, Any] = dict(values.get("rpc_arg_options") or {})
        for option in options:
            key, sep, text = option.partition("=")
            if not sep or not key:
                fail(f"--arg-option {option!r}: expected KEY=VALUE, e.g. value_bytes=1024")
            try:
                parsed[key] = json.loads(text)
            except ValueError:
                parsed[key] = text
        values["rpc_arg_options"] = parsed
    if values.get("rpc_arg_generator"):
        try:
            load_generator(values["rpc_arg_generator"])
        except ValueError as exc:
            fail(str(exc))


def _rpc_line(rpc: dict[str, Any]) -> str:
    """``store:put (kv put, provider 1): 1.03 KiB/call = request 1.03 KiB + response 1 B + bulk 0 B``."""
    return (
        f"{rpc['requested']} ({rpc['type']} {rpc['name']}, provider {rpc['provider_id']}): "
        f"{quantity(rpc['bytes_per_call'], 'B')}/call = request {quantity(rpc['request_bytes_per_call'], 'B')} + "
        f"response {quantity(rpc['response_bytes_per_call'], 'B')} + bulk {quantity(rpc['bulk_bytes_per_call'], 'B')}"
    )


def _selftest_attach(targets: list[tuple[str, int]], provider_id: int | None) -> Any:
    from svcframe.engine import Engine
    from svcframe.loops import run

    from ..attach import attach

    async def go() -> Any:
        async with Engine(None, secret=read_secret()) as engine:
            return await attach(engine, targets, provider_id)

    attachment = run(go())
    if attachment.added:
        click.echo(
            f"svcframe: added a self-test provider (id {attachment.provider_id}) to "
            f"{', '.join(attachment.added_addresses)}", err=True,
        )  # fmt: skip
    return attachment


def _selftest_detach(attachment: Any, keep: bool) -> None:
    from svcframe.engine import Engine
    from svcframe.loops import run

    from ..attach import detach

    if not attachment.added:
        return
    if keep:
        click.echo(f"svcframe: kept the self-test provider (id {attachment.provider_id})", err=True)
        return

    async def go() -> list[str]:
        async with Engine(None, secret=read_secret()) as engine:
            return await detach(engine, attachment)

    for problem in run(go()):
        click.echo(f"svcframe: warning: {problem}", err=True)


@selftest.command("bursts")
@group_option
@click.option("--rank", type=int, default=0, show_default=True, help="Which member of the group to measure.")
@click.option("--target", "-t", default=None, help="Server address (instead of a member of the group).")
@click.option("--bursts", type=int, default=3, show_default=True)
@click.option("--burst-seconds", type=float, default=10.0, show_default=True)
@click.option("--gap-seconds", type=float, default=20.0, show_default=True)
@click.option("--interval-seconds", type=float, default=1.0, show_default=True)
@click.option("--modes", default=",".join(PROGRESS_MODES), show_default=True)
@click.option("--spindown-msec", type=float, default=10.0, show_default=True)
@click.option("--provider-id", type=int, default=1, show_default=True)
@click.option("--client-core", type=int, default=None, help="Pin the client to this core.")
@click.option(
    "--output",
    "-o",
    "out",
    callback=output_path,
    type=click.Path(file_okay=False),
    default="out/bursts",
    show_default=True,
)
@json_option
def selftest_bursts(
    group: str | None, rank: int, target: str | None, out: str, modes: str, as_json: bool, **kw: Any
) -> None:
    """Sequential noop bursts separated by idle gaps, once per progress mode (the paper's Figure 6).

    Progress goes to stderr (a bar on a terminal, a line per mode in a pipe); --json prints the results
    document (the bursts.json written under -o)."""
    from svcframe.loops import run

    from ..bursts import BurstParams, plot_bursts, run_bursts

    if target is not None and group is not None:
        fail("give --target ADDRESS or -g/--group FILE, not both", 2)
    server = target or group_members(group, [rank])[0].address
    try:
        params = BurstParams(modes=modes.split(","), **kw)
        each = (
            f"{params.bursts} bursts of {quantity(params.burst_seconds, 's')}, {quantity(params.gap_seconds, 's')} gaps"
        )
        with StepProgress("selftest bursts", len(params.modes)) as progress:
            results = run(run_bursts(params, server, lambda mode, done, total: progress.step(f"{mode}: {each}", done)))
            progress.finish()
    except (SvcframeError, ValueError) as exc:
        fail(str(exc))
    dest = Path(out)
    write_output(dest / "bursts.json", json.dumps(results, indent=2), "the bursts' results")
    try:
        png = plot_bursts(results, dest / "bursts.png")
    except PlottingUnavailable as exc:
        fail(f"{exc}: {dest / 'bursts.json'}")
    except OSError as exc:
        fail(f"cannot write {dest / 'bursts.png'} ({exc.strerror or exc}); the results are in {dest / 'bursts.json'}")
    if as_json:
        echo_json(results)
        return
    rows = []
    for mode in results["modes"]:
        s = mode["summary"]
        rows.append((mode["mode"], quantity(s["burst_rate_ops_per_second"], "calls/s"),
                     f"{100 * (s['idle_server_cpu_utilization'] or 0):.1f}%",
                     f"{100 * (s['burst_server_cpu_utilization'] or 0):.1f}%",
                     quantity(s["idle_package_watts"], "W")))  # fmt: skip
    console = output_console()
    print_table(("mode", "rate in bursts", "server CPU idle", "busy", "idle power"), rows,
                numeric=("rate in bursts", "server CPU idle", "busy", "idle power"), console=console,
                title=f"noop bursts against {server}: {each}, one run per progress mode")  # fmt: skip
    print_lines(f"plot: {png}", f"results: {dest / 'bursts.json'}", console=console)


@selftest.command("nic-dispersion")
@click.option("--from", "from_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A described topology instead of this host's (with --loopback-aliases to rehearse it here).")  # fmt: skip
@click.option("--loopback-aliases", is_flag=True, help="Stand NIC k in by 127.0.0.(k+2).")
@click.option("--clients", "-c", type=int, default=16, show_default=True)
@click.option("--scenario", "scenarios", multiple=True, type=click.Choice(SCENARIOS),
              help="Client-binding scenario (repeatable; default: all three).")  # fmt: skip
@click.option("--nic-policy", "nic_policies", multiple=True, type=click.Choice(NIC_POLICIES),
              help=f"NIC policy to compare (repeatable; default: {' and '.join(COMPARED_NIC_POLICIES)}).")  # fmt: skip
@click.option("--bucket-policy", type=click.Choice([b for b, forms in BUCKET_POLICIES.items() if forms is not None]),
              default="all", show_default=True)  # fmt: skip
@click.option("--interfaces", multiple=True, help="Interface-name pattern (repeatable).")
@click.option("--bulk-size", type=int, default=4 * 1024 * 1024, show_default=True)
@click.option("--duration-seconds", type=float, default=2.0, show_default=True)
@click.option("--server", "server_map", multiple=True, metavar="NIC=ADDRESS",
              help="Use a running server for NIC instead of launching one (repeatable).")  # fmt: skip
@click.option("--output", "-o", "out", callback=output_path, type=click.Path(file_okay=False),
              default="out/nic-dispersion", show_default=True)  # fmt: skip
@json_option
def selftest_nic_dispersion(
    from_file: str | None, loopback_aliases: bool, clients: int, scenarios: tuple[str, ...],
    nic_policies: tuple[str, ...], bucket_policy: str, interfaces: tuple[str, ...], bulk_size: int,
    duration_seconds: float, server_map: tuple[str, ...], out: str, as_json: bool,
) -> None:  # fmt: skip
    """Servers one per NIC, clients under three CPU-binding scenarios and two NIC policies: aggregate
    bandwidth per scenario and a bar chart (the paper's Figure 2).

    Progress goes to stderr (a bar on a terminal, a line per run in a pipe); --json prints the results
    document (the nic-dispersion.json written under -o)."""
    from svcframe.topology import discover, load_topology

    from ..nic_dispersion import DispersionOptions, plot_dispersion, run_dispersion

    opts = DispersionOptions(
        out=Path(out), clients=clients, scenarios=list(scenarios) or list(SCENARIOS),
        nic_policies=list(nic_policies or COMPARED_NIC_POLICIES), bucket_policy=bucket_policy,
        bulk_size=bulk_size, duration_seconds=duration_seconds, interfaces=list(interfaces) or None,
        loopback_aliases=loopback_aliases,
        servers=dict(item.split("=", 1) for item in server_map if "=" in item) if server_map else None,
    )  # fmt: skip
    if any("=" not in item for item in server_map):
        fail("--server takes NIC=ADDRESS, e.g. --server nic0=tcp://10.99.1.1:40000")
    try:
        topo = load_topology(from_file) if from_file else discover()
        with StepProgress("selftest nic-dispersion", len(opts.scenarios) * len(opts.nic_policies)) as progress:
            doc = run_dispersion(topo, opts, on_step=lambda what, done, total: progress.step(what, done))
            progress.finish()
    except SvcframeError as exc:
        fail(str(exc))
    js = write_output(Path(opts.out) / "nic-dispersion.json", json.dumps(doc, indent=2, default=str), "the results")
    try:
        png = plot_dispersion(doc, Path(opts.out) / "nic-dispersion.png")
    except PlottingUnavailable as exc:
        fail(f"{exc}: {js}")
    except OSError as exc:
        fail(f"cannot write {Path(opts.out) / 'nic-dispersion.png'} ({exc.strerror or exc}); the results are in {js}")
    if as_json:
        echo_json(doc)
        return
    console = output_console()
    print_lines(*(f"note: {note}" for note in doc["notes"]), console=console)
    names = [n["name"] for n in doc["nics"]]
    rows = [(r["scenario"], r["nic_policy"], quantity(r["bandwidth_gib_per_second"], "GiB/s", keep_unit=True),
             " ".join(str(r["clients_per_nic"][n]) for n in names)) for r in doc["runs"]]  # fmt: skip
    print_table(("scenario", "nic_policy", "bandwidth", "clients per NIC"), rows, numeric=("bandwidth",),
                title=f"aggregate bandwidth of {clients} clients, {quantity(bulk_size, 'B')} bulk pulls; clients "
                f"per NIC in the order {', '.join(names)}", console=console)  # fmt: skip
    print_lines(f"plot: {png}", f"results: {js}", console=console)


@selftest.command("config")
def selftest_config() -> None:
    """Print the path of the shipped self-test server config.

    One server on loopback TCP hosting the self-test provider (provider id 1), e.g.
    svcframe launch "$(svcframe selftest config)" --procs 2 --group-file group.json"""
    click.echo(SELFTEST_CONFIG)
