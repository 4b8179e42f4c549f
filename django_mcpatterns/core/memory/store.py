"""MemoryStore: memcached's primitives in-process, with memcached 1.6's semantics.

It is the embedded default (no server needed) and the fast double in tests, so it
copies what a real server does, measured against memcached 1.6.18, rather than
what would be convenient:

* Items are kept serialised, as ``(bytes, flags, exptime, cas)``: ``get`` returns
  a fresh object, ``append`` works on the raw bytes and keeps flags and TTL, and
  the size limit applies to the serialised bytes.
* The item size limit (``-I``) counts the whole item as memcached does:
  59 bytes of header (48-byte ``item`` struct, the key's NUL, ``\\r\\n``, the
  8-byte CAS), the key, the value and 4 more bytes when the flags are non-zero.
  A ``set`` over the limit raises and *removes* the old item (memcached unlinks
  it so stale data cannot outlive a failed overwrite); ``add``/``cas`` over the
  limit raise and keep it; ``append``/``prepend`` past it answer ``False``.
* Time is memcached's whole-second clock: the injected wall clock is floored to
  seconds, a relative exptime ``e`` expires when that clock reaches
  ``floor(now) + e`` (so an item lives more than ``e - 1`` and at most ``e``
  seconds, as on a server) and an absolute one when it reaches the exptime.
  Negative exptimes store nothing visible but still replace (``set``, ``cas``)
  or expire (``touch``) the item, as memcached 1.6 does.
* ``incr``/``decr`` parse the value as memcached's ``safe_strtoull`` does and
  rewrite the number in place, padded with spaces, when it fits (``decr`` of
  ``b"10"`` leaves ``b"9 "``); a longer number becomes a new item.  Each write,
  except ``touch``, takes a new CAS token from one counter.
* When ``max_bytes`` would be exceeded, expired items are reclaimed first, then
  the least recently used (reads refresh recency) are evicted.
* Reads count hits and misses per key, under memcached's ``get_hits`` and
  ``get_misses``: ``get``, ``gets``, every key of a multi-get, and ``ttl`` (a
  meta get); an item the serde then refuses still counts as a hit.

One lock guards the table; serialisation happens outside it.
"""

from __future__ import annotations

import heapq
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .chunks import LARGE_VALUES
from .envelope import STALE, EnvelopeSerde, with_envelopes
from .exceptions import ConfigurationError, NonNumericValueError, ValueTooLargeError
from .keys import LONG_KEYS, Key, KeyT, PlainKey, Routed, placed
from .registry import Registry
from .serializers import SerdeOptions, ValueRefused, ValueSerde, is_refused
from .store import MAX_RELATIVE_EXPIRE, CasToken

# memcached 1.6 item_make_header(): sizeof(item) 48 + key NUL 1 + "\r\n" 2 + CAS 8.
ITEM_OVERHEAD = 59
# Non-zero client flags are stored as a 4-byte suffix (item_make_header()).
FLAGS_SUFFIX = 4
_MISS: Any = object()  # what _deserialize answers for a refused item
# memcached refuses -I below 1024 and above half of -m.
MIN_ITEM_SIZE = 1024
MAX_COUNTER = 2**64 - 1

# strtoull(): optional leading whitespace, a sign, decimal digits.
_COUNTER = re.compile(rb"[ \t\n\v\f\r]*([+-]?)([0-9]+)")
# safe_strtoull() accepts the number when followed by whitespace or the end of
# the data (memcached's item data is always followed by "\r\n", or a NUL).
_COUNTER_END = frozenset(b" \t\n\v\f\r\x00")


class Serde(Protocol):
    """pymemcache's serialisation protocol (``pymemcache.serde``)."""

    def serialize(self, key: Any, value: Any) -> tuple[bytes | str, int]: ...

    def deserialize(self, key: Any, value: bytes, flags: int) -> Any: ...


def item_size(key: bytes, data: bytes, flags: int) -> int:
    """Bytes memcached 1.6 allocates for an item; compared with the ``-I`` limit."""
    return ITEM_OVERHEAD + len(key) + len(data) + (FLAGS_SUFFIX if flags else 0)


