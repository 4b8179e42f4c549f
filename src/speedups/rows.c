/* The ORM's cached rows, packed and unpacked in C (django_mcpatterns/orm/rows.py).
 *
 * A cached list of model instances is stored as (label, db, names, values, related) per
 * row: the names of the instance's attributes but its ModelState (one tuple shared by the
 * rows that have the same ones), their values, the state's db, and the related rows
 * select_related left in state.fields_cache, packed alike.  rows.py does the same in
 * Python (the pure path; a test holds both to the same answers); here each row costs a
 * few tuple and dict operations instead of a Python frame and its bytecode, on every warm
 * read (unpack: 40 instances rebuilt for a page of 20 products with their category) and
 * every fill (pack). */
#include "speedups.h"

#define KNOWN_NAMES 4096 /* names tuples kept (rows.py's _NAMES_KEPT) */

static PyObject *s_state, *s_db, *s_adding, *s_fields_cache, *s_prefetched, *empty;

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
    if (empty == NULL || s_db == NULL || s_adding == NULL || s_fields_cache == NULL
        || s_prefetched == NULL)
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

/* The names and values of an instance's attributes but _state (in their order), the
 * names tuple the one kept in known for them; and its state.  0, or -1 with an error.
 * seen: the names of the last row of each class in this call, taken as they are when the
 * keys are those very objects (no tuple hashed). */
static int
split(PyObject *obj, PyObject *known, PyObject *seen, PyObject **names, PyObject **values,
      PyObject **state)
{
    PyObject *attributes = PyObject_GenericGetDict(obj, NULL);
    if (attributes == NULL)
        return -1;
    Py_ssize_t n = PyDict_GET_SIZE(attributes), i = 0, pos = 0;
    PyObject *key, *value;
    *names = PyTuple_New(n ? n - 1 : 0);
    *values = PyTuple_New(n ? n - 1 : 0);
    *state = NULL;
    if (*names == NULL || *values == NULL)
        goto fail;
    PyObject *last = PyDict_GetItemWithError(seen, (PyObject *)Py_TYPE(obj));
    if (last == NULL && PyErr_Occurred())
        goto fail;
    int same = last != NULL && PyTuple_GET_SIZE(last) == n - 1;
    while (PyDict_Next(attributes, &pos, &key, &value)) {
        int is_state = key == s_state;
        if (!is_state && PyUnicode_CheckExact(key)
            && PyUnicode_GET_LENGTH(key) == PyUnicode_GET_LENGTH(s_state)) {
            is_state = PyUnicode_Compare(key, s_state) == 0;
            if (is_state == 0 && PyErr_Occurred())
                goto fail;
        }
        if (is_state && *state == NULL) {
            *state = Py_NewRef(value);
            continue;
        }
        if (i >= n - 1) /* no _state among them */
            break;
        same = same && PyTuple_GET_ITEM(last, i) == key;
        PyTuple_SET_ITEM(*names, i, Py_NewRef(key));
        PyTuple_SET_ITEM(*values, i, Py_NewRef(value));
        i++;
    }
    if (*state == NULL) {
        PyErr_SetObject(PyExc_KeyError, s_state);
        goto fail;
    }
    Py_DECREF(attributes);
    attributes = NULL;
    if (same && i == n - 1) {
        Py_SETREF(*names, Py_NewRef(last));
        return 0;
    }
    PyObject *shared = PyDict_GetItemWithError(known, *names);
    if (shared != NULL)
        Py_SETREF(*names, Py_NewRef(shared));
    else if (PyErr_Occurred())
        goto fail;
    else {
        if (PyDict_GET_SIZE(known) >= KNOWN_NAMES)
            PyDict_Clear(known);
        if (PyDict_SetItem(known, *names, *names) < 0)
            goto fail;
    }
    if (PyDict_SetItem(seen, (PyObject *)Py_TYPE(obj), *names) < 0)
        goto fail;
    return 0;
fail:
    Py_XDECREF(attributes);
    Py_CLEAR(*names);
    Py_CLEAR(*values);
    Py_CLEAR(*state);
    return -1;
}

/* The rows a related row hangs from, nearest first (on the C stack). */
struct path {
    PyObject *obj;
    const struct path *up;
};

