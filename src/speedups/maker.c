/* Maker: a frozen slots dataclass's instance from all its fields, in C.
 *
 * The generated __init__ of a frozen dataclass sets each field through
 * object.__setattr__, some 1,500 instructions a field; the requests of the hot
 * path (a get's Get, a set's Store, a set_many's hundred Stores) are made here
 * instead, each field stored by its slot's member descriptor.  compiled.py only
 * makes a Maker for a class whose __init__ does nothing else (no __post_init__,
 * every field a slot, given in order). */
#include "speedups.h"
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyTypeObject *cls;
    Py_ssize_t n;
    PyMemberDef **members;
    vectorcallfunc vectorcall;
} Maker;

static PyObject *
maker_vectorcall(Maker *m, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n != m->n || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_Format(PyExc_TypeError, "%s maker takes its %zd fields, positionally",
                     m->cls->tp_name, m->n);
        return NULL;
    }
    PyObject *obj = m->cls->tp_alloc(m->cls, 0);
    if (obj == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyMember_SetOne((char *)obj, m->members[i], args[i]) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
    return obj;
}

static PyObject *
maker_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *cls, *names;
    if (!PyArg_ParseTuple(args, "O!O:Maker", &PyType_Type, &cls, &names))
        return NULL;
    PyObject *seq = PySequence_Fast(names, "field names");
    if (seq == NULL)
        return NULL;
    Maker *m = (Maker *)type->tp_alloc(type, 0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (m == NULL || (m->members = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyMemberDef *))) == NULL) {
        Py_DECREF(seq);
        Py_XDECREF(m);
        return m == NULL ? NULL : PyErr_NoMemory();
    }
    m->cls = (PyTypeObject *)Py_NewRef(cls);
    m->n = n;
    m->vectorcall = (vectorcallfunc)maker_vectorcall;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *descr = PyObject_GetAttr(cls, PySequence_Fast_GET_ITEM(seq, i));
        int ok = descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)
                 && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (ok)
            m->members[i] = ((PyMemberDescrObject *)descr)->d_member;
        Py_XDECREF(descr);
        if (!ok) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "every field must be a slot");
            Py_DECREF(seq);
            Py_DECREF(m);
            return NULL;
        }
    }
    Py_DECREF(seq);
    return (PyObject *)m;
}

static void
maker_dealloc(Maker *m)
{
    Py_XDECREF(m->cls);
    PyMem_Free(m->members);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

PyTypeObject MakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "django_mcpatterns.core.protocol._speedups.Maker",
    .tp_basicsize = sizeof(Maker),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Maker(cls, fields): make cls's instances from all their fields, positionally.",
    .tp_new = maker_new,
    .tp_dealloc = (destructor)maker_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Maker, vectorcall),
};
