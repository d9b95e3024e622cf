"""The command line's conventions, run as a user runs them (``python -m svcframe ...`` in a pipe, real server
processes): group files (svcframe's and Mochi Flock's), ``-g`` that always reads, ``$SVCFRAME_GROUP``,
``--ranks``, one-line user errors, plugins from the ``svcframe.cli`` entry points, and choices that come from
the registries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from selftest import SELFTEST_CONFIG
from svcframe.config import parse_config
from svcframe.group import Member
from svcframe.launch import Launch

# the commands' conventions: our logic, not the Python version's (CI's first interpreter only)
pytestmark = pytest.mark.one_interpreter


ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``svcframe ARGS`` in a pipe; ``env`` is added to this process's environment (None values unset)."""
    full = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.run(
        [sys.executable, "-m", "svcframe", *args], capture_output=True, text=True, cwd=cwd, env=full, timeout=60
    )


def ok_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def one_clear_line(proc: subprocess.CompletedProcess[str]) -> str:
    """A user error: a non-zero exit and one line on stderr, ``svcframe: error: ...``, no traceback."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("svcframe: error: "), proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def servers() -> Iterator[list[Member]]:
    """Three servers, each with a kv provider (provider id 1) and no group file of their own."""
    cfg = {
        "libraries": ["providers.kv"],
        "providers": [{"name": "store", "type": "kv", "config": {"path": ":memory:"}}],
    }
    with Launch(parse_config(cfg), 3) as job:
        yield job.members


@pytest.fixture
def flock_file(servers: list[Member], tmp_path: Path) -> Path:
    """The servers in a Mochi Flock group file: no rank (rank = index), Flock's own metadata."""
    path = tmp_path / "quintain.flock.json"
    members = [{"address": m.address, "provider_id": 0} for m in servers]
    path.write_text(json.dumps({"members": members, "metadata": {"__config__": "{}", "__type__": "static"}}))
    return path


def test_a_flock_group_file_is_a_group(servers: list[Member], flock_file: Path) -> None:
    everyone = ok_json(cli("status", "-g", str(flock_file)))
    assert list(everyone) == [m.address for m in servers]
    assert [s["pid"] for s in everyone.values()] == [m.pid for m in servers]
    picked = ok_json(cli("status", "-g", str(flock_file), "--ranks", "0,2"))
    assert list(picked) == [servers[0].address, servers[2].address]
    assert ok_json(cli("call", "-g", str(flock_file), "--rank", "2", "count", "-p", "1")) == 0


def test_ranks_select_members_on_every_group_verb(servers: list[Member], flock_file: Path, tmp_path: Path) -> None:
    g = ["-g", str(flock_file)]
    assert list(ok_json(cli("config", "query", *g, "--ranks", "1-2", "engine.progress_mode"))) == [
        servers[1].address,
        servers[2].address,
    ]
    assert list(ok_json(cli("provider", "list", *g, "--ranks", "1"))) == [servers[1].address]
    added = ok_json(
        cli("provider", "add", *g, "--ranks", "0-1", '{"name": "extra", "type": "kv", "config": {"path": ":memory:"}}')
    )
    assert added == {servers[0].address: 2, servers[1].address: 2}
    assert ok_json(cli("provider", "lookup", *g, "extra")) == {
        servers[0].address: {"name": "extra", "type": "kv", "provider_id": 2},
        servers[1].address: {"name": "extra", "type": "kv", "provider_id": 2},
        servers[2].address: None,
    }
    assert ok_json(cli("provider", "remove", *g, "--ranks", "0,1", "extra")) == dict.fromkeys(
        [servers[0].address, servers[1].address]
    )
    stats = ok_json(cli("stats", "dump", *g, "--ranks", "2"))
    assert list(stats) == [servers[2].address]
    out = tmp_path / "storage.json"  # the self-test's storage workload, on rank 1 only
    proc = cli("selftest", "run", *g, "--ranks", "1", "--workload", "storage", "--storage-block-size", "4096",
               "--duration-seconds", "0.2", "--warmup-iterations", "2", "-o", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert results["parameters"]["workload"] == "storage" and results["aggregate"]["ops"] > 0
    assert f"added a self-test provider (id 2) to {servers[1].address}" in proc.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--ranks", "3-1"], "Invalid value for '--ranks': '3-1': expected ranks and ranges such as 0-3,5"),
        (["--ranks", "x"], "expected ranks and ranges such as 0-3,5"),
        (["--ranks", "1,7"], "no rank 7 (ranks: 0, 1, 2)"),
    ],
)
def test_bad_ranks_are_one_line(flock_file: Path, args: list[str], expected: str) -> None:
    assert expected in one_clear_line(cli("status", "-g", str(flock_file), *args))


