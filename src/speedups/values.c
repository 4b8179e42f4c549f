/* A get's reply: VALUE blocks up to END, each key asked for answered at most once.
 *
 * values_scan() runs without the GIL (io.c calls it between receives): it checks
 * the blocks and notes where each one's parts lie; values_finish() makes them
 * Value tuples.  Parsed as protocol/reader.py's Reader.values parses them. */
#include "speedups.h"
#include <string.h>

void
values_reset(Reader *r)
{
    Py_CLEAR(r->found);
    for (Py_ssize_t i = 0; i < r->nkeys; i++)
        Py_DECREF(r->keys[i]);
    PyMem_Free(r->keys);
    PyMem_Free(r->answered);
    PyMem_Free(r->table);
    r->keys = NULL;
    r->answered = NULL;
    r->table = NULL;
    r->nkeys = 0;
    r->tmask = 0;
    r->vpos = 0;
    r->nentries = 0;
}

static unsigned long long
hash_key(const char *s, Py_ssize_t n)
{
    unsigned long long h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

/* The index of key s[:n] among the keys asked for, or -1. */
static Py_ssize_t
lookup(Reader *r, const char *s, Py_ssize_t n)
{
    if (r->table == NULL) {
        for (Py_ssize_t i = 0; i < r->nkeys; i++) {
            PyObject *k = r->keys[i];
            if (PyBytes_GET_SIZE(k) == n && memcmp(PyBytes_AS_STRING(k), s, (size_t)n) == 0)
                return i;
        }
        return -1;
    }
    for (size_t slot = (size_t)hash_key(s, n) & (size_t)r->tmask;; slot = (slot + 1) & (size_t)r->tmask) {
        Py_ssize_t i = r->table[slot] - 1;
        if (i < 0)
            return -1;
        PyObject *k = r->keys[i];
        if (PyBytes_GET_SIZE(k) == n && memcmp(PyBytes_AS_STRING(k), s, (size_t)n) == 0)
            return i;
    }
}

int
values_begin(Reader *r, PyObject *keys, int cas)
{
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    r->keys = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n ? n : 1));
    r->answered = PyMem_Calloc((size_t)(n ? n : 1), 1);
    if (r->keys == NULL || r->answered == NULL)
        goto nomem;
    r->nkeys = 0;
    if (n > 8) {
        Py_ssize_t size = 16;
        while (size < 2 * n)
            size *= 2;
        r->table = PyMem_Calloc((size_t)size, sizeof(Py_ssize_t));
        if (r->table == NULL)
            goto nomem;
        r->tmask = size - 1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = items[i];
        if (!PyBytes_Check(k)) {  /* hashable or not, as a set() of them says; never matches */
            if (PyObject_Hash(k) == -1)
                goto fail;
            continue;
        }
        const char *s = PyBytes_AS_STRING(k);
        Py_ssize_t len = PyBytes_GET_SIZE(k);
        if (lookup(r, s, len) >= 0)
            continue;  /* a key twice: one answer, as a set of them */
        r->keys[r->nkeys] = Py_NewRef(k);
        if (r->table != NULL) {
            size_t slot = (size_t)hash_key(s, len) & (size_t)r->tmask;
            while (r->table[slot])
                slot = (slot + 1) & (size_t)r->tmask;
            r->table[slot] = r->nkeys + 1;
        }
        r->nkeys++;
    }
    Py_DECREF(seq);
    r->found = PyList_New(0);
    if (r->found == NULL)
        return -1;
    r->cas = cas;
    r->vpos = 0;
    r->nentries = 0;
    return 0;
nomem:
    PyErr_NoMemory();
fail:
    Py_DECREF(seq);
    values_reset(r);
    return -1;
}

static int
is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

static int
digits(const char *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return n > 0;
}

static int
add_entry(Reader *r, Entry *e)
{
    if (r->nentries == r->centries) {
        Py_ssize_t c = r->centries ? 2 * r->centries : 16;
        Entry *entries = PyMem_RawRealloc(r->entries, sizeof(Entry) * (size_t)c);
        if (entries == NULL)
            return -1;
        r->entries = entries;
        r->centries = c;
    }
    r->entries[r->nentries++] = *e;
    return 0;
}

/* No GIL: scan from vpos; SCAN_NEED (need set), SCAN_LINE (the line that is no VALUE
 * block, at line_off) or SCAN_MISMATCH (its span at line_off; line_len -1: no memory). */
