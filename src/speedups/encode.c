/* Requests to bytes: get/gets and the storage commands in C (protocol/wire.py's encode()
 * methods are the reference), any other request through its own encode(). */
#include "speedups.h"
#include <string.h>

#define OUT_KEPT (4 * 65536)  /* the send buffer kept between requests, at most */

static int
out_reserve(Reader *r, Py_ssize_t extra)
{
    if (r->out_cap - r->out_len >= extra)
        return 0;
    Py_ssize_t cap = r->out_cap * 2;
    if (cap < r->out_len + extra)
        cap = r->out_len + extra;
    if (cap < 1024)
        cap = 1024;
    char *out = PyMem_RawRealloc(r->out, (size_t)cap);
    if (out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    r->out = out;
    r->out_cap = cap;
    return 0;
}

/* After a request is sent: a large one's room is given back (a pooled connection
 * would keep the largest set's bytes for its lifetime otherwise). */
void
encode_release(Reader *r)
{
    r->out_len = 0;
    if (r->out_cap > OUT_KEPT) {
        PyMem_RawFree(r->out);
        r->out = NULL;
        r->out_cap = 0;
    }
}

static int
put(Reader *r, const char *s, Py_ssize_t n)
{
    if (out_reserve(r, n) < 0)
        return -1;
    memcpy(r->out + r->out_len, s, (size_t)n);
    r->out_len += n;
    return 0;
}

/* 1: encoded; 0: not a case for C (the request's own encode() decides); -1: error. */
static int
encode_get(Reader *r, PyObject *request)
{
    PyObject *keys = PyObject_GetAttr(request, B.s_keys);
    PyObject *cas = keys ? PyObject_GetAttr(request, B.s_cas) : NULL;
    PyObject *seq = cas ? PySequence_Fast(keys, "keys") : NULL;
    int done = -1;
    if (seq == NULL)
        goto out;
    int gets = PyObject_IsTrue(cas);
    if (gets < 0)
        goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = (gets ? 5 : 4) + 2 + (n ? n - 1 : 0);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_CheckExact(items[i])) {
            done = 0;
            goto out;
        }
        total += PyBytes_GET_SIZE(items[i]);
    }
    if (out_reserve(r, total) < 0)
        goto out;
    char *o = r->out + r->out_len;
    memcpy(o, gets ? "gets " : "get ", gets ? 5 : 4);
    o += gets ? 5 : 4;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i) *o++ = ' ';
        memcpy(o, PyBytes_AS_STRING(items[i]), (size_t)PyBytes_GET_SIZE(items[i]));
        o += PyBytes_GET_SIZE(items[i]);
    }
    *o++ = '\r';
    *o++ = '\n';
    r->out_len += total;
    done = 1;
out:
    if (done < 0 && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_TypeError))
        PyErr_Clear(), done = 0;  /* the Python encode() raises what it raises */
    Py_XDECREF(keys);
    Py_XDECREF(cas);
    Py_XDECREF(seq);
    return done;
}

/* " <v>": a space and v in decimal, as printf's " %lld" writes it (without printf's
 * format parsing: a fifth of a set's encoding). */
static int
put_number(Reader *r, long long v)
{
    char text[24];
    char *end = text + sizeof text, *p = end;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    *--p = ' ';
    return put(r, p, end - p);
}

static int
as_long(PyObject *v, long long *out)
{
    if (!PyLong_Check(v))
        return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow && !(*out == -1 && PyErr_Occurred());
}

static int
encode_store(Reader *r, PyObject *request)
{
    PyObject *command = PyObject_GetAttr(request, B.s_command);
    PyObject *key = command ? PyObject_GetAttr(request, B.s_key) : NULL;
    PyObject *data = key ? PyObject_GetAttr(request, B.s_data) : NULL;
    PyObject *flags = data ? PyObject_GetAttr(request, B.s_flags) : NULL;
    PyObject *expire = flags ? PyObject_GetAttr(request, B.s_expire) : NULL;
    PyObject *token = expire ? PyObject_GetAttr(request, B.s_cas_token) : NULL;
    int done = token ? 0 : -1, verb = -1;
    long long f, e, c = 0;
    if (token == NULL)
        goto out;
    for (int i = 0; i < 6; i++)
        if (command == B.verbs[i] || (PyUnicode_CheckExact(command)
                                      && PyUnicode_Compare(command, B.verbs[i]) == 0))
            verb = i;
    if (verb < 0 || !PyBytes_CheckExact(key) || !PyBytes_CheckExact(data) || !as_long(flags, &f)
        || !as_long(expire, &e))
        goto out;
    int is_cas = verb == 5, token_bytes = is_cas && PyBytes_Check(token);
    if (is_cas && !token_bytes && token != Py_None && !as_long(token, &c))
        goto out;
    static const char *names[] = {"set ", "add ", "replace ", "append ", "prepend ", "cas "};
    Py_ssize_t klen = PyBytes_GET_SIZE(key), dlen = PyBytes_GET_SIZE(data);
    if (put(r, names[verb], (Py_ssize_t)strlen(names[verb])) < 0
        || put(r, PyBytes_AS_STRING(key), klen) < 0)
        goto fail;
    if (put_number(r, f) < 0 || put_number(r, e) < 0 || put_number(r, (long long)dlen) < 0)
        goto fail;
    if (token_bytes) {
        if (put(r, " ", 1) < 0 || put(r, PyBytes_AS_STRING(token), PyBytes_GET_SIZE(token)) < 0)
            goto fail;
    }
    else if (is_cas) {
        if (put_number(r, c) < 0)
            goto fail;
    }
    if (put(r, "\r\n", 2) < 0 || put(r, PyBytes_AS_STRING(data), dlen) < 0 || put(r, "\r\n", 2) < 0)
        goto fail;
    done = 1;
    goto out;
fail:
    done = -1;
out:
    if (done == 0 && PyErr_Occurred())
        PyErr_Clear();
    Py_XDECREF(command);
    Py_XDECREF(key);
    Py_XDECREF(data);
    Py_XDECREF(flags);
    Py_XDECREF(expire);
    Py_XDECREF(token);
    return done;
}

int
encode_into(Reader *r, PyObject *request, int append)
{
    if (!append)
        r->out_len = 0;
    Py_ssize_t mark = r->out_len;
    PyTypeObject *type = Py_TYPE(request);
    int done = 0;
    if ((PyObject *)type == B.Get)
        done = encode_get(r, request);
    else if ((PyObject *)type == B.Store)
        done = encode_store(r, request);
    if (done != 0) {
        if (done < 0)
            r->out_len = mark;
        return done < 0 ? -1 : 0;
    }
    r->out_len = mark;
    PyObject *encoded = PyObject_CallMethodNoArgs(request, B.s_encode);
    if (encoded == NULL)
        return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(encoded, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(encoded);
        return -1;
    }
    int failed = put(r, view.buf, view.len);
    PyBuffer_Release(&view);
    Py_DECREF(encoded);
    return failed;
}

PyObject *
speedups_encode(PyObject *module, PyObject *requests)
{
    Reader scratch;
    memset(&scratch, 0, sizeof scratch);
    PyObject *seq = PySequence_Fast(requests, "encode() takes a sequence of requests");
    if (seq == NULL)
        return NULL;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++)
        if (encode_into(&scratch, PySequence_Fast_GET_ITEM(seq, i), 1) < 0)
            goto done;
    result = PyBytes_FromStringAndSize(scratch.out ? scratch.out : "", scratch.out_len);
done:
    Py_DECREF(seq);
    PyMem_RawFree(scratch.out);
    return result;
}
