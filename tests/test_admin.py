"""The admin provider against real server processes: every RPC, the config round trip, dependencies
(local and remote, with Bedrock's grammar), removal with calls in flight, groups, and the refusals."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psutil
import pytest

from providers.kv import KVClient
from svcframe.admin import ServiceGroupHandle, ServiceHandle
from svcframe.config import parse_config
from svcframe.engine import Engine
from svcframe.errors import ConfigError, GroupError, NoSuchProvider, Refused, RemoteError
from svcframe.group import Member, read_group_file
from svcframe.launch import Launch, LaunchError
from svcframe.loops import run
from svcframe.provider import Dependency, Provider, register_provider_type
from svcframe.server import Server

WAIT_SECONDS = 10.0


def client_engine(**options: Any) -> Engine:
    """A client-only engine with the suite's shared secret (``SVCFRAME_SECRET``, set in conftest), if any."""
    secret = os.environ.get("SVCFRAME_SECRET")
    return Engine(None, secret=secret.encode() if secret else None, **options)


def admin(address: str, method: str, *args: Any, timeout_seconds: float = WAIT_SECONDS) -> Any:
    """One admin call from a fresh client engine."""

    async def go() -> Any:
        async with client_engine() as engine:
            return await getattr(ServiceHandle(engine, address, timeout_seconds=timeout_seconds), method)(*args)

    return run(go())


def remote_config_error(address: str, method: str, *args: Any) -> str:
    """Call an admin RPC that must fail with the server's ConfigError; return its message."""
    with pytest.raises(RemoteError) as info:
        admin(address, method, *args)
    assert info.value.remote_type == "ConfigError", info.value
    return info.value.remote_message


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sfadm", dir="/tmp"))  # short: unix socket paths live here too
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def svc(workdir: Path) -> Iterator[Member]:
    """A kv provider and a blob provider that depends on it (local dependency by name)."""
    cfg = {
        "libraries": ["providers.kv", "providers.blob"],
        "providers": [
            {"name": "store", "type": "kv", "provider_id": 1, "config": {"path": str(workdir / "store.sqlite")}},
            {"name": "blobs", "type": "blob", "provider_id": 2, "config": {"path": str(workdir / "blobs")},
             "dependencies": {"index": "store"}},
        ],
    }  # fmt: skip
    with Launch(parse_config(cfg), 1) as job:
        yield job.members[0]


@pytest.fixture(scope="module")
def locked() -> Iterator[Member]:
    """A server whose admin mutations are switched off in its bootstrap config."""
    cfg = {
        "admin": {"allow_mutations": False},
        "libraries": ["selftest.provider"],
        "providers": [{"name": "st", "type": "selftest", "provider_id": 1}],
    }
    with Launch(parse_config(cfg), 1) as job:
        yield job.members[0]


@pytest.fixture(scope="module")
def group(workdir: Path) -> Iterator[tuple[Path, list[Member]]]:
    """Two servers and their group file."""
    cfg = {"libraries": ["selftest.provider"], "providers": [{"name": "st", "type": "selftest", "provider_id": 1}]}
    path = workdir / "group.json"
    with Launch(parse_config(cfg), 2, group_file=path) as job:
        yield path, job.members


# -- read-only RPCs ----------------------------------------------------------------------------------------
def test_admin_provider_is_reserved_id_zero(svc: Member) -> None:
    assert svc.provider_id == 0
    rpcs = admin(svc.address, "list_rpcs")
    admin_rpcs = {r["name"] for r in rpcs if r["provider_id"] == 0}
    assert {"get_config", "query_config", "status", "list_rpcs", "statistics", "lookup_provider", "patch_config",
            "add_provider", "remove_provider", "load_library", "shutdown"} <= admin_rpcs  # fmt: skip
    assert {r["provider"] for r in rpcs if r["provider_id"] == 0} == {"admin"}
    assert {"put", "get", "put_bulk"} <= {r["name"] for r in rpcs if r["provider_id"] == 1 and r["provider"] == "store"}
    assert {"put", "get", "stat", "list"} <= {r["name"] for r in rpcs if r["provider"] == "blobs"}
    with pytest.raises(ConfigError, match="reserved for the admin"):
        parse_config({"providers": [{"name": "x", "type": "kv", "provider_id": 0}]})


