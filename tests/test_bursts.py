"""Progress modes switched live on a server process, idle CPU per mode, and the bursts workload."""

from __future__ import annotations

import psutil
import pytest
from roofline_kit import layout_problems

from selftest import SELFTEST_CONFIG
from selftest.bursts import BurstParams, bursts_figure, plot_bursts, run_bursts, summarize_mode, timeline_rows
from svcframe.admin import ServiceHandle
from svcframe.config import load_config
from svcframe.engine import Engine
from svcframe.launch import Launch
from svcframe.loops import run

# burst analysis and its plots: our logic, not the Python version's (CI's first interpreter only)
pytestmark = pytest.mark.one_interpreter


def test_timeline_arithmetic() -> None:
    params = BurstParams(bursts=2, burst_seconds=1.0, gap_seconds=1.0, interval_seconds=0.5)
    assert params.schedule() == [(0.0, 1.0), (2.0, 3.0)]
    assert params.total_seconds == 4.0
    # 10 calls in [0, 0.5), 6 in [0.5, 1.0), none in the gap, 4 in [2.0, 2.5), 2 in [2.5, 3.0)
    ends = [0.01 * i for i in range(10)] + [0.6 + 0.01 * i for i in range(6)] + [2.1] * 4 + [2.7, 2.8]
    cpu = [(0.0, 0.0), (0.5, 0.25), (1.0, 0.5), (1.5, 0.5), (2.0, 0.5), (2.5, 0.75), (3.0, 1.0), (3.5, 1.0), (4.0, 1.0)]
    energy = [10.0 * i for i in range(9)]
    rows = timeline_rows(ends, cpu, energy, params)
    assert [r["calls"] for r in rows] == [10, 6, 0, 0, 4, 2, 0, 0]
    assert [r["rate_ops_per_second"] for r in rows] == [20, 12, 0, 0, 8, 4, 0, 0]
    assert [r["phase"] for r in rows] == ["burst", "burst", "gap", "gap", "burst", "burst", "gap", "gap"]
    assert [r["server_cpu_utilization"] for r in rows] == [0.5, 0.5, 0, 0, 0.5, 0.5, 0, 0]
    assert all(r["package_watts"] == pytest.approx(20.0) for r in rows)
    summary = summarize_mode(rows)
    assert summary["burst_rate_ops_per_second"] == pytest.approx(11.0)
    assert summary["idle_server_cpu_utilization"] == 0
    assert summary["burst_server_cpu_utilization"] == 0.5
    assert summary["idle_package_watts"] == pytest.approx(20.0)


def test_interval_straddling_a_boundary_is_mixed() -> None:
    params = BurstParams(bursts=1, burst_seconds=0.75, gap_seconds=0.75, interval_seconds=0.5)
    cpu = [(0.5 * i, 0.0) for i in range(4)]
    rows = timeline_rows([0.1, 0.6], cpu, [None] * 4, params)
    assert [r["phase"] for r in rows] == ["burst", "mixed", "gap"]
    assert rows[0]["package_watts"] is None
    assert summarize_mode(rows)["idle_package_watts"] is None


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="unknown progress mode"):
        BurstParams(modes=["fast"])
    with pytest.raises(ValueError):
        BurstParams(interval_seconds=0)


@pytest.fixture(scope="module")
def server():
    with Launch(load_config(SELFTEST_CONFIG), 1) as job:
        yield job.members[0]


def _set_mode(address: str, mode: str) -> dict:
    async def go() -> dict:
        async with Engine(None) as engine:
            return await ServiceHandle(engine, address).set_progress(mode)

    return run(go())


def test_modes_switch_live_and_idle_cpu(server) -> None:
    """Idle CPU near zero in block and spindown; a busy loop cannot pass that tolerance."""
    proc = psutil.Process(server.pid)
    measured = {}
    for mode in ("spindown", "busy", "block", "spindown"):
        live = _set_mode(server.address, mode)
        assert live["engine"]["progress_mode"] == mode  # visible in the live config
        measured[mode] = proc.cpu_percent(interval=1.2)  # a measurement window, not a wait
    assert measured["spindown"] < 10.0
    assert measured["block"] < 10.0
    # busy polling occupies the core (it yields to other runnable processes, so under load it gets a share)
    assert measured["busy"] > max(25.0, 3 * max(measured["block"], measured["spindown"]))


def test_bursts_short_run(server, tmp_path) -> None:
    params = BurstParams(
        bursts=2, burst_seconds=0.5, gap_seconds=0.5, interval_seconds=0.25, modes=["spindown", "block"]
    )
    results = run(run_bursts(params, server.address))
    assert [m["mode"] for m in results["modes"]] == ["spindown", "block"]
    for mode in results["modes"]:
        rows = mode["timeline"]
        assert len(rows) == 8
        # a sequential client's last call of a burst may complete just after the burst ends
        assert sum(r["calls"] for r in rows if r["phase"] == "gap") <= params.bursts
        assert mode["summary"]["burst_rate_ops_per_second"] > 100
    png = plot_bursts(results, tmp_path / "b.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    figure = bursts_figure(results)
    assert layout_problems(figure) == []  # nothing cut at the edges, no legend over the data
    title = figure._suptitle.get_text()  # the plot states its schedule
    assert (
        title == f"noop bursts: 2 x 500 ms with 500 ms gaps, 250 ms intervals, spindown 10 ms; server {server.address}"
    )

    # the server's original mode is restored
    async def mode() -> str:
        async with Engine(None) as engine:
            return await ServiceHandle(engine, server.address).query_config("engine.progress_mode")

    assert run(mode()) == "spindown"
