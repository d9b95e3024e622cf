"""Output that reads well in a pipe, in an 80-column terminal and in a log file, and plots that state their
parameters, checked as a user runs the commands (``python -m svcframe ...`` in a
pipe, or under a pseudo-terminal 80 columns wide) against real server processes:

* every command of the click tree (plugins included, so a new command is covered without a change here),
  given bad input in a pipe (a bad option value, a missing file, a malformed file, a wrong address, a path it
  cannot write), exits non-zero with exactly one line on stderr that names the problem;
* figures in one notation (``svcframe.units``); tables never cut in a pipe (one row per line) or in 80
  columns (no line wider, no ``…``, no value folded mid-token); ``--json`` beside them; progress lines on
  stderr when it is not a terminal;
* plots read back from the matplotlib Figures the code builds: storage parameters, bulk size and direction,
  a ceiling below its own samples, one run's history on an hour, not years.

Also checked elsewhere, where a real run already happens: ``roofline collect`` (summary, ``--json``, progress
lines) and ``history`` in tests/test_store.py, ``nic-dispersion`` in tests/test_plumber.py, bursts in
tests/test_bursts.py.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import pytest

from selftest import SELFTEST_CONFIG
from svcframe.cli import main
from svcframe.config import parse_config
from svcframe.launch import Launch
from svcframe.units import quantity, quantity_range

# the commands' text: our logic, not the Python version's (CI's first interpreter only)
pytestmark = pytest.mark.one_interpreter


ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "svcframe"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``svcframe ARGS`` in a pipe (stdout and stderr both pipes), without this session's group or secret."""
    full = {k: v for k, v in os.environ.items() if k not in ("SVCFRAME_GROUP", "COLUMNS")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env={**full, **(env or {})})


def on_terminal(*args: str, columns: int = 80) -> str:
    """``svcframe ARGS`` with stdout and stderr on a pseudo-terminal ``columns`` wide; the text it shows (colour
    and cursor codes removed)."""
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "SVCFRAME_GROUP"} | {"COLUMNS": str(columns), "TERM": "xterm"}
    proc = subprocess.Popen([*CLI, *args], stdout=follower, stderr=follower, stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the follower side closed: the command is done
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(leader)
    assert proc.wait(30) == 0, b"".join(chunks).decode(errors="replace")
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n").replace("\r", "\n")


def assert_fits(text: str, values: list[str], columns: int = 80) -> None:
    """Nothing wider than ``columns``, nothing cut with an ellipsis, and every value's words whole somewhere."""
    assert "…" not in text, text
    wide = [line for line in text.splitlines() if len(line) > columns]
    assert not wide, "\n".join(wide)
    words = set(text.split())
    missing = [w for v in values for w in v.split() if w not in words]
    assert not missing, f"cut or folded: {missing}\n{text}"


# -- one notation ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (8632, "ops/s", "8.63 k ops/s"), (17090, "ops/s", "17.1 k ops/s"), (512, "ops/s", "512 ops/s"),
        (0.278, "calls/s", "0.278 calls/s"), (999_700, "ops/s", "1.00 M ops/s"), (3.6, "GiB/s", "3.60 GiB/s"),
        (0.0123, "GiB/s", "12.6 MiB/s"), (2.5e9, "B/s", "2.33 GiB/s"), (4096, "B", "4 KiB"), (1 << 20, "B", "1 MiB"),
        (1100, "B", "1.07 KiB"), (24.3, "usec", "24.3 µs"), (1500, "usec", "1.50 ms"), (3600, "s", "3600 s"),
        (171.2, "usec/op", "171 µs/op"), (10, "msec", "10 ms"), (None, "ops/s", "-"), (0, "ops/s", "0 ops/s"),
    ],
)  # fmt: skip
def test_one_notation_for_figures(value: float | None, unit: str, text: str) -> None:
    assert quantity(value, unit) == text


def test_a_range_takes_one_prefix_and_a_single_repeat_one_value() -> None:
    assert quantity_range(8632, 17090, "ops/s") == "8.63-17.1 k ops/s"  # was 8632-1.709e+04 ops/s
    assert quantity_range(8564, 8564, "ops/s") == "8.56 k ops/s"  # was 8564-8564
    assert quantity_range(0.5, 0.9, "GiB/s") == "512-922 MiB/s"
    assert quantity_range(1.2, 3.6, "GiB/s") == "1.20-3.60 GiB/s"


