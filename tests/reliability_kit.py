"""Shared by the reliability tests: real server processes, raw hostile peers, measurements.

Server processes are started as ``python -m svcframe serve CONFIG --ready-fd FD`` (readiness is the JSON line
on the pipe, never a sleep), with the tests directory on ``PYTHONPATH`` so they can load the
``reliability_provider`` library. A *standby* server has imported everything and waits for ``go()`` before it
binds: a restart at the same address then takes milliseconds, not an interpreter start-up.

Run as a script, this module is a hostile or slow peer in its own process (so its CPU use does not disturb
the timings the test process takes)::

    python tests/reliability_kit.py attack '{"address": ..., "soft_frames": 40000, "hard_frames": 10000, ...}'
    python tests/reliability_kit.py slowreader '{"address": ..., "rounds": 3, ...}'
    python tests/reliability_kit.py bulkvictim '{"address": ..., "size": ...}'

Each prints one JSON line with what it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import psutil

from svcframe import testing
from svcframe.decoder import FrameDecoder
from svcframe.wire import (
    HEADER,
    HEADER_SIZE,
    Flag,
    Kind,
    Status,
    auth_mac,
    encode_frame,
    pack_body,
    rpc_id,
    unpack_body,
)

TESTS_DIR = Path(__file__).resolve().parent
ROOT_DIR = TESTS_DIR.parent
#: The issue's full counts and durations run with SVCFRAME_LONG=1; CI runs the short variant.
LONG = os.environ.get("SVCFRAME_LONG") == "1"
MIB = 1024 * 1024
ADMIN_ID, RELTEST_ID, KV_ID, SELFTEST_ID = 0, 1, 2, 3


def scaled(ci: Any, long: Any) -> Any:
    """``long`` under SVCFRAME_LONG=1, else ``ci``."""
    return long if LONG else ci


def secret() -> bytes:
    """The suite's shared secret (tests/conftest.py sets SVCFRAME_SECRET)."""
    return os.environ["SVCFRAME_SECRET"].encode()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by the nearest-rank method; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


# --- server processes -----------------------------------------------------------------------------------------


def service_config(workdir: Path, *, kv: str | None = "durable", selftest: bool = False, **engine: Any) -> dict:
    """A bootstrap config: reltest (id 1, journal in workdir), optionally kv (id 2) and selftest (id 3)."""
    libraries = ["reliability_provider"]
    providers: list[dict[str, Any]] = [
        {
            "name": "rel",
            "type": "reltest",
            "provider_id": RELTEST_ID,
            "config": {"journal": str(workdir / "journal.txt")},
        }
    ]
    if kv is not None:
        libraries.append("providers.kv")
        providers.append(
            {"name": "kv", "type": "kv", "provider_id": KV_ID,
             "config": {"path": str(workdir / "kv.sqlite"), "durability": kv}}
        )  # fmt: skip
    if selftest:
        libraries.append("selftest.provider")
        providers.append({"name": "st", "type": "selftest", "provider_id": SELFTEST_ID})
    return {"engine": {"address": "tcp://127.0.0.1:0", **engine}, "libraries": libraries, "providers": providers}


def journal_counts(workdir: Path) -> dict[str, int]:
    """Executions per request id, from the reltest provider's journal."""
    counts: dict[str, int] = {}
    path = workdir / "journal.txt"
    if path.exists():
        for line in path.read_text().splitlines():
            if line:
                counts[line] = counts.get(line, 0) + 1
    return counts


_STANDBY = """
import logging, os, sys
from svcframe.config import load_config
from svcframe.provider import load_library
from svcframe.server import run_server
config, ready_fd, level = load_config(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
for library in config.libraries:
    load_library(library)
import providers.kv, selftest.provider, uvloop  # noqa: imported ahead, as a warm process has them
os.write(1, b"standby\\n")
if sys.stdin.buffer.read(1) != b"g":
    sys.exit(3)
sys.exit(run_server(config, ready_fd=ready_fd))
"""


