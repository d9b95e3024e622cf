"""The bench's reference peers move bulk bytes without copying them (counted, never timed)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import Any

import psutil
import pytest
from conftest import poll_until

from selftest.bench import PeerServer, _raw_bulk, add_ratios
from selftest.bench_peers import (
    ACK,
    LEN,
    RECV_BYTES,
    RawClient,
    RawServer,
    block_bulk,
    peer_progress,
    raw_noop_frame,
    raw_pull_frame,
    raw_push_header,
)
from svcframe.loops import run

SIZE = 4 * 1024 * 1024


class FakeTransport:
    def __init__(self) -> None:
        self.sent: list[list[Any]] = []

    def write(self, data: Any) -> None:
        self.sent.append([data])

    def writelines(self, parts: Any) -> None:
        self.sent.append(list(parts))


def deliver(proto: Any, data: bytes | memoryview, piece: int) -> list[memoryview]:
    """What uvloop does with a BufferedProtocol: recv_into ``get_buffer()``, then ``buffer_updated(n)``;
    the kernel hands over at most ``piece`` bytes per receive. Returns the buffers received into."""
    data = memoryview(data)
    used = []
    while data:
        buf = proto.get_buffer(-1)
        n = min(len(buf), piece, len(data))
        buf[:n] = data[:n]
        used.append(buf)
        proto.buffer_updated(n)
        data = data[n:]
    return used


def test_pull_reply_leaves_as_a_view_of_the_blob() -> None:
    blob = memoryview(bytearray(os.urandom(1024)) * (2 * SIZE // 1024))
    server = RawServer(blob)
    server.connection_made(transport := FakeTransport())
    deliver(server, raw_pull_frame(SIZE), piece=7)  # a request arriving in pieces
    deliver(server, raw_pull_frame(100) + raw_pull_frame(SIZE), piece=64)  # two in one receive
    first, both = transport.sent
    assert bytes(first[0]) == LEN.pack(SIZE + 1) + b"\x01" and bytes(both[0]) == LEN.pack(101) + b"\x01"
    for payload, size in ((first[1], SIZE), (both[1], 100), (both[3], SIZE)):
        assert isinstance(payload, memoryview) and payload.obj is blob.obj and len(payload) == size  # no copy
    assert len(both) == 4  # both replies in one writelines: one writev


def test_push_payload_is_received_in_place() -> None:
    server = RawServer(memoryview(bytearray(16)))
    server.connection_made(transport := FakeTransport())
    frame = raw_push_header(SIZE) + os.urandom(SIZE)
    deliver(server, frame, piece=256 * 1024)  # the first push grows the receive buffer once
    grown = server.copied
    assert grown < len(frame) and len(server.buf) >= len(frame)
    for _ in range(3):
        used = deliver(server, frame, piece=256 * 1024)
        assert all(buf.obj is server.buf for buf in used)  # received straight into the preallocated buffer
    assert server.copied == grown  # ... and never copied afterwards
    assert [p for write in transport.sent for p in write] == [ACK] * 4


def test_pull_reply_is_received_in_place() -> None:
    client = RawClient()
    client.connection_made(FakeTransport())
    loop_free_waiters: list[Any] = []

    class Done:
        def set_result(self, value: Any) -> None:
            loop_free_waiters.append(value)

    payload = os.urandom(SIZE)
    reply = LEN.pack(SIZE + 1) + b"\x01" + payload
    client.waiters.append(Done())  # type: ignore[arg-type]
    deliver(client, reply, piece=300_000)
    grown = client.copied
    for _ in range(3):
        client.waiters.append(Done())  # type: ignore[arg-type]
        used = deliver(client, reply, piece=300_000)
        assert all(buf.obj is client.buf for buf in used)
        assert client.payload.obj is client.buf and client.payload == payload  # where recv_into put it
    assert client.copied == grown and client.start == client.end == 0
    assert len(loop_free_waiters) == 4
    assert len(client.buf) >= SIZE + 5 and RECV_BYTES < SIZE  # grown once, for the largest frame


def test_echo_frames_pipelined_in_one_receive() -> None:
    server = RawServer(memoryview(bytearray(16)))
    server.connection_made(transport := FakeTransport())
    frames = raw_noop_frame() * 32 + raw_noop_frame(10)[:7]  # 32 whole frames and a partial one
    deliver(server, frames, piece=len(frames))
    assert [bytes(p) for p in transport.sent[0]] == [raw_noop_frame()] * 32
    deliver(server, raw_noop_frame(10)[7:], piece=64)
    assert bytes(transport.sent[1][0]) == raw_noop_frame(10)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("spin", [0.0, 10.0])
def test_peers_serve_bulk(transport: str, spin: float, tmp_path: Any) -> None:
    core = sorted(os.sched_getaffinity(0))[0]
    for kind in ("raw", "block"):
        unix = str(tmp_path / f"{kind}.sock") if transport == "unix" else None
        with PeerServer(kind, core, unix=unix, spindown_msec=spin) as peer:
            # its own session, as a svcframe server launched by svcframe.launch: the same scheduling group
            # placement (autogroups), so that the bench compares like with like
            assert os.getsid(peer.pid) == peer.pid != os.getsid(0)
            for size in (65536, SIZE):
                for op in ("pull", "push"):
                    if kind == "raw":
                        gib = run(_raw_bulk(peer.address, size, op, 0.02, warmup=2, spindown_msec=spin))
                    else:
                        gib = block_bulk(peer.address, size, op, 0.02, warmup=2, poll=spin > 0)
                    assert gib > 0


_STARTS_A_BUSY_PEER = """
import os, sys
from selftest.bench_peers import PeerServer
peer = PeerServer("raw", sorted(os.sched_getaffinity(0))[0], spindown_msec=float("inf"))
print(peer.pid, flush=True)
sys.stdin.read()
"""


def test_a_peer_dies_with_the_process_that_started_it() -> None:
    """A peer has a session of its own (no Ctrl-C reaches it from the terminal): a bench killed outright must not
    leave it behind, spinning (here a busy raw peer)."""
    with subprocess.Popen(
        [sys.executable, "-c", _STARTS_A_BUSY_PEER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    ) as starter:  # fmt: skip
        try:
            assert starter.stdout is not None
            peer = psutil.Process(int(starter.stdout.readline()))
            assert peer.is_running() and peer.status() != psutil.STATUS_ZOMBIE
            starter.send_signal(signal.SIGKILL)
            starter.wait()

            def gone() -> bool:
                try:
                    return peer.status() == psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    return True

            poll_until(gone, what="the peer to end after its starter was killed")
        finally:
            starter.kill()


def test_spindown_keeps_the_loop_polling_until_its_window_ends() -> None:
    async def main() -> tuple[int, int, bool, bool]:
        # (without the contention back-off: on a loaded machine it could end the window early)
        idle, spin = peer_progress(0), peer_progress(60_000, backoff=False)
        idle.activity()
        spin.activity()
        for _ in range(5):
            await asyncio.sleep(0)
        polled = spin.polls
        spin.configure("spindown", 1e-6, 0.0)  # the window is over: the next poll lets the loop block
        for _ in range(3):
            await asyncio.sleep(0)
        return idle.polls, polled, spin.spinning, idle.spinning

    idle_polls, polled, spinning, idle_spinning = run(main())
    assert idle_polls == 0 and not idle_spinning  # msec=0: asyncio's default, the loop blocks
    assert polled >= 4 and not spinning


def test_unix_over_tcp_per_implementation() -> None:
    def row(impl: str, transport: str, gib: float) -> dict[str, Any]:
        return {"workload": "bulk", "impl": impl, "transport": transport, "size": 1, "direction": "pull",
                "gib_per_second": gib}  # fmt: skip

    rows = [row("raw", "tcp", 2.0), row("sf", "tcp", 1.0), row("raw", "unix", 3.0), row("sf", "unix", 2.0)]
    add_ratios(rows)
    assert rows[3]["unix_over_tcp"] == 2.0 and rows[2]["unix_over_tcp"] == 1.5
    assert rows[3]["ratio_to_raw"] == 2.0 / 3.0 and "unix_over_tcp" not in rows[1]


@pytest.mark.one_interpreter
def test_bulk_rows_compare_the_same_data_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    from selftest.bench import BLOCK_BULK, FLOW, RAW_BULK, BenchOptions, run_bench

    monkeypatch.delenv("SVCFRAME_SECRET", raising=False)
    result = run_bench(BenchOptions(quick=True, seconds=0.1, bulk_repeats=2, workloads=("bulk",)))
    rows = result["rows"]
    assert len(rows) == 2 * 2 * 2 * 3  # transports x sizes x directions x (raw, machine, svcframe)
    for r in rows:
        assert r["flow"] == FLOW[r["direction"]] and len(r["samples"]) == 2
        assert r["min_gib_per_second"] <= r["gib_per_second"] <= r["max_gib_per_second"]
        assert r["ratio_to_raw"] > 0 and ("unix_over_tcp" in r) == (r["transport"] == "unix")
    assert {r["impl"] for r in rows} == {RAW_BULK, BLOCK_BULK, "svcframe"}
    assert FLOW["pull"] != FLOW["push"]  # svcframe's pull is the peers' push: the same bytes, the same way


def test_spindown_without_end_polls_until_stopped() -> None:
    """The raw peer's ``busy`` mode: an endless window, ended by ``stop()`` (the connection's end)."""

    async def main() -> tuple[int, bool, int]:
        busy = peer_progress(float("inf"))
        busy.activity()
        for _ in range(50):
            await asyncio.sleep(0)
        polled, spinning = busy.polls, busy.spinning
        busy.stop()
        for _ in range(3):
            await asyncio.sleep(0)
        return polled, spinning and not busy.spinning, busy.polls - polled

    polled, stopped, after = run(main())
    assert polled >= 45 and stopped and after <= 1


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_msgpack_peer_answers_calls_in_flight(transport: str, tmp_path: Any) -> None:
    from selftest.bench_peers import MsgpackClient

    unix = str(tmp_path / "m.sock") if transport == "unix" else None

    async def main(address: str) -> tuple[list[Any], str]:
        client = await MsgpackClient.connect(address)
        try:
            results = await asyncio.gather(*(client.call("read", n) for n in (1, 100, SIZE)), client.call("noop"))
            with pytest.raises(RuntimeError) as err:
                await client.call("nope")
            return list(results), str(err.value)
        finally:
            await client.close()

    with PeerServer("msgpack", sorted(os.sched_getaffinity(0))[0], unix=unix) as peer:
        results, error = run(main(peer.address))
    assert [len(r) for r in results[:3]] == [1, 100, SIZE] and results[3] is None
    assert results[2].count(0) < SIZE // 2  # written (random) data, as every peer's read returns
    assert "KeyError" in error  # an unknown method: an error reply
