"""A blob store provider whose index lives in a key-value provider: a service composed of two providers.

The ``blob`` provider keeps each blob's bytes in a file of its own directory and its index (name ->
file, size, SHA-256) in a ``kv`` provider it depends on, in the same process or in another one
(Bedrock's dependency grammar):

    {"libraries": ["providers.kv", "providers.blob"],
     "providers": [
       {"name": "blob_index", "type": "kv", "provider_id": 1, "config": {"path": "blob-index.sqlite"}},
       {"name": "blobs", "type": "blob", "provider_id": 2, "config": {"path": "blobs"},
        "dependencies": {"index": "blob_index@local"}}]}

or, with the index in another server process: ``"index": "kv:1@tcp://HOST:PORT"`` (or
``"blob_index@tcp://HOST:PORT"``); the server then looks the provider up through that server's admin
provider, waiting up to ``admin.dependency_resolution_timeout_seconds`` for it to appear
(``configs/blob-index.json`` + ``configs/blob-store.json`` are that pair; ``configs/blob.json`` is the
one-process service).

Data never passes through msgpack: the client exposes its buffer and the provider pulls the blob from it
(``put``) or pushes it into it (``get``), in chunks of ``chunk_bytes`` overlapped with the file I/O,
which runs in worker threads. A ``put`` writes a new file (fsync'ed unless ``fsync`` is false), then
publishes it in the index, then deletes the file it replaced: a reader sees the old blob or the new one,
never a partial one. The SHA-256 is computed as the data arrives and returned by every call, so a client
can check end to end (``BlobClient.get(verify=True)`` does).

Config (every key optional):

    {"path": "blob-<provider_id>", "chunk_bytes": 4194304, "max_blob_bytes": 1073741824,
     "index_prefix": "<provider name>/", "fsync": true}

- ``path``: directory of the data files (created if missing; relative to the server's working directory).
- ``chunk_bytes``: bytes per bulk transfer and file write/read (two such buffers per transfer in flight).
- ``max_blob_bytes``: largest blob accepted.
- ``index_prefix``: prefix of this provider's keys in the index (several blob providers may share one
  kv provider with different prefixes).
- ``fsync``: fsync each data file before publishing it.

Dependencies: ``index`` (type ``kv``, required).

RPCs (argument -> result; ``name`` is a non-empty string):

| RPC | argument | result |
|---|---|---|
| ``put`` | ``{name, bulk, size?}`` | ``{name, size, sha256}`` (pulls ``size`` bytes, default the whole readable handle) |
| ``get`` | ``{name, bulk}`` | ``{name, size, sha256}`` after pushing the blob into the start of the writable handle; None if missing |
| ``stat`` | ``{name}`` | ``{name, size, sha256}``, or None |
| ``erase`` | ``{name}`` | True if it existed |
| ``list`` | ``{prefix?, max?, start_after?}`` | sorted names |

Size errors reach the caller as ``svcframe.errors.AppError`` with ``code`` ``"BlobTooLarge"`` or
``"BufferTooSmall"``; malformed arguments as ``RemoteError`` (``remote_type`` ``"TypeError"``/``"ValueError"``);
index errors are the kv provider's.

Retries: ``get``, ``stat`` and ``list`` change nothing and are safe to retry. ``put`` writes the whole blob
and its index entry under one name, so repeating it leaves the same state (safe to retry after
``DeadlineExceeded``, whose outcome is unknown; ``Dropped`` means it never ran). ``erase`` is safe to retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from svcframe.bulk import BulkHandle
from svcframe.engine import Engine, Request
from svcframe.errors import AppError, ConfigError
from svcframe.provider import (
    ConfigContext,
    Dependency,
    Provider,
    ProviderConfig,
    ProviderHandle,
    register_provider_type,
    rpc,
)
from svcframe.wire import lazy_buffer

from .kv import DEFAULT_LIST_MAX, KVClient

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_BLOB_BYTES = 1 << 30
IO_THREADS = 4


class BlobTooLarge(AppError):
    """The blob is larger than the provider's ``max_blob_bytes``."""

    code = "BlobTooLarge"