/* obj's packed row; None (a new reference) when a related row leads back to a row it
 * hangs from (select_related on a one-to-one caches each side on the other): the rows are
 * then stored as they are (pickled, the cycle kept), as rows.py's pure form does. */
static PyObject *
pack_one(PyObject *obj, PyObject *labels, PyObject *fallback, PyObject *model, PyObject *known,
         PyObject *seen, const struct path *up)
{
    for (const struct path *at = up; at != NULL; at = at->up)
        if (at->obj == obj)
            return Py_NewRef(Py_None);
    if (Py_EnterRecursiveCall(" while packing cached rows"))
        return NULL;
    const struct path here = {obj, up};
    PyObject *names = NULL, *values = NULL, *state = NULL, *db = NULL, *cached = NULL;
    PyObject *related = NULL, *label = NULL, *row = NULL, *attributes;
    if (split(obj, known, seen, &names, &values, &state) < 0) {
        Py_LeaveRecursiveCall();
        return NULL;
    }
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
                PyObject *packed = NULL;
                if (is_model > 0)
                    packed = pack_one(rel, labels, fallback, model, known, seen, &here);
                else if (is_model == 0)
                    packed = Py_NewRef(rel);
                int cycle = is_model > 0 && packed == Py_None;
                int failed = packed == NULL || cycle || PyDict_SetItem(related, name, packed) < 0;
                Py_XDECREF(packed);
                Py_DECREF(name);
                Py_DECREF(rel);
                if (cycle)
                    row = Py_NewRef(Py_None);
                if (failed)
                    goto done;
            }
        }
    }
    if ((label = label_of(obj, labels, fallback)) == NULL)
        goto done;
    row = PyTuple_Pack(5, label, db, names, values, related);
done:
    Py_LeaveRecursiveCall();
    Py_XDECREF(names);
    Py_XDECREF(values);
    Py_XDECREF(state);
    Py_XDECREF(db);
    Py_XDECREF(cached);
    Py_XDECREF(related);
    Py_XDECREF(label);
    return row;
}

/* pack_rows(rows, labels, label_of, Model, known): each row's (label, db, names, values,
 * related), or None when a row is not a model instance or has prefetched relations
 * (stored as is). */
PyObject *
speedups_pack_rows(PyObject *module, PyObject *args)
{
    PyObject *rows, *labels, *fallback, *model, *known;
    if (!PyArg_ParseTuple(args, "O!O!OOO!:pack_rows", &PyList_Type, &rows, &PyDict_Type, &labels,
                          &fallback, &model, &PyDict_Type, &known))
        return NULL;
    if (names_ready() < 0)
        return NULL;
    /* __instancecheck__ may run Python code that changes the list: its size read each time,
     * each row held */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *obj = Py_NewRef(PyList_GET_ITEM(rows, i));
        int is_model = PyObject_IsInstance(obj, model);
        PyObject *attributes = is_model > 0 ? PyObject_GenericGetDict(obj, NULL) : NULL;
        Py_DECREF(obj);
        if (is_model <= 0)
            return is_model < 0 ? NULL : Py_NewRef(Py_None);
        if (attributes == NULL)
            return NULL;
        int prefetched = PyDict_Contains(attributes, s_prefetched);
        Py_DECREF(attributes);
        if (prefetched != 0)
            return prefetched < 0 ? NULL : Py_NewRef(Py_None);
    }
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *seen = PyDict_New();
    PyObject *packed = seen == NULL ? NULL : PyList_New(n);
    if (packed == NULL) {
        Py_XDECREF(seen);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        /* pack_one may run Python code (label_of, __instancecheck__): look again */
        if (i >= PyList_GET_SIZE(rows)) {
            PyErr_SetString(PyExc_RuntimeError, "the rows changed while packed");
            Py_CLEAR(packed);
            break;
        }
        PyObject *obj = Py_NewRef(PyList_GET_ITEM(rows, i));
        PyObject *row = pack_one(obj, labels, fallback, model, known, seen, NULL);
        Py_DECREF(obj);
        if (row == NULL || row == Py_None) {
            Py_CLEAR(packed);
            if (row != NULL)
                packed = row; /* a cycle: not packed */
            break;
        }
        PyList_SET_ITEM(packed, i, row);
    }
    Py_DECREF(seen);
    return packed;
}

