"""A bare server carries only what serving needs: neither numpy nor matplotlib, whether one
imports what `svcframe serve` imports for a shipped config, or asks a real `svcframe serve` process that has
served calls and folded its statistics what it has mapped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from reliability_kit import Procs, server_env

from selftest import SELFTEST_CONFIG
from svcframe.admin import ServiceHandle
from svcframe.engine import Engine
from svcframe.loops import run

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_CONFIGS = [
    SELFTEST_CONFIG,
    *sorted(path for path in (ROOT / "configs").glob("*.json") if path.name != "schema.json"),
]
HEAVY = ("numpy", "matplotlib")


@pytest.mark.parametrize("config", SHIPPED_CONFIGS, ids=lambda path: path.name)
def test_what_serve_imports_for_a_shipped_config_is_neither_numpy_nor_matplotlib(config: Path) -> None:
    libraries = json.loads(config.read_text())["libraries"]
    script = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]: importlib.import_module(name)\n"
        f"print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))\n"
    )
    modules = ["svcframe.cli", "svcframe.server", *libraries]
    result = subprocess.run([sys.executable, "-c", script, *modules], capture_output=True, text=True, timeout=60,
                            env=server_env(), cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"{' '.join(modules)} imported {result.stdout.strip()}"


def test_a_serving_process_has_neither_numpy_nor_matplotlib_mapped(procs: Procs, tmp_path: Path) -> None:
    """`svcframe serve configs/kv.json`: after kv calls and a statistics read (the monitoring fold), the
    server's address space (/proc/PID/maps) holds no C extension of numpy or matplotlib."""
    if not Path("/proc/self/maps").exists():
        pytest.skip("needs /proc/PID/maps (Linux)")
    config = json.loads((ROOT / "configs" / "kv.json").read_text())
    for provider in config["providers"]:
        if provider["type"] == "kv":
            provider["config"]["path"] = str(tmp_path / "kv.sqlite")
    server = procs.spawn(config)
    kv_id = next(p["provider_id"] for p in config["providers"] if p["type"] == "kv")

    async def exercise() -> dict[str, Any]:
        async with Engine(None) as engine:
            for i in range(100):
                key = f"key-{i}".encode()
                await engine.call(server.address, "put", {"key": key, "value": b"v" * i}, provider_id=kv_id)
                assert await engine.call(server.address, "get", {"key": key}, provider_id=kv_id) == b"v" * i
            return await ServiceHandle(engine, server.address).statistics()

    stats = run(exercise())
    served = [row for row in stats["rpcs"]["target"] if row["rpc"] == "put"]
    assert served and served[0]["calls"] == 100 and served[0]["handler_usec"]["p50"] > 0
    maps = Path(f"/proc/{server.pid}/maps").read_text()
    assert [name for name in HEAVY if f"/{name}/" in maps] == []
    assert "/msgpack/" in maps  # the check sees C extensions: msgpack's is mapped
