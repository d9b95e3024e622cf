"""The I/O roofline of Zhu & Neuwirth (``papers/zhu-neuwirth-io-roofline-scoring.txt``, section IV), for
storage and for the network, with its system scores and application scores.

* eq. 3: attainable operations per second ``min(ψ, κ·λ)``, with peak IOPS ``ψ`` (operations/s), peak
  bandwidth ``κ`` (bytes/s) and I/O intensity ``λ`` (operations per byte);
* eq. 4: ``λ = θ / σ``, operations over bytes moved (eqs. 5 and 8: every operation costs 1, ``c_i = 1``);
* the ridge intensity ``λ* = ψ / κ``, where the bandwidth diagonal meets the IOPS ceiling (section II);
  below it a workload is bandwidth-bound (large operations), above it IOPS-bound (small ones);
* eq. 13, the vector-based system score, the ridge point ``(ψ, λ*)``; eq. 14, the bandwidth-based system
  score, ``ψ · λ*^-1`` in bytes/s (as eqs. 17-18 apply it; the printed eq. 14 reads ``κ · λ^-1``, whose
  unit is not bytes/s: at the ridge both give ``κ``);
* eqs. 10-11, the application score: ``1 / (1 + Δ)`` with ``Δ`` the log10 distance of the application point
  ``(λ, IOPS)`` from the ridge point; eq. 12, scores of several rooflines (storage, network) combined by
  weighted geometric mean (:func:`selftest.roofline.scores.combine_scores`).

From a collected platform (:class:`~selftest.roofline.dataservice.Platform`), :func:`io_rooflines` builds
the storage roofline (``ψ`` from ``storage_iops``, ``κ`` from ``storage_bandwidth``) and the network one
(``ψ`` from ``rpc_rate``, ``κ`` from ``bandwidth``), per server process (``Ps``) or per client process
(``Pc``). :func:`validation_points` places the self-test's own validation samples on them, each at the
intensity of the operations it measured (one per block or bulk transfer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from .dataservice import BYTE_RATE_UNITS, Bound, Platform, bytes_per_second
from .scores import log_distance, partial_score

Side = Literal["server", "client"]

IO_METRICS: dict[str, tuple[str, str]] = {
    "storage": ("storage_iops", "storage_bandwidth"),
    "network": ("rpc_rate", "bandwidth"),
}
"""The data-service metrics giving each I/O roofline its (peak operations/s, peak bandwidth)."""

REGION_BANDWIDTH_BOUND = "bandwidth-bound"
"""Intensity below the ridge: large operations, limited by ``κ·λ`` (the paper's "memory-bound" analogue)."""
REGION_IOPS_BOUND = "IOPS-bound"
"""Intensity at or above the ridge: small operations, limited by ``ψ`` (the "compute-bound" analogue)."""


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class IOPoint:
    """A workload on the I/O roofline: its I/O intensity and the operations per second it achieved.

    Attributes:
        label: what it is (``"kv put, 4 servers x 32 clients"``).
        intensity_ops_per_byte: ``λ`` (Zhu eq. 4), finite and > 0.
        ops_per_second: achieved operations per second, finite and >= 0, in the scope of the roofline it
            is placed on (per server process, per client process...).

    Raises:
        ValueError: a value is not finite, or not positive where it must be.
    """

    label: str
    intensity_ops_per_byte: float
    ops_per_second: float

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "intensity_ops_per_byte", _positive("intensity_ops_per_byte", self.intensity_ops_per_byte)
        )
        ops = self.ops_per_second
        if (
            isinstance(ops, bool)
            or not isinstance(ops, int | float | np.floating | np.integer)
            or not math.isfinite(ops)
            or ops < 0
        ):
            raise ValueError(f"ops_per_second must be a finite number >= 0, got {ops!r}")
        object.__setattr__(self, "ops_per_second", float(ops))

    @classmethod
    def from_counts(cls, label: str, operations: float, bytes_moved: float, seconds: float) -> IOPoint:
        """A point from characterisation counters (Zhu section V: Darshan's operation and byte counts).

        ``λ = θ / σ`` (eq. 4) with ``θ = operations`` (eq. 8, each of cost 1) and ``σ = bytes_moved``
        (eq. 5: bytes read + written); achieved IOPS ``θ / seconds``.

        Raises:
            ValueError: ``operations``, ``bytes_moved`` or ``seconds`` is not finite and > 0.
        """
        theta = _positive("operations", operations)
        sigma = _positive("bytes_moved", bytes_moved)
        return cls(label, theta / sigma, theta / _positive("seconds", seconds))

    @property
    def bytes_per_second(self) -> float:
        """Achieved bandwidth, ``IOPS / λ`` (bytes/s)."""
        return self.ops_per_second / self.intensity_ops_per_byte


