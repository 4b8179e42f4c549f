/* Trip: AsyncCluster's round trip of a lone get/gets on a healthy server, as one C
 * awaitable (the twin of AsyncCluster._trip's hot path in client/aio.py).
 *
 * The coroutine _trip costs a Python frame per get, the largest of the async hot
 * path; with fifty tasks each awaiting its get, that frame is most of our cost per
 * get beyond the event loop's own.  A Trip does what _trip does when nothing is
 * special: the key joins its channel's batch (channel.fetch_one), the caller's
 * future is awaited through the future's own iterator (so a task sees an ordinary
 * future), and the batch's value for the key is decoded.  Anything else goes to
 * the Python methods, unchanged:
 *   - before the first step, a request that is not one key's Get, no decoder, an
 *     observer, a probe, a fork not yet seen, or no live channel of this loop:
 *     the Trip delegates to the coroutine _trip(...) itself;
 *   - an exception from fetch_one, the future or the decoder (a CancelledError
 *     excepted, which propagates as it does from _trip: no observer, no probe):
 *     the Trip delegates to the coroutine _failed(...), with _trip's arguments.
 * Delegating is `yield from` by hand: send, throw and close go to the coroutine.
 * A Trip is registered as a collections.abc.Coroutine (aio.py), so a task can
 * run one as it runs the coroutine it replaces. */
#include "speedups.h"
#include <stddef.h>
#include <structmember.h>

/* What aio.py binds (bind_trip): its classes and functions. */
static struct {
    PyObject *Batch, *CancelledError, *get_running_loop, *answered, *MISS, *armed;
    PyObject *completed, *Future, *create_future, *k_loop;
    PyObject *s_in_flight, *s_open_batch, *s_enqueue, *s_loop, *s_create_future, *s_sent_under,
        *s_waiters, *s_read;
    PyObject *s_links, *s_channels, *s_broken, *s_fetch_one, *s_values, *s_health,
        *s_failures, *s_shared, *s_observer, *s_probe, *s_trip, *s_failed, *s_throw,
        *s_close;
    int bound;
} T;

enum { NEW, WAIT, SUB, DONE };

/* An attribute read through a cache of its slot: the hot path's objects (a Call, a Get,
 * a Batch, a Node and its health, an Admission) keep their fields in __slots__, whose
 * member descriptors PyObject_GetAttr finds again on every read.  The cache remembers,
 * for the last type seen, where the slot is; any other type (or an empty slot) is read
 * by PyObject_GetAttr, so a subclass or another object answers as Python would. */
typedef struct {
    PyTypeObject *type;  /* strong reference */
    Py_ssize_t offset;
} SlotCache;

static PyObject *
slot_read(PyObject *obj, PyObject *name, SlotCache *c)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type != c->type) {
        PyObject *d = _PyType_Lookup(type, name);  /* borrowed */
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX
            || (((PyMemberDescrObject *)d)->d_member->flags & PY_AUDIT_READ)
            || !PyObject_TypeCheck(obj, PyDescr_TYPE(d)))  /* another class's slot */
            return PyObject_GetAttr(obj, name);
        c->offset = ((PyMemberDescrObject *)d)->d_member->offset;  /* d is borrowed */
        Py_XSETREF(c->type, (PyTypeObject *)Py_NewRef(type));
    }
    PyObject *value = *(PyObject **)((char *)obj + c->offset);
    return value != NULL ? Py_NewRef(value) : PyObject_GetAttr(obj, name);
}

/* One cache per place an attribute is read. */
static SlotCache c_values, c_health, c_failures, c_keys, c_probe, c_links, c_channels, c_cas,
    c_batch_cas, c_sent_under, c_batch_keys, c_waiters, c_run_health, c_open, c_request,
    c_decode, c_failed, c_ring, c_in_flight, c_open_batch, c_loop, c_broken;
#define SLOT(obj, name, cache) slot_read((obj), (name), &(cache))

static int intern(PyObject **slot, const char *text);

typedef struct {
    PyObject_HEAD
    PyObject *cluster, *node, *request, *decode, *failed, *admission;
    PyObject *kb;       /* the key's wire bytes (WAIT) */
    PyObject *channel;  /* the channel the key was queued on (WAIT) */
    PyObject *it;       /* the future's iterator (WAIT, an asyncio future) */
    PyObject *waiter;   /* the Waiter (WAIT, a Waiter: waiter.c) */
    PyObject *sub;      /* the coroutine delegated to (SUB) */
    int state;
} Trip;

