/* django_mcpatterns.core.protocol._speedups: the compiled hot path (see speedups.h).
 * compiled.py imports it, binds it to the pure modules' classes and decides whether
 * it is used (the DJANGO_MCPATTERNS_PURE_PYTHON switch). */
#include "speedups.h"

Bound B;

/* The interpreter B belongs to.  B is one per process (single-phase init): another
 * interpreter (mod_wsgi's application groups) binding its own classes would make every
 * interpreter's replies and errors that one's, and dangle once it is destroyed.  So the
 * first binding wins; another interpreter's bind() raises ImportError and compiled.py
 * runs the pure-Python path there. */
static int64_t bound_by = -1;

/* Bumped whenever what compiled.py expects of this module changes. */
#define ABI 10

static PyObject *
bind(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"ProtocolError", "ConnectionClosedError", "ErrorReply", "MetaReply",
                            "Value", "NEED_DATA", "Get", "Store", NULL};
    PyObject *o[8];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOO:bind", names, &o[0], &o[1], &o[2],
                                     &o[3], &o[4], &o[5], &o[6], &o[7]))
        return NULL;
    int64_t here = PyInterpreterState_GetID(PyInterpreterState_Get());
    if (here < 0)
        return NULL;
    if (B.bound && bound_by != here) {
        PyErr_SetString(PyExc_ImportError,
                        "the compiled hot path is bound to another interpreter's classes");
        return NULL;
    }
    if (!PyType_Check(o[4]) || !PyType_IsSubtype((PyTypeObject *)o[4], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "Value must be a tuple subclass");
        return NULL;
    }
    PyObject **slots[] = {&B.ProtocolError, &B.ClosedError, &B.ErrorReply, &B.MetaReply,
                          &B.Value, &B.NEED_DATA, &B.Get, &B.Store};
    for (int i = 0; i < 8; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    B.bound = 1;
    bound_by = here;
    Py_RETURN_NONE;
}

/* bind_meta(maker): meta replies made by ``maker`` (a Maker of MetaReply's four fields) rather
 * than by calling the class: its frozen dataclass __init__ sets each field through
 * object.__setattr__ (some 6k instructions a reply). */
static PyObject *
bind_meta(PyObject *module, PyObject *maker)
{
    if (!PyObject_TypeCheck(maker, &MakerType)) {
        PyErr_SetString(PyExc_TypeError, "bind_meta takes a Maker of MetaReply");
        return NULL;
    }
    Py_XSETREF(B.MetaReplyMaker, Py_NewRef(maker));
    Py_RETURN_NONE;
}

static PyMethodDef functions[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_VARARGS | METH_KEYWORDS,
     "Bind the parser to the classes it answers with (compiled.py does, in one interpreter)."},
    {"bind_meta", bind_meta, METH_O,
     "bind_meta(maker): meta replies made by a Maker of MetaReply (compiled.py)."},
    {"encode", speedups_encode, METH_O, "The bytes of a batch of requests, written at once."},
    {"keyed", speedups_keyed, METH_VARARGS, "keyed(keys, placed): {wire bytes: key as given}."},
    {"placed", (PyCFunction)(void (*)(void))speedups_placed, METH_FASTCALL,
     "placed(fallback, key): (wire, ring) bytes of a key; fallback(key) for any but plain ASCII."},
    {"decoded", speedups_decoded, METH_VARARGS,
     "decoded(values, direct, deserialize, cas): a get's values decoded, by key."},
    {"grouped", speedups_grouped, METH_VARARGS,
     "grouped(given, locate, known, routed): the wire bytes of keys by server."},
    {"hits", speedups_hits, METH_VARARGS,
     "hits(parts, given, cas, stale, refused, envelope): the fetched items by key as given."},
    {"trip", (PyCFunction)(void (*)(void))speedups_trip, METH_FASTCALL,
     "trip(cluster, node, request, decode, failed, admission): AsyncCluster's round trip."},
    {"resolve", speedups_resolve, METH_VARARGS,
     "resolve(waiters, result): a batch's result to its waiters, one loop callback for all."},
    {"pack_rows", speedups_pack_rows, METH_VARARGS,
     "pack_rows(rows, labels, label_of, Model): the ORM's cached rows, or None (rows.c)."},
    {"columns", speedups_columns, METH_O,
     "columns(rows): packed rows of one shape by column, or None (rows.c)."},
    {"unpack_columns", speedups_unpack_columns, METH_VARARGS,
     "unpack_columns(group, classes, model_of, ModelState): fresh instances (rows.c)."},
    {"unpack_rows", speedups_unpack_rows, METH_VARARGS,
     "unpack_rows(rows, classes, model_of, ModelState): the rows' instances, fresh (rows.c)."},
    {"shape_bind", speedups_shape_bind, METH_VARARGS,
     "shape_bind(handlers, atom, sequence, mapping, attributes, lookup, names, handler, "
     "skipped, lookup_skipped, field, klass, col): orm/shape.py's walk, bound once (shape.c)."},
    {"shape_walk", (PyCFunction)(void (*)(void))speedups_shape_walk, METH_FASTCALL,
     "shape_walk(value, shape): orm/shape.py's _walk, in C."},
    {"shape_named", (PyCFunction)(void (*)(void))speedups_shape_named, METH_FASTCALL,
     "shape_named(state, names, shape): each name and its value walked, in C."},
    {"bind_trip", speedups_bind_trip, METH_VARARGS,
     "bind_trip(Batch, CancelledError, get_running_loop, answered, MISS, armed) (aio.py)."},
    {"bind_near", speedups_bind_near, METH_VARARGS,
     "bind_near(Entry, NearTable, MISS, deque, lock type, str size, bytes size, overhead)."},
    {"near_hit", (PyCFunction)(void (*)(void))speedups_near_hit, METH_FASTCALL,
     "near_hit(table, key): table.hit(key), in C."},
    {"near_missed", speedups_near_missed, METH_O, "near_missed(table): table.missed(), in C."},
    {"look_first", (PyCFunction)(void (*)(void))speedups_look_first, METH_FASTCALL,
     "look_first(flag=None): force the exchange to look for a reply before releasing the GIL "
     "(True), never (False), or as the near cache's reads judge (None); returns whether it "
     "looks first now."},
    {"near_untrack", speedups_near_untrack, METH_O,
     "near_untrack(entry): the entry, not followed by the cycle collector."},
    {"near_fill", (PyCFunction)(void (*)(void))speedups_near_fill, METH_FASTCALL,
     "near_fill(table, key, value, ticket): table.fill(key, value, ticket), its common case in C."},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "django_mcpatterns.core.protocol._speedups",
    .m_doc = "The compiled hot path of the protocol layer (see compiled.py).",
    .m_size = -1,
    .m_methods = functions,
};

