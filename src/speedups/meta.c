/* A meta command's reply (mg, ms, md, ma), as protocol/reader.py's Reader.meta parses it. */
#include "speedups.h"
#include <string.h>

static const char *STATUSES[] = {"VA", "HD", "EN", "NS", "EX", "NF", "MN"};
static const char NUMERIC[] = "ctfshl";

static int
is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

static int
numeric(const char *s, Py_ssize_t n)
{
    if (n > 0 && s[0] == '-') {
        s++;
        n--;
    }
    if (n == 0)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static PyObject *
meta_line(Reader *r, PyObject *request, const char *b, Py_ssize_t eol, Py_ssize_t *off,
          Py_ssize_t *len, Py_ssize_t count)
{
    const char *line = b;
    PyObject *status = NULL, *flags = NULL, *data = NULL, *reply = NULL;
    int known = 0;
    if (count > 0 && len[0] == 2)
        for (int i = 0; i < 7; i++)
            if (memcmp(b + off[0], STATUSES[i], 2) == 0)
                known = 1;
    if (!known) {
        r->start += eol + 2;
        return unexpected(line, eol);
    }
    int va = memcmp(b + off[0], "VA", 2) == 0;
    int mn = memcmp(b + off[0], "MN", 2) == 0;
    if (va && count < 2)
        return mismatch(line, eol);
    if ((flags = PyDict_New()) == NULL)
        return NULL;
    for (Py_ssize_t i = va ? 2 : 1; i < count; i++) {
        char letter = b[off[i]];
        if (!((letter >= 'a' && letter <= 'z') || (letter >= 'A' && letter <= 'Z'))) {
            mismatch(b + off[i], len[i]);
            goto done;
        }
        PyObject *name = PyUnicode_FromStringAndSize(&letter, 1);
        PyObject *token = PyBytes_FromStringAndSize(b + off[i] + 1, len[i] - 1);
        int failed = name == NULL || token == NULL || PyDict_SetItem(flags, name, token) < 0;
        Py_XDECREF(name);
        Py_XDECREF(token);
        if (failed)
            goto done;
    }
    int ours = 0;
    if (!mn) {
        PyObject *matched = PyObject_CallMethodOneArg(request, B.s_matches, flags);
        if (matched == NULL)
            goto done;
        ours = PyObject_IsTrue(matched);
        Py_DECREF(matched);
        if (ours < 0)
            goto done;
    }
    if ((status = PyBytes_FromStringAndSize(b + off[0], 2)) == NULL)
        goto done;
    if (!ours) {
        PyObject *quiet = PyObject_GetAttr(request, B.s_quiet);
        int is_quiet = quiet == NULL ? -1 : PyObject_IsTrue(quiet);
        Py_XDECREF(quiet);
        if (is_quiet < 0)
            goto done;
        if (is_quiet) {  /* a reply left for a later request */
            PyObject *quieted = PyObject_GetAttr(request, B.s_QUIETED);
            PyObject *args = quieted ? PyTuple_Pack(1, quieted) : NULL;
            PyObject *kwargs = args ? Py_BuildValue("{s:O}", "quiet", Py_True) : NULL;
            if (kwargs != NULL)
                reply = PyObject_Call(B.MetaReply, args, kwargs);
            Py_XDECREF(quieted);
            Py_XDECREF(args);
            Py_XDECREF(kwargs);
            goto done;
        }
        mismatch(line, eol);
        goto done;
    }
    PyObject *valid = PyObject_GetAttr(request, B.s_STATUSES);
    int allowed = valid == NULL ? -1 : PySequence_Contains(valid, status);
    Py_XDECREF(valid);
    if (allowed <= 0) {
        if (allowed == 0)
            mismatch(line, eol);
        goto done;
    }
    for (const char *c = NUMERIC; *c; c++) {
        for (Py_ssize_t i = va ? 2 : 1; i < count; i++) {
            if (b[off[i]] != *c)
                continue;
            /* the last token of a letter is the one kept (a dict) */
            Py_ssize_t last = i;
            for (Py_ssize_t j = i + 1; j < count; j++)
                if (b[off[j]] == *c)
                    last = j;
            if (!numeric(b + off[last] + 1, len[last] - 1)) {
                mismatch(line, eol);
                goto done;
            }
            break;
        }
    }
    Py_ssize_t end = eol + 2;
    if (va) {
        const char *size = b + off[1];
        long long v = 0;
        int ok = len[1] > 0 && len[1] <= 18;
        for (Py_ssize_t i = 0; ok && i < len[1]; i++) {
            if (size[i] < '0' || size[i] > '9')
                ok = 0;
            else
                v = v * 10 + (size[i] - '0');
        }
        if (!ok || v > MAX_VALUE_LENGTH) {
            mismatch(size, len[1]);
            goto done;
        }
        end += (Py_ssize_t)v;
        if (end + 2 > r->end - r->start) {
            r->need = end + 2;
            reply = Py_NewRef(B.NEED_DATA);
            goto done;
        }
        if (b[end] != '\r' || b[end + 1] != '\n') {
            mismatch(b + end, 2);
            goto done;
        }
        if ((data = PyBytes_FromStringAndSize(b + eol + 2, end - eol - 2)) == NULL)
            goto done;
        end += 2;
    }
    if (B.MetaReplyMaker != NULL) {  /* each field by its slot: no dataclass __init__ */
        PyObject *fields[] = {status, flags, data ? data : Py_None, Py_False};
        reply = PyObject_Vectorcall(B.MetaReplyMaker, fields, 4, NULL);
    }
    else
        reply = PyObject_CallFunctionObjArgs(B.MetaReply, status, flags, data ? data : Py_None,
                                             NULL);
    if (reply != NULL) {
        r->need = 0;
        r->start += end;
    }
done:
    Py_XDECREF(status);
    Py_XDECREF(flags);
    Py_XDECREF(data);
    return reply;
}

PyObject *
reader_meta(Reader *r, PyObject *request)
{
    const char *b = r->buf + r->start;
    Py_ssize_t eol = find_crlf(b, 0, r->end - r->start);
    if (eol < 0) {
        r->need = 0;
        return Py_NewRef(B.NEED_DATA);
    }
    Py_ssize_t small_off[32], small_len[32], *off = small_off, *len = small_len;
    Py_ssize_t count = 0, room = 32;
    PyObject *reply = NULL;
    for (Py_ssize_t i = 0; i < eol;) {
        while (i < eol && is_space(b[i]))
            i++;
        if (i >= eol)
            break;
        if (count == room) {
            room *= 2;
            Py_ssize_t *o = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)room);
            Py_ssize_t *l = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)room);
            if (o == NULL || l == NULL) {
                PyMem_Free(o);
                PyMem_Free(l);
                PyErr_NoMemory();
                goto done;
            }
            memcpy(o, off, sizeof(Py_ssize_t) * (size_t)count);
            memcpy(l, len, sizeof(Py_ssize_t) * (size_t)count);
            if (off != small_off) {
                PyMem_Free(off);
                PyMem_Free(len);
            }
            off = o;
            len = l;
        }
        off[count] = i;
        while (i < eol && !is_space(b[i]))
            i++;
        len[count] = i - off[count];
        count++;
    }
    reply = meta_line(r, request, b, eol, off, len, count);
done:
    if (off != small_off) {
        PyMem_Free(off);
        PyMem_Free(len);
    }
    return reply;
}
