"""svcframe.testing, the public kit: a provider in a server with a client handle (tcp and unix), a server
process with readiness, and a raw peer for hand-made frames, each against the real thing."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import readme_quickstart

from svcframe import AuthenticationFailed, ConfigError, Engine, ProviderHandle
from svcframe.errors import NoSuchRPC
from svcframe.loops import run
from svcframe.testing import ProviderFor, RawPeer, ServerProcess
from svcframe.wire import Kind, Status

SECRET = os.environ["SVCFRAME_SECRET"].encode()


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_provider_for_runs_a_provider_behind_a_real_socket(transport: str) -> None:
    async with ProviderFor("kv", {"path": ":memory:"}, library="providers.kv", transport=transport) as kv:
        assert isinstance(kv, ProviderHandle) and kv.address.startswith(f"{transport}://")
        await kv.call("put", {"key": "a", "value": b"1"})
        assert await kv.call("get", {"key": "a"}) == b"1"
        with pytest.raises(NoSuchRPC):
            await kv.call("no_such_rpc")
    socket_dir = os.path.dirname(kv.address[len("unix://") :]) if transport == "unix" else None
    assert socket_dir is None or not os.path.isdir(socket_dir)  # noqa: ASYNC240 (one check, after the run)


@pytest.mark.asyncio
async def test_provider_for_validates_the_config_as_serve_would() -> None:
    with pytest.raises(ConfigError, match="no_such_setting: Extra inputs are not permitted"):
        async with ProviderFor("kv", {"no_such_setting": 1}, library="providers.kv"):
            pass
    with pytest.raises(ConfigError, match="nosuchtype"):
        async with ProviderFor("nosuchtype"):
            pass


def test_the_getting_started_provider_test_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/getting-started.md shows how to test the quick start's provider with the kit: run exactly that,
    here in this process (tests/test_docs.py runs it as the page says, with pytest)."""
    code, _ = readme_quickstart()
    (tmp_path / "counter.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    page = (Path(__file__).resolve().parents[1] / "docs" / "getting-started.md").read_text()
    found = re.search(r'```python \{\.file title="test_counter\.py"\}\n(.*?)```', page, re.S)
    assert found, "docs/getting-started.md lost its provider test"
    namespace: dict[str, Any] = {}
    exec(compile(found.group(1), "test_counter.py", "exec"), namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_") and callable(fn)]
    assert tests, "the page's provider test defines no test function"
    try:
        for fn in tests:
            run(fn())
    finally:
        sys.modules.pop("counter", None)


def test_server_process_reports_ready_and_stops_cleanly(tmp_path: Path) -> None:
    config = {"libraries": ["providers.kv"], "providers": [{"name": "kv", "type": "kv", "provider_id": 3,
              "config": {"path": ":memory:"}}]}  # fmt: skip
    with ServerProcess.start(config, tmp_path) as server:
        assert server.alive() and server.address.startswith("tcp://127.0.0.1:")
        assert server.ready_message["ok"] is True and server.pid > 0

        async def use() -> bytes:
            async with Engine(None) as client:
                kv = ProviderHandle(client, server.address, 3)
                await kv.call("put", {"key": "k", "value": b"v"})
                return await kv.call("get", {"key": "k"})  # type: ignore[no-any-return]

        assert run(use()) == b"v"
    assert server.proc.returncode == 0 and not server.alive()


def test_server_process_that_fails_says_why_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="failed to start") as info:
        ServerProcess.start({"providers": [{"name": "x", "type": "nosuchtype"}]}, tmp_path)
    assert "nosuchtype" in str(info.value)


@pytest.mark.asyncio
async def test_raw_peer_handshakes_calls_and_sees_a_bad_frame_dropped(tmp_path: Path) -> None:
    config = {"libraries": ["providers.kv"], "providers": [{"name": "kv", "type": "kv", "provider_id": 3,
              "config": {"path": ":memory:"}}]}  # fmt: skip
    with ServerProcess.start(config, tmp_path) as server:
        async with await RawPeer.connect(server.address, secret=SECRET) as peer:  # checks the server's proof
            assert peer.server_hello["auth"] is True
            peer.request(1, 3, "put", {"key": "a", "value": b"x"})
            frame, body = await peer.read_response()
            assert (frame.request_id, frame.status, body) == (1, Status.OK, None)
            peer.request(2, 3, "get", body=b"\xc1")  # 0xc1 is never valid msgpack: a bad frame
            frame, body = await peer.read_response()
            assert frame.status == Status.BAD_REQUEST and "malformed" in body
            goodbye = await peer.read_frame()
            assert goodbye.kind == Kind.GOODBYE and goodbye.status == Status.BAD_REQUEST
            assert await peer.wait_closed() == b""
        with pytest.raises(AuthenticationFailed, match="authentication failed"):
            await RawPeer.connect(server.address, secret=b"w" * 32)
