"""Bulk handles: the RDMA analogue.

A process *exposes* a buffer and gets a small, serialisable ``BulkHandle`` to pass in an RPC argument.
The peer *pulls* from it (reads the owner's bytes) or *pushes* into it (writes the owner's buffer) with
``Engine.pull`` / ``Engine.push``; the owner's engine serves the transfer in chunks without running any
user code, and the bytes move between the socket and the buffers without passing through msgpack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import BulkError, BulkUsageError

READ = "r"
WRITE = "w"
READ_WRITE = "rw"
MODES = (READ, WRITE, READ_WRITE)

Buffer = bytes | bytearray | memoryview


#: Bytes of randomness in a bulk id: a bulk handle is a capability (issue 13), so its id must be unguessable.
BULK_ID_BYTES = 16


@dataclass(frozen=True, slots=True)
class BulkHandle:
    """A reference to an exposed buffer: owner's engine id and address, bulk id, size in bytes, mode.

    The bulk id is 16 random bytes (128 bits): holding the handle is what allows a pull or push, like an
    RDMA key, so whoever the handle is given to can use it, and nobody can guess one. The owner revokes it
    with ``Engine.unexpose``.

    Serialise with ``to_wire()`` (a msgpack-friendly list) and rebuild with ``BulkHandle.from_wire``.
    """

    address: str | None
    engine_id: str
    bulk_id: bytes
    size: int
    mode: str

    def to_wire(self) -> list[Any]:
        return [self.address, self.engine_id, self.bulk_id, self.size, self.mode]

    @classmethod
    def from_wire(cls, obj: object) -> BulkHandle:
        """Raises BulkError when ``obj`` is not a serialised bulk handle."""
        if (
            isinstance(obj, list | tuple)
            and len(obj) == 5
            and (obj[0] is None or isinstance(obj[0], str))
            and isinstance(obj[1], str)
            and isinstance(obj[2], bytes)
            and len(obj[2]) == BULK_ID_BYTES
            and isinstance(obj[3], int)
            and obj[3] >= 0
            and obj[4] in MODES
        ):
            return cls(obj[0], obj[1], obj[2], obj[3], obj[4])
        raise BulkError(f"not a bulk handle: {obj!r:.100}")


def as_byte_view(buf: object, *, writable: bool) -> memoryview:
    """A flat, byte-addressed memoryview of ``buf`` (bytes-like or a C-contiguous numpy array).

    Raises:
        BulkUsageError: not a buffer, not contiguous, or read-only when ``writable``.
    """
    try:
        view = memoryview(buf)  # type: ignore[arg-type]
    except TypeError as exc:
        raise BulkUsageError(f"{type(buf).__name__} is not a bytes-like buffer") from exc
    if not view.c_contiguous:
        raise BulkUsageError("bulk buffers must be C-contiguous (use numpy.ascontiguousarray)")
    if writable and view.readonly:
        raise BulkUsageError(f"a {type(buf).__name__} is read-only; use a bytearray or a writable array")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view
