"""Make the plots the documentation shows, from a real run on this machine, and record how they were made.

    python tools/docs_figures.py            # about 5 minutes on 2 cores; writes docs/images/ and
                                            # docs/snippets/figures.md (the parameters, shown beside the plots)

It runs, in a temporary directory with its own results store, what docs/guides/selftest.md walks through:
``svcframe roofline collect`` (the data-service rooflines of every metric, the server sweep), the kv
provider's ``put`` at two service ratios placed on them (``roofline place``, ``roofline io``), and the
two-stage kv workflow measured twice and drawn on the workflow roofline (``roofline workflow``); then the
progress modes' bursts (``selftest bursts``, docs/guides/progress.md). The PNGs the commands wrote are copied
into docs/images/; docs/images/figures.json keeps every command, the machine, the software and the measured
parameters, and docs/snippets/figures.md says the same in a table that docs/guides/rooflines.md and
docs/guides/progress.md include. Nothing is drawn by this script: the plots are the commands'.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: PNG written by a command (relative to the run's directory) -> its name in docs/images/.
FIGURES = {
    "out/roofline/rpc_rate.png": "roofline-rpc_rate.png",
    "out/roofline/bandwidth.png": "roofline-bandwidth.png",
    "out/roofline/storage_iops.png": "roofline-storage_iops.png",
    "out/roofline/storage_bandwidth.png": "roofline-storage_bandwidth.png",
    "out/roofline/sweep.png": "roofline-sweep.png",
    "out/placement/placement.png": "placement-kv-put.png",
    "out/io/io.png": "io-kv-put.png",
    "out/workflow/workflow.png": "workflow-kv.png",
    "out/bursts/bursts.png": "bursts-progress-modes.png",
}


def commands(duration_seconds: float) -> list[str]:
    """The run, command by command (as docs/guides/selftest.md gives it, with the servers in the background)."""
    put = ("svcframe selftest run -g out/kv/group.json --rpc store:put --arg-generator selftest.generators:kv_put "
           f"--arg-option value_bytes=1024 --duration-seconds {duration_seconds:g}")  # fmt: skip
    workflow = "python examples/kv_workflow.py examples/kv-workflow.json -g out/kv/group.json --runs out/kv/runs.json"
    return [
        "svcframe roofline collect -o out/roofline --json > out/roofline-summary.json",
        "mkdir -p out/kv",
        "svcframe launch configs/kv.json --procs 1 --group-file out/kv/group.json &",
        f"{put} --clients 1 -o out/kv/put-1x1.json",
        f"{put} --clients 2 -o out/kv/put-1x2.json",
        "svcframe roofline place out/kv/put-1x1.json out/kv/put-1x2.json",
        "svcframe roofline io out/kv/put-1x1.json out/kv/put-1x2.json",
        f"{workflow} --parallel-tasks 1",
        f"{workflow} --parallel-tasks 2",
        "svcframe roofline workflow examples/kv-workflow.json --runs out/kv/runs.json",
        "svcframe shutdown -g out/kv/group.json",
        'svcframe launch "$(svcframe selftest config)" --procs 1 --pin --group-file out/bursts-group.json &',
        "svcframe selftest bursts -g out/bursts-group.json --client-core 1 --bursts 3 --burst-seconds 4 "
        "--gap-seconds 4 -o out/bursts",
        "svcframe shutdown -g out/bursts-group.json",
    ]


def run(command: str, workdir: Path, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """Run one command in bash (a background one is returned once its group file exists)."""
    print(f"docs_figures: {command}", file=sys.stderr, flush=True)
    if command.endswith("&"):
        proc = subprocess.Popen(["bash", "-c", f"exec {command[:-1]}"], cwd=workdir, env=env,
                                stdout=subprocess.DEVNULL)  # fmt: skip
        group = workdir / shlex.split(command[:-1])[-1]
        deadline = time.monotonic() + 120
        while not group.exists():  # the launcher writes it once every server accepts calls
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"docs_figures: the servers did not start ({command})")
            time.sleep(0.1)
        return proc
    subprocess.run(["bash", "-c", f"set -euo pipefail; {command}"], cwd=workdir, env=env, check=True,
                   stdout=subprocess.DEVNULL if ">" not in command else None)  # fmt: skip
    return None


def machine() -> dict[str, object]:
    model = ""
    with contextlib.suppress(OSError, StopIteration):
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))  # fmt: skip
    return {"cpu": model, "cores": os.cpu_count(), "load_average_1min_at_start": round(os.getloadavg()[0], 2),
            "kernel": platform.release(), "python": platform.python_version()}  # fmt: skip


def software() -> dict[str, str]:
    from svcframe import __version__

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True)  # fmt: skip
    return {"svcframe": __version__, "commit": commit.stdout.strip() + (" (modified)" if dirty.stdout.strip() else "")}


def snippet(record: dict[str, Any]) -> str:
    """The Markdown table docs/guides/rooflines.md shows beside the plots (tests/test_docs.py checks that
    docs/snippets/figures.md is what docs/images/figures.json gives)."""
    from svcframe.units import quantity_range

    def ceiling(p: dict[str, Any], unit: str) -> str:  # a bandwidth in its own unit (as the plots); >= a lower bound
        text = quantity_range(p["min"], p["max"], unit, keep_unit=unit.endswith("iB/s"))
        return f"≥ {text}" if p.get("lower_bound") else text

    m, s = record["machine"], record["software"]
    rows = [
        ("made", f"{record['made']} by `python tools/docs_figures.py` ({record['wall_seconds']:.0f} s)"),
        ("machine", f"{m['cores']} cores, {m['cpu'] or 'an unnamed CPU'}; Linux {m['kernel']}; load average "
                    f"{m['load_average_1min_at_start']} at start"),
        ("software", f"svcframe {s['svcframe']} (commit {s['commit']}), Python {m['python']}"),
    ]  # fmt: skip
    for name, p in record["parameters"].items():
        pc, ps = ceiling(p["pc"], p["unit"]), ceiling(p["ps"], p["unit"])
        relation = {"<=": "≤ ", ">=": "≥ ", "?": "? "}.get(p.get("ridge_relation", "="), "")
        rows.append((f"`{name}`", f"`Pc` {pc}, `Ps` {ps} per process; ridge `X*` {relation}{p['ridge']:.3g}"))
    rows.append(("commands", "<br>".join(f"`{c}`" for c in record["commands"])))
    return "\n".join(["| the run | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]) + "\n"


def measured(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each metric's unit, Pc and Ps (min, max, and whether each is a lower bound) and ridge (of the max ceiling, and
    how the true one relates to it) from ``roofline collect --json``."""
    return {
        name: {
            "unit": metric["unit"],
            "pc": metric["pc"],
            "ps": metric["ps"],
            "ridge": metric["ridge"]["max"],
            "ridge_relation": metric["ridge"].get("relation", "="),
        }
        for name, metric in summary["metrics"].items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-seconds", type=float, default=5.0, help="length of each kv put run")
    parser.add_argument("--images", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--snippet", type=Path, default=ROOT / "docs" / "snippets" / "figures.md")
    parser.add_argument("--check", action="store_true", help="check the snippet against figures.json; run nothing")
    args = parser.parse_args()
    if args.check:
        if args.snippet.read_text() != snippet(json.loads((args.images / "figures.json").read_text())):
            raise SystemExit(f"{args.snippet} is not what {args.images / 'figures.json'} gives")
        return
    started, t0 = datetime.now(UTC), time.monotonic()
    record: dict[str, Any] = {"made": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
                                 "software": software(), "commands": commands(args.duration_seconds)}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="svcframe-docs-figures-") as tmp:
        workdir = Path(tmp)
        for folder in ("configs", "examples"):
            (workdir / folder).symlink_to(ROOT / folder)
        (workdir / "out").mkdir()
        env = {**os.environ, "SVCFRAME_RESULTS": str(workdir / "results.sqlite"), "MPLBACKEND": "Agg",
               "SVCFRAME_SECRET": os.environ.get("SVCFRAME_SECRET") or secrets.token_hex(16),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
        env.pop("SVCFRAME_GROUP", None)
        servers = None
        try:
            for command in record["commands"]:
                servers = run(command, workdir, env) or servers
        finally:
            if servers is not None and servers.poll() is None:
                servers.terminate()  # (a failed step: the launcher stops its servers on SIGTERM)
                servers.wait()
        summary = json.loads((workdir / "out" / "roofline-summary.json").read_text())
        record["parameters"] = measured(summary)
        record["wall_seconds"] = time.monotonic() - t0
        args.images.mkdir(parents=True, exist_ok=True)
        for source, name in FIGURES.items():
            if not (workdir / source).exists():
                raise SystemExit(f"docs_figures: the run wrote no {source}")
            shutil.copyfile(workdir / source, args.images / name)
        record["figures"] = dict(FIGURES)
    (args.images / "figures.json").write_text(json.dumps(record, indent=2) + "\n")
    args.snippet.parent.mkdir(parents=True, exist_ok=True)
    args.snippet.write_text(snippet(record))
    print(f"docs_figures: {len(FIGURES)} plots in {args.images}, parameters in {args.snippet}", file=sys.stderr)


if __name__ == "__main__":
    main()