/* object.__new__(cls): made here where cls takes object's own (a model: no __new__),
 * else asked of object.__new__ (which refuses a class it cannot make, as in Python). */
static PyObject *
new_instance(PyObject *cls)
{
    if (PyType_Check(cls) && ((PyTypeObject *)cls)->tp_new == PyBaseObject_Type.tp_new)
        return PyBaseObject_Type.tp_new((PyTypeObject *)cls, empty, NULL);
    PyObject *make = PyObject_GetAttrString((PyObject *)&PyBaseObject_Type, "__new__");
    PyObject *made = make == NULL ? NULL : PyObject_CallOneArg(make, cls);
    Py_XDECREF(make);
    return made;
}

/* A fresh ModelState as from_db leaves it: adding False, db set. */
static PyObject *
new_state(PyObject *model_state, PyObject *db)
{
    PyObject *state;
    if (PyType_Check(model_state)
        && ((PyTypeObject *)model_state)->tp_new == PyBaseObject_Type.tp_new
        && ((PyTypeObject *)model_state)->tp_init == PyBaseObject_Type.tp_init)
        state = PyBaseObject_Type.tp_new((PyTypeObject *)model_state, empty, NULL);
    else
        state = PyObject_CallNoArgs(model_state);
    if (state == NULL)
        return NULL;
    PyObject *attributes = PyObject_GenericGetDict(state, NULL);
    int failed = attributes == NULL || PyDict_SetItem(attributes, s_adding, Py_False) < 0
                 || PyDict_SetItem(attributes, s_db, db) < 0;
    Py_XDECREF(attributes);
    if (failed)
        Py_CLEAR(state);
    return state;
}

static PyObject *unpack_row(PyObject *, PyObject *, PyObject *, PyObject *);

/* unpack_row, its depth bounded as Python's (a related row holds related rows) */
static PyObject *
unpack_one(PyObject *row, PyObject *classes, PyObject *model_of, PyObject *model_state)
{
    if (Py_EnterRecursiveCall(" while unpacking cached rows"))
        return NULL;
    PyObject *made = unpack_row(row, classes, model_of, model_state);
    Py_LeaveRecursiveCall();
    return made;
}

static PyObject *
unpack_row(PyObject *row, PyObject *classes, PyObject *model_of, PyObject *model_state)
{
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 5) {
        PyErr_SetString(PyExc_TypeError, "a packed row is a tuple of 5");
        return NULL;
    }
    PyObject *label = PyTuple_GET_ITEM(row, 0), *db = PyTuple_GET_ITEM(row, 1);
    PyObject *names = PyTuple_GET_ITEM(row, 2), *values = PyTuple_GET_ITEM(row, 3);
    PyObject *related = PyTuple_GET_ITEM(row, 4);
    if (!PyTuple_Check(names) || !PyTuple_Check(values) || !PyDict_Check(related)) {
        PyErr_SetString(PyExc_TypeError,
                        "a packed row's names and values are tuples, its related rows a dict");
        return NULL;
    }
    if (PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(values)) {
        PyErr_SetString(PyExc_TypeError, "a packed row has as many values as names");
        return NULL;
    }
    PyObject *cls = PyDict_GetItemWithError(classes, label);
    if (cls != NULL)
        Py_INCREF(cls);
    else if (PyErr_Occurred() || (cls = PyObject_CallOneArg(model_of, label)) == NULL)
        return NULL;
    PyObject *obj = NULL, *attributes = NULL, *state = NULL, *state_attributes = NULL;
    PyObject *cache = NULL;
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "a packed row's label names no model");
        goto fail;
    }
    /* object.__new__(cls), as the pure path does: no __init__ */
    if ((obj = new_instance(cls)) == NULL)
        goto fail;
    /* written into the instance's own dict (made from its inline values where the
     * version keeps them): no dict made and thrown away, no descriptor run (a foreign
     * key's attname has a __set__ that would clear the related row's cache) */
    if ((attributes = PyObject_GenericGetDict(obj, NULL)) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++)
        if (PyDict_SetItem(attributes, PyTuple_GET_ITEM(names, i), PyTuple_GET_ITEM(values, i))
            < 0)
            goto fail;
    /* the state as ModelState() then two attributes set: in its dict, likewise */
    if ((state = new_state(model_state, db)) == NULL
        || (state_attributes = PyObject_GenericGetDict(state, NULL)) == NULL)
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
        if (PyDict_SetItem(state_attributes, s_fields_cache, cache) < 0)
            goto fail;
    }
    if (PyDict_SetItem(attributes, s_state, state) < 0)
        goto fail;
    Py_DECREF(cls);
    Py_DECREF(attributes);
    Py_DECREF(state);
    Py_DECREF(state_attributes);
    Py_XDECREF(cache);
    return obj;
