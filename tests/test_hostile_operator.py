"""Operator safety and expensive reads, with real server processes and the CLI as a user runs it:
a unix address naming a file is refused and the file kept; a provider whose start() hangs fails the start-up;
a 100,000-deep config is a config error; statistics reset is an admin mutation; JMESPath queries are bounded;
short connections from one host do not grow the statistics.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from reliability_kit import MIB, RELTEST_ID, Procs, scaled, server_env, service_config

from svcframe import ConnectionLost, Engine, RemoteError, Unauthenticated
from svcframe.admin import ServiceHandle

ROOT = Path(__file__).resolve().parents[1]
uvloop_test = pytest.mark.asyncio(loop_factories=["uvloop"])


def svcframe_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "svcframe", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
        env=env or server_env(),
    )  # fmt: skip


def one_clear_line(proc: subprocess.CompletedProcess[str]) -> str:
    """A user error: a non-zero exit and one line on stderr, no traceback."""
    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    return lines[0]


@uvloop_test
async def test_a_unix_address_naming_a_file_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    victim = tmp_path / "notes.txt"
    victim.write_text("precious")
    with pytest.raises(ConnectionLost, match="a file is there, not a stale socket"):
        await Engine(f"unix://{victim}").start()
    assert victim.read_text() == "precious"
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"providers": []}))
    line = one_clear_line(svcframe_cli("serve", str(config), "--address", f"unix://{victim}"))
    assert "not a stale socket" in line
    assert victim.read_text() == "precious"


HANGING_LIBRARY = """
import asyncio
from svcframe import Provider, register_provider_type

@register_provider_type
class Hangs(Provider):
    type_name = "hangs"

    async def start(self):
        await asyncio.Event().wait()
