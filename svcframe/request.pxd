# The C types of svcframe/request.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
from svcframe.registration cimport Registration
from svcframe.transport cimport Connection
from svcframe.wire cimport Frame


cdef class Request:
    cdef readonly object engine
    cdef readonly Connection conn
    cdef readonly Registration reg
    cdef readonly Frame frame
    cdef readonly double arrival