fail:
    Py_DECREF(cls);
    Py_XDECREF(obj);
    Py_XDECREF(attributes);
    Py_XDECREF(state);
    Py_XDECREF(state_attributes);
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
            Py_CLEAR(made);
            break;
        }
        PyObject *row = Py_NewRef(PyList_GET_ITEM(rows, i));
        PyObject *obj = unpack_one(row, classes, model_of, model_state);
        Py_DECREF(row);
        if (obj == NULL) {
            Py_CLEAR(made);
            break;
        }
        PyList_SET_ITEM(made, i, obj);
    }
    return made;
}

/* ---- rows of one shape stored by column (rows.py's columns and unpack_columns) ---- */

/* Whether two related dicts of packed rows have the same names, in the same order:
 * 1, 0, or -1 with an error. */
static int
same_names(PyObject *a, PyObject *b)
{
    if (PyDict_GET_SIZE(a) != PyDict_GET_SIZE(b))
        return 0;
    Py_ssize_t pa = 0, pb = 0;
    PyObject *ka, *kb, *value;
    while (PyDict_Next(a, &pa, &ka, &value)) {
        if (!PyDict_Next(b, &pb, &kb, &value))
            return 0;
        if (ka != kb) {
            int equal = PyObject_RichCompareBool(ka, kb, Py_EQ);
            if (equal <= 0)
                return equal;
        }
    }
    return 1;
}

static PyObject *columns_of(PyObject *rows);

static PyObject *
columns_nested(PyObject *rows)
{
    if (Py_EnterRecursiveCall(" while storing cached rows by column"))
        return NULL;
    PyObject *group = columns_of(rows);
    Py_LeaveRecursiveCall();
    return group;
}

/* rows (a list of packed rows) as one column group, or None (a new reference) when they
 * are not of one shape. */
static PyObject *
columns_of(PyObject *list)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n == 0)
        return Py_NewRef(Py_None);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(list, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 5
            || !PyDict_CheckExact(PyTuple_GET_ITEM(row, 4)))
            return Py_NewRef(Py_None);
    }
    /* the rows as they are now, each held: the comparisons and lookups below may run
     * Python code (a str subclass's __eq__) that changes the list */
    PyObject *rows = PyList_AsTuple(list);
    if (rows == NULL)
        return NULL;
    PyObject *first = Py_NewRef(PyTuple_GET_ITEM(rows, 0)), *values = NULL, *by_name = NULL;
    PyObject *column = NULL, *group = NULL, *held_name = NULL;
    PyObject *label = PyTuple_GET_ITEM(first, 0), *db = PyTuple_GET_ITEM(first, 1);
    PyObject *names = PyTuple_GET_ITEM(first, 2), *related = PyTuple_GET_ITEM(first, 4);
    int shaped = 1;
    /* the comparisons may run Python code (a str subclass's __eq__): sizes read again */
    for (Py_ssize_t i = 1; shaped > 0 && i < n; i++) {
        PyObject *row = PyTuple_GET_ITEM(rows, i);
        if (PyTuple_GET_ITEM(row, 2) != names)
            shaped = 0;
        else if ((shaped = PyObject_RichCompareBool(PyTuple_GET_ITEM(row, 0), label, Py_EQ)) > 0
                 && (shaped = PyObject_RichCompareBool(PyTuple_GET_ITEM(row, 1), db, Py_EQ)) > 0)
            shaped = same_names(related, PyTuple_GET_ITEM(row, 4));
    }
    if (shaped <= 0) {
        Py_DECREF(first);
        Py_DECREF(rows);
        return shaped < 0 ? NULL : Py_NewRef(Py_None);
    }
    if ((values = PyList_New(n)) == NULL || (by_name = PyDict_New()) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(values, i, Py_NewRef(PyTuple_GET_ITEM(PyTuple_GET_ITEM(rows, i), 3)));
    Py_ssize_t pos = 0;
    PyObject *name, *unused;
    while (PyDict_Next(related, &pos, &name, &unused)) {
        Py_XSETREF(held_name, Py_NewRef(name));  /* the lookups may change `related` */
        if ((column = PyList_New(n)) == NULL)
            goto done;
        Py_ssize_t packed = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *rel = PyDict_GetItemWithError(PyTuple_GET_ITEM(PyTuple_GET_ITEM(rows, i), 4),
                                                   name);
            if (rel == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetObject(PyExc_KeyError, name);
                goto done;
            }
            packed += PyTuple_CheckExact(rel);
            PyList_SET_ITEM(column, i, Py_NewRef(rel));
        }
        if (packed == n) {
            PyObject *nested = columns_nested(column);
            if (nested == NULL)
                goto done;
            Py_SETREF(column, nested);
        }
        else if (packed)
            Py_SETREF(column, Py_NewRef(Py_None));
        if (column == Py_None) {  /* not of one shape */
            group = column;
            column = NULL;
            goto done;
        }
        int failed = PyDict_SetItem(by_name, name, column) < 0;
        Py_CLEAR(column);
        if (failed)
            goto done;
    }
    group = PyTuple_Pack(5, label, db, names, values, by_name);
