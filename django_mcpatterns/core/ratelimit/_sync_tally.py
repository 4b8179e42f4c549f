# Generated from core/ratelimit/_async_tally.py by scripts/generate_sync.py: do not edit.
"""Bump one slot counter and read the older ones: the rate limiter's only I/O.

Written once for an :class:`~django_mcpatterns.core.store.AsyncStore` (``tally``,
``untally``); the sync forms are generated.  What each store allows in one round
trip differs, not the meaning:

* a cluster (:class:`~django_mcpatterns.core.cluster.Cluster`, or the
  :class:`~django_mcpatterns.core.aio.AsyncCluster` without blocking) in meta mode
  sends ``ma <slot> N<ttl> J<cost> D<cost> v`` and one ``mg <older> v`` per older
  slot in **one write** (1 round trip: the slots share a route, so one server);
* a cluster in text mode sends ``incr`` and one ``get`` of the older slots in
  one write (1 round trip), and on the slot's first use ``add`` then, if it
  lost that race, ``incr`` again (2 or 3);
* any other store (the embedded ones) uses the Store primitives: ``incr``
  (``add``/``incr`` on first use) and ``get_many``.

Every form answers ``(current, older)``: the slot's total after the bump and
the older slots' counts (missing ones are 0), or ``None`` for ``current`` when
the store could not be asked or did not answer (the limiter's fail mode).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from django_mcpatterns.core.exceptions import McPatternsError
from django_mcpatterns.core.keys import Key, Routed, shorten
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.store import Store
from django_mcpatterns.core.wire import Request

from ._model import CREATE, Tally, counts_of, tally_batch, tally_replies
from ._model_fallback import Owed

__all__ = ["Exchanger", "restore", "tally", "untally"]


@runtime_checkable
class Exchanger(Protocol):
    """A store that sends wire requests to a key's server itself: a cluster."""

    options: ClusterOptions

    def exchange(self, key: Key, requests: Sequence[Request[Any]]) -> list[Any] | None: ...


def tally(store: Store, current: Routed, older: Sequence[Routed], cost: int, expire: int) -> Tally:
    """Add ``cost`` to ``current`` (created with ``expire``); read ``older``."""
    if isinstance(store, Exchanger):
        batch = tally_batch(store.options.protocol, current, older, cost, expire)
        now, counts = tally_replies(store.exchange(current, batch), batch)
        if now is CREATE:
            created = store.add(current, b"%d" % cost, expire)
            now = cost if created else store.incr(current, cost)
        return now, counts
    now = store.incr(current, cost)
    if now is None:
        created = store.add(current, b"%d" % cost, expire)
        now = cost if created else store.incr(current, cost)
    return now, counts_of(store.get_many(older), older)


def untally(store: Store, current: Routed, cost: int) -> None:
    """Take back a refused decision's ``cost`` (best effort: left over, it only errs strict)."""
    with contextlib.suppress(McPatternsError):
        store.decr(current, cost)


def restore(store: Store, name: str, route: bytes, owed: Owed, expire: int) -> bool:
    """Give back what the fallback decided alone (``_model_fallback.py``); False: not now.

    Each slot gets its local admissions added; one the server lost (it
    restarted empty) is created with what was seen plus them (``add``: the
    first process back restores it, the others add theirs).
    """
    try:
        for slot, (seen, alone) in sorted(owed.items()):
            key = Routed(shorten(f"{name}:{slot}".encode()), route)
            if alone and store.incr(key, alone) is not None:
                continue
            if store.add(key, b"%d" % (seen + alone), expire):
                continue
            if alone and store.incr(key, alone) is None:
                return False  # the server is out again
    except McPatternsError:
        return False
    return True