class ServerProcess(testing.ServerProcess):
    """A server process of the public kit (svcframe.testing), with what the reliability tests measure, and a
    standby start (imports done, waiting for ``go``)."""

    def go(self) -> ServerProcess:
        """Release a standby server (it binds and serves); returns once it is ready."""
        assert self.proc.stdin is not None
        self.started = time.monotonic()
        self.proc.stdin.write(b"g")
        self.proc.stdin.close()
        self.wait_ready()
        return self

    # -- measurements --------------------------------------------------------------------------------------
    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.pid)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def num_fds(self) -> int:
        return int(self.ps.num_fds())

    def reset_peak_rss(self) -> None:
        """Reset the kernel's high-water mark of this process's RSS (VmHWM; Linux ``clear_refs`` 5)."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def peak_rss(self) -> int:
        """The highest RSS since start or since ``reset_peak_rss`` (VmHWM), in bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc/PID/status")

    def kill(self) -> None:
        super().kill()
        self._close_stdin()

    def stop(self, grace_seconds: float = 15.0) -> int:
        code = super().stop(grace_seconds)
        self._close_stdin()
        return code

    def _close_stdin(self) -> None:  # a standby server never released still has its go pipe
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()


def server_env(extra: dict[str, str] | None = None, *, secret: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), str(ROOT_DIR), *filter(None, [env.get("PYTHONPATH")])])
    if not secret:
        env.pop("SVCFRAME_SECRET", None)
    env.update(extra or {})
    return env


def spawn_server(
    config: dict,
    workdir: Path,
    *,
    name: str = "server",
    verbose: bool = False,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
    standby: bool = False,
    wait: bool = True,
) -> ServerProcess:
    """Start a server process from ``config`` (written to ``workdir/NAME.json``, log in ``workdir/NAME.log``)
    with the public kit (``svcframe.testing.ServerProcess.start``).

    ``prefix``: a wrapper command (``ip netns exec NS``, ``strace ...``). ``standby``: import everything, then
    wait for ``go()`` (the cold-restart tests time the start itself). ``wait``: return only once it reported
    readiness (ignored for standby).
    """
    if not standby:
        return ServerProcess.start(
            config, workdir, name=name, verbose=verbose, prefix=prefix, env=env or server_env(), wait=wait
        )
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / f"{name}.json"
    config_path.write_text(json.dumps(config))
    log_path = workdir / f"{name}.log"
    r, w = os.pipe()
    cmd = [*prefix, sys.executable, "-c", _STANDBY, str(config_path), str(w), "10" if verbose else "30"]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            cmd, pass_fds=(w,), stdout=subprocess.PIPE, stderr=log, stdin=subprocess.PIPE, env=env or server_env(),
            start_new_session=True, preexec_fn=testing.die_with_parent,
        )  # fmt: skip
    os.close(w)
    server = ServerProcess(proc, config_path, log_path, ready_fd=r, started=time.monotonic())
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.stdout.close()
    if line.strip() != b"standby":
        server.kill()
        os.close(r)
        raise AssertionError(f"standby server did not come up\n{server.log_tail()}")
    return server


class Procs:
    """Server and peer processes of one test; every one still running is killed at ``close()``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.servers: list[ServerProcess] = []
        self.peers: list[subprocess.Popen[str]] = []

    def spawn(self, config: dict, name: str = "server", **options: Any) -> ServerProcess:
        server = spawn_server(config, self.workdir, name=name, **options)
        self.servers.append(server)
        return server

    def peer(self, mode: str, args: dict[str, Any], prefix: Sequence[str] = ()) -> subprocess.Popen[str]:
        proc = start_peer(mode, args, prefix)
        self.peers.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.peers:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)
        for server in self.servers:
            server.kill()


def address_port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def with_port(config: dict, port: int, host: str = "127.0.0.1") -> dict:
    """``config`` listening on ``tcp://host:port`` (a restart at the same address)."""
    return {**config, "engine": {**config["engine"], "address": f"tcp://{host}:{port}"}}


# --- raw peers ------------------------------------------------------------------------------------------------


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address[len("tcp://") :].rpartition(":")
    return host.strip("[]"), int(port)