done:
    Py_DECREF(first);
    Py_DECREF(rows);
    Py_XDECREF(held_name);
    Py_XDECREF(values);
    Py_XDECREF(by_name);
    Py_XDECREF(column);
    return group;
}

/* columns(rows): rows.py's columns, in C. */
PyObject *
speedups_columns(PyObject *module, PyObject *rows)
{
    if (!PyList_Check(rows)) {
        PyErr_SetString(PyExc_TypeError, "columns takes a list of packed rows");
        return NULL;
    }
    return columns_of(rows);
}

static PyObject *unpack_group(PyObject *, PyObject *, PyObject *, PyObject *);

static PyObject *
unpack_group_nested(PyObject *group, PyObject *classes, PyObject *model_of, PyObject *model_state)
{
    if (Py_EnterRecursiveCall(" while unpacking cached rows"))
        return NULL;
    PyObject *made = unpack_group(group, classes, model_of, model_state);
    Py_LeaveRecursiveCall();
    return made;
}

/* Fresh instances of a column group, each as unpack_row makes a row's. */
static PyObject *
unpack_group(PyObject *group, PyObject *classes, PyObject *model_of, PyObject *model_state)
{
    if (!PyTuple_CheckExact(group) || PyTuple_GET_SIZE(group) != 5) {
        PyErr_SetString(PyExc_TypeError, "a column group is a tuple of 5");
        return NULL;
    }
    PyObject *label = PyTuple_GET_ITEM(group, 0), *db = PyTuple_GET_ITEM(group, 1);
    PyObject *names = PyTuple_GET_ITEM(group, 2), *values = PyTuple_GET_ITEM(group, 3);
    PyObject *related = PyTuple_GET_ITEM(group, 4);
    if (!PyTuple_Check(names) || !PyList_CheckExact(values) || !PyDict_Check(related)) {
        PyErr_SetString(PyExc_TypeError,
                        "a column group's names are a tuple, its values a list, its related a dict");
        return NULL;
    }
    Py_INCREF(group);  /* held, and so its items: model_of() may run any Python code */
    PyObject *made = NULL, *cls = NULL, *out = NULL, *column = NULL, *held = NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    if ((made = PyDict_New()) == NULL)
        goto fail;
    Py_ssize_t pos = 0;
    PyObject *name, *rel;
    while (PyDict_Next(related, &pos, &name, &rel)) {
        PyObject *pair = PyTuple_Pack(2, name, rel);  /* held: the nested walk runs Python code */
        if (pair == NULL)
            goto fail;
        Py_XSETREF(held, pair);
        if (PyTuple_CheckExact(rel))
            column = unpack_group_nested(rel, classes, model_of, model_state);
        else if (PyList_CheckExact(rel))
            column = Py_NewRef(rel);
        else {
            PyErr_SetString(PyExc_TypeError, "a related column is a group or a list");
            goto fail;
        }
        if (column == NULL)
            goto fail;
        if (PyList_GET_SIZE(column) != n) {
            PyErr_SetString(PyExc_TypeError, "a related column has as many rows as its group");
            goto fail;
        }
        if (PyDict_SetItem(made, name, column) < 0)
            goto fail;
        Py_CLEAR(column);
    }
    cls = PyDict_GetItemWithError(classes, label);
    if (cls != NULL)
        Py_INCREF(cls);
    else if (PyErr_Occurred() || (cls = PyObject_CallOneArg(model_of, label)) == NULL)
        goto fail;
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "a packed row's label names no model");
        goto fail;
    }
    if (PyList_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_RuntimeError, "the packed rows changed while unpacked");
        goto fail;
    }
    if ((out = PyList_New(n)) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyList_GET_SIZE(values) != n) {  /* a name's __hash__ may be Python code */
            PyErr_SetString(PyExc_RuntimeError, "the packed rows changed while unpacked");
            goto fail;
        }
        PyObject *row = PyList_GET_ITEM(values, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != PyTuple_GET_SIZE(names)) {
            PyErr_SetString(PyExc_TypeError, "a packed row has as many values as names");
            goto fail;
        }
        Py_XSETREF(held, Py_NewRef(row));
        PyObject *obj = new_instance(cls), *attributes = NULL, *state = NULL, *cache = NULL;
        if (obj == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, obj);
        if ((attributes = PyObject_GenericGetDict(obj, NULL)) == NULL)
            goto fail;
        int failed = 0;
        for (Py_ssize_t j = 0; !failed && j < PyTuple_GET_SIZE(names); j++)
            failed = PyDict_SetItem(attributes, PyTuple_GET_ITEM(names, j),
                                    PyTuple_GET_ITEM(row, j)) < 0;
        if (!failed)
            failed = (state = new_state(model_state, db)) == NULL;
        if (!failed && PyDict_GET_SIZE(made)) {
            PyObject *state_attributes = PyObject_GenericGetDict(state, NULL);
            failed = state_attributes == NULL || (cache = PyDict_New()) == NULL;
            Py_ssize_t at = 0;
            PyObject *key, *col;
            while (!failed && PyDict_Next(made, &at, &key, &col)) {
                if (PyList_GET_SIZE(col) <= i) {  /* a stored list, changed meanwhile */
                    PyErr_SetString(PyExc_RuntimeError, "the packed rows changed while unpacked");
                    failed = 1;
                }
                else
                    failed = PyDict_SetItem(cache, key, PyList_GET_ITEM(col, i)) < 0;
            }
            if (!failed)
                failed = PyDict_SetItem(state_attributes, s_fields_cache, cache) < 0;
            Py_XDECREF(state_attributes);
        }
        if (!failed)
            failed = PyDict_SetItem(attributes, s_state, state) < 0;
        Py_DECREF(attributes);
        Py_XDECREF(state);
        Py_XDECREF(cache);
        if (failed)
            goto fail;
    }
    Py_DECREF(group);
    Py_XDECREF(held);
    Py_DECREF(made);
    Py_DECREF(cls);
    return out;
fail:
    Py_DECREF(group);
    Py_XDECREF(held);
    Py_XDECREF(made);
    Py_XDECREF(cls);
    Py_XDECREF(out);
    Py_XDECREF(column);
    return NULL;
}

/* unpack_columns(group, classes, model_of, ModelState): rows.py's unpack_columns, in C. */
PyObject *
speedups_unpack_columns(PyObject *module, PyObject *args)
{
    PyObject *group, *classes, *model_of, *model_state;
    if (!PyArg_ParseTuple(args, "OO!OO:unpack_columns", &group, &PyDict_Type, &classes,
                          &model_of, &model_state))
        return NULL;
    if (names_ready() < 0)
        return NULL;
    return unpack_group(group, classes, model_of, model_state);
}
