/* svcframe._speedups: the compiled twins of svcframe's per-call hot paths. Each has a Python definition, which
 * runs without this module (no compiler, or SVCFRAME_PURE=1), and tests/test_speedups.py checks they agree on
 * valid, truncated and hostile input:
 *
 * - parse_inline, of the two branches of FrameDecoder._parse that most frames take: a complete, valid frame
 *   with an inline body, and a complete bulk data frame (a read's data, under ``data_max`` bytes) that is first
 *   in its batch, whose bytes go where the decoder's bulk sink says. It appends those frames to a list and
 *   returns the offset of the first frame it did not take. It takes a frame only where the Python loop would
 *   append the very same Frame (and call the sink the same way); anything else (an incomplete header or body,
 *   a bulk data frame behind other frames or without a sink, a body over the receive buffer, a bad header) is
 *   left where it starts, for FrameDecoder._parse, which has the whole of the semantics and the error messages.
 * - DecoderCore, of svcframe.decoder._PyDecoderCore: FrameDecoder's state, get_buffer, buffer_updated and idle,
 *   which run this loop without a Python frame per read, and answer our calls (FrameDecoder.answers): an OK
 *   RESPONSE first in its batch gives its call's future what svcframe.wire.answer_call would, once the whole
 *   read decoded without an error.
 * - request_frame and ok_response, of svcframe.wire._request_frame_py and _ok_response_py: a call's REQUEST
 *   and a server's common answer in one allocation (anything unusual is handed to the Python twin).
 * - unpack_body, of svcframe.wire._unpack_body_py: a simple body without a call, others without a Python frame.
 * - DeadlinesCore, of svcframe.deadlines._PyDeadlinesCore: the deadline heap's add and _compact.
 * - serve_request, of svcframe.handlers.Handlers._on_request, in its common case (a sync handler, untraced and
 *   untimed, answering None or small bytes); any other request goes to the definition before anything is done.
 * - begin_call and Call, of svcframe.calls.Calls._call_once's work before and after its await, in its common
 *   case (an open connection, outside any handler, untraced, timed or not, into= only without cross-memory
 *   attach); likewise.
 * - vm_read and vm_write, of svcframe.cma.read and write (process_vm_readv / writev without ctypes), and
 *   buffer_address, of svcframe.cma.buffer_address.
 * - ConnectionState.buffer_updated, of svcframe.transport.Connection.buffer_updated (_buffer_updated_definition)
 *   on an open connection: the decoder's read, then an engine's batch of requests served (Engine.on_frames, each
 *   by serve_request) and its replies written in one write (_write), or answers given (Engine.on_answers); other
 *   frames, and an owner that replaces on_frames, go where the definition sends them.
 * - EngineState, ConnectionState, MonitorState, ProgressState and RecordState, of svcframe.slots' Python twins:
 *   the attributes those paths read on every call, as struct fields (tests/test_compiled_paths.py).
 *
 * Bounded by what was received: it reads only below ``end``, which the caller keeps within the buffer, and a
 * body is copied only when all of it is there (length <= max_body, checked before); a bulk data body is
 * copied only into a destination of exactly its length.
 *
 * Measured (tools/instructions_per_client_call.sh, tools/instructions_per_call.sh): see README "Performance".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <errno.h>
#include <sys/types.h>
#include <sys/uio.h>
#endif

#define HEADER_SIZE 80
#define FRAME_FIELDS 14
#define MAGIC_INT 0x4653u /* b"SF" little-endian */
#define WIRE_VERSION 1
#define K_REQUEST 2
#define K_CANCEL 4
#define K_RESPONSE 3
#define UNPACK_KWARGS_MAX 8
#define K_BULK_PUSH 6
#define K_BULK_DATA_REPLY 7
#define K_BULK_DATA_PUSH 8
#define F_NO_REPLY 4 /* wire.Flag.NO_REPLY */
#define F_INTO 16 /* wire.Flag.INTO */

#define IS_NONE(o) ((o) == NULL || (o) == Py_None)

/* time.monotonic_ns() and time.perf_counter_ns(): CLOCK_MONOTONIC, as CPython reads both on Linux. */
static long long
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline uint16_t rd16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* A Frame (a tuple subclass of 14 items) from a complete header at p and its body (None for bulk data, whose
 * bytes went to their destination). NULL on error. */
static PyObject *
new_frame(PyTypeObject *frame_type, const unsigned char *p, Py_ssize_t length, PyObject *zero_trace, int data)
{
    PyObject *frame = frame_type->tp_alloc(frame_type, FRAME_FIELDS);
    if (frame == NULL)
        return NULL;
    PyObject *items[FRAME_FIELDS];
    items[0] = PyLong_FromLong(p[3]);                             /* kind */
    items[1] = PyLong_FromLong(rd16(p + 4));                      /* flags */
    items[2] = PyLong_FromLong(rd16(p + 6));                      /* provider_id */
    items[3] = PyLong_FromUnsignedLong(rd32(p + 8));              /* rpc_id */
    items[4] = PyLong_FromUnsignedLongLong(rd64(p + 16));         /* request_id */
    items[5] = PyLong_FromUnsignedLong(rd32(p + 24));             /* deadline_usec */
    items[6] = PyLong_FromLong(rd16(p + 28));                     /* status */
    items[7] = PyLong_FromLong(rd16(p + 30));                     /* parent_provider_id */
    items[8] = PyLong_FromUnsignedLong(rd32(p + 32));             /* parent_rpc_id */
    items[9] = PyLong_FromUnsignedLongLong(rd64(p + 40));         /* callpath */
    if (rd64(p + 48) | rd64(p + 56)) {
        items[10] = PyBytes_FromStringAndSize((const char *)p + 48, 16); /* trace_id */
    } else {
        Py_INCREF(zero_trace);
        items[10] = zero_trace;
    }
    items[11] = PyLong_FromUnsignedLongLong(rd64(p + 64));        /* span_id */
    items[12] = PyLong_FromUnsignedLongLong(rd64(p + 72));        /* lamport */
    if (data) {
        Py_INCREF(Py_None);
        items[13] = Py_None;
    } else {
        items[13] = PyBytes_FromStringAndSize((const char *)p + HEADER_SIZE, length); /* body (b"" when empty) */
    }
    int failed = 0;
    for (int i = 0; i < FRAME_FIELDS; i++) {
        if (items[i] == NULL)
            failed = 1;
        PyTuple_SET_ITEM(frame, i, items[i]); /* NULL items are fine in a tuple being deallocated */
    }
    if (failed) {
        Py_DECREF(frame);
        return NULL;
    }
    return frame;
}

PyDoc_STRVAR(parse_inline_doc,
"parse_inline(buffer, start, end, max_body, legal_kinds, frames, frame_type, zero_trace_id, sink, data_max,\n"
"             place_ahead=None) -> int\n\n"
"Append to ``frames`` every complete, valid frame with an inline body found in ``buffer[start:end]``, as\n"
"``frame_type`` tuples (svcframe.wire.Frame), and return the offset of the first frame not taken: an\n"
"incomplete one, one whose body is over ``max_body`` bytes or not all received, or a bad header\n"
"(FrameDecoder._parse handles each, with its errors). ``legal_kinds``: bit k set accepts kind k. A complete\n"
"bulk data frame under ``data_max`` bytes is taken too when ``frames`` is empty and ``sink`` is not None:\n"
"its body is copied into ``sink(kind, request_id, length)`` (a writable buffer of exactly ``length`` bytes)\n"
"and its Frame has the body None. With ``place_ahead`` (FrameDecoder.place_ahead), a push ahead first in its\n"
"batch is taken as FrameDecoder._push_ahead takes it (no frame), and one still arriving stops the loop there.\n"
"Raises ValueError when ``0 <= start <= end <= len(buffer)`` does not hold,\n"
"svcframe.errors.RemoteProtocolError when the sink's or placer's buffer is not ``length`` bytes; what they\n"
"raise, or a buffer error on a destination that is not writable and contiguous, propagates.");

/* Copy ``length`` bytes from ``src`` into ``dest`` (a new reference, released here), which must be a writable,
 * contiguous buffer of exactly ``length`` bytes; else RemoteProtocolError(``format`` % (its length, length)), as
 * FrameDecoder._parse says it (a bug of the sink or placer, not of the peer). -1 with an exception set. */
static int
copy_into(PyObject *dest, const unsigned char *src, Py_ssize_t length, const char *format)
{
    Py_buffer out;
    int rc = PyObject_GetBuffer(dest, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS);
    Py_DECREF(dest);
    if (rc < 0)
        return -1;
    if (out.len != length) {
        PyObject *errors = PyImport_ImportModule("svcframe.errors");
        PyObject *error = errors ? PyObject_GetAttrString(errors, "RemoteProtocolError") : NULL;
        if (error != NULL)
            PyErr_Format(error, format, out.len, length);
        Py_XDECREF(error);
        Py_XDECREF(errors);
        PyBuffer_Release(&out);
        return -1;
    }
    memcpy(out.buf, src, (size_t)length);
    PyBuffer_Release(&out);
    return 0;
}

/* Copy a bulk data body into the buffer the sink names for it; -1 with an exception set on failure. */
static int
sink_data(PyObject *sink, unsigned kind, const unsigned char *p, Py_ssize_t length)
{
    PyObject *dest = PyObject_CallFunction(sink, "IKn", kind, (unsigned long long)rd64(p + 16), length);
    if (dest == NULL)
        return -1;
    return copy_into(dest, p + HEADER_SIZE, length, "bulk sink returned %zd bytes for %zd");
}

/* An unsigned msgpack int at b[*pos:end] (a positive fixint, uint 8, 16, 32 or 64) into *out, *pos moved past
 * it: 1; 0 for anything else. */
static int
read_uint(const unsigned char *b, Py_ssize_t *pos, Py_ssize_t end, unsigned long long *out)
{
    if (*pos >= end)
        return 0;
    unsigned c = b[*pos];
    if (c <= 0x7f) {
        *out = c;
        *pos += 1;
        return 1;
    }
    Py_ssize_t width = c == 0xcc ? 1 : c == 0xcd ? 2 : c == 0xce ? 4 : c == 0xcf ? 8 : 0;
    if (!width || *pos + 1 + width > end)
        return 0;
    unsigned long long v = 0;
    for (Py_ssize_t i = 1; i <= width; i++)
        v = (v << 8) | b[*pos + i];
    *out = v;
    *pos += 1 + width;
    return 1;
}

/* A push ahead's BULK_PUSH body b[pos:end] in the form its pushers pack it, svcframe.decoder._ahead_body's
 * (its definition): [bulk id (bin 8), offset, size, call id (unsigned ints)], the bulk id at b + *id_at, *id_len
 * bytes long: 1; 0 for any other body (decoded as usual). */
static int
ahead_body(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t *id_at, Py_ssize_t *id_len,
           unsigned long long *offset, unsigned long long *size)
{
    unsigned long long call_id;
    if (end - pos < 3 || b[pos] != 0x94 || b[pos + 1] != 0xc4 || pos + 3 + b[pos + 2] > end)
        return 0;
    *id_at = pos + 3;
    *id_len = b[pos + 2];
    pos += 3 + b[pos + 2];
    return read_uint(b, &pos, end, offset) && read_uint(b, &pos, end, size) && read_uint(b, &pos, end, &call_id) &&
           pos == end;
}

/* The push ahead whose BULK_PUSH (flagged NO_REPLY alone, first in its batch) is whole at base[start:], as
 * svcframe.decoder._Decoding._push_ahead takes it (its definition; the same conditions, in the same order):
 * the offset after its data frame when ``place(request id, bulk id, offset, length)`` named the data's
 * destination and the data was copied there;
 * -2 while the rest is still arriving and fits the receive buffer (``size`` bytes); 0 when the usual decoding
 * takes it; -1 with an exception set. */
static Py_ssize_t
push_ahead(PyObject *place, const unsigned char *base, Py_ssize_t start, Py_ssize_t end, Py_ssize_t size,
           long long max_body, unsigned long long legal, long long data_max)
{
    const unsigned char *p = base + start;
    Py_ssize_t body_end = start + HEADER_SIZE + (Py_ssize_t)rd32(p + 12), data_start = body_end + HEADER_SIZE;
    if (data_start > end)
        return end > body_end && data_start - start <= size ? -2 : 0;
    const unsigned char *d = base + body_end;
    uint32_t length = rd32(d + 12);
    if (rd16(d) != MAGIC_INT || d[2] != WIRE_VERSION || d[3] != K_BULK_DATA_PUSH || rd16(d + 4) || rd32(d + 36) ||
        !((legal >> K_BULK_DATA_PUSH) & 1) || rd64(d + 16) != rd64(p + 16) || (long long)length > max_body ||
        (long long)length >= data_max)
        return 0;
    Py_ssize_t data_end = data_start + (Py_ssize_t)length;
    if (data_end > end)
        return data_end - start <= size ? -2 : 0;
    Py_ssize_t id_at, id_len;
    unsigned long long offset, announced;
    if (!ahead_body(base, start + HEADER_SIZE, body_end, &id_at, &id_len, &offset, &announced) ||
        announced != length)
        return 0;
    /* place(request id, bulk id, offset, length), by vectorcall: no format parsed, no argument tuple made */
    PyObject *call_args[4] = {PyLong_FromUnsignedLongLong(rd64(p + 16)),
                              PyBytes_FromStringAndSize((const char *)base + id_at, id_len),
                              PyLong_FromUnsignedLongLong(offset), PyLong_FromSsize_t((Py_ssize_t)length)};
    PyObject *dest = call_args[0] && call_args[1] && call_args[2] && call_args[3]
                         ? PyObject_Vectorcall(place, call_args, 4, NULL)
                         : NULL;
    for (int i = 0; i < 4; i++)
        Py_XDECREF(call_args[i]);
    if (dest == NULL)
        return -1;
    if (dest == Py_None) {
        Py_DECREF(dest);
        return 0;
    }
    if (copy_into(dest, d + HEADER_SIZE, (Py_ssize_t)length, "push ahead placed in %zd bytes for %zd") < 0)
        return -1;
    return data_end;
}

typedef struct {
    PyObject *s_done, *s_set_result; /* method names, interned once per module (per interpreter) */
    PyObject *s_get_buffer_slow, *s_direct_updated, *s_compact, *s_parse, *s_release_pages;
    PyObject *s_overflow_ok, *s_cursor; /* IncomingPull's (an into= call's answer) */
    PyObject *frame_type, *zero_trace, *unpack; /* what DecoderCore decodes with (configure()) */
    PyObject *unpack_kwnames, *unpack_kwvalues;  /* unpack's keyword arguments (configure()) */
    PyObject *request_frame_py, *ok_response_py;  /* svcframe.wire's pure twins (configure()) */
    PyObject *unpack_body_py;
    Py_ssize_t keep_bytes;                        /* decoder.KEEP_RECEIVE_BYTES (configure_decoder()) */
    PyObject *core_type;                          /* DecoderCore */
    PyObject *deadlines_type;                     /* DeadlinesCore */
    PyObject *heappush, *heapify;                 /* heapq's */
    PyObject *s_arm, *s_compact_heap, *s_idle;    /* DeadlinesCore's method names */
    /* serve_request (configure_serve()): Handlers._on_request, Request, the sync handlers' thread-local, and
     * the attribute names it reads (SERVE_NAMES) */
    PyObject *on_request_py, *request_type, *sync, *done;
    /* push_ahead_now (configure_push()): BulkHandle, and the names it reads */
    PyObject *handle_type, *s_bulk_cma, *s_push, *s_record_bulk;
    PyObject *s_pushes, *s_buffer, *s_served_push; /* place_ahead's and record_bulk_now's */
    long long not_fast, small_result, always_timed;
    PyObject *sn[11];
    /* an async def handler's first step (configure_serve()): svcframe.handlers' globals (its first_step, looked
     * up per request, so that a patched one is honoured) and svcframe.eager's SUSPENDED and FINISHED */
    PyObject *handler_globals;
    long suspended, finished;
    /* begin_call and Call (configure_calls()): what Calls._call_once uses, and the names it reads (cn) */
    PyObject *call_type, *task_request, *pack_body, *nil_body, *error_from_status, *cancel_remote, *no_response;
    PyObject *deadline_expired, *cancelled_error, *no_parent, *zero;
    PyObject *as_byte_view, *incoming_pull, *too_large; /* for into= (configure_calls()) */
    PyObject *writable_kw, *overflow_ok_kw;             /* their keyword names: ("writable",), ("overflow_ok",) */
    long into_flag;
    long lent_status;
    Py_ssize_t cma_min; /* bulk.CMA_MIN_BYTES: an into= buffer this large may be filled by cross-memory attach */
    Py_ssize_t fold_at; /* monitoring.FOLD_AT: a timed call's record folds its buffer past this many values */
    PyObject *s_fold;
    PyObject *cn[17]; /* (CALL_NAMES_N) */
    PyObject *wire, *packer_pack; /* svcframe.wire, and its _packer's pack (pack_body's own call) */
    long long batch_flush_bytes; /* svcframe.transport.BATCH_FLUSH_BYTES (configure_serve()) */
    /* ConnectionState.buffer_updated (configure_read()): Engine.on_frames and on_answers (used where the owner
     * has them, not overrides), ProtocolError, FRAMES_PER_TURN, engine._NO_FRAMES, svcframe.engine's globals
     * (its serve_request), and the names it uses (READ_NAMES) */
    PyObject *on_frames_py, *on_answers_py, *protocol_error, *no_frames, *engine_globals;
    Py_ssize_t frames_per_turn;
    PyObject *rn[12];
    /* the state types (EngineState, ConnectionState, MonitorState, ProgressState, RecordState) */
    PyObject *engine_state, *connection_state, *monitor_state, *progress_state, *record_state;
} module_state;

/* The big-endian unsigned integer of ``width`` bytes at ``p``. */
static inline unsigned long long
be_uint(const unsigned char *p, int width)
{
    unsigned long long v = 0;
    for (int i = 0; i < width; i++)
        v = v << 8 | p[i];
    return v;
}

/* One msgpack item at ``b[*pos]``, below ``end``, as msgpack.unpackb decodes it with svcframe's options (raw=False,
 * strict UTF-8, lists, str map keys): nil, a bool, an int of any width, a float, a str up to 255 bytes, a bin up
 * to 255 bytes, and, ``depth`` below 2, a fixarray or a fixmap with str keys (up to 15 entries) of such items.
 * *pos moves past it. NULL for anything else, no exception set (a truncated item, another type, a key that is
 * not a str, invalid UTF-8: the decoder's own call decodes it, or raises its error), or with one set (memory). */
static PyObject *
small_item(const unsigned char *b, Py_ssize_t *pos, Py_ssize_t end, int depth)
{
    Py_ssize_t p = *pos, n;
    if (p >= end)
        return NULL;
    unsigned c = b[p++];
    PyObject *v;
    if (c <= 0x7f) { /* positive fixint */
        v = PyLong_FromLong((long)c);
    } else if (c >= 0xe0) { /* negative fixint */
        v = PyLong_FromLong((long)c - 256);
    } else if (c == 0xc0 || c == 0xc2 || c == 0xc3) {
        v = Py_NewRef(c == 0xc0 ? Py_None : c == 0xc2 ? Py_False : Py_True);
    } else if ((c >= 0xa0 && c <= 0xbf) || c == 0xd9 || c == 0xc4) { /* fixstr, str 8, bin 8 */
        n = c >= 0xa0 && c <= 0xbf ? (Py_ssize_t)(c & 0x1f) : p < end ? (Py_ssize_t)b[p++] : -1;
        if (n < 0 || n > end - p)
            return NULL;
        if (c == 0xc4) {
            v = PyBytes_FromStringAndSize((const char *)b + p, n);
        } else if ((v = PyUnicode_DecodeUTF8((const char *)b + p, n, NULL)) == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return NULL;
            PyErr_Clear(); /* (the decoder's own call raises it) */
            return NULL;
        }
        p += n;
    } else if (c >= 0xcc && c <= 0xd3) { /* uint 8-64, int 8-64 */
        int width = 1 << ((c - 0xcc) & 3);
        if (end - p < width)
            return NULL;
        unsigned long long u = be_uint(b + p, width);
        p += width;
        if (c <= 0xcf) {
            v = PyLong_FromUnsignedLongLong(u);
        } else { /* sign-extended from its width */
            int shift = 64 - 8 * width;
            v = PyLong_FromLongLong(shift ? (long long)(u << shift) >> shift : (long long)u);
        }
    } else if (c == 0xca || c == 0xcb) { /* float 32, float 64 (as msgpack reads them) */
        int width = c == 0xca ? 4 : 8;
        if (end - p < width)
            return NULL;
        double d = width == 4 ? PyFloat_Unpack4((const char *)b + p, 0) : PyFloat_Unpack8((const char *)b + p, 0);
        if (d == -1.0 && PyErr_Occurred())
            return NULL;
        v = PyFloat_FromDouble(d);
        p += width;
    } else if (c >= 0x80 && c <= 0x9f && depth < 2) { /* fixmap, fixarray */
        int map = c <= 0x8f;
        n = c & 0x0f;
        v = map ? PyDict_New() : PyList_New(n);
        for (Py_ssize_t i = 0; v != NULL && i < n; i++) {
            PyObject *key = map ? small_item(b, &p, end, depth + 1) : NULL;
            if (map && (key == NULL || !PyUnicode_CheckExact(key))) { /* (a key that is not a str: refused) */
                Py_XDECREF(key);
                Py_CLEAR(v);
                break;
            }
            PyObject *item = small_item(b, &p, end, depth + 1);
            if (item == NULL || (map && PyDict_SetItem(v, key, item) < 0)) {
                Py_XDECREF(key);
                Py_XDECREF(item);
                Py_CLEAR(v);
                break;
            }
            if (map) {
                Py_DECREF(key);
                Py_DECREF(item);
            } else {
                PyList_SET_ITEM(v, i, item);
            }
        }
    } else {
        return NULL;
    }
    if (v != NULL)
        *pos = p;
    return v;
}

