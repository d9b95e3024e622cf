"""The data-service roofline: ceilings, ridge point and scores of validation samples.

The model is the one of Carns et al. 2025 (``papers/carns2025-data-service-roofline.txt``, sections 4.2–4.3):

* x is the *service ratio* ``X = server processes / client processes`` (drawn on a log axis);
* y is the sustained rate *per client process* of one metric (RPC rate, network bandwidth, ...; linear axis);
* two empirical parameters bound it, each kept as a min–max range of repeated measurements:
  ``Pc``, the peak client rate (one client process against one quiescent server process, sampled over every
  pair of nodes), and ``Ps``, the peak server rate per server process (one fully populated server node
  saturated by many clients, aggregate rate divided by the server processes);
* the attainable rate per client process is ``R(X) = min(Pc, Ps * min(X, 1))`` and the ridge point, where
  the two ceilings meet, is ``X* = min(Pc / Ps, 1)``.

A parameter measured short of its definition is a *lower bound* (:class:`Saturation`): a ``Ps`` whose server was
not saturated ("we focus on measuring a server's maximum performance when saturated", section 4.3), a ``Pc`` set
by its server rather than by its client ("a given client process can go no faster than the rate it achieves when
communicating with a single quiescent server process", section 4.3). The ceiling drawn from a lower bound lies
too low, and so do the ridge point and the scores built on it: the model says so wherever it shows them.

Validation samples (measured rates at chosen server and client counts) are scored against ``R(X)`` with the
score of Zhu, Neuwirth et al. (``papers/zhu-neuwirth-io-roofline-scoring.txt``, eqs. 10–12):
``score = 1 / (1 + |log10(R(X) / measured)|)``, and scores combine by weighted geometric mean.

This module is pure analysis: it works on plain numbers and JSON documents and never imports the engine,
so a roofline can be rebuilt from a results file with no service running (``plots.plot`` draws it).

Errors: every invalid input (empty or negative ranges, a zero peak, a non-positive service ratio, a
malformed document) raises :class:`ValueError` with a message naming the offending field.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from svcframe.units import quantity, quantity_range

from .scores import rate_score, weighted_geometric_mean

Bound = Literal["min", "max"]

REGION_SERVER_BOUND = "server-bound"
"""Samples with a service ratio below the ridge point (too few servers for the clients)."""
REGION_CLIENT_BOUND = "client-bound"
"""Samples with a service ratio at or above the ridge point."""


# ----------------------------------------------------------------------------------------------------------
# Parameters and samples
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """The min–max range of repeated measurements of one parameter (Carns 2025, section 4.3 and Table 2).

    Attributes:
        min: smallest measured value, finite and >= 0, in the metric's unit.
        max: largest measured value, finite and >= ``min``, in the metric's unit.

    Raises:
        ValueError: a bound is not finite, is negative, or ``min > max``.
    """

    min: float
    max: float

    def __post_init__(self) -> None:
        for name in ("min", "max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
                raise ValueError(f"Range.{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"Range.{name} must be finite and >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.min > self.max:
            raise ValueError(f"Range.min ({self.min}) is larger than Range.max ({self.max})")

    @classmethod
    def of(cls, values: Iterable[float]) -> Range:
        """The range spanned by repeated measurements.

        Args:
            values: one or more measurements, each finite and >= 0.

        Returns:
            ``Range(min(values), max(values))``.

        Raises:
            ValueError: ``values`` is empty, or a value is not a finite number >= 0.
        """
        try:
            data = [float(v) for v in values]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Range.of needs numbers: {exc}") from exc
        if not data:
            raise ValueError("Range.of needs at least one measurement, got none")
        bad = [v for v in data if not math.isfinite(v) or v < 0]
        if bad:
            raise ValueError(f"Range.of needs finite measurements >= 0, got {bad[0]!r}")
        return cls(min(data), max(data))

    def to_dict(self) -> dict[str, float]:
        """``{"min": ..., "max": ...}``."""
        return {"min": self.min, "max": self.max}

    @classmethod
    def from_dict(cls, d: object) -> Range:
        """Inverse of :meth:`to_dict`; also accepts a two-element list ``[min, max]``.

        Raises:
            ValueError: the document is neither shape, or holds invalid bounds.
        """
        if isinstance(d, Mapping):
            missing = {"min", "max"} - set(d)
            if missing:
                raise ValueError(f"a range needs keys 'min' and 'max', missing {sorted(missing)}")
            return cls(d["min"], d["max"])
        if isinstance(d, Sequence) and not isinstance(d, str) and len(d) == 2:
            return cls(d[0], d[1])
        raise ValueError(f"a range is {{'min': x, 'max': y}} or [x, y], got {d!r}")


SATURATED_UTILIZATION = 0.9
"""A process that used (or, where the kernel tells, wanted) at least this fraction of one core over a measurement
was CPU-bound: saturated. (A polling server, ``busy`` or ``spindown`` progress, counts its polling as CPU time: the
load ramp, not its CPU alone, tells a saturated server from a polling one; see :class:`Saturation`.)"""
CONTENDED_WAITING = 0.1
"""A measurement whose processes waited for their cores at least this fraction of the time they were ready to run
(10%) was made under contention: other processes took those cores, and its rates are lower than the machine's."""


