"""The admin command line against real server processes: every verb as a user runs it
(``python -m svcframe ...``), its output, its exit code and its refusals; and the schema drift test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from selftest.attach import attach
from svcframe.admin import ServiceHandle
from svcframe.composition import service_schema
from svcframe.config import parse_config
from svcframe.engine import Engine
from svcframe.group import Member
from svcframe.launch import Launch
from svcframe.loops import run
from svcframe.provider import installed_libraries

# the admin commands' text and exit codes: our logic, not the Python version's (CI's first interpreter only)
pytestmark = pytest.mark.one_interpreter


ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "configs" / "schema.json"
REGENERATE = ".venv/bin/python -m svcframe config schema -o configs/schema.json"
#: The provider libraries svcframe ships (pyproject.toml's svcframe.providers entry points, by their installed
#: names): the default schema's.
SHIPPED = ["svcframe_providers.blob", "svcframe_providers.kv", "svcframe_selftest.provider"]
WAIT_SECONDS = 10.0


def client_engine(**options: Any) -> Engine:
    """A client-only engine with the suite's shared secret (``SVCFRAME_SECRET``, set in conftest), if any."""
    secret = os.environ.get("SVCFRAME_SECRET")
    return Engine(None, secret=secret.encode() if secret else None, **options)


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "svcframe", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    if ok:
        assert proc.returncode == 0, f"svcframe {' '.join(args)} failed:\n{proc.stderr}"
    else:
        assert proc.returncode != 0, f"svcframe {' '.join(args)} should have failed:\n{proc.stdout}"
    return proc


def cli_json(*args: str) -> Any:
    return json.loads(cli(*args).stdout)


def get_config(address: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with client_engine() as engine:
            return await ServiceHandle(engine, address).get_config()

    return run(go())


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Member]]]:
    """Two servers with a kv provider and no self-test provider, and their group file."""
    path = tmp_path_factory.mktemp("cli") / "group.json"
    cfg = {
        "libraries": ["providers.kv"],
        "providers": [{"name": "store", "type": "kv", "config": {"path": ":memory:"}}],
    }
    with Launch(parse_config(cfg), 2, group_file=path) as job:
        yield str(path), job.members


@pytest.fixture(scope="module")
def locked() -> Iterator[str]:
    cfg = {"admin": {"allow_mutations": False}, "libraries": ["providers.kv"]}
    with Launch(parse_config(cfg), 1) as job:
        yield job.members[0].address


def test_schema_file_matches_the_models() -> None:
    assert installed_libraries() == SHIPPED, "pyproject.toml's svcframe.providers changed: run pip install -e ."
    assert json.loads(SCHEMA.read_text()) == service_schema(SHIPPED), (
        f"{SCHEMA.relative_to(ROOT)} is out of date with the pydantic models (svcframe/config.py, svcframe/settings.py "
        f"and the shipped providers' Config); regenerate it with: {REGENERATE}"
    )


def test_config_schema_and_check(tmp_path: Path) -> None:
    assert cli_json("config", "schema") == service_schema(SHIPPED)
    out = tmp_path / "schema.json"
    cli("config", "schema", "-o", str(out))
    assert json.loads(out.read_text()) == service_schema(SHIPPED)
    checked = cli_json("config", "check", "configs/blob.json")
    assert checked["providers"][1]["dependencies"] == {"index": "blob_index@local"}
    assert checked["admin"]["dependency_resolution_timeout_seconds"] == 30.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"admin": {"allow_mutation": False}}))
    err = cli("config", "check", str(bad), ok=False).stderr
    assert f"{bad}: admin.allow_mutation: Extra inputs are not permitted" in err


def test_config_get_address_and_group(group: tuple[str, list[Member]]) -> None:
    path, members = group
    a = members[0].address
    assert cli_json("config", "get", a) == {a: get_config(a)}
    both = cli_json("config", "get", "--group", path)
    assert list(both) == [m.address for m in members]
    assert all(c["providers"][0]["name"] == "store" for c in both.values())


def test_config_get_output_relaunches_an_equal_server(group: tuple[str, list[Member]], tmp_path: Path) -> None:
    path, members = group
    saved = tmp_path / "live.json"
    proc = cli("config", "get", members[1].address, "-o", str(saved))
    assert f"written to {saved}" in proc.stderr
    err = cli("config", "get", "--group", path, "-o", str(tmp_path / "x.json"), ok=False).stderr
    assert "--output takes the configuration of one server; 2 were given" in err
    with Launch(saved, 1) as job:
        a = job.members[0].address
        assert cli_json("config", "get", a) == {a: json.loads(saved.read_text())}
        assert cli_json("status", a)[a]["address"] == a


