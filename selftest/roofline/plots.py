"""Plots of the three rooflines (matplotlib, object-oriented API, Agg backend, imported lazily through
``selftest.plotting.require_matplotlib``: ``plot`` is an optional extra, ``pip install 'svcframe[plot]'``).

* :func:`roofline_figure` / :func:`plot`: the data-service roofline of one metric with its validation
  samples (Carns et al. 2025, Figures 13-14), samples above its ceiling flagged;
* :func:`io_figure` / :func:`plot_io`: I/O rooflines with workloads as points (Zhu & Neuwirth Figs. 3-4);
* :func:`workflow_figure` / :func:`plot_workflow`: a workflow roofline, its wall, zones and runs (Ding et
  al. Figs. 1-3);
* :func:`placement_figure` / :func:`plot_placement`: a workload's points over the data-service ceilings,
  with score, region and headroom.

Every plot states its parameters (units, sizes) in its title, labels and legend. ``*_figure`` return the
matplotlib :class:`~matplotlib.figure.Figure` (no pyplot state: safe in threads, usable in notebooks);
``plot*`` write the file (the format follows the suffix, ``.png`` for PNG) and return its path.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from svcframe.units import quantity

from .dataservice import (
    BYTE_RATE_UNITS,
    REGION_CLIENT_BOUND,
    REGION_SERVER_BOUND,
    Platform,
    Roofline,
    bytes_per_second,
)
from .io import IOPoint, IORoofline
from .workflow import ZONE_GOOD_GOOD, ZONE_GOOD_POOR, ZONE_POOR_GOOD, ZONE_POOR_POOR, WorkflowRoofline

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _ratio_label(x: float, _pos: object = None) -> str:
    # 0.25 -> "1/4", 2 -> "2": service ratios read as servers per client.
    if x <= 0:
        return ""
    if x < 1:
        return f"1/{1 / x:.3g}"
    return f"{x:.3g}"


def _ridge_text(x: float) -> str:
    # 0.25 -> "0.25 (1/4)"; 1 -> "1".
    return f"{x:.3g} ({_ratio_label(x)})" if x < 1 else f"{x:.3g}"


_RELATION = {"=": "= ", "<=": "≤ ", ">=": "≥ ", "?": "? "}
"""How a ridge drawn from measured parameters relates to the true one (:attr:`Roofline.ridge_relation`)."""


def _at_least(lower_bound: bool) -> str:
    # "≥ " before a parameter that is a lower bound (Saturation), "= " before one that is not
    return "≥ " if lower_bound else "= "


def plot(roofline: Roofline, path: str | os.PathLike[str], title: str | None = None) -> Path:
    """Draw the roofline with its validation samples (:func:`roofline_figure`) and write it as an image.

    Args:
        roofline: the model to draw; it may have no samples.
        path: output file; its suffix picks the format (``.png`` for PNG). The directory must exist.
        title: figure title; default ``"<metric name> roofline"``.

    Returns:
        ``path`` as a :class:`Path`.

    Raises:
        OSError: the file cannot be written.
        PlottingUnavailable: matplotlib is not installed.
    """
    out = Path(path)
    roofline_figure(roofline, title).savefig(out, dpi=120)
    return out


def roofline_figure(roofline: Roofline, title: str | None = None) -> Figure:
    """The data-service roofline with its validation samples, as a Figure.

    Log x axis (service ratio), linear y axis (rate per client process, in the metric's unit, as the tables
    show it), as in Carns 2025, section 5.1 and Figures 13–14: the upper ceiling (``pc.max``, ``ps.max``)
    solid, the lower one (``pc.min``, ``ps.min``) dashed, the band between shaded, the ridge point marked and
    annotated inside the axes, and samples as semi-transparent points coloured by server process count, those
    with more than one process per core circled in red (:attr:`~selftest.roofline.Sample.oversubscribed`:
    outside the model) and those above the upper ceiling boxed in orange. A parameter that is a lower bound
    (:class:`~selftest.roofline.Saturation`) has its part of the ceiling marked with upward arrows (the true
    ceiling lies higher) and ``≥`` in the legend; the ridge is marked ``≤`` or ``≥`` (which way a larger
    parameter moves it). Below the axes: the legend (never over the data) and the roofline's findings
    (:meth:`~selftest.roofline.Roofline.findings`: what its own numbers show, each computed from them). The x
    range spans the samples and both ridge points with a factor 2 margin each side.

    Args:
        roofline: the model to draw; it may have no samples.
        title: figure title; default ``"<metric name> roofline"``.

    Raises:
        PlottingUnavailable: matplotlib is not installed.
    """
    _require_matplotlib()
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    rl = roofline
    metric = rl.metric
    unit = metric.unit
    ridges = {b: rl.ridge(b) for b in ("max", "min")}
    ratios = [s.service_ratio for s in rl.samples]
    lo = min([*ratios, *ridges.values()]) / 2
    hi = max([*ratios, *ridges.values()]) * 2
    # Evaluate on a dense log grid plus the kinks, so the corners are drawn sharp.
    kinks = [v for v in (*ridges.values(), 1.0) if lo < v < hi]
    xs = np.union1d(np.geomspace(lo, hi, 400), kinks)
    y_max = rl.attainable(xs, "max")
    y_min = rl.attainable(xs, "min")
    findings = rl.findings()
    notes = _wrapped(findings, 105)

    fig = Figure(figsize=(8, 5.6 + 0.16 * len(notes)), layout="constrained")
    if notes:
        ax, note_ax = fig.subplots(2, 1, height_ratios=[4.6, 0.25 + 0.16 * len(notes)])
        note_ax.axis("off")
        note_ax.text(0.0, 1.0, "\n".join(notes), va="top", ha="left", fontsize="small", transform=note_ax.transAxes,
                     color="dimgray")  # fmt: skip
    else:
        ax = fig.subplots()
    pc_mark, ps_mark = ("≥ " if rl.pc_lower_bound else ""), ("≥ " if rl.ps_lower_bound else "")
    ax.fill_between(xs, y_min, y_max, color="tab:blue", alpha=0.15, linewidth=0, label="ceiling range")
    ax.plot(xs, y_max, color="tab:blue", linestyle="-", linewidth=2,
            label=f"max ceiling: Pc {pc_mark}{metric.format(rl.pc.max)}, Ps {ps_mark}{metric.format(rl.ps.max)}")  # fmt: skip
    ax.plot(xs, y_min, color="tab:blue", linestyle="--", linewidth=1.5,
            label=f"min ceiling: Pc {pc_mark}{metric.format(rl.pc.min)}, Ps {ps_mark}{metric.format(rl.ps.min)}")  # fmt: skip
    x_star = ridges["max"]
    y_star = rl.attainable(x_star, "max")
    if rl.pc_lower_bound or rl.ps_lower_bound:  # arrows up from the part of the ceiling that lies too low
        part = ((xs <= x_star) & rl.ps_lower_bound) | ((xs >= x_star) & rl.pc_lower_bound)
        marks: list[float] = list(np.geomspace(xs[part].min(), xs[part].max(), 5)[1:-1]) if part.sum() > 1 else []
        for x in marks:
            y = float(rl.attainable(x, "max"))
            ax.annotate("", xy=(x, y * 1.12), xytext=(x, y), arrowprops={"arrowstyle": "->", "color": "tab:blue"},
                        annotation_clip=True)  # fmt: skip
        ax.plot([], [], color="tab:blue", marker="$\\uparrow$", linestyle="none",
                label="lower bound: the true ceiling lies higher")  # fmt: skip
    ridge_text = f"ridge X* {_RELATION[rl.ridge_relation]}{_ridge_text(x_star)}"
    ax.plot([x_star], [y_star], marker="D", color="tab:red", markersize=8, linestyle="none", label=ridge_text)
    if not math.isclose(ridges["min"], x_star):
        ax.plot([ridges["min"]], [rl.attainable(ridges["min"], "min")], marker="D", markersize=6,
                markerfacecolor="none", color="tab:red", linestyle="none",
                label=f"ridge (min ceiling) = {_ridge_text(ridges['min'])}")  # fmt: skip

    top = float(np.max(y_max))
    if rl.samples:
        rates = np.array([s.rate_per_client for s in rl.samples])
        servers = np.array([s.servers for s in rl.samples])
        top = max(top, float(rates.max()))
        counts = sorted(set(servers.tolist()))
        if len(counts) <= 10:
            cmap = colormaps["viridis"]
            for i, n in enumerate(counts):
                sel = servers == n
                ax.scatter(np.asarray(ratios)[sel], rates[sel], color=cmap(i / max(len(counts) - 1, 1)), alpha=0.6,
                           edgecolors="black", linewidths=0.5, zorder=3,
                           label=f"{n} server process{'es' if n != 1 else ''} (that served)")  # fmt: skip
        else:
            points = ax.scatter(ratios, rates, c=servers, cmap="viridis", alpha=0.6, edgecolors="black",
                                linewidths=0.5, zorder=3, label="validation samples")  # fmt: skip
            fig.colorbar(points, ax=ax, label="server processes that served")
        shared = np.array([s.oversubscribed for s in rl.samples])
        if shared.any():
            ax.scatter(np.asarray(ratios)[shared], rates[shared], s=140, facecolors="none", edgecolors="tab:red",
                       linewidths=1.2, zorder=4, label="> 1 process per core: not modelled, excluded")  # fmt: skip
        above = rl.above_ceiling()
        if above:
            worst = max(excess for _, excess in above)
            ax.scatter([s.service_ratio for s, _ in above], [s.rate_per_client for s, _ in above], s=180, marker="s",
                       facecolors="none", edgecolors="tab:orange", linewidths=1.5, zorder=4,
                       label=f"above the max ceiling (up to +{worst:.0%})")  # fmt: skip

    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(0, top * 1.3)
    # the ridge's label, inside the axes on the side with room, never over the y axis title
    room_right = math.log(hi / x_star) > math.log(x_star / lo)
    ax.annotate(f"{ridge_text}\n{metric.format(y_star)}", xy=(x_star, y_star), xytext=(12 if room_right else -12, 10),
                textcoords="offset points", ha="left" if room_right else "right", va="bottom", color="tab:red",
                fontsize="small", arrowprops={"arrowstyle": "->", "color": "tab:red"})  # fmt: skip
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))
    ax.xaxis.set_major_formatter(FuncFormatter(_ratio_label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: rate_tick(v, unit)))
    ax.set_xlabel("service ratio (server processes that served / client processes)")
    ax.set_ylabel(metric.label if unit in metric.label else f"{metric.label} ({unit})")
    ax.set_title(title if title is not None else f"{metric.name} roofline")
    ax.grid(True, which="major", alpha=0.3)
    legend_below(fig, ncols=2, fontsize="small")
    keep_inside(fig)
    return fig


def _wrapped(lines: Sequence[str], width: int) -> list[str]:
    """Each line wrapped at ``width`` characters, continuation lines indented."""
    import textwrap

    out: list[str] = []
    for line in lines:
        out += textwrap.wrap(line, width, subsequent_indent="    ", break_on_hyphens=False) or [""]
    return out


def rate_tick(value: float, unit: str) -> str:
    """A tick of a rate axis labelled ``(unit)``, in the notation of the tables: ``"20 k"`` under ``(ops/s)``
    (``svcframe.units.quantity``), ``"0.25"`` under ``(GiB/s)`` (a bandwidth keeps its unit)."""
    if unit in BYTE_RATE_UNITS or abs(value) < 1000:
        return f"{value:g}"
    return quantity(value)


def legend_below(fig: Figure, ncols: int, fontsize: str) -> None:
    """The figure's legend below its axes, in ``ncols`` columns, or in one when that is wider than the figure (long
    labels: a placement with several bandwidth ceilings); never over the data."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    legend = fig.legend(loc="outside lower center", ncols=ncols, fontsize=fontsize)
    if ncols == 1:
        return
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    if legend.get_window_extent(canvas.get_renderer()).width > fig.bbox.width:
        legend.remove()
        fig.legend(loc="outside lower center", ncols=1, fontsize=fontsize)


