"""What the status page and the management commands report about a cache.

Read-only views of a backend's Store, computed the same way for both:

* the ketama ring as arcs of the 2**32 hash space, each server's share, and the
  exact fraction of keys a change of server list would move (from arc
  ownership, not from sampling keys);
* node health (:meth:`Cluster.health`) and memcached's ``stats`` of every
  server, under a few stable names, for a ``Cluster`` (one mapping per server)
  and the embedded ``MemoryStore`` (one flat mapping) alike;
* the near cache's counts in this process (``OPTIONS["near_cache"]``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from .binding import Migration
from .core.client.migration import describe
from .core.cluster import Cluster
from .core.ketama import RING_SIZE, Continuum
from .core.memory import MemoryStore
from .core.servers import Server

# What the reports show, under memcached's own ``stats`` names.
STATS = {
    "hits": "get_hits",
    "misses": "get_misses",
    "evictions": "evictions",
    "items": "curr_items",
    "bytes": "bytes",
    "limit_maxbytes": "limit_maxbytes",
    "uptime": "uptime",
    "version": "version",
}
EMBEDDED_NODE = "in-process"


# -- the ring -------------------------------------------------------------------


@dataclass(frozen=True)
class Arc:
    """The hashes ``start <= h < end`` of the ring, all routed to ``node``."""

    start: int
    end: int
    node: str

    @property
    def fraction(self) -> float:
        return (self.end - self.start) / RING_SIZE


def arcs(ring: Continuum) -> list[Arc]:
    """Return the ring as consecutive arcs covering ``[0, 2**32)``, in hash order.

    A key goes to the first point >= its hash, wrapping past the last point to
    the first, so point ``p`` owns ``(previous point, p]``; neighbouring arcs of
    the same node are merged.  Equal points give their arc to the first entry,
    as lookups do (``bisect_left``).
    """
    points = ring.points()
    if not points:
        return []
    found: list[Arc] = []
    start = 0
    for point, owner in points:
        _extend(found, start, point + 1, owner)
        start = max(start, point + 1)
    _extend(found, start, RING_SIZE, points[0][1])  # the wrap-around arc
    return found


def _extend(found: list[Arc], start: int, end: int, node: str) -> None:
    if end <= start:
        return  # an equal point: its arc went to the first entry
    if found and found[-1].node == node:
        found[-1] = Arc(found[-1].start, end, node)
    else:
        found.append(Arc(start, end, node))


@dataclass(frozen=True)
class RingRow:
    """One server of a ring: its weight, its points and its share of the keyspace."""

    node: str
    weight: int
    points: int
    share: float  # fraction of the hash space (and so of uniformly spread keys)
    ideal: float  # weight / total weight: the share a perfect ring would give


def ring_rows(ring: Continuum) -> list[RingRow]:
    """Return each server's share of ``ring``, in server order."""
    shares = ring.shares()
    points = ring.point_counts()
    total = sum(ring.weights)
    return [
        RingRow(node, weight, points[node], shares[node], weight / total)
        for node, weight in zip(ring.nodes, ring.weights, strict=True)
    ]


@dataclass(frozen=True)
class Movement:
    """Where keys go when a ring changes: ``flows[(from, to)]`` fractions of all keys."""

    flows: Mapping[tuple[str, str], float]

    @property
    def moved(self) -> float:
        """The fraction of all keys that change server."""
        return sum(self.flows.values())


def movement(before: Continuum, after: Continuum) -> Movement:
    """Return exactly which fraction of the keyspace moves from ``before`` to ``after``.

    Both rings cover ``[0, 2**32)`` with arcs; walking them side by side, every
    stretch whose owner differs is a flow of keys (keys spread uniformly over
    the hash space, which MD5 and the other key hashes give).
    """
    old, new = arcs(before), arcs(after)
    flows: Counter[tuple[str, str]] = Counter()
    i = j = 0
    position = 0
    while i < len(old) and j < len(new):
        end = min(old[i].end, new[j].end)
        if old[i].node != new[j].node:
            flows[(old[i].node, new[j].node)] += end - position
        position = end
        if old[i].end == end:
            i += 1
        if new[j].end == end:
            j += 1
    return Movement({pair: size / RING_SIZE for pair, size in flows.items()})


def changed_cluster(
    cluster: Cluster, add: Sequence[Server] = (), remove: Sequence[str] = ()
) -> Cluster:
    """Return a cluster like ``cluster`` with servers added and removed (not connected).

    Built by :class:`Cluster` itself so the ring follows the same rules as a
    deployment with that ``LOCATION`` (e.g. weights count only when one is not 1).
    """
    kept = [s for s in cluster.servers if s.node not in set(remove)]
    return Cluster([*kept, *add], cluster.options)


# -- health and stats -----------------------------------------------------------