# -- every command, bad input, one line -----------------------------------------------------------------------
MISSING = "/nonexistent-svcframe-dir/missing.json"
WRONG_ADDRESS = "tcp://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once
WRITTEN = {"output", "out", "group_file"}  # path parameters a command writes (the others it reads)


def leaf_commands() -> Iterator[tuple[list[str], click.Command]]:
    """Every command a user can run, from the click tree (a group that runs on its own counts too)."""

    def walk(cmd: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
        if isinstance(cmd, click.Group):
            if cmd.invoke_without_command:
                yield path, cmd
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None, f"{' '.join([*path, name])} cannot be loaded"
                yield from walk(sub, [*path, name])
        else:
            yield path, cmd

    yield from walk(main, [])


def bad_inputs(path: list[str], cmd: click.Command, tmp: Path) -> list[tuple[str, list[str], str]]:
    """``(kind, argv, what the error line must name)`` for one command, from its parameters: a bad value for
    its first number or choice option; a missing and a malformed file for the first file it reads (only a
    missing one for -g, whose errors tests/test_cli_conventions.py checks in full); a path it cannot write;
    an address nothing listens on. Required arguments get a filler."""
    params = [p for p in cmd.params if p.name != "help"]
    names = {p.name for p in params}
    filler = ["{}" for p in params if isinstance(p, click.Argument) and p.required]
    flag = {id(p): max(p.opts, key=len) for p in params}
    found: list[tuple[str, list[str], str]] = []
    options = [p for p in params if isinstance(p, click.Option)]
    numbers = [p for p in options if isinstance(p.type, click.types._NumberParamTypeBase)]
    choices = [p for p in options if isinstance(p.type, click.Choice)]
    if numbers:
        found.append(("bad value", [*path, flag[id(numbers[0])], "x1", *filler], flag[id(numbers[0])]))
    elif choices:
        found.append(("bad value", [*path, flag[id(choices[0])], "bogus", *filler], flag[id(choices[0])]))
    files = [p for p in params if isinstance(p.type, click.Path)]
    read = [p for p in files if p.name not in WRITTEN]
    if read:
        p = read[0]
        kinds = [("missing file", MISSING), ("malformed file", str(tmp / "malformed.json"))]
        for kind, value in kinds[: 1 if p.name == "group" else 2]:
            argv = [*path, flag[id(p)], value, *filler] if isinstance(p, click.Option) else [*path, value, *filler[1:]]
            found.append((kind, argv, value))
    written = [p for p in files if p.name in WRITTEN and isinstance(p, click.Option)]
    if written:  # under a regular file: no directory can be made there
        value = str(tmp / "malformed.json" / "out")
        found.append(("unwritable path", [*path, flag[id(written[0])], value, *filler], value))
    address = names & {"address", "args", "words"}
    if address:
        rest = {"words": ["count"], "args": ["{}"], "address": []}[address.pop()]
        found.append(("wrong address", [*path, WRONG_ADDRESS, *rest], "127.0.0.1:9"))
    elif "target" in names:
        found.append(("wrong address", [*path, "--target", WRONG_ADDRESS], "127.0.0.1:9"))
    if not found:
        found.append(("bad option", [*path, "--no-such-option", *filler], "--no-such-option"))
    return found


def test_every_command_fails_on_bad_input_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "malformed.json").write_text("{not json")
    commands = list(leaf_commands())
    assert len(commands) >= 30 and ["roofline", "collect"] in [c for c, _ in commands]  # plugins are walked too
    cases = [case for path, cmd in commands for case in bad_inputs(path, cmd, tmp_path)]
    covered = {" ".join(argv[: len(path)]) for path, _ in commands for _, argv, _ in cases if argv[: len(path)] == path}
    assert covered >= {" ".join(path) for path, _ in commands}

    def run(case: tuple[str, list[str], str]) -> str | None:
        kind, argv, what = case
        if argv[0] == "wait" and "--timeout-seconds" not in argv:
            argv = [*argv, "--timeout-seconds", "0.5"]  # a missing group file is what it waits for (120 s)
        proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=90, cwd=tmp_path,
                              env={k: v for k, v in os.environ.items() if k not in ("SVCFRAME_GROUP", "SVCFRAME_SECRET")})  # fmt: skip
        lines = proc.stderr.splitlines()
        if proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr and what in lines[0]:
            return None
        return f"{kind}: svcframe {' '.join(argv)} -> exit {proc.returncode}, stderr:\n{proc.stderr[-1500:]}"

    with ThreadPoolExecutor(2) as pool:
        failures = [f for f in pool.map(run, cases) if f is not None]
    assert not failures, "\n\n".join(failures)
    assert not Path(MISSING).parent.exists()


