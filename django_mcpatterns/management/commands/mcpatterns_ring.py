"""``manage.py mcpatterns_ring``: each server's share of the ring, and what a change would move.

    manage.py mcpatterns_ring [--cache ALIAS] [--add HOST:PORT[:WEIGHT]]... [--remove HOST:PORT]...
                              [--json]

``--add`` and ``--remove`` may be repeated and combined.  Shares and moved keys
are measured on the ring (the arcs of the 2**32 hash space each server owns),
exactly, not by sampling keys.  A change also prints what it would cost (the
items and bytes that would start cold on their new servers, from each
server's ``stats`` when it answers) and the settings of a migration that
keeps them warm (``OPTIONS["migrate_from"]``, docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...core.cluster import Cluster
from ...core.exceptions import ConfigurationError
from ...core.servers import Server, parse_server
from ...decorators import patterns_cache
from ...inspection import RingRow, changed_cluster, movement, ring_rows
from ..base import CacheCommand, percent


class Command(CacheCommand):
    help = "Show each server's share of the ketama ring and the keys a server change would move."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--add",
            action="append",
            default=[],
            metavar="HOST:PORT[:WEIGHT]",
            help="A server to add (repeatable).",
        )
        parser.add_argument(
            "--remove",
            action="append",
            default=[],
            metavar="HOST:PORT",
            help="A server to remove (repeatable).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = self.cache_alias(options["cache"])
        cluster = patterns_cache(alias).store
        if not isinstance(cluster, Cluster):
            raise CommandError(
                f"cache {alias!r} is the embedded in-process store: it has no ring "
                "(give --cache the alias of a KetamaMemcacheCache)"
            )
        report: dict[str, Any] = {
            "cache": alias,
            "variant": cluster.options.ketama,
            "servers": [vars(row) for row in ring_rows(cluster.ring)],
        }
        if options["add"] or options["remove"]:
            report["change"] = self._change(cluster, options["add"], options["remove"])
        if options["json"]:
            self.print_json(report)
        else:
            self._print(report)

    def _change(self, cluster: Cluster, add: list[str], remove: list[str]) -> dict[str, Any]:
        current = {s.node for s in cluster.servers}
        added = [_parse(spec, "--add") for spec in add]
        removed = [_parse(spec, "--remove").node for spec in remove]
        for node in removed:
            if node not in current:
                raise CommandError(f"--remove {node}: not a server of this cache")
        for server in added:
            if server.node in current and server.node not in removed:
                raise CommandError(f"--add {server.node}: already a server of this cache")
        try:
            after = changed_cluster(cluster, add=added, remove=removed)
        except ConfigurationError as exc:
            raise CommandError(f"the changed server list is invalid: {exc}") from exc
        rows = ring_rows(after.ring)
        moved = movement(cluster.ring, after.ring)
        shares = {row.node: row.share for row in ring_rows(cluster.ring)}
        return {
            "add": [s.node for s in added],
            "remove": removed,
            "servers": [vars(row) for row in rows],
            "moved": moved.moved,
            "ideal_moved": _ideal_movement(ring_rows(cluster.ring), rows),
            "flows": [
                {"from": source, "to": target, "fraction": fraction}
                for (source, target), fraction in sorted(
                    moved.flows.items(), key=lambda item: -item[1]
                )
            ],
            "cost": _cost(cluster, moved.flows, shares),
            "migration": migration_settings(cluster, after),
        }

    def _print(self, report: dict[str, Any]) -> None:
        servers = report["servers"]
        self.stdout.write(
            f"Cache {report['cache']!r}: ketama {report['variant']!r}, {len(servers)} servers"
        )
        self._print_shares(servers)
        change = report.get("change")
        if change is None:
            return
        what = [f"adding {n}" for n in change["add"]] + [f"removing {n}" for n in change["remove"]]
        self.stdout.write("")
        self.stdout.write(f"After {' and '.join(what)}:")
        self._print_shares(change["servers"])
        self.stdout.write("")
        ideal = percent(change["ideal_moved"])
        self.stdout.write(
            f"Keys moved: {percent(change['moved'])} "
            f"(a ring giving every server exactly its weight's share: {ideal})"
        )
        self.print_table(
            ["from", "to", "keys"],
            [(f["from"], f["to"], percent(f["fraction"])) for f in change["flows"]],
        )
        self.stdout.write("")
        cost = change["cost"]
        if cost["items"] is None:
            self.stdout.write(
                f"Without migrate_from, {percent(change['moved'])} of the keys miss on their "
                "new server until computed again (no server answered stats: no item count)."
            )
        else:
            self.stdout.write(
                f"Without migrate_from, about {cost['items']} items ({cost['bytes']} bytes) "
                f"miss on their new server until computed again: {percent(change['moved'])} "
                "of the reads, at first."
            )
        self.stdout.write("")
        self.stdout.write("To keep them warm, change the ring in two stages (docs/operations.md):")
        for line in migration_text(change["migration"]):
            self.stdout.write(line)

    def _print_shares(self, servers: list[dict[str, Any]]) -> None:
        self.print_table(
            ["server", "weight", "points", "share", "ideal"],
            [
                (s["node"], s["weight"], s["points"], percent(s["share"]), percent(s["ideal"]))
                for s in servers
            ],
        )


def _cost(
    cluster: Cluster, flows: Mapping[tuple[str, str], float], shares: Mapping[str, float]
) -> dict[str, int | None]:
    """The items and bytes that would move, from each losing server's ``stats``.

    Keys spread evenly over a server's arcs, so a flow of ``f`` of the keyspace
    from a server with share ``s`` carries ``f / s`` of its items.  None when no
    server answers.
    """
    stats = cluster.stats()
    if not stats:
        return {"items": None, "bytes": None}
    items = size = 0.0
    for (source, _), fraction in flows.items():
        found, share = stats.get(source), shares.get(source)
        if found is None or not share:
            continue
        items += int(found.get("curr_items", 0)) * fraction / share
        size += int(found.get("bytes", 0)) * fraction / share
    return {"items": round(items), "bytes": round(size)}


def migration_settings(before: Cluster, after: Cluster) -> dict[str, Any]:
    """``LOCATION`` and ``OPTIONS["migrate_from"]`` of each stage, as a settings file has them."""
    location = [_spec(server) for server in after.servers]
    source = {"LOCATION": [_spec(server) for server in before.servers]}
    if after.options.ketama != "libmemcached" or before.options.ketama != after.options.ketama:
        source["ketama"] = before.options.ketama  # type: ignore[assignment]
    return {
        "LOCATION": location,
        "stage_old": {**source, "reads": "old"},
        "stage_new": {**source, "reads": "new"},
    }


def migration_text(settings: Mapping[str, Any]) -> list[str]:
    return [
        f'  1. every process: "LOCATION": {settings["LOCATION"]!r},',
        f'     "OPTIONS": {{..., "migrate_from": {settings["stage_old"]!r}}}',
        "  2. python manage.py mcpatterns_warm --rate 5000   (copies what moved; optional)",
        f'  3. every process: "migrate_from": {settings["stage_new"]!r}',
        '     (add "until": an ISO 8601 time at least your longest TTL away, to end the reads',
        "     from the old ring by themselves)",
        "  4. once 'until' has passed in every process: remove migrate_from (pattern keys move)",
    ]


def _spec(server: Server) -> str:
    spec = server.node if server.weight == 1 else f"{server.node}:{server.weight}"
    return spec if server.name is None else f"{spec} {server.name}"


def _parse(spec: str, flag: str) -> Server:
    try:
        return parse_server(spec)
    except ConfigurationError as exc:
        raise CommandError(f"{flag} {spec!r}: {exc}") from exc


def _ideal_movement(before: list[RingRow], after: list[RingRow]) -> float:
    """The keys that move between two ideal rings (each server exactly its weight's share).

    The least any assignment can move: half the sum of the share changes.
    """
    old = {row.node: row.ideal for row in before}
    new = {row.node: row.ideal for row in after}
    return sum(abs(new.get(n, 0.0) - old.get(n, 0.0)) for n in old.keys() | new.keys()) / 2
