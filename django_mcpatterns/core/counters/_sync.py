# Generated from core/counters/_async.py by scripts/generate_sync.py: do not edit.
"""Exact cached counters over any store: the seqlock of ``_model.py``.

Round trips: a cached ``get`` 1; a miss 5 (flight record, placeholder add,
lease read, second flight read, fill) plus the loader; a ``change`` 3 (enter,
apply, exit), 4 when the count is not cached (the apply deletes, see
:meth:`AsyncChange.__aexit__`).
"""

from __future__ import annotations

import contextlib
import logging
from types import TracebackType
from typing import Any

from django_mcpatterns.core.concurrency import Compute, call, finish_then_undo
from django_mcpatterns.core.exceptions import EncodingError, McPatternsError, NonNumericValueError
from django_mcpatterns.core.keys import Routed, placed, shorten
from django_mcpatterns.core.leases import PLACEHOLDER, PLACEHOLDER_TTL
from django_mcpatterns.core.store import CasToken, Store
from django_mcpatterns.core.values.envelope import Envelope

from ._model import ENTER, EXIT, FLIGHT_TTL, ROTATE, fresh, unpack

__all__ = ["CachedCounter", "Change"]

logger = logging.getLogger("django_mcpatterns.counters")


class CachedCounter:
    """A count of a source of truth, cached under ``key`` and kept exact (``_model.py``).

    ``loader`` returns the count from the source; ``expire`` is the cached
    count's memcached exptime (0: until evicted).
    """

    def __init__(
        self,
        store: Store,
        key: str | bytes,
        loader: Compute[int],
        *,
        expire: int = 0,
        flight_ttl: int = FLIGHT_TTL,
        lease_ttl: int = PLACEHOLDER_TTL,
    ) -> None:
        raw = placed(key)[0]
        self.store = store
        self.key = key
        # Same server as the count; a key near 250 bytes: its digest form (keys.py).
        self.flight_key = Routed(shorten(raw + b":f"), raw)
        self.loader = loader
        self.expire = expire
        self.flight_ttl = flight_ttl
        self.lease_ttl = lease_ttl

    def get(self) -> int:
        """Return the count: cached (1 round trip), or loaded and cached if no writer interferes."""
        try:
            found = self.store.get(self.key)
        except McPatternsError as exc:
            logger.warning("counter %r not read (%s): loading it", self.key, exc)
            return self._load()
        if found is None:
            return self._fill()
        return _count(found, self.key)

    def change(self, delta: int) -> Change:
        """A context manager around the write of ``delta`` to the source of truth."""
        return Change(self, delta)

    def incr(self, n: int = 1) -> None:
        """Add ``n`` to the cached count, as a ``change`` with nothing inside it.

        Exact only if the source already changed *and* no reader loaded it
        since; around the write itself, use :meth:`change`.
        """
        with self.change(n):
            pass

    def decr(self, n: int = 1) -> None:
        """Subtract ``n``; see :meth:`incr`."""
        with self.change(-n):
            pass

    def invalidate(self) -> None:
        """Forget the cached count: the next :meth:`get` loads it."""
        self._void()

    def _load(self) -> int:
        count = call(self.loader)
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"the loader of counter {self.key!r} returned {count!r}, not an int")
        return count

    def _fill(self) -> int:
        try:
            before = self._flight()
            if before is None or not unpack(before[0]).quiet:
                return self._load()  # a writer is in flight: its count may be either side
            self.store.add(self.key, PLACEHOLDER, self.lease_ttl)
            found, lease = self.store.gets_envelope(self.key)
        except McPatternsError as exc:
            logger.warning("counter %r not leased (%s): loading it", self.key, exc)
            return self._load()
        if lease is None:
            return self._load()
        if not (type(found) is Envelope and found.pending):
            return _count(found, self.key)  # filled since our miss
        count = self._load()
        try:
            after = self._read_flight()
            if after == before:
                self.store.cas(self.key, b"%d" % count, lease, self.expire)
        except McPatternsError as exc:
            logger.warning("counter %r not filled (%s)", self.key, exc)
        return count

    def _read_flight(self) -> tuple[int, CasToken] | None:
        value, cas = self.store.gets(self.flight_key)
        if cas is None:
            return None
        return _count(value, self.flight_key), cas

    def _flight(self) -> tuple[int, CasToken] | None:
        """The flight record and its cas, created quiet when missing (None: unreachable)."""
        found = self._read_flight()
        if found is None:
            self.store.add(self.flight_key, b"%d" % fresh(), self.flight_ttl)
            found = self._read_flight()
        return found

    def _enter(self) -> int | None:
        """Enter a flight; return the incarnation it was counted in (None: not counted)."""
        try:
            now = self.store.incr(self.flight_key, ENTER)
            if now is None:
                created = fresh(1)
                if self.store.add(self.flight_key, b"%d" % created, self.flight_ttl):
                    return unpack(created).incarnation
                now = self.store.incr(self.flight_key, ENTER)
        except McPatternsError as exc:
            logger.warning("counter %r: flight not entered (%s)", self.key, exc)
            return None
        return None if now is None else unpack(now).incarnation

    def _apply(self, delta: int) -> None:
        try:
            if delta >= 0:
                now = self.store.incr(self.key, delta)
            else:
                now = self.store.decr(self.key, -delta)
        except NonNumericValueError:
            now = None  # a reader's placeholder: void its lease
        except McPatternsError as exc:
            logger.warning("counter %r: change not applied (%s)", self.key, exc)
            now = None
        if now is None:
            self._void()  # missing, leased, or unknown: only a delete is right for all

    def _exit(self, ticket: int | None) -> None:
        if ticket is not None:
            try:
                now = self.store.incr(self.flight_key, EXIT)
            except McPatternsError:
                now = None
            if now is not None and unpack(now).incarnation == ticket:
                if unpack(now).exited >= ROTATE:  # its fields would soon carry: start anew
                    with contextlib.suppress(McPatternsError):
                        self.store.delete(self.flight_key)
                return
            if now is not None:  # counted in a record made after ours was lost: take it back
                with contextlib.suppress(McPatternsError):
                    self.store.decr(self.flight_key, EXIT)
        self._void()  # after the take-back: voids fills based on the stray exit

    def _void(self) -> None:
        """Delete the cached count: now, or before its server serves again (its journal).

        The repair of a change that could not be applied: never a replay of it
        (docs/failures.md), so the count is exact once reloaded.
        """
        try:
            if not self.store.forget(self.key):
                logger.info("counter %r: its server is out; it is dropped when back", self.key)
        except McPatternsError as exc:
            logger.warning("counter %r not invalidated (%s)", self.key, exc)


