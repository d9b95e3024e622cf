"""The platform's cross-memory-attach ceiling: one process copying another's memory with ``process_vm_readv``.

The limit a read by cross-memory attach (``svcframe.cma``, ``into=`` over ``unix://``) can approach on this
machine: the copy alone, with no RPC around it. The reader forks a child that holds ``--size`` bytes and reads
them from it ``--reads`` times into one reused buffer, through ``svcframe.cma.read``; prints GiB/s and µs per
copy (median of ``--samples``), to compare with ``svcframe bench --workload client-read``'s ``cma`` rows.

    python tools/cma_limit.py [--size 4194304] [--reads 300] [--samples 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from svcframe import cma


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4 * 1024 * 1024, help="bytes per copy")
    parser.add_argument("--reads", type=int, default=300, help="copies per sample")
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    if not cma.supported():
        raise SystemExit("cma_limit: process_vm_readv is not available here (Linux only)")
    source = os.urandom(args.size)  # the child's copy of it (after fork) is what is read
    address = cma.buffer_address(memoryview(source))
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(w)
        os.read(r, 1)  # hold the memory until the reader is done
        os._exit(0)
    os.close(r)
    try:
        dest = memoryview(bytearray(args.size))
        for _ in range(20):
            cma.read(child, address, dest)
        assert bytes(dest) == source, "the copy differs from the source"
        seconds = []
        for _ in range(args.samples):
            t0 = time.perf_counter()
            for _ in range(args.reads):
                cma.read(child, address, dest)
            seconds.append((time.perf_counter() - t0) / args.reads)
    except OSError as exc:
        raise SystemExit(f"cma_limit: the kernel refused the copy ({exc}); see docs/guides/providers.md") from None
    finally:
        os.write(w, b"x")
        os.waitpid(child, 0)
    each = statistics.median(seconds)
    print(
        f"process_vm_readv, {args.size:,} bytes: {args.size / each / 2**30:.2f} GiB/s "
        f"({min(args.size / s for s in seconds) / 2**30:.2f}-{max(args.size / s for s in seconds) / 2**30:.2f}), "
        f"{each * 1e6:.0f} µs per copy"
    )


if __name__ == "__main__":
    main()