static void
trip_drop(Trip *t)
{
    Py_CLEAR(t->cluster);
    Py_CLEAR(t->node);
    Py_CLEAR(t->request);
    Py_CLEAR(t->decode);
    Py_CLEAR(t->failed);
    Py_CLEAR(t->admission);
    Py_CLEAR(t->kb);
    Py_CLEAR(t->channel);
    Py_CLEAR(t->it);
    Py_CLEAR(t->waiter);
    Py_CLEAR(t->sub);
}

static PySendResult
trip_done(Trip *t, PySendResult r)
{
    t->state = DONE;
    trip_drop(t);
    return r;
}

/* Send `arg` to the coroutine delegated to. */
static PySendResult
trip_sub_send(Trip *t, PyObject *arg, PyObject **result)
{
    PySendResult r = PyIter_Send(t->sub, arg, result);
    return r == PYGEN_NEXT ? r : trip_done(t, r);
}

static PySendResult
trip_delegate(Trip *t, PyObject *coro, PyObject **result)
{
    *result = NULL;
    if (coro == NULL)
        return trip_done(t, PYGEN_ERROR);
    Py_CLEAR(t->it);
    Py_CLEAR(t->waiter);
    Py_XSETREF(t->sub, coro);
    t->state = SUB;
    return trip_sub_send(t, Py_None, result);
}

/* The exception set went through _trip's `except`: a CancelledError propagates, any
 * other is judged by _failed (a server failure answers `failed`, or raises). */
static PySendResult
trip_failed(Trip *t, PyObject **result)
{
    *result = NULL;
    if (PyErr_ExceptionMatches(T.CancelledError))
        return trip_done(t, PYGEN_ERROR);
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL)
        PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    if (exc == NULL)
        return trip_done(t, PYGEN_ERROR);
    PyObject *args[] = {t->cluster, t->node,    t->channel ? t->channel : Py_None,
                        t->request, exc,        t->admission,
                        Py_True,    Py_True,    NULL,
                        t->failed,  Py_True};
    PyObject *zero = PyLong_FromLong(0);
    PyObject *coro = NULL;
    if (zero != NULL) {
        args[8] = zero;
        coro = PyObject_VectorcallMethod(T.s_failed, args, 11,
                                         NULL);
        Py_DECREF(zero);
    }
    Py_DECREF(exc);
    return trip_delegate(t, coro, result);
}

/* ValueDecoder(direct, slow, miss): a get's decoder (decoding.py's Decoders.value): one
 * item whose flags have a direct format (bytes, str, int: the serde adds nothing) is
 * decoded here by that format; anything else (a miss excepted: `miss`) goes to `slow`,
 * the Python decoder, which answers as it always does. */
typedef struct {
    PyObject_HEAD
    PyObject *direct, *slow, *miss;
    vectorcallfunc vectorcall;
} ValueDecoder;

/* The item's value by its direct format; NULL without an error: the slow decoder's. */
static PyObject *
decode_item(ValueDecoder *d, PyObject *item)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 3 || !PyDict_Check(d->direct))
        return NULL;
    PyObject *format = PyDict_GetItemWithError(d->direct, PyTuple_GET_ITEM(item, 1));
    if (format == NULL)
        return NULL;
    PyObject *data = PyTuple_GET_ITEM(item, 2);
    if (format == (PyObject *)&PyBytes_Type && PyBytes_CheckExact(data))
        return Py_NewRef(data);  /* bytes(data) is data itself */
    PyObject *value = PyObject_CallOneArg(format, PyTuple_GET_ITEM(item, 2));
    if (value == NULL && PyErr_ExceptionMatches(PyExc_ValueError))
        PyErr_Clear();  /* not what its flags say: the serde refuses it (the slow path) */
    return value;
}

static PyObject *
value_decoder_call(ValueDecoder *d, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "a decoder takes the reply");
        return NULL;
    }
    PyObject *reply = args[0];
    if (PyList_CheckExact(reply) && PyList_GET_SIZE(reply) == 0)
        return Py_NewRef(d->miss);
    if (PyList_CheckExact(reply)) {
        PyObject *value = decode_item(d, PyList_GET_ITEM(reply, 0));
        if (value != NULL || PyErr_Occurred())
            return value;
    }
    return PyObject_CallOneArg(d->slow, reply);
}

static PyObject *
value_decoder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *direct, *slow, *miss;
    if (!PyArg_ParseTuple(args, "O!OO:ValueDecoder", &PyDict_Type, &direct, &slow, &miss))
        return NULL;
    ValueDecoder *d = (ValueDecoder *)type->tp_alloc(type, 0);
    if (d == NULL)
        return NULL;
    d->direct = Py_NewRef(direct);
    d->slow = Py_NewRef(slow);
    d->miss = Py_NewRef(miss);
    d->vectorcall = (vectorcallfunc)value_decoder_call;
    return (PyObject *)d;
}

