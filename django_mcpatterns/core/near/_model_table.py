"""The near cache's table: entries, their age bound, admission and eviction, its counts.

Read :mod:`django_mcpatterns.core.near` for what it promises.  A lookup takes no
lock (a dict read and two comparisons); fills, invalidations and evictions take
the table's lock, briefly, and never across I/O.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import itertools
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Final

from ..client.node import watch_forks
from ..protocol import compiled
from ..store import CasToken
from ..values.envelope import Envelope
from ._model import ENTRY_OVERHEAD, LARGE_VALUE, NearOptions, NearStats, keep
from ._model_entry import Admission, Entry, below

__all__ = [
    "CARRY_FROM",
    "MISS",
    "Entry",
    "NearTable",
    "Ticket",
    "clear_all",
    "fill",
    "hit",
    "missed",
]

MISS: Final[Any] = object()
"""What :meth:`NearTable.hit` answers when no live entry holds the key."""

Ticket = tuple[float, int]
"""``(sent, seq)``: the clock before a request was sent, and the table's write sequence then."""

STRIPES: Final = 4096  # write stamps kept per hash stripe, not per key: bounded memory
_STRIPE: Final = STRIPES - 1  # a key's stripe: its hash & _STRIPE
SWEEP: Final = 256  # the most expired entries one fill drops from the head of the queue
SLACK: Final = 1 / 16  # of max_age: how long past its bound an entry may wait to be dropped
QUEUED: Final = 80  # the bytes of an entry's item in the expiry queue: a tuple, a float
REPORT_EVERY: Final = 1.0  # seconds between reports to instrumentation (on a miss)
HOT: Final = 2  # hits in its life (this one counted) that make an entry worth a refresh ahead
DUE_LIMIT: Final = 128  # the most keys waiting for a refresh ahead (more are not noted)
CARRIED: Final = 16  # the most keys one miss re-reads ahead, in its own request
CARRY_FROM: Final = 8  # keys due before a miss carries them (its fixed cost shared)
# What a str (ASCII) or bytes object takes besides its characters: what sys.getsizeof
# says, without its method lookup and call (a fifth of a fill's cost).
_STR: Final = sys.getsizeof("")
_BYTES: Final = sys.getsizeof(b"")


