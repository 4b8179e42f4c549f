"""Append-based lists over any Store (``shared/reference/004_…``).

A list is one raw item, with memcached's prepend-blacklist trick.  Values are
appended with a timestamp; ``lrem`` *prepends* a removal (the blacklist, read
before the items) that hides matching values pushed before it.  Compaction
applies the removals.  The write path is :mod:`.append`'s, the encodings are in
:mod:`.codec`.

Round trips in steady state: ``rpush``/``lrem`` 1, ``lrange``/``llen`` 1 (``gets``).

The algorithm is written once, as asyncio code (``core/_async/lists.py``,
:class:`AsyncAppendLists`); the sync :class:`AppendLists` is generated from it
(``scripts/generate_sync.py``).  Lists as read are in :mod:`.listviews`.
"""

from __future__ import annotations

from ._async.lists import AsyncAppendLists
from ._sync.lists import AppendLists

__all__ = ["AppendLists", "AsyncAppendLists"]
