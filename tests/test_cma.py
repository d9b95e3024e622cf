"""Same-node bulk transfers by cross-memory attach (``svcframe.cma``), between real processes.

Over ``unix://`` both directions move by one kernel copy, the reader being always the process whose
memory receives the data; over ``tcp://`` (or with ``bulk_cma`` off) the socket path is used; when the
kernel refuses (no ptrace access), transfers fall back to the socket and stay correct.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import check_until, wait_until
from reliability_kit import RELTEST_ID, Procs, service_config
from reliability_provider import pattern

from svcframe import Engine, cma
from svcframe.cma import CMA_MIN_BYTES

pytestmark = pytest.mark.skipif(not cma.supported(), reason="cross-memory attach needs Linux process_vm_readv")
uvloop_test = pytest.mark.asyncio(loop_factories=["uvloop"])
MIB = 1 << 20


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sfcma", dir="/tmp"))  # short: unix socket paths are limited
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _bulk_counts(engine: Engine) -> dict[str, int]:
    """Transfers per direction recorded by the engine's monitor (calls, summed over peers)."""
    out: dict[str, int] = {}
    for (direction, _), rec in engine.monitor.bulk.items():
        out[direction] = out.get(direction, 0) + len(rec.buffer) // 2 + rec.summaries[rec.steps[0]].count
    return out


async def _exercise(engine: Engine, address: str, size: int) -> None:
    """Three real transfers with the server: we pull its buffer, it pulls ours, it pushes into ours."""
    exposed = await engine.call(address, "expose", {"size": size, "seed": 7}, provider_id=RELTEST_ID)
    got = await engine.pull(_handle(exposed["bulk"]))
    assert hashlib.sha256(got).hexdigest() == exposed["sha256"] == hashlib.sha256(pattern(size, 7)).hexdigest()
    mine = bytearray(pattern(size, 9))
    handle = engine.expose(mine, "r")
    digest = await engine.call(address, "sha_pull", {"bulk": handle.to_wire()}, provider_id=RELTEST_ID)
    assert digest == hashlib.sha256(mine).hexdigest()
    engine.unexpose(handle)
    dest = bytearray(size)
    handle = engine.expose(dest, "w")
    await engine.call(address, "push_pattern", {"bulk": handle.to_wire(), "seed": 11}, provider_id=RELTEST_ID)
    assert dest == pattern(size, 11)
    engine.unexpose(handle)


def _handle(wire: Any) -> Any:
    from svcframe import BulkHandle

    return BulkHandle.from_wire(wire)


@uvloop_test
@pytest.mark.parametrize("size", [CMA_MIN_BYTES, 3 * MIB, 20 * MIB], ids=["256KiB", "3MiB", "20MiB"])
async def test_unix_bulk_moves_by_cross_memory_attach(procs: Procs, tmp_path: Path, sockdir: Path, size: int) -> None:
    server = procs.spawn(service_config(tmp_path, kv=None, address=f"unix://{sockdir}/s.sock"))
    async with Engine(None) as engine:
        await _exercise(engine, server.address, size)
        counts = _bulk_counts(engine)
        # we pulled by CMA; the server pulled ours by CMA (we only answered with the address); it pushed
        # into ours by CMA (we read its source): no byte went through the socket in either direction.
        assert counts.get("cma_pull") == 1 and counts.get("served_cma_pull") == 1
        assert counts.get("served_cma_push") == 1
        assert "pull" not in counts and "served_pull" not in counts and "served_push" not in counts
        assert engine.cma_bytes == 2 * size  # our pull and the push we served (the server counts its pull)


@uvloop_test
async def test_small_transfers_use_the_socket(procs: Procs, tmp_path: Path, sockdir: Path) -> None:
    """Below CMA_MIN_BYTES the socket is cheaper (one round trip, no pid check): it is used."""
    server = procs.spawn(service_config(tmp_path, kv=None, address=f"unix://{sockdir}/s.sock"))
    async with Engine(None) as engine:
        await _exercise(engine, server.address, CMA_MIN_BYTES - 1)
        counts = _bulk_counts(engine)
        assert engine.cma_bytes == 0 and not any(d.startswith(("cma", "served_cma")) for d in counts), counts


@uvloop_test
async def test_tcp_and_disabled_cma_use_the_socket(procs: Procs, tmp_path: Path, sockdir: Path) -> None:
    for sub in ("tcp", "off"):
        (tmp_path / sub).mkdir()
    tcp = procs.spawn(service_config(tmp_path / "tcp", kv=None), name="tcp")
    off = procs.spawn(service_config(tmp_path / "off", kv=None, address=f"unix://{sockdir}/o.sock", bulk_cma=False),
                      name="off")  # fmt: skip
    for server in (tcp, off):
        async with Engine(None) as engine:
            await _exercise(engine, server.address, 3 * MIB)
            counts = _bulk_counts(engine)
            assert engine.cma_bytes == 0 and not any(d.startswith(("cma", "served_cma")) for d in counts), counts
            assert counts.get("pull") == 1 and counts.get("served_pull") == 1 and counts.get("served_push") == 1


