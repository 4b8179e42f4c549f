"""Bump one slot counter and read the older ones: the rate limiter's only I/O, in pairs.

``tally`` (sync) and ``async_tally`` are the two forms the generated and the
async :class:`~django_mcpatterns.core._async.ratelimit.AsyncRateLimiter` call.
They differ in what each store allows in one round trip, not in meaning:

* a :class:`~.cluster.Cluster` in meta mode sends ``ma <slot> N<ttl> J<cost>
  D<cost> v`` and one ``mg <older> v`` per older slot in **one write**
  (1 round trip: the slots share a route, so one server);
* a Cluster in text mode sends ``incr`` and one ``get`` of the older slots in
  one write (1 round trip), and on the slot's first use ``add`` then, if it
  lost that race, ``incr`` again (2 or 3);
* an :class:`~.aio.AsyncCluster` does the same as a Cluster, without blocking;
* any other store (the embedded ones) uses the Store primitives: ``incr``
  (``add``/``incr`` on first use) and ``get_many``.

Every form answers ``(current, older)``: the slot's total after the bump and
the older slots' counts (missing ones are 0), or ``None`` for ``current`` when
the store could not be asked or did not answer (the limiter's fail mode).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Final

from .aio import AsyncCluster
from .cluster import Cluster
from .exceptions import McPatternsError
from .keys import Routed, placed
from .store import AsyncStore, Store
from .wire import Get, Incr, MetaArithmetic, MetaGet, MetaReply, Request

__all__ = ["Tally", "async_tally", "async_untally", "count_of", "tally", "untally"]

Tally = tuple[int | None, list[int]]


def count_of(value: Any) -> int:
    """A slot counter's value as an int (memcached answers digits; a miss is 0)."""
    if value is None:
        return 0
    if isinstance(value, bytes | bytearray):
        return int(value)
    return int(value)


def tally(store: Store, current: Routed, older: Sequence[Routed], cost: int, expire: int) -> Tally:
    """Add ``cost`` to ``current`` (created with ``expire``); read ``older``."""
    if isinstance(store, Cluster):
        batch = _batch(store.options.protocol, current, older, cost, expire)
        now, counts = _replies(store.exchange(current, batch), batch)
        if now is _CREATE:
            now = (
                store.incr(current, cost) if not store.add(current, b"%d" % cost, expire) else cost
            )
        return now, counts
    now = store.incr(current, cost)
    if now is None:
        now = cost if store.add(current, b"%d" % cost, expire) else store.incr(current, cost)
    return now, _counts(store.get_many(older), older)


async def async_tally(
    store: AsyncStore, current: Routed, older: Sequence[Routed], cost: int, expire: int
) -> Tally:
    """:func:`tally` over an :class:`~.store.AsyncStore`."""
    if isinstance(store, AsyncCluster):
        batch = _batch(store.options.protocol, current, older, cost, expire)
        now, counts = _replies(await store.exchange(current, batch), batch)
        if now is _CREATE:
            created = await store.add(current, b"%d" % cost, expire)
            now = cost if created else await store.incr(current, cost)
        return now, counts
    now = await store.incr(current, cost)
    if now is None:
        created = await store.add(current, b"%d" % cost, expire)
        now = cost if created else await store.incr(current, cost)
    return now, _counts(await store.get_many(older), older)


def untally(store: Store, current: Routed, cost: int) -> None:
    """Take back a refused decision's ``cost`` (best effort: left over, it only errs strict)."""
    with contextlib.suppress(McPatternsError):
        store.decr(current, cost)


async def async_untally(store: AsyncStore, current: Routed, cost: int) -> None:
    """:func:`untally` over an :class:`~.store.AsyncStore`."""
    with contextlib.suppress(McPatternsError):
        await store.decr(current, cost)


class _Create:
    """The text protocol's answer for a slot's first use: ``incr`` found no item."""


_CREATE: Final = _Create()


def _counts(found: dict[Any, Any], keys: Sequence[Routed]) -> list[int]:
    return [count_of(found.get(key)) for key in keys]


def _batch(
    protocol: str, current: Routed, older: Sequence[Routed], cost: int, expire: int
) -> list[Request[Any]]:
    """One write: bump the slot (creating it, in meta), read the older slots."""
    kb = placed(current)[0]
    olds = tuple(placed(key)[0] for key in older)
    if protocol == "text":
        return [Incr(kb, cost), Get(olds)] if olds else [Incr(kb, cost)]
    bump = MetaArithmetic(kb, delta=cost, vivify=expire, initial=cost, value=True)
    return [bump, *(MetaGet(old, value=True) for old in olds)]


def _replies(replies: list[Any] | None, batch: list[Request[Any]]) -> tuple[Any, list[int]]:
    """``(current, older)`` from the replies to :func:`_batch` (``_CREATE``: add the slot)."""
    bump, reads = batch[0], batch[1:]
    if isinstance(bump, Incr):
        olds = list(reads[0].keys) if reads and isinstance(reads[0], Get) else []
    else:
        olds = [read.key for read in reads if isinstance(read, MetaGet)]
    if replies is None:
        return None, [0] * len(olds)
    counts = dict.fromkeys(olds, 0)
    if isinstance(bump, Incr):
        for item in replies[1] if len(replies) > 1 and isinstance(replies[1], list) else []:
            counts[item.key] = count_of(item.data)
        bumped = replies[0]
        if bumped is None:
            return _CREATE, [counts[old] for old in olds]
        return (bumped if isinstance(bumped, int) else None), [counts[old] for old in olds]
    for old, reply in zip(olds, replies[1:], strict=True):
        if isinstance(reply, MetaReply) and reply.status == b"VA" and reply.data:
            counts[old] = count_of(reply.data)
    bumped = replies[0]
    if not isinstance(bumped, MetaReply) or bumped.status != b"VA" or bumped.data is None:
        return None, [counts[old] for old in olds]
    return count_of(bumped.data), [counts[old] for old in olds]
