"""Every plot reads at a glance: rendered, no text past the figure's edges, no label of a point past its
axes, no legend over the data, no point outside its axes, all measured through matplotlib's artist extents
(``roofline_kit.layout_problems``); and what the plots say about the data comes from the data: a parameter that is a
lower bound is marked so, the workflow's two targets are told apart, its axis starts at one task, and a run beyond
the parallelism wall is drawn and said to be outside the model."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from roofline_kit import layout_problems, platform_doc

from selftest.roofline import (
    METRICS,
    Platform,
    Range,
    Roofline,
    Sample,
    Saturation,
    Workload,
    WorkloadPoint,
    io_rooflines,
    place,
)
from selftest.roofline.io import IOPoint, validation_points
from selftest.roofline.plots import io_figure, placement_figure, roofline_figure, workflow_figure
from selftest.roofline.workflow import WorkflowSpec, analyse, from_platform

pytestmark = pytest.mark.one_interpreter  # plots: our logic, not the Python version's

PS_LOW = Saturation(True, "the server used 30% of its core, the clients 97% of theirs: the clients set the rate",
                    0.3, 0.97, ramp=({"clients": 2, "depth": 1, "rate": 9e4}, {"clients": 2, "depth": 4, "rate": 1.2e5},
                                     {"clients": 2, "depth": 16, "rate": 1.21e5}))  # fmt: skip
PC_OK = Saturation(False, "the client used 60% of its core, the server 40% of its", 0.4, 0.6)


def _texts(fig: Any) -> str:
    from matplotlib.text import Text

    return "\n".join(t.get_text() for t in fig.findobj(Text))


def test_the_roofline_marks_a_lower_bound_and_keeps_every_label_in_place() -> None:
    samples = [Sample(1, 16, 7_000.0, 1.0, 1.0), Sample(1, 8, 12_000.0, 1.0, 1.0),
               Sample(1, 1, 21_000.0, 1.0, 1.0, pc_configuration=Range(16_900.0, 17_900.0)),
               Sample(4, 2, 17_000.0, 1.0, 1.0), Sample(2, 8, 5_000.0, 2.0, 8.0)]  # fmt: skip
    model = Roofline(METRICS["rpc_rate"], Range(16_900.0, 17_900.0), Range(118_000.0, 125_000.0), samples,
                     PC_OK, PS_LOW)  # fmt: skip
    fig = roofline_figure(model, "RPC rate roofline, vm\nnoop RPCs (no payload)")
    assert layout_problems(fig) == []
    text = _texts(fig)
    assert "Pc 17.9 k ops/s, Ps ≥ 125 k ops/s" in text  # the legend marks the lower bound
    assert "ridge X* ≤ 0.143" in text  # a larger Ps moves the ridge left
    assert "Ps 118-125 k ops/s is a lower bound: the server used 30% of its core" in text.replace("\n    ", " ")
    assert "lower bound: the true ceiling lies higher" in text
    # what the plot says about its samples is computed from them
    flat = text.replace("\n    ", " ")
    assert "the 1x1 sample repeats Pc's configuration: 21 k ops/s against Pc 16.9-17.9 k ops/s, +17%" in flat
    assert "repeats spread Pc 6% and Ps 6%" in flat
    assert "noisy" not in flat
    (ax, _notes) = fig.axes
    assert ax.get_legend() is None and len(fig.legends) == 1  # the legend is below the axes, never over the data
    # the ticks of a rate axis read as the tables do: "20 k" under "(ops/s)"
    assert any(t.get_text() == "20 k" for t in ax.get_yticklabels())


@pytest.mark.parametrize("pc, ps", [(1.0, 100.0), (100.0, 1.0), (10.0, 10.0)])
def test_the_ridge_label_stays_inside_wherever_the_ridge_is(pc: float, ps: float) -> None:
    """The ridge's label ran off the left edge over the y axis title when the ridge was the leftmost point."""
    for samples in ([], [Sample(1, 64, ps / 64), Sample(8, 1, min(pc, ps))]):
        fig = roofline_figure(Roofline(METRICS["bandwidth"], Range(pc, pc), Range(ps, ps), samples))
        assert layout_problems(fig) == [], (pc, ps, len(samples))


def test_many_server_counts_get_a_colour_bar_inside_the_figure() -> None:
    samples = [Sample(s, 16, 100.0 * s) for s in range(1, 13)]
    fig = roofline_figure(Roofline(METRICS["rpc_rate"], Range(900.0, 1000.0), Range(1000.0, 1100.0), samples))
    assert layout_problems(fig) == []


def test_placement_labels_at_the_right_edge_stay_inside() -> None:
    platform = Platform.from_document(platform_doc({"rpc_rate": (30_000.0, 30_000.0), "bandwidth": (1.2, 0.7)}))
    workload = Workload(name="kv put 1 KiB with a long name for its label", points=[
        WorkloadPoint(servers=8, clients=1, rate_per_client_ops_per_second=29_000, bytes_per_call=1200),
        WorkloadPoint(servers=1, clients=16, rate_per_client_ops_per_second=1_500, bytes_per_call=1200),
        WorkloadPoint(servers=1, clients=1, rate_per_client_ops_per_second=30_500, bytes_per_call=65536),
    ])  # fmt: skip
    fig = placement_figure(platform, place(platform, workload))
    assert layout_problems(fig) == []
    assert "Pc = 30 k ops/s" in _texts(fig)


