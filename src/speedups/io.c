/* The sync transport's I/O on a blocking socket (SO_RCVTIMEO/SO_SNDTIMEO bound each
 * system call; transport.py sets them), with the GIL released once per exchange:
 * send, receive and a get's scan run without it.  As transport.py's Connection:
 * an operation is bounded as a whole by `timeout` (checked between system calls),
 * a closed connection raises ConnectionClosedError, the kernel's timeout (EAGAIN)
 * raises BlockingIOError for the caller to report as a timeout. */
#include "speedups.h"
#include <errno.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>

#define RECV_MIN 65536

enum { IO_OK, IO_ERRNO, IO_CLOSED, IO_TIMEOUT, IO_NOMEM, IO_EINTR, IO_AGAIN };

static double
now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The state of one exchange, resumable after a signal interrupted a system call. */
typedef struct {
    int fd;
    const char *data;
    Py_ssize_t len, sent;
    int sends;        /* sends made: the deadline is checked before each but the first */
    double deadline;  /* 0: none */
    int err;
} Io;

static int
send_rest(Io *io)
{
    while (io->sent < io->len) {
        if (io->sends > 0 && io->deadline && now() > io->deadline)
            return IO_TIMEOUT;
        ssize_t n = send(io->fd, io->data + io->sent, (size_t)(io->len - io->sent), MSG_NOSIGNAL);
        if (n < 0) {
            io->err = errno;
            return errno == EINTR ? IO_EINTR : IO_ERRNO;
        }
        io->sends++;
        io->sent += n;
    }
    return IO_OK;
}

/* One receive into the reader: at least RECV_MIN of room, or what the awaited piece wants.
 * `flags` MSG_DONTWAIT (looking first): nothing there yet is IO_AGAIN, not the kernel's
 * timeout. */
static int
receive_more(Reader *r, Io *io, int check, int flags)
{
    if (check && io->deadline && now() > io->deadline)
        return IO_TIMEOUT;
    Py_ssize_t want = r->need - (r->end - r->start);
    if (want < RECV_MIN)
        want = RECV_MIN;
    if (r->start == r->end)
        r->start = r->end = 0;
    if (reader_reserve(r, want) < 0)
        return IO_NOMEM;
    ssize_t n = recv(io->fd, r->buf + r->end, (size_t)want, flags);
    if (n < 0) {
        if ((flags & MSG_DONTWAIT) && (errno == EAGAIN || errno == EWOULDBLOCK))
            return IO_AGAIN;
        io->err = errno;
        return errno == EINTR ? IO_EINTR : IO_ERRNO;
    }
    if (n == 0)
        return IO_CLOSED;
    r->end += n;
    return IO_OK;
}

/* Looking first: a round trip that keeps the GIL when its reply is there at once.
 *
 * Releasing the GIL for a round trip hands it to a thread waiting for it, and taking it
 * back waits for the next release.  In a process whose threads mostly run Python (a
 * near cache answering most reads from memory: they queue on the GIL), each hand-off
 * costs the waker's wake-up, and on a virtual machine an idle vCPU halts, so a wake-up
 * can cost more than a loopback round trip.  Sending without waiting (MSG_DONTWAIT),
 * holding the GIL, then taking whatever reply is already there (memcached's worker,
 * woken by the send, often answers before the sender's next system call) skips both
 * hand-offs.  In a process whose threads mostly wait on I/O, holding the GIL over a
 * send makes them wait for it instead: there it is a loss.
 *
 * So the process looks first while its near cache answers at least half of its reads
 * (note_near_reads, from near.c, judged every NEAR_WINDOW reads), and stops after
 * QUIET_REQUESTS requests with no judgement (the near cache no longer read).  A
 * connection whose replies were not there once sent (a server across a network: a
 * round trip is longer than a system call) more than WAITS_MAX of 255 (a moving average
 * over the last eight or so) looks first only once every LOOK_EVERY requests.  A request
 * over RECV_MIN bytes never looks first: its reply cannot be there when its send returns,
 * and copying it into the socket holding the GIL would keep the other threads waiting. */
#define NEAR_WINDOW 1024
#define QUIET_REQUESTS 8192
#define WAITS_MAX 240
#define LOOK_EVERY 16

static int looking;        /* the process looks first (judged from its near reads) */
static int forced = -1;    /* look_first(): -1 judged, 0 never, 1 always */
static unsigned near_reads, near_hits, quiet;

void
note_near_reads(int hit)
{
    near_hits += hit;
    if (++near_reads < NEAR_WINDOW)
        return;
    looking = 2 * near_hits >= near_reads;
    near_reads = near_hits = quiet = 0;
}