@uvloop_test
async def test_a_kernel_refusal_falls_back_to_the_socket(procs: Procs, tmp_path: Path, sockdir: Path) -> None:
    """The server runs without CAP_SYS_PTRACE and this process is not dumpable, so the kernel refuses the
    server's reads of our memory (EPERM): its pull of our buffer and our push into its buffer fall back
    to the socket, stay correct, and the connection stops trying CMA; our reads of its memory still work."""
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux) to drop CAP_SYS_PTRACE")
    prefix = ["setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace"]
    server = procs.spawn(service_config(tmp_path, kv=None, address=f"unix://{sockdir}/r.sock"), prefix=prefix)
    libc = ctypes.CDLL(None)
    pr_set_dumpable = 4
    libc.prctl(pr_set_dumpable, 0, 0, 0, 0)
    try:
        async with Engine(None) as engine:
            mine = bytearray(pattern(3 * MIB, 5))
            handle = engine.expose(mine, "r")
            for _ in range(2):
                digest = await engine.call(
                    server.address, "sha_pull", {"bulk": handle.to_wire()}, provider_id=RELTEST_ID
                )
                assert digest == hashlib.sha256(mine).hexdigest()
            counts = _bulk_counts(engine)
            assert counts.get("served_cma_pull") == 1  # asked once, refused by the kernel, never again
            assert counts.get("served_pull") == 2  # both pulls came over the socket
            exposed = await engine.call(server.address, "expose", {"size": 3 * MIB, "seed": 2}, provider_id=RELTEST_ID)
            got = await engine.pull(_handle(exposed["bulk"]))
            assert hashlib.sha256(got).hexdigest() == exposed["sha256"]
            assert _bulk_counts(engine).get("cma_pull") == 1  # we may read the server (it is dumpable)
    finally:
        libc.prctl(pr_set_dumpable, 1, 0, 0, 0)
    assert "cross-memory pull from pid" in server.log()


def test_buffer_address_of_read_only_and_writable_views() -> None:
    """The address cma sends for a view is where its first byte is: the kernel copies from a read-only
    slice of bytes at that address; a writable slice's address is ctypes'; a strided view is refused."""
    address = cma.buffer_address
    source = bytes(range(256)) * 16
    dest = bytearray(len(source) - 100)
    cma.read(os.getpid(), address(memoryview(source)[100:]), memoryview(dest))
    assert dest == source[100:]
    writable = bytearray(64)
    expected = ctypes.addressof((ctypes.c_char * 56).from_buffer(writable, 8))
    assert address(memoryview(writable)[8:]) == expected
    assert address(memoryview(b"")) == 0
    with pytest.raises(BufferError):
        address(memoryview(source)[::2])


def test_reads_and_writes_of_a_process() -> None:
    """cma.read and cma.write on this very process: the bytes land where asked, a write's mark after its data; an empty copy
    does nothing; a read-only destination is a ValueError; an address out of range (0, negative, past 64
    bits), or a range not mapped, is an OSError (EFAULT) that names the system call and the pid, and a write
    whose mark cannot be written is one too; a pid that is no process is ESRCH."""
    import errno

    read, write = cma.read, cma.write
    pid = os.getpid()
    source = pattern(3 * 4096 + 5, 41)
    at = cma.buffer_address(memoryview(source))
    dest = bytearray(len(source))
    read(pid, at, memoryview(dest))
    assert dest == source
    target, mark = bytearray(len(source)), bytearray(8)
    write(pid, cma.buffer_address(memoryview(target)), memoryview(source))
    assert target == source
    target[:] = bytes(len(target))
    write(pid, cma.buffer_address(memoryview(target)) + 5, memoryview(source)[:100],
          cma.buffer_address(memoryview(mark)), (77).to_bytes(8, "little"))  # fmt: skip
    assert target[5:105] == source[:100] and target[:5] == bytes(5) and int.from_bytes(mark, "little") == 77
    read(pid, 0, memoryview(bytearray()))  # empty: not even the address is looked at
    write(pid, 0, memoryview(b""))
    with pytest.raises(ValueError, match="writable"):
        read(pid, at, memoryview(source))
    for bad in (0, -4096, 1 << 64, (1 << 64) - 10):
        with pytest.raises(OSError) as info:
            read(pid, bad, memoryview(dest))
        assert info.value.errno == errno.EFAULT and "process_vm_readv" in str(info.value)
        with pytest.raises(OSError) as info:
            write(pid, bad, memoryview(source))
        assert info.value.errno == errno.EFAULT and "process_vm_writev" in str(info.value)
    with pytest.raises(OSError) as info:
        read(pid, 4096, memoryview(dest))  # the first page is never mapped
    assert info.value.errno == errno.EFAULT and f"pid {pid}" in str(info.value) and "Bad address" in str(info.value)
    mark[:] = bytes(8)
    with pytest.raises(OSError) as info:
        write(pid, cma.buffer_address(memoryview(target)), memoryview(source), 4096, (78).to_bytes(8, "little"))
    assert info.value.errno == errno.EFAULT
    with pytest.raises(OSError) as info:
        write(pid, 4096, memoryview(source), cma.buffer_address(memoryview(mark)), (79).to_bytes(8, "little"))
    assert info.value.errno == errno.EFAULT and mark == bytes(8)  # the data failed: the mark was not written
    with pytest.raises(OSError) as info:
        read(2**22 + 12345, at, memoryview(dest))  # above the kernel's pid_max: no such process
    assert info.value.errno == errno.ESRCH


def test_start_time_identifies_a_process_whatever_its_name(tmp_path: Path) -> None:
    """A pid is only read while it belongs to the process that connected: its start time is parsed from
    /proc/PID/stat after the command name, which may hold spaces and parentheses."""
    import subprocess

    odd = tmp_path / "a) b (c"
    odd.symlink_to(shutil.which("sleep") or "/bin/sleep")
    proc = subprocess.Popen([str(odd), "30"])
    try:
        first = cma.start_time(proc.pid)
        assert isinstance(first, int) and first > 0
        assert cma.start_time(proc.pid) == first
    finally:
        proc.kill()
        proc.wait()
    assert cma.start_time(proc.pid) is None


def test_a_peer_process_is_alive_until_it_exits_and_never_after() -> None:
    """The check before every read: the process that connected runs (by start time, then by a pidfd it keeps);
    once it has exited, or the connection closed, it is not read, whoever holds its pid then."""
    import subprocess

    proc = subprocess.Popen(["sleep", "30"])
    peer = cma.PeerProcess(proc.pid)
    try:
        assert peer.start_time is not None
        assert peer.alive() and peer.alive()  # (the first check opens the pidfd, the second polls it)
    finally:
        proc.kill()
        proc.wait()
    assert not peer.alive()
    peer.close()
    assert not peer.alive()
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(50):  # a connection's pidfd is given back when it closes
        other = cma.PeerProcess(os.getpid())
        assert other.alive() and other.alive()
        other.close()
        assert not other.alive()
    assert len(os.listdir("/proc/self/fd")) == fds