def test_config_query_and_patch(group: tuple[str, list[Member]], tmp_path: Path) -> None:
    path, members = group
    a = members[0].address
    assert cli_json("config", "query", a, "providers[].type") == {a: ["kv"]}
    assert cli_json("config", "query", "--group", path, "engine.progress_mode") == {
        m.address: "spindown" for m in members
    }
    patch = tmp_path / "busy.json"
    patch.write_text(json.dumps([{"op": "replace", "path": "/engine/progress_mode", "value": "busy"}]))
    assert cli_json("config", "patch", a, f"@{patch}")[a]["engine"]["progress_mode"] == "busy"
    back = '[{"op": "replace", "path": "/engine/progress_mode", "value": "spindown"}]'
    assert cli_json("config", "patch", a, back)[a]["engine"]["progress_mode"] == "spindown"
    frozen = '[{"op": "replace", "path": "/engine/address", "value": "tcp://127.0.0.1:1"}]'
    refused = cli("config", "patch", a, frozen, ok=False)
    assert "/engine/address cannot change while the server runs" in refused.stderr
    assert refused.stdout == ""  # the error alone: no "{}" for a pipe to take as a result
    assert "invalid JMESPath" in cli("config", "query", a, "providers[?", ok=False).stderr


def test_provider_add_list_lookup_remove(group: tuple[str, list[Member]], tmp_path: Path) -> None:
    path, members = group
    a = members[0].address
    assert cli_json("provider", "add", a, '{"name": "cache", "type": "kv", "config": {"path": ":memory:"}}') == {a: 2}
    desc = tmp_path / "desc.json"
    desc.write_text(json.dumps({"name": "pinned", "type": "kv", "provider_id": 7, "config": {"path": ":memory:"}}))
    assert cli_json("provider", "add", "--group", path, f"@{desc}") == {m.address: 7 for m in members}
    listed = cli_json("provider", "list", a)
    assert listed == {
        a: [
            {"name": "store", "type": "kv", "provider_id": 1},
            {"name": "cache", "type": "kv", "provider_id": 2},
            {"name": "pinned", "type": "kv", "provider_id": 7},
        ]
    }
    with_rpcs = cli_json("provider", "list", a, "--rpcs")[a]
    assert with_rpcs[0]["name"] == "admin" and "add_provider" in with_rpcs[0]["rpcs"]
    assert {"put", "get", "put_bulk"} <= set(with_rpcs[2]["rpcs"])
    assert cli_json("provider", "lookup", a, "kv:2") == {a: {"name": "cache", "type": "kv", "provider_id": 2}}
    assert cli_json("provider", "lookup", a, "nope") == {a: None}

    err = cli("provider", "add", a, '{"name": "cache", "type": "kv"}', ok=False).stderr
    assert "a provider named 'cache' already exists" in err
    assert "must be a JSON object" in cli("provider", "add", a, "[1]", ok=False).stderr
    assert "cannot read the provider description" in cli("provider", "add", a, "@/no/such/file", ok=False).stderr

    assert cli_json("provider", "remove", a, "cache") == {a: None}  # JSON keyed by address, as every verb
    cli("provider", "remove", "--group", path, "pinned")
    assert "no provider named 'cache'" in cli("provider", "remove", a, "cache", ok=False).stderr
    assert [p["name"] for p in cli_json("provider", "list", a)[a]] == ["store"]


def test_library_load(group: tuple[str, list[Member]]) -> None:
    path, members = group
    out = cli_json("library", "load", "--group", path, "providers.blob")
    assert out == {m.address: ["blob"] for m in members}
    assert "providers.blob" in get_config(members[1].address)["libraries"]
    err = cli("library", "load", members[0].address, "no_such_module_xyz", ok=False).stderr
    assert "library 'no_such_module_xyz' cannot be imported" in err


def test_mutating_verbs_refused_when_disabled(locked: str) -> None:
    for args in (
        ("provider", "add", locked, '{"name": "x", "type": "kv"}'),
        ("provider", "remove", locked, "x"),
        ("library", "load", locked, "providers.blob"),
        ("config", "patch", locked, '[{"op": "replace", "path": "/engine/progress_mode", "value": "busy"}]'),
        ("shutdown", locked),
    ):
        err = cli(*args, ok=False).stderr
        assert f"svcframe: {locked}: MutationsDisabled" in err and "admin.allow_mutations is false" in err, args
    assert cli_json("provider", "list", locked) == {locked: []}  # reads still work, nothing changed


