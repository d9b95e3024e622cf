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
 * - DecoderCore, of svcframe.wire._PyDecoderCore: FrameDecoder's state, get_buffer, buffer_updated and idle,
 *   which run this loop without a Python frame per read, and answer our calls (FrameDecoder.answers): an OK
 *   RESPONSE first in its batch gives its call's future what svcframe.wire.answer_call would, once the whole
 *   read decoded without an error.
 * - request_frame and ok_response, of svcframe.wire._request_frame_py and _ok_response_py: a call's REQUEST
 *   and a server's common answer in one allocation (anything unusual is handed to the Python twin).
 * - unpack_body, of svcframe.wire._unpack_body_py: a simple body without a call, others without a Python frame.
 * - DeadlinesCore, of svcframe.deadlines._PyDeadlinesCore: the deadline heap's add and _compact.
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
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 80
#define FRAME_FIELDS 14
#define MAGIC_INT 0x4653u /* b"SF" little-endian */
#define WIRE_VERSION 1
#define K_REQUEST 2
#define K_RESPONSE 3
#define UNPACK_KWARGS_MAX 8
#define K_BULK_DATA_REPLY 7
#define K_BULK_DATA_PUSH 8

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
"parse_inline(buffer, start, end, max_body, legal_kinds, frames, frame_type, zero_trace_id, sink, data_max)\n"
"-> int\n\n"
"Append to ``frames`` every complete, valid frame with an inline body found in ``buffer[start:end]``, as\n"
"``frame_type`` tuples (svcframe.wire.Frame), and return the offset of the first frame not taken: an\n"
"incomplete one, one whose body is over ``max_body`` bytes or not all received, or a bad header\n"
"(FrameDecoder._parse handles each, with its errors). ``legal_kinds``: bit k set accepts kind k. A complete\n"
"bulk data frame under ``data_max`` bytes is taken too when ``frames`` is empty and ``sink`` is not None:\n"
"its body is copied into ``sink(kind, request_id, length)`` (a writable buffer of exactly ``length`` bytes)\n"
"and its Frame has the body None. Raises ValueError when ``0 <= start <= end <= len(buffer)`` does not hold,\n"
"svcframe.errors.RemoteProtocolError when the sink's buffer is not ``length`` bytes; what the sink raises, or\n"
"a buffer error on a destination that is not writable and contiguous, propagates.");

/* Copy a bulk data body into the buffer the sink names for it; -1 with an exception set on failure. */
static int
sink_data(PyObject *sink, unsigned kind, const unsigned char *p, Py_ssize_t length)
{
    PyObject *dest = PyObject_CallFunction(sink, "IKn", kind, (unsigned long long)rd64(p + 16), length);
    if (dest == NULL)
        return -1;
    Py_buffer out;
    int rc = PyObject_GetBuffer(dest, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS);
    Py_DECREF(dest);
    if (rc < 0)
        return -1;
    if (out.len != length) { /* as FrameDecoder._parse says it (a bug of the sink, not of the peer) */
        PyObject *errors = PyImport_ImportModule("svcframe.errors");
        PyObject *error = errors ? PyObject_GetAttrString(errors, "RemoteProtocolError") : NULL;
        if (error != NULL)
            PyErr_Format(error, "bulk sink returned %zd bytes for %zd", out.len, length);
        Py_XDECREF(error);
        Py_XDECREF(errors);
        PyBuffer_Release(&out);
        return -1;
    }
    memcpy(out.buf, p + HEADER_SIZE, (size_t)length);
    PyBuffer_Release(&out);
    return 0;
}

