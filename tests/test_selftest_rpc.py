"""Any RPC as a self-test workload (selftest/rpc_workload.py): the kv and blob providers in real
server processes driven by ``run_selftest`` and by ``svcframe selftest run --rpc`` in a pipe; the bytes per call
the clients measured; the service's own state proving every call ran with its own argument."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from selftest.driver import SelftestError, SelftestParams, run_selftest
from selftest.roofline import Workload
from selftest.rpc_workload import ArgContext, load_generator, parse_rpc_spec
from svcframe.config import parse_config
from svcframe.launch import Launch
from svcframe.units import quantity

ROOT = Path(__file__).resolve().parent.parent


def _call(address: str, rpc: str, arg: Any, provider_id: int) -> Any:
    from svcframe.engine import Engine
    from svcframe.loops import run

    async def go() -> Any:
        async with Engine(None) as engine:
            return await engine.call(address, rpc, arg, provider_id=provider_id)

    return run(go())


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``svcframe ARGS`` in a pipe, as in a batch job's log (no ``$COLUMNS``: a line of text stays one line)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run([sys.executable, "-m", "svcframe", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env=env)  # fmt: skip


def one_clear_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("svcframe: error: "), proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def kv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One server: a kv provider 'store' (id 1, fast durability) and a self-test provider (id 2); its address
    and a group file."""
    tmp = tmp_path_factory.mktemp("kv")
    cfg = parse_config({
        "libraries": ["providers.kv", "selftest.provider"],
        "providers": [
            {"name": "store", "type": "kv", "provider_id": 1,
             "config": {"path": str(tmp / "kv.sqlite"), "durability": "fast"}},
            {"name": "selftest", "type": "selftest", "provider_id": 2},
        ],
    })  # fmt: skip
    with Launch(cfg, 1, group_file=tmp / "group.json") as job:
        yield job.members[0].address, tmp / "group.json"


def test_kv_put_from_a_generator_unique_keys_and_bytes_per_call(kv: tuple[str, Path]) -> None:
    address, _ = kv
    before = _call(address, "count", None, 1)
    params = SelftestParams(workload="rpc", rpc="store:put", rpc_arg_generator="selftest.generators:kv_put",
                            rpc_arg_options={"value_bytes": 2048, "prefix": "gen"}, clients=2, depth=2,
                            duration_seconds=0.3, warmup_iterations=3, provider_id=2)  # fmt: skip
    results = run_selftest(params, [address])
    rpc = results["rpc"]
    assert {k: rpc[k] for k in ("provider_id", "name", "provider", "type", "requested")} == {
        "provider_id": 1, "name": "put", "provider": "store", "type": "kv", "requested": "store:put"}  # fmt: skip
    assert results["parameters"]["rpc"] == "1:put"  # resolved once, before the clients started
    # every call, warm-up included, wrote its own key: the store grew by exactly the calls made
    assert rpc["calls"] == results["aggregate"]["ops"] + 2 * 3
    assert _call(address, "count", None, 1) - before == rpc["calls"]
    assert _call(address, "length", {"key": "gen-1-0"}, 1) == 2048
    # the request is {"key": "gen-C-N", "value": <2048 bytes>} in msgpack; the reply None (one byte)
    key_bytes = len(msgpack.packb({"key": "gen-0-10", "value": bytes(2048)}))
    assert rpc["request_bytes_per_call"] == pytest.approx(key_bytes, abs=3)
    assert rpc["response_bytes_per_call"] == 1.0 and rpc["bulk_bytes_per_call"] == 0.0
    assert rpc["bytes_per_call"] == round(rpc["request_bytes_per_call"] + 1)
    assert 0 < rpc["sampled_calls"] <= rpc["calls"]
    agg = results["aggregate"]
    assert agg["bandwidth_bytes_per_second"] == pytest.approx(agg["rate_ops_per_second"] * rpc["bytes_per_call"])
    assert all(c["rpc_sizes"]["calls"] > 0 for c in results["clients"])
    # it converts to a roofline workload with its own bytes per call
    workload = Workload.from_selftest_results(results, label="2 clients")
    (point,) = workload.points
    assert workload.name == "kv put" and workload.rpc == "store:put"
    assert (point.servers, point.clients, point.bytes_per_call) == (1, 2, rpc["bytes_per_call"])
    assert point.rate_per_client_ops_per_second == pytest.approx(agg["rate_per_client_ops_per_second"])


