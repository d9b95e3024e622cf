"""``svcframe roofline collect``: measure this machine's data-service roofline with the self-test.

Method (Carns et al., papers/carns2025-data-service-roofline.txt, sections 4.2-4.3 and 5), over a node set
(``selftest/nodes.py``: ``local:K`` splits of this machine's cores, a hostfile, the Slurm or PBS allocation;
default ``local:2``, the server "node" being the first half of the usable cores). Node 0 is the server node,
nodes 1..N-1 the client nodes (:func:`plan`):

* ``Pc``, peak client rate: one client process on node j against one quiescent server process on node i,
  for every unordered pair i < j (N(N-1)/2 pairs, Figure 8 right), repeated ``repeats`` times; a min-max
  range over pairs and repeats.
* ``ramp``: the load that saturates node 0, fully populated (one server process per slot): "a server's
  maximum performance when saturated" (section 4.3). The load rises from ``clients_per_core`` client processes
  per slot of every client node with one call in flight each, the calls in flight growing 4x a step up to
  ``saturation_depth``, then the client processes doubling up to ``max_clients_per_core`` per slot
  (:func:`ramp_loads`); it stops at the first step that raises the aggregate rate by less than
  :data:`RAMP_GROWTH` (:func:`ramp_outcome`). The load of the highest rate is the saturating load.
* ``Ps``, peak server rate per server process: node 0 under the saturating load (Figure 8 left); aggregate
  rate / server processes, repeated ``repeats`` times; a min-max range. It is marked a lower bound
  (:class:`~selftest.roofline.Saturation`, :func:`ps_saturation`) when the rate was still growing at the
  largest load, or when the clients' cores were saturated and the server's were not.
* ``sweep``: the server-process sweep of Figures 9 and 10 (``selftest/sweep.py``): 1..``sweep_max_servers``
  server processes on node 0 under the saturating load; aggregate rate against server processes. Its
  point at the ``Ps`` server count is the ``Ps`` measurement itself.
* ``grid``: validation samples, every (servers, clients) pair of the grid in processes, or every
  (server nodes, client nodes) pair of fully populated nodes; rate per client process. A sample's servers
  are those that served (client i calls server i mod S: with fewer clients than servers the others idle, and
  X counts the ones that served). Each records its server and client processes per core: samples above one
  share cores, which the model (one core per process, section 4.3) does not predict; they are marked and
  scored apart (``scores["excluded"]``). A 1x1 sample on a pair of nodes ``Pc`` measured repeats ``Pc``'s
  configuration: the model keeps that ``Pc`` range beside it (the machine's repeatability).

Every ``Pc`` and ``Ps`` measurement records the CPU utilisation of its servers and of its clients (fractions of
a core: ``server_utilization``, ``client_utilization`` and ``client_core_utilization``, the clients' CPU over
the cores they ran on); a ``Pc`` whose server was saturated while its client was not is a lower bound too
(:func:`pc_saturation`).

Processes: with the ``local`` launcher, servers are forked per local node and pinned to its cores, clients
are a :class:`~selftest.pool.ClientPool`; with ``mpiexec`` or ``srun``, one launcher command per node group
starts them and they are coordinated over svcframe RPC (``selftest/remote.py``).

Metrics: RPC rate (``noop`` workload, ops/s), network bandwidth (``bulk`` of ``bulk_size`` bytes, GiB/s),
storage IOPS (``storage`` workload, ``storage_block_size`` bytes at random offsets of a file on the
server's disk, ops/s) and storage bandwidth (``storage`` with ``storage_bandwidth_block_size``, GiB/s).
Each validation sample is scored (Zhu, Neuwirth et al. eqs. 10-11), per metric and across metrics by
weighted geometric mean (eq. 12), with the model's median and worst relative error per region.

Cost: server processes are launched once per node, for the largest count the plan places there, and a
measurement uses the first ones of each node (the rest idle in their blocking selector); client processes
are started once. The run's wall time is split into measurement intervals
and everything else (``overhead`` in the document).

With a results store (``store``), the run, its plan and every sample go into the SQLite file as they
complete (``selftest/store.py``); ``collect(..., resume=RUN)`` continues an interrupted run, skipping the
measurements already stored. Ctrl-C (KeyboardInterrupt) tears servers and clients down and marks the run
``interrupted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import json
import math
import os
import platform as _platform
import secrets
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

from svcframe.config import ServiceConfig, load_config
from svcframe.launch import Launch, usable_cores
from svcframe.units import percent, quantity

from . import SELFTEST_CONFIG
from .driver import SelftestParams, environment, save_results
from .nodes import NodeSet
from .nodes import resolve as resolve_nodes
from .roofline import (
    METRICS,
    SATURATED_UTILIZATION,
    Range,
    Roofline,
    Sample,
    Saturation,
    combine_scores,
    plot,
)

ALL_METRICS = ("rpc_rate", "bandwidth", "storage_iops", "storage_bandwidth")
"""Metrics collect can measure, in the order it measures them."""

_RATE_METRICS = ("rpc_rate", "storage_iops")  # ops/s; the others are GiB/s

RAMP_GROWTH = 0.05
"""A load step of the saturation ramp that raises the aggregate rate by less than this fraction (5%) ends it: the
rate stopped growing (Carns et al. 2025, section 4.3: Ps is the rate of a saturated server)."""


@dataclass
class CollectOptions:
    """Options of one collection. Times in seconds, sizes in bytes.

    ``store`` (a results store file, ``None`` = none) keeps the run for history and resume; ``service`` and
    ``platform`` name what history compares against (default: the config's file stem, and
    ``$SLURM_CLUSTER_NAME`` or the host name). ``weights`` weigh metrics in the combined score
    (default 1 each). ``sweep_max_servers`` (default: the server node's slots) bounds the server-process
    sweep; 0 disables it.

    Nodes (``selftest/nodes.py``): ``nodes`` (``"local:K"``) or ``hostfile``, else the Slurm or PBS
    allocation, else ``local:2``; ``launcher`` is ``auto``, ``local``, ``mpiexec`` or ``srun``.
    ``grid_server_nodes`` x ``grid_client_nodes`` (node counts, fully populated: one process per slot)
    replace the process grid ``grid_servers`` x ``grid_clients`` when given. ``coordinator_host`` is the
    host the coordinator's engine binds to for remote clients (default: the address of ``interface`` on this
    node, else this host's name). ``interface`` (remote nodes only): servers listen on that network
    interface's address of their node (``tcp://*:0`` with ``engine.plumber.interfaces``), instead of their
    node name's.
    The saturation ramp (:func:`ramp_loads`): from ``clients_per_core`` client processes per client-node slot
    with one call in flight each, to ``saturation_depth`` calls in flight, then to ``max_clients_per_core``
    client processes per slot.
    """

    out: Path = Path("out/roofline")
    config: Path = SELFTEST_CONFIG
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
    nodes: str | None = None
    hostfile: Path | None = None
    launcher: str = "auto"
    grid_server_nodes: list[int] | None = None
    grid_client_nodes: list[int] | None = None
    coordinator_host: str | None = None
    clients_per_core: int = 2
    max_clients_per_core: int = 4
    interface: str | None = None

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
                if f.name in ("out", "config", "storage_dir", "store", "hostfile") and value is not None:
                    value = Path(value)
                kw[f.name] = value
        return cls(**kw)


def metric_parameters(metric: str, options: Mapping[str, Any]) -> str:
    """What the measurements of ``metric`` were, in words, for the plots' titles and the summaries: the
    workload with its bulk size and direction, or its storage block size, operation and fsync.

    Args:
        metric: one of :data:`ALL_METRICS`.
        options: the run's :meth:`CollectOptions.to_dict` (missing keys take the defaults).

    Returns:
        e.g. ``"1 MiB bulk pulls (the server reads the client's buffer)"``, ``"4 KiB writes at random
        offsets, no fsync"``.
    """
    opts = {**CollectOptions().to_dict(), **options}
    if metric == "rpc_rate":
        return "noop RPCs (no payload)"
    if metric == "bandwidth":  # collect's bandwidth runs the self-test's default direction, pull
        return f"{quantity(opts['bulk_size'], 'B')} bulk pulls (the server reads the client's buffer)"
    block = opts["storage_bandwidth_block_size"] if metric == "storage_bandwidth" else opts["storage_block_size"]
    op = opts["storage_op"]
    fsync = ("fdatasync after every write" if opts["storage_fsync"] else "no fsync") if op == "write" else "no fsync"
    return f"{quantity(block, 'B')} {op}s at random offsets, {fsync}"


def plot_title(metric: str, options: Mapping[str, Any], where: str | None = None) -> str:
    """The title of a metric's roofline plot: the metric, where it was measured, and its parameters
    (:func:`metric_parameters`) on a second line."""
    name = METRICS[metric].label.split(" per ")[0] if metric in METRICS else metric
    return f"{name} roofline{', ' + where if where else ''}\n{metric_parameters(metric, options)}"


def _params(opts: CollectOptions, metric: str, **kw: Any) -> SelftestParams:
    workload = {"rpc_rate": "noop", "bandwidth": "bulk"}.get(metric, "storage")
    block = opts.storage_bandwidth_block_size if metric == "storage_bandwidth" else opts.storage_block_size
    return SelftestParams(
        workload=workload,
        provider_id=opts.provider_id,
        duration_seconds=opts.duration_seconds,
        warmup_iterations=opts.warmup_iterations,
        bulk_size=opts.bulk_size,
        storage_op=opts.storage_op,
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


class Step(NamedTuple):
    """One measurement of the plan.

    Attributes:
        stage: ``"Pc"``, ``"ramp"``, ``"Ps"``, ``"sweep"`` or ``"grid"``.
        metric: one of :data:`ALL_METRICS`.
        servers: server processes (S).
        clients: client processes (C); the service ratio is X = S / C (section 4.2). ``Ps`` and ``sweep``
            steps run under the load the ramp found (their clients and depth are replaced when they run).
        server_nodes: node index of each server process, in the order clients are assigned to them.
        client_nodes: node index of client rank r, for each r.
        tag: what tells apart steps of equal (stage, metric, S, C): ``"n0-1"`` for the Pc pair of nodes 0
            and 1, ``"nodes1x2"`` for a grid point of 1 server node x 2 client nodes, ``"L2"`` for the third
            load of the ramp, else ``""``.
        depth: calls in flight per client process.
    """

    stage: str
    metric: str
    servers: int
    clients: int
    server_nodes: tuple[int, ...]
    client_nodes: tuple[int, ...]
    tag: str = ""
    depth: int = 1


def ramp_loads(clients: int, max_clients: int, max_depth: int) -> list[tuple[int, int]]:
    """The loads of the saturation ramp, in order: ``(client processes, calls in flight each)``.

    From ``clients`` processes with one call in flight, the calls in flight grow 4x a step up to ``max_depth``,
    then the processes double up to ``max_clients`` (each bound included once): ``ramp_loads(2, 8, 16)`` is
    ``[(2, 1), (2, 4), (2, 16), (4, 16), (8, 16)]``.
    """
    loads = []
    depth = 1
    while True:
        loads.append((clients, depth))
        if depth >= max_depth:
            break
        depth = min(depth * 4, max_depth)
    while clients < max_clients:
        clients = min(clients * 2, max_clients)
        loads.append((clients, max_depth))
    return loads


class RampOutcome(NamedTuple):
    """Where the saturation ramp of one metric stands (:func:`ramp_outcome`).

    Attributes:
        best: index (in the measured loads) of the highest aggregate rate: the saturating load.
        stopped: a load raised the rate by less than :data:`RAMP_GROWTH`: no further load is measured.
        growth: the last step's relative change of the highest rate so far (None after one load).
    """

    best: int
    stopped: bool
    growth: float | None


def ramp_outcome(rates: list[float]) -> RampOutcome:
    """The outcome of the ramp's aggregate rates so far, in load order: it stops at the first load whose rate is
    below ``(1 + RAMP_GROWTH)`` times the best before it; the best is the highest rate measured.

    Raises:
        ValueError: no rate.
    """
    if not rates:
        raise ValueError("the ramp has no measured load yet")
    best = 0
    for i in range(1, len(rates)):
        step_growth = rates[i] / rates[best] - 1.0 if rates[best] > 0 else math.inf
        if step_growth < RAMP_GROWTH:
            return RampOutcome(best if rates[best] >= rates[i] else i, True, step_growth)
        best = i
    last = rates[-1] / rates[-2] - 1.0 if len(rates) > 1 and rates[-2] > 0 else None
    return RampOutcome(best, False, last)


def _spread(count: int, nodes: list[int], capacity: dict[int, int]) -> tuple[int, ...]:
    """Node of each of ``count`` processes: round-robin over ``nodes`` while each has capacity left, then
    round-robin over all of them (oversubscribed)."""
    out: list[int] = []
    left = {j: capacity[j] for j in nodes}
    while len(out) < count and any(left.values()):
        for j in nodes:
            if left[j] > 0 and len(out) < count:
                out.append(j)
                left[j] -= 1
    while len(out) < count:
        out.append(nodes[len(out) % len(nodes)])
    return tuple(out)


def node_set_of(opts: CollectOptions, *, check_launcher: bool = False) -> NodeSet:
    """The node set of ``opts`` (``selftest.nodes.resolve``). Raises NodeError."""
    return resolve_nodes(opts.nodes, opts.hostfile, opts.launcher, check_launcher=check_launcher)


def plan(opts: CollectOptions, node_set: NodeSet | None = None) -> list[Step]:
    """Every measurement, in the order they run (Carns et al. sections 4.3 and 5, over N nodes).

    Per metric, node 0 being the server node and nodes 1..N-1 the client nodes:

    * ``Pc``: for each of ``repeats`` rounds, every unordered pair of nodes (i, j), i < j (N(N-1)/2
      pairs): one client process on node j against one quiescent server process on node i.
    * ``ramp``: node 0 fully populated (one server process per slot) under each load of :func:`ramp_loads`,
      from ``clients_per_core`` client processes per slot of every client node (at least 2 in all) to
      ``max_clients_per_core``; the loads after the rate stopped growing are skipped when they come.
    * ``Ps`` (``repeats`` samples): node 0 fully populated, under the ramp's saturating load.
    * ``sweep``: 1..``sweep_max_servers`` server processes on node 0 (Figures 9 and 10), under the same load;
      the Ps server count itself is not repeated (its point is the Ps samples).
    * ``grid``: validation samples. ``grid_servers`` x ``grid_clients`` processes (servers on node 0,
      clients round-robin over the client nodes), or, when given, ``grid_server_nodes`` x
      ``grid_client_nodes`` fully populated nodes (servers from node 0 up, clients from node N-1 down,
      s + c <= N).

    Raises:
        ValueError: an unknown metric, or a node grid no point of which fits the N nodes.
        NodeError: the node set cannot be resolved (``node_set`` not given).
    """
    unknown = [m for m in opts.metrics if m not in ALL_METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; choose from {list(ALL_METRICS)}")
    ns = node_set if node_set is not None else node_set_of(opts)
    n = len(ns)
    slots = [node.slots for node in ns.nodes]
    client_node_ids = list(range(1, n))
    capacity = {j: opts.clients_per_core * slots[j] for j in client_node_ids}
    n_sat_servers = slots[0]
    n_sat_clients = max(2, sum(capacity.values()))
    sat_clients = _spread(n_sat_clients, client_node_ids, capacity)
    most_clients = max(n_sat_clients, opts.max_clients_per_core * sum(slots[j] for j in client_node_ids))
    ramp = [(c, d, _spread(c, client_node_ids, capacity))
            for c, d in ramp_loads(n_sat_clients, most_clients, opts.saturation_depth)]  # fmt: skip
    n_sweep = n_sat_servers if opts.sweep_max_servers is None else opts.sweep_max_servers
    grid: list[tuple[int, int, tuple[int, ...], tuple[int, ...], str]] = []
    if opts.grid_server_nodes or opts.grid_client_nodes:
        for s_nodes in opts.grid_server_nodes or [1]:
            for c_nodes in opts.grid_client_nodes or [1]:
                if s_nodes < 1 or c_nodes < 1 or s_nodes + c_nodes > n:
                    continue
                srv = tuple(i for i in range(s_nodes) for _ in range(slots[i]))
                cli = tuple(j for j in range(n - c_nodes, n) for _ in range(slots[j]))
                grid.append((len(srv), len(cli), srv, cli, f"nodes{s_nodes}x{c_nodes}"))
        if not grid:
            raise ValueError(f"no grid point of {opts.grid_server_nodes} server nodes x {opts.grid_client_nodes} "
                             f"client nodes fits {n} nodes (server nodes + client nodes <= {n})")  # fmt: skip
    else:
        for s in opts.grid_servers:
            for c in opts.grid_clients:
                grid.append((s, c, (0,) * s, _spread(c, client_node_ids, capacity), ""))
    steps: list[Step] = []
    for metric in opts.metrics:
        for _ in range(opts.repeats):
            steps += [Step("Pc", metric, 1, 1, (i,), (j,), f"n{i}-{j}") for i, j in ns.pairs]
        steps += [Step("ramp", metric, n_sat_servers, c, (0,) * n_sat_servers, cli, f"L{i}", d)
                  for i, (c, d, cli) in enumerate(ramp)]  # fmt: skip
        steps += [Step("Ps", metric, n_sat_servers, n_sat_clients, (0,) * n_sat_servers, sat_clients,
                       depth=opts.saturation_depth)] * opts.repeats  # fmt: skip
        steps += [Step("sweep", metric, k, n_sat_clients, (0,) * k, sat_clients, depth=opts.saturation_depth)
                  for k in range(1, n_sweep + 1) if k != n_sat_servers]  # fmt: skip
        steps += [Step("grid", metric, s, c, srv, cli, tag) for s, c, srv, cli, tag in grid]
    return steps


def step_keys(steps: list[Step]) -> list[str]:
    """A key per step, unique within the plan: ``"stage/metric/sS/cC[/tag]#k"`` (k counts repeats)."""
    seen: dict[str, int] = {}
    keys = []
    for step in steps:
        base = f"{step.stage}/{step.metric}/s{step.servers}/c{step.clients}" + (f"/{step.tag}" if step.tag else "")
        k = seen.get(base, 0)
        seen[base] = k + 1
        keys.append(f"{base}#{k}")
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


def _mean(values: list[float | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _busy(used: float | None, wanted: float | None) -> float | None:
    """How much of its cores a side took up: what it wanted (ran or waited for) where the kernel tells, else
    what it used."""
    return wanted if wanted is not None else used


def _used(side: str, used: float | None, wanted: float | None) -> str:
    """``"the server used 35% of its core"``, and what it wanted when it waited for its core (others had it):
    ``"the server used 15% of its core, wanting 85%"``."""
    text = f"the {side} used {percent(used)} of {'its core' if side in ('server', 'client') else 'their cores'}"
    if used is not None and wanted is not None and wanted - used >= 0.05:
        text += f", wanting {percent(wanted)}"
    return text


def pc_saturation(rows: list[dict[str, Any]]) -> Saturation | None:
    """Whether ``Pc`` (its rows) is the rate of a client against a quiescent server (Carns et al. 2025, section
    4.3), from the CPU recorded with each measurement: a lower bound when the server wanted at least
    :data:`~selftest.roofline.SATURATED_UTILIZATION` of its core (ran or waited for it) while the client wanted
    less of its own: the server, not the client, set the rate. None when the rows recorded no utilisation (a run
    of an older version)."""
    server = _mean([r.get("server_utilization") for r in rows])
    client = _mean([r.get("client_utilization") for r in rows])
    if server is None or client is None:
        return None
    server_demand = _mean([r.get("server_demand") for r in rows])
    client_demand = _mean([r.get("client_core_demand") for r in rows])
    waiting = [w for r in rows for w in (r.get("server_waiting"), r.get("client_waiting")) if w is not None]
    contention = max(waiting) if waiting else None
    used = f"{_used('client', client, client_demand)}, {_used('server', server, server_demand)}"
    figures = (server, client, server_demand, client_demand, contention)
    if (_busy(server, server_demand) or 0.0) >= SATURATED_UTILIZATION > (_busy(client, client_demand) or 0.0):
        return Saturation(True, f"{used}: the server, not the client, set the rate", *figures)
    return Saturation(False, f"{used}: the server had CPU to spare, the client's round trip set the rate", *figures)


def ps_saturation(ps_rows: list[dict[str, Any]], ramp_rows: list[dict[str, Any]]) -> Saturation | None:
    """Whether ``Ps`` (its rows) is the rate of a saturated server (Carns et al. 2025, section 4.3), from the
    load ramp (its rows, in load order) and the CPU recorded with each measurement.

    Saturated: the ramp's rate stopped growing (a load step raised it by less than :data:`RAMP_GROWTH`), and
    either the server took up at least :data:`~selftest.roofline.SATURATED_UTILIZATION` of its core (wanted it:
    ran, or waited for it) or the clients left theirs to spare (then the server side, its CPU, disk or network,
    set the rate). A lower bound otherwise: the rate still grew at the largest load tried, or the clients took up
    their cores while the server did not (the clients set the rate). None when nothing was recorded (a run of an
    older version).
    """
    server = _mean([r.get("server_utilization") for r in ps_rows])
    client = _mean([r.get("client_core_utilization") for r in ps_rows])
    rates = [float(r["aggregate"]) for r in ramp_rows]
    if server is None or client is None or not rates:
        return None
    server_demand = _mean([r.get("server_demand") for r in ps_rows])
    client_demand = _mean([r.get("client_core_demand") for r in ps_rows])
    waiting = [r["server_waiting"] for r in ps_rows if r.get("server_waiting") is not None]
    figures = (server, client, server_demand, client_demand, max(waiting) if waiting else None)
    outcome = ramp_outcome(rates)
    best = ramp_rows[outcome.best]
    ramp = tuple({"clients": int(r["clients"]), "depth": int(r.get("depth") or 1), "rate": float(r["aggregate"])}
                 for r in ramp_rows)  # fmt: skip
    load = f"{best['clients']} client processes x {best.get('depth') or 1} calls in flight"
    used = f"{_used('server', server, server_demand)}, {_used('clients', client, client_demand)}"
    if not outcome.stopped:
        grew = f" (+{outcome.growth:.0%} at the last step)" if outcome.growth is not None else ""
        return Saturation(True, f"its rate still grew at the largest load tried, {load}{grew}; {used}", *figures,
                          ramp)  # fmt: skip
    if (_busy(client, client_demand) or 0.0) >= SATURATED_UTILIZATION > (_busy(server, server_demand) or 0.0):
        return Saturation(True, f"{used} at {load}: the clients, not the server, set the rate", *figures, ramp)
    return Saturation(False, f"the rate stopped growing at {load} ({outcome.growth:+.0%} at the next load); {used}",
                      *figures, ramp)  # fmt: skip


def _model(metric: str, rows: dict[str, list[dict[str, Any]]]) -> Roofline:
    pc = Range.of(r["per_client"] for r in rows["Pc"])
    ps = Range.of(r["aggregate"] / (r.get("servers_serving") or r["servers"]) for r in rows["Ps"])
    pc_by_pair: dict[tuple[int, int], list[float]] = {}
    for r in rows["Pc"]:
        pair = (r["server_nodes"][0], r["client_nodes"][0]) if r.get("server_nodes") and r.get("client_nodes") else None
        if pair is not None:
            pc_by_pair.setdefault(pair, []).append(float(r["per_client"]))
    samples = []
    for r in rows["grid"]:
        serving = int(r.get("servers_serving") or r["servers"])
        same = None  # one client, one server (the first of node 0's), its client alone on a node Pc measured
        if serving == 1 and r["clients"] == 1 and r.get("client_nodes") and len(r["client_nodes"]) == 1:
            measured = pc_by_pair.get((0, r["client_nodes"][0]))
            same = Range.of(measured) if measured else None
        samples.append(Sample(serving, r["clients"], r["per_client"], r.get("server_processes_per_core"),
                              r.get("client_processes_per_core"), same))  # fmt: skip
    return Roofline(METRICS[metric], pc, ps, samples, pc_saturation(rows["Pc"]),
                    ps_saturation(rows["Ps"], rows["ramp"]))  # fmt: skip


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
             "server_cores", "client_cores", "nodes": {NodeSet.to_dict(), "processes"}, "pc_pairs",
             "metrics": {name: Roofline.to_dict()}, "combined_score",
             "sweep": {metric: [points]}, "runs": [rows], "wall_seconds", "measurement_seconds",
             "overhead": {...}, "load_average": 1-minute load average as the run began (other processes')}

    Raises:
        LaunchError / SelftestError: a server or client failed (the message says which and why); the
            run is marked ``failed`` in the store.
        StoreError: ``resume`` names no run, or a run whose plan differs from this machine's.
        NodeError: the node set or launcher cannot be used (``selftest/nodes.py``).
        KeyboardInterrupt: after tearing everything down and marking the run ``interrupted``.
    """
    from .store import ResultsStore, StoreError

    wall0 = time.monotonic()
    # other processes' load, read before this run starts any: at the end the 1-minute average counts the run's
    # own servers and clients (the demo on an idle 2-core machine ended at 4.8 and blamed "other processes")
    load_before = os.getloadavg()[0]
    timers = dict.fromkeys(("launch", "client_start", "coordination", "measurement", "store", "analysis",
                            "teardown"), 0.0)  # fmt: skip
    config = _service_config(opts)
    out = Path(opts.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    node_set = node_set_of(opts, check_launcher=True)
    server_cores = list(node_set.nodes[0].cores or [])
    client_cores = [c for node in node_set.nodes[1:] for c in (node.cores or [])]
    steps = plan(opts, node_set)
    keys = step_keys(steps)
    processes: dict[str, Any] = {}
    unwritten: list[str] = []  # files that could not be written (their measurements are kept all the same)
    store = ResultsStore(opts.store) if opts.store is not None else None
    run_id: int | None = None
    stored: dict[str, dict[str, Any]] = {}
    try:
        if store is not None and resume is not None:
            run_id = store.resolve(resume)
            previous = store.run(run_id)
            if previous["plan"] != keys:
                raise StoreError(
                    f"run {run_id} planned {len(previous['plan'])} measurements, these nodes and options plan "
                    f"{len(keys)} others; resume it with its own options on the same nodes"
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
                nodes=node_set.to_dict(),
            )
        todo = [(i, step, key) for i, (step, key) in enumerate(zip(steps, keys, strict=True)) if key not in stored]
        rows_by_key: dict[str, dict[str, Any]] = {k: {kk: v for kk, v in s.items() if kk not in ("id", "key", "created")}
                                                  for k, s in stored.items()}  # fmt: skip
        if todo:
            ramps: dict[str, list[tuple[Step, str]]] = {}
            for step, key in zip(steps, keys, strict=True):
                if step.stage == "ramp":
                    ramps.setdefault(step.metric, []).append((step, key))
            measure = _measure_local if node_set.launcher == "local" else _measure_remote
            measure(
                opts, config, node_set, todo, rows_by_key, timers, on_step, store, run_id, processes, ramps, unwritten
            )
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
    rows = [rows_by_key[k] for k in keys if k in rows_by_key]  # ramp loads past the saturating one were skipped
    from .sweep import plot_sweep, sweep_points

    by_metric: dict[str, dict[str, list[dict[str, Any]]]] = {
        m: {"Pc": [], "ramp": [], "Ps": [], "sweep": [], "grid": []} for m in opts.metrics
    }
    for r in rows:
        by_metric[r["metric"]][r["stage"]].append(r)
    models: dict[str, Any] = {}
    names = [node.name for node in node_set.nodes]
    where = (socket.gethostname() if node_set.source == "local"
             else f"{', '.join(names)} ({node_set.source.split(':')[0]})" if len(names) <= 4
             else f"{len(names)} nodes ({node_set.source.split(':')[0]})")  # fmt: skip
    for metric, metric_rows in by_metric.items():
        model = _model(metric, metric_rows)
        png = out / f"{metric}.png"
        _keep_going(functools.partial(plot, model, png, title=plot_title(metric, opts.to_dict(), where)), png,
                    unwritten)  # fmt: skip
        models[metric] = model.to_dict()
    sweep = sweep_points(rows)
    _keep_going(lambda: plot_sweep(sweep, out / "sweep.png", title=f"Server-process sweep, {where}",
                                   parameters={m: metric_parameters(m, opts.to_dict()) for m in sweep}),
                out / "sweep.png", unwritten)  # fmt: skip
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
        "nodes": {**node_set.to_dict(), "processes": processes},
        "pc_pairs": sorted({r["tag"] for r in rows if r["stage"] == "Pc" and r.get("tag")}),
        "metrics": models,
        "combined_score": combined,
        "weights": {m: float((opts.weights or {}).get(m, 1.0)) for m in models},
        "sweep": sweep,
        "runs": rows,
        "wall_seconds": wall,
        "measurement_seconds": measured,
        "overhead": overhead,
        "load_average": load_before,  # other processes on the cores make rates vary between repeats
    }
    text = json.dumps(doc, indent=2)
    _keep_going(lambda: (out / "roofline.json").write_text(text), out / "roofline.json", unwritten)
    if unwritten:  # the model is not lost with its file: kept in the temporary directory
        doc["unwritten"] = unwritten
        with contextlib.suppress(OSError):
            fd, kept = tempfile.mkstemp(prefix="svcframe-roofline-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            doc["kept"] = kept
    if store is not None and run_id is not None:
        try:
            store.finish_run(run_id, model={k: doc[k] for k in ("metrics", "sweep", "server_cores", "client_cores",
                                                                "nodes", "pc_pairs")},
                             summary={k: doc[k] for k in ("combined_score", "weights", "wall_seconds",
                                                          "measurement_seconds", "overhead",
                                                          "load_average")})  # fmt: skip
        finally:
            store.close()
    return doc


def processes_per_core(placement: tuple[int, ...], slots: list[int]) -> float:
    """Processes per usable core on the busiest node of ``placement`` (the node index of each process),
    ``slots[j]`` being node j's usable cores: above 1, processes share cores, which the roofline model does
    not predict (:attr:`selftest.roofline.Sample.oversubscribed`)."""
    counts: dict[int, int] = {}
    for j in placement:
        counts[j] = counts.get(j, 0) + 1
    return max(n / slots[j] for j, n in counts.items())


def client_cores_used(placement: tuple[int, ...], slots: list[int]) -> int:
    """The cores client processes placed so (the node index of each) ran on: per node, one each up to its
    slots (they share the node's cores beyond)."""
    counts: dict[int, int] = {}
    for j in placement:
        counts[j] = counts.get(j, 0) + 1
    return sum(min(n, slots[j]) for j, n in counts.items())


def _row(
    opts: CollectOptions, step: Step, index: int, result: dict[str, Any], slots: list[int]
) -> tuple[str, dict[str, Any]]:
    stage, metric, servers, clients = step.stage, step.metric, step.servers, step.clients
    name = f"{index + 1:03d}-{stage}-{metric}-s{servers}-c{clients}" + (f"-{step.tag}" if step.tag else "") + ".json"
    agg = result["aggregate"]
    serving_nodes = step.server_nodes[: min(servers, clients)]  # client i calls server i mod S
    elapsed = agg["elapsed_seconds"]
    cores = client_cores_used(step.client_nodes, slots)
    run, wait = agg.get("client_run_seconds"), agg.get("client_runqueue_wait_seconds")
    wanted = run + wait if run is not None and wait is not None else None  # the core time the clients wanted
    row = {
        "stage": stage,
        "metric": metric,
        "servers": servers,
        "clients": clients,
        "depth": step.depth,
        "tag": step.tag,
        "server_nodes": sorted(set(step.server_nodes)),
        "client_nodes": sorted(set(step.client_nodes)),
        "servers_serving": int(agg.get("servers_serving", len(serving_nodes))),
        "server_processes_per_core": processes_per_core(serving_nodes, slots),
        "client_processes_per_core": processes_per_core(step.client_nodes, slots),
        "value": _aggregate(metric, result) if stage in ("Ps", "sweep", "ramp") else _per_client(metric, result),
        "per_client": _per_client(metric, result),
        "aggregate": _aggregate(metric, result),
        "elapsed_seconds": elapsed,
        "latency_p50_usec": agg["latency_usec"]["p50"],
        "server_cpu_usec_per_op": agg["server_cpu_usec_per_op"],
        "server_utilization": agg["server_utilization"],
        "server_demand": agg.get("server_demand"),
        "server_waiting": _waiting(agg.get("server_run_seconds"), agg.get("server_runqueue_wait_seconds")),
        "client_utilization": agg.get("client_utilization"),
        "client_core_utilization": _per_core(agg["client_cpu_seconds"], elapsed, cores),
        "client_core_demand": _per_core(wanted, elapsed, cores),
        "client_waiting": _waiting(agg.get("client_run_seconds"), agg.get("client_runqueue_wait_seconds")),
        "file": f"runs/{name}",
    }
    return name, row


def _per_core(seconds: float | None, elapsed: float, cores: int) -> float | None:
    """Seconds of CPU over ``elapsed`` seconds, as a fraction of ``cores`` cores."""
    return seconds / elapsed / cores if seconds is not None and elapsed > 0 and cores else None


def _waiting(run: float | None, wait: float | None) -> float | None:
    """The fraction of the time processes were ready to run that they waited for a core."""
    if run is None or wait is None or run + wait <= 0:
        return None
    return wait / (run + wait)


def _ramp_rates(ramp: list[tuple[Step, str]], rows_by_key: dict[str, dict[str, Any]]) -> list[float]:
    """The aggregate rates the ramp measured, in load order, up to its first load not measured."""
    rates = []
    for _, key in ramp:
        row = rows_by_key.get(key)
        if row is None:
            break
        rates.append(float(row["aggregate"]))
    return rates


def _under_load(step: Step, ramp: list[tuple[Step, str]], rows_by_key: dict[str, dict[str, Any]]) -> Step:
    """``step`` (a ``Ps`` or ``sweep`` step) under the ramp's saturating load: its client processes, their
    nodes and calls in flight; as planned when the ramp measured nothing (a run of an older version)."""
    rates = _ramp_rates(ramp, rows_by_key)
    if not rates:
        return step
    best = ramp[ramp_outcome(rates).best][0]
    return step._replace(clients=best.clients, client_nodes=best.client_nodes, depth=best.depth)


def _sizing(todo: list[tuple[int, Step, str]], ramps: dict[str, list[tuple[Step, str]]]) -> list[tuple[int, Step, str]]:
    """The steps processes are started for: ``todo``, and the ramp of every metric whose ``Ps`` or sweep is in it
    (those run under one of the ramp's loads, measured now or before an interruption)."""
    metrics = {step.metric for _, step, _ in todo if step.stage in ("Ps", "sweep")}
    return todo + [(-1, step, key) for metric in sorted(metrics) for step, key in ramps.get(metric, [])]


def _needed(todo: list[tuple[int, Step, str]], attr: str) -> dict[int, int]:
    """Processes to start per node: the most any step of ``todo`` places there (servers or clients)."""
    need: dict[int, int] = {}
    for _, step, _ in todo:
        counts: dict[int, int] = {}
        for j in getattr(step, attr):
            counts[j] = counts.get(j, 0) + 1
        for j, k in counts.items():
            need[j] = max(need.get(j, 0), k)
    return need


def _run_steps(
    opts: CollectOptions,
    todo: list[tuple[int, Step, str]],
    addresses: dict[int, list[str]],
    run_one: Callable[[SelftestParams, list[str], Step], dict[str, Any]],
    node_set: NodeSet,
    rows_by_key: dict[str, dict[str, Any]],
    timers: dict[str, float],
    on_step: Callable[[str, int, int], None] | None,
    store: Any,
    run_id: int | None,
    ramps: dict[str, list[tuple[Step, str]]],
    unwritten: list[str],
) -> None:
    """Every step of ``todo``: its servers (the first k launched on each of its server nodes), one run,
    the row stored at once. A ramp load after the rate stopped growing is skipped; ``Ps`` and sweep steps run
    under the ramp's saturating load (``ramps``: each metric's ramp steps and keys, in load order). Measurement
    intervals go to ``timers["measurement"]``."""
    out = Path(opts.out)
    for n, (index, planned, key) in enumerate(todo, 1):
        step = planned
        if step.stage == "ramp":
            earlier = _ramp_rates(ramps[step.metric][: int(step.tag[1:])], rows_by_key)
            if earlier and ramp_outcome(earlier).stopped:
                continue  # the rate stopped growing at a lower load
        elif step.stage in ("Ps", "sweep"):
            step = _under_load(step, ramps.get(step.metric, []), rows_by_key)
        if on_step is not None:
            where = f" (nodes {step.tag[1:]})" if step.stage == "Pc" and len(node_set) > 2 else ""
            load = f", depth {step.depth}" if step.stage in ("ramp", "Ps", "sweep") else ""
            repeat = f", sample {int(key.rpartition('#')[2]) + 1}" if step.stage != "ramp" else ""
            of = f", load {int(step.tag[1:]) + 1} of {len(ramps[step.metric])}" if step.stage == "ramp" else ""
            on_step(f"{step.stage} {step.metric}: {step.servers} server(s) x {step.clients} client(s){load}{where}"
                    f"{of}{repeat}", n, len(todo))  # fmt: skip
        taken: dict[int, int] = {}
        servers = []
        for i in step.server_nodes:
            servers.append(addresses[i][taken.get(i, 0)])
            taken[i] = taken.get(i, 0) + 1
        params = _params(opts, step.metric, clients=step.clients, depth=step.depth)
        t_run = time.monotonic()
        result = run_one(params, servers, step)
        elapsed = result["aggregate"]["elapsed_seconds"]
        timers["measurement"] += elapsed
        timers["coordination"] += time.monotonic() - t_run - elapsed
        t_store = time.monotonic()
        name, row = _row(opts, step, index, result, [node.slots for node in node_set.nodes])
        rows_by_key[key] = row
        if store is not None and run_id is not None:
            store.add_sample(run_id, key, row, result)
        raw = out / "runs" / name
        _keep_going(functools.partial(save_results, result, raw), raw, unwritten)
        timers["store"] += time.monotonic() - t_store


def _keep_going(write: Callable[[], object], path: Path, unwritten: list[str]) -> None:
    """``write()`` (which writes ``path``); a failure (the disk filled, the directory went away) is noted in
    ``unwritten`` and the run goes on: its measurements are in the store and in the model document."""
    try:
        write()
    except OSError as exc:
        unwritten.append(f"{path}: {exc.strerror or exc}")


def _measure_local(
    opts: CollectOptions,
    config: ServiceConfig,
    node_set: NodeSet,
    todo: list[tuple[int, Step, str]],
    rows_by_key: dict[str, dict[str, Any]],
    timers: dict[str, float],
    on_step: Callable[[str, int, int], None] | None,
    store: Any,
    run_id: int | None,
    processes: dict[str, Any],
    ramps: dict[str, list[tuple[Step, str]]],
    unwritten: list[str],
) -> None:
    """Local nodes: server processes per node forked by :class:`~svcframe.launch.Launch` (pinned to the
    node's cores), client processes from one :class:`~selftest.pool.ClientPool`, each run pinning client
    rank r to a core of node ``step.client_nodes[r]``. Everything is launched once, torn down at the end."""
    from .pool import ClientPool

    servers_needed = _needed(_sizing(todo, ramps), "server_nodes")
    n_clients = max(step.clients for _, step, _ in _sizing(todo, ramps))
    t0 = time.monotonic()
    pool = ClientPool(n_clients).start()  # workers import while the servers start
    grace_seconds = 5.0
    launches: dict[int, Launch] = {}
    try:
        try:
            for i, count in sorted(servers_needed.items()):
                launches[i] = Launch(config, count, cores=list(node_set.nodes[i].cores or []) or None)
                launches[i].start()
            timers["launch"] += time.monotonic() - t0
            t1 = time.monotonic()
            pool.wait_ready()
            timers["client_start"] += time.monotonic() - t1
            processes["servers"] = [{"node": node_set.nodes[i].name, "servers": len(job.members), "launcher": "local"}
                                    for i, job in launches.items()]  # fmt: skip
            processes["clients"] = [{"node": "(any local node, pinned per run)", "clients": n_clients,
                                     "launcher": "local"}]  # fmt: skip
            addresses = {i: [m.address for m in job.members] for i, job in launches.items()}

            def run_one(params: SelftestParams, servers: list[str], step: Step) -> dict[str, Any]:
                placed: dict[int, int] = {}
                cores = []
                for j in step.client_nodes:
                    node_cores = node_set.nodes[j].cores or ()
                    k = placed.get(j, 0)
                    placed[j] = k + 1
                    if node_cores:
                        cores.append(node_cores[k % len(node_cores)])
                params.client_cores = cores or None
                return pool.run(params, servers)

            _run_steps(
                opts, todo, addresses, run_one, node_set, rows_by_key, timers, on_step, store, run_id, ramps, unwritten
            )
        except BaseException:
            grace_seconds = 0.5  # interrupted or failed: do not wait for busy clients
            raise
        finally:
            t2 = time.monotonic()
            for job in launches.values():
                job.stop()
            timers["teardown"] += time.monotonic() - t2
    finally:
        t3 = time.monotonic()
        pool.close(grace_seconds)
        timers["teardown"] += time.monotonic() - t3


def _measure_remote(
    opts: CollectOptions,
    config: ServiceConfig,
    node_set: NodeSet,
    todo: list[tuple[int, Step, str]],
    rows_by_key: dict[str, dict[str, Any]],
    timers: dict[str, float],
    on_step: Callable[[str, int, int], None] | None,
    store: Any,
    run_id: int | None,
    processes: dict[str, Any],
    ramps: dict[str, list[tuple[Step, str]]],
    unwritten: list[str],
) -> None:
    """Nodes reached through ``srun`` or ``mpiexec`` (``selftest/remote.py``): one launcher command per node
    for its server processes (a group file each, published after a barrier) and one per client node for
    its client processes (they dial this process's coordinator engine and register). Everything is
    launched once; teardown ends the clients, shuts the servers down over admin RPC and waits for the
    launchers.

    The output directory must be on a filesystem every node sees (configs and group files)."""
    from .nodes import mpiexec_flavour
    from .remote import Coordinator, RemoteClientPool, ServerGroup

    workdir = Path(opts.out).resolve() / "launch"
    workdir.mkdir(parents=True, exist_ok=True)
    flavour = mpiexec_flavour(node_set.launcher_path or "mpiexec") if node_set.launcher == "mpiexec" else "hydra"
    saved_secret = os.environ.get("SVCFRAME_SECRET")
    if not saved_secret:  # servers on other nodes listen on non-loopback addresses: they need a shared secret
        os.environ["SVCFRAME_SECRET"] = secrets.token_hex(32)
    coordinator_host = check_addresses(node_set, opts.coordinator_host, opts.interface)
    t0 = time.monotonic()
    coordinator = Coordinator(coordinator_host)
    groups: list[ServerGroup] = []
    pool: RemoteClientPool | None = None
    grace_seconds = 5.0
    try:
        coordinator.start()
        for i, count in sorted(_needed(_sizing(todo, ramps), "server_nodes").items()):
            groups.append(ServerGroup(node_set, i, count, config, workdir, flavour=flavour, interface=opts.interface,
                                      multi_node=spans_hosts(node_set)))  # fmt: skip
            groups[-1].start()
        pool = RemoteClientPool(coordinator, node_set, _needed(_sizing(todo, ramps), "client_nodes"), workdir,
                                flavour=flavour)  # fmt: skip
        pool.start()  # client processes start while the servers do

        async def servers_ready() -> None:
            await asyncio.gather(*(g.wait_ready(coordinator.engine) for g in groups))

        coordinator.run(servers_ready())
        timers["launch"] += time.monotonic() - t0
        t1 = time.monotonic()
        pool.wait_ready()
        timers["client_start"] += time.monotonic() - t1
        processes["servers"] = [g.publication for g in groups]
        processes["clients"] = _client_summary(node_set, pool.clients)
        addresses = {g.index: [m.address for m in g.members] for g in groups}
        remote_pool = pool

        def run_one(params: SelftestParams, servers: list[str], step: Step) -> dict[str, Any]:
            return remote_pool.run(params, servers, client_nodes=step.client_nodes)

        _run_steps(
            opts, todo, addresses, run_one, node_set, rows_by_key, timers, on_step, store, run_id, ramps, unwritten
        )
    except BaseException:
        grace_seconds = 0.5
        raise
    finally:
        t2 = time.monotonic()
        try:
            if pool is not None:
                pool.close(grace_seconds)
            if coordinator.runner is not None:

                async def shutdown() -> None:
                    await asyncio.gather(*(g.shutdown(coordinator.engine) for g in groups))

                with contextlib.suppress(Exception):
                    coordinator.run(shutdown())
            for g in groups:
                g.stop(10.0 if grace_seconds > 1 else 2.0)
        finally:
            coordinator.close()
            if not saved_secret:
                os.environ.pop("SVCFRAME_SECRET", None)
            timers["teardown"] += time.monotonic() - t2


def check_addresses(node_set: NodeSet, coordinator_host: str | None, interface: str | None) -> str:
    """Before anything starts on other nodes: the host the coordinator binds (returned), checked to be one
    the nodes can reach, and each node's name checked to resolve here (servers listen on it without
    ``interface``).

    Raises:
        NodeError: a name that does not resolve, an interface this node does not have, or a coordinator
            host that resolves to a loopback address while the nodes are other hosts (Debian's ``127.0.1.1
            <hostname>`` line); each with the option that fixes it.
    """
    from svcframe.ranks import address_problem

    from .nodes import NodeError

    if coordinator_host is None and interface is not None:
        coordinator_host = interface_address(interface)
    host = coordinator_host or socket.gethostname()
    how = "--coordinator-host ADDRESS or --interface NAME (e.g. ib0, eth0)"
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as exc:
        raise NodeError(f"this node's name {host!r} does not resolve ({exc}): the client processes could not dial "
                        f"the coordinator; give {how}") from None  # fmt: skip
    if spans_hosts(node_set):
        problem = address_problem(f"tcp://{host}:0")
        if problem is not None:
            raise NodeError(f"the coordinator would listen on {problem}; processes on the other nodes could not "
                            f"reach it: give {how}")  # fmt: skip
    if interface is None:
        for node in node_set.nodes:
            try:
                socket.getaddrinfo(node.host, None)
            except (OSError, UnicodeError) as exc:
                raise NodeError(f"node {node.name} ({node_set.source}): its name {node.host!r} does not resolve here "
                                f"({exc}); servers listen on their node's name: give --interface NAME to have "
                                "them listen on that interface's address instead") from None  # fmt: skip
    return host


def spans_hosts(node_set: NodeSet) -> bool:
    """Do the nodes include hosts other than this one (not all named by this host's name or loopback)?"""
    here = {socket.gethostname(), "localhost", "127.0.0.1"}
    return any(node.host not in here for node in node_set.nodes)


def interface_address(interface: str) -> str:
    """The IPv4 address (else IPv6) of a network interface of this node.

    Raises:
        NodeError: no such interface, or it has no IP address.
    """
    import psutil

    from .nodes import NodeError

    addresses = psutil.net_if_addrs()
    if interface not in addresses:
        raise NodeError(f"--interface {interface}: this node has no such interface (it has "
                        f"{', '.join(sorted(addresses))})")  # fmt: skip
    for family in (socket.AF_INET, socket.AF_INET6):
        for a in addresses[interface]:
            if a.family == family:
                return a.address.split("%", 1)[0]
    raise NodeError(f"--interface {interface}: the interface has no IP address on this node")


def _client_summary(node_set: NodeSet, clients: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per client node: how many processes registered, the rank sources their launcher's environment gave
    (``"pmi"`` for MPICH, ``"slurm"``/``"pmix"`` for srun...), their ranks and job size."""
    out = []
    for j in sorted({int(c["node"]) for c in clients}):
        mine = [c for c in clients if int(c["node"]) == j]
        out.append({"node": node_set.nodes[j].name, "clients": len(mine), "sources": sorted({c["source"] for c in mine}),
                    "ranks": sorted(int(c["rank"]) for c in mine), "size": max(int(c["size"]) for c in mine),
                    "hosts": sorted({c["host"] for c in mine})})  # fmt: skip
    return out
