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

from .aio import AsyncMemoryStore
from .items import (
    FLAGS_SUFFIX,
    ITEM_OVERHEAD,
    MAX_COUNTER,
    MIN_ITEM_SIZE,
    Serde,
    item_size,
    parse_counter,
)
from .shared import (
    EMBEDDED_OPTIONS,
    MEMORY_OPTIONS,
    memory_options,
    reset_shared_memory_stores,
    shared_memory_store,
)
from .store import MemoryStore

__all__ = [
    "EMBEDDED_OPTIONS",
    "FLAGS_SUFFIX",
    "ITEM_OVERHEAD",
    "MAX_COUNTER",
    "MEMORY_OPTIONS",
    "MIN_ITEM_SIZE",
    "AsyncMemoryStore",
    "MemoryStore",
    "Serde",
    "item_size",
    "memory_options",
    "parse_counter",
    "reset_shared_memory_stores",
    "shared_memory_store",
]