def parse_counter(data: bytes) -> int | None:
    """Return the number ``incr``/``decr`` see in ``data``, or ``None`` if non-numeric.

    Mirrors memcached's ``safe_strtoull``: leading whitespace and ``+`` are
    accepted, anything but whitespace after the digits is not, values over
    2**64 - 1 are refused, and a ``-`` is refused only when it wraps the result
    past 2**63 (so ``b"-0"`` is 0).
    """
    match = _COUNTER.match(data)
    if match is None:
        return None
    end = match.end()
    if end < len(data) and data[end] not in _COUNTER_END:
        return None
    number = int(match.group(2))
    if number > MAX_COUNTER:  # strtoull() sets ERANGE
        return None
    if match.group(1) == b"-":
        number = -number & MAX_COUNTER
        if number > MAX_COUNTER >> 1:
            return None
    return number


@dataclass(frozen=True, slots=True)
class _Item:
    data: bytes
    flags: int
    deadline: int | None  # whole-second clock value at which it expires; None: never
    cas: int
    size: int

    def expired(self, now: int) -> bool:
        return self.deadline is not None and self.deadline <= now


class MemoryStore:
    """An in-process memcached: the :class:`~.store.Store` protocol in one process.

    ``max_item_size`` is memcached's ``-I`` and ``max_bytes`` its ``-m`` (in
    bytes); ``serde`` defaults to a :class:`~.serializers.ValueSerde` with
    pickle (pymemcache's ``pickle_serde`` layout, what Django's
    ``PyMemcacheCache`` uses; an item it refuses reads as a miss), wrapped to
    read soft-expiry envelopes as plain values (:mod:`.envelope`); ``clock``
    returns Unix time in seconds (absolute exptimes are Unix times).
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
        self._max_item_size = max_item_size
        self._max_bytes = max_bytes
        # Every read unwraps soft-expiry envelopes (core/envelope.py).
        self._serde: EnvelopeSerde = with_envelopes(
            serde if serde is not None else ValueSerde(), clock=clock
        )
        self._clock = clock
        self._lock = threading.Lock()
        self._items: OrderedDict[bytes, _Item] = OrderedDict()  # least recently used first
        self._expiries: list[tuple[int, bytes]] = []  # heap of (deadline, key); may be stale
        self._used = 0
        self._last_cas = 0
        self._evictions = 0
        self._reclaimed = 0
        self._get_hits = 0
        self._get_misses = 0

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
        return (None, None) if value is _MISS else (value, _token(item))  # type: ignore[arg-type]

    def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return {key: value for key, value, _ in self._decoded(keys)}

    def gets_many(self, keys: Iterable[Key]) -> dict[Key, tuple[Any, CasToken]]:
        return {key: (value, _token(item)) for key, value, item in self._decoded(keys)}

    # -- the soft-expiry envelope's explicit read path (see Store.gets_envelope) --

    def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        raw = placed(key)[0]
        with self._lock:
            item = self._read(raw, self._now())
        value = _MISS if item is None else self._deserialize(key, item, envelopes=True)
        return (None, None) if value is _MISS else (value, _token(item))  # type: ignore[arg-type]

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
        expire = _exptime(expire)
        prepared = [
            (key, placed(key)[0], *self._serialize(key, value)) for key, value in values.items()
        ]
        too_large: list[KeyT] = []
        with self._lock:
            now = self._now()
            deadline = _deadline(expire, now)
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
        return True if isinstance(swapped, _Item) else swapped

    def _swap(self, key: Key, value: Any, cas: CasToken, expire: int) -> _Item | bool | None:
        """``cas`` in one step under the lock: the new item, False (changed) or None (missing)."""
        expire = _exptime(expire)
        wanted = _token_number(cas)
        raw, data, flags = self._prepare(key, value)
        with self._lock:
            now = self._now()
            item = self._live(raw, now)
            if item is None:
                return None
            if item.cas != wanted:
                return False
            item = self._new_item(raw, data, flags, _deadline(expire, now))
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
        expire = _exptime(expire)
        raw = placed(key)[0]
        with self._lock:
            now = self._now()
            item = self._live(raw, now)
            if item is None:
                return False
            deadline = _deadline(expire, now)
            self._link(raw, _Item(item.data, item.flags, deadline, item.cas, item.size), now)
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

    def delete_many(self, keys: Iterable[Key]) -> None:
        raws = [placed(key)[0] for key in keys]
        with self._lock:
            for raw in raws:
                self._discard(raw)

    # -- owner primitives (store.py): each one step under the lock ----------

    def gets_ttl(self, key: Key) -> tuple[Any, CasToken | None, int | None]:
        raw = placed(key)[0]
        with self._lock:
            now = self._now()
            item = self._read(raw, now)
        value = _MISS if item is None else self._deserialize(key, item)
        if value is _MISS:
            return None, None, None
        assert item is not None
        return value, _token(item), -1 if item.deadline is None else item.deadline - now

    def add_cas(self, key: Key, value: Any, expire: int = 0) -> CasToken | None:
        expire = _exptime(expire)
        raw, data, flags = self._prepare(key, value)
        with self._lock:
            now = self._now()
            if self._live(raw, now) is not None:
                return None
            item = self._new_item(raw, data, flags, _deadline(expire, now))
            self._link(raw, item, now)
        return _token(item)

    def recas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> CasToken | None:
        swapped = self._swap(key, value, cas, expire)
        return _token(swapped) if isinstance(swapped, _Item) else None

    def delete_cas(self, key: Key, cas: CasToken) -> bool:
        wanted = _token_number(cas)
        raw = placed(key)[0]
        with self._lock:
            item = self._live(raw, self._now())
            return item is not None and item.cas == wanted and self._discard(raw)

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
        data, flags = self._serde.serialize(_plain(key), value)
        # pymemcache sends non-bytes serialiser output (e.g. "%d" for ints) as text.
        return (data if isinstance(data, bytes) else str(data).encode()), flags

    def _deserialize(self, key: Key, item: _Item, *, envelopes: bool = False) -> Any:
        """The item's value, or ``_MISS`` for an item the serde refused (serializers.py).

        A refused item is left in place, as ``Cluster`` leaves it: it may be
        another client's value.  ``envelopes``: soft-expiry envelopes as such.
        """
        serde = self._serde
        decode = serde.deserialize_envelope if envelopes else serde.deserialize
        value = decode(_plain(key), item.data, item.flags)
        if value is STALE:
            return _MISS  # past its soft expiry: a plain miss, left for get_or_compute
        return _MISS if is_refused(value) else value

    def _decoded(
        self, keys: Iterable[Key], *, envelopes: bool = False
    ) -> list[tuple[Key, Any, _Item]]:
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

    def _fetch(self, keys: Iterable[Key]) -> list[tuple[Key, _Item]]:
        pairs = [(key, placed(key)[0]) for key in keys]
        with self._lock:
            now = self._now()
            found = [(key, self._read(raw, now)) for key, raw in pairs]
        return [(key, item) for key, item in found if item is not None]

    def _concat(self, key: Key, value: bytes, *, at_end: bool) -> bool:
        raw = placed(key)[0]
        if not isinstance(value, bytes):
            # The item keeps its own flags, so only raw bytes make sense (store.py).
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

    def _new_item(self, raw: bytes, data: bytes, flags: int, deadline: int | None) -> _Item:
        """An item with the next CAS token.  Caller holds the lock."""
        self._last_cas += 1
        return _Item(data, flags, deadline, self._last_cas, item_size(raw, data, flags))

    def _live(self, raw: bytes, now: int) -> _Item | None:
        """The unexpired item, marked most recently used.  Caller holds the lock."""
        item = self._items.get(raw)
        if item is None:
            return None
        if item.expired(now):
            self._discard(raw)
            return None
        self._items.move_to_end(raw)
        return item

    def _read(self, raw: bytes, now: int) -> _Item | None:
        """:meth:`_live` for a read, counted as a hit or a miss.  Caller holds the lock."""
        item = self._live(raw, now)
        if item is None:
            self._get_misses += 1
        else:
            self._get_hits += 1
        return item

    def _discard(self, raw: bytes) -> bool:
        """Unlink the item if present.  Caller holds the lock."""
        item = self._items.pop(raw, None)
        if item is None:
            return False
        self._used -= item.size
        return True

    def _link(self, raw: bytes, item: _Item, now: int) -> None:
        """Replace the key's item, making room first.  Caller holds the lock."""
        self._discard(raw)
        if item.expired(now):
            return  # stored and expired at once: nothing visible remains
        self._reclaim(now)
        while self._used + item.size > self._max_bytes:
            _, evicted = self._items.popitem(last=False)
            self._used -= evicted.size
            self._evictions += 1
        self._items[raw] = item
        self._used += item.size
        if item.deadline is not None:
            heapq.heappush(self._expiries, (item.deadline, raw))
            if len(self._expiries) > 2 * len(self._items) + 64:
                self._rebuild_expiries()

    def _reclaim(self, now: int) -> None:
        """Drop every expired item, like memcached's LRU crawler.  Caller holds the lock."""
        while self._expiries and self._expiries[0][0] <= now:
            _, raw = heapq.heappop(self._expiries)
            item = self._items.get(raw)
            # Entries go stale when an item is replaced or touched; check the item itself.
            if item is not None and item.expired(now):
                self._discard(raw)
                self._reclaimed += 1

    def _rebuild_expiries(self) -> None:
        """Drop stale heap entries (overwrites of keys with a TTL).  Caller holds the lock."""
        self._expiries = [
            (item.deadline, raw) for raw, item in self._items.items() if item.deadline is not None
        ]
        heapq.heapify(self._expiries)


