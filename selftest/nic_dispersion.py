"""NIC dispersion: the shape of the paper's Figure 2 experiment (Carns et al. 2025, section 4.1.1).

The paper: 8 servers on one Aurora node, each bound to a core and a distinct NIC; 16 client processes on a
second node under three CPU-binding scenarios (one core per process, two cores per process, unbound),
each issuing 4 MiB RDMA transfers; aggregate bandwidth with the cpuset-based NIC choice (Mercury's default)
against an even mapping. The cpuset choice overloads four NICs when each process holds two cores, and
puts every process on one NIC when none is bound.

Here, on whatever NICs the topology has (``run_dispersion``):

* one server process per candidate NIC, listening on that NIC's address, pinned to a core (round robin
  over the usable cores);
* for each scenario and NIC policy (default ``byset``, the cpuset rule, against ``roundrobin``) the
  plumber chooses a NIC for each of the ``clients`` processes from the placement the scenario gives it
  (``scenario_placements``). The choice runs in this driver on each client's behalf, with a fresh
  round-robin control directory per run: the same function and the same control files as in a client,
  so the mapping is the one those processes would make (the shared self-test driver's client processes
  do not run the plumber themselves);
* client *i* then runs the ``bulk`` workload against the server on its chosen NIC (on one host, the
  server's NIC is the only link a client's traffic can be attributed to), through the self-test driver
  (``run_selftest``), and the aggregate bandwidth of each run is reported and drawn as a bar chart.

With one NIC every scenario and policy maps every client to it: the run still happens and says so.
``servers`` (``--server NIC=ADDRESS``) uses servers already running, one per NIC (for example launched in
another network namespace with ``tcp://*:0`` and round robin), instead of launching them here.
``loopback_aliases`` stands NIC *k* in by ``127.0.0.(k+2)`` (a rehearsal of a described topology, such
as the Aurora-like node, on one host): the mapping is the real one; the bandwidth is the host's.
"""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from svcframe.config import ServiceConfig, load_config
from svcframe.errors import ConfigError
from svcframe.plumber import NicChoice, Placement, select_nic
from svcframe.topology import Topology
from svcframe.units import quantity

from . import SELFTEST_CONFIG
from .driver import SelftestParams, environment, run_selftest

#: The client-binding scenarios of Figure 2, in the paper's order.
SCENARIOS = ("one-core", "two-cores", "unbound")
#: The NIC policies Figure 2 compares (any of ``svcframe.plumber.NIC_POLICIES`` may be given).
COMPARED_NIC_POLICIES = ("byset", "roundrobin")


