"""Plots of the three rooflines (matplotlib, object-oriented API, Agg backend, imported lazily through
``selftest.plotting.require_matplotlib``: ``plot`` is an optional extra, ``pip install 'svcframe[plot]'``).

* :func:`plot`: the data-service roofline of one metric with its validation samples (Carns et al. 2025,
  Figures 13-14);

Every plot states its parameters (units, sizes) in its title, labels and legend, and returns the path of
the file it wrote (the format follows the suffix, ``.png`` for PNG).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from .dataservice import Roofline


def _num(v: float) -> str:
    # 173000.0 -> "173,000"; 1.75 -> "1.75".
    return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"


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


def plot(roofline: Roofline, path: str | os.PathLike[str], title: str | None = None) -> Path:
    """Draw the roofline with its validation samples and write it as an image (PNG by suffix).

    Log x axis (service ratio), linear y axis (rate per client process), as in Carns 2025, section 5.1 and
    Figures 13–14: the upper ceiling (``pc.max``, ``ps.max``) solid, the lower one (``pc.min``, ``ps.min``)
    dashed, the band between shaded, the ridge point marked and annotated, and samples as semi-transparent
    points coloured by server process count, those with more than one process per core circled in red
    (:attr:`~selftest.roofline.Sample.oversubscribed`: outside the model). The x range spans the samples and both ridge points with a
    factor 2 margin each side.

    Args:
        roofline: the model to draw; it may have no samples.
        path: output file; its suffix picks the format (``.png`` for PNG). The directory must exist.
        title: figure title; default ``"<metric name> roofline"``.

    Returns:
        ``path`` as a :class:`Path`.

    Raises:
        OSError: the file cannot be written.
    """
    _require_matplotlib()
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    rl = roofline
    unit = rl.metric.unit
    ridges = {b: rl.ridge(b) for b in ("max", "min")}
    ratios = [s.service_ratio for s in rl.samples]
    lo = min([*ratios, *ridges.values()]) / 2
    hi = max([*ratios, *ridges.values()]) * 2
    # Evaluate on a dense log grid plus the kinks, so the corners are drawn sharp.
    kinks = [v for v in (*ridges.values(), 1.0) if lo < v < hi]
    xs = np.union1d(np.geomspace(lo, hi, 400), kinks)
    y_max = rl.attainable(xs, "max")
    y_min = rl.attainable(xs, "min")

    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    ax.fill_between(xs, y_min, y_max, color="tab:blue", alpha=0.15, linewidth=0, label="ceiling range")
    ax.plot(
        xs,
        y_max,
        color="tab:blue",
        linestyle="-",
        linewidth=2,
        label=f"max ceiling: Pc={_num(rl.pc.max)}, Ps={_num(rl.ps.max)} {unit}",
    )
    ax.plot(
        xs,
        y_min,
        color="tab:blue",
        linestyle="--",
        linewidth=1.5,
        label=f"min ceiling: Pc={_num(rl.pc.min)}, Ps={_num(rl.ps.min)} {unit}",
    )

    x_star = ridges["max"]
    y_star = rl.attainable(x_star, "max")
    ax.plot(
        [x_star],
        [y_star],
        marker="D",
        color="tab:red",
        markersize=8,
        linestyle="none",
        label=f"ridge X* = {_ridge_text(x_star)}",
    )
    ax.annotate(
        f"ridge X* = {_ridge_text(x_star)}\n{_num(y_star)} {unit}",
        xy=(x_star, y_star),
        xytext=(-14, 10),
        textcoords="offset points",
        ha="right",
        va="bottom",
        arrowprops={"arrowstyle": "->", "color": "tab:red"},
        color="tab:red",
    )
    if not math.isclose(ridges["min"], x_star):
        ax.plot(
            [ridges["min"]],
            [rl.attainable(ridges["min"], "min")],
            marker="D",
            markersize=6,
            markerfacecolor="none",
            color="tab:red",
            linestyle="none",
            label=f"ridge (min) = {_ridge_text(ridges['min'])}",
        )

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
                color = cmap(i / max(len(counts) - 1, 1))
                ax.scatter(
                    np.asarray(ratios)[sel],
                    rates[sel],
                    color=color,
                    alpha=0.6,
                    edgecolors="black",
                    linewidths=0.5,
                    zorder=3,
                    label=f"{n} server process{'es' if n != 1 else ''}",
                )
        else:
            points = ax.scatter(
                ratios,
                rates,
                c=servers,
                cmap="viridis",
                alpha=0.6,
                edgecolors="black",
                linewidths=0.5,
                zorder=3,
                label="validation samples",
            )
            fig.colorbar(points, ax=ax, label="server processes")
        shared = np.array([s.oversubscribed for s in rl.samples])
        if shared.any():
            ax.scatter(
                np.asarray(ratios)[shared],
                rates[shared],
                s=140,
                facecolors="none",
                edgecolors="tab:red",
                linewidths=1.2,
                zorder=4,
                label="> 1 process per core: not modelled, excluded",
            )

    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(0, top * 1.25)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))
    ax.xaxis.set_major_formatter(FuncFormatter(_ratio_label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("service ratio (server processes / client processes)")
    label = rl.metric.label if unit in rl.metric.label else f"{rl.metric.label} ({unit})"
    ax.set_ylabel(label)
    ax.set_title(title if title is not None else f"{rl.metric.name} roofline")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    out = Path(path)
    fig.savefig(out, dpi=120)
    return out


def _require_matplotlib() -> None:
    # matplotlib is optional: one clear error naming the extra when it is missing (selftest/plotting.py).
    from ..plotting import require_matplotlib

    require_matplotlib()
