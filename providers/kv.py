"""A key-value store provider on SQLite, and its client: how a service is composed from svcframe parts.

The provider (type ``"kv"``) keeps one SQLite database. All SQLite work runs in one dedicated worker
thread per provider, so the event loop never waits for the disk. Small values travel inline in the RPC
argument or result; values larger than ``inline_max_bytes`` move by bulk transfer: for ``put_bulk`` the
server pulls them from a buffer the client exposed, for ``get_bulk`` it pushes them into one.

Example:

    from svcframe import Engine
    from providers.kv import KVClient, KVProvider

    server = await Engine("tcp://127.0.0.1:0").start()
    provider = KVProvider(server, 1, config={"path": "/tmp/kv.sqlite", "durability": "durable"})
    provider.register()
    await provider.start()

    client_engine = await Engine(None).start()          # client-only engine
    kv = KVClient(client_engine, server.address, 1)
    await kv.put("greeting", b"hello")                   # inline
    await kv.put(b"blob", bytes(8 << 20))                # 8 MiB: bulk transfer, chosen automatically
    assert await kv.get("greeting") == b"hello"
    assert await kv.list_keys(prefix="gr") == [b"greeting"]

    server.deregister_provider(1)                        # stop taking calls, then release the database
    await provider.close()
    await client_engine.close()
    await server.close()

Keys are byte strings: a ``str`` key is stored as its UTF-8 encoding, so ``"a"`` and ``b"a"`` name the
same entry, and ``list_keys`` returns ``bytes``. Values are byte strings too: ``put`` stores a ``str`` value as
its UTF-8 encoding (``svcframe call ADDR put '{"key": "k", "value": "text"}' -p 1`` works), ``get`` returns
``bytes``.

Config (JSON, every key optional):

    {"path": "kv-{rank}.sqlite", "durability": "durable", "inline_max_bytes": 65536}

- ``path``: the SQLite file (relative paths are relative to the server's working directory), or
  ``":memory:"`` for a store that disappears when the provider closes. ``{rank}`` in it is replaced by the
  server process's rank (``svcframe launch --procs N``, or the rank srun/mpiexec gave it): SQLite lets one
  process write a file, so the processes of one config need a file each, ``"kv-{rank}.sqlite"``; several
  processes of ``launch --procs N`` on one file are refused before any starts. Default ``kv-<provider id>.sqlite``
  (``kv-<provider id>-<rank>.sqlite`` for several processes).
- ``durability``:
    - ``"durable"`` (default): WAL journal, ``synchronous=FULL``. Each write is one transaction whose
      commit is fsync'ed before the RPC returns: an acknowledged write survives a process kill, an OS
      crash and a power loss.
    - ``"fast"``: WAL journal, ``synchronous=NORMAL``: commits are not fsync'ed, only WAL checkpoints
      are. An acknowledged write survives a process kill (the OS already holds it); an OS crash or a
      power loss can lose the most recent acknowledged writes, but the database stays consistent
      (SQLite's guarantee for WAL with NORMAL). Use it when recent writes can be redone.
- ``inline_max_bytes``: largest value (bytes) that may travel inline in ``put``/``get``; larger ones
  must use ``put_bulk``/``get_bulk``. At most the engine's ``max_body_bytes`` minus 64 KiB.

RPCs (argument -> result; keys are ``str | bytes``):

| RPC | argument | result |
|---|---|---|
| ``put`` | ``{key, value}`` (value: bytes or str) | None |
| ``get`` | ``{key}`` | bytes, or None when the key is missing |
| ``put_bulk`` | ``{key, bulk, size}`` | None (``bulk``: a readable handle's wire form) |
| ``get_bulk`` | ``{key, bulk}`` | the value's length in bytes, or None |
| ``length`` | ``{key}`` | the value's length in bytes, or None |
| ``erase`` | ``{key}`` | True if the key existed |
| ``exists`` | ``{key}`` | bool |
| ``list_keys`` | ``{prefix?, max?, start_after?}`` or None | sorted list of keys (bytes) |
| ``count`` | None | number of keys |
| ``stats`` | None | config plus the live SQLite settings |

The size errors below reach the caller as ``svcframe.errors.AppError`` with ``code`` ``"ValueTooLarge"``
or ``"BufferTooSmall"`` (no traceback); malformed arguments as ``RemoteError`` (``remote_type``
``"TypeError"``/``"ValueError"``).

Retries: a call that is cancelled or ends in ``DeadlineExceeded`` after reaching the server may still have
been applied (``Dropped`` says it was not). Every RPC of this provider is safe to retry: reads change
nothing, and ``put``/``put_bulk``/``erase`` set the final state of one key (repeating one leaves the same
state), so ``KVClient`` may pass ``idempotent=True``. A retried write can still overwrite a newer write by
another client that landed in between.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Literal, TypeVar, cast

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from svcframe.bulk import BulkHandle
from svcframe.engine import Engine, Request
from svcframe.errors import AppError, ConfigError
from svcframe.provider import ConfigContext, Provider, ProviderConfig, ProviderHandle, register_provider_type, rpc
from svcframe.wire import lazy_buffer

log = logging.getLogger("svcframe.providers.kv")

T = TypeVar("T")

DURABILITY_MODES = ("durable", "fast")
DEFAULT_INLINE_MAX_BYTES = 64 * 1024
#: Room left in an inline frame for the key and the msgpack framing around a value.
INLINE_HEADROOM_BYTES = 64 * 1024
DEFAULT_LIST_MAX = 1000

_SYNCHRONOUS = {"durable": "FULL", "fast": "NORMAL"}


class ValueTooLarge(AppError):
    """A value is larger than ``inline_max_bytes`` and must move by bulk transfer."""

    code = "ValueTooLarge"


class BufferTooSmall(AppError):
    """The client's bulk buffer cannot hold the stored value."""

    code = "BufferTooSmall"


