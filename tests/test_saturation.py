"""Ps is measured at saturation, or the collector says it was not (Carns et al. 2025, section 4.3: Ps is
"a server's maximum performance when saturated", Pc the rate of a client against "a single quiescent server"):
the load ramp's loads and where it stops, the reading of a Ps and a Pc from the CPU recorded with them, and the
model built from measurement rows (X counts the servers that served; a 1x1 sample on Pc's pair of nodes keeps
Pc's range beside it)."""

from __future__ import annotations

from typing import Any

import pytest

from selftest.collect import (
    RAMP_GROWTH,
    CollectOptions,
    _model,
    pc_saturation,
    plan,
    ps_saturation,
    ramp_loads,
    ramp_outcome,
)
from selftest.roofline import SATURATED_UTILIZATION


def test_the_ramp_raises_calls_in_flight_then_client_processes() -> None:
    assert ramp_loads(2, 8, 16) == [(2, 1), (2, 4), (2, 16), (4, 16), (8, 16)]
    assert ramp_loads(2, 2, 2) == [(2, 1), (2, 2)]
    assert ramp_loads(12, 48, 16) == [(12, 1), (12, 4), (12, 16), (24, 16), (48, 16)]
    assert ramp_loads(3, 10, 1) == [(3, 1), (6, 1), (10, 1)]


def test_the_ramp_stops_where_the_rate_stops_growing() -> None:
    assert RAMP_GROWTH == 0.05
    assert ramp_outcome([100.0]) == (0, False, None)
    grew = ramp_outcome([100.0, 200.0, 300.0])
    assert (grew.best, grew.stopped) == (2, False) and grew.growth == pytest.approx(0.5)
    flat = ramp_outcome([100.0, 200.0, 204.0, 500.0])  # +2% stops it: the load after is never measured
    assert (flat.best, flat.stopped) == (2, True) and flat.growth == pytest.approx(0.02)
    fell = ramp_outcome([100.0, 200.0, 150.0])
    assert (fell.best, fell.stopped) == (1, True) and fell.growth == pytest.approx(-0.25)
    with pytest.raises(ValueError):
        ramp_outcome([])


def _row(stage: str, rate: float, **kw: Any) -> dict[str, Any]:
    return {"stage": stage, "metric": "rpc_rate", "servers": 1, "clients": kw.pop("clients", 2), "depth": 16,
            "aggregate": rate, "per_client": rate / 2, **kw}  # fmt: skip


def test_a_ps_whose_clients_set_the_rate_is_a_lower_bound() -> None:
    """The demo's Ps: the server used 26-32% of a core while the clients' core was saturated."""
    ramp = [_row("ramp", 9e4, depth=1), _row("ramp", 1.2e5, depth=4), _row("ramp", 1.21e5)]
    ps = [_row("Ps", 1.2e5, server_utilization=0.3, client_core_utilization=0.97),
          _row("Ps", 1.22e5, server_utilization=0.32, client_core_utilization=0.98)]  # fmt: skip
    s = ps_saturation(ps, ramp)
    assert s is not None and s.lower_bound
    assert s.reason == ("the server used 31% of its core, the clients used 98% of their cores at 2 client processes "
                        "x 16 calls in flight: the clients, not the server, set the rate")  # fmt: skip
    assert s.server_utilization == pytest.approx(0.31) and [r["rate"] for r in s.ramp] == [9e4, 1.2e5, 1.21e5]


def test_a_ps_still_growing_at_the_largest_load_is_a_lower_bound() -> None:
    ramp = [_row("ramp", 1e5, depth=1), _row("ramp", 2e5, depth=4), _row("ramp", 3e5)]
    ps = [_row("Ps", 3e5, server_utilization=0.95, client_core_utilization=0.5)]
    s = ps_saturation(ps, ramp)
    assert s is not None and s.lower_bound
    assert s.reason.startswith("its rate still grew at the largest load tried, 2 client processes x 16 calls in "
                               "flight (+50% at the last step)")  # fmt: skip


