"""The one place the self-test's plots get matplotlib, an optional dependency (``pip install 'svcframe[plot]'``):
a server never imports it, and a plot without it is one clear error, not an ImportError traceback.

Imports nothing of svcframe: the roofline models and their plots run on JSON files with no engine loaded.
The commands of ``selftest/cli`` turn :class:`PlottingUnavailable` into their one-line error.
"""

from __future__ import annotations


class PlottingUnavailable(RuntimeError):
    """matplotlib is not installed; the message says what to install."""


def require_matplotlib() -> None:
    """Select the Agg backend (files, no display).

    Raises:
        PlottingUnavailable: matplotlib cannot be imported; the message says what to install.
    """
    try:
        import matplotlib
    except ImportError:
        raise PlottingUnavailable(
            "plots need matplotlib, an optional dependency: pip install 'svcframe[plot]' (the results were kept)"
        ) from None
    matplotlib.use("Agg")
