/* Waiter: the future a Trip waits on for its key's batch, lighter than asyncio's.
 *
 * An asyncio.Future costs a get two things beyond the Trip's own work: its
 * __init__ (which asks the loop for get_debug(), a Python call), and, when the
 * batch's reply comes, set_result()'s loop.call_soon() for the task's wakeup (a
 * Handle made by Python code).  Fifty tasks waiting on one batch paid that fifty
 * times.  A Waiter is the "Future-compatible" object asyncio's tasks accept (an
 * `_asyncio_future_blocking` attribute, get_loop, add_done_callback, cancel,
 * result ...), made in C, and resolve(waiters, result) hands a whole batch's
 * results out with ONE loop.call_soon, whose callback runs each waiting task's
 * wakeup in that task's own context, in the order the callbacks were added, as
 * separate call_soon()s would have.  A Waiter cancelled, failed or resolved on its
 * own (set_result, set_exception) schedules its callbacks one by one, as a Future
 * does.  Each caller keeps a waiter of its own: one cancelled task never touches
 * another's.  It is awaitable, as asyncio.isfuture() promises, and keeps a Future's
 * rules where Python code can run mid-method (a callback's __eq__). */
#include "speedups.h"
#include <stddef.h>

enum { PENDING, FINISHED, CANCELLED };

typedef struct {
    PyObject_HEAD
    PyObject *loop;
    PyObject *result, *exception, *cancel_msg;
    PyObject *fn0, *ctx0;  /* the first callback and its context (a task's wakeup) */
    PyObject *callbacks;   /* list of (fn, context) tuples: any further ones, or NULL */
    int state, blocking;
} Waiter;

static PyObject *s_call_soon, *s_call_exception_handler, *k_context, *CancelledError,
    *InvalidStateError;

static int
waiter_intern(void)
{
    if (s_call_soon != NULL)
        return 0;
    if ((s_call_soon = PyUnicode_InternFromString("call_soon")) == NULL
        || (s_call_exception_handler = PyUnicode_InternFromString("call_exception_handler"))
               == NULL
        || (k_context = Py_BuildValue("(s)", "context")) == NULL)
        return -1;
    PyObject *asyncio = PyImport_ImportModule("asyncio");
    if (asyncio == NULL)
        return -1;
    CancelledError = PyObject_GetAttrString(asyncio, "CancelledError");
    InvalidStateError = CancelledError ? PyObject_GetAttrString(asyncio, "InvalidStateError")
                                       : NULL;
    Py_DECREF(asyncio);
    return InvalidStateError == NULL ? -1 : 0;
}

/* loop.call_soon(fn, arg, context=context) */
static int
call_soon(PyObject *loop, PyObject *fn, PyObject *arg, PyObject *context)
{
    PyObject *args[] = {loop, fn, arg, context};
    PyObject *handle = PyObject_VectorcallMethod(s_call_soon, args, 3, k_context);
    Py_XDECREF(handle);
    return handle == NULL ? -1 : 0;
}

/* Done now: each callback scheduled on its own (cancelled, failed, resolved alone). */
static int
waiter_schedule(Waiter *w)
{
    PyObject *fn0 = w->fn0, *ctx0 = w->ctx0, *callbacks = w->callbacks;
    w->fn0 = w->ctx0 = w->callbacks = NULL;
    int rc = fn0 == NULL ? 0 : call_soon(w->loop, fn0, (PyObject *)w, ctx0);
    Py_XDECREF(fn0);
    Py_XDECREF(ctx0);
    if (callbacks == NULL)
        return rc;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(callbacks) && rc == 0; i++) {
        PyObject *pair = PyList_GET_ITEM(callbacks, i);
        rc = call_soon(w->loop, PyTuple_GET_ITEM(pair, 0), (PyObject *)w, PyTuple_GET_ITEM(pair, 1));
    }
    Py_DECREF(callbacks);
    return rc;
}

