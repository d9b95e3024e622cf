"""The workflow roofline of Ding et al. 2024 (selftest/roofline/workflow.py) on known inputs: the paper's
Perlmutter Fig. 1 ceilings and wall, its CosmoFlow and BerkeleyGW figures, the four zones of Fig. 2a, and
the ceilings of a workflow against a measured service."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from roofline_kit import platform_doc

from selftest.roofline import Platform
from selftest.roofline.workflow import (
    ZONE_GOOD_GOOD,
    ZONE_GOOD_POOR,
    ZONE_POOR_GOOD,
    ZONE_POOR_POOR,
    WorkflowRoofline,
    WorkflowSpec,
    analyse,
    from_platform,
    node_ceiling,
    parallelism_wall,
    system_ceiling,
)

GB, TB = 1e9, 1e12  # Ding et al. use decimal units


def perlmutter_fig1() -> WorkflowRoofline:
    """Ding section III-A, Fig. 1 (PM-GPU): 1 TB per task from the file system at 5.6 TB/s, 1 TB per node
    through the NICs at 100 GB/s per node (1792 nodes, 64 per task), 4 GB over PCIe at 100 GB/s and 100
    GFLOPs at 38.8 TFLOPS per node, wall floor(1792 / 64)."""
    return WorkflowRoofline(
        "Perlmutter Fig. 1",
        (
            node_ceiling("node: PCIe bytes", 4 * GB, 100 * GB),
            node_ceiling("node: FLOPs", 100e9, 9.7e12 * 4),
            system_ceiling("system: file system", 1 * TB, 5.6 * TB),
            system_ceiling("system: NICs", 64 * 1 * TB, 1792 * 100 * GB),
        ),
        wall=parallelism_wall(1792, 64),
    )


def test_perlmutter_fig1_ceilings_and_wall() -> None:
    rl = perlmutter_fig1()
    pcie, flops, fs, nic = rl.ceilings
    assert pcie.tasks_per_second == pytest.approx(25.0)  # 4 GB / 100 GB/s = 0.04 s per task
    assert pcie.seconds_per_task == pytest.approx(0.04)
    assert flops.tasks_per_second == pytest.approx(388.0)  # 100 GFLOP / 38.8 TFLOPS = 2.58 ms per task
    assert fs.tasks_per_second == pytest.approx(5.6)  # upper horizontal
    assert nic.tasks_per_second == pytest.approx(2.8)  # lower horizontal: 64 TB per task / 179.2 TB/s
    assert rl.wall == 28  # "the task parallelism boundary (vertical wall) is 28"
    # the roof: PCIe diagonal up to n = 2.8 / 25 = 0.112, then the NIC horizontal, up to the wall
    assert rl.attainable(0.1) == pytest.approx(2.5)
    assert rl.bound(0.1).name == "node: PCIe bytes"
    assert rl.attainable(28.0) == pytest.approx(2.8)
    assert rl.bound(28.0).name == "system: NICs" and rl.bound(28.0).kind == "system"
    np.testing.assert_allclose(rl.attainable(np.array([0.05, 1.0, 28.0])), [1.25, 2.8, 2.8])
    # at the wall, 28 tasks each through its 64 nodes' NICs is the whole machine's NIC bandwidth
    assert nic.tasks_per_second == pytest.approx(28 * 64 * 100 * GB / (64 * TB))


def test_cosmoflow_and_berkeleygw_figures() -> None:
    # Section IV-C3: PCIe 80 GB per node at 100 GB/s: a 0.8 s makespan ceiling; HBM 6.4 GB x 2^19 samples at
    # 1555 GB/s x 4 GPUs x 128 nodes: 4.2 s; 1536 GPU nodes / 128 per instance: 12 instances at most;
    # the file system ceiling 2 TB / 5.6 TB/s.
    assert node_ceiling("PCIe", 80 * GB, 100 * GB).seconds_per_task == pytest.approx(0.8)
    hbm = node_ceiling("HBM", 6.4 * GB * 2**19, 1555 * GB * 4 * 128)
    assert round(hbm.seconds_per_task, 1) == 4.2
    assert parallelism_wall(1536, 128) == 12
    assert system_ceiling("file system", 2 * TB, 5.6 * TB).seconds_per_task == pytest.approx(2 / 5.6)
    # Section IV-C2: BGW on 64 nodes, (1164 + 3226) PFLOPs / 64 nodes at 9.7 x 4 TFLOPS per node; its wall
    # moves from floor(1792 / 64) = 28 to floor(1792 / 1024) = 1 on 1024 nodes per task.
    bgw = node_ceiling("FLOPs", (1164e15 + 3226e15) / 64, 9.7e12 * 4)
    assert bgw.seconds_per_task == pytest.approx(1767.9, abs=0.1)
    assert (parallelism_wall(1792, 64), parallelism_wall(1792, 1024)) == (28, 1)
    # doubling the nodes per task halves the wall and doubles the node ceiling (Fig. 2c)
    assert node_ceiling("x", 1.0, 2.0).tasks_per_second == 2 * node_ceiling("x", 1.0, 1.0).tasks_per_second
    assert parallelism_wall(1792, 128) == parallelism_wall(1792, 64) // 2


def test_the_four_zones_of_fig_2a() -> None:
    # target: a task within 2 s (the diagonal TPS = n / 2), 3 tasks/s (the horizontal)
    rl = WorkflowRoofline("t", (node_ceiling("node", 1.0, 10.0),), wall=100, target_makespan_seconds=2.0,
                          target_throughput_tasks_per_second=3.0)  # fmt: skip
    assert rl.zone(4, 4.0) == ZONE_GOOD_GOOD  # a task in 1 s, 4 tasks/s
    assert rl.zone(1, 1.0) == ZONE_GOOD_POOR  # a task in 1 s, 1 task/s: increase parallelism (Fig. 2b)
    assert rl.zone(16, 4.0) == ZONE_POOR_GOOD  # a task in 4 s, 4 tasks/s
    assert rl.zone(16, 1.0) == ZONE_POOR_POOR
    assert rl.zone(6, 3.0) == ZONE_GOOD_GOOD  # on both lines counts as meeting them
    assert WorkflowRoofline("t", rl.ceilings, wall=1).zone(1, 1.0) is None  # no targets: no zone
    run = rl.place("run", parallel_tasks=16, tasks=64, makespan_seconds=16.0)
    assert run["tasks_per_second"] == 4.0 and run["task_makespan_seconds"] == 4.0
    assert run["zone"] == ZONE_POOR_GOOD and run["bound_kind"] == "node"
    assert run["attainable_tasks_per_second"] == 160.0 and run["headroom"] == 40.0
    assert run["score"] == pytest.approx(1 / (1 + math.log10(40)))
    assert not run["beyond_wall"] and rl.place("x", 101, 101, 1.0)["beyond_wall"]


def two_stage_spec(**kw: object) -> dict:
    doc = {
        "name": "write then read",
        "servers": 3,
        "parallel_tasks": 4,
        "target_makespan_seconds": 1.0,
        "target_throughput_tasks_per_second": 10.0,
        "stages": [
            {"name": "write", "tasks": 16, "rpcs_per_task": 1000, "bytes_per_task": 0},
            {"name": "read", "tasks": 16, "rpcs_per_task": 200, "bytes_per_task": 8 * 2**20},
        ],
        "runs": [{"label": "measured", "parallel_tasks": 4, "makespan_seconds": 8.0}],
    }
    return {**doc, **kw}


def test_ceilings_of_a_two_stage_workflow_against_a_measured_service() -> None:
    # RPC rate: Pc 20k, Ps 80k ops/s -> R(1) = 20k; bandwidth: Pc 2, Ps 1 GiB/s -> R(1) = 1 GiB/s.
    platform = Platform.from_document(platform_doc({"rpc_rate": (20_000.0, 80_000.0), "bandwidth": (2.0, 1.0)},
                                                   slots=(4, 8)))  # fmt: skip
    spec = WorkflowSpec.from_document(two_stage_spec())
    rl = from_platform(platform, spec)
    # per task, averaged over 32 tasks: 600 RPCs and 4 MiB
    node_rpc, sys_rpc, node_bw, sys_bw = rl.ceilings
    assert node_rpc.kind == "node" and node_rpc.tasks_per_second == pytest.approx(20_000 / 600)
    assert sys_rpc.kind == "system" and sys_rpc.tasks_per_second == pytest.approx(80_000 * 3 / 600)  # 400
    assert node_bw.tasks_per_second == pytest.approx(2**30 / (4 * 2**20))  # min(Pc, Ps) = 1 GiB/s: 256 tasks/s
    assert sys_bw.tasks_per_second == pytest.approx(3 * 2**30 / (4 * 2**20))  # 3 servers x 1 GiB/s: 768
    assert "x 3 servers" in sys_bw.name and "GiB/s" in sys_bw.name
    assert rl.wall == 8  # the platform's 8 client cores, one client process per task
    assert rl.attainable(4.0) == pytest.approx(4 * 20_000 / 600)  # the node RPC diagonal binds at n = 4
    assert rl.bound(4.0) == node_rpc
    assert rl.attainable(16.0) == pytest.approx(400.0)  # (past the wall) the system RPC horizontal
    assert rl.bound(16.0) == sys_rpc

    result = analyse(platform, spec)
    json.dumps(result, allow_nan=False)
    assert result["attainable_tasks_per_second"] == pytest.approx(400 / 3) and not result["beyond_wall"]
    write, read = result["stages"]
    assert write["attainable_tasks_per_second"] == pytest.approx(4 * 20_000 / 1000)  # 80 tasks/s
    assert write["makespan_lower_bound_seconds"] == pytest.approx(0.2)
    assert read["bound"].startswith("system: bandwidth")  # 8 MiB per task: 3 GiB/s / 8 MiB = 384 tasks/s
    assert read["makespan_lower_bound_seconds"] == pytest.approx(16 / 384)
    assert result["makespan_lower_bound_seconds"] == pytest.approx(0.2 + 16 / 384)
    (run,) = result["runs"]
    assert run["tasks"] == 32 and run["tasks_per_second"] == 4.0  # 32 tasks in 8 s
    assert run["task_makespan_seconds"] == 1.0  # meets the 1 s target, 4 tasks/s misses 10 (Fig. 2b)
    assert run["zone"] == ZONE_GOOD_POOR
    assert run["headroom"] == pytest.approx(100 / 3)
    # intra-task parallelism (Fig. 2c): 2 client processes per task double the node ceilings, halve the wall
    wider = from_platform(platform, WorkflowSpec.from_document(two_stage_spec(client_processes_per_task=2)))
    assert wider.ceilings[0].tasks_per_second == pytest.approx(2 * node_rpc.tasks_per_second)
    assert wider.wall == 4
    # the spec's available client processes override the platform's cores
    assert from_platform(platform, WorkflowSpec.from_document(two_stage_spec(available_client_processes=2))).wall == 2


def test_a_workflow_needs_the_metrics_and_cores_it_uses() -> None:
    spec = WorkflowSpec.from_document(two_stage_spec())
    rpc_only = Platform.from_document(platform_doc({"rpc_rate": (20_000.0, 80_000.0)}))
    with pytest.raises(ValueError, match="no 'bandwidth' roofline"):
        from_platform(rpc_only, spec)
    bare = Platform.from_document({"metrics": platform_doc({"rpc_rate": (1.0, 2.0), "bandwidth": (1, 1)})["metrics"]})
    with pytest.raises(ValueError, match="give available_client_processes"):
        from_platform(bare, spec)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"stages": []}, "wf.json: stages: List should have at least 1 item"),
        ({"servers": 0}, "wf.json: servers: Input should be greater than or equal to 1 (got 0)"),
        ({"stages": [{"name": "idle", "tasks": 1, "rpcs_per_task": 0, "bytes_per_task": 0}]},
         "wf.json: stages[0]: stage 'idle' makes no RPC and moves no byte"),
        ({"stages": [{"name": "a", "tasks": 1, "rpcs_per_task": 1, "bytes_per_task": 0}] * 2},
         "wf.json: (top level): stage names must be unique"),
        ({"runs": [{"parallel_tasks": 1, "makespan_seconds": 0}]},
         "wf.json: runs[0].makespan_seconds: Input should be greater than 0 (got 0)"),
        ({"target_makespan_seconds": "soon"}, "wf.json: target_makespan_seconds: Input should be a valid number"),
        ({"nodes": 4}, "wf.json: nodes: Extra inputs are not permitted (got 4)"),
    ],
)  # fmt: skip
def test_workflow_errors_name_the_file_and_the_json_path(change: dict, expected: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError) as err:
        WorkflowSpec.from_document(two_stage_spec(**change), "wf.json")
    assert str(err.value).startswith(expected), str(err.value)
    path = tmp_path / "wf.json"
    path.write_text("[")
    with pytest.raises(ValueError, match="cannot read a workflow"):
        WorkflowSpec.load(path)
    path.write_text(json.dumps(two_stage_spec()))
    assert WorkflowSpec.load(path).tasks == 32
