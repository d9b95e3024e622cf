"""A testing kit for providers and services (grpclib's ``testing.ChannelFor``, with real sockets).

Three tools, each usable from any test framework (the examples use pytest with pytest-asyncio):

``ProviderFor``: a provider type running in a server in this process, on a real loopback tcp or unix socket,
and a client handle to it::

    from svcframe.testing import ProviderFor

    async def test_add():
        async with ProviderFor("counter", library="counter") as counter:   # a ProviderHandle
            assert await counter.call("add", 5) == 5

``ServerProcess``: a ``svcframe serve`` process started from a config, returned once it reported ready on a
readiness pipe (never a sleep); stopped, or killed, at the end; its log kept::

    with ServerProcess.start({"libraries": ["counter"], "providers": [...]}, workdir=tmp_path) as server:
        ... server.address ...

``RawPeer``: a connection that speaks the wire protocol by hand (handshake included, with or without the
shared secret), to send frames no conforming engine would and read what the server answers::

    async with await RawPeer.connect(server.address, secret=b"...") as peer:
        peer.send(b"GET / HTTP/1.1\\r\\n\\r\\n")
        await peer.wait_closed()

The kit uses only svcframe's public API and the wire format (``svcframe.wire``); svcframe's own test suite
uses it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from .config import parse_config
from .engine import Engine
from .errors import AuthenticationFailed, ConfigError, ConnectionLost
from .provider import ProviderHandle
from .server import Server
from .wire import HEADER, HEADER_SIZE, Frame, Kind, Status, auth_mac, encode_frame, pack_body, rpc_id, unpack_body

__all__ = ["ProviderFor", "RawPeer", "ServerProcess", "die_with_parent", "short_socket_path"]


def short_socket_path(name: str = "s.sock") -> str:
    """A unix socket path in a fresh directory under /tmp, well inside the 107-byte AF_UNIX limit (uvicorn's
    ``short_socket_name``). The caller removes the directory (``shutil.rmtree(os.path.dirname(path))``)."""
    return os.path.join(tempfile.mkdtemp(prefix="sf", dir="/tmp"), name)


class ProviderFor:
    """An async context manager: a server engine in this process hosting one provider, and a client handle.

    Args:
        provider_type: the provider's type name (``Provider.type_name``).
        config: its configuration (validated by its ``Config`` model, as ``svcframe serve`` would).
        library: the module that registers the type (imported first), when it is not imported already.
        transport: "tcp" (an ephemeral loopback port) or "unix" (a fresh socket path).
        provider_id: its provider id.
        dependencies: its dependencies (Bedrock's grammar, as in a config).
        engine: the server's engine section (a dict; its address is chosen from ``transport``).
        secret: the shared secret of both sides (None: no authentication; default: ``SVCFRAME_SECRET``).
        timeout_seconds: the client handle's default deadline.

    ``async with`` gives a ``ProviderHandle``; ``.server`` is the ``svcframe.server.Server`` and
    ``.client`` the client-only engine. Both are closed on exit.

    Raises:
        ConfigError: the type, config or dependencies are invalid (the message names the JSON path).
    """

    def __init__(
        self,
        provider_type: str,
        config: Mapping[str, Any] | None = None,
        *,
        library: str | None = None,
        transport: str = "tcp",
        provider_id: int = 1,
        dependencies: Mapping[str, Any] | None = None,
        engine: Mapping[str, Any] | None = None,
        secret: bytes | object | None = ...,
        timeout_seconds: float = 10.0,
    ) -> None:
        if transport not in ("tcp", "unix"):
            raise ConfigError(f"transport {transport!r}: expected 'tcp' or 'unix'")
        self._socket_dir: str | None = None
        if transport == "unix":
            path = short_socket_path()
            self._socket_dir = os.path.dirname(path)
            address = f"unix://{path}"
        else:
            address = "tcp://127.0.0.1:0"
        self.document: dict[str, Any] = {
            "engine": {**(engine or {}), "address": address},
            "libraries": [library] if library else [],
            "providers": [
                {
                    "name": provider_type,
                    "type": provider_type,
                    "provider_id": provider_id,
                    "config": dict(config or {}),
                    "dependencies": dict(dependencies or {}),
                }
            ],
        }
        self.provider_id = provider_id
        self._secret = secret
        self.timeout_seconds = timeout_seconds
        self.server: Server | None = None
        self.client: Engine | None = None

    async def __aenter__(self) -> ProviderHandle:
        config = parse_config(self.document, "ProviderFor")
        secret_kw: dict[str, Any] = {} if self._secret is ... else {"secret": self._secret}
        try:
            self.server = await Server(config, **secret_kw).start()
            self.client = await Engine(None, **secret_kw).start()
        except BaseException:
            await self._close()
            raise
        return ProviderHandle(self.client, self.server.address, self.provider_id, timeout_seconds=self.timeout_seconds)

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.server is not None:
            await self.server.close()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)


@dataclass
class ServerProcess:
    """One ``svcframe serve`` process. Make it with ``ServerProcess.start``; use it as a context manager (or
    call ``stop``/``kill``) so it never outlives the test.

    Attributes:
        address: the address it listens on (from its readiness message).
        pid: its pid; log_path: its stderr (``log()``, ``log_tail()``).
    """

    proc: subprocess.Popen[bytes]
    config_path: Path
    log_path: Path
    ready_fd: int | None = None
    pid: int = 0
    address: str = ""
    started: float = 0.0  # time.monotonic() when the process was spawned
    ready_at: float = 0.0  # time.monotonic() when it reported readiness
    ready_message: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        config: Mapping[str, Any],
        workdir: str | os.PathLike[str],
        *,
        name: str = "server",
        verbose: bool = False,
        prefix: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        timeout_seconds: float = 30.0,
        die_with_parent: bool = True,
    ) -> ServerProcess:
        """Start ``svcframe serve`` on ``config`` (written to ``workdir/NAME.json``; stderr to ``NAME.log``).

        Args:
            prefix: a wrapper command (``ip netns exec NS``, ``strace -f ...``).
            env: the process environment (default: this process's).
            wait: return once it reported readiness (else call ``wait_ready``).
            die_with_parent: the server is killed when this process dies, however it dies (Linux
                ``PR_SET_PDEATHSIG``): a test run that crashes leaves no server behind.

        Raises:
            AssertionError: it did not report ready in time, or reported a failure (with its log tail).
        """
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / f"{name}.json"
        config_path.write_text(json.dumps(config))
        log_path = workdir / f"{name}.log"
        r, w = os.pipe()
        cmd = [*prefix, sys.executable, "-m", "svcframe", *(["-vv"] if verbose else []), "serve", str(config_path),
               "--ready-fd", str(w)]  # fmt: skip
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                cmd, pass_fds=(w,), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None, start_new_session=True,
                preexec_fn=_die_with_parent if die_with_parent else None,
            )  # fmt: skip
        os.close(w)
        server = cls(proc, config_path, log_path, ready_fd=r, started=time.monotonic())
        if wait:
            server.wait_ready(timeout_seconds)
        return server

    def wait_ready(self, timeout_seconds: float = 30.0) -> ServerProcess:
        """Block until the readiness message (or the process's end); see ``start``."""
        assert self.ready_fd is not None, "wait_ready called twice"
        buf = b""
        deadline = time.monotonic() + timeout_seconds
        try:
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise AssertionError(f"server not ready within {timeout_seconds:g} s\n{self.log_tail()}")
                ready, _, _ = select.select([self.ready_fd], [], [], left)
                if ready:
                    chunk = os.read(self.ready_fd, 4096)
                    if not chunk:
                        break
                    buf += chunk
        finally:
            os.close(self.ready_fd)
            self.ready_fd = None
        self.ready_at = time.monotonic()
        msg: dict[str, Any] = (
            json.loads(buf.split(b"\n")[0]) if buf.strip() else {"ok": False, "error": "exited before readiness"}
        )
        self.ready_message = msg
        if not msg.get("ok"):
            self.kill()
            raise AssertionError(f"server failed to start: {msg.get('error')}\n{self.log_tail()}")
        self.pid, self.address = int(msg["pid"]), str(msg["address"])
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "--- server log tail ---\n" + "\n".join(self.log().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        os.kill(self.pid or self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL (if still running) and reap."""
        if self.proc.poll() is None:
            for pid in {self.pid or self.proc.pid, self.proc.pid}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, grace_seconds: float = 15.0) -> int:
        """SIGTERM (the server drains and exits), SIGKILL after ``grace_seconds``; returns the exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid or self.proc.pid, signal.SIGCONT)
                os.kill(self.pid or self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_seconds)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.proc.returncode)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RawPeer:
    """A hand-driven connection to a server: the handshake by hand, then any bytes or frames.

    Make one with ``await RawPeer.connect(address, secret=...)`` (or ``handshake=False`` to send the first
    bytes yourself). ``read_frame`` reads frames with its own minimal reader (header, then exactly the
    announced body), independent of the decoder it may be testing.
    """

    #: the nonce a raw peer sends in its HELLO (fixed: raw peers replay exchanges byte for byte)
    NONCE = b"raw-peer-nonce16"

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.server_hello: dict[str, Any] = {}

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        secret: bytes | None = None,
        handshake: bool = True,
        engine_id: str = "raw-peer",
        peer_address: str | None = None,
        timeout_seconds: float = 10.0,
    ) -> RawPeer:
        """Open a connection to ``address`` and (unless ``handshake`` is False) complete the handshake as a
        client with ``engine_id`` (and the shared ``secret``, proving it and checking the server's proof).

        Raises:
            AuthenticationFailed: the server refused our proof; ConnectionLost: it refused us otherwise;
            AssertionError: the server's side of the handshake is not what the protocol says.
        """
        if address.startswith("unix://"):
            reader, writer = await asyncio.open_unix_connection(address[len("unix://") :])
        else:
            host, _, port = address[len("tcp://") :].rpartition(":")
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        peer = cls(reader, writer)
        if handshake:
            try:
                await peer.handshake(
                    secret, engine_id=engine_id, peer_address=peer_address, timeout_seconds=timeout_seconds
                )
            except BaseException:
                await peer.close()
                raise
        return peer

    async def handshake(
        self,
        secret: bytes | None,
        *,
        engine_id: str = "raw-peer",
        peer_address: str | None = None,
        timeout_seconds: float = 10.0,
    ) -> dict[str, Any]:
        """Read the server's HELLO, answer it, and with a secret read and check the server's proof."""
        frame = await self.read_frame(timeout_seconds)
        assert frame.kind == Kind.HELLO, f"expected the server's HELLO, got {Kind(frame.kind).name}"
        hello = unpack_body(frame.body or b"")
        assert isinstance(hello, dict)
        self.server_hello = hello
        self.send(self.hello_reply(secret, engine_id=engine_id, peer_address=peer_address))
        if secret is not None and hello.get("auth"):
            proof = await self.read_frame(timeout_seconds)
            if proof.kind == Kind.GOODBYE:
                reason = unpack_body(proof.body or b"")
                error = AuthenticationFailed if proof.status == Status.UNAUTHENTICATED else ConnectionLost
                raise error(f"the server refused the handshake: {reason}")
            assert proof.kind == Kind.HELLO, f"expected the server's proof, got {Kind(proof.kind).name}"
            mac = unpack_body(proof.body or b"")["mac"]  # type: ignore[index]
            expect = auth_mac(secret, "server", hello["nonce"], self.NONCE, hello["engine_id"], engine_id,
                              self.local_endpoint)  # fmt: skip
            assert mac == expect, "the server did not prove the shared secret"
        return hello

    def hello_reply(
        self, secret: bytes | None, *, engine_id: str = "raw-peer", peer_address: str | None = None
    ) -> bytes:
        """This peer's HELLO for the server's (read by ``handshake``); with ``secret``, the client's proof."""
        hello = self.server_hello
        reply: dict[str, Any] = {"engine_id": engine_id, "address": peer_address}
        if secret is not None:
            via = self.remote_endpoint
            reply.update(nonce=self.NONCE, via=via, mac=auth_mac(
                secret, "client", hello["nonce"], self.NONCE, hello["engine_id"], engine_id, via
            ))  # fmt: skip
        return encode_frame(Kind.HELLO, 0, pack_body(reply))

    @property
    def remote_endpoint(self) -> str:
        """The server's end of the connection as this socket sees it ("host:port" or the unix path)."""
        return _endpoint(self.writer.get_extra_info("peername"))

    @property
    def local_endpoint(self) -> str:
        return _endpoint(self.writer.get_extra_info("sockname"))

    # -- sending --------------------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        """Write raw bytes (anything: a frame, part of one, garbage)."""
        self.writer.write(data)

    def request(
        self,
        request_id: int,
        provider_id: int,
        name: str,
        arg: Any = None,
        *,
        body: bytes | None = None,
        flags: int = 0,
        deadline_usec: int = 10_000_000,
    ) -> bytes:
        """Send a REQUEST for RPC ``name`` (``body``: raw bytes instead of ``pack_body(arg)``); returns it."""
        frame = encode_frame(
            Kind.REQUEST, request_id, pack_body(arg) if body is None else body, provider_id=provider_id,
            rpc=rpc_id(name), flags=flags, deadline_usec=deadline_usec,
        )  # fmt: skip
        self.send(frame)
        return frame

    # -- receiving ------------------------------------------------------------------------------------------
    async def read_frame(self, timeout_seconds: float = 10.0) -> Frame:
        """The next frame (its body as bytes; bulk data frames' bodies included).

        Raises:
            TimeoutError: nothing complete within ``timeout_seconds``; asyncio.IncompleteReadError: closed.
        """
        header = await asyncio.wait_for(self.reader.readexactly(HEADER_SIZE), timeout_seconds)
        f = HEADER.unpack(header)
        body = await asyncio.wait_for(self.reader.readexactly(f[6]), timeout_seconds)
        return Frame(f[2], f[3], f[4], f[5], f[7], f[8], f[9], f[10], f[11], f[13], f[14], f[15], f[16], body)

    async def read_response(self, timeout_seconds: float = 10.0) -> tuple[Frame, Any]:
        """The next RESPONSE frame (skipping others) and its decoded body."""
        while True:
            frame = await self.read_frame(timeout_seconds)
            if frame.kind == Kind.RESPONSE:
                return frame, unpack_body(frame.body or b"")

    async def wait_closed(self, timeout_seconds: float = 10.0) -> bytes:
        """Read until the server closes the connection; return everything it sent meanwhile.

        Raises:
            TimeoutError: still open after ``timeout_seconds``.
        """
        got = bytearray()

        async def drain() -> None:
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                while chunk := await self.reader.read(65536):
                    got.extend(chunk)

        await asyncio.wait_for(drain(), timeout_seconds)
        return bytes(got)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()

    async def __aenter__(self) -> RawPeer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _die_with_parent() -> None:
    """A ``preexec_fn`` (it runs in the child, between fork and exec): the child is killed when the thread that
    started it ends (``PR_SET_PDEATHSIG``, Linux; elsewhere nothing), so a test or a bench killed outright leaves
    no server behind, even one in a session of its own, which a terminal's Ctrl-C does not reach."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


#: ``_die_with_parent`` by its public name (``ServerProcess.start``'s argument of that name hides it there).
die_with_parent = _die_with_parent


def _endpoint(name: Any) -> str:
    if isinstance(name, tuple):
        return f"{name[0]}:{name[1]}"
    if isinstance(name, bytes):
        return name.decode(errors="replace")
    return str(name or "")
