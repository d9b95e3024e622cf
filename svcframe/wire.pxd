# The C types of svcframe/wire.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from svcframe._bytes cimport _put16, _put32, _put64, _put64be


cdef extern from "Python.h":
    double PyFloat_Unpack4(const char *p, int le) except? -1.0
    double PyFloat_Unpack8(const char *p, int le) except? -1.0


# The header's constants and the kinds, flags and statuses the hot paths compare with: C constants here, ints
# for Python (wire.py defines the same values for its interpreted build; tests/test_compiled.py compares them).
cpdef enum:
    WIRE_VERSION = 1
    HEADER_SIZE = 80
    NO_PARENT_PROVIDER = 0xFFFF
    K_HELLO = 1
    K_REQUEST = 2
    K_RESPONSE = 3
    K_CANCEL = 4
    K_BULK_PULL = 5
    K_BULK_PUSH = 6
    K_BULK_DATA_REPLY = 7
    K_BULK_DATA_PUSH = 8
    K_GOODBYE = 9
    F_TRACED = 1
    F_IDEMPOTENT = 2
    F_NO_REPLY = 4
    F_CMA = 8
    F_INTO = 16
    F_TRACE_STARTED_HERE = 0x8000
    S_OK = 0


cdef class Frame:
    cdef readonly unsigned int kind
    cdef readonly unsigned int flags
    cdef readonly unsigned int provider_id
    cdef readonly uint32_t rpc_id
    cdef readonly uint64_t request_id
    cdef readonly uint32_t deadline_usec
    cdef readonly unsigned int status
    cdef readonly unsigned int parent_provider_id
    cdef readonly uint32_t parent_rpc_id
    cdef readonly uint64_t callpath
    cdef readonly bytes trace_id
    cdef readonly uint64_t span_id
    cdef readonly uint64_t lamport
    cdef public object body
    cpdef tuple fields(self)


@cython.locals(n=Py_ssize_t, p="unsigned char *")
cpdef bytes request_frame(
    uint16_t flags, uint16_t provider_id, uint32_t rpc_id, uint64_t request_id, uint32_t deadline_usec,
    uint16_t parent_provider_id, uint32_t parent_rpc_id, uint64_t callpath, bytes trace_id, uint64_t span_id,
    uint64_t lamport, object body)

@cython.locals(n=Py_ssize_t, head=Py_ssize_t, p="unsigned char *", q="unsigned char *")
cpdef bytes ok_response(uint64_t request_id, object result)

cpdef bytes data_reply_header(uint16_t flags, uint32_t length, uint64_t request_id)

cdef enum:
    _AHEAD_BODY_BYTES = 46

@cython.locals(with_data=bint, p="unsigned char *", q="unsigned char *")
cpdef bytes push_ahead_frames(object request_id, object bulk_id, object offset, object size, object call_id,
                              bint data=*)

cdef inline bytes _new_frame_bytes(Py_ssize_t body_length)
cdef inline unsigned char *_frame_data(bytes out)
cdef inline const unsigned char *_bytes_data(bytes b)
cdef inline void _put_header(unsigned char *p, unsigned int kind, unsigned int flags, uint32_t body_length,
                             uint64_t request_id) noexcept

@cython.locals(n=Py_ssize_t, pos=Py_ssize_t)
cpdef object unpack_body(object body)

cpdef answer_call(object waiter, unsigned int status, object body)

@cython.locals(pos=Py_ssize_t, c=cython.uint, n=Py_ssize_t, width=cython.int, u=uint64_t, shift=cython.int,
               i=cython.int, value=object, mapping=dict, items=list, key=object, item=object)
cdef object _small_item(const unsigned char *b, Py_ssize_t *at, Py_ssize_t end, int depth)
