# The C types of svcframe/cma.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.object cimport Py_buffer
from libc.errno cimport errno as c_errno
from posix.types cimport pid_t


cdef extern from "<sys/uio.h>" nogil:
    struct iovec:
        void *iov_base
        size_t iov_len
    ssize_t c_process_vm_readv "process_vm_readv" (pid_t pid, const iovec *local_iov, unsigned long liovcnt,
                                                   const iovec *remote_iov, unsigned long riovcnt,
                                                   unsigned long flags)
    ssize_t c_process_vm_writev "process_vm_writev" (pid_t pid, const iovec *local_iov, unsigned long liovcnt,
                                                     const iovec *remote_iov, unsigned long riovcnt,
                                                     unsigned long flags)


@cython.locals(address=size_t)
cpdef size_t buffer_address(object view) except? 0

@cython.locals(size=Py_ssize_t, marked=Py_ssize_t, base="char *", done=Py_ssize_t, n=int, remote=size_t,
               remote_mark=size_t,
               got=Py_ssize_t, err=int)
cdef int _vm_copy(bint writing, pid_t pid, object address, object local, object mark_address, bytes mark) except -1
