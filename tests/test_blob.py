"""The composition example: a blob store whose index lives in a kv provider of another server process,
its data moving by bulk transfer; built from the shipped configs (configs/blob-index.json,
configs/blob-store.json, configs/blob.json)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import poll_until

from providers.blob import BlobClient
from providers.kv import KVClient
from svcframe.admin import ServiceHandle
from svcframe.composition import parse_dependency
from svcframe.config import ServiceConfig, load_config
from svcframe.engine import Engine
from svcframe.errors import AppError, RemoteError
from svcframe.launch import Launch
from svcframe.loops import run

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
WAIT_SECONDS = 10.0


def client_engine(**options: Any) -> Engine:
    """A client-only engine with the suite's shared secret (``SVCFRAME_SECRET``, set in conftest), if any."""
    secret = os.environ.get("SVCFRAME_SECRET")
    return Engine(None, secret=secret.encode() if secret else None, **options)


def _sha(data: Any) -> str:
    return hashlib.sha256(memoryview(data).cast("B")).hexdigest()


def test_shipped_two_process_configs_point_at_each_other() -> None:
    index, store = load_config(CONFIGS / "blob-index.json"), load_config(CONFIGS / "blob-store.json")
    (kv,) = index.providers
    (blob,) = store.providers
    assert (kv.type, blob.type) == ("kv", "blob")
    name, _, _, location = parse_dependency(blob.dependencies["index"])
    assert (name, location) == (kv.name, index.engine.address)
    local = load_config(CONFIGS / "blob.json")
    assert parse_dependency(local.providers[1].dependencies["index"]) == (local.providers[0].name, None, None, None)


@pytest.fixture(scope="module")
def service() -> Iterator[dict[str, Any]]:
    """The two shipped configs, moved to a scratch directory: the kv server on a unix socket there, the blob
    server on an ephemeral TCP port depending on it remotely. The blob server is started FIRST: it must wait
    for its remote dependency (bounded) and become ready only once the kv server is up."""
    work = Path(tempfile.mkdtemp(prefix="sfblob", dir="/tmp"))
    index_address = f"unix://{work}/index.sock"
    index_cfg = load_config(CONFIGS / "blob-index.json")
    index_cfg.engine.address = index_address
    index_cfg.providers[0].config["path"] = str(work / "index.sqlite")
    store_cfg = load_config(CONFIGS / "blob-store.json")
    store_cfg.admin.dependency_resolution_timeout_seconds = WAIT_SECONDS
    store_cfg.providers[0].config["path"] = str(work / "data")
    store_cfg.providers[0].dependencies["index"] = (
        store_cfg.providers[0]
        .dependencies["index"]
        .replace(load_config(CONFIGS / "blob-index.json").engine.address, index_address)
    )
    assert store_cfg.providers[0].dependencies["index"] == f"blob_index@{index_address}"

    store_job = Launch(store_cfg, 1)
    outcome: dict[str, Any] = {}
    ready, release = threading.Event(), threading.Event()

    def start_store() -> None:
        try:
            outcome["members"] = store_job.start()
        except BaseException as exc:
            outcome["error"] = exc
        ready.set()
        # Launch asks the kernel to SIGTERM its servers when their parent *thread* ends (PR_SET_PDEATHSIG):
        # this thread lives until the server is stopped.
        release.wait(120)

    starter = threading.Thread(target=start_store)
    starter.start()
    index_job = Launch(index_cfg, 1)
    try:
        waiting = f"providers[0].dependencies.index: 'blob_index@{index_address}': not available yet"

        def waits_for_its_index() -> bool:  # the blob server is up and says it waits for its index
            assert not ready.is_set(), f"the blob server did not wait for its index: {outcome}"
            return waiting in store_job.log_tail(0)

        poll_until(waits_for_its_index, WAIT_SECONDS, "the blob server to report waiting for its index")
        index_job.start()
        assert ready.wait(WAIT_SECONDS + 5), "the blob server never became ready"
        if "error" in outcome:
            raise outcome["error"]
        yield {
            "work": work,
            "index": index_job.members[0].address,
            "store": store_job.members[0].address,
            "blob_id": store_cfg.providers[0].provider_id,
            "kv_id": index_cfg.providers[0].provider_id,
            "prefix": "blobs/",
        }
    finally:
        codes = {"store": store_job.stop(), "index": index_job.stop()}
        release.set()
        starter.join(WAIT_SECONDS)
        shutil.rmtree(work, ignore_errors=True)
    assert codes == {"store": {0: 0}, "index": {0: 0}}


def with_clients(service: dict[str, Any], body: Any) -> Any:
    async def go() -> Any:
        async with client_engine(default_timeout_seconds=WAIT_SECONDS * 3) as engine:
            blobs = BlobClient(engine, service["store"], service["blob_id"])
            index = KVClient(engine, service["index"], service["kv_id"])
            return await body(engine, blobs, index)

    return run(go())