def test_a_fixed_json_argument_by_provider_id(kv: tuple[str, Path]) -> None:
    address, _ = kv
    params = SelftestParams(workload="rpc", rpc="1:exists", rpc_arg={"key": "gen-0-0"}, clients=1,
                            duration_seconds=0.2, warmup_iterations=2, provider_id=2)  # fmt: skip
    results = run_selftest(params, [address])
    rpc = results["rpc"]
    assert (rpc["provider"], rpc["name"], rpc["requested"]) == ("store", "exists", "1:exists")
    assert rpc["request_bytes_per_call"] == len(msgpack.packb({"key": "gen-0-0"}))
    assert rpc["response_bytes_per_call"] == 1.0  # True
    assert results["aggregate"]["ops"] > 0


def test_unknown_targets_fail_before_any_client_starts(kv: tuple[str, Path]) -> None:
    address, _ = kv
    for spec, expected in (
        ("store:putt", f"provider 'store' (1) at {address} has no RPC 'putt' (it has: count, erase, exists, get,"),
        ("nope:put", f"{address} has no provider 'nope' (it has: store (1), selftest (2))"),
        ("9:put", f"{address} has no provider 9"),
    ):
        with pytest.raises(SelftestError, match=r"^--rpc ") as err:
            run_selftest(SelftestParams(workload="rpc", rpc=spec, provider_id=2, duration_seconds=0.1), [address])
        assert expected in str(err.value)
    with pytest.raises(ValueError, match="expected PROVIDER_ID:NAME"):
        parse_rpc_spec("put")
    with pytest.raises(ValueError, match="needs rpc"):
        SelftestParams(workload="rpc")
    with pytest.raises(ValueError, match="not both"):
        SelftestParams(workload="rpc", rpc="1:put", rpc_arg=1, rpc_arg_generator="a:b")


def test_generators_are_loaded_by_module_or_file_and_fail_in_one_line(tmp_path: Path) -> None:
    assert load_generator("selftest.generators:kv_put").__name__ == "kv_put"
    (tmp_path / "gen.py").write_text("def make(ctx, call):\n    return [ctx.client, call, ctx.options['x']]\n")
    make = load_generator(f"{tmp_path / 'gen.py'}:make")
    assert make(ArgContext(client=3, clients=4, options={"x": 5}), 7) == [3, 7, 5]
    ctx = ArgContext(client=0, clients=1, options={})
    assert ctx.payload(16) is ctx.payload(16) and len(ctx.payload(16)) == 16
    for spec, expected in (("nope", "expected module:function"),
                           ("no_such_module_xyz:f", "cannot import no_such_module_xyz: ModuleNotFoundError"),
                           ("selftest.generators:nope", "has no function 'nope'"),
                           (f"{tmp_path / 'missing.py'}:f", "cannot import")):  # fmt: skip
        with pytest.raises(ValueError, match=expected):
            load_generator(spec)


def test_blob_put_moves_its_bytes_by_bulk(tmp_path: Path) -> None:
    cfg = parse_config({
        "libraries": ["providers.kv", "providers.blob", "selftest.provider"],
        "providers": [
            {"name": "blob_index", "type": "kv", "provider_id": 1, "config": {"path": ":memory:"}},
            {"name": "blobs", "type": "blob", "provider_id": 2, "config": {"path": str(tmp_path / "blobs"),
             "fsync": False}, "dependencies": {"index": "blob_index@local"}},
            {"name": "selftest", "type": "selftest", "provider_id": 3},
        ],
    })  # fmt: skip
    with Launch(cfg, 1) as job:
        address = job.members[0].address
        params = SelftestParams(workload="rpc", rpc="blobs:put", rpc_arg_generator="selftest.generators:blob_put",
                                rpc_arg_options={"size_bytes": 65536}, clients=1, duration_seconds=0.3,
                                warmup_iterations=2, provider_id=3)  # fmt: skip
        results = run_selftest(params, [address])
        names = _call(address, "list", {"max": 100000}, 2)
        stat = _call(address, "stat", {"name": "selftest-0-0"}, 2)
    rpc = results["rpc"]
    assert rpc["bulk_bytes_per_call"] == 65536.0  # the server pulled exactly the blob, every call
    assert rpc["bytes_per_call"] > 65536
    assert len(names) == rpc["calls"] and stat["size"] == 65536
    assert len(list((tmp_path / "blobs").iterdir())) == rpc["calls"]


