"""The group provider (svcframe.group_provider) in real server processes on loopback: members that find each other
through a group file, a view that any client reads and watches, the group file kept equal to it, a member killed
(kill -9), stopped (SIGSTOP) or stopped cleanly leaving the view, a process back at the same address as a new
member, the client handle that stops sending to members that left, the CLI, and Flock's configs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import poll_until
from reliability_kit import server_env

from svcframe import ConfigError, Engine, GroupError
from svcframe.group import read_group_document, read_group_file
from svcframe.group_provider import GroupHandle, GroupProvider
from svcframe.provider import ConfigContext
from svcframe.settings import EngineConfig
from svcframe.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
GROUP_ID = 42
uvloop_test = pytest.mark.asyncio(loop_factories=["uvloop"])
#: Faster than the defaults (the benchmark measures those): a test's failure is detected in about 2 s.
FAST = {"protocol_period_ms": 200, "suspicion_timeout_ms": 1000}


def group_config(file: Path, bootstrap: str, port: int = 0, **swim: Any) -> dict[str, Any]:
    return {
        "engine": {"address": f"tcp://127.0.0.1:{port}"},
        "providers": [
            {"name": "group", "type": "group", "provider_id": GROUP_ID,
             "config": {"bootstrap": bootstrap, "file": str(file), "group": {"type": "swim", "config": {**FAST, **swim}}}},
        ],
    }  # fmt: skip


def start_group(tmp_path: Path, n: int, **swim: Any) -> tuple[Path, list[ServerProcess]]:
    """n servers: the first founds the group (and writes its file), the others join through that file."""
    file = tmp_path / "group.json"
    servers = [ServerProcess.start(group_config(file, "self", **swim), tmp_path, name="m0", env=server_env())]
    for i in range(1, n):
        servers.append(
            ServerProcess.start(group_config(file, "join", **swim), tmp_path, name=f"m{i}", env=server_env())
        )
    return file, servers


async def view_of(engine: Engine, address: str, provider_id: int = GROUP_ID) -> dict[str, Any]:
    return await engine.call(address, "view", None, provider_id=provider_id, timeout_seconds=5.0)  # type: ignore[no-any-return]


async def wait_for_view(
    engine: Engine, address: str, predicate: Callable[[dict[str, Any]], bool], within: float, what: str,
    provider_id: int = GROUP_ID,
) -> dict[str, Any]:  # fmt: skip
    """The view of the member at ``address`` once ``predicate`` holds, woken by the member's own watch (never a
    fixed sleep); fails after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    view = await view_of(engine, address, provider_id)
    while not predicate(view):
        left = deadline - loop.time()
        if left <= 0:
            pytest.fail(f"timed out after {within:g} s waiting for {what}; last view: {view}")
        view = await engine.call(address, "watch", {"version": view["version"], "timeout_seconds": min(left, 5.0)},
                                 provider_id=provider_id, timeout_seconds=min(left, 5.0) + 5.0)  # fmt: skip
    return view


def addresses(view: dict[str, Any]) -> set[str]:
    return {m["address"] for m in view["members"]}


def stop_all(servers: list[ServerProcess]) -> None:
    for s in servers:
        with_cont(s)
        s.stop()


def with_cont(server: ServerProcess) -> None:
    if server.alive():
        os.kill(server.pid, signal.SIGCONT)


