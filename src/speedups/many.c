/* The per-key bookkeeping of multi-key commands: the wire bytes of many keys, and a
 * get's values decoded by key.  Each answers as its Python twin in compiled.py. */
#include "speedups.h"

#define MAX_KEY_LENGTH 250  /* memcached's KEY_MAX_LENGTH (keys.py) */

/* keyed(keys, placed): {wire bytes: key as given}; a plain printable ASCII str key is
 * encoded here, any other goes to placed() (keys.py), which checks or refuses it. */
PyObject *
speedups_keyed(PyObject *module, PyObject *args)
{
    PyObject *keys, *placed;
    if (!PyArg_ParseTuple(args, "OO:keyed", &keys, &placed))
        return NULL;
    PyObject *iter = PyObject_GetIter(keys), *given = iter ? PyDict_New() : NULL, *key;
    if (given == NULL) {
        Py_XDECREF(iter);
        return NULL;
    }
    while ((key = PyIter_Next(iter)) != NULL) {
        PyObject *kb = NULL;
        Py_ssize_t n;
        if (PyUnicode_CheckExact(key) && PyUnicode_IS_ASCII(key)
            && (n = PyUnicode_GET_LENGTH(key)) > 0 && n <= MAX_KEY_LENGTH) {
            const Py_UCS1 *s = PyUnicode_1BYTE_DATA(key);
            Py_ssize_t i = 0;
            while (i < n && s[i] > 0x20 && s[i] < 0x7f)
                i++;
            if (i == n)
                kb = PyBytes_FromStringAndSize((const char *)s, n);
        }
        if (kb == NULL && !PyErr_Occurred()) {
            PyObject *pair = PyObject_CallOneArg(placed, key);
            if (pair != NULL) {
                kb = PySequence_GetItem(pair, 0);
                Py_DECREF(pair);
            }
        }
        int failed = kb == NULL || PyDict_SetItem(given, kb, key) < 0;
        Py_XDECREF(kb);
        Py_DECREF(key);
        if (failed) {
            Py_DECREF(iter);
            Py_DECREF(given);
            return NULL;
        }
    }
    Py_DECREF(iter);
    if (PyErr_Occurred()) {
        Py_DECREF(given);
        return NULL;
    }
    return given;
}

/* placed(fallback, key): (wire, ring) of keys.py's placed(); a plain printable ASCII str
 * key is encoded here (its wire and ring bytes are the same), any other goes to
 * fallback (keys.py's placed), which checks, routes or refuses it.  The fallback comes
 * first: compiled.py binds it with functools.partial. */
PyObject *
speedups_placed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "placed(fallback, key)");
        return NULL;
    }
    PyObject *key = args[1];
    Py_ssize_t n;
    if (PyUnicode_CheckExact(key) && PyUnicode_IS_ASCII(key)
        && (n = PyUnicode_GET_LENGTH(key)) > 0 && n <= MAX_KEY_LENGTH) {
        const Py_UCS1 *s = PyUnicode_1BYTE_DATA(key);
        Py_ssize_t i = 0;
        while (i < n && s[i] > 0x20 && s[i] < 0x7f)
            i++;
        if (i == n) {
            PyObject *kb = PyBytes_FromStringAndSize((const char *)s, n);
            if (kb == NULL)
                return NULL;
            PyObject *pair = PyTuple_Pack(2, kb, kb);
            Py_DECREF(kb);
            return pair;
        }
    }
    return PyObject_CallOneArg(args[0], key);
}

/* decoded(values, direct, deserialize, cas): {key: value} (or (value, cas)); a value whose
 * flags have a direct decoder gets it (one raising ValueError goes to deserialize). */
PyObject *
speedups_decoded(PyObject *module, PyObject *args)
{
    PyObject *values, *direct, *deserialize;
    int cas;
    if (!PyArg_ParseTuple(args, "OO!Op:decoded", &values, &PyDict_Type, &direct, &deserialize,
                          &cas))
        return NULL;
    PyObject *seq = PySequence_Fast(values, "values must be a sequence");
    PyObject *found = seq ? PyDict_New() : NULL;
    if (found == NULL) {
        Py_XDECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) < 4) {
            PyErr_SetString(PyExc_TypeError, "values must be Value tuples");
            goto fail;
        }
        PyObject *key = PyTuple_GET_ITEM(v, 0), *flags = PyTuple_GET_ITEM(v, 1);
        PyObject *data = PyTuple_GET_ITEM(v, 2), *value = NULL;
        PyObject *decode = PyDict_GetItemWithError(direct, flags);
        if (decode != NULL) {
            value = PyObject_CallOneArg(decode, data);
            if (value == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_ValueError))
                    goto fail;
                PyErr_Clear();  /* not what its flags say: the serde refuses it */
            }
        }
        else if (PyErr_Occurred())
            goto fail;
        if (value == NULL) {
            value = PyObject_CallFunctionObjArgs(deserialize, key, data, flags, NULL);
            if (value == NULL)
                goto fail;
        }
        if (cas) {
            PyObject *pair = PyTuple_Pack(2, value, PyTuple_GET_ITEM(v, 3));
            Py_SETREF(value, pair);
            if (value == NULL)
                goto fail;
        }
        int failed = PyDict_SetItem(found, key, value) < 0;
        Py_DECREF(value);
        if (failed)
            goto fail;
    }
    Py_DECREF(seq);
    return found;