PyObject *
waiter_new(PyObject *loop)
{
    extern PyTypeObject WaiterType;
    if (waiter_intern() < 0)
        return NULL;
    Waiter *w = PyObject_GC_New(Waiter, &WaiterType);
    if (w == NULL)
        return NULL;
    w->loop = Py_NewRef(loop);
    w->result = w->exception = w->cancel_msg = w->callbacks = w->fn0 = w->ctx0 = NULL;
    w->state = PENDING;
    w->blocking = 0;
    PyObject_GC_Track(w);
    return (PyObject *)w;
}

/* For the Trip: 1 finished (*result: its result, new), 0 pending, -1 an error set
 * (its exception, or a CancelledError). */
int
waiter_outcome(PyObject *self, PyObject **result)
{
    Waiter *w = (Waiter *)self;
    *result = NULL;
    if (w->state == PENDING) {
        w->blocking = 1;  /* yielded again: a task waits on it */
        return 0;
    }
    if (w->state == CANCELLED) {
        /* made here, not by PyErr_SetObject: a tuple message stays one argument */
        PyObject *exc = w->cancel_msg != NULL && w->cancel_msg != Py_None
                            ? PyObject_CallOneArg(CancelledError, w->cancel_msg)
                            : PyObject_CallNoArgs(CancelledError);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return -1;
    }
    if (w->exception != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(w->exception), w->exception);
        return -1;
    }
    *result = Py_NewRef(w->result);
    return 1;
}

void
waiter_block(PyObject *self)
{
    ((Waiter *)self)->blocking = 1;
}

/* -- the Future-compatible methods ---------------------------------------------------- */

static PyObject *
waiter_result(Waiter *w, PyObject *unused)
{
    if (w->state == PENDING) {
        PyErr_SetString(InvalidStateError, "Result is not ready.");
        return NULL;
    }
    PyObject *result;
    return waiter_outcome((PyObject *)w, &result) < 0 ? NULL : result;
}

static PyObject *
waiter_exception(Waiter *w, PyObject *unused)
{
    if (w->state == PENDING) {
        PyErr_SetString(InvalidStateError, "Exception is not set.");
        return NULL;
    }
    if (w->state == CANCELLED) {
        PyObject *result;
        waiter_outcome((PyObject *)w, &result);
        return NULL;
    }
    return Py_NewRef(w->exception ? w->exception : Py_None);
}