static int
value_decoder_traverse(ValueDecoder *d, visitproc visit, void *arg)
{
    Py_VISIT(d->direct);
    Py_VISIT(d->slow);
    Py_VISIT(d->miss);
    return 0;
}

static int
value_decoder_clear(ValueDecoder *d)
{
    Py_CLEAR(d->direct);
    Py_CLEAR(d->slow);
    Py_CLEAR(d->miss);
    return 0;
}

static void
value_decoder_dealloc(ValueDecoder *d)
{
    PyObject_GC_UnTrack(d);
    value_decoder_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

PyTypeObject ValueDecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "django_mcpatterns.core.protocol._speedups.ValueDecoder",
    .tp_basicsize = sizeof(ValueDecoder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ValueDecoder(direct, slow, miss): a get's decoder, plain formats in C.",
    .tp_new = value_decoder_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ValueDecoder, vectorcall),
    .tp_traverse = (traverseproc)value_decoder_traverse,
    .tp_clear = (inquiry)value_decoder_clear,
    .tp_dealloc = (destructor)value_decoder_dealloc,
};

/* The future's iterator answered `r` (its value in `res`): wait on, or finish. */
static PySendResult
trip_after(Trip *t, PySendResult r, PyObject *res, PyObject **result)
{
    if (r == PYGEN_NEXT) {
        *result = res;
        return r;
    }
    if (r == PYGEN_ERROR)
        return trip_failed(t, result);
    PyObject *batch = res, *reply = NULL, *value = NULL;
    if (Py_IS_TYPE(batch, (PyTypeObject *)T.Batch)) {
        PyObject *values = SLOT(batch, T.s_values, c_values);
        PyObject *item = values ? PyDict_GetItemWithError(values, t->kb) : NULL;
        if (values != NULL && !PyErr_Occurred()) {
            if (Py_IS_TYPE(t->decode, &ValueDecoderType)) {  /* no reply list to make */
                ValueDecoder *d = (ValueDecoder *)t->decode;
                value = item == NULL ? Py_NewRef(d->miss) : decode_item(d, item);
            }
            if (value == NULL && !PyErr_Occurred()) {
                reply = PyList_New(item != NULL);
                if (reply != NULL && item != NULL)
                    PyList_SET_ITEM(reply, 0, Py_NewRef(item));
            }
        }
        Py_XDECREF(values);
    }
    else
        reply = Py_NewRef(batch);  /* memcached's error reply: the decoder judges it */
    Py_DECREF(batch);
    if (reply != NULL) {
        value = PyObject_CallOneArg(t->decode, reply);
        Py_DECREF(reply);
    }
    if (value == NULL)
        return trip_failed(t, result);
    PyObject *health = SLOT(t->node, T.s_health, c_health);
    PyObject *failures = health ? SLOT(health, T.s_failures, c_failures) : NULL;
    Py_XDECREF(health);
    int failing = failures ? PyObject_IsTrue(failures) : -1;
    Py_XDECREF(failures);
    if (failing > 0) {  /* answered(node, observer, admission): a failing server is up */
        PyObject *shared = PyObject_GetAttr(t->cluster, T.s_shared);
        PyObject *observer = shared ? PyObject_GetAttr(shared, T.s_observer) : NULL;
        Py_XDECREF(shared);
        PyObject *done = observer ? PyObject_CallFunctionObjArgs(T.answered, t->node, observer,
                                                                  t->admission, NULL)
                                  : NULL;
        Py_XDECREF(observer);
        failing = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    if (failing < 0) {
        Py_DECREF(value);
        return trip_done(t, PYGEN_ERROR);
    }
    if (value == T.MISS)
        Py_SETREF(value, Py_NewRef(t->failed));
    *result = value;
    return trip_done(t, PYGEN_RETURN);
}

/* Whether the hot path applies: 1 yes, 0 no (_trip runs), -1 an error. */
static int
trip_plain(Trip *t)
{
    if (t->decode == Py_None || !PyObject_TypeCheck(t->request, (PyTypeObject *)B.Get))
        return 0;
    PyObject *keys = SLOT(t->request, B.s_keys, c_keys);
    if (keys == NULL)
        return -1;
    int one = (PyTuple_Check(keys) && PyTuple_GET_SIZE(keys) == 1)
              || (PyList_Check(keys) && PyList_GET_SIZE(keys) == 1);
    if (one)
        t->kb = Py_NewRef(PyTuple_Check(keys) ? PyTuple_GET_ITEM(keys, 0)
                                              : PyList_GET_ITEM(keys, 0));
    Py_DECREF(keys);
    if (!one)
        return 0;
    PyObject *armed = PySequence_GetItem(T.armed, 0);
    int ok = armed ? PyObject_IsTrue(armed) : -1;
    Py_XDECREF(armed);
    if (ok <= 0)
        return ok;  /* forked: _trip sees to it */
    PyObject *probe = SLOT(t->admission, T.s_probe, c_probe);
    int probing = probe ? PyObject_IsTrue(probe) : -1;
    Py_XDECREF(probe);
    ok = probing < 0 ? -1 : !probing;
    if (ok <= 0)
        return ok;
    PyObject *shared = PyObject_GetAttr(t->cluster, T.s_shared);
    PyObject *observer = shared ? PyObject_GetAttr(shared, T.s_observer) : NULL;
    Py_XDECREF(shared);
    ok = observer == NULL ? -1 : observer == Py_None;
    Py_XDECREF(observer);
    return ok;
}

/* A future of `loop`: a Waiter (waiter.c) when the loop's create_future() is asyncio's
 * own (which makes a plain Future), else the loop's own kind. */
static PyObject *
new_future(PyObject *loop)
{
    PyObject *make = _PyType_Lookup(Py_TYPE(loop), T.s_create_future);
    if (make == T.create_future)
        return waiter_new(loop);
    return PyObject_CallMethodNoArgs(loop, T.s_create_future);
}

/* Channel.fetch_one(kb, cas, read) of channel.py, the same steps in C: the batch that
 * will answer the key (one in flight it may share, else this iteration's open batch),
 * and a future of the caller's own on it. */
static PyObject *
fetch_one(PyObject *channel, PyObject *kb, PyObject *cas, PyObject *read)
{
    int want_cas = PyObject_IsTrue(cas);
    if (want_cas < 0)
        return NULL;
    PyObject *in_flight = SLOT(channel, T.s_in_flight, c_in_flight), *batch = NULL, *waiter = NULL;
    if (in_flight == NULL || !PyDict_Check(in_flight))
        goto fallback;
    batch = PyDict_GetItemWithError(in_flight, kb);
    if (batch == NULL && PyErr_Occurred())
        goto done;
    Py_XINCREF(batch);
    if (batch != NULL) {  /* batch.joinable(cas), as channel.py inlines it */
        int join = 1;
        if (want_cas) {
            PyObject *has = SLOT(batch, B.s_cas, c_batch_cas);
            join = has ? PyObject_IsTrue(has) : -1;
            Py_XDECREF(has);
        }
        if (join > 0) {
            PyObject *sent = SLOT(batch, T.s_sent_under, c_sent_under);
            PyObject *stamp = sent ? PyList_GetItem(T.completed, 0) : NULL;
            long under = stamp ? PyLong_AsLong(sent) : -1;
            if (stamp == NULL || (under == -1 && PyErr_Occurred()))
                join = -1;
            else if (under >= 0) {
                join = PyObject_RichCompareBool(sent, stamp, Py_EQ);
            }
            Py_XDECREF(sent);
        }
        if (join < 0)
            goto done;
        if (!join)
            Py_CLEAR(batch);
    }
    if (batch == NULL) {
        batch = SLOT(channel, T.s_open_batch, c_open_batch);
        if (batch == NULL)
            goto done;
        if (batch == Py_None) {
            Py_SETREF(batch, PyObject_CallOneArg(T.Batch, read));
            if (batch == NULL || PyObject_SetAttr(channel, T.s_open_batch, batch) < 0)
                goto done;
            PyObject *queued = PyObject_CallMethodOneArg(channel, T.s_enqueue, batch);
            if (queued == NULL)
                goto done;
            Py_DECREF(queued);
        }
        else if (PyObject_SetAttr(batch, T.s_read, Py_None) < 0)
            goto done;  /* another caller's key joins: the batch's own get is sent */
        PyObject *keys = SLOT(batch, B.s_keys, c_batch_keys);
        int stored = keys == NULL ? -1 : PyObject_SetItem(keys, kb, Py_None);
        Py_XDECREF(keys);
        if (stored < 0 || PyDict_SetItem(in_flight, kb, batch) < 0)
            goto done;
        if (want_cas && PyObject_SetAttr(batch, B.s_cas, Py_True) < 0)
            goto done;
    }
    PyObject *loop = SLOT(channel, T.s_loop, c_loop);
    waiter = loop ? new_future(loop) : NULL;
    Py_XDECREF(loop);
    PyObject *waiters = waiter ? SLOT(batch, T.s_waiters, c_waiters) : NULL;
    if (waiters == NULL || (PyList_Check(waiters) ? PyList_Append(waiters, waiter)
                                                  : -!PyErr_Format(PyExc_TypeError, "waiters")) < 0)
        Py_CLEAR(waiter);
    Py_XDECREF(waiters);
    goto done;
fallback:  /* not a channel of channel.py's making: its own method */
    if (in_flight != NULL || PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        PyObject *args[] = {channel, kb, cas, read};
        waiter = PyObject_VectorcallMethod(T.s_fetch_one, args, 4, NULL);
    }
done:
    Py_XDECREF(in_flight);
    Py_XDECREF(batch);
    return waiter;
}

/* The first step: queue the key on this loop's channel and wait on the future. */
static PySendResult
trip_start(Trip *t, PyObject **result)
{
    *result = NULL;
    int plain = trip_plain(t);
    if (plain < 0)
        return trip_done(t, PYGEN_ERROR);
    PyObject *channel = NULL;
    if (plain) {
        PyObject *loop = PyObject_CallNoArgs(T.get_running_loop);
        if (loop == NULL)
            return trip_done(t, PYGEN_ERROR);
        PyObject *links = SLOT(t->node, T.s_links, c_links);
        PyObject *channels = links ? SLOT(links, T.s_channels, c_channels) : NULL;
        Py_XDECREF(links);
        if (channels != NULL) {
            channel = PyDict_Check(channels) ? PyDict_GetItemWithError(channels, loop)
                                             : PyObject_GetItem(channels, loop);
            if (PyDict_Check(channels))
                Py_XINCREF(channel);
            else if (channel == NULL && PyErr_ExceptionMatches(PyExc_KeyError))
                PyErr_Clear();
            Py_DECREF(channels);
        }
        Py_DECREF(loop);
        if (PyErr_Occurred()) {
            Py_XDECREF(channel);
            return trip_done(t, PYGEN_ERROR);
        }
        if (channel != NULL) {
            PyObject *broken = SLOT(channel, T.s_broken, c_broken);
            if (broken == NULL) {
                Py_DECREF(channel);
                return trip_done(t, PYGEN_ERROR);
            }
            if (broken != Py_None)
                Py_CLEAR(channel);
            Py_DECREF(broken);
        }
    }
    if (channel == NULL) {  /* not the hot path: the coroutine _trip, as it is */
        PyObject *args[] = {t->cluster, t->node,  t->request,       t->decode,
                            t->failed,  t->admission, Py_True, Py_True};
        return trip_delegate(
            t,
            PyObject_VectorcallMethod(T.s_trip, args, 8, NULL),
            result);
    }
    t->channel = channel;
    PyObject *cas = SLOT(t->request, B.s_cas, c_cas);
    if (cas == NULL)
        return trip_done(t, PYGEN_ERROR);
    PyObject *waiter = fetch_one(channel, t->kb, cas, t->request);
    Py_DECREF(cas);
    if (waiter == NULL)
        return trip_failed(t, result);
    t->state = WAIT;
    if (Py_IS_TYPE(waiter, &WaiterType)) {  /* yielded as it is: a task waits on it */
        PyObject *res;
        int done = waiter_outcome(waiter, &res);  /* pending: marked blocking */
        t->waiter = waiter;
        return trip_after(t, done > 0 ? PYGEN_RETURN : done < 0 ? PYGEN_ERROR : PYGEN_NEXT,
                          done ? res : Py_NewRef(waiter), result);
    }
    PyAsyncMethods *am = Py_TYPE(waiter)->tp_as_async;
    t->it = am && am->am_await ? am->am_await(waiter) : PyObject_GetIter(waiter);
    Py_DECREF(waiter);
    if (t->it == NULL)
        return trip_failed(t, result);
    t->state = WAIT;
    PyObject *res;
    PySendResult r = PyIter_Send(t->it, Py_None, &res);
    return trip_after(t, r, res, result);
}

static PySendResult
trip_am_send(Trip *t, PyObject *arg, PyObject **result)
{
    PyObject *res = NULL;
    PySendResult r;
    switch (t->state) {
    case NEW:
        return trip_start(t, result);
    case WAIT:
        if (t->waiter != NULL) {
            int done = waiter_outcome(t->waiter, &res);
            r = done > 0 ? PYGEN_RETURN : done < 0 ? PYGEN_ERROR : PYGEN_NEXT;
            return trip_after(t, r, done ? res : Py_NewRef(t->waiter), result);
        }
        r = PyIter_Send(t->it, arg, &res);
        return trip_after(t, r, res, result);
    case SUB:
        return trip_sub_send(t, arg, result);
    default:
        *result = NULL;
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return PYGEN_ERROR;
    }
}

/* A send's outcome as a method answers it: the value yielded, or StopIteration(result). */
static PyObject *
as_method(PySendResult r, PyObject *result)
{
    if (r == PYGEN_NEXT)
        return result;
    if (r == PYGEN_RETURN) {
        /* StopIteration(result) made here: a tuple or exception result stays one value */
        PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, result);
        Py_DECREF(result);
        if (stop != NULL) {
            PyErr_SetObject(PyExc_StopIteration, stop);
            Py_DECREF(stop);
        }
    }
    return NULL;
}