@uvloop_test
async def test_members_find_each_other_and_the_group_file_is_the_view(tmp_path: Path) -> None:
    file, servers = start_group(tmp_path, 3)
    try:
        async with Engine(None) as engine:
            everyone = {s.address for s in servers}
            for s in servers:
                view = await wait_for_view(engine, s.address, lambda v: addresses(v) == everyone, 15.0, "3 members")
            digests = {(await view_of(engine, s.address))["digest"] for s in servers}
            assert len(digests) == 1  # every member sees the same members
            # the group file is the view, written by its first member, readable by svcframe's (and Flock's) reader
            group = read_group_file(file)
            assert {m.address for m in group.members} == everyone
            doc = json.loads(file.read_text())
            assert doc["metadata"]["group"]["digest"] == view["digest"]
            assert {m["member_id"] for m in doc["members"]} == {m["member_id"] for m in view["members"]}
            assert all(m["group_provider_id"] == GROUP_ID and m["provider_id"] == 0 for m in doc["members"])
            # a client's handle reads it from the file
            handle = GroupHandle.from_group_file(engine, file)
            assert {m["address"] for m in (await handle.refresh())["members"]} == everyone
            stats = await engine.call(servers[1].address, "stats", None, provider_id=GROUP_ID)
            assert stats["suspicions"] == 0 and stats["bootstrapped"]
    finally:
        stop_all(servers)


@uvloop_test
@pytest.mark.parametrize("killed", ["the file's writer", "another member"])
async def test_a_killed_member_leaves_the_view_and_comes_back_as_a_new_member(tmp_path: Path, killed: str) -> None:
    """kill -9: removed within the bound the members state; the same address started again is a new member (a
    new member id), and the old one never returns. The view's first member (by address, here: no ranks) writes
    the group file: when it is the one killed, the next one takes over, although the view it writes then has
    the members of a view it wrote itself before."""
    first, middle, last = free_ports(3)
    port = first if killed == "the file's writer" else last
    file = tmp_path / "group.json"
    servers = [ServerProcess.start(group_config(file, "self", port=middle), tmp_path, name="m0", env=server_env())]
    servers += [ServerProcess.start(group_config(file, "join", port=last if port == first else first), tmp_path,
                                    name="m1", env=server_env())]  # fmt: skip
    servers += [ServerProcess.start(group_config(file, "join", port=port), tmp_path, name="m2", env=server_env())]
    try:
        async with Engine(None) as engine, GroupHandle.from_group_file(engine, file) as handle:
            survivor = servers[0].address
            view = await wait_for_view(engine, survivor, lambda v: len(v["members"]) == 3, 15.0, "3 members")
            old_id = next(m["member_id"] for m in view["members"] if m["address"] == servers[2].address)
            stats = await engine.call(survivor, "stats", None, provider_id=GROUP_ID)
            bound = stats["detection_bound_seconds"] * (1 + stats["awareness"])
            servers[2].kill()
            view = await wait_for_view(engine, survivor, lambda v: len(v["members"]) == 2, bound + 5.0,
                                       "the killed member's removal")  # fmt: skip
            assert servers[2].address not in addresses(view)
            # the file follows, and the client handle stops sending to the member that left
            await wait_file(file, lambda g: len(g.members) == 2, 10.0)
            await asyncio.wait_for(wait_handle(handle, lambda h: len(h.members) == 2), 40.0)
            assert servers[2].address not in {m["address"] for m in handle.members}
            with pytest.raises(GroupError, match="not in the group's view"):
                await handle.call(servers[2].address, "view", provider_id=GROUP_ID)
            assert (await handle.call(survivor, "view", provider_id=GROUP_ID))["version"] == view["version"]
            # back at the same address: a new member
            servers[2] = ServerProcess.start(
                group_config(file, "join", port=port), tmp_path, name="m2b", env=server_env()
            )
            view = await wait_for_view(engine, survivor, lambda v: len(v["members"]) == 3, 15.0, "the new member")
            new_id = next(m["member_id"] for m in view["members"] if m["address"] == servers[2].address)
            assert new_id != old_id
            assert old_id not in {m["member_id"] for m in view["members"]}
    finally:
        stop_all(servers)


