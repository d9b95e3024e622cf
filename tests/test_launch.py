"""Launching server processes: readiness, group file, clean stop, clear failure reasons."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import alive_pids, poll_until, readme_quickstart

from svcframe.admin import ServiceHandle
from svcframe.config import parse_config
from svcframe.engine import Engine
from svcframe.group import read_group_file
from svcframe.launch import Launch, LaunchError
from svcframe.loops import run

SELFTEST = {"libraries": ["selftest.provider"], "providers": [{"name": "st", "type": "selftest", "provider_id": 1}]}


def _status(address: str) -> dict:
    async def go() -> dict:
        async with Engine(None) as engine:
            return await ServiceHandle(engine, address).status()

    return run(go())


def test_launch_three_servers_group_file_and_clean_stop(tmp_path) -> None:
    group = tmp_path / "group.json"
    job = Launch(parse_config(SELFTEST), 3, group_file=group)
    members = job.start()
    try:
        assert [m.rank for m in members] == [0, 1, 2]
        assert len({m.address for m in members}) == 3
        assert read_group_file(group).members == members
        for m in members:
            status = _status(m.address)
            assert status["pid"] == m.pid
            assert status["providers"] == [{"name": "st", "type": "selftest", "provider_id": 1}]
    finally:
        codes = job.stop()
    assert codes == {0: 0, 1: 0, 2: 0}
    assert not group.exists()


def test_launch_unix_addresses_per_rank(tmp_path) -> None:
    import tempfile

    d = tempfile.mkdtemp(prefix="sf", dir="/tmp")
    cfg = parse_config({**SELFTEST, "engine": {"address": f"unix://{d}/s.sock"}})
    with Launch(cfg, 2) as job:
        assert [m.address for m in job.members] == [f"unix://{d}/s.sock.0", f"unix://{d}/s.sock.1"]
        assert _status(job.members[1].address)["address"] == f"unix://{d}/s.sock.1"


def test_launch_failure_names_rank_and_reason(tmp_path) -> None:
    cfg = parse_config({"libraries": ["no_such_module_xyz"]})
    with pytest.raises(
        LaunchError,
        match=r"rank \d failed to start: .*: libraries\[0\]: library 'no_such_module_xyz' cannot be imported",
    ):
        Launch(cfg, 2, group_file=tmp_path / "g.json").start()
    assert not (tmp_path / "g.json").exists()


def test_launch_failure_when_port_taken(tmp_path) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        cfg = parse_config({"engine": {"address": f"tcp://127.0.0.1:{port}"}})
        with pytest.raises(LaunchError, match="cannot listen"):
            Launch(cfg, 1).start()
    finally:
        s.close()


def test_cli_launch_stops_all_on_sigterm(tmp_path) -> None:
    cfg = tmp_path / "svc.json"
    cfg.write_text(json.dumps(SELFTEST))
    group = tmp_path / "g.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "svcframe", "launch", str(cfg), "--procs", "2", "--group-file", str(group)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The launcher prints its readiness line only after the group file is written.
        line = proc.stderr.readline()
        assert "2 server(s) ready" in line, line
        members = read_group_file(group).members
        pids = [m.pid for m in members]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "all servers stopped cleanly" in err
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_admin_shutdown_exits_zero(tmp_path) -> None:
    job = Launch(parse_config(SELFTEST), 1)
    (member,) = job.start()

    async def go() -> None:
        async with Engine(None) as engine:
            await ServiceHandle(engine, member.address).shutdown()

    run(go())
    assert job.wait(15) == {0: 0}
    job.stop()


def test_servers_outlive_the_thread_that_launched_them(tmp_path) -> None:
    """PR_SET_PDEATHSIG fires when the launching *thread* exits; the lifeline pipe only when the process
    does: servers started from a short-lived thread keep serving."""
    import threading

    job = Launch(parse_config(SELFTEST), 1)
    starter = threading.Thread(target=job.start)
    starter.start()
    starter.join()
    try:
        assert job.members and job.poll() == {}
        assert _status(job.members[0].address)["pid"] == job.members[0].pid  # still serving
    finally:
        assert job.stop() == {0: 0}


def test_servers_exit_when_the_launcher_is_killed(tmp_path) -> None:
    """kill -9 of `svcframe launch`: its lifeline pipe closes and every server shuts down by itself."""
    cfg = tmp_path / "svc.json"
    cfg.write_text(json.dumps(SELFTEST))
    group = tmp_path / "g.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "svcframe", "launch", str(cfg), "--procs", "2", "--group-file", str(group)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert "2 server(s) ready" in proc.stderr.readline()
        pids = [m.pid for m in read_group_file(group).members]
        proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    poll_until(lambda: not alive_pids(pids), within=15.0, what="the servers to exit after their launcher's kill -9")


def test_a_clean_launch_leaves_no_work_directory(tmp_path: Path) -> None:
    """Every launch left /tmp/svcframe-launch-* behind; now only a failed one keeps its logs."""
    from svcframe.config import parse_config
    from svcframe.launch import Launch

    with Launch(parse_config({"providers": []}), 1, group_file=tmp_path / "g.json") as job:
        workdir = job.workdir
        assert (workdir / "rank-0.log").exists()
    assert not workdir.exists()


def test_serve_imports_libraries_from_the_current_directory(tmp_path: Path) -> None:
    """The README's quick start (counter.py beside counter.json) failed with `svcframe serve`."""
    code, config = readme_quickstart()
    (tmp_path / "counter.py").write_text(code)
    (tmp_path / "counter.json").write_text(config)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server = subprocess.Popen(
        [sys.executable, "-m", "svcframe", "serve", "counter.json"], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        ready = json.loads(server.stdout.readline() or "{}")
        assert ready.get("ok") is True, server.stderr.read() if server.stderr else ready
        done = subprocess.run(
            [sys.executable, "-m", "svcframe", "call", ready["address"], "add", "5", "-p", "1"],
            capture_output=True, text=True, timeout=30, env=env,
        )  # fmt: skip
        assert done.returncode == 0 and json.loads(done.stdout) == 5, done.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=30)


