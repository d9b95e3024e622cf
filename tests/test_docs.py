"""Every example the documentation marks as runnable is run, so none can silently rot.

In ``README.md`` and ``docs/**/*.md`` a fenced code block is marked with attributes after its language
(pymdownx.superfences' syntax; the site shows them as ordinary code blocks):

- ``{.file title="NAME"}``: the block is written to the file NAME (a provider module, a config, a test);
- ``{.run}``: the block is run: ``sh``/``bash`` blocks by bash, ``python`` blocks by Python.

A page's marked blocks are one script, run top to bottom in a fresh directory laid out as the repository's
root is for a user (``configs/``, ``examples/`` and ``.venv`` beside the files the page writes), with the
environment a user has after installing (``svcframe`` and ``python`` on PATH). The script stops at the first
command that fails, and the test names the page's line it came from. A server started in the background with
``svcframe launch ... --group-file F &`` is waited for as a script of the user's would: until F exists (the
launcher writes it once every server accepts calls). ``FASTER`` shortens measurements a page gives at full
length; ``CHECKS`` adds what a page's output must show.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from roofline_kit import assert_png

# the documentation's examples: our logic, not the Python version's (CI's first interpreter only)
pytestmark = pytest.mark.one_interpreter

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

#: A fence that opens a block: its indentation, its language and its attributes (``{.run}``).
FENCE = re.compile(r"^(?P<indent> *)(?P<ticks>`{3,})(?P<lang>[\w+-]*) *(?:\{(?P<attrs>[^}]*)\})? *$")
#: A line that starts servers in the background and names the group file they publish when ready.
BACKGROUND_LAUNCH = re.compile(r"&\s*(?:#.*)?$")


@dataclass(frozen=True)
class Block:
    """A marked code block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    classes: frozenset[str]
    title: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def marked_blocks(page: Path) -> list[Block]:
    """The blocks of ``page`` marked ``.run`` or ``.file``, in page order."""
    blocks: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, start = len(m["indent"]), i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != m["ticks"]:  # (a ```` block may show ``` blocks)
            body.append(lines[i][indent:])
            i += 1
        i += 1
        attrs = m["attrs"] or ""
        classes = frozenset(re.findall(r"(?:^|\s)\.([\w-]+)", attrs))
        title = re.search(r'title="([^"]*)"', attrs)
        if classes & {"run", "file"}:
            blocks.append(Block(page, start + 1, m["lang"], classes, title and title.group(1), "\n".join(body) + "\n"))
    return blocks


def runnable_pages() -> Iterator[Path]:
    return (page for page in PAGES if marked_blocks(page))


#: Shorter measurements, per page: (what the page says, what the test runs). The pages' own figures take
#: minutes on a small machine; the commands are otherwise run as written.
FASTER: dict[str, list[tuple[str, str]]] = {
    "docs/guides/selftest.md": [
        ("svcframe roofline collect ", "svcframe roofline collect --duration-seconds 0.3 --repeats 1 "
         "--grid-servers 1 --grid-clients 1,2 --sweep-max-servers 0 --saturation-depth 4 --max-clients-per-core 2 "),
        ("--duration-seconds 5 ", "--duration-seconds 0.5 "),
    ],
}  # fmt: skip

WAIT_FOR_GROUP_FILE = r"""
_docs_wait_for_group_file() {  # GROUP_FILE LAUNCHER_PID: until the launcher wrote it, or died, or 60 s passed
  local deadline=$((SECONDS + 60))
  until [ -e "$1" ]; do
    kill -0 "$2" 2>/dev/null || { echo "test_docs: the launcher exited before it wrote $1" >&2; return 1; }
    [ "$SECONDS" -lt "$deadline" ] || { echo "test_docs: no $1 after 60 s" >&2; return 1; }
    sleep 0.05  # polling a file another process writes: a condition, with a deadline
  done
}
"""