"""


def test_a_provider_whose_start_hangs_fails_the_start_up(tmp_path: Path, figures: Any) -> None:
    (tmp_path / "hanging_lib.py").write_text(HANGING_LIBRARY)
    config = tmp_path / "c.json"
    config.write_text(json.dumps({
        "libraries": ["hanging_lib"], "admin": {"provider_start_timeout_seconds": 1.0},
        "providers": [{"name": "h", "type": "hangs", "provider_id": 1}],
    }))  # fmt: skip
    env = server_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    t0 = time.perf_counter()
    proc = svcframe_cli("serve", str(config), env=env, timeout=30)
    seconds = time.perf_counter() - t0
    figures.record("operator: a hanging provider start failed the start-up after", round(seconds, 2), "s")
    assert proc.returncode != 0 and "did not start within 1 s" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_server_answers_nobody_before_its_providers_started(tmp_path: Path) -> None:
    """A provider whose start() hangs: the server's address is bound (its providers may need it) but no call
    is answered meanwhile, not even the admin provider's status; the start-up then fails and frees it."""
    import shutil
    import tempfile

    from svcframe.loops import run

    (tmp_path / "hanging_lib.py").write_text(HANGING_LIBRARY)
    sockets = Path(tempfile.mkdtemp(prefix="sfh", dir="/tmp"))  # a short unix path
    path = sockets / "s.sock"
    config = tmp_path / "c.json"
    config.write_text(json.dumps({
        "engine": {"address": f"unix://{path}"}, "libraries": ["hanging_lib"],
        "admin": {"provider_start_timeout_seconds": 5.0},
        "providers": [{"name": "h", "type": "hangs", "provider_id": 1}],
    }))  # fmt: skip
    env = server_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    proc = subprocess.Popen([sys.executable, "-m", "svcframe", "serve", str(config)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

    async def status() -> None:
        async with Engine(None) as client:
            await ServiceHandle(client, f"unix://{path}", timeout_seconds=1.0).status()

    try:
        deadline = time.monotonic() + 60
        while not path.exists():  # bound: the engine started, the hanging provider is starting
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        with pytest.raises((TimeoutError, ConnectionLost)):
            run(status())
        assert proc.poll() is None, "the start-up ended before the call was refused an answer"
        _, err = proc.communicate(timeout=60)
        assert proc.returncode != 0 and "did not start within 5 s" in err, err
        assert not path.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        shutil.rmtree(sockets, ignore_errors=True)


def test_a_deep_config_is_a_config_error(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"providers": [], "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    line = one_clear_line(svcframe_cli("config", "check", str(deep)))
    assert "nested too deeply" in line or "nested more than" in line, line
    nested = {"providers": [], "engine": {}}
    node: Any = nested["engine"]
    for _ in range(100):
        node["x"] = {}
        node = node["x"]
    deep.write_text(json.dumps(nested))
    line = one_clear_line(svcframe_cli("config", "check", str(deep)))
    assert "nested more than 64 levels" in line, line


@uvloop_test
async def test_statistics_reset_is_a_mutation_and_queries_are_bounded(
    procs: Procs, tmp_path: Path, figures: Any
) -> None:
    server = procs.spawn(service_config(tmp_path, kv=None), env=server_env(secret=False))
    async with Engine(None, secret=None) as anyone:
        admin = ServiceHandle(anyone, server.address, timeout_seconds=10.0)
        assert isinstance(await admin.statistics(), dict)  # reading statistics needs nothing
        with pytest.raises(Unauthenticated):
            await admin.statistics(reset=True)
        rss_before = server.rss()
        t0 = time.perf_counter()
        for n in range(4):
            with pytest.raises(RemoteError, match="limit is 4096") as info:
                await admin.query_config("providers[0].name" + " || providers[0].name" * (40_000 + n))
            assert info.value.remote_type == "ConfigError"
        seconds = time.perf_counter() - t0
        assert await admin.query_config("providers[].name") == ["rel"]
        grown = server.rss() - rss_before
    figures.record("operator: 4 x 800 KB JMESPath expressions refused in", round(seconds * 1e3, 1), "ms")
    figures.record("operator: ... server RSS growth", round(grown / MIB, 1), "MiB")
    assert seconds < 2.0 and grown < 16 * MIB


@uvloop_test
async def test_short_connections_do_not_grow_the_statistics(procs: Procs, tmp_path: Path, figures: Any) -> None:
    server = procs.spawn(service_config(tmp_path, kv=None))
    count = scaled(300, 3000)

    async def one() -> None:
        async with Engine(None) as engine:
            await engine.call(server.address, "noop", 1, provider_id=RELTEST_ID)

    await one()
    rss_before = server.rss()
    for _ in range(count):
        await one()
    grown = server.rss() - rss_before
    async with Engine(None) as engine:
        stats = await ServiceHandle(engine, server.address).statistics()
    peers = {key for key in json.dumps(stats).split('"') if key.startswith("clients@")}
    figures.record(f"operator: {count} short connections, server RSS growth", round(grown / MIB, 1), "MiB")
    figures.record(f"operator: {count} short connections, peer labels in statistics", len(peers), "")
    assert peers == {"clients@127.0.0.1"}, peers
    assert grown < 8 * MIB


def test_an_empty_or_short_secret_is_refused_everywhere(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"providers": []}))
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    line = one_clear_line(svcframe_cli("serve", str(config), "--secret-file", str(empty)))
    assert "empty" in line and "16 bytes" in line, line
    line = one_clear_line(svcframe_cli("status", "tcp://127.0.0.1:9", env=server_env({"SVCFRAME_SECRET": "short"})))
    assert "too short" in line, line
    config.write_text(json.dumps({"providers": [], "engine": {"auth": {"secret_file": str(empty)}}}))
    line = one_clear_line(svcframe_cli("serve", str(config), env=server_env(secret=False)))
    assert "empty" in line, line
    asyncio.run(_engine_refuses_empty_env())


async def _engine_refuses_empty_env() -> None:
    from svcframe import ConfigError

    os.environ["SVCFRAME_SECRET"], saved = "", os.environ.get("SVCFRAME_SECRET", "")
    try:
        with pytest.raises(ConfigError, match="SVCFRAME_SECRET variable is empty"):
            Engine(None)
    finally:
        os.environ["SVCFRAME_SECRET"] = saved


@uvloop_test
async def test_claimed_addresses_cannot_grow_the_statistics(procs: Procs, tmp_path: Path, figures: Any) -> None:
    """A peer's HELLO may claim any address, and statistics are kept per peer address: past 1,024 distinct
    peers, new ones share one "other" record."""
    from reliability_kit import close_writer, open_raw, raw_handshake, read_frame, request, secret

    from svcframe.connections import MAX_PEER_LABELS
    from svcframe.wire import pack_body

    server = procs.spawn(service_config(tmp_path, kv=None))
    for n in range(MAX_PEER_LABELS + 76):
        reader, writer = await open_raw(server.address)
        try:
            await raw_handshake(reader, writer, secret(), f"claimer-{n}", address=f"tcp://10.{n // 256}.{n % 256}.1:1")
            writer.write(request(1, RELTEST_ID, "noop", pack_body(n)))
            await read_frame(reader)
        finally:
            await close_writer(writer)
    async with Engine(None) as engine:
        stats = await ServiceHandle(engine, server.address).statistics()
    peers = {r["peer"] for r in stats["rpcs"]["target"]}
    figures.record(f"operator: {MAX_PEER_LABELS + 76} claimed peer addresses, statistics peers", len(peers), "")
    assert len(peers) <= MAX_PEER_LABELS + 2 and "other" in peers  # + "other" + our own client host


def test_a_secret_file_that_is_a_fifo_or_a_device_or_huge_is_refused_at_once(tmp_path: Path) -> None:
    """A --secret-file that is a FIFO, a device or a large file is one clear error, never a read that blocks or
    never ends."""
    from svcframe.errors import ConfigError
    from svcframe.server import read_secret_file

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"k" * 1_000_000)
    for path, why in ((fifo, "not a regular file"), ("/dev/zero", "not a regular file"), (big, "larger than 4096")):
        with pytest.raises(ConfigError, match=why):
            read_secret_file(str(path))
    cli = subprocess.run(
        [sys.executable, "-m", "svcframe", "serve", "configs/kv.json", "--secret-file", str(fifo)],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert cli.returncode != 0 and len(cli.stderr.strip().splitlines()) == 1 and "not a regular file" in cli.stderr