/* A forked child's near tables start empty: so does its judgement (pthread_atfork, so
 * that a fork without Python's hooks, uWSGI's, is seen too). */
static void
looks_forked(void)
{
    looking = 0;
    near_reads = near_hits = quiet = 0;
}

int
look_first_init(void)
{
    return pthread_atfork(NULL, NULL, looks_forked);
}

/* look_first(flag=None): force looking first on (True) or off (False), or let the near
 * cache's reads judge (None); returns whether the process looks first now. */
PyObject *
speedups_look_first(PyObject *module, PyObject *const *args, Py_ssize_t n)
{
    if (n > 1) {
        PyErr_SetString(PyExc_TypeError, "look_first(flag=None)");
        return NULL;
    }
    if (n == 1) {
        int flag = args[0] == Py_None ? -1 : PyObject_IsTrue(args[0]);
        if (flag == -1 && PyErr_Occurred())
            return NULL;
        forced = flag;
        near_reads = near_hits = quiet = 0;
        looking = 0;
    }
    return PyBool_FromLong(forced >= 0 ? forced : looking);
}

/* Whether this request looks first (see above). */
static int
looks_first(Reader *r)
{
    if (forced >= 0)
        return forced;
    if (!looking)
        return 0;
    if (++quiet > QUIET_REQUESTS) {
        looking = 0;
        near_reads = near_hits = 0;  /* the next judgement is of reads made from now on */
        return 0;
    }
    return r->waits <= WAITS_MAX || ++r->skipped % LOOK_EVERY == 0;
}

/* Send and receive without waiting, holding the GIL: IO_OK when the request went out
 * whole and some of its reply was already there, IO_AGAIN when what is left (the rest
 * of the request, or the reply) must be waited for, without the GIL. */
static int
try_first(Reader *r, Io *io)
{
    ssize_t n = send(io->fd, io->data, (size_t)io->len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return IO_AGAIN;
        io->err = errno;
        return errno == EINTR ? IO_EINTR : IO_ERRNO;
    }
    io->sends++;
    io->sent = n;
    if (io->sent < io->len)
        return IO_AGAIN;
    return receive_more(r, io, 0, MSG_DONTWAIT);
}

static PyObject *
io_error(int status, Io *io)
{
    switch (status) {
    case IO_CLOSED:
        PyErr_SetString(B.ClosedError, "memcached closed the connection mid-reply");
        break;
    case IO_TIMEOUT:
        PyErr_SetString(PyExc_TimeoutError, "timed out");
        break;
    case IO_NOMEM:
        PyErr_NoMemory();
        break;
    default:
        errno = io->err;
        PyErr_SetFromErrno(PyExc_OSError);
    }
    return NULL;
}

static int
parse_args(PyObject *args, const char *format, int *fd, PyObject **obj, double *deadline)
{
    PyObject *timeout;
    if (!PyArg_ParseTuple(args, format, fd, obj, &timeout))
        return -1;
    *deadline = 0;
    if (timeout != Py_None) {
        double t = PyFloat_AsDouble(timeout);
        if (t == -1 && PyErr_Occurred())
            return -1;
        if (t)
            *deadline = now() + t;
    }
    return 0;
}

/* The reply to one request from what is buffered, receiving more as needed (a get's
 * receive-and-scan loop without the GIL); `first`: a receive is due before parsing. */
static PyObject *
read_reply(Reader *r, Io *io, PyObject *request, int first)
{
    int status = IO_OK;
    if (Py_TYPE(request) == (PyTypeObject *)B.Get) {
        if (r->found == NULL) {
            PyObject *keys = PyObject_GetAttr(request, B.s_keys);
            PyObject *cas = keys ? PyObject_GetAttr(request, B.s_cas) : NULL;
            int gets = cas ? PyObject_IsTrue(cas) : -1;
            int failed = gets < 0 || values_begin(r, keys, gets) < 0;
            Py_XDECREF(keys);
            Py_XDECREF(cas);
            if (failed)
                return NULL;
        }
        int scan = first ? SCAN_NEED : values_scan(r);
        while (scan == SCAN_NEED) {
            Py_BEGIN_ALLOW_THREADS
            do {
                status = receive_more(r, io, !first, 0);
                first = 0;
                if (status == IO_OK)
                    scan = values_scan(r);
            } while (status == IO_OK && scan == SCAN_NEED);
            Py_END_ALLOW_THREADS
            if (status == IO_EINTR) {
                if (PyErr_CheckSignals() < 0)
                    return NULL;
                first = 1;  /* the interrupted receive again, no deadline check */
                continue;
            }
            if (status != IO_OK) {
                values_reset(r);
                return io_error(status, io);
            }
        }
        return values_finish(r, scan);
    }
    for (;;) {
        if (!first) {
            PyObject *reply = PyObject_CallMethodOneArg(request, B.s_read, (PyObject *)r);
            if (reply != B.NEED_DATA)
                return reply;
            Py_DECREF(reply);
        }
        int check = !first;
        do {
            Py_BEGIN_ALLOW_THREADS
            status = receive_more(r, io, check, 0);
            Py_END_ALLOW_THREADS
            check = 0;
        } while (status == IO_EINTR && PyErr_CheckSignals() == 0);
        if (status == IO_EINTR)
            return NULL;
        if (status != IO_OK)
            return io_error(status, io);
        first = 0;
    }
}