def test_get_config_fills_defaults_keeps_configured_address(svc: Member, workdir: Path) -> None:
    cfg = admin(svc.address, "get_config")
    assert cfg["engine"]["address"] == "tcp://127.0.0.1:0"  # as configured; re-launchable
    assert cfg["engine"]["progress_mode"] == "spindown"
    admin_section = {"provider_id": 0, "allow_mutations": True, "dependency_resolution_timeout_seconds": 30.0}
    assert cfg["admin"].items() >= admin_section.items()
    store, blobs = cfg["providers"][:2]
    assert store == {"name": "store", "type": "kv", "provider_id": 1, "tags": [], "dependencies": {},
                     "config": {"path": str(workdir / "store.sqlite"), "durability": "durable",
                                "inline_max_bytes": 65536, "max_value_bytes": 268435456}}  # fmt: skip
    assert blobs["dependencies"] == {"index": "store"}
    assert blobs["config"]["index_prefix"] == "blobs/"  # the provider's defaults are filled in too
    assert parse_config(cfg).model_dump(mode="json") == cfg
    status = admin(svc.address, "status")
    assert status["address"] == svc.address != cfg["engine"]["address"]  # the bound one is in status


def test_query_config(svc: Member) -> None:
    assert admin(svc.address, "query_config", "providers[?name=='store'].type") == ["kv"]
    assert admin(svc.address, "query_config", "admin.provider_id") == 0
    assert admin(svc.address, "query_config", "no_such_key") is None
    assert "invalid JMESPath expression" in remote_config_error(svc.address, "query_config", "providers[?")


def test_statistics(svc: Member) -> None:
    stats = admin(svc.address, "statistics")
    assert stats["address"] == svc.address
    assert "handlers_running" in stats


def test_lookup_provider(svc: Member) -> None:
    assert admin(svc.address, "lookup_provider", "store") == {"name": "store", "type": "kv", "provider_id": 1}
    assert admin(svc.address, "lookup_provider", "kv:1") == {"name": "store", "type": "kv", "provider_id": 1}
    assert admin(svc.address, "lookup_provider", "blob:2@local")["name"] == "blobs"
    assert admin(svc.address, "lookup_provider", "nope") is None
    assert admin(svc.address, "lookup_provider", "kv:2") is None  # id 2 is a blob provider
    assert "not a remote one" in remote_config_error(svc.address, "lookup_provider", "store@tcp://10.0.0.1:1")
    assert "expected NAME or TYPE:ID" in remote_config_error(svc.address, "lookup_provider", "kv:x")


# -- round trip ---------------------------------------------------------------------------------------------
def test_config_round_trip_after_runtime_changes(tmp_path: Path) -> None:
    """get -> save -> launch a new server from it -> get: equal, including every change made at runtime."""
    first = parse_config({"libraries": ["providers.kv"],
                          "providers": [{"name": "store", "type": "kv", "config": {"path": ":memory:"}}]})  # fmt: skip
    with Launch(first, 1) as job:
        address = job.members[0].address
        assert admin(address, "load_library", "selftest.provider") == ["selftest"]
        assert admin(address, "add_provider", {"name": "st", "type": "selftest"}) == 2  # lowest free id
        admin(address, "add_provider", {"name": "gone", "type": "kv", "provider_id": 9, "config": {"path": ":memory:"}})
        admin(address, "remove_provider", "gone")
        admin(address, "patch_config", [{"op": "replace", "path": "/engine/progress_mode", "value": "busy"}])
        saved = admin(address, "get_config")
    path = tmp_path / "saved.json"
    path.write_text(json.dumps(saved))
    with Launch(path, 1) as job:
        (member,) = job.members
        assert member.address != address
        again = admin(member.address, "get_config")
        assert again == saved
        assert [p["name"] for p in again["providers"]] == ["store", "st"]
        assert again["engine"]["progress_mode"] == "busy"
        assert admin(member.address, "lookup_provider", "selftest:2") == {
            "name": "st", "type": "selftest", "provider_id": 2}  # fmt: skip

        # Mutations can be switched off live, and then not switched on again remotely.
        off = [{"op": "replace", "path": "/admin/allow_mutations", "value": False}]
        assert admin(member.address, "patch_config", off)["admin"]["allow_mutations"] is False
        with pytest.raises(Refused, match="allow_mutations is false"):
            admin(member.address, "patch_config", [{**off[0], "value": True}])
        assert admin(member.address, "query_config", "admin.allow_mutations") is False