int
values_scan(Reader *r)
{
    const char *b = r->buf + r->start;
    Py_ssize_t n = r->end - r->start, p = r->vpos;
    int width = r->cas ? 5 : 4;
    for (;;) {
        Py_ssize_t eol = find_crlf(b, p, n);
        if (eol < 0) {
            r->vpos = p;
            r->need = 0;
            return SCAN_NEED;
        }
        if (!(eol - p >= 6 && memcmp(b + p, "VALUE ", 6) == 0)) {
            r->vpos = p;
            r->line_off = p;
            r->line_len = eol - p;
            return SCAN_LINE;
        }
        Py_ssize_t off[5], len[5];
        int count = 0;
        for (Py_ssize_t i = p; i < eol;) {
            while (i < eol && is_space(b[i]))
                i++;
            if (i >= eol)
                break;
            Py_ssize_t s = i;
            while (i < eol && !is_space(b[i]))
                i++;
            if (count == width) {
                count++;
                break;
            }
            off[count] = s;
            len[count] = i - s;
            count++;
        }
        Py_ssize_t k = -1;
        if (count == width && digits(b + off[2], len[2]) && digits(b + off[3], len[3])
            && len[3] <= 18 && (width == 4 || digits(b + off[4], len[4])))
            k = lookup(r, b + off[1], len[1]);
        if (k < 0 || r->answered[k]) {
            r->line_off = p;
            r->line_len = eol - p;
            return SCAN_MISMATCH;
        }
        long long size = 0;
        for (Py_ssize_t i = 0; i < len[3]; i++)
            size = size * 10 + (b[off[3] + i] - '0');
        if (size > MAX_VALUE_LENGTH) {
            r->line_off = p;
            r->line_len = eol - p;
            return SCAN_MISMATCH;
        }
        Py_ssize_t start = eol + 2, end = start + (Py_ssize_t)size;
        if (end + 2 > n) {
            r->vpos = p;
            r->need = end + 2;  /* from start, as receive_more reads it */
            return SCAN_NEED;
        }
        if (b[end] != '\r' || b[end + 1] != '\n') {
            r->line_off = end;
            r->line_len = 2;
            return SCAN_MISMATCH;
        }
        Entry e = {k, off[2], len[2], start, end - start, width == 5 ? off[4] : 0,
                   width == 5 ? len[4] : -1};
        if (add_entry(r, &e) < 0) {
            r->line_len = -1;
            return SCAN_MISMATCH;
        }
        r->answered[k] = 1;
        p = end + 2;
        r->vpos = p;
    }
}

static PyObject *
make_value(Reader *r, Entry *e)
{
    const char *b = r->buf + r->start;
    PyObject *key = r->keys[e->key];
    PyObject *v = ((PyTypeObject *)B.Value)->tp_alloc((PyTypeObject *)B.Value, 4);
    if (v == NULL)
        return NULL;
    PyObject *flags, *data, *cas;
    if (PyBytes_CheckExact(key))
        Py_INCREF(key);
    else
        key = PyBytes_FromStringAndSize(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
    PyTuple_SET_ITEM(v, 0, key);
    if (e->flags_len <= 18) {
        long long f = 0;
        for (Py_ssize_t i = 0; i < e->flags_len; i++)
            f = f * 10 + (b[e->flags_off + i] - '0');
        flags = PyLong_FromLongLong(f);
    }
    else {
        PyObject *text = PyUnicode_DecodeASCII(b + e->flags_off, e->flags_len, "strict");
        flags = text ? PyLong_FromUnicodeObject(text, 10) : NULL;
        Py_XDECREF(text);
    }
    PyTuple_SET_ITEM(v, 1, flags);
    data = PyBytes_FromStringAndSize(b + e->data_off, e->data_len);
    PyTuple_SET_ITEM(v, 2, data);
    cas = e->cas_len < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize(b + e->cas_off, e->cas_len);
    PyTuple_SET_ITEM(v, 3, cas);
    if (key == NULL || flags == NULL || data == NULL || cas == NULL) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
}

/* GIL: make the scanned blocks Values and answer as the scan ended. */
PyObject *
values_finish(Reader *r, int state)
{
    if (state == SCAN_MISMATCH) {
        PyObject *error = r->line_len < 0 ? PyErr_NoMemory()
                                          : mismatch(r->buf + r->start + r->line_off, r->line_len);
        values_reset(r);
        return error;
    }
    for (Py_ssize_t i = 0; i < r->nentries; i++) {
        PyObject *v = make_value(r, &r->entries[i]);
        if (v == NULL || PyList_Append(r->found, v) < 0) {
            Py_XDECREF(v);
            values_reset(r);
            return NULL;
        }
        Py_DECREF(v);
    }
    r->nentries = 0;
    r->start += r->vpos;  /* the blocks made are consumed */
    if (r->need > 0)
        r->need -= r->vpos;
    r->vpos = 0;
    if (state == SCAN_NEED)
        return Py_NewRef(B.NEED_DATA);
    const char *line = r->buf + r->start;
    Py_ssize_t n = r->line_len;
    r->start += n + 2;
    r->need = 0;
    PyObject *found = Py_NewRef(r->found);
    values_reset(r);
    if (n == 3 && memcmp(line, "END", 3) == 0)
        return found;
    Py_DECREF(found);
    return unexpected(line, n);
}

PyObject *
reader_values(Reader *r, PyObject *args)
{
    PyObject *keys, *cas_arg;
    if (!PyArg_ParseTuple(args, "OO:values", &keys, &cas_arg))
        return NULL;
    if (r->found == NULL) {
        int cas = PyObject_IsTrue(cas_arg);
        if (cas < 0 || values_begin(r, keys, cas) < 0)
            return NULL;
    }
    return values_finish(r, values_scan(r));
}