def scenario_placements(topology: Topology, scenario: str, clients: int) -> list[Placement]:
    """Where each of ``clients`` processes runs in a Figure 2 scenario (Carns 2025 §4.1.1).

    Cores are taken in package order (package 0's cores first), as a launcher binding ranks to cores does.

    * ``one-core``: process *i* is bound to core *i* (all of its hardware threads) and runs on its first one;
    * ``two-cores``: process *i* is bound to cores *2i* and *2i+1* and runs on the first;
    * ``unbound``: every process may run anywhere (cpuset = every CPU); process *i* runs on CPU
      ``i * ncpus // clients`` (the scheduler spreading them).

    Cores wrap around when there are fewer than needed.

    Args:
        topology: the node the clients run on.
        scenario: one of ``SCENARIOS``.
        clients: number of client processes.

    Returns:
        one ``Placement`` per process, pid = rank + 1000 (seeds the ``random`` policy reproducibly).

    Raises:
        ValueError: unknown scenario.
    """
    cores = sorted(topology.cores, key=lambda c: (c.package if c.package is not None else -1, min(c.cpus)))
    if not cores:
        raise ValueError("the topology lists no cores")
    cpus = sorted(topology.cpus)
    out = []
    for i in range(clients):
        if scenario == "one-core":
            core = cores[i % len(cores)]
            out.append(Placement(core.cpus, min(core.cpus), 1000 + i))
        elif scenario == "two-cores":
            a, b = cores[(2 * i) % len(cores)], cores[(2 * i + 1) % len(cores)]
            out.append(Placement(a.cpus | b.cpus, min(a.cpus), 1000 + i))
        elif scenario == "unbound":
            out.append(Placement(frozenset(cpus), cpus[i * len(cpus) // clients], 1000 + i))
        else:
            raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    return out


def plan_choices(
    topology: Topology,
    scenario: str,
    nic_policy: str,
    clients: int,
    *,
    bucket_policy: str = "all",
    interfaces: list[str] | None = None,
) -> list[NicChoice]:
    """The plumber's choice for each client process of a scenario, in rank order, as if the processes started
    one after another on a node with no earlier round-robin selection (a fresh control directory).

    Raises:
        ConfigError: unknown policy.
    """
    with tempfile.TemporaryDirectory(prefix="svcframe-dispersion-") as control:
        return [
            select_nic(topology, bucket_policy, nic_policy, placement=p, interfaces=interfaces, control=control)
            for p in scenario_placements(topology, scenario, clients)
        ]


@dataclass
class DispersionOptions:
    """Options of one NIC-dispersion run. Sizes in bytes, times in seconds."""

    out: Path = Path("out/nic-dispersion")
    clients: int = 16
    scenarios: list[str] = field(default_factory=lambda: list(SCENARIOS))
    nic_policies: list[str] = field(default_factory=lambda: list(COMPARED_NIC_POLICIES))
    bucket_policy: str = "all"
    bulk_size: int = 4 * 1024 * 1024
    bulk_direction: str = "pull"
    duration_seconds: float = 2.0
    warmup_iterations: int = 2
    interfaces: list[str] | None = None
    loopback_aliases: bool = False
    config: Path = SELFTEST_CONFIG
    servers: dict[str, str] | None = None


def _server_config(base: ServiceConfig, address: str, core: int | None) -> ServiceConfig:
    cfg = base.model_copy(deep=True)
    cfg.engine.address = f"tcp://[{address}]:0" if ":" in address else f"tcp://{address}:0"
    cfg.engine.cpu_affinity = [core] if core is not None else None
    return cfg


def run_dispersion(topology: Topology, opts: DispersionOptions, on_step: Any = None) -> dict[str, Any]:
    """Launch one server per NIC, run every scenario under every NIC policy, stop the servers.

    Args:
        topology: the node (this host's, or a described one with ``loopback_aliases``).
        opts: the options.
        on_step: called as ``on_step(description, done, total)`` before each run (progress display): ``done``
            runs of ``total`` are complete.

    Returns:
        the results document: ``{"kind", "topology", "nics": [{name, address, server}], "runs": [{scenario,
        nic_policy, clients_per_nic, nics_used, bandwidth_gib_per_second, results}], "notes", ...}``.

    Raises:
        ConfigError: no usable NIC; bad options. LaunchError / SelftestError from the runs.
    """
    from svcframe.launch import Launch, usable_cores

    for s in opts.scenarios:
        if s not in SCENARIOS:
            raise ConfigError(f"unknown scenario {s!r}; choose from {', '.join(SCENARIOS)}")
    nics = topology.candidate_nics(opts.interfaces)
    if opts.servers is not None:
        unknown = sorted(set(opts.servers) - {n.name for n in nics})
        if unknown:
            raise ConfigError(f"--server names {', '.join(unknown)}, not candidate NICs of {topology.source}")
        nics = [n for n in nics if n.name in opts.servers]
    if not nics:
        raise ConfigError(
            f"no NIC to run on in {topology.source} (none up with an address); describe one with --from FILE "
            "and use --loopback-aliases to rehearse on this host"
        )
    notes = []
    if len(nics) == 1:
        notes.append(f"only one NIC ({nics[0].name}): every scenario and policy uses it, so no dispersion can show")
    if opts.servers is not None:
        addresses = {n.name: n.address_for(None) or "-" for n in nics}
        notes.append("servers given (--server): already running, one per NIC")
    elif opts.loopback_aliases:
        addresses = {n.name: f"127.0.0.{k + 2}" for k, n in enumerate(nics)}
        notes.append("loopback aliases: NIC k is stood in for by 127.0.0.(k+2); bandwidth is this host's loopback")
    else:
        addresses = {}
        for n in nics:
            addr = n.address_for(None)
            if addr is None:
                raise ConfigError(f"NIC {n.name} has no address (a described topology? use --loopback-aliases)")
            addresses[n.name] = addr
    base = load_config(opts.config)
    cores = usable_cores()
    jobs: list[Any] = []
    runs: list[dict[str, Any]] = []
    servers: dict[str, str] = dict(opts.servers or {})
    try:
        for k, n in enumerate(nics):
            if n.name in servers:
                continue
            job = Launch(_server_config(base, addresses[n.name], cores[k % len(cores)] if cores else None), 1)
            jobs.append(job)
            servers[n.name] = job.start()[0].address
        for scenario in opts.scenarios:
            for policy in opts.nic_policies:
                choices = plan_choices(
                    topology, scenario, policy, opts.clients, bucket_policy=opts.bucket_policy,
                    interfaces=opts.interfaces,
                )  # fmt: skip
                chosen = [c.nic if c.nic is not None else nics[0].name for c in choices]
                if on_step is not None:
                    on_step(f"{scenario} / {policy}", len(runs), len(opts.scenarios) * len(opts.nic_policies))
                params = SelftestParams(
                    workload="bulk", bulk_size=opts.bulk_size, bulk_direction=opts.bulk_direction,
                    clients=opts.clients, duration_seconds=opts.duration_seconds,
                    warmup_iterations=opts.warmup_iterations, resp_buffer_size=0, req_buffer_size=0,
                )  # fmt: skip
                results = run_selftest(params, [servers[name] for name in chosen])
                per_nic = Counter(chosen)
                runs.append(
                    {
                        "scenario": scenario,
                        "nic_policy": policy,
                        "bucket_policy": opts.bucket_policy,
                        "clients_per_nic": {n.name: per_nic.get(n.name, 0) for n in nics},
                        "nics_used": len(per_nic),
                        "choices": [c.to_dict() for c in choices],
                        "bandwidth_gib_per_second": results["aggregate"]["bandwidth_gib_per_second"],
                        "rate_ops_per_second": results["aggregate"]["rate_ops_per_second"],
                        "results": results,
                    }
                )
    finally:
        for job in jobs:
            job.stop()
    return {
        "kind": "svcframe-nic-dispersion",
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "topology": topology.to_dict(),
        "nics": [{"name": n.name, "address": addresses[n.name], "server": servers.get(n.name)} for n in nics],
        "runs": runs,
        "notes": notes,
        "environment": environment(),
        "created": time.time(),
    }


def plot_dispersion(doc: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write :func:`dispersion_figure` as an image (PNG by suffix).

    Raises:
        OSError: the file cannot be written.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    dispersion_figure(doc).savefig(out, dpi=120)
    return out


def dispersion_figure(doc: dict[str, Any]) -> Any:
    """Figure 2 analogue: aggregate bandwidth (GiB/s) per scenario, one bar per NIC policy, annotated with
    the number of NICs in use. The title states the clients, NICs, bulk size and direction and the run length;
    when the NICs were stood in for by loopback aliases (or the servers were given, or there was one NIC) the
    axes say so in red: the bars then show this host's loopback, not a dispersion over NICs. Matplotlib,
    object-oriented API on the Agg canvas.
    """
    from .plotting import require_matplotlib

    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = doc["runs"]
    scenarios = list(dict.fromkeys(r["scenario"] for r in runs))
    policies = list(dict.fromkeys(r["nic_policy"] for r in runs))
    by_key = {(r["scenario"], r["nic_policy"]): r for r in runs}
    fig = Figure(figsize=(7, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / max(len(policies), 1)
    labels = {"one-core": "one core\nper process", "two-cores": "two cores\nper process", "unbound": "unbound"}
    for j, policy in enumerate(policies):
        xs = [i + (j - (len(policies) - 1) / 2) * width for i in range(len(scenarios))]
        heights = [by_key[(s, policy)]["bandwidth_gib_per_second"] if (s, policy) in by_key else 0.0 for s in scenarios]
        bars = ax.bar(xs, heights, width * 0.95, label=f"nic_policy={policy}")
        for bar, s in zip(bars, scenarios, strict=True):
            run = by_key.get((s, policy))
            if run is not None:
                ax.annotate(f"{run['nics_used']}/{len(doc['nics'])} NICs", (bar.get_x() + bar.get_width() / 2,
                            bar.get_height()), ha="center", va="bottom", fontsize=8)  # fmt: skip
    ax.set_xticks(range(len(scenarios)), [labels.get(s, s) for s in scenarios])
    ax.set_ylabel("aggregate bandwidth (GiB/s)")
    options = doc["options"]
    source = textwrap.fill(f"({doc['topology']['source']})", 80, break_on_hyphens=False)  # a long path wraps
    ax.set_title(
        f"NIC dispersion: {options['clients']} clients, {len(doc['nics'])} NIC(s)\n{source}\n"
        f"{quantity(options['bulk_size'], 'B')} bulk {options.get('bulk_direction', 'pull')}s, "
        f"{quantity(options['duration_seconds'], 's')} per run, bucket policy {options.get('bucket_policy', 'all')}",
        fontsize="medium",
    )  # fmt: skip
    if options.get("loopback_aliases") or options.get("servers") or len(doc["nics"]) == 1:
        ax.text(0.02, 0.98, "\n".join(textwrap.fill(n, 70) for n in doc["notes"]), transform=ax.transAxes, va="top",
                ha="left", fontsize=7, color="tab:red",
                bbox={"facecolor": "white", "edgecolor": "tab:red", "alpha": 0.9})  # fmt: skip
    fig.legend(loc="outside lower center", ncols=max(len(policies), 1))
    ax.margins(y=0.45 if doc["notes"] else 0.15)
    return fig


def save(doc: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``nic-dispersion.json`` and ``nic-dispersion.png`` under ``out``; return both paths."""
    out.mkdir(parents=True, exist_ok=True)
    js = out / "nic-dispersion.json"
    js.write_text(json.dumps(doc, indent=2, default=str))
    return js, plot_dispersion(doc, out / "nic-dispersion.png")