/* The value of the StopIteration set (a finished delegate's), as a send's outcome. */
static PySendResult
stopped(PyObject **result)
{
    *result = NULL;
    if (!PyErr_ExceptionMatches(PyExc_StopIteration))
        return PYGEN_ERROR;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    *result = value ? Py_NewRef(((PyStopIterationObject *)value)->value) : Py_NewRef(Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return PYGEN_RETURN;
}

static PyObject *
trip_send(Trip *t, PyObject *arg)
{
    PyObject *result;
    PySendResult r = trip_am_send(t, arg, &result);
    return as_method(r, result);
}

static PyObject *
trip_iternext(Trip *t)
{
    return trip_send(t, Py_None);
}

/* throw(exc) or throw(type[, value[, traceback]]): as a coroutine's throw(). */
static PyObject *
trip_throw(Trip *t, PyObject *const *args, Py_ssize_t n)
{
    if (n < 1 || n > 3) {
        PyErr_SetString(PyExc_TypeError, "throw expected 1 to 3 arguments");
        return NULL;
    }
    PyObject *result;
    PySendResult r;
    if (t->state == SUB) {  /* the delegate's own throw */
        result = PyObject_VectorcallMethod(T.s_throw, (PyObject *[]){t->sub, args[0],
                                                                     n > 1 ? args[1] : NULL,
                                                                     n > 2 ? args[2] : NULL},
                                           (size_t)(1 + n), NULL);
        if (result != NULL)
            return result;
        r = stopped(&result);
        trip_done(t, r);
        return as_method(r, result);
    }
    PyObject *typ = args[0], *val = n > 1 ? args[1] : Py_None;
    if (n > 2 && args[2] != Py_None && !PyTraceBack_Check(args[2])) {  /* as a coroutine */
        PyErr_SetString(PyExc_TypeError, "throw() third argument must be a traceback object");
        return NULL;
    }
    if (PyExceptionInstance_Check(typ) && val != Py_None) {
        PyErr_SetString(PyExc_TypeError, "instance exception may not have a separate value");
        return NULL;
    }
    if (PyExceptionInstance_Check(typ))
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    else if (PyExceptionClass_Check(typ))
        PyErr_SetObject(typ, val);
    else {
        PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
        return NULL;
    }
    if (n > 2 && args[2] != Py_None) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        Py_XDECREF(tb);
        tb = Py_NewRef(args[2]);
        PyException_SetTraceback(value, tb);
        PyErr_Restore(type, value, tb);
    }
    if (t->state != WAIT) {  /* not started, or finished: it raises as it is */
        trip_done(t, PYGEN_ERROR);
        return NULL;
    }
    r = trip_failed(t, &result);  /* thrown in at the await, as into _trip */
    return as_method(r, result);
}