def page_script(blocks: list[Block]) -> str:
    """One bash script that writes and runs a page's marked blocks in order."""
    parts = ["set -euo pipefail", WAIT_FOR_GROUP_FILE]
    for n, block in enumerate(blocks):
        parts.append(f"echo '=== {block.where}' >&2")
        if "file" in block.classes:
            assert block.title, f'{block.where}: a .file block needs title="NAME"'
            parts.append(f"cat > {shlex.quote(block.title)} <<'DOCS_EOF'\n{block.text}DOCS_EOF")
        if "run" not in block.classes:
            continue
        if block.lang == "python":
            name = f"_docs_block_{n}.py"
            parts.append(f"cat > {name} <<'DOCS_EOF'\n{block.text}DOCS_EOF\npython {name}")
        elif block.lang in ("sh", "bash"):
            for line in block.text.replace("\\\n", " ").splitlines():
                parts.append(line)
                group = re.search(r"--group-file\s+(\S+)", line)
                if BACKGROUND_LAUNCH.search(line) and group:
                    parts.append(f"_docs_wait_for_group_file {group.group(1)} $!")
        else:
            raise AssertionError(f"{block.where}: cannot run a {block.lang or 'plain'} block")
    return "\n".join(parts) + "\n"


def check_kv_worked_example(workdir: Path, page: str, stdout: str) -> None:
    """The kv provider on the rooflines: the placement table the page shows is the one the command prints,
    and every output it names was made."""
    shown = re.search(r"`roofline place` on this 2-core VM.*?```text\n(.*?)```", page, re.S)
    assert shown, "the page lost the roofline place output of its worked example"
    lines = stdout[stdout.index("kv put (store:put) on run 1: ") :].splitlines()
    assert lines[1].split() == shown.group(1).splitlines()[1].split()  # the header of the table shown
    assert [line.split()[0] for line in lines[2:4]] == ["1x1", "1x2"]
    place = lines[: next(i for i, line in enumerate(lines) if line.startswith("kept with run 1 in"))]
    assert all(len(line) <= 80 for line in place)  # an 80-column terminal, as the page shows
    placement = json.loads((workdir / "out" / "placement" / "placement.json").read_text())
    assert [p["service_ratio"] for p in placement["points"]] == [1.0, 0.5]
    assert all(p["bytes_per_call"] > 1024 for p in placement["points"])  # a 1 KiB value and its key
    for png in ("placement/placement.png", "io/io.png", "workflow/workflow.png"):
        assert_png(workdir / "out" / png)
    runs = json.loads((workdir / "out" / "kv" / "runs.json").read_text())
    assert [r["parallel_tasks"] for r in runs] == [1, 2] and all(r["tasks"] == 16 for r in runs)
    assert "run 1 at once: 1 parallel" in stdout and "run 2 at once: 2 parallel" in stdout
    report = (workdir / "out" / "kv" / "report.html").read_text()
    assert "<h3>kv put (store:put), placed" in report


#: What a page's run must show besides succeeding: check(workdir, page text, stdout).
CHECKS: dict[str, Callable[[Path, str, str], None]] = {
    "docs/guides/selftest.md": check_kv_worked_example,
}


def run_script(script: str, workdir: Path) -> tuple[int, str, str]:
    """Run a page's script in ``workdir`` (laid out as a user's checkout) as a user would: (exit status,
    stdout, stderr)."""
    for folder in ("configs", "examples"):
        (workdir / folder).symlink_to(ROOT / folder)
    (workdir / ".venv").symlink_to(sys.prefix)  # `source .venv/bin/activate`: the interpreter running the tests
    (workdir / "_docs_page.sh").write_text(script)
    # a user's environment: the suite's own secret and group file are not the page's
    env = {key: value for key, value in os.environ.items() if key not in ("SVCFRAME_GROUP", "SVCFRAME_SECRET")}
    env.update({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
                "SVCFRAME_RESULTS": str(workdir / "results.sqlite"), "MPLBACKEND": "Agg",
                "COLUMNS": "80"})  # as typed in an 80-column terminal: tables and text fold to it  # fmt: skip
    stdout_path, stderr_path = workdir / "_docs_stdout.txt", workdir / "_docs_stderr.txt"
    # Output to files, not pipes: a server the page leaves in the background would hold a pipe open.
    with stdout_path.open("w") as out, stderr_path.open("w") as err:
        proc = subprocess.Popen(["bash", "_docs_page.sh"], cwd=workdir, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=540)
        finally:
            with contextlib.suppress(ProcessLookupError):  # what the page left in the background (a launcher
                os.killpg(proc.pid, signal.SIGTERM)  # stops its servers on SIGTERM)
            proc.wait()
    return rc, stdout_path.read_text(), stderr_path.read_text()


