"""Workloads placed on the data-service rooflines (selftest/roofline/placement.py): known inputs, the
workload schema's errors, and end to end: a real collection, a real self-test run, its placement."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from roofline_kit import platform_doc

from selftest.roofline import Platform
from selftest.roofline.placement import Workload, WorkloadPoint, place

# roofline placement: our logic, not the Python version's (CI's first interpreter only)
pytestmark = pytest.mark.one_interpreter


GIB = 2**30

# RPC rate: Pc 20k, Ps 80k ops/s (ridge 1/4); bandwidth: Pc 2, Ps 1 GiB/s (ridge 1).
PLATFORM = Platform.from_document(platform_doc({"rpc_rate": (20_000.0, 80_000.0), "bandwidth": (2.0, 1.0)}))


def test_points_get_attainable_rate_limit_region_score_and_headroom() -> None:
    workload = Workload(
        name="kv put 1 KiB",
        rpc="1:put",
        points=[
            # X = 1/8: R_rpc = 80k / 8 = 10k calls/s; R_bw = 1 GiB/s / 8 / 1100 B = 122k calls/s
            WorkloadPoint(servers=4, clients=32, rate_per_client_ops_per_second=9000.0, bytes_per_call=1100,
                          server_processes_per_core=1.0, client_processes_per_core=1.0, label="4x32"),
            # X = 1 with 1 MiB per call: R_rpc = 20k, R_bw = 1 GiB/s / 1 MiB = 1024 calls/s
            WorkloadPoint(servers=4, clients=4, rate_per_client_ops_per_second=512.0, bytes_per_call=2**20),
            # 4 clients per core: placed, but the model does not claim it
            WorkloadPoint(servers=1, clients=8, rate_per_client_ops_per_second=1000.0, client_processes_per_core=4),
        ],
    )  # fmt: skip
    result = place(PLATFORM, workload)
    assert result["kind"] == "svcframe-placement" and result["workload"] == "kv put 1 KiB"
    a, b, c = result["points"]
    assert a["attainable_ops_per_second"] == pytest.approx(10_000.0)
    assert a["limited_by"] == "rpc_rate" and a["region"] == "server-bound"
    assert a["ceilings"]["bandwidth"] == pytest.approx(GIB / 8 / 1100)
    assert a["headroom"] == pytest.approx(10 / 9)
    assert a["score"] == pytest.approx(1 / (1 + math.log10(10 / 9)))
    assert a["ridge"] == pytest.approx(0.25) and a["servers_at_ridge"] == 8  # 8 servers for 32 clients
    assert b["attainable_ops_per_second"] == pytest.approx(1024.0)
    assert b["limited_by"] == "bandwidth" and b["region"] == "client-bound"
    assert b["headroom"] == pytest.approx(2.0) and b["servers_at_ridge"] == 4
    assert b["score"] == pytest.approx(1 / (1 + math.log10(2)))
    assert c["oversubscribed"] and not a["oversubscribed"] and not b["oversubscribed"]
    assert c["ceilings"] == {"rpc_rate": pytest.approx(10_000.0)}  # no bytes: no bandwidth ceiling
    summary = result["summary"]
    assert summary["count"] == 2 and summary["excluded"] == 1
    assert summary["score"] == pytest.approx(math.sqrt(a["score"] * b["score"]))
    assert summary["median_headroom"] == pytest.approx((10 / 9 + 2) / 2)
    assert result["notes"] == []
    json.dumps(result, allow_nan=False)  # JSON-ready

    low = place(PLATFORM, workload, bound="min")["points"][0]  # one-value ranges: the same ceilings
    assert low["attainable_ops_per_second"] == pytest.approx(10_000.0)


def test_without_a_bandwidth_roofline_points_are_placed_on_the_rpc_rate_and_the_result_says_so() -> None:
    rpc_only = Platform.from_document(platform_doc({"rpc_rate": (20_000.0, 80_000.0)}))
    w = Workload(name="w", points=[WorkloadPoint(servers=1, clients=1, rate_per_client_ops_per_second=10.0,
                                                 bytes_per_call=4096)])  # fmt: skip
    result = place(rpc_only, w)
    assert result["points"][0]["limited_by"] == "rpc_rate"
    assert result["notes"] == ["the platform model has no bandwidth roofline: points are placed on the RPC rate alone"]
    bw_only = Platform.from_document(platform_doc({"bandwidth": (2.0, 1.0)}))
    with pytest.raises(ValueError, match="no 'rpc_rate' roofline"):
        place(bw_only, w)


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"name": "w", "points": []}, "w.json: points: List should have at least 1 item"),
        ({"points": [{"servers": 1, "clients": 1, "rate_per_client_ops_per_second": 1}]},
         "w.json: name: Field required"),
        ({"name": "w", "points": [{"servers": 0, "clients": 1, "rate_per_client_ops_per_second": 1}]},
         "w.json: points[0].servers: Input should be greater than or equal to 1 (got 0)"),
        ({"name": "w", "points": [{"servers": 1, "clients": 1, "rate_per_client_ops_per_second": -5}]},
         "w.json: points[0].rate_per_client_ops_per_second: Input should be greater than or equal to 0 (got -5)"),
        ({"name": "w", "points": [{"servers": 1, "clients": 1, "rate_per_client_ops_per_second": 1, "rate": 2}]},
         "w.json: points[0].rate: Extra inputs are not permitted (got 2)"),
        ({"name": "w", "kind": "svcframe-roofline", "points": [{"servers": 1, "clients": 1,
                                                               "rate_per_client_ops_per_second": 1}]},
         "w.json: kind: Input should be 'svcframe-workload'"),
    ],
)  # fmt: skip
def test_workload_errors_name_the_file_and_the_json_path(doc: dict, expected: str, tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as err:
        Workload.from_document(doc, "w.json")
    assert str(err.value).startswith(expected)
    with pytest.raises(ValueError, match=r"w\.json: "):
        Workload.load(path)


def test_workload_file_round_trip_and_unreadable_files(tmp_path: Path) -> None:
    w = Workload(name="kv get", rpc="kv:get", points=[WorkloadPoint(servers=2, clients=8,
                 rate_per_client_ops_per_second=1e4, bytes_per_call=64)], source={"window_seconds": 60})  # fmt: skip
    path = tmp_path / "kv-get.json"
    path.write_text(w.model_dump_json())
    assert Workload.load(path) == w
    path.write_text("not json")
    with pytest.raises(ValueError, match=r"kv-get\.json: cannot read a workload"):
        Workload.load(path)
    with pytest.raises(ValueError, match="not a self-test results document"):
        Workload.from_selftest_results({"aggregate": {}})


def test_placement_end_to_end_real_collection_and_real_selftest_run(tmp_path: Path) -> None:
    from selftest import SELFTEST_CONFIG
    from selftest.collect import CollectOptions, collect
    from selftest.driver import SelftestParams, run_selftest
    from selftest.store import ResultsStore
    from svcframe.config import load_config
    from svcframe.launch import Launch

    config = SELFTEST_CONFIG
    doc = collect(CollectOptions(out=tmp_path / "rl", duration_seconds=0.2, repeats=1, warmup_iterations=5,
                                 grid_servers=[1], grid_clients=[1], sweep_max_servers=0, saturation_depth=2,
                                 max_clients_per_core=2,
                                 store=tmp_path / "r.sqlite"))  # fmt: skip
    with ResultsStore(tmp_path / "r.sqlite") as store:
        run = store.run(doc["run_id"])
    platform = Platform.from_document(run)
    assert platform.rooflines.keys() == {"rpc_rate", "bandwidth"}

    with Launch(load_config(config), 1) as job:
        servers = [m.address for m in job.members]
        noop = run_selftest(SelftestParams(clients=1, duration_seconds=0.3, warmup_iterations=5), servers)
        bulk = run_selftest(SelftestParams(workload="bulk", bulk_size=2**20, clients=1, duration_seconds=0.3,
                                           warmup_iterations=2), servers)  # fmt: skip
    workload = Workload.from_selftest_results(noop, "noop", label="noop")
    workload.points += Workload.from_selftest_results(bulk, label="bulk 1 MiB").points
    assert [p.bytes_per_call for p in workload.points] == [256, 256 + 2**20]
    path = tmp_path / "workload.json"
    path.write_text(workload.model_dump_json(indent=2))
    result = place(platform, Workload.load(path))

    rpc, bw = platform.roofline("rpc_rate"), platform.roofline("bandwidth")
    p_noop, p_bulk = result["points"]
    assert p_noop["service_ratio"] == 1.0 and p_noop["rate_per_client_ops_per_second"] > 0
    assert p_noop["ceilings"]["rpc_rate"] == pytest.approx(rpc.attainable(1.0))
    assert p_noop["limited_by"] == "rpc_rate"  # 256 bytes per call: far below the bandwidth ceiling
    assert p_bulk["ceilings"]["bandwidth"] == pytest.approx(bw.attainable(1.0) * GIB / (256 + 2**20))
    assert p_bulk["limited_by"] == "bandwidth"  # a MiB per call: bandwidth-limited, not RPC-rate-limited
    for p in (p_noop, p_bulk):
        assert p["region"] == "client-bound"  # X = 1 is at or past the ridge (capped at 1)
        assert p["headroom"] == pytest.approx(p["attainable_ops_per_second"] / p["rate_per_client_ops_per_second"])
        assert 0 < p["score"] <= 1
    assert result["platform"] == f"run {run['id']}: selftest on {run['platform']}"


def test_workload_points_on_the_network_io_roofline() -> None:
    from selftest.roofline.io import io_rooflines
    from selftest.roofline.placement import io_points

    w = Workload(name="kv put", points=[
        WorkloadPoint(servers=2, clients=8, rate_per_client_ops_per_second=1000.0, bytes_per_call=1024),
        WorkloadPoint(servers=1, clients=1, rate_per_client_ops_per_second=50.0),  # no bytes: no intensity
    ])  # fmt: skip
    (p,) = io_points(w)
    assert p.label == "kv put 2x8" and p.intensity_ops_per_byte == 1 / 1024
    assert p.ops_per_second == 4000.0  # 8 clients x 1000 calls/s over 2 server processes
    assert io_points(w, side="client")[0].ops_per_second == 1000.0
    network = io_rooflines(PLATFORM)["network"]  # psi 80k ops/s, kappa 1 GiB/s: 1 KiB calls are IOPS-bound
    placed = network.place(p)
    assert placed["region"] == "IOPS-bound" and placed["headroom"] == pytest.approx(20.0)


def _stats(since: float, target: list[tuple[str, str, int, int, int, int]], bulk: dict[str, int]) -> dict:
    """Engine statistics as the admin ``statistics`` RPC returns them (the keys from_statistics reads): target
    rows (rpc, peer, calls, errors, sampled calls, request bytes of those; responses are 8 bytes each) and
    bulk bytes per peer."""
    rows = [{"parent_rpc": "", "parent_provider_id": None, "rpc": rpc, "provider_id": 1, "peer": peer, "calls": calls,
             "errors": errors, "request_bytes": {"count": sampled, "sum": nbytes},
             "response_bytes": {"count": sampled, "sum": 8 * sampled}}
            for rpc, peer, calls, errors, sampled, nbytes in target]  # fmt: skip
    return {"rpcs": {"enabled": True, "since": since, "target": rows,
                     "bulk": [{"direction": "pull", "peer": p, "bytes": {"sum": n}} for p, n in bulk.items()]}}  # fmt: skip


def test_a_workload_from_two_statistics_reads() -> None:
    first = {
        "tcp://a:1": _stats(5.0, [("put", "clients@h1", 100, 0, 64, 64_000), ("get", "clients@h1", 7, 0, 7, 70)],
                            {"clients@h1": 10_000, "clients@h9": 5}),
        "tcp://b:2": _stats(6.0, [], {}),
        "tcp://c:3": _stats(7.0, [("put", "clients@h3", 10, 0, 10, 10_000)], {}),
    }  # fmt: skip
    second = {
        "tcp://a:1": _stats(5.0, [("put", "clients@h1", 1_100, 4, 124, 124_000), ("get", "clients@h1", 900, 0, 70, 700),
                                  ("put", "tcp://peer:9", 50, 0, 50, 50_000)],
                            {"clients@h1": 1_010_000, "clients@h9": 999_999}),
        "tcp://b:2": _stats(6.0, [("put", "clients@h2", 500, 0, 80, 80_000)], {}),
        "tcp://c:3": _stats(7.0, [("put", "clients@h3", 10, 0, 10, 10_000)], {}),  # no call in the window
    }  # fmt: skip
    w = Workload.from_statistics(first, second, rpc="store:put", name="kv put", rpc_name="put", provider_id=1,
                                 window_seconds=10.0)  # fmt: skip
    (p,) = w.points
    # 1000 + 50 + 500 calls, 4 failed; peers h1, peer:9, h2 (3 client processes at least); servers a and b
    assert (p.servers, p.clients) == (2, 3)
    assert p.rate_per_client_ops_per_second == pytest.approx(1546 / 10 / 3)
    # requests: (60,000 + 50,000 + 80,000) bytes over 60 + 50 + 80 sampled calls = 1,000; responses 8; bulk of
    # the calling peers only: 1,000,000 over 1546 calls
    assert p.bytes_per_call == round(1000 + 8 + 1_000_000 / 1546)
    assert p.server_processes_per_core is None and not p.sample().oversubscribed
    stats = w.source["statistics"]
    assert stats["calls"] == 1550 and stats["errors"] == 4 and stats["servers"] == ["tcp://a:1", "tcp://b:2"]
    assert stats["peers"] == ["clients@h1", "clients@h2", "tcp://peer:9"]
    notes = " ".join(w.source["notes"])
    assert "client processes: 3, the distinct calling peers, a lower bound (clients@h1, clients@h2" in notes
    assert "servers: the 2 of 3 read that served store:put" in notes and "4 of 1550 calls failed" in notes
    assert "bulk bytes: 1,000,000 moved with the calling peers" in notes
    given = Workload.from_statistics(first, second, rpc="1:put", name="kv put", rpc_name="put", provider_id=1,
                                     window_seconds=10.0, clients=8)  # fmt: skip
    assert given.points[0].clients == 8 and "lower bound" not in " ".join(given.source["notes"])
    assert place(PLATFORM, w)["notes"][: len(w.source["notes"])] == w.source["notes"]  # placed with its notes


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"since": 99.0}, "tcp://a:1's statistics were reset during the window: read again"),
        ({"enabled": False}, "tcp://a:1 has monitoring off"),
        ({"calls": 100}, "no completed call of 1:put on 1 server(s) in the 2 s window: is the workload running?"),
        ({"first": {}}, "tcp://a:1 answered the second statistics read but not the first"),
        ({"window": 0.0}, "the window must be > 0 seconds"),
    ],
)
def test_statistics_that_cannot_give_a_workload(change: dict, expected: str) -> None:
    first = {"tcp://a:1": _stats(5.0, [("put", "clients@h", 100, 0, 64, 6400)], {})}
    after = _stats(change.get("since", 5.0), [("put", "clients@h", change.get("calls", 300), 0, 80, 8000)], {})
    after["rpcs"]["enabled"] = change.get("enabled", True)
    with pytest.raises(ValueError, match=re.escape(expected)):
        Workload.from_statistics(change.get("first", first), {"tcp://a:1": after}, rpc="1:put", name="kv put",
                                 rpc_name="put", provider_id=1, window_seconds=change.get("window", 2.0))  # fmt: skip
