# The C types of svcframe/bulk.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
cimport cython

from svcframe.bulk_serving cimport BulkServing
from svcframe.deadlines cimport Deadlines
from svcframe.monitoring cimport Monitor
from svcframe.progress cimport Progress
from svcframe.request cimport Request
from svcframe.transport cimport Connection
from svcframe.wire cimport F_CMA, F_NO_REPLY, Frame


cdef class BulkTransfers:
    cdef readonly str engine_id
    cdef readonly object connections
    cdef readonly BulkServing serving
    cdef readonly Deadlines deadlines
    cdef readonly Monitor monitor
    cdef readonly Progress progress
    cdef public double default_timeout_seconds
    cdef public bint allow_third_party_bulk
    cdef public bint bulk_cma
    cdef public Py_ssize_t cma_bytes
    cdef object _loop

    @cython.locals(req=Request, size=Py_ssize_t)
    cpdef object push(self, object handle, object src, Py_ssize_t offset=*, object timeout_seconds=*, bint ahead=*)
    @cython.locals(conn=Connection, frame=Frame, size=Py_ssize_t, frames=bytes)
    cpdef object _push_ahead_now(self, Request req, object handle, Py_ssize_t offset, object src)
