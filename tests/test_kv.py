"""Tests of the SQLite key-value provider (providers/kv.py): real engines on real sockets, real files."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import wait_until

from providers.kv import BufferTooSmall, KVClient, KVProvider, ValueTooLarge
from svcframe.engine import Engine
from svcframe.errors import AppError, BulkError, BulkUsageError, ConfigError, RemoteError
from svcframe.provider import PROVIDER_TYPES, ProviderHandle

PID = 3
MiB = 1024 * 1024


@pytest_asyncio.fixture
async def server() -> AsyncIterator[Engine]:
    engine = await Engine("tcp://127.0.0.1:0").start()
    try:
        yield engine
    finally:
        await engine.close()


@pytest_asyncio.fixture
async def client_engine() -> AsyncIterator[Engine]:
    engine = await Engine(None).start()
    try:
        yield engine
    finally:
        await engine.close()


async def start_kv(engine: Engine, config: dict[str, Any], provider_id: int = PID) -> KVProvider:
    provider = KVProvider(engine, provider_id, config=config)
    provider.register()
    await provider.start()
    return provider


async def stop_kv(engine: Engine, provider: KVProvider) -> None:
    engine.deregister_provider(provider.provider_id)
    await provider.close()


@pytest_asyncio.fixture
async def provider(server: Engine, tmp_path: Path) -> AsyncIterator[KVProvider]:
    p = await start_kv(server, {"path": str(tmp_path / "kv.sqlite")})
    try:
        yield p
    finally:
        await stop_kv(server, p)


@pytest.fixture
def kv(provider: KVProvider, client_engine: Engine, server: Engine) -> KVClient:
    assert server.address is not None
    return KVClient(client_engine, server.address, PID)


@pytest.fixture
def raw(provider: KVProvider, client_engine: Engine, server: Engine) -> ProviderHandle:
    assert server.address is not None
    return ProviderHandle(client_engine, server.address, PID)


def sha(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


def origin_count(engine: Engine, rpc: str) -> int:
    rows = [r for r in engine.statistics()["rpcs"]["origin"] if r["rpc"] == rpc and r["provider_id"] == PID]
    return sum(r["total_usec"]["count"] for r in rows)


def bulk_bytes(engine: Engine, direction: str) -> int:
    rows = engine.statistics()["rpcs"]["bulk"]
    return sum(r["bytes"]["sum"] for r in rows if r["direction"] == direction)


# --- registration and config -------------------------------------------------------------------------------


def test_registered_as_kv_type() -> None:
    assert PROVIDER_TYPES["kv"] is KVProvider


@pytest.mark.asyncio
async def test_default_config_is_filled_in(server: Engine) -> None:
    p = KVProvider(server, 7)
    assert p.get_config() == {
        "path": "kv-7.sqlite",
        "durability": "durable",
        "inline_max_bytes": 64 * 1024,
        "max_value_bytes": 256 * 1024 * 1024,
    }


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"paht": "x.sqlite"}, r"config: paht: Extra inputs are not permitted"),
        ({"path": ""}, "path: String should have at least 1 character"),
        ({"path": 3}, "path: Input should be a valid string"),
        ({"durability": "sometimes"}, r"durability: Input should be 'durable' or 'fast'"),
        ({"inline_max_bytes": -1}, "inline_max_bytes: Input should be greater than or equal to 0"),
        ({"inline_max_bytes": "64k"}, "inline_max_bytes: Input should be a valid integer"),
        ({"inline_max_bytes": True}, "inline_max_bytes: Input should be a valid integer"),
        ({"inline_max_bytes": 64 * MiB}, "max_body_bytes"),
    ],
)
async def test_bad_config_is_rejected(server: Engine, config: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        KVProvider(server, 1, config=config)


@pytest.mark.asyncio
async def test_unopenable_database_is_a_config_error(server: Engine, tmp_path: Path) -> None:
    p = KVProvider(server, 1, config={"path": str(tmp_path / "no-such-dir" / "kv.sqlite")})
    with pytest.raises(ConfigError, match="cannot open SQLite database"):
        await p.start()
    await p.close()  # nothing to close: must not fail


# --- basic operations -------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_put_get_small_roundtrip(kv: KVClient, client_engine: Engine) -> None:
    await kv.put("hello", b"world")
    await kv.put(b"\x00bin\xff", bytes(range(256)))
    await kv.put("empty", b"")
    assert await kv.get("hello") == b"world"
    assert await kv.get(b"hello") == b"world"  # str keys are stored as UTF-8
    await kv.handle.call("put", {"key": "text", "value": "é, text"})  # as svcframe call sends a JSON str
    assert await kv.get("text") == "é, text".encode()  # a str value too
    assert await kv.get(b"\x00bin\xff") == bytes(range(256))
    assert await kv.get("empty") == b""
    assert await kv.length("hello") == 5
    await kv.put("hello", bytearray(b"again"))  # overwrite
    assert await kv.get("hello") == b"again"
    assert origin_count(client_engine, "put_bulk") == 0
    assert origin_count(client_engine, "get_bulk") == 0


@pytest.mark.asyncio
async def test_value_at_the_inline_limit_stays_inline(kv: KVClient, client_engine: Engine) -> None:
    limit = await kv.inline_max_bytes()
    assert limit == 64 * 1024
    await kv.put("edge", b"e" * limit)
    assert await kv.get("edge") == b"e" * limit
    assert origin_count(client_engine, "put_bulk") == 0
    await kv.put("over", b"o" * (limit + 1))
    assert await kv.get("over") == b"o" * (limit + 1)
    assert origin_count(client_engine, "put_bulk") == 1
    assert origin_count(client_engine, "get_bulk") == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [1 * MiB, 8 * MiB])
async def test_put_get_large_uses_bulk(kv: KVClient, client_engine: Engine, server: Engine, size: int) -> None:
    value = os.urandom(size)
    await kv.put("big", value)
    assert origin_count(client_engine, "put_bulk") == 1
    assert origin_count(client_engine, "put") == 0
    assert bulk_bytes(server, "pull") == size  # the server pulled the bytes
    assert await kv.length("big") == size
    got = await kv.get("big")
    assert got is not None
    assert len(got) == size
    assert sha(got) == sha(value)
    assert origin_count(client_engine, "get_bulk") == 1
    assert bulk_bytes(server, "push") == size  # the server pushed the bytes
    assert client_engine.statistics()["exposed_bulk_buffers"] == 0  # always unexposed


@pytest.mark.asyncio
async def test_erase_exists_count(kv: KVClient) -> None:
    assert await kv.count() == 0
    for i in range(5):
        await kv.put(f"k{i}", b"v")
    assert await kv.count() == 5
    assert await kv.exists("k3")
    assert await kv.erase("k3") is True
    assert not await kv.exists("k3")
    assert await kv.erase("k3") is False
    assert await kv.count() == 4
    assert await kv.get("k3") is None


@pytest.mark.asyncio
async def test_list_keys_prefix_max_and_paging(kv: KVClient) -> None:
    for key in ["user:2", "user:1", "users", "usa", "item:1", "user:10"]:
        await kv.put(key, b"x")
    await kv.put(b"\xff\xff", b"x")
    await kv.put(b"\xff\xff\x01", b"x")
    await kv.put(b"\xfe", b"x")
    assert await kv.list_keys(prefix="user:") == [b"user:1", b"user:10", b"user:2"]
    assert await kv.list_keys(prefix="user") == [b"user:1", b"user:10", b"user:2", b"users"]
    assert await kv.list_keys(prefix="nope") == []
    assert await kv.list_keys(prefix=b"\xff\xff") == [b"\xff\xff", b"\xff\xff\x01"]  # no upper bound
    everything = await kv.list_keys()
    assert everything == sorted(everything)
    assert len(everything) == 9
    assert await kv.list_keys(prefix="user", max_keys=2) == [b"user:1", b"user:10"]
    assert await kv.list_keys(prefix="user", max_keys=2, start_after=b"user:10") == [b"user:2", b"users"]
    assert await kv.list_keys(max_keys=0) == []


@pytest.mark.asyncio
async def test_list_keys_default_max_is_1000(kv: KVClient, raw: ProviderHandle) -> None:
    await asyncio.gather(*(kv.put(f"{i:05d}", b"") for i in range(1005)))
    assert await kv.count() == 1005
    first = await raw.call("list_keys")
    assert len(first) == 1000
    rest = await raw.call("list_keys", {"start_after": first[-1]})
    assert rest == [f"{i:05d}".encode() for i in range(1000, 1005)]


@pytest.mark.asyncio
async def test_missing_key(kv: KVClient, raw: ProviderHandle) -> None:
    assert await kv.get("missing") is None
    assert await kv.length("missing") is None
    assert not await kv.exists("missing")
    assert await raw.call("get", {"key": "missing"}) is None
    buf = bytearray(b"untouched")
    handle = raw.engine.expose(buf, "w")
    try:
        assert await raw.call("get_bulk", {"key": "missing", "bulk": handle.to_wire()}) is None
    finally:
        raw.engine.unexpose(handle)
    assert buf == b"untouched"


# --- size limits and errors -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_oversize_inline_put_is_refused(raw: ProviderHandle, kv: KVClient) -> None:
    with pytest.raises(AppError, match=r"65537 bytes.*inline_max_bytes \(65536\).*put_bulk") as info:
        await raw.call("put", {"key": "k", "value": b"x" * (64 * 1024 + 1)})
    assert info.value.code == ValueTooLarge.code and not isinstance(info.value, RemoteError)
    assert not await kv.exists("k")


@pytest.mark.asyncio
async def test_inline_get_of_large_value_is_refused(raw: ProviderHandle, kv: KVClient) -> None:
    await kv.put("big", b"x" * (100 * 1024))
    with pytest.raises(AppError, match=r"102400 bytes.*get_bulk") as info:
        await raw.call("get", {"key": "big"})
    assert info.value.code == ValueTooLarge.code and not isinstance(info.value, RemoteError)


@pytest.mark.asyncio
async def test_get_bulk_into_too_small_buffer(raw: ProviderHandle, kv: KVClient) -> None:
    await kv.put("big", b"y" * 200_000)
    buf = bytearray(1000)
    handle = raw.engine.expose(buf, "w")
    try:
        with pytest.raises(AppError, match=r"200000 bytes.*only 1000 bytes.*at least 200000 bytes") as info:
            await raw.call("get_bulk", {"key": "big", "bulk": handle.to_wire()})
    finally:
        raw.engine.unexpose(handle)
    assert info.value.code == BufferTooSmall.code
    assert buf == bytearray(1000)  # nothing was written


@pytest.mark.asyncio
async def test_get_bulk_into_larger_buffer_returns_length(raw: ProviderHandle, kv: KVClient) -> None:
    await kv.put("v", b"abc")
    buf = bytearray(b"-" * 8)
    handle = raw.engine.expose(buf, "w")
    try:
        assert await raw.call("get_bulk", {"key": "v", "bulk": handle.to_wire()}) == 3
    finally:
        raw.engine.unexpose(handle)
    assert buf == b"abc-----"


@pytest.mark.asyncio
async def test_put_bulk_stores_only_size_bytes_and_checks_it(raw: ProviderHandle, kv: KVClient) -> None:
    data = b"0123456789"
    handle = raw.engine.expose(data, "r")
    try:
        await raw.call("put_bulk", {"key": "part", "bulk": handle.to_wire(), "size": 4})
        with pytest.raises(RemoteError, match="only 10 bytes"):
            await raw.call("put_bulk", {"key": "bad", "bulk": handle.to_wire(), "size": 11})
    finally:
        raw.engine.unexpose(handle)
    assert await kv.get("part") == b"0123"
    assert not await kv.exists("bad")


@pytest.mark.asyncio
async def test_get_bulk_into_read_only_handle_fails(raw: ProviderHandle, kv: KVClient) -> None:
    await kv.put("v", b"abc")
    handle = raw.engine.expose(bytearray(8), "r")
    try:
        with pytest.raises(RemoteError, match="cannot be pushed") as info:
            await raw.call("get_bulk", {"key": "v", "bulk": handle.to_wire()})
    finally:
        raw.engine.unexpose(handle)
    assert info.value.remote_type == BulkUsageError.__name__


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("rpc", "arg", "error", "match"),
    [
        ("put", {"key": 5, "value": b"x"}, RemoteError, "'key' must be str or bytes, not int"),
        ("put", {"key": "k", "value": 5}, RemoteError, "'value' must be bytes or str, not int"),
        ("put", {"value": b"x"}, RemoteError, "no 'key' field"),
        ("get", "k", RemoteError, "must be a dict"),
        ("put_bulk", {"key": "k", "bulk": [1, 2]}, BulkError, "not a bulk handle"),
        ("list_keys", {"max": -1}, RemoteError, "'max' must be an integer >= 0"),
        ("list_keys", {"prefix": 1}, RemoteError, "'prefix' must be str or bytes"),
    ],
)
async def test_malformed_arguments_get_clear_errors(
    raw: ProviderHandle, rpc: str, arg: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        await raw.call(rpc, arg)


@pytest.mark.asyncio
async def test_concurrent_puts_of_mixed_sizes(kv: KVClient) -> None:
    values = {f"k{i}": os.urandom(i * 37_000) for i in range(12)}  # 0 .. ~400 KB, both paths
    await asyncio.gather(*(kv.put(k, v) for k, v in values.items()))
    got = await asyncio.gather(*(kv.get(k) for k in values))
    assert [sha(g or b"") for g in got] == [sha(v) for v in values.values()]
    assert await kv.count() == len(values)


# --- threading: SQLite never blocks the event loop --------------------------------------------------------


@pytest.mark.asyncio
async def test_database_work_does_not_block_the_event_loop(
    server: Engine, client_engine: Engine, tmp_path: Path
) -> None:
    path = tmp_path / "locked.sqlite"
    provider = await start_kv(server, {"path": str(path)})
    server.register(99, "echo", lambda req, arg: arg)
    assert server.address is not None
    kv = KVClient(client_engine, server.address, PID)
    await kv.put("warm", b"up")
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # hold the write lock: the provider's put waits in its thread
        put = asyncio.create_task(kv.put("k", b"v"))
        await wait_until(lambda: server.statistics()["handlers_running"] >= 1, what="the put's handler to run")
        assert not put.done()  # its database work waits for the lock, in the provider's thread
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await client_engine.call(server.address, "echo", "ping", provider_id=99, timeout_seconds=2) == "ping"
        assert loop.time() - t0 < 1.0  # the server's event loop kept serving
        blocker.execute("COMMIT")
        await asyncio.wait_for(put, 5)
    finally:
        blocker.close()
        await stop_kv(server, provider)
        server.deregister_provider(99)


@pytest.mark.asyncio
async def test_database_runs_in_one_dedicated_thread(server: Engine, tmp_path: Path) -> None:
    provider = await start_kv(server, {"path": str(tmp_path / "t.sqlite")})
    try:
        seen: set[int] = set()
        for _ in range(5):
            seen.add(await provider._run(lambda store: threading.get_ident()))
        assert len(seen) == 1
        assert threading.get_ident() not in seen
    finally:
        await stop_kv(server, provider)
    with pytest.raises(RuntimeError, match="not started"):
        await provider._run(lambda store: None)


# --- durability -------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_durable_put_is_visible_to_a_separate_connection(
    server: Engine, client_engine: Engine, tmp_path: Path
) -> None:
    path = tmp_path / "durable.sqlite"
    provider = await start_kv(server, {"path": str(path), "durability": "durable"})
    try:
        assert server.address is not None
        kv = KVClient(client_engine, server.address, PID)
        big = os.urandom(2 * MiB)
        await kv.put("small", b"committed")
        await kv.put("big", big)
        with contextlib.closing(sqlite3.connect(path)) as other:
            rows = dict(other.execute("SELECT key, value FROM kv").fetchall())
        assert rows[b"small"] == b"committed"
        assert sha(rows[b"big"]) == sha(big)
    finally:
        await stop_kv(server, provider)


@pytest.mark.asyncio
@pytest.mark.parametrize("durability", ["durable", "fast"])
async def test_reopen_reads_everything_back(
    server: Engine, client_engine: Engine, tmp_path: Path, durability: str
) -> None:
    path = str(tmp_path / f"reopen-{durability}.sqlite")
    values = {f"key-{i}": os.urandom(size) for i, size in enumerate([0, 10, 64 * 1024, 70_000, 3 * MiB])}
    assert server.address is not None
    provider = await start_kv(server, {"path": path, "durability": durability})
    kv = KVClient(client_engine, server.address, PID)
    await asyncio.gather(*(kv.put(k, v) for k, v in values.items()))
    await kv.erase("key-1")
    del values["key-1"]
    await stop_kv(server, provider)

    provider = await start_kv(server, {"path": path, "durability": durability})
    try:
        kv = KVClient(client_engine, server.address, PID)
        assert await kv.count() == len(values)
        assert await kv.list_keys() == sorted(k.encode() for k in values)
        for k, v in values.items():
            got = await kv.get(k)
            assert got is not None
            assert sha(got) == sha(v), k
    finally:
        await stop_kv(server, provider)


@pytest.mark.asyncio
@pytest.mark.parametrize(("durability", "synchronous"), [("durable", 2), ("fast", 1)])
async def test_sqlite_settings_follow_durability(
    server: Engine, client_engine: Engine, tmp_path: Path, durability: str, synchronous: int
) -> None:
    provider = await start_kv(server, {"path": str(tmp_path / "s.sqlite"), "durability": durability})
    try:
        assert server.address is not None
        stats = await KVClient(client_engine, server.address, PID).stats()
        assert stats["synchronous"] == synchronous  # 1 = NORMAL, 2 = FULL
        assert stats["journal_mode"] == "wal"
        assert stats["durability"] == durability
        assert stats["inline_max_bytes"] == 64 * 1024
    finally:
        await stop_kv(server, provider)


@pytest.mark.asyncio
async def test_memory_database_and_custom_inline_limit(server: Engine, client_engine: Engine) -> None:
    provider = await start_kv(server, {"path": ":memory:", "inline_max_bytes": 0})
    try:
        assert server.address is not None
        kv = KVClient(client_engine, server.address, PID)
        await kv.put("a", b"1")  # inline_max_bytes 0: every non-empty value goes by bulk
        await kv.put("e", b"")
        assert await kv.get("a") == b"1"
        assert await kv.get("e") == b""
        assert origin_count(client_engine, "put_bulk") == 1
        assert origin_count(client_engine, "get_bulk") == 1
    finally:
        await stop_kv(server, provider)


@pytest.mark.asyncio
async def test_client_with_a_wrong_inline_limit_falls_back_to_bulk(
    kv: KVClient, client_engine: Engine, server: Engine
) -> None:
    assert server.address is not None
    optimist = KVClient(client_engine, server.address, PID, inline_max_bytes=4 * MiB)  # provider: 64 KiB
    value = os.urandom(100_000)
    await optimist.put("v", value)
    assert origin_count(client_engine, "put") == 1  # refused ...
    assert origin_count(client_engine, "put_bulk") == 1  # ... then sent by bulk
    got = await optimist.get("v")
    assert got is not None
    assert sha(got) == sha(value)
    assert origin_count(client_engine, "get_bulk") == 1
    pessimist = KVClient(client_engine, server.address, PID, inline_max_bytes=0)
    await pessimist.put("w", b"tiny")
    assert await pessimist.get("w") == b"tiny"
    assert origin_count(client_engine, "put_bulk") == 2
    assert origin_count(client_engine, "get_bulk") == 2
    assert await kv.get("w") == b"tiny"
