/* The Reader: a receive buffer and the one-line replies (status, number, version,
 * stats, noop), as protocol/reader.py parses them. */
#include "speedups.h"
#include <string.h>

#define RECV_MIN 65536

int
reader_reserve(Reader *r, Py_ssize_t extra)
{
    if (r->cap - r->end >= extra)
        return 0;
    Py_ssize_t live = r->end - r->start;
    if (r->start > 0) {
        memmove(r->buf, r->buf + r->start, (size_t)live);
        r->start = 0;
        r->end = live;
        if (r->cap - r->end >= extra)
            return 0;
    }
    Py_ssize_t cap = r->cap * 2;
    if (cap < live + extra)
        cap = live + extra;
    if (cap < RECV_MIN)
        cap = RECV_MIN;
    char *buf = PyMem_RawRealloc(r->buf, (size_t)cap);
    if (buf == NULL)
        return -1;
    r->buf = buf;
    r->cap = cap;
    return 0;
}

Py_ssize_t
find_crlf(const char *b, Py_ssize_t p, Py_ssize_t n)
{
    while (p + 1 < n) {
        const char *q = memchr(b + p, '\r', (size_t)(n - p - 1));
        if (q == NULL)
            return -1;
        if (q[1] == '\n')
            return q - b;
        p = q - b + 1;
    }
    return -1;
}

PyObject *
mismatch(const char *s, Py_ssize_t n)
{
    PyObject *head = PyBytes_FromStringAndSize(s, n < 64 ? n : 64);
    if (head == NULL)
        return NULL;
    PyObject *message = PyUnicode_FromFormat("reply %R does not answer the request", head);
    Py_DECREF(head);
    if (message != NULL) {
        PyErr_SetObject(B.ProtocolError, message);
        Py_DECREF(message);
    }
    return NULL;
}

static PyObject *
error_reply(PyObject *kind, const char *s, Py_ssize_t n, Py_ssize_t skip)
{
    if (skip > n)
        skip = n;
    PyObject *message = PyUnicode_DecodeUTF8(s + skip, n - skip, "replace");
    if (message == NULL)
        return NULL;
    PyObject *reply = PyObject_CallFunctionObjArgs(B.ErrorReply, kind, message, NULL);
    Py_DECREF(message);
    return reply;
}

static int
starts(const char *s, Py_ssize_t n, const char *prefix, Py_ssize_t len)
{
    return n >= len && memcmp(s, prefix, (size_t)len) == 0;
}

static int
equals(const char *s, Py_ssize_t n, const char *text, Py_ssize_t len)
{
    return n == len && memcmp(s, text, (size_t)len) == 0;
}

PyObject *
unexpected(const char *s, Py_ssize_t n)
{
    if (starts(s, n, "SERVER_ERROR", 12))
        return error_reply(B.k_server_error, s, n, 13);
    if (starts(s, n, "CLIENT_ERROR", 12))
        return error_reply(B.k_client_error, s, n, 13);
    if (equals(s, n, "ERROR", 5) || starts(s, n, "ERROR ", 6))
        return error_reply(B.k_error, s, n, 6);
    return mismatch(s, n);
}

/* The next whole line, consumed: 1 (its span in *s, *n), or 0 when not all here. */
static int
take_line(Reader *r, const char **s, Py_ssize_t *n)
{
    const char *b = r->buf + r->start;
    Py_ssize_t eol = find_crlf(b, 0, r->end - r->start);
    if (eol < 0) {
        r->need = 0;
        return 0;
    }
    *s = b;
    *n = eol;
    r->start += eol + 2;
    return 1;
}

