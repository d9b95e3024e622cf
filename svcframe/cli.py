"""The ``svcframe`` command line (click). Every command prints JSON or a rich table; errors exit non-zero
with the reason on stderr.

    svcframe serve CONFIG                         one server process in the foreground
    svcframe launch CONFIG --procs N [--group-file F] [--pin]
    svcframe status|shutdown (ADDRESS | --group F)
    svcframe config check FILE | schema | get (ADDRESS | --group F) | query ... EXPR | patch ... PATCH
    svcframe provider add ... DESCRIPTION | remove ... NAME | list ... [--rpcs] | lookup ... SPEC
    svcframe library load ... MODULE
    svcframe call ADDRESS RPC [ARG_JSON] --provider-id N
    svcframe selftest run (--group F | --target ADDRESS ...) [--clients C] [--workload noop|bulk] ...
    svcframe roofline collect [-o DIR] [--duration-seconds S] [--repeats R] [--paper]
                              [--nodes local:K | --hostfile F] [--launcher auto|local|mpiexec|srun]
    svcframe roofline plot MODEL.json [-o DIR]
    svcframe history [--store DB] | history show RUN [-o PNG]     runs in the results store; "is that normal?"
    svcframe report RUN [-o FILE.html]                            one self-contained HTML page of a run
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

# The self-test's registries (the move of its commands into selftest comes next)
from selftest.bench import WORKLOADS as BENCH_WORKLOADS
from selftest.collect import ALL_METRICS
from selftest.driver import WORKLOADS
from selftest.nic_dispersion import SCENARIOS
from selftest.nodes import LAUNCHERS
from selftest.provider import DIRECTIONS, STORAGE_OPS

from .config import ADMIN_PROVIDER_ID, config_schema, load_config
from .errors import ConfigError, SvcframeError
from .loops import EVENT_LOOPS
from .plumber import BUCKET_POLICIES, NIC_POLICIES
from .progress import PROGRESS_MODES
from .topology import BACKENDS
from .wire import check_secret


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"svcframe: error: {message}", err=True)
    sys.exit(code)


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def _read_secret(secret_file: str | None) -> bytes | None:
    if secret_file is not None:
        from .server import read_secret_file

        try:
            return read_secret_file(secret_file)
        except ConfigError as exc:
            _fail(str(exc), 2)
    env = os.environ.get("SVCFRAME_SECRET")
    if env is None:
        return None
    try:
        return check_secret(env.encode(), "the SVCFRAME_SECRET variable")
    except ConfigError as exc:
        _fail(str(exc), 2)


def _targets(addresses: tuple[str, ...], group: str | None) -> list[tuple[str, int]]:
    from .group import read_group_file

    out = [(a, ADMIN_PROVIDER_ID) for a in addresses]
    if group:
        try:
            out += [(m.address, m.provider_id) for m in read_group_file(group).members]
        except SvcframeError as exc:
            _fail(str(exc), 2)
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
@click.version_option(package_name="svcframe", message="svcframe %(version)s")
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
@click.option("--group-file", "-g", type=click.Path(dir_okay=False), default=None,
              help="Under srun/mpiexec: rank 0 writes this group file once every rank is ready.")  # fmt: skip
@click.option("--group-timeout-seconds", type=float, default=120.0, show_default=True,
              help="How long rank 0 waits for the other ranks.")  # fmt: skip
@click.option("--lifeline-fd", type=int, default=None,
              help="Shut down when this pipe's write end closes (the launcher exited).")  # fmt: skip
def serve(
    config: str, ready_fd: int | None, secret_file: str | None, address: str | None, group_file: str | None,
    group_timeout_seconds: float, lifeline_fd: int | None,
) -> None:  # fmt: skip
    """Run one server from a JSON bootstrap CONFIG until SIGTERM / Ctrl-C / admin shutdown.

    Under a launcher (srun, mpiexec) each process learns its rank from the environment (or mpi4py); with
    --group-file the group is published when all ranks accept calls (svcframe/ranks.py).

    Libraries are imported as ``python -m`` would: the current directory first (issue 15)."""
    from .server import run_server

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())

    try:
        cfg = load_config(config)
        if address:
            cfg.engine.address = address
    except SvcframeError as exc:
        if ready_fd is not None:
            os.write(ready_fd, (json.dumps({"ok": False, "error": str(exc)}) + "\n").encode())
        _fail(str(exc))
        return
    on_ready = None
    if group_file is not None:
        from . import ranks

        try:
            info = ranks.detect()
        except SvcframeError as exc:
            _fail(str(exc))
            return
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

    sys.exit(run_server(cfg, ready_fd=ready_fd, secret=_read_secret(secret_file), on_ready=on_ready,
                        lifeline_fd=lifeline_fd))  # fmt: skip


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
        _fail(f"server(s) exited with non-zero codes: {bad}; their logs are kept in {job.workdir}")
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
    _echo_json(_run_admin(_targets(address, group), "shutdown"))


def _call_argument(text: str) -> Any:
    """ARG of ``svcframe call``: JSON, ``@FILE`` (the file's bytes) or ``base64:DATA`` (bytes)."""
    if text.startswith("@"):
        try:
            return Path(text[1:]).read_bytes()
        except OSError as exc:
            _fail(f"ARG {text}: cannot read {text[1:]}: {exc.strerror}", 2)
    if text.startswith("base64:"):
        import base64
        import binascii

        try:
            return base64.b64decode(text[7:], validate=True)
        except binascii.Error as exc:
            _fail(f"ARG {text[:40]}: not base64 ({exc})", 2)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(
            f"ARG {text[:40]!r} is not JSON ({exc.msg} at column {exc.colno}); quote strings as '\"text\"', "
            "pass bytes as @FILE or base64:DATA",
            2,
        )


@main.command()
@click.argument("words", nargs=-1, required=True, metavar="[ADDRESS] RPC_NAME [ARG]")
@click.option("--group", "-g", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Call the member of this group file given by --rank instead of ADDRESS.")  # fmt: skip
@click.option("--rank", type=int, default=0, show_default=True, help="Which member of --group.")
@click.option("--bytes", "byte_fields", multiple=True, metavar="FIELD=@FILE|base64:DATA",
              help="Set FIELD of the JSON object ARG to bytes (repeatable), e.g. --bytes value=@blob.bin.")  # fmt: skip
@click.option("--provider-id", "-p", type=int, default=0, show_default=True)
@click.option("--timeout-seconds", type=float, default=10.0, show_default=True)
def call(
    words: tuple[str, ...], group: str | None, rank: int, byte_fields: tuple[str, ...], provider_id: int,
    timeout_seconds: float,
) -> None:  # fmt: skip
    """Call RPC_NAME of a provider and print the result as JSON (bytes as text).

    ARG is JSON (default null), @FILE (the file's bytes) or base64:DATA (bytes). With --bytes, ARG is a JSON
    object some of whose fields are bytes: svcframe call ADDR put '{"key": "k"}' --bytes value=@v.bin -p 1
    """
    from .engine import Engine
    from .loops import run

    if group is None:
        if len(words) not in (2, 3):
            _fail("usage: svcframe call ADDRESS RPC_NAME [ARG], or svcframe call -g GROUP RPC_NAME [ARG]", 2)
        address, rpc_name, *rest = words
    else:
        if len(words) not in (1, 2):
            _fail("with --group, give RPC_NAME [ARG] (no ADDRESS)", 2)
        members = _targets((), group)
        if not 0 <= rank < len(members):
            _fail(f"--rank {rank}: {group} has ranks 0..{len(members) - 1}", 2)
        address = members[rank][0]
        rpc_name, *rest = words
    arg = _call_argument(rest[0] if rest else ("{}" if byte_fields else "null"))
    for spec in byte_fields:
        name, sep, source = spec.partition("=")
        if not sep or not (source.startswith("@") or source.startswith("base64:")):
            _fail(f"--bytes {spec}: expected FIELD=@FILE or FIELD=base64:DATA", 2)
        if not isinstance(arg, dict):
            _fail("--bytes needs ARG to be a JSON object", 2)
        arg[name] = _call_argument(source)

    async def go() -> Any:
        async with Engine(None, secret=_read_secret(None)) as engine:
            return await engine.call(address, rpc_name, arg, provider_id=provider_id, timeout_seconds=timeout_seconds)

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
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Write it to this file (the repository keeps it in configs/schema.json).")  # fmt: skip
def config_schema_cmd(output: str | None) -> None:
    """Print the JSON Schema of the bootstrap config (generated from the pydantic models)."""
    if output:
        Path(output).write_text(json.dumps(config_schema(), indent=2) + "\n")
        click.echo(f"schema written to {output}", err=True)
    else:
        _echo_json(config_schema())


@config.command("get")
@_target_options
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Write the one server's configuration to this file, ready for `svcframe serve`.")  # fmt: skip
def config_get(address: tuple[str, ...], group: str | None, output: str | None) -> None:
    """Print the live configuration of each server, keyed by address (re-launchable: defaults filled in,
    every change since start, the configured listen address; the bound one is in `svcframe status`)."""
    targets = _targets(address, group)
    if output and len(targets) != 1:
        _fail(f"--output takes the configuration of one server; {len(targets)} were given")
    configs = _run_admin(targets, "get_config")
    if output:
        Path(output).write_text(json.dumps(next(iter(configs.values())), indent=2) + "\n")
        click.echo(f"configuration of {targets[0][0]} written to {output}", err=True)
    else:
        _echo_json(configs)


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


def _json_argument(text: str, what: str) -> Any:
    """JSON text, or ``@FILE`` for the contents of FILE."""
    try:
        return json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except (OSError, ValueError) as exc:
        _fail(f"cannot read {what} ({text[:60]!r}): {exc}")
        return None


# -- providers and libraries ------------------------------------------------------------------------------------
@main.group()
def provider() -> None:
    """Add, remove, list and look up providers of running servers (through their admin provider)."""


@provider.command("add")
@click.argument("args", nargs=-1, required=True)
@click.option("--group", "-g", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--timeout-seconds", type=float, default=60.0, show_default=True,
              help="Deadline of the call; bounds the wait for remote dependencies too.")  # fmt: skip
def provider_add(args: tuple[str, ...], group: str | None, timeout_seconds: float) -> None:
    """Start a provider from a description (the last argument: JSON text or @FILE, a providers[] entry);
    print the provider id each server assigned.

    Example: svcframe provider add ADDRESS '{"name": "cache", "type": "kv", "config": {"path": ":memory:"}}'
    """
    *addresses, text = args
    description = _json_argument(text, "the provider description")
    if not isinstance(description, dict):
        _fail("the provider description must be a JSON object (a providers[] entry)")
    _echo_json(_run_admin(_targets(tuple(addresses), group), "add_provider", description, timeout=timeout_seconds))


@provider.command("remove")
@click.argument("args", nargs=-1, required=True)
@click.option("--group", "-g", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--timeout-seconds", type=float, default=60.0, show_default=True)
def provider_remove(args: tuple[str, ...], group: str | None, timeout_seconds: float) -> None:
    """Remove the provider named by the last argument: new calls are refused at once, in-flight calls
    complete, then its resources are released. Refused while other providers depend on it."""
    *addresses, name = args
    _echo_json(_run_admin(_targets(tuple(addresses), group), "remove_provider", name, timeout=timeout_seconds))


@provider.command("list")
@_target_options
@click.option("--rpcs", is_flag=True, help="Include each provider's registered RPCs.")
def provider_list(address: tuple[str, ...], group: str | None, rpcs: bool) -> None:
    """Print each server's providers (name, type, provider id), keyed by address."""
    targets = _targets(address, group)
    statuses = _run_admin(targets, "status")
    out = {a: s["providers"] for a, s in statuses.items()}
    if rpcs:
        tables = _run_admin(targets, "list_rpcs")
        for a, providers in out.items():
            admin_id = dict(targets).get(a, ADMIN_PROVIDER_ID)
            providers.insert(0, {"name": "admin", "type": "admin", "provider_id": admin_id})
            for p in providers:
                p["rpcs"] = [r["name"] for r in tables[a] if r["provider_id"] == p["provider_id"]]
    _echo_json(out)


@provider.command("lookup")
@click.argument("args", nargs=-1, required=True)
@click.option("--group", "-g", type=click.Path(exists=True, dir_okay=False), default=None)
def provider_lookup(args: tuple[str, ...], group: str | None) -> None:
    """Look up NAME or TYPE:ID (the last argument) on each server: {name, type, provider_id} or null."""
    *addresses, spec = args
    _echo_json(_run_admin(_targets(tuple(addresses), group), "lookup_provider", spec))


@main.group()
def library() -> None:
    """Load provider libraries into running servers."""


@library.command("load")
@click.argument("args", nargs=-1, required=True)
@click.option("--group", "-g", type=click.Path(exists=True, dir_okay=False), default=None)
def library_load(args: tuple[str, ...], group: str | None) -> None:
    """Import the Python module named by the last argument (e.g. providers.kv) on each server; print the
    provider types it defines. It is added to the live config's libraries."""
    *addresses, module = args
    _echo_json(_run_admin(_targets(tuple(addresses), group), "load_library", module))


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
@click.option("--client-cores", default=None, help="Comma-separated cores to pin clients to.")
@click.option("--event-loop", type=click.Choice(EVENT_LOOPS), default=None)
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="Write the results JSON here.")
@click.option("--keep-provider", is_flag=True,
              help="Keep a self-test provider this command added (default: remove it after the run).")  # fmt: skip
def selftest_run(
    group: str | None, target: tuple[str, ...], params_file: str | None, output: str | None, keep_provider: bool,
    **flags: Any,
) -> None:  # fmt: skip
    """Run one self-test; print the results JSON (or a summary when -o is given).

    Servers without a self-test provider get one through their admin provider (library selftest.provider,
    type selftest) for the run; it is removed afterwards unless --keep-provider.
    """
    from pydantic import ValidationError

    from selftest.driver import SelftestParams, run_selftest, save_results

    from .config import format_validation_error
    from .group import read_group_file

    values: dict[str, Any] = json.loads(Path(params_file).read_text()) if params_file else {}
    for key, value in flags.items():
        if value is not None:
            values[key] = [int(c) for c in value.split(",")] if key == "client_cores" else value
    try:
        params = SelftestParams.model_validate(values)
    except ValidationError as exc:
        _fail(format_validation_error(exc, "selftest parameters"))
        return
    targets = [(a, ADMIN_PROVIDER_ID) for a in target]
    targets += [(m.address, m.provider_id) for m in read_group_file(group).members] if group else []
    if not targets:
        _fail("give --group FILE or --target ADDRESS")
    servers = [a for a, _ in targets]
    try:
        attachment = _selftest_attach(targets, params.provider_id if "provider_id" in values else None)
    except SvcframeError as exc:
        _fail(str(exc))
        return
    params = params.model_copy(update={"provider_id": attachment.provider_id})
    try:
        results = run_selftest(params, servers, admin_provider_id=targets[0][1])
    except SvcframeError as exc:
        _fail(str(exc))
        return
    finally:
        _selftest_detach(attachment, keep_provider)
    if output:
        save_results(results, output)
        agg = results["aggregate"]
        lat = agg["latency_usec"]
        click.echo(
            f"{params.workload}: {agg['rate_ops_per_second']:.0f} ops/s "
            f"({agg['bandwidth_gib_per_second']:.3f} GiB/s), p50 {lat['p50']:.1f} us, p99 {lat['p99']:.1f} us, "
            f"server CPU {agg['server_cpu_usec_per_op']:.1f} us/op; results in {output}"
        )
        from .diagnosis import format_diagnosis

        for address, findings in results.get("diagnosis", {}).items():
            click.echo(f"diagnosis of {address}:\n{format_diagnosis(findings)}")
    else:
        _echo_json(results)


def _selftest_attach(targets: list[tuple[str, int]], provider_id: int | None) -> Any:
    from selftest.attach import attach

    from .engine import Engine
    from .loops import run

    async def go() -> Any:
        async with Engine(None, secret=_read_secret(None)) as engine:
            return await attach(engine, targets, provider_id)

    attachment = run(go())
    if attachment.added:
        click.echo(
            f"svcframe: added a self-test provider (id {attachment.provider_id}) to "
            f"{', '.join(attachment.added_addresses)}", err=True,
        )  # fmt: skip
    return attachment


def _selftest_detach(attachment: Any, keep: bool) -> None:
    from selftest.attach import detach

    from .engine import Engine
    from .loops import run

    if not attachment.added:
        return
    if keep:
        click.echo(f"svcframe: kept the self-test provider (id {attachment.provider_id})", err=True)
        return

    async def go() -> list[str]:
        async with Engine(None, secret=_read_secret(None)) as engine:
            return await detach(engine, attachment)

    for problem in run(go()):
        click.echo(f"svcframe: warning: {problem}", err=True)


@selftest.command("bursts")
@click.option("--group", "-g", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--target", "-t", default=None, help="Server address (default: rank 0 of --group).")
@click.option("--bursts", type=int, default=3, show_default=True)
@click.option("--burst-seconds", type=float, default=10.0, show_default=True)
@click.option("--gap-seconds", type=float, default=20.0, show_default=True)
@click.option("--interval-seconds", type=float, default=1.0, show_default=True)
@click.option("--modes", default=",".join(PROGRESS_MODES), show_default=True)
@click.option("--spindown-msec", type=float, default=10.0, show_default=True)
@click.option("--provider-id", type=int, default=1, show_default=True)
@click.option("--client-core", type=int, default=None, help="Pin the client to this core.")
@click.option("--output", "-o", "out", type=click.Path(file_okay=False), default="out/bursts", show_default=True)
def selftest_bursts(group: str | None, target: str | None, out: str, modes: str, **kw: Any) -> None:
    """Sequential noop bursts separated by idle gaps, once per progress mode (the paper's Figure 6)."""
    from selftest.bursts import BurstParams, plot_bursts, run_bursts

    from .group import read_group_file
    from .loops import run

    server = target or (read_group_file(group).members[0].address if group else None)
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


def _store_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--store", "store_path", type=click.Path(dir_okay=False), default=None,
        help="Results store (SQLite). Default: $SVCFRAME_RESULTS or ~/.local/share/svcframe/results.sqlite.",
    )(fn)  # fmt: skip


def _open_store(store_path: str | None, *, must_exist: bool = True) -> Any:
    from selftest.store import ResultsStore, default_store_path

    path = Path(store_path) if store_path else default_store_path()
    if must_exist and not path.exists():
        _fail(f"no results store at {path}: run `svcframe roofline collect` first, or give --store PATH")
    return ResultsStore(path)


@roofline.command("collect")
@click.option("--output", "-o", "out", type=click.Path(file_okay=False), default="out/roofline", show_default=True)
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Server config hosting the self-test provider (default: configs/selftest.json).")  # fmt: skip
@click.option("--duration-seconds", type=float, default=2.0, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True, help="Samples of Pc and Ps.")
@click.option("--paper", is_flag=True, help="The paper's settings: 5-second measurements, five samples.")
@click.option("--metric", "metrics", multiple=True,
              type=click.Choice(ALL_METRICS),
              help="Metric to measure (repeatable; default all four).")  # fmt: skip
@click.option("--bulk-size", type=int, default=1024 * 1024, show_default=True)
@click.option("--grid-servers", default="1,2", show_default=True)
@click.option("--grid-clients", default="1,2,4,8", show_default=True)
@click.option("--sweep-max-servers", type=int, default=None,
              help="Server-process sweep 1..N (default: the server cores; 0 = no sweep).")  # fmt: skip
@click.option("--storage-dir", type=click.Path(file_okay=False), default=None,
              help="Directory of the servers' storage files (default: the system temporary directory).")  # fmt: skip
@click.option("--storage-block-size", type=int, default=4096, show_default=True, help="Bytes per op, storage_iops.")
@click.option("--storage-bandwidth-block-size", type=int, default=1024 * 1024, show_default=True,
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
@click.option("--grid-server-nodes", default=None,
              help="Validation grid in fully populated nodes, e.g. 1,2 (with --grid-client-nodes).")  # fmt: skip
@click.option("--grid-client-nodes", default=None, help="Validation grid client nodes, e.g. 1,2,3.")
@click.option("--coordinator-host", default=None,
              help="Host this process's engine binds to for remote client processes (default: the host name).")  # fmt: skip
@_store_option
@click.option("--no-store", is_flag=True, help="Do not record the run in the results store.")
@click.option("--resume", default=None, help="Continue an interrupted run (id, 'latest' or -N) from the store.")
def roofline_collect(
    out: str, config_file: str | None, duration_seconds: float, repeats: int, paper: bool, metrics: tuple[str, ...],
    bulk_size: int, grid_servers: str, grid_clients: str, sweep_max_servers: int | None, storage_dir: str | None,
    storage_block_size: int, storage_bandwidth_block_size: int, storage_op: str, storage_fsync: bool,
    service: str | None, platform_name: str | None, weights: tuple[str, ...], nodes_spec: str | None,
    hostfile: str | None, launcher: str, grid_server_nodes: str | None, grid_client_nodes: str | None,
    coordinator_host: str | None, store_path: str | None, no_store: bool, resume: str | None,
) -> None:  # fmt: skip
    """Run the whole suite over a node set: launch, Pc over every pair of nodes, Ps, server sweep, validation
    grid, teardown; write plots + JSON and record the run in the results store. Ctrl-C stops cleanly;
    --resume continues. On a cluster: inside salloc/sbatch (--launcher srun) or with --hostfile (mpiexec)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from selftest.collect import DEFAULT_CONFIG, CollectOptions, collect, plan
    from selftest.report import print_collect_summary
    from selftest.store import default_store_path

    store_file = None if no_store else (Path(store_path) if store_path else default_store_path())
    resume_id = None
    if resume is not None:
        if store_file is None:
            _fail("--resume needs the results store (drop --no-store)")
        try:
            with _open_store(str(store_file)) as st:
                resume_id = st.resolve(resume)
                run = st.run(resume_id, with_samples=False)
        except SvcframeError as exc:
            _fail(str(exc))
            return
        if run["status"] == "complete":
            _fail(f"run {resume_id} is already complete")
        opts = CollectOptions.from_dict(run["options"])
        opts.store = store_file
    else:
        if paper:
            duration_seconds, repeats = 5.0, 5
        try:
            weight_map = {k: float(v) for k, v in (w.split("=", 1) for w in weights)}
        except ValueError:
            _fail(f"--weight takes METRIC=NUMBER, got {weights}")
            return
        opts = CollectOptions(
            out=Path(out), config=Path(config_file) if config_file else DEFAULT_CONFIG,
            metrics=list(metrics) or list(ALL_METRICS), duration_seconds=duration_seconds, repeats=repeats,
            bulk_size=bulk_size, grid_servers=[int(x) for x in grid_servers.split(",")],
            grid_clients=[int(x) for x in grid_clients.split(",")], sweep_max_servers=sweep_max_servers,
            storage_dir=Path(storage_dir) if storage_dir else None, storage_block_size=storage_block_size,
            storage_bandwidth_block_size=storage_bandwidth_block_size, storage_op=storage_op,
            storage_fsync=storage_fsync, store=store_file, service=service, platform=platform_name,
            weights=weight_map or None, nodes=nodes_spec, hostfile=Path(hostfile) if hostfile else None,
            launcher=launcher, coordinator_host=coordinator_host,
            grid_server_nodes=[int(x) for x in grid_server_nodes.split(",")] if grid_server_nodes else None,
            grid_client_nodes=[int(x) for x in grid_client_nodes.split(",")] if grid_client_nodes else None,
        )  # fmt: skip
    try:
        total = len(plan(opts))
    except (ValueError, SvcframeError) as exc:
        _fail(str(exc))
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # tear down as for Ctrl-C

    old_term = signal.signal(signal.SIGTERM, on_sigterm)
    columns = (TextColumn("[bold]{task.fields[stage]}[/bold] {task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn())  # fmt: skip
    try:
        with Progress(*columns, transient=False) as bar:
            task = bar.add_task("launching servers and clients", total=total, stage="start")

            def on_step(description: str, index: int, todo: int) -> None:
                stage, _, rest = description.partition(" ")
                bar.update(task, description=rest, stage=stage, completed=total - todo + index - 1)

            doc = collect(opts, on_step, resume=resume_id)
            bar.update(task, completed=total, description="done", stage="")
    except KeyboardInterrupt:
        hint = ""
        if store_file is not None and store_file.exists():
            with _open_store(str(store_file)) as st:
                runs = st.runs()
            rid = resume_id if resume_id is not None else (runs[-1]["id"] if runs else None)
            if rid is not None:
                hint = f"; resume with: svcframe roofline collect --resume {rid} --store {store_file}"
        click.echo(f"svcframe: interrupted, servers and clients stopped{hint}", err=True)
        sys.exit(130)
    except SvcframeError as exc:
        _fail(str(exc))
        return
    finally:
        signal.signal(signal.SIGTERM, old_term)
    print_collect_summary(doc, Path(opts.out))


@roofline.command("plot")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--output", "-o", "out", type=click.Path(file_okay=False), default=None)
def roofline_plot(model: str, out: str | None) -> None:
    """Redraw the plots of a roofline.json (no service needed)."""
    from selftest.roofline import Roofline, plot

    try:
        doc = json.loads(Path(model).read_text())
    except (OSError, ValueError) as exc:
        _fail(f"{model}: cannot read a roofline model: {exc}", 2)
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
        kind = doc.get("kind") if isinstance(doc, dict) else None
        _fail(f"{model} is not a roofline model (the roofline.json of `svcframe roofline collect`)"
              + (f"; it is a {kind} document" if kind else ""), 2)  # fmt: skip
    dest = Path(out) if out else Path(model).parent
    dest.mkdir(parents=True, exist_ok=True)
    for name, m in doc["metrics"].items():
        click.echo(plot(Roofline.from_dict(m), dest / f"{name}.png"))


# -- results store: history and reports ---------------------------------------------------------------------------
@main.group(invoke_without_command=True)
@_store_option
@click.option("--service", default=None, help="Only runs of this service.")
@click.option("--platform", "platform_name", default=None, help="Only runs on this platform.")
@click.pass_context
def history(ctx: click.Context, store_path: str | None, service: str | None, platform_name: str | None) -> None:
    """List the runs of the results store (or `history show RUN`: a run against its history)."""
    ctx.ensure_object(dict)
    ctx.obj["store_path"] = store_path
    if ctx.invoked_subcommand is not None:
        return
    from selftest.report import print_history

    with _open_store(store_path) as st:
        print_history(st.runs(service=service, platform=platform_name), st.path)


@history.command("show")
@click.argument("run_ref", metavar="RUN", default="latest")
@_store_option
@click.option("--output", "-o", "out", type=click.Path(dir_okay=False), default=None,
              help="Box-plot PNG (default: out/history/run-ID.png).")  # fmt: skip
@click.pass_context
def history_show(ctx: click.Context, run_ref: str, store_path: str | None, out: str | None) -> None:
    """Is that normal? RUN's Pc, Ps, scores and overhead against the earlier runs of the same service and
    platform: a table, and box plots of the history with RUN as a marker (UMAMI)."""
    from selftest.report import print_comparison
    from selftest.store import compare, plot_history

    try:
        with _open_store(store_path or ctx.obj.get("store_path")) as st:
            run = st.run(run_ref, with_samples=False)
            hist = [h for h in st.history(run["id"]) if h["id"] != run["id"] and h["created"] <= run["created"]]
        rows = compare(run, hist)
        dest = Path(out) if out else Path("out/history") / f"run-{run['id']}.png"
        dest.parent.mkdir(parents=True, exist_ok=True)
        png = plot_history(run, hist, dest)
    except SvcframeError as exc:
        _fail(str(exc))
        return
    print_comparison(run, rows)
    click.echo(f"plot: {png}")


@main.command()
@click.argument("run_ref", metavar="RUN", default="latest")
@_store_option
@click.option("--output", "-o", "out", type=click.Path(dir_okay=False), default=None,
              help="HTML file (default: out/report/run-ID.html).")  # fmt: skip
def report(run_ref: str, store_path: str | None, out: str | None) -> None:
    """Write one self-contained HTML page of a run from the results store: every plot and table."""
    from selftest.report import write_report

    try:
        with _open_store(store_path) as st:
            run = st.run(run_ref)
            hist = [h for h in st.history(run["id"]) if h["id"] != run["id"] and h["created"] <= run["created"]]
        dest = Path(out) if out else Path("out/report") / f"run-{run['id']}.html"
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_report(run, hist, dest)
    except SvcframeError as exc:
        _fail(str(exc))
        return
    click.echo(f"report: {dest}")


# -- monitoring -----------------------------------------------------------------------------------------------
def _stats_rows(previous: dict[str, Any] | None, current: dict[str, Any], seconds: float) -> list[tuple[Any, ...]]:
    """Per address and callpath: calls/s since the previous snapshot, and latency percentiles (µs)."""
    rows = []
    for address, stats in current.items():
        before = {}
        if previous and address in previous:
            for side in ("origin", "target"):
                for r in previous[address]["rpcs"][side]:
                    before[(side, r["parent_rpc"], r["rpc"], r["provider_id"], r["peer"])] = r
        for side, step in (("target", "handler_usec"), ("origin", "total_usec")):
            for r in stats["rpcs"][side]:
                key = (side, r["parent_rpc"], r["rpc"], r["provider_id"], r["peer"])
                count = r["calls"]  # exact: every call is counted; only latencies are sampled (timing_sample_every)
                old = before.get(key, {}).get("calls", 0) if previous else 0
                rate = (count - old) / seconds if previous and seconds > 0 else 0.0
                parent = f"{r['parent_rpc']}[{r['parent_provider_id']}] -> " if r["parent_rpc"] else ""
                rows.append((address, side, f"{parent}{r['rpc']}[{r['provider_id']}]", r["peer"], rate, count,
                             r[step]["p50"], r[step]["p99"], r.get("queue_usec", {}).get("p50"), r["errors"]))  # fmt: skip
    return rows


def _stats_table(rows: list[tuple[Any, ...]]) -> Any:
    from rich.table import Table

    table = Table(title="svcframe monitor (target: handler time; origin: round trip; calls exact, latencies sampled)")
    for col in ("server", "side", "callpath", "peer", "calls/s", "calls", "p50 µs", "p99 µs", "queue p50 µs", "errors"):
        table.add_column(col)
    for a, side, cp, peer, rate, count, p50, p99, queue, errors in rows:
        table.add_row(a, side, cp, peer, f"{rate:,.0f}", str(count), f"{p50:.1f}", f"{p99:.1f}",
                      "" if queue is None else f"{queue:.1f}", str(errors))  # fmt: skip
    return table


@main.command()
@_target_options
@click.option("--interval-seconds", type=float, default=1.0, show_default=True)
@click.option("--count", type=int, default=0, help="Stop after this many refreshes (0 = until Ctrl-C).")
def monitor(address: tuple[str, ...], group: str | None, interval_seconds: float, count: int) -> None:
    """Live per-callpath rates and latency percentiles of servers, refreshed every interval."""
    from rich.console import Console
    from rich.live import Live

    from .engine import Engine
    from .loops import run

    targets = _targets(address, group)

    async def go() -> None:
        import asyncio

        from .admin import ServiceGroupHandle

        async with Engine(None, secret=_read_secret(None), default_timeout_seconds=10.0) as engine:
            handle = ServiceGroupHandle(engine, targets)
            previous, t_prev = None, time.monotonic()
            with Live(console=Console(width=max(Console().width, 140)), auto_refresh=False) as live:
                n = 0
                while count == 0 or n <= count:
                    current = {
                        a: r for a, r in (await handle.call("statistics")).items() if not isinstance(r, Exception)
                    }
                    now = time.monotonic()
                    live.update(_stats_table(_stats_rows(previous, current, now - t_prev)), refresh=True)
                    previous, t_prev = current, now
                    n += 1
                    if count == 0 or n <= count:
                        await asyncio.sleep(interval_seconds)  # the refresh period

    with contextlib.suppress(KeyboardInterrupt):
        run(go())


@main.group()
def stats() -> None:
    """Statistics of running servers: dump (JSON or Prometheus text) and diagnose."""


@stats.command("dump")
@_target_options
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="Write here (default stdout).")
@click.option("--format", "fmt", type=click.Choice(["json", "prometheus"]), default="json", show_default=True)
@click.option("--reset", is_flag=True, help="Reset the statistics after reading them.")
def stats_dump(address: tuple[str, ...], group: str | None, output: str | None, fmt: str, reset: bool) -> None:
    """Every server's statistics, keyed by address (JSON), or in the Prometheus text format."""
    results = _run_admin(_targets(address, group), "statistics", reset)
    if fmt == "json":
        text = json.dumps(results, indent=2)
    else:
        from .monitoring import to_prometheus_many

        text = to_prometheus_many([({"server": a}, st) for a, st in results.items()]).decode()
    if output:
        Path(output).write_text(text)
        click.echo(f"statistics of {len(results)} server(s) written to {output}", err=True)
    else:
        click.echo(text)


@stats.command("diagnose")
@_target_options
def stats_diagnose(address: tuple[str, ...], group: str | None) -> None:
    """Name the dominant callpaths of each server and the step where their time goes."""
    from .diagnosis import diagnose, format_diagnosis

    for a, st in _run_admin(_targets(address, group), "statistics").items():
        click.echo(f"{a}:")
        click.echo(format_diagnosis(diagnose(st)))


@main.group()
def trace() -> None:
    """Request tracing: switch it on or off live, and export Chrome Trace JSON (Perfetto UI)."""


@trace.command("on")
@_target_options
def trace_on(address: tuple[str, ...], group: str | None) -> None:
    """Start recording traces of every call on these servers."""
    _run_admin(_targets(address, group), "set_tracing", True)
    click.echo("tracing on", err=True)


@trace.command("off")
@_target_options
def trace_off(address: tuple[str, ...], group: str | None) -> None:
    """Stop recording traces."""
    _run_admin(_targets(address, group), "set_tracing", False)
    click.echo("tracing off", err=True)


@trace.command("dump")
@_target_options
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="trace.json", show_default=True)
@click.option("--clear", is_flag=True, help="Empty the servers' trace buffers after reading.")
def trace_dump(address: tuple[str, ...], group: str | None, output: str, clear: bool) -> None:
    """Merge the servers' trace events into one Chrome Trace file (open it at ui.perfetto.dev)."""
    from .tracing import write_chrome_trace

    results = _run_admin(_targets(address, group), "trace_events", clear)
    events = [e for evs in results.values() for e in evs]
    names = {e["pid"]: a for a, evs in results.items() for e in evs[:1]}
    write_chrome_trace(output, events, process_names=names)
    click.echo(f"{len(events)} events from {len(results)} server(s) written to {output}", err=True)


@main.command()
@click.option("--quick", is_flag=True, help="Short measurements (for CI: figures printed, no pass/fail).")
@click.option("--seconds", type=float, default=3.0, show_default=True, help="Length of each measurement.")
@click.option("--workload", "workloads", multiple=True, type=click.Choice(BENCH_WORKLOADS))
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="out/bench.json", show_default=True)
def bench(quick: bool, seconds: float, workloads: tuple[str, ...], output: str) -> None:
    """Measure svcframe against the raw uvloop limit (and pyzmq / grpcio when installed)."""
    from selftest.bench import BenchOptions, print_table, run_bench

    opts = BenchOptions(quick=quick, seconds=seconds, workloads=workloads or BENCH_WORKLOADS)
    result = run_bench(opts)
    print_table(result)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(json.dumps(result, indent=2))
    click.echo(f"results: {output}")


# -- topology and plumber ----------------------------------------------------------------------------------------
@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the topology document (the --from FILE format).")
@click.option("--from", "from_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A described topology (JSON, or hwloc XML through pyhwloc) instead of this host's.")  # fmt: skip
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True)
@click.option("--policies", is_flag=True, help="Also show what every plumber policy pair would choose (dry run).")
@click.option("--interfaces", multiple=True, help="Interface-name pattern the plumber may choose (repeatable).")
def topology(as_json: bool, from_file: str | None, backend: str, policies: bool, interfaces: tuple[str, ...]) -> None:
    """Show packages, NUMA nodes, cores and NICs (with PCI locality), as the plumber sees them."""
    from .plumber import select_nic
    from .topology import discover, format_cpulist, load_topology

    try:
        topo = load_topology(from_file) if from_file else discover(backend)
    except SvcframeError as exc:
        _fail(str(exc))
        return
    patterns = list(interfaces) or None
    matrix = []
    if policies:  # every pair of policies that choose (passthrough, a None in the registries, does not)
        for bp in (b for b, choose_buckets in BUCKET_POLICIES.items() if choose_buckets is not None):
            for np_ in (n for n, choose_nic in NIC_POLICIES.items() if choose_nic is not None):
                choice = select_nic(topo, bp, np_, interfaces=patterns, dry_run=True)
                matrix.append({"bucket_policy": bp, "nic_policy": np_, **choice.to_dict()})
    if as_json:
        _echo_json({**topo.to_dict(), **({"policies": matrix} if policies else {})})
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]{topo.host or '(described)'}[/bold] from {topo.source}: {len(topo.packages)} package(s), "
        f"{len(topo.numa_nodes)} NUMA node(s), {len(topo.cores)} core(s), {len(topo.cpus)} CPU(s)"
    )
    places = Table(title="packages and NUMA nodes")
    for col in ("kind", "os_index", "cpus"):
        places.add_column(col)
    for p in topo.packages:
        places.add_row("package", str(p.os_index), format_cpulist(p.cpus))
    for n in topo.numa_nodes:
        places.add_row("numa", str(n.os_index), format_cpulist(n.cpus))
    console.print(places)
    candidates = {n.name for n in topo.candidate_nics(patterns)}
    nics = Table(title="network interfaces")
    for col in ("name", "addresses", "local cpus", "packages", "numa", "pci", "kind", "up", "plumber candidate"):
        nics.add_column(col, overflow="fold", no_wrap=col == "name")
    for n in topo.nics:
        pkgs = sorted({p.os_index for p in topo.packages if p.cpus & n.local_cpus})
        nics.add_row(
            n.name, ", ".join(n.addresses) or "-", format_cpulist(n.local_cpus), ",".join(map(str, pkgs)),
            "-" if n.numa_node is None else str(n.numa_node), n.pci or "-", "virtual" if n.virtual else "pci",
            "yes" if n.up else "no", "yes" if n.name in candidates else "no",
        )  # fmt: skip
    console.print(nics)
    if matrix:
        table = Table(title="plumber choices for this process (dry run: round robin not taken)")
        for col in ("bucket_policy", "nic_policy", "bucket", "nic", "address"):
            table.add_column(col)
        for row in matrix:
            table.add_row(row["bucket_policy"], row["nic_policy"], row["bucket"] or "-", row["nic"] or "-",
                          row["address"] or "-")  # fmt: skip
        console.print(table)