/* The value of a msgpack body that is one small item (small_item's) and nothing after it, decoded as
 * msgpack.unpackb decodes it, without a call; NULL for anything else (no exception set): the decoder's own call
 * decodes it. A noop call's [0, None, None, b""] took unpackb 862 instructions (callgrind, Python 3.11), most of
 * them its keyword arguments' parsing. */
static PyObject *
simple_value(const unsigned char *b, Py_ssize_t length)
{
    Py_ssize_t pos = 0;
    PyObject *v = small_item(b, &pos, length, 0);
    if (v != NULL && pos != length) /* (extra data: the decoder's own call raises its error) */
        Py_CLEAR(v);
    return v;
}

/* 1 when configure() was called, else 0 with an exception set. */
static int
configured(module_state *st)
{
    if (st->frame_type != NULL)
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "svcframe._speedups.configure() was not called");
    return 0;
}

/* 1 when ``future.done()``, 0 when not, -1 with an exception set. */
static int
future_done(module_state *st, PyObject *future)
{
    PyObject *done = PyObject_CallMethodNoArgs(future, st->s_done);
    int is_done = done == NULL ? -1 : PyObject_IsTrue(done);
    Py_XDECREF(done);
    return is_done;
}

/* ``getattr(o, name)`` is true: 1, 0, or -1 with an exception set. */
static int
attr_true(PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    int truth = PyObject_IsTrue(v);
    Py_DECREF(v);
    return truth;
}

/* ``unpack(body, **unpack_kwargs)`` (configure()), by vectorcall: no keyword dict made per call. */
static PyObject *
strict_unpack(module_state *st, PyObject *body)
{
    PyObject *args[1 + UNPACK_KWARGS_MAX];
    Py_ssize_t nkw = PyTuple_GET_SIZE(st->unpack_kwnames);
    args[0] = body;
    for (Py_ssize_t i = 0; i < nkw; i++)
        args[1 + i] = PyTuple_GET_ITEM(st->unpack_kwvalues, i);
    return PyObject_Vectorcall(st->unpack, args, 1, nkw ? st->unpack_kwnames : NULL);
}

/* The answer to the call waiting for the OK RESPONSE at p, as svcframe.wire.answer_call gives it: its future in
 * ``answers`` (by request id) and ``(0, value, length)`` are appended to ``*answered`` (a list made at the first
 * answer of a read), for core_buffer_updated to give once the whole read decoded without an error. 1: taken; 0:
 * not ours (no such call, its future done or answered earlier in this read, or a body the decoder refuses: the
 * Python dispatch has the whole of the semantics and the error); -1 with an exception set on failure. */
static int
answer(module_state *st, PyObject *answers, PyObject **answered, const unsigned char *p, Py_ssize_t length)
{
    PyObject *key = PyLong_FromUnsignedLongLong(rd64(p + 16));
    if (key == NULL)
        return -1;
    PyObject *waiter = PyDict_GetItemWithError(answers, key); /* borrowed */
    Py_DECREF(key);
    if (waiter == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (*answered != NULL)
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(*answered); i += 2)
            if (PyList_GET_ITEM(*answered, i) == waiter) /* answered earlier in this read: this one is the dispatch's */
                return 0;
    Py_INCREF(waiter);
    int is_done = future_done(st, waiter);
    if (is_done) {
        Py_DECREF(waiter);
        return is_done < 0 ? -1 : 0;
    }
    PyObject *value = simple_value(p + HEADER_SIZE, length);
    if (value == NULL && !PyErr_Occurred()) {
        PyObject *body = PyBytes_FromStringAndSize((const char *)p + HEADER_SIZE, length);
        value = body == NULL ? NULL : strict_unpack(st, body);
        Py_XDECREF(body);
        if (value == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear(); /* a body the decoder refuses: the Python dispatch decodes it again and answers the error */
            Py_DECREF(waiter);
            return 0;
        }
    }
    if (value == NULL) {
        Py_DECREF(waiter);
        return -1;
    }
    PyObject *result = PyTuple_New(3);
    if (result != NULL) {
        PyObject *zero = PyLong_FromLong(0), *nbytes = PyLong_FromSsize_t(length);
        PyTuple_SET_ITEM(result, 0, zero);
        PyTuple_SET_ITEM(result, 1, value);
        PyTuple_SET_ITEM(result, 2, nbytes);
        if (zero == NULL || nbytes == NULL)
            Py_CLEAR(result);
    } else {
        Py_DECREF(value);
    }
    if (result != NULL && *answered == NULL)
        *answered = PyList_New(0);
    int rc = result == NULL || *answered == NULL || PyList_Append(*answered, waiter) < 0 ||
                     PyList_Append(*answered, result) < 0
                 ? -1
                 : 1;
    Py_XDECREF(result);
    Py_DECREF(waiter);
    return rc;
}

/* Give the answers collected by answer() (future, result, future, result, ...): -1 with an exception set. Each
 * future was not done when collected, and nothing the read's decoding does in between resolves one. */
static int
give_answers(module_state *st, PyObject *answered)
{
    for (Py_ssize_t i = 0; i + 1 < PyList_GET_SIZE(answered); i += 2) {
        PyObject *rc = PyObject_CallMethodOneArg(PyList_GET_ITEM(answered, i), st->s_set_result,
                                                 PyList_GET_ITEM(answered, i + 1));
        if (rc == NULL)
            return -1;
        Py_DECREF(rc);
    }
    return 0;
}

/* The answer to our into= call ``request_id`` that a data frame flagged INTO, just written into its buffer,
 * makes, as svcframe.engine.Engine._into_answered gives it: ``(0, pull.cursor, pull.cursor)`` to its future in
 * ``answers``, collected in ``*answered`` as answer() does. 1: taken; 0: not ours (no such call or pull, not an
 * into= call's pull, its future done or answered earlier in this read: the frame is dispatched); -1 with an
 * exception set. */
static int
answer_into(module_state *st, PyObject *answers, PyObject *pulls, PyObject **answered, uint64_t request_id)
{
    PyObject *key = PyLong_FromUnsignedLongLong(request_id);
    if (key == NULL)
        return -1;
    PyObject *waiter = PyDict_GetItemWithError(answers, key), *pull = NULL, *cursor = NULL, *result = NULL;
    pull = waiter == NULL ? NULL : PyDict_GetItemWithError(pulls, key);
    Py_DECREF(key);
    if (pull == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(waiter);
    Py_INCREF(pull);
    int rc = attr_true(pull, st->s_overflow_ok); /* (a pull's data flagged INTO answers nothing) */
    if (rc > 0 && *answered != NULL)
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(*answered); i += 2)
            if (PyList_GET_ITEM(*answered, i) == waiter)
                rc = 0;
    if (rc > 0) {
        int is_done = future_done(st, waiter);
        rc = is_done < 0 ? -1 : !is_done;
    }
    if (rc > 0) {
        cursor = PyObject_GetAttr(pull, st->s_cursor);
        PyObject *zero = cursor == NULL ? NULL : PyLong_FromLong(0);
        result = zero == NULL ? NULL : PyTuple_Pack(3, zero, cursor, cursor);
        Py_XDECREF(zero);
        if (result != NULL && *answered == NULL)
            *answered = PyList_New(0);
        if (result == NULL || *answered == NULL || PyList_Append(*answered, waiter) < 0 ||
            PyList_Append(*answered, result) < 0)
            rc = -1;
    }
    Py_XDECREF(result);
    Py_XDECREF(cursor);
    Py_DECREF(pull);
    Py_DECREF(waiter);
    return rc;
}

/* The loop of parse_inline over base[start:end] (see its docstring): the offset of the first frame not taken,
 * or -1 with an exception set. */
static Py_ssize_t
parse_loop(module_state *st, const unsigned char *base, Py_ssize_t start, Py_ssize_t end, Py_ssize_t size,
           long long max_body, unsigned long long legal, PyObject *frames, PyTypeObject *frame_type,
           PyObject *zero_trace, PyObject *sink, long long data_max, PyObject *place, int *waiting,
           PyObject *answers, PyObject **answered, PyObject *pulls, int *took_data)
{
    while (end - start >= HEADER_SIZE) {
        const unsigned char *p = base + start;
        unsigned kind = p[3];
        uint32_t length = rd32(p + 12);
        if (rd16(p) != MAGIC_INT || p[2] != WIRE_VERSION || rd32(p + 36) != 0 || kind >= 64 ||
            !((legal >> kind) & 1) || (long long)length > max_body || (Py_ssize_t)length > end - start - HEADER_SIZE)
            break; /* not ours to take: the Python loop decides */
        if (kind == K_BULK_PUSH && rd16(p + 4) == F_NO_REPLY && !IS_NONE(place)) {
            /* a push ahead of our call's answer: behind frames, the Python loop holds it as it holds data; behind
             * answers, core_buffer_updated decodes the read again, all of it frames, as it does for data */
            if (PyList_GET_SIZE(frames) || (answered != NULL && *answered != NULL))
                break;
            Py_ssize_t taken = push_ahead(place, base, start, end, size, max_body, legal, data_max);
            if (taken == -1)
                return -1;
            if (taken == -2) { /* its data still arriving: nothing of it yet */
                *waiting = 1;
                break;
            }
            if (taken) {
                start = taken;
                continue;
            }
        }
        if (kind == K_RESPONSE && answered != NULL && !PyList_GET_SIZE(frames) && !rd16(p + 28)) {
            /* an OK answer first in its batch (the frames before it are dispatched first) */
            int rc = answer(st, answers, answered, p, (Py_ssize_t)length);
            if (rc < 0)
                return -1;
            if (rc) {
                start += HEADER_SIZE + (Py_ssize_t)length;
                continue;
            }
        }
        int data = kind == K_BULK_DATA_REPLY || kind == K_BULK_DATA_PUSH;
        if (data) {
            /* first in its batch (the frames before it may set up its sink: they are dispatched first), small
             * (after a large chunk the decoder reads header first), and a sink to ask */
            if (sink == Py_None || PyList_GET_SIZE(frames) || (answered != NULL && *answered != NULL) ||
                (long long)length >= data_max)
                break;
            if (sink_data(sink, kind, p, (Py_ssize_t)length) < 0)
                return -1;
            if (answered != NULL && kind == K_BULK_DATA_REPLY && (rd16(p + 4) & F_INTO) && pulls != NULL) {
                *took_data = 1; /* (its bytes are written: this read is not decoded again) */
                int rc = answer_into(st, answers, pulls, answered, rd64(p + 16));
                if (rc < 0)
                    return -1;
                if (rc) { /* an into= call answered by its data: no frame to dispatch */
                    start += HEADER_SIZE + (Py_ssize_t)length;
                    continue;
                }
            }
        }
        PyObject *frame = new_frame(frame_type, p, (Py_ssize_t)length, zero_trace, data);
        if (frame == NULL)
            return -1;
        int rc = PyList_Append(frames, frame);
        Py_DECREF(frame);
        if (rc < 0)
            return -1;
        start += HEADER_SIZE + (Py_ssize_t)length;
    }
    return start;
}

static PyObject *
parse_inline(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 && nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "parse_inline takes 10 or 11 arguments");
        return NULL;
    }
    PyObject *place = nargs == 11 ? args[10] : Py_None;
    PyObject *frames = args[5], *zero_trace = args[7], *sink = args[8];
    if (!PyList_Check(frames) || !PyType_Check(args[6]) || !PyType_IsSubtype((PyTypeObject *)args[6], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "parse_inline: frames must be a list, frame_type a tuple subclass");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    long long max_body = PyLong_AsLongLong(args[3]);
    unsigned long long legal = PyLong_AsUnsignedLongLongMask(args[4]);
    long long data_max = PyLong_AsLongLong(args[9]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (start < 0 || start > end || end > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "parse_inline: need 0 <= start <= end <= len(buffer)");
        return NULL;
    }
    int waiting = 0;
    start = parse_loop((module_state *)PyModule_GetState(module), (const unsigned char *)view.buf, start, end,
                       view.len, max_body, legal, frames, (PyTypeObject *)args[6], zero_trace, sink, data_max, place,
                       &waiting, NULL, NULL, NULL, NULL);
    PyBuffer_Release(&view);
    return start < 0 ? NULL : PyLong_FromSsize_t(start);
}


/* ---- DecoderCore: the receive interface of svcframe.decoder.FrameDecoder ------------------------------------- */

static struct PyModuleDef speedups_module;

typedef struct {
    PyObject_HEAD
    PyObject *buf, *view, *head, *direct, *bulk_sink, *answers, *into_pulls, *place_ahead;
    Py_ssize_t start, end, high, data_max, direct_pos;
    long long max_body;
    unsigned long long legal;
    char reuse_large;
} Core;

static module_state *
core_state(PyObject *self)
{
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(self), &speedups_module);
    return module == NULL ? NULL : (module_state *)PyModule_GetState(module);
}

static PyObject *
core_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwargs))
{
    Core *self = (Core *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    PyObject **slots[] = {&self->buf,     &self->view,    &self->head,       &self->direct,
                          &self->bulk_sink, &self->answers, &self->into_pulls, &self->place_ahead};
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++) {
        Py_INCREF(Py_None);
        *slots[i] = Py_None;
    }
    return (PyObject *)self;
}

static int
core_traverse(Core *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->buf);
    Py_VISIT(self->view);
    Py_VISIT(self->head);
    Py_VISIT(self->direct);
    Py_VISIT(self->bulk_sink);
    Py_VISIT(self->answers);
    Py_VISIT(self->into_pulls);
    Py_VISIT(self->place_ahead);
    return 0;
}

static int
core_clear(Core *self)
{
    Py_CLEAR(self->buf);
    Py_CLEAR(self->view);
    Py_CLEAR(self->head);
    Py_CLEAR(self->direct);
    Py_CLEAR(self->bulk_sink);
    Py_CLEAR(self->answers);
    Py_CLEAR(self->into_pulls);
    Py_CLEAR(self->place_ahead);
    return 0;
}

static void
core_dealloc(Core *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    core_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* get_buffer(sizehint=-1): FrameDecoder's get_buffer when no body is received into its own destination and no
 * header-first read is due (those are _get_buffer_slow's). */
static PyObject *
core_get_buffer(Core *self, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "get_buffer takes at most one argument");
        return NULL;
    }
    if (!IS_NONE(self->direct) && self->direct_pos >= 0) /* a body received into its own destination: the rest */
        return PySequence_GetSlice(self->direct, self->direct_pos, PY_SSIZE_T_MAX); /* (direct[direct_pos:]) */
    if (!IS_NONE(self->direct) || !self->data_max) {
        module_state *st = core_state((PyObject *)self);
        return st == NULL ? NULL : PyObject_CallMethodNoArgs((PyObject *)self, st->s_get_buffer_slow);
    }
    if (!self->end) { /* nothing buffered: the view made once */
        PyObject *v = self->reuse_large ? self->view : self->head;
        Py_INCREF(v);
        return v;
    }
    Py_ssize_t size = PyObject_Size(self->view);
    if (size < 0)
        return NULL;
    if (self->end >= size) {
        module_state *st = core_state((PyObject *)self);
        PyObject *rc = st == NULL ? NULL : PyObject_CallMethodNoArgs((PyObject *)self, st->s_compact);
        if (rc == NULL)
            return NULL;
        Py_DECREF(rc);
    }
    return PySequence_GetSlice(self->view, self->end, PY_SSIZE_T_MAX);
}

/* buffer_updated(nbytes): FrameDecoder's buffer_updated; a body received into its own destination is
 * _direct_updated's, and what the compiled loop does not take is _parse's. */
