"""Mochi files accepted: Bedrock's ``margo`` and ``bedrock`` sections are read as ``engine``
and ``admin``, Margo settings svcframe has no equivalent for are ignored with ONE warning naming them, the
names both share apply; provider ids are 0-65534 and 65535 means "choose one" (the lowest free), in config
validation, ``provider add`` and the engine. The Mochi files are the real ones (tests/data/mochi/SOURCES.md);
the commands run as a user runs them, in a pipe, against real server processes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from svcframe import ConfigError, Engine
from svcframe.admin import ServiceHandle
from svcframe.config import load_config, parse_config
from svcframe.loops import run
from svcframe.testing import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
MOCHI = ROOT / "tests" / "data" / "mochi"
SECRET = os.environ["SVCFRAME_SECRET"].encode()


def svcframe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "svcframe", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)  # fmt: skip


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("svcframe: error: "), proc.stderr
    return lines[0]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "svcframe.config" and r.levelno == logging.WARNING]


def live_config(address: str, admin_provider_id: int = 0) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with Engine(None, secret=SECRET) as client:
            return await ServiceHandle(client, address, admin_provider_id).get_config()

    return run(go())


# -- Bedrock's sections ---------------------------------------------------------------------------------------------
def test_quintains_provider_file_reads_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    path = MOCHI / "mochi-quintain-provider-rpc-threads.json"
    cfg = load_config(path)
    assert cfg.engine.progress_mode == "spindown" and cfg.admin.provider_id == 0
    assert [(p.name, p.type, p.provider_id, p.dependencies) for p in cfg.providers] == [
        ("my_quintain_provider", "quintain", 1, {}), ("quintain_group", "flock", 2, {}),
    ]  # fmt: skip
    assert warnings_of(caplog) == [
        f"{path}: ignoring Mochi settings svcframe has no equivalent for: margo.argobots, "
        "providers[0].dependencies.pool, providers[1].dependencies.pool"
    ]


def test_bedrocks_own_output_config_maps_the_shared_names(caplog: pytest.LogCaptureFixture) -> None:
    """The config Bedrock 0.16 writes (``bedrock -o``) for an empty input: Margo's progress and plumber
    settings are svcframe's names for the same settings; the rest is ignored, named once."""
    path = MOCHI / "bedrock-empty-output.json"
    cfg = load_config(path)
    assert (cfg.engine.progress_spindown_msec, cfg.engine.progress_timeout_ub_msec) == (10, 100)
    assert (cfg.engine.plumber.bucket_policy, cfg.engine.plumber.nic_policy) == ("package", "roundrobin")
    assert cfg.admin.provider_id == 0
    assert warnings_of(caplog) == [
        f"{path}: ignoring Mochi settings svcframe has no equivalent for: margo.argobots, margo.enable_abt_profiling, "
        "margo.handle_cache_size, margo.progress_pool, margo.rpc_pool, bedrock.pool"
    ]


def test_check_of_a_real_mochi_file_names_only_what_svcframe_cannot_run() -> None:
    """Quintain's own file: its margo section passes, its Flock provider is svcframe's built-in group provider;
    what is left are Quintain's C++ library and its type."""
    path = MOCHI / "mochi-quintain-provider.json"
    proc = svcframe("config", "check", str(path))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    warning, *errors = proc.stderr.splitlines()
    assert warning.endswith(
        f"svcframe.config WARNING {path}: ignoring Mochi settings svcframe "
        "has no equivalent for: providers[0].dependencies.pool, providers[1].dependencies.pool"
    ), warning
    # (Flock's library and its flock provider are svcframe's built-in group provider: only Quintain's are left)
    assert [e.split(": ")[3] for e in errors] == ["libraries[0]", "providers[0].type"]
    assert (
        "libquintain-bedrock.so' cannot be imported (a Bedrock C++ module; svcframe libraries are Python" in errors[0]
    )
    assert "margo" not in "\n".join(errors)


def quintain_as_svcframe(**changes: Any) -> dict[str, Any]:
    """Quintain's rpc-threads file, its Bedrock modules swapped for svcframe's self-test provider (Quintain's
    analogue) and the Flock provider dropped (svcframe's group files are written by serve/launch)."""
    document = json.loads((MOCHI / "mochi-quintain-provider-rpc-threads.json").read_text())
    document["libraries"] = ["selftest.provider"]
    document["providers"] = [{**document["providers"][0], "type": "selftest", **changes}]
    return document


