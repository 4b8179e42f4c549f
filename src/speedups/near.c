/* The near cache's hit and fill in C (core/near/_model_table.py: NearTable.hit, .fill).
 *
 * near_hit answers a get from a live entry as NearTable.hit does (counted, the value or
 * the caller's copy), or says MISS.  Every read the near cache misses ends in a fill; in
 * Python its common case (a str or bytes value, room in memory) is most of a miss's own
 * cost, and so is the sweep of expired entries (NearTable._expire) that every sixteenth
 * of max_age brings.  near_fill does that case here, its sweep included, with the same
 * answers and the same table afterwards; any other case (another type of value or key,
 * prefixes, a full table whose admission must choose, the sketch ageing, an expiry queue
 * to rebuild, the table's lock held) it hands to NearTable.fill, before it changed
 * anything.
 *
 * near_hit also notes a hot entry near its end for a refresh ahead (NearTable.hit).
 *
 * The table's lock: NearTable.fill holds it across a few dict and list operations.  Here
 * the lock is seen free (`locked()`) and the whole change is made without releasing the
 * GIL and without running Python code (every object allocated and every call made before
 * the look; what is dropped is let go after), so no thread runs in between: none can be
 * inside the lock's section meanwhile, and one that takes it afterwards sees the change
 * complete.  A dict lookup inside the change runs no Python code as long as every key
 * held is a str or a subclass comparing and hashing as str does: NearTable.fill notes
 * any other (`_odd_keys`), and the table is then its own until cleared; the sweep's keys
 * are exact str (else the sweep is NearTable.fill's too).  Past half full the
 * admission sketch counts the read here too; admission
 * itself (the budget reached) and the sketch's ageing are Python's. */
#include "speedups.h"

#include <structmember.h>

#define STRIPE 4095  /* _model_table.STRIPES - 1 */
#define DUE_LIMIT 128  /* _model_table.DUE_LIMIT */
#define HOT 2  /* _model_table.HOT */
#define SWEEP 256  /* _model_table.SWEEP */
#define LARGE 8192  /* _model.LARGE_VALUE */

/* What _model_table.py binds (bind_near): its classes, the size constants, slot offsets. */
static struct {
    PyTypeObject *Entry, *Table, *deque, *lock;
    Py_ssize_t str_size, bytes_size, overhead;
    /* NearTable's slots */
    Py_ssize_t t_hits, t_misses, t_report, t_report_at, t_seq, t_clock, t_fixed, t_cleared, t_stamps, t_lock, t_entries, t_order, t_queue,
        t_bytes, t_sketch_from, t_largest, t_sweep_at, t_fills, t_rows, t_mask, t_added,
        t_sample_limit, t_budget, t_due, t_due_within, t_slack, t_odd_keys;
    /* Entry's slots */
    Py_ssize_t e_key, e_value, e_copy, e_size, e_expires, e_hits, e_slot, e_envelope, e_cas,
        e_epoch, e_due;
    PyObject *s_fill, *s_hit, *s_miss, *s_missed, *s_locked, *s_append, *s_popleft, *zero, *one,
        *MISS;
    int bound;
} N;

#define AT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* The offset of `name`, an object slot of `type` (its member descriptor), or -1. */
static Py_ssize_t
slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL)
        return -1;
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)
        && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX
        && PyDescr_TYPE(d) == type)
        offset = ((PyMemberDescrObject *)d)->d_member->offset;
    else
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot of its own", type->tp_name, name);
    Py_DECREF(d);
    return offset;
}

