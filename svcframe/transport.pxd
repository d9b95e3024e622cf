# The C types of svcframe/transport.py's compiled build (Cython's pure-Python mode: the .py is the source of both).
cimport cython

from svcframe.decoder cimport FrameDecoder
from svcframe.protocol cimport Protocol
from svcframe.wire cimport F_NO_REPLY, Frame


cpdef enum:
    # Replies of one received batch are written as soon as they pass this many bytes (bounded memory).
    BATCH_FLUSH_BYTES = 1048576
    # Frames of one connection dispatched in one turn of the loop; the rest wait for the next turn.
    FRAMES_PER_TURN = 256


cdef class ConnectionOwner:
    cpdef on_frames(self, Connection conn, list frames)
    cpdef on_answers(self, Connection conn)


cdef class Connection:
    cdef public ConnectionOwner owner
    cdef public Protocol protocol
    cdef FrameDecoder _decoder
    cdef public dict pending
    cdef public dict serving
    cdef public dict records
    cdef public object transport
    cdef public object ready
    cdef public bint closed
    cdef public object close_reason
    cdef public bint server_side
    cdef public bint reading_paused
    cdef public bint authenticated
    cdef public bint admitted
    cdef public double last_activity
    cdef public double frame_started
    cdef public Py_ssize_t writes
    cdef public Py_ssize_t max_output_bytes
    cdef public Py_ssize_t bulk_chunk_bytes
    cdef public double handshake_timeout_seconds
    cdef public object dialled_address
    cdef public object peername
    cdef public object peer_label
    cdef public object peer_host
    cdef public object peer_pid
    cdef public object peer_process
    cdef public object peer_engine_id
    cdef public object peer_address
    cdef public Py_ssize_t peer_max_body_bytes
    cdef public bint peer_cma
    cdef public bint peer_cma_write
    cdef public bint peer_cma_offer
    cdef public bint peer_cma_split_push
    cdef public bint peer_push_ahead
    cdef public double split_share
    cdef public double offer_share
    cdef public double cma_write_allowance
    cdef public double cma_write_reckoned
    cdef bint _open
    cdef object _handshake_timer
    cdef list _batch
    cdef Py_ssize_t _batch_bytes
    cdef bint _paused
    cdef bint _writelines_pauses
    cdef object _drain
    cdef list _cork
    cdef list _backlog

    cpdef object get_buffer(self, Py_ssize_t sizehint)
    cpdef object next_request_id(self)
    @cython.locals(frames=object)
    cpdef buffer_updated(self, Py_ssize_t nbytes)
    @cython.locals(batch=list)
    cdef int _dispatch(self, object frames) except -1
    cpdef send(self, object data)
    cpdef send_request(self, bytes data, bint corked)
    cpdef send_many(self, object parts)
    cdef int _write(self, object parts) except -1
    cdef int _flush_batch(self) except -1
    cpdef reply(self, Frame frame, unsigned int status, bytes body)
    cpdef reply_error(self, Frame frame, unsigned int status, str message)
    cpdef fail_pending(self, object error)
