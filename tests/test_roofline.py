"""Tests of the data-service roofline model (selftest/roofline/dataservice.py): no service, plain numbers and
JSON documents only; the platform model read from every document that holds one."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from roofline_kit import assert_png, platform_doc

from selftest.roofline import (
    METRICS,
    Metric,
    Platform,
    Range,
    Roofline,
    Sample,
    Saturation,
    combine_scores,
    plot,
)
from selftest.store import ResultsStore


def make(pc: float, ps: float, samples: list[Sample] | None = None, metric: str = "rpc_rate") -> Roofline:
    return Roofline(METRICS[metric], Range(pc, pc), Range(ps, ps), samples or [])


# --- Range -------------------------------------------------------------------------------------------------


def test_range_of_takes_min_and_max() -> None:
    r = Range.of(iter([3.0, 1, 2.5]))
    assert (r.min, r.max) == (1.0, 3.0)
    assert Range.of([7]) == Range(7.0, 7.0)


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ([], "at least one"),
        ([1.0, math.nan], "finite"),
        ([1.0, math.inf], "finite"),
        ([1.0, -0.5], ">= 0"),
        (["fast"], "numbers"),
    ],
)
def test_range_of_rejects_bad_input(values: list[object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Range.of(values)  # type: ignore[arg-type]


def test_range_rejects_inverted_bounds() -> None:
    with pytest.raises(ValueError, match="larger than"):
        Range(2.0, 1.0)


# --- ceilings and ridge ------------------------------------------------------------------------------------


def test_ridge_capped_at_one_when_client_peak_exceeds_server_peak() -> None:
    # Pc/Ps = 2, but the server ceiling is flat beyond X = 1 (Carns 2025, section 4.2).
    rl = make(pc=100, ps=50)
    assert rl.ridge() == pytest.approx(1.0)
    assert rl.attainable(0.5) == pytest.approx(25.0)
    assert rl.attainable(1.0) == pytest.approx(50.0)
    assert rl.attainable(4.0) == pytest.approx(50.0)  # not Ps * X = 200, not Pc = 100


def test_ridge_below_one_when_server_peak_exceeds_client_peak() -> None:
    rl = make(pc=20, ps=80)
    assert rl.ridge() == pytest.approx(0.25)
    assert rl.attainable(1 / 16) == pytest.approx(5.0)
    assert rl.attainable(1 / 8) == pytest.approx(10.0)
    assert rl.attainable(0.25) == pytest.approx(20.0)
    assert rl.attainable(2.0) == pytest.approx(20.0)
    assert isinstance(rl.attainable(0.5), float)


def test_attainable_is_vectorised() -> None:
    rl = make(pc=20, ps=80)
    x = np.array([[1 / 16, 1 / 8], [0.25, 4.0]])
    y = rl.attainable(x)
    assert isinstance(y, np.ndarray)
    assert y.shape == (2, 2)
    np.testing.assert_allclose(y, [[5.0, 10.0], [20.0, 20.0]])
    np.testing.assert_allclose(rl.attainable([0.125, 1.0]), [10.0, 20.0])


def test_min_and_max_bounds_use_their_own_parameters() -> None:
    rl = Roofline(METRICS["rpc_rate"], pc=Range(10, 20), ps=Range(40, 80))
    assert rl.attainable(0.1, "max") == pytest.approx(8.0)
    assert rl.attainable(0.1, "min") == pytest.approx(4.0)
    assert rl.attainable(1.0, "min") == pytest.approx(10.0)
    assert rl.ridge("max") == pytest.approx(0.25)
    assert rl.ridge("min") == pytest.approx(0.25)
    rl2 = Roofline(METRICS["rpc_rate"], pc=Range(10, 40), ps=Range(80, 80))
    assert rl2.ridge("min") == pytest.approx(0.125)
    assert rl2.ridge("max") == pytest.approx(0.5)


@pytest.mark.parametrize("x", [0.0, -1.0, math.inf, math.nan])
def test_attainable_rejects_bad_ratio(x: float) -> None:
    with pytest.raises(ValueError, match="service ratio"):
        make(20, 80).attainable(x)


def test_bad_bound_is_rejected() -> None:
    with pytest.raises(ValueError, match="bound"):
        make(20, 80).ridge("middle")  # type: ignore[arg-type]


@pytest.mark.parametrize(("pc", "ps", "name"), [(0.0, 5.0, "pc"), (5.0, 0.0, "ps")])
def test_zero_peak_is_rejected(pc: float, ps: float, name: str) -> None:
    with pytest.raises(ValueError, match=f"Roofline.{name} must be > 0"):
        Roofline(METRICS["bandwidth"], Range(pc, 10.0), Range(ps, 10.0))


def test_sample_service_ratio_and_validation() -> None:
    assert Sample(servers=2, clients=8, rate_per_client=1.0).service_ratio == pytest.approx(0.25)
    with pytest.raises(ValueError, match="clients"):
        Sample(servers=1, clients=0, rate_per_client=1.0)
    with pytest.raises(ValueError, match="rate_per_client"):
        Sample(servers=1, clients=1, rate_per_client=-1.0)


# --- scores ------------------------------------------------------------------------------------------------


def test_score_on_known_inputs() -> None:
    rl = make(pc=20, ps=80)  # R(1/8) = 10, R(1) = 20
    assert rl.score(Sample(1, 8, 10.0)) == pytest.approx(1.0)
    assert rl.score(Sample(1, 8, 1.0)) == pytest.approx(0.5)  # 10x below
    assert rl.score(Sample(1, 1, 200.0)) == pytest.approx(0.5)  # 10x above
    assert rl.score(Sample(1, 1, 0.2)) == pytest.approx(1 / 3)  # 100x below
    assert rl.score(Sample(1, 1, 0.0)) == 0.0
    assert rl.efficiency(Sample(1, 8, 5.0)) == pytest.approx(0.5)


def test_combine_scores_weighted_geometric_mean() -> None:
    assert combine_scores({"rpc_rate": 0.25, "bandwidth": 1.0}) == pytest.approx(0.5)
    assert combine_scores({"a": 0.5, "b": 1.0}, {"a": 2, "b": 1}) == pytest.approx(0.25 ** (1 / 3))
    assert combine_scores({"a": 0.8}) == pytest.approx(0.8)
    assert combine_scores({"a": 0.0, "b": 1.0}) == 0.0


@pytest.mark.parametrize(
    ("scores", "weights", "match"),
    [
        ({}, None, "at least one"),
        ({"a": -0.1}, None, "finite"),
        ({"a": 0.5}, {"a": 0.0}, "> 0"),
        ({"a": 0.5, "b": 0.5}, {"a": 1.0}, "missing"),
        ({"a": 0.5}, {"a": 1.0, "c": 1.0}, "unknown"),
    ],
)
def test_combine_scores_errors(scores: dict[str, float], weights: dict[str, float] | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        combine_scores(scores, weights)


def test_scores_summary_and_regions() -> None:
    # Pc = 20, Ps = 80, ridge 1/4.
    samples = [
        Sample(1, 8, 10.0),  # X = 1/8, R = 10, on the roof: score 1, error 0, server-bound
        Sample(1, 16, 0.5),  # X = 1/16, R = 5, 10x below: score 0.5, error -0.9, server-bound
        Sample(1, 4, 10.0),  # X = 1/4 (ridge), R = 20: error -0.5, client-bound
        Sample(2, 1, 20.0),  # X = 2, R = 20: score 1, client-bound
    ]
    result = make(20, 80, samples).scores()
    assert result["ridge"] == pytest.approx(0.25)
    assert [row["region"] for row in result["samples"]] == [
        "server-bound",
        "server-bound",
        "client-bound",
        "client-bound",
    ]
    assert [row["relative_error"] for row in result["samples"]] == pytest.approx([0.0, -0.9, -0.5, 0.0])
    s3 = 1 / (1 + math.log10(2))
    assert result["overall"]["count"] == 4
    assert result["overall"]["score"] == pytest.approx((0.5 * s3) ** 0.25)
    assert result["overall"]["median_relative_error"] == pytest.approx(0.25)
    assert result["overall"]["worst_relative_error"] == pytest.approx(0.9)
    server = result["regions"]["server-bound"]
    assert server["count"] == 2
    assert server["score"] == pytest.approx(math.sqrt(0.5))
    assert server["worst_relative_error"] == pytest.approx(0.9)
    client = result["regions"]["client-bound"]
    assert client["score"] == pytest.approx(math.sqrt(s3))
    assert client["median_relative_error"] == pytest.approx(0.25)


def test_scores_without_samples() -> None:
    result = make(20, 80).scores()
    assert result["samples"] == []
    assert result["overall"] == {
        "count": 0,
        "score": None,
        "median_relative_error": None,
        "worst_relative_error": None,
    }


def test_oversubscribed_samples_are_marked_and_scored_apart() -> None:
    # Pc = 20, Ps = 80, ridge 1/4. The model assumes one process per core (Carns 2025, section 4.3).
    samples = [
        Sample(1, 8, 10.0, 1.0, 1.0),  # claimed, server-bound, on the roof
        Sample(1, 1, 18.0, 1.0, 1.0),  # claimed, client-bound, error -10%
        Sample(1, 8, 2.0, 1.0, 8.0),  # 8 clients per core: excluded, error -80%
        Sample(2, 4, 5.0, 2.0, 0.5),  # 2 servers per core: excluded, error -75%
        Sample(1, 4, 20.0),  # not recorded (an older document): claimed
    ]
    assert [s.oversubscribed for s in samples] == [False, False, True, True, False]
    result = make(20, 80, samples).scores()
    assert [row["oversubscribed"] for row in result["samples"]] == [False, False, True, True, False]
    assert result["overall"]["count"] == 3
    assert result["overall"]["median_relative_error"] == pytest.approx(0.0)
    assert result["overall"]["worst_relative_error"] == pytest.approx(0.1)
    assert result["regions"]["server-bound"]["count"] == 1
    assert result["regions"]["client-bound"]["count"] == 2
    excluded = result["excluded"]
    assert excluded["count"] == 2
    assert excluded["median_relative_error"] == pytest.approx(0.775)
    assert excluded["worst_relative_error"] == pytest.approx(0.8)
    assert excluded["score"] == pytest.approx(math.sqrt(1 / (1 + math.log10(5)) / (1 + math.log10(4))))


def test_processes_per_core_round_trip_and_validation() -> None:
    s = Sample(2, 8, 1.5, server_processes_per_core=2, client_processes_per_core=0.25)
    assert s.to_dict() == {"servers": 2, "clients": 8, "rate_per_client": 1.5, "server_processes_per_core": 2.0,
                           "client_processes_per_core": 0.25}  # fmt: skip
    assert Sample.from_dict(s.to_dict()) == s
    assert "server_processes_per_core" not in Sample(1, 1, 1.0).to_dict()
    for bad in (0.0, -1.0, math.inf, "two", True):
        with pytest.raises(ValueError, match="server_processes_per_core"):
            Sample(1, 1, 1.0, server_processes_per_core=bad)  # type: ignore[arg-type]


# --- JSON --------------------------------------------------------------------------------------------------


def test_json_round_trip() -> None:
    rl = Roofline(
        METRICS["bandwidth"],
        pc=Range.of([19.0, 21.1]),
        ps=Range.of([1.4, 1.45]),
        samples=[Sample(1, 16, 0.08), Sample(4, 4, 1.2), Sample(3, 2, 1.5)],
    )
    text = json.dumps(rl.to_dict(), allow_nan=False)
    doc = json.loads(text)
    assert doc["ridge"] == {"min": 1.0, "max": 1.0, "relation": "="}
    assert doc["scores"]["overall"]["count"] == 3
    assert doc["pc_saturation"] is None and doc["ps_saturation"] is None  # not recorded: nothing claimed
    back = Roofline.from_dict(doc)
    assert back == rl
    assert back.to_dict() == doc


def test_a_lower_bound_travels_with_the_model_and_moves_its_ridge() -> None:
    """A Ps from a server that was not saturated (Carns et al. 2025, section 4.3: Ps is a saturated server's rate)
    is a lower bound: the true ridge X* = Pc / Ps lies left of the one drawn; a Pc that is one moves it right."""
    ramp = ({"clients": 2, "depth": 1, "rate": 9e4}, {"clients": 2, "depth": 4, "rate": 9.1e4})
    low = Saturation(True, "the clients set the rate", 0.3, 0.97, 0.35, 1.4, 0.02, ramp)
    fine = Saturation(False, "the client's round trip set the rate", 0.4, 0.6)
    same = Range(16_000.0, 18_000.0)
    rl = Roofline(METRICS["rpc_rate"], Range(16_000.0, 18_000.0), Range(45_000.0, 45_500.0),
                  [Sample(1, 1, 20_700.0, pc_configuration=same), Sample(1, 8, 5_000.0)], fine, low)  # fmt: skip
    doc = json.loads(json.dumps(rl.to_dict(), allow_nan=False))
    assert doc["ps_saturation"]["lower_bound"] is True and doc["ps_saturation"]["ramp"] == [dict(r) for r in ramp]
    back = Roofline.from_dict(doc)
    assert back == rl and back.ps_lower_bound and not back.pc_lower_bound
    assert back.ridge_relation == "<="
    assert Roofline(rl.metric, rl.pc, rl.ps, [], low, fine).ridge_relation == ">="
    assert Roofline(rl.metric, rl.pc, rl.ps, [], low, low).ridge_relation == "?"
    assert Roofline(rl.metric, rl.pc, rl.ps, [], fine, fine).ridge_relation == "="
    assert back.samples[0].pc_difference == pytest.approx(0.15)  # 20.7 k against Pc 16-18 k: +15%
    assert back.samples[1].pc_difference is None
    findings = back.findings()
    assert findings[0] == "Ps 45-45.5 k ops/s is a lower bound: the clients set the rate"
    assert "repeats spread Pc 12% and Ps 1% (max / min - 1)" in findings
    assert ("the 1x1 sample repeats Pc's configuration: 20.7 k ops/s against Pc 16-18 k ops/s, +15% against its range"
            in findings)  # fmt: skip
    assert findings[-1] == "1 of 2 samples above the max ceiling (up to +15%), client-bound"
    twice = Roofline(rl.metric, rl.pc, rl.ps, [Sample(1, 1, 8_000.0, pc_configuration=same),
                     Sample(1, 1, 17_000.0, pc_configuration=same)], fine, fine).findings()  # fmt: skip
    assert [f for f in twice if "Pc's configuration" in f] == [  # one configuration, one sentence
        "the 1x1 samples (2) repeat Pc's configuration, Pc 16-18 k ops/s: 8 k ops/s, -50% against its range; "
        "17 k ops/s, within its range"]  # fmt: skip
    above = Roofline(rl.metric, rl.pc, rl.ps, [Sample(1, 8, 9_000.0)], fine, low).findings()[-1]
    assert above == ("1 of 1 samples above the max ceiling (up to +58%), server-bound, where the ceiling is Ps·X and "
                     "Ps is a lower bound")  # fmt: skip
    contended = Saturation(False, "saturated", 1.0, 0.5, 1.6, 0.6, 0.4, ramp)
    worded = Roofline(rl.metric, rl.pc, rl.ps, [], fine, contended).findings()
    assert ("Ps was measured under contention: its server waited for a core 40% of the time they were ready to run "
            "(other processes had it)") in worded  # fmt: skip
    with pytest.raises(ValueError, match="server_utilization"):
        Saturation(True, "x", server_utilization=float("nan"))
    with pytest.raises(ValueError, match="a saturation is"):
        Saturation.from_dict({"reason": "no lower_bound"})


def test_from_dict_hand_written_document() -> None:
    doc = {"metric": "rpc_rate", "pc": [148e3, 173e3], "ps": {"min": 524e3, "max": 530e3}}
    rl = Roofline.from_dict(doc)
    assert rl.metric == METRICS["rpc_rate"]
    assert rl.samples == []
    assert rl.ridge() == pytest.approx(173 / 530)
    with pytest.raises(ValueError, match="missing"):
        Roofline.from_dict({"metric": "rpc_rate", "pc": [1, 2]})
    with pytest.raises(ValueError, match="unknown metric"):
        Roofline.from_dict({**doc, "metric": "latency"})
    custom = Metric("storage_latency", "s", "latency per client process (s)")
    assert Roofline.from_dict({**doc, "metric": custom.to_dict()}).metric == custom


def test_save_and_load(tmp_path: Path) -> None:
    rl = make(20, 80, [Sample(1, 8, 9.0)])
    path = rl.save(tmp_path / "roofline.json")
    assert Roofline.load(path) == rl


# --- plot --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "samples",
    [
        [],
        [Sample(s, c, 0.9 * min(20.0, 80.0 * min(s / c, 1.0))) for s in (1, 2, 4) for c in (1, 4, 16)],
        [Sample(s, 16, 1.0) for s in range(1, 13)],  # more server counts than legend entries: colorbar
        [Sample(1, 1, 18.0, 1.0, 1.0), Sample(2, 8, 9.0, 2.0, 8.0)],  # the second shares cores: circled
    ],
    ids=["no-samples", "legend", "colorbar", "oversubscribed"],
)
def test_plot_writes_png(tmp_path: Path, samples: list[Sample]) -> None:
    rl = Roofline(METRICS["rpc_rate"], Range(15.0, 20.0), Range(70.0, 80.0), samples)
    out = plot(rl, tmp_path / "roofline.png", title="test")
    assert out.name == "roofline.png"
    assert_png(out)


def test_plot_client_ceiling_above_server_ceiling(tmp_path: Path) -> None:
    # The bandwidth case of Carns 2025, section 5.2: Pc >> Ps, ridge at 1:1.
    rl = Roofline(METRICS["bandwidth"], Range(19.0, 21.1), Range(1.4, 1.4), [Sample(1, 2, 0.7)])
    assert_png(plot(rl, str(tmp_path / "bw.png")))


# --- the platform model, from every document that holds one ------------------------------------------------


def test_platform_from_a_collect_document_a_store_run_and_a_bare_model(tmp_path: Path) -> None:
    doc = platform_doc({"rpc_rate": (20.0, 80.0), "bandwidth": (2.0, 1.0)}, {"rpc_rate": [Sample(1, 8, 9.0)]})
    p = Platform.from_document(doc)
    assert p.rooflines.keys() == {"rpc_rate", "bandwidth"}
    assert p.roofline("rpc_rate").samples == [Sample(1, 8, 9.0)]
    assert (p.server_cores, p.client_cores) == (4, 8)
    assert p.bytes_per_op == {"bandwidth": 2**20, "storage_iops": 4096, "storage_bandwidth": 2**20}
    assert p.label == "run 7"
    with pytest.raises(ValueError, match=r"no 'storage_iops' roofline \(it has \['bandwidth', 'rpc_rate'\]\)"):
        p.roofline("storage_iops")

    with ResultsStore(tmp_path / "r.sqlite") as store:
        rid = store.create_run(kind="svcframe-roofline", service="kv", platform="vm", host="vm",
                               options=doc["options"], environment={}, hardware={}, software={}, plan=[],
                               nodes=doc["nodes"])  # fmt: skip
        with pytest.raises(ValueError, match=rf"run {rid} has no model \(status running\); complete it"):
            Platform.from_document(store.run(rid), "store")
        store.finish_run(rid, model={k: doc[k] for k in ("metrics", "nodes")}, summary={})
        from_store = Platform.from_document(store.run(rid))
    assert from_store.rooflines == p.rooflines
    assert from_store.label == f"run {rid}: kv on vm"
    assert (from_store.server_cores, from_store.client_cores) == (4, 8)

    bare = Platform.from_document({"metrics": doc["metrics"]})
    assert bare.rooflines == p.rooflines and bare.server_cores is None and bare.bytes_per_op == {}

    path = tmp_path / "roofline.json"
    path.write_text(json.dumps(doc))
    assert Platform.load(path).rooflines == p.rooflines


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ([1, 2], "a platform roofline model is a JSON object, got list"),
        (
            {"kind": "svcframe-selftest", "aggregate": {}},
            "is not a platform roofline model .*; it is a svcframe-selftest",
        ),
        ({"metrics": {}}, "the model has no metric"),
        ({"metrics": {"rpc_rate": {"metric": "rpc_rate", "pc": [0, 1], "ps": [1, 1]}}}, r"metrics\.rpc_rate: .*> 0"),
    ],
)
def test_platform_errors_name_the_document(doc: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Platform.from_document(doc, "x.json")


def test_platform_load_of_a_file_that_is_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"bad\.json: cannot read a platform roofline model"):
        Platform.load(bad)
    with pytest.raises(ValueError, match=r"missing\.json: cannot read"):
        Platform.load(tmp_path / "missing.json")


def test_the_models_work_on_json_files_alone_without_the_engine(tmp_path: Path) -> None:
    # a fresh interpreter: every model and a plot on JSON files, and no svcframe module but its notation (no engine)
    doc = platform_doc({"rpc_rate": (20.0, 80.0), "bandwidth": (2.0, 1.0), "storage_iops": (3.0, 6.0),
                        "storage_bandwidth": (0.5, 0.25)})  # fmt: skip
    (tmp_path / "platform.json").write_text(json.dumps(doc))
    (tmp_path / "workload.json").write_text(
        json.dumps(
            {
                "name": "w",
                "points": [{"servers": 1, "clients": 4, "rate_per_client_ops_per_second": 5.0, "bytes_per_call": 100}],
            }
        )
    )  # R(1/4) = 20
    (tmp_path / "workflow.json").write_text(json.dumps({"name": "wf", "servers": 1, "parallel_tasks": 2, "stages": [
        {"name": "s", "tasks": 4, "rpcs_per_task": 10, "bytes_per_task": 1000}]}))  # fmt: skip
    code = f"""
import json, sys
from pathlib import Path
from selftest.roofline import Platform, Workload, WorkflowSpec, io_rooflines, place, plot_placement
from selftest.roofline.workflow import analyse
d = Path({str(tmp_path)!r})
platform = Platform.load(d / "platform.json")
placed = place(platform, Workload.load(d / "workload.json"))
plot_placement(platform, placed, d / "placed.png")  # the plots too: matplotlib, not the engine
out = {{"place": placed["points"][0]["headroom"],
        "io": sorted(io_rooflines(platform)),
        "workflow": analyse(platform, WorkflowSpec.load(d / "workflow.json"))["roofline"]["wall"],
        "svcframe": sorted(m for m in sys.modules if m.split(".")[0] == "svcframe")}}
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    out = json.loads(proc.stdout)
    # of svcframe, the figure notation alone (svcframe.units: pure functions, so tables and plots read alike), and
    # svcframe.compiled, which the package imports first (the standard library's importlib alone)
    assert out == {"place": pytest.approx(4.0), "io": ["network", "storage"], "workflow": 8,
                   "svcframe": ["svcframe", "svcframe.compiled", "svcframe.units"]}  # fmt: skip
    assert_png(tmp_path / "placed.png")
