"""The README's worked example of the kv provider on the rooflines, run command by command as a user types
them (bash, in a directory holding the repository's configs/ and examples/), with shorter measurements: collect
the platform, run kv ``put`` at two service ratios, place it, the I/O roofline, the two-stage workflow measured
twice and placed, the report, shutdown. The README stays true: a command that changes or breaks fails here."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from roofline_kit import assert_png

# the README's worked examples: our logic, not the Python version's (CI's first interpreter only)
pytestmark = pytest.mark.one_interpreter


ROOT = Path(__file__).resolve().parent.parent

#: The same commands with shorter measurements (the README's take minutes on a small machine).
FASTER = (
    ("svcframe roofline collect ", "svcframe roofline collect --duration-seconds 0.3 --repeats 1 --grid-servers 1 "
     "--grid-clients 1,2 --sweep-max-servers 0 "),
    ("--duration-seconds 5 ", "--duration-seconds 0.5 "),
)  # fmt: skip


def readme_worked_example() -> tuple[list[str], str]:
    """The commands of the README's kv worked example (continuations joined, comments dropped) and the
    ``roofline place`` output it shows."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    (block,) = [b for b in blocks if "svcframe roofline place out/kv/put-1x1.json" in b]
    commands = [re.sub(r"\s+#\s.*$", "", line).strip() for line in block.replace("\\\n", " ").splitlines()]
    shown = re.search(r"`roofline place` on this 2-core VM.*?```text\n(.*?)```", readme, re.S)
    assert shown, "README.md lost the roofline place output of its worked example"
    return [" ".join(c.split()) for c in commands if c], shown.group(1)


def test_the_readme_worked_example_runs(tmp_path: Path) -> None:
    commands, shown = readme_worked_example()
    for name in ("configs", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "SVCFRAME_RESULTS": str(tmp_path / "results.sqlite"),
           "COLUMNS": "80"}  # as typed in an 80-column terminal: tables and text fold to it, as the README shows  # fmt: skip
    outputs: dict[str, str] = {}
    launcher = None
    try:
        for command in commands:
            if command.startswith("export SVCFRAME_SECRET="):
                assert "SVCFRAME_SECRET" in env  # the test suite's own secret stands in for it
                continue
            for slow, fast in FASTER:
                command = command.replace(slow, fast)
            if command.endswith("&"):  # the servers, in the background: wait for their group file
                args = shlex.split(command[:-1])
                group = tmp_path / args[args.index("--group-file") + 1]
                launcher = subprocess.Popen(["bash", "-c", command[:-1]], cwd=tmp_path, env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
                deadline = time.monotonic() + 60
                while not group.exists():
                    assert launcher.poll() is None, launcher.stderr.read() if launcher.stderr else ""
                    assert time.monotonic() < deadline, "the servers did not publish their group file"
                    time.sleep(0.05)  # polling a file another process writes (a condition, with a deadline)
                continue
            proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=600)  # fmt: skip
            assert proc.returncode == 0, f"{command}\n{proc.stderr}"
            outputs[command] = proc.stdout
        assert launcher is not None and launcher.wait(timeout=30) == 0  # shutdown drained the servers
    finally:
        if launcher is not None:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
            assert launcher.stderr is not None
            launcher.stderr.close()

    place = next(out for cmd, out in outputs.items() if cmd.startswith("svcframe roofline place "))
    lines = place.splitlines()
    assert lines[0].startswith("kv put (store:put) on run 1: ")
    assert lines[1].split() == shown.splitlines()[1].split()  # the README shows the table the command prints
    assert [line.split()[0] for line in lines[2:4]] == ["1x1", "1x2"]
    assert all(len(line) <= 80 for line in lines if str(tmp_path) not in line)  # but the test's own paths
    assert "kept with run 1 in " in " ".join(place.split())  # a long path folds at a space
    placement = json.loads((tmp_path / "out" / "placement" / "placement.json").read_text())
    assert [p["service_ratio"] for p in placement["points"]] == [1.0, 0.5]
    assert all(p["bytes_per_call"] > 1024 for p in placement["points"])  # a 1 KiB value and its key
    for png in ("placement/placement.png", "io/io.png", "workflow/workflow.png"):
        assert_png(tmp_path / "out" / png)
    runs = json.loads((tmp_path / "out" / "kv" / "runs.json").read_text())
    assert [r["parallel_tasks"] for r in runs] == [1, 2] and all(r["tasks"] == 16 for r in runs)
    workflow = next(out for cmd, out in outputs.items() if cmd.startswith("svcframe roofline workflow "))
    assert "run 1 at once: 1 parallel" in workflow and "run 2 at once: 2 parallel" in workflow
    report = (tmp_path / "out" / "kv" / "report.html").read_text()
    assert "<h3>kv put (store:put), placed" in report