def test_store_and_retrieve_with_checksums(service: dict[str, Any]) -> None:
    sizes = {"empty": 0, "one": 1, "small": 4096 + 3, "odd": (1 << 20) + 7, "chunks": 9 * (1 << 20) + 5}
    data = {name: os.urandom(size) for name, size in sizes.items()}

    async def body(engine: Engine, blobs: BlobClient, index: KVClient) -> None:
        for name, payload in data.items():
            info = await blobs.put(name, payload)
            assert info == {"name": name, "size": len(payload), "sha256": _sha(payload)}
        for name, payload in data.items():
            got = await blobs.get(name)
            assert got is not None and len(got) == len(payload) and _sha(got) == _sha(payload)
            assert got == payload
            assert await blobs.stat(name) == {"name": name, "size": len(payload), "sha256": _sha(payload)}
        assert await blobs.list_names() == sorted(data)
        assert await blobs.list_names(prefix="o") == ["odd", "one"]
        assert await blobs.list_names(start_after="odd", max_names=1) == ["one"]

        # The index lives in the kv provider of the other process: one entry per blob.
        keys = await index.list_keys(prefix=service["prefix"])
        assert keys == sorted(f"{service['prefix']}{n}".encode() for n in data)
        entry = json.loads(await index.get(f"{service['prefix']}chunks"))
        assert entry["size"] == sizes["chunks"] and entry["sha256"] == _sha(data["chunks"])

        for name in data:
            assert await blobs.erase(name) is True
        assert await blobs.erase("chunks") is False
        assert await blobs.get("chunks") is None and await blobs.stat("chunks") is None
        assert await index.list_keys(prefix=service["prefix"]) == []

    with_clients(service, body)
    assert os.listdir(service["work"] / "data") == []  # every data file went with its blob


def test_overwrite_replaces_data_file(service: dict[str, Any]) -> None:
    async def body(engine: Engine, blobs: BlobClient, index: KVClient) -> None:
        await blobs.put("x", b"first version")
        array = np.arange(300_000, dtype=np.float64)  # numpy buffers are exposed as they are
        info = await blobs.put("x", array)
        assert info["size"] == array.nbytes and info["sha256"] == _sha(array)
        got = await blobs.get("x")
        assert np.array_equal(np.frombuffer(got, dtype=np.float64), array)
        assert len(os.listdir(service["work"] / "data")) == 1  # the old version's file is gone
        await blobs.erase("x")

    with_clients(service, body)


def test_concurrent_puts_and_gets(service: dict[str, Any]) -> None:
    data = {f"c{i}": os.urandom(200_000 + i) for i in range(8)}

    async def body(engine: Engine, blobs: BlobClient, index: KVClient) -> None:
        infos = await asyncio.gather(*(blobs.put(n, d) for n, d in data.items()))
        assert [i["sha256"] for i in infos] == [_sha(d) for d in data.values()]
        got = await asyncio.gather(*(blobs.get(n) for n in data))
        assert got == list(data.values())
        await asyncio.gather(*(blobs.erase(n) for n in data))

    with_clients(service, body)


def test_errors_are_clear(service: dict[str, Any]) -> None:
    async def body(engine: Engine, blobs: BlobClient, index: KVClient) -> None:
        await blobs.put("big", bytes(10_000))
        small = bytearray(100)
        handle = engine.expose(small, "w")
        with pytest.raises(AppError) as info:
            await blobs.handle.call("get", {"name": "big", "bulk": handle.to_wire()})
        assert info.value.code == "BufferTooSmall"
        assert "at least 10000 bytes" in info.value.message
        assert small == bytearray(100)
        with pytest.raises(RemoteError) as info:
            await blobs.handle.call("put", {"name": "", "bulk": handle.to_wire()})
        assert info.value.remote_type == "TypeError"
        with pytest.raises(RemoteError) as info:
            await blobs.handle.call("put", {"name": "y", "bulk": handle.to_wire()})  # a write-only handle
        assert info.value.remote_type == "BulkUsageError" and "pulled" in info.value.remote_message
        engine.unexpose(handle)
        await blobs.erase("big")

    with_clients(service, body)


def test_live_configs_show_the_composition(service: dict[str, Any]) -> None:
    async def body(engine: Engine, blobs: BlobClient, index: KVClient) -> None:
        store = ServiceHandle(engine, service["store"])
        (provider,) = (await store.get_config())["providers"]
        assert provider["dependencies"] == {"index": f"blob_index@{service['index']}"}
        assert provider["config"]["index_prefix"] == service["prefix"]
        remote = await ServiceHandle(engine, service["index"]).lookup_provider("blob_index")
        assert remote == {"name": "blob_index", "type": "kv", "provider_id": service["kv_id"]}

    with_clients(service, body)


def test_one_process_service_refuses_to_remove_the_index(tmp_path: Path) -> None:
    cfg: ServiceConfig = load_config(CONFIGS / "blob.json")
    cfg.providers[0].config["path"] = str(tmp_path / "index.sqlite")
    cfg.providers[1].config["path"] = str(tmp_path / "data")
    payload = os.urandom(3 * (1 << 20) + 1)

    async def go(address: str) -> None:
        async with client_engine(default_timeout_seconds=WAIT_SECONDS) as engine:
            blobs = BlobClient(engine, address, cfg.providers[1].provider_id or 0)
            assert (await blobs.put("p", payload))["sha256"] == _sha(payload)
            assert await blobs.get("p") == payload
            admin = ServiceHandle(engine, address)
            with pytest.raises(RemoteError, match="cannot remove 'blob_index': blobs depend"):
                await admin.remove_provider("blob_index")
            await admin.remove_provider("blobs")
            await admin.remove_provider("blob_index")
            assert (await admin.status())["providers"] == []

    with Launch(cfg, 1) as job:
        run(go(job.members[0].address))
