"""Add-based, owner-safe, expiring locks over any Store (memcached's "ghetto" locks).

The protocol, in memcached's own primitives (reference 004, "Ghetto central
locking"), and what it costs in round trips (meta protocol / text protocol):

acquire
    ``add_cas(key, token, exptime)``: stored only when nobody holds the key,
    and it hands back the item's cas token (meta: ``ms <key> ME T<ttl> c``;
    text: ``add`` and ``gets`` in one write).  1 / 1; a blocking acquire
    repeats it with back-off.
release
    ``delete_cas(key, cas)``: deletes only the version our acquire (or
    extend) stored, so a lock that lapsed and was taken over by another owner
    is never deleted.  Meta ``md <key> C<cas>``: 1; text has no such delete,
    so ``gets`` then ``cas`` of the same bytes with exptime -1: 2.  An
    uncontended acquire + release costs 2 / 3.
extend
    ``recas(key, token, cas, <new TTL>)``, returning the new cas (meta
    ``ms <key> C<cas> T<ttl> c``; text ``cas`` and ``gets`` in one write): 1 / 1.
fallback
    Where the cas is not known here (another thread acts with ``token=``) or
    no longer matches (a keepalive extended the lock), release and extend go
    by the token instead: :func:`rewrite_owned`, ``gets`` then ``cas``, which
    rewrites the item only while it holds our token.
locked, owned
    ``get``: one request.

Every lock expires, so a holder that crashed cannot wedge anything.  memcached's
clock ticks in whole seconds (an item stored with exptime ``e`` lives more than
``e - 1`` and at most ``e`` seconds), so a lock of ``timeout`` seconds is stored
with exptime ``ceil(timeout) + 1``: it is held at least ``timeout`` seconds and
freed at most ``ceil(timeout) + 1`` seconds after it was taken.

"Held by someone else" is not "server unreachable"
    A :class:`~django_mcpatterns.core.cluster.Cluster` degrades an unreachable server to misses and
    failed writes by default, and a failed ``add`` would then look exactly like
    a lost race (the reference warns about this).  Locks therefore run on the
    store's *strict* view (:func:`authoritative`): the same servers, pools and
    node health, but an unreachable server raises
    :class:`~django_mcpatterns.core.exceptions.NodeUnavailableError`.  Users keep ``raise_errors``
    off for ordinary cache traffic and still get a clear error from locks.

With ``failover="remap"`` a lock whose server is dead is taken on the next
server of the ring; processes that disagree about the dead server's health can
then hold the "same" lock on two servers.  Use ``"miss"`` (the default) where
exclusion matters more than availability.

Owners
    A :class:`Lock` object keeps one owner per thread: its token lives in a
    ``threading.local`` (redis-py's ``thread_local=True``), so threads sharing
    one object (a module-level lock, a lock on a view class) exclude each other
    like separate owners, and a thread can only release what it took.  To let
    another thread finish an owner's work, pass the owner's token explicitly
    (``extend(..., token=t)``, ``release(token=t)``: a keepalive thread) or
    build the lock with ``thread_local=False`` to hand the whole object over (a
    background job that releases it).  Used as a decorator it takes a fresh
    owner (token) per call.

asyncio
    :class:`AsyncLock` is the same lock over an
    :class:`~django_mcpatterns.core.store.AsyncStore`, with coroutine methods of the same names
    (``await lock.acquire()``, ``async with lock:``, a decorator of coroutine
    functions).  It waits with ``asyncio.sleep``, so a waiter never blocks the
    event loop, and it keeps one owner per *task* (every task of a loop runs
    on one thread): two tasks sharing a lock object exclude each other, and a
    waiter in the same loop as the holder gets the lock once the holder
    releases it.  On cache objects, ``cache.lock(...)`` returns one lock with
    both forms (``acquire``/``aacquire``...; :mod:`django_mcpatterns.patterns.locks`).

Written once
    The algorithm is asyncio code in ``_async.py``; the sync
    :class:`Lock` and :func:`rewrite_owned` in ``_sync.py`` are
    generated from it (``scripts/generate_sync.py``).  The pure parts (events,
    :class:`Backoff`, exptimes, :func:`authoritative`) are in ``_model.py``
    and the owners in :mod:`django_mcpatterns.core.concurrency`; every name stays importable from
    here.
"""

from __future__ import annotations

from ._async import AsyncLock, async_strict_view
from ._async import rewrite_owned as async_rewrite_owned
from ._model import (
    DEFAULT_TIMEOUT,
    MAX_TIMEOUT,
    Backoff,
    EventHook,
    LockTimedOut,
    LockWaited,
    Ownership,
    SupportsStrict,
    authoritative,
    emit,
    exptime_for,
    new_token,
)
from ._sync import Lock, rewrite_owned, strict_view

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
    "AsyncLock",
    "Backoff",
    "EventHook",
    "Lock",
    "LockTimedOut",
    "LockWaited",
    "Ownership",
    "SupportsStrict",
    "async_rewrite_owned",
    "async_strict_view",
    "authoritative",
    "emit",
    "exptime_for",
    "new_token",
    "rewrite_owned",
    "strict_view",
]
