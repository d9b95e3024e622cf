"""Cross-memory attach (CMA): one-copy bulk transfers between processes on one node.

Mercury's shared-memory plugin (``na+sm``, under Mochi's Margo) moves bulk data between processes of one
node with Linux's ``process_vm_readv``/``process_vm_writev``: the bytes go from one address space to the
other in a single kernel copy, instead of a copy into a socket buffer and another out of it. svcframe
does the same over ``unix://`` connections, with rules that keep a peer from touching memory it does not
own:

* a process reads a peer's memory only into its own buffers (``process_vm_readv``). A pull reads the
  owner's exposed buffer; a push asks the owner to read the pusher's source (exposed, while the push
  lasts, under a bulk id of its own: the owner's read of it may then be split, as a pull's).
* it writes into a peer's memory (``process_vm_writev``) only where that peer asked, for a read the peer
  is making and waiting on: the first part of a *split read* (``svcframe.split_read``), whose asker copies the
  rest itself meanwhile, so that two cores copy (the asker is the owner of a pushed buffer, too: the
  pusher writes part of its source into it while the owner copies the rest). The asker names a destination in its own memory, a time
  (``time.monotonic_ns``, one clock on one node) after which the writer declines, and where the writer
  puts a mark once done; it does not give the destination back to its caller before the mark is there,
  or the writer answered, or that time is long past. The asker may make that request before the read's
  own request (an *offer*: the writer then writes as it answers the read); until the read is answered
  it may not know whether the writer will take it up, so a read cancelled or timed out meanwhile also
  waits for one of those three (its cancellation withdraws the offer, which the writer answers).
* the peer's pid comes from the kernel (``SO_PEERCRED`` of the unix socket), never from a message, and
  it is checked before every copy that the pid is still that process's (``PeerProcess``: its start time,
  then a pidfd; a pid reused by another process is not touched); the
  addresses come from the peer and point into its own memory (its exposed buffer, its push source, its
  split read's destination).

The kernel checks the rest: reading or writing another process needs ptrace access to it (same user and,
with Yama, ``ptrace_scope`` 0, or ``CAP_SYS_PTRACE``). When it is refused, or on any other error, transfers
fall back to the socket path (a split read's asker copies the whole range itself).
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import socket
import struct
import sys
from typing import Any

try:
    import cython
except ModuleNotFoundError:  # interpreted where Cython is not installed
    from . import _cython as cython

if not cython.compiled:  # the C functions and types the compiled branches use (cma.pxd): never reached here
    PyObject_GetBuffer: Any = None
    PyBuffer_Release: Any = None
    Py_buffer: Any = None
    PyBUF_SIMPLE: Any = None
    PyBUF_WRITABLE: Any = None
    iovec: Any = None
    c_process_vm_readv: Any = None
    c_process_vm_writev: Any = None
    c_errno: Any = None

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_MAX_ADDRESS = (1 << 64) - 1


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _bind(name: str) -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                   ctypes.c_ulong]  # fmt: skip
    fn.restype = ctypes.c_ssize_t
    bound: object = fn
    return bound


_process_vm_readv = _bind("process_vm_readv")
_process_vm_writev = _bind("process_vm_writev")


#: Same-node transfers of at least this size use cross-memory attach; smaller ones are cheaper over the
#: socket (the address round trip and the pid check cost about what copying 64 KiB twice does).
CMA_MIN_BYTES = 256 * 1024


def supported() -> bool:
    """True on Linux with ``process_vm_readv`` in the C library (whether the kernel allows it for a given
    peer is only known when reading)."""
    return _process_vm_readv is not None


def peer_pid(sock: socket.socket | None) -> int | None:
    """The pid of the process at the other end of a unix socket, from the kernel (``SO_PEERCRED``);
    None for any other socket or when the kernel does not say."""
    if sock is None or sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        pid, _, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except OSError:
        return None
    return pid if pid > 0 else None


class PeerProcess:
    """The process at the other end of a unix connection (its pid from ``SO_PEERCRED``), and whether it is
    still that process: checked before every read, since pids are reused.

    The first check compares its start time with the one read when the connection was made, then opens a
    pidfd (Linux 5.3+; ``os.pidfd_open``), which refers to that process and no other; later checks poll it (one
    system call: a pidfd is readable once its process has exited). Without pidfds, every check compares start
    times (``/proc/PID/stat``: an open, a read and a parse, many times the cost of the poll).
    ``close()`` gives the pidfd back (the connection is gone).
    """

    __slots__ = ("_pidfd", "_poll", "pid", "start_time")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start_time = start_time(pid)
        self._pidfd: int | None = None  # (None: not tried yet; -1: none to be had, start times each time)
        self._poll: select.poll | None = None  # (poll, not select: a descriptor may be above FD_SETSIZE)

    def alive(self) -> bool:
        """True when the process that connected still runs (its pid is not another process's)."""
        if self._poll is not None:
            return not self._poll.poll(0)
        if self.start_time is None or start_time(self.pid) != self.start_time:
            return False
        if self._pidfd is None:  # the first check: take a pidfd for the later ones
            try:
                fd = os.pidfd_open(self.pid)
            except (AttributeError, OSError) as exc:  # none to be had here (or refused): start times each time
                self._pidfd = -1
                return getattr(exc, "errno", None) != errno.ESRCH
            if start_time(self.pid) != self.start_time:  # reused in between: the pidfd is another process's
                os.close(fd)
                self.start_time = None
                return False
            self._pidfd, self._poll = fd, select.poll()
            self._poll.register(fd, select.POLLIN)
        return True

    def close(self) -> None:
        """The connection is gone: give the pidfd back; ``alive()`` is False from now on."""
        fd, self._pidfd, self._poll, self.start_time = self._pidfd, None, None, None
        if fd is not None and fd >= 0:
            os.close(fd)


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), None when it is
    gone. Pids are reused: a pid whose start time changed since a connection was made is another process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may contain spaces: count fields after the last ")"
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (part of the stable ABI since Python 3.11)."""

    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]  # fmt: skip


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None
_PyBUF_SIMPLE = 0  # a contiguous buffer, read-only allowed


def buffer_address(view: memoryview) -> int:
    """The virtual address of the first byte of a C-contiguous byte view (read-only views included), 0 when
    it is empty, from the buffer protocol itself (``PyObject_GetBuffer``); the caller keeps ``view`` alive
    while the address is used.

    Raises:
        BufferError: ``view`` is not C-contiguous.
    """
    if not len(view):
        return 0
    if cython.compiled:
        pybuf = cython.declare(Py_buffer)
        PyObject_GetBuffer(view, cython.address(pybuf), PyBUF_SIMPLE)  # raises the BufferError the view sets
        address = cython.cast(cython.size_t, pybuf.buf)
        PyBuffer_Release(cython.address(pybuf))
        return address  # type: ignore[no-any-return]  # (an int: the address)
    buffer = _PyBuffer()
    _get_buffer(view, ctypes.byref(buffer), _PyBUF_SIMPLE)  # raises the BufferError the view sets
    try:
        return int(buffer.buf)
    finally:
        _release_buffer(ctypes.byref(buffer))


def read(pid: int, address: int, dest: memoryview) -> None:
    """Copy ``len(dest)`` bytes at ``address`` in process ``pid`` into ``dest`` (one kernel copy).

    The call releases the GIL, so large copies may run in a worker thread.

    Raises:
        OSError: the kernel refused (EPERM: no ptrace access; ESRCH: no such process; EFAULT: the range
            is not mapped in the peer) or CMA is not supported here (ENOSYS).
        ValueError: ``dest`` is read-only.
    """
    if dest.readonly and len(dest):
        raise ValueError("the destination of a CMA read must be writable")
    if cython.compiled and _process_vm_readv is not None:
        _vm_copy(False, pid, address, dest, 0, b"")
        return
    _transfer(_process_vm_readv, "process_vm_readv", pid, address, dest)


def write(pid: int, address: int, src: memoryview, mark_address: int = 0, mark: bytes = b"") -> None:
    """Copy ``src`` to ``address`` in process ``pid`` (one kernel copy): only where that process asked for
    it (the module's rules). With ``mark_address``, ``mark`` is written there after the data, in the same
    system call: the peer sees the mark only once the data is all there (the kernel copies the ranges in
    order, and x86-64 keeps the order of stores; elsewhere the peer must wait for our answer instead).

    Raises:
        OSError: as ``read`` (EFAULT: the range is not mapped, or not writable, in the peer; a write cut
            short, with a mark, is EFAULT too: the mark was not written; with a mark, at most 2 GiB).
    """
    if cython.compiled and _process_vm_writev is not None:
        _vm_copy(True, pid, address, src, mark_address, mark)
        return
    if not mark_address:
        _transfer(_process_vm_writev, "process_vm_writev", pid, address, src)
        return
    if _process_vm_writev is None:
        raise OSError(38, "process_vm_writev is not available on this platform")  # ENOSYS
    size, total = len(src), len(src) + len(mark)
    if not (0 < address <= _MAX_ADDRESS - size and 0 < mark_address <= _MAX_ADDRESS - len(mark)):
        raise OSError(14, f"process_vm_writev with pid {pid}: address out of range")
    keep = ctypes.create_string_buffer(mark, len(mark))
    local = (_IOVec * 2)(_IOVec(buffer_address(src) if size else 0, size), _IOVec(ctypes.addressof(keep), len(mark)))
    remote = (_IOVec * 2)(_IOVec(address, size), _IOVec(mark_address, len(mark)))
    got = _process_vm_writev(pid, local, 2, remote, 2, 0)  # type: ignore[operator]
    if got != total:
        err = ctypes.get_errno() if got < 0 else 14  # cut short: the mark was not written
        raise OSError(err, f"process_vm_writev with pid {pid}: {os.strerror(err)}")


def _transfer(fn: object | None, name: str, pid: int, address: int, local_view: memoryview) -> None:
    """``len(local_view)`` bytes between ``local_view`` and ``address`` in ``pid``, by ``fn``."""
    if fn is None:
        raise OSError(38, f"{name} is not available on this platform")  # ENOSYS
    size = len(local_view)
    if not size:
        return
    if not 0 < address <= _MAX_ADDRESS - size:  # a peer's address is data from the wire: bound it
        raise OSError(14, f"{name} with pid {pid}: address {address:#x} + {size} is out of range")
    base = buffer_address(local_view)
    done = 0
    while done < size:  # the kernel may copy less than asked (at most 2 GiB - 4 KiB per call)
        local = _IOVec(base + done, size - done)
        remote = _IOVec(address + done, size - done)
        got = fn(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)  # type: ignore[operator]
        if got <= 0:
            err = ctypes.get_errno() if got < 0 else 14  # EFAULT: nothing copied
            raise OSError(err, f"{name} with pid {pid}: {os.strerror(err)}")
        done += got


def _vm_copy(writing: bool, pid: int, address: int, local: memoryview, mark_address: int, mark: bytes) -> int:
    """The compiled build's copy: ``len(local)`` bytes between ``local`` and ``address`` in ``pid``
    (``process_vm_writev`` when ``writing``, else ``process_vm_readv``), the GIL released meanwhile; a write
    with ``mark_address`` puts ``mark`` there after the data in the same call, as ``write`` says. The errors
    of ``read`` and ``write``; 0 when done."""
    name = "process_vm_writev" if writing else "process_vm_readv"
    size = len(local)
    marked = len(mark) if writing and mark_address else 0
    if not size and not marked:
        return 0
    if size and not 0 < address <= _MAX_ADDRESS - size:  # a peer's address is data from the wire: bound it
        raise OSError(14, f"{name} with pid {pid}: address {address:#x} + {size} is out of range")
    if marked and not 0 < mark_address <= _MAX_ADDRESS - marked:
        raise OSError(14, f"{name} with pid {pid}: address out of range")
    remote = address if size else 0  # (in range: checked above)
    remote_mark = mark_address if marked else 0
    pybuf = cython.declare(Py_buffer)
    PyObject_GetBuffer(local, cython.address(pybuf), PyBUF_SIMPLE if writing else PyBUF_WRITABLE)
    try:
        base = cython.cast(cython.p_char, pybuf.buf)
        liov = cython.declare(iovec[2])
        riov = cython.declare(iovec[2])
        done = 0
        while True:
            n = 0
            if done < size:
                liov[0].iov_base, liov[0].iov_len = base + done, size - done
                riov[0].iov_base, riov[0].iov_len = cython.cast(cython.p_void, remote + done), size - done
                n = 1
            if marked:  # (the data and the mark in one call, the mark after the data)
                liov[n].iov_base, liov[n].iov_len = cython.cast(cython.p_char, mark), marked
                riov[n].iov_base, riov[n].iov_len = cython.cast(cython.p_void, remote_mark), marked
                n += 1
            with cython.nogil:
                if writing:
                    got = c_process_vm_writev(pid, liov, n, riov, n, 0)
                else:
                    got = c_process_vm_readv(pid, liov, n, riov, n, 0)
            err = c_errno
            if marked:
                if got != size - done + marked:  # cut short: the mark was not written
                    err = err if got < 0 else 14
                    raise OSError(err, f"{name} with pid {pid}: {os.strerror(err)}")
                return 0
            if got <= 0:
                err = err if got < 0 else 14  # EFAULT: nothing copied
                raise OSError(err, f"{name} with pid {pid}: {os.strerror(err)}")
            done += got
            if done >= size:  # (the kernel may copy less than asked: at most 2 GiB - 4 KiB a call)
                return 0
    finally:
        PyBuffer_Release(cython.address(pybuf))
