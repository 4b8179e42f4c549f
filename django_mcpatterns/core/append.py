"""The write path that append-based sets and lists share (the article ``shared/reference/000_…``).

A collection is one raw item that writers change by appending (or prepending)
records, without reading it.  :class:`AppendCollections` holds what
:class:`~.sets.AppendSets` and :class:`~.lists.AppendLists` do alike, on top of
the article:

Missing or full
    ``append`` answers NOT_STORED both for a missing item and for one that would
    pass the item size limit.  Writers try ``append``, then ``add`` (creation),
    then ``append`` again (a lost creation race); only when all three fail do
    they read the item: it is full, so it is compacted with their records folded
    in.  Nothing is dropped silently.
Unreachable servers
    A server that cannot be reached would answer like a missing item, and a
    write would retry and fail as if it lost races.  Writers use the store's
    strict view (:func:`~.locks.authoritative`) instead and raise
    :class:`~.exceptions.NodeUnavailableError` at once, as locks do; reads
    still degrade to the empty answer of a missing collection.
Concurrent appends during a rewrite
    A rewrite (compaction, pop, growth) is a ``cas``.  When it loses to appends
    made since its read, the item still starts with what was read, so the
    rewrite is retried with those appended bytes carried over after the new
    content: a lost race loses nothing and compaction converges under load.  A
    rewrite that finds anything else (another compaction) gives up to it.
Unknown outcomes
    A rewrite's ``cas`` (or ``add``) goes through the strict view, which tells
    "not stored" from "unknown" (:mod:`.store`).  When the reply never came,
    the item is read again: starting with what was sent, it was applied;
    starting with what was read, it was not (a carried retry follows);
    otherwise, or when it cannot be read, the rewrite raises
    :class:`~.exceptions.OutcomeUnknownError` and whatever the item might name
    (a set's old or new shards) is left in place, to expire.  A rewrite that a
    read decided on (compaction) never fails the read.
Expiry
    A rewrite is a ``cas``, which sets a new TTL: it keeps the item's own, so a
    touched collection keeps its extended life.  Readers get it with the value
    (``gets_ttl``: meta's ``mg <key> v c t f``, one request); where the store
    cannot say it there (the text protocol, a multi-key read) the rewrite asks
    (``ttl``, one more request).  A header also records the expiry given at
    creation, for when the store cannot tell (the item is being created).

:class:`SetOptions` holds the thresholds of both algorithms.

Written once
    The algorithm is asyncio code (``core/_async/append.py``,
    :class:`AsyncAppendCollections` over an :class:`~.store.AsyncStore`); the
    sync :class:`AppendCollections` is generated from it
    (``scripts/generate_sync.py``).  The pure parts (:class:`SetOptions`,
    ``Carry``, :class:`~.setoptions.ReadRewrite`) are in :mod:`.setoptions`.
"""

from __future__ import annotations

from ._async.append import AsyncAppendCollections
from ._sync.append import AppendCollections
from .setoptions import Carry, SetOptions

__all__ = ["AppendCollections", "AsyncAppendCollections", "Carry", "SetOptions"]