def keep_inside(fig: Figure) -> None:
    """Move every annotation of ``fig`` that runs past its axes (labels of points, placed in offset points) back
    inside them: first to the other side of the point it labels (left/right, above/below), then, if still out,
    shifted in; one that then lies over a label placed before it is moved above that label, or below it when the
    axes have no room above. Call it last: it measures the texts as drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Annotation

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    points_per_pixel = 72.0 / fig.dpi
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        placed: list[Any] = []  # the extents of the labels placed so far in these axes
        for text in ax.texts:
            if not isinstance(text, Annotation) or not text.get_text() or text.anncoords != "offset points":
                continue
            ext = text.get_window_extent(renderer)
            dx, dy = text.get_position()
            if (ext.x1 > box.x1 and dx >= 0) or (ext.x0 < box.x0 and dx < 0):
                dx = -dx
                text.set_horizontalalignment("right" if dx < 0 else "left")
            if (ext.y1 > box.y1 and dy >= 0) or (ext.y0 < box.y0 and dy < 0):
                dy = -dy
                text.set_verticalalignment("top" if dy < 0 else "bottom")
            text.set_position((dx, dy))
            ext = text.get_window_extent(renderer)
            shift_x = min(0.0, box.x1 - ext.x1) + max(0.0, box.x0 - ext.x0)
            shift_y = min(0.0, box.y1 - ext.y1) + max(0.0, box.y0 - ext.y0)
            dx, dy = dx + shift_x * points_per_pixel, dy + shift_y * points_per_pixel
            text.set_position((dx, dy))
            ext = text.get_window_extent(renderer)
            for other in placed:
                if not ext.overlaps(other):
                    continue
                up, down = other.y1 - ext.y0 + 2, ext.y1 - other.y0 + 2  # pixels to clear it either way
                move = up if ext.y1 + up <= box.y1 else -down if ext.y0 - down >= box.y0 else 0.0
                dy += move * points_per_pixel
                text.set_position((dx, dy))
                ext = text.get_window_extent(renderer)
            placed.append(ext)
    canvas.draw()


def _require_matplotlib() -> None:
    # matplotlib is optional: one clear error naming the extra when it is missing (selftest/plotting.py).
    from ..plotting import require_matplotlib

    require_matplotlib()


# ----------------------------------------------------------------------------------------------------------
# The I/O roofline
# ----------------------------------------------------------------------------------------------------------

_COLORS = ("tab:blue", "tab:green", "tab:purple", "tab:brown")


def _bytes_text(n: float) -> str:
    # 4096 -> "4 KiB", 1048576 -> "1 MiB", 1100 -> "1,100 B".
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and (n / size) == round(n / size, 2):
            return f"{n / size:g} {unit}"
    return f"{n:,.0f} B"


def io_figure(
    rooflines: Sequence[IORoofline], points: Mapping[str, Sequence[IOPoint]] | None = None, title: str | None = None
) -> Figure:
    """The I/O roofline(s) with workloads as points (Zhu & Neuwirth section IV-A, Figs. 3-4), as a Figure.

    Log-log: x the I/O intensity ``λ`` (operations per byte; the top axis reads it as bytes per operation),
    y operations per second. Each roofline ``min(ψ, κ·λ)`` is a line labelled ``"<name> roof"`` with its
    ``ψ``, ``κ`` and scope, its ridge point marked and annotated with ``λ*`` and the bandwidth score
    (eq. 14); the points placed on a roofline (``points[roofline.name]``) are drawn in its colour and
    annotated with their score (eqs. 10-11) when there are at most 6.

    Args:
        rooflines: one or more I/O rooflines (storage, network).
        points: workload points per roofline name (may be empty or miss a name).
        title: default ``"I/O roofline"`` with the rooflines' scope.

    Raises:
        ValueError: ``rooflines`` is empty.
        PlottingUnavailable: matplotlib is not installed.
    """
    if not rooflines:
        raise ValueError("io_figure needs at least one I/O roofline")
    _require_matplotlib()
    from matplotlib.figure import Figure

    points = points or {}
    ridges = [rl.ridge_intensity for rl in rooflines]
    xs_all = ridges + [p.intensity_ops_per_byte for ps in points.values() for p in ps]
    lo, hi = min(xs_all) / 30, max(xs_all) * 30
    xs = np.union1d(np.geomspace(lo, hi, 400), [r for r in ridges if lo < r < hi])
    fig = Figure(figsize=(9, 7), layout="constrained")
    ax = fig.subplots()
    for i, rl in enumerate(rooflines):
        color = _COLORS[i % len(_COLORS)]
        ax.plot(
            xs,
            rl.attainable(xs),
            color=color,
            linewidth=2,
            label=f"{rl.name} roof, {rl.scope}: ψ = {quantity(rl.psi_ops_per_second, 'ops/s')}, "
            f"κ = {quantity(rl.kappa_bytes_per_second / 2**30, 'GiB/s', keep_unit=True)}",
        )
        ridge = rl.ridge_intensity
        ax.plot([ridge], [rl.psi_ops_per_second], marker="D", color=color, markersize=7, linestyle="none")
        ax.annotate(
            f"ridge λ* = {ridge:.3g} ops/B (1 op per {_bytes_text(1 / ridge)})\n"
            f"bandwidth score {quantity(rl.system_score_bandwidth() / 2**30, 'GiB/s', keep_unit=True)}",
            xy=(ridge, rl.psi_ops_per_second),
            xytext=(8, 8),
            textcoords="offset points",
            fontsize="small",
            color=color,
        )
        placed = list(points.get(rl.name, ()))
        if placed:
            ax.scatter(
                [p.intensity_ops_per_byte for p in placed],
                [max(p.ops_per_second, 1e-9) for p in placed],
                color=color,
                edgecolors="black",
                linewidths=0.5,
                alpha=0.8,
                zorder=3,
                label=f"{rl.name} workloads ({len(placed)})",
            )
            if len(placed) <= 6:
                for p in placed:
                    text = ax.annotate(
                        f"{p.label}: score {rl.application_score(p):.2f}",
                        xy=(p.intensity_ops_per_byte, max(p.ops_per_second, 1e-9)),
                        xytext=(5, -12),
                        textcoords="offset points",
                        fontsize="x-small",
                    )
                    text.set_in_layout(False)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    rates = [p.ops_per_second for ps in points.values() for p in ps if p.ops_per_second > 0]
    ax.set_ylim(min([*(float(rl.attainable(lo)) for rl in rooflines), *rates]) / 3,
                max(rl.psi_ops_per_second for rl in rooflines) * 5)  # fmt: skip
    ax.set_xlabel("I/O intensity λ (operations per byte)")
    ax.set_ylabel("operations per second")
    top = ax.secondary_xaxis("top", functions=(_inverse, _inverse))
    top.set_xlabel("bytes per operation")
    ax.set_title(title if title is not None else f"I/O roofline (Zhu & Neuwirth eq. 3), {rooflines[0].scope}")
    ax.grid(True, which="major", alpha=0.3)
    legend_below(fig, ncols=1, fontsize="x-small")
    keep_inside(fig)
    return fig


def _inverse(x: Any) -> Any:  # λ <-> bytes per operation, for the top axis
    with np.errstate(divide="ignore"):
        return 1.0 / np.asarray(x, dtype=np.float64)


def plot_io(
    rooflines: Sequence[IORoofline],
    path: str | os.PathLike[str],
    points: Mapping[str, Sequence[IOPoint]] | None = None,
    title: str | None = None,
) -> Path:
    """Write :func:`io_figure` to ``path`` (PNG by suffix) and return it as a :class:`Path`.

    Raises:
        OSError: the file cannot be written.
    """
    return _save(io_figure(rooflines, points, title), path)


# ----------------------------------------------------------------------------------------------------------
# The workflow roofline
# ----------------------------------------------------------------------------------------------------------

_ZONE_COLORS = {
    ZONE_GOOD_GOOD: "tab:green",
    ZONE_GOOD_POOR: "gold",
    ZONE_POOR_GOOD: "tab:orange",
    ZONE_POOR_POOR: "tab:red",
}
"""Ding et al. Fig. 2a's colours of the four zones."""