static PyObject *
trip_close(Trip *t, PyObject *unused)
{
    PyObject *sub = t->state == SUB ? Py_NewRef(t->sub) : NULL;
    trip_done(t, PYGEN_RETURN);
    if (sub == NULL)
        Py_RETURN_NONE;
    PyObject *done = PyObject_CallMethodNoArgs(sub, T.s_close);
    Py_DECREF(sub);
    return done;
}

static PyObject *
trip_await(Trip *t)
{
    return Py_NewRef(t);
}

static int
trip_traverse(Trip *t, visitproc visit, void *arg)
{
    Py_VISIT(t->cluster);
    Py_VISIT(t->node);
    Py_VISIT(t->request);
    Py_VISIT(t->decode);
    Py_VISIT(t->failed);
    Py_VISIT(t->admission);
    Py_VISIT(t->kb);
    Py_VISIT(t->channel);
    Py_VISIT(t->it);
    Py_VISIT(t->waiter);
    Py_VISIT(t->sub);
    return 0;
}

static int
trip_clear(Trip *t)
{
    trip_drop(t);
    return 0;
}

static void
trip_dealloc(Trip *t)
{
    PyObject_GC_UnTrack(t);
    trip_drop(t);
    PyObject_GC_Del(t);
}

static PyAsyncMethods trip_async = {
    .am_await = (unaryfunc)trip_await,
    .am_send = (sendfunc)trip_am_send,
};