class AsyncMemoryStore:
    """:class:`MemoryStore` for asyncio (:class:`~.store.AsyncStore`), over the same data.

    Its operations are in-memory and take the store's lock only for a few
    microseconds, so they run on the event loop directly: no thread, no
    ``sync_to_async``.  ``sync`` is the store it reads and writes, so a
    Django backend's sync and async methods see one cache.
    """

    def __init__(self, sync: MemoryStore | None = None) -> None:
        self.sync = sync if sync is not None else MemoryStore()

    async def get(self, key: Key, default: Any = None) -> Any:
        return self.sync.get(key, default)

    async def gets(self, key: Key) -> tuple[Any, CasToken | None]:
        return self.sync.gets(key)

    async def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return self.sync.get_many(keys)

    async def gets_many(self, keys: Iterable[Key]) -> dict[Key, tuple[Any, CasToken]]:
        return self.sync.gets_many(keys)

    async def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        return self.sync.gets_envelope(key)

    async def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return self.sync.get_many_envelopes(keys)

    async def ttl(self, key: Key) -> int | None:
        return self.sync.ttl(key)

    async def set(self, key: Key, value: Any, expire: int = 0) -> bool:
        return self.sync.set(key, value, expire)

    async def set_many(self, values: Mapping[KeyT, Any], expire: int = 0) -> list[KeyT]:
        return self.sync.set_many(values, expire)

    async def add(self, key: Key, value: Any, expire: int = 0) -> bool:
        return self.sync.add(key, value, expire)

    async def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        return self.sync.cas(key, value, cas, expire)

    async def append(self, key: Key, value: bytes) -> bool:
        return self.sync.append(key, value)

    async def prepend(self, key: Key, value: bytes) -> bool:
        return self.sync.prepend(key, value)

    async def incr(self, key: Key, delta: int = 1) -> int | None:
        return self.sync.incr(key, delta)

    async def decr(self, key: Key, delta: int = 1) -> int | None:
        return self.sync.decr(key, delta)

    async def touch(self, key: Key, expire: int = 0) -> bool:
        return self.sync.touch(key, expire)

    async def delete(self, key: Key) -> bool:
        return self.sync.delete(key)

    async def bump(self, key: Key) -> bool:
        return self.sync.bump(key)

    async def delete_many(self, keys: Iterable[Key]) -> None:
        self.sync.delete_many(keys)

    async def gets_ttl(self, key: Key) -> tuple[Any, CasToken | None, int | None]:
        return self.sync.gets_ttl(key)

    async def add_cas(self, key: Key, value: Any, expire: int = 0) -> CasToken | None:
        return self.sync.add_cas(key, value, expire)

    async def recas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> CasToken | None:
        return self.sync.recas(key, value, cas, expire)

    async def delete_cas(self, key: Key, cas: CasToken) -> bool:
        return self.sync.delete_cas(key, cas)

    async def flush_all(self) -> bool:
        return self.sync.flush_all()

    async def close(self) -> None:
        """Do nothing, as :meth:`MemoryStore.close`."""

    async def stats(self) -> dict[str, int]:
        return self.sync.stats()

    @property
    def serde(self) -> Serde:
        return self.sync.serde


