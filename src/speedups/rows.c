/* The ORM's cached rows, packed and unpacked in C (django_mcpatterns/orm/rows.py).
 *
 * A cached list of model instances is stored as (label, db, fields, related) per row:
 * the instance's __dict__ without its ModelState, the state's db, and the related rows
 * select_related left in state.fields_cache, packed alike.  rows.py does the same in
 * Python (the pure path; a test holds both to the same answers); here each row costs a
 * dict copy and a few lookups instead of a Python frame and its bytecode, on every warm
 * read (unpack: 40 instances rebuilt for a page of 20 products with their category) and
 * every fill (pack). */
#include "speedups.h"

static PyObject *s_state, *s_db, *s_adding, *s_fields_cache, *s_prefetched, *s_dict, *empty;

static int
names_ready(void)
{
    if (s_state != NULL)
        return 0;
    empty = PyTuple_New(0);
    s_db = PyUnicode_InternFromString("db");
    s_adding = PyUnicode_InternFromString("adding");
    s_fields_cache = PyUnicode_InternFromString("fields_cache");
    s_prefetched = PyUnicode_InternFromString("_prefetched_objects_cache");
    s_dict = PyUnicode_InternFromString("__dict__");
    if (empty == NULL || s_db == NULL || s_adding == NULL || s_fields_cache == NULL
        || s_prefetched == NULL || s_dict == NULL)
        return -1;
    s_state = PyUnicode_InternFromString("_state"); /* last: set means all are */
    return s_state == NULL ? -1 : 0;
}

/* The label of obj's class: labels[cls], else label_of(cls) (which remembers it). */
static PyObject *
label_of(PyObject *obj, PyObject *labels, PyObject *fallback)
{
    PyObject *label = PyDict_GetItemWithError(labels, (PyObject *)Py_TYPE(obj));
    if (label != NULL)
        return Py_NewRef(label);
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallOneArg(fallback, (PyObject *)Py_TYPE(obj));
}

static PyObject *
pack_one(PyObject *obj, PyObject *labels, PyObject *fallback, PyObject *model)
{
    PyObject *fields = NULL, *state = NULL, *db = NULL, *cached = NULL, *related = NULL;
    PyObject *label = NULL, *row = NULL;
    PyObject *attributes = PyObject_GenericGetDict(obj, NULL);
    if (attributes == NULL)
        return NULL;
    fields = PyDict_Copy(attributes);
    Py_DECREF(attributes);
    if (fields == NULL)
        return NULL;
    state = PyDict_GetItemWithError(fields, s_state);
    if (state == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, s_state);
        goto done;
    }
    Py_INCREF(state);
    if (PyDict_DelItem(fields, s_state) < 0)
        goto done;
    if ((db = PyObject_GetAttr(state, s_db)) == NULL)
        goto done;
    if ((related = PyDict_New()) == NULL)
        goto done;
    attributes = PyObject_GenericGetDict(state, NULL);
    if (attributes == NULL)
        goto done;
    cached = PyDict_GetItemWithError(attributes, s_fields_cache);
    Py_XINCREF(cached);
    Py_DECREF(attributes);
    if (cached == NULL && PyErr_Occurred())
        goto done;
    if (cached != NULL) {
        int truth = PyObject_IsTrue(cached);
        if (truth < 0)
            goto done;
        if (truth) {
            if (!PyDict_Check(cached)) {
                PyErr_SetString(PyExc_TypeError, "a ModelState's fields_cache is not a dict");
                goto done;
            }
            Py_ssize_t pos = 0;
            PyObject *name, *rel;
            while (PyDict_Next(cached, &pos, &name, &rel)) {
                Py_INCREF(name); /* held: the calls below may run Python code */
                Py_INCREF(rel);
                int is_model = PyObject_IsInstance(rel, model);
                PyObject *packed = is_model < 0   ? NULL
                                   : is_model ? pack_one(rel, labels, fallback, model)
                                              : Py_NewRef(rel);
                int failed = packed == NULL || PyDict_SetItem(related, name, packed) < 0;
                Py_XDECREF(packed);
                Py_DECREF(name);
                Py_DECREF(rel);
                if (failed)
                    goto done;
            }
        }
    }
    if ((label = label_of(obj, labels, fallback)) == NULL)
        goto done;
    row = PyTuple_Pack(4, label, db, fields, related);
done:
    Py_XDECREF(fields);
    Py_XDECREF(state);
    Py_XDECREF(db);
    Py_XDECREF(cached);
    Py_XDECREF(related);
    Py_XDECREF(label);
    return row;
}

/* pack_rows(rows, labels, label_of, Model): each row's (label, db, fields, related), or
 * None when a row is not a model instance or has prefetched relations (stored as is). */