/* bind_near(Entry, NearTable, MISS, deque, lock type, str size, bytes size, overhead) */
PyObject *
speedups_bind_near(PyObject *module, PyObject *args)
{
    PyObject *entry, *table, *miss, *deque, *lock;
    Py_ssize_t str_size, bytes_size, overhead;
    if (!PyArg_ParseTuple(args, "O!O!OO!O!nnn:bind_near", &PyType_Type, &entry, &PyType_Type,
                          &table, &miss, &PyType_Type, &deque, &PyType_Type, &lock, &str_size,
                          &bytes_size, &overhead))
        return NULL;
    PyTypeObject *E = (PyTypeObject *)entry, *T = (PyTypeObject *)table;
    struct {
        Py_ssize_t *at;
        PyTypeObject *type;
        const char *name;
    } slots[] = {
        {&N.t_hits, T, "_hits"},
        {&N.t_misses, T, "_misses"},     {&N.t_report, T, "_report"},
        {&N.t_report_at, T, "_report_at"}, {&N.t_seq, T, "_seq"},
        {&N.t_clock, T, "clock"},        {&N.t_fixed, T, "_fixed"},
        {&N.t_cleared, T, "_cleared"},   {&N.t_stamps, T, "_stamps"},
        {&N.t_lock, T, "_lock"},         {&N.t_entries, T, "entries"},
        {&N.t_order, T, "_order"},       {&N.t_queue, T, "_queue"},
        {&N.t_bytes, T, "_bytes"},       {&N.t_sketch_from, T, "_sketch_from"},
        {&N.t_largest, T, "_largest"},   {&N.t_sweep_at, T, "_sweep_at"},
        {&N.t_fills, T, "_fills"},       {&N.t_rows, T, "_rows"},
        {&N.t_mask, T, "_mask"},         {&N.t_added, T, "_added"},
        {&N.t_sample_limit, T, "_sample_limit"}, {&N.t_budget, T, "budget"},
        {&N.t_due, T, "due"},            {&N.t_due_within, T, "_due_within"},
        {&N.t_slack, T, "_slack"},      {&N.t_odd_keys, T, "_odd_keys"},
        {&N.e_key, E, "key"},
        {&N.e_value, E, "value"},        {&N.e_copy, E, "copy"},
        {&N.e_size, E, "size"},          {&N.e_expires, E, "expires"},
        {&N.e_hits, E, "hits"},          {&N.e_slot, E, "slot"},
        {&N.e_envelope, E, "envelope"},  {&N.e_cas, E, "cas"},
        {&N.e_epoch, E, "epoch"},        {&N.e_due, E, "due"},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if ((*slots[i].at = slot_offset(slots[i].type, slots[i].name)) < 0)
            return NULL;
    if (E->tp_itemsize != 0 || E->tp_dictoffset != 0 || E->tp_new != PyBaseObject_Type.tp_new
        || E->tp_init != PyBaseObject_Type.tp_init) {
        PyErr_SetString(PyExc_TypeError, "Entry must be a plain slots class without __init__");
        return NULL;
    }
    if (N.s_fill == NULL) {
        if ((N.s_fill = PyUnicode_InternFromString("fill")) == NULL
            || (N.s_hit = PyUnicode_InternFromString("hit")) == NULL
            || (N.s_miss = PyUnicode_InternFromString("miss")) == NULL
            || (N.s_missed = PyUnicode_InternFromString("missed")) == NULL
            || (N.one = PyLong_FromLong(1)) == NULL
            || (N.s_locked = PyUnicode_InternFromString("locked")) == NULL
            || (N.s_append = PyUnicode_InternFromString("append")) == NULL
            || (N.s_popleft = PyUnicode_InternFromString("popleft")) == NULL
            || (N.zero = PyLong_FromLong(0)) == NULL)
            return NULL;
    }
    Py_XSETREF(N.Entry, (PyTypeObject *)Py_NewRef(entry));
    Py_XSETREF(N.Table, (PyTypeObject *)Py_NewRef(table));
    Py_XSETREF(N.deque, (PyTypeObject *)Py_NewRef(deque));
    Py_XSETREF(N.lock, (PyTypeObject *)Py_NewRef(lock));
    Py_XSETREF(N.MISS, Py_NewRef(miss));
    N.str_size = str_size;
    N.bytes_size = bytes_size;
    N.overhead = overhead;
    N.bound = 1;
    Py_RETURN_NONE;
}

/* A number read as a double (int or float, as Python would add them), else -1 with
 * *ok = 0 (the caller takes the Python path, which says what is wrong). */
static double
as_double(PyObject *o, int *ok)
{
    if (PyFloat_CheckExact(o))
        return PyFloat_AS_DOUBLE(o);
    if (PyLong_CheckExact(o)) {
        double d = PyLong_AsDouble(o);
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            *ok = 0;
        }
        return d;
    }
    *ok = 0;
    return -1.0;
}

/* NearTable.hit's refresh ahead: an entry hit before in its life (`hits` now, counting
 * this one), with less than the table's window left of it, not noted yet, a plain value
 * (no envelope, no cas): noted in the table's `due` (at most DUE_LIMIT keys).  -1: an
 * error set.  `timed`: whether `expires` and `now` were read as numbers. */
static int
note(PyObject *table, PyObject *entry, PyObject *key, long hits, int timed, double expires,
     double now)
{
    PyObject *within = AT(table, N.t_due_within), *due = AT(table, N.t_due);
    if (hits < HOT || !timed || within == NULL || within == Py_None || due == NULL
        || !PyDict_CheckExact(due) || PyDict_GET_SIZE(due) >= DUE_LIMIT
        || AT(entry, N.e_due) != Py_False || AT(entry, N.e_envelope) != Py_None
        || AT(entry, N.e_cas) != Py_None)
        return 0;
    int ok = 1;
    double window = as_double(within, &ok);
    if (!ok || expires - now >= window)
        return 0;
    Py_SETREF(AT(entry, N.e_due), Py_NewRef(Py_True));
    return PyDict_SetItem(due, key, entry);
}

