"""The I/O roofline of Zhu & Neuwirth (selftest/roofline/io.py) on known inputs: the paper's worked system
scores (eqs. 15-18), the ceilings and ridge (eq. 3), intensities (eq. 4) and application scores (eqs. 10-12),
and the storage and network rooflines built from a collected platform model."""

from __future__ import annotations

import math

import numpy as np
import pytest
from roofline_kit import platform_doc

from selftest.roofline import Platform, Sample, combine_scores
from selftest.roofline.io import (
    REGION_BANDWIDTH_BOUND,
    REGION_IOPS_BOUND,
    IOPoint,
    IORoofline,
    bandwidth_score,
    io_rooflines,
    validation_points,
)

MIB = 2**20

# Section VI-C: FUCHS-CSC peaks at 3333.33 MiB/s and 3416.5 IOPS, Cesari at 1000 MiB/s and 1024 IOPS.
FUCHS = IORoofline("FUCHS-CSC", 3416.5, 3333.33 * MIB)
CESARI = IORoofline("Cesari", 1024, 1000 * MIB)


# --- the paper's worked figures ------------------------------------------------------------------------


def test_vector_scores_are_the_papers_eqs_15_and_16() -> None:
    # eq. 15: Score_Fuchs = (3416.5 IOP/s, 9.77e-7 IOP/byte); eq. 16: Score_Cesari = (1024, 9.77e-7)
    psi, ridge = FUCHS.system_score_vector()
    assert psi == 3416.5
    assert float(f"{ridge:.3g}") == 9.77e-7
    psi, ridge = CESARI.system_score_vector()
    assert psi == 1024
    assert float(f"{ridge:.3g}") == 9.77e-7


def test_bandwidth_scores_are_the_papers_eqs_17_and_18() -> None:
    # eq. 17: 3416 IOP/s x 1 / 9.77e-7 IOP/byte ~ 3334 MiB/s; eq. 18: 1024 / 9.77e-7 ~ 1000 MiB/s
    assert round(bandwidth_score(3416, 9.77e-7) / MIB) == 3334
    assert round(bandwidth_score(1024, 9.77e-7) / MIB) == 1000
    # with the unrounded ridge, the score is the peak bandwidth itself (psi / (psi / kappa))
    assert FUCHS.system_score_bandwidth() == pytest.approx(3333.33 * MIB)
    assert CESARI.system_score_bandwidth() == pytest.approx(1000 * MIB)
    # "Cesari only achieved approximately one-third of Fuchs-CSC's peak performance"
    assert CESARI.psi_ops_per_second / FUCHS.psi_ops_per_second == pytest.approx(0.30, abs=0.01)


# --- eq. 3: ceilings and ridge -------------------------------------------------------------------------


def test_attainable_is_the_lower_of_the_two_ceilings() -> None:
    rl = IORoofline("disk", psi_ops_per_second=1000.0, kappa_bytes_per_second=4096.0 * 100)  # ridge 1/409.6
    assert rl.ridge_intensity == pytest.approx(1000 / 409600)
    assert rl.attainable(1 / 4096) == pytest.approx(100.0)  # bandwidth-bound: 400 KiB/s of 4 KiB ops
    assert rl.attainable(1 / 64) == pytest.approx(1000.0)  # IOPS-bound
    assert rl.attainable(rl.ridge_intensity) == pytest.approx(1000.0)
    assert rl.region(1 / 4096) == REGION_BANDWIDTH_BOUND
    assert rl.region(1 / 64) == REGION_IOPS_BOUND
    np.testing.assert_allclose(rl.attainable(np.array([1 / 4096, 1 / 64])), [100.0, 1000.0])
    with pytest.raises(ValueError, match="I/O intensities must be finite and > 0"):
        rl.attainable(0.0)


@pytest.mark.parametrize(("psi", "kappa"), [(0.0, 1.0), (1.0, -1.0), (math.inf, 1.0), (1.0, math.nan)])
def test_peaks_must_be_positive(psi: float, kappa: float) -> None:
    with pytest.raises(ValueError, match="must be finite and > 0"):
        IORoofline("x", psi, kappa)


# --- eq. 4 and the application scores (eqs. 10-12) ------------------------------------------------------


def test_intensity_from_counts_is_operations_per_byte() -> None:
    p = IOPoint.from_counts("ior", operations=1000, bytes_moved=1000 * 4096, seconds=2.0)
    assert p.intensity_ops_per_byte == pytest.approx(1 / 4096)
    assert p.ops_per_second == pytest.approx(500.0)
    assert p.bytes_per_second == pytest.approx(500 * 4096)
    with pytest.raises(ValueError, match="bytes_moved"):
        IOPoint.from_counts("empty", operations=10, bytes_moved=0, seconds=1.0)