def _launch_cli(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    cfg = tmp_path / "svc.json"
    cfg.write_text(json.dumps(SELFTEST))
    group = tmp_path / "g.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "svcframe", "launch", str(cfg), "--procs", "3", "--group-file", str(group), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()  # printed once the group file is written
    assert "3 server(s) ready" in line, line + proc.stderr.read()
    return proc, group


def test_a_killed_server_is_reported_and_leaves_the_group_file(tmp_path: Path) -> None:
    """kill -9 of one server under `svcframe launch`: the launcher says which rank died and how at once,
    writes the group file again with the live members only (the dead one in metadata.departed), serves on
    with the others, and exits with status 1 naming the rank when it is stopped."""
    proc, group = _launch_cli(tmp_path)
    assert proc.stderr is not None
    try:
        members = read_group_file(group).members
        victim = members[1]
        os.kill(victim.pid, signal.SIGKILL)
        while "killed" not in (line := proc.stderr.readline()):
            assert line, "the launcher ended without reporting the killed rank"
        assert f"rank 1 (pid {victim.pid}) killed by SIGKILL; 2 of 3 server(s) left" in line
        after = read_group_file(group)  # rewritten before the line was printed
        assert [m.rank for m in after.members] == [0, 2]
        assert [(d["rank"], d["pid"], d["status"]) for d in after.metadata["departed"]] == [
            (1, victim.pid, "killed by SIGKILL")
        ]
        assert _status(members[2].address)["pid"] == members[2].pid  # the others serve on
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert "svcframe: error: rank 1 killed by SIGKILL; logs kept in" in err
    assert not group.exists()


def test_kill_on_bad_exit_stops_every_server(tmp_path: Path) -> None:
    """--kill-on-bad-exit (srun -K): the first server that dies of a signal or an error stops the rest, and the
    launcher exits with status 1 by itself."""
    proc, group = _launch_cli(tmp_path, "--kill-on-bad-exit")
    try:
        pids = [m.pid for m in read_group_file(group).members]
        os.kill(pids[2], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert "rank 2" in err and "stopping the others (--kill-on-bad-exit)" in err
    assert not alive_pids(pids) and not group.exists()