static PyMethodDef trip_methods[] = {
    {"send", (PyCFunction)trip_send, METH_O, "Resume with a value (as a coroutine's send)."},
    {"throw", (PyCFunction)(void (*)(void))trip_throw, METH_FASTCALL,
     "Raise an exception at the await (as a coroutine's throw)."},
    {"close", (PyCFunction)trip_close, METH_NOARGS, "Stop (as a coroutine's close)."},
    {NULL},
};

PyTypeObject TripType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "django_mcpatterns.core.protocol._speedups.Trip",
    .tp_basicsize = sizeof(Trip),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "AsyncCluster's round trip of a lone get on a healthy server (see trip.c).",
    .tp_as_async = &trip_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)trip_iternext,
    .tp_methods = trip_methods,
    .tp_traverse = (traverseproc)trip_traverse,
    .tp_clear = (inquiry)trip_clear,
    .tp_dealloc = (destructor)trip_dealloc,
};

/* trip(cluster, node, request, decode, failed, admission): the awaitable of _trip(...,
 * loud=True, miss=True), a Trip. */
PyObject *
speedups_trip(PyObject *module, PyObject *const *args, Py_ssize_t n)
{
    if (!T.bound) {
        PyErr_SetString(PyExc_RuntimeError, "bind_trip() first");
        return NULL;
    }
    if (n != 6) {
        PyErr_SetString(PyExc_TypeError, "trip(cluster, node, request, decode, failed, admission)");
        return NULL;
    }
    Trip *t = PyObject_GC_New(Trip, &TripType);
    if (t == NULL)
        return NULL;
    PyObject **fields[] = {&t->cluster, &t->node, &t->request, &t->decode, &t->failed,
                           &t->admission};
    for (int i = 0; i < 6; i++)
        *fields[i] = Py_NewRef(args[i]);
    t->kb = t->channel = t->it = t->waiter = t->sub = NULL;
    t->state = NEW;
    PyObject_GC_Track(t);
    return (PyObject *)t;
}