def test_ranks_need_a_group(servers: list[Member]) -> None:
    line = one_clear_line(cli("status", servers[0].address, "--ranks", "0", env={"SVCFRAME_GROUP": None}))
    assert "--ranks selects members of a group file" in line


def test_g_twice_is_an_error_not_the_last_one(flock_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(flock_file.read_text())
    line = one_clear_line(cli("status", "-g", str(flock_file), "-g", str(other)))
    assert "given 2 times" in line and str(other) in line and str(flock_file) in line
    assert "given 2 times" in one_clear_line(cli("call", "-g", str(other), "--group", str(other), "count"))


def test_g_reads_launch_and_serve_write_with_group_file(tmp_path: Path) -> None:
    for verb in ("launch", "serve"):
        line = one_clear_line(cli(verb, str(SELFTEST_CONFIG), "-g", str(tmp_path / "g.json")))
        assert f"{verb} writes its group file with --group-file FILE" in line
    assert not (tmp_path / "g.json").exists()


def test_svcframe_group_is_the_default_target(tmp_path: Path) -> None:
    """launch writes $SVCFRAME_GROUP; status, call and shutdown read it when given no address and no -g."""
    env = {"SVCFRAME_GROUP": str(tmp_path / "group.json")}
    config = tmp_path / "kv.json"
    config.write_text(
        json.dumps(
            {"libraries": ["providers.kv"], "providers": [{"name": "s", "type": "kv", "config": {"path": ":memory:"}}]}
        )
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "svcframe", "launch", str(config), "--procs", "2"],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
    )  # fmt: skip
    try:
        ready = launcher.stderr.readline()  # type: ignore[union-attr]
        assert f"2 server(s) ready; group file {tmp_path / 'group.json'}" in ready, ready
        statuses = ok_json(cli("status", env=env))
        assert [s["pid"] for s in statuses.values()] == [
            m["pid"] for m in json.loads((tmp_path / "group.json").read_text())["members"]
        ]
        first = next(iter(statuses))
        assert list(ok_json(cli("status", first, env=env))) == [first]  # an address wins over the default
        assert ok_json(cli("call", "put", '{"key": "k"}', "--bytes", "value=base64:aGk=", "-p", "1", env=env)) is None
        assert ok_json(cli("call", first, "get", '{"key": "k"}', "-p", "1", env=env)) == "hi"  # rank 0 by default
        assert ok_json(cli("shutdown", env=env)) == dict.fromkeys(statuses)
        assert launcher.wait(timeout=30) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        launcher.stderr.close()  # type: ignore[union-attr]
    line = one_clear_line(cli("status", env={"SVCFRAME_GROUP": None}))
    assert line == "svcframe: error: give at least one ADDRESS or -g/--group FILE (or set SVCFRAME_GROUP)"
    line = one_clear_line(cli("call", "count", env={"SVCFRAME_GROUP": None}))
    assert "give -g/--group FILE (or set SVCFRAME_GROUP)" in line


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read: No such file or directory"),
        ("{not json", "not JSON"),
        ('{"nodes": []}', "not a group file (expected {\"members\": [{\"address\": ..., \"provider_id\": ...}, ...]})"),
        ('{"members": []}', "members: List should have at least 1 item"),
        ('{"members": [{"provider_id": 0}]}', "members[0].address: Field required"),
        ('{"members": [{"address": "tcp://h:1", "provider_id": 65536}]}', "members[0].provider_id"),
        ('{"members": [{"address": "tcp://h:1", "rank": 0}, {"address": "tcp://h:2", "rank": 0}]}', "two members have rank 0"),
    ],
)  # fmt: skip
def test_a_bad_group_file_is_one_line_naming_it(tmp_path: Path, content: str | None, expected: str) -> None:
    path = tmp_path / "g.json"
    if content is not None:
        path.write_text(content)
    for args in (("status", "-g", str(path)), ("call", "-g", str(path), "count"), ("shutdown",)):
        line = one_clear_line(cli(*args, env={"SVCFRAME_GROUP": str(path)}))
        assert line.startswith(f"svcframe: error: group file {path}: ") and expected in line, line


def test_click_usage_errors_are_one_line() -> None:
    for group in ([], ["config"]):  # a group given no command shows its help, whole
        shown = cli(*group)
        assert "Usage: svcframe" in shown.stdout + shown.stderr and "Commands:" in shown.stdout + shown.stderr
    assert "No such option '--bogus'" in one_clear_line(cli("status", "--bogus"))
    assert "No such command 'statu'" in one_clear_line(cli("statu"))
    assert "Missing argument 'CONFIG'" in one_clear_line(cli("launch"))
    assert "'noop-rpc' is not one of" in one_clear_line(cli("selftest", "run", "--workload", "noop-rpc"))