async def open_raw(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if address.startswith("unix://"):
        return await asyncio.open_unix_connection(address[7:])
    host, port = host_port(address)
    return await asyncio.open_connection(host, port)


async def read_frame(reader: asyncio.StreamReader, timeout_seconds: float = 10.0) -> tuple[tuple, bytes]:
    """One frame: (header fields, body)."""
    header = await asyncio.wait_for(reader.readexactly(HEADER_SIZE), timeout_seconds)
    fields = HEADER.unpack(header)
    return fields, await asyncio.wait_for(reader.readexactly(fields[6]), timeout_seconds)


CLIENT_NONCE = b"raw-peer-nonce16"  # a raw peer's fixed nonce (16 bytes)


def hello_reply(
    server_hello: dict,
    key: bytes | None,
    engine_id: str = "raw-peer",
    via: str = "",
    address: str | None = None,
    announce: dict[str, Any] | None = None,
) -> bytes:
    """The dialling side's HELLO for ``server_hello``; with ``key``, the client's proof over the transcript
    (``via``: the server's end of the connection as the raw socket sees it, "host:port" or the unix path).
    A server that accepts it answers with its own proof, a second HELLO, before anything else. ``announce``:
    more keys (e.g. ``{"cma": True, "cma_write": True}``)."""
    reply: dict[str, Any] = {"engine_id": engine_id, "address": address, **(announce or {})}
    if key is not None:
        reply.update(nonce=CLIENT_NONCE, via=via, mac=auth_mac(
            key, "client", server_hello["nonce"], CLIENT_NONCE, server_hello["engine_id"], engine_id, via
        ))  # fmt: skip
    return encode_frame(Kind.HELLO, 0, pack_body(reply))


def endpoint_of(name: Any) -> str:
    """A socket's peername as the handshake names endpoints: "host:port" or the unix path."""
    return f"{name[0]}:{name[1]}" if isinstance(name, tuple) else str(name or "")


async def raw_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    key: bytes | None,
    engine_id: str = "raw-peer",
    address: str | None = None,
    announce: dict[str, Any] | None = None,
) -> dict:
    fields, body = await read_frame(reader)
    assert fields[2] == Kind.HELLO, fields
    hello = unpack_body(body)
    assert isinstance(hello, dict)
    writer.write(hello_reply(hello, key, engine_id, endpoint_of(writer.get_extra_info("peername")), address, announce))
    if key is not None and hello.get("auth"):
        fields, body = await read_frame(reader)  # the server's proof
        assert fields[2] == Kind.HELLO and "mac" in unpack_body(body), fields
    return hello


async def wait_closed_by_peer(reader: asyncio.StreamReader, timeout_seconds: float) -> bytes:
    """Read until the server closes the connection; return what it sent. Raises TimeoutError."""
    got = bytearray()

    async def drain() -> None:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while chunk := await reader.read(65536):
                got.extend(chunk)

    await asyncio.wait_for(drain(), timeout_seconds)
    return bytes(got)


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


def request(
    request_id: int, provider_id: int, name: str, body: bytes, *, flags: int = 0, deadline_usec: int = 10_000_000
) -> bytes:
    return encode_frame(
        Kind.REQUEST, request_id, body, provider_id=provider_id, rpc=rpc_id(name), flags=flags,
        deadline_usec=deadline_usec,
    )  # fmt: skip