def test_without_pidfds_a_peer_is_checked_by_its_start_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel gives no pidfd (before Linux 5.3; under valgrind), every check compares start times,
    and the pidfd is asked for once, not before every read."""
    import errno
    import subprocess

    asked = []

    def no_pidfds(pid: int, flags: int = 0) -> int:
        asked.append(pid)
        raise OSError(errno.ENOSYS, "pidfd_open")

    monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    proc = subprocess.Popen(["sleep", "30"])
    peer = cma.PeerProcess(proc.pid)
    try:
        assert all(peer.alive() for _ in range(5)) and asked == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert not peer.alive()


@uvloop_test
async def test_cma_requests_from_a_raw_peer(procs: Procs, tmp_path: Path, sockdir: Path) -> None:
    """At the protocol level: a CMA pull over tcp is refused with a "cma:" error and the connection kept
    (the peer's pid is unknown there); a CMA push whose body lacks the source address is a bad frame."""
    import msgpack
    from reliability_kit import open_raw, raw_handshake, read_frame, request, secret, wait_closed_by_peer

    from svcframe.wire import Flag, Kind, Status, encode_frame, pack_body, unpack_body

    (tmp_path / "t").mkdir()
    (tmp_path / "u").mkdir()
    tcp = procs.spawn(service_config(tmp_path / "t", kv=None), name="tcp")
    unix = procs.spawn(service_config(tmp_path / "u", kv=None, address=f"unix://{sockdir}/h.sock"), name="unix")
    for server in (tcp, unix):
        reader, writer = await open_raw(server.address)
        await raw_handshake(reader, writer, secret())
        writer.write(request(1, RELTEST_ID, "expose", pack_body({"size": 1 << 20, "seed": 1})))
        fields, body = await read_frame(reader)
        bulk_id = msgpack.unpackb(body)["bulk"][2]
        if server is tcp:
            writer.write(encode_frame(Kind.BULK_PULL, 2, pack_body([bulk_id, 0, 1 << 20]), flags=Flag.CMA))
            fields, body = await read_frame(reader)
            assert fields[2] == Kind.RESPONSE and fields[9] == Status.BULK_ERROR
            assert str(unpack_body(body)).startswith("cma:")
            writer.write(request(3, RELTEST_ID, "noop", pack_body(1)))  # the connection is still served
            fields, _ = await read_frame(reader)
            assert fields[2] == Kind.RESPONSE and fields[9] == Status.OK
        else:
            writer.write(encode_frame(Kind.BULK_PUSH, 2, pack_body([bulk_id, 0, 16]), flags=Flag.CMA))
            fields, _ = await read_frame(reader)
            assert fields[2] == Kind.RESPONSE and fields[9] == Status.BAD_REQUEST
            fields, _ = await read_frame(reader)
            assert fields[2] == Kind.GOODBYE
            await wait_closed_by_peer(reader, 5.0)
        writer.close()


@uvloop_test
async def test_cma_pull_past_its_deadline_is_a_deadline_error_not_a_socket_retry(sockdir: Path) -> None:
    """A deadline raised between two pieces of a cross-memory copy was an OSError (the old
    TimeoutError_ derived from the builtin TimeoutError), so the CMA path swallowed it and pulled again over
    the socket with the full timeout: about twice the deadline. Now the deadline ends the pull, and nothing
    goes over the socket."""
    from svcframe.errors import DeadlineExceeded

    size = 512 * MIB  # about 100-200 ms of copying in 8 MiB pieces: the 30 ms deadline passes between pieces
    async with Engine(f"unix://{sockdir}/d.sock") as server, Engine(None) as client:
        handle = server.expose(bytearray(size), "r")
        await client.pull(handle, size=CMA_MIN_BYTES)  # connected, and CMA works on this connection
        before = _bulk_counts(client)
        with pytest.raises(DeadlineExceeded):
            await client.pull(handle, bytearray(size), timeout_seconds=0.03)
        after = _bulk_counts(client)
        assert after.get("pull", 0) == before.get("pull", 0), "the pull was retried over the socket"
        assert _bulk_counts(server).get("served_pull", 0) == 0
        conn = client.connections.peers[server.engine_id]
        assert conn.peer_cma, "a deadline is not a kernel refusal: the connection keeps cross-memory attach"


@uvloop_test
async def test_a_read_into_the_callers_buffer_is_one_cross_memory_copy(
    procs: Procs, tmp_path: Path, sockdir: Path
) -> None:
    """``call(..., into=buffer)`` over unix: the server lends its bytes result by address and, idle, writes its
    first part into our buffer (process_vm_writev: offered with the request, or asked for after the answer
    when the offer expired) while we copy the rest (process_vm_readv), then we release it; nothing stays
    exposed on the server, the socket carried no data. A buffer below CMA_MIN_BYTES, and a
    result larger than the buffer, take the socket path and its errors."""
    from svcframe import ResultTooLarge
    from svcframe.split_read import (
        SPLIT_OFFER_SHARE,
        SPLIT_SHARE_MAX,
        SPLIT_SHARE_MIN,
        SPLIT_SHARE_STEP,
        SPLIT_WRITER_SHARE,
    )

    server = procs.spawn(service_config(tmp_path, kv=None, address=f"unix://{sockdir}/i.sock"))
    async with Engine(None) as engine:
        buf = bytearray(4 * MIB)
        for seed in range(3):
            n = await engine.call(server.address, "read", {"size": 3 * MIB, "seed": seed}, provider_id=RELTEST_ID,
                                  into=buf)  # fmt: skip
            assert n == 3 * MIB and buf[:n] == pattern(3 * MIB, seed)
        assert engine.cma_bytes == 9 * MIB  # all three by cross-memory attach
        assert _bulk_counts(engine).get("cma_written") == 3  # the server wrote part of each
        small = bytearray(CMA_MIN_BYTES - 1)
        n = await engine.call(server.address, "read", {"size": 1000, "seed": 4}, provider_id=RELTEST_ID, into=small)
        assert n == 1000 and small[:n] == pattern(1000, 4) and engine.cma_bytes == 9 * MIB  # by the socket
        with pytest.raises(ResultTooLarge):
            await engine.call(server.address, "read", {"size": 5 * MIB, "seed": 5}, provider_id=RELTEST_ID, into=buf)
        assert buf[: 3 * MIB] == pattern(3 * MIB, 2)  # no part of a result too large was written (by its offer)
        state = await engine.call(server.address, "bulk_state", None, provider_id=RELTEST_ID)
        assert state["exposed"] == 0  # every lent result released
        assert 9 * MIB * (SPLIT_SHARE_MIN - 0.05) <= state["cma_bytes"] <= 9 * MIB * (SPLIT_SHARE_MAX + 0.05)
        # each read moved a share a step (up when the server's part was in place as ours was, down when not): the
        # share offered with the request, or, when the offer had expired (a slow first result), the share asked
        # for after the answer
        conn = engine.connections.dialled[server.address]
        moves = [(share - start) / SPLIT_SHARE_STEP for share, start in
                 ((conn.offer_share, SPLIT_OFFER_SHARE), (conn.split_share, SPLIT_WRITER_SHARE)) if share]  # fmt: skip
        assert all(abs(m - round(m)) < 1e-9 for m in moves) and sum(abs(round(m)) for m in moves) in (1, 3), moves
        assert not conn.pending and not conn.protocol.offers  # every offer's answer taken or dropped
    assert "Traceback" not in server.log()


@uvloop_test
async def test_a_busy_server_leaves_the_whole_split_read_to_the_reader(
    procs: Procs, tmp_path: Path, sockdir: Path
) -> None:
    """A server with a handler in flight declines to write its part of a split read (its core is not idle):
    the reader copies all of it, correct; when the server is idle again it writes its part again."""
    import asyncio

    server = procs.spawn(service_config(tmp_path, kv=None, address=f"unix://{sockdir}/b.sock"))
    size = 2 * MIB
    async with Engine(None) as engine:
        buf = bytearray(size)
        sleeper = asyncio.ensure_future(engine.call(server.address, "sleep", 30, provider_id=RELTEST_ID))
        try:  # (sent before the reads: an offer made with a read is taken up as the server answers it)
            await wait_until(lambda: len(getattr(engine.connections.dialled.get(server.address), "pending", ())) == 1)
            for seed in range(2):
                n = await engine.call(server.address, "read", {"size": size, "seed": seed}, provider_id=RELTEST_ID,
                                      into=buf)  # fmt: skip
                assert n == size and buf == pattern(size, seed)
            state = await engine.call(server.address, "bulk_state", None, provider_id=RELTEST_ID)
            assert state["cma_bytes"] == 0 and "cma_written" not in _bulk_counts(engine)
        finally:
            sleeper.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sleeper

        async def idle_again() -> bool:  # until the server has seen the cancel and ended the handler
            n = await engine.call(server.address, "read", {"size": size, "seed": 3}, provider_id=RELTEST_ID, into=buf)
            assert n == size and buf == pattern(size, 3)
            return _bulk_counts(engine).get("cma_written", 0) > 0

        await check_until(idle_again, what="the idle server writing its part of a split read")
    assert "Traceback" not in server.log()


@uvloop_test
async def test_split_read_write_requests_from_a_raw_peer(procs: Procs, tmp_path: Path, sockdir: Path) -> None:
    """At the protocol level, a request to write an exposed range into the asker's memory: into an address
    that is not mapped there, it is refused with a "cma:" error (EFAULT) and the connection kept; past its
    expiry, or over tcp, it is declined; a correct one is written, then its mark (the request id); a peer that
    asks for writes without pause is declined past its share of the server's time; a request with a
    destination and no expiry and mark is a bad frame."""
    import ctypes
    import time

    import msgpack
    from reliability_kit import open_raw, raw_handshake, read_frame, request, secret, wait_closed_by_peer

    from svcframe.wire import Flag, Kind, Status, encode_frame, pack_body, unpack_body

    (tmp_path / "t").mkdir()
    (tmp_path / "u").mkdir()
    tcp = procs.spawn(service_config(tmp_path / "t", kv=None), name="tcp")
    unix = procs.spawn(service_config(tmp_path / "u", kv=None, address=f"unix://{sockdir}/w.sock"), name="unix")
    size = 4 << 20  # (writes that take most of the server's time per request: its share of time is what binds)
    dest = ctypes.create_string_buffer(size)
    mark = ctypes.create_string_buffer(8)
    later = time.monotonic_ns() + 60 * 10**9
    for server in (tcp, unix):
        reader, writer = await open_raw(server.address)
        try:
            await raw_handshake(reader, writer, secret())
            writer.write(request(1, RELTEST_ID, "expose", pack_body({"size": size, "seed": 4})))
            fields, body = await read_frame(reader)
            bulk_id = msgpack.unpackb(body)["bulk"][2]

            async def ask(
                rid: int, fields_: list[object], reader: Any = reader, writer: Any = writer
            ) -> tuple[int, Any]:
                writer.write(encode_frame(Kind.BULK_PULL, rid, pack_body(fields_), flags=Flag.CMA))
                answer, answer_body = await read_frame(reader)
                assert answer[2] == Kind.RESPONSE and answer[7] == rid
                return answer[9], unpack_body(answer_body) if answer_body else None

            status, why = await ask(2, [bulk_id, 0, size, ctypes.addressof(dest), later, 0])
            if server is tcp:
                assert status == Status.BULK_ERROR and str(why).startswith("cma: write declined"), why
                assert dest.raw[:16] == bytes(16)
            else:
                assert status == Status.OK and dest.raw == pattern(size, 4)
                status, why = await ask(3, [bulk_id, 0, size, 4096, later, 0])  # not mapped here
                assert status == Status.BULK_ERROR and "Bad address" in str(why), why
                ctypes.memset(dest, 0, size)
                status, why = await ask(4, [bulk_id, 0, size, ctypes.addressof(dest), time.monotonic_ns() - 1, 0])
                assert status == Status.BULK_ERROR and "expired" in str(why) and dest.raw[:16] == bytes(16), why
                status, why = await ask(5, [bulk_id, 0, size, ctypes.addressof(dest), later, ctypes.addressof(mark)])
                assert status == Status.OK and dest.raw == pattern(size, 4)  # the connection was kept
                assert int.from_bytes(mark.raw, "little") == 5  # and then the request id, as the mark
                # a peer that keeps asking gets SPLIT_WRITE_SHARE_OF_TIME of the server's time: the rest is declined
                many = 1000
                writer.write(b"".join(
                    encode_frame(Kind.BULK_PULL, 100 + i, pack_body([bulk_id, 0, size, ctypes.addressof(dest), later, 0]),
                                 flags=Flag.CMA)
                    for i in range(many)
                ))  # fmt: skip
                outcomes = []
                for _ in range(many):
                    answer, answer_body = await read_frame(reader)
                    outcomes.append(answer[9] == Status.OK or str(unpack_body(answer_body)))
                written = outcomes.count(True)
                declined = [o for o in outcomes if o is not True]
                assert 10 <= written < many and all("of our time" in o for o in declined), (written, declined[:1])
                writer.write(encode_frame(Kind.BULK_PULL, 6, pack_body([bulk_id, 0, size, 4096]), flags=Flag.CMA))
                fields, _ = await read_frame(reader)
                assert fields[2] == Kind.RESPONSE and fields[9] == Status.BAD_REQUEST
                fields, _ = await read_frame(reader)
                assert fields[2] == Kind.GOODBYE
                await wait_closed_by_peer(reader, 5.0)
        finally:
            writer.close()  # (a failure above must not leave the transport to the loop)


def test_a_split_reads_share_moves_a_step_toward_the_slower_side_within_bounds() -> None:
    """``bulk.next_share``: more for a writer that ended first, less for one the reader waited for, never
    past SPLIT_SHARE_MIN / SPLIT_SHARE_MAX however long one side stays the faster."""
    from svcframe.split_read import SPLIT_SHARE_MAX, SPLIT_SHARE_MIN, SPLIT_SHARE_STEP, SPLIT_WRITER_SHARE, next_share

    assert next_share(SPLIT_WRITER_SHARE, True) == pytest.approx(SPLIT_WRITER_SHARE + SPLIT_SHARE_STEP)
    assert next_share(SPLIT_WRITER_SHARE, False) == pytest.approx(SPLIT_WRITER_SHARE - SPLIT_SHARE_STEP)
    for writer_first, bound in ((True, SPLIT_SHARE_MAX), (False, SPLIT_SHARE_MIN)):
        share = SPLIT_WRITER_SHARE
        for _ in range(200):
            share = next_share(share, writer_first)
        assert share == bound


@pytest.mark.asyncio
async def test_a_split_read_keeps_the_buffer_until_the_writer_answers_even_when_cancelled() -> None:
    """``split_read.wait_written``, the wait for the writer's answer: a cancellation of the reader does not end it
    before the answer comes (the writer may be writing into the reader's buffer until then); it is raised
    after. Without an answer, or when the connection ends first (the writer may not have read the request
    yet), the wait lasts to its time limit; a refusal ends it at once."""
    import asyncio
    import time

    from svcframe.errors import ConnectionLost, Status
    from svcframe.split_read import wait_written

    loop = asyncio.get_running_loop()
    answer: asyncio.Future[tuple[int, object, int]] = loop.create_future()
    waiter = asyncio.ensure_future(wait_written(answer, time.monotonic_ns() + 60 * 10**9))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.sleep(0)
    assert not waiter.done(), "the wait ended before the writer answered"
    loop.call_soon(answer.set_result, (Status.OK, None, 0))
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert answer.done()

    for ending in ("silent", "lost"):
        future: asyncio.Future[tuple[int, object, int]] = loop.create_future()
        if ending == "lost":
            loop.call_soon(future.set_exception, ConnectionLost("gone"))
        limit = time.monotonic_ns() + 30_000_000
        assert await wait_written(future, limit) is False
        assert time.monotonic_ns() >= limit, f"{ending}: the buffer was given back before the time limit"
    declined: asyncio.Future[tuple[int, object, int]] = loop.create_future()
    loop.call_soon(declined.set_result, (Status.BULK_ERROR, "cma: write declined: busy", 0))
    assert await wait_written(declined, time.monotonic_ns() + 60 * 10**9) is False


_REFUSED_READER = """
import asyncio, hashlib, sys
from svcframe import Engine
from svcframe.loops import run


async def main(address: str) -> None:
    async with Engine(None) as engine:
        buf = bytearray(4 << 20)
        digests = []
        for seed in (1, 2):
            n = await engine.call(address, "read", {"size": 3 << 20, "seed": seed}, provider_id=1, into=buf)
            digests.append(hashlib.sha256(buf[:n]).hexdigest())
        conn = engine.connections.dialled[address]
        state = await engine.call(address, "bulk_state", None, provider_id=1)
        print(digests[0], digests[1], engine.cma_bytes, conn.peer_cma, state["exposed"])


run(main(sys.argv[1]))
"""


def test_a_read_into_the_callers_buffer_falls_back_when_the_kernel_refuses(
    procs: Procs, tmp_path: Path, sockdir: Path
) -> None:
    """A caller that may not read the server's memory (another user, no CAP_SYS_PTRACE: EPERM) gets the lent
    result over the socket, correct, and its connection stops asking for cross-memory reads; the server
    keeps nothing exposed."""
    import subprocess
    import sys

    if not shutil.which("setpriv") or os.geteuid() != 0:
        pytest.skip("needs root and setpriv (util-linux) to run the caller as another user")
    sockdir.chmod(0o711)  # the caller (nobody) reaches the socket, which the server makes with umask 0
    umask0 = ["sh", "-c", 'umask 0; exec "$@"', "sh"]
    server = procs.spawn(service_config(tmp_path, kv=None, address=f"unix://{sockdir}/f.sock"), prefix=umask0)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    probe = subprocess.run([*nobody, sys.executable, "-c", "import svcframe"], capture_output=True, text=True,
                           timeout=60, cwd="/", env=os.environ.copy())  # fmt: skip
    if probe.returncode != 0:  # e.g. a shared libpython another user cannot load (pyenv's 3.12 here)
        pytest.skip(f"this interpreter does not run as another user: {probe.stderr.strip()[-200:]}")
    proc = subprocess.run([*nobody, sys.executable, "-c", _REFUSED_READER, server.address], capture_output=True,
                          text=True, timeout=60, cwd="/", env=os.environ.copy())  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second, cma_bytes, peer_cma, exposed = proc.stdout.split()
    assert first == hashlib.sha256(pattern(3 * MIB, 1)).hexdigest()
    assert second == hashlib.sha256(pattern(3 * MIB, 2)).hexdigest()
    assert (cma_bytes, peer_cma, exposed) == ("0", "False", "0")
    assert "cross-memory read from pid" in proc.stderr  # said once, as the connection gave it up


@uvloop_test
async def test_a_caller_that_never_reads_what_it_was_lent_holds_little(
    procs: Procs, tmp_path: Path, sockdir: Path
) -> None:
    """A raw peer asks for reads by cross-memory attach and never says it has read them: past
    MAX_LENT_PER_CONNECTION lent results the server answers with the data, and all it lent is released when
    the connection ends."""
    from svcframe.bulk_serving import MAX_LENT_PER_CONNECTION
    from svcframe.errors import Status
    from svcframe.testing import RawPeer
    from svcframe.wire import F_CMA, F_INTO, Kind

    server = procs.spawn(service_config(tmp_path, kv=None, address=f"unix://{sockdir}/h.sock"))
    size, calls = CMA_MIN_BYTES, MAX_LENT_PER_CONNECTION + 4
    async with await RawPeer.connect(server.address, secret=os.environ["SVCFRAME_SECRET"].encode()) as peer:
        for rid in range(1, calls + 1):
            peer.request(rid, RELTEST_ID, "read", {"size": size, "seed": rid}, flags=F_INTO | F_CMA)
        lent, data = 0, 0
        for _ in range(calls):  # each answered by its address (a RESPONSE, LENT) or its data (one frame)
            frame = await peer.read_frame()
            if frame.kind == Kind.BULK_DATA_REPLY:
                assert frame.flags & F_INTO, "a result that fits one frame is that frame, flagged INTO"
                assert len(frame.body or b"") == size and frame.body == pattern(size, frame.request_id)
                data += 1
            else:
                assert frame.kind == Kind.RESPONSE and frame.status == Status.LENT, frame
                lent += 1
        assert (lent, data) == (MAX_LENT_PER_CONNECTION, calls - MAX_LENT_PER_CONNECTION)
        async with Engine(None) as engine:
            state = await engine.call(server.address, "bulk_state", None, provider_id=RELTEST_ID)
            assert state["exposed"] == MAX_LENT_PER_CONNECTION
    async with Engine(None) as engine:  # until the server sees the raw peer's connection end (polled, bounded)

        async def nothing_lent() -> bool:
            state = await engine.call(server.address, "bulk_state", None, provider_id=RELTEST_ID)
            return not state["exposed"]

        await check_until(nothing_lent, what="no buffer lent to the ended connection")


@uvloop_test
async def test_an_offer_has_the_owner_write_its_part_as_it_answers(sockdir: Path) -> None:
    """With a read into the caller's buffer, and with a pull into one, the reader offers its buffer before
    the request: the owner writes its part as its answer leaves (no request after the answer), the reader
    copies the rest; the bytes are the owner's, each read moves the offered share a step, and no offer or
    answer is left behind on either side."""
    from svcframe.split_read import SPLIT_OFFER_SHARE, SPLIT_SHARE_STEP

    size = 3 * MIB
    results = [pattern(size, seed) for seed in range(3)]
    async with Engine(f"unix://{sockdir}/o.sock") as server, Engine(None) as client:
        server.register(1, "read", lambda req, seed: results[seed])
        handle = server.expose(results[2], "r")
        buf = bytearray(4 * MIB)
        for seed in range(2):
            n = await client.call(server.address, "read", seed, provider_id=1, into=buf)
            assert n == size and buf[:n] == results[seed]
        target = bytearray(size)
        await client.pull(handle, target)
        assert target == results[2]
        assert _bulk_counts(client).get("cma_written") == 3 and _bulk_counts(server).get("served_cma_write") == 3
        conn = client.connections.dialled[server.address]
        moves = (conn.offer_share - SPLIT_OFFER_SHARE) / SPLIT_SHARE_STEP
        assert round(moves) in (-3, -1, 1, 3) and abs(moves - round(moves)) < 1e-9, moves
        assert conn.split_share == 0.0  # no split read was asked for after an answer
        assert not conn.pending and not server.connections.peers[client.engine_id].protocol.offers


@uvloop_test
async def test_a_cancelled_read_is_never_written_by_its_offer(sockdir: Path) -> None:
    """A read into the caller's buffer cancelled while its handler runs: the cancellation withdraws the offer
    (its answer ends the caller's wait for it), so even a handler that ignores the cancellation and returns
    its result leaves the caller's buffer untouched; the caller's next read works."""
    import asyncio
    import contextlib

    size = 2 * MIB
    data = pattern(size, 5)
    entered, release = asyncio.Event(), asyncio.Event()

    async def stubborn(req: Any, arg: Any) -> bytes:
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):  # (answers all the same)
            await release.wait()
        return data

    async with Engine(f"unix://{sockdir}/c.sock") as server, Engine(None) as client:
        server.register(1, "stubborn", stubborn)
        server.register(1, "read", lambda req, arg: data)
        buf = bytearray(size)
        call = asyncio.ensure_future(client.call(server.address, "stubborn", None, provider_id=1, into=buf))
        await asyncio.wait_for(entered.wait(), 10)
        accepted = server.connections.peers[client.engine_id]
        assert len(accepted.protocol.offers) == 1
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await wait_until(lambda: not accepted.serving, what="the stubborn handler's end")
        assert not accepted.protocol.offers and buf == bytes(size), "the cancelled read's buffer was written"
        n = await client.call(server.address, "read", None, provider_id=1, into=buf)
        assert n == size and buf == data
        assert not client.connections.dialled[server.address].pending


