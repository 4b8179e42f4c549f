"""memcached's item table: least recently used order, expiries, CAS tokens, memory accounting.

The base of :class:`~.store.MemoryStore`: what a server does to its items whatever the
command (link, unlink, evict, reclaim expired items, count hits and misses).  Every
method expects the caller to hold the store's lock.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from .items import Item, item_size

__all__ = ["ItemTable"]


class ItemTable:
    """The items of one store, keyed by their wire bytes, within ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._items: OrderedDict[bytes, Item] = OrderedDict()  # least recently used first
        self._expiries: list[tuple[int, bytes]] = []  # heap of (deadline, key); may be stale
        self._used = 0
        self._last_cas = 0
        self._evictions = 0
        self._reclaimed = 0
        self._get_hits = 0
        self._get_misses = 0

    def _new_item(
        self, raw: bytes, data: bytes, flags: int, deadline: int | None, leased: bool = False
    ) -> Item:
        """An item with the next CAS token.  Caller holds the lock."""
        self._last_cas += 1
        return Item(data, flags, deadline, self._last_cas, item_size(raw, data, flags), leased)

    def _live(self, raw: bytes, now: int) -> Item | None:
        """The unexpired item, marked most recently used.  Caller holds the lock."""
        item = self._items.get(raw)
        if item is None:
            return None
        if item.expired(now):
            self._discard(raw)
            return None
        self._items.move_to_end(raw)
        return item

    def _read(self, raw: bytes, now: int) -> Item | None:
        """:meth:`_live` for a read, counted as a hit or a miss.  Caller holds the lock."""
        item = self._live(raw, now)
        if item is None:
            self._get_misses += 1
        else:
            self._get_hits += 1
        return item

    def _vivify(
        self, raw: bytes, deadline: int | None, replacing: int | None, now: int
    ) -> tuple[Item, bool]:
        """memcached's ``mg <key> N<ttl>``: the live item (the version ``replacing``
        deleted first), or a new empty one leased to the caller; and whether it was
        made now (the caller won the lease).  Caller holds the lock."""
        item = self._read(raw, now)
        if item is not None and item.cas == replacing:
            self._discard(raw)
            item = None
        if item is not None:
            return item, False
        item = self._new_item(raw, b"", 0, deadline, leased=True)
        self._link(raw, item, now)
        return item, True

    def _discard(self, raw: bytes) -> bool:
        """Unlink the item if present.  Caller holds the lock."""
        item = self._items.pop(raw, None)
        if item is None:
            return False
        self._used -= item.size
        return True

    def _link(self, raw: bytes, item: Item, now: int) -> None:
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