PyObject *
speedups_pack_rows(PyObject *module, PyObject *args)
{
    PyObject *rows, *labels, *fallback, *model;
    if (!PyArg_ParseTuple(args, "O!O!OO:pack_rows", &PyList_Type, &rows, &PyDict_Type, &labels,
                          &fallback, &model))
        return NULL;
    if (names_ready() < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = PyList_GET_ITEM(rows, i);
        int is_model = PyObject_IsInstance(obj, model);
        if (is_model <= 0)
            return is_model < 0 ? NULL : Py_NewRef(Py_None);
        PyObject *attributes = PyObject_GenericGetDict(obj, NULL);
        if (attributes == NULL)
            return NULL;
        int prefetched = PyDict_Contains(attributes, s_prefetched);
        Py_DECREF(attributes);
        if (prefetched != 0)
            return prefetched < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *packed = PyList_New(n);
    if (packed == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* pack_one may run Python code (label_of, __instancecheck__): look again */
        if (i >= PyList_GET_SIZE(rows)) {
            PyErr_SetString(PyExc_RuntimeError, "the rows changed while packed");
            Py_DECREF(packed);
            return NULL;
        }
        PyObject *obj = Py_NewRef(PyList_GET_ITEM(rows, i));
        PyObject *row = pack_one(obj, labels, fallback, model);
        Py_DECREF(obj);
        if (row == NULL) {
            Py_DECREF(packed);
            return NULL;
        }
        PyList_SET_ITEM(packed, i, row);
    }
    return packed;
}

static PyObject *
unpack_one(PyObject *row, PyObject *classes, PyObject *model_of, PyObject *model_state)
{
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 4) {
        PyErr_SetString(PyExc_TypeError, "a packed row is a tuple of 4");
        return NULL;
    }
    PyObject *label = PyTuple_GET_ITEM(row, 0), *db = PyTuple_GET_ITEM(row, 1);
    PyObject *fields = PyTuple_GET_ITEM(row, 2), *related = PyTuple_GET_ITEM(row, 3);
    if (!PyDict_Check(fields) || !PyDict_Check(related)) {
        PyErr_SetString(PyExc_TypeError, "a packed row's fields and related rows are dicts");
        return NULL;
    }
    PyObject *cls = PyDict_GetItemWithError(classes, label);
    if (cls != NULL)
        Py_INCREF(cls);
    else if (PyErr_Occurred() || (cls = PyObject_CallOneArg(model_of, label)) == NULL)
        return NULL;
    PyObject *obj = NULL, *attributes = NULL, *state = NULL, *cache = NULL;
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "a packed row's label names no model");
        goto fail;
    }
    /* object.__new__(cls), as the pure path does: no __init__ */
    if ((obj = PyBaseObject_Type.tp_new((PyTypeObject *)cls, empty, NULL)) == NULL)
        goto fail;
    if ((attributes = PyDict_Copy(fields)) == NULL)
        goto fail;
    if ((state = PyObject_CallNoArgs(model_state)) == NULL)
        goto fail;
    if (PyObject_SetAttr(state, s_adding, Py_False) < 0 || PyObject_SetAttr(state, s_db, db) < 0)
        goto fail;
    if (PyDict_GET_SIZE(related)) {
        if ((cache = PyDict_New()) == NULL)
            goto fail;
        Py_ssize_t pos = 0;
        PyObject *name, *rel;
        while (PyDict_Next(related, &pos, &name, &rel)) {
            Py_INCREF(name); /* held: model_of() may run any Python code */
            Py_INCREF(rel);
            PyObject *made = PyTuple_CheckExact(rel)
                                 ? unpack_one(rel, classes, model_of, model_state)
                                 : Py_NewRef(rel);
            int failed = made == NULL || PyDict_SetItem(cache, name, made) < 0;
            Py_XDECREF(made);
            Py_DECREF(name);
            Py_DECREF(rel);
            if (failed)
                goto fail;
        }
        if (PyObject_SetAttr(state, s_fields_cache, cache) < 0)
            goto fail;
    }
    if (PyDict_SetItem(attributes, s_state, state) < 0)
        goto fail;
    /* through the class's __dict__ descriptor: PyObject_GenericSetDict leaves 3.13's
     * inline attribute values in place, and the instance would not see its dict */
    if (PyObject_SetAttr(obj, s_dict, attributes) < 0)
        goto fail;
    Py_DECREF(cls);
    Py_DECREF(attributes);
    Py_DECREF(state);
    Py_XDECREF(cache);
    return obj;
fail:
    Py_DECREF(cls);
    Py_XDECREF(obj);
    Py_XDECREF(attributes);
    Py_XDECREF(state);
    Py_XDECREF(cache);
    return NULL;
}

/* unpack_rows(rows, classes, model_of, ModelState): fresh instances of packed rows, as
 * Django's from_db leaves them (state.adding False, state.db set), related rows in
 * state.fields_cache; a label's class is classes[label], else model_of(label). */
PyObject *
speedups_unpack_rows(PyObject *module, PyObject *args)
{
    PyObject *rows, *classes, *model_of, *model_state;
    if (!PyArg_ParseTuple(args, "O!O!OO:unpack_rows", &PyList_Type, &rows, &PyDict_Type,
                          &classes, &model_of, &model_state))
        return NULL;
    if (names_ready() < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *made = PyList_New(n);
    if (made == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* a model_of() call may run Python code that changes the list: look again */
        if (i >= PyList_GET_SIZE(rows)) {
            PyErr_SetString(PyExc_RuntimeError, "the packed rows changed while unpacked");
            Py_DECREF(made);
            return NULL;
        }
        PyObject *row = Py_NewRef(PyList_GET_ITEM(rows, i));
        PyObject *obj = unpack_one(row, classes, model_of, model_state);
        Py_DECREF(row);
        if (obj == NULL) {
            Py_DECREF(made);
            return NULL;
        }
        PyList_SET_ITEM(made, i, obj);
    }
    return made;
}
