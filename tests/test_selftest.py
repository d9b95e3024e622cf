"""The self-test against live server processes: sane, internally consistent figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import readme_quickstart

from selftest import SELFTEST_CONFIG
from selftest.collect import CollectOptions, collect, plan
from selftest.driver import SelftestError, SelftestParams, run_selftest
from svcframe.config import load_config
from svcframe.launch import Launch


@pytest.fixture(scope="module")
def servers():
    with Launch(load_config(SELFTEST_CONFIG), 2) as job:
        yield [m.address for m in job.members]


def _check_consistent(results: dict, params: SelftestParams, n_servers: int) -> None:
    agg = results["aggregate"]
    clients = results["clients"]
    assert len(clients) == params.clients
    assert [c["rank"] for c in clients] == list(range(params.clients))
    for c in clients:
        assert c["ops"] > 0
        assert c["rate_ops_per_second"] == pytest.approx(c["ops"] / c["elapsed_seconds"])
        assert c["elapsed_seconds"] >= params.duration_seconds * 0.99  # measured, not nominal
        lat = c["latency_usec"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
        assert lat["min"] <= lat["mean"] <= lat["max"]
    assert agg["ops"] == sum(c["ops"] for c in clients)
    assert agg["rate_ops_per_second"] == pytest.approx(sum(c["rate_ops_per_second"] for c in clients))
    assert agg["rate_per_client_ops_per_second"] == pytest.approx(agg["rate_ops_per_second"] / params.clients)
    assert agg["rate_per_server_ops_per_second"] == pytest.approx(agg["rate_ops_per_second"] / n_servers)
    assert sum(s["rate_ops_per_second"] for s in results["servers"]) == pytest.approx(agg["rate_ops_per_second"])
    assert agg["server_cpu_seconds"] > 0
    assert agg["server_cpu_usec_per_op"] == pytest.approx(agg["server_cpu_seconds"] / agg["ops"] * 1e6)
    assert 0 < agg["server_utilization"] <= 1.5
    assert results["parameters"] == params.model_dump(mode="json")
    assert results["server_config"]["providers"][0]["type"] == "selftest"
    for key in ("host", "cores", "python", "svcframe", "msgpack"):
        assert results["environment"][key]


def test_one_client_on_two_servers_counts_the_server_that_served(servers) -> None:
    """``selftest run --clients 1`` on 2 servers: the idle server is not counted in the rate per server, nor in
    the service ratio a placement reads (X = 1 server that served / 1 client, not 2)."""
    from selftest.roofline import Workload

    params = SelftestParams(clients=1, duration_seconds=0.3, warmup_iterations=5)
    results = run_selftest(params, servers)
    _check_consistent(results, params, 1)
    agg = results["aggregate"]
    assert [s["clients"] for s in results["servers"]] == [1, 0] and agg["servers_serving"] == 1
    assert agg["rate_per_server_ops_per_second"] == pytest.approx(agg["rate_ops_per_second"])
    assert agg["server_utilization"] == results["servers"][0]["utilization"]  # over the server that served
    (point,) = Workload.from_selftest_results(results).points
    assert (point.servers, point.clients, point.service_ratio) == (1, 1, 1.0)
    # each side's CPU: what it used, and (Linux keeps scheduler statistics) what it wanted, ran or waited for
    (client,) = results["clients"]
    assert 0 < client["utilization"] <= 1.05 and agg["client_utilization"] == client["utilization"]
    if results["servers"][0]["demand"] is not None:
        assert client["demand"] >= client["utilization"] * 0.9 and agg["server_demand"] > 0
        assert agg["client_runqueue_wait_seconds"] >= 0 and agg["server_runqueue_wait_seconds"] >= 0


def test_noop_two_clients_two_servers(servers) -> None:
    params = SelftestParams(clients=2, duration_seconds=0.5, warmup_iterations=5, timeline_interval_seconds=0.1)
    results = run_selftest(params, servers)
    _check_consistent(results, params, 2)
    assert [c["server"] for c in results["clients"]] == servers  # client i -> server i mod S
    for c in results["clients"]:
        assert sum(c["timeline"]) == c["ops"]
    assert results["aggregate"]["bandwidth_bytes_per_second"] == 0


@pytest.mark.parametrize("direction", ["pull", "push"])
def test_bulk(servers, direction: str) -> None:
    params = SelftestParams(
        workload="bulk", bulk_size=256 * 1024, bulk_direction=direction, clients=1, duration_seconds=0.4, depth=2
    )
    results = run_selftest(params, servers[:1])
    _check_consistent(results, params, 1)
    agg = results["aggregate"]
    assert agg["bandwidth_bytes_per_second"] == pytest.approx(agg["rate_ops_per_second"] * 256 * 1024)
    assert agg["bandwidth_gib_per_second"] == pytest.approx(agg["bandwidth_bytes_per_second"] / 2**30)


def test_unreachable_server_is_a_clear_error() -> None:
    params = SelftestParams(clients=1, duration_seconds=0.2, timeout_seconds=2.0)
    with pytest.raises(SelftestError, match="cannot connect"):
        run_selftest(params, ["tcp://127.0.0.1:1"])


def test_wrong_provider_id_is_a_clear_error(servers) -> None:
    params = SelftestParams(clients=1, duration_seconds=0.2, provider_id=9)
    with pytest.raises(SelftestError, match="no provider with id 9"):
        run_selftest(params, servers[:1])


def test_cli_selftest_run_with_params_file(servers, tmp_path) -> None:
    pfile = tmp_path / "params.json"
    pfile.write_text(json.dumps({"duration_seconds": 0.3, "req_buffer_size": 1000, "resp_buffer_size": 2000}))
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "svcframe", "selftest", "run", "-t", servers[0], "--params", str(pfile),
         "--clients", "1", "-o", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ops/s" in proc.stdout
    results = json.loads(out.read_text())
    assert results["parameters"]["req_buffer_size"] == 1000
    assert results["parameters"]["resp_buffer_size"] == 2000
    assert results["parameters"]["warmup_iterations"] == 10  # default filled in


def test_cli_rejects_bad_parameters(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "svcframe", "selftest", "run", "-t", "tcp://127.0.0.1:1", "--duration-seconds", "-1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "duration_seconds" in proc.stderr


@pytest.mark.one_interpreter  # (long, and about our logic: CI's first interpreter only)
def test_collect_small_suite_writes_plots_and_model(tmp_path) -> None:
    opts = CollectOptions(
        out=tmp_path / "rl", duration_seconds=0.3, repeats=1, warmup_iterations=5, bulk_size=64 * 1024,
        grid_servers=[1], grid_clients=[1, 2], saturation_depth=4,
    )  # fmt: skip
    steps: list[str] = []
    doc = collect(opts, lambda desc, i, n: steps.append(desc))
    assert len(steps) == len(doc["runs"]) <= len(plan(opts))  # ramp loads past the rate's plateau are skipped
    for metric in ("rpc_rate", "bandwidth"):
        png = (tmp_path / "rl" / f"{metric}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        model = doc["metrics"][metric]
        assert model["pc"]["min"] > 0 and model["ps"]["min"] > 0
        assert len(model["samples"]) == 2
        ridge = min(model["pc"]["max"] / model["ps"]["max"], 1.0)
        assert model["ridge"]["max"] == pytest.approx(ridge)
    saved = json.loads((tmp_path / "rl" / "roofline.json").read_text())
    assert saved["metrics"].keys() == {"rpc_rate", "bandwidth"}
    assert len(list((tmp_path / "rl" / "runs").glob("*.json"))) == len(doc["runs"])
    for metric in ("rpc_rate", "bandwidth"):  # Ps says how it was measured, and whether it is a lower bound
        saturation = saved["metrics"][metric]["ps_saturation"]
        assert saturation["ramp"] and isinstance(saturation["lower_bound"], bool) and saturation["reason"]
        assert saved["metrics"][metric]["pc_saturation"]["server_utilization"] is not None
    assert 0 < saved["measurement_seconds"] < saved["wall_seconds"]


def test_quickstart_custom_provider(tmp_path) -> None:
    code, config = readme_quickstart()
    (tmp_path / "counter.py").write_text(code)
    (tmp_path / "counter.json").write_text(config)
    cli = [sys.executable, "-m", "svcframe"]
    check = subprocess.run([*cli, "config", "check", "counter.json"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    launcher = subprocess.Popen(
        [*cli, "launch", "counter.json", "--procs", "1", "--group-file", "group.json"],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert "ready" in launcher.stderr.readline()
        address = json.loads((tmp_path / "group.json").read_text())["members"][0]["address"]
        for n, expected in (("5", "5"), ("2", "7")):
            out = subprocess.run([*cli, "call", address, "add", n, "-p", "1"], capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            assert out.stdout.strip() == expected
        shut = subprocess.run([*cli, "shutdown", "-g", "group.json"], cwd=tmp_path, capture_output=True, text=True)
        assert shut.returncode == 0, shut.stderr
        assert launcher.wait(timeout=30) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        launcher.stderr.close()


@pytest.mark.asyncio
async def test_calls_in_flight_at_once_each_reuse_a_buffer_of_their_own() -> None:
    """Quintain's poolset: 8 bulk pulls in flight at once take 8 server buffers, and the next 8 reuse them (a
    loaded server measured page faults when one buffer per size was kept and the others were made anew)."""
    import asyncio

    from svcframe.testing import ProviderFor

    size = 256 * 1024
    kit = ProviderFor("selftest", library="selftest.provider")
    async with kit as handle:
        assert kit.server is not None and kit.client is not None
        (provider,) = kit.server.providers.values()
        exposed = kit.client.expose(bytearray(size), "r")

        async def round_of(n: int) -> set[int]:
            await asyncio.gather(*(handle.call("work", [0, "pull", exposed.to_wire(), b""]) for _ in range(n)))
            return {id(buf) for buf in provider._buffers[size]}

        first = await round_of(8)
        assert len(first) == 8
        assert await round_of(8) == first  # the same buffers, none made anew
