# The C types of svcframe/decoder.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
cimport cython
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.object cimport Py_buffer
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

from svcframe._bytes cimport _u16, _u32, _u32be, _u64
from svcframe.wire cimport (
    F_INTO,
    F_NO_REPLY,
    HEADER_SIZE,
    K_BULK_DATA_PUSH,
    K_BULK_DATA_REPLY,
    K_BULK_PUSH,
    K_RESPONSE,
    WIRE_VERSION,
    Frame,
    unpack_body,
)


cdef class FrameDecoder:
    cdef object _buf
    cdef object _view
    cdef object _head
    cdef const unsigned char *_base
    cdef Py_ssize_t _size
    cdef Py_ssize_t _start
    cdef Py_ssize_t _end
    cdef Py_ssize_t _high
    cdef Py_ssize_t _data_max
    cdef object _direct
    cdef Py_ssize_t _direct_pos
    cdef Frame _direct_frame
    cdef object _direct_value
    cdef object _large
    cdef public object bulk_sink
    cdef public object place_ahead
    cdef public dict answers
    cdef public dict into_pulls
    cdef public Py_ssize_t max_body_bytes
    cdef public uint64_t legal_kinds
    cdef public bint reuse_large
    cdef public bint held

    cdef void _set_buffer(self, object buf) except *
    cpdef object get_buffer(self, Py_ssize_t sizehint=*)
    @cython.locals(end=Py_ssize_t, frames=list)
    cpdef object buffer_updated(self, Py_ssize_t nbytes)
    @cython.locals(frames=list)
    cpdef list more(self)
    cdef void _emptied(self) except *
    cdef void _compact(self) except *
    @cython.locals(base="const unsigned char *", h="const unsigned char *", end=Py_ssize_t, max_body=Py_ssize_t,
                   legal=uint64_t, start=Py_ssize_t, completed=bint, avail=Py_ssize_t, bad=bint, kind=cython.uint,
                   flags=cython.uint, length=uint32_t, request_id=uint64_t, status=cython.uint,
                   body_start=Py_ssize_t, body_end=Py_ssize_t, taken=Py_ssize_t, frame=Frame)
    cdef bint _parse(self, list frames) except -1
    cdef bint _answer(self, uint64_t request_id, bytes body) except -1
    cdef bint _into_answered(self, uint64_t request_id) except -1
    @cython.locals(d="const unsigned char *", end=Py_ssize_t, size=Py_ssize_t, data_start=Py_ssize_t,
                   data_end=Py_ssize_t, ok=bint, kind=cython.uint, flags=cython.uint, length=uint32_t,
                   data_id=uint64_t)
    cdef Py_ssize_t _push_ahead(self, const unsigned char *base, Py_ssize_t start, Py_ssize_t body_end,
                                uint64_t request_id) except -2
    @cython.locals(have=Py_ssize_t)
    cdef void _start_direct(self, object dest, Frame frame, Py_ssize_t body_start, list frames) except *
    @cython.locals(kind=cython.uint)
    cdef Frame _finish_direct(self)


@cython.locals(h="const unsigned char *", f=Frame)
cdef Frame _new_frame(const unsigned char *b, Py_ssize_t start, object body)

cdef int _copy_into(object dest, const unsigned char *p, Py_ssize_t n) except -1

@cython.locals(mv="const unsigned char[:]")
cdef const unsigned char *_address(object view) except? NULL

@cython.locals(n=Py_ssize_t, c=cython.uint, width=cython.int, i=cython.int, k=cython.int, value=uint64_t,
               offset=uint64_t, size=uint64_t)
cdef tuple _ahead_body(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end)


cdef class _BytesFiller:
    cdef bytes value
