"""``svcframe roofline collect``: measure this machine's data-service roofline with the self-test.

Method (Carns et al., papers/carns2025-data-service-roofline.txt, sections 4.2-4.3), on one machine whose
usable cores are split into a server "node" (first half) and a client "node" (second half):

* ``Pc``, peak client rate: one client process against one quiescent server process, pinned to
  different cores, repeated ``repeats`` times (every pair of the two local nodes); a min-max range.
* ``Ps``, peak server rate per server process: one server process per server core, saturated by
  client processes on the client cores with ``saturation_depth`` calls in flight each; aggregate rate
  / server processes, repeated ``repeats`` times; a min-max range.
* ``sweep``: the server-process sweep of Figures 9 and 10 (``selftest/sweep.py``): 1..``sweep_max_servers``
  server processes saturated by the same clients; aggregate rate against server processes. Its point at
  the ``Ps`` server count is the ``Ps`` measurement itself.
* ``grid``: validation samples, every (servers, clients) pair of the grid, rate per client process.

Metrics: RPC rate (``noop`` workload, ops/s), network bandwidth (``bulk`` of ``bulk_size`` bytes, GiB/s),
storage IOPS (``storage`` workload, ``storage_block_size`` bytes at random offsets of a file on the
server's disk, ops/s) and storage bandwidth (``storage`` with ``storage_bandwidth_block_size``, GiB/s).
Each validation sample is scored (Zhu, Neuwirth et al. eqs. 10-11), per metric and across metrics by
weighted geometric mean (eq. 12), with the model's median and worst relative error per region.

Cost: server processes are launched once, for the largest server count of the plan, and a measurement
uses the first ``servers`` of them (the rest idle in their blocking selector); client processes are a
:class:`~selftest.pool.ClientPool` started once. The run's wall time is split into measurement intervals
and everything else (``overhead`` in the document).

With a results store (``store``), the run, its plan and every sample go into the SQLite file as they
complete (``selftest/store.py``); ``collect(..., resume=RUN)`` continues an interrupted run, skipping the
measurements already stored. Ctrl-C (KeyboardInterrupt) tears servers and clients down and marks the run
``interrupted``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform as _platform
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from svcframe.config import ServiceConfig, load_config
from svcframe.launch import Launch, usable_cores

from .driver import SelftestParams, environment, save_results
from .roofline import METRICS, Range, Roofline, Sample, combine_scores, plot

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "selftest.json"

ALL_METRICS = ("rpc_rate", "bandwidth", "storage_iops", "storage_bandwidth")
"""Metrics collect can measure, in the order it measures them."""

_RATE_METRICS = ("rpc_rate", "storage_iops")  # ops/s; the others are GiB/s


@dataclass
class CollectOptions:
    """Options of one collection. Times in seconds, sizes in bytes.

    ``store`` (a results store file, ``None`` = none) keeps the run for history and resume; ``service`` and
    ``platform`` name what history compares against (default: the config's file stem, and
    ``$SLURM_CLUSTER_NAME`` or the host name). ``weights`` weigh metrics in the combined score
    (default 1 each). ``sweep_max_servers`` (default: the server cores) bounds the server-process sweep;
    0 disables it.
    """

    out: Path = Path("out/roofline")
    config: Path = DEFAULT_CONFIG
    metrics: list[str] = field(default_factory=lambda: ["rpc_rate", "bandwidth"])
    duration_seconds: float = 2.0
    repeats: int = 3
    warmup_iterations: int = 10
    bulk_size: int = 1024 * 1024
    saturation_depth: int = 16
    grid_servers: list[int] = field(default_factory=lambda: [1, 2])
    grid_clients: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    provider_id: int = 1
    storage_block_size: int = 4096
    storage_bandwidth_block_size: int = 1024 * 1024
    storage_op: str = "write"
    storage_fsync: bool = False
    storage_dir: Path | None = None
    sweep_max_servers: int | None = None
    store: Path | None = None
    service: str | None = None
    platform: str | None = None
    weights: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (paths as strings)."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CollectOptions:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (documents of older versions)."""
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in d:
                value = d[f.name]
                if f.name in ("out", "config", "storage_dir", "store") and value is not None:
                    value = Path(value)
                kw[f.name] = value
        return cls(**kw)


def _core_split() -> tuple[list[int], list[int]]:
    cores = usable_cores()
    if len(cores) < 2:
        return cores, cores
    half = len(cores) // 2
    return cores[:half], cores[half:]