# -- tables, JSON and progress against a real server ---------------------------------------------------------
@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """One server with the self-test provider (the shipped config), a shared secret in the environment."""
    config = parse_config(json.loads(SELFTEST_CONFIG.read_text()))
    with Launch(config, 1) as job:
        yield job.members[0].address


def test_selftest_run_and_monitor_in_a_pipe_and_in_80_columns(server: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    run = cli("selftest", "run", "-t", server, "--clients", "2", "--duration-seconds", "0.3", "-o", str(out))
    assert run.returncode == 0, run.stderr
    agg = json.loads(out.read_text())["aggregate"]
    first = run.stdout.splitlines()[0]
    assert first.startswith(f"noop: {quantity(agg['rate_ops_per_second'], 'ops/s')}, p50 "), first
    assert f"server CPU {quantity(agg['server_cpu_usec_per_op'], 'usec/op')}" in first and " us" not in first
    progress = run.stderr.splitlines()
    assert progress[0].startswith("selftest run: [1/1] noop: 2 client(s) x depth 1 on 1 server(s) for 300 ms, elapsed ")
    assert re.fullmatch(r"selftest run: done in \d:\d\d:\d\d", progress[-1]), run.stderr
    as_json = cli("selftest", "run", "-t", server, "--duration-seconds", "0.2", "-o", str(out), "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["kind"] == "svcframe-selftest"

    # monitor: one table per server, side and peer; in a pipe one row per line, in 80 columns every value whole
    (line,) = cli("monitor", server, "--count", "1", "--json").stdout.splitlines()
    (work,) = [r for r in json.loads(line)["rows"] if r["callpath"] == "work[1]" and r["side"] == "target"]
    piped = cli("monitor", server, "--count", "1").stdout
    assert f"{server} target, from {work['peer']}" in piped
    (row,) = [ln for ln in piped.splitlines() if ln.startswith("work[1] ")]
    assert f" {work['calls']:,} " in row and " µs" in row
    shown = on_terminal("monitor", server, "--count", "1")
    assert_fits(shown, [server, work["peer"], "work[1]", f"{work['calls']:,}", quantity(work["p50_usec"], "usec")])


def test_topology_in_a_pipe_and_in_80_columns() -> None:
    described = str(ROOT / "tests" / "data" / "aurora-like.json")
    doc = json.loads(cli("topology", "--from", described, "--policies", "--json").stdout)
    addresses = [", ".join(n["addresses"]) for n in doc["nics"] if n["addresses"]]
    assert addresses
    piped = cli("topology", "--from", described, "--policies").stdout
    lines = piped.splitlines()
    for nic in doc["nics"]:  # one row per NIC, its addresses whole on it (they wrapped mid-token)
        (row,) = [ln for ln in lines if ln.startswith(nic["name"] + " ")]
        assert (", ".join(nic["addresses"]) or "-") in row
    assert all(ln == ln.rstrip() for ln in lines)
    assert_fits(on_terminal("topology", "--from", described, "--policies"),
                [a for n in doc["nics"] for a in n["addresses"]] + [n["name"] for n in doc["nics"]])  # fmt: skip


# -- plots ----------------------------------------------------------------------------------------------------
def _texts(fig: Any) -> str:
    """Every text a Figure shows: suptitle, axes titles and labels, texts, legend entries."""
    found = [fig._suptitle.get_text()] if fig._suptitle is not None else []
    for ax in fig.axes:
        found += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), *(t.get_text() for t in ax.texts)]
        legend = ax.get_legend()
        found += [t.get_text() for t in legend.get_texts()] if legend is not None else []
    found += [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    return "\n".join(found)


def test_plots_state_their_parameters_and_flag_a_ceiling_below_its_samples(tmp_path: Path) -> None:
    from selftest.collect import plot_title
    from selftest.report import validity_lines
    from selftest.roofline import METRICS, Range, Roofline, Sample
    from selftest.roofline.plots import plot, roofline_figure
    from selftest.sweep import sweep_figure

    options = {"storage_block_size": 4096, "storage_op": "write", "storage_fsync": True, "bulk_size": 1 << 20}
    # one sample 40% above the upper ceiling (Pc = 10 at X = 1), in the region where the ceiling is Pc
    samples = [Sample(1, 1, 14.0, 1.0, 1.0), Sample(1, 2, 4.9, 1.0, 1.0)]
    model = Roofline(METRICS["storage_iops"], Range(9.0, 10.0), Range(10.0, 11.0), samples)
    assert [(s.clients, round(e, 2)) for s, e in model.above_ceiling()] == [(1, 0.4)]
    text = _texts(roofline_figure(model, plot_title("storage_iops", options, "node0")))
    assert "Storage IOPS roofline, node0\n4 KiB writes at random offsets, fdatasync after every write" in text
    flagged = "1 of 2 samples above the max ceiling (up to +40%), client-bound"
    assert flagged in text and "above the max ceiling (up to +40%)" in text
    assert "noisy" not in text  # a claim the data does not support is not made
    assert plot(model, tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    lines = validity_lines({"storage_iops": model.to_dict()}, None)
    assert f"storage_iops: {flagged}." in lines, lines
    clean = Roofline(METRICS["rpc_rate"], Range(9.0, 10.0), Range(10.0, 11.0), samples[1:])
    assert "above the max ceiling" not in _texts(roofline_figure(clean))

    assert plot_title("bandwidth", options).endswith("\n1 MiB bulk pulls (the server reads the client's buffer)")
    assert plot_title("storage_bandwidth", {**options, "storage_op": "read"}).endswith(
        "\n1 MiB reads at random offsets, no fsync"
    )
    sweep = {"storage_iops": [{"servers": 1, "clients": 4, "samples": 1, "min": 9.0, "median": 10.0, "max": 11.0}]}
    assert "4 KiB writes at random offsets, fdatasync after every write" in _texts(
        sweep_figure(sweep, parameters={"storage_iops": plot_title("storage_iops", options).split("\n")[1]})
    )


def test_history_of_one_run_draws_an_hour_not_years() -> None:
    from selftest.roofline import METRICS, Range, Roofline
    from selftest.store import history_figure

    model = Roofline(METRICS["rpc_rate"], Range(9.0, 10.0), Range(10.0, 11.0), [])
    now = time.time()
    run = {"id": 3, "service": "kv", "platform": "vm", "created": now, "model": {"metrics": {"rpc_rate": model.to_dict()}},
           "summary": {"combined_score": 0.9}}  # fmt: skip
    fig = history_figure(run, [])
    assert "no earlier run of this service and platform yet" in fig._suptitle.get_text()
    lo, hi = fig.axes[0].get_xlim()  # matplotlib dates: days
    assert hi - lo == pytest.approx(1 / 24, rel=1e-3)
    day_later = {**run, "id": 4, "created": now + 86400}
    lo, hi = history_figure(day_later, [run]).axes[0].get_xlim()
    assert 1.0 < hi - lo < 1.2


# -- paths a command writes ------------------------------------------------------------------------------------
def test_an_unwritable_path_is_refused_before_the_work_and_a_late_failure_keeps_the_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``selftest run -o /proc/y.json`` measured for its whole duration, then lost its results to a traceback: root
    passes the permission bits of /proc, so the check now writes a file there. A path that fails anyway, later
    (the disk filled, the directory went away), keeps the results in a temporary file, named in one line."""
    from svcframe.cli.common import writable, write_output

    assert (writable("/proc/y.json") or "").startswith("/proc/y.json: cannot write in /proc: ")
    assert writable("/proc", directory=True) is not None
    assert writable(tmp_path / "deep" / "er" / "r.json") is None and (tmp_path / "deep" / "er").is_dir()
    assert writable(tmp_path) == f"{tmp_path} is a directory; give a file name"
    for argv in (["selftest", "run", "-t", WRONG_ADDRESS, "-o", "/proc/y.json"],
                 ["config", "schema", "-o", "/proc/y.json"], ["roofline", "collect", "-o", "/proc"]):  # fmt: skip
        proc = cli(*argv)
        (line,) = proc.stderr.splitlines()
        assert proc.returncode == 2 and "cannot write in /proc" in line and "Traceback" not in proc.stderr, line

    target = tmp_path / "gone" / "r.json"
    assert writable(target) is None
    (tmp_path / "gone").rmdir()
    (tmp_path / "gone").write_text("now a file: the directory went away")
    with pytest.raises(SystemExit) as ended:
        write_output(target, '{"ops": 42}', "the self-test results")
    assert ended.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    kept = Path(line.rpartition(" kept in ")[2])
    assert line.startswith(f"svcframe: error: cannot write {target} (") and kept.read_text() == '{"ops": 42}'
    kept.unlink()
    good = write_output(tmp_path / "r.json", b"\x00\x01", "bytes")
    assert good.read_bytes() == b"\x00\x01" and oct(good.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
