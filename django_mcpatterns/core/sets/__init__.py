"""Append-based sets over any Store (the article ``shared/reference/000_…``).

A set is one raw item: members are *added* and *removed* by appending ``+member``
and ``-member`` records (one ``append`` for any number of members, nothing read),
a missing set is created with ``add``, and a read that finds too many records
*compacts* the item with ``gets_ttl`` + ``cas``.  The write path (missing or full
items, rewrites that carry racing appends over) is :mod:`.append`'s, the
encodings are in :mod:`.codec`, lists are in :mod:`.lists`.  On top of the
article:

Shards
    A set whose compacted form outgrows 70% of an item spills into
    *shards* (:mod:`.shards`): immutable snapshot items under keys derived from
    the root key and a random generation (so memcached spreads them over the
    cluster), members routed by a stable hash.  The root keeps the header and
    the log of recent writes, so writes stay one ``append``; a rewrite writes a
    new generation of shards and switches the root to it with ``cas``.  Readers
    fetch the root and the shards they know of in one parallel multi-get.
    ``max_shards`` bounds a set; a write past it raises
    :class:`~.exceptions.CollectionTooLargeError`.
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

:class:`~.lists.AppendLists`, :class:`~.append.SetOptions` and
:func:`~.shards.shard_key` are importable from here too.

Written once, async and sync
    The algorithm is asyncio code in ``core/_async/sets.py``
    (:class:`AsyncAppendSets`, over an :class:`~.store.AsyncStore`, with
    coroutine methods of the same names: ``await sets.sadd(key, 1)``; a
    ``loader`` may be a coroutine function or a plain callable, which runs
    through ``sync_to_async`` since it may use the ORM).  The sync
    :class:`AppendSets` in ``core/_sync/sets.py`` is generated from it by
    ``scripts/generate_sync.py``, and CI checks it is current.  Sets as read
    (views, log replay, the carrying ``cas``) are in :mod:`.setviews`.
"""

from __future__ import annotations

from ._async.lists import AsyncAppendLists
from ._async.sets import AsyncAppendSets
from ._sync.lists import AppendLists
from ._sync.sets import AppendSets
from .setoptions import SetOptions
from .setviews import AsyncLoader, Loader
from .shards import shard_key

__all__ = [
    "AppendLists",
    "AppendSets",
    "AsyncAppendLists",
    "AsyncAppendSets",
    "AsyncLoader",
    "Loader",
    "SetOptions",
    "shard_key",
]
