"""Bulk handles: what a process gives out for a buffer it exposes, and the buffers bulk transfers take.

A ``BulkHandle`` names an exposed buffer (its owner's engine id and address, a 16-byte random bulk id, its size
and mode) and travels in RPC arguments as ``to_wire()``'s list. ``as_byte_view`` makes the flat, byte-addressed
view every transfer moves bytes through.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .errors import BulkError, BulkUsageError

__all__ = ["BULK_ID_BYTES", "MODES", "READ", "READ_WRITE", "WRITE", "BulkHandle", "as_byte_view", "short_id"]

READ = "r"
WRITE = "w"
READ_WRITE = "rw"
MODES = (READ, WRITE, READ_WRITE)

Buffer = bytes | bytearray | memoryview


#: Bytes of randomness in a bulk id: a bulk handle is a capability, so its id must be unguessable.
BULK_ID_BYTES = 16


class BulkHandle(NamedTuple):
    """A reference to an exposed buffer: owner's engine id and address, bulk id, size in bytes, mode.

    The bulk id is 16 random bytes (128 bits): holding the handle is what allows a pull or push, like an
    RDMA key, so whoever the handle is given to can use it, and nobody can guess one. The owner revokes it
    with ``Engine.unexpose``.

    Serialise with ``to_wire()`` (a msgpack-friendly list) and rebuild with ``BulkHandle.from_wire``.
    (A tuple, for speed: ``from_wire`` builds one in one C call, where a frozen dataclass's ``__init__``
    would run Python code on the server of every push read. Being a tuple, it compares
    equal to a tuple of its fields, and msgpack packs it as ``to_wire()``'s list.)
    """

    address: str | None
    engine_id: str
    bulk_id: bytes
    size: int
    mode: str

    def to_wire(self) -> list[Any]:
        return list(self)

    @classmethod
    def from_wire(cls, obj: object) -> BulkHandle:
        """Raises BulkError when ``obj`` is not a serialised bulk handle."""
        if (type(obj) is list or isinstance(obj, list | tuple)) and len(obj) == 5:  # (first: a decoded list)
            address, engine_id, bulk_id, size, mode = obj  # (unpacked once: fewer bytecodes a handle)
            if (
                (address is None or isinstance(address, str))
                and isinstance(engine_id, str)
                and isinstance(bulk_id, bytes)
                and len(bulk_id) == BULK_ID_BYTES
                and isinstance(size, int)
                and size >= 0
                and mode in MODES
            ):
                return _new_tuple(cls, obj)
        raise BulkError(f"not a bulk handle: {obj!r:.100}")


_new_tuple = tuple.__new__


def as_byte_view(buf: object, *, writable: bool) -> memoryview:
    """A flat, byte-addressed memoryview of ``buf`` (bytes-like or a C-contiguous numpy array).

    Raises:
        BulkUsageError: not a buffer, not contiguous, or read-only when ``writable``.
    """
    if type(buf) is bytearray or (type(buf) is bytes and not writable):  # the common buffers, flat: a
        return memoryview(buf)  # few bytecodes per into= call (a bytearray), or per push of bytes
    try:
        view = memoryview(buf)  # type: ignore[arg-type]
    except TypeError as exc:
        raise BulkUsageError(f"{type(buf).__name__} is not a bytes-like buffer") from exc
    if not view.c_contiguous:
        raise BulkUsageError("bulk buffers must be C-contiguous (use numpy.ascontiguousarray)")
    if writable and view.readonly:
        raise BulkUsageError(f"a {type(buf).__name__} is read-only; use a bytearray or a writable array")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def short_id(bulk_id: object) -> str:
    """A bulk id in messages and logs: its first 4 bytes in hex (enough to tell handles apart, not to use one)."""
    return bulk_id[:4].hex() + "…" if isinstance(bulk_id, bytes) else repr(bulk_id)[:20]
