"""Provider configs are first-class: ``svcframe config check`` imports the libraries and checks
every provider's config by its type's ``Config`` model, its id and its dependencies, with the very check
``svcframe serve`` runs at start-up (one function); ``svcframe config schema`` describes ``providers[].config``
as a union discriminated on ``type``; providers read typed settings, and the live configuration still
relaunches an equal server. Every command runs as a user runs it, in a pipe; servers are real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import readme_quickstart

from providers.kv import KVProvider
from svcframe import ConfigError, Engine
from svcframe.admin import ServiceHandle
from svcframe.composition import check_service, service_schema
from svcframe.config import parse_config
from svcframe.loops import run
from svcframe.testing import ProviderFor, ServerProcess

ROOT = Path(__file__).resolve().parent.parent
SECRET = os.environ["SVCFRAME_SECRET"].encode()


def svcframe(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``python -m svcframe ARGS`` with stdout and stderr on pipes (not a terminal)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "svcframe", *args], capture_output=True, text=True, cwd=cwd, timeout=60, env=env
    )


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The problems a failed command printed: exit 1, nothing on stdout, every stderr line one problem (or a
    note: what could not be checked offline)."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("svcframe: note: ")]
    assert lines and all(line.startswith("svcframe: error: ") for line in lines), proc.stderr
    return [line.removeprefix("svcframe: error: ") for line in lines]


def get_config(address: str, provider_id: int = 0) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with Engine(None, secret=SECRET) as client:
            return await ServiceHandle(client, address, provider_id).get_config()

    return run(go())


#: Four problems in four providers, and one dependency on another server.
BROKEN = {
    "libraries": ["providers.kv", "providers.blob", "no_such_library"],
    "providers": [
        {"name": "blobs", "type": "blob", "config": {"chunk_bytes": 100}, "dependencies": {"index": "store"}},
        {"name": "store", "type": "kv", "config": {"max_value_bytes": 2_000_000_000}},
        {"name": "mystery", "type": "nosuchtype"},
        {"name": "far", "type": "blob", "dependencies": {"index": "kv:1@tcp://127.0.0.1:9"}},
    ],
}
PROBLEMS = [
    "libraries[2]: library 'no_such_library' cannot be imported: No module named 'no_such_library'",
    "providers[0].config.chunk_bytes: Input should be greater than or equal to 4096 (got 100)",
    "providers[0].dependencies.index: 'store': no such provider listed before 'blobs' (before it: none); "
    "providers start in list order, so list it before the providers that depend on it",
    "providers[1].config.max_value_bytes: Input should be less than or equal to 1000000000 (got 2000000000)",
    "providers[2].type: unknown provider type 'nosuchtype' (known: ",
]


def test_check_reports_every_problem_by_json_path(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(BROKEN))
    proc = svcframe("config", "check", str(path))
    problems = error_lines(proc)
    assert len(problems) == len(PROBLEMS), proc.stderr
    for line, expected in zip(problems, PROBLEMS, strict=True):
        assert line.startswith(f"{path}: {expected}"), (line, expected)
    # the remote dependency is noted, not checked (and is no problem)
    assert f"svcframe: note: {path}: providers[3].dependencies.index: 'kv:1@tcp://127.0.0.1:9' is on another " in (
        proc.stderr
    )


def test_an_invalid_section_hides_no_other_problem(tmp_path: Path) -> None:
    """An engine typo stopped the check before any provider's config was looked at. One pass now: the
    sections' problems, then every remaining provider checked by its type, each line naming its JSON path in the
    user's file; and launch says the same, naming the user's file (not its temporary per-rank copy)."""
    path = tmp_path / "typos.json"
    path.write_text(json.dumps({
        "engine": {"address": "tcp://127.0.0.1:0", "progress_mod": "busy"},
        "libraries": ["providers.kv"],
        "providers": [{"name": "store", "type": "kv", "config": {"durabilty": "fast"}},
                      {"name": "bad name", "type": "kv"},
                      {"name": "other", "type": "kv", "config": {"path": ":memory:", "inline_max_bytes": -1}}],
    }))  # fmt: skip
    expected = [
        f'{path}: engine.progress_mod: Extra inputs are not permitted (got "busy")',
        f"{path}: providers[1].name: String should match pattern '^[A-Za-z_][A-Za-z0-9_]*$' (got \"bad name\")",
        f'{path}: providers[0].config.durabilty: Extra inputs are not permitted (got "fast")',
        f"{path}: providers[2].config.inline_max_bytes: Input should be greater than or equal to 0 (got -1)",
    ]
    assert error_lines(svcframe("config", "check", str(path))) == expected
    assert error_lines(svcframe("launch", str(path), "--procs", "2", "--group-file", str(tmp_path / "g.json"))) == (
        expected
    )
    assert not (tmp_path / "g.json").exists()


def test_kv_names_a_file_per_rank_and_refuses_one_file_for_several_processes(tmp_path: Path) -> None:
    """The kv example config under launch --procs N: every rank opened one SQLite file ("database is locked").
    {rank} names a file per rank; one file for several processes is refused before any starts, with the fix."""
    shared = tmp_path / "shared.json"
    shared.write_text(json.dumps({"libraries": ["providers.kv"], "providers": [
        {"name": "store", "type": "kv", "config": {"path": "kv.sqlite"}}]}))  # fmt: skip
    assert svcframe("config", "check", str(shared)).returncode == 0  # one process: fine
    (line,) = error_lines(svcframe("config", "check", str(shared), "--procs", "3"))
    assert line.startswith(f"{shared}: providers[0].config.path: each of the 3 server processes would open "
                           "'kv.sqlite', and SQLite lets one of them write")  # fmt: skip
    assert "give a file per rank, such as 'kv-{rank}.sqlite'" in line
    (refused,) = error_lines(svcframe("launch", str(shared), "--procs", "2", cwd=tmp_path))
    assert refused == line.replace("3 server processes", "2 server processes")
    assert not (tmp_path / "kv.sqlite").exists()  # nothing started
    checked = json.loads(svcframe("config", "check", str(ROOT / "configs" / "kv.json"), "--procs", "2").stdout)
    assert checked["providers"][0]["config"]["path"] == "kv-store-0.sqlite"  # rank 0's, as launch checks it

    group = tmp_path / "g.json"
    launcher = subprocess.Popen([sys.executable, "-m", "svcframe", "launch", str(ROOT / "configs" / "kv.json"),
                                 "--procs", "2", "--group-file", str(group)], cwd=tmp_path, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    try:
        assert "2 server(s) ready" in launcher.stderr.readline()
        members = json.loads(group.read_text())["members"]
        for rank, member in enumerate(members):
            config = get_config(member["address"])
            assert config["providers"][0]["config"]["path"] == f"kv-store-{rank}.sqlite"
            assert (tmp_path / f"kv-store-{rank}.sqlite").exists()
    finally:
        launcher.terminate()
        assert launcher.wait(timeout=30) == 0
        assert launcher.stderr is not None
        launcher.stderr.close()


def test_serve_refuses_the_same_problems_with_the_same_lines(tmp_path: Path) -> None:
    """``serve`` runs the check ``config check`` runs: the same problems, the same lines, nothing started."""
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(BROKEN))
    checked = error_lines(svcframe("config", "check", str(path)))
    served = svcframe("serve", str(path))
    assert served.returncode == 1 and "Traceback" not in served.stderr, served.stderr
    refused = [line.split("server failed to start: ", 1)[1] for line in served.stderr.splitlines()]
    assert refused == checked and len(refused) == len(PROBLEMS)


def test_check_prints_the_config_serve_would_run_with_defaults_ids_and_notes(tmp_path: Path) -> None:
    path = tmp_path / "ok.json"
    path.write_text(json.dumps({
        "engine": {"max_body_bytes": 131072, "bulk_chunk_bytes": 65536},
        "libraries": ["providers.kv", "providers.blob"],
        "providers": [
            {"name": "store", "type": "kv", "provider_id": 65535},
            {"name": "blobs", "type": "blob", "provider_id": 7, "dependencies": {"index": "kv:1"}},
            {"name": "far", "type": "blob", "dependencies": {"index": "kv:1@tcp://127.0.0.1:9"}},
        ],
    }))  # fmt: skip
    proc = svcframe("config", "check", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"svcframe: note: {path}: providers[2].dependencies.index: 'kv:1@tcp://127.0.0.1:9' is on another server: "
        "not checked offline (the server resolves it when it starts)"
    ]
    store, blobs, far = json.loads(proc.stdout)["providers"]
    # ids: 65535 and absent mean "choose": the lowest free (0 is the admin's, 7 is taken)
    assert (store["provider_id"], blobs["provider_id"], far["provider_id"]) == (1, 7, 2)
    # defaults filled in from the provider id, the name and the engine's settings
    assert store["config"] == {
        "path": "kv-1.sqlite", "durability": "durable", "inline_max_bytes": 131072 - 65536,
        "max_value_bytes": 256 * 1024 * 1024,
    }  # fmt: skip
    assert (blobs["config"]["path"], blobs["config"]["index_prefix"]) == ("blob-7", "blobs/")


def test_a_provider_named_admin_does_not_take_the_admin_providers_id() -> None:
    config = parse_config({"libraries": ["providers.kv"], "providers": [{"name": "admin", "type": "kv"}]})
    checked, findings = check_service(config)
    assert findings.problems == [] and [c.spec.provider_id for c in checked] == [1]


def test_a_limit_the_engine_sets_is_checked_offline(tmp_path: Path) -> None:
    """kv's inline_max_bytes must fit the engine's frames: the Config reads the engine's settings offline too."""
    path = tmp_path / "inline.json"
    path.write_text(json.dumps({
        "engine": {"max_body_bytes": 131072, "bulk_chunk_bytes": 65536}, "libraries": ["providers.kv"],
        "providers": [{"name": "store", "type": "kv", "config": {"inline_max_bytes": 100000}}],
    }))  # fmt: skip
    (line,) = error_lines(svcframe("config", "check", str(path)))
    assert line == (
        f"{path}: providers[0].config.inline_max_bytes: 100000 exceeds 65536 (the engine's max_body_bytes 131072 "
        "minus 65536 for the key and framing) (got 100000)"
    )


