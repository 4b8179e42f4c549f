/* The walk of an ORM query's key (django_mcpatterns/orm/shape.py), in C.
 *
 * shape.py writes a query down as text parts: every attribute of every object, by
 * handlers chosen by the value's kind.  The handlers that only loop (atoms, tuples
 * and lists, dicts, plain objects and lookups walked attribute by attribute) run
 * here; any other (a field, a column, a join, a class, an unknown kind) is shape.py's
 * own Python function, called as the pure walk calls it.  So the parts are the very
 * parts of the pure walk, in the same order (tests/orm/test_keys_compiled.py), at a
 * fraction of the interpreter's cost: the loops were most of keying a page query.
 *
 * shape_bind() is given shape.py's handler table and functions once; shape_walk(value,
 * shape) is its _walk, shape_named(state, names, shape) the loop of its _query. */
#include "speedups.h"

static struct {
    PyObject *handlers;              /* shape._HANDLERS: kind -> handler (shape.py fills it) */
    PyObject *atom, *sequence, *mapping, *attributes, *lookup;  /* the handlers run here */
    PyObject *names;                 /* shape._names(kind, state, skipped) */
    PyObject *handler;               /* shape._handler(kind): a kind's handler, first seen */
    PyObject *skipped, *lookup_skipped;
    PyObject *field, *klass, *col;   /* shape._field, ._class, ._col */
    PyObject *headers;               /* kind -> "O:module.qualname" (made once per kind) */
    PyObject *named;                 /* (kind, skipped, *attribute names) -> names walked */
    PyObject *memo;                  /* id -> (field or class, its one part) */
    PyObject *s_dict, *s_target, *s_alias, *s_output_field;
    int64_t by;                      /* the interpreter bound (see module.c's bind) */
} S = {.by = -1};

static int walk(PyObject *value, PyObject *shape, PyObject *parts);
static int append_new(PyObject *parts, PyObject *text);

static int
append_new(PyObject *parts, PyObject *text)
{
    if (text == NULL)
        return -1;
    int failed = PyList_Append(parts, text);
    Py_DECREF(text);
    return failed;
}

/* The parts of ``names`` of ``state`` (a dict): each name, then its value walked. */
static int
walk_named(PyObject *state, PyObject *names, PyObject *shape, PyObject *parts)
{
    if (!PyTuple_Check(names) || !PyDict_Check(state)) {
        PyErr_SetString(PyExc_TypeError, "shape_named takes a dict and a tuple of names");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (PyList_Append(parts, name) < 0)
            return -1;
        PyObject *item = PyDict_GetItemWithError(state, name);
        if (item == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, name);
            return -1;
        }
        Py_INCREF(item);
        int failed = walk(item, shape, parts);
        Py_DECREF(item);
        if (failed)
            return -1;
    }
    return 0;
}

#define KEPT 4096  /* entries of a cache before it starts again (shape.py's _walked too) */

/* shape._names(kind, state, skipped), kept by the kind, skipped and the attributes'
 * names in their order (a new name, or another order, is asked of shape.py again). */