def _exptime(expire: int) -> int:
    # The text protocol carries exptimes as decimal integers.
    if isinstance(expire, bool) or not isinstance(expire, int):
        raise ValueError(f"expire must be an integer number of seconds, not {expire!r}")
    return expire


def _deadline(expire: int, now: int) -> int | None:
    """memcached's ``realtime()``: the clock value at which an item stored ``now`` expires."""
    if expire == 0:
        return None
    if expire < 0:
        return now  # negative exptimes expire at once (EXPTIME_TO_POSITIVE_TIME)
    if expire > MAX_RELATIVE_EXPIRE:
        return expire  # an absolute Unix time
    return now + expire


def _plain(key: Key) -> PlainKey:
    """The key the serde sees: the one stored (a routed key's bytes, as a Cluster sends them)."""
    return key.key if isinstance(key, Routed) else key


def _token(item: _Item) -> bytes:
    # pymemcache returns CAS tokens as the ASCII digits memcached sends.
    return b"%d" % item.cas


def _token_number(cas: CasToken | str) -> int:
    # pymemcache sends a token given as int, str or bytes, if it is ASCII digits.
    text = (
        cas if isinstance(cas, bytes) else str(cas).encode() if isinstance(cas, int | str) else b""
    )
    if not text.isdigit():
        raise ValueError(f"cas must be a token of ASCII digits, not {cas!r}")
    return int(text)