typedef struct {
    PyObject *s_done, *s_set_result; /* method names, interned once per module (per interpreter) */
    PyObject *s_get_buffer_slow, *s_direct_updated, *s_compact, *s_parse, *s_release_pages;
    PyObject *frame_type, *zero_trace, *unpack; /* what DecoderCore decodes with (configure()) */
    PyObject *unpack_kwnames, *unpack_kwvalues;  /* unpack's keyword arguments (configure()) */
    PyObject *request_frame_py, *ok_response_py;  /* svcframe.wire's pure twins (configure()) */
    PyObject *unpack_body_py;
    Py_ssize_t keep_bytes;                        /* wire.KEEP_RECEIVE_BYTES (configure()) */
    PyObject *core_type;                          /* DecoderCore */
    PyObject *deadlines_type;                     /* DeadlinesCore */
    PyObject *heappush, *heapify;                 /* heapq's */
    PyObject *s_arm, *s_compact_heap, *s_idle;    /* DeadlinesCore's method names */
} module_state;

/* The value of a msgpack body that is one simple item, decoded as msgpack.unpackb decodes it (nil, true,
 * false, a fixint, a bin 8 that is the whole body), without a call; NULL for anything else (no exception set):
 * the decoder's own call decodes it. */
static PyObject *
simple_value(const unsigned char *b, Py_ssize_t length)
{
    if (length == 1) {
        unsigned c = b[0];
        if (c == 0xc0)
            Py_RETURN_NONE;
        if (c == 0xc2)
            Py_RETURN_FALSE;
        if (c == 0xc3)
            Py_RETURN_TRUE;
        if (c <= 0x7f) /* positive fixint */
            return PyLong_FromLong((long)c);
        if (c >= 0xe0) /* negative fixint */
            return PyLong_FromLong((long)c - 256);
        return NULL;
    }
    if (length >= 2 && b[0] == 0xc4 && (Py_ssize_t)b[1] == length - 2) /* bin 8: bytes */
        return PyBytes_FromStringAndSize((const char *)b + 2, length - 2);
    return NULL;
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

/* The loop of parse_inline over base[start:end] (see its docstring): the offset of the first frame not taken,
 * or -1 with an exception set. */
static Py_ssize_t
parse_loop(module_state *st, const unsigned char *base, Py_ssize_t start, Py_ssize_t end, long long max_body,
           unsigned long long legal, PyObject *frames, PyTypeObject *frame_type, PyObject *zero_trace, PyObject *sink,
           long long data_max, PyObject *answers, PyObject **answered)
{
    while (end - start >= HEADER_SIZE) {
        const unsigned char *p = base + start;
        unsigned kind = p[3];
        uint32_t length = rd32(p + 12);
        if (rd16(p) != MAGIC_INT || p[2] != WIRE_VERSION || rd32(p + 36) != 0 || kind >= 64 ||
            !((legal >> kind) & 1) || (long long)length > max_body || (Py_ssize_t)length > end - start - HEADER_SIZE)
            break; /* not ours to take: the Python loop decides */
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
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "parse_inline takes 10 arguments");
        return NULL;
    }
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
    start = parse_loop((module_state *)PyModule_GetState(module), (const unsigned char *)view.buf, start, end,
                       max_body, legal, frames, (PyTypeObject *)args[6], zero_trace, sink, data_max, NULL, NULL);
    PyBuffer_Release(&view);
    return start < 0 ? NULL : PyLong_FromSsize_t(start);
}


/* ---- DecoderCore: the receive interface of svcframe.wire.FrameDecoder ------------------------------------- */

static struct PyModuleDef speedups_module;

typedef struct {
    PyObject_HEAD
    PyObject *buf, *view, *head, *direct, *bulk_sink, *answers;
    Py_ssize_t start, end, high, data_max, direct_pos;
    long long max_body;
    unsigned long long legal;
    char reuse_large;
} Core;

