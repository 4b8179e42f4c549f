"""Namespaces: keys invalidated together in O(1), read in one request.

The recipe (memcached's programming tricks, "Deleting By Namespace"): a
*version key* per namespace, created with ``add`` from a time-based value and
bumped with ``incr`` to invalidate every key of the namespace at once.  Values
of an older version are never returned again and fall off the LRU.

One request per read, not the recipe's two
    The recipe reads the version, then the value.  Here every key of a
    namespace, and of the namespaces nested in it, is routed to the server of
    the *root* namespace's version key (a :class:`~django_mcpatterns.core.keys.Routed` key, honoured
    by the :class:`~django_mcpatterns.core.cluster.Cluster` only), the value carries the versions it
    was written under, and one multi-get to that one server reads the versions and
    the value together.  A value whose versions are not the current ones is a
    miss.  A nested namespace's value carries every level's version, so
    invalidating an outer namespace invalidates the inner ones.

Keys, before the backend's ``KEY_PREFIX``/``VERSION``
    ``ns:<id>`` is a namespace's version key and ``ns:<id>|<key>`` a value key.
    ``<id>`` is the parts percent-encoded (RFC 3986 unreserved characters stay,
    everything else, UTF-8 encoded, becomes ``%XX``), joined with ``:``, levels
    joined with ``/``: ``ns:org:1/user:42|profile``.  Over
    :data:`MAX_READABLE_ID` bytes it is ``#`` and a BLAKE2b-160 digest of that
    text instead.  So whatever the parts hold (spaces, newlines, unicode,
    megabytes) the id has no whitespace, control bytes, ``|`` or ``#`` and is
    at most 64 bytes: distinct namespaces never share a key, a value key is
    never a version key, and nothing can reach the protocol.  Parts are ``str``
    or ``int``; an int is its decimal text (as Django turns keys into text), so
    ``("user", 42)`` and ``("user", "42")`` are one namespace.

Versions
    Decimal text stored as raw bytes (so ``incr`` works whatever the serde),
    never expiring (evicted by the LRU only; every read refreshes them).  A
    missing version key is created with ``add`` of the microseconds since the
    epoch.  Versions are compared for equality, so a recreated key (evicted,
    server restarted) never matches the version older values carry, unless the
    namespace saw over a million invalidations per second of its life.

Tagged values (wire format)
    Raw bytes (flags 0, as the Store protocol keeps ``bytes``)::

        magic  format  depth  written_at   inner flags  versions       inner data
        b"ns"  u8 (=1) u8     f64 (Unix s) u32          depth x u64    ...
        big-endian

    The inner data and flags are the store's serde output for the value, so a
    soft-expiry :class:`~django_mcpatterns.core.values.envelope.Envelope`
    (:mod:`django_mcpatterns.core.stampede`) nests inside. Any other value under a value key raises
    :class:`~django_mcpatterns.core.exceptions.EncodingError`.

Writes
    ``set`` tags the value with the versions current when it is stored.
    ``get_or_set``, ``get_or_compute`` and ``recompute`` tag it with the
    versions read *before* computing it, so a value computed while the
    namespace was invalidated is stored already invalid.  A missing version
    key (first use, eviction, restart) is created before the value is
    computed, for the same reason: an invalidation during the compute then
    bumps that version instead of creating the one the value would be stored
    under.  So an invalidation during any namespaced compute wins, warm or
    cold, at every level.

Invalidation
    ``incr`` of the version key: one request.  On a missing key, ``add`` of a
    new time-based version; if that ``add`` loses a race with a writer creating
    the key, ``incr`` again (that writer may have read the data before the
    change).  It runs on the store's strict view: an unreachable server raises
    :class:`~django_mcpatterns.core.exceptions.NodeUnavailableError` rather than losing the
    invalidation silently.

Soft namespaces (``soft=True``)
    ``get_or_compute`` serves an invalidated value as *stale*: one caller
    recomputes it under the stampede lock while the others are served it
    (``get``, ``get_many`` and ``get_or_set`` still miss).  Likewise a
    ``get_or_compute`` value past its soft expiry is a miss for those plain
    reads, in any namespace (:mod:`django_mcpatterns.core.values.envelope`).

The guarantee
    Once :meth:`Namespace.invalidate` has returned, every read that starts
    later, in any process, misses every value written before it (soft
    namespaces: ``get_or_compute`` serves them stale, by choice).  The read
    fetches the version key from the same server in the same request, and
    memcached answers it after the ``incr``.  With ``failover="remap"`` an
    invalidation made while the namespace's server is out goes to the next
    server and is lost when the first one comes back, like any write during an
    outage: prefer ``"miss"`` (the default), where the namespace's keys and its
    version are out together.

Requests (steady state; ``d`` = nesting depth, all keys on one server)
    ``get``, ``get_many``, ``get_or_set`` hit, ``get_or_compute`` fresh: 1
    multi-get of ``d`` + n keys.  ``set``, ``set_many``: 2 (versions, then the
    write).  ``add``: 2 (``gets`` of versions and value, ``add``/``cas``).
    ``delete``, ``delete_many``, ``invalidate``: 1.  ``get_or_set`` miss: 4 (the
    lease of :mod:`django_mcpatterns.core.leases`: ``add`` of a placeholder, ``gets``, then a
    ``cas`` fill). A missing version key adds one ``add`` to the first write.

Written once
    :class:`AsyncNamespaces` / :class:`AsyncNamespace` (``_async.py``,
    over an :class:`~django_mcpatterns.core.store.AsyncStore`) are the source; :class:`Namespaces`
    and :class:`Namespace` are their generated sync form.  The async methods have the
    same names and arguments, awaited; a ``compute`` or callable ``default`` given
    to them may be a coroutine function (awaited) or a plain callable (run through
    ``sync_to_async``: it may use the ORM).  Key derivation and the value format
    are in ``_model.py``.
"""

from __future__ import annotations

from ._async import AsyncNamespace, AsyncNamespaces, AsyncNamespaceSlot
from ._model import (
    MAX_DEPTH,
    MAX_READABLE_ID,
    REMEMBERED_PATHS,
    KeyMaker,
    Part,
    Path,
    namespace_id,
    part_text,
)
from ._sync import Namespace, Namespaces, NamespaceSlot

__all__ = [
    "MAX_DEPTH",
    "MAX_READABLE_ID",
    "REMEMBERED_PATHS",
    "AsyncNamespace",
    "AsyncNamespaceSlot",
    "AsyncNamespaces",
    "KeyMaker",
    "Namespace",
    "NamespaceSlot",
    "Namespaces",
    "Part",
    "Path",
    "namespace_id",
    "part_text",
]