/* near_hit(table, key): table.hit(key), the same answer and counts. */
PyObject *
speedups_near_hit(PyObject *module, PyObject *const *args, Py_ssize_t n)
{
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "near_hit(table, key)");
        return NULL;
    }
    PyObject *table = args[0], *key = args[1];
    PyObject *entries = N.bound && Py_IS_TYPE(table, N.Table) ? AT(table, N.t_entries) : NULL;
    PyObject *clock = entries != NULL ? AT(table, N.t_clock) : NULL;
    if (clock == NULL || !PyDict_CheckExact(entries) || !PyUnicode_CheckExact(key))
        return PyObject_CallMethodOneArg(table, N.s_hit, key);
    PyObject *entry = PyDict_GetItemWithError(entries, key);  /* borrowed */
    if (entry == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(N.MISS);
    if (!Py_IS_TYPE(entry, N.Entry))
        return PyObject_CallMethodOneArg(table, N.s_hit, key);
    Py_INCREF(entry);  /* the clock may run Python code (a test's): the entry may go */
    PyObject *result = NULL, *now_obj = PyObject_CallNoArgs(clock);
    if (now_obj == NULL)
        goto done;
    PyObject *expires = AT(entry, N.e_expires);
    int live, timed = 0;  /* timed: both read as doubles, for the refresh window */
    double expires_at = 0.0, now = 0.0;
    if (expires != NULL && PyFloat_CheckExact(expires) && PyFloat_CheckExact(now_obj)) {
        expires_at = PyFloat_AS_DOUBLE(expires);
        now = PyFloat_AS_DOUBLE(now_obj);
        timed = 1;
        live = expires_at > now;
    }
    else if (expires != NULL) {  /* held: the comparison may run Python code (a renew) */
        Py_INCREF(expires);
        live = PyObject_RichCompareBool(expires, now_obj, Py_GT);
        if (live >= 0) {  /* not with the comparison's error set: as_double may clear it */
            timed = 1;
            expires_at = as_double(expires, &timed);
            now = as_double(now_obj, &timed);
        }
        Py_DECREF(expires);
    }
    else {
        PyErr_SetString(PyExc_AttributeError, "expires");
        live = -1;
    }
    Py_DECREF(now_obj);
    if (live <= 0) {
        result = live < 0 ? NULL : Py_NewRef(N.MISS);
        goto done;
    }
    PyObject *hits = AT(entry, N.e_hits), *count;
    PyObject *counted = hits == NULL ? NULL : PyNumber_Add(hits, N.one);
    if (counted == NULL)
        goto done;
    Py_XSETREF(AT(entry, N.e_hits), counted);
    PyObject *within = AT(table, N.t_due_within);
    if (within != NULL && PyFloat_CheckExact(within) && timed
        && expires_at - now < PyFloat_AS_DOUBLE(within) && AT(entry, N.e_due) == Py_False) {
        counted = AT(entry, N.e_hits);  /* in the window, not noted yet: maybe due */
        long hits_now = counted != NULL && PyLong_CheckExact(counted) ? PyLong_AsLong(counted) : 0;
        if (hits_now == -1 && PyErr_Occurred())
            PyErr_Clear();
        if (note(table, entry, key, hits_now, timed, expires_at, now) < 0)
            goto done;
    }
    PyObject *counter = AT(table, N.t_hits);  /* a hit and a round trip saved, counted once */
    if (counter == NULL || (count = PyIter_Next(counter)) == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "a near table's counter ended");
        goto done;
    }
    Py_DECREF(count);
    note_near_reads(1);
    PyObject *copy = AT(entry, N.e_copy), *value = AT(entry, N.e_value);
    if (copy == NULL || value == NULL)
        PyErr_SetString(PyExc_AttributeError, "copy");
    else if (copy == Py_None)
        result = Py_NewRef(value);
    else
        result = PyObject_CallOneArg(copy, value);
done:
    Py_DECREF(entry);
    return result;
}