static int
intern(PyObject **slot, const char *text)
{
    if (*slot == NULL)
        *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

/* Runner(run, Call): AsyncCluster.run with its hot path in C (one Python frame less per
 * command): a Call to a healthy server with nothing to route becomes a Trip here;
 * any other plan goes to `run`, the Python method, which decides as it always does.
 * A method descriptor, so `self.run(plan)` calls it with no bound method made. */
typedef struct {
    PyObject_HEAD
    PyObject *run, *Call;
    vectorcallfunc vectorcall;
} Runner;

static PyObject *s_routes, *s_only, *s_nodes, *s_locate, *s_open, *s_ring, *s_request,
    *s_decode, *s_failed_field;

static PyObject *
runner_hot(Runner *r, PyObject *cluster, PyObject *plan)
{
    if (!Py_IS_TYPE(plan, (PyTypeObject *)r->Call))
        return Py_NewRef(Py_None);
    PyObject *routes = PyObject_GetAttr(cluster, s_routes);
    if (routes == NULL || routes != Py_None) {
        Py_XDECREF(routes);
        return routes == NULL ? NULL : Py_NewRef(Py_None);
    }
    Py_DECREF(routes);
    PyObject *node = PyObject_GetAttr(cluster, s_only);
    if (node == Py_None) {  /* several servers: the ring's choice */
        Py_DECREF(node);
        PyObject *ring = SLOT(plan, s_ring, c_ring);
        PyObject *name = ring ? PyObject_CallMethodOneArg(cluster, s_locate, ring) : NULL;
        PyObject *nodes = name ? PyObject_GetAttr(cluster, s_nodes) : NULL;
        node = nodes ? PyObject_GetItem(nodes, name) : NULL;
        Py_XDECREF(ring);
        Py_XDECREF(name);
        Py_XDECREF(nodes);
    }
    if (node == NULL)
        return NULL;
    PyObject *health = SLOT(node, T.s_health, c_run_health);
    PyObject *admission = health ? SLOT(health, s_open, c_open) : NULL;
    Py_XDECREF(health);
    if (admission == NULL || admission == Py_None) {
        Py_DECREF(node);
        Py_XDECREF(admission);
        return admission == NULL ? NULL : Py_NewRef(Py_None);
    }
    PyObject *args[6] = {cluster, node, NULL, NULL, NULL, admission};
    args[2] = SLOT(plan, s_request, c_request);
    args[3] = args[2] ? SLOT(plan, s_decode, c_decode) : NULL;
    args[4] = args[3] ? SLOT(plan, s_failed_field, c_failed) : NULL;
    PyObject *trip = args[4] ? speedups_trip(NULL, args, 6) : NULL;
    for (int i = 1; i < 6; i++)
        Py_XDECREF(args[i]);
    return trip;
}

static PyObject *
runner_call(Runner *r, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) == 2 && kwnames == NULL && T.bound) {
        PyObject *trip = runner_hot(r, args[0], args[1]);
        if (trip != Py_None)
            return trip;  /* the Trip, or NULL: an error */
        Py_DECREF(trip);
    }
    return PyObject_Vectorcall(r->run, args, nargsf, kwnames);
}

