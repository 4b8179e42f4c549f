"""Leases: a cache fill lands only if nothing touched its key since its compute began.

A value computed from a source of truth races with writers: one that updates
the row and deletes the key (or sets the new value) while the compute runs
must win, or the old value is served to everyone until it expires.  This is
the guarantee of Facebook's memcache leases (Nishtala et al., *Scaling
Memcache at Facebook*, NSDI 2013, section 3.2.1), built here from memcached's
own primitives, so it holds in both protocols, through twemproxy, and in the
embedded :class:`~django_mcpatterns.core.memory.MemoryStore` alike:

1. Before computing, the filler reads the key with ``gets``.  On a miss it
   first ``add``\\ s a *placeholder* (:data:`PLACEHOLDER`, an envelope that is
   :attr:`~django_mcpatterns.core.values.envelope.Envelope.pending`: every plain read sees a miss)
   and reads the placeholder's cas.  That cas is the lease.
2. The fill is a ``cas`` against the lease.  A ``delete`` after step 1 removed
   the item (memcached answers ``NOT_FOUND``); a ``set``, another fill or
   :meth:`~django_mcpatterns.core.stampede.Stampede.mark_stale` changed its cas (``EXISTS``): the
   fill does not land, the caller still gets its computed value, and the
   next read computes afresh.

What is not guaranteed: a placeholder evicted or lost in a restart makes the
fill fail (the safe side, a miss); a writer that changes the source of truth
without touching the cache is invisible to any lease; two fillers may hold the
same lease (one took over a placeholder left by another): the first fill
lands, the second fails.  While a fill is pending, ``add`` of the key fails
(the placeholder exists) although reads miss.

Written once in ``_async.py`` (``async_take``, ``async_fill``...,
for an :class:`~django_mcpatterns.core.store.AsyncStore`); the sync functions here are generated
from them.  In async, a callable ``default`` may be a coroutine function (awaited) or
a plain callable (run through ``sync_to_async``: it may use the ORM).
"""

from __future__ import annotations

from ._async import async_fill, async_fill_missing, async_get_or_set, async_read, async_take
from ._model import PLACEHOLDER, PLACEHOLDER_TTL
from ._sync import fill, fill_missing, get_or_set, read, take

__all__ = [
    "PLACEHOLDER",
    "PLACEHOLDER_TTL",
    "async_fill",
    "async_fill_missing",
    "async_get_or_set",
    "async_read",
    "async_take",
    "fill",
    "fill_missing",
    "get_or_set",
    "read",
    "take",
]