static int
send_all(Io *io)
{
    int status;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        status = send_rest(io);
        Py_END_ALLOW_THREADS
        if (status != IO_EINTR)
            break;
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
    if (status != IO_OK) {
        io_error(status, io);
        return -1;
    }
    return 0;
}

PyObject *
reader_request(Reader *r, PyObject *args)
{
    Io io = {0};
    PyObject *request;
    if (parse_args(args, "iOO:request", &io.fd, &request, &io.deadline) < 0)
        return NULL;
    if (encode_into(r, request, 0) < 0)
        return NULL;
    io.data = r->out;
    io.len = r->out_len;
    int status;
    /* The hot path: send, then receive (and scan a get's reply) in one release, unless
     * the reply was there once sent (looking first, above). */
    int is_get = Py_TYPE(request) == (PyTypeObject *)B.Get;
    values_reset(r);  /* a reply left half read by an error is never resumed */
    if (is_get) {
        PyObject *keys = PyObject_GetAttr(request, B.s_keys);
        PyObject *cas = keys ? PyObject_GetAttr(request, B.s_cas) : NULL;
        int gets = cas ? PyObject_IsTrue(cas) : -1;
        int failed = gets < 0 || values_begin(r, keys, gets) < 0;
        Py_XDECREF(keys);
        Py_XDECREF(cas);
        if (failed)
            return NULL;
    }
    status = IO_AGAIN;
    if (io.len <= RECV_MIN && looks_first(r)) {  /* a large request's reply is never there */
        status = try_first(r, &io);
        r->waits += ((status == IO_AGAIN ? 255 : 0) - r->waits) / 8;
    }
    if (status == IO_AGAIN) {
        Py_BEGIN_ALLOW_THREADS
        status = send_rest(&io);
        if (status == IO_OK)
            status = receive_more(r, &io, 0, 0);
        Py_END_ALLOW_THREADS
    }
    PyObject *reply;
    if (status == IO_EINTR) {  /* finish sending, then read as usual */
        if (PyErr_CheckSignals() < 0 || (io.sent < io.len && send_all(&io) < 0)) {
            values_reset(r);
            encode_release(r);
            return NULL;
        }
        encode_release(r);
        reply = read_reply(r, &io, request, 1);
    }
    else if (status != IO_OK) {
        values_reset(r);
        encode_release(r);
        return io_error(status, &io);
    }
    else {
        encode_release(r);
        reply = read_reply(r, &io, request, 0);
    }
    if (reply == NULL)
        return NULL;
    if (r->end > r->start) {
        Py_DECREF(reply);
        return reader_drained(r, NULL);
    }
    PyObject *done = reader_drained(r, NULL);
    Py_XDECREF(done);
    return reply;
}

PyObject *
reader_send(Reader *r, PyObject *args)
{
    Io io = {0};
    PyObject *data;
    if (parse_args(args, "iOO:send", &io.fd, &data, &io.deadline) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    io.data = view.buf;
    io.len = view.len;
    int failed = send_all(&io);
    PyBuffer_Release(&view);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
reader_receive(Reader *r, PyObject *args)
{
    Io io = {0};
    PyObject *requests;
    if (parse_args(args, "iOO:receive", &io.fd, &requests, &io.deadline) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(requests, "requests must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *replies = PyList_New(n);
    if (replies == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* Nothing buffered (the first reply, usually): receive before parsing. */
        PyObject *reply = read_reply(r, &io, PySequence_Fast_GET_ITEM(seq, i), r->end == r->start);
        if (reply == NULL)
            goto fail;
        PyList_SET_ITEM(replies, i, reply);
    }
    Py_DECREF(seq);
    PyObject *done = reader_drained(r, NULL);
    if (done == NULL) {
        Py_DECREF(replies);
        return NULL;
    }
    Py_DECREF(done);
    return replies;
fail:
    Py_XDECREF(replies);
    Py_DECREF(seq);
    return NULL;
}