# -- add, remove, load ------------------------------------------------------------------------------------
def test_add_provider_then_remove_it(svc: Member) -> None:
    desc = {"name": "cache", "type": "kv", "config": {"path": ":memory:"}}
    pid = admin(svc.address, "add_provider", desc)
    assert pid not in (0, 1, 2)

    async def use() -> bytes | None:
        async with client_engine() as engine:
            kv = KVClient(engine, svc.address, pid)
            await kv.put("k", b"v")
            return await kv.get("k")

    assert run(use()) == b"v"
    (entry,) = admin(svc.address, "query_config", "providers[?name=='cache']")
    assert entry["provider_id"] == pid
    assert entry["config"] == {
        "path": ":memory:",
        "durability": "durable",
        "inline_max_bytes": 65536,
        "max_value_bytes": 268435456,
    }
    assert admin(svc.address, "remove_provider", "cache") is None
    with pytest.raises(NoSuchProvider):
        run(use())
    assert admin(svc.address, "query_config", "providers[?name=='cache']") == []
    assert "no provider named 'cache'" in remote_config_error(svc.address, "remove_provider", "cache")


@pytest.mark.parametrize(
    ("desc", "fragment"),
    [
        ({"name": "store", "type": "kv"}, "a provider named 'store' already exists"),
        ({"name": "x", "type": "kv", "provider_id": 1}, "provider_id 1 of 'x' is already used by 'store'"),
        ({"name": "x", "type": "kv", "provider_id": 0}, "reserved for the admin provider"),
        ({"name": "x", "type": "nope"}, "unknown provider type 'nope' (known: "),
        ({"type": "kv"}, "provider description: name: Field required"),
        ({"name": "x", "type": "kv", "config": {"colour": 1}}, "colour: Extra inputs are not permitted"),
    ],
)
def test_add_provider_errors(svc: Member, desc: dict[str, Any], fragment: str) -> None:
    assert fragment in remote_config_error(svc.address, "add_provider", desc)
    assert admin(svc.address, "lookup_provider", "x") is None  # nothing half-added


def test_remove_refused_while_others_depend_on_it(svc: Member) -> None:
    message = remote_config_error(svc.address, "remove_provider", "store")
    assert "cannot remove 'store'" in message and "blobs" in message
    assert admin(svc.address, "lookup_provider", "store") is not None
    assert "admin provider cannot be removed" in remote_config_error(svc.address, "remove_provider", "admin")


def test_remove_waits_for_in_flight_calls_and_releases_resources(svc: Member, workdir: Path) -> None:
    """A kv put blocked on a SQLite lock we hold is in flight while the provider is removed: new calls are
    refused at once, the put completes once we let go, then the database is closed."""
    path = workdir / "slow.sqlite"
    pid = admin(svc.address, "add_provider", {"name": "slow", "type": "kv", "config": {"path": str(path)}})
    proc = psutil.Process(svc.pid)

    def server_has_open() -> bool:
        return any(f.path == str(path) for f in proc.open_files())

    assert server_has_open()
    lock = sqlite3.connect(path, isolation_level=None, timeout=WAIT_SECONDS)
    lock.execute("BEGIN IMMEDIATE")  # the provider's writes now wait (its busy_timeout is 5 s)

    async def go() -> None:
        async with client_engine(default_timeout_seconds=WAIT_SECONDS) as engine:
            kv = KVClient(engine, svc.address, pid, inline_max_bytes=65536)
            handle = ServiceHandle(engine, svc.address)
            put = asyncio.create_task(kv.put("key", b"value"))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_SECONDS
            while (await handle.statistics())["handlers_running"] < 1:  # the put is running on the server
                assert loop.time() < deadline, "the put never started"
            remove = asyncio.create_task(handle.remove_provider("slow"))
            while (await handle.statistics())["handlers_running"] < 2:  # the removal is running too
                assert loop.time() < deadline, "the removal never started"
            with pytest.raises(Refused, match="provider 'slow' is being removed"):
                await kv.count()  # a new call is refused at once
            assert not put.done() and not remove.done()
            assert server_has_open()
            lock.execute("ROLLBACK")
            assert await put is None  # the in-flight call completed
            assert await remove is None  # ... before the removal did
            with pytest.raises(NoSuchProvider):
                await kv.count()

    try:
        run(go())
    finally:
        lock.close()
    assert not server_has_open()  # released
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT value FROM kv WHERE key = ?", (b"key",)).fetchone() == (b"value",)