def workflow_figure(
    roofline: WorkflowRoofline, runs: Sequence[Mapping[str, Any]] = (), title: str | None = None
) -> Figure:
    """The workflow roofline (Ding et al. Fig. 1) with its zones (Fig. 2a) and measured runs, as a Figure.

    Log-log: x parallel tasks (from one task), y tasks per second. Node ceilings are dashed diagonals, system
    ceilings dash-dotted horizontals, each labelled with its figures; the roof (their minimum) is solid up to
    the parallelism wall (a vertical line), past which the area is grey: more parallel tasks than the
    platform's client processes (cores) can run without sharing cores, which the model does not predict.
    With both targets, the attainable area is shaded in the four zones of Fig. 2a (green: good makespan and
    throughput; yellow: good makespan, poor throughput; orange: poor makespan, good throughput; red: both
    poor), the target makespan (a diagonal) and throughput (a horizontal) each in a style of its own; without
    them, node-bound (blue) and system-bound (orange) parts are shaded (Fig. 3). Runs
    (:meth:`WorkflowRoofline.place` results) are points annotated with their label, bound and zone; a run
    beyond the wall is an open circle, said to be outside the model. The legend is below the axes.

    Raises:
        PlottingUnavailable: matplotlib is not installed.
    """
    _require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ns = [float(r["parallel_tasks"]) for r in runs]
    hi = max([roofline.wall, *ns]) * 4.0
    xs = np.geomspace(1.0, hi, 600)
    roof = roofline.attainable(xs)
    rates = [float(r["tasks_per_second"]) for r in runs]
    horizontals = [c.tasks_per_second for c in roofline.ceilings if c.kind == "system"]
    bottom = min([*roof, *rates]) / 10
    top = max([*roof, *rates, *horizontals]) * 3
    fig = Figure(figsize=(9, 7), layout="constrained")
    ax = fig.subplots()
    inside = xs <= roofline.wall
    tm, tt = roofline.target_makespan_seconds, roofline.target_throughput_tasks_per_second
    if tm is not None and tt is not None:
        y_mk = xs / tm  # above: good makespan
        y_tp = np.full_like(xs, tt)  # above: good throughput
        low = np.full_like(xs, bottom)
        for zone, (y0, y1) in {
            ZONE_GOOD_GOOD: (np.maximum(y_mk, y_tp), roof),
            ZONE_GOOD_POOR: (y_mk, np.minimum(y_tp, roof)),
            ZONE_POOR_GOOD: (y_tp, np.minimum(y_mk, roof)),
            ZONE_POOR_POOR: (low, np.minimum(np.minimum(y_mk, y_tp), roof)),
        }.items():
            ax.fill_between(
                xs,
                y0,
                y1,
                where=inside & (y1 > y0),
                interpolate=True,
                color=_ZONE_COLORS[zone],
                alpha=0.25,
                linewidth=0,
                label=zone,
            )
        ax.plot(xs, y_mk, color="black", linestyle=(0, (1, 1.5)), linewidth=1.4,
                label=f"target makespan {tm:g} s per task")  # fmt: skip
        ax.axhline(tt, color="tab:purple", linestyle=(0, (8, 3, 1, 3)), linewidth=1.4,
                   label=f"target throughput {tt:g} tasks/s")  # fmt: skip
    else:
        kinds = np.array([roofline.bound(x).kind for x in xs])
        for kind, color in (("node", "tab:blue"), ("system", "tab:orange")):
            mask = kinds == kind
            mask[1:] |= mask[:-1]  # one sample past each change, so the two shades meet without a gap
            ax.fill_between(
                xs, bottom, roof, where=inside & mask, color=color, alpha=0.15, linewidth=0, label=f"{kind}-bound"
            )
    for i, c in enumerate(roofline.ceilings):
        style = "--" if c.kind == "node" else "-."
        ax.plot(
            xs,
            c.at(xs),
            color=_COLORS[i % len(_COLORS)],
            linestyle=style,
            linewidth=1.2,
            label=f"{c.name} ({c.seconds_per_task:.3g} s per task)"
            if c.kind == "node"
            else f"{c.name} ({c.tasks_per_second:.3g} tasks/s)",
        )
    ax.plot(xs[inside], roof[inside], color="black", linewidth=2.2, label="attainable (Ding eq. 1)")
    ax.axvline(roofline.wall, color="dimgray", linewidth=2, label=f"parallelism wall: {roofline.wall} tasks")
    ax.axvspan(roofline.wall, hi, color="lightgray", alpha=0.6, linewidth=0,
               label="beyond the wall: tasks would share cores (outside the model)")  # fmt: skip
    if runs:
        beyond = np.array([bool(r.get("beyond_wall")) for r in runs])
        xs_runs, ys_runs = np.asarray(ns), np.asarray(rates)
        if (~beyond).any():
            ax.scatter(xs_runs[~beyond], ys_runs[~beyond], color="black", zorder=4, label="measured runs")
        if beyond.any():
            ax.scatter(xs_runs[beyond], ys_runs[beyond], facecolors="none", edgecolors="black", linewidths=1.2,
                       zorder=4, label="measured runs beyond the wall (outside the model)")  # fmt: skip
        for r, x, y in zip(runs, ns, rates, strict=True):
            zone = f"\n{r['zone']}" if r.get("zone") else ""
            wall = ", beyond the wall" if r.get("beyond_wall") else ""
            text = ax.annotate(
                f"{r.get('label') or 'run'}: {y:.3g} tasks/s, {r['bound_kind']}-bound{wall}{zone}",
                xy=(x, y),
                xytext=(6, -6),
                textcoords="offset points",
                va="top",
                fontsize="x-small",
            )
            text.set_in_layout(False)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(1.0, hi)
    ax.set_ylim(bottom, top)
    # tasks as plain numbers (1, 2, 5, 10), not 2×10^0; within a decade or two the minor ticks are labelled too
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain if hi <= 20 else NullFormatter())
    ax.set_xlabel("parallel tasks")
    ax.set_ylabel("throughput (tasks per second)")
    ax.set_title(title if title is not None else f"workflow roofline (Ding et al. eq. 1): {roofline.name}")
    ax.grid(True, which="major", alpha=0.3)
    legend_below(fig, ncols=2, fontsize="x-small")
    keep_inside(fig)
    return fig


