# The C types of svcframe/connections.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
cimport cython

from svcframe.handlers cimport Handlers
from svcframe.transport cimport Connection, ConnectionOwner
from svcframe.wire cimport (
    F_INTO,
    K_BULK_DATA_PUSH,
    K_BULK_DATA_REPLY,
    K_BULK_PULL,
    K_BULK_PUSH,
    K_CANCEL,
    K_GOODBYE,
    K_REQUEST,
    K_RESPONSE,
    Frame,
    answer_call,
)


cdef class Connections(ConnectionOwner):
    cdef readonly Handlers handlers
    cdef readonly object serving
    cdef readonly object progress
    cdef public object local_host
    cdef readonly dict dialled
    cdef readonly dict peers
    cdef readonly set all
    cdef public object identity
    cdef public bint closing
    cdef public double default_timeout_seconds
    cdef public Py_ssize_t max_body_bytes
    cdef public Py_ssize_t max_output_bytes
    cdef public Py_ssize_t max_inflight_per_connection
    cdef public Py_ssize_t bulk_chunk_bytes
    cdef public double handshake_timeout_seconds
    cdef public double idle_timeout_seconds
    cdef public double frame_timeout_seconds
    cdef public Py_ssize_t max_connections
    cdef public Py_ssize_t max_connections_per_host
    cdef bint _listening
    cdef object _loop
    cdef dict _dialing
    cdef Py_ssize_t _accepted
    cdef dict _per_host
    cdef dict _handshaking
    cdef double _last_refusal_log
    cdef set _peer_labels
    cdef object _sweeper

    @cython.locals(frame=Frame, kind=cython.uint, arrival_ns=cython.longlong, arrival=cython.double,
                   handlers=Handlers)
    cpdef on_frames(self, Connection conn, list frames)
