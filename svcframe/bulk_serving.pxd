# The C types of svcframe/bulk_serving.py's compiled build (Cython's pure-Python mode: the .py is the source of
# both).
cimport cython

from svcframe.monitoring cimport Monitor
from svcframe.progress cimport Progress
from svcframe.transport cimport Connection
from svcframe.wire cimport F_CMA, F_INTO, F_NO_REPLY, K_BULK_PUSH, K_RESPONSE


cdef class BulkServing:
    cdef readonly str engine_id
    cdef readonly Monitor monitor
    cdef readonly Progress progress
    cdef public bint bulk_cma
    cdef readonly dict exposed
    cdef readonly dict push_sources
    cdef readonly set tasks
    cdef public Py_ssize_t cma_bytes
    cdef public object address
    cdef Py_ssize_t _lent_bytes
    cdef object _loop

    cpdef object _place_ahead(self, Connection conn, object request_id, bytes bulk_id, Py_ssize_t offset,
                              Py_ssize_t size)
    @cython.locals(entry=tuple, view=object, mode=str, bound=object)
    cpdef tuple _exposed_range(self, Connection conn, bytes bulk_id, Py_ssize_t offset, Py_ssize_t size, str need)