def test_a_ps_that_stopped_growing_with_clients_to_spare_is_saturated() -> None:
    """Rate flat while the clients had CPU to spare: the server side (its CPU, disk or network) set it."""
    ramp = [_row("ramp", 1e5, depth=1), _row("ramp", 1.5e5, depth=4), _row("ramp", 1.52e5)]
    ps = [_row("Ps", 1.5e5, server_utilization=0.6, client_core_utilization=0.4)]
    s = ps_saturation(ps, ramp)
    assert s is not None and not s.lower_bound
    assert s.reason.startswith("the rate stopped growing at 2 client processes x 16 calls in flight (+1% at the next")


def test_a_starved_server_reads_from_what_it_wanted_not_what_it_got() -> None:
    """On a busy machine the server used 15% of its core and waited for it the rest: not idle, but starved by
    other processes (its demand, from the kernel's scheduler statistics); the contention is said."""
    ramp = [_row("ramp", 1e5, depth=1), _row("ramp", 1.01e5, depth=4)]
    ps = [_row("Ps", 1e5, server_utilization=0.15, server_demand=0.95, server_waiting=0.84,
               client_core_utilization=0.97, client_core_demand=2.0)]  # fmt: skip
    s = ps_saturation(ps, ramp)
    assert s is not None and not s.lower_bound  # both sides wanted their cores: the server was not idle
    assert "the server used 15% of its core, wanting 95%" in s.reason and s.contention == pytest.approx(0.84)


def test_a_pc_set_by_its_server_is_a_lower_bound() -> None:
    fine = pc_saturation([_row("Pc", 4e4, clients=1, server_utilization=0.5, client_utilization=0.7)])
    assert fine is not None and not fine.lower_bound
    assert fine.reason == ("the client used 70% of its core, the server used 50% of its core: the server had CPU to "
                           "spare, the client's round trip set the rate")  # fmt: skip
    low = pc_saturation([_row("Pc", 4e4, clients=1, server_utilization=0.99, client_utilization=0.3)])
    assert low is not None and low.lower_bound and low.reason.endswith("the server, not the client, set the rate")
    assert SATURATED_UTILIZATION == 0.9
    assert pc_saturation([{"per_client": 1.0}]) is None  # a run of an older version: nothing claimed


def test_the_model_counts_servers_that_served_and_keeps_pcs_range_beside_its_configuration() -> None:
    pc = [{**_row("Pc", 100.0, clients=1), "per_client": p, "server_nodes": [0], "client_nodes": [1],
           "server_utilization": 0.4, "client_utilization": 0.6} for p in (90.0, 100.0)]  # fmt: skip
    ramp = [_row("ramp", 300.0, depth=1), _row("ramp", 301.0, depth=4)]
    ps = [{**_row("Ps", 300.0), "server_utilization": 0.95, "client_core_utilization": 0.5}]
    grid = [  # 2 servers x 1 client: one served, the other idled; 1 x 1 on Pc's pair of nodes
        {"stage": "grid", "metric": "rpc_rate", "servers": 2, "clients": 1, "servers_serving": 1, "per_client": 157.0,
         "server_nodes": [0], "client_nodes": [1], "server_processes_per_core": 1.0, "client_processes_per_core": 1.0},
        {"stage": "grid", "metric": "rpc_rate", "servers": 1, "clients": 2, "servers_serving": 1, "per_client": 80.0,
         "server_nodes": [0], "client_nodes": [1], "server_processes_per_core": 1.0, "client_processes_per_core": 2.0},
    ]  # fmt: skip
    model = _model("rpc_rate", {"Pc": pc, "ramp": ramp, "Ps": ps, "sweep": [], "grid": grid})
    first, second = model.samples
    assert (first.servers, first.clients, first.service_ratio) == (1, 1, 1.0)  # X counts the server that served
    assert first.pc_configuration is not None and (first.pc_configuration.min, first.pc_configuration.max) == (90, 100)
    assert first.pc_difference == pytest.approx(0.57)  # the same configuration, 57% above Pc's range
    assert second.pc_configuration is None
    assert model.ps.max == 300.0 and model.ps_saturation is not None and not model.ps_saturation.lower_bound
    assert any("+57% against its range" in f for f in model.findings())


