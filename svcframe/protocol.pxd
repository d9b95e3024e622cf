# The C types of svcframe/protocol.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
cimport cython
from libc.stdint cimport uint64_t

from svcframe.decoder cimport FrameDecoder


cdef class IncomingPull:
    cdef public object dest
    cdef public Py_ssize_t cursor
    cdef public bint overflow_ok
    cdef public bint overflowed


cdef class IncomingPush:
    cdef public object frame
    cdef public object dest
    cdef public Py_ssize_t size
    cdef public object error
    cdef public Py_ssize_t cursor


cdef class Protocol:
    cdef readonly object role
    cdef readonly object identity
    cdef public Py_ssize_t max_pushes
    cdef public object phase
    cdef public object peer
    cdef public object error
    cdef readonly dict pending
    cdef readonly dict pulls
    cdef readonly dict serving
    cdef readonly dict pushes
    cdef readonly dict lent
    cdef readonly dict offers
    cdef dict _refused_pushes
    cdef readonly FrameDecoder decoder
    cdef uint64_t _next_id
    cdef bytes _nonce
    cdef bytes _client_nonce
    cdef list _out
    cdef str _local_endpoint
    cdef str _remote_endpoint
    cdef bint _peer_on_node

    cpdef uint64_t next_request_id(self) except? 0