def test_the_readme_counter_config_is_typed(tmp_path: Path) -> None:
    code, config = readme_quickstart()
    (tmp_path / "counter.py").write_text(code)
    document = json.loads(config)
    (tmp_path / "counter.json").write_text(json.dumps(document))
    checked = svcframe("config", "check", "counter.json", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["providers"][0]["config"] == {"start": 0}
    for bad, expected in (
        ({"start": "ten"}, "providers[0].config.start: Input should be a valid integer"),
        ({"stat": 1}, "providers[0].config.stat: Extra inputs are not permitted"),
    ):
        document["providers"][0]["config"] = bad
        (tmp_path / "counter.json").write_text(json.dumps(document))
        (line,) = error_lines(svcframe("config", "check", "counter.json", cwd=tmp_path))
        assert line.startswith(f"counter.json: {expected}"), line


# -- the schema ----------------------------------------------------------------------------------------------------
def test_schema_is_a_union_discriminated_on_type() -> None:
    proc = svcframe("config", "schema", "--library", "providers.kv", "--library", "selftest.provider")
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    items = schema["properties"]["providers"]["items"]
    assert items["discriminator"] == {
        "propertyName": "type",
        "mapping": {  # the libraries' types, and the built-in group provider's (svcframe.group_provider)
            "flock": "#/$defs/FlockProviderSpec",
            "group": "#/$defs/GroupProviderSpec",
            "kv": "#/$defs/KvProviderSpec",
            "selftest": "#/$defs/SelftestProviderSpec",
        },
    }
    assert schema["$defs"]["KvProviderSpec"]["properties"]["config"] == {"$ref": "#/$defs/KvConfig"}
    assert schema["$defs"]["KvConfig"]["properties"]["max_value_bytes"]["maximum"] == 1_000_000_000
    assert "blob" not in json.dumps(items)  # only the libraries given


def test_the_schema_checks_provider_configs_by_type_as_an_editor_would() -> None:
    """A JSON Schema validator (what an editor runs) finds a provider config's mistakes by the provider's type."""
    schema = json.loads(svcframe("config", "schema").stdout)  # default: the shipped libraries
    assert schema == service_schema(["providers.blob", "providers.kv", "selftest.provider"])
    validator = jsonschema.Draft202012Validator(schema)
    good = json.loads((ROOT / "configs" / "blob.json").read_text())
    assert list(validator.iter_errors(good)) == []
    mochi = {"margo": {"argobots": {}}, "bedrock": {"provider_id": 0}, "providers": [{"name": "k", "type": "kv"}]}
    assert list(validator.iter_errors(mochi)) == []  # Bedrock's section names are in the schema too
    for config, type_name in (({"max_value_bytes": 2_000_000_000}, "kv"), ({"chunk_bytes": 1}, "blob"),
                              ({"max_blob_bytes": 1}, "kv"), ({"storage_dir": 3}, "selftest")):  # fmt: skip
        document = {"providers": [{"name": "p", "type": type_name, "config": config}]}
        errors = list(validator.iter_errors(document))
        assert errors, (type_name, config)
        assert all(list(e.absolute_path)[:3] == ["providers", 0, "config"] or e.validator == "oneOf" for e in errors)


def test_schema_errors_are_one_line() -> None:
    (line,) = error_lines(svcframe("config", "schema", "--library", "no_such_library"))
    assert line.startswith("library 'no_such_library' cannot be imported")


# -- typed settings, and the live configuration's round trip -------------------------------------------------------
@pytest.mark.asyncio
async def test_a_provider_reads_its_settings_as_its_config_model() -> None:
    kit = ProviderFor("kv", {"path": ":memory:", "durability": "fast"}, library="providers.kv", provider_id=4)
    async with kit as kv:
        assert kit.server is not None
        provider = kit.server.providers["kv"]
        assert isinstance(provider, KVProvider) and isinstance(provider.settings, KVProvider.Config)
        assert (provider.settings.path, provider.settings.durability) == (":memory:", "fast")
        assert provider.settings.inline_max_bytes == 64 * 1024  # filled in from the engine's max_body_bytes
        assert provider.get_config() == provider.settings.model_dump(mode="json")
        await kv.call("put", {"key": "k", "value": bytes(64 * 1024)})  # at the limit: inline
    with pytest.raises(ConfigError, match=r"kv provider 'x' \(id 1\) config: durability: Input should be"):
        KVProvider(Engine(None), 1, name="x", config={"durability": "sometimes"})


def test_live_config_relaunches_an_equal_service(tmp_path: Path) -> None:
    """get_config -> serve the result -> get_config: equal, with the defaults the configs filled in."""
    config = {
        "libraries": ["providers.kv", "providers.blob"],
        "providers": [
            {"name": "store", "type": "kv", "provider_id": 65535, "config": {"path": str(tmp_path / "s.sqlite")}},
            {"name": "blobs", "type": "blob", "config": {"path": str(tmp_path / "blobs")},
             "dependencies": {"index": "store"}},
        ],
    }  # fmt: skip
    with ServerProcess.start(config, tmp_path, name="first") as first:
        live = get_config(first.address)
    assert [(p["name"], p["provider_id"]) for p in live["providers"]] == [("store", 1), ("blobs", 2)]
    assert live["providers"][1]["config"]["index_prefix"] == "blobs/"
    with ServerProcess.start(live, tmp_path, name="second") as second:
        again = get_config(second.address)
    assert again == live
