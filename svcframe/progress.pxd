# The C types of svcframe/progress.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
cimport cython


cdef class Progress:
    cdef public bint backoff
    cdef public Py_ssize_t inflight
    cdef object _loop
    cdef bint _spinning
    cdef double _last
    cdef double _polled
    cdef object _tick
    cdef public Py_ssize_t polls
    cdef public Py_ssize_t blocks
    cdef public Py_ssize_t wakeups
    cdef public Py_ssize_t contended
    cdef public double last_holdoff
    cdef long long _switches
    cdef Py_ssize_t _strikes
    cdef double _first_strike
    cdef public str mode
    cdef public bint blocking
    cdef public double spindown_seconds
    cdef double _holdoff_until
    cdef double _holdoff
    cdef public double timeout_ub_seconds
    @cython.locals(last=cython.double)
    cpdef activity(self)