def test_the_plan_ramps_before_ps_and_sizes_for_its_largest_load() -> None:
    opts = CollectOptions(metrics=["rpc_rate"], repeats=2, nodes="local:2", saturation_depth=16,
                          max_clients_per_core=4)  # fmt: skip
    steps = plan(opts)
    stages = [s.stage for s in steps]
    assert stages.index("ramp") > stages.index("Pc") and stages.index("Ps") > max(
        i for i, s in enumerate(stages) if s == "ramp"
    )
    ramp = [s for s in steps if s.stage == "ramp"]
    assert [s.tag for s in ramp] == [f"L{i}" for i in range(len(ramp))]
    assert [s.depth for s in ramp][:3] == [1, 4, 16] and ramp[-1].clients >= ramp[0].clients
    assert all(s.depth == 16 for s in steps if s.stage == "Ps")


def test_models_built_on_a_lower_bound_say_so() -> None:
    """Placement, the I/O roofline's peaks and the workflow roofline take their ceilings from Pc and Ps: where the
    platform's Ps is a lower bound, their notes say so and their ceilings are marked >= (a ridge <=)."""
    from selftest.roofline import METRICS, Platform, Range, Roofline, Saturation
    from selftest.roofline.placement import Workload, WorkloadPoint, place
    from selftest.roofline.plots import placement_figure, workflow_figure
    from selftest.roofline.workflow import WorkflowSpec, analyse, from_platform

    low = Saturation(True, "the clients, not the server, set the rate")
    fine = Saturation(False, "the client's round trip set the rate")
    platform = Platform({
        "rpc_rate": Roofline(METRICS["rpc_rate"], Range(9e3, 1e4), Range(4e4, 5e4), [], fine, low),
        "bandwidth": Roofline(METRICS["bandwidth"], Range(1.0, 1.2), Range(1.4, 1.5), [], fine, fine),
    }, server_cores=1, client_cores=1)  # fmt: skip
    said = ("rpc_rate's Ps 40-50 k ops/s is a lower bound (the clients, not the server, set the rate): the ceilings "
            "drawn from it lie too low, and so do the ridges and scores built on them")  # fmt: skip
    assert platform.lower_bounds(["rpc_rate", "bandwidth"]) == [said]
    assert platform.lower_bounds(["rpc_rate"], ["Pc"]) == [] and platform.lower_bounds(["storage_iops"]) == []

    workload = Workload(name="kv put", points=[WorkloadPoint(servers=1, clients=1, rate_per_client_ops_per_second=1e3,
                                                             bytes_per_call=1024)])  # fmt: skip
    placement = place(platform, workload)
    assert placement["notes"] == [said]
    legend = [t.get_text() for t in placement_figure(platform, placement).legends[0].get_texts()]
    assert "RPC rate ceiling: Pc = 10 k ops/s, Ps ≥ 50 k ops/s" in legend
    assert "RPC rate ridge X* ≤ 0.2 (1/5)" in legend

    spec = WorkflowSpec.from_document({"name": "w", "servers": 1, "parallel_tasks": 1, "available_client_processes": 1,
                                       "stages": [{"name": "s", "tasks": 4, "rpcs_per_task": 10, "bytes_per_task": 0}],
                                       "runs": [{"label": "r", "parallel_tasks": 2, "makespan_seconds": 1.0}]})  # fmt: skip
    analysis = analyse(platform, spec)
    assert analysis["notes"] == [said]
    names = [c["name"] for c in analysis["roofline"]["ceilings"]]
    assert names == ["node: RPC rate 10,000 ops/s per client process", "system: RPC rate Ps ≥ 50,000 ops/s x 1 servers"]
    ticks = workflow_figure(from_platform(platform, spec), analysis["runs"])
    ticks.canvas.draw()
    labels = [t.get_text() for t in [*ticks.axes[0].get_xticklabels(), *ticks.axes[0].get_xticklabels(minor=True)]]
    assert "2" in labels and not any("times" in t or "^" in t for t in labels)  # 2, not 2x10^0