class BufferTooSmall(AppError):
    """The client's bulk buffer cannot hold the blob."""

    code = "BufferTooSmall"


def _name(arg: Any) -> str:
    if not isinstance(arg, dict):
        raise TypeError(f"the argument must be a dict with a 'name' field, not {type(arg).__name__}")
    name = arg.get("name")
    if not isinstance(name, str) or not name:
        raise TypeError(f"'name' must be a non-empty string, not {name!r}")
    return name


def _write_chunk(f: BinaryIO, digest: Any, data: memoryview) -> None:
    f.write(data)
    digest.update(data)


def _read_chunk(f: io.BufferedReader, buf: bytearray, size: int) -> memoryview:
    view = memoryview(buf)[:size]
    got = f.readinto(view)
    if got != size:
        raise OSError(f"data file ended after {got} of {size} bytes")
    return view


@register_provider_type
class BlobProvider(Provider):
    """Blob store (type ``"blob"``): data files here, index in a ``kv`` provider (dependency ``index``).

    Raises:
        ConfigError: an unknown config key or an invalid value (the message names it).
    """

    type_name: ClassVar[str] = "blob"
    DEPENDENCIES: ClassVar[tuple[Dependency, ...]] = (Dependency("index", type="kv"),)

    class Config(ProviderConfig):
        """The blob provider's settings. ``path`` and ``index_prefix`` default from the provider id and name
        when validated with a ``ConfigContext`` (as every provider's is)."""

        path: str | None = Field(
            None, min_length=1, validate_default=True, description="data directory (default blob-<id>)"
        )
        chunk_bytes: int = Field(DEFAULT_CHUNK_BYTES, ge=4096)
        max_blob_bytes: int = Field(DEFAULT_MAX_BLOB_BYTES, ge=0)
        index_prefix: str | None = Field(
            None, validate_default=True, description="key prefix in the index (default '<name>/')"
        )
        fsync: bool = True

        @field_validator("path")
        @classmethod
        def _default_path(cls, value: str | None, info: ValidationInfo) -> str | None:
            context = info.context
            return f"blob-{context.provider_id}" if value is None and isinstance(context, ConfigContext) else value

        @field_validator("index_prefix")
        @classmethod
        def _default_prefix(cls, value: str | None, info: ValidationInfo) -> str | None:
            context = info.context
            return f"{context.name}/" if value is None and isinstance(context, ConfigContext) else value

    settings: Config

    def __init__(
        self,
        engine: Engine,
        provider_id: int,
        *,
        name: str | None = None,
        config: dict[str, Any] | BaseModel | None = None,
        dependencies: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(engine, provider_id, name=name, config=config, dependencies=dependencies)
        assert self.settings.path is not None and self.settings.index_prefix is not None  # filled in (Config)
        self.path = Path(self.settings.path)
        self.prefix = self.settings.index_prefix
        index = self.dependencies.get("index")
        if isinstance(index, ProviderHandle):  # in another process
            self.index = KVClient(engine, index.address, index.provider_id)
        elif isinstance(index, Provider):  # in this process: call it through our own address
            if engine.address is None:
                raise ConfigError(f"blob provider {self.name!r}: a local index needs a listening engine")
            self.index = KVClient(engine, engine.address, index.provider_id)
        else:
            raise ConfigError(f"blob provider {self.name!r}: dependency 'index' must be a kv provider, not {index!r}")
        self._executor: ThreadPoolExecutor | None = None
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # name -> (lock, [users])

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Create the data directory and the I/O threads.

        Raises:
            ConfigError: the directory cannot be created.
        """
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"blob provider {self.name!r}: cannot create {str(self.path)!r}: {exc}") from exc
        self._executor = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix=f"blob-{self.provider_id}")

    async def close(self) -> None:
        """Stop the I/O threads (after the queued work; the server drained the calls before)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)

    async def _io(self, fn: Any, *args: Any) -> Any:
        if self._executor is None:
            raise RuntimeError(f"blob provider {self.name!r} is not started (or already closed)")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @contextlib.asynccontextmanager
    async def _exclusive(self, name: str) -> AsyncIterator[None]:
        """One index read-modify-write per blob name at a time (the lock is dropped when unused)."""
        entry = self._locks.get(name)
        if entry is None:
            entry = self._locks[name] = (asyncio.Lock(), [0])
        entry[1][0] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1][0] -= 1
            if not entry[1][0]:
                del self._locks[name]

    # -- index -----------------------------------------------------------------------------------------
    def _key(self, name: str) -> bytes:
        return (self.prefix + name).encode()

    async def _entry(self, name: str) -> dict[str, Any] | None:
        raw = await self.index.get(self._key(name))
        return None if raw is None else json.loads(raw)

    # -- RPCs ------------------------------------------------------------------------------------------
    @rpc
    async def put(self, req: Request, arg: Any) -> dict[str, Any]:
        """Pull ``arg["size"]`` bytes (default: all) of the client's readable ``arg["bulk"]`` and store them
        as blob ``arg["name"]``, replacing any previous one.

        Returns:
            ``{name, size, sha256}`` (hex digest of the stored bytes).

        Raises:
            BlobTooLarge: over ``max_blob_bytes``. BulkError: bad handle. TypeError / ValueError: malformed.
        """
        name = _name(arg)
        handle = BulkHandle.from_wire(arg.get("bulk"))
        size = arg.get("size", handle.size)
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= handle.size:
            raise ValueError(f"'size' must be an integer in 0..{handle.size} (the bulk handle's size), not {size!r}")
        if size > self.settings.max_blob_bytes:
            raise BlobTooLarge(
                f"the blob is {size} bytes, over this provider's max_blob_bytes ({self.settings.max_blob_bytes})"
            )
        file_name = uuid.uuid4().hex
        path = self.path / file_name
        digest = hashlib.sha256()
        # Nothing is allocated or created for the caller before its first bytes arrived: the chunk
        # buffers are lazily committed mappings, and the file is created once the first chunk is in.
        chunk = min(self.settings.chunk_bytes, max(size, 1))
        buffers = (lazy_buffer(chunk), lazy_buffer(chunk))
        first = min(chunk, size)
        if first:
            await req.engine.pull(handle, buffers[0], size=first, timeout_seconds=req.remaining_seconds())
        f: BinaryIO = await self._io(open, path, "wb")
        published = False
        try:
            try:
                await self._transfer_in(req, handle, size, f, digest, buffers, first)
                if self.settings.fsync:
                    await self._io(_flush_and_sync, f)
            finally:
                await self._io(f.close)
            entry = {"file": file_name, "size": size, "sha256": digest.hexdigest()}
            async with self._exclusive(name):
                old = await self._entry(name)
                await self.index.put(self._key(name), json.dumps(entry).encode())
                published = True
                if old is not None:
                    await self._io(_unlink, self.path / old["file"])
        finally:
            if not published:
                await self._io(_unlink, path)
        return {"name": name, "size": size, "sha256": entry["sha256"]}

    async def _transfer_in(
        self,
        req: Request,
        handle: BulkHandle,
        size: int,
        f: BinaryIO,
        digest: Any,
        buffers: tuple[Any, Any],
        first: int,
    ) -> None:
        """Pull chunk i+1 while chunk i is written (two buffers); chunk 0 (``first`` bytes) is in ``buffers[0]``."""
        chunk = len(buffers[0])
        writing: asyncio.Future[Any] | None = None
        try:
            for i, offset in enumerate(range(0, size, chunk)):
                n = min(chunk, size - offset)
                buf = buffers[i % 2]
                if offset or not first:
                    await req.engine.pull(handle, buf, offset=offset, size=n, timeout_seconds=req.remaining_seconds())
                if writing is not None:
                    await writing
                writing = asyncio.ensure_future(self._io(_write_chunk, f, digest, memoryview(buf)[:n]))
            if writing is not None:
                await writing
                writing = None
        finally:
            if writing is not None:  # a pull failed while a write was under way: let it finish first
                await asyncio.wait([writing])

    @rpc
    async def get(self, req: Request, arg: Any) -> dict[str, Any] | None:
        """Push blob ``arg["name"]`` into the start of the client's writable ``arg["bulk"]``.

        Returns:
            ``{name, size, sha256}``, or None when there is no such blob (the buffer is untouched).

        Raises:
            BufferTooSmall: the buffer is smaller than the blob (the message gives the size needed).
        """
        name = _name(arg)
        handle = BulkHandle.from_wire(arg.get("bulk"))
        for _ in range(3):  # the file may be replaced between reading the index and opening it
            entry = await self._entry(name)
            if entry is None:
                return None
            if entry["size"] > handle.size:
                raise BufferTooSmall(
                    f"blob {name!r} is {entry['size']} bytes but the bulk buffer holds only {handle.size}; "
                    f"expose a writable buffer of at least {entry['size']} bytes"
                )
            try:
                f: io.BufferedReader = await self._io(open, self.path / entry["file"], "rb")
            except FileNotFoundError:
                continue
            try:
                await self._transfer_out(req, handle, entry["size"], f)
            finally:
                await self._io(f.close)
            return {"name": name, "size": entry["size"], "sha256": entry["sha256"]}
        raise OSError(f"blob {name!r}: its data file keeps disappearing (replaced concurrently?)")

    async def _transfer_out(self, req: Request, handle: BulkHandle, size: int, f: io.BufferedReader) -> None:
        """Read chunk i+1 while chunk i is pushed (two buffers)."""
        chunk = min(self.settings.chunk_bytes, max(size, 1))
        buffers = (bytearray(chunk), bytearray(chunk))
        offsets = list(range(0, size, chunk))
        reading: asyncio.Future[Any] | None = None
        if offsets:
            reading = asyncio.ensure_future(self._io(_read_chunk, f, buffers[0], min(chunk, size)))
        try:
            for i, offset in enumerate(offsets):
                assert reading is not None
                view = await reading
                reading = None
                if i + 1 < len(offsets):
                    nxt = offsets[i + 1]
                    reading = asyncio.ensure_future(
                        self._io(_read_chunk, f, buffers[(i + 1) % 2], min(chunk, size - nxt))
                    )
                await req.engine.push(handle, view, offset=offset, timeout_seconds=req.remaining_seconds())
        finally:
            if reading is not None:
                await asyncio.wait([reading])

    @rpc
    async def stat(self, req: Request, arg: Any) -> dict[str, Any] | None:
        """``{name, size, sha256}`` of blob ``arg["name"]``, or None when it does not exist."""
        name = _name(arg)
        entry = await self._entry(name)
        return None if entry is None else {"name": name, "size": entry["size"], "sha256": entry["sha256"]}

    @rpc
    async def erase(self, req: Request, arg: Any) -> bool:
        """Remove blob ``arg["name"]`` (index entry, then data file). Returns True if it existed."""
        name = _name(arg)
        async with self._exclusive(name):
            entry = await self._entry(name)
            if entry is None:
                return False
            await self.index.erase(self._key(name))
            await self._io(_unlink, self.path / entry["file"])
            return True

    @rpc(name="list")
    async def list_names(self, req: Request, arg: Any) -> list[str]:
        """Blob names in byte order: ``arg`` None or ``{prefix?, max? (default 1000), start_after?}``."""
        arg = {} if arg is None else arg
        if not isinstance(arg, dict):
            raise TypeError(f"the argument must be None or a dict, not {type(arg).__name__}")
        prefix = arg.get("prefix") or ""
        start_after = arg.get("start_after")
        if not isinstance(prefix, str) or not (start_after is None or isinstance(start_after, str)):
            raise TypeError("'prefix' and 'start_after' must be strings")
        keys = await self.index.list_keys(
            prefix=self.prefix + prefix,
            max_keys=int(arg.get("max", DEFAULT_LIST_MAX)),
            start_after=None if start_after is None else self.prefix + start_after,
        )
        return [k.decode()[len(self.prefix) :] for k in keys]


