"""Helpers of the roofline tests: platform documents shaped as ``svcframe roofline collect`` writes them,
and a check that a plot is a real PNG image of a plausible size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selftest.roofline import METRICS, Range, Roofline, Sample

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def platform_doc(
    peaks: dict[str, tuple[float, float]],
    samples: dict[str, list[Sample]] | None = None,
    slots: tuple[int, ...] = (4, 8),
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A collect document: ``peaks`` maps a metric to its (Pc, Ps) (each a one-value range)."""
    metrics = {
        name: Roofline(METRICS[name], Range(pc, pc), Range(ps, ps), (samples or {}).get(name, [])).to_dict()
        for name, (pc, ps) in peaks.items()
    }
    return {
        "kind": "svcframe-roofline",
        "run_id": 7,
        "options": options or {"bulk_size": 2**20, "storage_block_size": 4096, "storage_bandwidth_block_size": 2**20},
        "nodes": {"source": "local", "nodes": [{"name": f"local{i}", "slots": n} for i, n in enumerate(slots)]},
        "metrics": metrics,
    }


def assert_png(path: Path, min_width: int = 600, min_height: int = 400) -> tuple[int, int]:
    """The file is a complete PNG that decodes, at least ``min_width`` x ``min_height`` pixels; its size."""
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_MAGIC, f"{path} is not a PNG"
    with Image.open(path) as im:
        im.verify()  # checks the chunks' CRCs
    with Image.open(path) as im:
        im.load()  # decodes every pixel
        width, height = im.size
    assert width >= min_width and height >= min_height, f"{path}: {width}x{height} px is too small"
    assert width <= 4000 and height <= 4000, f"{path}: {width}x{height} px is implausibly large"
    return width, height


def layout_problems(fig: Any) -> list[str]:
    """What a rendered Figure shows out of place, measured through matplotlib's artist extents (pixels, as
    drawn by Agg): a text (title, label, tick label, note, legend entry) past the figure's edges; an annotation
    (a label placed beside a point) past its axes; a legend over an axes that shows data (a legend belongs
    outside them, never over data); a scatter point outside its axes. Empty when the figure is laid out well."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PathCollection
    from matplotlib.text import Annotation, Text

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    edge = fig.bbox
    slack = 1.0  # pixels: anti-aliasing

    def inside(ext: Any, box: Any) -> bool:
        return (ext.x0 >= box.x0 - slack and ext.x1 <= box.x1 + slack and ext.y0 >= box.y0 - slack
                and ext.y1 <= box.y1 + slack)  # fmt: skip

    problems = []
    every_axes = [*fig.axes, *(child for ax in fig.axes for child in ax.child_axes)]  # secondary axes too
    axes_lines = [axis for ax in every_axes if ax.get_visible() and ax.axison for axis in (ax.xaxis, ax.yaxis)]
    tick_labels = {id(t) for ax in every_axes for axis in (ax.xaxis, ax.yaxis)
                   for tick in (*axis.get_major_ticks(), *axis.get_minor_ticks()) for t in (tick.label1, tick.label2)}  # fmt: skip
    for text in fig.findobj(Text):
        if id(text) in tick_labels:  # the ticks drawn are measured with their axis, below
            continue
        if text.get_visible() and text.get_text().strip() and not inside(text.get_window_extent(renderer), edge):
            problems.append(f"text past the figure's edge: {text.get_text()[:60]!r}")
    for axis in axes_lines:
        ext = axis.get_tightbbox(renderer)  # the ticks and labels it draws (those within its view)
        if ext is not None and not inside(ext, edge):
            problems.append(f"tick labels of {axis.axis_name} past the figure's edge: {axis.get_label_text()[:40]!r}")
    data_axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison and (ax.lines or ax.collections or ax.patches)]
    for ax in data_axes:
        box = ax.get_window_extent(renderer)
        for text in ax.texts:
            shown = isinstance(text, Annotation) and text.get_visible() and text.get_text().strip()
            if shown and not inside(text.get_window_extent(renderer), box):
                problems.append(f"annotation past its axes: {text.get_text()[:60]!r}")
        for points in (c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())):
            xy = ax.transData.transform(points.get_offsets())
            if not all(box.x0 - slack <= x <= box.x1 + slack and box.y0 - slack <= y <= box.y1 + slack for x, y in xy):
                problems.append(f"points of {points.get_label()!r} outside their axes")
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    for legend in legends:
        ext = legend.get_window_extent(renderer)
        if not inside(ext, edge):
            problems.append("a legend past the figure's edge")
        for ax in data_axes:
            if ext.overlaps(ax.get_window_extent(renderer)):
                problems.append(f"a legend over the axes {ax.get_title()[:40]!r}")
    return problems