static PyObject *
core_buffer_updated(Core *self, PyObject *arg)
{
    module_state *st = core_state((PyObject *)self);
    if (st == NULL)
        return NULL;
    if (!IS_NONE(self->direct)) {
        /* a body received into its own destination: short of its end, _direct_updated only counts (here);
         * the read that completes it is _direct_updated's */
        Py_ssize_t n = PyLong_Check(arg) ? PyLong_AsSsize_t(arg) : -1, size = PyObject_Size(self->direct);
        if (n < 0 || size < 0) {
            if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
                return NULL;
            PyErr_Clear(); /* (the definition meets the same error) */
        } else if (self->direct_pos >= 0 && self->direct_pos < size - n) {
            self->direct_pos += n;
            return PyList_New(0);
        }
        return PyObject_CallMethodOneArg((PyObject *)self, st->s_direct_updated, arg);
    }
    if (!configured(st))
        return NULL;
    Py_ssize_t nbytes = PyLong_AsSsize_t(arg);
    if (nbytes == -1 && PyErr_Occurred())
        return NULL;
    if (!IS_NONE(self->answers) && !PyDict_Check(self->answers)) {
        PyErr_SetString(PyExc_TypeError, "answers must be a dict or None");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(self->buf, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t first = self->start, end = self->end + nbytes;
    if (nbytes < 0 || first < 0 || first > self->end || end > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "buffer_updated: more bytes than the buffer given holds");
        return NULL;
    }
    self->end = end;
    if (end > self->high)
        self->high = end;
    PyObject *frames = PyList_New(0);
    if (frames == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    PyObject *answered = NULL; /* (future, result, ...), given once the read decoded; made at its first answer */
    /* (held for the read: the sink and the futures run Python code, which may set other ones on the core) */
    PyObject *sink = Py_NewRef(self->bulk_sink ? self->bulk_sink : Py_None);
    PyObject *answers = Py_NewRef(self->answers);
    PyObject *pulls = PyDict_Check(self->into_pulls) && !IS_NONE(answers) ? Py_NewRef(self->into_pulls) : NULL;
    PyObject *place = Py_NewRef(self->place_ahead ? self->place_ahead : Py_None);
    int took_data = 0, waiting = 0;
    const unsigned char *base = (const unsigned char *)view.buf;
    Py_ssize_t start = parse_loop(st, base, first, end, view.len, self->max_body, self->legal, frames,
                                  (PyTypeObject *)st->frame_type, st->zero_trace, sink, self->data_max, place,
                                  &waiting, answers, IS_NONE(answers) ? NULL : &answered, pulls, &took_data);
    Py_DECREF(answers);
    Py_XDECREF(pulls);
    int data_next = start >= 0 && end - start > 3 &&
                    (base[start + 3] == K_BULK_DATA_REPLY || base[start + 3] == K_BULK_DATA_PUSH ||
                     (base[start + 3] == K_BULK_PUSH && end - start > 5 && rd16(base + start + 4) == F_NO_REPLY &&
                      !IS_NONE(place)));
    if (start >= 0 && answered != NULL && !took_data && !PyList_GET_SIZE(frames) && data_next) {
        /* answers, then bulk data (or a push ahead): the Python loop holds data behind the frames before it (their
         * dispatch may set up its sink), so this read is decoded without answering, all of it frames (rare: a read
         * of ours is answered by the data's last frame) */
        Py_CLEAR(answered);
        waiting = 0;
        start = parse_loop(st, base, first, end, view.len, self->max_body, self->legal, frames,
                           (PyTypeObject *)st->frame_type, st->zero_trace, sink, self->data_max, place, &waiting, NULL,
                           NULL, NULL, NULL);
    }
    Py_DECREF(place);
    Py_DECREF(sink);
    PyBuffer_Release(&view);
    if (start < 0)
        goto fail;
    self->start = start;
    if (waiting) {
        /* a push ahead's data still arriving, nothing before it to return: the Python loop would wait too */
    } else if (start == end) { /* all taken (_emptied): the next read starts at the beginning */
        self->start = self->end = 0;
        if (self->high > st->keep_bytes && !self->reuse_large) {
            PyObject *rc = PyObject_CallMethodNoArgs((PyObject *)self, st->s_release_pages);
            if (rc == NULL)
                goto fail;
            Py_DECREF(rc);
        }
    } else {
        /* the rest is the Python loop's; an error there (a bad frame behind the answers) answers nothing, as the
         * pure-Python decoder's error loses the whole batch; but data behind an into= answer is held behind it by
         * the pure decoder (dispatched first): its answers are given before the data is taken */
        if (answered != NULL && took_data && data_next && !PyList_GET_SIZE(frames)) {
            int given = give_answers(st, answered);
            Py_CLEAR(answered);
            if (given < 0)
                goto fail;
        }
        PyObject *rc = PyObject_CallMethodObjArgs((PyObject *)self, st->s_parse, frames, Py_True, NULL);
        if (rc == NULL)
            goto fail;
        Py_DECREF(rc);
    }
    if (answered != NULL) {
        int rc = give_answers(st, answered);
        Py_CLEAR(answered);
        if (rc < 0)
            goto fail;
    }
    if (!PyList_GET_SIZE(frames) && start != first) { /* calls answered, nothing else: see FrameDecoder.answers */
        Py_DECREF(frames);
        Py_RETURN_NONE;
    }
    return frames;
fail:
    Py_XDECREF(answered);
    Py_DECREF(frames);
    return NULL;
}

static PyObject *
core_idle(Core *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(IS_NONE(self->direct) && self->start == self->end);
}

static PyMemberDef core_members[] = {
    {"_buf", T_OBJECT, offsetof(Core, buf), 0, NULL},
    {"_view", T_OBJECT, offsetof(Core, view), 0, NULL},
    {"_head", T_OBJECT, offsetof(Core, head), 0, NULL},
    {"_direct", T_OBJECT, offsetof(Core, direct), 0, NULL},
    {"bulk_sink", T_OBJECT, offsetof(Core, bulk_sink), 0, NULL},
    {"answers", T_OBJECT, offsetof(Core, answers), 0, NULL},
    {"into_pulls", T_OBJECT, offsetof(Core, into_pulls), 0, NULL},
    {"place_ahead", T_OBJECT, offsetof(Core, place_ahead), 0, NULL},
    {"_start", T_PYSSIZET, offsetof(Core, start), 0, NULL},
    {"_end", T_PYSSIZET, offsetof(Core, end), 0, NULL},
    {"_high", T_PYSSIZET, offsetof(Core, high), 0, NULL},
    {"_data_max", T_PYSSIZET, offsetof(Core, data_max), 0, NULL},
    {"_direct_pos", T_PYSSIZET, offsetof(Core, direct_pos), 0, NULL},
    {"max_body_bytes", T_LONGLONG, offsetof(Core, max_body), 0, NULL},
    {"legal_kinds", T_ULONGLONG, offsetof(Core, legal), 0, NULL},
    {"reuse_large", T_BOOL, offsetof(Core, reuse_large), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef core_methods[] = {
    {"get_buffer", (PyCFunction)(void (*)(void))core_get_buffer, METH_FASTCALL,
     "get_buffer(sizehint=-1) -> memoryview: see svcframe.decoder.FrameDecoder."},
    {"buffer_updated", (PyCFunction)core_buffer_updated, METH_O,
     "buffer_updated(nbytes) -> list[Frame] | None: see svcframe.decoder.FrameDecoder."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef core_getset[] = {
    {"idle", (getter)core_idle, NULL, "True when no partial frame is buffered.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot core_slots[] = {
    {Py_tp_doc, "The state and receive interface (get_buffer, buffer_updated, idle) of svcframe.decoder.FrameDecoder "
                "in C: the compiled twin of svcframe.decoder._PyDecoderCore."},
    {Py_tp_new, core_new},
    {Py_tp_dealloc, core_dealloc},
    {Py_tp_traverse, core_traverse},
    {Py_tp_clear, core_clear},
    {Py_tp_members, core_members},
    {Py_tp_methods, core_methods},
    {Py_tp_getset, core_getset},
    {0, NULL},
};

static PyType_Spec core_spec = {
    "svcframe._speedups.DecoderCore",
    sizeof(Core),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    core_slots,
};


/* ---- DeadlinesCore: svcframe.deadlines.Deadlines.add ------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *heap;
    unsigned long long seq;
    double timer_at;
} DlCore;

static PyObject *
dl_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwargs))
{
    DlCore *self = (DlCore *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->heap = PyList_New(0);
    if (self->heap == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->timer_at = Py_HUGE_VAL;
    return (PyObject *)self;
}

static int
dl_traverse(DlCore *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->heap);
    return 0;
}

static int
dl_clear(DlCore *self)
{
    Py_CLEAR(self->heap);
    return 0;
}

static void
dl_dealloc(DlCore *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    dl_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* 1 when the heap entry is a finished call (gone from its table, or its future done), 0 when it is not, -1
 * with an exception set. */
static int
dl_finished(module_state *st, PyObject *entry)
{
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 4 || !PyDict_Check(PyTuple_GET_ITEM(entry, 2))) {
        PyErr_SetString(PyExc_TypeError, "deadline entries are (deadline, seq, waiting, request_id)");
        return -1;
    }
    PyObject *future = PyDict_GetItemWithError(PyTuple_GET_ITEM(entry, 2), PyTuple_GET_ITEM(entry, 3));
    if (future == NULL)
        return PyErr_Occurred() ? -1 : 1;
    Py_INCREF(future);
    int is_done = future_done(st, future);
    Py_DECREF(future);
    return is_done;
}

/* _compact(): svcframe.deadlines._PyDeadlinesCore._compact (the unfinished calls, when they are less than half
 * the heap, become the heap; _idle() when none is left). */
static PyObject *
dl_compact(DlCore *self, PyObject *Py_UNUSED(ignored))
{
    module_state *st = core_state((PyObject *)self);
    if (st == NULL)
        return NULL;
    if (self->heap == NULL || !PyList_CheckExact(self->heap)) {
        PyErr_SetString(PyExc_TypeError, "_heap must be a list");
        return NULL;
    }
    PyObject *heap = self->heap;
    Py_INCREF(heap);
    PyObject *live = PyList_New(0);
    if (live == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(heap); i++) {
        PyObject *entry = PyList_GET_ITEM(heap, i);
        Py_INCREF(entry);
        int finished = dl_finished(st, entry);
        int rc = finished < 0 ? -1 : finished ? 0 : PyList_Append(live, entry);
        Py_DECREF(entry);
        if (rc < 0)
            goto fail;
    }
    if (PyList_GET_SIZE(live) * 2 < PyList_GET_SIZE(heap)) {
        PyObject *rc = PyObject_Vectorcall(st->heapify, &live, 1, NULL);
        if (rc == NULL)
            goto fail;
        Py_DECREF(rc);
        Py_SETREF(self->heap, live); /* (takes our reference to live) */
        live = NULL;
        if (!PyList_GET_SIZE(self->heap)) {
            rc = PyObject_CallMethodNoArgs((PyObject *)self, st->s_idle);
            if (rc == NULL)
                goto fail;
            Py_DECREF(rc);
        }
    }
    Py_XDECREF(live);
    Py_DECREF(heap);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(live);
    Py_DECREF(heap);
    return NULL;
}

/* add(deadline, waiting, request_id): svcframe.deadlines._PyDeadlinesCore.add. */
static PyObject *
dl_add(DlCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "add takes 3 arguments");
        return NULL;
    }
    module_state *st = core_state((PyObject *)self);
    if (st == NULL)
        return NULL;
    double deadline = PyFloat_AsDouble(args[0]);
    if (deadline == -1.0 && PyErr_Occurred())
        return NULL;
    if (self->heap == NULL || !PyList_CheckExact(self->heap)) {
        PyErr_SetString(PyExc_TypeError, "_heap must be a list");
        return NULL;
    }
    PyObject *heap = self->heap;
    Py_INCREF(heap); /* (the methods called below may replace it) */
    unsigned long long seq = ++self->seq;
    PyObject *seq_obj = PyLong_FromUnsignedLongLong(seq);
    PyObject *entry = seq_obj == NULL ? NULL : PyTuple_Pack(4, args[0], seq_obj, args[1], args[2]);
    Py_XDECREF(seq_obj);
    PyObject *pushargs[2] = {heap, entry};
    PyObject *rc = entry == NULL ? NULL : PyObject_Vectorcall(st->heappush, pushargs, 2, NULL);
    Py_XDECREF(entry);
    if (rc == NULL)
        goto fail;
    Py_DECREF(rc);
    if (deadline < self->timer_at) {
        rc = PyObject_CallMethodOneArg((PyObject *)self, st->s_arm, args[0]);
    } else if (PyList_GET_SIZE(heap) > 1024 && !(seq & 1023)) {
        rc = PyObject_CallMethodNoArgs((PyObject *)self, st->s_compact_heap);
    } else {
        Py_DECREF(heap);
        Py_RETURN_NONE;
    }
    Py_DECREF(heap);
    return rc == NULL ? NULL : (Py_DECREF(rc), Py_NewRef(Py_None));
fail:
    Py_DECREF(heap);
    return NULL;
}

static PyMemberDef dl_members[] = {
    {"_heap", T_OBJECT, offsetof(DlCore, heap), 0, NULL},
    {"_seq", T_ULONGLONG, offsetof(DlCore, seq), 0, NULL},
    {"_timer_at", T_DOUBLE, offsetof(DlCore, timer_at), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef dl_methods[] = {
    {"add", (PyCFunction)(void (*)(void))dl_add, METH_FASTCALL,
     "add(deadline, waiting, request_id) -> None: see svcframe.deadlines.Deadlines."},
    {"_compact", (PyCFunction)dl_compact, METH_NOARGS,
     "_compact() -> None: drop finished calls when they are more than half the heap."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot dl_slots[] = {
    {Py_tp_doc, "The heap and add() of svcframe.deadlines.Deadlines in C: the compiled twin of "
                "svcframe.deadlines._PyDeadlinesCore."},
    {Py_tp_new, dl_new},
    {Py_tp_dealloc, dl_dealloc},
    {Py_tp_traverse, dl_traverse},
    {Py_tp_clear, dl_clear},
    {Py_tp_members, dl_members},
    {Py_tp_methods, dl_methods},
    {0, NULL},
};

static PyType_Spec dl_spec = {
    "svcframe._speedups.DeadlinesCore",
    sizeof(DlCore),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    dl_slots,
};

PyDoc_STRVAR(configure_doc,
"configure(frame_type, zero_trace_id, unpack, unpack_kwargs, request_frame_py, ok_response_py,\n"
"          unpack_body_py) -> None\n\n"
"What DecoderCore decodes with: svcframe.wire's Frame, ZERO_TRACE_ID and the strict msgpack decoder of\n"
"answers (``unpack(body, **unpack_kwargs)``, at most 8 keywords); the Python twins of request_frame,\n"
"ok_response and unpack_body.");

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "configure takes 7 arguments");
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: frame_type must be a tuple subclass");
        return NULL;
    }
    if (!PyDict_Check(args[3]) || PyDict_GET_SIZE(args[3]) > UNPACK_KWARGS_MAX) {
        PyErr_SetString(PyExc_TypeError, "configure: unpack_kwargs must be a dict of at most 8 keywords");
        return NULL;
    }
    PyObject *names = PyTuple_New(PyDict_GET_SIZE(args[3])), *values = PyTuple_New(PyDict_GET_SIZE(args[3]));
    if (names == NULL || values == NULL) {
        Py_XDECREF(names);
        Py_XDECREF(values);
        return NULL;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0, i = 0;
    while (PyDict_Next(args[3], &pos, &key, &value)) {
        if (!PyUnicode_Check(key)) {
            Py_DECREF(names);
            Py_DECREF(values);
            PyErr_SetString(PyExc_TypeError, "configure: unpack_kwargs' keys must be str");
            return NULL;
        }
        Py_INCREF(key);
        Py_INCREF(value);
        PyTuple_SET_ITEM(names, i, key);
        PyTuple_SET_ITEM(values, i, value);
        i++;
    }
    module_state *st = (module_state *)PyModule_GetState(module);
    Py_INCREF(args[0]);
    Py_XSETREF(st->frame_type, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(st->zero_trace, args[1]);
    Py_INCREF(args[2]);
    Py_XSETREF(st->unpack, args[2]);
    Py_XSETREF(st->unpack_kwnames, names);
    Py_XSETREF(st->unpack_kwvalues, values);
    Py_INCREF(args[4]);
    Py_XSETREF(st->request_frame_py, args[4]);
    Py_INCREF(args[5]);
    Py_XSETREF(st->ok_response_py, args[5]);
    Py_INCREF(args[6]);
    Py_XSETREF(st->unpack_body_py, args[6]);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(configure_decoder_doc,
"configure_decoder(keep_bytes) -> None\n\n"
"svcframe.decoder.KEEP_RECEIVE_BYTES: the receive-buffer bytes an idle DecoderCore keeps committed.");

static PyObject *
configure_decoder(PyObject *module, PyObject *keep_bytes)
{
    Py_ssize_t keep = PyLong_AsSsize_t(keep_bytes);
    if (keep == -1 && PyErr_Occurred())
        return NULL;
    ((module_state *)PyModule_GetState(module))->keep_bytes = keep;
    Py_RETURN_NONE;
}


/* ---- request_frame: a REQUEST's bytes --------------------------------------------------------------------- */

static inline void wr16(unsigned char *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void wr32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void wr64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }

/* A header at p with the fields every frame sets (kind, flags, body length, request id), the rest zero. */
static inline void
write_header(unsigned char *p, unsigned kind, unsigned flags, Py_ssize_t length, unsigned long long rid)
{
    memset(p, 0, HEADER_SIZE);
    wr16(p, MAGIC_INT);
    p[2] = WIRE_VERSION;
    p[3] = (unsigned char)kind;
    wr16(p + 4, (uint16_t)flags);
    wr32(p + 12, (uint32_t)length);
    wr64(p + 16, rid);
}

/* args[i] as an unsigned int of at most ``max``; 0 with no exception when it is not one (the caller defers to
 * the Python twin, whose error is the definition). */
static int
as_field(PyObject *o, unsigned long long max, unsigned long long *out)
{
    if (!PyLong_CheckExact(o))
        return 0;
    /* below 2**63 by the digit loop of PyLong_AsLongLongAndOverflow: PyLong_AsUnsignedLongLong goes through the
     * generic _PyLong_AsByteArray for any value of two digits or more (2**30 up: an rpc id, a callpath), about
     * 185 instructions each, four per call (callgrind, Python 3.11) */
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(o, &overflow);
    unsigned long long v = (unsigned long long)s;
    if (overflow || s < 0) {
        v = PyLong_AsUnsignedLongLong(o);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    }
    if (v > max)
        return 0;
    *out = v;
    return 1;
}

PyDoc_STRVAR(request_frame_doc,
"request_frame(flags, provider_id, rpc_id, request_id, deadline_usec, parent_provider_id, parent_rpc_id,\n"
"              callpath, trace_id, span_id, lamport, body) -> bytes\n\n"
"A REQUEST frame, header and body in one bytes object: svcframe.wire.request_frame (its Python twin, which it\n"
"calls for anything but in-range ints, a 16-byte trace id and a bytes body, so that errors are the twin's).");

static PyObject *
request_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const unsigned long long max[11] = {0xFFFF, 0xFFFF, 0xFFFFFFFF, UINT64_MAX, 0xFFFFFFFF, 0xFFFF,
                                               0xFFFFFFFF, UINT64_MAX, 0, UINT64_MAX, UINT64_MAX};
    module_state *st = (module_state *)PyModule_GetState(module);
    unsigned long long v[11] = {0};
    int ok = nargs == 12 && PyBytes_CheckExact(args[8]) && PyBytes_GET_SIZE(args[8]) == 16 &&
             PyBytes_CheckExact(args[11]) && PyBytes_GET_SIZE(args[11]) <= 0xFFFFFFFF;
    for (int i = 0; ok && i < 11; i++)
        ok = i == 8 || as_field(args[i], max[i], &v[i]);
    if (!ok) {
        if (!configured(st))
            return NULL;
        return PyObject_Vectorcall(st->request_frame_py, args, (size_t)nargs, NULL);
    }
    Py_ssize_t length = PyBytes_GET_SIZE(args[11]);
    PyObject *frame = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + length);
    if (frame == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(frame);
    write_header(p, K_REQUEST, (unsigned)v[0], length, v[3]); /* flags, request_id */
    wr16(p + 6, (uint16_t)v[1]);   /* provider_id */
    wr32(p + 8, (uint32_t)v[2]);   /* rpc_id */
    wr32(p + 24, (uint32_t)v[4]);  /* deadline_usec; status (28) 0 */
    wr16(p + 30, (uint16_t)v[5]);  /* parent_provider_id */
    wr32(p + 32, (uint32_t)v[6]);  /* parent_rpc_id; reserved (36) 0 */
    wr64(p + 40, v[7]);            /* callpath */
    memcpy(p + 48, PyBytes_AS_STRING(args[8]), 16); /* trace_id */
    wr64(p + 64, v[9]);            /* span_id */
    wr64(p + 72, v[10]);           /* lamport */
    memcpy(p + HEADER_SIZE, PyBytes_AS_STRING(args[11]), (size_t)length);
    return frame;
}

PyDoc_STRVAR(ok_response_doc,
"ok_response(request_id, result) -> bytes\n\n"
"An OK RESPONSE frame whose body is ``result`` (None or bytes) packed as msgpack: svcframe.wire.ok_response\n"
"(its Python twin, which it calls for anything else).");

static PyObject *
ok_response(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = (module_state *)PyModule_GetState(module);
    unsigned long long rid = 0;
    PyObject *result = nargs == 2 ? args[1] : NULL;
    if (nargs != 2 || !as_field(args[0], UINT64_MAX, &rid) || (result != Py_None && !PyBytes_CheckExact(result)) ||
        (result != Py_None && PyBytes_GET_SIZE(result) > 0xFFFFFFFF - 5)) {
        if (!configured(st))
            return NULL;
        return PyObject_Vectorcall(st->ok_response_py, args, (size_t)nargs, NULL);
    }
    Py_ssize_t n = result == Py_None ? 0 : PyBytes_GET_SIZE(result);
    Py_ssize_t head = result == Py_None ? 1 : n < 0x100 ? 2 : n < 0x10000 ? 3 : 5; /* nil, or bin 8/16/32 */
    PyObject *frame = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + head + n);
    if (frame == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(frame);
    write_header(p, K_RESPONSE, 0, head + n, rid);
    unsigned char *b = p + HEADER_SIZE;
    if (result == Py_None) {
        b[0] = 0xc0;
    } else {
        if (head == 2) {
            b[0] = 0xc4;
            b[1] = (unsigned char)n;
        } else if (head == 3) {
            b[0] = 0xc5;
            b[1] = (unsigned char)(n >> 8);
            b[2] = (unsigned char)n;
        } else {
            b[0] = 0xc6;
            b[1] = (unsigned char)(n >> 24);
            b[2] = (unsigned char)(n >> 16);
            b[3] = (unsigned char)(n >> 8);
            b[4] = (unsigned char)n;
        }
        memcpy(b + head, PyBytes_AS_STRING(result), (size_t)n);
    }
    return frame;
}

PyDoc_STRVAR(receive_bytes_doc,
"receive_bytes(size) -> tuple[bytes, memoryview]\n\n"
"A new bytes object of ``size`` bytes (> 0), not yet written, and a writable memoryview of its bytes, for\n"
"svcframe.decoder to receive a large bin result straight into the object the call returns (one copy, the\n"
"kernel's, where decoding a received body made a second). The view does not own the bytes: the caller\n"
"keeps both, writes only through the view, and lets the view go before it hands the bytes out.\n\n"
"Raises ValueError (size < 1), MemoryError.");

static PyObject *
receive_bytes(PyObject *module, PyObject *arg)
{
    Py_ssize_t size = PyLong_AsSsize_t(arg);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 1) {
        PyErr_SetString(PyExc_ValueError, "receive_bytes: size must be at least 1");
        return NULL;
    }
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, size);
    if (bytes == NULL)
        return NULL;
    PyObject *view = PyMemoryView_FromMemory(PyBytes_AS_STRING(bytes), size, PyBUF_WRITE);
    if (view == NULL) {
        Py_DECREF(bytes);
        return NULL;
    }
    PyObject *pair = PyTuple_Pack(2, bytes, view);
    Py_DECREF(bytes);
    Py_DECREF(view);
    return pair;
}

PyDoc_STRVAR(unpack_body_doc,
"unpack_body(body) -> object\n\n"
"svcframe.wire.unpack_body: a simple item (nil, true, false, a fixint, a bin 8) without a call, other bytes\n"
"bodies by the strict msgpack decoder; anything else, and any body it refuses, by the Python twin (whose\n"
"errors are the definition).");

static PyObject *
unpack_body(PyObject *module, PyObject *body)
{
    module_state *st = (module_state *)PyModule_GetState(module);
    if (!configured(st))
        return NULL;
    if (PyBytes_CheckExact(body) && PyBytes_GET_SIZE(body) > 0) {
        PyObject *value = simple_value((const unsigned char *)PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body));
        if (value != NULL || PyErr_Occurred())
            return value;
        value = strict_unpack(st, body);
        if (value != NULL || !PyErr_ExceptionMatches(PyExc_Exception))
            return value;
        PyErr_Clear(); /* refused: the twin decodes it again and raises its error */
    }
    return PyObject_CallOneArg(st->unpack_body_py, body);
}

/* ---- State types: the attributes the compiled paths read, in C structs ------------------------------------ */

/* EngineState, ConnectionState, MonitorState, ProgressState and RecordState hold, as members, the attributes of
 * svcframe's Engine, Connection, Monitor, Progress and Record (their subclasses) that serve_request and
 * begin_call read and write on every call: a struct field each, where a generic attribute lookup cost about 265
 * instructions (callgrind, Python 3.11; the interpreter's own specialised lookups are a tenth of it, and Python
 * code reads a member as fast as a __slots__ slot). svcframe.slots has their Python twins (the same names as
 * __slots__). A member never set reads as AttributeError, as an unset attribute would. */
enum { E_LOOP, E_DEFAULT_TIMEOUT, E_CONNS, E_RPC_IDS, E_ROOT_CALLPATHS, E_TRACER, E_MONITOR, E_PROGRESS,
       E_DEADLINES, E_ROWS, E_CLOSING, E_REFUSED, E_ENGINE_ID, E_EXPOSED, E_DISPATCHING, E_DISPATCHING_CANCELS, E_N };
static const char *const ENGINE_STATE[E_N] = {
    "_loop", "default_timeout_seconds", "_conns", "_rpc_ids", "_root_callpaths", "tracer", "monitor", "progress",
    "_deadlines", "_rows", "_closing", "_refused", "engine_id", "_exposed", "_dispatching", "_dispatching_cancels",
};
enum { CN_CLOSED, CN_PENDING, CN_PEER_MAX_BODY, CN_RECORDS, CN_NEXT_REQUEST_ID, CN_BATCH, CN_BATCH_BYTES,
       CN_TRANSPORT, CN_WRITES, CN_MAX_OUTPUT, CN_CORK, CN_PEER_ENGINE_ID, CN_PEER_PUSH_AHEAD, CN_PEER_LABEL,
       CN_PAUSED, CN_OPEN, CN_DECODE, CN_LAST_ACTIVITY, CN_FRAME_STARTED, CN_OWNER, CN_BACKLOG, CN_PROTOCOL,
       CN_WRITELINES_PAUSES, CN_N };
static const char *const CONNECTION_STATE[CN_N] = {
    "closed", "pending", "peer_max_body_bytes", "records", "next_request_id", "_batch", "_batch_bytes",
    "transport", "writes", "max_output_bytes", "_cork", "peer_engine_id", "peer_push_ahead", "peer_label",
    "_paused", "_open", "_decode", "last_activity", "frame_started", "owner", "_backlog", "protocol",
    "_writelines_pauses",
};
enum { M_ENABLED, M_SAMPLE_EVERY, M_ORIGIN, M_TARGET, M_BULK, M_N };
static const char *const MONITOR_STATE[M_N] = {"enabled", "sample_every", "origin", "target", "bulk"};
enum { P_INFLIGHT, P_BLOCKING, P_N };
static const char *const PROGRESS_STATE[P_N] = {"inflight", "blocking"};
enum { R_CALLS, R_ERRORS, R_N };
static const char *const RECORD_STATE[R_N] = {"calls", "errors"};

typedef struct {
    PyObject_HEAD
    PyObject *f[1]; /* (as many as the type's names: its basicsize says) */
} State;

#define FIELD(o, i) (((State *)(o))->f[i])
#define STATE_SIZE(n) (offsetof(State, f) + (n) * sizeof(PyObject *))

static void state_dealloc(PyObject *self);

/* The number of fields of ``self``'s state type (its first base, from its own type up, that is one). */
static Py_ssize_t
state_fields(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    while (type->tp_dealloc != state_dealloc)
        type = type->tp_base;
    return (Py_ssize_t)((type->tp_basicsize - offsetof(State, f)) / sizeof(PyObject *));
}

static int
state_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    for (Py_ssize_t i = 0, n = state_fields(self); i < n; i++)
        Py_VISIT(FIELD(self, i));
    return 0;
}

static int
state_clear(PyObject *self)
{
    for (Py_ssize_t i = 0, n = state_fields(self); i < n; i++)
        Py_CLEAR(FIELD(self, i));
    return 0;
}

static void
state_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    state_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

/* A state type named ``name`` with the members ``names`` (a base class: see above). */
static PyObject *
new_state_type(PyObject *module, const char *name, const char *const *names, int n, const char *doc,
               PyMethodDef *methods)
{
    PyMemberDef *members = PyMem_Calloc((size_t)n + 1, sizeof(PyMemberDef));
    if (members == NULL)
        return PyErr_NoMemory();
    for (int i = 0; i < n; i++) {
        members[i].name = names[i];
        members[i].type = T_OBJECT_EX;
        members[i].offset = (Py_ssize_t)STATE_SIZE(i);
    }
    PyType_Slot slots[] = {
        {Py_tp_doc, (void *)doc},
        {Py_tp_dealloc, state_dealloc},
        {Py_tp_traverse, state_traverse},
        {Py_tp_clear, state_clear},
        {Py_tp_members, members},
        {methods != NULL ? Py_tp_methods : 0, methods},
        {0, NULL},
    };
    PyType_Spec spec = {name, (int)STATE_SIZE(n), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
                        slots};
    PyObject *type = PyType_FromModuleAndSpec(module, &spec, NULL);
    PyMem_Free(members); /* (the type has its own copies of the member descriptors) */
    if (type == NULL || PyModule_AddObjectRef(module, strrchr(name, '.') + 1, type) < 0) {
        Py_XDECREF(type);
        return NULL;
    }
    return type;
}

/* ---- serve_request: the common case of svcframe.handlers.Handlers._on_request ---------------------------- */

/* The attribute and method names serve_request uses, interned once (module_state.sn, in this order). */
#define SERVE_NAMES_N 11
_Static_assert(sizeof(((module_state *)0)->sn) / sizeof(PyObject *) == SERVE_NAMES_N, "module_state.sn: SERVE_NAMES_N");
static const char *const SERVE_NAMES[SERVE_NAMES_N] = {
    "is_coroutine", "handler", "request", "send", "_handled", "_finish_error", "_track_task", "send_many",
    "serving", "first_step", "_answer_first_step",
};
enum { N_IS_COROUTINE, N_HANDLER, N_REQUEST, N_SEND, N_HANDLED, N_FINISH_ERROR, N_TRACK_TASK, N_SEND_MANY,
       N_SERVING, N_FIRST_STEP, N_ANSWER_FIRST_STEP };

/* The method names begin_call and conn_send use, interned once (module_state.cn, in this order). */
#define CALL_NAMES_N 17
_Static_assert(sizeof(((module_state *)0)->cn) / sizeof(PyObject *) == CALL_NAMES_N, "module_state.cn: CALL_NAMES_N");
static const char *const CALL_NAMES[CALL_NAMES_N] = {
    "time", "create_future", "send_request", "activity", "request", "write", "get_write_buffer_size",
    "_flush_batch", "_slow_reader", "peer_cma", "protocol", "pulls", "overflowed", "writable", "call_soon",
    "_uncork", "DEBUG_WIRE",
};
enum { C_TIME, C_CREATE_FUTURE, C_SEND_REQUEST, C_ACTIVITY, C_REQUEST, C_WRITE, C_GET_WRITE_BUFFER_SIZE,
       C_FLUSH_BATCH, C_SLOW_READER, C_PEER_CMA, C_PROTOCOL, C_PULLS, C_OVERFLOWED, C_WRITABLE, C_CALL_SOON,
       C_UNCORK, C_DEBUG_WIRE };


/* ``o`` is an instance of the state type ``type`` (a subclass's) with its field ``i`` set: that field, borrowed;
 * NULL (no exception set) otherwise. */
static inline PyObject *
field_of(PyObject *o, PyObject *type, int i)
{
    return o != NULL && PyObject_TypeCheck(o, (PyTypeObject *)type) ? FIELD(o, i) : NULL;
}

/* An exact int in [0, LLONG_MAX): its value; -1 for anything else. */
static inline long long
small_count(PyObject *o)
{
    if (o == NULL || !PyLong_CheckExact(o))
        return -1;
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        PyErr_Clear();
    return v < 0 || v == LLONG_MAX ? -1 : v;
}

/* Connection._write's work for one write of ``data`` by the transport's ``method`` (write, or writelines of a
 * list), where the connection's ``writes`` is a small int and its transport is set: writes += 1, the write, then
 * the slow-reader cap checked on the transport's buffer (see _write). 0, or -1 with an exception set. */
static int
transport_write(module_state *st, PyObject *conn, PyObject *method, PyObject *data)
{
    PyObject *writes = PyLong_FromLongLong(small_count(FIELD(conn, CN_WRITES)) + 1), *r;
    if (writes == NULL)
        return -1;
    Py_XSETREF(FIELD(conn, CN_WRITES), writes);
    PyObject *transport = Py_NewRef(FIELD(conn, CN_TRANSPORT)), *call_args[2] = {transport, data};
    r = PyObject_VectorcallMethod(method, call_args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_XSETREF(r, r == NULL ? NULL : PyObject_CallMethodNoArgs(transport, st->cn[C_GET_WRITE_BUFFER_SIZE]));
    Py_DECREF(transport);
    if (r == NULL)
        return -1;
    PyObject *cap = Py_XNewRef(FIELD(conn, CN_MAX_OUTPUT));
    int over = cap == NULL ? -1 : PyObject_RichCompareBool(r, cap, Py_GT); /* the slow-reader cap (see _write) */
    Py_XDECREF(cap);
    Py_DECREF(r);
    if (over <= 0) {
        if (over < 0 && !PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError, "max_output_bytes");
        return over;
    }
    r = PyObject_CallMethodNoArgs(conn, st->cn[C_SLOW_READER]);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* svcframe.transport.Connection.send(data), its definition (called for anything unusual): ``data`` joins the
 * batch of replies being dispatched, or is written to the transport, whose buffer is then checked against the
 * slow-reader cap. 0, or -1 with an exception set. */
static int
conn_send(module_state *st, PyObject *conn, PyObject *data)
{
    PyObject *batch = FIELD(conn, CN_BATCH), *closed = FIELD(conn, CN_CLOSED), *r;
    long long total = PyBytes_CheckExact(data) ? small_count(FIELD(conn, CN_BATCH_BYTES)) : -1;
    if (batch != NULL && PyList_CheckExact(batch) && total >= 0 && total < LLONG_MAX / 2) {
        total += PyBytes_GET_SIZE(data); /* batch.append(data); self._batch_bytes += len(data) */
        PyObject *count = PyList_Append(batch, data) < 0 ? NULL : PyLong_FromLongLong(total);
        if (count == NULL)
            return -1;
        Py_XSETREF(FIELD(conn, CN_BATCH_BYTES), count);
        if (total <= st->batch_flush_bytes)
            return 0;
        r = PyObject_CallMethodNoArgs(conn, st->cn[C_FLUSH_BATCH]);
    } else if (batch == Py_None && closed == Py_True) {
        return 0; /* (closed: nothing is sent) */
    } else if (batch == Py_None && closed == Py_False && PyBytes_CheckExact(data) && FIELD(conn, CN_TRANSPORT) != NULL &&
               FIELD(conn, CN_TRANSPORT) != Py_None && small_count(FIELD(conn, CN_WRITES)) >= 0) {
        return transport_write(st, conn, st->cn[C_WRITE], data);
    } else {
        r = PyObject_CallMethodOneArg(conn, st->sn[N_SEND], data);
    }
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* svcframe.transport.Connection.send_many((header, data)) for two bytes objects: both join the batch of replies
 * being dispatched (the common case: a server answers within its dispatch), or the definition writes them. 0,
 * or -1 with an exception set. */
static int
conn_send_two(module_state *st, PyObject *conn, PyObject *header, PyObject *data)
{
    PyObject *batch = FIELD(conn, CN_BATCH), *r;
    long long total = small_count(FIELD(conn, CN_BATCH_BYTES));
    if (batch != NULL && PyList_CheckExact(batch) && total >= 0 && total < LLONG_MAX / 4) {
        total += PyBytes_GET_SIZE(header) + PyBytes_GET_SIZE(data); /* batch.extend(parts); _batch_bytes += ... */
        PyObject *count = PyList_Append(batch, header) < 0 || PyList_Append(batch, data) < 0
                              ? NULL
                              : PyLong_FromLongLong(total);
        if (count == NULL)
            return -1;
        Py_XSETREF(FIELD(conn, CN_BATCH_BYTES), count);
        if (total <= st->batch_flush_bytes)
            return 0;
        r = PyObject_CallMethodNoArgs(conn, st->cn[C_FLUSH_BATCH]);
    } else {
        PyObject *parts = PyTuple_Pack(2, header, data);
        r = parts == NULL ? NULL : PyObject_CallMethodOneArg(conn, st->sn[N_SEND_MANY], parts);
        Py_XDECREF(parts);
    }
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The header of a BULK_DATA_REPLY of ``length`` bytes with ``flags`` for request ``rid``: the bytes of
 * svcframe.wire.pack_data_reply_header_flags(flags, length, rid). */
static PyObject *
data_reply_header(unsigned flags, Py_ssize_t length, unsigned long long rid)
{
    PyObject *header = PyBytes_FromStringAndSize(NULL, HEADER_SIZE);
    if (header == NULL)
        return NULL;
    write_header((unsigned char *)PyBytes_AS_STRING(header), K_BULK_DATA_REPLY, flags, length, rid);
    return header;
}

/* Connection.whole_frame_bytes (the largest data that leaves as one frame: min(peer_max_body_bytes,
 * max_output_bytes // 2)); -1 when either is not a small int (the definition then decides). */
static long long
whole_frame_bytes(PyObject *conn)
{
    long long peer = small_count(FIELD(conn, CN_PEER_MAX_BODY)), cap = small_count(FIELD(conn, CN_MAX_OUTPUT));
    if (peer < 0 || cap < 0)
        return -1;
    return peer < cap / 2 ? peer : cap / 2;
}

/* A compiled path hands its case to the Python definition: an Exception raised while it decided is cleared (the
 * definition meets it again and raises it with its own context); anything else (KeyboardInterrupt, SystemExit,
 * arriving while Python code ran) stays set, and 0 says to raise it now, as the definition would. 1: decline. */
static inline int
may_decline(void)
{
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
        return 0;
    PyErr_Clear();
    return 1;
}

/* Handlers._runs_now: an async def handler's first step may run now (its deadline, usec after its arrival, has
 * not passed by the clock; its batch does not cancel it; its request id is not being served). 1, or 0 (perhaps
 * with an exception set). It makes the set of the batch's CANCELs when _runs_now would, the same set. */
static int
runs_now(module_state *st, PyObject *engine, PyObject *conn, PyObject *frame, long long arrival_ns)
{
    PyObject *usec = PyTuple_GET_ITEM(frame, 5), *request_id = PyTuple_GET_ITEM(frame, 4);
    long long us = PyLong_CheckExact(usec) ? PyLong_AsLongLong(usec) : -1;
    if (us < 0 || arrival_ns < 0 || us > LLONG_MAX / 1000 || (us && monotonic_ns() - arrival_ns >= us * 1000))
        return 0;
    PyObject *cancels = FIELD(engine, E_DISPATCHING_CANCELS), *batch = FIELD(engine, E_DISPATCHING);
    if (cancels == Py_None) { /* {f[4] for f in self._dispatching if f[0] == K_CANCEL} */
        if (batch == NULL || !(PyList_CheckExact(batch) || PyTuple_CheckExact(batch)))
            return 0;
        PyObject *made = PySet_New(NULL);
        for (Py_ssize_t i = 0; made != NULL && i < PySequence_Fast_GET_SIZE(batch); i++) {
            PyObject *f = PySequence_Fast_GET_ITEM(batch, i), *kind;
            if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != FRAME_FIELDS)
                Py_CLEAR(made);
            else if (PyLong_CheckExact(kind = PyTuple_GET_ITEM(f, 0)) && PyLong_AsLong(kind) == K_CANCEL &&
                     PySet_Add(made, PyTuple_GET_ITEM(f, 4)) < 0)
                Py_CLEAR(made);
        }
        if (made == NULL)
            return 0;
        Py_XSETREF(FIELD(engine, E_DISPATCHING_CANCELS), made);
        cancels = made;
    }
    if (cancels == NULL || !PyAnySet_CheckExact(cancels) || PySet_Contains(cancels, request_id) != 0)
        return 0;
    PyObject *serving = PyObject_GetAttr(conn, st->sn[N_SERVING]);
    int served = serving != NULL && PyDict_CheckExact(serving) ? PyDict_Contains(serving, request_id) : -1;
    Py_XDECREF(serving);
    return served == 0;
}

/* A request that _on_request would answer in its common case: its registration, its decoded argument (*arg)
 * and, when monitored, its statistics record (*rec) and the count it reaches (*calls), all new references, and
 * whether its handler is an async def (*coroutine: one whose first step may run now); NULL when it is not that
 * case, perhaps with an exception set (serve_request decides what becomes of it). Nothing is changed here (but
 * the batch's set of CANCELs, made as _runs_now makes it): the decision precedes every effect. */
static PyObject *
common_request(module_state *st, PyObject *module, PyObject *engine, PyObject *conn, PyObject *frame,
               PyObject *arrival_ns, PyObject **arg, PyObject **rec, long long *calls, int *coroutine)
{
    *arg = *rec = NULL;
    if (!PyTuple_Check(frame) || PyTuple_GET_SIZE(frame) != FRAME_FIELDS ||
        !PyObject_TypeCheck(engine, (PyTypeObject *)st->engine_state) ||
        !PyObject_TypeCheck(conn, (PyTypeObject *)st->connection_state))
        return NULL;
    PyObject *flags = PyTuple_GET_ITEM(frame, 1), *body = PyTuple_GET_ITEM(frame, 13);
    long fl = PyLong_CheckExact(flags) ? PyLong_AsLong(flags) : -1;
    if (fl < 0 || fl & st->not_fast || !PyBytes_CheckExact(body) || PyBytes_GET_SIZE(body) == 0) {
        return NULL;
    }
    PyObject *rows = FIELD(engine, E_ROWS), *refused = FIELD(engine, E_REFUSED);
    if (rows == NULL || !PyDict_CheckExact(rows) || FIELD(engine, E_CLOSING) != Py_False || refused == NULL ||
        !PyDict_CheckExact(refused) || PyDict_GET_SIZE(refused) || FIELD(engine, E_TRACER) != Py_None)
        return NULL;
    PyObject *key = PyTuple_Pack(2, PyTuple_GET_ITEM(frame, 2), PyTuple_GET_ITEM(frame, 3));
    PyObject *reg = key == NULL ? NULL : PyDict_GetItemWithError(rows, key);
    Py_XDECREF(key);
    *coroutine = reg == NULL ? -1 : attr_true(reg, st->sn[N_IS_COROUTINE]);
    if (*coroutine < 0 || (*coroutine && (st->handler_globals == NULL || !PyLong_CheckExact(arrival_ns) ||
                                          !runs_now(st, engine, conn, frame, PyLong_AsLongLong(arrival_ns))))) {
        return NULL; /* (an async def handler that may not run now: started as usual, by _on_request) */
    }
    Py_INCREF(reg); /* (held: decoding the body may run Python code, a collection's finalizers) */
    PyObject *monitor = FIELD(engine, E_MONITOR);
    PyObject *enabled = field_of(monitor, st->monitor_state, M_ENABLED);
    if (enabled != Py_False && enabled != Py_True) {
        Py_DECREF(reg);
        return NULL;
    }
    if (enabled == Py_True) { /* counted, and untimed: a call from outside any handler, whose record is cached */
        PyObject *parent_rpc = PyTuple_GET_ITEM(frame, 8), *records = FIELD(conn, CN_RECORDS);
        if (!PyLong_CheckExact(parent_rpc) || PyLong_AsLong(parent_rpc) != 0 || records == NULL ||
            !PyDict_CheckExact(records)) {
            Py_DECREF(reg);
            return NULL;
        }
        *rec = PyDict_GetItemWithError(records, reg);
        long long count = small_count(field_of(*rec, st->record_state, R_CALLS));
        long long every = small_count(FIELD(monitor, M_SAMPLE_EVERY));
        if (count < 0 || every <= 0 || count + 1 <= st->always_timed || !((count + 1) % every)) {
            *rec = NULL;
            Py_DECREF(reg);
            return NULL; /* (timed: _on_request times it) */
        }
        *calls = count + 1;
        Py_INCREF(*rec);
    }
    *arg = unpack_body(module, body);
    if (*arg == NULL) { /* (refused: _on_request decodes it again and answers BAD_REQUEST) */
        Py_CLEAR(*rec);
        Py_DECREF(reg);
        return NULL;
    }
    return reg;
}

/* The exception set, as an object with its traceback (for _finish_error); the error indicator is cleared. */
static PyObject *
take_exception(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

/* except Exception as exc: self._finish_error(conn, frame, reg, exc), when the exception set is an Exception:
 * 0 once answered; -1 with the exception (another kind, or _finish_error's own) set. */
static int
finish_error(module_state *st, PyObject *engine, PyObject *conn, PyObject *frame, PyObject *reg)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *exc = take_exception();
    PyObject *error_args[5] = {engine, conn, frame, reg, exc};
    PyObject *r = exc == NULL ? NULL : PyObject_VectorcallMethod(st->sn[N_FINISH_ERROR], error_args,
                                                                 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_XDECREF(exc);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* _on_request's async def branch, for a handler whose first step may run now (common_request): the request in
 * the task-request context variable while the handler makes its coroutine and the coroutine's context is
 * copied; its first step by svcframe.handlers' first_step (svcframe.eager.first_step: in a Task of its own);
 * finished with None or small bytes (not into=), answered here as a sync handler's common result; otherwise
 * the engine's _answer_first_step answers it, or _track_task tracks the Task it goes on in (answered by
 * _task_done). An Exception goes to _finish_error, as the twin's try does. 0, or -1 with an exception set. */
static int
serve_coroutine(module_state *st, PyObject *module, PyObject *engine, PyObject *conn, PyObject *frame, PyObject *reg,
                PyObject *req, PyObject *arg, PyObject *arrival_ns, int into)
{
    PyObject *token = PyContextVar_Set(st->task_request, req); /* token = _task_request.set(req) */
    if (token == NULL)
        return -1;
    PyObject *handler = NULL, *coro = NULL, *ctx = NULL, *stepped = NULL, *task = NULL, *answer = NULL;
    int failed = 0;
    /* try: */
    handler = PyObject_GetAttr(reg, st->sn[N_HANDLER]);
    PyObject *call_args[2] = {req, arg};
    coro = handler == NULL ? NULL : PyObject_Vectorcall(handler, call_args, 2, NULL);
    PyObject *first_step = coro == NULL ? NULL : PyDict_GetItemWithError(st->handler_globals, st->sn[N_FIRST_STEP]);
    if (coro != NULL && first_step == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "svcframe.handlers has no first_step");
    ctx = first_step == NULL ? NULL : PyContext_CopyCurrent();
    if (ctx != NULL) {
        PyObject *step_args[3] = {FIELD(engine, E_LOOP), coro, ctx};
        stepped = step_args[0] == NULL ? NULL : PyObject_Vectorcall(first_step, step_args, 3, NULL);
        if (step_args[0] == NULL)
            PyErr_SetString(PyExc_RuntimeError, "the engine has no loop");
    }
    long kind = -1;
    if (stepped != NULL && (!PyTuple_CheckExact(stepped) || PyTuple_GET_SIZE(stepped) != 2 ||
                            !PyLong_CheckExact(PyTuple_GET_ITEM(stepped, 0)))) {
        PyErr_SetString(PyExc_TypeError, "first_step returned something other than (kind, outcome)");
    } else if (stepped != NULL) {
        kind = PyLong_AsLong(PyTuple_GET_ITEM(stepped, 0));
    }
    PyObject *outcome = kind < 0 ? NULL : PyTuple_GET_ITEM(stepped, 1);
    if (outcome == NULL) {
        failed = 1;
    } else if (kind == st->suspended) { /* task, answer = outcome, (arrival_ns, start_ns, rec) */
        task = Py_NewRef(outcome);
        answer = PyTuple_Pack(3, arrival_ns, st->zero, Py_None);
        failed = answer == NULL;
    } else if (kind == st->finished && !into &&
               (outcome == Py_None || (PyBytes_CheckExact(outcome) && PyBytes_GET_SIZE(outcome) <= st->small_result))) {
        PyObject *answer_args[2] = {PyTuple_GET_ITEM(frame, 4), outcome}; /* (untimed, untraced: checked) */
        PyObject *reply = ok_response(module, answer_args, 2);
        failed = reply == NULL || conn_send(st, conn, reply) < 0;
        Py_XDECREF(reply);
    } else { /* self._answer_first_step(conn, frame, reg, arrival_ns, start_ns, rec, kind, outcome, coro) */
        PyObject *answer_args[10] = {engine, conn, frame, reg, arrival_ns, st->zero, Py_None,
                                     PyTuple_GET_ITEM(stepped, 0), outcome, coro};
        PyObject *r = PyObject_VectorcallMethod(st->sn[N_ANSWER_FIRST_STEP], answer_args,
                                                10 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        failed = r == NULL;
        Py_XDECREF(r);
    }
    if (failed && finish_error(st, engine, conn, frame, reg) == 0) { /* except Exception as exc: */
        failed = 0;
        Py_CLEAR(task);
    }
    { /* finally: _task_request.reset(token) */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (PyContextVar_Reset(st->task_request, token) < 0) {
            if (type != NULL)
                PyErr_Clear(); /* (the first error wins) */
            else
                failed = 1;
        }
        if (type != NULL)
            PyErr_Restore(type, value, tb);
    }
    if (!failed && task != NULL) { /* self._track_task(conn, frame, reg, req, task, coro, answer) */
        PyObject *track_args[8] = {engine, conn, frame, reg, req, task, coro, answer};
        PyObject *r = PyObject_VectorcallMethod(st->sn[N_TRACK_TASK], track_args,
                                                8 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        failed = r == NULL;
        Py_XDECREF(r);
    }
    Py_XDECREF(answer);
    Py_XDECREF(task);
    Py_XDECREF(stepped);
    Py_XDECREF(ctx);
    Py_XDECREF(coro);
    Py_XDECREF(handler);
    Py_DECREF(token);
    return failed ? -1 : 0;
}

PyDoc_STRVAR(serve_request_doc,
"serve_request(engine, conn, frame, arrival_ns, arrival) -> None\n\n"
"svcframe.handlers.Handlers._on_request (its Python twin, configure_serve()), without a Python frame in its\n"
"common case: a handler of a known target (sync, or async def whose first step may run now), untraced,\n"
"untimed (monitoring off, or counted and not sampled), whose result is None or small bytes, or, for a call\n"
"taking its result into its own buffer (into=), bytes that fit one frame (sent as one data frame flagged\n"
"INTO, as _reply_into sends them). Any other request is handed to the twin before anything is done; a\n"
"handler's other results and its exceptions go to the engine's _handled and _finish_error, as the twin's do.");

static PyObject *
serve_request(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = (module_state *)PyModule_GetState(module);
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "serve_request takes 5 arguments");
        return NULL;
    }
    if (st->on_request_py == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "svcframe._speedups.configure_serve() was not called");
        return NULL;
    }
    PyObject *engine = args[0], *conn = args[1], *frame = args[2], *arg, *rec;
    long long calls = 0;
    int coroutine = 0;
    PyObject *reg = common_request(st, module, engine, conn, frame, args[3], &arg, &rec, &calls, &coroutine);
    if (reg == NULL) {
        if (!may_decline())
            return NULL;
        return PyObject_Vectorcall(st->on_request_py, args, (size_t)nargs, NULL);
    }
    PyObject *req = NULL, *result = NULL, *task = NULL, *handler = NULL;
    int failed = 0, into = (PyLong_AsLong(PyTuple_GET_ITEM(frame, 1)) & st->into_flag) != 0; /* (checked: an int) */
    if (rec != NULL) { /* rec.calls = n */
        PyObject *count = PyLong_FromLongLong(calls);
        if (count != NULL)
            Py_XSETREF(FIELD(rec, R_CALLS), count);
        Py_DECREF(rec);
        if (count == NULL) {
            failed = 1;
            goto done;
        }
    }
    PyTypeObject *request_type = (PyTypeObject *)st->request_type;
    req = request_type->tp_alloc(request_type, 5); /* Request(engine, conn, reg, frame, arrival) */
    if (req == NULL) {
        failed = 1;
        goto done;
    }
    PyObject *items[5] = {engine, conn, reg, frame, args[4]};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(req, i, items[i]);
    }
    if (coroutine) {
        failed = serve_coroutine(st, module, engine, conn, frame, reg, req, arg, args[3], into) < 0;
        goto done;
    }
    if (PyObject_SetAttr(st->sync, st->sn[N_REQUEST], req) < 0) { /* sync.request = req */
        failed = 1;
        goto done;
    }
    /* try: (as _on_request's: an Exception here goes to _finish_error) */
    handler = PyObject_GetAttr(reg, st->sn[N_HANDLER]);
    PyObject *call_args[2] = {req, arg};
    result = handler == NULL ? NULL : PyObject_Vectorcall(handler, call_args, 2, NULL);
    Py_ssize_t size = result != NULL && PyBytes_CheckExact(result) ? PyBytes_GET_SIZE(result) : -1;
    unsigned long long rid;
    if (!into && (result == Py_None || (result != NULL && result == st->done) || (size >= 0 && size <= st->small_result))) {
        /* (svcframe.eager.DONE: a push ahead written at once, its value None; as _handled answers it) */
        PyObject *answer_args[2] = {PyTuple_GET_ITEM(frame, 4), result == st->done ? Py_None : result};
        PyObject *answer = ok_response(module, answer_args, 2);
        failed = answer == NULL || conn_send(st, conn, answer) < 0;
        Py_XDECREF(answer);
    } else if (into && size > 0 && size <= whole_frame_bytes(conn) && as_field(PyTuple_GET_ITEM(frame, 4), UINT64_MAX, &rid)) {
        /* taken into the caller's buffer (_finish, _reply_into): bytes that fit one frame leave as one data
         * frame flagged INTO, which is also the answer; the object itself is written, not copied */
        PyObject *header = data_reply_header((unsigned)st->into_flag, size, rid);
        failed = header == NULL || conn_send_two(st, conn, header, result) < 0;
        Py_XDECREF(header);
    } else if (result != NULL) { /* sent by _finish, or an awaitable run as a task (returned) */
        PyObject *zero = PyLong_FromLong(0);
        PyObject *handled_args[9] = {engine, conn, frame, reg, req, args[3], zero, Py_None, result};
        task = zero == NULL ? NULL
                            : PyObject_VectorcallMethod(st->sn[N_HANDLED], handled_args,
                                                        9 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_XDECREF(zero);
        failed = task == NULL;
    } else {
        failed = 1;
    }
    if (failed && finish_error(st, engine, conn, frame, reg) == 0) { /* except Exception as exc: */
        failed = 0;
        Py_CLEAR(task);
    }
    { /* finally: sync.request = None */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (PyObject_SetAttr(st->sync, st->sn[N_REQUEST], Py_None) < 0) {
            if (type != NULL)
                PyErr_Clear(); /* (the first error wins, as a finally that raises would not let it) */
            else
                failed = 1;
        }
        if (type != NULL)
            PyErr_Restore(type, value, tb);
    }
    if (!failed && task != NULL && task != Py_None) {
        PyObject *track_args[7] = {engine, conn, frame, reg, req, task, result};
        PyObject *r = PyObject_VectorcallMethod(st->sn[N_TRACK_TASK], track_args,
                                                7 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        failed = r == NULL;
        Py_XDECREF(r);
    }
done:
    Py_XDECREF(task);
    Py_XDECREF(result);
    Py_XDECREF(handler);
    Py_XDECREF(req);
    Py_DECREF(arg);
    Py_DECREF(reg);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(configure_serve_doc,
"configure_serve(on_request_py, request_type, sync, not_fast_flags, into_flag, small_result_bytes,\n"
"                always_timed, batch_flush_bytes, done, handler_globals, suspended, finished) -> None\n\n"
"What serve_request serves with: svcframe.handlers' Handlers._on_request (its twin), Request (a tuple\n"
"subclass of 5 items), the sync handlers' thread-local, the request flags it leaves to the twin (no reply;\n"
"a result lent by address), wire.F_INTO (the result taken into the caller's buffer: answered here when it is\n"
"bytes that fit one frame), _SMALL_RESULT_BYTES, monitoring.ALWAYS_TIMED, transport.BATCH_FLUSH_BYTES, svcframe.eager.DONE\n"
"(answered as None: a push ahead written at once), and for async def handlers svcframe.handlers' globals (its\n"
"first_step, looked up per request) and svcframe.eager's SUSPENDED and FINISHED.");

static PyObject *
configure_serve(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "configure_serve takes 12 arguments");
        return NULL;
    }
    if (!PyDict_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError, "configure_serve: handler_globals must be a dict");
        return NULL;
    }
    long suspended = PyLong_AsLong(args[10]), finished = PyLong_AsLong(args[11]);
    if ((suspended == -1 || finished == -1) && PyErr_Occurred())
        return NULL;
    if (!PyType_Check(args[1]) || !PyType_IsSubtype((PyTypeObject *)args[1], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure_serve: request_type must be a tuple subclass");
        return NULL;
    }
    long long not_fast = PyLong_AsLongLong(args[3]), into_flag = PyLong_AsLongLong(args[4]);
    long long small = PyLong_AsLongLong(args[5]), always = PyLong_AsLongLong(args[6]);
    long long flush = PyLong_AsLongLong(args[7]);
    if (PyErr_Occurred())
        return NULL;
    module_state *st = (module_state *)PyModule_GetState(module);
    Py_INCREF(args[0]);
    Py_XSETREF(st->on_request_py, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(st->request_type, args[1]);
    Py_INCREF(args[2]);
    Py_XSETREF(st->sync, args[2]);
    Py_INCREF(args[8]);
    Py_XSETREF(st->done, args[8]);
    Py_XSETREF(st->handler_globals, Py_NewRef(args[9]));
    st->suspended = suspended;
    st->finished = finished;
    st->not_fast = not_fast;
    st->into_flag = (long)into_flag; /* (the same flag configure_calls() gives) */
    st->small_result = small;
    st->always_timed = always;
    st->batch_flush_bytes = flush;
    Py_RETURN_NONE;
}

/* svcframe.monitoring.Monitor.record_bulk(direction, peer, nbytes, 0), for a transfer done in this turn (no time
 * passed): its common case here (monitoring on, the key's record made), the definition otherwise. 0, or -1 with
 * an exception set. */
static int
record_bulk_now(module_state *st, PyObject *monitor, PyObject *direction, PyObject *peer, Py_ssize_t nbytes)
{
    PyObject *enabled = field_of(monitor, st->monitor_state, M_ENABLED);
    if (enabled == Py_False)
        return 0;
    PyObject *bulk = enabled == Py_True ? FIELD(monitor, M_BULK) : NULL, *n = PyLong_FromSsize_t(nbytes), *r;
    if (n == NULL)
        return -1;
    PyObject *key = bulk != NULL && PyDict_CheckExact(bulk) ? PyTuple_Pack(2, direction, peer) : NULL;
    PyObject *rec = key == NULL ? NULL : PyDict_GetItemWithError(bulk, key); /* (borrowed) */
    Py_XDECREF(key);
    long long calls = small_count(field_of(rec, st->record_state, R_CALLS));
    PyObject *buffer = calls >= 0 && calls < LLONG_MAX - 1 ? PyObject_GetAttr(rec, st->s_buffer) : NULL;
    if (buffer != NULL && PyList_CheckExact(buffer)) { /* rec.calls += 1; rec.buffer.extend((nbytes, 0)) */
        PyObject *count = PyLong_FromLongLong(calls + 1);
        if (count != NULL)
            Py_XSETREF(FIELD(rec, R_CALLS), count);
        int failed = count == NULL || PyList_Append(buffer, n) < 0 || PyList_Append(buffer, st->zero) < 0;
        Py_DECREF(buffer);
        Py_DECREF(n);
        return failed ? -1 : 0;
    }
    Py_XDECREF(buffer);
    if (!may_decline()) { /* (what it met, the definition meets again) */
        Py_DECREF(n);
        return -1;
    }
    PyObject *record_args[5] = {monitor, direction, peer, n, st->zero};
    r = PyObject_VectorcallMethod(st->s_record_bulk, record_args, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(n);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

PyDoc_STRVAR(place_ahead_doc,
"place_ahead(engine, conn, request_id, bulk_id, offset, size, /) -> memoryview | None\n\n"
"svcframe.bulk_serving.BulkServing._place_ahead's compiled twin (a connection's decoder's place_ahead, as\n"
"functools.partial(place_ahead, engine, conn)): the range of the engine's exposed buffer that a push ahead\n"
"writes, counted in the bulk statistics; None where the definition gives None, and for anything it does not\n"
"expect (its frames are then dispatched: _on_push_ahead decides).");

static PyObject *
place_ahead(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = (module_state *)PyModule_GetState(module);
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "place_ahead takes 6 arguments");
        return NULL;
    }
    if (st->zero == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "svcframe._speedups.configure_calls() was not called");
        return NULL;
    }
    PyObject *engine = args[0], *conn = args[1], *bulk_id = args[3];
    long long offset = small_count(args[4]), size = small_count(args[5]);
    if (offset < 0 || size < 0 || offset > LLONG_MAX / 2 || size > LLONG_MAX / 2 || !PyBytes_CheckExact(bulk_id) ||
        !PyObject_TypeCheck(engine, (PyTypeObject *)st->engine_state) ||
        !PyObject_TypeCheck(conn, (PyTypeObject *)st->connection_state))
        Py_RETURN_NONE;
    /* a request id of a push under way (conn.protocol.pushes): the definition's */
    PyObject *protocol = PyObject_GetAttr(conn, st->cn[C_PROTOCOL]);
    PyObject *pushes = protocol == NULL ? NULL : PyObject_GetAttr(protocol, st->s_pushes);
    Py_XDECREF(protocol);
    int under_way = pushes == NULL || !PyDict_CheckExact(pushes) ? -1 : PyDict_Contains(pushes, args[2]);
    Py_XDECREF(pushes);
    if (under_way != 0)
        return under_way < 0 && !may_decline() ? NULL : Py_NewRef(Py_None);
    /* _exposed_range(conn, bulk_id, offset, size, WRITE) */
    PyObject *exposed = FIELD(engine, E_EXPOSED), *conns = FIELD(engine, E_CONNS);
    PyObject *entry = exposed != NULL && PyDict_CheckExact(exposed) ? PyDict_GetItemWithError(exposed, bulk_id) : NULL;
    if (entry == NULL || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3)
        return !may_decline() ? NULL : Py_NewRef(Py_None);
    PyObject *view = PyTuple_GET_ITEM(entry, 0), *mode = PyTuple_GET_ITEM(entry, 1), *bound = PyTuple_GET_ITEM(entry, 2);
    if (bound != Py_None) { /* a handle bound to a peer: only over the connection we dialled to it */
        PyObject *dialled = conns != NULL && PyDict_CheckExact(conns) && PyUnicode_CheckExact(bound)
                                ? PyDict_GetItemWithError(conns, bound)
                                : NULL;
        if (dialled != conn)
            return !may_decline() ? NULL : Py_NewRef(Py_None);
    }
    Py_ssize_t w = PyUnicode_CheckExact(mode) ? PyUnicode_FindChar(mode, 'w', 0, PyUnicode_GET_LENGTH(mode), 1) : -1;
    Py_ssize_t length = w >= 0 && PyMemoryView_Check(view) ? PyObject_Length(view) : -1;
    if (length < 0 || offset + size > length)
        return !may_decline() ? NULL : Py_NewRef(Py_None);
    PyObject *monitor = FIELD(engine, E_MONITOR), *peer = FIELD(conn, CN_PEER_LABEL);
    if (monitor == NULL || peer == NULL)
        Py_RETURN_NONE;
    PyObject *range = PySequence_GetSlice(view, (Py_ssize_t)offset, (Py_ssize_t)(offset + size));
    if (range != NULL && record_bulk_now(st, monitor, st->s_served_push, peer, (Py_ssize_t)size) < 0)
        Py_CLEAR(range);
    return range;
}

/* ---- push_ahead_now: the common case of svcframe.bulk.BulkOps.push ------------------------------------------ */

/* A push ahead's BULK_PUSH body in the form svcframe.wire.push_ahead_frames packs it for a 16-byte bulk id:
 * msgpack [bulk id (bin 8), offset, size, call id], each unsigned int a uint 64. */
#define AHEAD_BODY_BYTES 46
#define AHEAD_ID_BYTES 16
#define NO_PARENT_PROVIDER 0xFFFF /* wire.NO_PARENT_PROVIDER, at a header's offset 30 */

static inline void
wr_be64(unsigned char *p, unsigned long long v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)(v & 0xff);
}

/* The bytes of svcframe.wire.push_ahead_frames(rid, bulk_id, offset, size, call_id) for a 16-byte ``id``: the
 * BULK_PUSH, and the header of its data frame when ``size`` > 0. */
static PyObject *
ahead_frames(unsigned long long rid, const char *id, unsigned long long offset, Py_ssize_t size,
             unsigned long long call_id)
{
    Py_ssize_t length = HEADER_SIZE + AHEAD_BODY_BYTES + (size > 0 ? HEADER_SIZE : 0);
    PyObject *frames = PyBytes_FromStringAndSize(NULL, length);
    if (frames == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(frames), *b = p + HEADER_SIZE;
    write_header(p, K_BULK_PUSH, F_NO_REPLY, AHEAD_BODY_BYTES, rid);
    wr16(p + 30, NO_PARENT_PROVIDER);
    b[0] = 0x94, b[1] = 0xc4, b[2] = AHEAD_ID_BYTES;
    memcpy(b + 3, id, AHEAD_ID_BYTES);
    unsigned long long values[3] = {offset, (unsigned long long)size, call_id};
    for (int i = 0; i < 3; i++) {
        b[3 + AHEAD_ID_BYTES + 9 * i] = 0xcf;
        wr_be64(b + 4 + AHEAD_ID_BYTES + 9 * i, values[i]);
    }
    if (size > 0) {
        write_header(b + AHEAD_BODY_BYTES, K_BULK_DATA_PUSH, 0, size, rid);
        wr16(b + AHEAD_BODY_BYTES + 30, NO_PARENT_PROVIDER);
    }
    return frames;
}

PyDoc_STRVAR(push_ahead_frames_doc,
"push_ahead_frames(request_id, bulk_id, offset, size, call_id, /) -> bytes\n\n"
"svcframe.wire.push_ahead_frames for a 16-byte bulk id (push_ahead_now's frames; tests compare the two).\n"
"Raises ValueError for another bulk id, OverflowError for a field that does not fit.");

static PyObject *
push_ahead_frames_c(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "push_ahead_frames takes 5 arguments");
        return NULL;
    }
    if (!PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[1]) != AHEAD_ID_BYTES) {
        PyErr_SetString(PyExc_ValueError, "push_ahead_frames: the bulk id must be 16 bytes");
        return NULL;
    }
    unsigned long long v[4];
    PyObject *fields[4] = {args[0], args[2], args[3], args[4]};
    for (int i = 0; i < 4; i++) {
        v[i] = PyLong_AsUnsignedLongLong(fields[i]);
        if (v[i] == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    if (v[2] > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "push_ahead_frames: size over 32 bits");
        return NULL;
    }
    return ahead_frames(v[0], PyBytes_AS_STRING(args[1]), v[1], (Py_ssize_t)v[2], v[3]);
}

PyDoc_STRVAR(push_ahead_now_doc,
"push_ahead_now(engine, handle, offset, src, /) -> bool\n\n"
"The common case of svcframe.bulk.BulkOps.push (its definition, whose _push_ahead_now it does in one call):\n"
"a handler's push of ``src`` (bytes) into its caller's buffer, ahead of the answer, in one write. True once\n"
"written (the frames join the batch of replies, or are written), counted in the bulk statistics; False,\n"
"having done nothing, for every other case, which the definition then decides: a range or mode it refuses,\n"
"a handle of this engine's or not its caller's, one cross-memory attach may take (of CMA_MIN_BYTES or more,\n"
"on a connection with cross-memory attach), over one frame, a paused\n"
"or closed connection, a caller that does not take pushes ahead, a request that takes no answer, no\n"
"handler running here, a type it does not expect. configure_push() first.");

static PyObject *
push_ahead_now(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = (module_state *)PyModule_GetState(module);
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "push_ahead_now takes 4 arguments");
        return NULL;
    }
    if (st->handle_type == NULL || st->request_type == NULL || st->task_request == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "svcframe._speedups: configure_push, _serve and _calls first");
        return NULL;
    }
    PyObject *engine = args[0], *handle = args[1], *src = args[3];
    if (!PyBytes_CheckExact(src) || Py_TYPE(handle) != (PyTypeObject *)st->handle_type ||
        PyTuple_GET_SIZE(handle) != 5 || !PyObject_TypeCheck(engine, (PyTypeObject *)st->engine_state))
        Py_RETURN_FALSE;
    /* the range and mode (bulk._check_range), in the handle's own terms */
    Py_ssize_t size = PyBytes_GET_SIZE(src);
    long long offset = small_count(args[2]), limit = small_count(PyTuple_GET_ITEM(handle, 3));
    PyObject *engine_id = PyTuple_GET_ITEM(handle, 1), *bulk_id = PyTuple_GET_ITEM(handle, 2);
    PyObject *mode = PyTuple_GET_ITEM(handle, 4), *own = FIELD(engine, E_ENGINE_ID);
    if (offset < 0 || limit < 0 || offset > limit || size > limit - offset || !PyUnicode_CheckExact(mode) ||
        !PyUnicode_CheckExact(engine_id) || !PyBytes_CheckExact(bulk_id) ||
        PyBytes_GET_SIZE(bulk_id) != AHEAD_ID_BYTES || own == NULL || !PyUnicode_CheckExact(own))
        Py_RETURN_FALSE;
    Py_ssize_t w = PyUnicode_FindChar(mode, 'w', 0, PyUnicode_GET_LENGTH(mode), 1); /* "w" in mode */
    if (w < 0)
        return w == -1 ? Py_NewRef(Py_False) : NULL;
    if (PyUnicode_Compare(engine_id, own) == 0) /* (str, exact: no error) a buffer of this engine's */
        Py_RETURN_FALSE;
    /* the request whose handler runs here (svcframe.handlers.current_request.get()) */
    PyObject *req = PyObject_GetAttr(st->sync, st->sn[N_REQUEST]);
    if (req == Py_None) {
        Py_DECREF(req);
        if (PyContextVar_Get(st->task_request, Py_None, &req) < 0)
            return NULL;
    }
    if (req == NULL)
        return NULL;
    int ahead = Py_TYPE(req) == (PyTypeObject *)st->request_type && PyTuple_GET_SIZE(req) == 5;
    PyObject *conn = ahead ? PyTuple_GET_ITEM(req, 1) : NULL, *frame = ahead ? PyTuple_GET_ITEM(req, 3) : NULL;
    unsigned long long call_id = 0;
    ahead = ahead && PyObject_TypeCheck(conn, (PyTypeObject *)st->connection_state) && PyTuple_Check(frame) &&
            PyTuple_GET_SIZE(frame) > 4 && PyLong_CheckExact(PyTuple_GET_ITEM(frame, 1)) &&
            as_field(PyTuple_GET_ITEM(frame, 4), UINT64_MAX, &call_id);
    /* _push_ahead_now's conditions: the caller's buffer, a caller that takes pushes ahead, a request it answers,
     * and one frame that may be written now */
    PyObject *peer = ahead ? FIELD(conn, CN_PEER_ENGINE_ID) : NULL;
    ahead = ahead && peer != NULL && PyUnicode_CheckExact(peer) && PyUnicode_Compare(peer, engine_id) == 0 &&
            FIELD(conn, CN_PEER_PUSH_AHEAD) == Py_True && !(PyLong_AsLong(PyTuple_GET_ITEM(frame, 1)) & F_NO_REPLY) &&
            FIELD(conn, CN_PAUSED) == Py_False && FIELD(conn, CN_CLOSED) == Py_False &&
            FIELD(conn, CN_NEXT_REQUEST_ID) != NULL && FIELD(conn, CN_PEER_LABEL) != NULL &&
            size <= whole_frame_bytes(conn);
    if (ahead && size >= st->cma_min) { /* cross-memory attach first, when the caller's connection may take it */
        int cma = attr_true(engine, st->s_bulk_cma);
        cma = cma > 0 ? attr_true(conn, st->cn[C_PEER_CMA]) : cma;
        ahead = cma == 0;
    }
    if (!ahead || PyErr_Occurred()) { /* (the flags: an int, checked; an error would be the definition's) */
        PyErr_Clear();
        Py_DECREF(req);
        Py_RETURN_FALSE;
    }
    Py_INCREF(conn);
    Py_DECREF(req); /* (conn is all we need of it) */
    PyObject *rid_o = PyObject_CallNoArgs(FIELD(conn, CN_NEXT_REQUEST_ID)), *frames = NULL;
    unsigned long long rid;
    int failed = rid_o == NULL;
    if (!failed && !as_field(rid_o, UINT64_MAX, &rid)) {
        PyErr_SetString(PyExc_OverflowError, "push_ahead_now: a request id over 64 bits");
        failed = 1;
    }
    Py_XDECREF(rid_o);
    if (!failed) {
        frames = ahead_frames(rid, PyBytes_AS_STRING(bulk_id), (unsigned long long)offset, size, call_id);
        failed = frames == NULL || (size > 0 ? conn_send_two(st, conn, frames, src) : conn_send(st, conn, frames)) < 0;
        Py_XDECREF(frames);
    }
    PyObject *monitor = FIELD(engine, E_MONITOR); /* self.monitor.record_bulk("push", conn.peer_label, size, 0) */
    if (!failed && monitor != NULL)
        failed = record_bulk_now(st, monitor, st->s_push, FIELD(conn, CN_PEER_LABEL), size) < 0;
    Py_DECREF(conn);
    if (failed)
        return NULL;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(configure_push_doc,
"configure_push(handle_type) -> None\n\n"
"What push_ahead_now pushes with: svcframe.bulk.BulkHandle (a tuple subclass of 5 items). It also uses what\n"
"configure_serve (Request, the sync handlers' thread-local) and configure_calls (the task's request,\n"
"bulk.CMA_MIN_BYTES) gave.");

static PyObject *
configure_push(PyObject *module, PyObject *handle_type)
{
    if (!PyType_Check(handle_type) || !PyType_IsSubtype((PyTypeObject *)handle_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure_push: handle_type must be a tuple subclass");
        return NULL;
    }
    module_state *st = (module_state *)PyModule_GetState(module);
    Py_INCREF(handle_type);
    Py_XSETREF(st->handle_type, handle_type);
    Py_RETURN_NONE;
}

/* ---- begin_call and Call: the common case of svcframe.calls.Calls._call_once ------------------------------ */

/* A call under way (begin_call): what _call_once's ``await`` and ``finally:`` need. */
typedef struct {
    PyObject_HEAD
    PyObject *future, *conn, *pending, *request_id, *rec, *progress, *name, *provider_id, *address, *timeout;
    PyObject *pulls, *pull, *into; /* an into= call's: its connection's pulls, its IncomingPull, its view */
    long long t0, t1;      /* perf_counter_ns() before and after its request was sent */
    Py_ssize_t body_bytes; /* its argument's size */
    char timed;            /* a sampled call: its values go to its record's buffer */
    char finished; /* the clean-up ran (it runs once) */
} Call;

/* A Call's objects, listed once (its traverse and clear run over it). */
#define CALL_OBJECTS(X) \
    X(future) X(conn) X(pending) X(request_id) X(rec) X(progress) X(name) X(provider_id) X(address) X(timeout) \
    X(pulls) X(pull) X(into)

static int
call_traverse(Call *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
#define VISIT(field) Py_VISIT(self->field);
    CALL_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int
call_clear(Call *self)
{
    self->finished = 1; /* (its tables are gone: nothing to clean up) */
#define CLEAR(field) Py_CLEAR(self->field);
    CALL_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void
call_dealloc(Call *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    call_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* ``progress.inflight += delta`` and ``if not progress.blocking: progress.activity()``; -1 on error. */
static int
progress_step(module_state *st, PyObject *progress, long delta)
{
    PyObject *n = FIELD(progress, P_INFLIGHT), *d = PyLong_FromLong(delta);
    PyObject *sum = n == NULL || d == NULL ? NULL : PyNumber_Add(n, d);
    Py_XDECREF(d);
    if (sum == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError, "inflight");
        return -1;
    }
    Py_XSETREF(FIELD(progress, P_INFLIGHT), sum);
    PyObject *blocking = FIELD(progress, P_BLOCKING);
    int is_blocking = blocking == Py_True ? 1 : blocking == Py_False ? 0 : blocking == NULL ? -1 : PyObject_IsTrue(blocking);
    if (blocking == NULL)
        PyErr_SetString(PyExc_AttributeError, "blocking");
    if (is_blocking != 0)
        return is_blocking < 0 ? -1 : 0;
    PyObject *r = PyObject_CallMethodNoArgs(progress, st->cn[C_ACTIVITY]);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* _call_once's ``finally:``: the call leaves its connection's table and the progress loop's count; when it
 * ``failed``, its record counts an error; a timed call's record takes its four values (its round trip, the
 * sending of its request, its argument's and its answer's sizes: ``payload_bytes``, an int), and folds them
 * past FOLD_AT. Runs once; -1 with an exception set on error. */
static int
call_finish(module_state *st, Call *self, int failed, PyObject *payload_bytes)
{
    if (self->finished)
        return 0;
    self->finished = 1;
    PyObject *waiter = PyDict_GetItemWithError(self->pending, self->request_id); /* pending.pop(id, None) */
    if (waiter == NULL ? PyErr_Occurred() != NULL : PyDict_DelItem(self->pending, self->request_id) < 0)
        return -1;
    if (self->pulls != NULL) { /* conn.protocol.pulls.pop(request_id, None) */
        PyObject *pull = PyDict_GetItemWithError(self->pulls, self->request_id);
        if (pull == NULL ? PyErr_Occurred() != NULL : PyDict_DelItem(self->pulls, self->request_id) < 0)
            return -1;
    }
    if (progress_step(st, self->progress, -1) < 0)
        return -1;
    if (failed && self->rec != NULL) { /* rec.errors += 1 */
        PyObject *one = PyLong_FromLong(1), *errors = FIELD(self->rec, R_ERRORS);
        PyObject *sum = one == NULL || errors == NULL ? NULL : PyNumber_Add(errors, one);
        Py_XDECREF(one);
        if (sum == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_AttributeError, "errors");
            return -1;
        }
        Py_XSETREF(FIELD(self->rec, R_ERRORS), sum);
    }
    if (self->timed && self->rec != NULL) {
        /* buf = rec.buffer; buf.extend((perf_ns() - t0, t1 - t0, len(body), payload_bytes)); and
         * if len(buf) > FOLD_AT: rec.fold() (read now: a fold meanwhile gave the record a new buffer) */
        PyObject *values = Py_BuildValue("(LLnO)", monotonic_ns() - self->t0, self->t1 - self->t0, self->body_bytes,
                                         payload_bytes);
        PyObject *buf = values == NULL ? NULL : PyObject_GetAttr(self->rec, st->s_buffer), *r = NULL;
        if (buf != NULL && PyList_CheckExact(buf)) {
            Py_ssize_t end = PyList_GET_SIZE(buf);
            r = PyList_SetSlice(buf, end, end, values) < 0 ? NULL : Py_NewRef(Py_None);
        } else if (buf != NULL) {
            r = PyObject_CallMethod(buf, "extend", "O", values);
        }
        Py_XDECREF(values);
        Py_ssize_t size = r == NULL ? -1 : PyObject_Length(buf);
        Py_XDECREF(r);
        Py_XDECREF(buf);
        if (size < 0)
            return -1;
        if (size > st->fold_at) {
            r = PyObject_CallMethodNoArgs(self->rec, st->s_fold);
            Py_XDECREF(r);
            return r == NULL ? -1 : 0;
        }
    }
    return 0;
}

static module_state *
call_state(PyObject *self)
{
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(self), &speedups_module);
    return module == NULL ? NULL : (module_state *)PyModule_GetState(module);
}

PyDoc_STRVAR(call_answered_doc,
"answered(answer) -> object\n\n"
"The call's result from what its future was given, ``(status, payload, payload_bytes)``, after its clean-up:\n"
"the payload when OK, else raises svcframe.errors.error_from_status(...) (as Calls._call_once).");

static PyObject *
call_answered(Call *self, PyObject *answer)
{
    module_state *st = call_state((PyObject *)self);
    if (st == NULL)
        return NULL;
    long status = -1;
    if (PyTuple_CheckExact(answer) && PyTuple_GET_SIZE(answer) == 3 && PyLong_CheckExact(PyTuple_GET_ITEM(answer, 0)))
        status = PyLong_AsLong(PyTuple_GET_ITEM(answer, 0));
    if (status == -1) { /* (not an answer Engine.on_frames or wire.answer_call gives) */
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a call's answer must be (status, payload, payload_bytes)");
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (call_finish(st, self, 1, st->zero) < 0) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            return NULL;
        }
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (call_finish(st, self, status != 0 && status != st->lent_status, PyTuple_GET_ITEM(answer, 2)) < 0)
        return NULL;
    PyObject *payload = PyTuple_GET_ITEM(answer, 1);
    if (status == 0 && self->pull != NULL) { /* an into= result larger than the buffer */
        int over = attr_true(self->pull, st->cn[C_OVERFLOWED]);
        if (over < 0)
            return NULL;
        if (over) {
            Py_ssize_t size = PyObject_Length(self->into);
            PyObject *n = size < 0 ? NULL : PyLong_FromSsize_t(size);
            PyObject *error = n == NULL ? NULL : PyObject_CallFunctionObjArgs(st->too_large, self->name, self->provider_id,
                                                                           self->address, payload, n, NULL);
            Py_XDECREF(n);
            if (error != NULL) {
                PyErr_SetObject((PyObject *)Py_TYPE(error), error);
                Py_DECREF(error);
            }
            return NULL;
        }
    }
    if (status == 0) {
        Py_INCREF(payload);
        return payload;
    }
    PyObject *error_args[5] = {PyTuple_GET_ITEM(answer, 0), payload, self->name, self->provider_id, self->address};
    PyObject *error = PyObject_Vectorcall(st->error_from_status, error_args, 5, NULL);
    if (error != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        Py_DECREF(error);
    }
    return NULL;
}

PyDoc_STRVAR(call_failed_doc,
"failed(exc) -> BaseException\n\n"
"The call's await raised ``exc``: as Calls._call_once's ``except`` clauses (the server is told of a call\n"
"abandoned by its deadline or its caller's cancellation) and ``finally:``; returns what to raise: ``exc``\n"
"itself (raise it again), or DeadlineExceeded for DeadlineExpired (raise it from None).");

static PyObject *
call_failed(Call *self, PyObject *exc)
{
    module_state *st = call_state((PyObject *)self);
    if (st == NULL)
        return NULL;
    if (self->conn == NULL) /* (cleared by the collector: nothing left to tell or clean up) */
        return Py_NewRef(exc);
    PyObject *error = exc, *r = Py_None;
    Py_INCREF(error);
    Py_INCREF(r);
    int expired = PyObject_IsInstance(exc, st->deadline_expired);
    int cancelled = expired ? 0 : PyObject_IsInstance(exc, st->cancelled_error);
    if (expired < 0 || cancelled < 0) {
        Py_CLEAR(error);
    } else if (expired || cancelled) {
        Py_SETREF(r, PyObject_CallFunctionObjArgs(st->cancel_remote, self->conn, self->request_id, NULL));
        if (r == NULL)
            Py_CLEAR(error);
        else if (expired)
            Py_SETREF(error, PyObject_CallFunctionObjArgs(st->no_response, self->name, self->provider_id,
                                                          self->address, self->timeout, NULL));
    }
    Py_XDECREF(r);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* finally: (its own error wins over the clauses') */
    if (call_finish(st, self, 1, st->zero) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        Py_XDECREF(error);
        return NULL;
    }
    PyErr_Restore(type, value, tb);
    return error;
}

static PyMemberDef call_members[] = {
    {"future", T_OBJECT, offsetof(Call, future), READONLY, "The future the call's answer is given to."},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef call_methods[] = {
    {"answered", (PyCFunction)call_answered, METH_O, call_answered_doc},
    {"failed", (PyCFunction)call_failed, METH_O, call_failed_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot call_slots[] = {
    {Py_tp_dealloc, call_dealloc},
    {Py_tp_traverse, call_traverse},
    {Py_tp_clear, call_clear},
    {Py_tp_members, call_members},
    {Py_tp_methods, call_methods},
    {Py_tp_doc, "A call begun by begin_call (svcframe.calls.Calls._call_compiled awaits its future)."},
    {0, NULL},
};

static PyType_Spec call_spec = {
    "svcframe._speedups.Call",
    sizeof(Call),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_HAVE_GC,
    call_slots,
};

/* wire.pack_body(arg) without its Python frame (12 bytecodes a call, measured): the packer's own pack, unless
 * wire.DEBUG_WIRE asks for pack_body's checks. An error is left to begin_call's caller, which declines: _call_once
 * then calls pack_body, which resets the packer and raises its LocalProtocolError. */
static PyObject *
pack_arg(module_state *st, PyObject *arg)
{
    if (st->wire == NULL || st->packer_pack == NULL)
        return PyObject_CallOneArg(st->pack_body, arg);
    PyObject *debug = PyObject_GetAttr(st->wire, st->cn[C_DEBUG_WIRE]);
    if (debug == NULL)
        return NULL;
    int plain = debug == Py_False;
    Py_DECREF(debug);
    return PyObject_CallOneArg(plain ? st->packer_pack : st->pack_body, arg);
}

PyDoc_STRVAR(begin_call_doc,
"begin_call(engine, address, name, arg, provider_id, timeout_seconds, flags, into) -> Call | None\n\n"
"What svcframe.calls.Calls._call_once (its Python twin) does before its ``await``, without a Python frame, in\n"
"its common case: an open connection, a known RPC, untraced (monitoring off, or counted, and timed when\n"
"sampled: its values go to the record's buffer as _call_once's do), outside any handler, an into= buffer\n"
"only to a peer without cross-memory attach; the request is sent and the Call returned. None for any other\n"
"call, before anything is done (_call_once then makes it).");

static PyObject *
begin_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = (module_state *)PyModule_GetState(module);
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "begin_call takes 8 arguments");
        return NULL;
    }
    if (st->task_request == NULL || st->sync == NULL || !configured(st)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "svcframe._speedups.configure_calls() was not called");
        return NULL;
    }
    PyObject *engine = args[0], *address = args[1], *name = args[2], *arg = args[3], *provider_id = args[4];
    PyObject *now = NULL, *body = NULL, *parent = NULL, *key = NULL, *o = NULL, *request_id = NULL;
    PyObject *future = NULL, *frame = NULL, *when = NULL, *method = NULL;
    PyObject *held[8] = {NULL}; /* what is read borrowed, held once Python code may run (loop.time() on) */
    Call *call = NULL;
    unsigned long long flags, pid, rpc, cp, limit;
    long long calls = 0;
    PyObject *into = args[7], *view = NULL, *pulls = NULL, *pull = NULL;
    char timed = 0;
    if (!as_field(args[6], 0xFFFF, &flags) || !as_field(provider_id, 0xFFFF, &pid) ||
        !PyObject_TypeCheck(engine, (PyTypeObject *)st->engine_state))
        goto decline;
    PyObject *loop = FIELD(engine, E_LOOP), *conns = FIELD(engine, E_CONNS), *ids = FIELD(engine, E_RPC_IDS);
    PyObject *roots = FIELD(engine, E_ROOT_CALLPATHS), *monitor = FIELD(engine, E_MONITOR);
    PyObject *progress = FIELD(engine, E_PROGRESS), *deadlines = FIELD(engine, E_DEADLINES);
    PyObject *timeout = args[5] != Py_None ? args[5] : FIELD(engine, E_DEFAULT_TIMEOUT);
    if (loop == NULL || loop == Py_None || conns == NULL || !PyDict_CheckExact(conns) || ids == NULL ||
        !PyDict_CheckExact(ids) || roots == NULL || !PyDict_CheckExact(roots) || FIELD(engine, E_TRACER) != Py_None ||
        progress == NULL || !PyObject_TypeCheck(progress, (PyTypeObject *)st->progress_state) || deadlines == NULL ||
        !PyObject_TypeCheck(deadlines, (PyTypeObject *)st->deadlines_type) || timeout == NULL ||
        !(PyFloat_CheckExact(timeout) || PyLong_CheckExact(timeout)))
        goto decline;
    double t = PyFloat_AsDouble(timeout);
    if ((t == -1.0 && PyErr_Occurred()) || !(t > -1e9 && t < 1e9)) /* (so int(t * 1e6) is exact, as in Python; NaN and errors are left to it) */
        goto decline;
    PyObject *conn = PyDict_GetItemWithError(conns, address); /* (borrowed: held by the Call, or unused) */
    PyObject *pending = field_of(conn, st->connection_state, CN_PENDING);
    if (pending == NULL || !PyDict_CheckExact(pending) || FIELD(conn, CN_CLOSED) != Py_False ||
        FIELD(conn, CN_PEER_MAX_BODY) == NULL || !as_field(FIELD(conn, CN_PEER_MAX_BODY), UINT64_MAX, &limit) ||
        FIELD(conn, CN_NEXT_REQUEST_ID) == NULL)
        goto decline;
    PyObject *rid = PyDict_GetItemWithError(ids, name);
    if (rid == NULL || !as_field(rid, 0xFFFFFFFF, &rpc) || rpc == 0)
        goto decline;
    key = PyTuple_Pack(2, rid, provider_id);
    PyObject *callpath = key == NULL ? NULL : PyDict_GetItemWithError(roots, key);
    if (callpath == NULL || !as_field(callpath, UINT64_MAX, &cp) || cp == 0)
        goto decline;
    Py_INCREF(callpath); /* (held while the dict may change: the request is sent with it) */
    Py_SETREF(key, callpath);
    parent = PyObject_GetAttr(st->sync, st->cn[C_REQUEST]); /* current_request.get(), inlined */
    if (parent == NULL || PyObject_IsTrue(parent) != 0)
        goto decline;
    Py_CLEAR(parent);
    if (PyContextVar_Get(st->task_request, Py_None, &parent) < 0 || parent != Py_None)
        goto decline;
    PyObject *enabled = field_of(monitor, st->monitor_state, M_ENABLED), *rec = NULL;
    if (enabled != Py_True && enabled != Py_False)
        goto decline;
    if (enabled == Py_True) { /* counted, and perhaps timed: the record exists (made by the callpath's first call) */
        PyObject *origin = FIELD(monitor, M_ORIGIN);
        o = PyTuple_Pack(5, st->zero, st->no_parent, rid, provider_id, address);
        rec = o == NULL || origin == NULL || !PyDict_CheckExact(origin) ? NULL : PyDict_GetItemWithError(origin, o);
        Py_CLEAR(o);
        long long count = small_count(field_of(rec, st->record_state, R_CALLS));
        long long every = small_count(FIELD(monitor, M_SAMPLE_EVERY));
        if (count < 0 || every <= 0 || st->fold_at <= 0)
            goto decline;
        calls = count + 1;
        timed = calls <= st->always_timed || !(calls % every); /* (its values: Call.answered and failed) */
    }
    PyObject *borrowed[8] = {loop, conn, pending, rid, rec, progress, deadlines, timeout};
    for (int i = 0; i < 8; i++)
        held[i] = Py_XNewRef(borrowed[i]);
    now = PyObject_CallMethodNoArgs(loop, st->cn[C_TIME]);
    if (now == NULL || !PyFloat_CheckExact(now))
        goto decline;
    double start = PyFloat_AS_DOUBLE(now);
    body = arg == Py_None ? Py_NewRef(st->nil_body) : pack_arg(st, arg);
    if (body == NULL || !PyBytes_CheckExact(body) || (unsigned long long)PyBytes_GET_SIZE(body) > limit)
        goto decline; /* (an argument that cannot be sent: _call_once raises its error) */
    if (into != Py_None) { /* into = as_byte_view(into, writable=True); flags |= F_INTO */
        PyObject *view_args[2] = {into, Py_True};
        view = PyObject_Vectorcall(st->as_byte_view, view_args, 1, st->writable_kw);
        if (view == NULL)
            goto decline; /* (not a writable buffer: _call_once raises its error) */
        Py_ssize_t size = PyObject_Length(view);
        if (size < 0 || (size >= st->cma_min && attr_true(conn, st->cn[C_PEER_CMA]) != 0))
            goto decline; /* (the result may be copied from the server's memory: _call_once decides) */
        flags |= (unsigned long long)st->into_flag;
    }
    long long usec = (long long)(t * 1e6); /* deadlines.wire_deadline */
    unsigned long long deadline_usec = usec > 0xFFFFFFFFLL ? 0 : usec > 0 ? (unsigned long long)usec : 1;
    /* the call is made from here on (an error now propagates, as _call_once's own would) */
    call = PyObject_GC_New(Call, (PyTypeObject *)st->call_type); /* (its references: held by what follows) */
    if (call == NULL)
        goto error;
    call->future = call->request_id = call->pulls = call->pull = call->into = NULL;
    call->conn = Py_NewRef(conn);
    call->pending = Py_NewRef(pending);
    call->rec = Py_XNewRef(rec);
    call->progress = Py_NewRef(progress);
    call->name = Py_NewRef(name);
    call->provider_id = Py_NewRef(provider_id);
    call->address = Py_NewRef(address);
    call->timeout = Py_NewRef(timeout);
    call->t0 = call->t1 = timed ? monotonic_ns() : 0; /* (t0 = perf_ns() if timed) */
    call->body_bytes = PyBytes_GET_SIZE(body);
    call->timed = 0;
    call->finished = 1; /* (not begun: nothing to clean up if this fails) */
    PyObject_GC_Track(call);
    if (rec != NULL) {
        o = PyLong_FromLongLong(calls);
        if (o == NULL)
            goto error;
        Py_XSETREF(FIELD(rec, R_CALLS), o);
        o = NULL;
    }
    method = Py_XNewRef(FIELD(conn, CN_NEXT_REQUEST_ID));
    request_id = method == NULL ? NULL : PyObject_CallNoArgs(method);
    if (method == NULL)
        PyErr_SetString(PyExc_AttributeError, "next_request_id");
    future = request_id == NULL ? NULL : PyObject_CallMethodNoArgs(loop, st->cn[C_CREATE_FUTURE]);
    if (future == NULL || PyDict_SetItem(pending, request_id, future) < 0)
        goto error;
    if (view != NULL) { /* conn.protocol.pulls[request_id] = IncomingPull(into, overflow_ok=True) */
        PyObject *protocol = PyObject_GetAttr(conn, st->cn[C_PROTOCOL]);
        pulls = protocol == NULL ? NULL : PyObject_GetAttr(protocol, st->cn[C_PULLS]);
        Py_XDECREF(protocol);
        PyObject *pull_args[2] = {view, Py_True};
        pull = pulls == NULL ? NULL : PyObject_Vectorcall(st->incoming_pull, pull_args, 1, st->overflow_ok_kw);
        if (pull == NULL || !PyDict_CheckExact(pulls) || PyDict_SetItem(pulls, request_id, pull) < 0) {
            if (pull != NULL && !PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "Protocol.pulls must be a dict");
            goto error;
        }
    }
    o = PyLong_FromUnsignedLongLong(deadline_usec);
    if (o == NULL)
        goto error;
    PyObject *flags_o = PyLong_FromUnsignedLongLong(flags);
    if (flags_o == NULL)
        goto error;
    PyObject *request_args[12] = {flags_o, provider_id, rid, request_id, o, st->no_parent, st->zero, key,
                                  st->zero_trace, st->zero, st->zero, body};
    frame = request_frame(module, request_args, 12);
    Py_CLEAR(o);
    Py_DECREF(flags_o);
    if (frame == NULL)
        goto error;
    if (PyDict_GET_SIZE(pending) <= 1 || FIELD(conn, CN_BATCH) != Py_None || FIELD(conn, CN_CLOSED) != Py_False) {
        if (conn_send(st, conn, frame) < 0) /* conn.send_request(frame, False), inlined */
            goto error;
    } else { /* corked (other calls of ours in flight here): held for the loop's next turn, as
              * conn.send_request(frame, True) does (its 21 bytecodes a call at depth 32, measured) */
        PyObject *cork = FIELD(conn, CN_CORK);
        if (cork == NULL || cork == Py_None) { /* the turn's first: a new list, and _uncork on the next turn */
            PyObject *uncork = PyObject_GetAttr(conn, st->cn[C_UNCORK]);
            o = uncork == NULL ? NULL : PyObject_CallMethodOneArg(loop, st->cn[C_CALL_SOON], uncork);
            Py_XDECREF(uncork);
            if (o == NULL)
                goto error;
            Py_CLEAR(o);
            o = PyList_New(0);
            if (o == NULL)
                goto error;
            Py_XSETREF(FIELD(conn, CN_CORK), o); /* (the field owns it; o is borrowed from here) */
            cork = o;
            o = NULL;
        } else if (!PyList_CheckExact(cork)) {
            PyErr_SetString(PyExc_TypeError, "Connection._cork must be a list or None");
            goto error;
        }
        if (PyList_Append(cork, frame) < 0)
            goto error;
    }
    if (timed)
        call->t1 = monotonic_ns(); /* (t1: the request sent) */
    if (progress_step(st, progress, 1) < 0)
        goto error;
    when = PyFloat_FromDouble(start + t);
    PyObject *add_args[3] = {when, pending, request_id};
    o = when == NULL ? NULL : dl_add((DlCore *)deadlines, add_args, 3);
    if (o == NULL)
        goto error;
    Py_CLEAR(o);
    call->future = Py_NewRef(future);
    call->request_id = Py_NewRef(request_id);
    call->pulls = Py_XNewRef(pulls);
    call->pull = Py_XNewRef(pull);
    call->into = Py_XNewRef(view);
    call->timed = timed;
    call->finished = 0;
    goto done;
decline:
    if (!may_decline())
        goto error;
    call = (Call *)Py_NewRef(Py_None);
    goto done;
error:
    Py_CLEAR(call);
done:
    Py_XDECREF(now);
    Py_XDECREF(body);
    Py_XDECREF(parent);
    Py_XDECREF(key);
    Py_XDECREF(o);
    Py_XDECREF(request_id);
    Py_XDECREF(future);
    Py_XDECREF(frame);
    Py_XDECREF(when);
    Py_XDECREF(method);
    Py_XDECREF(view);
    Py_XDECREF(pulls);
    Py_XDECREF(pull);
    for (int i = 0; i < 8; i++)
        Py_XDECREF(held[i]);
    return (PyObject *)call;
}

PyDoc_STRVAR(configure_calls_doc,
"configure_calls(task_request, pack_body, nil_body, error_from_status, cancel_remote, no_response,\n"
"                deadline_expired, cancelled_error, no_parent_provider, lent_status, as_byte_view,\n"
"                incoming_pull, too_large, into_flag, cma_min_bytes, wire, fold_at) -> None\n\n"
"What begin_call and Call use (svcframe.calls): the async handlers' request contextvar, wire.pack_body, the\n"
"body of None, errors.error_from_status, transport.Connection.cancel (a CANCEL unless closed), calls'\n"
"no_response, DeadlineExpired, asyncio.CancelledError, wire.NO_PARENT_PROVIDER, Status.LENT; for into= calls\n"
"bulk.as_byte_view, protocol.IncomingPull, calls' too_large, wire.F_INTO and bulk.CMA_MIN_BYTES (an into= buffer this large may\n"
"take its result by cross-memory attach: _call_once decides); svcframe.wire itself (its _packer's pack is\n"
"called directly while DEBUG_WIRE is False); monitoring.FOLD_AT (a timed call's record folds its values past it).\n"
"configure_serve() comes first (the sync handlers' thread-local).");

static PyObject *
configure_calls(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = (module_state *)PyModule_GetState(module);
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "configure_calls takes 17 arguments");
        return NULL;
    }
    PyObject *packer = PyObject_GetAttrString(args[15], "_packer");
    PyObject *pack = packer == NULL ? NULL : PyObject_GetAttrString(packer, "pack");
    Py_XDECREF(packer);
    if (pack == NULL)
        return NULL;
    Py_XSETREF(st->packer_pack, pack);
    Py_XSETREF(st->wire, Py_NewRef(args[15]));
    if (!PyContextVar_CheckExact(args[0]) || !PyBytes_CheckExact(args[2]) || !PyLong_CheckExact(args[8])) {
        PyErr_SetString(PyExc_TypeError, "configure_calls: a ContextVar, bytes and an int expected");
        return NULL;
    }
    long lent = PyLong_AsLong(args[9]), into_flag = PyLong_AsLong(args[13]);
    Py_ssize_t cma_min = PyLong_AsSsize_t(args[14]), fold_at = PyLong_AsSsize_t(args[16]);
    if ((lent == -1 || into_flag == -1 || cma_min == -1 || fold_at == -1) && PyErr_Occurred())
        return NULL;
    if (st->writable_kw == NULL && (st->writable_kw = Py_BuildValue("(s)", "writable")) == NULL)
        return NULL;
    if (st->overflow_ok_kw == NULL && (st->overflow_ok_kw = Py_BuildValue("(s)", "overflow_ok")) == NULL)
        return NULL;
    if (st->zero == NULL && (st->zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    PyObject **slots[] = {&st->task_request, &st->pack_body, &st->nil_body, &st->error_from_status,
                          &st->cancel_remote, &st->no_response, &st->deadline_expired, &st->cancelled_error,
                          &st->no_parent};
    for (int i = 0; i < 9; i++)
        Py_XSETREF(*slots[i], Py_NewRef(args[i]));
    Py_XSETREF(st->as_byte_view, Py_NewRef(args[10]));
    Py_XSETREF(st->incoming_pull, Py_NewRef(args[11]));
    Py_XSETREF(st->too_large, Py_NewRef(args[12]));
    st->lent_status = lent;
    st->into_flag = into_flag;
    st->cma_min = cma_min;
    st->fold_at = fold_at;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(buffer_address_doc,
"buffer_address(view, /)\n--\n\n"
"The virtual address of the first byte of a C-contiguous buffer, 0 when it is empty: the twin of\n"
"svcframe.cma.buffer_address, whose ctypes calls cost 2.5-3 us (a split read takes three addresses).\n"
"Raises BufferError for a buffer that is not C-contiguous.");

static PyObject *
buffer_address(PyObject *module, PyObject *obj)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *address = view.len ? PyLong_FromVoidPtr(view.buf) : PyLong_FromLong(0);
    PyBuffer_Release(&view);
    return address;
}

#ifdef __linux__
/* ---- vm_read / vm_write: svcframe.cma.read / write without ctypes ------------------------------------------- */

/* Raise OSError(err, msg) (its subclass for err, as OSError itself picks); steals msg, which may be NULL
   (its error set). Returns NULL. */
static PyObject *
raise_os_error(int err, PyObject *msg)
{
    if (msg != NULL) {
        PyObject *e = PyObject_CallFunction(PyExc_OSError, "iO", err, msg);
        if (e != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(e), e);
            Py_DECREF(e);
        }
        Py_DECREF(msg);
    }
    return NULL;
}

/* OSError(err, "<name> with pid <pid>: <strerror>"), as svcframe.cma raises it. */
static PyObject *
vm_error(int err, const char *name, long pid)
{
    return raise_os_error(err, PyUnicode_FromFormat("%s with pid %ld: %s", name, pid, strerror(err)));
}

/* The peer's address as an unsigned 64-bit int with room for ``size`` bytes after it, or -1 (OSError set:
   EFAULT, "out of range", as svcframe.cma._transfer: a peer's address is data from the wire). */
static int
vm_address(PyObject *obj, Py_ssize_t size, const char *name, long pid, unsigned long long *out)
{
    unsigned long long a = PyLong_Check(obj) ? PyLong_AsUnsignedLongLong(obj) : 0;
    if (PyErr_Occurred())
        PyErr_Clear(); /* negative or over 64 bits: out of range below */
    else if (a > 0 && a <= ULLONG_MAX - (unsigned long long)size) {
        *out = a;
        return 0;
    }
    raise_os_error(EFAULT, PyUnicode_FromFormat("%s with pid %ld: address out of range", name, pid));
    return -1;
}

PyDoc_STRVAR(vm_read_doc,
"vm_read(pid, address, dest, /)\n--\n\n"
"The twin of svcframe.cma.read: copy len(dest) bytes at ``address`` in process ``pid`` into ``dest`` with\n"
"process_vm_readv, the GIL released, without ctypes (whose structures and call cost several us a copy).\n"
"Raises OSError (EPERM, ESRCH, EFAULT; an address out of range is EFAULT) and ValueError (read-only dest).");

static PyObject *
vm_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "vm_read takes 3 arguments");
        return NULL;
    }
    long pid = PyLong_AsLong(args[0]);
    if (pid == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.readonly && view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the destination of a CMA read must be writable");
        return NULL;
    }
    unsigned long long address;
    if (!view.len) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    if (vm_address(args[1], view.len, "process_vm_readv", pid, &address) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    size_t done = 0, size = (size_t)view.len;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done < size) { /* the kernel may copy less than asked (at most 2 GiB - 4 KiB a call) */
        struct iovec local = {(char *)view.buf + done, size - done};
        struct iovec remote = {(void *)(uintptr_t)(address + done), size - done};
        ssize_t got = process_vm_readv((pid_t)pid, &local, 1, &remote, 1, 0);
        if (got <= 0) {
            err = got < 0 ? errno : EFAULT; /* EFAULT: nothing copied */
            break;
        }
        done += (size_t)got;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (err)
        return vm_error(err, "process_vm_readv", pid);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(vm_write_doc,
"vm_write(pid, address, src, mark_address=0, mark=b'', /)\n--\n\n"
"The twin of svcframe.cma.write: copy ``src`` to ``address`` in process ``pid`` with process_vm_writev, then,\n"
"with ``mark_address``, ``mark`` there in the same system call (a write cut short is EFAULT: the mark was not\n"
"written), the GIL released, without ctypes. Raises OSError (EPERM, ESRCH, EFAULT).");

static PyObject *
vm_write(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "vm_write takes 3 to 5 arguments");
        return NULL;
    }
    long pid = PyLong_AsLong(args[0]);
    if (pid == -1 && PyErr_Occurred())
        return NULL;
    int marked = nargs >= 4 && PyObject_IsTrue(args[3]) == 1;
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view, mark = {0};
    if (PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (marked && (nargs < 5 || PyObject_GetBuffer(args[4], &mark, PyBUF_SIMPLE) < 0)) {
        if (nargs < 5)
            PyErr_SetString(PyExc_TypeError, "vm_write: a mark address without a mark");
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned long long address = 0, mark_address = 0;
    PyObject *result = NULL;
    if (!marked && !view.len) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (vm_address(args[1], view.len, "process_vm_writev", pid, &address) < 0)
        goto done;
    if (marked && vm_address(args[3], mark.len, "process_vm_writev", pid, &mark_address) < 0)
        goto done;
    size_t done_bytes = 0, size = (size_t)view.len;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    if (marked) { /* one call: the data, then the mark (the kernel copies the ranges in order) */
        struct iovec local[2] = {{view.buf, size}, {mark.buf, (size_t)mark.len}};
        struct iovec remote[2] = {{(void *)(uintptr_t)address, size}, {(void *)(uintptr_t)mark_address, (size_t)mark.len}};
        int first = size ? 0 : 1; /* (no data: the mark alone) */
        ssize_t got = process_vm_writev((pid_t)pid, local + first, 2 - first, remote + first, 2 - first, 0);
        if (got != (ssize_t)(size + (size_t)mark.len))
            err = got < 0 ? errno : EFAULT; /* cut short: the mark was not written */
    } else {
        while (done_bytes < size) {
            struct iovec local = {(char *)view.buf + done_bytes, size - done_bytes};
            struct iovec remote = {(void *)(uintptr_t)(address + done_bytes), size - done_bytes};
            ssize_t got = process_vm_writev((pid_t)pid, &local, 1, &remote, 1, 0);
            if (got <= 0) {
                err = got < 0 ? errno : EFAULT;
                break;
            }
            done_bytes += (size_t)got;
        }
    }
    Py_END_ALLOW_THREADS
    if (err)
        vm_error(err, "process_vm_writev", pid);
    else
        result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    if (marked)
        PyBuffer_Release(&mark);
    return result;
}
#endif

/* ---- ConnectionState.buffer_updated: Connection.buffer_updated of an open connection ------------------------ */

/* The names the read path uses, interned once (module_state.rn, in this order). */
#define READ_NAMES_N 12
_Static_assert(sizeof(((module_state *)0)->rn) / sizeof(PyObject *) == READ_NAMES_N, "module_state.rn: READ_NAMES_N");
static const char *const READ_NAMES[READ_NAMES_N] = {
    "writelines", "_write", "_defer", "more", "held", "fail", "abort", "on_frames", "on_answers",
    "_buffer_updated_definition", "serve_request", "_loop",
};
enum { RN_WRITELINES, RN_WRITE, RN_DEFER, RN_MORE, RN_HELD, RN_FAIL, RN_ABORT, RN_ON_FRAMES, RN_ON_ANSWERS,
       RN_DEFINITION, RN_SERVE_REQUEST, RN_LOOP };

/* time.monotonic(): the same clock in seconds, converted as CPython converts it (_PyTime_AsSecondsDouble). */
static double
monotonic_seconds(void)
{
    long long ns = monotonic_ns();
    return ns % 1000000000LL == 0 ? (double)(ns / 1000000000LL) : (double)ns / 1e9;
}

/* Set the float field ``i`` of ``conn``. 0, or -1 with an exception set. */
static int
set_float(PyObject *conn, int i, double value)
{
    PyObject *v = PyFloat_FromDouble(value);
    if (v == NULL)
        return -1;
    Py_XSETREF(FIELD(conn, i), v);
    return 0;
}

/* ``owner`` is an engine (EngineState) that keeps svcframe.engine.Engine's method ``name`` (``method``,
 * configured): its class does not override it, nor does the instance. 1 or 0; -1 with an exception set (one
 * that is not an Exception, as may_decline). */
static int
engine_method(module_state *st, PyObject *owner, int name, PyObject *method)
{
    if (method == NULL || !PyObject_TypeCheck(owner, (PyTypeObject *)st->engine_state))
        return 0;
    PyObject *bound = PyObject_GetAttr(owner, st->rn[name]); /* (owner.on_frames: a method object from a free list) */
    int kept = bound != NULL && PyMethod_Check(bound) && PyMethod_GET_FUNCTION(bound) == method &&
               PyMethod_GET_SELF(bound) == owner;
    Py_XDECREF(bound);
    return bound == NULL && !may_decline() ? -1 : kept; /* (an Exception: the definition's call meets it again) */
}

/* progress.activity() unless progress.blocking (Engine.on_frames' and on_answers' first line). 0, or -1. */
static int
progress_activity(module_state *st, PyObject *engine)
{
    PyObject *progress = Py_XNewRef(FIELD(engine, E_PROGRESS)), *r;
    if (progress == NULL) {
        PyErr_SetString(PyExc_AttributeError, "progress");
        return -1;
    }
    PyObject *blocking = field_of(progress, st->progress_state, P_BLOCKING);
    int busy = blocking == Py_True ? 0 : blocking == Py_False ? 1 : -2;
    if (busy == -2) { /* (not a ProgressState, or not a bool: as Python reads it) */
        PyObject *b = PyObject_GetAttrString(progress, "blocking");
        busy = b == NULL ? -1 : !PyObject_IsTrue(b);
        Py_XDECREF(b);
        if (busy == -1 || PyErr_Occurred())
            busy = -1;
    }
    if (busy == 1) {
        r = PyObject_CallMethodNoArgs(progress, st->cn[C_ACTIVITY]);
        busy = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(progress);
    return busy < 0 ? -1 : 0;
}

/* Engine.on_frames(conn, frames) for a batch of requests only (the server's common read): arrival read once,
 * the batch being dispatched set as _dispatching (Handlers._start), each request to svcframe.engine's
 * serve_request. Any other batch, or an owner that is not an Engine or overrides on_frames, goes to its
 * on_frames. 0, or -1 with an exception set. */
static int
dispatch_frames(module_state *st, PyObject *owner, PyObject *conn, PyObject *frames)
{
    Py_ssize_t n = PyList_GET_SIZE(frames);
    int requests = engine_method(st, owner, RN_ON_FRAMES, st->on_frames_py);
    if (requests < 0)
        return -1;
    requests = requests && FIELD(owner, E_LOOP) != NULL;
    for (Py_ssize_t i = 0; requests && i < n; i++) {
        PyObject *frame = PyList_GET_ITEM(frames, i);
        int overflow = 0;
        requests = PyTuple_Check(frame) && PyTuple_GET_SIZE(frame) == FRAME_FIELDS &&
                   PyLong_CheckExact(PyTuple_GET_ITEM(frame, 0)) &&
                   PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(frame, 0), &overflow) == K_REQUEST;
    }
    PyObject *serve = requests ? PyDict_GetItemWithError(st->engine_globals, st->rn[RN_SERVE_REQUEST]) : NULL;
    if (serve == NULL) {
        if (PyErr_Occurred())
            return -1;
        PyObject *call_args[3] = {owner, conn, frames};
        PyObject *r = PyObject_VectorcallMethod(st->rn[RN_ON_FRAMES], call_args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                NULL);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    Py_INCREF(serve);
    if (progress_activity(st, owner) < 0) {
        Py_DECREF(serve);
        return -1;
    }
    PyObject *loop = Py_NewRef(FIELD(owner, E_LOOP));
    PyObject *arrival_ns = PyLong_FromLongLong(monotonic_ns());
    PyObject *arrival = arrival_ns == NULL ? NULL : PyObject_CallMethodNoArgs(loop, st->cn[C_TIME]);
    Py_DECREF(loop);
    int failed = arrival == NULL;
    if (!failed) { /* self._dispatching, self._dispatching_cancels = frames, None */
        Py_XSETREF(FIELD(owner, E_DISPATCHING), Py_NewRef(frames));
        Py_XSETREF(FIELD(owner, E_DISPATCHING_CANCELS), Py_NewRef(Py_None));
    }
    for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(frames); i++) {
        PyObject *frame = Py_NewRef(PyList_GET_ITEM(frames, i));
        PyObject *call_args[5] = {owner, conn, frame, arrival_ns, arrival};
        PyObject *r = PyObject_Vectorcall(serve, call_args, 5, NULL);
        Py_DECREF(frame);
        failed = r == NULL;
        Py_XDECREF(r);
    }
    if (!failed) /* (as on_frames: an exception leaves the batch in place) */
        Py_XSETREF(FIELD(owner, E_DISPATCHING), Py_NewRef(st->no_frames));
    Py_XDECREF(arrival);
    Py_XDECREF(arrival_ns);
    Py_DECREF(serve);
    return failed ? -1 : 0;
}

/* Connection._write(batch) for the replies of a read: one write (writelines where it pauses the protocol), as
 * the definition; anything unusual to the definition. 0, or -1 with an exception set. */
static int
write_batch(module_state *st, PyObject *conn, PyObject *batch)
{
    Py_ssize_t n = PyList_GET_SIZE(batch);
    if (IS_NONE(FIELD(conn, CN_TRANSPORT)) || small_count(FIELD(conn, CN_WRITES)) < 0 ||
        (n > 1 && FIELD(conn, CN_WRITELINES_PAUSES) != Py_True)) {
        PyObject *call_args[2] = {conn, batch};
        PyObject *r = PyObject_VectorcallMethod(st->rn[RN_WRITE], call_args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    PyObject *data = Py_NewRef(n == 1 ? PyList_GET_ITEM(batch, 0) : batch);
    int rc = transport_write(st, conn, n == 1 ? st->cn[C_WRITE] : st->rn[RN_WRITELINES], data);
    Py_DECREF(data);
    return rc;
}

/* The open connection's read: Connection.buffer_updated's try block, with ``core`` its decoder. None, or NULL
 * with an exception set (a ProtocolError is the caller's to handle). */
static PyObject *
read_open(module_state *st, PyObject *conn, PyObject *core, PyObject *owner, PyObject *proto, PyObject *nbytes)
{
    PyObject *frames = core_buffer_updated((Core *)core, nbytes);
    if (frames == NULL)
        return NULL;
    int idle = IS_NONE(((Core *)core)->direct) && ((Core *)core)->start == ((Core *)core)->end;
    if (frames == Py_None) { /* the decoder answered our calls itself: frames completed */
        Py_DECREF(frames);
        double now = monotonic_seconds();
        if (set_float(conn, CN_LAST_ACTIVITY, now) < 0 || set_float(conn, CN_FRAME_STARTED, idle ? 0.0 : now) < 0)
            return NULL;
        int kept = engine_method(st, owner, RN_ON_ANSWERS, st->on_answers_py);
        if (kept)
            return kept < 0 || progress_activity(st, owner) < 0 ? NULL : Py_NewRef(Py_None);
        PyObject *call_args[2] = {owner, conn};
        return PyObject_VectorcallMethod(st->rn[RN_ON_ANSWERS], call_args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    if (!PyList_Check(frames)) {
        Py_DECREF(frames);
        PyErr_SetString(PyExc_TypeError, "the decoder's buffer_updated returned neither a list nor None");
        return NULL;
    }
    if (PyList_GET_SIZE(frames) == 0) { /* a frame is under way: the owner's sweep bounds how long it takes */
        Py_DECREF(frames);
        PyObject *started = FIELD(conn, CN_FRAME_STARTED);
        int truth = started == NULL ? -1 : PyObject_IsTrue(started);
        if (truth < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_AttributeError, "frame_started");
            return NULL;
        }
        return truth || set_float(conn, CN_FRAME_STARTED, monotonic_seconds()) == 0 ? Py_NewRef(Py_None) : NULL;
    }
    double now = monotonic_seconds(); /* activity = a frame completed, not a byte received */
    PyObject *batch = PyList_New(0), *zero = PyLong_FromLong(0);
    if (batch == NULL || zero == NULL || set_float(conn, CN_LAST_ACTIVITY, now) < 0 ||
        set_float(conn, CN_FRAME_STARTED, idle ? 0.0 : now) < 0) {
        Py_XDECREF(batch);
        Py_XDECREF(zero);
        Py_DECREF(frames);
        return NULL;
    }
    Py_XSETREF(FIELD(conn, CN_BATCH), Py_NewRef(batch)); /* self._batch = batch = []; self._batch_bytes = 0 */
    Py_XSETREF(FIELD(conn, CN_BATCH_BYTES), zero);
    int failed = 0;
    while (!failed && frames != NULL && PyList_Check(frames) && PyList_GET_SIZE(frames)) {
        if (PyList_GET_SIZE(frames) > st->frames_per_turn) {
            PyObject *call_args[2] = {conn, frames};
            Py_SETREF(frames, PyObject_VectorcallMethod(st->rn[RN_DEFER], call_args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                        NULL));
            if (frames == NULL || !PyList_Check(frames)) {
                if (frames != NULL)
                    PyErr_SetString(PyExc_TypeError, "Connection._defer must return a list");
                failed = 1;
                break;
            }
        }
        if (dispatch_frames(st, owner, conn, frames) < 0) {
            failed = 1;
            break;
        }
        /* frames = proto.more() if proto.decoder.held and self._backlog is None else None */
        PyObject *held = PyObject_GetAttr(core, st->rn[RN_HELD]);
        int more = held == NULL ? -1 : PyObject_IsTrue(held);
        Py_XDECREF(held);
        if (more < 0) {
            failed = 1;
            break;
        }
        Py_CLEAR(frames);
        if (more && FIELD(conn, CN_BACKLOG) == Py_None) {
            frames = PyObject_CallMethodNoArgs(proto, st->rn[RN_MORE]);
            failed = frames == NULL;
        }
    }
    Py_XDECREF(frames);
    { /* finally: self._batch = None; if batch and not self.closed: self._write(batch) */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        Py_XSETREF(FIELD(conn, CN_BATCH), Py_NewRef(Py_None));
        PyObject *now_closed = FIELD(conn, CN_CLOSED);
        int closed = !PyList_GET_SIZE(batch) ? 1 : now_closed == NULL ? -1 : PyObject_IsTrue(now_closed);
        if (closed < 0 && !PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError, "closed");
        if (closed < 0 || (!closed && write_batch(st, conn, batch) < 0)) {
            failed = 1; /* (an error in a finally replaces the one before it) */
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        } else if (type != NULL) {
            PyErr_Restore(type, value, tb);
        }
    }
    Py_DECREF(batch);
    return failed ? NULL : Py_NewRef(Py_None);
}

static PyObject *
conn_buffer_updated(PyObject *conn, PyTypeObject *defining, PyObject *const *args, Py_ssize_t nargs,
                    PyObject *kwnames)
{
    module_state *st = (module_state *)PyType_GetModuleState(defining);
    if (st == NULL)
        return NULL;
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "buffer_updated takes one argument (nbytes)");
        return NULL;
    }
    PyObject *closed = FIELD(conn, CN_CLOSED);
    if (closed == Py_True)
        Py_RETURN_NONE;
    PyObject *decode = FIELD(conn, CN_DECODE), *owner = FIELD(conn, CN_OWNER), *proto = FIELD(conn, CN_PROTOCOL);
    if (st->on_frames_py == NULL || closed != Py_False || FIELD(conn, CN_OPEN) != Py_True || decode == NULL ||
        !PyCFunction_Check(decode) || PyCFunction_GET_FUNCTION(decode) != (PyCFunction)core_buffer_updated ||
        PyCFunction_GET_SELF(decode) == NULL || owner == NULL || proto == NULL) {
        /* (the handshake, a closed connection, anything unusual: the definition) */
        PyObject *call_args[2] = {conn, args[0]};
        return PyObject_VectorcallMethod(st->rn[RN_DEFINITION], call_args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    PyObject *core = Py_NewRef(PyCFunction_GET_SELF(decode));
    Py_INCREF(owner);
    Py_INCREF(proto);
    PyObject *result = read_open(st, conn, core, owner, proto, args[0]);
    if (result == NULL && PyErr_ExceptionMatches(st->protocol_error)) { /* except ProtocolError as exc: */
        PyObject *exc = take_exception(), *call_args[2] = {proto, exc}, *r = NULL;
        if (exc != NULL) {
            r = PyObject_VectorcallMethod(st->rn[RN_FAIL], call_args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            call_args[0] = conn;
            Py_XSETREF(r, r == NULL ? NULL
                                    : PyObject_VectorcallMethod(st->rn[RN_ABORT], call_args,
                                                                2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL));
            Py_DECREF(exc);
        }
        result = r == NULL ? NULL : Py_NewRef(Py_None);
        Py_XDECREF(r);
    }
    Py_DECREF(proto);
    Py_DECREF(owner);
    Py_DECREF(core);
    return result;
}

static PyMethodDef connection_methods[] = {
    {"buffer_updated", (PyCFunction)(void (*)(void))conn_buffer_updated, METH_METHOD | METH_FASTCALL | METH_KEYWORDS,
     "buffer_updated(nbytes) -> None: svcframe.transport.Connection.buffer_updated (_buffer_updated_definition)\n"
     "without a Python frame on an open connection: the decoder's read, then an engine's batch of requests\n"
     "served (Engine.on_frames) and its replies written in one write (_write); anything else it meets (the\n"
     "handshake, other frames, an owner that overrides on_frames) goes where the definition sends it."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(configure_read_doc,
"configure_read(on_frames, on_answers, protocol_error, frames_per_turn, no_frames, engine_globals) -> None\n\n"
"What ConnectionState.buffer_updated reads with: svcframe.engine.Engine.on_frames and on_answers (done here for\n"
"an owner that keeps them), ProtocolError, transport.FRAMES_PER_TURN, engine._NO_FRAMES and svcframe.engine's\n"
"globals (whose serve_request serves each request). Until it is called, every read goes to the definition.");

static PyObject *
configure_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "configure_read takes 6 arguments");
        return NULL;
    }
    if (!PyType_Check(args[2]) || !PyDict_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "configure_read: protocol_error must be a type, engine_globals a dict");
        return NULL;
    }
    Py_ssize_t per_turn = PyLong_AsSsize_t(args[3]);
    if (per_turn == -1 && PyErr_Occurred())
        return NULL;
    module_state *st = (module_state *)PyModule_GetState(module);
    st->frames_per_turn = per_turn;
    Py_XSETREF(st->on_answers_py, Py_NewRef(args[1]));
    Py_XSETREF(st->protocol_error, Py_NewRef(args[2]));
    Py_XSETREF(st->no_frames, Py_NewRef(args[4]));
    Py_XSETREF(st->engine_globals, Py_NewRef(args[5]));
    Py_XSETREF(st->on_frames_py, Py_NewRef(args[0])); /* (last: set, it says the rest is) */
    Py_RETURN_NONE;
}

static PyMethodDef speedups_methods[] = {
#ifdef __linux__
    {"vm_read", (PyCFunction)(void (*)(void))vm_read, METH_FASTCALL, vm_read_doc},
    {"vm_write", (PyCFunction)(void (*)(void))vm_write, METH_FASTCALL, vm_write_doc},
#endif
    {"buffer_address", (PyCFunction)buffer_address, METH_O, buffer_address_doc},
    {"parse_inline", (PyCFunction)(void (*)(void))parse_inline, METH_FASTCALL, parse_inline_doc},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, configure_doc},
    {"configure_decoder", (PyCFunction)configure_decoder, METH_O, configure_decoder_doc},
    {"request_frame", (PyCFunction)(void (*)(void))request_frame, METH_FASTCALL, request_frame_doc},
    {"ok_response", (PyCFunction)(void (*)(void))ok_response, METH_FASTCALL, ok_response_doc},
    {"unpack_body", (PyCFunction)unpack_body, METH_O, unpack_body_doc},
    {"receive_bytes", (PyCFunction)receive_bytes, METH_O, receive_bytes_doc},
    {"serve_request", (PyCFunction)(void (*)(void))serve_request, METH_FASTCALL, serve_request_doc},
    {"configure_serve", (PyCFunction)(void (*)(void))configure_serve, METH_FASTCALL, configure_serve_doc},
    {"begin_call", (PyCFunction)(void (*)(void))begin_call, METH_FASTCALL, begin_call_doc},
    {"configure_calls", (PyCFunction)(void (*)(void))configure_calls, METH_FASTCALL, configure_calls_doc},
    {"push_ahead_now", (PyCFunction)(void (*)(void))push_ahead_now, METH_FASTCALL, push_ahead_now_doc},
    {"push_ahead_frames", (PyCFunction)(void (*)(void))push_ahead_frames_c, METH_FASTCALL, push_ahead_frames_doc},
    {"configure_push", (PyCFunction)configure_push, METH_O, configure_push_doc},
    {"place_ahead", (PyCFunction)(void (*)(void))place_ahead, METH_FASTCALL, place_ahead_doc},
    {"configure_read", (PyCFunction)(void (*)(void))configure_read, METH_FASTCALL, configure_read_doc},
    {NULL, NULL, 0, NULL},
};

#ifndef SVCFRAME_SOURCE_SHA256
#define SVCFRAME_SOURCE_SHA256 "unknown"
#endif

static int
speedups_exec(PyObject *module)
{
    module_state *st = (module_state *)PyModule_GetState(module);
    st->s_done = PyUnicode_InternFromString("done");
    st->s_set_result = PyUnicode_InternFromString("set_result");
    st->s_get_buffer_slow = PyUnicode_InternFromString("_get_buffer_slow");
    st->s_direct_updated = PyUnicode_InternFromString("_direct_updated");
    st->s_compact = PyUnicode_InternFromString("_compact");
    st->s_parse = PyUnicode_InternFromString("_parse");
    st->s_release_pages = PyUnicode_InternFromString("_release_pages");
    st->s_overflow_ok = PyUnicode_InternFromString("overflow_ok");
    st->s_cursor = PyUnicode_InternFromString("cursor");
    if (!st->s_overflow_ok || !st->s_cursor)
        return -1;
    if (!st->s_done || !st->s_set_result || !st->s_get_buffer_slow || !st->s_direct_updated || !st->s_compact ||
        !st->s_parse || !st->s_release_pages)
        return -1;
    st->core_type = PyType_FromModuleAndSpec(module, &core_spec, NULL);
    if (st->core_type == NULL || PyModule_AddObjectRef(module, "DecoderCore", st->core_type) < 0)
        return -1;
    st->deadlines_type = PyType_FromModuleAndSpec(module, &dl_spec, NULL);
    if (st->deadlines_type == NULL || PyModule_AddObjectRef(module, "DeadlinesCore", st->deadlines_type) < 0)
        return -1;
    if ((st->engine_state = new_state_type(module, "svcframe._speedups.EngineState", ENGINE_STATE, E_N,
                                           "The hot attributes of svcframe.engine.Engine (svcframe.slots).",
                                           NULL)) == NULL ||
        (st->connection_state = new_state_type(module, "svcframe._speedups.ConnectionState", CONNECTION_STATE, CN_N,
                                               "The hot attributes of svcframe.transport.Connection, and its "
                                               "compiled buffer_updated.",
                                               connection_methods)) == NULL ||
        (st->monitor_state = new_state_type(module, "svcframe._speedups.MonitorState", MONITOR_STATE, M_N,
                                            "The hot attributes of svcframe.monitoring.Monitor.", NULL)) == NULL ||
        (st->progress_state = new_state_type(module, "svcframe._speedups.ProgressState", PROGRESS_STATE, P_N,
                                             "The hot attributes of svcframe.progress.Progress.", NULL)) == NULL ||
        (st->record_state = new_state_type(module, "svcframe._speedups.RecordState", RECORD_STATE, R_N,
                                           "The hot attributes of svcframe.monitoring.Record.", NULL)) == NULL)
        return -1;
    st->call_type = PyType_FromModuleAndSpec(module, &call_spec, NULL);
    if (st->call_type == NULL || PyModule_AddObjectRef(module, "Call", st->call_type) < 0)
        return -1;
    for (int i = 0; i < SERVE_NAMES_N; i++) {
        if ((st->sn[i] = PyUnicode_InternFromString(SERVE_NAMES[i])) == NULL)
            return -1;
    }
    for (int i = 0; i < CALL_NAMES_N; i++) {
        if ((st->cn[i] = PyUnicode_InternFromString(CALL_NAMES[i])) == NULL)
            return -1;
    }
    for (int i = 0; i < READ_NAMES_N; i++) {
        if ((st->rn[i] = PyUnicode_InternFromString(READ_NAMES[i])) == NULL)
            return -1;
    }
    st->s_bulk_cma = PyUnicode_InternFromString("bulk_cma");
    st->s_push = PyUnicode_InternFromString("push");
    st->s_record_bulk = PyUnicode_InternFromString("record_bulk");
    st->s_pushes = PyUnicode_InternFromString("pushes");
    st->s_buffer = PyUnicode_InternFromString("buffer");
    st->s_served_push = PyUnicode_InternFromString("served_push");
    if ((st->s_fold = PyUnicode_InternFromString("fold")) == NULL)
        return -1;
    if (!st->s_bulk_cma || !st->s_push || !st->s_record_bulk || !st->s_pushes || !st->s_buffer || !st->s_served_push)
        return -1;
    st->s_arm = PyUnicode_InternFromString("_arm");
    st->s_compact_heap = PyUnicode_InternFromString("_compact");
    st->s_idle = PyUnicode_InternFromString("_idle");
    PyObject *heapq = PyImport_ImportModule("heapq");
    if (heapq == NULL || !st->s_arm || !st->s_compact_heap || !st->s_idle)
        return -1;
    st->heappush = PyObject_GetAttrString(heapq, "heappush");
    st->heapify = PyObject_GetAttrString(heapq, "heapify");
    Py_DECREF(heapq);
    if (st->heappush == NULL || st->heapify == NULL)
        return -1;
    /* the SHA-256 of the source this was compiled from (hatch_build.py): a stale build is found by a test */
    return PyModule_AddStringConstant(module, "SOURCE_SHA256", SVCFRAME_SOURCE_SHA256);
}

/* Every object the module state holds, listed once (its traverse and clear run over it). */
#define STATE_OBJECTS(X) \
    X(s_done) X(s_set_result) X(s_get_buffer_slow) X(s_direct_updated) X(s_compact) X(s_parse) X(s_release_pages) \
    X(s_overflow_ok) X(s_cursor) X(frame_type) X(zero_trace) X(unpack) X(unpack_kwnames) X(unpack_kwvalues) \
    X(request_frame_py) X(ok_response_py) X(unpack_body_py) X(core_type) X(deadlines_type) X(heappush) X(heapify) \
    X(s_arm) X(s_compact_heap) X(s_idle) X(on_request_py) X(request_type) X(sync) X(done) X(handle_type) X(s_bulk_cma) X(s_push) X(s_record_bulk) X(s_pushes) X(s_buffer) X(s_served_push) X(call_type) X(task_request) \
    X(pack_body) X(nil_body) X(error_from_status) X(cancel_remote) X(no_response) X(deadline_expired) \
    X(cancelled_error) X(no_parent) X(zero) X(engine_state) X(as_byte_view) X(incoming_pull) X(too_large) \
    X(writable_kw) X(overflow_ok_kw) X(connection_state) X(monitor_state) X(progress_state) X(record_state) \
    X(wire) X(packer_pack) X(on_frames_py) X(on_answers_py) X(protocol_error) X(no_frames) X(engine_globals) \
    X(s_fold) X(handler_globals)

static int
speedups_traverse(PyObject *module, visitproc visit, void *arg)
{
    module_state *st = (module_state *)PyModule_GetState(module);
#define VISIT(field) Py_VISIT(st->field);
    STATE_OBJECTS(VISIT)
#undef VISIT
    for (int i = 0; i < SERVE_NAMES_N; i++)
        Py_VISIT(st->sn[i]);
    for (int i = 0; i < CALL_NAMES_N; i++)
        Py_VISIT(st->cn[i]);
    for (int i = 0; i < READ_NAMES_N; i++)
        Py_VISIT(st->rn[i]);
    return 0;
}

static int
speedups_clear(PyObject *module)
{
    module_state *st = (module_state *)PyModule_GetState(module);
#define CLEAR(field) Py_CLEAR(st->field);
    STATE_OBJECTS(CLEAR)
#undef CLEAR
    for (int i = 0; i < SERVE_NAMES_N; i++)
        Py_CLEAR(st->sn[i]);
    for (int i = 0; i < CALL_NAMES_N; i++)
        Py_CLEAR(st->cn[i]);
    for (int i = 0; i < READ_NAMES_N; i++)
        Py_CLEAR(st->rn[i]);
    return 0;
}

static struct PyModuleDef_Slot speedups_slots[] = {
    {Py_mod_exec, speedups_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    "svcframe._speedups",
    "The compiled twins of svcframe's per-call hot paths (optional: svcframe runs without them).",
    sizeof(module_state),
    speedups_methods,
    speedups_slots,
    speedups_traverse,
    speedups_clear,
    NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&speedups_module);
}