def failed_at(stderr: str) -> str | None:
    """The page and line of the last block a script started, from its stderr."""
    at = re.findall(r"^=== (.*)$", stderr, re.M)
    return at[-1] if at else None


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", list(runnable_pages()), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_page_examples_run(page: Path, tmp_path: Path) -> None:
    name = str(page.relative_to(ROOT))
    script = page_script(marked_blocks(page))
    for slow, fast in FASTER.get(name, []):
        assert slow in script, f"FASTER: {name} no longer says {slow!r}"
        script = script.replace(slow, fast)
    rc, stdout, stderr = run_script(script, tmp_path)
    if rc != 0:
        pytest.fail(f"{failed_at(stderr) or name}: the example failed (exit {rc}):\n{stderr[-4000:]}")
    check = CHECKS.get(name)
    if check is not None:
        check(tmp_path, page.read_text(), stdout)


def test_a_failing_example_fails_at_its_block(tmp_path: Path) -> None:
    """The harness itself: a command that fails stops the page at its block; unmarked blocks are not run."""
    page = ROOT / "docs" / "_harness_check.md"  # (never written: a Block names a page, not a file read)
    blocks = [
        Block(page, 3, "python", frozenset({"file"}), "mod.py", "VALUE = 41\n"),
        Block(page, 7, "sh", frozenset({"run"}), None, "python -c 'import mod; print(mod.VALUE + 1)'\n"),
        Block(page, 11, "python", frozenset({"run"}), None, "import mod\nassert mod.VALUE == 0, 'wrong'\n"),
        Block(page, 15, "sh", frozenset({"run"}), None, "echo never\n"),
    ]
    rc, stdout, stderr = run_script(page_script(blocks), tmp_path)
    assert rc != 0 and failed_at(stderr) == "docs/_harness_check.md:11" and "AssertionError: wrong" in stderr
    assert stdout.split() == ["42"]
    text = (
        '```sh\necho plain\n```\n\n```sh {.run}\necho marked\n```\n\n```python {.file title="a.py"}\nx = 1\n```\n'
        "\n````markdown\n```sh {.run}\necho shown, not run\n```\n````\n"
    )
    (tmp_path / "page.md").write_text(text)
    assert [(b.line, b.classes, b.title) for b in marked_blocks(tmp_path / "page.md")] == [
        (5, frozenset({"run"}), None), (9, frozenset({"file"}), "a.py")]  # fmt: skip


def _tool(name: str) -> Any:
    """A script of tools/ as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plots_are_those_a_recorded_run_made() -> None:
    """docs/images/ holds what tools/docs_figures.py copied from its run, and the parameters shown beside the
    plots are its record's, not typed by hand."""
    figures = _tool("docs_figures")
    record = json.loads((ROOT / "docs" / "images" / "figures.json").read_text())
    assert (ROOT / "docs" / "snippets" / "figures.md").read_text() == figures.snippet(record)
    assert sorted(record["figures"].values()) == sorted(figures.FIGURES.values())
    assert sorted(p.name for p in (ROOT / "docs" / "images").glob("*.png")) == sorted(figures.FIGURES.values())
    for name in record["figures"].values():
        assert_png(ROOT / "docs" / "images" / name)
    pages = "".join(page.read_text() for page in PAGES)
    shown = set(re.findall(r"\(\.\./images/([\w.-]+\.png)\)", pages))
    assert shown == set(figures.FIGURES.values())  # every plot made is shown, every plot shown was made


def test_the_performance_tables_are_the_bench_output() -> None:
    """docs/snippets/bench.md is what tools/docs_bench.py makes of the `svcframe bench` results beside it."""
    bench = _tool("docs_bench")
    result = json.loads(bench.JSON_PATH.read_text())
    assert result["kind"] == "svcframe-bench" and result["rows"]
    assert bench.MARKDOWN_PATH.read_text() == bench.markdown(result)
