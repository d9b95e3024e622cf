# The C types of svcframe/monitoring.py's compiled build (Cython's pure-Python mode: the .py is the source of both).

cdef class Record:
    cdef readonly tuple steps
    cdef public list buffer
    cdef public dict summaries
    cdef public Py_ssize_t calls
    cdef public Py_ssize_t errors
    cdef object _shown
    cdef object _shown_at
    cpdef fold(self)


cdef class Monitor:
    cdef public bint enabled
    cdef public Py_ssize_t sample_every
    cdef readonly dict origin
    cdef readonly dict target
    cdef readonly dict bulk
    cdef readonly dict names
    cdef public double started
    cpdef Record origin_record(self, tuple key)
    cpdef Record target_record(self, tuple key)
    cpdef record_bulk(self, str direction, str peer, Py_ssize_t nbytes, long long duration_ns)