@dataclass(frozen=True)
class IORoofline:
    """One I/O roofline (Zhu & Neuwirth section IV-A, eq. 3).

    Attributes:
        name: ``"storage"``, ``"network"``, or any.
        psi_ops_per_second: ``ψ``, peak operations per second, finite and > 0.
        kappa_bytes_per_second: ``κ``, peak bandwidth in bytes per second, finite and > 0.
        scope: whose peaks they are, for labels (``"per server process"``).

    Raises:
        ValueError: a peak is not finite and > 0.
    """

    name: str
    psi_ops_per_second: float
    kappa_bytes_per_second: float
    scope: str = ""

    def __post_init__(self) -> None:
        for attr in ("psi_ops_per_second", "kappa_bytes_per_second"):
            object.__setattr__(self, attr, _positive(f"IORoofline.{attr}", getattr(self, attr)))

    @overload
    def attainable(self, intensity: float) -> float: ...
    @overload
    def attainable(self, intensity: npt.ArrayLike) -> npt.NDArray[np.float64]: ...

    def attainable(self, intensity: float | npt.ArrayLike) -> float | npt.NDArray[np.float64]:
        """Attainable operations per second at I/O intensity ``λ``: ``min(ψ, κ·λ)`` (Zhu eq. 3).

        Args:
            intensity: ``λ`` in operations per byte, each finite and > 0; a scalar or an array.

        Returns:
            A float for a scalar, else a float64 array of the shape of ``intensity``; operations/s.

        Raises:
            ValueError: an intensity is not finite or <= 0.
        """
        arr = np.asarray(intensity, dtype=np.float64)
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise ValueError(f"I/O intensities must be finite and > 0 (operations per byte), got {intensity!r}")
        ops = np.minimum(self.psi_ops_per_second, self.kappa_bytes_per_second * arr)
        return float(ops) if arr.ndim == 0 and not isinstance(intensity, np.ndarray) else ops

    @property
    def ridge_intensity(self) -> float:
        """``λ* = ψ / κ`` (operations per byte): where ``κ·λ`` meets ``ψ`` (Zhu section II, the ridge point)."""
        return self.psi_ops_per_second / self.kappa_bytes_per_second

    def region(self, intensity: float) -> str:
        """:data:`REGION_BANDWIDTH_BOUND` below the ridge intensity, else :data:`REGION_IOPS_BOUND`."""
        return REGION_BANDWIDTH_BOUND if intensity < self.ridge_intensity else REGION_IOPS_BOUND

    def system_score_vector(self) -> tuple[float, float]:
        """The vector-based system score, the ridge point ``(ψ, λ*)`` in (operations/s, operations/byte)
        (Zhu eq. 13; eqs. 15-16 for FUCHS-CSC and Cesari)."""
        return (self.psi_ops_per_second, self.ridge_intensity)

    def system_score_bandwidth(self) -> float:
        """The bandwidth-based system score ``ψ · λ*^-1`` in bytes/s (Zhu eq. 14 as eqs. 17-18 apply it),
        which equals ``κ``; :func:`bandwidth_score` computes it from a (rounded) published ridge point."""
        return bandwidth_score(self.psi_ops_per_second, self.ridge_intensity)

    def application_score(self, point: IOPoint) -> float:
        """Zhu eqs. 10-11: ``1 / (1 + Δ)``, ``Δ`` the log10 distance of ``(λ, IOPS)`` from ``(λ*, ψ)``.

        1.0 at the ridge point; lower the further the point lies in intensity or in rate (a point on the roof
        far from the ridge scores below 1, as Table IV of the paper shows for small operations). 0 for a
        point with no operations.
        """
        ref = (self.ridge_intensity, self.psi_ops_per_second)
        return partial_score(log_distance(ref, (point.intensity_ops_per_byte, point.ops_per_second)))

    def place(self, point: IOPoint) -> dict[str, Any]:
        """One point on this roofline, JSON-ready.

        Returns:
            ``{"label", "intensity_ops_per_byte", "ops_per_second", "bytes_per_second", "attainable_ops_per_second",
            "headroom" (attainable / achieved, None for 0), "region", "score"}``.
        """
        attainable = self.attainable(point.intensity_ops_per_byte)
        return {
            "label": point.label,
            "intensity_ops_per_byte": point.intensity_ops_per_byte,
            "ops_per_second": point.ops_per_second,
            "bytes_per_second": point.bytes_per_second,
            "attainable_ops_per_second": attainable,
            "headroom": attainable / point.ops_per_second if point.ops_per_second > 0 else None,
            "region": self.region(point.intensity_ops_per_byte),
            "score": self.application_score(point),
        }

    def to_dict(self) -> dict[str, Any]:
        """``{"name", "scope", "psi_ops_per_second", "kappa_bytes_per_second", "ridge_intensity_ops_per_byte",
        "system_score_vector", "system_score_bandwidth_bytes_per_second"}``."""
        return {
            "name": self.name,
            "scope": self.scope,
            "psi_ops_per_second": self.psi_ops_per_second,
            "kappa_bytes_per_second": self.kappa_bytes_per_second,
            "ridge_intensity_ops_per_byte": self.ridge_intensity,
            "system_score_vector": list(self.system_score_vector()),
            "system_score_bandwidth_bytes_per_second": self.system_score_bandwidth(),
        }