def _flush_and_sync(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


class BlobClient:
    """Client of a ``blob`` provider.

    Args:
        engine: the local engine (a client-only ``Engine(None)`` is enough).
        address: the blob provider's server address.
        provider_id: the blob provider's id.
        timeout_seconds: deadline of each call (default: the engine's default).

    Methods raise the errors of ``Engine.call``; ``RemoteError`` carries the provider's errors.
    """

    RETRIES = 3

    def __init__(self, engine: Engine, address: str, provider_id: int, *, timeout_seconds: float | None = None):
        self.engine = engine
        self.handle = ProviderHandle(engine, address, provider_id, timeout_seconds=timeout_seconds)

    async def put(self, name: str, data: Any) -> dict[str, Any]:
        """Store ``data`` (bytes-like or contiguous numpy array) as blob ``name``; the provider pulls it.
        Keep ``data`` unchanged until this returns. Returns ``{name, size, sha256}``."""
        bulk = self.engine.expose(data, "r")
        try:
            return await self.handle.call("put", {"name": name, "bulk": bulk.to_wire(), "size": bulk.size})  # type: ignore[no-any-return]
        finally:
            self.engine.unexpose(bulk)

    async def get(self, name: str, *, verify: bool = True) -> bytes | None:
        """Blob ``name``, or None when it does not exist: ``stat`` for its size, then the provider pushes
        it into a buffer of that size (retried if it grew in between).

        Raises:
            ValueError: ``verify`` and the received bytes do not match the stored SHA-256.
        """
        for attempt in range(self.RETRIES + 1):
            info = await self.stat(name)
            if info is None:
                return None
            buf = bytearray(info["size"])
            bulk = self.engine.expose(buf, "w")
            try:
                got = await self.handle.call("get", {"name": name, "bulk": bulk.to_wire()})
            except AppError as exc:
                if attempt == self.RETRIES or exc.code != BufferTooSmall.code:
                    raise
                continue
            finally:
                self.engine.unexpose(bulk)
            if got is None:
                return None
            data = bytes(buf[: got["size"]])
            if verify and hashlib.sha256(data).hexdigest() != got["sha256"]:
                raise ValueError(f"blob {name!r}: received bytes do not match the stored SHA-256 {got['sha256']}")
            return data
        raise AssertionError("unreachable")  # pragma: no cover

    async def stat(self, name: str) -> dict[str, Any] | None:
        """``{name, size, sha256}``, or None."""
        return await self.handle.call("stat", {"name": name})  # type: ignore[no-any-return]

    async def erase(self, name: str) -> bool:
        return await self.handle.call("erase", {"name": name})  # type: ignore[no-any-return]

    async def list_names(
        self, prefix: str = "", max_names: int = DEFAULT_LIST_MAX, start_after: str | None = None
    ) -> list[str]:
        """Up to ``max_names`` blob names starting with ``prefix``, after ``start_after``, in byte order."""
        arg: dict[str, Any] = {"prefix": prefix, "max": max_names}
        if start_after is not None:
            arg["start_after"] = start_after
        return await self.handle.call("list", arg)  # type: ignore[no-any-return]


__all__ = ["BlobClient", "BlobProvider", "BlobTooLarge", "BufferTooSmall"]