static PyObject *
runner_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyObject *
runner_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *run, *call;
    if (!PyArg_ParseTuple(args, "OO!:Runner", &run, &PyType_Type, &call))
        return NULL;
    if (intern(&s_routes, "_routes") < 0 || intern(&s_only, "_only") < 0
        || intern(&s_nodes, "_nodes") < 0 || intern(&s_locate, "_locate") < 0
        || intern(&s_open, "open") < 0 || intern(&s_ring, "ring") < 0
        || intern(&s_request, "request") < 0 || intern(&s_decode, "decode") < 0
        || intern(&s_failed_field, "failed") < 0)
        return NULL;
    Runner *r = (Runner *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    r->run = Py_NewRef(run);
    r->Call = Py_NewRef(call);
    r->vectorcall = (vectorcallfunc)runner_call;
    return (PyObject *)r;
}

static int
runner_traverse(Runner *r, visitproc visit, void *arg)
{
    Py_VISIT(r->run);
    Py_VISIT(r->Call);
    return 0;
}

static int
runner_clear(Runner *r)
{
    Py_CLEAR(r->run);
    Py_CLEAR(r->Call);
    return 0;
}

static void
runner_dealloc(Runner *r)
{
    PyObject_GC_UnTrack(r);
    runner_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *
runner_doc(Runner *r, void *closure)
{
    return PyObject_GetAttrString(r->run, "__doc__");
}

static PyGetSetDef runner_getset[] = {
    {"__doc__", (getter)runner_doc, NULL, NULL, NULL},
    {NULL},
};

PyTypeObject RunnerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "django_mcpatterns.core.protocol._speedups.Runner",
    .tp_basicsize = sizeof(Runner),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = runner_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Runner, vectorcall),
    .tp_descr_get = runner_get,
    .tp_getset = runner_getset,
    .tp_traverse = (traverseproc)runner_traverse,
    .tp_clear = (inquiry)runner_clear,
    .tp_dealloc = (destructor)runner_dealloc,
};

/* bind_trip(Batch, CancelledError, get_running_loop, answered, MISS, armed, completed,
 *           Future, create_future) */
PyObject *
speedups_bind_trip(PyObject *module, PyObject *args)
{
    PyObject *o[9];
    if (!PyArg_ParseTuple(args, "O!O!OOOOO!O!O:bind_trip", &PyType_Type, &o[0], &PyType_Type,
                          &o[1], &o[2], &o[3], &o[4], &o[5], &PyList_Type, &o[6], &PyType_Type,
                          &o[7], &o[8]))
        return NULL;
    if (PyList_GET_SIZE(o[6]) != 1) {
        PyErr_SetString(PyExc_ValueError, "completed: a list of one stamp");
        return NULL;
    }
    if (T.k_loop == NULL && (T.k_loop = Py_BuildValue("(s)", "loop")) == NULL)
        return NULL;
    if (intern(&T.s_links, "links") < 0 || intern(&T.s_channels, "channels") < 0
        || intern(&T.s_broken, "broken") < 0 || intern(&T.s_fetch_one, "fetch_one") < 0
        || intern(&T.s_values, "values") < 0 || intern(&T.s_health, "health") < 0
        || intern(&T.s_failures, "failures") < 0 || intern(&T.s_shared, "shared") < 0
        || intern(&T.s_observer, "observer") < 0 || intern(&T.s_probe, "probe") < 0
        || intern(&T.s_trip, "_trip") < 0 || intern(&T.s_failed, "_failed") < 0
        || intern(&T.s_throw, "throw") < 0 || intern(&T.s_close, "close") < 0
        || intern(&T.s_in_flight, "_in_flight") < 0 || intern(&T.s_open_batch, "_open_batch") < 0
        || intern(&T.s_enqueue, "_enqueue") < 0 || intern(&T.s_loop, "loop") < 0
        || intern(&T.s_create_future, "create_future") < 0
        || intern(&T.s_sent_under, "sent_under") < 0 || intern(&T.s_waiters, "waiters") < 0
        || intern(&T.s_read, "read") < 0)
        return NULL;
    PyObject **slots[] = {&T.Batch,   &T.CancelledError, &T.get_running_loop,
                          &T.answered, &T.MISS,          &T.armed,
                          &T.completed, &T.Future,       &T.create_future};
    for (int i = 0; i < 9; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    T.bound = 1;
    Py_RETURN_NONE;
}
