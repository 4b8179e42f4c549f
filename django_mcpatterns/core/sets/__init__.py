"""Append-based sets over any Store (the article ``shared/reference/000_…``).

A set is one raw item: members are *added* and *removed* by appending ``+member``
and ``-member`` records (one ``append`` for any number of members, nothing read),
a missing set is created with ``add``, and a read that finds too many records
*compacts* the item with ``gets_ttl`` + ``cas``.  The write path (missing or full
items, rewrites that carry racing appends over) is ``_async_append.py``'s, the
encodings are in ``_model_layout.py``, lists are in ``_async_lists.py``.  On top of the
article:

Shards
    A set whose compacted form outgrows 70% of an item spills into
    *shards* (``_model_shards.py``): immutable snapshot items under keys derived from
    the root key and a random generation (so memcached spreads them over the
    cluster), members routed by a stable hash.  The root keeps the header and
    the log of recent writes, so writes stay one ``append``; a rewrite writes a
    new generation of shards and switches the root to it with ``cas``.  Readers
    fetch the root and the shards they know of in one parallel multi-get.
    ``max_shards`` bounds a set; a write past it raises
    :class:`~django_mcpatterns.core.exceptions.CollectionTooLargeError`.
Loaders (eviction)
    A set declared with a ``loader`` (its source of truth) is never created by a
    writer.  A reader that misses ``add``\\ s an empty *pending* item, calls the
    loader and appends the snapshot; writes that land in between are kept
    (a member the log decided keeps the log's verdict), and readers never take a
    pending set for a complete one.

Round trips in steady state (one Store call; a multi-key call is one parallel
request): ``sadd``/``srem`` 1; ``smembers``/``sismember``/``scard`` 1 (``gets``,
or the multi-get of a sharded set);
creating a set 2 (append, add) or 3 (a lost race); a compacting read and
``spop`` 2 with the meta protocol (``gets_ttl``: value, cas and TTL in one
``mg``, then ``cas``), 3 with the text protocol (``gets``, ``ttl``, ``cas``),
+1 per carried race;
``smove`` 3 (read, append, append);
algebra 1 (+1 for shards it did not know of).  The full table is in
``docs/sets.md``.

:class:`AppendLists` (lists), :class:`AppendCollections` (the write path both
share), :class:`SetOptions` and :func:`shard_key` are importable from here too.

Written once, async and sync
    The algorithm is asyncio code in ``_async.py`` (:class:`AsyncAppendSets`, over
    an :class:`~django_mcpatterns.core.store.AsyncStore`, with coroutine methods of
    the same names: ``await sets.sadd(key, 1)``; a ``loader`` may be a coroutine
    function or a plain callable, which runs through ``sync_to_async`` since it
    may use the ORM), lists in ``_async_lists.py``, the shared write path in
    ``_async_append.py``.  The sync :class:`AppendSets` (``_sync.py``...) is
    generated from them by ``scripts/generate_sync.py``, and CI checks it is
    current.  The pure parts: options (``_model.py``), the item layout
    (``_model_layout.py``), sets and lists as read (``_model_views.py``,
    ``_model_lists.py``) and shards (``_model_shards.py``).
"""

from __future__ import annotations

from ._async import AsyncAppendSets
from ._async_append import AsyncAppendCollections
from ._async_lists import AsyncAppendLists
from ._model import Carry, SetOptions
from ._model_layout import Member
from ._model_shards import SHARD_TTL_MARGIN, shard_key
from ._model_views import AsyncLoader, Loader, matching
from ._sync import AppendSets
from ._sync_append import AppendCollections
from ._sync_lists import AppendLists

__all__ = [
    "SHARD_TTL_MARGIN",
    "AppendCollections",
    "AppendLists",
    "AppendSets",
    "AsyncAppendCollections",
    "AsyncAppendLists",
    "AsyncAppendSets",
    "AsyncLoader",
    "Carry",
    "Loader",
    "Member",
    "SetOptions",
    "matching",
    "shard_key",
]