static int
all_digits(const char *s, Py_ssize_t n)
{
    if (n == 0)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static PyObject *
digits_to_int(const char *s, Py_ssize_t n)
{
    if (n <= 18) {
        long long v = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            v = v * 10 + (s[i] - '0');
        return PyLong_FromLongLong(v);
    }
    PyObject *text = PyUnicode_DecodeASCII(s, n, "strict");
    if (text == NULL)
        return NULL;
    PyObject *v = PyLong_FromUnicodeObject(text, 10);
    Py_DECREF(text);
    return v;
}

/* -- methods --------------------------------------------------------------------- */

static PyObject *
reader_feed(Reader *r, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len > 0) {
        if (r->start == r->end)
            r->start = r->end = 0;
        if (reader_reserve(r, view.len) < 0) {
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
        memcpy(r->buf + r->end, view.buf, (size_t)view.len);
        r->end += view.len;
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

PyObject *
reader_drained(Reader *r, PyObject *unused)
{
    if (r->end > r->start) {
        r->need = 0;
        return mismatch(r->buf + r->start, r->end - r->start);
    }
    r->start = r->end = 0;
    if (r->cap > 4 * RECV_MIN) {  /* a large value's room is given back */
        char *buf = PyMem_RawRealloc(r->buf, RECV_MIN);
        if (buf != NULL) {
            r->buf = buf;
            r->cap = RECV_MIN;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *
reader_status(Reader *r, PyObject *valid)
{
    const char *s;
    Py_ssize_t n;
    if (!take_line(r, &s, &n))
        return Py_NewRef(B.NEED_DATA);
    PyObject *line = PyBytes_FromStringAndSize(s, n);
    if (line == NULL)
        return NULL;
    int found = PySequence_Contains(valid, line);
    if (found != 0) {
        if (found < 0)
            Py_CLEAR(line);
        return line;
    }
    Py_DECREF(line);
    return unexpected(s, n);
}

static PyObject *
reader_number(Reader *r, PyObject *unused)
{
    const char *s;
    Py_ssize_t n;
    if (!take_line(r, &s, &n))
        return Py_NewRef(B.NEED_DATA);
    if (all_digits(s, n))
        return digits_to_int(s, n);
    if (equals(s, n, "NOT_FOUND", 9))
        Py_RETURN_NONE;
    return unexpected(s, n);
}

static PyObject *
reader_version(Reader *r, PyObject *unused)
{
    const char *s;
    Py_ssize_t n;
    if (!take_line(r, &s, &n))
        return Py_NewRef(B.NEED_DATA);
    if (starts(s, n, "VERSION ", 8))
        return PyUnicode_DecodeASCII(s + 8, n - 8, "replace");
    return unexpected(s, n);
}

static PyObject *
reader_stats(Reader *r, PyObject *unused)
{
    const char *s;
    Py_ssize_t n;
    for (;;) {
        if (!take_line(r, &s, &n))
            return Py_NewRef(B.NEED_DATA);
        if (r->stats == NULL && (r->stats = PyDict_New()) == NULL)
            return NULL;
        if (starts(s, n, "STAT ", 5)) {
            const char *rest = s + 5, *space = memchr(rest, ' ', (size_t)(n - 5));
            Py_ssize_t name_len = space ? space - rest : n - 5;
            Py_ssize_t value_off = space ? name_len + 1 : n - 5;
            PyObject *name = PyUnicode_DecodeASCII(rest, name_len, "replace");
            PyObject *value = PyUnicode_DecodeASCII(rest + value_off, n - 5 - value_off, "replace");
            int failed = name == NULL || value == NULL || PyDict_SetItem(r->stats, name, value) < 0;
            Py_XDECREF(name);
            Py_XDECREF(value);
            if (failed)
                return NULL;
            continue;
        }
        PyObject *stats = r->stats;
        r->stats = NULL;
        if (equals(s, n, "END", 3))
            return stats;
        Py_DECREF(stats);
        return unexpected(s, n);
    }
}

static PyObject *
reader_noop(Reader *r, PyObject *unused)
{
    const char *s;
    Py_ssize_t n;
    if (!take_line(r, &s, &n))
        return Py_NewRef(B.NEED_DATA);
    if (equals(s, n, "MN", 2)) {
        PyObject *status = PyBytes_FromStringAndSize("MN", 2);
        if (status == NULL)
            return NULL;
        PyObject *reply = PyObject_CallOneArg(B.MetaReply, status);
        Py_DECREF(status);
        return reply;
    }
    return unexpected(s, n);
}

static PyObject *
reader_buffered(Reader *r, void *unused)
{
    return PyLong_FromSsize_t(r->end - r->start);
}

static PyObject *
reader_wanted(Reader *r, void *unused)
{
    Py_ssize_t wanted = r->need - (r->end - r->start);
    return PyLong_FromSsize_t(wanted > 0 ? wanted : 0);
}

/* -- the type ---------------------------------------------------------------------- */

static int
reader_init(Reader *r, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"data", NULL};
    Py_buffer data = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|y*:Reader", names, &data))
        return -1;
    if (!B.bound) {
        PyErr_SetString(PyExc_RuntimeError, "the compiled reader is not bound: import compiled.py");
        PyBuffer_Release(&data);
        return -1;
    }
    r->start = r->end = r->need = 0;
    values_reset(r);
    Py_CLEAR(r->stats);
    int failed = 0;
    if (data.buf != NULL && data.len > 0) {
        if (reader_reserve(r, data.len) < 0)
            failed = 1;
        else {
            memcpy(r->buf, data.buf, (size_t)data.len);
            r->end = data.len;
        }
    }
    if (data.buf != NULL)
        PyBuffer_Release(&data);
    if (failed)
        PyErr_NoMemory();
    return failed ? -1 : 0;
}

static void
reader_dealloc(Reader *r)
{
    values_reset(r);
    Py_CLEAR(r->stats);
    PyMem_RawFree(r->buf);
    PyMem_RawFree(r->out);
    PyMem_RawFree(r->entries);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMethodDef reader_methods[] = {
    {"feed", (PyCFunction)reader_feed, METH_O, "Add bytes received from the server."},
    {"drained", (PyCFunction)reader_drained, METH_NOARGS,
     "Raise ProtocolError if bytes nobody asked for follow the replies."},
    {"status", (PyCFunction)reader_status, METH_O, "A one-line status among valid."},
    {"number", (PyCFunction)reader_number, METH_NOARGS, "incr/decr: digits, or NOT_FOUND (None)."},
    {"version", (PyCFunction)reader_version, METH_NOARGS, "version's text."},
    {"stats", (PyCFunction)reader_stats, METH_NOARGS, "STAT <name> <value> lines up to END."},
    {"values", (PyCFunction)reader_values, METH_VARARGS, "VALUE blocks up to END."},
    {"meta", (PyCFunction)reader_meta, METH_O, "A meta reply to request."},
    {"noop", (PyCFunction)reader_noop, METH_NOARGS, "mn's MN."},
    {"request", (PyCFunction)reader_request, METH_VARARGS,
     "request(fd, request, timeout): send one request on a blocking socket, return its reply."},
    {"send", (PyCFunction)reader_send, METH_VARARGS, "send(fd, data, timeout): write it all."},
    {"receive", (PyCFunction)reader_receive, METH_VARARGS,
     "receive(fd, requests, timeout): the replies to requests sent before, in order."},
    {NULL},
};

static PyGetSetDef reader_getset[] = {
    {"buffered", (getter)reader_buffered, NULL, "Bytes received and not yet parsed.", NULL},
    {"wanted", (getter)reader_wanted, NULL, "Bytes still missing for the awaited piece.", NULL},
    {NULL},
};

PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "django_mcpatterns.core.protocol._speedups.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Parse replies from the bytes fed so far, one request at a time (compiled).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
    .tp_getset = reader_getset,
};