#define IS_NONE(o) ((o) == NULL || (o) == Py_None)

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
    PyObject **slots[] = {&self->buf, &self->view, &self->head, &self->direct, &self->bulk_sink, &self->answers};
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
    if (!IS_NONE(self->direct))
        return PyObject_CallMethodOneArg((PyObject *)self, st->s_direct_updated, arg);
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
    PyObject *sink = self->bulk_sink ? self->bulk_sink : Py_None;
    Py_ssize_t start = parse_loop(st, (const unsigned char *)view.buf, first, end, self->max_body, self->legal, frames,
                                  (PyTypeObject *)st->frame_type, st->zero_trace, sink, self->data_max, self->answers,
                                  IS_NONE(self->answers) ? NULL : &answered);
    if (start >= 0 && answered != NULL && !PyList_GET_SIZE(frames) && end - start > 3 &&
        (((const unsigned char *)view.buf)[start + 3] == K_BULK_DATA_REPLY ||
         ((const unsigned char *)view.buf)[start + 3] == K_BULK_DATA_PUSH)) {
        /* answers, then bulk data: the Python loop holds data behind the frames before it (their dispatch may set
         * up its sink), so this read is decoded without answering, all of it frames (rare: a read of ours is
         * answered by the data's last frame) */
        Py_CLEAR(answered);
        start = parse_loop(st, (const unsigned char *)view.buf, first, end, self->max_body, self->legal, frames,
                           (PyTypeObject *)st->frame_type, st->zero_trace, sink, self->data_max, NULL, NULL);
    }
    PyBuffer_Release(&view);
    if (start < 0)
        goto fail;
    self->start = start;
    if (start == end) { /* all taken (_emptied): the next read starts at the beginning */
        self->start = self->end = 0;
        if (self->high > st->keep_bytes && !self->reuse_large) {
            PyObject *rc = PyObject_CallMethodNoArgs((PyObject *)self, st->s_release_pages);
            if (rc == NULL)
                goto fail;
            Py_DECREF(rc);
        }
    } else {
        /* the rest is the Python loop's; an error there (a bad frame behind the answers) answers nothing, as the
         * pure-Python decoder's error loses the whole batch */
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
     "get_buffer(sizehint=-1) -> memoryview: see svcframe.wire.FrameDecoder."},
    {"buffer_updated", (PyCFunction)core_buffer_updated, METH_O,
     "buffer_updated(nbytes) -> list[Frame] | None: see svcframe.wire.FrameDecoder."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef core_getset[] = {
    {"idle", (getter)core_idle, NULL, "True when no partial frame is buffered.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot core_slots[] = {
    {Py_tp_doc, "The state and receive interface (get_buffer, buffer_updated, idle) of svcframe.wire.FrameDecoder "
                "in C: the compiled twin of svcframe.wire._PyDecoderCore."},
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
"configure(frame_type, zero_trace_id, unpack, unpack_kwargs, keep_bytes, request_frame_py, ok_response_py,\n"
"          unpack_body_py) -> None\n\n"
"What DecoderCore decodes with: svcframe.wire's Frame, ZERO_TRACE_ID, the strict msgpack decoder of answers\n"
"(``unpack(body, **unpack_kwargs)``, at most 8 keywords) and KEEP_RECEIVE_BYTES; the Python twins of\n"
"request_frame, ok_response and unpack_body.");

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "configure takes 8 arguments");
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
    Py_ssize_t keep = PyLong_AsSsize_t(args[4]);
    if (keep == -1 && PyErr_Occurred())
        return NULL;
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
    Py_INCREF(args[5]);
    Py_XSETREF(st->request_frame_py, args[5]);
    Py_INCREF(args[6]);
    Py_XSETREF(st->ok_response_py, args[6]);
    Py_INCREF(args[7]);
    Py_XSETREF(st->unpack_body_py, args[7]);
    st->keep_bytes = keep;
    Py_RETURN_NONE;
}


/* ---- request_frame: a REQUEST's bytes --------------------------------------------------------------------- */

static inline void wr16(unsigned char *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void wr32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void wr64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }

/* args[i] as an unsigned int of at most ``max``; 0 with no exception when it is not one (the caller defers to
 * the Python twin, whose error is the definition). */