Key = str | bytes


def _key(arg: Any) -> bytes:
    """The stored form of the ``key`` field of an RPC argument dict.

    Raises:
        TypeError: ``arg`` is not a dict, or its key is missing or not ``str | bytes``.
    """
    if not isinstance(arg, dict):
        raise TypeError(f"the argument must be a dict with a 'key' field, not {type(arg).__name__}")
    if "key" not in arg:
        raise TypeError("the argument has no 'key' field")
    return _encode_key(arg["key"], "key")


def _encode_key(key: Any, field: str) -> bytes:
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes | bytearray):
        return bytes(key)
    raise TypeError(f"{field!r} must be str or bytes, not {type(key).__name__}")


def _prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix`` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _int_field(arg: dict[str, Any], field: str, default: int | None) -> int | None:
    value = arg.get(field, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field!r} must be an integer >= 0, not {value!r}")
    return value


class _Store:
    """The SQLite side of a provider. Every method runs in the provider's single worker thread."""

    def __init__(self, path: str, durability: str) -> None:
        self.path = path
        self.durability = durability
        self.db: sqlite3.Connection | None = None

    def open(self) -> str:
        """Open (creating if needed) the database; returns the journal mode SQLite actually uses."""
        db = sqlite3.connect(self.path, isolation_level=None)  # autocommit: one statement, one commit
        try:
            journal_mode = str(db.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
            db.execute(f"PRAGMA synchronous={_SYNCHRONOUS[self.durability]}")
            if self.durability == "durable":
                db.execute("PRAGMA fullfsync=ON")  # macOS: flush the drive cache too (no-op elsewhere)
                db.execute("PRAGMA checkpoint_fullfsync=ON")
            db.execute("PRAGMA busy_timeout=5000")  # wait for other connections' locks, in this thread
            db.execute("CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY NOT NULL, value BLOB NOT NULL)")
        except BaseException:
            db.close()
            raise
        self.db = db
        return journal_mode

    def close(self) -> None:
        if self.db is not None:
            self.db.close()  # the last connection checkpoints the WAL into the main file
            self.db = None

    def _db(self) -> sqlite3.Connection:
        if self.db is None:
            raise RuntimeError("the kv store is closed")
        return self.db

    def put(self, key: bytes, value: bytes | bytearray) -> None:
        self._db().execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, value))

    def get_limited(self, key: bytes, limit: int) -> tuple[int, bytes | None] | None:
        """(length, value) with value None when longer than ``limit``; None when the key is missing."""
        row = (
            self._db()
            .execute(
                "SELECT length(value), CASE WHEN length(value) <= ? THEN value END FROM kv WHERE key = ?",
                (limit, key),
            )
            .fetchone()
        )
        if row is None:
            return None
        return int(row[0]), (None if row[1] is None else bytes(row[1]))

    def length(self, key: bytes) -> int | None:
        row = self._db().execute("SELECT length(value) FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def erase(self, key: bytes) -> bool:
        return self._db().execute("DELETE FROM kv WHERE key = ?", (key,)).rowcount > 0

    def exists(self, key: bytes) -> bool:
        return self._db().execute("SELECT 1 FROM kv WHERE key = ?", (key,)).fetchone() is not None

    def count(self) -> int:
        return int(self._db().execute("SELECT count(*) FROM kv").fetchone()[0])

    def list_keys(self, prefix: bytes, start_after: bytes | None, limit: int, budget_bytes: int) -> list[bytes]:
        sql = "SELECT key FROM kv WHERE key >= ?"
        params: list[Any] = [prefix]
        upper = _prefix_upper_bound(prefix)
        if upper is not None:
            sql += " AND key < ?"
            params.append(upper)
        if start_after is not None:
            sql += " AND key > ?"
            params.append(start_after)
        sql += " ORDER BY key LIMIT ?"
        params.append(limit)
        keys: list[bytes] = []
        total = 0
        for (key,) in self._db().execute(sql, params):
            total += len(key)
            if keys and total > budget_bytes:
                break  # keep the reply inside one frame; the caller continues with start_after
            keys.append(bytes(key))
        return keys

    def pragmas(self) -> dict[str, Any]:
        db = self._db()
        return {
            "journal_mode": str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower(),
            "synchronous": int(db.execute("PRAGMA synchronous").fetchone()[0]),
            "sqlite_version": sqlite3.sqlite_version,
        }


@register_provider_type
class KVProvider(Provider):
    """Key-value store provider on SQLite (type ``"kv"``).

    Args:
        engine: the engine to register with.
        provider_id: 0..65534, unique within the process.
        name: the provider's name in the configuration.
        config: ``KVProvider.Config`` (``path``, ``durability``, ``inline_max_bytes``, ``max_value_bytes``);
            see the module docstring.
        dependencies: unused.

    Raises:
        ConfigError: an unknown config key or an invalid value (the message names it).
    """

    type_name: ClassVar[str] = "kv"

    class Config(ProviderConfig):
        """The kv provider's settings. ``path`` and ``inline_max_bytes`` default from the provider id and
        the engine's ``max_body_bytes`` when validated with a ``ConfigContext`` (as every provider's is)."""

        path: str | None = Field(
            None, min_length=1, validate_default=True,
            description="SQLite file or ':memory:' (default kv-<id>.sqlite, kv-<id>-<rank>.sqlite for several "
            "processes); {rank} is replaced by the server process's rank",
        )  # fmt: skip
        durability: Literal["durable", "fast"] = "durable"
        inline_max_bytes: int | None = Field(
            None, ge=0, strict=True, validate_default=True,
            description="largest value put/get move inline (default: 64 KiB, within the engine's max_body_bytes)",
        )  # fmt: skip
        max_value_bytes: int = Field(
            256 * 1024 * 1024, ge=0, le=1_000_000_000, strict=True,
            description="largest value put_bulk accepts (a caller's size claim is checked against it before "
            "anything is allocated; SQLite's own limit is 1e9 bytes)",
        )  # fmt: skip

        @field_validator("path")
        @classmethod
        def _path_of_this_rank(cls, value: str | None, info: ValidationInfo) -> str | None:
            """The default path, ``{rank}`` replaced by the process's rank; a file several processes would open
            is refused (SQLite lets one of them write: the others fail with "database is locked")."""
            context = info.context
            if not isinstance(context, ConfigContext):
                return value
            if value is None:
                return f"kv-{context.provider_id}" + (f"-{context.rank}" if context.procs > 1 else "") + ".sqlite"
            if value == ":memory:" or "{rank}" in value:
                return value.replace("{rank}", str(context.rank))
            if context.procs > 1:
                stem, dot, suffix = value.rpartition(".")
                example = f"{stem}-{{rank}}.{suffix}" if dot else f"{value}-{{rank}}"
                raise ValueError(
                    f"each of the {context.procs} server processes would open {value!r}, and SQLite lets one of "
                    f"them write (the others: 'database is locked'); give a file per rank, such as {example!r} "
                    "({rank} is replaced by each process's rank)"
                )
            return value

        @field_validator("inline_max_bytes")
        @classmethod
        def _within_a_frame(cls, value: int | None, info: ValidationInfo) -> int | None:
            context = info.context
            if not isinstance(context, ConfigContext):
                return value
            max_inline = max(0, context.engine.max_body_bytes - INLINE_HEADROOM_BYTES)
            if value is None:
                return min(DEFAULT_INLINE_MAX_BYTES, max_inline)
            if value > max_inline:
                raise ValueError(
                    f"{value} exceeds {max_inline} (the engine's max_body_bytes {context.engine.max_body_bytes} "
                    f"minus {INLINE_HEADROOM_BYTES} for the key and framing)"
                )
            return value

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
        self._executor: ThreadPoolExecutor | None = None
        self._store: _Store | None = None
        self._journal_mode: str | None = None

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the worker thread and open the database in it.

        Raises:
            ConfigError: the database cannot be opened (missing directory, not a database, locked...).
        """
        if self._executor is not None:
            return
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kv-{self.provider_id}")
        path = self.settings.path
        assert path is not None  # filled in from the provider id (Config)
        store = _Store(path, self.settings.durability)
        try:
            self._journal_mode = await asyncio.get_running_loop().run_in_executor(executor, store.open)
        except sqlite3.Error as exc:
            executor.shutdown(wait=True)
            raise ConfigError(f"kv provider {self.name!r}: cannot open SQLite database {path!r}: {exc}") from exc
        except BaseException:
            executor.shutdown(wait=True)
            raise
        if self._journal_mode != "wal" and path != ":memory:":
            log.warning(
                "kv provider %r: SQLite refused WAL for %s (journal mode %s)", self.name, path, self._journal_mode
            )
        self._executor, self._store = executor, store

    async def close(self) -> None:
        """Close the database (in its thread, after any queued work) and stop the worker thread."""
        executor, store = self._executor, self._store
        if executor is None or store is None:
            return
        self._executor = self._store = None  # new work fails from here on
        try:
            await asyncio.get_running_loop().run_in_executor(executor, store.close)
        finally:
            executor.shutdown(wait=True)  # the queue is empty: this only joins the idle thread

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(store, *args)`` in the worker thread."""
        executor, store = self._executor, self._store
        if executor is None or store is None:
            raise RuntimeError(f"kv provider {self.name!r} is not started (or already closed)")
        return await asyncio.get_running_loop().run_in_executor(executor, fn, store, *args)

    # -- RPCs ----------------------------------------------------------------------------------------
    @rpc
    async def put(self, req: Request, arg: Any) -> None:
        """Store ``arg["value"]`` (bytes, at most ``inline_max_bytes``) under ``arg["key"]``.

        Returns once the write is committed (and, in ``durable`` mode, fsync'ed).

        Raises:
            ValueTooLarge: the value is larger than ``inline_max_bytes`` (use ``put_bulk``).
            TypeError: malformed argument.
        """
        key = _key(arg)
        value = arg.get("value")
        if isinstance(value, str):
            value = value.encode("utf-8")  # stored as its UTF-8 encoding, as a str key is
        if not isinstance(value, bytes | bytearray):
            raise TypeError(f"'value' must be bytes or str, not {type(value).__name__}")
        limit = self.settings.inline_max_bytes
        assert limit is not None  # filled in from the engine's settings (Config)
        if len(value) > limit:
            raise ValueTooLarge(
                f"the value is {len(value)} bytes, over this provider's inline_max_bytes "
                f"({limit}); send it with put_bulk (KVClient.put does this automatically)"
            )
        await self._run(_Store.put, key, value)

    @rpc
    async def get(self, req: Request, arg: Any) -> bytes | None:
        """The value stored under ``arg["key"]``, or None when the key is missing.

        Raises:
            ValueTooLarge: the stored value is larger than ``inline_max_bytes`` (use ``get_bulk``).
        """
        key = _key(arg)
        limit = self.settings.inline_max_bytes
        assert limit is not None  # filled in from the engine's settings (Config)
        found = await self._run(_Store.get_limited, key, limit)
        if found is None:
            return None
        size, value = found
        if value is None:
            raise ValueTooLarge(
                f"the value is {size} bytes, over this provider's inline_max_bytes "
                f"({limit}); read it with get_bulk (KVClient.get does this automatically)"
            )
        return value

    @rpc
    async def put_bulk(self, req: Request, arg: Any) -> None:
        """Pull ``arg["size"]`` bytes (default: the whole handle) from the caller's exposed buffer
        ``arg["bulk"]`` (a readable ``BulkHandle.to_wire()``) and store them under ``arg["key"]``.

        Raises:
            BulkError: not a bulk handle, not readable, or ``size`` larger than the handle.
            TypeError / ValueError: malformed argument.
        """
        key = _key(arg)
        handle = BulkHandle.from_wire(arg.get("bulk"))
        size = _int_field(arg, "size", handle.size)
        assert size is not None
        if size > handle.size:
            raise ValueError(f"'size' is {size} bytes but the bulk handle covers only {handle.size} bytes")
        if size > self.settings.max_value_bytes:
            raise ValueTooLarge(
                f"the value is {size} bytes, over this provider's max_value_bytes ({self.settings.max_value_bytes})"
            )
        # pages are committed as the owner's bytes arrive: a size claim alone costs nothing
        value = memoryview(lazy_buffer(size)) if size else b""
        if size:
            await req.engine.pull(handle, value, size=size, timeout_seconds=req.remaining_seconds())
        await self._run(_Store.put, key, value)

    @rpc
    async def get_bulk(self, req: Request, arg: Any) -> int | None:
        """Push the value stored under ``arg["key"]`` into the start of the caller's exposed writable
        buffer ``arg["bulk"]`` (a ``BulkHandle.to_wire()`` of mode "w" or "rw").

        Returns:
            The value's length in bytes (the bytes of the buffer after it are untouched), or None when
            the key is missing (the buffer is untouched).

        Raises:
            BufferTooSmall: the buffer is smaller than the value (the message gives the needed size).
            BulkError: not a bulk handle, or not writable.
        """
        key = _key(arg)
        handle = BulkHandle.from_wire(arg.get("bulk"))
        found = await self._run(_Store.get_limited, key, handle.size)
        if found is None:
            return None
        size, value = found
        if value is None:
            raise BufferTooSmall(
                f"the value is {size} bytes but the bulk buffer holds only {handle.size} bytes; "
                f"expose a writable buffer of at least {size} bytes"
            )
        if size:
            await req.engine.push(handle, value, timeout_seconds=req.remaining_seconds())
        return size

    @rpc
    async def length(self, req: Request, arg: Any) -> int | None:
        """The length in bytes of the value stored under ``arg["key"]``, or None when it is missing."""
        return await self._run(_Store.length, _key(arg))

    @rpc
    async def erase(self, req: Request, arg: Any) -> bool:
        """Remove ``arg["key"]``. Returns True if it existed."""
        return await self._run(_Store.erase, _key(arg))

    @rpc
    async def exists(self, req: Request, arg: Any) -> bool:
        """Whether ``arg["key"]`` is stored."""
        return await self._run(_Store.exists, _key(arg))

    @rpc
    async def list_keys(self, req: Request, arg: Any) -> list[bytes]:
        """Keys in ascending byte order.

        Args:
            arg: None or a dict with optional ``prefix`` (str | bytes: only keys starting with it),
                ``max`` (int >= 0, default 1000: at most this many keys) and ``start_after``
                (str | bytes: only keys after it, for paging).

        Returns:
            Up to ``max`` keys (bytes). Fewer are returned when their total size would exceed half the
            engine's ``max_body_bytes``; page on with ``start_after`` = the last key until a call returns [].
        """
        arg = {} if arg is None else arg
        if not isinstance(arg, dict):
            raise TypeError(f"the argument must be None or a dict, not {type(arg).__name__}")
        prefix = _encode_key(arg.get("prefix") or b"", "prefix")
        start_after = None if arg.get("start_after") is None else _encode_key(arg["start_after"], "start_after")
        limit = _int_field(arg, "max", DEFAULT_LIST_MAX)
        budget = self.engine.max_body_bytes // 2
        return await self._run(_Store.list_keys, prefix, start_after, limit, budget)

    @rpc
    async def count(self, req: Request, arg: Any) -> int:
        """The number of stored keys."""
        return await self._run(_Store.count)

    @rpc
    async def stats(self, req: Request, arg: Any) -> dict[str, Any]:
        """The config plus the live SQLite settings: ``journal_mode`` (e.g. "wal"), ``synchronous``
        (SQLite's number: 0 = OFF, 1 = NORMAL, 2 = FULL) and ``sqlite_version``."""
        return {**self.get_config(), **(await self._run(_Store.pragmas))}


class KVClient:
    """Client of a ``kv`` provider: a thin layer over ``ProviderHandle`` that picks inline or bulk
    transfer by value size.

    Args:
        engine: the local engine (a client-only ``Engine(None)`` is enough).
        address: the server engine's address.
        provider_id: the kv provider's id.
        inline_max_bytes: the provider's inline limit in bytes; None (default) asks the provider once,
            on the first ``put`` or ``get``.
        timeout_seconds: deadline of each call (default: the engine's default).

    Every method raises the errors of ``Engine.call`` (svcframe.errors): ``RemoteError`` for the
    provider's errors, ``NoSuchProvider``, ``DeadlineExceeded``, ``ConnectionLost``...
    """

    #: How many times ``get`` retries when the value changes size between ``length`` and the read.
    RETRIES = 3

    def __init__(
        self,
        engine: Engine,
        address: str,
        provider_id: int,
        *,
        inline_max_bytes: int | None = None,
        timeout_seconds: float | None = None,
    ) -> None:
        self.engine = engine
        self.handle = ProviderHandle(engine, address, provider_id, timeout_seconds=timeout_seconds)
        self._inline_max_bytes = inline_max_bytes

    async def inline_max_bytes(self) -> int:
        """The provider's inline limit in bytes (asked once, then cached)."""
        if self._inline_max_bytes is None:
            self._inline_max_bytes = int((await self.stats())["inline_max_bytes"])
        return self._inline_max_bytes

    async def put(self, key: Key, value: Any) -> None:
        """Store ``value`` under ``key``; returns once the provider committed it.

        Args:
            key: str (stored as UTF-8) or bytes.
            value: bytes-like (bytes, bytearray, memoryview, contiguous numpy array). Values over the
                inline limit are exposed read-only and pulled by the provider (keep them unchanged
                until this returns).
        """
        with memoryview(value) as view:
            if view.nbytes <= await self.inline_max_bytes():
                inline = value if isinstance(value, bytes) else view.tobytes()
                try:
                    await self.handle.call("put", {"key": key, "value": inline})
                    return
                except AppError as exc:
                    if exc.code != ValueTooLarge.code:
                        raise
                    # our inline_max_bytes is larger than the provider's: fall through to bulk
        bulk = self.engine.expose(value, "r")
        try:
            await self.handle.call("put_bulk", {"key": key, "bulk": bulk.to_wire(), "size": bulk.size})
        finally:
            self.engine.unexpose(bulk)

    async def get(self, key: Key) -> bytes | None:
        """The value stored under ``key``, or None when it is missing.

        Asks the value's ``length`` first, then reads it inline (``get``) or, over the inline limit,
        into a new bytearray the provider pushes into (``get_bulk``): two round trips.
        """
        limit = await self.inline_max_bytes()
        inline_refused = False
        for attempt in range(self.RETRIES + 1):
            last = attempt == self.RETRIES
            size = await self.length(key)
            if size is None:
                return None
            if size <= limit and not inline_refused:
                try:
                    value: bytes | None = await self.handle.call("get", {"key": key})
                except AppError as exc:
                    if last or exc.code != ValueTooLarge.code:
                        raise
                    # it grew since we asked its length, or our limit is larger than the provider's
                    inline_refused = True
                    continue
                return value
            buf = bytearray(size)
            bulk = self.engine.expose(buf, "w")
            try:
                got: int | None = await self.handle.call("get_bulk", {"key": key, "bulk": bulk.to_wire()})
            except AppError as exc:
                if last or exc.code != BufferTooSmall.code:
                    raise
                continue  # it grew since we asked its length
            finally:
                self.engine.unexpose(bulk)
            if got is None:
                return None  # erased since we asked its length
            return bytes(buf) if got == size else bytes(buf[:got])  # it shrank since we asked its length
        raise AssertionError("unreachable")  # pragma: no cover

    async def length(self, key: Key) -> int | None:
        """The length in bytes of the value under ``key``, or None when it is missing."""
        return cast("int | None", await self.handle.call("length", {"key": key}))

    async def erase(self, key: Key) -> bool:
        """Remove ``key``. Returns True if it existed."""
        return cast(bool, await self.handle.call("erase", {"key": key}))

    async def exists(self, key: Key) -> bool:
        """Whether ``key`` is stored."""
        return cast(bool, await self.handle.call("exists", {"key": key}))

    async def list_keys(
        self, prefix: Key | None = None, max_keys: int = DEFAULT_LIST_MAX, start_after: Key | None = None
    ) -> list[bytes]:
        """Up to ``max_keys`` keys starting with ``prefix``, after ``start_after``, in byte order.

        May return fewer than ``max_keys`` when the keys are large; page on with ``start_after`` set
        to the last key returned until the result is empty.
        """
        arg: dict[str, Any] = {"max": max_keys}
        if prefix is not None:
            arg["prefix"] = prefix
        if start_after is not None:
            arg["start_after"] = start_after
        return cast("list[bytes]", await self.handle.call("list_keys", arg))

    async def count(self) -> int:
        """The number of stored keys."""
        return cast(int, await self.handle.call("count"))

    async def stats(self) -> dict[str, Any]:
        """The provider's config and live SQLite settings (see ``KVProvider.stats``)."""
        return cast("dict[str, Any]", await self.handle.call("stats"))


__all__ = ["BufferTooSmall", "KVClient", "KVProvider", "ValueTooLarge"]