def test_load_library(svc: Member) -> None:
    assert admin(svc.address, "load_library", "selftest.provider") == ["selftest"]
    assert admin(svc.address, "load_library", "selftest.provider") == ["selftest"]  # idempotent
    assert admin(svc.address, "query_config", "libraries") == ["providers.kv", "providers.blob", "selftest.provider"]
    message = remote_config_error(svc.address, "load_library", "no_such_module_xyz")
    assert "library 'no_such_module_xyz' cannot be imported" in message
    assert "no_such_module_xyz" not in admin(svc.address, "query_config", "libraries")


def test_patch_config_live_and_frozen_settings(svc: Member) -> None:
    new = admin(svc.address, "patch_config", [{"op": "replace", "path": "/engine/progress_mode", "value": "block"}])
    assert new["engine"]["progress_mode"] == "block"
    assert admin(svc.address, "query_config", "engine.progress_mode") == "block"
    admin(svc.address, "patch_config", [{"op": "replace", "path": "/engine/progress_mode", "value": "spindown"}])
    frozen = [{"op": "replace", "path": "/engine/address", "value": "tcp://127.0.0.1:1"}]
    assert "/engine/address cannot change while the server runs" in remote_config_error(
        svc.address, "patch_config", frozen
    )
    bad = [{"op": "replace", "path": "/engine/progress_mode", "value": "fast"}]
    assert "engine.progress_mode" in remote_config_error(svc.address, "patch_config", bad)
    assert "cannot apply the JSON Patch" in remote_config_error(
        svc.address, "patch_config", [{"op": "replace", "path": "/nope/x", "value": 1}]
    )
    assert admin(svc.address, "query_config", "engine.address") == "tcp://127.0.0.1:0"


# -- dependencies -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("deps", "fragment"),
    [
        ({"index": "nokv"}, "dependencies.index: 'nokv': no such provider in this process (running: store (kv:1)"),
        ({"index": "kv:7@local"}, "dependencies.index: 'kv:7@local': no such provider"),
        ({}, "dependencies: missing required dependency 'index'"),
        ({"index": "store", "extra": "store"}, "dependencies.extra: unknown dependency 'extra'; type 'blob' declares"),
        ({"index": "blobs"}, "dependencies.index: 'blobs' is a provider of type 'blob'; expected type 'kv'"),
        ({"index": ["store", "store"]}, "dependencies.index: dependency 'index' takes one provider, not 2"),
        ({"index": "kv:"}, "dependencies.index: dependency 'kv:': expected NAME or TYPE:ID"),
    ],
)
def test_dependency_errors_name_the_dependency(svc: Member, workdir: Path, deps: dict[str, Any], fragment: str) -> None:
    desc = {"name": "b2", "type": "blob", "config": {"path": str(workdir / "b2")}, "dependencies": deps}
    message = remote_config_error(svc.address, "add_provider", desc)
    assert fragment in message
    assert "provider 'b2' (type 'blob')" in message
    assert admin(svc.address, "lookup_provider", "b2") is None


def test_local_dependency_by_type_and_id_and_one_element_list(svc: Member, workdir: Path) -> None:
    for name, index in (("b3", "kv:1@local"), ("b4", ["store"]), ("b5", f"store@{svc.address}")):  # own address: local
        desc = {"name": name, "type": "blob", "config": {"path": str(workdir / name)}, "dependencies": {"index": index}}
        admin(svc.address, "add_provider", desc)
        assert f"blobs, {name} depend(s) on it" in remote_config_error(svc.address, "remove_provider", "store")
        admin(svc.address, "remove_provider", name)


