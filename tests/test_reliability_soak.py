"""Soak: 64 clients, a mixed load of no-op, key-value and bulk calls, each with a unique
request id, against one real server process. Nothing lost (every call answered, and answered with its
own id), nothing duplicated (the server's journal and the key-value table hold each id exactly once), no
errors, the server's memory within 32 MiB of where it started; rate and p99 latency printed.

CI runs about 5 s; SVCFRAME_LONG=1 runs the issue's 30 s.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from reliability_kit import KV_ID, MIB, RELTEST_ID, Procs, journal_counts, percentile, scaled, service_config

from svcframe import Engine

pytestmark = [pytest.mark.asyncio(loop_factories=["uvloop"]), pytest.mark.timeout(scaled(120, 600))]

CLIENTS = 64
DURATION_SECONDS = scaled(5.0, 30.0)
WARM_UP_CALLS = 200  # of each kind (no-op, key-value, bulk), before the server's memory is measured


@pytest.mark.one_interpreter  # (long, and about our logic: CI's first interpreter only)
async def test_soak_64_clients_mixed_load(procs: Procs, tmp_path: Path, figures: Any) -> None:
    server = procs.spawn(service_config(tmp_path, kv="durable"))
    latencies: dict[str, list[float]] = {"noop": [], "kv": [], "bulk": []}
    errors: list[str] = []
    answered: dict[str, list[str]] = {"noop": [], "kv": [], "bulk": []}
    stop = asyncio.Event()

    async def client(n: int, phase: str = "soak") -> None:
        async with Engine(None) as engine:
            buf = bytearray(os.urandom(64 * 1024))
            handle = engine.expose(buf, "r")
            digest = hashlib.sha256(buf).hexdigest()
            k = 0
            while not stop.is_set():
                kind = ("noop", "kv", "noop", "bulk")[k % 4]
                rid = f"{kind}-{phase}-{n}-{k}"
                k += 1
                t0 = time.perf_counter()
                try:
                    if kind == "noop":
                        got = await engine.call(server.address, "record", {"id": rid}, provider_id=RELTEST_ID,
                                                timeout_seconds=10.0)  # fmt: skip
                        ok = got == rid
                    elif kind == "kv":
                        got = await engine.call(server.address, "put", {"key": rid, "value": rid.encode() * 4},
                                                provider_id=KV_ID, timeout_seconds=10.0)  # fmt: skip
                        ok = got is None
                    else:
                        got = await engine.call(server.address, "sha_pull", {"bulk": handle.to_wire(), "id": rid},
                                                provider_id=RELTEST_ID, timeout_seconds=10.0)  # fmt: skip
                        ok = got == digest
                except Exception as exc:  # every error is a failure of the promise; keep going to count them
                    errors.append(f"{rid}: {type(exc).__name__}: {exc}")
                    continue
                latencies[kind].append(time.perf_counter() - t0)
                if ok:
                    answered[kind].append(rid)
                else:
                    errors.append(f"{rid}: answered {got!r:.80}")

    # warm up (first-use allocations, SQLite pages) by an amount of work, the same on a fast or a loaded machine;
    # an error ends the warm-up early and fails the test below (errors are kept)
    warm = [asyncio.create_task(client(n, "warm")) for n in range(4)]
    await wait_until(
        lambda: bool(errors) or all(len(v) >= WARM_UP_CALLS for v in answered.values()),
        within=60.0,
        what=f"{WARM_UP_CALLS} warm-up calls of each kind",
    )
    stop.set()
    await asyncio.gather(*warm)
    stop.clear()
    for values in (*latencies.values(), *answered.values()):
        values.clear()
    rss_before = server.rss()
    server.reset_peak_rss()
    t0 = time.perf_counter()
    clients = [asyncio.create_task(client(n)) for n in range(CLIENTS)]
    await asyncio.sleep(DURATION_SECONDS)  # the soak window is what is measured
    stop.set()
    await asyncio.wait_for(asyncio.gather(*clients), 60)
    seconds = time.perf_counter() - t0
    growth = max(server.peak_rss(), server.rss()) - rss_before

    counts = journal_counts(tmp_path)
    journal_ids = answered["noop"] + answered["bulk"]
    lost = [rid for rid in journal_ids if counts.get(rid, 0) == 0]
    duplicated = [rid for rid, c in counts.items() if c > 1]
    with closing(sqlite3.connect(tmp_path / "kv.sqlite")) as db:
        rows = dict(db.execute("SELECT key, value FROM kv").fetchall())
    kv_lost = [rid for rid in answered["kv"] if rows.get(rid.encode()) != rid.encode() * 4]
    total = sum(len(v) for v in answered.values())
    everything = [x for v in latencies.values() for x in v]
    figures.record("soak: clients", CLIENTS, f"for {seconds:.1f} s")
    figures.record("soak: calls answered", total, "")
    figures.record("soak: rate", round(total / seconds), "calls/s")
    for kind, values in latencies.items():
        figures.record(f"soak: {kind} p99", round(percentile(values, 99) * 1e3, 2), f"ms ({len(values)} calls)")
    figures.record("soak: all calls p99", round(percentile(everything, 99) * 1e3, 2), "ms")
    figures.record(
        "soak: errors / lost / duplicated", f"{len(errors)} / {len(lost) + len(kv_lost)} / {len(duplicated)}"
    )
    figures.record("soak: server RSS growth (peak)", round(growth / MIB, 1), "MiB")
    assert errors == [], errors[:10]
    assert lost == [] and kv_lost == [], (lost[:10], kv_lost[:10])
    assert duplicated == [], duplicated[:10]
    assert len(rows) >= len(answered["kv"])  # the in-flight ones of the warm-up may be there too, nothing else
    assert all(len(v) > 0 for v in answered.values())
    assert growth <= 32 * MIB, f"server RSS grew by {growth / MIB:.1f} MiB"
    assert server.alive()