@selftest.command("nic-dispersion")
@click.option("--from", "from_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A described topology instead of this host's (with --loopback-aliases to rehearse it here).")  # fmt: skip
@click.option("--loopback-aliases", is_flag=True, help="Stand NIC k in by 127.0.0.(k+2).")
@click.option("--clients", "-c", type=int, default=16, show_default=True)
@click.option("--scenario", "scenarios", multiple=True, type=click.Choice(SCENARIOS),
              help="Client-binding scenario (repeatable; default: all three).")  # fmt: skip
@click.option("--nic-policy", "nic_policies", multiple=True, type=click.Choice(NIC_POLICIES),
              help="NIC policy to compare (repeatable; default: byset and roundrobin).")  # fmt: skip
@click.option("--bucket-policy", type=click.Choice([b for b, forms in BUCKET_POLICIES.items() if forms is not None]),
              default="all", show_default=True)  # fmt: skip
@click.option("--interfaces", multiple=True, help="Interface-name pattern (repeatable).")
@click.option("--bulk-size", type=int, default=4 * 1024 * 1024, show_default=True)
@click.option("--duration-seconds", type=float, default=2.0, show_default=True)
@click.option("--server", "server_map", multiple=True, metavar="NIC=ADDRESS",
              help="Use a running server for NIC instead of launching one (repeatable).")  # fmt: skip