/* near_missed(table): table.missed(), the same ticket and counts. */
PyObject *
speedups_near_missed(PyObject *module, PyObject *table)
{
    if (!N.bound || !Py_IS_TYPE(table, N.Table))
        return PyObject_CallMethodNoArgs(table, N.s_missed);
    PyObject *clock = AT(table, N.t_clock);
    if (clock == NULL)
        return PyObject_CallMethodNoArgs(table, N.s_missed);
    PyObject *now = PyObject_CallNoArgs(clock);
    if (now == NULL)
        return NULL;
    PyObject *report = AT(table, N.t_report);
    if (report != Py_None) {  /* instrumentation: a report due is Python's to send */
        PyObject *at = report == NULL ? NULL : Py_XNewRef(AT(table, N.t_report_at));
        int due = at == NULL ? 1 : PyObject_RichCompareBool(now, at, Py_GE);
        Py_XDECREF(at);
        if (due != 0) {
            PyObject *result = due < 0 ? NULL : PyObject_CallMethodOneArg(table, N.s_miss, now);
            Py_DECREF(now);
            return result;
        }
    }
    /* Read after the clock (and the comparison), as Python reads them: either may run
     * Python code (a test's clock) and let another thread write (a seq read before would
     * be stale, and freed). */
    PyObject *misses = AT(table, N.t_misses), *seq = AT(table, N.t_seq);
    if (misses == NULL || seq == NULL) {
        PyObject *result = PyObject_CallMethodOneArg(table, N.s_miss, now);
        Py_DECREF(now);
        return result;
    }
    PyObject *count = PyIter_Next(misses);
    if (count == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "a near table's counter ended");
        Py_DECREF(now);
        return NULL;
    }
    Py_DECREF(count);
    note_near_reads(0);
    PyObject *ticket = PyTuple_Pack(2, now, seq);
    Py_DECREF(now);
    return ticket;
}

static PyObject *
slow(PyObject *const *args)
{
    return PyObject_CallMethodObjArgs(args[0], N.s_fill, args[1], args[2], args[3], NULL);
}

/* Whether the sketch may count a fill bringing the table to `held` bytes here: its four
 * rows (bytearrays of the table's width) in `rows`, its count of reads in `*added`; not
 * when admission may be asked (past the budget) or the sketch ages with this read. */
static int
sketch(PyObject *table, Py_ssize_t held, unsigned char *rows[4], Py_ssize_t *added)
{
    PyObject *list = AT(table, N.t_rows), *mask = AT(table, N.t_mask);
    PyObject *count = AT(table, N.t_added), *limit = AT(table, N.t_sample_limit);
    PyObject *budget = AT(table, N.t_budget);
    if (list == NULL || !PyList_CheckExact(list) || PyList_GET_SIZE(list) != 4 || mask == NULL
        || !PyLong_CheckExact(mask) || count == NULL || !PyLong_CheckExact(count)
        || limit == NULL || !PyLong_CheckExact(limit) || budget == NULL
        || !PyLong_CheckExact(budget))
        return 0;
    Py_ssize_t width = PyLong_AsSsize_t(mask) + 1, n = PyLong_AsSsize_t(count);
    Py_ssize_t most = PyLong_AsSsize_t(limit), room = PyLong_AsSsize_t(budget);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (held > room || n + 1 >= most || width <= 0 || width > (1 << 16))
        return 0;
    for (int i = 0; i < 4; i++) {
        PyObject *row = PyList_GET_ITEM(list, i);
        if (!PyByteArray_CheckExact(row) || PyByteArray_GET_SIZE(row) != width)
            return 0;
        rows[i] = (unsigned char *)PyByteArray_AS_STRING(row);
    }
    *added = n;
    return 1;
}

/* NearTable._expire(now), within near_fill's change (no Python code runs: the table's
 * lock is seen free and the GIL kept): drop the entries past their bound from the head
 * of the expiry queue, at most SWEEP, oldest fill first (large ones stay, as do those
 * renewed or filled again since: their queue item is not their last), then date the
 * next sweep.  What is popped and dropped is kept in `let_go` (SWEEP places each) for
 * the caller to let go once the table is whole.  A queue grown past twice the entries
 * is left for Python's next fill to rebuild (near_fill hands that case to it).  -1: an
 * error set. */
