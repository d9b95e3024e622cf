"""Watching running servers: ``svcframe monitor`` (live rates and latencies), ``svcframe stats dump|diagnose``
and ``svcframe trace on|off|dump`` (Chrome Trace JSON for ui.perfetto.dev)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

import click

from .common import (
    describe,
    echo_json,
    emit,
    fail,
    make_table,
    output_console,
    output_path,
    quantity,
    read_secret,
    resolve_targets,
    run_admin,
    target_options,
    write_output,
)

MONITOR_COLUMNS = ("server", "side", "callpath", "peer", "calls_per_second", "calls", "p50_usec", "p99_usec",
                   "queue_p50_usec", "errors")  # fmt: skip


def stats_rows(previous: dict[str, Any] | None, current: dict[str, Any], seconds: float) -> list[tuple[Any, ...]]:
    """Per address and callpath: calls/s since the previous snapshot (without one: since the statistics were
    reset, their ``since``), exact call and error counts, and sampled latency percentiles (µs); the columns are
    ``MONITOR_COLUMNS``."""
    rows = []
    now = time.time()
    for address, stats in current.items():
        before = {}
        if previous and address in previous:
            for side in ("origin", "target"):
                for r in previous[address]["rpcs"][side]:
                    before[(side, r["parent_rpc"], r["rpc"], r["provider_id"], r["peer"])] = r
        window = seconds if previous else now - stats["rpcs"].get("since", now)
        for side, step in (("target", "handler_usec"), ("origin", "total_usec")):
            for r in stats["rpcs"][side]:
                key = (side, r["parent_rpc"], r["rpc"], r["provider_id"], r["peer"])
                count = r["calls"]  # exact: every call is counted; only latencies are sampled (timing_sample_every)
                old = before.get(key, {}).get("calls", 0)
                rate = (count - old) / window if window > 0 else 0.0
                parent = f"{r['parent_rpc']}[{r['parent_provider_id']}] -> " if r["parent_rpc"] else ""
                rows.append((address, side, f"{parent}{r['rpc']}[{r['provider_id']}]", r["peer"], rate, count,
                             r[step]["p50"], r[step]["p99"], r.get("queue_usec", {}).get("p50"), r["errors"]))  # fmt: skip
    return rows


MONITOR_TITLE = ("svcframe monitor: calls and errors exact; latencies sampled (p50, p99: handler time on the "
                 "target side, round trip on the origin side; queue: p50 of the wait for a handler)")  # fmt: skip
_MONITOR_HEADERS = ("callpath", "calls/s", "calls", "p50", "p99", "queue", "errors")


def _stats_view(rows: list[tuple[Any, ...]], console: Any) -> Any:
    """The title, then per server, side and peer a line naming them (``SERVER target, from PEER``) and a table
    of the callpaths (figures with their units): within 80 columns for callpaths of up to ~25 characters."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = [Text(MONITOR_TITLE)]
    for server, side, peer in dict.fromkeys((r[0], r[1], r[3]) for r in rows):
        cells = [(cp, quantity(rate), f"{count:,}", quantity(p50, "usec"), quantity(p99, "usec"),
                  quantity(queue, "usec"), f"{errors:,}")
                 for a, s, cp, p, rate, count, p50, p99, queue, errors in rows
                 if (a, s, p) == (server, side, peer)]  # fmt: skip
        heading = f"{server} {side}, {'from' if side == 'target' else 'to'} {peer}"
        parts += [Text(heading), make_table(_MONITOR_HEADERS, cells, numeric=_MONITOR_HEADERS[1:], console=console)]
    if not rows:
        parts.append(Text("no calls yet"))
    return Group(*parts)