@uvloop_test
async def test_a_stopped_member_leaves_the_view_and_rejoins_when_it_resumes(tmp_path: Path) -> None:
    """SIGSTOP: it answers nothing and is removed; SIGCONT: it learns it was declared dead (a reconnection brings
    it the news), refutes at a higher incarnation and is back, with the same member id."""
    _, servers = start_group(tmp_path, 3)
    try:
        async with Engine(None) as engine:
            survivor = servers[0].address
            view = await wait_for_view(engine, survivor, lambda v: len(v["members"]) == 3, 15.0, "3 members")
            stopped = servers[1]
            stopped_id = next(m["member_id"] for m in view["members"] if m["address"] == stopped.address)
            stats = await engine.call(survivor, "stats", None, provider_id=GROUP_ID)
            bound = stats["detection_bound_seconds"] * (1 + stats["awareness"])
            os.kill(stopped.pid, signal.SIGSTOP)
            await wait_for_view(engine, survivor, lambda v: stopped.address not in addresses(v), bound + 5.0,
                                "the stopped member's removal")  # fmt: skip
            os.kill(stopped.pid, signal.SIGCONT)
            view = await wait_for_view(engine, survivor, lambda v: stopped.address in addresses(v), 30.0,
                                       "the resumed member's return")  # fmt: skip
            assert stopped_id in {m["member_id"] for m in view["members"]}
            stats = await engine.call(stopped.address, "stats", None, provider_id=GROUP_ID)
            assert stats["refutations"] >= 1 and stats["incarnation"] >= 1
    finally:
        stop_all(servers)


@uvloop_test
async def test_a_member_stopped_cleanly_leaves_at_once(tmp_path: Path) -> None:
    """SIGTERM: the member tells the others before its engine drains (Provider.before_close): removed as "left",
    nobody had to detect a failure."""
    _, servers = start_group(tmp_path, 3, suspicion_timeout_ms=60_000)
    try:
        async with Engine(None) as engine:
            survivor = servers[0].address
            await wait_for_view(engine, survivor, lambda v: len(v["members"]) == 3, 15.0, "3 members")
            assert servers[2].stop() == 0
            # a failure would take a minute of suspicion here: the leave is what removes it
            await wait_for_view(engine, survivor, lambda v: len(v["members"]) == 2, 10.0, "the leave")
            stats = await engine.call(survivor, "stats", None, provider_id=GROUP_ID)
            assert stats["deaths"] == 0 and stats["members"]["left"] == 1
    finally:
        stop_all(servers)


