"""The client rows of `svcframe bench`, the self-test ``read`` RPC they use, and the client profiling tools.

Figures are printed and checked for shape (every row beside a raw reference of the same run), never for speed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

import pytest
from conftest import poll_until

from selftest import SELFTEST_CONFIG
from selftest.bench import BenchOptions, print_table, run_bench
from selftest.bench_client import (
    COPY,
    HEADLINE,
    IMPLS,
    MALLOC_TUNING,
    MSGPACK,
    RAW,
    READ_METHODS,
    READ_SIZES,
    SEQ_MODES,
    SVCFRAME,
    ClientProcess,
    client_environment,
)
from svcframe import BulkHandle, Engine
from svcframe.cma import CMA_MIN_BYTES
from svcframe.config import load_config
from svcframe.errors import BulkError, RemoteError
from svcframe.launch import Launch
from svcframe.units import quantity

# benchmarks under valgrind: figures, not the Python version's behaviour
pytestmark = pytest.mark.one_interpreter


ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


@pytest.fixture(scope="module")
def server() -> Any:
    with Launch(load_config(SELFTEST_CONFIG), 1) as job:
        yield job.members[0].address


@pytest.mark.asyncio
async def test_read_hands_the_same_real_data_by_every_method(server: str) -> None:
    async with Engine(None, max_body_bytes=8 * MiB) as engine:
        for size in (100, 64 * 1024, 4 * MiB):  # 4 MiB inline: the caller accepts bodies over 4 MiB
            inline = await engine.call(server, "read", [size, "inline", None], provider_id=1)
            pushed = bytearray(size)
            handle = engine.expose(pushed, "w", peer=server)
            assert await engine.call(server, "read", [size, "push", handle.to_wire()], provider_id=1) is None
            engine.unexpose(handle)
            region = BulkHandle.from_wire(await engine.call(server, "read", [size, "pull", None], provider_id=1))
            pulled = await engine.pull(region)
            into = bytearray(size)
            assert await engine.call(server, "read", [size, "inline", None], provider_id=1, into=into) == size
            assert len(inline) == region.size == size and region.mode == "r"
            assert inline == pushed == pulled == into
            assert inline.count(0) < size // 2  # written (random) data, not untouched zero pages


@pytest.mark.asyncio
async def test_read_keeps_four_sizes_at_most_max_response_bytes_and_revokes_the_rest(server: str) -> None:
    async with Engine(None) as engine:
        first = BulkHandle.from_wire(await engine.call(server, "read", [1000, "pull", None], provider_id=1))
        assert len(await engine.pull(first)) == 1000
        for size in (1001, 1002, 1003, 1004):
            await engine.call(server, "read", [size, "pull", None], provider_id=1)
        with pytest.raises(BulkError):
            await engine.pull(first)  # 1000 was the least recently used size: dropped, its region revoked
        again = BulkHandle.from_wire(await engine.call(server, "read", [1004, "pull", None], provider_id=1))
        assert len(await engine.pull(again)) == 1004  # a kept size: the same region, still exposed
        big = BulkHandle.from_wire(await engine.call(server, "read", [40 * MiB, "pull", None], provider_id=1))
        await engine.call(server, "read", [30 * MiB, "pull", None], provider_id=1)
        with pytest.raises(BulkError):
            await engine.pull(big, size=1)  # 70 MiB would exceed max_response_bytes (64 MiB) kept in all


@pytest.mark.asyncio
async def test_read_refuses_bad_sizes_and_methods(server: str) -> None:
    async with Engine(None) as engine:
        for arg in ([0, "inline", None], [65 * MiB, "inline", None], ["1", "pull", None], [10, "mail", None]):
            with pytest.raises(RemoteError, match="ValueError"):
                await engine.call(server, "read", arg, provider_id=1)


def test_client_processes_run_with_and_without_the_malloc_tuning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0")
    default = client_environment("default")
    assert not [k for k in default if k.startswith("MALLOC_")] and "GLIBC_TUNABLES" not in default
    assert default["PATH"] == os.environ["PATH"]
    for malloc, expected in (("tuned", MALLOC_TUNING), ("default", {})):
        client = ClientProcess(client_environment(malloc))
        proc = Path(f"/proc/{client.proc.pid}")
        try:
            cmdline = proc / "cmdline"  # (bound per iteration: the lambda runs now)
            poll_until(lambda: b"selftest.bench_client" in cmdline.read_bytes(), what="the client to exec")  # noqa: B023
            environ = (proc / "environ").read_bytes().split(b"\0")
            found = dict(e.decode().split("=", 1) for e in environ if e.startswith(b"MALLOC_"))
            assert found == expected  # what glibc reads when the process starts
        finally:
            client.close()


def test_client_rows_cover_every_setting_beside_raw(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], figures: Any
) -> None:
    monkeypatch.delenv("SVCFRAME_SECRET", raising=False)  # the bench brings its own secret for its servers
    result = run_bench(BenchOptions(quick=True, workloads=("client",), client_seconds=0.1))
    rows = result["rows"]
    cores = len(os.sched_getaffinity(0))
    placements = ["same core", "own cores"] if cores > 1 else ["same core"]
    expected = {("client-cpu", impl, ()) for impl in IMPLS}
    for placement in placements:
        expected |= {("client-seq", impl, (placement, *modes)) for impl in (RAW, SVCFRAME) for modes in SEQ_MODES}
        expected.add(("client-seq", MSGPACK, (placement, "block", "block")))
    for transport in ("tcp", "unix"):
        for size in READ_SIZES:
            setting = (transport, size, "tuned")
            expected |= {("client-read", RAW, (*setting, "inline")), ("client-read", MSGPACK, (*setting, "inline"))}
            expected |= {("client-read", SVCFRAME, (*setting, m)) for m in READ_METHODS}
            if transport == "unix" and size >= CMA_MIN_BYTES:
                expected.add(("client-read", COPY, (*setting, "inline")))
    expected |= {("client-read", impl, ("tcp", READ_SIZES[-1], "default", "inline")) for impl in IMPLS}
    fields = {"client-cpu": (), "client-seq": ("placement", "server_mode", "client_mode"),
              "client-read": ("transport", "size", "malloc", "method")}  # fmt: skip
    got = [(r["workload"], r["impl"], tuple(r[f] for f in fields[r["workload"]])) for r in rows]
    assert sorted(got, key=str) == sorted(expected, key=str)  # every setting, once
    for r in rows:
        assert r["ratio_to_raw"] > 0  # a raw reference of the same setting, measured in the same run
        assert len(r["samples"]) == 2 and r["ops_per_second"] > 0 and r["client_cpu_usec_per_call"] > 0
        figure = {"client-cpu": "client_cpu_usec_per_call", "client-seq": "p50_usec"}.get(r["workload"])
        figure = figure or "gib_per_second"
        assert r[f"min_{figure}"] <= r[figure] <= r[f"max_{figure}"]
        if r["workload"] == "client-seq":
            assert r["p50_usec"] <= r["p99_usec"]
        if r["workload"] == "client-read":
            assert ("ratio_to_tuned" in r) == (r["malloc"] == "default")
            assert r["transport"] == "unix" or r["cma_bytes"] == 0
            assert ("ratio_to_copy" in r) == (
                r["cma_bytes"] > 0 and r["malloc"] == "tuned" and r["size"] >= CMA_MIN_BYTES
            )
        if r["impl"] == RAW:
            assert r["ratio_to_raw"] == 1.0
    assert result["wall_seconds"]["client"] > 0
    monkeypatch.delenv("COLUMNS", raising=False)
    print_table(result)  # in a pipe: one line per row, nothing cut, figures in one notation
    lines = capsys.readouterr().out.splitlines()
    assert "…" not in "\n".join(lines) and len([t for t in lines if t.startswith("client-read: ")]) == 2
    headline = {"client-cpu": "usec", "client-seq": "usec", "client-read": "GiB/s"}
    for r in rows:
        figure = quantity(r[HEADLINE[r["workload"]]], headline[r["workload"]])
        assert any(line.startswith(r["impl"]) and figure in line for line in lines), r
    by = {(r["workload"], r["impl"]): r for r in rows if r["workload"] == "client-cpu"}
    for impl in IMPLS:
        figures.record(f"client CPU µs per noop call, {impl} (quick, indicative)", by["client-cpu", impl][
            "client_cpu_usec_per_call"], "µs")  # fmt: skip


def test_profile_client_lists_where_the_time_goes() -> None:
    """The profile of the client's calls names the engine's functions where they run interpreted
    (SVCFRAME_PURE=1), and says so where they run compiled (cProfile sees Python frames only)."""
    command = [sys.executable, "tools/profile_client.py", "--calls", "300", "--profile", "--top", "5"]
    for pure in ("1", "0"):
        env = {**os.environ, "SVCFRAME_PURE": pure}
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True, env=env).stdout
        assert re.search(
            r"svcframe client, 300 noop calls, depth 1, block: [\d,]+ calls/s, client CPU [\d.]+ µs/call", out
        )
        table = out.split("function (per noop call)\n", 1)[1].splitlines()
        assert len(table) == 5
        if pure == "1":
            assert any("calls.py" in line for line in table), table
        else:
            built = any((ROOT / "svcframe" / f"calls{suffix}").exists() for suffix in EXTENSION_SUFFIXES)
            assert ("compiled modules are not profiled" in out) == built, out


def test_profile_client_counts_the_bytecodes_per_call() -> None:
    """The exact Python work of a call, by function: the call itself is in it, and the receive path where it is
    Python; compiled, a svcframe call runs fewer Python bytecodes than the raw uvloop client's."""

    def bytecodes(impl: str) -> tuple[int, str]:
        out = subprocess.run(
            [sys.executable, "tools/profile_client.py", "--impl", impl, "--calls", "300", "--bytecodes", "--top", "6"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
        total = re.search(r"bytecodes per call: (\d+) \(Python frames run by the calls\); top 6:\n", out)
        assert total, out
        return int(total[1]), out.split(total[0], 1)[1]

    from svcframe.compiled import compiled_modules

    ours, table = bytecodes("svcframe")
    assert len(table.splitlines()) == 6
    # (compiled, a read runs no Python frame)
    compiled = compiled_modules().get("svcframe.transport", False)
    assert ("(buffer_updated)" in table) != compiled
    raw = bytecodes("raw")[0]
    assert 0 < ours < 5000 and 50 < raw < 5000 and (ours < raw or not compiled)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cross-memory attach is Linux's")
@pytest.mark.parametrize(
    "method,toggle,transport",
    [
        ("push", "split-push", "unix"),
        ("into", "offers", "unix"),
        ("push", "push-ahead", "tcp"),
        ("push", "eager", "tcp"),
        ("push", "place-ahead", "tcp"),
    ],
)
def test_paired_ab_prints_both_variants_and_their_ratio(method: str, toggle: str, transport: str) -> None:
    """tools/paired_ab.py runs its server and client processes and prints each variant's median and the
    per-round ratios (a few small batches here: the shape, not the speed); a bad toggle is one line."""
    out = subprocess.run(
        [sys.executable, "tools/paired_ab.py", "--method", method, "--toggle", toggle, "--transport", transport,
         "--size", str(2 << 20), "--batch", "4", "--rounds", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert out.startswith(f"{method}, {2 << 20} bytes over {transport}, {toggle} on/off, 2 rounds of 4:\n"), out
    assert re.search(
        r"\n  on +[\d.]+ GiB/s \(median\)\n  off +[\d.]+ GiB/s\n  on/off [\d.]+ \(rounds [\d.]+-[\d.]+\)\n$", out
    )
    bad = subprocess.run([sys.executable, "tools/paired_ab.py", "--toggle", "no"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "invalid choice: 'no'" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_client_instruction_count_is_printed() -> None:
    out = subprocess.run(
        ["bash", "tools/instructions_per_client_call.sh", "--calls", "200", "--impl", "raw", "--depth", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if "needs valgrind" in out.stderr:
        pytest.skip("valgrind is not installed")
    assert out.returncode == 0, out.stderr
    count = re.fullmatch(r"raw +client, depth 1: (\d+) instructions per call \(1\.00x raw\)\n", out.stdout)
    assert count and 1000 < int(count[1]) < 10_000_000, out.stdout