@uvloop_test
async def test_write_offers_from_a_raw_peer(procs: Procs, tmp_path: Path, sockdir: Path) -> None:
    """At the protocol level, a read into the caller's buffer offered to the server: the answer (LENT) names
    the part the server writes, then the offer is answered (OK once written, with its id as the mark); an
    offer into an address not mapped in the caller is answered with a "cma:" error (EFAULT) and the connection
    kept; an expired one is declined (part 0); a CANCEL of the request declines its offer; past
    MAX_LENT_PER_CONNECTION offers kept at once the next is declined; a malformed offer is a bad frame."""
    import time

    import msgpack
    from reliability_kit import open_raw, raw_handshake, read_frame, request, secret, wait_closed_by_peer

    from svcframe.bulk_serving import MAX_LENT_PER_CONNECTION
    from svcframe.wire import Flag, Kind, Status, encode_frame, pack_body, unpack_body

    server = procs.spawn(service_config(tmp_path, kv=None, address=f"unix://{sockdir}/r.sock"))
    size = 2 * MIB
    dest = ctypes.create_string_buffer(size)
    mark = ctypes.create_string_buffer(8)
    later = time.monotonic_ns() + 60 * 10**9
    half = 1 << 15  # a share of 0.5, in 1/65536ths
    reader, writer = await open_raw(server.address)
    try:
        await raw_handshake(reader, writer, secret())

        def offer(oid: int, rid: int, *, to: int = 0, expires: int = later, mark_at: int = 0) -> bytes:
            fields = [rid, to or ctypes.addressof(dest), size, expires, mark_at, half]
            return encode_frame(Kind.BULK_PULL, oid, pack_body(fields), flags=Flag.CMA | Flag.INTO)

        def read(rid: int, seed: int) -> bytes:
            body = msgpack.packb({"size": size, "seed": seed})
            return request(rid, RELTEST_ID, "read", body, flags=Flag.INTO | Flag.CMA)

        async def answers(n: int) -> dict[int, tuple[int, Any]]:
            out = {}
            for _ in range(n):
                fields, body = await read_frame(reader)
                assert fields[2] == Kind.RESPONSE, fields
                out[fields[7]] = (fields[9], unpack_body(body) if body else None)
            return out

        writer.write(offer(2, 1, mark_at=ctypes.addressof(mark)) + read(1, 4))
        got = await answers(2)
        status, lent = got[1]
        assert status == Status.LENT and lent[0] == size and lent[3] == size // 2, lent
        assert got[2] == (Status.OK, None)
        assert dest.raw[: size // 2] == pattern(size, 4)[: size // 2] and dest.raw[size // 2 :] == bytes(size // 2)
        assert int.from_bytes(mark.raw, "little") == 2  # the offer's id, once its part was in place
        writer.write(encode_frame(Kind.CANCEL, 1))  # read: the server may let the result go

        writer.write(offer(4, 3, to=4096) + read(3, 5))  # not mapped here
        got = await answers(2)
        assert got[3][0] == Status.LENT and got[3][1][3] == size // 2
        assert got[4][0] == Status.BULK_ERROR and "Bad address" in str(got[4][1]), got[4]
        writer.write(encode_frame(Kind.CANCEL, 3))

        ctypes.memset(dest, 0, size)
        writer.write(offer(6, 5, expires=time.monotonic_ns() - 1) + read(5, 6))
        got = await answers(2)
        assert got[5][0] == Status.LENT and got[5][1][3] == 0 and dest.raw[:16] == bytes(16)
        assert got[6][0] == Status.BULK_ERROR and "expired" in str(got[6][1]), got[6]
        writer.write(encode_frame(Kind.CANCEL, 5))

        writer.write(offer(8, 7) + encode_frame(Kind.CANCEL, 7))  # an offer for a request then cancelled
        got = await answers(1)
        assert got[8][0] == Status.BULK_ERROR and "cancelled" in str(got[8][1]), got[8]

        # offers for requests never sent: kept to their expiry, at most MAX_LENT_PER_CONNECTION at once
        writer.write(b"".join(offer(100 + i, 1000 + i) for i in range(MAX_LENT_PER_CONNECTION + 1)))
        got = await answers(1)
        assert got == {100 + MAX_LENT_PER_CONNECTION: (Status.BULK_ERROR, "cma: write declined: too many offers")}

        bad = encode_frame(Kind.BULK_PULL, 9, pack_body([1, 2, 3]), flags=Flag.CMA | Flag.INTO)
        writer.write(bad)
        fields, _ = await read_frame(reader)
        assert fields[2] == Kind.RESPONSE and fields[7] == 9 and fields[9] == Status.BAD_REQUEST
        fields, _ = await read_frame(reader)
        assert fields[2] == Kind.GOODBYE
        await wait_closed_by_peer(reader, 5.0)
    finally:
        writer.close()  # (a failure above must not leave the transport to the loop)
    assert "Traceback" not in server.log()


@uvloop_test
async def test_a_push_is_a_split_read_of_the_pushers_source(sockdir: Path) -> None:
    """A push by cross-memory attach names its source as a bulk id, exposed while the push lasts: the owner
    of the buffer asks the pusher to write the first part of it (a split read of the source) and copies the
    rest. Both ways: a handler pushing into the caller's buffer (the pusher waits in its handler) and a
    client pushing into a server's; the bytes are the pusher's, nothing stays exposed after, and a pusher
    whose peer did not announce ``cma_split_push`` sends the address alone (the owner copies it all)."""
    size = 3 * MIB
    source = pattern(size, 21)

    async def push_into(req: Any, wire: Any) -> None:
        await server.push(_handle(wire), source)

    async with Engine(f"unix://{sockdir}/p.sock") as server, Engine(None) as client:
        server.register(1, "push_into", push_into)
        mine = bytearray(size)
        handle = client.expose(mine, "w", peer=server.address)
        await client.call(server.address, "push_into", handle.to_wire(), provider_id=1)
        assert mine == source
        assert _bulk_counts(client).get("cma_written") == 1 and _bulk_counts(server).get("served_cma_write") == 1
        theirs = bytearray(size)
        sink = server.expose(theirs, "w")
        await client.push(sink, pattern(size, 22))
        assert theirs == pattern(size, 22)
        assert _bulk_counts(server).get("cma_written") == 1 and _bulk_counts(client).get("served_cma_write") == 1
        assert not server.serving.push_sources and not client.serving.push_sources
        assert set(server.serving.exposed) == {sink.bulk_id} and set(client.serving.exposed) == {handle.bulk_id}
        # a peer that does not take a source's bulk id: one copy, by the owner
        server.connections.peers[client.engine_id].peer_cma_split_push = False
        mine[:] = bytes(size)
        await client.call(server.address, "push_into", handle.to_wire(), provider_id=1)
        assert mine == source
        assert _bulk_counts(client).get("served_cma_push") == 2 and _bulk_counts(client).get("cma_written") == 1


@uvloop_test
async def test_split_pushes_from_a_raw_peer(sockdir: Path) -> None:
    """At the protocol level, a raw pusher that exposes its source as a bulk id: the owner asks it to write
    the first part of it (a BULK_PULL flagged CMA naming the source's bulk id, a destination, an expiry and
    a mark); a part written and marked is not copied again; a declined one, or one never answered (the owner
    waits to the request's expiry and its grace), is copied by the owner; every push ends with the
    pusher's bytes and an OK. A source id that is not 16 bytes is a bad frame."""
    import time

    from reliability_kit import open_raw, raw_handshake, read_frame, secret, wait_closed_by_peer

    from svcframe.split_read import SPLIT_EXPIRY_NS
    from svcframe.wire import Flag, Kind, Status, encode_frame, pack_body, unpack_body

    size = 2 * MIB
    source = ctypes.create_string_buffer(pattern(size, 31), size)
    source_id = os.urandom(16)
    sink = bytearray(size)
    announce = {"cma": True, "cma_write": True}
    async with Engine(f"unix://{sockdir}/q.sock") as server:
        handle = server.expose(sink, "w")
        reader, writer = await open_raw(server.address)
        try:
            await raw_handshake(reader, writer, secret(), announce=announce)

            def push(rid: int, *extra: object) -> bytes:
                fields = [handle.bulk_id, 0, size, ctypes.addressof(source), *extra]
                return encode_frame(Kind.BULK_PUSH, rid, pack_body(fields), flags=Flag.CMA)

            async def write_request() -> tuple[int, list[Any]]:
                fields, body = await read_frame(reader)
                assert fields[2] == Kind.BULK_PULL and fields[3] & Flag.CMA, fields
                ask = unpack_body(body)
                assert ask[0] == source_id and ask[1] == 0 and 0 < ask[2] < size and ask[4] > time.monotonic_ns()
                return fields[7], ask

            async def answer(rid: int) -> int:
                fields, _ = await read_frame(reader)
                assert fields[2] == Kind.RESPONSE and fields[7] == rid, fields
                return int(fields[9])

            writer.write(push(1, source_id))  # written by us (the server's memory is ours: one process)
            wid, ask = await write_request()
            part, dest, mark = ask[2], ask[3], ask[5]
            ctypes.memmove(dest, ctypes.addressof(source), part)
            ctypes.memmove(mark, wid.to_bytes(8, "little"), 8)
            writer.write(encode_frame(Kind.RESPONSE, wid, b"", status=Status.OK))
            assert await answer(1) == Status.OK and sink == source.raw
            assert _bulk_counts(server).get("cma_written") == 1

            sink[:] = bytes(size)
            writer.write(push(2, source_id))  # declined: the owner copies it all
            wid, ask = await write_request()
            writer.write(
                encode_frame(Kind.RESPONSE, wid, pack_body("cma: write declined: busy"), status=Status.BULK_ERROR)
            )
            assert await answer(2) == Status.OK and sink == source.raw

            sink[:] = bytes(size)
            start = time.monotonic_ns()
            writer.write(push(3, source_id))  # never answered: copied once the request is past its expiry
            wid, ask = await write_request()
            assert await answer(3) == Status.OK and sink == source.raw
            assert time.monotonic_ns() - start > SPLIT_EXPIRY_NS
            assert _bulk_counts(server).get("cma_written") == 1 and _bulk_counts(server).get("served_cma_push") == 3

            writer.write(push(4, source_id[:8]))
            fields, _ = await read_frame(reader)
            assert fields[2] == Kind.RESPONSE and fields[7] == 4 and fields[9] == Status.BAD_REQUEST
            fields, _ = await read_frame(reader)
            assert fields[2] == Kind.GOODBYE
            await wait_closed_by_peer(reader, 5.0)
        finally:
            writer.close()  # (a failure above must not leave the transport to the loop)