static int
as_field(PyObject *o, unsigned long long max, unsigned long long *out)
{
    if (!PyLong_CheckExact(o))
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
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
    memset(p, 0, HEADER_SIZE);
    wr16(p, MAGIC_INT);
    p[2] = WIRE_VERSION;
    p[3] = K_REQUEST;
    wr16(p + 4, (uint16_t)v[0]);   /* flags */
    wr16(p + 6, (uint16_t)v[1]);   /* provider_id */
    wr32(p + 8, (uint32_t)v[2]);   /* rpc_id */
    wr32(p + 12, (uint32_t)length); /* body length */
    wr64(p + 16, v[3]);            /* request_id */
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
    memset(p, 0, HEADER_SIZE);
    wr16(p, MAGIC_INT);
    p[2] = WIRE_VERSION;
    p[3] = K_RESPONSE;
    wr32(p + 12, (uint32_t)(head + n));
    wr64(p + 16, rid);
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

static PyMethodDef speedups_methods[] = {
    {"parse_inline", (PyCFunction)(void (*)(void))parse_inline, METH_FASTCALL, parse_inline_doc},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, configure_doc},
    {"request_frame", (PyCFunction)(void (*)(void))request_frame, METH_FASTCALL, request_frame_doc},
    {"ok_response", (PyCFunction)(void (*)(void))ok_response, METH_FASTCALL, ok_response_doc},
    {"unpack_body", (PyCFunction)unpack_body, METH_O, unpack_body_doc},
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
    if (!st->s_done || !st->s_set_result || !st->s_get_buffer_slow || !st->s_direct_updated || !st->s_compact ||
        !st->s_parse || !st->s_release_pages)
        return -1;
    st->core_type = PyType_FromModuleAndSpec(module, &core_spec, NULL);
    if (st->core_type == NULL || PyModule_AddObjectRef(module, "DecoderCore", st->core_type) < 0)
        return -1;
    st->deadlines_type = PyType_FromModuleAndSpec(module, &dl_spec, NULL);
    if (st->deadlines_type == NULL || PyModule_AddObjectRef(module, "DeadlinesCore", st->deadlines_type) < 0)
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

static int
speedups_traverse(PyObject *module, visitproc visit, void *arg)
{
    module_state *st = (module_state *)PyModule_GetState(module);
    Py_VISIT(st->s_done);
    Py_VISIT(st->s_set_result);
    Py_VISIT(st->s_get_buffer_slow);
    Py_VISIT(st->s_direct_updated);
    Py_VISIT(st->s_compact);
    Py_VISIT(st->s_parse);
    Py_VISIT(st->s_release_pages);
    Py_VISIT(st->frame_type);
    Py_VISIT(st->zero_trace);
    Py_VISIT(st->unpack);
    Py_VISIT(st->unpack_kwnames);
    Py_VISIT(st->unpack_kwvalues);
    Py_VISIT(st->request_frame_py);
    Py_VISIT(st->ok_response_py);
    Py_VISIT(st->unpack_body_py);
    Py_VISIT(st->core_type);
    Py_VISIT(st->deadlines_type);
    Py_VISIT(st->heappush);
    Py_VISIT(st->heapify);
    Py_VISIT(st->s_arm);
    Py_VISIT(st->s_compact_heap);
    Py_VISIT(st->s_idle);
    return 0;
}

static int
speedups_clear(PyObject *module)
{
    module_state *st = (module_state *)PyModule_GetState(module);
    Py_CLEAR(st->s_done);
    Py_CLEAR(st->s_set_result);
    Py_CLEAR(st->s_get_buffer_slow);
    Py_CLEAR(st->s_direct_updated);
    Py_CLEAR(st->s_compact);
    Py_CLEAR(st->s_parse);
    Py_CLEAR(st->s_release_pages);
    Py_CLEAR(st->frame_type);
    Py_CLEAR(st->zero_trace);
    Py_CLEAR(st->unpack);
    Py_CLEAR(st->unpack_kwnames);
    Py_CLEAR(st->unpack_kwvalues);
    Py_CLEAR(st->request_frame_py);
    Py_CLEAR(st->ok_response_py);
    Py_CLEAR(st->unpack_body_py);
    Py_CLEAR(st->core_type);
    Py_CLEAR(st->deadlines_type);
    Py_CLEAR(st->heappush);
    Py_CLEAR(st->heapify);
    Py_CLEAR(st->s_arm);
    Py_CLEAR(st->s_compact_heap);
    Py_CLEAR(st->s_idle);
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
