"""Prometheus metrics of the clusters (``OPTIONS["instrumentation"] = ["prometheus"]``).

=========================================== ========= ==================================
metric                                      type      labels
=========================================== ========= ==================================
``mcpatterns_commands_total``               counter   cache, server, command, outcome
``mcpatterns_command_seconds``              histogram cache, server, command
``mcpatterns_server_up``                    gauge     cache, server (1 alive, 0 failing)
``mcpatterns_events_total``                 counter   cache, event
``mcpatterns_near_lookups_total``           counter   cache, result (``hit``, ``miss``)
``mcpatterns_near_round_trips_saved_total`` counter   cache
``mcpatterns_near_evictions_total``         counter   cache
``mcpatterns_near_revalidations_total``     counter   cache
``mcpatterns_near_refreshes_total``         counter   cache
``mcpatterns_near_bytes``                   gauge     cache (summed over live workers)
``mcpatterns_near_entries``                 gauge     cache (summed over live workers)
=========================================== ========= ==================================

The near cache's series (``OPTIONS["near_cache"]``) are brought up to date at
most once a second, on a read that memcached answers: a hit costs nothing here.

Label values come from closed sets (server names of the configuration,
command names, :data:`~django_mcpatterns.core.observe.OUTCOMES`, event names): never a key, so the
number of series stays bounded.  A histogram's ``command`` is the round
trip's operation (``get``, or ``ms+gets`` for a pipelined batch).

The metrics live in prometheus_client's default registry, or in the one given
as ``OPTIONS["prometheus_registry"]``; each registry gets them once, whatever
the number of caches.  Under prometheus_client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``, gunicorn) every worker writes its own files and
the exporter sums them; the gauge keeps the lowest value of the live workers.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import Counter as Occurrences
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from .records import BaseSink, RoundTrip
from .trips import Counted, Shared

__all__ = ["BUCKETS", "PrometheusSink"]

# memcached answers in tens of microseconds on a LAN; the default buckets start at 5 ms.
BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class _Families:
    """The four metric families, registered once in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # One process: plain counts collected on a scrape; multiprocess mode: its files.
        shared = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.trips: Counted | Shared = (Shared if shared else Counted)(registry, BUCKETS)
        self.server_up = Gauge(
            "mcpatterns_server_up",
            "1 while the memcached server answers, 0 while it is failing or dead",
            ("cache", "server"),
            multiprocess_mode="livemin",
            registry=registry,
        )
        self.events = Counter(
            "mcpatterns_events",
            "Pattern and server events (the django-mcpatterns signals), by name",
            ("cache", "event"),
            registry=registry,
        )
        self.near_lookups = Counter(
            "mcpatterns_near_lookups",
            "Reads the near cache looked up, by result (hit: served from process memory)",
            ("cache", "result"),
            registry=registry,
        )
        self.near_saved = Counter(
            "mcpatterns_near_round_trips_saved",
            "Calls the near cache answered without a round trip to memcached",
            ("cache",),
            registry=registry,
        )
        self.near_evictions = Counter(
            "mcpatterns_near_evictions",
            "Entries the near cache evicted to stay under max_bytes",
            ("cache",),
            registry=registry,
        )
        self.near_revalidations = Counter(
            "mcpatterns_near_revalidations",
            "Large values the near cache kept after checking their cas (no value sent)",
            ("cache",),
            registry=registry,
        )
        self.near_refreshes = Counter(
            "mcpatterns_near_refreshes",
            "Hot values the near cache renewed ahead, in the request of a miss to their server",
            ("cache",),
            registry=registry,
        )
        self.near_bytes = Gauge(
            "mcpatterns_near_bytes",
            "Bytes the near cache holds (values, keys and entries)",
            ("cache",),
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.near_entries = Gauge(
            "mcpatterns_near_entries",
            "Entries the near cache holds",
            ("cache",),
            multiprocess_mode="livesum",
            registry=registry,
        )


_families: dict[int, tuple[CollectorRegistry, _Families]] = {}
_families_lock = threading.Lock()


def _families_of(registry: CollectorRegistry) -> _Families:
    with _families_lock:
        held = _families.get(id(registry))
        if held is None or held[0] is not registry:
            held = _families[id(registry)] = (registry, _Families(registry))
        return held[1]


# Every sink of the process, to re-set its gauges in a forked child (see _restore).
_sinks: weakref.WeakValueDictionary[int, PrometheusSink] = weakref.WeakValueDictionary()


def _after_fork() -> None:
    for sink in list(_sinks.values()):
        sink._forked = True


os.register_at_fork(after_in_child=_after_fork)


class PrometheusSink(BaseSink):
    """Counts round trips, times them and follows server health in Prometheus metrics.

    The children a single-command round trip moves are remembered per cache,
    server and commands with their outcomes: a get costs one dict lookup and
    one record (:mod:`.trips`: plain counts under one lock in one process).  It
    also answers the status page's per-server counts (:meth:`servers`), read
    back from the metrics.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else REGISTRY
        self._families = _families_of(self.registry)
        self._children: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}
        self._up: dict[tuple[str, str], int] = {}  # the server_up values this process set
        self._near: dict[str, tuple[int, ...]] = {}  # the near counts sent, per cache
        self._forked = False
        _sinks[id(self)] = self

    def _restore(self) -> None:
        """In a forked child: set the server_up gauges again.

        In multiprocess mode prometheus_client gives a forked child files of
        its own and resets every value to 0 on first use: the ``livemin``
        gauge would say every server is down while the worker lives.
        """
        self._forked = False
        for (cache, server), up in list(self._up.items()):
            self._families.server_up.labels(cache, server).set(up)

    def round_trip(self, trip: RoundTrip) -> None:
        if self._forked:
            self._restore()
        cache, server, operation, commands, nanoseconds, _, _ = trip
        trips = self._families.trips
        if len(commands) == 1:  # the hot path: remembered (a closed set of series)
            key = (cache, server, commands)
            children = self._children.get(key)
            if children is None:
                ((command, result),) = commands
                children = trips.children(cache, server, operation, ((command, result, 1),))
                self._children[key] = children
        else:  # a batch: not remembered, its outcomes make too many combinations to keep
            counted = [(c, o, n) for (c, o), n in Occurrences(commands).items()]
            children = trips.children(cache, server, operation, counted)
        trips.record(children, nanoseconds)

    def series(self, cache: str, server: str, command: str, result: str) -> Callable[[int], None]:
        """What counts one command of this series with its round trip's nanoseconds
        (the observer asks once per series, and again in a forked child)."""
        if self._forked:
            self._restore()
        return self._families.trips.counter(cache, server, command, result)

    def event(self, cache: str, name: str) -> None:
        if self._forked:
            self._restore()
        self._families.events.labels(cache, name).inc()

    def server_state(self, cache: str, server: str, up: bool) -> None:
        self._up[(cache, server)] = 1 if up else 0
        if self._forked:
            self._restore()
        self._families.server_up.labels(cache, server).set(1 if up else 0)

    def near(self, cache: str, stats: Any) -> None:
        """Bring the near cache's series up to date with its counts so far."""
        if self._forked:
            self._restore()
        counts: tuple[int, ...] = (
            stats.hits,
            stats.misses,
            stats.round_trips_saved,
            stats.evictions,
            stats.revalidated,
            stats.refreshed,
        )
        last = self._near.get(cache, (0,) * len(counts))
        if any(now < before for now, before in zip(counts, last, strict=True)):
            last = (0,) * len(counts)  # a new table (a forked child): counted from 0
        self._near[cache] = counts
        hits, misses, saved, evictions, revalidated, refreshed = (
            now - before for now, before in zip(counts, last, strict=True)
        )
        families = self._families
        for counter, amount in (
            (families.near_lookups.labels(cache, "hit"), hits),
            (families.near_lookups.labels(cache, "miss"), misses),
            (families.near_saved.labels(cache), saved),
            (families.near_evictions.labels(cache), evictions),
            (families.near_revalidations.labels(cache), revalidated),
            (families.near_refreshes.labels(cache), refreshed),
        ):
            if amount:
                counter.inc(amount)
        families.near_bytes.labels(cache).set(stats.bytes)
        families.near_entries.labels(cache).set(stats.entries)

    def servers(self, cache: str) -> dict[str, dict[str, Any]]:
        """This process's counts of one cache, as
        :meth:`django_mcpatterns.core.observe.Tally.servers` gives them."""
        if self._forked:
            self._restore()
        rows: dict[str, dict[str, Any]] = {}
        trips = list(self._families.trips.collect())
        for family in trips[:1]:  # mcpatterns_commands
            for sample in family.samples:
                labels = sample.labels
                if not sample.name.endswith("_total") or labels["cache"] != cache:
                    continue
                row = rows.setdefault(
                    labels["server"], {"commands": 0, "seconds": 0.0, "outcomes": {}}
                )
                row["commands"] += int(sample.value)
                outcomes = row["outcomes"]
                outcomes[labels["outcome"]] = outcomes.get(labels["outcome"], 0) + int(sample.value)
        for family in trips[1:]:  # mcpatterns_command_seconds
            for sample in family.samples:
                labels = sample.labels
                summed = sample.name.endswith("_sum") and labels["cache"] == cache
                if summed and labels["server"] in rows:
                    rows[labels["server"]]["seconds"] += sample.value
        return {server: rows[server] for server in sorted(rows)}

    def events(self, cache: str) -> dict[str, int]:
        """This process's events of one cache, by name."""
        if self._forked:
            self._restore()
        found = {
            sample.labels["event"]: int(sample.value)
            for family in self._families.events.collect()
            for sample in family.samples
            if sample.name.endswith("_total") and sample.labels["cache"] == cache
        }
        return dict(sorted(found.items()))

    def __eq__(self, other: object) -> bool:
        # One sink per registry in an observer: adding it twice is harmless.
        return isinstance(other, PrometheusSink) and other.registry is self.registry

    def __hash__(self) -> int:
        return id(self.registry)