def bandwidth_score(psi_ops_per_second: float, ridge_intensity_ops_per_byte: float) -> float:
    """The bandwidth-based system score, ``ψ · λ^-1`` in bytes/s (Zhu eq. 14 as eqs. 17-18 apply it).

    Eq. 17: ``3416 IOP/s / 9.77e-7 IOP/byte ≈ 3334 MiB/s`` (FUCHS-CSC); eq. 18: ``1024 / 9.77e-7 ≈ 1000
    MiB/s`` (Cesari).

    Raises:
        ValueError: an argument is not finite and > 0.
    """
    return _positive("psi_ops_per_second", psi_ops_per_second) / _positive(
        "ridge intensity", ridge_intensity_ops_per_byte
    )


def io_rooflines(platform: Platform, side: Side = "server", bound: Bound = "max") -> dict[str, IORoofline]:
    """The storage and network I/O rooflines of a measured platform, those whose two metrics it has.

    ``ψ`` is the operation-rate metric's peak and ``κ`` the bandwidth metric's (:data:`IO_METRICS`): per
    server process (``Ps``, the saturated server node's aggregate over its server processes) for
    ``side="server"``, per client process (``Pc``, one client against a quiescent server) for
    ``side="client"``. Zhu derive both peaks from benchmarks (IOR); here the self-test is the benchmark.

    Args:
        platform: the collected data-service model.
        side: ``"server"`` (``Ps``) or ``"client"`` (``Pc``).
        bound: ``"max"`` or ``"min"`` of each parameter's measured range.

    Returns:
        ``{"storage": IORoofline, "network": IORoofline}``, without those the platform lacks a metric of.

    Raises:
        ValueError: ``side`` or ``bound`` is not one of its values.
    """
    if side not in ("server", "client"):
        raise ValueError(f"side must be 'server' or 'client', got {side!r}")
    if bound not in ("min", "max"):
        raise ValueError(f"bound must be 'min' or 'max', got {bound!r}")
    out: dict[str, IORoofline] = {}
    for name, (ops_metric, bw_metric) in IO_METRICS.items():
        if ops_metric not in platform.rooflines or bw_metric not in platform.rooflines:
            continue
        ops_rl, bw_rl = platform.rooflines[ops_metric], platform.rooflines[bw_metric]
        ops_range, bw_range = (ops_rl.ps, bw_rl.ps) if side == "server" else (ops_rl.pc, bw_rl.pc)
        out[name] = IORoofline(
            name=name,
            psi_ops_per_second=getattr(ops_range, bound),
            kappa_bytes_per_second=bytes_per_second(bw_rl.metric, getattr(bw_range, bound)),
            scope=f"per {side} process ({'Ps' if side == 'server' else 'Pc'} {bound})",
        )
    return out


def validation_points(platform: Platform, name: str, side: Side = "server") -> list[IOPoint]:
    """The self-test's own validation samples of the two metrics of I/O roofline ``name``, as I/O points.

    A sample of metric m ran operations of ``platform.bytes_per_op[m]`` bytes (the bulk size, the storage
    block size), so its intensity is ``λ = 1 / bytes`` (eq. 4 for one operation); its operations per second
    are its rate per client process times clients / servers (``side="server"``: per server process) or the
    rate per client process itself (``side="client"``); a bandwidth rate is divided by the bytes per
    operation. Metrics whose bytes per operation were not recorded (and ``rpc_rate``, a noop of no payload)
    give no point.

    Raises:
        ValueError: ``name`` is not a key of :data:`IO_METRICS`.
    """
    if name not in IO_METRICS:
        raise ValueError(f"no I/O roofline {name!r}; choose from {sorted(IO_METRICS)}")
    points = []
    for metric in IO_METRICS[name]:
        size = platform.bytes_per_op.get(metric)
        rl = platform.rooflines.get(metric)
        if not size or rl is None:
            continue
        for s in rl.samples:
            per_process = s.rate_per_client * (s.clients / s.servers if side == "server" else 1.0)
            ops = bytes_per_second(rl.metric, per_process) / size if rl.metric.unit in BYTE_RATE_UNITS else per_process
            points.append(IOPoint(f"{metric} {s.servers}x{s.clients}", 1.0 / size, ops))
    return points
