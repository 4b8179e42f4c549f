"""MemoryStore: memcached's primitives in-process (see :mod:`django_mcpatterns.core.memory`)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from ..exceptions import ConfigurationError, NonNumericValueError, ValueTooLargeError
from ..keys import Key, KeyT, placed
from ..store import CasToken, Leased
from ..values.envelope import STALE, EnvelopeSerde, with_envelopes
from ..values.refusals import is_refused
from ..values.serde import ValueSerde
from .items import (
    ITEM_OVERHEAD,
    MAX_COUNTER,
    MIN_ITEM_SIZE,
    Item,
    Serde,
    cas_number,
    cas_token,
    check_exptime,
    deadline_of,
    item_size,
    parse_counter,
    serde_key,
)
from .table import ItemTable

__all__ = ["MemoryStore"]

_MISS: Any = object()  # what _deserialize answers for a refused item


class MemoryStore(ItemTable):
    """An in-process memcached: the :class:`~.store.Store` protocol in one process.

    ``max_item_size`` is memcached's ``-I`` and ``max_bytes`` its ``-m`` (in
    bytes); ``serde`` defaults to a :class:`~django_mcpatterns.core.values.serde.ValueSerde`
    with pickle (pymemcache's ``pickle_serde`` layout, what Django's
    ``PyMemcacheCache`` uses; an item it refuses reads as a miss), wrapped to
    read soft-expiry envelopes as plain values (:mod:`django_mcpatterns.core.values.envelope`);
    ``clock`` returns Unix time in seconds (absolute exptimes are Unix times).
    Thread-safe.
    """

    def __init__(
        self,
        *,
        max_item_size: int = 1024 * 1024,
        max_bytes: int = 64 * 1024 * 1024,
        serde: Serde | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_item_size < MIN_ITEM_SIZE:
            raise ConfigurationError(
                f"max_item_size must be at least {MIN_ITEM_SIZE} bytes, like memcached's -I",
                option="max_item_size",
            )
        if max_bytes < 2 * max_item_size:
            raise ConfigurationError(
                "max_bytes must be at least twice max_item_size, as memcached requires of -m",
                option="max_bytes",
            )
        super().__init__(max_bytes)
        self._max_item_size = max_item_size
        # Every read unwraps soft-expiry envelopes (core/values/envelope.py).
        self._serde: EnvelopeSerde = with_envelopes(
            serde if serde is not None else ValueSerde(), clock=clock
        )
        self._clock = clock
        self._lock = threading.Lock()

    # -- reads -------------------------------------------------------------

    def get(self, key: Key, default: Any = None) -> Any:
        raw = placed(key)[0]
        with self._lock:
            item = self._read(raw, self._now())
        value = _MISS if item is None else self._deserialize(key, item)
        return default if value is _MISS else value

    def gets(self, key: Key) -> tuple[Any, CasToken | None]:
        raw = placed(key)[0]
        with self._lock:
            item = self._read(raw, self._now())
        value = _MISS if item is None else self._deserialize(key, item)
        return (None, None) if value is _MISS else (value, cas_token(item))  # type: ignore[arg-type]

    def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return {key: value for key, value, _ in self._decoded(keys)}

    def gets_many(self, keys: Iterable[Key]) -> dict[Key, tuple[Any, CasToken]]:
        return {key: (value, cas_token(item)) for key, value, item in self._decoded(keys)}

    # -- the soft-expiry envelope's explicit read path (see Store.gets_envelope) --

    def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        raw = placed(key)[0]
        with self._lock:
            item = self._read(raw, self._now())
        value = _MISS if item is None else self._deserialize(key, item, envelopes=True)
        return (None, None) if value is _MISS else (value, cas_token(item))  # type: ignore[arg-type]

    def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return {key: value for key, value, _ in self._decoded(keys, envelopes=True)}

    def ttl(self, key: Key) -> int | None:
        """Return the seconds the item has left (-1: never expires), None when it is missing.

        On the whole-second clock, as memcached's ``mg <key> t``: an item lives
        until the clock reaches its deadline, so a live one has at least 1 left.
        """
        raw = placed(key)[0]
        with self._lock:
            now = self._now()
            item = self._read(raw, now)
        if item is None:
            return None
        return -1 if item.deadline is None else item.deadline - now

    # -- writes ------------------------------------------------------------

    def set(self, key: Key, value: Any, expire: int = 0) -> bool:
        if self.set_many({key: value}, expire):
            raise self._too_large(repr(key))
        return True

    def set_many(self, values: Mapping[KeyT, Any], expire: int = 0) -> list[KeyT]:
        """Store every value; return the keys that were not stored.

        Every key is validated and every value serialised before anything is
        stored.  As on a server, each item is stored independently: the others
        are stored, and an oversized one fails and removes the key's old item.
        """
        expire = check_exptime(expire)
        prepared = [
            (key, placed(key)[0], *self._serialize(key, value)) for key, value in values.items()
        ]
        too_large: list[KeyT] = []
        with self._lock:
            now = self._now()
            deadline = deadline_of(expire, now)
            for key, raw, data, flags in prepared:
                if item_size(raw, data, flags) > self._max_item_size:
                    self._discard(raw)
                    too_large.append(key)
                else:
                    self._link(raw, self._new_item(raw, data, flags, deadline), now)
        return too_large

    def add(self, key: Key, value: Any, expire: int = 0) -> bool:
        return self.add_cas(key, value, expire) is not None

    def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        """Store only if the item still has token ``cas``: ``None`` when it is missing."""
        swapped = self._swap(key, value, cas, expire)
        return True if isinstance(swapped, Item) else swapped

    def _swap(self, key: Key, value: Any, cas: CasToken, expire: int) -> Item | bool | None:
        """``cas`` in one step under the lock: the new item, False (changed) or None (missing)."""
        expire = check_exptime(expire)
        wanted = cas_number(cas)
        raw, data, flags = self._prepare(key, value)
        with self._lock:
            now = self._now()
            item = self._live(raw, now)
            if item is None:
                return None
            if item.cas != wanted:
                return False
            item = self._new_item(raw, data, flags, deadline_of(expire, now))
            self._link(raw, item, now)
        return item

    def append(self, key: Key, value: bytes) -> bool:
        return self._concat(key, value, at_end=True)

    def prepend(self, key: Key, value: bytes) -> bool:
        return self._concat(key, value, at_end=False)

    def incr(self, key: Key, delta: int = 1) -> int | None:
        return self._add_delta(key, delta, increment=True)

    def decr(self, key: Key, delta: int = 1) -> int | None:
        return self._add_delta(key, delta, increment=False)

    def touch(self, key: Key, expire: int = 0) -> bool:
        """Give the item a new exptime; its CAS token is kept, as memcached does."""
        expire = check_exptime(expire)
        raw = placed(key)[0]
        with self._lock:
            now = self._now()
            item = self._live(raw, now)
            if item is None:
                return False
            deadline = deadline_of(expire, now)
            self._link(raw, replace(item, deadline=deadline), now)
        return True

    def bump(self, key: Key) -> bool:
        """Move the item to the head of the LRU, as a read does, keeping its TTL and value."""
        raw = placed(key)[0]
        with self._lock:
            return self._live(raw, self._now()) is not None  # _live marks it most recent

    def delete(self, key: Key) -> bool:
        raw = placed(key)[0]
        with self._lock:
            return self._live(raw, self._now()) is not None and self._discard(raw)

    def forget(self, key: Key, marker: bytes | None = None, expire: int = 0) -> bool:
        """Delete ``key`` (or store ``marker`` there): an embedded store is always reachable."""
        if marker is None:
            self.delete(key)
        else:
            self.set(key, bytes(marker), expire)
        return True

    def delete_many(self, keys: Iterable[Key]) -> None:
        raws = [placed(key)[0] for key in keys]
        with self._lock:
            for raw in raws:
                self._discard(raw)

    # -- owner primitives (core/store.py): each one step under the lock ----------

    def gets_ttl(self, key: Key) -> tuple[Any, CasToken | None, int | None]:
        raw = placed(key)[0]
        with self._lock:
            now = self._now()
            item = self._read(raw, now)
        value = _MISS if item is None else self._deserialize(key, item)
        if value is _MISS:
            return None, None, None
        assert item is not None
        return value, cas_token(item), -1 if item.deadline is None else item.deadline - now

    def add_cas(self, key: Key, value: Any, expire: int = 0) -> CasToken | None:
        expire = check_exptime(expire)
        raw, data, flags = self._prepare(key, value)
        with self._lock:
            now = self._now()
            if self._live(raw, now) is not None:
                return None
            item = self._new_item(raw, data, flags, deadline_of(expire, now))
            self._link(raw, item, now)
        return cas_token(item)

    def recas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> CasToken | None:
        swapped = self._swap(key, value, cas, expire)
        return cas_token(swapped) if isinstance(swapped, Item) else None

    def delete_cas(self, key: Key, cas: CasToken) -> bool:
        wanted = cas_number(cas)
        raw = placed(key)[0]
        with self._lock:
            item = self._live(raw, self._now())
            return item is not None and item.cas == wanted and self._discard(raw)

    # -- leasing reads (store.LeaseStore): memcached's mg ... N<ttl>, in process --

    def gets_leased(self, key: Key, others: Iterable[Key], ttl: int) -> Leased:
        found = self.gets_many(others)
        item, won = self._leased(key, ttl, None)
        if not won and not (item.leased and not item.data):  # a value, not a lease's item
            value = self._deserialize(key, item)
            if value is not _MISS:
                found[key] = (value, cas_token(item))
        return Leased(found, cas_token(item) if won else None, item.leased and not won)

    def lease(self, key: Key, ttl: int, replacing: CasToken | None = None) -> Leased:
        item, won = self._leased(key, ttl, None if replacing is None else cas_number(replacing))
        return Leased({}, cas_token(item) if won else None, item.leased and not won)

    def _leased(self, key: Key, ttl: int, replacing: int | None) -> tuple[Item, bool]:
        raw = placed(key)[0]
        expire = check_exptime(ttl)
        with self._lock:
            now = self._now()
            return self._vivify(raw, deadline_of(expire, now), replacing, now)

    def flush_all(self) -> bool:
        with self._lock:
            self._items.clear()
            self._expiries.clear()
            self._used = 0
        return True

    def close(self) -> None:
        """Do nothing: there is no connection, and the data must outlive Django's ``close()``."""

    def stats(self) -> dict[str, int]:
        """A few of memcached's ``stats`` counters, under memcached's names."""
        with self._lock:
            return {
                "curr_items": len(self._items),
                "bytes": self._used,
                "get_hits": self._get_hits,
                "get_misses": self._get_misses,
                "evictions": self._evictions,
                "reclaimed": self._reclaimed,
                "limit_maxbytes": self._max_bytes,
                "item_size_max": self._max_item_size,
            }

    @property
    def serde(self) -> Serde:
        """The serde values go through (envelopes included), as ``Cluster.serde``."""
        return self._serde

    # -- shared steps (callers hold the lock where noted) -------------------

    def _now(self) -> int:
        # memcached's clock ticks in whole seconds.
        return math.floor(self._clock())

    def _serialize(self, key: Key, value: Any) -> tuple[bytes, int]:
        data, flags = self._serde.serialize(serde_key(key), value)
        # pymemcache sends non-bytes serialiser output (e.g. "%d" for ints) as text.
        return (data if isinstance(data, bytes) else str(data).encode()), flags

    def _deserialize(self, key: Key, item: Item, *, envelopes: bool = False) -> Any:
        """The item's value, or ``_MISS`` for an item the serde refused (values/refusals.py).

        A refused item is left in place, as ``Cluster`` leaves it: it may be
        another client's value.  ``envelopes``: soft-expiry envelopes as such.
        """
        serde = self._serde
        decode = serde.deserialize_envelope if envelopes else serde.deserialize
        value = decode(serde_key(key), item.data, item.flags)
        if value is STALE:
            return _MISS  # past its soft expiry: a plain miss, left for get_or_compute
        return _MISS if is_refused(value) else value

    def _decoded(
        self, keys: Iterable[Key], *, envelopes: bool = False
    ) -> list[tuple[Key, Any, Item]]:
        found = [
            (key, self._deserialize(key, item, envelopes=envelopes), item)
            for key, item in self._fetch(keys)
        ]
        return [hit for hit in found if hit[1] is not _MISS]

    def _prepare(self, key: Key, value: Any) -> tuple[bytes, bytes, int]:
        """Validate and serialise; raise :class:`ValueTooLargeError` (keeping the old item)."""
        raw = placed(key)[0]
        data, flags = self._serialize(key, value)
        if item_size(raw, data, flags) > self._max_item_size:
            raise self._too_large(repr(key))
        return raw, data, flags

    def _too_large(self, keys: str) -> ValueTooLargeError:
        return ValueTooLargeError(
            f"the value of {keys} is over the item size limit ({self._max_item_size} bytes, "
            f"counting memcached's {ITEM_OVERHEAD}-byte item header and the key)"
        )

    def _fetch(self, keys: Iterable[Key]) -> list[tuple[Key, Item]]:
        pairs = [(key, placed(key)[0]) for key in keys]
        with self._lock:
            now = self._now()
            found = [(key, self._read(raw, now)) for key, raw in pairs]
        return [(key, item) for key, item in found if item is not None]

    def _concat(self, key: Key, value: bytes, *, at_end: bool) -> bool:
        raw = placed(key)[0]
        if not isinstance(value, bytes):
            # The item keeps its own flags, so only raw bytes make sense (core/store.py).
            raise TypeError(f"append/prepend take bytes, not {type(value).__name__}")
        with self._lock:
            now = self._now()
            item = self._live(raw, now)
            if item is None:
                return False
            joined = item.data + value if at_end else value + item.data
            if item_size(raw, joined, item.flags) > self._max_item_size:
                return False  # NOT_STORED, the same answer as for a missing key
            self._link(raw, self._new_item(raw, joined, item.flags, item.deadline), now)
        return True

    def _add_delta(self, key: Key, delta: int, *, increment: bool) -> int | None:
        raw = placed(key)[0]
        if isinstance(delta, bool) or not isinstance(delta, int) or not 0 <= delta <= MAX_COUNTER:
            # memcached answers "CLIENT_ERROR invalid numeric delta argument".
            raise ValueError(f"incr/decr delta must be an integer in [0, 2**64), not {delta!r}")
        with self._lock:
            now = self._now()
            item = self._live(raw, now)
            if item is None:
                return None
            current = parse_counter(item.data)
            if current is None:
                raise NonNumericValueError(
                    f"cannot increment or decrement the non-numeric value of {key!r}"
                )
            # incr wraps at 2**64; decr stops at 0 (memcached's do_add_delta).
            number = (current + delta) & MAX_COUNTER if increment else max(current - delta, 0)
            text = b"%d" % number
            # A number that fits is written over the old one, padded with spaces.
            data = text.ljust(len(item.data)) if len(text) <= len(item.data) else text
            self._link(raw, self._new_item(raw, data, item.flags, item.deadline), now)
        return number
