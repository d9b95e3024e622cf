# The compiled build's leaf byte loops: little-endian (and msgpack's big-endian) integers read from and written
# to a frame's bytes in place. Cython only: the modules that cimport these call them in their compiled branches
# (``if cython.compiled:``); interpreted, they read and write with struct.
from libc.stdint cimport uint16_t, uint32_t, uint64_t


cdef inline uint32_t _u16(const unsigned char *p) noexcept:
    return p[0] | (<uint32_t>p[1] << 8)

cdef inline uint32_t _u32(const unsigned char *p) noexcept:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)

cdef inline uint64_t _u64(const unsigned char *p) noexcept:
    return _u32(p) | (<uint64_t>_u32(p + 4) << 32)

cdef inline uint32_t _u32be(const unsigned char *p) noexcept:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]

cdef inline void _put16(unsigned char *p, uint16_t v) noexcept:
    p[0] = v & 0xFF
    p[1] = v >> 8

cdef inline void _put32(unsigned char *p, uint32_t v) noexcept:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = v >> 24

cdef inline void _put64(unsigned char *p, uint64_t v) noexcept:
    _put32(p, <uint32_t>v)
    _put32(p + 4, <uint32_t>(v >> 32))

cdef inline void _put64be(unsigned char *p, uint64_t v) noexcept:
    cdef int i
    for i in range(8):
        p[i] = (v >> (56 - 8 * i)) & 0xFF