static PyObject *
waiter_set_result(Waiter *w, PyObject *value)
{
    if (w->state != PENDING) {
        PyErr_SetString(InvalidStateError, "invalid state");
        return NULL;
    }
    w->result = Py_NewRef(value);
    w->state = FINISHED;
    if (waiter_schedule(w) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
waiter_set_exception(Waiter *w, PyObject *exc)
{
    if (w->state != PENDING) {
        PyErr_SetString(InvalidStateError, "invalid state");
        return NULL;
    }
    if (!PyExceptionInstance_Check(exc)) {
        PyErr_SetString(PyExc_TypeError, "a Waiter's exception is an exception instance");
        return NULL;
    }
    w->exception = Py_NewRef(exc);
    w->state = FINISHED;
    if (waiter_schedule(w) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
waiter_cancel(Waiter *w, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"msg", NULL};
    PyObject *msg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:cancel", names, &msg))
        return NULL;
    if (w->state != PENDING)
        Py_RETURN_FALSE;
    w->state = CANCELLED;
    w->cancel_msg = Py_NewRef(msg);
    if (waiter_schedule(w) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* add_done_callback(fn, *, context=None) */
static PyObject *
waiter_add_done_callback(Waiter *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *context = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs != 1 || nkw > 1
        || (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "context"))) {
        PyErr_SetString(PyExc_TypeError, "add_done_callback(fn, *, context=None)");
        return NULL;
    }
    if (nkw == 1)
        context = args[1];
    PyObject *fn = args[0];
    PyObject *ctx = context == Py_None ? PyContext_CopyCurrent() : Py_NewRef(context);
    if (ctx == NULL)
        return NULL;
    int rc;
    if (w->state != PENDING)
        rc = call_soon(w->loop, fn, (PyObject *)w, ctx);
    else if (w->fn0 == NULL && (w->callbacks == NULL || PyList_GET_SIZE(w->callbacks) == 0)) {
        w->fn0 = Py_NewRef(fn);
        w->ctx0 = Py_NewRef(ctx);
        rc = 0;
    }
    else {
        PyObject *pair = PyTuple_Pack(2, fn, ctx);
        if (pair != NULL && w->callbacks == NULL)
            w->callbacks = PyList_New(0);
        rc = pair == NULL || w->callbacks == NULL ? -1 : PyList_Append(w->callbacks, pair);
        Py_XDECREF(pair);
    }
    Py_DECREF(ctx);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The first slot is the first callback added: when it is empty and the list is not, the
 * list's head moves into it (callbacks run in the order added). */
static int
waiter_promote(Waiter *w)
{
    if (w->state != PENDING || w->fn0 != NULL || w->callbacks == NULL
        || PyList_GET_SIZE(w->callbacks) == 0)
        return 0;
    PyObject *pair = PyList_GET_ITEM(w->callbacks, 0);
    w->fn0 = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
    w->ctx0 = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
    return PyList_SetSlice(w->callbacks, 0, 1, NULL);
}

/* Each comparison runs Python (__eq__), which may add, remove, or resolve the waiter
 * (its callbacks then gone): what is compared is held, and the callbacks are looked at
 * again after each comparison. */
static PyObject *
waiter_remove_done_callback(Waiter *w, PyObject *fn)
{
    Py_ssize_t removed = 0;
    if (w->fn0 != NULL) {
        PyObject *fn0 = Py_NewRef(w->fn0);
        int same = PyObject_RichCompareBool(fn0, fn, Py_EQ);
        if (same > 0 && w->fn0 == fn0) {
            Py_CLEAR(w->fn0);
            Py_CLEAR(w->ctx0);
            removed++;
        }
        Py_DECREF(fn0);
        if (same < 0)
            return NULL;
    }
    if (w->callbacks != NULL) {
        PyObject *list = Py_NewRef(w->callbacks);
        PyObject *kept = PyList_New(0);
        if (kept == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        Py_ssize_t found = 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list) && w->callbacks == list; i++) {
            PyObject *pair = Py_NewRef(PyList_GET_ITEM(list, i));
            int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(pair, 0), fn, Py_EQ);
            if (same < 0 || (!same && PyList_Append(kept, pair) < 0)) {
                Py_DECREF(pair);
                Py_DECREF(kept);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(pair);
            found += same;
        }
        if (w->callbacks == list) {  /* unchanged but for appends, all looked at */
            Py_SETREF(w->callbacks, kept);
            removed += found;
        }
        else
            Py_DECREF(kept);  /* resolved, or replaced by a nested removal: that one stands */
        Py_DECREF(list);
    }
    if (waiter_promote(w) < 0)
        return NULL;
    return PyLong_FromSsize_t(removed);
}

static PyObject *
waiter_done(Waiter *w, PyObject *unused)
{
    return PyBool_FromLong(w->state != PENDING);
}

static PyObject *
waiter_cancelled(Waiter *w, PyObject *unused)
{
    return PyBool_FromLong(w->state == CANCELLED);
}

static PyObject *
waiter_get_loop(Waiter *w, PyObject *unused)
{
    return Py_NewRef(w->loop);
}

static PyObject *
waiter_get_blocking(Waiter *w, void *closure)
{
    return PyBool_FromLong(w->blocking);
}

static int
waiter_set_blocking(Waiter *w, PyObject *value, void *closure)
{
    int truth = value == NULL ? 0 : PyObject_IsTrue(value);
    if (truth < 0)
        return -1;
    w->blocking = truth;
    return 0;
}

static PyObject *
waiter_get_loop_attr(Waiter *w, void *closure)
{
    return Py_NewRef(w->loop);
}

static int
waiter_traverse(Waiter *w, visitproc visit, void *arg)
{
    Py_VISIT(w->loop);
    Py_VISIT(w->result);
    Py_VISIT(w->exception);
    Py_VISIT(w->cancel_msg);
    Py_VISIT(w->callbacks);
    Py_VISIT(w->fn0);
    Py_VISIT(w->ctx0);
    return 0;
}

static int
waiter_clear(Waiter *w)
{
    Py_CLEAR(w->fn0);
    Py_CLEAR(w->ctx0);
    Py_CLEAR(w->loop);
    Py_CLEAR(w->result);
    Py_CLEAR(w->exception);
    Py_CLEAR(w->cancel_msg);
    Py_CLEAR(w->callbacks);
    return 0;
}

static void
waiter_dealloc(Waiter *w)
{
    PyObject_GC_UnTrack(w);
    waiter_clear(w);
    PyObject_GC_Del(w);
}

/* -- await waiter: yields the waiter while pending, as Future.__await__ does ------------ */

typedef struct {
    PyObject_HEAD
    Waiter *waiter;  /* NULL once it has answered */
    int yielded;
} WaiterIter;

static PyObject *
waiter_iter_next(WaiterIter *it)
{
    Waiter *w = it->waiter;
    if (w == NULL)
        return NULL;
    if (w->state == PENDING) {
        if (!it->yielded) {
            it->yielded = 1;
            w->blocking = 1;
            return Py_NewRef(w);
        }
        PyErr_SetString(PyExc_RuntimeError, "await wasn't used with future");
        Py_CLEAR(it->waiter);
        return NULL;
    }
    PyObject *result;
    int rc = waiter_outcome((PyObject *)w, &result);
    Py_CLEAR(it->waiter);
    if (rc < 0)
        return NULL;
    /* StopIteration(result) made here: a tuple result stays one value */
    PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, result);
    Py_DECREF(result);
    if (stop != NULL) {
        PyErr_SetObject(PyExc_StopIteration, stop);
        Py_DECREF(stop);
    }
    return NULL;
}

static PyObject *
waiter_iter_send(WaiterIter *it, PyObject *value)
{
    return waiter_iter_next(it);  /* as Future's iterator: what is sent is not looked at */
}

static int
waiter_iter_traverse(WaiterIter *it, visitproc visit, void *arg)
{
    Py_VISIT(it->waiter);
    return 0;
}

static int
waiter_iter_clear(WaiterIter *it)
{
    Py_CLEAR(it->waiter);
    return 0;
}

static void
waiter_iter_dealloc(WaiterIter *it)
{
    PyObject_GC_UnTrack(it);
    waiter_iter_clear(it);
    PyObject_GC_Del(it);
}

static PyMethodDef waiter_iter_methods[] = {
    {"send", (PyCFunction)waiter_iter_send, METH_O, NULL},
    {NULL},
};

PyTypeObject WaiterIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "django_mcpatterns.core.protocol._speedups.WaiterIter",
    .tp_basicsize = sizeof(WaiterIter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "What `await waiter` runs: the waiter yielded while pending, then its outcome.",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)waiter_iter_next,
    .tp_methods = waiter_iter_methods,
    .tp_traverse = (traverseproc)waiter_iter_traverse,
    .tp_clear = (inquiry)waiter_iter_clear,
    .tp_dealloc = (destructor)waiter_iter_dealloc,
};

static PyObject *
waiter_await(Waiter *w)
{
    WaiterIter *it = PyObject_GC_New(WaiterIter, &WaiterIterType);
    if (it == NULL)
        return NULL;
    it->waiter = (Waiter *)Py_NewRef(w);
    it->yielded = 0;
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

static PyAsyncMethods waiter_as_async = {.am_await = (unaryfunc)waiter_await};

static PyMethodDef waiter_methods[] = {
    {"result", (PyCFunction)waiter_result, METH_NOARGS, NULL},
    {"exception", (PyCFunction)waiter_exception, METH_NOARGS, NULL},
    {"set_result", (PyCFunction)waiter_set_result, METH_O, NULL},
    {"set_exception", (PyCFunction)waiter_set_exception, METH_O, NULL},
    {"cancel", (PyCFunction)(void (*)(void))waiter_cancel, METH_VARARGS | METH_KEYWORDS, NULL},
    {"add_done_callback", (PyCFunction)(void (*)(void))waiter_add_done_callback,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"remove_done_callback", (PyCFunction)waiter_remove_done_callback, METH_O, NULL},
    {"done", (PyCFunction)waiter_done, METH_NOARGS, NULL},
    {"cancelled", (PyCFunction)waiter_cancelled, METH_NOARGS, NULL},
    {"get_loop", (PyCFunction)waiter_get_loop, METH_NOARGS, NULL},
    {NULL},
};

static PyGetSetDef waiter_getset[] = {
    {"_asyncio_future_blocking", (getter)waiter_get_blocking, (setter)waiter_set_blocking, NULL,
     NULL},
    {"_loop", (getter)waiter_get_loop_attr, NULL, NULL, NULL},
    {NULL},
};

PyTypeObject WaiterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "django_mcpatterns.core.protocol._speedups.Waiter",
    .tp_basicsize = sizeof(Waiter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A Trip's future: Future-compatible, resolved a batch at a time (see waiter.c).",
    .tp_as_async = &waiter_as_async,
    .tp_iter = (getiterfunc)waiter_await,
    .tp_methods = waiter_methods,
    .tp_getset = waiter_getset,
    .tp_traverse = (traverseproc)waiter_traverse,
    .tp_clear = (inquiry)waiter_clear,
    .tp_dealloc = (destructor)waiter_dealloc,
};

/* -- a batch's wakeups, one loop callback -------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *loop;
    PyObject *calls;  /* list of (fn, waiter, context) */
} Wakeups;

static PyObject *
wakeups_call(Wakeups *k, PyObject *args, PyObject *kwargs)
{
    PyObject *calls = k->calls;
    k->calls = NULL;
    if (calls == NULL)
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(calls), i = 0;
    PyObject *failure = NULL;
    for (; i < n; i++) {
        PyObject *call = PyList_GET_ITEM(calls, i);
        PyObject *ctx = PyTuple_GET_ITEM(call, 2);
        if (PyContext_Enter(ctx) < 0)
            break;
        PyObject *done = PyObject_CallOneArg(PyTuple_GET_ITEM(call, 0), PyTuple_GET_ITEM(call, 1));
        if (PyContext_Exit(ctx) < 0) {
            Py_XDECREF(done);
            break;
        }
        if (done != NULL) {
            Py_DECREF(done);
            continue;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            break;  /* SystemExit, KeyboardInterrupt: out, the rest scheduled again */
        /* as Handle._run: the loop's exception handler hears of it */
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        PyObject *context = Py_BuildValue("{s:s,s:O}", "message",
                                          "Exception in a batch's wakeup callback", "exception",
                                          exc ? exc : Py_None);
        PyObject *handled = context ? PyObject_CallMethodOneArg(k->loop, s_call_exception_handler,
                                                                context)
                                    : NULL;
        if (handled == NULL)
            PyErr_WriteUnraisable((PyObject *)k);
        Py_XDECREF(handled);
        Py_XDECREF(context);
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
    }
    if (i < n) {  /* stopped by an error: the wakeups not run yet still run, later */
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        for (Py_ssize_t j = i + 1; j < n; j++) {
            PyObject *call = PyList_GET_ITEM(calls, j);
            if (call_soon(k->loop, PyTuple_GET_ITEM(call, 0), PyTuple_GET_ITEM(call, 1),
                          PyTuple_GET_ITEM(call, 2))
                < 0)
                PyErr_WriteUnraisable((PyObject *)k);
        }
        PyErr_Restore(type, exc, tb);
        failure = calls;
    }
    Py_DECREF(calls);
    if (failure != NULL)
        return NULL;
    Py_RETURN_NONE;
}

static int
wakeups_traverse(Wakeups *k, visitproc visit, void *arg)
{
    Py_VISIT(k->loop);
    Py_VISIT(k->calls);
    return 0;
}

static int
wakeups_clear(Wakeups *k)
{
    Py_CLEAR(k->loop);
    Py_CLEAR(k->calls);
    return 0;
}

static void
wakeups_dealloc(Wakeups *k)
{
    PyObject_GC_UnTrack(k);
    wakeups_clear(k);
    PyObject_GC_Del(k);
}

PyTypeObject WakeupsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "django_mcpatterns.core.protocol._speedups.Wakeups",
    .tp_basicsize = sizeof(Wakeups),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The wakeups of a batch's waiting tasks, run as one loop callback.",
    .tp_call = (ternaryfunc)wakeups_call,
    .tp_traverse = (traverseproc)wakeups_traverse,
    .tp_clear = (inquiry)wakeups_clear,
    .tp_dealloc = (destructor)wakeups_dealloc,
};

/* resolve(waiters, result): every waiter still pending gets `result`; a Waiter's
 * callbacks run from one loop.call_soon, any other future's set_result() is its own. */
PyObject *
speedups_resolve(PyObject *module, PyObject *args)
{
    PyObject *waiters, *result;
    if (!PyArg_ParseTuple(args, "O!O:resolve", &PyList_Type, &waiters, &result))
        return NULL;
    if (waiter_intern() < 0)
        return NULL;
    PyObject *calls = NULL, *loop = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(waiters); i++) {
        PyObject *item = PyList_GET_ITEM(waiters, i);
        if (!Py_IS_TYPE(item, &WaiterType)) {  /* an asyncio future: as channel.py does */
            Py_INCREF(item);
            PyObject *done = PyObject_CallMethod(item, "done", NULL);
            int finished = done ? PyObject_IsTrue(done) : -1;
            Py_XDECREF(done);
            PyObject *set = finished == 0 ? PyObject_CallMethod(item, "set_result", "O", result)
                                          : NULL;
            Py_DECREF(item);
            if (finished < 0 || (finished == 0 && set == NULL))
                goto fail;
            Py_XDECREF(set);
            continue;
        }
        Waiter *w = (Waiter *)item;
        if (w->state != PENDING)
            continue;  /* a cancelled caller's waiter is dropped */
        w->result = Py_NewRef(result);
        w->state = FINISHED;
        PyObject *fn0 = w->fn0, *ctx0 = w->ctx0, *callbacks = w->callbacks;
        w->fn0 = w->ctx0 = w->callbacks = NULL;
        if (fn0 == NULL && callbacks == NULL)
            continue;
        if (loop == NULL)
            loop = Py_NewRef(w->loop);
        int rc = 0;
        Py_ssize_t count = callbacks ? PyList_GET_SIZE(callbacks) : 0;
        for (Py_ssize_t j = fn0 ? -1 : 0; j < count && rc == 0; j++) {
            PyObject *fn = j < 0 ? fn0 : PyTuple_GET_ITEM(PyList_GET_ITEM(callbacks, j), 0);
            PyObject *ctx = j < 0 ? ctx0 : PyTuple_GET_ITEM(PyList_GET_ITEM(callbacks, j), 1);
            if (w->loop != loop) {
                rc = call_soon(w->loop, fn, item, ctx);
                continue;
            }
            if (calls == NULL && (calls = PyList_New(0)) == NULL) {
                rc = -1;
                break;
            }
            PyObject *call = PyTuple_Pack(3, fn, item, ctx);
            rc = call == NULL ? -1 : PyList_Append(calls, call);
            Py_XDECREF(call);
        }
        Py_XDECREF(fn0);
        Py_XDECREF(ctx0);
        Py_XDECREF(callbacks);
        if (rc < 0)
            goto fail;
    }
    if (calls != NULL && PyList_GET_SIZE(calls) > 0) {
        Wakeups *k = PyObject_GC_New(Wakeups, &WakeupsType);
        if (k == NULL)
            goto fail;
        k->loop = Py_NewRef(loop);
        k->calls = calls;
        calls = NULL;
        PyObject_GC_Track(k);
        PyObject *args[] = {loop, (PyObject *)k};
        PyObject *handle = PyObject_VectorcallMethod(s_call_soon, args, 2, NULL);
        Py_DECREF(k);
        if (handle == NULL)
            goto fail;
        Py_DECREF(handle);
    }
    Py_XDECREF(calls);
    Py_XDECREF(loop);
    Py_RETURN_NONE;
fail:
    if (calls != NULL) {  /* the wakeups collected still run, each on its own */
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(calls); j++) {
            PyObject *call = PyList_GET_ITEM(calls, j);
            if (call_soon(loop, PyTuple_GET_ITEM(call, 0), PyTuple_GET_ITEM(call, 1),
                          PyTuple_GET_ITEM(call, 2))
                < 0)
                PyErr_WriteUnraisable(call);
        }
        PyErr_Restore(type, exc, tb);
    }
    Py_XDECREF(calls);
    Py_XDECREF(loop);
    return NULL;
}