@click.option("--output", "-o", "out", type=click.Path(file_okay=False), default="out/nic-dispersion",
              show_default=True)  # fmt: skip
def selftest_nic_dispersion(
    from_file: str | None, loopback_aliases: bool, clients: int, scenarios: tuple[str, ...],
    nic_policies: tuple[str, ...], bucket_policy: str, interfaces: tuple[str, ...], bulk_size: int,
    duration_seconds: float, server_map: tuple[str, ...], out: str,
) -> None:  # fmt: skip
    """Servers one per NIC, clients under three CPU-binding scenarios and two NIC policies: aggregate
    bandwidth per scenario and a bar chart (the paper's Figure 2)."""
    from selftest.nic_dispersion import DispersionOptions, run_dispersion, save

    from .topology import discover, load_topology

    opts = DispersionOptions(
        out=Path(out), clients=clients, scenarios=list(scenarios) or list(SCENARIOS),
        nic_policies=list(nic_policies) or ["byset", "roundrobin"], bucket_policy=bucket_policy,
        bulk_size=bulk_size, duration_seconds=duration_seconds, interfaces=list(interfaces) or None,
        loopback_aliases=loopback_aliases,
        servers=dict(item.split("=", 1) for item in server_map if "=" in item) if server_map else None,
    )  # fmt: skip
    if any("=" not in item for item in server_map):
        _fail("--server takes NIC=ADDRESS, e.g. --server nic0=tcp://10.99.1.1:40000")
    try:
        topo = load_topology(from_file) if from_file else discover()
        doc = run_dispersion(topo, opts, on_step=lambda what: click.echo(f"running {what} ...", err=True))
    except SvcframeError as exc:
        _fail(str(exc))
        return
    js, png = save(doc, opts.out)
    for note in doc["notes"]:
        click.echo(f"note: {note}")
    names = [n["name"] for n in doc["nics"]]
    click.echo(f"{'scenario':>10} {'nic_policy':>11} {'GiB/s':>8}  clients per NIC ({', '.join(names)})")
    for r in doc["runs"]:
        spread = " ".join(str(r["clients_per_nic"][n]) for n in names)
        click.echo(f"{r['scenario']:>10} {r['nic_policy']:>11} {r['bandwidth_gib_per_second']:8.3f}  {spread}")
    click.echo(f"plot: {png}\nresults: {js}")


if __name__ == "__main__":
    main()
