"""Ring changes without a cold cache: the old ring serves, and is copied, while the new one fills.

A server added to a ketama ring of four takes about a fifth of the keys, and
every one of them misses there until it is computed again: the database takes
the herd (mcrouter's ``MigrateRoute`` and ``WarmUpRoute``, meta-memcache's
``MigratingCacheClient`` and Facebook's cold-cluster warm-up answer the same
problem).  ``OPTIONS["migrate_from"]`` names the ring before the change
(:mod:`django_mcpatterns.core.client.migration`), and the cache's values go
through an :class:`AsyncMigratingStore` / :class:`MigratingStore` over both.

Stages of a rolling deploy (``migrate_from["reads"]``)
    ``"old"``: reads and writes still go to the old ring; a write deletes the
    key on the new ring, and a delete goes to both rings (old first).  Every
    process must run it before any runs the next stage.
    ``"new"``: reads and writes go to the new ring; a miss of a key whose old
    server is another is read there and written back with the TTL it has left
    (meta ``mg v f c t``; text mode cannot read a TTL: ``text_ttl`` seconds);
    a write deletes the key on the old ring; a delete goes to both (old first).
    ``until`` ends the read fallback only.

No stale read after a delete
    A copy takes a lease placeholder on the new ring *before* it reads the old
    item, then fills it with ``cas``; deletes run on the old ring, then the new
    one.  A value read before a delete therefore finds its placeholder deleted
    or its fill refused; a value read after it is a miss.  A write in either
    stage deletes the key on the other ring after it lands, so a process still
    on the other stage never reads a copy older than the write.

Pattern keys
    Locks, sets and lists, counters, namespace versions, rate-limit slots and
    ``get_or_compute`` values never move during a migration: the pattern
    objects of a migrating cache use the old ring's cluster in both stages
    (and after ``until``), the ring every process of the previous stage uses
    too, so no pattern key is ever on two servers (docs/operations.md).  They
    move when ``migrate_from`` is removed.

:class:`Tally` counts what a migration did (the status page, metrics).  The
warm-up command's copier is :mod:`.warm`.
"""

from ._async import AsyncMigratingStore
from ._model import COUNTS, Tally
from ._sync import MigratingStore

__all__ = ["COUNTS", "AsyncMigratingStore", "MigratingStore", "Tally"]
