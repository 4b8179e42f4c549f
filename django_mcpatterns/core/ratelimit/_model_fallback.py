"""The local fallback of ``fail="open"``: a limit kept in the process while its server is out.

Without it, an open limit whose server cannot be reached admits everything
(5,784 attempts of a "50/20s" limit on 4 workers with every server stalled 2
seconds).  With it, each process decides alone, by the same slotted window:

* **seeded** with the slot counts its server last answered this process (the
  attempts every process made, as far as that answer knew): a window already
  used up stays used up;
* **plus** what this process admitted alone since.

So while a limit's server is unreachable each process admits at most
``limit`` per window, less what the server had counted; with ``P`` processes
at most ``P * limit`` (and nothing more once the window was used up).

When the server answers again, the process gives back what it admitted alone
(:func:`~._async_tally.restore`): each slot's local admissions are added to its
counter, and a slot the server lost (it restarted empty) is created with what
was seen plus them.  So across one server's restart a window holds at most
``2 * limit`` (what the server counted before, ``limit`` after), and less
when the returning processes restore what they saw.

Pure and thread-safe; one per store's servers and process (:func:`fallback_for`),
shared by every limiter (sync and async) of those servers: two caches on other
clusters that make the same keys (the same ``KEY_PREFIX`` and limit names) keep
their counts apart, as their servers do.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

from ._model import Decision, Window

__all__ = ["FALLBACK", "Fallback", "Owed", "fallback_for"]

SEEN_KEPT = 16_384  # names whose last counts are remembered (past it, the memory starts over)

Owed = dict[int, tuple[int, int]]
"""A name's slots to give back: slot index -> (count last seen, admitted alone)."""


class Fallback:
    """The counts each name's server last answered, and what was admitted without it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int, tuple[int, ...]]] = {}  # name -> (slot, counts)
        self._alone: dict[str, dict[int, int]] = {}  # name -> slot -> admitted alone

    def seen(self, name: str, slot: int, current: int, older: Sequence[int]) -> None:
        """The server answered: slot ``slot`` holds ``current``, the ones before it ``older``."""
        seen = self._seen
        if len(seen) >= SEEN_KEPT:
            seen.clear()
        seen[name] = (slot, (*older, current))  # one assignment: no lock on the hot path

    def owes(self, name: str) -> bool:
        """Whether this process decided ``name`` alone since its server last answered."""
        return name in self._alone

    def decide(self, window: Window, name: str, cost: int, now: float) -> Decision:
        """Decide alone (the server cannot be asked): seeded counts plus local admissions."""
        k = window.slot(now)
        with self._lock:
            counts = self._counts(name, window, k)
            alone = self._alone.get(name, {})
            for slot, admitted in alone.items():
                counts[slot] = counts.get(slot, 0) + admitted
            older = [counts.get(i, 0) for i in range(k - window.slots, k)]
            decision = window.decide(counts.get(k, 0) + cost, older, cost, now)
            kept = {i: n for i, n in alone.items() if i >= k - window.slots}
            if decision.allowed and cost:
                kept[k] = kept.get(k, 0) + cost
            self._alone[name] = kept  # owed, even empty: the counts seen are restored too
        return Decision(
            decision.allowed,
            decision.limit,
            decision.remaining,
            decision.retry_after,
            degraded=True,
        )

    def take(self, name: str, window: Window, now: float) -> Owed:
        """What to give back to the server for ``name``: every slot still in the window
        that was seen counted or admitted alone (forgotten here: given back once)."""
        k = window.slot(now)
        with self._lock:
            alone = self._alone.pop(name, {})
            counts = self._counts(name, window, k)
        slots = sorted({*counts, *(slot for slot in alone if slot >= k - window.slots)})
        return {slot: (counts.get(slot, 0), alone.get(slot, 0)) for slot in slots}

    def give_back(self, name: str, owed: Owed) -> None:
        """``owed`` could not be given back (the server is out again): keep it."""
        with self._lock:
            alone = self._alone.setdefault(name, {})
            for slot, (_, admitted) in owed.items():
                alone[slot] = alone.get(slot, 0) + admitted

    def _counts(self, name: str, window: Window, k: int) -> dict[int, int]:
        """The counts last seen for ``name``, by slot, of the slots still in the window at ``k``."""
        found = self._seen.get(name)
        if found is None:
            return {}
        slot, counts = found
        first = slot - len(counts) + 1
        return {
            first + i: count
            for i, count in enumerate(counts)
            if first + i >= k - window.slots and count
        }


FALLBACK = Fallback()
"""The fallback of a store that cannot be told apart (no weak reference to it)."""

_by_store: weakref.WeakKeyDictionary[object, Fallback] = weakref.WeakKeyDictionary()
_by_store_lock = threading.Lock()


def fallback_for(store: object) -> Fallback:
    """The fallback of ``store``'s servers: a cluster's and its asyncio twin's share their
    ``shared`` state, so they share one; another store has its own, for as long as it lives."""
    owner = getattr(store, "shared", store)
    with _by_store_lock:
        try:
            found = _by_store.get(owner)
            if found is None:
                found = _by_store[owner] = Fallback()
        except TypeError:  # not weakly referable, or unhashable
            return FALLBACK
    return found
