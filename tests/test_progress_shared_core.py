"""Spindown on a core shared with the peer it serves: real processes, a real socket."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from conftest import WAIT_SECONDS
from test_progress import pinned

from selftest import SELFTEST_CONFIG
from svcframe import Engine
from svcframe.admin import ServiceHandle
from svcframe.config import load_config
from svcframe.launch import Launch
from svcframe.loops import run


def test_a_server_sharing_its_core_with_its_client_stops_spinning() -> None:
    """The issue's same-core row: a spindown server and its client on one core. The server finds it is
    starving the client and blocks; its statistics say so."""
    core = max(os.sched_getaffinity(0))
    cfg = load_config(SELFTEST_CONFIG)
    assert cfg.engine.progress_mode == "spindown"

    async def calls(address: str) -> dict[str, Any]:
        async with Engine(None) as client:  # a client-only engine: blocks
            admin = ServiceHandle(client, address)
            deadline = time.monotonic() + WAIT_SECONDS
            while time.monotonic() < deadline:
                for _ in range(200):  # sequential calls: the server replies, then polls while we run
                    await client.call(address, "work", [0, None, None, b""], provider_id=1)
                progress: dict[str, Any] = (await admin.statistics())["progress"]
                if progress["contended"] >= 1:
                    return progress
            pytest.fail(f"the server kept spinning on the core it shares with its client: {progress}")

    with Launch(cfg, 1, cores=[core]) as job, pinned(core):
        progress = run(calls(job.members[0].address))
    assert progress["mode"] == "spindown" and progress["blocks"] >= 1, progress