def plot_workflow(
    roofline: WorkflowRoofline,
    path: str | os.PathLike[str],
    runs: Sequence[Mapping[str, Any]] = (),
    title: str | None = None,
) -> Path:
    """Write :func:`workflow_figure` to ``path`` (PNG by suffix) and return it as a :class:`Path`.

    Raises:
        OSError: the file cannot be written.
    """
    return _save(workflow_figure(roofline, runs, title), path)


# ----------------------------------------------------------------------------------------------------------
# A workload placed on the data-service rooflines
# ----------------------------------------------------------------------------------------------------------


def placement_figure(platform: Platform, placement: Mapping[str, Any], title: str | None = None) -> Figure:
    """A workload's points over the platform's data-service ceilings, with score, region and headroom.

    Log x (service ratio), linear y (calls per second per client process), as the data-service roofline
    (Carns et al. 2025, Figures 13-14): the RPC rate ceiling ``R_rpc(X)`` (solid, labelled ``"RPC rate
    ceiling"``), the bandwidth ceiling per call ``R_bw(X) / bytes per call`` for each bytes-per-call of the
    workload (dashed), the ridge of the RPC rate marked, and each point (:func:`selftest.roofline.placement.place`
    result) coloured by region and annotated with its score, region and headroom (at most 10 annotations);
    points with more than one process per core are circled in red.

    Args:
        platform: the platform the workload was placed on.
        placement: the result of ``place(platform, workload)``.
        title: default ``"<workload> on <platform>"``.

    Raises:
        PlottingUnavailable: matplotlib is not installed.
    """
    _require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    bound = placement["bound"]
    rows = placement["points"]
    rpc = platform.roofline("rpc_rate")
    ratios = [r["service_ratio"] for r in rows]
    ridge = rpc.ridge(bound)
    lo = min([*ratios, ridge]) / 2
    hi = max([*ratios, ridge, 1.0]) * 2
    xs = np.union1d(np.geomspace(lo, hi, 400), [v for v in (ridge, 1.0) if lo < v < hi])
    fig = Figure(figsize=(9, 7), layout="constrained")
    ax = fig.subplots()
    y_rpc = rpc.attainable(xs, bound)
    ax.plot(
        xs,
        y_rpc,
        color="tab:blue",
        linewidth=2,
        label=f"RPC rate ceiling: Pc {_at_least(rpc.pc_lower_bound)}{rpc.metric.format(getattr(rpc.pc, bound))}, "
        f"Ps {_at_least(rpc.ps_lower_bound)}{rpc.metric.format(getattr(rpc.ps, bound))}",
    )
    ax.plot(
        [ridge],
        [rpc.attainable(ridge, bound)],
        marker="D",
        color="tab:red",
        linestyle="none",
        label=f"RPC rate ridge X* {_RELATION[rpc.ridge_relation]}{_ridge_text(ridge)}",
    )
    bandwidth = platform.rooflines.get("bandwidth")
    top = max(float(np.max(y_rpc)), *(r["rate_per_client_ops_per_second"] for r in rows))
    if bandwidth is not None:
        for i, size in enumerate(sorted({r["bytes_per_call"] for r in rows if r["bytes_per_call"] > 0})):
            y_bw = bytes_per_second(bandwidth.metric, bandwidth.attainable(xs, bound)) / size
            above = " (above the chart)" if float(np.min(y_bw)) > top * 1.3 else ""
            ax.plot(
                xs,
                y_bw,
                color=_COLORS[(i + 1) % len(_COLORS)],
                linestyle="--",
                linewidth=1.5,
                label=f"bandwidth ceiling at {_bytes_text(size)} per call: "
                f"Pc {_at_least(bandwidth.pc_lower_bound)}{bandwidth.metric.format(getattr(bandwidth.pc, bound))}, "
                f"Ps {_at_least(bandwidth.ps_lower_bound)}{bandwidth.metric.format(getattr(bandwidth.ps, bound))}"
                f"{above}",
            )
    region_colors = {REGION_SERVER_BOUND: "tab:orange", REGION_CLIENT_BOUND: "tab:green"}
    for region, color in region_colors.items():
        sel = [r for r in rows if r["region"] == region]
        if sel:
            ax.scatter(
                [r["service_ratio"] for r in sel],
                [r["rate_per_client_ops_per_second"] for r in sel],
                color=color,
                edgecolors="black",
                linewidths=0.6,
                s=50,
                zorder=4,
                label=f"{placement['workload']}: {region}",
            )
    shared = [r for r in rows if r["oversubscribed"]]
    if shared:
        ax.scatter(
            [r["service_ratio"] for r in shared],
            [r["rate_per_client_ops_per_second"] for r in shared],
            s=160,
            facecolors="none",
            edgecolors="tab:red",
            linewidths=1.2,
            zorder=5,
            label="> 1 process per core: not modelled",
        )
    if len(rows) <= 10:
        for r in rows:
            headroom = f"{r['headroom']:.2f}x" if r["headroom"] is not None else "-"
            text = ax.annotate(
                f"{r['servers']}x{r['clients']}: score {r['score']:.2f}, {r['region']}\n"
                f"headroom {headroom} ({r['limited_by']})",
                xy=(r["service_ratio"], r["rate_per_client_ops_per_second"]),
                xytext=(6, 6),
                textcoords="offset points",
                fontsize="x-small",
            )
            text.set_in_layout(False)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(0, top * 1.3)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))
    ax.xaxis.set_major_formatter(FuncFormatter(_ratio_label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: rate_tick(v, "ops/s")))
    ax.set_xlabel("service ratio (server processes that served / client processes)")
    ax.set_ylabel("calls per second per client process (ops/s)")
    ax.set_title(
        title if title is not None else f"{placement['workload']} on {placement['platform']} ({bound} ceilings)"
    )
    ax.grid(True, which="major", alpha=0.3)
    legend_below(fig, ncols=2, fontsize="x-small")
    keep_inside(fig)
    return fig


def plot_placement(
    platform: Platform, placement: Mapping[str, Any], path: str | os.PathLike[str], title: str | None = None
) -> Path:
    """Write :func:`placement_figure` to ``path`` (PNG by suffix) and return it as a :class:`Path`.

    Raises:
        OSError: the file cannot be written.
    """
    return _save(placement_figure(platform, placement, title), path)


def _save(fig: Figure, path: str | os.PathLike[str]) -> Path:
    out = Path(path)
    fig.savefig(out, dpi=120)
    return out
