/* The compiled hot path of django_mcpatterns.core.protocol: what its sources share.
 *
 * A Reader is one connection's receive buffer and parser (the C twin of
 * protocol/reader.py's Reader, same methods, same answers), with the sync
 * transport's I/O on a blocking socket's descriptor (io.c): a request is
 * encoded, sent, received and its reply scanned with the GIL released once.
 * A Reader belongs to one connection, used by one thread at a time. */
#ifndef MCP_SPEEDUPS_H
#define MCP_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The Python objects the parser answers with, bound once by bind() (compiled.py). */
typedef struct {
    PyObject *ProtocolError;  /* exceptions.ProtocolError */
    PyObject *ClosedError;    /* transport.ConnectionClosedError */
    PyObject *ErrorReply, *MetaReply, *Value;
    PyObject *NEED_DATA;
    PyObject *Get, *Store;    /* request classes encoded and scanned in C */
    PyObject *verbs[6];       /* "set" "add" "replace" "append" "prepend" "cas" */
    PyObject *s_keys, *s_cas, *s_command, *s_key, *s_data, *s_flags, *s_expire, *s_cas_token;
    PyObject *s_read, *s_encode, *s_matches, *s_quiet, *s_QUIETED, *s_STATUSES;
    PyObject *k_error, *k_client_error, *k_server_error;
    PyObject *END;
    PyObject *MetaReplyMaker; /* MetaReply from its four fields (maker.c), bind_meta() */
    int bound;
} Bound;

extern Bound B;

/* One VALUE block scanned and not yet built: offsets from the reader's start. */
typedef struct {
    Py_ssize_t key, flags_off, flags_len, data_off, data_len, cas_off, cas_len;
} Entry;

typedef struct {
    PyObject_HEAD
    char *buf;
    Py_ssize_t cap, start, end;
    Py_ssize_t need;          /* bytes (from start) the awaited piece needs; 0: a line */
    /* a get's reply under way (values()) */
    PyObject *found;          /* list of Value, NULL outside a get's reply */
    PyObject **keys;          /* the keys asked for, owned */
    char *answered;
    Py_ssize_t nkeys, *table, tmask;
    int cas;
    Py_ssize_t vpos;          /* the scan resumes here (from start) */
    Entry *entries;
    Py_ssize_t nentries, centries;
    Py_ssize_t line_off, line_len;  /* the line that ended the scan, or the mismatch */
    PyObject *stats;          /* a stats reply under way */
    char *out;                /* the encoded request (io.c) */
    Py_ssize_t out_cap, out_len;
    unsigned char waits;      /* io.c: how often a reply looked for was not there (of 255) */
    unsigned char skipped;    /* io.c: requests sent without looking first, mod 256 */
} Reader;

extern PyTypeObject ReaderType;
extern PyTypeObject MakerType;  /* maker.c */
PyObject *speedups_pack_rows(PyObject *module, PyObject *args);   /* rows.c */
PyObject *speedups_unpack_rows(PyObject *module, PyObject *args);
PyObject *speedups_columns(PyObject *module, PyObject *rows);
PyObject *speedups_unpack_columns(PyObject *module, PyObject *args);
PyObject *speedups_shape_bind(PyObject *module, PyObject *args);  /* shape.c */
PyObject *speedups_shape_walk(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_shape_named(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

enum { SCAN_NEED, SCAN_LINE, SCAN_MISMATCH };

/* The longest value a reply may declare: memcached's item size ceiling (-I at most 1 GiB).
 * A longer one is a protocol error, not a buffer to grow; protocol/reader.py's
 * MAX_VALUE_LENGTH is the same (a test compares them through the module's constant). */
#define MAX_VALUE_LENGTH (1LL << 30)

/* io.c: whether the compiled exchange looks for a reply before releasing the GIL
 * (try_first); near.c's reads set it, look_first() forces it (tests). */
void note_near_reads(int hit);
int look_first_init(void);  /* module init: the child of a fork judges afresh */
PyObject *speedups_look_first(PyObject *module, PyObject *const *args, Py_ssize_t n);

/* reader.c */
int reader_reserve(Reader *r, Py_ssize_t extra);       /* no GIL needed */
Py_ssize_t find_crlf(const char *b, Py_ssize_t p, Py_ssize_t n);
PyObject *mismatch(const char *s, Py_ssize_t n);       /* sets ProtocolError, returns NULL */
PyObject *unexpected(const char *s, Py_ssize_t n);     /* an ErrorReply, or NULL (mismatch) */
PyObject *reader_drained(Reader *r, PyObject *unused);

/* values.c */
int values_begin(Reader *r, PyObject *keys, int cas);  /* GIL */
int values_scan(Reader *r);                            /* no GIL: SCAN_* */
PyObject *values_finish(Reader *r, int state);         /* GIL: result, NEED_DATA or NULL */
PyObject *reader_values(Reader *r, PyObject *args);
void values_reset(Reader *r);

/* meta.c */
PyObject *reader_meta(Reader *r, PyObject *request);

/* encode.c */
int encode_into(Reader *r, PyObject *request, int append);  /* r->out; 0 ok, -1 error */
void encode_release(Reader *r);                              /* r->out sent: shrunk */
PyObject *speedups_encode(PyObject *module, PyObject *requests);

/* many.c */
PyObject *speedups_keyed(PyObject *module, PyObject *args);
PyObject *speedups_placed(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_decoded(PyObject *module, PyObject *args);
PyObject *speedups_grouped(PyObject *module, PyObject *args);
PyObject *speedups_hits(PyObject *module, PyObject *args);

/* trip.c */
extern PyTypeObject TripType, ValueDecoderType, RunnerType;
PyObject *speedups_trip(PyObject *module, PyObject *const *args, Py_ssize_t n);
PyObject *speedups_bind_trip(PyObject *module, PyObject *args);

/* waiter.c */
extern PyTypeObject WaiterType, WaiterIterType, WakeupsType;
PyObject *waiter_new(PyObject *loop);
int waiter_outcome(PyObject *waiter, PyObject **result);
PyObject *speedups_resolve(PyObject *module, PyObject *args);

/* near.c: the near cache's hit and fill (core/near/_model_table.py) */
PyObject *speedups_bind_near(PyObject *module, PyObject *args);
PyObject *speedups_near_hit(PyObject *module, PyObject *const *args, Py_ssize_t n);
PyObject *speedups_near_missed(PyObject *module, PyObject *table);
PyObject *speedups_near_untrack(PyObject *module, PyObject *entry);
PyObject *speedups_near_fill(PyObject *module, PyObject *const *args, Py_ssize_t n);

/* io.c */
PyObject *reader_request(Reader *r, PyObject *args);
PyObject *reader_send(Reader *r, PyObject *args);
PyObject *reader_receive(Reader *r, PyObject *args);

#endif