async def wait_file(file: Path, predicate: Callable[[Any], bool], within: float) -> None:
    """Until the group file satisfies ``predicate``; fails after ``within`` seconds with what the file said."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            if predicate(read_group_file(file)):
                return
        except GroupError:
            pass
        if loop.time() > deadline:
            pytest.fail(f"the group file did not follow within {within:g} s: {read_group_document(file)}")
        await asyncio.sleep(0.05)  # bounded polling: another process writes the file


async def wait_handle(handle: GroupHandle, predicate: Callable[[GroupHandle], bool]) -> None:
    while not predicate(handle):
        await handle.changed()


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports, in the order of their addresses as text (the order of a view without ranks)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return sorted((int(s.getsockname()[1]) for s in sockets), key=str)


# -- the command line -----------------------------------------------------------------------------------------------
def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "svcframe", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=env or server_env({"COLUMNS": "80"}))  # fmt: skip


def test_the_cli_views_watches_and_changes_the_group(tmp_path: Path) -> None:
    file, servers = start_group(tmp_path, 3)
    try:
        watch = subprocess.Popen(
            [sys.executable, "-m", "svcframe", "group", "watch", "-g", str(file), "--json", "--count", "3"],
            cwd=ROOT, env=server_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(line) for line in watch.stdout], daemon=True)  # type: ignore[union-attr]
        reader.start()

        def next_view() -> dict[str, Any]:
            try:
                return json.loads(lines.get(timeout=60))  # type: ignore[no-any-return]
            except queue.Empty:
                watch.kill()
                pytest.fail(f"svcframe group watch printed no view within 60 s: {watch.communicate()[1]}")

        everyone = {s.address for s in servers}
        first = next_view()  # the watch is connected before anything changes
        while addresses(first) != everyone:  # it may start before the last member joined
            first = next_view()
        out = cli("group", "view", "-g", str(file), "--json")
        assert out.returncode == 0, out.stderr
        view = json.loads(out.stdout)
        assert "source" in view and view["version"] >= 1
        table = cli("group", "view", "-g", str(file))
        assert table.returncode == 0 and all(len(line) <= 80 for line in table.stdout.splitlines()), table.stdout
        assert "member(s)" in table.stdout and "member id" in table.stdout
        leaving = first["source"]  # the member the watch asks leaves: it answers at once, then another takes over
        left = cli("group", "leave", leaving, "-g", str(file))
        assert left.returncode == 0 and "left the group" in left.stdout, left.stderr
        after_leave = next_view()
        assert addresses(after_leave) == everyone - {leaving}
        back = cli("group", "join", leaving, "-g", str(file), "--json")
        assert back.returncode == 0, back.stderr
        assert leaving in {m["address"] for m in json.loads(back.stdout)["members"]}
        after_join = next_view()
        assert addresses(after_join) == everyone
        assert after_join["version"] > after_leave["version"] > first["version"]
        assert watch.wait(timeout=60) == 0  # --count 3: the first view and the two changes
        reader.join()
        # a user error is one line: no group provider at that id
        bad = cli("group", "view", servers[0].address, "--provider-id", "7")
        assert bad.returncode != 0 and "Traceback" not in bad.stderr
        assert len([line for line in bad.stderr.splitlines() if line.strip()]) == 1, bad.stderr
    finally:
        if watch.poll() is None:
            watch.kill()
        watch.communicate()
        stop_all(servers)


def test_leave_for_another_removes_a_member_that_does_not_answer(tmp_path: Path) -> None:
    file, servers = start_group(tmp_path, 3, suspicion_timeout_ms=60_000)
    try:

        async def members() -> int:
            async with Engine(None) as engine:
                view = await wait_for_view(engine, servers[0].address, lambda v: len(v["members"]) == 3, 15.0, "3")
                return len(view["members"])

        assert asyncio.run(members()) == 3
        os.kill(servers[2].pid, signal.SIGSTOP)  # a minute before the others would decide alone
        out = cli("group", "leave", servers[2].address, "-g", str(file), "--timeout-seconds", "2")
        assert out.returncode == 0, out.stderr
        assert "removed from the group by" in out.stdout
        view = json.loads(cli("group", "view", servers[0].address, "-p", str(GROUP_ID), "--json").stdout)
        assert servers[2].address not in addresses(view)
    finally:
        stop_all(servers)


# -- configs ------------------------------------------------------------------------------------------------------
def test_flock_configs_are_accepted_as_they_are(tmp_path: Path) -> None:
    """Flock's type, its library name and its swim and centralized keys (Mochi's bedrock-config-swim.json)."""
    file = tmp_path / "mygroup.flock"
    flock = {
        "libraries": ["libflock-bedrock-module.so"],
        "providers": [{"type": "flock", "name": "my_flock_provider", "provider_id": GROUP_ID, "config": {
            "bootstrap": "self", "file": str(file),
            "group": {"type": "swim", "config": {"protocol_period_ms": 1000, "ping_timeout_ms": 200,
                                                 "ping_req_timeout_ms": 500, "ping_req_members": 3,
                                                 "suspicion_timeout_ms": 5000}}}}],
    }  # fmt: skip
    path = tmp_path / "flock.json"
    path.write_text(json.dumps(flock))
    check = cli("config", "check", str(path))
    assert check.returncode == 0, check.stderr
    centralized = json.loads(json.dumps(flock))
    centralized["providers"][0]["config"]["group"] = {"type": "centralized", "config": {
        "ping_interval_ms": [500, 1500], "ping_timeout_ms": 300, "ping_max_num_timeouts": 3}}  # fmt: skip
    settings = GroupProvider.Config.model_validate(centralized["providers"][0]["config"]).group.config
    assert settings.protocol_period_ms == 1000 and settings.ping_timeout_ms == 300
    with ServerProcess.start(flock, tmp_path, name="flock", env=server_env()) as server:

        async def view() -> dict[str, Any]:
            async with Engine(None) as engine:
                return await view_of(engine, server.address)

        assert [m["address"] for m in asyncio.run(view())["members"]] == [server.address]
        assert read_group_file(file).members[0].address == server.address


def test_config_errors_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"providers": [{"name": "g", "type": "group", "config": {
        "group": {"config": {"protocol_period_msec": 5}}}}]}))  # fmt: skip
    out = cli("config", "check", str(path))
    assert out.returncode != 0 and "protocol_period_msec" in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(ConfigError, match=r"config: bootstrap\[0\]: .*'self', 'file', 'join' or 'mpi'"):
        GroupProvider.validate_config({"bootstrap": "gossip"}, ConfigContext(GROUP_ID, "g", EngineConfig()))


def test_without_a_shared_secret_a_member_refuses_to_start(tmp_path: Path) -> None:
    config = group_config(tmp_path / "g.json", "self")
    with pytest.raises(AssertionError, match="no shared secret"):
        ServerProcess.start(config, tmp_path, name="nosecret", env=server_env(secret=False))
    config["providers"][0]["config"]["require_authentication"] = False  # a trusted machine: the user's choice
    with ServerProcess.start(config, tmp_path, name="trusted", env=server_env(secret=False)) as server:
        assert server.alive()


# -- svcframe launch ----------------------------------------------------------------------------------------------
def test_launch_reports_a_killed_rank_in_its_output_exit_status_and_the_view(tmp_path: Path) -> None:
    """configs/group.json under `svcframe launch`: each server knows its rank and the group file (from the
    launcher), the group keeps the file; kill -9 of rank 1 is reported at once, removed from the group's view at
    once (the launcher tells a live member), the file keeps the group's entries of the others, and the launcher
    exits with status 1 naming the rank."""
    group = tmp_path / "g.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "svcframe", "launch", str(ROOT / "configs" / "group.json"), "--procs", "3",
         "--group-file", str(group)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=server_env(), cwd=tmp_path,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline()
        assert "3 server(s) ready" in line, line + proc.stderr.read()
        launched = read_group_file(group).members

        async def ranked_view() -> dict[str, Any]:
            async with Engine(None) as engine:
                return await wait_for_view(engine, launched[0].address, lambda v: [m.get("rank") for m in
                                           v["members"]] == [0, 1, 2], 15.0, "ranks 0-2", provider_id=10)  # fmt: skip

        view = asyncio.run(ranked_view())
        assert [m["pid"] for m in view["members"]] == [m.pid for m in launched]
        os.kill(launched[1].pid, signal.SIGKILL)
        while "killed" not in (line := proc.stderr.readline()):
            assert line, "the launcher ended without reporting the killed rank"
        assert f"rank 1 (pid {launched[1].pid}) killed by SIGKILL" in line
        assert f"removed from the group's view (version {view['version'] + 1})" in line

        def group_entries_of_the_live() -> bool:  # (the launcher and the group provider both write the file)
            after = json.loads(group.read_text())
            return [m["rank"] for m in after["members"]] == [0, 2] and all(
                "member_id" in m and "group_provider_id" in m for m in after["members"]
            )  # the group's entries

        poll_until(group_entries_of_the_live, what="the group file of ranks 0 and 2, with the group's entries")
        after = json.loads(group.read_text())
        assert after["metadata"]["departed"][0]["rank"] == 1
        out = cli("group", "view", "-g", str(group), "--json")
        assert [m["rank"] for m in json.loads(out.stdout)["members"]] == [0, 2], out.stderr
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert "rank 1 killed by SIGKILL" in err
    assert not group.exists()