def test_selftest_run_attaches_and_detaches_the_provider(group: tuple[str, list[Member]], tmp_path: Path) -> None:
    path, members = group
    quick = ["--clients", "1", "--duration-seconds", "0.2", "--warmup-iterations", "2"]
    out = tmp_path / "noop.json"
    proc = cli("selftest", "run", "--target", members[0].address, *quick, "-o", str(out))
    assert f"added a self-test provider (id 2) to {members[0].address}" in proc.stderr
    results = json.loads(out.read_text())
    assert results["aggregate"]["ops"] > 0
    assert results["parameters"]["provider_id"] == 2
    assert [p["name"] for p in cli_json("provider", "list", members[0].address)[members[0].address]] == ["store"]

    proc = cli("selftest", "run", "--group", path, *quick, "--keep-provider", "-o", str(out))
    assert "kept the self-test provider (id 2)" in proc.stderr
    assert json.loads(out.read_text())["aggregate"]["ops"] > 0
    kept = {"name": "selftest", "type": "selftest", "provider_id": 2}
    assert cli_json("provider", "lookup", "--group", path, "selftest:2") == {m.address: kept for m in members}

    async def reattach() -> Any:  # present everywhere now: used as it is, nothing added
        async with client_engine() as engine:
            return await attach(engine, [(m.address, 0) for m in members])

    attachment = run(reattach())
    assert (attachment.provider_id, attachment.added) == (2, [])
    cli("provider", "remove", "--group", path, "selftest")

    err = cli("selftest", "run", "--target", members[0].address, "--provider-id", "1", *quick, ok=False).stderr
    assert "provider id 1 is used by 'store' (type 'kv')" in err


def test_selftest_run_refused_on_a_locked_server(locked: str) -> None:
    err = cli("selftest", "run", "--target", locked, "--duration-seconds", "0.2", ok=False).stderr
    assert f"{locked} has no self-test provider and refuses to add one" in err
    assert "admin.allow_mutations is false" in err


def test_shutdown_by_address() -> None:
    with Launch(parse_config({}), 1) as job:
        a = job.members[0].address
        assert cli_json("shutdown", a) == {a: None}
        assert job.wait(WAIT_SECONDS) == {0: 0}


def test_version_is_the_installed_one() -> None:
    from importlib.metadata import version

    import svcframe

    assert (
        cli("--version").stdout.startswith(f"svcframe {version('svcframe')} (")
        and version("svcframe") == svcframe.__version__
    )


def test_call_takes_bytes_and_a_group(group: tuple[str, list[Member]], tmp_path: Path) -> None:
    """The kv provider's put needs bytes, which the CLI could not pass; --group picks a member. Values print as
    they are (binary as base64:DATA or hex:DATA, text and keys as text), and a str value is stored as its UTF-8
    encoding."""
    path, members = group
    value = tmp_path / "value.bin"
    value.write_bytes(b"\x00\x01binary")
    text = '{"key": "k0", "value": "plain text, é"}'
    assert cli_json("call", "-g", path, "put", text, "-p", "1") is None  # a str value: its UTF-8 bytes
    shown = cli("call", "-g", path, "get", '{"key": "k0"}', "-p", "1").stdout
    assert json.loads(shown) == "plain text, é" and "é" in shown  # as it is, not \u00e9
    assert cli_json("call", "-g", path, "put", '{"key": "k1"}', "--bytes", f"value=@{value}", "-p", "1") is None
    assert cli_json("call", "-g", path, "get", '{"key": "k1"}', "-p", "1") == "base64:AAFiaW5hcnk="  # not \ufffd
    assert (
        cli_json("call", "-g", path, "get", '{"key": "k1"}', "-p", "1", "--bytes-as", "hex") == "hex:000162696e617279"
    )
    assert cli_json("call", "-g", path, "list_keys", "-p", "1") == ["k0", "k1"]  # keys as text, not "b'k1'"
    assert (
        cli_json("call", "-g", path, "put", '{"key": "k1"}', "--bytes", "value=hex:000162696e617279", "-p", "1") is None
    )
    assert cli_json("call", "-g", path, "get", '{"key": "k1"}', "-p", "1") == "base64:AAFiaW5hcnk="
    assert cli_json("call", "-g", path, "erase", '{"key": "k0"}', "-p", "1") is True
    assert cli_json("call", members[0].address, "length", '{"key": "k1"}', "-p", "1") == len(b"\x00\x01binary")
    assert cli_json("call", members[0].address, "get", '{"key": "k2"}', "-p", "1") is None
    cli("call", members[0].address, "put", '{"key": "k2"}', "--bytes", "value=base64:aGk=", "-p", "1")
    assert cli_json("call", members[0].address, "get", '{"key": "k2"}', "-p", "1") == "hi"
    assert cli_json("call", "-g", path, "--rank", "1", "count", "-p", "1") == 0  # the other server's store
    got = cli("call", members[0].address, "noop-not-there", f"@{value}", "-p", "1", ok=False).stderr
    assert got.startswith("svcframe: error:") and "Traceback" not in got
    for bad in ("notjson", "base64:!!", "@/nonexistent/file"):
        err = cli("call", members[0].address, "count", bad, "-p", "1", ok=False).stderr
        assert err.count("\n") == 1 and err.startswith("svcframe: error: ARG"), err
    err = cli("call", "-g", path, "--rank", "5", "count", ok=False).stderr
    assert f"group file {path}: no rank 5 (ranks: 0, 1)" in err
