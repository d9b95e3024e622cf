"""The self-test's storage workload: real files on the server's disk, I/O off the event loop."""

from __future__ import annotations

import asyncio
import os

import pytest
from conftest import wait_until

from selftest.driver import SelftestError, SelftestParams, run_selftest
from svcframe.config import parse_config
from svcframe.engine import Engine
from svcframe.errors import RemoteError
from svcframe.launch import Launch
from svcframe.loops import run

FILE_BYTES = 64 * 1024 * 1024


def _config(storage_dir: str) -> dict:
    return {
        "libraries": ["selftest.provider"],
        "providers": [{"name": "st", "type": "selftest", "provider_id": 1,
                       "config": {"storage_dir": storage_dir, "storage_file_bytes": FILE_BYTES}}],
    }  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("disk")
    with Launch(parse_config(_config(str(directory))), 1) as job:
        yield job.members[0], directory


def _call(address: str, rpc: str, arg, timeout_seconds: float = 30.0):
    async def go():
        async with Engine(None) as engine:
            return await engine.call(address, rpc, arg, provider_id=1, timeout_seconds=timeout_seconds)

    return run(go())


def test_writes_and_reads_land_in_the_servers_file(server) -> None:
    member, directory = server
    assert _call(member.address, "storage", ["write", 4096, False]) == 4096
    path = directory / f"svcframe-selftest-{member.pid}-1.dat"
    assert path.stat().st_size == FILE_BYTES  # one file per provider, of the configured size
    assert _call(member.address, "storage", ["read", 65536, False]) == 65536
    assert _call(member.address, "storage", ["write", 1 << 20, True]) == 1 << 20  # with fdatasync


@pytest.mark.parametrize(
    ("arg", "message"),
    [(["erase", 4096, False], "expected 'write' or 'read'"), (["write", 0, False], "outside 1.."),
     (["read", FILE_BYTES * 2, False], "outside 1..")],
)  # fmt: skip
def test_bad_requests_are_refused(server, arg, message) -> None:
    with pytest.raises(RemoteError, match=message):
        _call(server[0].address, "storage", arg)


def test_io_runs_off_the_event_loop(server) -> None:
    """A noop call sent while a large synced write is in flight completes first: the loop kept serving."""
    address = server[0].address

    async def go() -> list[str]:
        order: list[str] = []
        async with Engine(None) as engine:
            await engine.call(address, "work", [0, None, None, b""], provider_id=1)  # connected

            async def big() -> None:
                await engine.call(address, "storage", ["write", FILE_BYTES, True], provider_id=1, timeout_seconds=60)
                order.append("storage")

            conn = await engine.connection(address)

            async def small() -> None:
                # the storage request is sent first (one connection: the server takes them in order)
                await wait_until(lambda: bool(conn.pending), what="the storage request to be sent")
                for _ in range(3):
                    await engine.call(address, "work", [0, None, None, b""], provider_id=1)
                order.append("noop")

            await asyncio.gather(big(), small())
        return order

    assert run(go()) == ["noop", "storage"]


def test_driver_storage_workload_rates(server) -> None:
    params = SelftestParams(workload="storage", storage_block_size=16384, clients=2, duration_seconds=0.3,
                            warmup_iterations=2)  # fmt: skip
    results = run_selftest(params, [server[0].address])
    agg = results["aggregate"]
    assert agg["ops"] > 0
    assert agg["bandwidth_bytes_per_second"] == pytest.approx(agg["rate_ops_per_second"] * 16384)
    assert results["parameters"]["storage_op"] == "write"


def test_file_is_removed_when_the_server_stops(tmp_path) -> None:
    with Launch(parse_config(_config(str(tmp_path))), 1) as job:
        _call(job.members[0].address, "storage", ["write", 4096, False])
        assert len(os.listdir(tmp_path)) == 1
    assert os.listdir(tmp_path) == []


def test_unwritable_storage_dir_is_a_clear_error(tmp_path) -> None:
    with Launch(parse_config(_config(str(tmp_path / "missing"))), 1) as job:
        params = SelftestParams(workload="storage", clients=1, duration_seconds=0.2, warmup_iterations=1)
        with pytest.raises(SelftestError, match="No such file or directory"):
            run_selftest(params, [job.members[0].address])