def test_remote_dependency_found_checked_and_bounded(
    svc: Member, group: tuple[Path, list[Member]], workdir: Path
) -> None:
    other = group[1][0].address  # hosts a selftest provider "st" at id 1, no kv
    desc = {"name": "rb", "type": "blob", "config": {"path": str(workdir / "rb")}}
    message = remote_config_error(svc.address, "add_provider", {**desc, "dependencies": {"index": f"st@{other}"}})
    assert f"dependencies.index: 'st@{other}' is a provider of type 'selftest'; expected type 'kv'" in message

    short = [{"op": "replace", "path": "/admin/dependency_resolution_timeout_seconds", "value": 0.3}]
    admin(svc.address, "patch_config", short)
    try:
        message = remote_config_error(svc.address, "add_provider", {**desc, "dependencies": {"index": f"kv:1@{other}"}})
        assert f"dependencies.index: 'kv:1@{other}': not found within" in message
        assert f"{other} has no provider 'kv:1'" in message
        gone = f"unix://{workdir}/nobody.sock"
        message = remote_config_error(svc.address, "add_provider", {**desc, "dependencies": {"index": f"kv:1@{gone}"}})
        assert "not found within" in message and "ConnectionLost" in message
    finally:
        admin(svc.address, "patch_config", [{**short[0], "value": 30.0}])


def test_remote_dependency_waits_for_the_provider_to_appear(group: tuple[Path, list[Member]], workdir: Path) -> None:
    """add_provider on one server waits (bounded) for its remote dependency to be added on another."""
    first, second = (m.address for m in group[1])

    async def go() -> dict[str, Any]:
        async with client_engine(default_timeout_seconds=WAIT_SECONDS) as engine:
            a, b = ServiceHandle(engine, first), ServiceHandle(engine, second)
            await a.load_library("providers.blob")
            desc = {"name": "late_blobs", "type": "blob", "config": {"path": str(workdir / "late")},
                    "dependencies": {"index": f"late_index@{second}"}}  # fmt: skip
            await b.statistics(reset=True)
            adding = asyncio.create_task(a.add_provider(desc))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_SECONDS
            while not any(r["rpc"] == "lookup_provider" for r in (await b.statistics())["rpcs"]["target"]):
                assert loop.time() < deadline, "the dependency was never looked up"  # `first` asked `second`
            assert not adding.done()
            await b.load_library("providers.kv")
            await b.add_provider({"name": "late_index", "type": "kv", "config": {"path": ":memory:"}})
            await adding
            try:
                return (await a.query_config("providers[?name=='late_blobs']"))[0]
            finally:
                await a.remove_provider("late_blobs")
                await b.remove_provider("late_index")  # nothing local depends on it over there

    entry = run(go())
    assert entry["dependencies"] == {"index": f"late_index@{second}"}


# -- refusals ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "arg"),
    [
        ("patch_config", [{"op": "replace", "path": "/engine/progress_mode", "value": "busy"}]),
        ("add_provider", {"name": "x", "type": "selftest"}),
        ("remove_provider", "st"),
        ("load_library", "providers.kv"),
        ("shutdown", None),
    ],
)
def test_mutations_refused_when_disabled(locked: Member, method: str, arg: Any) -> None:
    with pytest.raises(Refused, match=f"{method} refused: admin.allow_mutations is false"):
        admin(locked.address, method, *([] if arg is None else [arg]))
    status = admin(locked.address, "status")  # still up, unchanged
    assert status["providers"] == [{"name": "st", "type": "selftest", "provider_id": 1}]
    assert admin(locked.address, "query_config", "engine.progress_mode") == "spindown"
    assert admin(locked.address, "lookup_provider", "st")["provider_id"] == 1