static PyObject *
names_of(PyObject *kind, PyObject *state, PyObject *skipped)
{
    if (!PyDict_Check(state)) {
        PyErr_SetString(PyExc_TypeError, "an object's __dict__ must be a dict");
        return NULL;
    }
    PyObject *key = PyTuple_New(2 + PyDict_GET_SIZE(state));
    if (key == NULL)
        return NULL;
    PyTuple_SET_ITEM(key, 0, Py_NewRef(kind));
    PyTuple_SET_ITEM(key, 1, Py_NewRef(skipped));
    Py_ssize_t pos = 0, i = 2;
    PyObject *name, *item;
    while (PyDict_Next(state, &pos, &name, &item))
        PyTuple_SET_ITEM(key, i++, Py_NewRef(name));
    PyObject *names = PyDict_GetItemWithError(S.named, key);
    if (names != NULL) {
        Py_DECREF(key);
        return Py_NewRef(names);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    names = PyObject_CallFunctionObjArgs(S.names, kind, state, skipped, NULL);
    if (names != NULL && PyTuple_CheckExact(names)) {
        if (PyDict_GET_SIZE(S.named) >= KEPT)
            PyDict_Clear(S.named);
        if (PyDict_SetItem(S.named, key, names) < 0)
            Py_CLEAR(names);
    }
    Py_DECREF(key);
    return names;
}

/* A field of a model or a class: one part, the same for the object's whole life
 * (shape._field keeps it by id too); kept here with the object, so the id is its. */
static int
walk_memo(PyObject *handler, PyObject *value, PyObject *shape, PyObject *parts)
{
    PyObject *id = PyLong_FromVoidPtr(value);
    if (id == NULL)
        return -1;
    PyObject *known = PyDict_GetItemWithError(S.memo, id);
    if (known != NULL && PyTuple_GET_ITEM(known, 0) == value) {
        Py_DECREF(id);
        return PyList_Append(parts, PyTuple_GET_ITEM(known, 1));
    }
    Py_ssize_t before = PyList_GET_SIZE(parts);
    PyObject *done = PyErr_Occurred() ? NULL
                                      : PyObject_CallFunctionObjArgs(handler, value, shape, NULL);
    if (done == NULL) {
        Py_DECREF(id);
        return -1;
    }
    Py_DECREF(done);
    int failed = 0;
    if (PyList_GET_SIZE(parts) == before + 1) {  /* one part: a field without a model is more */
        PyObject *pair = PyTuple_Pack(2, value, PyList_GET_ITEM(parts, before));
        if (PyDict_GET_SIZE(S.memo) >= KEPT)
            PyDict_Clear(S.memo);
        failed = pair == NULL || PyDict_SetItem(S.memo, id, pair) < 0;
        Py_XDECREF(pair);
    }
    Py_DECREF(id);
    return failed ? -1 : 0;
}

/* shape._col: "C:<alias>", its target, and its output field when another. */
static int
walk_col(PyObject *value, PyObject *shape, PyObject *parts)
{
    PyObject *target = PyObject_GetAttr(value, S.s_target);
    if (target == NULL)
        return -1;
    PyObject *alias = PyObject_GetAttr(value, S.s_alias);
    int failed = alias == NULL || append_new(parts, PyUnicode_FromFormat("C:%S", alias)) < 0
                 || walk(target, shape, parts) < 0;
    Py_XDECREF(alias);
    if (!failed) {
        PyObject *output = PyObject_GetAttr(value, S.s_output_field);
        failed = output == NULL || (output != target && walk(output, shape, parts) < 0);
        Py_XDECREF(output);
    }
    Py_DECREF(target);
    return failed ? -1 : 0;
}

/* shape._attributes: the kind's header, each attribute not skipped (sorted), ";". */
static int
walk_attributes(PyObject *value, PyObject *skipped, PyObject *shape, PyObject *parts)
{
    PyObject *kind = (PyObject *)Py_TYPE(value);
    PyObject *header = PyDict_GetItemWithError(S.headers, kind);
    if (header == NULL) {
        if (PyErr_Occurred())
            return -1;
        PyObject *module = PyObject_GetAttrString(kind, "__module__");
        PyObject *qualname = module ? PyObject_GetAttrString(kind, "__qualname__") : NULL;
        header = qualname ? PyUnicode_FromFormat("O:%S.%S", module, qualname) : NULL;
        Py_XDECREF(module);
        Py_XDECREF(qualname);
        if (header == NULL)
            return -1;
        int failed = PyDict_SetItem(S.headers, kind, header);
        Py_DECREF(header);  /* the dict holds it */
        if (failed)
            return -1;
    }
    if (PyList_Append(parts, header) < 0)
        return -1;
    PyObject *state = PyObject_GetAttr(value, S.s_dict);
    if (state == NULL)
        return -1;
    PyObject *names = names_of(kind, state, skipped);
    int failed = names == NULL || walk_named(state, names, shape, parts) < 0;
    Py_XDECREF(names);
    Py_DECREF(state);
    if (failed)
        return -1;
    return append_new(parts, PyUnicode_FromString(";"));
}

static int
walk_sequence(PyObject *value, PyObject *shape, PyObject *parts)
{
    Py_ssize_t n = PySequence_Size(value);
    if (n < 0)
        return -1;
    if (n == 0)
        return append_new(parts, PyUnicode_FromString("()"));
    if (append_new(parts, PyUnicode_FromFormat("(%zd", n)) < 0)
        return -1;
    for (Py_ssize_t i = 0;; i++) {  /* a list is read as it is now, as Python's for does */
        Py_ssize_t size = PyList_Check(value) ? PyList_GET_SIZE(value) : PyTuple_GET_SIZE(value);
        if (i >= size)
            break;
        PyObject *item = PyList_Check(value) ? PyList_GET_ITEM(value, i) : PyTuple_GET_ITEM(value, i);
        Py_INCREF(item);
        int failed = walk(item, shape, parts);
        Py_DECREF(item);
        if (failed)
            return -1;
    }
    return append_new(parts, PyUnicode_FromString(")"));
}

static int
walk_mapping(PyObject *value, PyObject *shape, PyObject *parts)
{
    Py_ssize_t n = PyDict_GET_SIZE(value);
    if (n == 0)
        return append_new(parts, PyUnicode_FromString("{}"));
    if (append_new(parts, PyUnicode_FromFormat("{%zd", n)) < 0)
        return -1;
    Py_ssize_t pos = 0;
    PyObject *key, *item;
    while (PyDict_Next(value, &pos, &key, &item)) {
        Py_INCREF(key);
        Py_INCREF(item);
        int failed = walk(key, shape, parts) < 0 || walk(item, shape, parts) < 0;
        Py_DECREF(key);
        Py_DECREF(item);
        if (failed)
            return -1;
        if (PyDict_GET_SIZE(value) != n) {
            PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
            return -1;
        }
    }
    return append_new(parts, PyUnicode_FromString("}"));
}

/* shape._walk: the value's handler by its kind (shape._handler decides a new kind). */
static int
walk(PyObject *value, PyObject *shape, PyObject *parts)
{
    PyObject *kind = (PyObject *)Py_TYPE(value);
    PyObject *handler = PyDict_GetItemWithError(S.handlers, kind);
    if (handler != NULL)
        Py_INCREF(handler);
    else if (PyErr_Occurred() || (handler = PyObject_CallOneArg(S.handler, kind)) == NULL)
        return -1;
    int failed;
    if (handler == S.atom) {
        failed = append_new(parts, PyObject_Repr(value));
    } else if (Py_EnterRecursiveCall(" while keying a query")) {
        failed = -1;
    } else {
        if (handler == S.sequence && (PyList_CheckExact(value) || PyTuple_CheckExact(value)))
            failed = walk_sequence(value, shape, parts);
        else if (handler == S.mapping && PyDict_CheckExact(value))
            failed = walk_mapping(value, shape, parts);
        else if (handler == S.attributes)
            failed = walk_attributes(value, S.skipped, shape, parts);
        else if (handler == S.lookup)
            failed = walk_attributes(value, S.lookup_skipped, shape, parts);
        else if (handler == S.col)
            failed = walk_col(value, shape, parts);
        else if (handler == S.field || handler == S.klass)
            failed = walk_memo(handler, value, shape, parts);
        else {
            PyObject *done = PyObject_CallFunctionObjArgs(handler, value, shape, NULL);
            failed = done == NULL ? -1 : 0;
            Py_XDECREF(done);
        }
        Py_LeaveRecursiveCall();
    }
    Py_DECREF(handler);
    return failed;
}

static PyObject *
parts_of(PyObject *shape)
{
    PyObject *parts = PyObject_GetAttrString(shape, "parts");
    if (parts != NULL && !PyList_Check(parts)) {
        Py_DECREF(parts);
        PyErr_SetString(PyExc_TypeError, "a shape's parts must be a list");
        return NULL;
    }
    return parts;
}

/* shape_walk(value, shape): shape.py's _walk. */
PyObject *
speedups_shape_walk(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "shape_walk(value, shape)");
        return NULL;
    }
    if (S.handlers == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "shape_bind() was not called");
        return NULL;
    }
    PyObject *parts = parts_of(args[1]);
    if (parts == NULL)
        return NULL;
    int failed = walk(args[0], args[1], parts);
    Py_DECREF(parts);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* shape_named(state, names, shape): each name of ``names`` and its value in ``state``. */