static int
intern(PyObject **slot, const char *text)
{
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

PyMODINIT_FUNC
PyInit__speedups(void)
{
    static const char *verbs[] = {"set", "add", "replace", "append", "prepend", "cas"};
    for (int i = 0; i < 6; i++)
        if (intern(&B.verbs[i], verbs[i]) < 0)
            return NULL;
    if (intern(&B.s_keys, "keys") < 0 || intern(&B.s_cas, "cas") < 0
        || intern(&B.s_command, "command") < 0 || intern(&B.s_key, "key") < 0
        || intern(&B.s_data, "data") < 0 || intern(&B.s_flags, "flags") < 0
        || intern(&B.s_expire, "expire") < 0 || intern(&B.s_cas_token, "cas_token") < 0
        || intern(&B.s_read, "read") < 0 || intern(&B.s_encode, "encode") < 0
        || intern(&B.s_matches, "matches") < 0 || intern(&B.s_quiet, "quiet") < 0
        || intern(&B.s_QUIETED, "QUIETED") < 0 || intern(&B.s_STATUSES, "STATUSES") < 0
        || intern(&B.k_error, "ERROR") < 0 || intern(&B.k_client_error, "CLIENT_ERROR") < 0
        || intern(&B.k_server_error, "SERVER_ERROR") < 0)
        return NULL;
    if (PyType_Ready(&ReaderType) < 0 || PyType_Ready(&MakerType) < 0
        || PyType_Ready(&TripType) < 0
        || PyType_Ready(&ValueDecoderType) < 0
        || PyType_Ready(&RunnerType) < 0
        || PyType_Ready(&WaiterType) < 0 || PyType_Ready(&WaiterIterType) < 0
        || PyType_Ready(&WakeupsType) < 0)
        return NULL;
    static int at_fork;  /* registered once per process */
    if (!at_fork && look_first_init() != 0) {
        PyErr_SetString(PyExc_RuntimeError, "pthread_atfork failed");
        return NULL;
    }
    at_fork = 1;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Reader", (PyObject *)&ReaderType) < 0
        || PyModule_AddObjectRef(module, "Maker", (PyObject *)&MakerType) < 0
        || PyModule_AddObjectRef(module, "Trip", (PyObject *)&TripType) < 0
        || PyModule_AddObjectRef(module, "ValueDecoder", (PyObject *)&ValueDecoderType) < 0
        || PyModule_AddObjectRef(module, "Runner", (PyObject *)&RunnerType) < 0
        || PyModule_AddObjectRef(module, "Waiter", (PyObject *)&WaiterType) < 0
        || PyModule_AddIntConstant(module, "ABI", ABI) < 0
        || PyModule_AddIntConstant(module, "MAX_VALUE_LENGTH", MAX_VALUE_LENGTH) < 0) {
        Py_DECREF(module);
        return NULL;
    }
#ifdef Py_GIL_DISABLED
    /* Not yet declared free-threading safe: docs/architecture.md says what it must lock. */
    PyUnstable_Module_SetGIL(module, Py_MOD_GIL_USED);
#endif
    return module;
}
