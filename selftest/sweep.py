"""The server-process sweep: aggregate rate of one server node against its server process count.

Carns et al. 2025 (``papers/carns2025-data-service-roofline.txt``, section 4.3, Figures 9 and 10) run
1..n server processes on one node (n = usable physical cores), saturate them from many client processes,
and plot the node's aggregate rate against the server process count: RPC rate grows almost linearly
(CPU-bound, Figure 9), bandwidth levels off at the node's network links (Figure 10). The result decides
how many server processes the saturation measurement of ``Ps`` runs: all of them, when the curve never
declines.

This module turns the sweep's rows (``stage == "sweep"``, and the ``Ps`` rows, which are the sweep's last
point) into points and draws them; ``selftest/collect.py`` measures them. Pure analysis, no engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .roofline import METRICS


def sweep_points(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Aggregate rate per server process count, per metric.

    Args:
        rows: measurement rows with ``stage`` (``"sweep"`` or ``"Ps"``; others are ignored), ``metric``,
            ``servers``, ``clients`` and ``aggregate`` (the node's aggregate rate, in the metric's unit).

    Returns:
        ``{metric: [{"servers", "clients", "samples", "min", "median", "max"}, ...]}`` sorted by
        ``servers``; several samples at one count (the repeated ``Ps`` measurement) give a min–median–max.
    """
    by: dict[str, dict[int, list[Mapping[str, Any]]]] = {}
    for r in rows:
        if r["stage"] in ("sweep", "Ps"):
            by.setdefault(r["metric"], {}).setdefault(int(r["servers"]), []).append(r)
    out: dict[str, list[dict[str, Any]]] = {}
    for metric, counts in by.items():
        points = []
        for n in sorted(counts):
            values = np.array([float(r["aggregate"]) for r in counts[n]])
            points.append(
                {
                    "servers": n,
                    "clients": int(counts[n][0]["clients"]),
                    "samples": int(values.size),
                    "min": float(values.min()),
                    "median": float(np.median(values)),
                    "max": float(values.max()),
                }
            )
        out[metric] = points
    return out


def plot_sweep(
    points: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike[str], title: str | None = None,
    parameters: Mapping[str, str] | None = None,
) -> Path:  # fmt: skip
    """Write :func:`sweep_figure` as an image (``.png``); returns ``path`` as a :class:`Path`.

    Raises:
        ValueError: ``points`` is empty.
    """
    out = Path(path)
    sweep_figure(points, title, parameters).savefig(out, dpi=110)
    return out


def sweep_figure(
    points: Mapping[str, Sequence[Mapping[str, Any]]], title: str | None = None,
    parameters: Mapping[str, str] | None = None,
) -> Any:  # fmt: skip
    """The sweep (Carns 2025, Figures 9 and 10) as a Figure: one panel per metric, x = server processes on the
    node, y = the node's aggregate rate (median, with a min–max bar where the count was repeated), and a
    dashed line of perfect scaling from the one-process point; one legend below the panels.

    Args:
        points: :func:`sweep_points` output.
        title: figure title.
        parameters: per metric, what its measurements were (``collect.metric_parameters``: sizes, operation,
            fsync), a second line of its panel's title.

    Raises:
        ValueError: ``points`` is empty.
        PlottingUnavailable: matplotlib is not installed.
    """
    from .plotting import require_matplotlib

    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    from .roofline.plots import keep_inside, rate_tick

    metrics = [m for m in points if points[m]]
    if not metrics:
        raise ValueError("no sweep points to plot")
    ncols = min(2, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig = Figure(figsize=(5.5 * ncols, 4.0 * nrows + 0.4), layout="constrained")
    grid = fig.subplots(nrows, ncols, squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    for ax, metric in zip(axes, metrics, strict=False):
        pts = points[metric]
        info = METRICS.get(metric)
        unit = info.unit if info else ""
        name = info.label.split(" per ")[0] if info else metric
        x = np.array([p["servers"] for p in pts], dtype=float)
        med = np.array([p["median"] for p in pts])
        err = np.array([[p["median"] - p["min"] for p in pts], [p["max"] - p["median"] for p in pts]])
        ax.errorbar(x, med, yerr=err, fmt="o-", color="tab:blue", capsize=4, label="measured (min-median-max)")
        first = pts[0]
        if first["servers"] >= 1 and len(pts) > 1:
            xs = np.array([x.min(), x.max()])
            ax.plot(xs, first["median"] / first["servers"] * xs, "--", color="tab:gray", label="linear scaling")
        ax.set_xlabel("server processes on the server node")
        lowered = name[0].lower() + name[1:] if len(name) > 1 and name[1].islower() else name
        ax.set_ylabel(f"aggregate {lowered} ({unit})")
        what = f"\n{parameters[metric]}" if parameters and metric in parameters else ""
        ax.set_title(f"{name}: {pts[-1]['clients']} saturating client processes{what}", fontsize="medium")
        if len(pts) <= 16:
            ax.set_xticks([p["servers"] for p in pts])
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(0.5, x.max() + 0.5)
        if len(pts) == 1:
            ax.text(0.5, 0.97, "one server core: --sweep-max-servers N sweeps further (oversubscribed)",
                    transform=ax.transAxes, ha="center", va="top", fontsize="x-small", color="tab:gray")  # fmt: skip
        ax.set_ylim(0, max(p["max"] for p in pts) * 1.2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos, unit=unit: rate_tick(v, unit)))
        ax.grid(True, alpha=0.3)
    handles = {label: handle for ax in axes for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=2, fontsize="small")
    fig.suptitle(title or "Server-process sweep (aggregate rate of one server node)")
    keep_inside(fig)
    return fig