def test_a_quintain_shaped_service_serves(tmp_path: Path) -> None:
    document = quintain_as_svcframe(provider_id=65535)  # and its margo section, Argobots pools and all
    document["margo"]["mercury"] = {"na_no_block": True, "auto_sm": True}
    document["bedrock"] = {"provider_id": 5, "dependency_resolution_timeout": 2.5, "pool": "quintain_rpcs"}
    with ServerProcess.start(document, tmp_path) as server:
        live = live_config(server.address, admin_provider_id=5)
        stat = svcframe("call", server.address, "stat", "-p", str(live["providers"][0]["provider_id"]))
        log = server.log()
    assert stat.returncode == 0 and json.loads(stat.stdout)["pid"] == server.pid, stat.stderr
    assert "margo" not in live and "bedrock" not in live  # the live configuration uses svcframe's names
    assert live["engine"]["progress_mode"] == "busy"  # Mercury's na_no_block: busy polling
    assert live["admin"]["provider_id"] == 5 and live["admin"]["dependency_resolution_timeout_seconds"] == 2.5
    assert [(p["name"], p["provider_id"], p["dependencies"]) for p in live["providers"]] == [
        ("my_quintain_provider", 0, {})  # 65535: the lowest free id (the admin has 5)
    ]
    (warning,) = [line for line in log.splitlines() if "ignoring Mochi settings" in line]
    assert warning.endswith("margo.argobots, margo.mercury.auto_sm, bedrock.pool, providers[0].dependencies.pool"), (
        warning
    )


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ({"engine": {}, "margo": {}}, "(top level): give 'engine' or 'margo' (Bedrock's name for it), not both"),
        ({"admin": {}, "bedrock": {}}, "(top level): give 'admin' or 'bedrock' (Bedrock's name for it), not both"),
        ({"margo": [{}, {}]}, "margo: svcframe runs one engine per process; give one Margo object, not 2"),
        ({"margo": []}, "margo: svcframe runs one engine per process; give one Margo object, not 0"),
        ({"margo": {"progres_mode": "busy"}}, "margo.progres_mode: Extra inputs are not permitted"),
        ({"margo": {"progress_spindown_msec": -1}}, "margo.progress_spindown_msec: Input should be greater than"),
        ({"bedrock": {"provider_id": 65535}}, "bedrock.provider_id: Input should be less than or equal to 65534"),
        ({"providers": [{"name": "a", "type": "kv", "engine": 1}]}, "providers[0].engine: Input should be 0"),
        ({"providers": [{"name": "a", "type": "kv", "provider_id": 65536}]}, "providers[0].provider_id: Input"),
    ],
)
def test_mochi_shaped_mistakes_are_one_clear_line(tmp_path: Path, document: dict[str, Any], fragment: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(document))
    assert one_error(svcframe("config", "check", str(path))).startswith(f"svcframe: error: {path}: {fragment}")


def test_a_one_engine_margo_list_and_engine_zero_are_accepted() -> None:
    cfg = parse_config({"margo": [{"progress_timeout_ub_msec": 5}], "providers": [{"name": "a", "type": "kv",
                        "engine": 0}]})  # fmt: skip
    assert cfg.engine.progress_timeout_ub_msec == 5
    assert "engine" not in cfg.providers[0].model_dump()  # svcframe's one engine: not repeated in the live config


# -- provider ids: 0-65534, 65535 = choose one ----------------------------------------------------------------------
def test_65535_means_choose_in_config_and_provider_add_and_the_engine_refuses_it(tmp_path: Path) -> None:
    config = {
        "libraries": ["providers.kv"],
        "providers": [
            {"name": "a", "type": "kv", "provider_id": 1, "config": {"path": ":memory:"}},
            {"name": "b", "type": "kv", "provider_id": 65535, "config": {"path": ":memory:"}},
            {"name": "c", "type": "kv", "provider_id": 3, "config": {"path": ":memory:"}},
        ],
    }
    with ServerProcess.start(config, tmp_path) as server:
        assert [p["provider_id"] for p in live_config(server.address)["providers"]] == [1, 2, 3]
        added = svcframe(
            "provider",
            "add",
            server.address,
            json.dumps({"name": "d", "type": "kv", "provider_id": 65535, "config": {"path": ":memory:"}}),
        )
        assert added.returncode == 0, added.stderr
        assert json.loads(added.stdout) == {server.address: 4}  # the lowest free id
        line = one_error(svcframe("call", server.address, "count", "-p", "65535"))
        assert "65535 is not in the range 0<=x<=65534" in line

    async def register() -> None:
        async with Engine(None) as engine:
            with pytest.raises(ConfigError, match=r"outside 0\.\.65534 \(65535 is reserved\)"):
                engine.register(65535, "x", lambda req, arg: None)

    run(register())