# What an embedded cache's OPTIONS may hold: the store's sizes, and how values are encoded.
MEMORY_OPTIONS = ("max_bytes", "max_item_size")
EMBEDDED_OPTIONS = (*MEMORY_OPTIONS, *SerdeOptions.NAMES, "long_keys", "large_values")


def memory_options(options: Mapping[str, Any]) -> dict[str, int]:
    """Return the :class:`MemoryStore` sizes among an embedded cache's ``options``, validated.

    The Django and Flask embedded backends take :data:`EMBEDDED_OPTIONS`; any
    other name, a size that is not a positive integer, or sizes memcached
    would refuse for ``-I`` and ``-m`` raise :class:`ConfigurationError`
    naming the option.
    """
    unknown = sorted(set(options) - set(EMBEDDED_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"unknown option {unknown[0]!r}; valid options: "
            + ", ".join(repr(o) for o in EMBEDDED_OPTIONS),
            option=unknown[0],
            choices=EMBEDDED_OPTIONS,
        )
    for name, choices in (("long_keys", LONG_KEYS), ("large_values", LARGE_VALUES)):
        if options.get(name, choices[0]) not in choices:
            raise ConfigurationError(
                f"invalid value {options[name]!r} for option {name!r}; valid choices: "
                + ", ".join(repr(c) for c in choices),
                option=name,
                choices=choices,
            )
    sizes = {name: value for name, value in options.items() if name in MEMORY_OPTIONS}
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigurationError(
                f"option {name!r} must be a positive integer, not {value!r}", option=name
            )
    MemoryStore(**sizes)  # memcached's own rules for -I and -m (an empty store costs nothing)
    return sizes


# Each shared store with the serialisation options it was made with.
_SHARED: Registry[tuple[MemoryStore, SerdeOptions]] = Registry(
    on_reset=lambda shared: shared[0].flush_all()
)


def shared_memory_store(
    name: str,
    serde_options: SerdeOptions | None = None,
    *,
    on_refused: Callable[[ValueRefused], object] | None = None,
    **sizes: Any,
) -> MemoryStore:
    """Return the process-wide store called ``name``, creating it with these options.

    Every thread (and every Django backend instance) naming the same store
    shares its data, as Django's ``LocMemCache`` shares one dict per
    ``LOCATION``.  ``sizes`` (``max_bytes``, ``max_item_size``) and
    ``on_refused`` only matter to the first caller.  ``serde_options``
    (serializer and signing) decide how every value is written and read, so
    a caller asking for other ones than the store was made with gets
    :class:`ConfigurationError`: silently sharing the first caller's would
    store unsigned values for a cache configured to sign them.
    """
    wanted = serde_options if serde_options is not None else SerdeOptions()
    store, made_with = _SHARED.get_or_create(
        name, lambda: (MemoryStore(serde=wanted.build(on_refused), **sizes), wanted)
    )
    if made_with != wanted:
        # SerdeOptions' repr leaves the keys out; say so when only they differ.
        detail = f"{made_with!r}, not {wanted!r}"
        if repr(made_with) == repr(wanted):
            detail = "other signing keys"
        raise ConfigurationError(
            f"the embedded store {name!r} is already used with {detail}; give a cache with "
            "other serializer or signing options its own LOCATION",
            option="LOCATION",
        )
    return store


def reset_shared_memory_stores() -> None:
    """Forget (and empty) every shared store, e.g. between tests."""
    _SHARED.reset()
