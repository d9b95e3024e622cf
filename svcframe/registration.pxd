# The C types of svcframe/registration.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
from libc.stdint cimport uint32_t, uint64_t


cdef class Registration:
    cdef readonly unsigned int provider_id
    cdef readonly str name
    cdef readonly uint32_t rpc_id
    cdef readonly object handler
    cdef readonly bint is_coroutine
    cdef readonly object owner
    cdef public double last_logged


cpdef uint64_t row_key(uint64_t provider_id, uint64_t rpc_id) noexcept


cdef class RegistrationTable:
    cdef readonly dict rows
    cdef readonly dict providers
    cdef readonly dict refused
    cdef readonly dict names
    cdef readonly dict ids
