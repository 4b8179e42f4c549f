"""Leases: a cache fill lands only if nothing touched its key since its compute began.

A value computed from a source of truth races with writers: one that updates
the row and deletes the key (or sets the new value) while the compute runs
must win, or the old value is served to everyone until it expires.  This is
the guarantee of Facebook's memcache leases (Nishtala et al., *Scaling
Memcache at Facebook*, NSDI 2013, section 3.2.1), built here from memcached's
own primitives, so it holds in both protocols, through twemproxy, and in the
embedded :class:`~.memory.MemoryStore` alike:

1. Before computing, the filler reads the key with ``gets``.  On a miss it
   first ``add``\\ s a *placeholder* (:data:`PLACEHOLDER`, an envelope that is
   :attr:`~.envelope.Envelope.pending`: every plain read sees a miss) and
   reads the placeholder's cas.  That cas is the lease.
2. The fill is a ``cas`` against the lease.  A ``delete`` after step 1 removed
   the item (memcached answers ``NOT_FOUND``); a ``set``, another fill or
   :meth:`~.stampede.Stampede.mark_stale` changed its cas (``EXISTS``): the
   fill does not land, the caller still gets its computed value, and the
   next read computes afresh.

What is not guaranteed: a placeholder evicted or lost in a restart makes the
fill fail (the safe side, a miss); a writer that changes the source of truth
without touching the cache is invisible to any lease; two fillers may hold the
same lease (one took over a placeholder left by another): the first fill
lands, the second fails.  While a fill is pending, ``add`` of the key fails
(the placeholder exists) although reads miss.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Final

from .envelope import Envelope
from .exceptions import ValueTooLargeError
from .keys import Key
from .store import CasToken, Store

__all__ = ["PLACEHOLDER", "PLACEHOLDER_TTL", "fill", "fill_missing", "get_or_set", "read", "take"]

logger = logging.getLogger("django_mcpatterns.leases")

PLACEHOLDER: Final = Envelope(None, -math.inf, -math.inf)
"""What a filler ``add``\\ s on a miss: a pending envelope, which plain reads see as a miss."""

PLACEHOLDER_TTL: Final = 301
"""Default exptime of a placeholder: a crashed filler's only blocks ``add`` that long."""


def read(store: Store, key: Key) -> tuple[Any, CasToken | None]:
    """``gets`` of ``key`` with envelopes as :class:`~.envelope.Envelope` (placeholders too)."""
    return store.gets_envelope(key)


def take(store: Store, key: Key, ttl: int, *, missing: bool = False) -> tuple[Any, CasToken | None]:
    """Return what ``key`` holds (as :func:`read`) and its cas: the lease a fill must match.

    On a miss a :data:`PLACEHOLDER` living ``ttl`` (memcached exptime) is added
    first; ``missing``: the caller just saw a miss, so skip the first read.
    ``(None, None)``: the key could not be leased (deleted again at once, or
    its server unreachable), so no fill may land.
    """
    if not missing:
        found, cas = read(store, key)
        if cas is not None:
            return found, cas
    store.add(key, PLACEHOLDER, ttl)
    return read(store, key)


def fill(store: Store, key: Key, value: Any, lease: CasToken | None, expire: int) -> bool:
    """Store ``value`` only if ``key`` still holds the item ``lease`` was read from."""
    if lease is None:
        return False
    try:
        stored = store.cas(key, value, lease, expire)
    except ValueTooLargeError:
        logger.warning("the value of %r is over the item size limit; not cached", key)
        return False
    if not stored:
        logger.debug("fill of %r not stored: the key changed since its lease was taken", key)
    return stored is True


def get_or_set(
    store: Store, key: Key, default: Any, expire: int, *, ttl: int = PLACEHOLDER_TTL
) -> Any:
    """Return the value of ``key``, or ``default`` (called if callable) filled under a lease.

    A plain read first (a hit is one request).  On a miss the lease is taken
    before ``default`` is called, so a delete or set of the key meanwhile
    keeps the computed value out of the cache; it is returned all the same.
    """
    missing = object()
    found = store.get(key, missing)
    if found is not missing:
        return found
    return fill_missing(store, key, default, expire, ttl=ttl)


def fill_missing(
    store: Store, key: Key, default: Any, expire: int, *, ttl: int = PLACEHOLDER_TTL
) -> Any:
    """The miss half of :func:`get_or_set`: lease, compute ``default``, fill; return it.

    As Django's ``get_or_set`` does after its ``add``: when the fill does not
    land, return what the cache holds then (a racing writer's value), or
    ``default`` when it holds nothing.
    """
    current, lease = take(store, key, ttl, missing=True)
    if callable(default):
        default = default()
    if type(current) is Envelope and current.pending:
        if fill(store, key, default, lease, expire):
            return default
        return store.get(key, default)  # a racing writer's value, or nothing
    if lease is None:
        return default  # nothing readable there (unreachable, refused): not cached
    return store.get(key, default)  # filled by another caller since our read: theirs