def _params(opts: CollectOptions, metric: str, **kw: Any) -> SelftestParams:
    workload = {"rpc_rate": "noop", "bandwidth": "bulk"}.get(metric, "storage")
    block = opts.storage_bandwidth_block_size if metric == "storage_bandwidth" else opts.storage_block_size
    return SelftestParams(
        workload=workload,  # type: ignore[arg-type]
        provider_id=opts.provider_id,
        duration_seconds=opts.duration_seconds,
        warmup_iterations=opts.warmup_iterations,
        bulk_size=opts.bulk_size,
        storage_op=opts.storage_op,  # type: ignore[arg-type]
        storage_block_size=block,
        storage_fsync=opts.storage_fsync,
        **kw,
    )


def _per_client(metric: str, result: dict[str, Any]) -> float:
    agg = result["aggregate"]
    if metric in _RATE_METRICS:
        return float(agg["rate_per_client_ops_per_second"])
    return float(agg["bandwidth_gib_per_second"]) / len(result["clients"])


def _aggregate(metric: str, result: dict[str, Any]) -> float:
    agg = result["aggregate"]
    return float(agg["rate_ops_per_second"] if metric in _RATE_METRICS else agg["bandwidth_gib_per_second"])


def _saturation(opts: CollectOptions) -> tuple[int, int]:
    server_cores, client_cores = _core_split()
    return len(server_cores), max(2, 2 * len(client_cores))


