"""The performance page's tables, from ``svcframe bench``: one command measures and writes them.

    python tools/docs_bench.py                       # run `svcframe bench` (every workload; about 5 minutes on
                                                     # 2 cores), keep its JSON in docs/snippets/bench.json and
                                                     # write docs/snippets/bench.md, which docs/performance.md shows
    python tools/docs_bench.py --from out/bench.json # the tables of a run made before (`svcframe bench -o FILE`)
    python tools/docs_bench.py --check               # exit 1 if bench.md is not what bench.json gives

The tables are the ones ``svcframe bench`` prints (the same rows, columns and notation: ``selftest.bench``'s
``server_tables`` and ``selftest.bench_client``'s ``tables``), as Markdown, after a line that says where,
when and with what the run was made. Nothing in them is typed by hand: tests/test_docs.py checks that bench.md
is what bench.json gives.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout: the repository's selftest package

from selftest.bench import WORKLOADS, server_tables  # noqa: E402
from selftest.bench_client import CLIENT_WORKLOADS, tables  # noqa: E402

JSON_PATH = ROOT / "docs" / "snippets" / "bench.json"
MARKDOWN_PATH = ROOT / "docs" / "snippets" / "bench.md"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(result: dict[str, Any]) -> str:
    """The run's tables as Markdown: a line on the run, then one table per workload (client-read: two)."""
    env, opts = result["environment"], result["options"]
    made = datetime.fromtimestamp(env["time"], UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = result.get("command") or "svcframe bench"
    start_load = result.get("load_average_1min_at_start")
    load = "" if start_load is None else f" (load average {start_load:.2f} at the start)"
    wall = result["wall_seconds"]
    wall_seconds = sum(wall.values()) if isinstance(wall, dict) else wall  # (per workload, or in all)
    build = env.get("svcframe_build") or env.get("svcframe_decoder")  # (runs before the build was recorded)
    lines = [
        f"Made {made} by `{command}` ({wall_seconds:.0f} s; {opts.get('seconds', '?')} s per "
        f"measurement): {env['cores']} cores of {env['cpu_model'] or 'an unnamed CPU'}{load}, "
        f"{env['platform']}; Python {env['python']}, svcframe {env['svcframe']} ({build} hot paths), "
        f"uvloop {env['uvloop']}, msgpack {env['msgpack']}.",
        "",
    ]
    for workload in WORKLOADS:
        rows = [r for r in result["rows"] if r["workload"] == workload]
        if not rows:
            continue
        specs = tables(workload, rows) if workload in CLIENT_WORKLOADS else server_tables(workload, rows)
        for title, columns, cells in specs:
            name, _, rest = title.partition(": ")
            lines += [f"**{name}**: {rest}", "", "| " + " | ".join(columns) + " |",
                      "|" + "|".join("---" for _ in columns) + "|"]  # fmt: skip
            lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in cells]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def measure(extra: list[str]) -> dict[str, Any]:
    """Run ``svcframe bench`` with ``extra`` arguments; its results document, with the command recorded."""
    load = os.getloadavg()[0]  # other work on the machine: the figures are only as quiet as it was
    with tempfile.TemporaryDirectory(prefix="svcframe-docs-bench-") as tmp:
        out = Path(tmp) / "bench.json"
        argv = [str(Path(sys.executable).parent / "svcframe"), "bench", *extra, "-o", str(out)]
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
        result: dict[str, Any] = json.loads(out.read_text())
    result["command"] = shlex.join(["svcframe", "bench", *extra])
    result["load_average_1min_at_start"] = load
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="a results file of `svcframe bench -o FILE`")
    parser.add_argument("--check", action="store_true", help="check bench.md against bench.json; change nothing")
    parser.add_argument("bench_args", nargs="*", help="arguments for svcframe bench (after --), e.g. -- --quick")
    args = parser.parse_args()
    if args.check:
        if MARKDOWN_PATH.read_text() != markdown(json.loads(JSON_PATH.read_text())):
            raise SystemExit(f"{MARKDOWN_PATH} is not what {JSON_PATH} gives: python tools/docs_bench.py --from ...")
        return
    result = json.loads(args.source.read_text()) if args.source is not None else measure(args.bench_args)
    JSON_PATH.parent.mkdir(parents=True, exist_ok=True)
    JSON_PATH.write_text(json.dumps(result, indent=1) + "\n")
    MARKDOWN_PATH.write_text(markdown(result))
    print(f"docs_bench: {MARKDOWN_PATH.relative_to(ROOT)} from {JSON_PATH.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
