"""The ``bursts`` workload: the paper's Figure 6 experiment (Carns et al., section 4.1.2).

One client makes sequential noop calls in ``bursts`` bursts of ``burst_seconds``, separated by idle gaps
of ``gap_seconds``, once per progress mode (server and client switched together). A timeline with one
row per ``interval_seconds`` records the call rate, the server process's CPU utilisation (psutil, on
the same intervals) and, where ``/sys/class/powercap/intel-rapl*/energy_uj`` is readable, the CPU
package power. The summary per mode gives the burst rate (intervals wholly inside bursts) and the idle
CPU utilisation (intervals wholly inside gaps): what spindown is meant to get together.
"""

from __future__ import annotations

import asyncio
import glob
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from svcframe.errors import SvcframeError
from svcframe.progress import PROGRESS_MODES
from svcframe.units import quantity


@dataclass
class BurstParams:
    """Times in seconds. Paper: 3 bursts of 10 s with 20 s gaps, 1 s intervals."""

    bursts: int = 3
    burst_seconds: float = 10.0
    gap_seconds: float = 20.0
    interval_seconds: float = 1.0
    modes: list[str] = field(default_factory=lambda: list(PROGRESS_MODES))
    spindown_msec: float = 10.0
    provider_id: int = 1
    admin_provider_id: int = 0
    client_core: int | None = None

    def __post_init__(self) -> None:
        if self.bursts < 1 or self.burst_seconds <= 0 or self.gap_seconds < 0 or self.interval_seconds <= 0:
            raise ValueError("bursts >= 1, burst_seconds > 0, gap_seconds >= 0 and interval_seconds > 0 are required")
        bad = [m for m in self.modes if m not in PROGRESS_MODES]
        if bad:
            raise ValueError(f"unknown progress mode(s) {bad}; choose from {list(PROGRESS_MODES)}")

    def schedule(self) -> list[tuple[float, float]]:
        """(start, end) of each burst, in seconds from the start of the run; a gap follows each burst."""
        period = self.burst_seconds + self.gap_seconds
        return [(i * period, i * period + self.burst_seconds) for i in range(self.bursts)]

    @property
    def total_seconds(self) -> float:
        return self.bursts * (self.burst_seconds + self.gap_seconds)


class RAPL:
    """CPU package energy counters from Linux powercap, where readable (else ``available`` is False)."""

    def __init__(self) -> None:
        self.files = []
        for path in sorted(glob.glob("/sys/class/powercap/intel-rapl:*/energy_uj")):
            if path.count(":") == 1:  # packages only, not their sub-domains
                try:
                    int(Path(path).read_text())
                except (OSError, ValueError):
                    continue
                self.files.append(path)
        self.available = bool(self.files)

    def read_joules(self) -> float | None:
        if not self.available:
            return None
        return sum(int(Path(p).read_text()) for p in self.files) / 1e6


def timeline_rows(
    call_ends: list[float], cpu_samples: list[tuple[float, float]], energy: list[float | None], params: BurstParams
) -> list[dict[str, Any]]:
    """Bin the run into intervals.

    Args:
        call_ends: completion time of each call, seconds from the run's start.
        cpu_samples: (time, server CPU seconds) at every interval boundary, starting at (0, cpu0).
        energy: package energy in joules at the same boundaries (None entries when unavailable).

    Returns:
        one row per interval: ``{"start", "end", "calls", "rate_ops_per_second", "server_cpu_utilization",
        "package_watts", "phase"}`` where phase is "burst", "gap" or "mixed" (straddles a boundary).
    """
    n = len(cpu_samples) - 1
    counts = [0] * n
    step = params.interval_seconds
    for t in call_ends:
        i = int(t / step)
        if 0 <= i < n:
            counts[i] += 1
    rows = []
    bursts = params.schedule()
    for i in range(n):
        (t0, c0), (t1, c1) = cpu_samples[i], cpu_samples[i + 1]
        start, end = i * step, (i + 1) * step
        inside = any(b0 <= start and end <= b1 + 1e-9 for b0, b1 in bursts)
        touches = any(start < b1 and b0 < end for b0, b1 in bursts)
        e0, e1 = energy[i], energy[i + 1]
        dt = t1 - t0
        rows.append(
            {
                "start": start,
                "end": end,
                "calls": counts[i],
                "rate_ops_per_second": counts[i] / step,
                "server_cpu_utilization": (c1 - c0) / dt if dt > 0 else 0.0,
                "package_watts": (e1 - e0) / dt if e0 is not None and e1 is not None and dt > 0 else None,
                "phase": "burst" if inside else ("mixed" if touches else "gap"),
            }
        )
    return rows


