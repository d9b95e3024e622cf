"""``svcframe roofline collect``: measure this machine's data-service roofline with the self-test.

Method (Carns et al., papers/carns2025-data-service-roofline.txt, sections 4.2-4.3), on one machine:

* ``Pc``, peak client rate: one client process against one quiescent server process, pinned to
  different cores, repeated ``repeats`` times; kept as a min-max range.
* ``Ps``, peak server rate per server process: one server process per server core, saturated by
  client processes on the remaining cores with ``saturation_depth`` calls in flight each; aggregate rate
  / server processes, repeated ``repeats`` times; a min-max range.
* Validation samples: every (servers, clients) pair of the grid, rate per client process.

Server processes are pinned to the first half of the usable cores and client processes to the other
half, standing in for the paper's server and client nodes. On a small machine the grid therefore
oversubscribes cores (several processes share one), which the validation samples show as they are.

Both metrics come from the same procedure: RPC rate (``noop`` workload, ops/s) and network bandwidth
(``bulk`` workload of ``bulk_size`` bytes, GiB/s). The server config is the shipped self-test config.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from svcframe.config import ServiceConfig, load_config
from svcframe.launch import Launch, usable_cores

from .driver import SelftestParams, environment, run_selftest, save_results
from .roofline import METRICS, Range, Roofline, Sample, plot

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "selftest.json"


@dataclass
class CollectOptions:
    """Options of one collection. Times in seconds, sizes in bytes."""

    out: Path = Path("out/roofline")
    config: Path = DEFAULT_CONFIG
    metrics: list[str] = field(default_factory=lambda: ["rpc_rate", "bandwidth"])
    duration_seconds: float = 2.0
    repeats: int = 3
    warmup_iterations: int = 50
    bulk_size: int = 1024 * 1024
    saturation_depth: int = 16
    grid_servers: list[int] = field(default_factory=lambda: [1, 2])
    grid_clients: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    provider_id: int = 1


def _core_split() -> tuple[list[int], list[int]]:
    cores = usable_cores()
    if len(cores) < 2:
        return cores, cores
    half = len(cores) // 2
    return cores[:half], cores[half:]


def _params(opts: CollectOptions, metric: str, **kw: Any) -> SelftestParams:
    workload = "noop" if metric == "rpc_rate" else "bulk"
    return SelftestParams(
        workload=workload,
        provider_id=opts.provider_id,
        duration_seconds=opts.duration_seconds,
        warmup_iterations=opts.warmup_iterations,
        bulk_size=opts.bulk_size,
        **kw,
    )


def _per_client(metric: str, result: dict[str, Any]) -> float:
    agg = result["aggregate"]
    if metric == "rpc_rate":
        return float(agg["rate_per_client_ops_per_second"])
    return float(agg["bandwidth_gib_per_second"]) / len(result["clients"])


def _aggregate(metric: str, result: dict[str, Any]) -> float:
    agg = result["aggregate"]
    return float(agg["rate_ops_per_second"] if metric == "rpc_rate" else agg["bandwidth_gib_per_second"])


def plan(opts: CollectOptions) -> list[tuple[str, str, int, int]]:
    """Every measurement, as (stage, metric, servers, clients), in the order they run."""
    server_cores, client_cores = _core_split()
    n_sat_servers = len(server_cores)
    n_sat_clients = max(2, 2 * len(client_cores))
    steps = []
    for metric in opts.metrics:
        steps += [("Pc", metric, 1, 1)] * opts.repeats
        steps += [("Ps", metric, n_sat_servers, n_sat_clients)] * opts.repeats
        steps += [("grid", metric, s, c) for s in opts.grid_servers for c in opts.grid_clients]
    return steps


def collect(opts: CollectOptions, on_step: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Run the whole suite; write plots, raw results and the model into ``opts.out``.

    Args:
        on_step: called before each measurement with (description, index, total), for progress display.

    Returns:
        the model document (also written to ``opts.out / "roofline.json"``).

    Raises:
        LaunchError / SelftestError: a server or client failed (the message says which and why).
    """
    config: ServiceConfig = load_config(opts.config)
    out = Path(opts.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    server_cores, client_cores = _core_split()
    steps = plan(opts)
    wall0 = time.monotonic()
    measured = 0.0
    runs: list[dict[str, Any]] = []
    by_metric: dict[str, dict[str, Any]] = {m: {"Pc": [], "Ps": [], "grid": []} for m in opts.metrics}
    index = 0
    # Servers live on the server cores and clients on the client cores, as server and client nodes
    # do in the paper; one launch per server count serves every measurement that needs it.
    layouts: dict[int, list[tuple[str, str, int, int]]] = {}
    for step in steps:
        layouts.setdefault(step[2], []).append(step)
    for n_servers, group in layouts.items():
        with Launch(config, n_servers, cores=server_cores) as launch:
            addresses = [m.address for m in launch.members]
            for stage, metric, servers, clients in group:
                index += 1
                if on_step is not None:
                    on_step(f"{stage} {metric}: {servers} server(s) x {clients} client(s)", index, len(steps))
                depth = opts.saturation_depth if stage == "Ps" else 1
                params = _params(opts, metric, clients=clients, depth=depth, client_cores=client_cores)
                result = run_selftest(params, addresses[:servers])
                measured += result["aggregate"]["elapsed_seconds"]
                name = f"{index:03d}-{stage}-{metric}-s{servers}-c{clients}.json"
                save_results(result, out / "runs" / name)
                row = {
                    "stage": stage,
                    "metric": metric,
                    "servers": servers,
                    "clients": clients,
                    "per_client": _per_client(metric, result),
                    "aggregate": _aggregate(metric, result),
                    "latency_p50_usec": result["aggregate"]["latency_usec"]["p50"],
                    "server_cpu_usec_per_op": result["aggregate"]["server_cpu_usec_per_op"],
                    "server_utilization": result["aggregate"]["server_utilization"],
                    "file": f"runs/{name}",
                }
                runs.append(row)
                by_metric[metric][stage].append(row)
    models: dict[str, Any] = {}
    for metric, rows in by_metric.items():
        pc = Range.of(r["per_client"] for r in rows["Pc"])
        ps = Range.of(r["aggregate"] / r["servers"] for r in rows["Ps"])
        samples = [Sample(r["servers"], r["clients"], r["per_client"]) for r in rows["grid"]]
        model = Roofline(METRICS[metric], pc, ps, samples)
        plot(
            model,
            out / f"{metric}.png",
            title=f"{METRICS[metric].label.split(' per ')[0]} roofline, {os.uname().nodename}",
        )
        models[metric] = model.to_dict()
    wall = time.monotonic() - wall0
    doc = {
        "kind": "svcframe-roofline",
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "environment": environment(),
        "server_cores": server_cores,
        "client_cores": client_cores,
        "metrics": models,
        "runs": runs,
        "wall_seconds": wall,
        "measurement_seconds": measured,
    }
    (out / "roofline.json").write_text(json.dumps(doc, indent=2))
    return doc