@functools.cache
def tls_client_hello() -> bytes:
    """The first flight of a real TLS client (the ssl module's own ClientHello)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="example.org")
    with contextlib.suppress(ssl.SSLWantReadError):
        conn.do_handshake()
    return outgoing.read()


HTTP_REQUEST = (
    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\nConnection: close\r\n\r\n"
)


def _header(kind: int, length: int, *, magic: bytes = b"SF", version: int = 1, reserved: int = 0) -> bytes:
    return HEADER.pack(magic, version, kind, 0, 1, 0, length, 7, 0, 0, 0xFFFF, 0, reserved, 0, bytes(16), 0, 0)


#: Malformed frames that break the framing or the handshake: the server must drop the connection. Name ->
#: (bytes after the handshake, or None for bytes sent instead of the HELLO) — see ``hard_case``.
FRAMING_CASES = (
    "pre-http", "pre-tls", "pre-zeros", "pre-request-before-hello", "pre-malformed-hello", "pre-hello-bad-mac",
    "pre-oversize-hello", "pre-hangup", "bad-magic", "bad-version", "bad-kind", "reserved-bits", "oversize-4gib",
    "bulk-data-nobody-expects", "second-hello", "truncated-then-hangup", "push-overrun", "goodbye",
    "response-never-asked", "data-reply-never-asked",
)  # fmt: skip

#: Bodies every receiver refuses (svcframe.wire.unpack_body): malformed or non-strict msgpack.
BAD_BODIES = {
    "never-used-byte": b"\xc1",
    "ext-type": msgpack.packb(msgpack.ExtType(5, b"x")),
    "timestamp-ext": msgpack.packb(msgpack.Timestamp(1, 0)),
    "int-map-key": msgpack.packb({1: "x"}),
    "bytes-map-key": msgpack.packb({b"BODY-MARKER-never-logged": "x"}, use_bin_type=True),
    "truncated-array": b"\x92\x01",
    "huge-str-header": b"\xdb\xff\xff\xff\xff",
    "trailing-bytes": b"\x01\x02",
    "deep-nesting": b"\x91" * 5000 + b"\xc0",
}

#: Well-framed requests and bulk requests with a body a conforming peer never sends: bad frames too. The server
#: answers the frame with BAD_REQUEST (unless it is one-way), says GOODBYE with status BAD_REQUEST and drops the
#: connection; the request that follows it on the wire is never run. Name -> (a BAD_REQUEST reply is due, frame).
BAD_BODY_CASES: dict[str, tuple[bool, bytes]] = {
    **{f"request-{name}": (True, request(1, RELTEST_ID, "noop", body)) for name, body in BAD_BODIES.items()},
    "request-no-reply-garbage": (False, request(1, RELTEST_ID, "noop", b"\xc1", flags=Flag.NO_REPLY)),
    "pull-malformed": (True, encode_frame(Kind.BULK_PULL, 1, b"\xc1")),
    "pull-int-map-key": (True, encode_frame(Kind.BULK_PULL, 1, msgpack.packb({1: 2}))),
    "pull-negative-offset": (True, encode_frame(Kind.BULK_PULL, 1, pack_body([1, -5, 10]))),
    "pull-wrong-shape": (True, encode_frame(Kind.BULK_PULL, 1, pack_body({"bulk": 1}))),
    "push-malformed": (True, encode_frame(Kind.BULK_PUSH, 1, b"\xc1")),
    "push-negative-size": (True, encode_frame(Kind.BULK_PUSH, 1, pack_body([1, 0, -10]))),
}

#: Every case that costs the attacker its connection.
HARD_CASES = FRAMING_CASES + tuple(BAD_BODY_CASES)


def after_bad(name: str) -> bytes:
    """The request an attacker pipelines right after a bad frame: journalled by the server if it ever ran."""
    return request(2, RELTEST_ID, "record", pack_body({"id": f"after-bad-{name}"}))


def hard_case(name: str, key: bytes) -> tuple[bool, bytes]:
    """(needs the handshake first, bytes to send) for one HARD_CASES entry."""
    if name in BAD_BODY_CASES:
        return True, BAD_BODY_CASES[name][1] + after_bad(name)
    pre = {
        "pre-http": HTTP_REQUEST,
        "pre-tls": tls_client_hello(),
        "pre-zeros": bytes(HEADER_SIZE * 2),
        "pre-request-before-hello": request(1, RELTEST_ID, "noop", pack_body(1)),
        "pre-malformed-hello": encode_frame(Kind.HELLO, 0, b"\xc1"),
        "pre-hello-bad-mac": encode_frame(Kind.HELLO, 0, pack_body({"engine_id": "x", "mac": b"\0" * 32})),
        "pre-oversize-hello": _header(Kind.HELLO, 2**32 - 1),
        "pre-hangup": b"",
    }
    if name in pre:
        return False, pre[name]
    post = {
        "bad-magic": _header(Kind.REQUEST, 0, magic=b"XY"),
        "bad-version": _header(Kind.REQUEST, 0, version=9),
        "bad-kind": _header(0x63, 0),
        "reserved-bits": _header(Kind.REQUEST, 0, reserved=1),
        "oversize-4gib": _header(Kind.REQUEST, 2**32 - 1),
        "bulk-data-nobody-expects": encode_frame(Kind.BULK_DATA_PUSH, 5, b"abc"),
        "second-hello": hello_reply({"nonce": b"n" * 16, "engine_id": "e"}, key, "again"),
        "truncated-then-hangup": request(1, RELTEST_ID, "noop", pack_body("x" * 100))[:90],
        "push-overrun": encode_frame(Kind.BULK_PUSH, 9, pack_body([bytes(16), 0, 10]))
        + encode_frame(Kind.BULK_DATA_PUSH, 9, b"y" * 20),
        "goodbye": encode_frame(Kind.GOODBYE, 0, pack_body("bye"), status=Status.REFUSED),
        # answers to requests the server never sent on this connection (svcframe.protocol.check_late_answer)
        "response-never-asked": encode_frame(Kind.RESPONSE, 7, pack_body("unsolicited")),
        "data-reply-never-asked": encode_frame(Kind.BULK_DATA_REPLY, 7, b"z" * 64),
    }
    return True, post[name]


def bad_body_outcome(name: str, received: bytes) -> str | None:
    """What is wrong with the server's answer ``received`` (every byte after its HELLO, up to the close) to the
    bad-body case ``name`` followed by ``after_bad(name)``; None when it is right: a BAD_REQUEST reply to
    request 1 (when one is due), then a GOODBYE with status BAD_REQUEST, and nothing for request 2."""
    try:
        frames = FrameDecoder().feed(received)
    except Exception as exc:  # the server's own bytes must decode
        return f"{name}: undecodable answer: {exc}"
    got = [(Kind(f.kind).name, f.request_id, Status(f.status).name) for f in frames]
    want = [("GOODBYE", 0, "BAD_REQUEST")]
    if BAD_BODY_CASES[name][0]:
        want.insert(0, ("RESPONSE", 1, "BAD_REQUEST"))
    return None if got == want else f"{name}: got {got}, expected {want}"


def soft_cases() -> list[tuple[str, Status | None, Any]]:
    """Requests that are well formed but cannot be served: the server answers each with an error (or, where
    the protocol says so, ignores it) and keeps the connection. (name, the status of the reply or None for no
    reply, builder(request_id))."""
    return [
        ("no-such-provider", Status.NO_SUCH_PROVIDER, lambda i: request(i, 777, "noop", pack_body(1))),
        ("no-such-rpc", Status.NO_SUCH_RPC, lambda i: request(i, RELTEST_ID, "no_such_rpc", pack_body(1))),
        ("wrong-argument-type", Status.HANDLER_ERROR, lambda i: request(i, RELTEST_ID, "hold", pack_body([1, 2]))),
        ("handler-error", Status.HANDLER_ERROR, lambda i: request(i, RELTEST_ID, "fail", pack_body("soft"))),
        # a 1 µs deadline: DROPPED when it passed before the handler started, else DEADLINE_EXCEEDED (it ran)
        ("expired-deadline", (Status.DROPPED, Status.DEADLINE_EXCEEDED),
         lambda i: request(i, RELTEST_ID, "sleep", pack_body(10), deadline_usec=1)),
        ("pull-unknown-handle", Status.BULK_ERROR,
         lambda i: encode_frame(Kind.BULK_PULL, i, pack_body([bytes(16), 0, 10]))),
        ("push-empty-unknown", Status.BULK_ERROR,
         lambda i: encode_frame(Kind.BULK_PUSH, i, pack_body([bytes(16), 0, 0]))),
        ("push-unknown-handle-with-data", Status.BULK_ERROR,
         lambda i: encode_frame(Kind.BULK_PUSH, i, pack_body([bytes(16), 0, 16]))
         + encode_frame(Kind.BULK_DATA_PUSH, i, b"d" * 16)),
        ("cancel-unknown", None, lambda i: encode_frame(Kind.CANCEL, i)),
        # every flag bit but INTO (a request flagged INTO carries [capacity, argument]: a bad body otherwise)
        ("all-flag-bits", None, lambda i: request(i, RELTEST_ID, "noop", pack_body(1), flags=0xFFFF & ~Flag.INTO)),
    ]  # fmt: skip


# --- script modes: peers in their own process ---------------------------------------------------------------


async def _soft_worker(address: str, key: bytes, frames: int, batch: int, out: dict[str, Any]) -> None:
    """Pipeline soft cases in batches on one connection; every reply must carry the case's status and the
    connection must stay open."""
    cases = soft_cases()
    reader, writer = await open_raw(address)
    try:
        await raw_handshake(reader, writer, key, "soft-attacker")
        decoder = FrameDecoder(bulk_sink=lambda kind, rid, n: memoryview(bytearray(n)))
        next_id, sent = 1, 0
        while sent < frames:
            parts, expect = [], {}
            for _ in range(min(batch, frames - sent)):
                name, status, build = cases[next_id % len(cases)]
                parts.append(build(next_id))
                if status is not None:
                    expect[next_id] = (name, status)
                next_id += 1
                sent += 1
            writer.write(b"".join(parts))
            while expect:
                chunk = await asyncio.wait_for(reader.read(1 << 20), 10.0)
                if not chunk:
                    out["anomalies"].append(f"server closed a connection that sent only soft cases after {sent}")
                    return
                for frame in decoder.feed(chunk):
                    if frame.kind != Kind.RESPONSE:
                        out["anomalies"].append(f"unexpected {Kind(frame.kind).name} frame on a soft connection")
                        continue
                    name, status = expect.pop(frame.request_id, ("?", None))
                    if frame.status != status and not (isinstance(status, tuple) and frame.status in status):
                        out["anomalies"].append(f"{name} (request {frame.request_id}) answered {frame.status}")
                    label = Status(frame.status).name
                    out["statuses"][label] = out["statuses"].get(label, 0) + 1
            out["soft_frames"] += len(parts)
    finally:
        await close_writer(writer)


async def _hard_worker(address: str, key: bytes, conns: int, offset: int, out: dict[str, Any]) -> None:
    """One connection per case: send it, wait for the server to drop the connection (bad bodies: check that
    it answered BAD_REQUEST and said GOODBYE, and ran nothing after the bad frame)."""
    for n in range(conns):
        name = HARD_CASES[(offset + n) % len(HARD_CASES)]
        handshake, data = hard_case(name, key)
        reader, writer = await open_raw(address)
        try:
            if handshake:
                await raw_handshake(reader, writer, key, "hard-attacker")
            t0 = time.monotonic()
            if data:
                writer.write(data)
            if name in ("pre-hangup", "truncated-then-hangup"):
                writer.write_eof() if writer.can_write_eof() else None
            try:
                received = await wait_closed_by_peer(reader, 5.0)
            except TimeoutError:
                out["anomalies"].append(f"{name}: connection not dropped within 5 s")
                continue
            out["close_seconds"].append(time.monotonic() - t0)
            out["hard_frames"] += 1
            if name in BAD_BODY_CASES:
                out["bad_body_frames"] += 1
                wrong = bad_body_outcome(name, received)
                if wrong:
                    out["anomalies"].append(wrong)
        except (ConnectionError, OSError) as exc:
            out["hard_frames"] += 1  # the server dropped us while we were still writing: that is the point
            out["close_seconds"].append(0.0)
            out["resets"] = out.get("resets", 0) + 1
            if name in BAD_BODY_CASES:
                out["anomalies"].append(f"{name}: reset before the server's answer could be read ({exc})")
        finally:
            await close_writer(writer)


async def _attack(args: dict[str, Any]) -> dict[str, Any]:
    key = secret()
    out: dict[str, Any] = {"soft_frames": 0, "hard_frames": 0, "bad_body_frames": 0, "anomalies": [], "statuses": {},
                           "close_seconds": []}  # fmt: skip
    soft, hard = args["soft_connections"], args["hard_connections"]
    t0 = time.monotonic()
    jobs = [_soft_worker(args["address"], key, args["soft_frames"] // soft, args.get("batch", 250), out)
            for _ in range(soft)]  # fmt: skip
    jobs += [_hard_worker(args["address"], key, args["hard_frames"] // hard, k * 7, out) for k in range(hard)]
    results = await asyncio.gather(*jobs, return_exceptions=True)
    out["errors"] = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    out["seconds"] = time.monotonic() - t0
    closes = out.pop("close_seconds")
    out["close_p99_seconds"] = percentile(closes, 99)
    out["close_max_seconds"] = max(closes, default=0.0)
    return out


def _slowreader(args: dict[str, Any]) -> dict[str, Any]:
    """Pipeline large ``work`` requests and never read; report when the server hung up."""
    from selftest.provider import work_arg

    key = secret()
    host, port = host_port(args["address"])
    size = args["size"]
    frame = request(1, SELFTEST_ID, "work", pack_body(work_arg(size, None, None, b"q" * size)))
    if args.get("wait_for_go"):  # start-up (interpreter, imports) stays out of the caller's measurement
        print("ready", flush=True)
        sys.stdin.readline()
    rounds = []
    for _ in range(args["rounds"]):
        sock = socket.create_connection((host, port))
        sock.settimeout(10.0)
        try:
            buf = b""
            while len(buf) < HEADER_SIZE or len(buf) < HEADER_SIZE + HEADER.unpack(buf[:HEADER_SIZE])[6]:
                buf += sock.recv(65536)
            hello = unpack_body(buf[HEADER_SIZE:])
            assert isinstance(hello, dict)
            sock.sendall(hello_reply(hello, key, "slow-reader", endpoint_of(sock.getpeername())))
            sent, t0, how = 0, time.monotonic(), "still connected"
            try:
                while sent < args["max_requests"]:
                    sock.sendall(frame)
                    sent += 1
            except (ConnectionResetError, BrokenPipeError) as exc:
                how = type(exc).__name__
            except TimeoutError:
                how = "send blocked for 10 s (the server stopped reading but kept the connection)"
            rounds.append({"requests": sent, "seconds": time.monotonic() - t0, "ended_by": how})
        finally:
            sock.close()
    return {"rounds": rounds}


async def _bulkvictim(args: dict[str, Any]) -> None:
    """Start a transfer the server pulls from us, say so, then wait to be killed mid-transfer."""
    from svcframe import Engine

    async with Engine(None, bulk_chunk_bytes=64 * 1024) as engine:  # small chunks: the transfer yields often
        data = bytearray(os.urandom(1024)) * (args["size"] // 1024)
        handle = engine.expose(data, "r")
        call = asyncio.ensure_future(
            engine.call(args["address"], "sha_pull", {"bulk": handle.to_wire()}, provider_id=RELTEST_ID,
                        timeout_seconds=60)
        )  # fmt: skip
        conn = await engine.connection(args["address"])
        for _ in range(10_000_000):  # until the server is pulling: our engine serves its BULK_PULL in chunks
            if conn.serving or call.done():
                break
            await asyncio.sleep(0)  # every loop iteration: the moment the server starts pulling
        outcome = None
        if call.done():
            outcome = repr(call.exception()) if call.exception() else f"finished: {call.result()!r:.80}"
        print(json.dumps({"started": True, "done": call.done(), **({"outcome": outcome} if outcome else {})}),
              flush=True)  # fmt: skip
        await asyncio.sleep(3600)


async def _bulkvictim_raw(args: dict[str, Any]) -> None:
    """Like bulkvictim, at the protocol level, so the moment is exact: ask the server to pull ``size`` bytes
    from us, answer its BULK_PULL with half of a 1 MiB data frame, say so, then wait to be killed."""
    reader, writer = await open_raw(args["address"])
    await raw_handshake(reader, writer, secret(), "victim-1")
    handle = [None, "victim-1", b"v" * 16, args["size"], "r"]
    writer.write(request(1, RELTEST_ID, "sha_pull", pack_body({"bulk": handle}), deadline_usec=60_000_000))
    while True:
        fields, _ = await read_frame(reader)
        if fields[2] == Kind.BULK_PULL:
            break
    chunk = MIB
    writer.write(encode_frame(Kind.BULK_DATA_REPLY, fields[7], b"d" * chunk)[: HEADER_SIZE + chunk // 2])
    await writer.drain()
    print(json.dumps({"started": True, "done": False}), flush=True)
    await asyncio.sleep(3600)


async def _netclient(args: dict[str, Any]) -> None:
    """A client driven line by line on stdin (for a network namespace); one JSON line out per command:
    ``call T`` (one call, deadline T s), ``burst N T`` (N concurrent calls), ``until_ok T LIMIT`` (calls with
    deadline T until one succeeds or LIMIT s passed), ``quit``."""
    from svcframe import Engine

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with Engine(None) as engine:

        async def one(deadline: float) -> dict[str, Any]:
            t0 = time.monotonic()
            try:
                await engine.call(args["address"], "noop", 1, provider_id=RELTEST_ID, timeout_seconds=deadline)
                error = None
            except Exception as exc:  # reported to the test
                error = type(exc).__name__
            return {"error": error, "seconds": time.monotonic() - t0}

        while line := (await reader.readline()).decode().split():
            if line[0] == "call":
                out: Any = await one(float(line[1]))
            elif line[0] == "burst":
                out = await asyncio.gather(*(one(float(line[2])) for _ in range(int(line[1]))))
            elif line[0] == "until_ok":
                t0, attempts, errors = time.monotonic(), 0, []
                while time.monotonic() - t0 < float(line[2]):
                    attempts += 1
                    got = await one(float(line[1]))
                    if got["error"] is None:
                        break
                    errors.append(got["error"])
                out = {"seconds": time.monotonic() - t0, "attempts": attempts, "errors": errors,
                       "ok": got["error"] is None}  # fmt: skip
            else:
                break
            print(json.dumps(out), flush=True)


def main(argv: list[str]) -> None:
    mode, args = argv[1], json.loads(argv[2])
    import uvloop

    if mode == "attack":
        print(json.dumps(uvloop.run(_attack(args))), flush=True)
    elif mode == "slowreader":
        print(json.dumps(_slowreader(args)), flush=True)
    elif mode == "bulkvictim":
        uvloop.run(_bulkvictim(args))
    elif mode == "bulkvictim_raw":
        uvloop.run(_bulkvictim_raw(args))
    elif mode == "netclient":
        uvloop.run(_netclient(args))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


def run_peer(mode: str, args: dict[str, Any], timeout_seconds: float = 120.0) -> dict[str, Any]:
    """Run a script mode to completion in its own process and return its JSON report."""
    out = subprocess.run(
        [sys.executable, __file__, mode, json.dumps(args)], capture_output=True, text=True, timeout=timeout_seconds,
        env=server_env(),
    )  # fmt: skip
    if out.returncode != 0:
        raise AssertionError(f"{mode} peer failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def start_peer(mode: str, args: dict[str, Any], prefix: Sequence[str] = ()) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, sys.executable, __file__, mode, json.dumps(args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.PIPE, text=True, env=server_env(), start_new_session=True, preexec_fn=testing.die_with_parent,
    )  # fmt: skip


@dataclass
class Sampler:
    """Samples a server's RSS in a background thread (so the loop under test is not the one sampling)."""

    server: ServerProcess
    interval_seconds: float = 0.02
    samples: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            with contextlib.suppress(psutil.Error):
                self.samples.append(self.server.rss())

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT_DIR))
    main(sys.argv)
