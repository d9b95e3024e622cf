/* svcframe._speedups: the per-frame hot loop of svcframe.wire.FrameDecoder in C.
 *
 * One function, parse_inline, the compiled twin of the two branches of FrameDecoder._parse that most frames
 * take: a complete, valid frame with an inline body, and a complete bulk data frame (a read's data, under
 * ``data_max`` bytes) that is first in its batch, whose bytes go where the decoder's bulk sink says. It appends
 * those frames to a list and returns the offset of the first frame it did not take. It takes a frame only where
 * the Python loop would append the very same Frame (and call the sink the same way); anything else (an
 * incomplete header or body, a bulk data frame behind other frames or without a sink, a body over the receive
 * buffer, a bad header) is left where it starts, for FrameDecoder._parse, which has the whole of the semantics
 * and the error messages. So the pure-Python decoder stays the definition, and tests/test_speedups.py checks
 * the two agree on valid, truncated and hostile input.
 *
 * Bounded by what was received: it reads only below ``end``, which the caller keeps within the buffer, and a
 * body is copied only when all of it is there (length <= max_body, checked before); a bulk data body is
 * copied only into a destination of exactly its length.
 *
 * Measured (tools/instructions_per_client_call.sh, tools/instructions_per_call.sh): see README "Performance".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 80
#define FRAME_FIELDS 14
#define MAGIC_INT 0x4653u /* b"SF" little-endian */
#define WIRE_VERSION 1
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

static PyObject *
parse_inline(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
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
    PyTypeObject *frame_type = (PyTypeObject *)args[6];
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
    const unsigned char *base = (const unsigned char *)view.buf;
    while (end - start >= HEADER_SIZE) {
        const unsigned char *p = base + start;
        unsigned kind = p[3];
        uint32_t length = rd32(p + 12);
        if (rd16(p) != MAGIC_INT || p[2] != WIRE_VERSION || rd32(p + 36) != 0 || kind >= 64 ||
            !((legal >> kind) & 1) || (long long)length > max_body || (Py_ssize_t)length > end - start - HEADER_SIZE)
            break; /* not ours to take: the Python loop decides */
        int data = kind == K_BULK_DATA_REPLY || kind == K_BULK_DATA_PUSH;
        if (data) {
            /* first in its batch (the frames before it may set up its sink: they are dispatched first), small
             * (after a large chunk the decoder reads header first), and a sink to ask */
            if (sink == Py_None || PyList_GET_SIZE(frames) || (long long)length >= data_max)
                break;
            if (sink_data(sink, kind, p, (Py_ssize_t)length) < 0) {
                PyBuffer_Release(&view);
                return NULL;
            }
        }
        PyObject *frame = new_frame(frame_type, p, (Py_ssize_t)length, zero_trace, data);
        if (frame == NULL) {
            PyBuffer_Release(&view);
            return NULL;
        }
        int rc = PyList_Append(frames, frame);
        Py_DECREF(frame);
        if (rc < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        start += HEADER_SIZE + (Py_ssize_t)length;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(start);
}

static PyMethodDef speedups_methods[] = {
    {"parse_inline", (PyCFunction)(void (*)(void))parse_inline, METH_FASTCALL, parse_inline_doc},
    {NULL, NULL, 0, NULL},
};

#ifndef SVCFRAME_SOURCE_SHA256
#define SVCFRAME_SOURCE_SHA256 "unknown"
#endif

static int
speedups_exec(PyObject *module)
{
    /* the SHA-256 of the source this was compiled from (hatch_build.py): a stale build is found by a test */
    return PyModule_AddStringConstant(module, "SOURCE_SHA256", SVCFRAME_SOURCE_SHA256);
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
    "The compiled hot loop of svcframe.wire.FrameDecoder (optional: svcframe runs without it).",
    0,
    speedups_methods,
    speedups_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&speedups_module);
}
