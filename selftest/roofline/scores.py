"""Scores of a point against a roofline (Zhu & Neuwirth, ``papers/zhu-neuwirth-io-roofline-scoring.txt``,
section IV-B1, eqs. 9-12), shared by the three models of this package.

* eq. 10, the distance of an application point from its reference point, in log10 space over the
  dimensions of one roofline: ``Δ = sqrt(Σ_dim log10(P_ref / P_app)^2)``;
* eq. 11, the partial score of one roofline (one performance dimension): ``1 / (1 + Δ)``, in (0, 1];
* eq. 12, the score of several rooflines: the weighted geometric mean of the partial scores,
  ``(Π score_i ** w_i) ** (1 / Σ w_i)``.

The data-service roofline and workload placement score one coordinate (the rate), against the attainable
rate at the point's own service ratio (DESIGN.md section 6); the I/O roofline scores two (intensity and
IOPS) against the ridge point, as the paper does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def log_distance(reference: Sequence[float], point: Sequence[float]) -> float:
    """Euclidean distance in log10 space: ``sqrt(Σ log10(reference_i / point_i)^2)`` (Zhu & Neuwirth eq. 10).

    Args:
        reference: the reference point's coordinates (the ridge point, or the attainable rate), each > 0.
        point: the application point's coordinates, same length, each > 0 (``inf`` distance for a 0).

    Returns:
        The distance, >= 0, dimensionless (decades); ``math.inf`` if a coordinate of ``point`` is 0.

    Raises:
        ValueError: the lengths differ, are 0, or a coordinate is negative, not finite or a zero reference.
    """
    if len(reference) != len(point) or not reference:
        raise ValueError(f"a distance needs two points of equal, non-zero dimension; got {reference!r}, {point!r}")
    for ref, app in zip(reference, point, strict=True):
        if not (math.isfinite(ref) and ref > 0):
            raise ValueError(f"reference coordinates must be finite and > 0, got {ref!r}")
        if not (math.isfinite(app) and app >= 0):
            raise ValueError(f"point coordinates must be finite and >= 0, got {app!r}")
    if any(app == 0 for app in point):
        return math.inf
    return math.sqrt(math.fsum(math.log10(ref / app) ** 2 for ref, app in zip(reference, point, strict=True)))


def partial_score(distance: float) -> float:
    """``1 / (1 + distance)`` (Zhu & Neuwirth eq. 11): 1.0 at the reference, 0.5 one decade away, 0 at ``inf``.

    Raises:
        ValueError: ``distance`` is negative or NaN.
    """
    if math.isnan(distance) or distance < 0:
        raise ValueError(f"a distance is >= 0, got {distance!r}")
    return 0.0 if math.isinf(distance) else 1.0 / (1.0 + distance)


def rate_score(attainable: float, measured: float) -> float:
    """Closeness of one measured rate to its attainable rate: ``1 / (1 + |log10(attainable / measured)|)``.

    Zhu & Neuwirth eqs. 10-11 in one dimension (DESIGN.md section 6). Symmetric in log space: 10x below or
    10x above the roof both score 0.5; a measured rate of 0 scores 0.

    Raises:
        ValueError: ``attainable`` is not finite and > 0, or ``measured`` is negative or not finite.
    """
    return partial_score(log_distance([attainable], [measured]))


def weighted_geometric_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """``(Π v_i ** w_i) ** (1 / Σ w_i)`` (Zhu & Neuwirth eq. 12), computed in log space; 0.0 if a value is 0.

    The caller checks the inputs (values >= 0, weights > 0, equal lengths, not empty).
    """
    if any(v == 0 for v in values):
        return 0.0
    total = math.fsum(weights)
    return math.exp(math.fsum(w * math.log(v) for v, w in zip(values, weights, strict=True)) / total)


def combine_scores(scores: Mapping[str, float], weights: Mapping[str, float] | None = None) -> float:
    """Combine per-dimension (per-metric) scores into one by weighted geometric mean.

    ``score = (prod_i score_i ** w_i) ** (1 / sum_i w_i)`` (Zhu & Neuwirth eq. 12).

    Args:
        scores: score per metric name, each finite and >= 0 (scores of this package lie in [0, 1]).
        weights: weight per metric name, each finite and > 0; ``None`` weighs every metric 1.
            Must name exactly the metrics of ``scores``.

    Returns:
        The combined score; 0.0 if any score is 0.

    Raises:
        ValueError: ``scores`` is empty, a score or weight is invalid, or the keys of ``weights`` differ
            from those of ``scores``.
    """
    if not scores:
        raise ValueError("combine_scores needs at least one score")
    for name, value in scores.items():
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"score {name!r} must be finite and >= 0, got {value!r}")
    if weights is None:
        weights = dict.fromkeys(scores, 1.0)
    if set(weights) != set(scores):
        raise ValueError(
            f"weights must name exactly the scored metrics {sorted(scores)}; "
            f"missing {sorted(set(scores) - set(weights))}, unknown {sorted(set(weights) - set(scores))}"
        )
    for name, w in weights.items():
        if not math.isfinite(w) or w <= 0:
            raise ValueError(f"weight {name!r} must be finite and > 0, got {w!r}")
    names = list(scores)
    return weighted_geometric_mean([scores[n] for n in names], [weights[n] for n in names])
