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
