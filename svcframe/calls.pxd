# The C types of svcframe/calls.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
cimport cython

from svcframe.deadlines cimport Deadlines
from svcframe.monitoring cimport Monitor, Record
from svcframe.progress cimport Progress
from svcframe.registration cimport RegistrationTable, row_key
from svcframe.request cimport Request
from svcframe.transport cimport Connection
from svcframe.wire cimport F_CMA, F_IDEMPOTENT, F_INTO, F_TRACED, NO_PARENT_PROVIDER, S_OK, Frame, request_frame


cdef class Calls:
    cdef readonly RegistrationTable table
    cdef dict _rpc_ids
    cdef readonly object connections
    cdef dict _dialled
    cdef readonly object bulk
    cdef readonly Deadlines deadlines
    cdef readonly Monitor monitor
    cdef readonly Progress progress
    cdef public object tracer
    cdef public double default_timeout_seconds
    cdef public bint bulk_cma
    cdef dict _root_callpaths
    cdef object _loop
    cdef double _epoch_offset_us

    @cython.locals(loop=object, remaining=cython.double, into_pull=object, rid=object, parent=Request, pf=Frame,
                   parent_rpc=cython.uint, parent_provider=cython.uint, callpath=object, rec=Record,
                   timed=bint, t0=cython.longlong, usec=cython.longlong, deadline_usec=cython.longlong,
                   request_id=object, future=object, pending=dict, request=bytes, progress=Progress, call=_Call,
                   body=bytes)
    cpdef _Call _begin(self, str address, str name, object arg, unsigned int provider_id, double timeout,
                       unsigned int flags, object into, Connection conn, double start, long long connect_ns)
    @cython.locals(progress=Progress, rec=Record, buf=list)
    cpdef _end(self, _Call call, int status, Py_ssize_t payload_bytes)


cdef class _Call:
    cdef readonly Connection conn
    cdef readonly object future
    cdef readonly object request_id
    cdef readonly unsigned int flags
    cdef readonly double start
    cdef long long t0
    cdef long long t1
    cdef long long connect_ns
    cdef Record rec
    cdef bint timed
    cdef Py_ssize_t body_bytes
    cdef readonly object into
    cdef readonly object into_pull
    cdef readonly object offer
    cdef tuple traced
