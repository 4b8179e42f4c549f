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
* any other store (the embedded ones, an async cluster) uses the Store
  primitives: ``incr`` (``add``/``incr`` on first use) and ``get_many``.

Every form answers ``(current, older)``: the slot's total after the bump and
the older slots' counts (missing ones are 0), or ``None`` for ``current`` when
the store could not be asked or did not answer (the limiter's fail mode).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from .cluster import Cluster
from .exceptions import McPatternsError
from .keys import Routed, placed
from .store import AsyncStore, Store
from .wire import ErrorReply, Get, Incr, MetaArithmetic, MetaGet, MetaReply, Request, Value

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
        return _cluster_tally(store, current, older, cost, expire)
    return (_bump(store, current, cost, expire), _counts(store.get_many(older), older))


async def async_tally(
    store: AsyncStore, current: Routed, older: Sequence[Routed], cost: int, expire: int
) -> Tally:
    """:func:`tally` over an :class:`~.store.AsyncStore` (its primitives)."""
    now = await store.incr(current, cost)
    if now is None:
        if await store.add(current, b"%d" % cost, expire):
            now = cost
        else:
            now = await store.incr(current, cost)
    return now, _counts(await store.get_many(older), older)


def untally(store: Store, current: Routed, cost: int) -> None:
    """Take back a refused decision's ``cost`` (best effort: left over, it only errs strict)."""
    with contextlib.suppress(McPatternsError):
        store.decr(current, cost)


async def async_untally(store: AsyncStore, current: Routed, cost: int) -> None:
    """:func:`untally` over an :class:`~.store.AsyncStore`."""
    with contextlib.suppress(McPatternsError):
        await store.decr(current, cost)


def _bump(store: Store, key: Routed, cost: int, expire: int) -> int | None:
    now = store.incr(key, cost)
    if now is not None:
        return now
    if store.add(key, b"%d" % cost, expire):
        return cost
    return store.incr(key, cost)  # another decision created it first; or unreachable: None


def _counts(found: dict[Any, Any], keys: Sequence[Routed]) -> list[int]:
    return [count_of(found.get(key)) for key in keys]


def _cluster_tally(
    store: Cluster, current: Routed, older: Sequence[Routed], cost: int, expire: int
) -> Tally:
    kb = placed(current)[0]
    olds = [placed(key)[0] for key in older]
    if store.options.protocol == "text":
        return _text_tally(store, current, kb, olds, cost, expire)
    batch: list[Request[Any]] = [
        MetaArithmetic(kb, delta=cost, vivify=expire, initial=cost, value=True)
    ]
    batch += [MetaGet(old, value=True) for old in olds]
    replies = store.exchange(current, batch)
    if replies is None:
        return None, [0] * len(olds)
    bumped = replies[0]
    if not isinstance(bumped, MetaReply) or bumped.status != b"VA" or bumped.data is None:
        return None, [0] * len(olds)
    return int(bumped.data), [_meta_count(reply) for reply in replies[1:]]


def _meta_count(reply: MetaReply | ErrorReply) -> int:
    if isinstance(reply, MetaReply) and reply.status == b"VA" and reply.data:
        return int(reply.data)
    return 0


def _text_tally(
    store: Cluster, current: Routed, kb: bytes, olds: list[bytes], cost: int, expire: int
) -> Tally:
    batch: list[Request[Any]] = [Incr(kb, cost)]
    if olds:
        batch.append(Get(tuple(olds)))
    replies = store.exchange(current, batch)
    if replies is None:
        return None, [0] * len(olds)
    counts = dict.fromkeys(olds, 0)
    if len(replies) > 1 and isinstance(replies[1], list):
        for item in replies[1]:
            if isinstance(item, Value):
                counts[item.key] = int(item.data)
    older = [counts[old] for old in olds]
    bumped = replies[0]
    if isinstance(bumped, int):
        return bumped, older
    if isinstance(bumped, ErrorReply):
        return None, older
    # NOT_FOUND: the slot's first decision creates it (add; incr after a lost race).
    if store.add(current, b"%d" % cost, expire):
        return cost, older
    return store.incr(current, cost), older
