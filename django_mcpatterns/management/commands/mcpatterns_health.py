"""``manage.py mcpatterns_health``: every server's health and memcached counters.

    manage.py mcpatterns_health [--cache ALIAS] [--json]

Health is what failover knows in this process (a fresh process starts with every
server up); the counters come from memcached's ``stats``, asked of each server
now.  On the embedded store, the in-process store's own counters.
"""

from __future__ import annotations

from typing import Any

from ...inspection import ServerStatus, cache_status
from ..base import CacheCommand, percent


class Command(CacheCommand):
    help = "Show each memcached server's health and stats: hits, misses, evictions, items, bytes."

    def handle(self, *args: Any, **options: Any) -> None:
        status = cache_status(self.cache_alias(options["cache"]))
        if options["json"]:
            self.print_json(status.as_dict())
            return
        variant = f", ketama {status.variant!r}" if status.variant else ""
        failover = f", failover {status.failover!r}" if status.failover else ""
        self.stdout.write(f"Cache {status.alias!r}: {status.backend}{variant}{failover}")
        if status.replicate:
            copies = ", ".join(f"{p!r} x{n}" for p, n in status.replicate.items())
            self.stdout.write(f"Replicated key prefixes: {copies}")
        self._servers(status.servers)
        migration = status.migration
        if migration is not None:
            until = f", until {migration.until}" if migration.until else ""
            counts = migration.counts
            self.stdout.write(
                f"Migrating from the old ring (reads {migration.reads!r}{until}): "
                f"{counts['fallbacks']} misses of moved keys, {counts['old_hits']} served "
                f"from the old ring, {counts['copied']} copied, "
                f"{counts['invalidations']} deletes on the other ring (this process)"
            )
            self._servers(migration.servers)
        if status.gutter:
            self.stdout.write(f"Gutter pool (TTLs of at most {status.gutter_ttl} s):")
            self._servers(status.gutter)

    def _servers(self, servers: list[ServerStatus]) -> None:
        rows = []
        for server in servers:
            stats = server.stats or {}
            rows.append(
                (
                    server.node,
                    server.state if server.stats is not None else f"{server.state}, no stats",
                    server.failures,
                    stats.get("hits"),
                    stats.get("misses"),
                    percent(server.hit_ratio),
                    stats.get("evictions"),
                    stats.get("items"),
                    stats.get("bytes"),
                    server.journal,
                )
            )
        self.print_table(
            [
                "server",
                "state",
                "failures",
                "hits",
                "misses",
                "hit ratio",
                "evictions",
                "items",
                "bytes",
                "to delete",
            ],
            rows,
        )
        for server in servers:
            if server.last_error:
                self.stdout.write(f"{server.node}: last error: {server.last_error}")