class Change:
    """``async with counter.change(delta)``: enter a flight, run the write, apply, exit.

    The body must commit the write to the source of truth before it ends; an
    exception out of the body applies nothing (the write rolled back) but
    forgets the cached count, since the write may have committed anyway.
    """

    def __init__(self, counter: CachedCounter, delta: int) -> None:
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise TypeError(f"a counter's delta is an int, not {delta!r}")
        self.counter = counter
        self.delta = delta
        self.ticket: int | None = None

    def __enter__(self) -> Change:
        # Cancelled while the enter is on its way, the flight may be entered and no
        # __aexit__ would exit it: readers would not cache for the record's TTL.
        self.ticket = finish_then_undo(self.counter._enter(), self.counter._exit)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Run to the end even if this task is cancelled meanwhile: an exit left
        # undone keeps every reader from caching for the flight record's TTL.
        finish_then_undo(self._settle(exc_type is None), _settled)

    def _settle(self, committed: bool) -> bool:
        """Apply (or forget the count) and exit; return ``committed``."""
        if not committed:
            # The body's outcome is unknown (a commit whose answer was lost, a task
            # cancelled while awaiting it): a count cached before it may be off.
            self.counter._void()
        elif self.delta:
            self.counter._apply(self.delta)
        self.counter._exit(self.ticket)
        return committed


def _settled(_: bool) -> None:
    """Nothing to hand back once a cancelled writer's settling is done."""


def _count(value: Any, key: object) -> int:
    if isinstance(value, bytes | bytearray) and value.strip().isdigit():
        return int(value)  # decr keeps the item's length: memcached pads with spaces
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise EncodingError(f"counter item {key!r} holds {value!r}, not a count")