@click.command()
@target_options
@click.option("--interval-seconds", type=click.FloatRange(min=0.01), default=1.0, show_default=True)
@click.option(
    "--count", type=click.IntRange(min=0), default=0, help="Stop after this many snapshots (0 = until Ctrl-C)."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per snapshot and line (JSON lines).")
def monitor(
    address: tuple[str, ...], group: str | None, ranks: list[int] | None, interval_seconds: float, count: int,
    as_json: bool,
) -> None:  # fmt: skip
    """Per-callpath rates and latency percentiles of servers, refreshed every interval.

    Calls and errors are exact; latencies are sampled. The first snapshot's rate is since the statistics were
    last reset; each later one's since the snapshot before. In a pipe each snapshot is printed in turn. A
    server that does not answer is one line on stderr (and an exit code of 1 at the end); none answering is an
    error."""
    from rich.live import Live

    from ..engine import Engine
    from ..loops import run

    targets = resolve_targets(address, group, ranks)
    console = output_console()
    unanswered: set[str] = set()

    async def go() -> None:
        import asyncio

        from ..admin import ServiceGroupHandle

        async with Engine(None, secret=read_secret(), default_timeout_seconds=10.0) as engine:
            handle = ServiceGroupHandle(engine, targets)
            previous, t_prev = None, time.monotonic()
            live = Live(console=console, auto_refresh=False) if console.is_terminal and not as_json else None
            with live or contextlib.nullcontext():
                n = 0
                while count == 0 or n < count:
                    answers = await handle.call("statistics")
                    current = {a: r for a, r in answers.items() if not isinstance(r, Exception)}
                    failed = {a: r for a, r in answers.items() if isinstance(r, Exception)}
                    if not current:
                        fail("no server answered: " + "; ".join(f"{a}: {describe(r)}" for a, r in failed.items()))
                    for a, r in failed.items():
                        unanswered.add(a)
                        click.echo(f"svcframe: {a}: {describe(r)}", err=True)
                    now = time.monotonic()
                    rows = stats_rows(previous, current, now - t_prev)
                    if as_json:
                        click.echo(json.dumps({"time": time.time(), "rows": [dict(zip(MONITOR_COLUMNS, r, strict=True))
                                                                             for r in rows]}))  # fmt: skip
                    elif live is not None:
                        live.update(_stats_view(rows, console), refresh=True)
                    else:
                        emit(_stats_view(rows, console), console)
                    previous, t_prev = current, now
                    n += 1
                    if count == 0 or n < count:
                        await asyncio.sleep(interval_seconds)  # the refresh period

    with contextlib.suppress(KeyboardInterrupt):
        run(go())
    if unanswered:
        sys.exit(1)


@click.group()
def stats() -> None:
    """Statistics of running servers: dump (JSON or Prometheus text) and diagnose."""


@stats.command("dump")
@target_options
@click.option(
    "--output",
    "-o",
    callback=output_path,
    type=click.Path(dir_okay=False),
    default=None,
    help="Write here (default stdout).",
)
@click.option("--format", "fmt", type=click.Choice(["json", "prometheus"]), default="json", show_default=True)
@click.option("--reset", is_flag=True, help="Reset the statistics after reading them.")
def stats_dump(
    address: tuple[str, ...], group: str | None, ranks: list[int] | None, output: str | None, fmt: str, reset: bool
) -> None:
    """Every server's statistics, keyed by address (JSON), or in the Prometheus text format."""
    results = run_admin(resolve_targets(address, group, ranks), "statistics", reset)
    if fmt == "json":
        text = json.dumps(results, indent=2)
    else:
        from ..monitoring import to_prometheus_many

        text = to_prometheus_many([({"server": a}, st) for a, st in results.items()]).decode()
    if output:
        write_output(output, text, "the statistics")
        click.echo(f"statistics of {len(results)} server(s) written to {output}", err=True)
    else:
        click.echo(text)


@stats.command("diagnose")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON keyed by address.")
def stats_diagnose(address: tuple[str, ...], group: str | None, ranks: list[int] | None, as_json: bool) -> None:
    """Name the dominant callpaths of each server and the step where their time goes.

    Times are exact call counts x sampled step means; the admin provider's calls (this tool's own) are left
    out and listed apart. A parent RPC that ran in another process is named by asking that process."""
    from ..diagnosis import diagnose, format_diagnosis, rpc_names

    targets = resolve_targets(address, group, ranks)
    results = run_admin(targets, "statistics")
    names = rpc_names(*results.values())
    names.update(_peer_rpc_names(results, names, targets[0][1]))
    found = {a: diagnose(st, names=names) for a, st in results.items()}
    if as_json:
        echo_json(found)
        return
    for a, diagnosis in found.items():
        click.echo(f"{a}:")
        click.echo(format_diagnosis(diagnosis))


def _peer_rpc_names(results: dict[str, Any], names: dict[str, str], admin_provider_id: int) -> dict[str, str]:
    """Names of parent RPCs none of ``results`` knows, from the peers that made those calls (their admin
    ``list_rpcs``; peers that are not servers, or do not answer, leave the parent as its ``#id``)."""
    from ..diagnosis import unnamed_parents
    from ..engine import Engine
    from ..loops import run
    from ..wire import rpc_id

    peers: set[str] = set()
    for st in results.values():
        peers.update(p for p in unnamed_parents(st, names) if "://" in p)
    if not peers:
        return {}

    async def go() -> dict[str, str]:
        import asyncio

        from ..admin import ServiceHandle

        async with Engine(None, secret=read_secret(), default_timeout_seconds=5.0) as engine:
            tables = await asyncio.gather(
                *(ServiceHandle(engine, p, admin_provider_id).list_rpcs() for p in sorted(peers)),
                return_exceptions=True,
            )
        return {f"{rpc_id(r['name']):08x}": r["name"] for t in tables if isinstance(t, list) for r in t}

    return run(go())


@click.group()
def trace() -> None:
    """Request tracing: switch it on or off live, and export Chrome Trace JSON (Perfetto UI)."""


@trace.command("on")
@target_options
def trace_on(address: tuple[str, ...], group: str | None, ranks: list[int] | None) -> None:
    """Start recording traces of every call on these servers."""
    run_admin(resolve_targets(address, group, ranks), "set_tracing", True)
    click.echo("tracing on", err=True)


@trace.command("off")
@target_options
def trace_off(address: tuple[str, ...], group: str | None, ranks: list[int] | None) -> None:
    """Stop recording traces."""
    run_admin(resolve_targets(address, group, ranks), "set_tracing", False)
    click.echo("tracing off", err=True)


@trace.command("dump")
@target_options
@click.option(
    "--output", "-o", callback=output_path, type=click.Path(dir_okay=False), default="trace.json", show_default=True
)
@click.option("--clear", is_flag=True, help="Empty the servers' trace buffers after reading.")
def trace_dump(address: tuple[str, ...], group: str | None, ranks: list[int] | None, output: str, clear: bool) -> None:
    """Merge the servers' trace events into one Chrome Trace file (open it at ui.perfetto.dev)."""
    from ..tracing import chrome_trace

    results = run_admin(resolve_targets(address, group, ranks), "trace_events", clear)
    events = [e for evs in results.values() for e in evs]
    names = {e["pid"]: a for a, evs in results.items() for e in evs[:1]}
    write_output(output, json.dumps(chrome_trace(events, process_names=names)), "the trace")
    click.echo(f"{len(events)} events from {len(results)} server(s) written to {output}", err=True)