def plan(opts: CollectOptions) -> list[tuple[str, str, int, int]]:
    """Every measurement, as (stage, metric, servers, clients), in the order they run.

    Per metric: ``Pc`` (``repeats`` x 1 server x 1 client), ``Ps`` (``repeats`` x all server cores x
    saturating clients), ``sweep`` (each other server count up to ``sweep_max_servers``, saturating
    clients), ``grid`` (``grid_servers`` x ``grid_clients``).

    Raises:
        ValueError: an unknown metric.
    """
    unknown = [m for m in opts.metrics if m not in ALL_METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; choose from {list(ALL_METRICS)}")
    n_sat_servers, n_sat_clients = _saturation(opts)
    n_sweep = n_sat_servers if opts.sweep_max_servers is None else opts.sweep_max_servers
    steps = []
    for metric in opts.metrics:
        steps += [("Pc", metric, 1, 1)] * opts.repeats
        steps += [("Ps", metric, n_sat_servers, n_sat_clients)] * opts.repeats
        steps += [("sweep", metric, n, n_sat_clients) for n in range(1, n_sweep + 1) if n != n_sat_servers]
        steps += [("grid", metric, s, c) for s in opts.grid_servers for c in opts.grid_clients]
    return steps


def step_keys(steps: list[tuple[str, str, int, int]]) -> list[str]:
    """A key per step, unique within the plan: ``"stage/metric/sS/cC#k"`` (k counts repeats)."""
    seen: dict[tuple[str, str, int, int], int] = {}
    keys = []
    for step in steps:
        k = seen.get(step, 0)
        seen[step] = k + 1
        stage, metric, s, c = step
        keys.append(f"{stage}/{metric}/s{s}/c{c}#{k}")
    return keys


def hardware() -> dict[str, Any]:
    """What the machine is: CPU model, logical / physical / usable cores, memory, network interfaces."""
    import psutil

    env = environment()
    nics = {}
    with contextlib.suppress(OSError):
        for name, st in psutil.net_if_stats().items():
            nics[name] = {"up": st.isup, "speed_mbps": st.speed, "mtu": st.mtu}
    return {
        "cpu_model": env["cpu_model"],
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": usable_cores(),
        "memory_bytes": psutil.virtual_memory().total,
        "machine": _platform.machine(),
        "nics": nics,
    }


def software() -> dict[str, Any]:
    """Versions of Python, the kernel and every library a measurement depends on (None = not installed)."""
    out: dict[str, Any] = {"python": _platform.python_version(), "kernel": _platform.release()}
    for dist in ("svcframe", "uvloop", "msgpack", "numpy", "matplotlib", "pydantic", "psutil", "mpi4py"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _service_config(opts: CollectOptions) -> ServiceConfig:
    config = load_config(opts.config)
    if opts.storage_dir is not None:
        for spec in config.providers:
            if spec.type == "selftest":
                spec.config["storage_dir"] = str(opts.storage_dir)
    return config


def _model(metric: str, rows: dict[str, list[dict[str, Any]]]) -> Roofline:
    pc = Range.of(r["per_client"] for r in rows["Pc"])
    ps = Range.of(r["aggregate"] / r["servers"] for r in rows["Ps"])
    samples = [Sample(r["servers"], r["clients"], r["per_client"]) for r in rows["grid"]]
    return Roofline(METRICS[metric], pc, ps, samples)


def combined_score(models: dict[str, dict[str, Any]], weights: dict[str, float] | None = None) -> float | None:
    """The cross-metric score: weighted geometric mean of each metric's validation score (Zhu, Neuwirth
    et al. eq. 12, via :func:`selftest.roofline.combine_scores`); None when a metric has no samples.

    Args:
        models: ``Roofline.to_dict()`` per metric name.
        weights: weight per metric (default 1 each); metrics missing from it weigh 1.
    """
    scores = {m: d["scores"]["overall"]["score"] for m, d in models.items()}
    if not scores or any(v is None for v in scores.values()):
        return None
    w = {m: float((weights or {}).get(m, 1.0)) for m in scores}
    return combine_scores(scores, w)


def collect(
    opts: CollectOptions,
    on_step: Callable[[str, int, int], None] | None = None,
    *,
    resume: int | None = None,
) -> dict[str, Any]:
    """Run the whole suite; write plots, raw results and the model into ``opts.out`` (and the store).

    Args:
        on_step: called before each measurement with (description, index, total), index from 1, over
            the measurements this call makes (a resumed run skips the stored ones).
        resume: a run id of ``opts.store`` to continue: its stored samples are kept, the rest measured.

    Returns:
        the model document (also written to ``opts.out / "roofline.json"``)::

            {"kind": "svcframe-roofline", "run_id", "options", "environment", "hardware", "software",
             "server_cores", "client_cores", "metrics": {name: Roofline.to_dict()}, "combined_score",
             "sweep": {metric: [points]}, "runs": [rows], "wall_seconds", "measurement_seconds",
             "overhead": {...}}

    Raises:
        LaunchError / SelftestError: a server or client failed (the message says which and why); the
            run is marked ``failed`` in the store.
        StoreError: ``resume`` names no run, or a run whose plan differs from this machine's.
        KeyboardInterrupt: after tearing everything down and marking the run ``interrupted``.
    """
    from .pool import ClientPool
    from .store import ResultsStore, StoreError

    wall0 = time.monotonic()
    timers = dict.fromkeys(("launch", "client_start", "coordination", "measurement", "store", "analysis",
                            "teardown"), 0.0)  # fmt: skip
    config = _service_config(opts)
    out = Path(opts.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    server_cores, client_cores = _core_split()
    steps = plan(opts)
    keys = step_keys(steps)
    store = ResultsStore(opts.store) if opts.store is not None else None
    run_id: int | None = None
    stored: dict[str, dict[str, Any]] = {}
    try:
        if store is not None and resume is not None:
            run_id = store.resolve(resume)
            previous = store.run(run_id)
            if previous["plan"] != keys:
                raise StoreError(
                    f"run {run_id} planned {len(previous['plan'])} measurements, this machine and these options "
                    f"plan {len(keys)} others; resume it with its own options on the same machine"
                )
            stored = {s["key"]: s for s in previous["samples"]}
            store.set_status(run_id, "running")
        elif store is not None:
            env = environment()
            run_id = store.create_run(
                kind="svcframe-roofline",
                service=opts.service or Path(opts.config).stem,
                platform=opts.platform or os.environ.get("SLURM_CLUSTER_NAME") or socket.gethostname(),
                host=socket.gethostname(),
                options=opts.to_dict(),
                environment=env,
                hardware=hardware(),
                software=software(),
                plan=keys,
            )
        todo = [(i, step, key) for i, (step, key) in enumerate(zip(steps, keys, strict=True)) if key not in stored]
        rows_by_key: dict[str, dict[str, Any]] = {k: {kk: v for kk, v in s.items() if kk not in ("id", "key", "created")}
                                                  for k, s in stored.items()}  # fmt: skip
        if todo:
            _measure(opts, config, todo, rows_by_key, timers, on_step, store, run_id, server_cores, client_cores,
                     ClientPool)  # fmt: skip
    except KeyboardInterrupt:
        if store is not None and run_id is not None:
            store.set_status(run_id, "interrupted")
        raise
    except BaseException:
        if store is not None and run_id is not None:
            store.set_status(run_id, "failed")
        raise
    finally:
        if store is not None and run_id is None:
            store.close()

    t_analysis = time.monotonic()
    rows = [rows_by_key[k] for k in keys]
    from .sweep import plot_sweep, sweep_points

    by_metric: dict[str, dict[str, list[dict[str, Any]]]] = {m: {"Pc": [], "Ps": [], "sweep": [], "grid": []}
                                                             for m in opts.metrics}  # fmt: skip
    for r in rows:
        by_metric[r["metric"]][r["stage"]].append(r)
    models: dict[str, Any] = {}
    for metric, metric_rows in by_metric.items():
        model = _model(metric, metric_rows)
        plot(model, out / f"{metric}.png",
             title=f"{METRICS[metric].label.split(' per ')[0]} roofline, {socket.gethostname()}")  # fmt: skip
        models[metric] = model.to_dict()
    sweep = sweep_points(rows)
    plot_sweep(sweep, out / "sweep.png", title=f"Server-process sweep, {socket.gethostname()}")
    combined = combined_score(models, opts.weights)
    timers["analysis"] += time.monotonic() - t_analysis
    wall = time.monotonic() - wall0
    measured = timers["measurement"]
    overhead = {
        **{f"{k}_seconds": v for k, v in timers.items()},
        "other_seconds": max(0.0, wall - sum(timers.values())),
        "wall_seconds": wall,
        "outside_fraction": (1.0 - measured / wall) if wall > 0 else None,
        "measurements": len(rows),
        "resumed_measurements": len(stored),
    }
    doc = {
        "kind": "svcframe-roofline",
        "run_id": run_id,
        "store": str(opts.store) if opts.store is not None else None,
        "options": opts.to_dict(),
        "environment": environment(),
        "hardware": hardware(),
        "software": software(),
        "server_cores": server_cores,
        "client_cores": client_cores,
        "metrics": models,
        "combined_score": combined,
        "weights": {m: float((opts.weights or {}).get(m, 1.0)) for m in models},
        "sweep": sweep,
        "runs": rows,
        "wall_seconds": wall,
        "measurement_seconds": measured,
        "overhead": overhead,
    }
    (out / "roofline.json").write_text(json.dumps(doc, indent=2))
    if store is not None and run_id is not None:
        try:
            store.finish_run(run_id, model={k: doc[k] for k in ("metrics", "sweep", "server_cores", "client_cores")},
                             summary={k: doc[k] for k in ("combined_score", "weights", "wall_seconds",
                                                          "measurement_seconds", "overhead")})  # fmt: skip
        finally:
            store.close()
    return doc


def _measure(
    opts: CollectOptions,
    config: ServiceConfig,
    todo: list[tuple[int, tuple[str, str, int, int], str]],
    rows_by_key: dict[str, dict[str, Any]],
    timers: dict[str, float],
    on_step: Callable[[str, int, int], None] | None,
    store: Any,
    run_id: int | None,
    server_cores: list[int],
    client_cores: list[int],
    pool_cls: Any,
) -> None:
    """Launch the servers and the client pool once, run every step of ``todo``, tear down."""
    out = Path(opts.out)
    n_servers = max(step[2] for _, step, _ in todo)
    n_clients = max(step[3] for _, step, _ in todo)
    t0 = time.monotonic()
    pool = pool_cls(n_clients).start()  # workers import while the servers start
    grace_seconds = 5.0
    try:
        launch = Launch(config, n_servers, cores=server_cores)
        try:
            launch.start()
            timers["launch"] += time.monotonic() - t0
            t1 = time.monotonic()
            pool.wait_ready()
            timers["client_start"] += time.monotonic() - t1
            addresses = [m.address for m in launch.members]
            for n, (index, (stage, metric, servers, clients), key) in enumerate(todo, 1):
                if on_step is not None:
                    on_step(f"{stage} {metric}: {servers} server(s) x {clients} client(s)", n, len(todo))
                depth = opts.saturation_depth if stage in ("Ps", "sweep") else 1
                params = _params(opts, metric, clients=clients, depth=depth, client_cores=client_cores)
                t_run = time.monotonic()
                result = pool.run(params, addresses[:servers])
                elapsed = result["aggregate"]["elapsed_seconds"]
                timers["measurement"] += elapsed
                timers["coordination"] += time.monotonic() - t_run - elapsed
                t_store = time.monotonic()
                name = f"{index + 1:03d}-{stage}-{metric}-s{servers}-c{clients}.json"
                save_results(result, out / "runs" / name)
                row = {
                    "stage": stage,
                    "metric": metric,
                    "servers": servers,
                    "clients": clients,
                    "value": _aggregate(metric, result) if stage in ("Ps", "sweep") else _per_client(metric, result),
                    "per_client": _per_client(metric, result),
                    "aggregate": _aggregate(metric, result),
                    "elapsed_seconds": elapsed,
                    "latency_p50_usec": result["aggregate"]["latency_usec"]["p50"],
                    "server_cpu_usec_per_op": result["aggregate"]["server_cpu_usec_per_op"],
                    "server_utilization": result["aggregate"]["server_utilization"],
                    "file": f"runs/{name}",
                }
                rows_by_key[key] = row
                if store is not None and run_id is not None:
                    store.add_sample(run_id, key, row, result)
                timers["store"] += time.monotonic() - t_store
        except BaseException:
            grace_seconds = 0.5  # interrupted or failed: do not wait for busy clients
            raise
        finally:
            t2 = time.monotonic()
            launch.stop()
            timers["teardown"] += time.monotonic() - t2
    finally:
        t3 = time.monotonic()
        pool.close(grace_seconds)
        timers["teardown"] += time.monotonic() - t3