# -- groups ---------------------------------------------------------------------------------------------------
def test_group_handle_from_group_file(group: tuple[Path, list[Member]], tmp_path: Path) -> None:
    path, members = group
    addresses = [m.address for m in members]
    assert [(m.address, m.provider_id) for m in read_group_file(path).members] == [(a, 0) for a in addresses]

    async def go() -> None:
        async with client_engine(default_timeout_seconds=WAIT_SECONDS) as engine:
            g = ServiceGroupHandle.from_group_file(engine, path)
            assert len(g) == 2 and g.addresses == addresses and g[1].address == addresses[1]
            configs = await g.get_config()
            assert list(configs) == addresses
            assert all(c["providers"][0]["name"] == "st" for c in configs.values())
            assert await g.query_config("providers[].type") == {a: ["selftest"] for a in addresses}
            statuses = await g.status()
            assert [s["address"] for s in statuses.values()] == addresses
            ids = await g.add_provider({"name": "extra", "type": "selftest"})
            assert ids == dict.fromkeys(addresses, 2)
            assert await g.remove_provider("extra") == dict.fromkeys(addresses)
            assert await g.lookup_provider("extra") == dict.fromkeys(addresses)

            dead = f"unix://{tmp_path}/dead.sock"
            mixed = ServiceGroupHandle(engine, [(addresses[0], 0), (dead, 0)], timeout_seconds=2.0)
            out = await mixed.status()
            assert out[addresses[0]]["address"] == addresses[0]
            assert isinstance(out[dead], Exception)

            one = tmp_path / "one.json"
            one.write_text(json.dumps({"members": [{"address": addresses[1], "provider_id": 0}]}))
            g2 = ServiceGroupHandle.from_group_file(engine, one)
            one.write_text(json.dumps({"members": [{"address": a} for a in addresses]}))
            g2.refresh()
            assert g2.addresses == addresses

    run(go())
    with pytest.raises(GroupError, match=r"missing\.json: cannot read"):
        read_group_file(tmp_path / "missing.json")


def test_shutdown_drains_and_exits_zero() -> None:
    with Launch(parse_config({}), 1) as job:
        assert admin(job.members[0].address, "shutdown") is None
        assert job.wait(WAIT_SECONDS) == {0: 0}


def test_missing_dependency_at_start_is_a_clear_launch_error(workdir: Path) -> None:
    cfg = parse_config({
        "libraries": ["providers.blob"],
        "providers": [{"name": "orphan", "type": "blob", "config": {"path": str(workdir / "orphan")},
                       "dependencies": {"index": "missing_kv"}}],
    })  # fmt: skip
    with pytest.raises(LaunchError, match=r"providers\[0\]\.dependencies\.index: 'missing_kv': no such provider"):
        Launch(cfg, 1).start()


@register_provider_type
class _Fanout(Provider):
    """Declares an array dependency on kv providers and an optional one of any type."""

    type_name = "test_fanout"
    DEPENDENCIES = (Dependency("shards", type="kv", array=True), Dependency("extra", required=False))


def test_array_and_optional_dependencies_in_process() -> None:
    async def go() -> None:
        cfg = parse_config({
            "engine": {"address": "tcp://127.0.0.1:0"},
            "libraries": ["providers.kv"],
            "providers": [
                {"name": "s1", "type": "kv", "config": {"path": ":memory:"}},
                {"name": "s2", "type": "kv", "config": {"path": ":memory:"}},
                {"name": "many", "type": "test_fanout", "dependencies": {"shards": ["s1", "kv:2"]}},
                {"name": "one", "type": "test_fanout", "dependencies": {"shards": "s1", "extra": "many"}},
            ],
        })  # fmt: skip
        server = await Server(cfg).start()
        try:
            s1, s2, many, one = (server.providers[n] for n in ("s1", "s2", "many", "one"))
            assert many.dependencies == {"shards": [s1, s2]}
            assert one.dependencies == {"shards": [s1], "extra": many}  # a scalar is a one-element array
            assert server.dependents("s1") == ["many", "one"]
            with pytest.raises(
                ConfigError, match=r"dependencies\.shards\[0\]: 'one' is a provider of type 'test_fanout'"
            ):
                await server.add_provider({"name": "bad", "type": "test_fanout", "dependencies": {"shards": ["one"]}})
        finally:
            await server.close()

    run(go())