class NearTable(Admission):
    """The entries one process holds for one cache, shared by its threads and tasks.

    ``clock`` (seconds, monotonic) times entries: an entry read by a request
    sent at ``sent`` (its :meth:`ticket`) is served until ``sent + max_age``;
    ``wall`` (Unix seconds) reads soft expiries.  ``report`` receives the counts
    (:meth:`stats`) at most every :data:`REPORT_EVERY` seconds, on a read that
    memcached answers (instrumentation: a hit never reports).
    ``scope`` is a regular expression for what precedes the caller's key
    (``KEY_PREFIX:version:``), skipped before ``prefixes`` are matched.
    """

    # Slots: the hot paths' reads are the interpreter's quickest, and the compiled fill
    # (:func:`fill`) finds each where Python keeps it.
    __slots__ = (
        "__weakref__",
        "_added",
        "_bytes",
        "_cleared",
        "_counts",
        "_due_within",
        "_fills",
        "_fixed",
        "_hits",
        "_largest",
        "_lock",
        "_looked",
        "_mask",
        "_misses",
        "_odd_keys",
        "_order",
        "_queue",
        "_report",
        "_report_at",
        "_rng",
        "_rows",
        "_sample_limit",
        "_saved",
        "_scope",
        "_seq",
        "_sketch_from",
        "_slack",
        "_stamps",
        "_sweep_at",
        "_wall",
        "budget",
        "clock",
        "due",
        "entries",
        "max_age",
        "options",
    )

    def __init__(
        self,
        options: NearOptions,
        *,
        scope: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: Callable[[int], int] = below,
        report: Callable[[NearStats], object] | None = None,
    ) -> None:
        self.options = options
        self.max_age = options.max_age
        # Every key's bound, or None: under ``prefixes`` each key has its own (bound()).
        self._fixed = options.max_age if options.prefixes is None else None
        self.clock = clock
        self._wall = wall
        self._report = report
        self._report_at = 0.0
        self._rng = rng
        self._scope = re.compile(scope) if scope and options.prefixes else None
        # The frequency sketch: 4 rows of one-byte counters, about one per KiB of values.
        # Four 16-bit slices of a key's hash index the rows: at most 2**16 counters a row.
        width = 1 << max(8, min(16, (options.max_bytes // 1024).bit_length() - 1))
        self._mask = width - 1
        self._sample_limit = 10 * width
        self.budget = options.max_bytes - 4 * width  # the sketch counts against max_bytes
        # Admission is asked only when memory is full: the sketch counts the reads of fills
        # from half full on (as Caffeine starts its sketch), so that a table with room,
        # the common case, pays nothing for it.
        self._sketch_from = self.budget // 2
        self._largest = self.budget // 4  # a value larger is never held
        self._slack = options.max_age * SLACK
        # Refresh ahead: a hit on an entry read before in its life, with less than this
        # left of it, notes its key in `due` (None: off; under prefixes each key's bound
        # is its own, and none is noted).
        ahead = options.refresh_ahead
        self._due_within: float | None = (
            None
            if ahead is None or options.prefixes is not None
            else float((1 - ahead) * self.max_age)
        )
        self._reset()
        watch_forks(self)
        _tables.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        # Keys due for a refresh ahead, with the entry noted (the next miss carries them).
        self.due: dict[str, Entry] = {}
        self._order: list[Entry] = []  # for sampling victims
        # (expires, key) of each fill, in fill order: those past their bound go first.
        self._queue: collections.deque[tuple[float, str]] = collections.deque()
        self._bytes = 0
        self._seq = 0  # bumped by every invalidation
        self._cleared = 0  # tickets older than this are void (flush_all)
        self._stamps = array.array("q", bytes(8 * STRIPES))
        self._rows = [bytearray(self._mask + 1) for _ in range(4)]
        self._added = 0
        # Round trips saved = hits - those of lookup() (they save none by themselves) +
        # saved(): a hit of hit(), the hot path, counts once.
        self._hits = itertools.count()
        self._looked = itertools.count()
        self._misses = itertools.count()
        self._saved = itertools.count()
        self._fills = itertools.count()
        self._sweep_at = 0.0  # when the oldest entry held is SLACK past its bound (or later)
        self._odd_keys = False  # a key whose lookups may run Python code held (see fill)
        self._counts = dict.fromkeys(
            ("refused", "evictions", "invalidations", "revalidated", "refreshed"), 0
        )

    def after_fork(self) -> None:
        """In a forked child: start empty, nothing due (another process; a parent's lock may
        be held)."""
        self._reset()

    # -- reading (no lock) --

    def lookup(self, key: str) -> Entry | None:
        """The live entry of ``key`` (counted as a hit), or None (counted as a miss)."""
        entry = self.entries.get(key)
        if entry is not None and entry.expires > self.clock():
            entry.hits += 1
            next(self._hits)
            next(self._looked)
            return entry
        next(self._misses)
        return None

    def hit(self, key: str, note: bool = True) -> Any:
        """The value of ``key``'s live entry for one caller (counted as a hit and a round trip
        saved: a ``get`` answered), else :data:`MISS` (not counted: the caller's :meth:`miss`
        counts it).  Compiled where the hot path is (:func:`hit`).

        ``note``: an entry read before in its life (hot) with less than the table's
        refresh window left is noted in :attr:`due` (once), for the next miss to re-read
        (``key`` is then a str the store can read as it is).
        """
        entry = self.entries.get(key)
        now = self.clock()
        if entry is not None and entry.expires > now:
            hits = entry.hits = entry.hits + 1
            next(self._hits)  # and a round trip saved (see _reset)
            within = self._due_within
            if (
                note
                and within is not None
                and hits >= HOT
                and entry.expires - now < within
                and not entry.due
                and entry.envelope is None
                and entry.cas is None
                and len(self.due) < DUE_LIMIT
            ):
                entry.due = True
                self.due[key] = entry
            copy = entry.copy
            return entry.value if copy is None else copy(entry.value)
        return MISS

    def no_refresh(self) -> None:
        """Note no key for a refresh ahead (a store in front of which misses cannot carry
        other keys)."""
        self._due_within = None
        self.due = {}

    def take_due(self, key: str) -> list[Entry]:
        """Up to :data:`CARRIED` entries due for a refresh ahead, taken out of :attr:`due`
        (``key``'s own left out: the miss reads it anyway)."""
        due: dict[str, Entry] = self.due
        taken: list[Entry] = []
        while due and len(taken) < CARRIED:
            try:
                name, entry = due.popitem()
            except KeyError:  # another thread took the last one
                break
            if name != key:
                taken.append(entry)
        return taken

    def refreshed(
        self, found: dict[Any, Any], carried: Iterable[str], taken: list[Entry], ticket: Ticket
    ) -> None:
        """The answer of a miss's request that carried the keys ``carried`` of the entries
        ``taken`` (:meth:`take_due`), sent under ``ticket``: each carried key memcached
        holds is filled with its value as any read sent then (a write of this process
        since wins), one it does not hold has its entry dropped; the keys not carried (on
        another server) are due again."""
        went, filled = set(carried), 0
        for entry in taken:
            key = entry.key
            if key not in went:
                if self.entries.get(key) is entry and len(self.due) < DUE_LIMIT:
                    self.due[key] = entry
                continue
            value = found.get(key, MISS)
            if value is MISS:
                self.forget(entry)
            elif fill(self, key, value, ticket):
                filled += 1
        if filled:
            with self._lock:
                self._counts["refreshed"] += filled

    def forget(self, entry: Entry) -> None:
        """Drop ``entry`` if it is still its key's (memcached no longer holds the key)."""
        with self._lock:
            if self.entries.get(entry.key) is entry:
                self._remove(entry)

    def miss(self, now: float) -> Ticket:
        """Count a miss found at ``now`` (this table's clock, read before the request that
        follows is sent) and return that request's :meth:`ticket`."""
        next(self._misses)
        if self._report is not None and now >= self._report_at:
            self._report_at = now + REPORT_EVERY
            self._report(self.stats())
        return now, self._seq

    def missed(self) -> Ticket:
        """:meth:`miss` now: a ``get`` this table did not answer, about to be sent.  Compiled
        where the hot path is (:func:`missed`)."""
        return self.miss(self.clock())

    def envelope(self, key: str) -> Envelope | None:
        """``get_or_compute``'s lookup: the fresh envelope of ``key`` with this caller's own
        value (counted as a hit), or None (a miss, or a value a plain ``get`` read)."""
        entry = self.entries.get(key)
        if entry is not None and entry.envelope is not None and entry.expires > self.clock():
            entry.hits += 1
            next(self._hits)  # and a round trip saved (see _reset)
            return dataclasses.replace(entry.envelope, value=entry.out())
        next(self._misses)
        return None

    def held(self, key: str) -> Entry | None:
        """The entry of ``key`` whatever its age (past ``max_age``: to revalidate), or None."""
        return self.entries.get(key)

    def saved(self) -> None:
        """Count a call answered without a round trip."""
        next(self._saved)

    def ticket(self) -> Ticket:
        """Take before sending a read: its answer is then dated no later than now."""
        now = self.clock()
        if self._report is not None and now >= self._report_at:
            self._report_at = now + REPORT_EVERY
            self._report(self.stats())
        return now, self._seq

    def bound(self, key: str) -> float | None:
        """How long ``key`` may be held (None: not under ``prefixes``)."""
        prefixes = self.options.prefixes
        if prefixes is None:
            return self.max_age
        start = 0
        if self._scope is not None:
            scoped = self._scope.match(key)
            start = scoped.end() if scoped else 0
        for prefix, bound in prefixes:
            if key.startswith(prefix, start):
                return bound
        return None

    # -- writing (under the lock) --

    def fill(
        self,
        key: str,
        value: Any,
        ticket: Ticket,
        *,
        envelope: Envelope | None = None,
        cas: CasToken | None = None,
        epoch: Any = None,
    ) -> bool:
        """Hold ``value``, read by a request sent under ``ticket``; return whether it is held.

        Not held when a write of this process dropped the key since the ticket
        (the value may predate it), when the key is not under ``prefixes``, when
        the value cannot be kept apart from its callers, or when admission
        prefers what memory holds.

        Every miss pays for this, so its common case (a str or bytes value, room
        in memory) is written out inline: no call but the clock's, one entry and
        one queue item made, the lock held for a few dict and list operations.
        """
        bound = self._fixed
        if bound is None and (bound := self.bound(key)) is None:
            return False
        sent, seq = ticket
        now = self.clock()
        expires = sent + bound
        if envelope is not None:  # a get_or_compute value stops being fresh at its soft expiry
            expires = min(expires, now + envelope.soft_expiry - self._wall())
        if expires <= now:
            return False
        kind = type(value)
        if kind is str and value.isascii():
            stored, copy, size = value, None, _STR + len(value)
        elif kind is bytes:
            stored, copy, size = value, None, _BYTES + len(value)
        else:
            kept = keep(value)
            # Not kept apart from its callers: too large to count as held, refused below.
            stored, copy, size = (None, None, self.budget) if kept is None else kept
        size += (_STR + len(key) if key.isascii() else sys.getsizeof(key)) + ENTRY_OVERHEAD + QUEUED
        entry = Entry()  # no __init__ to call: its slots are set here
        if type(key) is str:  # a str subclass may carry attributes: a cycle could pass through
            untrack(entry)
        entry.key = key
        entry.value = stored
        entry.copy = copy
        entry.size = size
        entry.expires = expires
        entry.hits = 0
        entry.due = False
        entry.envelope = None
        entry.cas = None
        entry.epoch = None
        if envelope is not None:
            entry.envelope = dataclasses.replace(envelope, value=None)
        if cas is not None:
            entry.cas, entry.epoch = cas, epoch
        stamp = hash(key) & _STRIPE
        lock = self._lock
        lock.acquire()  # not `with`: its __enter__ and __exit__ lookups cost a miss 5 %
        try:
            if seq < self._cleared or self._stamps[stamp] > seq:
                return False  # a write of this process came after the read was sent
            if size > self._largest:  # or a value that cannot be kept apart
                self._counts["refused"] += 1
                return False
            entries, order = self.entries, self._order
            old = entries.get(key)
            if old is not None:
                self._remove(old)
            held = self._bytes + size
            if held > self._sketch_from:
                self._count_use(key)  # admission may soon be asked: its sketch learns
                if held > self.budget and not self._admit(key, size, now):
                    self._counts["refused"] += 1
                    return False
            entry.slot = len(order)
            order.append(entry)
            if type(key) is not str and _odd(type(key)):
                self._odd_keys = True  # near.c's fill leaves the table to this one from now on
            entries[key] = entry
            self._bytes += size
            queue = self._queue
            queue.append((expires, key))
            if now >= self._sweep_at or len(queue) > 2 * len(order) + 64:
                self._expire(now)
            next(self._fills)
            return True
        finally:
            lock.release()

    def _expire(self, now: float) -> None:
        """Drop the entries past their bound, oldest fill first (at most :data:`SWEEP`):
        memory holds the live ones, and a full table seldom needs to evict (a sampled
        eviction costs more).  Called once the oldest is :data:`SLACK` of ``max_age``
        past its bound, so most fills pay nothing for it, or when the queue holds
        more than twice the entries (then rebuilt).

        Large ones stay (past ``max_age`` they may be revalidated), as do those
        renewed or filled again since (their queue item is not their last).
        """
        queue, entries, popleft = self._queue, self.entries, self._queue.popleft
        for _ in range(SWEEP):
            if not queue or queue[0][0] > now:
                break
            expires, key = popleft()
            entry = entries.get(key)
            if entry is not None and entry.expires == expires and entry.size < LARGE_VALUE:
                self._remove(entry)
        if len(queue) > 2 * len(self._order) + 64:
            self._compact()
        self._sweep_at = (queue[0][0] if queue else now) + self._slack

    def renew(self, entry: Entry, ticket: Ticket) -> bool:
        """``entry`` was found unchanged on the server by a request sent under ``ticket``:
        serve it for another ``max_age`` from then.  False when it was dropped since."""
        bound = self.bound(entry.key)
        if bound is None:
            return False
        sent, seq = ticket
        with self._lock:
            stamp = hash(entry.key) & _STRIPE
            if seq < self._cleared or self._stamps[stamp] > seq:
                return False
            if self.entries.get(entry.key) is not entry:
                return False
            entry.expires = max(entry.expires, sent + bound)
            self._counts["revalidated"] += 1
            return True

    def invalidate(self, key: str) -> None:
        """A write of this process to ``key`` completed (or may have): drop its copy now,
        and void the answers of reads sent before."""
        stamp = hash(key) & _STRIPE
        lock = self._lock
        lock.acquire()  # not `with`: every write of the process pays this (see fill)
        try:
            seq = self._seq = self._seq + 1
            self._stamps[stamp] = seq
            entry = self.entries.get(key)
            if entry is not None:
                self._remove(entry)
                self._counts["invalidations"] += 1
        finally:
            lock.release()

    def written(self, key: str, value: Any, ticket: Ticket) -> bool:
        """A write of this process stored ``value`` under ``key``, its request sent under
        ``ticket``: hold it as a read sent then would have it (the copy ages from then),
        unless another write of this process may have landed on the key since the ticket
        (their order on the server is not known: the copy is dropped, as by
        :meth:`invalidate`).  Either way the answers of reads sent before are void.
        Returns whether the value is held."""
        sent, seq = ticket
        stamp = hash(key) & _STRIPE
        with self._lock:
            alone = seq >= self._cleared and self._stamps[stamp] <= seq
            seq = self._seq = self._seq + 1
            self._stamps[stamp] = seq
            entry = self.entries.get(key)
            if entry is not None:
                self._remove(entry)
                self._counts["invalidations"] += 1
        # A write of this process landing from now on voids this fill (its stamp is later).
        return alone and fill(self, key, value, (sent, seq))

    def invalidate_many(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.invalidate(key)

    def clear(self) -> None:
        """Drop everything, and void every read under way (``flush_all``)."""
        with self._lock:
            self._seq += 1
            self._cleared = self._seq
            self.entries = {}
            self.due = {}
            self._order = []
            self._queue.clear()
            self._bytes = 0
            self._odd_keys = False

    def _remove(self, entry: Entry) -> None:
        order = self._order
        last = order.pop()
        if last is not entry:
            order[entry.slot] = last
            last.slot = entry.slot
        del self.entries[entry.key]
        self._bytes -= entry.size

    # -- reporting --

    def stats(self) -> NearStats:
        with self._lock:
            counts = {**self._counts, "fills": _read(self._fills)}
            entries, held = len(self.entries), self._bytes
        looked = _read(self._looked)  # before the hits: a lookup counts a hit first
        hits = _read(self._hits)
        return NearStats(
            hits=hits,
            misses=_read(self._misses),
            round_trips_saved=hits - looked + _read(self._saved),
            entries=entries,
            bytes=held,
            max_bytes=self.options.max_bytes,
            max_age=self.max_age,
            **counts,
        )


fill, hit, missed, untrack = compiled.near(
    Entry,
    NearTable,
    MISS,
    (_STR, _BYTES, ENTRY_OVERHEAD + QUEUED),
    NearTable.fill,
    NearTable.hit,
    NearTable.missed,
)
"""``fill(table, key, value, ticket)``, ``hit(table, key)`` and ``missed(table)``: the
table's methods of those names, compiled where the hot path is (``src/speedups/near.c``:
the same answers, the same table afterwards; a fill's common case only, a str or bytes
value, room in memory; the sweep of expired entries included).  ``untrack(entry)``: the
entry, left out of the cycle collector's work (near.c's ``near_untrack`` says why it is
safe)."""


_tables: weakref.WeakSet[NearTable] = weakref.WeakSet()  # every table of this process


def clear_all() -> None:
    """:meth:`NearTable.clear` every table of this process (a ``flush_all`` empties whole
    servers: what any cache holds of them may be gone)."""
    for table in list(_tables):
        table.clear()


def _read(counter: itertools.count[int]) -> int:
    """The next number ``counter`` would give: how many it gave (read without taking one)."""
    return int(repr(counter)[6:-1])


def _odd(kind: type[str]) -> bool:
    """Whether a key of ``kind`` (a str subclass) compares or hashes by its own methods: a
    dict lookup of an equal str may then run Python code, which near.c's fill must not."""
    return kind.__eq__ is not str.__eq__ or kind.__hash__ is not str.__hash__
