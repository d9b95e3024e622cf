"""Watching running servers: ``svcframe monitor`` (live rates and latencies), ``svcframe stats dump|diagnose``
and ``svcframe trace on|off|dump`` (Chrome Trace JSON for ui.perfetto.dev)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import click

from .common import read_secret, resolve_targets, run_admin, target_options


def stats_rows(previous: dict[str, Any] | None, current: dict[str, Any], seconds: float) -> list[tuple[Any, ...]]:
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


@click.command()
@target_options
@click.option("--interval-seconds", type=float, default=1.0, show_default=True)
@click.option("--count", type=int, default=0, help="Stop after this many refreshes (0 = until Ctrl-C).")
def monitor(
    address: tuple[str, ...], group: str | None, ranks: list[int] | None, interval_seconds: float, count: int
) -> None:
    """Live per-callpath rates and latency percentiles of servers, refreshed every interval."""
    from rich.console import Console
    from rich.live import Live

    from ..engine import Engine
    from ..loops import run

    targets = resolve_targets(address, group, ranks)

    async def go() -> None:
        import asyncio

        from ..admin import ServiceGroupHandle

        async with Engine(None, secret=read_secret(), default_timeout_seconds=10.0) as engine:
            handle = ServiceGroupHandle(engine, targets)
            previous, t_prev = None, time.monotonic()
            with Live(console=Console(width=max(Console().width, 140)), auto_refresh=False) as live:
                n = 0
                while count == 0 or n <= count:
                    current = {
                        a: r for a, r in (await handle.call("statistics")).items() if not isinstance(r, Exception)
                    }
                    now = time.monotonic()
                    live.update(_stats_table(stats_rows(previous, current, now - t_prev)), refresh=True)
                    previous, t_prev = current, now
                    n += 1
                    if count == 0 or n <= count:
                        await asyncio.sleep(interval_seconds)  # the refresh period

    with contextlib.suppress(KeyboardInterrupt):
        run(go())


@click.group()
def stats() -> None:
    """Statistics of running servers: dump (JSON or Prometheus text) and diagnose."""


@stats.command("dump")
@target_options
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="Write here (default stdout).")
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
        Path(output).write_text(text)
        click.echo(f"statistics of {len(results)} server(s) written to {output}", err=True)
    else:
        click.echo(text)


@stats.command("diagnose")
@target_options
def stats_diagnose(address: tuple[str, ...], group: str | None, ranks: list[int] | None) -> None:
    """Name the dominant callpaths of each server and the step where their time goes."""
    from ..diagnosis import diagnose, format_diagnosis

    for a, st in run_admin(resolve_targets(address, group, ranks), "statistics").items():
        click.echo(f"{a}:")
        click.echo(format_diagnosis(diagnose(st)))


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
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="trace.json", show_default=True)
@click.option("--clear", is_flag=True, help="Empty the servers' trace buffers after reading.")
def trace_dump(address: tuple[str, ...], group: str | None, ranks: list[int] | None, output: str, clear: bool) -> None:
    """Merge the servers' trace events into one Chrome Trace file (open it at ui.perfetto.dev)."""
    from ..tracing import write_chrome_trace

    results = run_admin(resolve_targets(address, group, ranks), "trace_events", clear)
    events = [e for evs in results.values() for e in evs]
    names = {e["pid"]: a for a, evs in results.items() for e in evs[:1]}
    write_chrome_trace(output, events, process_names=names)
    click.echo(f"{len(events)} events from {len(results)} server(s) written to {output}", err=True)
