"""Leases: a cache fill lands only if nothing touched its key since its compute began.

The algorithm of :mod:`django_mcpatterns.core.leases` (read its docstring), for
an :class:`~django_mcpatterns.core.store.AsyncStore`; the sync functions are
generated from these (``async_take`` -> ``take``...).
"""

from __future__ import annotations

import logging
from typing import Any

from django_mcpatterns.core.concurrency import async_call
from django_mcpatterns.core.exceptions import ValueTooLargeError
from django_mcpatterns.core.keys import Key
from django_mcpatterns.core.store import AsyncStore, CasToken
from django_mcpatterns.core.values.envelope import Envelope

from ._model import PLACEHOLDER, PLACEHOLDER_TTL

logger = logging.getLogger("django_mcpatterns.leases")


async def async_read(store: AsyncStore, key: Key) -> tuple[Any, CasToken | None]:
    """``gets`` of ``key`` with envelopes as
    :class:`~django_mcpatterns.core.values.envelope.Envelope` (placeholders too)."""
    return await store.gets_envelope(key)


async def async_take(
    store: AsyncStore, key: Key, ttl: int, *, missing: bool = False
) -> tuple[Any, CasToken | None]:
    """Return what ``key`` holds (as :func:`async_read`) and its cas: the lease a fill must match.

    On a miss a :data:`~django_mcpatterns.core.placeholder.PLACEHOLDER` living
    ``ttl`` (memcached exptime) is added first; ``missing``: the caller just
    saw a miss, so skip the first read.  ``(None, None)``: the key could not
    be leased (deleted again at once, or its server unreachable), so no fill
    may land.
    """
    if not missing:
        found, cas = await async_read(store, key)
        if cas is not None:
            return found, cas
    await store.add(key, PLACEHOLDER, ttl)
    return await async_read(store, key)


async def async_fill(
    store: AsyncStore, key: Key, value: Any, lease: CasToken | None, expire: int
) -> bool:
    """Store ``value`` only if ``key`` still holds the item ``lease`` was read from."""
    if lease is None:
        return False
    try:
        stored = await store.cas(key, value, lease, expire)
    except ValueTooLargeError:
        logger.warning("the value of %r is over the item size limit; not cached", key)
        return False
    if not stored:
        logger.debug("fill of %r not stored: the key changed since its lease was taken", key)
    return stored is True


async def async_get_or_set(
    store: AsyncStore, key: Key, default: Any, expire: int, *, ttl: int = PLACEHOLDER_TTL
) -> Any:
    """Return the value of ``key``, or ``default`` (called if callable) filled under a lease.

    A plain read first (a hit is one request).  On a miss the lease is taken
    before ``default`` is called, so a delete or set of the key meanwhile
    keeps the computed value out of the cache; it is returned all the same.
    In async a coroutine function ``default`` is awaited, a plain callable
    runs through ``sync_to_async`` (it may use the ORM; :mod:`~django_mcpatterns.core.concurrency`).
    """
    missing = object()
    found = await store.get(key, missing)
    if found is not missing:
        return found
    return await async_fill_missing(store, key, default, expire, ttl=ttl)


async def async_fill_missing(
    store: AsyncStore, key: Key, default: Any, expire: int, *, ttl: int = PLACEHOLDER_TTL
) -> Any:
    """The miss half of :func:`async_get_or_set`: lease, compute ``default``, fill; return it.

    As Django's ``get_or_set`` does after its ``add``: when the fill does not
    land, return what the cache holds then (a racing writer's value), or
    ``default`` when it holds nothing.
    """
    current, lease = await async_take(store, key, ttl, missing=True)
    if callable(default):
        default = await async_call(default)
    if type(current) is Envelope and current.pending:
        if await async_fill(store, key, default, lease, expire):
            return default
        return await store.get(key, default)  # a racing writer's value, or nothing
    if lease is None:
        return default  # nothing readable there (unreachable, refused): not cached
    return await store.get(key, default)  # filled by another caller since our read: theirs
