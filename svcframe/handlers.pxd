# The C types of svcframe/handlers.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
cimport cython
from libc.stdint cimport uint64_t

from svcframe.registration cimport Registration, RegistrationTable, row_key
from svcframe.request cimport Request
from svcframe.transport cimport Connection
from svcframe.wire cimport (
    F_CMA,
    F_INTO,
    F_NO_REPLY,
    F_TRACE_STARTED_HERE,
    F_TRACED,
    HEADER_SIZE,
    K_CANCEL,
    Frame,
    ok_response,
    unpack_body,
)


cdef enum:
    _SMALL_RESULT_BYTES = 4096
    _NOT_FAST = F_NO_REPLY | F_INTO


cdef class Handlers:
    cdef readonly object api
    cdef readonly RegistrationTable table
    cdef dict _rows
    cdef dict _refused
    cdef readonly object serving
    cdef readonly object monitor
    cdef readonly object progress
    cdef public object tracer
    cdef public bint closing
    cdef readonly set tasks
    cdef public object address
    cdef public Py_ssize_t max_inflight_per_connection
    cdef public bint send_tracebacks
    cdef object _loop
    cdef readonly object dispatching
    cdef object _dispatching_cancels
    cdef double _epoch_offset_us

    cpdef batch_begins(self, object frames)
    cpdef batch_ends(self)
    @cython.locals(reg=Registration, req=Request, start_ns=cython.longlong, n=Py_ssize_t, size=Py_ssize_t,
                   kind=cython.int)
    cpdef serve(self, Connection conn, Frame frame, long long arrival_ns, double arrival)
    @cython.locals(request_id=object, usec=cython.longlong, cancels=set)
    cdef bint _runs_now(self, Connection conn, Frame frame, long long arrival_ns) except -1


@cython.locals(req=Request)
cdef Request _new_request(object engine, Connection conn, Registration reg, Frame frame, double arrival)