def test_a_legend_too_wide_for_two_columns_takes_one() -> None:
    """The docs' kv put: two bandwidth ceilings (1,053 and 1,054 B per call, above the chart), Ps a lower bound; in
    two columns its legend ran past both edges of the figure, and its two points' labels lay over each other."""
    from selftest.roofline import METRICS, Range, Roofline, Saturation

    low = Saturation(True, "the clients, not the server, set the rate")
    platform = Platform({
        "rpc_rate": Roofline(METRICS["rpc_rate"], Range(3_940.0, 5_490.0), Range(35_100.0, 63_800.0), [], None, low),
        "bandwidth": Roofline(METRICS["bandwidth"], Range(0.400, 0.688), Range(0.857, 1.13)),
    }, client_cores=1, label="run 1: selftest on vm")  # fmt: skip
    workload = Workload(name="kv put", points=[
        WorkloadPoint(servers=1, clients=1, rate_per_client_ops_per_second=278.0, bytes_per_call=1053),
        WorkloadPoint(servers=1, clients=2, rate_per_client_ops_per_second=173.0, bytes_per_call=1054,
                      client_processes_per_core=2.0),
    ])  # fmt: skip
    fig = placement_figure(platform, place(platform, workload))
    assert layout_problems(fig) == []
    assert "Ps ≥ 63.8 k ops/s" in _texts(fig)
    # the 1x1 label, moved left of its point at the right edge, no longer lies over the 1x2 label
    renderer = fig.canvas.get_renderer()
    first, second = (text.get_window_extent(renderer) for text in fig.axes[0].texts)
    assert not first.overlaps(second)


def test_io_rooflines_keep_their_labels_inside() -> None:
    platform = Platform.from_document(platform_doc({
        "rpc_rate": (30_000.0, 30_000.0), "bandwidth": (1.2, 0.7), "storage_iops": (3_600.0, 7_500.0),
        "storage_bandwidth": (0.57, 0.25),
    }, {"bandwidth": [Sample(1, 1, 0.5), Sample(1, 2, 0.3)]}))  # fmt: skip
    rooflines = io_rooflines(platform)
    points = {name: validation_points(platform, name) for name in rooflines}
    points["network"].append(IOPoint("kv put 1 KiB, far right", 1.0, 9000.0))
    fig = io_figure(list(rooflines.values()), points)
    assert layout_problems(fig) == []
    assert "MiB/s" not in _texts(fig)  # bandwidths in one unit, GiB/s, as the tables show them


def test_the_workflow_tells_its_targets_apart_and_a_run_beyond_the_wall_is_outside_the_model() -> None:
    platform = Platform.from_document(platform_doc({"rpc_rate": (6_000.0, 18_000.0), "bandwidth": (1.2, 0.7)},
                                                   slots=(1, 1)))  # fmt: skip
    spec = WorkflowSpec.from_document({
        "name": "kv write then read", "servers": 1, "parallel_tasks": 1, "target_makespan_seconds": 2.0,
        "target_throughput_tasks_per_second": 5.0,
        "stages": [{"name": "put", "tasks": 8, "rpcs_per_task": 40, "bytes_per_task": 40 * 1024},
                   {"name": "get", "tasks": 8, "rpcs_per_task": 40, "bytes_per_task": 40 * 1024}],
        "runs": [{"label": "1 at once", "parallel_tasks": 1, "makespan_seconds": 2.0},
                 {"label": "2 at once", "parallel_tasks": 2, "makespan_seconds": 2.6}],
    })  # fmt: skip
    roofline = from_platform(platform, spec)
    assert roofline.wall == 1  # the platform has one client core
    fig = workflow_figure(roofline, analyse(platform, spec)["runs"])
    assert layout_problems(fig) == []
    ax = fig.axes[0]
    assert ax.get_xlim()[0] == 1.0  # from one task, not half a task
    (makespan,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("target makespan")]
    (throughput,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("target throughput")]
    assert (makespan.get_color(), makespan.get_linestyle()) != (throughput.get_color(), throughput.get_linestyle())
    assert makespan.get_color() != throughput.get_color()
    (inside,) = [c for c in ax.collections if c.get_label() == "measured runs"]
    (beyond,) = [c for c in ax.collections if c.get_label().startswith("measured runs beyond the wall")]
    np.testing.assert_allclose(inside.get_offsets()[:, 0], [1.0])
    np.testing.assert_allclose(beyond.get_offsets()[:, 0], [2.0])
    assert "outside the model" in beyond.get_label()
    assert any("2 at once" in t.get_text() and "beyond the wall" in t.get_text() for t in ax.texts)
    assert "unattainable" not in _texts(fig)


def test_sweep_and_history_figures_keep_their_legends_off_the_data() -> None:
    from selftest.store import history_figure
    from selftest.sweep import sweep_figure

    points = {m: [{"servers": s, "clients": 4, "samples": 1, "min": 9.0 * s, "median": 10.0 * s, "max": 11.0 * s}
                  for s in (1, 2, 3)] for m in ("rpc_rate", "bandwidth", "storage_iops")}  # fmt: skip
    fig = sweep_figure(points, parameters={m: "noop RPCs (no payload)" for m in points})
    assert layout_problems(fig) == []
    model = Roofline(METRICS["rpc_rate"], Range(9.0, 10.0), Range(10.0, 11.0), []).to_dict()
    now = time.time()
    runs = [{"id": i, "service": "kv", "platform": "vm", "created": now - 3600 * (5 - i),
             "model": {"metrics": {"rpc_rate": model}}, "summary": {"combined_score": 0.8 + 0.01 * i}}
            for i in range(1, 6)]  # fmt: skip
    fig = history_figure(runs[-1], runs[:-1])
    assert layout_problems(fig) == []