PyObject *
speedups_shape_named(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "shape_named(state, names, shape)");
        return NULL;
    }
    if (S.handlers == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "shape_bind() was not called");
        return NULL;
    }
    PyObject *parts = parts_of(args[2]);
    if (parts == NULL)
        return NULL;
    int failed = walk_named(args[0], args[1], args[2], parts);
    Py_DECREF(parts);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* shape_bind(handlers, atom, sequence, mapping, attributes, lookup, names, handler,
 * skipped, lookup_skipped, field, klass, col): shape.py's table and functions (once per
 * process). */
PyObject *
speedups_shape_bind(PyObject *module, PyObject *args)
{
    PyObject *o[13];
    if (!PyArg_ParseTuple(args, "O!OOOOOOOOOOOO:shape_bind", &PyDict_Type, &o[0], &o[1], &o[2],
                          &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o[11],
                          &o[12]))
        return NULL;
    int64_t here = PyInterpreterState_GetID(PyInterpreterState_Get());
    if (here < 0)
        return NULL;
    if (S.by >= 0 && S.by != here) {
        PyErr_SetString(PyExc_ImportError, "the compiled key walk is bound in another interpreter");
        return NULL;
    }
    if (S.s_dict == NULL
        && ((S.s_dict = PyUnicode_InternFromString("__dict__")) == NULL
            || (S.s_target = PyUnicode_InternFromString("target")) == NULL
            || (S.s_alias = PyUnicode_InternFromString("alias")) == NULL
            || (S.s_output_field = PyUnicode_InternFromString("output_field")) == NULL))
        return NULL;
    PyObject *caches[] = {PyDict_New(), PyDict_New(), PyDict_New()};
    if (caches[0] == NULL || caches[1] == NULL || caches[2] == NULL) {
        for (int i = 0; i < 3; i++)
            Py_XDECREF(caches[i]);
        return NULL;
    }
    PyObject **slots[] = {&S.handlers, &S.atom, &S.sequence, &S.mapping, &S.attributes,
                          &S.lookup, &S.names, &S.handler, &S.skipped, &S.lookup_skipped,
                          &S.field, &S.klass, &S.col};
    for (int i = 0; i < 13; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    Py_XSETREF(S.headers, caches[0]);
    Py_XSETREF(S.named, caches[1]);
    Py_XSETREF(S.memo, caches[2]);
    S.by = here;
    Py_RETURN_NONE;
}