def test_application_score_is_the_log_distance_to_the_ridge_point() -> None:
    rl = IORoofline("disk", 1000.0, 1000.0 * 4096)  # ridge (1/4096 IOP/byte, 1000 IOP/s)
    at_ridge = IOPoint("at ridge", 1 / 4096, 1000.0)
    assert rl.application_score(at_ridge) == pytest.approx(1.0)
    assert rl.application_score(IOPoint("10x slower", 1 / 4096, 100.0)) == pytest.approx(0.5)
    # a decade away in both intensity and rate: distance sqrt(2) (eq. 10)
    assert rl.application_score(IOPoint("far", 1 / 409.6, 100.0)) == pytest.approx(1 / (1 + math.sqrt(2)))
    # on the roof but at 1/16 the ridge's intensity: the distance counts the intensity too (Table IV)
    on_roof = IOPoint("big ops", 1 / 65536, rl.attainable(1 / 65536))
    placed = rl.place(on_roof)
    assert placed["headroom"] == pytest.approx(1.0)
    assert placed["score"] == pytest.approx(1 / (1 + math.sqrt(2) * math.log10(16)))
    assert placed["region"] == REGION_BANDWIDTH_BOUND
    assert rl.place(IOPoint("idle", 1 / 4096, 0.0))["score"] == 0.0
    # eq. 12 combines the storage and network scores, weighted
    combined = combine_scores({"storage": 0.5, "network": 1.0}, {"storage": 3.0, "network": 1.0})
    assert combined == pytest.approx(0.5**0.75)


# --- from a collected platform --------------------------------------------------------------------------


def test_rooflines_of_a_collected_platform_per_server_and_per_client() -> None:
    doc = platform_doc({
        "rpc_rate": (20_000.0, 80_000.0),  # ops/s
        "bandwidth": (2.0, 1.0),  # GiB/s
        "storage_iops": (3_000.0, 6_000.0),
        "storage_bandwidth": (0.5, 0.25),
    })  # fmt: skip
    platform = Platform.from_document(doc)
    server = io_rooflines(platform)
    assert server.keys() == {"storage", "network"}
    assert server["network"].psi_ops_per_second == 80_000.0
    assert server["network"].kappa_bytes_per_second == 2**30
    assert server["network"].ridge_intensity == pytest.approx(80_000 / 2**30)
    assert server["storage"].psi_ops_per_second == 6_000.0
    assert server["storage"].kappa_bytes_per_second == 0.25 * 2**30
    client = io_rooflines(platform, side="client")
    assert client["network"].psi_ops_per_second == 20_000.0
    assert client["network"].kappa_bytes_per_second == 2 * 2**30
    assert "per client process" in client["network"].scope
    d = server["storage"].to_dict()
    assert d["ridge_intensity_ops_per_byte"] == pytest.approx(6000 / (0.25 * 2**30))
    assert d["system_score_bandwidth_bytes_per_second"] == pytest.approx(0.25 * 2**30)
    # without the storage metrics, only the network roofline
    assert io_rooflines(Platform.from_document(platform_doc({"rpc_rate": (1, 2), "bandwidth": (1, 2)}))).keys() == {
        "network"
    }
    with pytest.raises(ValueError, match="side"):
        io_rooflines(platform, side="both")  # type: ignore[arg-type]


def test_validation_samples_are_placed_at_their_block_intensity() -> None:
    samples = {
        "storage_iops": [Sample(2, 4, 1000.0)],  # 4 clients x 1000 ops/s over 2 servers, 4 KiB blocks
        "storage_bandwidth": [Sample(1, 2, 0.125)],  # 2 clients x 1/8 GiB/s over 1 server, 1 MiB blocks
    }
    doc = platform_doc({"storage_iops": (3_000.0, 6_000.0), "storage_bandwidth": (0.5, 0.25)}, samples)
    platform = Platform.from_document(doc)
    points = validation_points(platform, "storage")
    assert [p.label for p in points] == ["storage_iops 2x4", "storage_bandwidth 1x2"]
    assert points[0].intensity_ops_per_byte == 1 / 4096
    assert points[0].ops_per_second == pytest.approx(2000.0)  # per server process
    assert points[1].intensity_ops_per_byte == 1 / 2**20
    assert points[1].ops_per_second == pytest.approx(0.25 * 2**30 / 2**20)  # 256 ops/s of 1 MiB
    client_side = validation_points(platform, "storage", side="client")
    assert client_side[0].ops_per_second == pytest.approx(1000.0)
    # no network metric was collected: no network points
    assert validation_points(platform, "network") == []
    with pytest.raises(ValueError, match="no I/O roofline"):
        validation_points(platform, "memory")
