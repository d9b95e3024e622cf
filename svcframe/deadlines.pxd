# The C types of svcframe/deadlines.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
cimport cython


cdef class Deadlines:
    cdef list _heap
    cdef Py_ssize_t _seq
    cdef object _loop
    cdef object _timer
    cdef double _timer_at
    @cython.locals(heap=list, seq=Py_ssize_t)
    cpdef add(self, double deadline, dict waiting, object request_id)