static int
sweep_expired(PyObject *table, double now, PyObject **let_go, int *n_let_go)
{
    PyObject *queue = AT(table, N.t_queue), *entries = AT(table, N.t_entries);
    PyObject *order = AT(table, N.t_order), *slack_obj = AT(table, N.t_slack);
    Py_ssize_t held = PyLong_AsSsize_t(AT(table, N.t_bytes)), dropped = 0;
    int ok = 1;
    double slack = slack_obj == NULL ? -1.0 : as_double(slack_obj, &ok);
    if (!ok || slack < 0)
        return 0;  /* nothing swept: Python's fill sweeps once this one is done */
    for (int i = 0; i < SWEEP; i++) {
        if (PyObject_Size(queue) <= 0)
            break;
        PyObject *head = PySequence_GetItem(queue, 0);
        if (head == NULL)
            return -1;
        double expires = -1.0;
        ok = PyTuple_CheckExact(head) && PyTuple_GET_SIZE(head) == 2;
        if (ok)
            expires = as_double(PyTuple_GET_ITEM(head, 0), &ok);
        if (!ok || expires > now) {
            Py_DECREF(head);
            break;
        }
        PyObject *popped = PyObject_CallMethodNoArgs(queue, N.s_popleft);
        if (popped == NULL) {
            Py_DECREF(head);
            return -1;
        }
        Py_DECREF(popped);  /* the head itself, held below */
        let_go[(*n_let_go)++] = head;
        PyObject *key = PyTuple_GET_ITEM(head, 1);
        PyObject *entry = PyUnicode_CheckExact(key) ? PyDict_GetItemWithError(entries, key) : NULL;
        if (entry == NULL) {
            if (PyErr_Occurred())
                return -1;
            continue;
        }
        PyObject *its = Py_IS_TYPE(entry, N.Entry) ? AT(entry, N.e_expires) : NULL;
        PyObject *size = its == NULL ? NULL : AT(entry, N.e_size);
        PyObject *slot = its == NULL ? NULL : AT(entry, N.e_slot);
        if (size == NULL || slot == NULL || !PyLong_CheckExact(size) || !PyLong_CheckExact(slot))
            continue;
        int same = 1;
        if (its != PyTuple_GET_ITEM(head, 0) && (as_double(its, &same) != expires || !same))
            continue;  /* renewed or filled again since */
        Py_ssize_t bytes = PyLong_AsSsize_t(size);
        if (bytes >= LARGE)
            continue;  /* may be revalidated */
        /* NearTable._remove(entry) */
        let_go[(*n_let_go)++] = Py_NewRef(entry);
        Py_ssize_t last_at = PyList_GET_SIZE(order) - 1;
        PyObject *last = Py_NewRef(PyList_GET_ITEM(order, last_at));
        if (PyList_SetSlice(order, last_at, last_at + 1, NULL) < 0) {
            Py_DECREF(last);
            return -1;
        }
        if (last != entry) {
            Py_ssize_t at = PyLong_AsSsize_t(slot);
            Py_XSETREF(AT(last, N.e_slot), Py_NewRef(slot));
            PyList_SetItem(order, at, last);  /* steals last; the entry is held in let_go */
        }
        else
            Py_DECREF(last);
        if (PyDict_DelItem(entries, key) < 0)
            return -1;
        dropped += bytes;
    }
    if (dropped) {
        PyObject *now_held = PyLong_FromSsize_t(held - dropped);
        if (now_held == NULL)
            return -1;
        Py_SETREF(AT(table, N.t_bytes), now_held);
    }
    double next = now;
    if (PyObject_Size(queue) > 0) {
        PyObject *head = PySequence_GetItem(queue, 0);
        if (head == NULL)
            return -1;
        ok = PyTuple_CheckExact(head) && PyTuple_GET_SIZE(head) == 2;
        if (ok)
            next = as_double(PyTuple_GET_ITEM(head, 0), &ok);
        Py_DECREF(head);
        if (!ok)
            return 0;  /* not a number: the sweep stays due, for Python's fill */
    }
    PyObject *at = PyFloat_FromDouble(next + slack);
    if (at == NULL)
        return -1;
    Py_SETREF(AT(table, N.t_sweep_at), at);
    return 0;
}

/* Whether the sweep near_fill would make now pops only items keyed by an exact str: a
 * key of a str subclass (filled by NearTable.fill) is looked up by Python's rules, its
 * __eq__ and __hash__ maybe Python code, so such a sweep is NearTable.fill's whole.
 * 1, 0, or -1 with an error. */
static int
sweep_keys_exact(PyObject *queue, double now)
{
    Py_ssize_t queued = PyObject_Size(queue);
    if (queued < 0)
        return -1;
    for (Py_ssize_t i = 0; i < queued && i < SWEEP; i++) {
        PyObject *item = PySequence_GetItem(queue, i);
        if (item == NULL)
            return -1;
        int ok = PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2;
        double expires = ok ? as_double(PyTuple_GET_ITEM(item, 0), &ok) : -1.0;
        int exact = !ok || expires > now || PyUnicode_CheckExact(PyTuple_GET_ITEM(item, 1));
        Py_DECREF(item);
        if (!ok || expires > now)
            return 1;  /* the sweep stops here */
        if (!exact)
            return 0;
    }
    return 1;
}

