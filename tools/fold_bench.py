"""Cost of folding monitoring samples (svcframe.monitoring.Record.fold): what timing one call costs later.

Fills a target record's buffer with ``FOLD_AT`` values as the engine does (five steps per timed call:
queue, handler and respond times in ns drawn lognormal, request and response sizes) and folds it
``--folds`` times; prints the best fold's time, per value and per call at the default sampling (one call in
16 timed). Under callgrind, compare ``--folds N`` with ``--folds 3N`` for instructions per value.

    python tools/fold_bench.py [--folds 20]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from svcframe.monitoring import FOLD_AT, TARGET_STEPS, Record

SAMPLE_EVERY = 16  # the default monitoring.timing_sample_every


def samples(rows: int) -> list[int]:
    """``rows`` timed calls' raw values, interleaved as the engine appends them."""
    rng = random.Random(1)
    values: list[int] = []
    for _ in range(rows):
        queue, handler, respond = rng.lognormvariate(9, 0.5), rng.lognormvariate(10, 1), rng.lognormvariate(8, 0.3)
        values.extend((int(queue), int(handler), int(respond), rng.choice((64, 80, 4096)), 9))
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, default=20)
    args = parser.parse_args()
    width = len(TARGET_STEPS)
    data = samples(FOLD_AT // width)
    rec = Record(TARGET_STEPS)
    best = float("inf")
    for _ in range(args.folds):
        rec.buffer = list(data)
        started = time.perf_counter()
        rec.fold()
        best = min(best, time.perf_counter() - started)
    per_value_ns = best / len(data) * 1e9
    print(f"fold of {len(data)} values: {best * 1e6:.0f} µs, {per_value_ns:.1f} ns per value, "
          f"{per_value_ns * width / SAMPLE_EVERY:.1f} ns per call (one call in {SAMPLE_EVERY} timed)")  # fmt: skip


if __name__ == "__main__":
    main()
