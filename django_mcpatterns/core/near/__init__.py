"""The near cache: hot values served from process memory, with a staleness bound.

``OPTIONS["near_cache"] = {"max_age": 0.1, "max_bytes": 32 * 2**20, "prefixes": None,
"refresh_ahead": 0.5}``
keeps the values memcached answered in this process's memory and serves them from
there, with no round trip, for at most ``max_age`` seconds.  memcached has no
invalidation push (Redis's client-side caching has ``CLIENT TRACKING``), so the
bound is the whole contract, and it holds by construction:

The bound
    An entry's age counts from when the request that read it was *sent*, not
    from when its reply came: the clock is read before the request leaves.  So a
    value served at time ``t`` was on its server at some time after
    ``t - max_age``, and a write another process completed before then is in it.
    A read that begins more than ``max_age`` after a write completed, in any
    process, never returns an older value.

This process's writes
    Every write through the cache (``set``, ``add``, ``delete``, ``touch``,
    ``incr``, ``set_many``, cas writes, a ``get_or_compute`` fill, a namespace's
    invalidation) drops the key's copy once memcached answered (or the write
    failed: its outcome may be unknown), and voids the answer of every read of
    that key sent before it: such a read may return the old value after the
    write, and is not kept.  So a read that starts after a write of this process
    returned sees it, in any thread or task.  A ``set`` of a str or bytes value
    memcached stored (to live at least ``max_age``) keeps the value written instead,
    aged from when the set was sent, unless another write of this process to the key
    may have landed meanwhile.  ``flush_all`` (``cache.clear()``) empties every table
    of the process.

What is held
    Plain values (what ``get``, ``get_many``, ``get_or_set`` and
    ``get_or_compute`` return: the latter while its value is fresh) and
    namespaced values with their namespace's version keys, each under the same
    bound: an invalidation elsewhere reaches this process within ``max_age``;
    one here, at once.  Sets, lists, counters, locks, rate-limit slots, leases
    and ORM results are never held: they read through ``gets``, ``gets_leased``,
    ``gets_ttl`` or the store underneath, which this layer never answers (a lease
    ``gets_leased`` or ``lease`` takes is a write: the key's copy goes).

Refresh ahead
    A hit on an entry read before in its life and older than ``refresh_ahead``
    of ``max_age`` notes its key as due (a bounded set, per table, emptied in a
    forked child); a ``get`` that misses and goes to memcached anyway carries a
    few due keys held on its server in its own request
    (:meth:`~django_mcpatterns.core.client.shared.Driver.get_along`: one round
    trip, never failed over).  Each answer is held as a read sent then (aged from
    that request's send, so the bound holds as for any miss; absent on the server:
    dropped; a write of this process meanwhile wins, as for any read).  Plain
    values read by ``get`` with a str key only: namespaced values, envelopes,
    large values and keys under ``prefixes`` age out as before.

Large values past ``max_age``
    A value of :data:`LARGE_VALUE` bytes or more is read with its cas; past
    ``max_age`` it is revalidated with ``mg <key> c`` (no value sent), and kept
    for another ``max_age`` when its cas is unchanged.  memcached's cas counter
    restarts with the server, so the answer counts only when the server's epoch
    (:meth:`~django_mcpatterns.core.cluster.Cluster.server_epoch`) is the one the
    cas was read in.  In text mode (twemproxy, mcrouter) it is read again.

Isolation
    A caller mutating what it got never changes what the next caller gets:
    immutable values are handed out as they are (no copy, no pickle), flat
    dicts, lists and sets of them are copied per hit, anything else is kept
    pickled and unpickled per hit (:func:`keep`).

Memory and eviction
    Values are counted by the bytes they take here, plus their key and a fixed
    :data:`ENTRY_OVERHEAD` per entry, against ``max_bytes`` (the admission
    sketch counts too).  Entries past their bound are dropped as later fills
    come, oldest first, so memory holds the live ones (large ones stay: they
    may be revalidated).  When full, the least used of a few entries drawn at
    random is evicted, unless it is used more than the newcomer (TinyLFU
    admission: a frequency sketch of recent reads, halved as it ages), so a
    scan of cold keys cannot flush the hot ones.

Processes, threads and tasks
    One table per process and cache, shared by its threads and tasks: a lookup
    takes no lock; fills and invalidations take one briefly, never across I/O.
    A forked child starts empty.

Written once
    :class:`AsyncNearStore` (``_async.py``) is the source; :class:`NearStore` is
    generated from it.  The table is ``_model_table.py``, the options and the
    isolation rules ``_model.py``.
"""

from __future__ import annotations

from ._async import AsyncNearStore
from ._model import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_BYTES,
    DEFAULT_REFRESH_AHEAD,
    ENTRY_OVERHEAD,
    LARGE_VALUE,
    NEAR_OPTIONS,
    Kept,
    NearOptions,
    NearStats,
    keep,
    near_key,
)
from ._model_table import Entry, NearTable, Ticket
from ._sync import NearStore

__all__ = [
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_REFRESH_AHEAD",
    "ENTRY_OVERHEAD",
    "LARGE_VALUE",
    "NEAR_OPTIONS",
    "AsyncNearStore",
    "Entry",
    "Kept",
    "NearOptions",
    "NearStats",
    "NearStore",
    "NearTable",
    "Ticket",
    "keep",
    "near_key",
]