def summarize_mode(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Burst rate (mean over intervals wholly inside bursts) and idle CPU (wholly inside gaps)."""

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    burst = [r for r in rows if r["phase"] == "burst"]
    gap = [r for r in rows if r["phase"] == "gap"]
    watts = [r["package_watts"] for r in gap if r["package_watts"] is not None]
    return {
        "burst_rate_ops_per_second": mean([r["rate_ops_per_second"] for r in burst]),
        "burst_server_cpu_utilization": mean([r["server_cpu_utilization"] for r in burst]),
        "idle_server_cpu_utilization": mean([r["server_cpu_utilization"] for r in gap]),
        "idle_package_watts": mean(watts) if watts else None,
    }


async def _one_mode(engine: Any, admin: Any, server: str, pid: int, mode: str, params: BurstParams) -> dict[str, Any]:
    import psutil

    await admin.set_progress(mode, params.spindown_msec)
    engine.progress.configure(mode, params.spindown_msec, engine.progress.timeout_ub_seconds * 1000)
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        raise SvcframeError(
            f"server pid {pid} is not on this machine: bursts samples the server's CPU locally; run it there"
        ) from None
    rapl = RAPL()
    loop = asyncio.get_running_loop()
    perf = time.perf_counter

    def cpu() -> float:
        t = proc.cpu_times()
        return t.user + t.system

    call_ends: list[float] = []
    n_intervals = round(params.total_seconds / params.interval_seconds)
    start = perf()
    samples = [(0.0, cpu())]
    energy = [rapl.read_joules()]

    async def sampler() -> None:
        for i in range(1, n_intervals + 1):
            await asyncio.sleep(max(0.0, start + i * params.interval_seconds - perf()))
            samples.append((perf() - start, cpu()))
            energy.append(rapl.read_joules())

    sampling = loop.create_task(sampler())
    call = engine.call
    for b0, b1 in params.schedule():
        await _sleep_until(start + b0)
        end = start + b1
        while perf() < end:
            await call(server, "work", [0, None, None, b""], provider_id=params.provider_id)
            call_ends.append(perf() - start)
    await sampling
    rows = timeline_rows(call_ends, samples, energy, params)
    return {"mode": mode, "summary": summarize_mode(rows), "timeline": rows, "rapl_available": rapl.available}


async def _sleep_until(when: float) -> None:
    """Sleep until ``time.perf_counter() >= when``: loop timers may fire up to a millisecond early, and no
    call of a burst may start before it."""
    await asyncio.sleep(max(0.0, when - time.perf_counter()))
    if time.perf_counter() < when:
        await asyncio.sleep(when - time.perf_counter() + 0.001)


async def run_bursts(
    params: BurstParams, server: str, on_step: Callable[[str, int, int], None] | None = None
) -> dict[str, Any]:
    """Run every mode against ``server`` (which hosts the self-test provider and is on this machine).

    The server's progress mode is restored afterwards. ``on_step(mode, done, total)`` is called before each
    mode (progress display): ``done`` modes of ``total`` are complete.

    Raises:
        SvcframeError: the server cannot be reached or refuses the progress change.
    """

    original_affinity = os.sched_getaffinity(0)
    if params.client_core is not None:
        os.sched_setaffinity(0, [params.client_core])  # restored at the end
    try:
        return await _run_bursts(params, server, on_step)
    finally:
        os.sched_setaffinity(0, original_affinity)


async def _run_bursts(
    params: BurstParams, server: str, on_step: Callable[[str, int, int], None] | None
) -> dict[str, Any]:
    from svcframe.admin import ServiceHandle
    from svcframe.engine import Engine

    async with Engine(None) as engine:
        admin = ServiceHandle(engine, server, params.admin_provider_id)
        status = await admin.status()
        original = await admin.query_config("engine.[progress_mode, progress_spindown_msec]")
        modes: list[dict[str, Any]] = []
        try:
            for mode in params.modes:
                if on_step is not None:
                    on_step(mode, len(modes), len(params.modes))
                modes.append(await _one_mode(engine, admin, server, int(status["pid"]), mode, params))
        finally:
            await admin.set_progress(original[0], original[1])
    return {"kind": "svcframe-bursts", "parameters": asdict(params), "server": server, "modes": modes}


def plot_bursts(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write :func:`bursts_figure` as an image (PNG by suffix)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    bursts_figure(results).savefig(out, dpi=110)
    return out


def bursts_figure(results: dict[str, Any]) -> Any:
    """Figure 6 analogue: one panel per mode, call rate (left axis) and server CPU or power (right); the title
    states the schedule (bursts, their length, the gaps, the interval), the spindown and the server."""
    from .plotting import require_matplotlib

    require_matplotlib()
    from matplotlib.figure import Figure

    modes = results["modes"]
    p = results["parameters"]
    fig = Figure(figsize=(8, 2.6 * len(modes) + 0.6), layout="constrained")
    axes = fig.subplots(len(modes), 1, sharex=True, squeeze=False)
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        rows = mode["timeline"]
        x = [r["start"] for r in rows]
        ax.step(x, [r["rate_ops_per_second"] for r in rows], where="post", color="tab:blue", label="call rate")
        ax.set_ylabel("calls/s", color="tab:blue")
        ax.set_ylim(bottom=0)
        right = ax.twinx()
        watts = [r["package_watts"] for r in rows]
        if mode.get("rapl_available") and all(w is not None for w in watts):
            right.step(x, watts, where="post", color="tab:red", label="package power")
            right.set_ylabel("package power (W)", color="tab:red")
        else:
            cpu = [100 * r["server_cpu_utilization"] for r in rows]
            right.step(x, cpu, where="post", color="tab:red", label="server CPU")
            right.set_ylabel("server CPU (%)", color="tab:red")
            right.set_ylim(0, 105)
        s = mode["summary"]
        rate = quantity(s["burst_rate_ops_per_second"] or 0.0, "calls/s")
        idle = 100 * (s["idle_server_cpu_utilization"] or 0.0)
        ax.set_title(f"{mode['mode']}: {rate} in bursts, server CPU {idle:.1f}% when idle", fontsize=10)
    axes[-1, 0].set_xlabel("time (s)")
    fig.suptitle(
        f"noop bursts: {p['bursts']} x {quantity(p['burst_seconds'], 's')} with {quantity(p['gap_seconds'], 's')} "
        f"gaps, {quantity(p['interval_seconds'], 's')} intervals, spindown {quantity(p['spindown_msec'], 'ms')}; "
        f"server {results['server']}",
        fontsize=10,
    )  # fmt: skip
    return fig