def test_cli_rpc_run_with_a_generator_in_the_current_directory(kv: tuple[str, Path], tmp_path: Path) -> None:
    address, group = kv
    (tmp_path / "mygen.py").write_text(
        "def counter(ctx, call):\n    return {'key': f\"mine-{ctx.client}-{call}\", 'value': ctx.payload(ctx.options['n'])}\n"
    )
    before = _call(address, "count", None, 1)
    out = tmp_path / "r.json"
    proc = cli("selftest", "run", "-g", str(group), "--rpc", "store:put", "--arg-generator", "mygen:counter",
               "--arg-option", "n=100", "-c", "1", "--duration-seconds", "0.2", "--warmup-iterations", "2",
               "-o", str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert _call(address, "count", None, 1) - before == results["rpc"]["calls"]
    assert _call(address, "length", {"key": "mine-0-1"}, 1) == 100
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("store:put")]  # one line in a pipe
    rpc = results["rpc"]  # the bytes per call in one notation: 1.03 KiB/call = request 1.03 KiB + response 1 B ...
    assert line == (f"store:put (kv put, provider 1): {quantity(rpc['bytes_per_call'], 'B')}/call = request "
                    f"{quantity(rpc['request_bytes_per_call'], 'B')} + response "
                    f"{quantity(rpc['response_bytes_per_call'], 'B')} + bulk {quantity(rpc['bulk_bytes_per_call'], 'B')}")  # fmt: skip
    # progress in a pipe: one line on stderr as the timed loop starts (clients warmed up), one when done
    assert re.fullmatch(r"selftest run: \[1/1\] rpc: 1 client\(s\) x depth 1 on 1 server\(s\) for 200 ms, "
                        r"elapsed \d:\d\d:\d\d, ETA (\d:\d\d:\d\d|-)", proc.stderr.splitlines()[0]), proc.stderr  # fmt: skip


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--rpc", "store:nope"], "svcframe: error: --rpc store:nope: provider 'store' (1) at "),
        (["--rpc", "put"], "svcframe: error: --rpc 'put': expected PROVIDER_ID:NAME (1:put) or PROVIDER_NAME:NAME"),
        (["--rpc", "1:put", "--arg-generator", "nosuch_mod:f"], "svcframe: error: --arg-generator nosuch_mod:f: "
         "cannot import nosuch_mod: ModuleNotFoundError"),
        (["--rpc", "1:put", "--arg", "{bad"], "svcframe: error: cannot read --arg ('{bad'): Expecting property"),
        (["--rpc", "1:put", "--arg-option", "novalue"], "svcframe: error: --arg-option 'novalue': expected KEY=VALUE"),
        (["--rpc", "1:put", "--arg", '{"key": "k", "value": 5}'],
         "svcframe: error: clients did not finish warm-up: client 0 failed: remote TypeError: 'value' must be bytes "
         "or str, not int"),
        (["--workload", "noop", "--rpc", "1:put"], "svcframe: error: selftest parameters: (top level): the rpc "
         "workload needs rpc"),
    ],
)  # fmt: skip
def test_cli_rpc_errors_are_one_line(kv: tuple[str, Path], args: list[str], expected: str) -> None:
    _, group = kv
    proc = cli("selftest", "run", "-g", str(group), "-c", "1", "--duration-seconds", "0.1", *args)
    assert one_clear_line(proc).startswith(expected)


def test_arg_from_a_file(kv: tuple[str, Path], tmp_path: Path) -> None:
    _, group = kv
    (tmp_path / "arg.json").write_text(json.dumps({"key": "gen-0-0"}))
    proc = cli("selftest", "run", "-g", str(group), "--rpc", "store:length", "--arg", f"@{tmp_path / 'arg.json'}",
               "-c", "1", "--duration-seconds", "0.1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert results["rpc"]["name"] == "length" and results["parameters"]["rpc_arg"] == {"key": "gen-0-0"}
    assert os.path.exists(tmp_path / "arg.json")