/* near_fill(table, key, value, ticket): table.fill(key, value, ticket), the same answer
 * and the same table afterwards. */
PyObject *
speedups_near_fill(PyObject *module, PyObject *const *args, Py_ssize_t n)
{
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "near_fill(table, key, value, ticket)");
        return NULL;
    }
    PyObject *table = args[0], *key = args[1], *value = args[2], *ticket = args[3];
    if (!N.bound || Py_TYPE(table) != N.Table || !PyUnicode_CheckExact(key)
        || !PyUnicode_IS_ASCII(key) || !PyTuple_CheckExact(ticket)
        || PyTuple_GET_SIZE(ticket) != 2 || !PyLong_CheckExact(PyTuple_GET_ITEM(ticket, 1)))
        return slow(args);
    PyObject *fixed = AT(table, N.t_fixed), *clock = AT(table, N.t_clock);
    if (fixed == NULL || fixed == Py_None || clock == NULL)
        return slow(args);  /* prefixes: each key's bound is its own */
    int ok = 1;
    double bound = as_double(fixed, &ok), sent = as_double(PyTuple_GET_ITEM(ticket, 0), &ok);
    if (!ok)
        return slow(args);
    long long seq = PyLong_AsLongLong(PyTuple_GET_ITEM(ticket, 1));
    if (seq == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return slow(args);
    }
    Py_ssize_t size;
    if (PyUnicode_CheckExact(value) && PyUnicode_IS_ASCII(value))
        size = N.str_size + PyUnicode_GET_LENGTH(value);
    else if (PyBytes_CheckExact(value))
        size = N.bytes_size + PyBytes_GET_SIZE(value);
    else
        return slow(args);  /* kept apart from its callers: copied or pickled (keep);
                             * before the clock: Python's fill reads it once */
    size += N.str_size + PyUnicode_GET_LENGTH(key) + N.overhead;
    PyObject *now_obj = PyObject_CallNoArgs(clock);
    if (now_obj == NULL)
        return NULL;
    double now = as_double(now_obj, &ok);
    Py_DECREF(now_obj);
    if (!ok)
        return slow(args);
    double expires = sent + bound;
    if (expires <= now)
        Py_RETURN_FALSE;
    Py_hash_t hash = PyObject_Hash(key);
    if (hash == -1)
        return NULL;

    /* What the change needs, made before the table is looked at. */
    PyObject *entry = N.Entry->tp_alloc(N.Entry, 0);
    if (entry == NULL)
        return NULL;
    PyObject_GC_UnTrack(entry);  /* see speedups_near_untrack */
    /* sent + bound as Python adds them: two ints (a fake clock's) make an int */
    PyObject *sent_obj = PyTuple_GET_ITEM(ticket, 0), *bound_obj = AT(table, N.t_fixed);
    PyObject *size_obj = PyLong_FromSsize_t(size);
    PyObject *expires_obj = PyLong_CheckExact(sent_obj) && bound_obj != NULL
                                    && PyLong_CheckExact(bound_obj)
                                ? PyNumber_Add(sent_obj, bound_obj)
                                : PyFloat_FromDouble(expires);
    PyObject *item = expires_obj == NULL ? NULL : PyTuple_Pack(2, expires_obj, key);
    if (item != NULL)
        PyObject_GC_UnTrack(item);  /* a number and a str: no cycle can pass through it */
    PyObject *result = NULL, *old = NULL, *dropped = NULL;
    if (size_obj == NULL || item == NULL)
        goto done;
    PyObject **fields[] = {&AT(entry, N.e_key),     &AT(entry, N.e_value),
                           &AT(entry, N.e_copy),    &AT(entry, N.e_size),
                           &AT(entry, N.e_expires), &AT(entry, N.e_hits),
                           &AT(entry, N.e_envelope), &AT(entry, N.e_cas),
                           &AT(entry, N.e_epoch),   &AT(entry, N.e_due)};
    PyObject *values[] = {key, value, Py_None, size_obj, expires_obj, N.zero,
                          Py_None, Py_None, Py_None, Py_False};
    for (int i = 0; i < 10; i++)
        *fields[i] = Py_NewRef(values[i]);

    PyObject *lock = AT(table, N.t_lock), *entries = AT(table, N.t_entries);
    PyObject *order = AT(table, N.t_order), *queue = AT(table, N.t_queue);
    PyObject *stamps = AT(table, N.t_stamps), *cleared = AT(table, N.t_cleared);
    PyObject *held_obj = AT(table, N.t_bytes), *sketch_from = AT(table, N.t_sketch_from);
    PyObject *largest = AT(table, N.t_largest), *sweep_at = AT(table, N.t_sweep_at);
    PyObject *fills = AT(table, N.t_fills);
    if (lock == NULL || !Py_IS_TYPE(lock, N.lock) || entries == NULL
        || !PyDict_CheckExact(entries) || order == NULL || !PyList_CheckExact(order)
        || queue == NULL || !Py_IS_TYPE(queue, N.deque) || stamps == NULL || cleared == NULL
        || !PyLong_CheckExact(cleared) || held_obj == NULL || !PyLong_CheckExact(held_obj)
        || sketch_from == NULL || !PyLong_CheckExact(sketch_from) || largest == NULL
        || !PyLong_CheckExact(largest) || sweep_at == NULL || fills == NULL)
        goto fallback;
    double sweep = as_double(sweep_at, &ok);
    Py_ssize_t held = PyLong_AsSsize_t(held_obj), from = PyLong_AsSsize_t(sketch_from);
    Py_ssize_t most = PyLong_AsSsize_t(largest);
    long long cleared_at = PyLong_AsLongLong(cleared);
    if (!ok || PyErr_Occurred()) {
        PyErr_Clear();
        goto fallback;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(stamps, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        goto fallback;
    }
    long long stamp = 0;
    int stamped = view.len >= (Py_ssize_t)((STRIPE + 1) * sizeof(long long));
    if (stamped)
        stamp = ((long long *)view.buf)[hash & STRIPE];
    PyBuffer_Release(&view);
    if (!stamped)
        goto fallback;
    if (size > most)
        goto fallback;  /* refused, and counted there */

    /* The lookup may run Python code (a key held under a str subclass whose __eq__ is
     * Python's, and that may let another thread write): made before the look, the table
     * then checked unchanged (what was read held meanwhile: none freed and made again at
     * its address).  Let go before the look: when changed, that may run Python code. */
    PyObject *read[3] = {Py_NewRef(entries), Py_NewRef(held_obj), Py_XNewRef(AT(table, N.t_seq))};
    old = PyDict_GetItemWithError(entries, key);  /* borrowed */
    int changed = AT(table, N.t_entries) != read[0] || AT(table, N.t_bytes) != read[1]
                  || AT(table, N.t_seq) != read[2];
    for (int i = 0; i < 3; i++)
        Py_XDECREF(read[i]);
    if (old == NULL && PyErr_Occurred())
        goto done;
    if (changed)
        goto fallback;

    /* The look: is the lock free?  From here to its end no Python code runs. */
    PyObject *locked = PyObject_CallMethodNoArgs(lock, N.s_locked);
    if (locked == NULL)
        goto done;
    Py_DECREF(locked);
    if (locked != Py_False)
        goto fallback;  /* another thread is inside: NearTable.fill waits for it */
    if (AT(table, N.t_odd_keys) != Py_False)
        goto fallback;  /* a key held whose lookups (the sweep's) may run Python code */
    if (seq < cleared_at || stamp > seq) {
        result = Py_NewRef(Py_False);  /* a write of this process came after the read was sent */
        goto done;
    }
    Py_ssize_t count = PyList_GET_SIZE(order);
    if (old != NULL) {
        PyObject *old_size = Py_IS_TYPE(old, N.Entry) ? AT(old, N.e_size) : NULL;
        PyObject *old_slot = Py_IS_TYPE(old, N.Entry) ? AT(old, N.e_slot) : NULL;
        PyObject *old_key = Py_IS_TYPE(old, N.Entry) ? AT(old, N.e_key) : NULL;
        if (old_size == NULL || !PyLong_CheckExact(old_size) || old_slot == NULL
            || !PyLong_CheckExact(old_slot) || old_key == NULL || !PyUnicode_CheckExact(old_key))
            goto fallback;  /* a str subclass's key: its deletion may run Python code */
        held -= PyLong_AsSsize_t(old_size);
        count -= 1;
    }
    held += size;
    Py_ssize_t queued = PyObject_Size(queue);
    if (queued < 0)
        goto done;
    if (queued + 1 > 2 * (count + 1) + 64)
        goto fallback;  /* the queue is rebuilt (NearTable._compact) */
    int sweeping = now >= sweep;  /* swept below, once the entry is in */
    if (sweeping) {
        int exact = sweep_keys_exact(queue, now);
        if (exact < 0)
            goto done;
        if (!exact)
            goto fallback;
    }
    unsigned char *rows[4];
    Py_ssize_t added = 0;
    if (held > from) {  /* the sketch counts this read (NearTable._count_use) */
        if (!sketch(table, held, rows, &added))
            goto fallback;  /* admission may be asked, or the sketch ages: Python's */
    }
    PyObject *new_held = PyLong_FromSsize_t(held), *new_added = NULL;
    if (new_held == NULL)
        goto done;
    if (held > from) {
        if ((new_added = PyLong_FromSsize_t(added + 1)) == NULL) {
            Py_DECREF(new_held);
            goto done;
        }
        Py_ssize_t mask = PyLong_AsSsize_t(AT(table, N.t_mask));
        Py_ssize_t at[4] = {hash & mask, (hash >> 16) & mask, (hash >> 32) & mask,
                            (hash >> 48) & mask};
        for (int i = 0; i < 4; i++)
            if (rows[i][at[i]] < 255)
                rows[i][at[i]] += 1;
        Py_SETREF(AT(table, N.t_added), new_added);
    }
    if (old != NULL) {  /* NearTable._remove(old), its references let go after */
        dropped = Py_NewRef(old);
        Py_ssize_t last_at = PyList_GET_SIZE(order) - 1;
        PyObject *last = Py_NewRef(PyList_GET_ITEM(order, last_at));
        if (PyList_SetSlice(order, last_at, last_at + 1, NULL) < 0) {
            Py_DECREF(last);
            Py_DECREF(new_held);
            goto done;
        }
        if (last != old) {
            PyObject *at = AT(old, N.e_slot);
            Py_ssize_t i = PyLong_AsSsize_t(at);
            Py_XSETREF(AT(last, N.e_slot), Py_NewRef(at));
            PyList_SetItem(order, i, last);  /* steals last */
        }
        else
            Py_DECREF(last);
        if (PyDict_DelItem(entries, key) < 0) {
            Py_DECREF(new_held);
            goto done;
        }
    }
    PyObject *slot = PyLong_FromSsize_t(PyList_GET_SIZE(order));
    if (slot == NULL) {
        Py_DECREF(new_held);
        goto done;
    }
    AT(entry, N.e_slot) = slot;
    if (PyList_Append(order, entry) < 0 || PyDict_SetItem(entries, key, entry) < 0) {
        Py_DECREF(new_held);
        goto done;
    }
    Py_SETREF(AT(table, N.t_bytes), new_held);
    PyObject *r = PyObject_CallMethodOneArg(queue, N.s_append, item);
    if (r == NULL)
        goto done;
    Py_DECREF(r);
    PyObject *counted = PyIter_Next(fills);
    if (counted == NULL)
        goto done;
    Py_DECREF(counted);
    if (sweeping) {
        PyObject *let_go[2 * SWEEP];
        int n_let_go = 0;
        int swept = sweep_expired(table, now, let_go, &n_let_go);
        for (int i = 0; i < n_let_go; i++)  /* once the table is whole */
            Py_DECREF(let_go[i]);
        if (swept < 0)
            goto done;
    }
    result = Py_NewRef(Py_True);
    goto done;

fallback:
    Py_DECREF(entry);
    Py_XDECREF(size_obj);
    Py_XDECREF(expires_obj);
    Py_XDECREF(item);
    return slow(args);
done:
    Py_DECREF(entry);
    Py_XDECREF(size_obj);
    Py_XDECREF(expires_obj);
    Py_XDECREF(item);
    Py_XDECREF(dropped);  /* the entry replaced, let go once the table is whole */
    return result;
}

/* near_untrack(entry): the entry, no longer followed by the cycle collector.
 *
 * A table holds up to max_bytes of entries, made at every fill and kept for max_age:
 * tracked, each is traversed by the young collections it survives and by every full
 * collection, which their own turnover keeps triggering (a tenth of a miss's
 * instructions, with a few thousand entries).  No cycle can pass through an entry:
 * it refers to its key (an exact str: a subclass's instance may carry attributes, so its
 * entry stays tracked), its value as keep() stores it (immutable scalars and tuples of
 * them, a private copy of a flat dict, list or set, or pickled bytes: nothing a caller
 * holds or can make refer back), a module-level copier, metadata and numbers, and
 * nothing refers to it but its table.  Should a value hold a cycle of its own, that
 * cycle stays tracked and is collected once the entry lets go of it. */
PyObject *
speedups_near_untrack(PyObject *module, PyObject *entry)
{
    if (!N.bound || !Py_IS_TYPE(entry, N.Entry)) {
        PyErr_SetString(PyExc_TypeError, "near_untrack takes the bound Entry class's instances");
        return NULL;
    }
    PyObject_GC_UnTrack(entry);
    return Py_NewRef(entry);
}
