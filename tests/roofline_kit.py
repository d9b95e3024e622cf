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
