"""The plots of the three rooflines (selftest/roofline/plots.py): real PNG files of a plausible size, and the
model values drawn checked on the figures' own data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from roofline_kit import assert_png, platform_doc

from selftest.roofline import Platform, Sample, Workload, WorkloadPoint, io_rooflines, place
from selftest.roofline.io import IOPoint, validation_points
from selftest.roofline.plots import (
    io_figure,
    placement_figure,
    plot_io,
    plot_placement,
    plot_workflow,
    workflow_figure,
)
from selftest.roofline.workflow import ZONES, WorkflowSpec, analyse, from_platform

SAMPLES = {
    "storage_iops": [Sample(1, 1, 2000.0), Sample(1, 4, 500.0)],
    "storage_bandwidth": [Sample(1, 2, 0.1)],
    "bandwidth": [Sample(1, 1, 0.5), Sample(1, 2, 0.3)],
}
PLATFORM = Platform.from_document(platform_doc({
    "rpc_rate": (30_000.0, 30_000.0),
    "bandwidth": (1.2, 0.7),
    "storage_iops": (3_600.0, 7_500.0),
    "storage_bandwidth": (0.57, 0.25),
}, SAMPLES, slots=(1, 1)))  # fmt: skip


def _line(ax, label_start: str):  # the one line whose label starts so
    (line,) = [ln for ln in ax.get_lines() if ln.get_label().startswith(label_start)]
    return line


def test_io_roofline_plot(tmp_path: Path) -> None:
    rooflines = io_rooflines(PLATFORM)
    points = {name: validation_points(PLATFORM, name) for name in rooflines}
    points["network"].append(IOPoint("kv put 1 KiB", 1 / 1024, 9000.0))
    fig = io_figure(list(rooflines.values()), points)
    ax = fig.axes[0]
    for name, rl in rooflines.items():
        line = _line(ax, f"{name} roof")
        np.testing.assert_allclose(line.get_ydata(), rl.attainable(np.asarray(line.get_xdata())))
        assert "ψ = " in line.get_label() and "GiB/s" in line.get_label()
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "operations per byte" in ax.get_xlabel() and "per second" in ax.get_ylabel()
    (network_points,) = [c for c in ax.collections if c.get_label().startswith("network workloads")]
    np.testing.assert_allclose(network_points.get_offsets()[-1], [1 / 1024, 9000.0])
    assert_png(plot_io(list(rooflines.values()), tmp_path / "io.png", points))
    with pytest.raises(ValueError, match="at least one"):
        io_figure([])


def test_workflow_roofline_plot_with_zones_and_without(tmp_path: Path) -> None:
    spec = WorkflowSpec.from_document({
        "name": "write then read", "servers": 1, "parallel_tasks": 1, "available_client_processes": 4,
        "target_makespan_seconds": 0.5, "target_throughput_tasks_per_second": 3,
        "stages": [{"name": "write", "tasks": 8, "rpcs_per_task": 1000, "bytes_per_task": 2**20},
                   {"name": "read", "tasks": 8, "rpcs_per_task": 1000, "bytes_per_task": 2**20}],
        "runs": [{"label": "1 at once", "parallel_tasks": 1, "makespan_seconds": 6.0},
                 {"label": "4 at once", "parallel_tasks": 4, "makespan_seconds": 2.5}],
    })  # fmt: skip
    roofline = from_platform(PLATFORM, spec)
    runs = analyse(PLATFORM, spec)["runs"]
    fig = workflow_figure(roofline, runs)
    ax = fig.axes[0]
    roof = _line(ax, "attainable")
    np.testing.assert_allclose(roof.get_ydata(), roofline.attainable(np.asarray(roof.get_xdata())))
    assert max(roof.get_xdata()) <= roofline.wall
    wall = _line(ax, "parallelism wall")
    assert list(wall.get_xdata()) == [4, 4] and "4 tasks" in wall.get_label()
    assert {c.get_label() for c in ax.collections} >= {*ZONES, "measured runs"}
    (points,) = [c for c in ax.collections if c.get_label() == "measured runs"]
    np.testing.assert_allclose(points.get_offsets(), [[1, 16 / 6], [4, 16 / 2.5]])
    for c in roofline.ceilings:
        assert _line(ax, c.name)
    assert_png(plot_workflow(roofline, tmp_path / "workflow.png", runs))

    untargeted = from_platform(PLATFORM, spec.model_copy(update={"target_makespan_seconds": None}))
    labels = {c.get_label() for c in workflow_figure(untargeted).axes[0].collections}
    assert {"node-bound", "system-bound"} <= labels and not labels & set(ZONES)
    assert_png(plot_workflow(untargeted, tmp_path / "workflow-bounds.png"))


def test_placement_plot(tmp_path: Path) -> None:
    workload = Workload(name="kv put 1 KiB", points=[
        WorkloadPoint(servers=1, clients=1, rate_per_client_ops_per_second=9000, bytes_per_call=1200),
        WorkloadPoint(servers=1, clients=4, rate_per_client_ops_per_second=3000, bytes_per_call=1200,
                      client_processes_per_core=4),
        WorkloadPoint(servers=2, clients=1, rate_per_client_ops_per_second=8000, bytes_per_call=65536),
    ])  # fmt: skip
    result = place(PLATFORM, workload)
    fig = placement_figure(PLATFORM, result)
    ax = fig.axes[0]
    rpc_line = _line(ax, "RPC rate ceiling")
    rpc = PLATFORM.roofline("rpc_rate")
    np.testing.assert_allclose(rpc_line.get_ydata(), rpc.attainable(np.asarray(rpc_line.get_xdata())))
    bw_line = _line(ax, "bandwidth ceiling at 64 KiB per call")
    bw = PLATFORM.roofline("bandwidth")
    expected = bw.attainable(np.asarray(bw_line.get_xdata())) * 2**30 / 65536
    np.testing.assert_allclose(bw_line.get_ydata(), expected)
    assert "(above the chart)" in _line(ax, "bandwidth ceiling at 1,200 B").get_label()
    drawn = np.concatenate([c.get_offsets() for c in ax.collections if c.get_label().startswith("kv put")])
    assert sorted(map(tuple, drawn)) == sorted((r["service_ratio"], r["rate_per_client_ops_per_second"])
                                               for r in result["points"])  # fmt: skip
    texts = " ".join(t.get_text() for t in ax.texts)
    for r in result["points"]:
        assert f"score {r['score']:.2f}, {r['region']}" in texts
        assert f"headroom {r['headroom']:.2f}x" in texts
    (circled,) = [c for c in ax.collections if c.get_label().startswith("> 1 process per core")]
    np.testing.assert_allclose(circled.get_offsets(), [[0.25, 3000]])
    assert ax.get_title() == "kv put 1 KiB on run 7 (max ceilings)"
    assert_png(plot_placement(PLATFORM, result, tmp_path / "placement.png"))