@dataclass(frozen=True)
class Saturation:
    """Whether a measured parameter (``Pc`` or ``Ps``) reached what it stands for, or is a lower bound of it, and
    what was measured to tell (Carns et al. 2025, section 4.3).

    ``Ps`` is "a server's maximum performance when saturated": the collector raises the load (client processes,
    calls in flight) until the server's aggregate rate stops growing (:data:`selftest.collect.RAMP_GROWTH`). Its
    ``Ps`` is a lower bound when the rate was still growing at the largest load tried, or when the clients'
    cores were saturated (:data:`SATURATED_UTILIZATION`) while the server's was not: the clients, not the
    server, set the rate. ``Pc`` is the rate of one client "communicating with a single quiescent server
    process": a lower bound when its server was saturated and its client was not (the server set the rate).

    Which side was saturated is read from its *demand* where the kernel keeps scheduler statistics: the fraction
    of a core it wanted, ran or waited for (a process starved by others is not idle); from its utilisation (CPU
    used) elsewhere.

    Attributes:
        lower_bound: the measurement did not reach the parameter: the true value is higher.
        reason: what was measured, in words, for tables, plots and reports (utilisations, the ramp).
        server_utilization: the fraction of one core each serving server process used (mean over the samples),
            None when not recorded.
        client_utilization: for ``Ps``, the fraction of the client processes' cores they used; for ``Pc``, the
            fraction of its core the client used; None when not recorded.
        server_demand, client_demand: the same for what they wanted (ran, or waited for); None when not recorded.
        contention: the fraction of the time the server (and, for ``Pc``, the client) was ready to run that it
            waited for its core: other processes had it; None when not recorded.
        ramp: for ``Ps``, the loads tried in order: ``{"clients", "depth", "rate"}`` (aggregate rate, the
            metric's unit); empty for ``Pc``.

    Raises:
        ValueError: a utilisation, demand or contention that is not a finite number >= 0.
    """

    lower_bound: bool
    reason: str
    server_utilization: float | None = None
    client_utilization: float | None = None
    server_demand: float | None = None
    client_demand: float | None = None
    contention: float | None = None
    ramp: tuple[Mapping[str, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("server_utilization", "client_utilization", "server_demand", "client_demand", "contention"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not math.isfinite(value) or value < 0):
                raise ValueError(f"Saturation.{name} must be a finite number >= 0 or None, got {value!r}")
        object.__setattr__(self, "lower_bound", bool(self.lower_bound))
        object.__setattr__(self, "ramp", tuple(dict(step) for step in self.ramp))

    def to_dict(self) -> dict[str, Any]:
        """``{"lower_bound", "reason", "server_utilization", "client_utilization", "server_demand",
        "client_demand", "contention", "ramp": [...]}``."""
        return {
            "lower_bound": self.lower_bound,
            "reason": self.reason,
            "server_utilization": self.server_utilization,
            "client_utilization": self.client_utilization,
            "server_demand": self.server_demand,
            "client_demand": self.client_demand,
            "contention": self.contention,
            "ramp": [dict(step) for step in self.ramp],
        }

    @classmethod
    def from_dict(cls, d: object) -> Saturation:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: not an object with ``lower_bound`` and ``reason``, or an invalid value.
        """
        if not isinstance(d, Mapping) or "lower_bound" not in d or "reason" not in d:
            raise ValueError(f"a saturation is {{'lower_bound', 'reason', ...}}, got {d!r}")
        ramp = d.get("ramp") or []
        if not isinstance(ramp, Sequence) or not all(isinstance(step, Mapping) for step in ramp):
            raise ValueError(f"a saturation's ramp is a list of objects, got {ramp!r}")
        return cls(bool(d["lower_bound"]), str(d["reason"]), d.get("server_utilization"), d.get("client_utilization"),
                   d.get("server_demand"), d.get("client_demand"), d.get("contention"), tuple(ramp))  # fmt: skip


@dataclass(frozen=True)
class Metric:
    """One performance metric that a roofline can be drawn for.

    Attributes:
        name: identifier, e.g. ``"rpc_rate"``.
        unit: unit of every rate of this metric, e.g. ``"ops/s"``.
        label: y-axis label, with the unit, e.g. ``"RPC rate per client process (ops/s)"``.
    """

    name: str
    unit: str
    label: str

    def to_dict(self) -> dict[str, str]:
        """``{"name": ..., "unit": ..., "label": ...}``."""
        return {"name": self.name, "unit": self.unit, "label": self.label}

    def format(self, value: float | None) -> str:
        """A rate of this metric as every table, plot and report shows it: a bandwidth in the metric's own unit
        (``0.434 GiB/s``, never rescaled to MiB/s beside a plot in GiB/s), other rates in the house notation
        (``16.9 k ops/s``, ``svcframe.units.quantity``)."""
        return quantity(value, self.unit, keep_unit=self.unit in BYTE_RATE_UNITS)

    def format_range(self, low: float, high: float) -> str:
        """A min-max range of this metric, as :meth:`format` shows one rate."""
        return quantity_range(low, high, self.unit, keep_unit=self.unit in BYTE_RATE_UNITS)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | str) -> Metric:
        """Inverse of :meth:`to_dict`; a bare name (or a dict with only a name) looks up :data:`METRICS`.

        Raises:
            ValueError: an unknown name without unit and label, or a malformed document.
        """
        if isinstance(d, str):
            d = {"name": d}
        if not isinstance(d, Mapping) or "name" not in d:
            raise ValueError(f"a metric is a name or {{'name', 'unit', 'label'}}, got {d!r}")
        if "unit" not in d and "label" not in d:
            if d["name"] not in METRICS:
                raise ValueError(f"unknown metric {d['name']!r}; known: {sorted(METRICS)} (or give unit and label)")
            return METRICS[d["name"]]
        unit = str(d.get("unit", ""))
        return cls(name=str(d["name"]), unit=unit, label=str(d.get("label", f"{d['name']} ({unit})")))


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("rpc_rate", "ops/s", "RPC rate per client process (ops/s)"),
        Metric("bandwidth", "GiB/s", "Network bandwidth per client process (GiB/s)"),
        Metric("storage_iops", "ops/s", "Storage IOPS per client process (ops/s)"),
        Metric("storage_bandwidth", "GiB/s", "Storage bandwidth per client process (GiB/s)"),
    )
}
"""Known metrics by name: the two network metrics of Carns 2025 (section 4.3) and its storage future work."""


@dataclass(frozen=True)
class Sample:
    """One validation measurement: a deployment footprint and the rate each client process achieved.

    Attributes:
        servers: server processes in the deployment, >= 1.
        clients: client processes in the deployment, >= 1.
        rate_per_client: measured aggregate rate divided by ``clients``, finite, >= 0, in the metric's unit.
        server_processes_per_core: active server processes per usable core of the busiest server node
            (finite, > 0), or ``None`` when not recorded (documents of older versions).
        client_processes_per_core: the same for the client processes on the client nodes.
        pc_configuration: when the sample repeats a ``Pc`` measurement's configuration (one client against one
            server, on the same pair of nodes), the range of those ``Pc`` measurements; else None. The two measure
            the same thing at different times: their difference is the machine's repeatability.

    Raises:
        ValueError: a count is not an integer >= 1, the rate is negative or not finite, a processes-per-core
            value is not a finite number > 0, or ``pc_configuration`` is not a Range.
    """

    servers: int
    clients: int
    rate_per_client: float
    server_processes_per_core: float | None = None
    client_processes_per_core: float | None = None
    pc_configuration: Range | None = None

    def __post_init__(self) -> None:
        for name in ("servers", "clients"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"Sample.{name} must be an integer >= 1, got {value!r}")
            object.__setattr__(self, name, int(value))
        rate = self.rate_per_client
        if isinstance(rate, bool) or not isinstance(rate, int | float | np.floating | np.integer):
            raise ValueError(f"Sample.rate_per_client must be a number, got {rate!r}")
        if not math.isfinite(rate) or rate < 0:
            raise ValueError(f"Sample.rate_per_client must be finite and >= 0, got {rate!r}")
        object.__setattr__(self, "rate_per_client", float(rate))
        for name in ("server_processes_per_core", "client_processes_per_core"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
                raise ValueError(f"Sample.{name} must be a number or None, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"Sample.{name} must be finite and > 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.pc_configuration is not None and not isinstance(self.pc_configuration, Range):
            raise ValueError(f"Sample.pc_configuration must be a Range or None, got {self.pc_configuration!r}")

    @property
    def service_ratio(self) -> float:
        """``X = servers / clients`` (Carns 2025, section 4.2), dimensionless, > 0."""
        return self.servers / self.clients

    @property
    def oversubscribed(self) -> bool:
        """More than one process per core on the server or the client side (a side not recorded counts as
        one per core).

        The model's parameters are measured with a core per process and its validation runs one process per
        physical core (Carns 2025, section 4.3: "each daemon is bound to a physical CPU core"; section 5,
        Figures 11-12: "one process per physical core"): processes that share a core split it, so the model
        does not predict such samples. (Not to be confused with the paper's *servers oversubscribed by
        clients*, X < 1, which the model does predict.)
        """
        return any(v is not None and v > 1.0 for v in (self.server_processes_per_core, self.client_processes_per_core))

    @property
    def pc_difference(self) -> float | None:
        """How far the sample lies outside the ``Pc`` range of its configuration (:attr:`pc_configuration`), as a
        fraction: ``rate / max - 1`` above it, ``rate / min - 1`` below it (negative), 0 within it; None when the
        sample repeats no ``Pc`` configuration."""
        pc = self.pc_configuration
        if pc is None:
            return None
        if self.rate_per_client > pc.max:
            return self.rate_per_client / pc.max - 1.0
        if self.rate_per_client < pc.min:
            return self.rate_per_client / pc.min - 1.0 if pc.min > 0 else None
        return 0.0

    def to_dict(self) -> dict[str, Any]:
        """``{"servers", "clients", "rate_per_client"}``, plus the processes per core that are recorded and the
        ``pc_configuration`` range when there is one."""
        d: dict[str, Any] = {"servers": self.servers, "clients": self.clients, "rate_per_client": self.rate_per_client}
        for name in ("server_processes_per_core", "client_processes_per_core"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        if self.pc_configuration is not None:
            d["pc_configuration"] = self.pc_configuration.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sample:
        """Inverse of :meth:`to_dict` (extra keys, e.g. ``service_ratio``, are ignored).

        Raises:
            ValueError: a key is missing or a value is invalid.
        """
        missing = {"servers", "clients", "rate_per_client"} - set(d)
        if missing:
            raise ValueError(f"a sample needs keys servers, clients, rate_per_client; missing {sorted(missing)}")
        return cls(
            servers=d["servers"],
            clients=d["clients"],
            rate_per_client=d["rate_per_client"],
            server_processes_per_core=d.get("server_processes_per_core"),
            client_processes_per_core=d.get("client_processes_per_core"),
            pc_configuration=Range.from_dict(d["pc_configuration"]) if d.get("pc_configuration") else None,
        )


def _check_bound(bound: str) -> None:
    if bound not in ("min", "max"):
        raise ValueError(f"bound must be 'min' or 'max', got {bound!r}")


# ----------------------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------------------


ABOVE_CEILING_TOLERANCE = 0.05
"""A validation sample more than this far above the upper ceiling (5%) is counted as above it
(:meth:`Roofline.above_ceiling`)."""


@dataclass
class Roofline:
    """A data-service roofline for one metric, with its validation samples (Carns 2025, sections 4.2–4.3).

    Attributes:
        metric: what the rates measure; every rate below is in ``metric.unit``.
        pc: peak client rate, per client process: one client against one quiescent server (min–max).
        ps: peak server rate, per server process: aggregate rate of one saturated server node divided by
            its server processes (min–max).
        samples: validation measurements drawn and scored against the ceilings.
        pc_saturation, ps_saturation: whether each parameter reached its definition or is a lower bound, and
            what was measured to tell (:class:`Saturation`); None when not recorded (documents of older
            versions, hand-written models): nothing is claimed either way.

    Raises:
        ValueError: ``pc.min`` or ``ps.min`` is 0 (a zero peak has no ridge point and no scores), or a field
            has the wrong type.
    """

    metric: Metric
    pc: Range
    ps: Range
    samples: list[Sample] = field(default_factory=list)
    pc_saturation: Saturation | None = None
    ps_saturation: Saturation | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.metric, Metric):
            raise ValueError(f"Roofline.metric must be a Metric, got {self.metric!r}")
        for name in ("pc", "ps"):
            value = getattr(self, name)
            if not isinstance(value, Range):
                raise ValueError(f"Roofline.{name} must be a Range, got {value!r}")
            if value.min <= 0:
                raise ValueError(
                    f"Roofline.{name} must be > 0 (got min={value.min}); a zero peak rate means the "
                    f"parameter benchmark failed, re-measure it"
                )
        self.samples = list(self.samples)
        for s in self.samples:
            if not isinstance(s, Sample):
                raise ValueError(f"Roofline.samples must hold Sample objects, got {s!r}")
        for name in ("pc_saturation", "ps_saturation"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Saturation):
                raise ValueError(f"Roofline.{name} must be a Saturation or None, got {value!r}")

    @property
    def pc_lower_bound(self) -> bool:
        """``Pc`` was measured short of its definition (:class:`Saturation`): the client ceiling lies too low."""
        return self.pc_saturation is not None and self.pc_saturation.lower_bound

    @property
    def ps_lower_bound(self) -> bool:
        """``Ps`` was measured from a server that was not saturated: the server ceiling lies too low."""
        return self.ps_saturation is not None and self.ps_saturation.lower_bound

    @property
    def ridge_relation(self) -> str:
        """How the true ridge point relates to :meth:`ridge`, given which parameters are lower bounds: ``"="``
        (neither), ``"<="`` (``Ps`` only: a larger ``Ps`` moves ``X* = Pc / Ps`` left), ``">="`` (``Pc`` only,
        and ``Pc / Ps < 1``: a larger ``Pc`` moves it right, up to 1) or ``"?"`` (both: either way)."""
        if self.pc_lower_bound and self.ps_lower_bound:
            return "?"
        if self.ps_lower_bound:
            return "<="
        if self.pc_lower_bound and self.ridge("max") < 1.0:
            return ">="
        return "="

    def _peaks(self, bound: str) -> tuple[float, float]:
        _check_bound(bound)
        return (self.pc.max, self.ps.max) if bound == "max" else (self.pc.min, self.ps.min)

    @overload
    def attainable(self, x: float, bound: Bound = "max") -> float: ...
    @overload
    def attainable(self, x: npt.ArrayLike, bound: Bound = "max") -> npt.NDArray[np.float64]: ...

    def attainable(self, x: float | npt.ArrayLike, bound: Bound = "max") -> float | npt.NDArray[np.float64]:
        """Attainable rate per client process at service ratio ``x``.

        ``R(X) = min(Pc, Ps * min(X, 1))`` (Carns 2025, section 4.2 and Figure 7b; formula as fixed in
        DESIGN.md section 6): a client can go no faster than against a quiescent server (``Pc``); the servers
        share ``Ps * servers`` among the clients, i.e. ``Ps * X`` each, and that share stops growing at
        ``X = 1``, where each server is no longer oversubscribed.

        Args:
            x: service ratio(s), each finite and > 0; a scalar or an array of any shape.
            bound: ``"max"`` uses ``pc.max`` and ``ps.max`` (the upper ceiling), ``"min"`` the lower one.

        Returns:
            A float for a Python/NumPy scalar, otherwise a float64 array of the shape of ``x``, in
            ``metric.unit``.

        Raises:
            ValueError: an ``x`` is not finite or <= 0, or ``bound`` is not ``"min"``/``"max"``.
        """
        pc, ps = self._peaks(bound)
        arr = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise ValueError(f"service ratios must be finite and > 0, got {x!r}")
        rate = np.minimum(pc, ps * np.minimum(arr, 1.0))
        if arr.ndim == 0 and not isinstance(x, np.ndarray):
            return float(rate)
        return rate

    def ridge(self, bound: Bound = "max") -> float:
        """The ridge point: the service ratio where the server ceiling meets the client ceiling.

        ``X* = Pc / Ps`` where ``Ps * X = Pc``, capped at 1 because the server ceiling is flat beyond
        ``X = 1`` (Carns 2025, section 4.2; DESIGN.md section 6). It is the smallest service ratio that
        reaches the full attainable rate, i.e. the most efficient deployment (the paper's ~1/4 for RPC rate
        in section 5.1, 1:1 for bandwidth in section 5.2, where ``Pc > Ps``).

        Args:
            bound: ``"max"`` or ``"min"`` ceiling, as in :meth:`attainable`.

        Returns:
            ``min(Pc / Ps, 1)``, dimensionless, in (0, 1].

        Raises:
            ValueError: ``bound`` is not ``"min"``/``"max"``.
        """
        pc, ps = self._peaks(bound)
        return min(pc / ps, 1.0)

    def efficiency(self, sample: Sample, bound: Bound = "max") -> float:
        """Measured over attainable rate, ``sample.rate_per_client / R(X)``; 1.0 is on the roof.

        Args:
            sample: a validation sample.
            bound: ceiling to compare against (default the upper one).

        Returns:
            A dimensionless ratio >= 0 (above 1 when the sample beats the ceiling).

        Raises:
            ValueError: ``bound`` is not ``"min"``/``"max"``.
        """
        return sample.rate_per_client / self.attainable(sample.service_ratio, bound)

    def score(self, sample: Sample, bound: Bound = "max") -> float:
        """Closeness of a sample to the roof: ``1 / (1 + |log10(R(X) / measured)|)``.

        Zhu, Neuwirth et al., eqs. 10–11, with one dimension (the rate) and the attainable rate at the
        sample's own service ratio as the reference point. Symmetric in log space: a sample 10x below or
        10x above the roof both score 0.5.

        Args:
            sample: a validation sample.
            bound: ceiling to compare against (default the upper one).

        Returns:
            A score in [0, 1]: 1.0 on the roof, 0.0 for a measured rate of 0.

        Raises:
            ValueError: ``bound`` is not ``"min"``/``"max"``.
        """
        return rate_score(self.attainable(sample.service_ratio, bound), sample.rate_per_client)

    def region(self, sample: Sample, bound: Bound = "max") -> str:
        """:data:`REGION_SERVER_BOUND` if ``X < ridge(bound)``, else :data:`REGION_CLIENT_BOUND`."""
        return REGION_SERVER_BOUND if sample.service_ratio < self.ridge(bound) else REGION_CLIENT_BOUND

    def above_ceiling(self, tolerance: float = ABOVE_CEILING_TOLERANCE) -> list[tuple[Sample, float]]:
        """The samples measured above the upper ceiling by more than ``tolerance``, with their excess.

        No deployment should beat ``R(X)`` at its service ratio with the largest Pc and Ps measured, so a sample
        above it says a ceiling lies low: :meth:`findings` says what the data shows about why (a parameter that
        is a lower bound, the spread of repeated measurements of one configuration).

        Args:
            tolerance: relative excess tolerated as noise (default :data:`ABOVE_CEILING_TOLERANCE`).

        Returns:
            ``(sample, measured / R(X) - 1)`` per sample above, in sample order.
        """
        found = [(s, self.efficiency(s) - 1.0) for s in self.samples]
        return [(s, excess) for s, excess in found if excess > tolerance]

    def findings(self) -> list[str]:
        """What this roofline's own numbers show about its ceilings, one sentence each, for the plot, the tables
        and the verdict (every figure is computed from the data here, nothing is guessed):

        * a parameter that is a lower bound (:class:`Saturation`), with what was measured;
        * how far repeated measurements of ``Pc`` and of ``Ps`` spread (``max / min - 1``);
        * each sample that repeats a ``Pc`` configuration (:attr:`Sample.pc_configuration`), against that range;
        * the samples above the upper ceiling (:meth:`above_ceiling`) and the region they lie in.
        """
        m = self.metric
        lines = []
        for name, saturation, rng in (("Ps", self.ps_saturation, self.ps), ("Pc", self.pc_saturation, self.pc)):
            if saturation is not None and saturation.lower_bound:
                lines.append(f"{name} {m.format_range(rng.min, rng.max)} is a lower bound: {saturation.reason}")
        for name, saturation in (("Ps", self.ps_saturation), ("Pc", self.pc_saturation)):
            if saturation is not None and (saturation.contention or 0.0) >= CONTENDED_WAITING:
                who = "its server" if name == "Ps" else "its client and server"
                lines.append(f"{name} was measured under contention: {who} waited for a core "
                             f"{saturation.contention:.0%} of the time they were ready to run (other processes had it)")  # fmt: skip
        spreads = [f"{name} {self_range.max / self_range.min - 1:.0%}" for name, self_range in (("Pc", self.pc),
                   ("Ps", self.ps)) if self_range.min > 0]  # fmt: skip
        lines.append(f"repeats spread {' and '.join(spreads)} (max / min - 1)")
        repeats: dict[tuple[int, int, float, float], list[Sample]] = {}  # one sentence per configuration
        for sample in self.samples:
            pc = sample.pc_configuration
            if pc is not None and sample.pc_difference is not None:
                repeats.setdefault((sample.servers, sample.clients, pc.min, pc.max), []).append(sample)
        for (servers, clients, low, high), same in repeats.items():
            each = [(m.format(s.rate_per_client), "within its range" if not s.pc_difference
                     else f"{s.pc_difference:+.0%} against its range") for s in same]  # fmt: skip
            pc_range = m.format_range(low, high)
            if len(same) == 1:
                lines.append(f"the {servers}x{clients} sample repeats Pc's configuration: {each[0][0]} against Pc "
                             f"{pc_range}, {each[0][1]}")  # fmt: skip
            else:
                lines.append(f"the {servers}x{clients} samples ({len(same)}) repeat Pc's configuration, Pc {pc_range}: "
                             + "; ".join(f"{rate}, {where}" for rate, where in each))  # fmt: skip
        above = self.above_ceiling()
        if above:
            worst = max(excess for _, excess in above)
            regions = sorted({self.region(s) for s, _ in above})
            text = (f"{len(above)} of {len(self.samples)} samples above the max ceiling (up to +{worst:.0%}), "
                    f"{' and '.join(regions)}")  # fmt: skip
            if self.ps_lower_bound and regions == [REGION_SERVER_BOUND]:
                text += ", where the ceiling is Ps·X and Ps is a lower bound"
            elif self.pc_lower_bound and regions == [REGION_CLIENT_BOUND]:
                text += ", where the ceiling is Pc and Pc is a lower bound"
            lines.append(text)
        return lines

    def scores(self, bound: Bound = "max") -> dict[str, Any]:
        """Score every sample and summarise the samples the model claims to predict, overall and per region.

        Per sample: service ratio, attainable rate, efficiency, relative error ``measured / R(X) - 1``
        (signed, negative below the roof), score (:meth:`score`), region (:meth:`region`) and
        ``oversubscribed`` (:attr:`Sample.oversubscribed`: more than one process per core, which the model
        does not predict). A summary holds the sample ``count``, the combined ``score`` (geometric mean of the
        sample scores with equal weights, Zhu, Neuwirth et al. eq. 12), and the ``median_relative_error``
        and ``worst_relative_error`` (of the absolute relative errors). ``overall`` and ``regions`` summarise
        the samples that are not oversubscribed, ``excluded`` the oversubscribed ones. Summaries of no
        samples hold ``None``.

        Args:
            bound: ceiling to compare against (default the upper one).

        Returns:
            A JSON-ready dict::

                {"bound": "max", "ridge": float,
                 "samples": [{"servers", "clients", "rate_per_client", ["server_processes_per_core",
                              "client_processes_per_core"], "service_ratio", "attainable", "efficiency",
                              "relative_error", "score", "region", "oversubscribed"}, ...],
                 "overall": summary,
                 "regions": {"server-bound": summary, "client-bound": summary},
                 "excluded": summary}

        Raises:
            ValueError: ``bound`` is not ``"min"``/``"max"``.
        """
        rows = []
        for s in self.samples:
            r = self.attainable(s.service_ratio, bound)
            rows.append(
                {
                    **s.to_dict(),
                    "service_ratio": s.service_ratio,
                    "attainable": r,
                    "efficiency": s.rate_per_client / r,
                    "relative_error": s.rate_per_client / r - 1.0,
                    "score": rate_score(r, s.rate_per_client),
                    "region": self.region(s, bound),
                    "oversubscribed": s.oversubscribed,
                }
            )
        claimed = [row for row in rows if not row["oversubscribed"]]
        return {
            "bound": bound,
            "ridge": self.ridge(bound),
            "samples": rows,
            "overall": _summary(claimed),
            "regions": {
                name: _summary([row for row in claimed if row["region"] == name])
                for name in (REGION_SERVER_BOUND, REGION_CLIENT_BOUND)
            },
            "excluded": _summary([row for row in rows if row["oversubscribed"]]),
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document: the parameters and samples, plus the derived ridge points and scores.

        Returns:
            ``{"metric", "pc", "ps", "pc_saturation", "ps_saturation", "samples", "ridge": {"min", "max",
            "relation"}, "scores": scores("max"), "findings"}`` (the saturations None when not recorded;
            ``ridge.relation``: :attr:`ridge_relation`); :meth:`from_dict` reads the first six keys and
            recomputes the rest.
        """
        return {
            "metric": self.metric.to_dict(),
            "pc": self.pc.to_dict(),
            "ps": self.ps.to_dict(),
            "pc_saturation": self.pc_saturation.to_dict() if self.pc_saturation is not None else None,
            "ps_saturation": self.ps_saturation.to_dict() if self.ps_saturation is not None else None,
            "samples": [s.to_dict() for s in self.samples],
            "ridge": {"min": self.ridge("min"), "max": self.ridge("max"), "relation": self.ridge_relation},
            "scores": self.scores("max"),
            "findings": self.findings(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Roofline:
        """Rebuild a roofline from :meth:`to_dict` output or a hand-written document.

        ``metric`` may be a name from :data:`METRICS` or a full metric dict; ``pc`` and ``ps`` may be
        ``{"min", "max"}`` or ``[min, max]``; ``samples``, ``pc_saturation`` and ``ps_saturation`` are optional.
        Derived keys are ignored.

        Raises:
            ValueError: a required key is missing or a value is invalid.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"a roofline document is a JSON object, got {type(d).__name__}")
        missing = {"metric", "pc", "ps"} - set(d)
        if missing:
            raise ValueError(f"a roofline document needs keys metric, pc, ps; missing {sorted(missing)}")
        samples = d.get("samples") or []
        return cls(
            metric=Metric.from_dict(d["metric"]),
            pc=Range.from_dict(d["pc"]),
            ps=Range.from_dict(d["ps"]),
            samples=[Sample.from_dict(s) for s in samples],
            pc_saturation=Saturation.from_dict(d["pc_saturation"]) if d.get("pc_saturation") else None,
            ps_saturation=Saturation.from_dict(d["ps_saturation"]) if d.get("ps_saturation") else None,
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as indented JSON to ``path`` and return it as a :class:`Path`."""
        out = Path(path)
        out.write_text(json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Roofline:
        """Read a roofline JSON document (see :meth:`from_dict`).

        Raises:
            OSError: the file cannot be read.
            ValueError: the file is not valid JSON or not a valid roofline document.
        """
        return cls.from_dict(json.loads(Path(path).read_text()))


def _summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not rows:
        return {"count": 0, "score": None, "median_relative_error": None, "worst_relative_error": None}
    errors = [abs(row["relative_error"]) for row in rows]
    scores = [row["score"] for row in rows]
    return {
        "count": len(rows),
        "score": weighted_geometric_mean(scores, [1.0] * len(scores)),
        "median_relative_error": float(np.median(errors)),
        "worst_relative_error": max(errors),
    }


# ----------------------------------------------------------------------------------------------------------
# The measured platform
# ----------------------------------------------------------------------------------------------------------

BYTE_RATE_UNITS: dict[str, int] = {"B/s": 1, "KiB/s": 2**10, "MiB/s": 2**20, "GiB/s": 2**30}
"""Bytes per second in one of each bandwidth unit a metric may be measured in (``bandwidth`` is GiB/s)."""

_BYTES_PER_OP_OPTIONS = {
    "bandwidth": "bulk_size",
    "storage_iops": "storage_block_size",
    "storage_bandwidth": "storage_bandwidth_block_size",
}


@overload
def bytes_per_second(metric: Metric, value: float) -> float: ...
@overload
def bytes_per_second(metric: Metric, value: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]: ...


def bytes_per_second(metric: Metric, value: float | npt.NDArray[np.float64]) -> float | npt.NDArray[np.float64]:
    """``value`` (in ``metric.unit``, a bandwidth unit of :data:`BYTE_RATE_UNITS`) in bytes per second.

    Raises:
        ValueError: the metric's unit is not a bandwidth unit (e.g. ``ops/s``).
    """
    if metric.unit not in BYTE_RATE_UNITS:
        raise ValueError(f"metric {metric.name!r} is in {metric.unit}, not a bandwidth ({sorted(BYTE_RATE_UNITS)})")
    return value * BYTE_RATE_UNITS[metric.unit]


@dataclass(frozen=True)
class Platform:
    """A measured platform: the data-service roofline of each collected metric, and what it was measured on.

    The input of every model of this package: the I/O roofline takes its peaks from it, the workflow roofline
    its ceilings, placement its ceilings and scores.

    Attributes:
        rooflines: the data-service roofline per metric name (``rpc_rate``, ``bandwidth``, ...).
        server_cores: usable cores of the server node (its slots), or ``None`` when not recorded.
        client_cores: usable cores of the client nodes together, or ``None`` when not recorded.
        bytes_per_op: bytes each measured operation moved, per metric (``bandwidth``: the bulk size,
            ``storage_iops`` and ``storage_bandwidth``: their block sizes), when the options were recorded.
        label: where the model came from, for titles (``"run 3: selftest on host"``).
    """

    rooflines: Mapping[str, Roofline]
    server_cores: int | None = None
    client_cores: int | None = None
    bytes_per_op: Mapping[str, int] = field(default_factory=dict)
    label: str = ""

    def roofline(self, metric: str) -> Roofline:
        """The data-service roofline of ``metric``.

        Raises:
            ValueError: the platform model has no such metric (the message lists those it has).
        """
        if metric not in self.rooflines:
            raise ValueError(
                f"the platform model has no {metric!r} roofline (it has {sorted(self.rooflines)}); "
                f"collect it: svcframe roofline collect --metric {metric}"
            )
        return self.rooflines[metric]

    def lower_bounds(self, metrics: Iterable[str], parameters: Iterable[str] = ("Pc", "Ps")) -> list[str]:
        """What every model built on this platform says of its own figures: one sentence per ``Pc`` or ``Ps`` of
        ``metrics`` that is a lower bound (:class:`Saturation`), with what was measured. A ceiling drawn from a
        lower bound lies too low (Carns et al. 2025, section 4.3), and so do the ridges, scores and headroom
        built on it. Metrics the platform lacks are skipped.

        Args:
            metrics: the metrics a model uses (placement: ``rpc_rate`` and ``bandwidth``).
            parameters: ``"Pc"``, ``"Ps"`` or both: those the model uses (the I/O roofline of the server side:
                ``Ps``).
        """
        wanted = set(parameters)
        lines = []
        for name in metrics:
            rl = self.rooflines.get(name)
            if rl is None:
                continue
            for param, saturation, rng in (("Pc", rl.pc_saturation, rl.pc), ("Ps", rl.ps_saturation, rl.ps)):
                if param in wanted and saturation is not None and saturation.lower_bound:
                    lines.append(f"{name}'s {param} {rl.metric.format_range(rng.min, rng.max)} is a lower bound "
                                 f"({saturation.reason}): the ceilings drawn from it lie too low, and so do the "
                                 "ridges and scores built on them")  # fmt: skip
        return lines

    @classmethod
    def from_document(cls, doc: Any, source: str = "document") -> Platform:
        """Read a platform model from any of the documents that hold one.

        Accepts the ``roofline.json`` that ``svcframe roofline collect`` writes (``{"kind":
        "svcframe-roofline", "metrics", "nodes", "options", ...}``), a run of the results store
        (:meth:`selftest.store.ResultsStore.run`: ``{"id", "model": {"metrics", "nodes", ...}, "options"}``),
        or a bare ``{"metrics": {name: Roofline.to_dict()}}``.

        Args:
            doc: the decoded JSON document.
            source: what to call it in error messages (a file name).

        Raises:
            ValueError: the document is none of these shapes, holds no model (an incomplete run), or a
                metric's roofline is invalid; the message names ``source`` and the offending key.
        """
        if not isinstance(doc, Mapping):
            raise ValueError(f"{source}: a platform roofline model is a JSON object, got {type(doc).__name__}")
        options = doc.get("options")
        if not isinstance(options, Mapping):
            options = {}
        if "model" in doc and "id" in doc:  # a run of the results store
            model = doc.get("model")
            if not isinstance(model, Mapping) or not isinstance(model.get("metrics"), Mapping):
                raise ValueError(
                    f"{source}: run {doc['id']} has no model (status {doc.get('status', '?')}); "
                    f"complete it with: svcframe roofline collect --resume {doc['id']}"
                )
            label = f"run {doc['id']}: {doc.get('service', '?')} on {doc.get('platform', '?')}"
        elif isinstance(doc.get("metrics"), Mapping):
            model = doc
            label = f"run {doc['run_id']}" if doc.get("run_id") is not None else source
        else:
            kind = doc.get("kind")
            raise ValueError(
                f"{source} is not a platform roofline model (the roofline.json of `svcframe roofline collect`, "
                f"or a run of the results store)" + (f"; it is a {kind} document" if kind else "")
            )
        rooflines: dict[str, Roofline] = {}
        for name, m in model["metrics"].items():
            try:
                rooflines[str(name)] = Roofline.from_dict(m)
            except ValueError as exc:
                raise ValueError(f"{source}: metrics.{name}: {exc}") from None
        if not rooflines:
            raise ValueError(f"{source}: the model has no metric")
        nodes = model.get("nodes")
        node_list = nodes.get("nodes") if isinstance(nodes, Mapping) else None
        slots = [int(n["slots"]) for n in node_list or [] if isinstance(n, Mapping) and "slots" in n]
        return cls(
            rooflines=rooflines,
            server_cores=slots[0] if slots else None,
            client_cores=sum(slots[1:]) if len(slots) > 1 else None,
            bytes_per_op={m: int(options[key]) for m, key in _BYTES_PER_OP_OPTIONS.items() if options.get(key)},
            label=label,
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Platform:
        """Read a platform model from a JSON file (see :meth:`from_document`).

        Raises:
            ValueError: the file cannot be read, is not JSON, or is not a platform model; one line naming it.
        """
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read a platform roofline model: {exc}") from None
        return cls.from_document(doc, str(path))
