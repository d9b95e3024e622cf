"""Start-up time and memory of `svcframe serve CONFIG`: spawn to readiness, RSS at readiness.

Starts the server ``--runs`` times, each in a fresh temporary directory (relative paths in the config,
such as a kv store's file, land there), waits for its readiness line on ``--ready-fd``, reads its resident
set size (/proc/PID/status VmRSS) and which heavy libraries it has mapped (/proc/PID/maps: numpy's and
matplotlib's C extensions), then stops it with SIGTERM. Prints the median and the fastest run; figures
only, never a pass/fail.

    python tools/serve_startup.py [CONFIG] [--runs 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "matplotlib")


def start_once(config: Path) -> dict[str, object]:
    """One server: seconds from spawn to its readiness line, RSS at readiness, heavy libraries mapped."""
    read_end, write_end = os.pipe()
    with tempfile.TemporaryDirectory() as workdir:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "svcframe", "serve", str(config), "--ready-fd", str(write_end)],
            cwd=workdir, pass_fds=(write_end,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        os.close(write_end)
        try:
            with os.fdopen(read_end, "rb") as ready:
                line = ready.readline()
            ready_seconds = time.perf_counter() - started
            if not json.loads(line or b"{}").get("ok"):
                raise SystemExit(f"the server did not start: {line!r} {proc.communicate(timeout=30)[1]!r}")
            status = Path(f"/proc/{proc.pid}/status").read_text()
            rss_bytes = int(next(row for row in status.splitlines() if row.startswith("VmRSS:")).split()[1]) * 1024
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
            mapped = [name for name in HEAVY if f"/{name}/" in maps]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    return {"ready_seconds": ready_seconds, "rss_bytes": rss_bytes, "heavy_libraries_mapped": mapped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(ROOT / "configs" / "kv.json"))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    runs = [start_once(Path(args.config).resolve()) for _ in range(args.runs)]
    ready = [float(r["ready_seconds"]) for r in runs]  # type: ignore[arg-type]
    rss = [int(r["rss_bytes"]) for r in runs]  # type: ignore[call-overload]
    figures = {
        "config": args.config,
        "runs": args.runs,
        "ready_seconds_median": statistics.median(ready),
        "ready_seconds_min": min(ready),
        "rss_bytes_median": statistics.median(rss),
        "heavy_libraries_mapped": runs[-1]["heavy_libraries_mapped"],
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"svcframe serve {figures['config']} ({args.runs} runs)")
    print(f"  spawn to ready: median {figures['ready_seconds_median'] * 1e3:.0f} ms, "
          f"fastest {figures['ready_seconds_min'] * 1e3:.0f} ms")  # fmt: skip
    print(f"  RSS at ready:   median {figures['rss_bytes_median'] / 2**20:.1f} MiB")
    print(f"  heavy libraries mapped: {', '.join(figures['heavy_libraries_mapped']) or 'none'}")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
