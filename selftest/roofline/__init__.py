"""The rooflines: three models, their scores, plots and the placement of workloads (DESIGN.md section 6b).

One place for everything roofline, pure analysis on plain numbers and JSON documents, with no service
running: the models import nothing of svcframe but its figure notation (``svcframe.units``, pure functions; no
engine). Drawing needs matplotlib, an optional extra,
through ``selftest.plotting`` (one clear error when it is missing).

* ``dataservice``: the data-service roofline of Carns et al. 2025 (rate per client process against the
  service ratio; ``Pc``, ``Ps``, ``R(X)``, the ridge point), validation samples and their scores, and
  :class:`Platform`, the per-metric rooflines of a collected platform model (the input of the others);
* ``io``: the I/O roofline of Zhu & Neuwirth (attainable IOPS against I/O intensity, eqs. 3-4), its system
  scores (eqs. 13-14) and application scores (eqs. 10-12), for storage and for the network;
* ``workflow``: the workflow roofline of Ding et al. 2024 (tasks per second against parallel tasks, eq. 1,
  the four zones of Fig. 2a), with ceilings derived from the data-service parameters;
* ``placement``: a measured workload (:class:`Workload`: one RPC at one or more service ratios) placed on
  the data-service rooflines: attainable rate, limiting metric, score, region, headroom;
* ``scores``: the scores of Zhu & Neuwirth (eqs. 10-12) the three models share;
* ``plots``: the plots of each model and of a placement (matplotlib, an optional extra).
"""

from .dataservice import (
    METRICS,
    REGION_CLIENT_BOUND,
    REGION_SERVER_BOUND,
    SATURATED_UTILIZATION,
    Metric,
    Platform,
    Range,
    Roofline,
    Sample,
    Saturation,
)
from .io import IOPoint, IORoofline, io_rooflines
from .placement import Workload, WorkloadPoint, place
from .plots import plot, plot_io, plot_placement, plot_workflow
from .scores import combine_scores
from .workflow import WorkflowRoofline, WorkflowSpec

__all__ = [
    "METRICS",
    "REGION_CLIENT_BOUND",
    "REGION_SERVER_BOUND",
    "SATURATED_UTILIZATION",
    "IOPoint",
    "IORoofline",
    "Metric",
    "Platform",
    "Range",
    "Roofline",
    "Sample",
    "Saturation",
    "WorkflowRoofline",
    "WorkflowSpec",
    "Workload",
    "WorkloadPoint",
    "combine_scores",
    "io_rooflines",
    "place",
    "plot",
    "plot_io",
    "plot_placement",
    "plot_workflow",
]
