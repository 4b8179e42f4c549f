"""The observer's hot path (one command, a reply): series counted through hooks made once,
records made only for the sinks that take them and are not quiet, counts exact however
many threads count and whenever they are read."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.observe import BaseSink, Observer, RoundTrip, Tally
from django_mcpatterns.core.observe.metrics import BUCKETS
from django_mcpatterns.core.observe.records import FOLD_AT
from django_mcpatterns.core.observe.trips import Counted, Shared
from django_mcpatterns.core.protocol.wire import Get
from tests.harness import MemcachedServer

TIMES = (30_000, 100_000, 100_001, 250_000, 3_000_000_000, 0, 5_000, 99_999_999)


def exposition(registry: CollectorRegistry) -> list[str]:
    lines = generate_latest(registry).decode().splitlines()
    return sorted(line for line in lines if "_created" not in line)


@pytest.mark.parametrize("kind", [Counted, Shared])
def test_a_series_counter_exposes_what_the_records_do(kind: type[Counted | Shared]) -> None:
    """Counted through a series' counter (more than FOLD_AT of them, folded on the way and
    on the scrape) or round trip by round trip: the same text, for both kinds."""
    texts = []
    for through_counter in (True, False):
        registry = CollectorRegistry()
        trips = kind(registry, BUCKETS)
        if through_counter:
            hit, miss = (
                trips.counter("c", "s1", "get", "hit"),
                trips.counter("c", "s1", "get", "miss"),
            )
            for i in range(FOLD_AT * 2 + 5):
                hit(TIMES[i % len(TIMES)])
            miss(5_000)
        else:
            hits = trips.children("c", "s1", "get", (("get", "hit", 1),))
            misses = trips.children("c", "s1", "get", (("get", "miss", 1),))
            for i in range(FOLD_AT * 2 + 5):
                trips.record(hits, TIMES[i % len(TIMES)])
            trips.record(misses, 5_000)
        texts.append(exposition(registry))
    counted, recorded = texts
    # The sum of seconds: added in another order (exact nanoseconds, then seconds).
    assert [line for line in counted if "_sum" not in line] == [
        line for line in recorded if "_sum" not in line
    ]
    total = [float(line.rsplit(" ", 1)[1]) for line in counted if "_sum" in line]
    expected = [float(line.rsplit(" ", 1)[1]) for line in recorded if "_sum" in line]
    assert total == pytest.approx(expected, rel=1e-12)
    assert 'mcpatterns_commands_total{cache="c",command="get",outcome="hit",server="s1"} 517.0' in (
        counted
    )


def test_threads_counting_one_series_lose_nothing() -> None:
    """The hot path appends without a lock; a fold under the lock takes only what it saw."""
    registry = CollectorRegistry()
    trips = Counted(registry, BUCKETS)
    count = trips.counter("c", "s1", "get", "hit")
    start = threading.Barrier(4)

    def work() -> None:
        start.wait()
        for _ in range(5_000):
            count(1_000)

    threads = [threading.Thread(target=work) for _ in range(4)]
    scrapes = 0
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        exposition(registry)  # folds while they append
        scrapes += 1
    for thread in threads:
        thread.join()
    text = exposition(registry)
    assert (
        'mcpatterns_commands_total{cache="c",command="get",outcome="hit",server="s1"} 20000.0'
        in (text)
    )
    assert (
        'mcpatterns_command_seconds_bucket{cache="c",command="get",le="0.0001",server="s1"} 20000.0'
        in text
    )


def test_the_tally_counts_through_series_and_reset_empties_them() -> None:
    tally = Tally()
    hit, miss = tally.series("c", "s1", "get", "hit"), tally.series("c", "s1", "get", "miss")
    for _ in range(FOLD_AT + 1):
        hit(1_000)
    miss(2_000)
    assert tally.servers("c") == {
        "s1": {
            "commands": FOLD_AT + 2,
            "seconds": (FOLD_AT + 1) * 1e-6 + 2e-6,
            "outcomes": {
                "hit": FOLD_AT + 1,
                "miss": 1,
            },
        }
    }
    tally.reset()
    assert tally.servers("c") == {}
    hit(1_000)  # the hooks made before the reset still count
    assert tally.servers("c")["s1"]["outcomes"] == {"hit": 1}


class Collect(BaseSink):
    def __init__(self, quiet: bool | None = None) -> None:
        self.trips: list[RoundTrip] = []
        if quiet is not None:
            self.quiet = lambda: quiet

    def round_trip(self, trip: RoundTrip) -> None:
        self.trips.append(trip)


class Series(BaseSink):
    def __init__(self) -> None:
        self.asked: list[tuple[str, ...]] = []
        self.counted: list[tuple[tuple[str, ...], int]] = []
        self.trips: list[RoundTrip] = []

    def series(self, cache: str, server: str, command: str, result: str) -> Any:
        key = (cache, server, command, result)
        self.asked.append(key)
        return lambda nanoseconds: self.counted.append((key, nanoseconds))

    def round_trip(self, trip: RoundTrip) -> None:
        self.trips.append(trip)


def test_hooks_are_made_once_per_series_and_records_only_for_who_wants_them() -> None:
    series, whole, quiet = Series(), Collect(), Collect(quiet=True)
    observer = Observer("c", ["s1"], [series, whole, quiet])
    hit, miss = Get(keys=[b"k"]), Get(keys=[b"k"], cas=True)
    for _ in range(3):
        observer.request("s1", hit, [object()], 1)
    observer.request("s1", miss, [], 1)
    observer.request("s1", (hit, miss), [[object()], []], 1)  # a batch: a record for every sink
    assert series.asked == [("c", "s1", "get", "hit"), ("c", "s1", "gets", "miss")]
    assert [key for key, _ in series.counted] == [("c", "s1", "get", "hit")] * 3 + [
        ("c", "s1", "gets", "miss")
    ]
    assert all(nanoseconds > 0 for _, nanoseconds in series.counted)
    assert [trip.operation for trip in whole.trips] == ["get"] * 3 + ["gets", "get+gets"]
    assert [trip.commands for trip in whole.trips][3:] == [
        (("gets", "miss"),),
        (("get", "hit"), ("gets", "miss")),
    ]
    assert [trip.operation for trip in series.trips] == ["get+gets"]
    assert [trip.operation for trip in quiet.trips] == ["get+gets"]  # quiet: asked per request


def test_a_failing_hook_is_logged_and_the_other_sinks_still_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(Series):
        def series(self, cache: str, server: str, command: str, result: str) -> Any:
            def fail(nanoseconds: int) -> None:
                raise RuntimeError("dashboard down")

            return fail

    whole = Collect()
    observer = Observer("c", ["s1"], [Broken(), whole])
    observer.request("s1", Get(keys=[b"k"]), [], 1)
    assert [trip.commands for trip in whole.trips] == [(("get", "miss"),)]
    assert "instrumentation sink" in caplog.text


def test_a_sink_added_later_gets_the_hot_path_too(memcached_1: list[MemcachedServer]) -> None:
    cluster = Cluster([memcached_1[0].spec])
    first = Series()
    cluster.observe(first)
    cluster.set("later", 1)
    cluster.get("later")
    second = Series()
    cluster.observe(second)
    cluster.get("later")
    counted = [key[2:] for key, _ in first.counted]
    assert counted[1:] == [("get", "hit"), ("get", "hit")]
    assert counted[0][1] == "stored"
    assert [key[2:] for key, _ in second.counted] == [("get", "hit")]
    assert first.asked[1] == second.asked[0]  # one hook per sink and series


def test_a_span_under_a_sampled_request_has_the_attributes_of_a_root_span(
    memcached_1: list[MemcachedServer],
) -> None:
    """Under a request's span every attribute is given when the span starts; a root span
    gives the sampler where it goes and the rest once it is recorded: the same span."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    from django_mcpatterns.core.options import ClusterOptions
    from tests.observing import spans_exporter

    cluster = Cluster(
        [memcached_1[0].spec], ClusterOptions(instrumentation=("opentelemetry",), trace_keys=True)
    )
    request = NonRecordingSpan(SpanContext(7, 9, is_remote=True, trace_flags=TraceFlags(1)))
    with spans_exporter() as exporter:
        cluster.set("k", 1)
        with trace.use_span(request):
            cluster.get("k")
            cluster.get_many(["k", "absent"])
        cluster.get("k")
        cluster.get_many(["k", "absent"])
    spans = exporter.get_finished_spans()
    assert [(span.name, span.parent is not None) for span in spans] == [
        ("set", False),
        ("get", True),
        ("get", True),
        ("get", False),
        ("get", False),
    ]
    attributes = [dict(span.attributes or {}) for span in spans]
    assert attributes[1] == attributes[3]
    assert attributes[2] == attributes[4]
    assert attributes[1]["mcpatterns.outcome"] == "hit"
    assert attributes[1]["db.query.text"] == "get k"
    assert attributes[1]["server.port"] == memcached_1[0].port
