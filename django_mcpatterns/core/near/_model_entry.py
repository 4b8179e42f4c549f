"""The near cache's entries, and the table's admission and eviction (TinyLFU).

:class:`Entry` is one value held; :class:`Admission` is the part of
:class:`~._model_table.NearTable` that decides, once memory is full, whether a
newcomer is worth an eviction, and which entry goes.  Read
:mod:`django_mcpatterns.core.near` for what the table promises.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any, Final

from .. import chance
from ..store import CasToken
from ..values.envelope import Envelope
from ._model import LARGE_VALUE, Copier

__all__ = ["SAMPLE", "Admission", "Entry", "below"]

SAMPLE: Final = 5  # entries looked at to choose an eviction victim
_HALF: Final = bytes(i >> 1 for i in range(256))  # halves every counter of a sketch row


def below(n: int, _random: Callable[[], float] = chance.uniform) -> int:
    """A random index below ``n`` (``random.randrange`` checks its arguments: slower)."""
    return int(_random() * n)


class Entry:
    """One value held near, with its deadline (``expires``, on the table's clock).

    Made by :meth:`NearTable.fill` alone, every slot set there (no ``__init__``: the
    call would cost a miss more than the rest of the fill).
    """

    __slots__ = (
        "cas",
        "copy",
        "due",
        "envelope",
        "epoch",
        "expires",
        "hits",
        "key",
        "size",
        "slot",
        "value",
    )

    key: str
    value: Any
    copy: Copier | None  # None: the value itself is handed out (immutable)
    size: int  # the bytes counted against max_bytes
    expires: float
    hits: int  # since the sketch last aged: eviction's measure of use
    due: bool  # noted for a refresh ahead (once per entry: a refreshed key is a new entry)
    slot: int  # the entry's index in the table's order list
    envelope: Envelope | None  # get_or_compute's metadata (value left out)
    cas: CasToken | None  # with the server's epoch: for revalidation
    epoch: Any

    def out(self) -> Any:
        """The value for one caller: the kept object itself, or that caller's own copy."""
        copy = self.copy
        return self.value if copy is None else copy(self.value)

    @property
    def large(self) -> bool:
        return self.size >= LARGE_VALUE


class Admission:
    """The table's admission and eviction, over the table's own state (a part of
    :class:`~._model_table.NearTable`, which holds every slot named here)."""

    __slots__ = ()

    entries: dict[str, Entry]
    budget: int
    _bytes: int
    _order: list[Entry]
    _queue: collections.deque[tuple[float, str]]
    _rows: list[bytearray]
    _mask: int
    _added: int
    _sample_limit: int
    _counts: dict[str, int]
    _rng: Callable[[int], int]
    _lock: threading.Lock

    def _count_use(self, key: str) -> None:
        """Count a read of ``key`` that memcached answered (the admission's frequency)."""
        h, mask = hash(key), self._mask
        r0, r1, r2, r3 = self._rows
        i = h & mask
        if r0[i] < 255:
            r0[i] += 1
        i = h >> 16 & mask
        if r1[i] < 255:
            r1[i] += 1
        i = h >> 32 & mask
        if r2[i] < 255:
            r2[i] += 1
        i = h >> 48 & mask
        if r3[i] < 255:
            r3[i] += 1
        # The table's slots (mypy sees only this part's empty __slots__).
        self._added += 1  # type: ignore[misc]
        if self._added >= self._sample_limit:  # age: recent use counts, old use fades
            self._added = 0  # type: ignore[misc]
            self._rows = [bytearray(row.translate(_HALF)) for row in self._rows]  # type: ignore[misc]
            for entry in self._order:
                entry.hits >>= 1

    def _frequency(self, key: str) -> int:
        h, mask = hash(key), self._mask
        r0, r1, r2, r3 = self._rows
        return min(r0[h & mask], r1[h >> 16 & mask], r2[h >> 32 & mask], r3[h >> 48 & mask])

    def _admit(self, key: str, size: int, now: float) -> bool:
        """Make room for ``size`` bytes, or say the newcomer is not worth it (TinyLFU)."""
        budget = self.budget
        candidate = self._frequency(key)
        while self._bytes + size > budget and self._order:
            victim = self._victim(now)
            if victim.expires > now and victim.hits + 1 > candidate:
                return False  # what memory holds is used more than the newcomer
            self._remove(victim)
            self._counts["evictions"] += 1
        return True

    def _compact(self) -> None:
        """Rebuild the expiry queue from the entries held: the items of entries dropped
        or filled again since are left out (at most as many again as there are entries)."""
        queue = collections.deque(sorted([(e.expires, e.key) for e in self._order]))
        self._queue = queue  # type: ignore[misc]  # the table's slot

    def _victim(self, now: float) -> Entry:
        """The least used of a few entries drawn at random; expired small ones first."""
        order = self._order
        n = len(order)
        rng = self._rng
        best: Entry | None = None
        best_score = 0
        for _ in range(min(SAMPLE, n)):
            entry = order[rng(n)]
            # Expired ones first (a large one last: it may still be revalidated).
            score = entry.hits + 1 if entry.expires > now else 0 if entry.large else -1
            if best is None or score < best_score:
                best, best_score = entry, score
        assert best is not None
        return best

    def _remove(self, entry: Entry) -> None:
        raise NotImplementedError