# -- plugins ------------------------------------------------------------------------------------------------------
PLUGIN = '''
import click

@click.command()
@click.argument("name")
def hello(name):
    """Say hello (a plugin)."""
    click.echo(f"hello {name}")

not_a_command = 42
'''


@pytest.fixture
def plugins(tmp_path: Path) -> dict[str, str]:
    """A directory on PYTHONPATH with a module and a distribution declaring four ``svcframe.cli`` plugins:
    one that works, one whose module does not import, one that is not a click command, one with a built-in's
    name."""
    (tmp_path / "hello_plugin.py").write_text(PLUGIN)
    info = tmp_path / "svcframe_test_plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: svcframe-test-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[svcframe.cli]\nhello = hello_plugin:hello\nbroken = no_such_module_xyz:cli\n"
        "number = hello_plugin:not_a_command\nstatus = hello_plugin:hello\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


def test_plugins_join_the_command_line(plugins: dict[str, str]) -> None:
    assert cli("hello", "world", env=plugins).stdout == "hello world\n"
    helped = cli("--help", env=plugins)
    assert helped.returncode == 0
    listed = [line.split()[0] for line in helped.stdout.split("Commands:")[1].splitlines() if line.strip()]
    for name in ("hello", "status", "serve", "selftest", "roofline", "history", "report", "bench"):
        assert name in listed
    assert "broken" not in listed and "number" not in listed
    warnings = sorted(helped.stderr.splitlines())
    assert len(warnings) == 3, helped.stderr
    assert warnings[0].startswith("svcframe: warning: plugin 'broken' (no_such_module_xyz:cli) cannot be loaded: ")
    assert "ModuleNotFoundError: No module named 'no_such_module_xyz'" in warnings[0]
    assert (
        warnings[1] == "svcframe: warning: plugin 'number' (hello_plugin:not_a_command) is a int, not a click command"
    )
    assert (
        warnings[2] == "svcframe: warning: plugin 'status' (hello_plugin:hello) ignored: svcframe has that command name"
    )


def test_a_broken_plugin_breaks_nothing_else(plugins: dict[str, str], servers: list[Member]) -> None:
    line = one_clear_line(cli("broken", "--anything", env=plugins))
    assert "plugin 'broken' (no_such_module_xyz:cli) cannot be loaded: ModuleNotFoundError" in line
    status = cli("status", servers[0].address, env=plugins)  # the built-in wins; no plugin is even imported
    assert status.returncode == 0 and status.stderr == "", status.stderr
    assert list(json.loads(status.stdout)) == [servers[0].address]


# -- the registries are the one source of names -------------------------------------------------------------------
def test_choices_and_schema_enums_come_from_the_registries() -> None:
    import click

    from selftest.cli.workloads import selftest
    from selftest.driver import WORKLOADS
    from selftest.provider import DIRECTIONS, STORAGE_OPS
    from svcframe.composition import service_schema
    from svcframe.errors import ConfigError
    from svcframe.loops import EVENT_LOOPS
    from svcframe.plumber import BUCKET_POLICIES, NIC_POLICIES
    from svcframe.progress import PROGRESS_MODES

    run = selftest.commands["run"]
    choices = {p.name: list(p.type.choices) for p in run.params if isinstance(p.type, click.Choice)}
    assert choices == {
        "workload": list(WORKLOADS), "bulk_direction": list(DIRECTIONS), "storage_op": list(STORAGE_OPS),
        "progress_mode": list(PROGRESS_MODES), "event_loop": list(EVENT_LOOPS),
    }  # fmt: skip
    assert "storage" in WORKLOADS  # the CLI offered noop|bulk while the model had storage too
    defs = service_schema(())["$defs"]
    assert defs["EngineConfig"]["properties"]["progress_mode"]["enum"] == list(PROGRESS_MODES)
    assert defs["EngineConfig"]["properties"]["event_loop"]["enum"] == list(EVENT_LOOPS)
    assert defs["PlumberConfig"]["properties"]["bucket_policy"]["enum"] == list(BUCKET_POLICIES)
    assert defs["PlumberConfig"]["properties"]["nic_policy"]["enum"] == list(NIC_POLICIES)
    with pytest.raises(ConfigError, match=r"engine\.progress_mode: Input should be 'block'") as info:
        parse_config({"engine": {"progress_mode": "sometimes"}})
    assert all(repr(mode) in str(info.value) for mode in PROGRESS_MODES)