fail:
    Py_DECREF(seq);
    Py_DECREF(found);
    return NULL;
}

/* grouped(given, locate, known, routed): {server: [wire bytes]} in the order servers first
 * appear; a key placed by a route (a `routed` instance) by its route's bytes; the server of
 * ring bytes from `known` (the remembered routes), else locate() (which remembers it). */
PyObject *
speedups_grouped(PyObject *module, PyObject *args)
{
    PyObject *given, *locate, *known, *routed, *kb, *key, *s_route = NULL;
    if (!PyArg_ParseTuple(args, "O!OO!O:grouped", &PyDict_Type, &given, &locate, &PyDict_Type,
                          &known, &routed))
        return NULL;
    PyObject *owned = PyDict_New();
    if (owned == NULL)
        return NULL;
    Py_ssize_t pos = 0;
    while (PyDict_Next(given, &pos, &kb, &key)) {
        PyObject *ring = Py_NewRef(kb), *name, *kbs;
        if ((PyObject *)Py_TYPE(key) == routed) {
            if (s_route == NULL && (s_route = PyUnicode_InternFromString("route")) == NULL)
                goto fail_ring;
            Py_SETREF(ring, PyObject_GetAttr(key, s_route));
            if (ring == NULL)
                goto fail;
        }
        name = PyDict_GetItemWithError(known, ring);
        if (name != NULL)
            Py_INCREF(name);
        else if (PyErr_Occurred() || (name = PyObject_CallOneArg(locate, ring)) == NULL)
            goto fail_ring;
        Py_DECREF(ring);
        kbs = PyDict_GetItemWithError(owned, name);
        if (kbs == NULL) {
            if (PyErr_Occurred() || (kbs = PyList_New(0)) == NULL
                || PyDict_SetItem(owned, name, kbs) < 0) {
                Py_XDECREF(kbs);
                Py_DECREF(name);
                goto fail;
            }
            Py_DECREF(kbs);  /* owned holds it */
        }
        Py_DECREF(name);
        if (PyList_Append(kbs, kb) < 0)
            goto fail;
        continue;
    fail_ring:
        Py_DECREF(ring);
        goto fail;
    }
    Py_XDECREF(s_route);
    return owned;
fail:
    Py_XDECREF(s_route);
    Py_DECREF(owned);
    return NULL;
}

/* hits(parts, given, cas, stale, refused, envelope): the fetched items by the keys as given,
 * leaving out what reads as a miss (past its soft expiry, refused, an envelope of a refused
 * value); as decoding.hits. */
PyObject *
speedups_hits(PyObject *module, PyObject *args)
{
    PyObject *parts, *given, *stale, *refused, *envelope, *s_value = NULL;
    int cas;
    if (!PyArg_ParseTuple(args, "OO!pOOO:hits", &parts, &PyDict_Type, &given, &cas, &stale,
                          &refused, &envelope))
        return NULL;
    PyObject *seq = PySequence_Fast(parts, "parts must be a sequence");
    PyObject *found = seq ? PyDict_New() : NULL;
    if (found == NULL) {
        Py_XDECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *part = PySequence_Fast_GET_ITEM(seq, i), *kb, *item;
        if (!PyDict_Check(part)) {
            PyErr_SetString(PyExc_TypeError, "each part must be a dict");
            goto fail;
        }
        Py_ssize_t pos = 0;
        while (PyDict_Next(part, &pos, &kb, &item)) {
            PyObject *value = item;
            if (cas) {
                if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 1) {
                    PyErr_SetString(PyExc_TypeError, "a gets item must be (value, cas)");
                    goto fail;
                }
                value = PyTuple_GET_ITEM(item, 0);
            }
            if (value == stale || value == refused)
                continue;
            if ((PyObject *)Py_TYPE(value) == envelope) {
                if (s_value == NULL && (s_value = PyUnicode_InternFromString("value")) == NULL)
                    goto fail;
                PyObject *inner = PyObject_GetAttr(value, s_value);
                if (inner == NULL)
                    goto fail;
                Py_DECREF(inner);
                if (inner == refused)
                    continue;
            }
            PyObject *key = PyDict_GetItemWithError(given, kb);
            if (key == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetObject(PyExc_KeyError, kb);
                goto fail;
            }
            if (PyDict_SetItem(found, key, item) < 0)
                goto fail;
        }
    }
    Py_XDECREF(s_value);
    Py_DECREF(seq);
    return found;
fail:
    Py_XDECREF(s_value);
    Py_DECREF(seq);
    Py_DECREF(found);
    return NULL;
}