@dataclass(frozen=True)
class ServerStatus:
    """One server's health and memcached counters (``stats`` None: it did not answer)."""

    node: str
    state: str  # "up", "failing" or "dead"; "embedded" for the in-process store
    failures: int = 0
    retry_in: float = 0.0
    last_error: str | None = None
    stats: dict[str, Any] | None = None
    journal: int = 0  # keys it missed writes of, deleted there before it serves (replicas)

    @property
    def hit_ratio(self) -> float | None:
        stats = self.stats or {}
        hits, misses = stats.get("hits"), stats.get("misses")
        if hits is None or misses is None or not hits + misses:
            return None
        return float(hits / (hits + misses))  # stats values are untyped


@dataclass(frozen=True)
class MigrationStatus:
    """A ring migration in progress (``OPTIONS["migrate_from"]``): the old ring, the stage,
    and what this process's cache API did with it so far (:data:`~.core.migrate.COUNTS`)."""

    servers: list[ServerStatus]  # the old ring's
    ketama: str
    reads: str  # the stage: "old" (reads and writes on the old ring), then "new"
    until: str | None  # when the read fallback ends (ISO 8601, UTC)
    text_ttl: int
    counts: dict[str, int]

    @property
    def served_from_old(self) -> float | None:
        """The share of moved keys' misses the old ring answered (it falls as the new fills)."""
        fallbacks = self.counts.get("fallbacks", 0)
        return self.counts.get("old_hits", 0) / fallbacks if fallbacks else None


@dataclass(frozen=True)
class CacheStatus:
    """Everything the reports show about one cache alias."""

    alias: str
    backend: str
    variant: str | None  # the ketama variant; None for the embedded store
    ring: list[RingRow] = field(default_factory=list)
    servers: list[ServerStatus] = field(default_factory=list)
    failover: str | None = None  # the failover policy; None for the embedded store
    replicate: dict[str, int] = field(default_factory=dict)  # key prefix -> copies
    gutter: list[ServerStatus] = field(default_factory=list)  # the gutter pool's servers
    gutter_ttl: int | None = None
    near: dict[str, Any] | None = None  # the near cache's counts in this process (NearStats)
    migration: MigrationStatus | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``--json`` output)."""
        data = asdict(self)
        for name in ("servers", "gutter"):
            for server, status in zip(data[name], getattr(self, name), strict=True):
                server["hit_ratio"] = status.hit_ratio
        if self.migration is not None:
            data["migration"]["served_from_old"] = self.migration.served_from_old
        return data


def pattern_aliases() -> list[str]:
    """Return the ``CACHES`` aliases served by one of this package's backends."""
    from .backend import KetamaMemcacheCache, LocMemPatternsCache

    found = []
    for alias, entry in settings.CACHES.items():
        try:
            backend = import_string(entry.get("BACKEND", ""))
        except ImportError:
            continue
        if isinstance(backend, type) and issubclass(
            backend, KetamaMemcacheCache | LocMemPatternsCache
        ):
            found.append(alias)
    return found


def cache_status(alias: str) -> CacheStatus:
    """Return the ring, health and stats of the cache ``alias``.

    Contacts every server once (``stats``); a server that does not answer is
    reported with ``stats=None`` and its health as failover sees it.
    """
    from .decorators import patterns_cache

    cache = patterns_cache(alias)
    store = cache.store
    backend = type(cache).__name__
    if isinstance(store, Cluster):
        options = store.options
        raw, gutter_raw = store.stats(), store.stats(gutter=True)  # first: it finds dead servers
        near = cache.binding.near
        return CacheStatus(
            alias,
            backend,
            options.ketama,
            ring_rows(store.ring),
            _servers(store.health(), raw, store.journal()),
            failover=options.failover,
            replicate=dict(options.replicate),
            gutter=_servers(store.gutter_health(), gutter_raw, {}),
            gutter_ttl=options.gutter_ttl if options.gutter else None,
            near=near.stats().as_dict() if near is not None else None,
            migration=migration_status(getattr(cache.binding, "migration", None)),
        )
    # The embedded MemoryStore: one flat stats mapping, no ring, no health.
    assert isinstance(store, MemoryStore)  # the only other Store our backends build
    stats = normalise_stats(store.stats())
    return CacheStatus(
        alias, backend, None, [], [ServerStatus(EMBEDDED_NODE, "embedded", stats=stats)]
    )


def migration_status(migration: Migration | None) -> MigrationStatus | None:
    """The status of a cache's ring migration (its old ring's servers asked for ``stats``)."""
    if migration is None:
        return None
    old = migration.patterns
    settings_ = describe(migration.source)
    return MigrationStatus(
        _servers(old.health(), old.stats(), old.journal()),
        settings_["ketama"],
        settings_["reads"],
        settings_["until"],
        settings_["text_ttl"],
        migration.tally.counts(),
    )


def _servers(
    health: Mapping[str, Any], raw: Mapping[str, Any], journal: Mapping[str, int]
) -> list[ServerStatus]:
    return [
        ServerStatus(
            node,
            snapshot.state,
            snapshot.failures,
            snapshot.retry_in,
            snapshot.last_error,
            normalise_stats(raw[node]) if node in raw else None,
            journal.get(node, 0),
        )
        for node, snapshot in health.items()
    ]


def normalise_stats(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Pick the reported counters out of memcached's ``stats`` (missing ones: None)."""
    return {ours: raw.get(theirs) for ours, theirs in STATS.items()}
