"""The self-test provider (Quintain analogue): synthetic server load any service can host.

Config: ``{"type": "selftest"}`` in a bootstrap config, with ``libraries: ["selftest.provider"]``.

RPCs:

* ``work``: ``[resp_buffer_size, bulk_direction, bulk_handle, req_buffer]`` -> ``resp_buffer`` (bytes of
  ``resp_buffer_size``). ``bulk_direction`` is ``"pull"`` (the server reads ``bulk_handle``'s bytes from
  the client) or ``"push"`` (the server writes into the client's buffer) or None for no bulk. Without
  bulk the handler runs inline (no Task). (Quintain's ``qtn_work_rpc``, without its inverted-direction
  bug: here ``pull`` is a pull.)
* ``storage``: ``[op, block_size, fsync]`` -> bytes done. The server writes (``op="write"``) or reads
  (``op="read"``) ``block_size`` bytes at a random ``block_size``-aligned offset of its own file
  ``<storage_dir>/svcframe-selftest-<pid>-<provider_id>.dat`` (``storage_file_bytes`` long), with
  ``os.pwrite`` / ``os.preadv`` in a worker thread (``loop.run_in_executor``) so the event loop keeps
  serving; ``fsync=True`` makes each write durable before the reply. Without fsync the page cache
  absorbs writes and serves reads, as it does for a real service. The file is removed when the provider
  closes. (Storage IOPS and bandwidth: the future work of Carns et al. 2025, section 4.3.)
* ``read``: ``[size, method, bulk_handle]``: the reader's side of a data service, ``size`` bytes of the
  provider's data (real bytes, not untouched zero pages, the same for every method) by one of three
  ``READ_METHODS``: ``"inline"`` returns them as the result (``bytes``); ``"push"`` writes them into
  ``bulk_handle`` (the caller's buffer, exposed ``"w"``) and returns None; ``"pull"`` returns the wire
  form of a bulk handle on a read-only region of the server holding them, which the caller then pulls
  (``svcframe bench --workload client-read`` compares the three). The data of at most four sizes, and of
  ``max_response_bytes`` in all, is kept, each exposed once for pulls and revoked when its size is dropped.
* ``stat``: no argument -> ``{"user_seconds", "system_seconds", "cpu_seconds", "run_seconds",
  "runqueue_wait_seconds", "wall_seconds", "max_rss_bytes", "pid", "progress_mode"}`` from ``getrusage(RUSAGE_SELF)``
  (Quintain's ``qtn_stat_rpc``) and the scheduler's statistics (:func:`scheduler_seconds`; None where the kernel
  keeps none).

Server bulk buffers are kept per size, one for each call that was in flight at once, and reused (Quintain's
poolset), so a bulk workload measures the transfer, not the allocator; they are committed page by page as data
lands, 32 MiB of them are kept at most, and sizes are bounded by ``max_bulk_bytes`` / ``max_response_bytes``.

Retries: every RPC is safe to retry. ``work``, ``read`` and ``stat`` change nothing a caller can observe; a
retried ``storage`` write rewrites a random block of the provider's own scratch file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import resource
import tempfile
import time
from typing import Any

from pydantic import Field

from svcframe import BulkHandle, Provider, ProviderConfig, Request, register_provider_type, rpc
from svcframe.wire import lazy_buffer

PULL = "pull"
PUSH = "push"
DIRECTIONS = (PULL, PUSH)
#: What the ``storage`` RPC does: write or read a block of the provider's file.
STORAGE_OPS = ("write", "read")
#: Bulk and storage buffers kept for reuse between calls, in bytes in all (a run uses one or two sizes; the
#: default suite's largest is 4 MiB): beyond it, buffers are mapped anew per call (their pages fault in again).
_KEEP_BUFFER_BYTES = 32 * 1024 * 1024
#: Response sizes kept ready (a run asks for one).
_KEEP_RESPONSES = 8
INLINE = "inline"
READ_METHODS = (INLINE, PUSH, PULL)  # how a ``read`` hands its bytes to the caller
_KEEP_READ_SIZES = 4  # sizes of ``read`` data kept (a run uses one or two)


def work_arg(
    resp_buffer_size: int, bulk_direction: str | None, bulk: BulkHandle | None, req_buffer: bytes
) -> list[Any]:
    """The argument of the ``work`` RPC (a positional list keeps the request small and fast to decode)."""
    return [resp_buffer_size, bulk_direction, bulk.to_wire() if bulk is not None else None, req_buffer]


@register_provider_type
class SelftestProvider(Provider):
    """Synthetic work for benchmarks. Config: ``max_response_bytes`` (default 64 MiB), ``max_bulk_bytes``
    (default 1 GiB): requests above them are refused with an error; ``storage_dir`` (default: the system
    temporary directory) and ``storage_file_bytes`` (default 256 MiB) for the ``storage`` RPC."""

    type_name = "selftest"

    class Config(ProviderConfig):
        max_response_bytes: int = Field(64 * 1024 * 1024, ge=0)
        max_bulk_bytes: int = Field(1 << 30, ge=0)
        storage_dir: str | None = None
        storage_file_bytes: int = Field(256 * 1024 * 1024, ge=4096)

    settings: Config

    def __init__(self, engine: Any, provider_id: int, **kwargs: Any) -> None:
        super().__init__(engine, provider_id, **kwargs)
        self._responses: dict[int, bytes] = {}
        self._buffers: dict[int, list[Any]] = {}  # size -> idle buffers of it, least recently used size first
        self._kept_bytes = 0
        self._data: dict[int, tuple[bytes, BulkHandle]] = {}  # size -> (read data, its exposed region), LRU first
        self._storage_fd: int | None = None
        self._storage_path: str | None = None

    def _buffer(self, size: int) -> Any:
        """A buffer of ``size`` bytes, an idle one of an earlier call of that size when there is one (give it back
        with ``_keep``): calls in flight at once each get their own, and reuse them call after call, as
        Quintain's poolset does, so a loaded server measures transfers, not page faults. A new buffer's pages are
        committed only as data lands in it."""
        idle = self._buffers.get(size)
        if idle:
            self._kept_bytes -= size
            return idle.pop()
        return memoryview(lazy_buffer(size)) if size else bytearray(0)

    def _keep(self, size: int, buf: Any) -> None:
        """Keep ``buf`` for a later call of its size, within ``_KEEP_BUFFER_BYTES`` in all (the sizes least
        recently given back go first): a caller that names many or large sizes, or a transfer that never comes,
        leaves at most that behind."""
        buffers = self._buffers
        idle = buffers.pop(size, None) or []
        idle.append(buf)
        buffers[size] = idle  # this size is now the most recently used
        self._kept_bytes += size
        while self._kept_bytes > _KEEP_BUFFER_BYTES:
            oldest = next(iter(buffers))
            buffers[oldest].pop(0)
            self._kept_bytes -= oldest
            if not buffers[oldest]:
                del buffers[oldest]

    def _response(self, size: int) -> bytes:
        resp = self._responses.get(size)
        if resp is None:
            if not 0 <= size <= self.settings.max_response_bytes:
                raise ValueError(f"resp_buffer_size {size} is outside 0..{self.settings.max_response_bytes}")
            responses = self._responses
            while len(responses) >= _KEEP_RESPONSES:  # at most a few sizes (one per size would grow without end)
                del responses[next(iter(responses))]
            resp = responses[size] = bytes(size)
        return resp

    @rpc
    def work(self, req: Request, arg: Any) -> Any:
        resp_size, direction, handle, _req_buffer = arg
        if direction is None:
            resp = self._responses.get(resp_size)  # the noop path: one dict lookup, no further call
            return resp if resp is not None else self._response(resp_size)
        return self._work_bulk(req, resp_size, direction, BulkHandle.from_wire(handle))

    async def _work_bulk(self, req: Request, resp_size: int, direction: str, handle: BulkHandle) -> bytes:
        size = handle.size
        if direction not in DIRECTIONS:
            raise ValueError(f"bulk_direction {direction!r}: expected {' or '.join(map(repr, DIRECTIONS))}")
        if size > self.settings.max_bulk_bytes:
            raise ValueError(f"bulk of {size} bytes exceeds max_bulk_bytes {self.settings.max_bulk_bytes}")
        buf = self._buffer(size)
        try:
            if direction == PULL:
                await req.engine.pull(handle, buf)
            else:
                await req.engine.push(handle, buf)
        finally:
            self._keep(size, buf)
        return self._response(resp_size)

    def _read_data(self, size: int) -> tuple[bytes, BulkHandle]:
        """``size`` bytes of data for ``read`` and the read-only region exposing them, made once per size.
        The bytes are written (a repeated random block), so a transfer reads memory, as a real service's
        does, not the shared zero page an untouched allocation maps. Their memory is committed: the sizes
        kept hold ``max_response_bytes`` at most in all."""
        entry = self._data.pop(size, None)
        if entry is None:
            limit = self.settings.max_response_bytes
            if not isinstance(size, int) or not 0 < size <= limit:
                raise ValueError(f"read size {size!r} is outside 1..{limit}")
            while self._data and (len(self._data) >= _KEEP_READ_SIZES or size + sum(self._data) > limit):
                self.engine.unexpose(self._data.pop(next(iter(self._data)))[1])  # the least recently used
            block = os.urandom(4096)
            data = (block * (size // len(block) + 1))[:size]
            entry = (data, self.engine.expose(data, "r"))
        self._data[size] = entry
        return entry

    @rpc
    def read(self, req: Request, arg: Any) -> Any:
        size, method, handle = arg
        if method not in READ_METHODS:
            raise ValueError(f"read method {method!r}: expected one of {READ_METHODS}")
        data, region = self._read_data(size)
        if method == INLINE:
            return data  # a large bytes result leaves as a bin header plus this object: no copy
        if method == PULL:
            return region.to_wire()
        return req.engine.push(BulkHandle.from_wire(handle), data)  # done at once (ahead of the answer), or a Task

    def _storage_file(self) -> int:
        if self._storage_fd is None:
            directory = self.settings.storage_dir or tempfile.gettempdir()
            path = os.path.join(directory, f"svcframe-selftest-{os.getpid()}-{self.provider_id}.dat")
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            os.ftruncate(fd, self.settings.storage_file_bytes)
            self._storage_fd, self._storage_path = fd, path
        return self._storage_fd

    @rpc
    async def storage(self, req: Request, arg: Any) -> int:
        op, block_size, fsync = arg
        if op not in STORAGE_OPS:
            raise ValueError(f"storage op {op!r}: expected {' or '.join(map(repr, STORAGE_OPS))}")
        file_bytes = self.settings.storage_file_bytes
        limit = min(file_bytes, self.settings.max_bulk_bytes)
        if not isinstance(block_size, int) or not 0 < block_size <= limit:
            raise ValueError(f"storage block_size {block_size!r} is outside 1..{limit}")
        fd = self._storage_file()
        offset = random.randrange(file_bytes // block_size) * block_size
        buf = self._buffer(block_size)
        try:
            loop = asyncio.get_running_loop()
            if op == "write":
                done = await loop.run_in_executor(None, _write_block, fd, buf, offset, bool(fsync))
            else:
                done = await loop.run_in_executor(None, os.preadv, fd, [buf], offset)
        finally:
            self._keep(block_size, buf)
        return int(done)

    async def close(self) -> None:
        for _, region in self._data.values():
            self.engine.unexpose(region)
        self._data.clear()
        if self._storage_fd is not None:
            os.close(self._storage_fd)
            self._storage_fd = None
        if self._storage_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._storage_path)
            self._storage_path = None
        await super().close()

    @rpc
    def stat(self, req: Request, _: Any) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        scheduled = scheduler_seconds()
        return {
            "user_seconds": usage.ru_utime,
            "system_seconds": usage.ru_stime,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "run_seconds": scheduled[0] if scheduled else None,
            "runqueue_wait_seconds": scheduled[1] if scheduled else None,
            "wall_seconds": time.monotonic(),
            "max_rss_bytes": usage.ru_maxrss * 1024,
            "pid": os.getpid(),
            "progress_mode": self.engine.progress.mode,  # the live engine's (engine.progress_mode, patchable)
        }


def scheduler_seconds() -> tuple[float, float] | None:
    """``(run, runqueue wait)``: seconds this process's threads ran on a core, and seconds they were ready to run
    but waited for one (another process had it), summed over its live threads, from the kernel's scheduler
    statistics (``/proc/self/task/*/schedstat``, Linux ``CONFIG_SCHED_INFO``); None where they are not kept.

    Their sum over a wall-clock interval is how much of a core the process *wanted*: a process that used 15% of
    a core and waited for it 70% of the time was starved by others, not idle.
    """
    run = wait = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                fields = f.read().split()
        except OSError:
            continue  # a thread that just ended
        if len(fields) < 2:
            return None
        run, wait = run + int(fields[0]), wait + int(fields[1])
    return run / 1e9, wait / 1e9


def _write_block(fd: int, buf: bytearray, offset: int, fsync: bool) -> int:
    done = os.pwrite(fd, buf, offset)
    if fsync:
        os.fdatasync(fd)
    return done
