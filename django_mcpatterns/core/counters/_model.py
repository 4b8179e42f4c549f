"""Exact cached counters: the pure parts (the flight record, its packing, the argument).

A cached count ``C`` (an ASCII integer item, so ``incr``/``decr`` work on it)
shadows a count in a source of truth.  Writers change the source and then
the cache; readers that miss load the count and fill the cache.  The
obvious designs break (``docs/counters.md`` walks through each):

* a reader loads *before* a writer commits and fills *after* the writer's
  ``incr`` found no item: the fill is one short, for good;
* a reader loads *after* a writer commits and fills *before* the writer's
  ``incr``: the ``incr`` counts that write twice;
* the item is evicted between a writer's commit and its ``incr``, or while
  a reader loads: either of the above, by another route.

The fix is a *flight record* ``F`` beside ``C``, one 64-bit counter that
memcached changes atomically, used as a seqlock:

``F = incarnation · 2**40 + entered · 2**20 + exited``

* a writer enters (``incr F 2**20``) *before* it writes the source, and when
  the write is committed applies its delta to ``C`` and *then* exits
  (``incr F 1``).  Its ticket is the incarnation its enter saw;
* a reader that misses reads ``F`` with its cas (``S0``); if a writer is in
  flight (``entered != exited``) it returns the loaded count without
  caching it.  Otherwise it takes a lease on ``C`` (a placeholder added,
  its cas kept), loads, reads ``F`` again (``S1``), and fills ``C`` by
  ``cas`` against its lease only if ``S1`` is ``S0`` (value *and* cas: no
  writer entered or exited meanwhile, and ``F`` was not recreated);
* an eviction of ``F`` is noticed by the writers in flight: their exit finds
  another incarnation (or nothing).  Such a writer takes its stray exit back
  (``decr F 1``) and deletes ``C``, in that order, which voids every fill a
  reader based on the record its stray exit made look quiet.

Only ``incr``, ``decr``, ``add``, ``gets``, ``cas`` and ``delete``: both
protocols, twemproxy and the embedded store alike.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

from .. import chance

__all__ = ["ENTER", "EXIT", "ROTATE", "Flight", "fresh", "unpack"]

ENTER: Final = 1 << 20
EXIT: Final = 1
_FIELD: Final = (1 << 20) - 1
_INCARNATIONS: Final = 1 << 24

ROTATE: Final = 1 << 19
"""Exits after which a writer deletes the flight record (as an eviction would):
long before a 20-bit field carries into the next, which would leave the record
never quiet again (no caching until it expires)."""

FLIGHT_TTL: Final = 86400
"""Exptime of a flight record: a flight left open (a rolled-back write whose
exit never ran) keeps readers from caching at most this long."""


@dataclass(frozen=True, slots=True)
class Flight:
    """A flight record read from memcached."""

    incarnation: int
    entered: int
    exited: int

    @property
    def quiet(self) -> bool:
        """No writer is between its enter and its exit."""
        return self.entered == self.exited


def unpack(value: int) -> Flight:
    """The fields of a flight record's value."""
    return Flight(value >> 40, (value >> 20) & _FIELD, value & _FIELD)


def fresh(entered: int = 0, rng: random.Random | None = None) -> int:
    """A new flight record's value: a random incarnation, ``entered`` writers in flight."""
    incarnation = (rng or chance.generator).randrange(1, _INCARNATIONS)
    return (incarnation << 40) + entered * ENTER
