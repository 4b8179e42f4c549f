"""Instrumentation on real memcached: Prometheus metrics parsed from their text, spans
collected with the OpenTelemetry SDK's in-memory exporter, outcomes of every kind."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import ConfigurationError
from django_mcpatterns.core.observe import BaseSink, RoundTrip, tally
from django_mcpatterns.core.options import ClusterOptions
from tests.conftest import flush
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer
from tests.observing import spans_exporter

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(registry: CollectorRegistry) -> Samples:
    """Every sample of the registry's exposition text, parsed back."""
    text = generate_latest(registry).decode()
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def commands(found: Samples, **labels: str) -> float:
    """The sum of mcpatterns_commands_total over the samples matching ``labels``."""
    wanted = set(labels.items())
    return sum(
        value
        for (name, got), value in found.items()
        if name == "mcpatterns_commands_total" and wanted <= got
    )


def sample(found: Samples, name: str, **labels: str) -> float:
    """The value of one sample, named with all its labels."""
    return found[(name, frozenset(labels.items()))]


def instrumented(servers: list[str], *names: str, **options: Any) -> Cluster:
    return Cluster(servers, ClusterOptions(instrumentation=names, **options))


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def cluster3(memcached_3: list[MemcachedServer], registry: CollectorRegistry) -> Iterator[Cluster]:
    flush(memcached_3)
    cluster = instrumented(
        [s.spec for s in memcached_3],
        "prometheus",
        prometheus_registry=registry,
        instrumentation_name="main",
        # The live servers get time to answer on a busy machine: a timed-out command is
        # counted as a failure, not as the outcome a test counts.  Timeouts are tested on
        # proxies of their own below.
        timeout=30,
        connect_timeout=30,
    )
    yield cluster
    cluster.close()


def test_off_by_default_the_cluster_has_no_observer(memcached_1: list[MemcachedServer]) -> None:
    cluster = Cluster([memcached_1[0].spec])
    assert cluster.observer is None
    assert cluster.set("k", 1) is True  # nothing to report to, nothing breaks


def test_commands_are_counted_per_server_command_and_outcome(
    cluster3: Cluster, registry: CollectorRegistry
) -> None:
    server = cluster3.ring.get_node(b"user:42")
    assert cluster3.get("user:42") is None
    assert cluster3.set("user:42", {"name": "Ada"}) is True
    assert cluster3.get("user:42") == {"name": "Ada"}
    assert cluster3.add("user:42", "other") is False
    assert cluster3.delete("user:42") is True
    assert cluster3.delete("user:42") is False
    assert cluster3.incr("missing-counter") is None

    found = samples(registry)
    ours = {"cache": "main", "server": server}
    assert commands(found, **ours, command="get", outcome="miss") == 1
    assert commands(found, **ours, command="get", outcome="hit") == 1
    assert commands(found, **ours, command="set", outcome="stored") == 1
    assert commands(found, **ours, command="add", outcome="not_stored") == 1
    assert commands(found, **ours, command="delete", outcome="deleted") == 1
    assert commands(found, **ours, command="delete", outcome="not_found") == 1
    assert commands(found, command="incr", outcome="miss") == 1
    # One histogram observation per round trip, labelled without the outcome.
    count = found[
        (
            "mcpatterns_command_seconds_count",
            frozenset({**ours, "command": "get"}.items()),
        )
    ]
    assert count == 2
    # Keys and values never become label values: cardinality stays bounded.
    label_values = {value for _, labels in found for _, value in labels}
    assert not any("user:42" in value or "Ada" in value for value in label_values)


def test_meta_commands_and_batches_have_their_outcomes(
    cluster3: Cluster, registry: CollectorRegistry
) -> None:
    assert cluster3.add_cas("lease", "v") is not None  # ms ... ME c
    assert cluster3.add_cas("lease", "w") is None
    value, token, _ = cluster3.gets_ttl("lease")  # mg v c t f
    assert value == "v"
    assert token is not None
    assert cluster3.delete_cas("lease", token) is True  # md C<cas>
    found = samples(registry)
    assert commands(found, command="ms", outcome="stored") == 1
    assert commands(found, command="ms", outcome="not_stored") == 1
    assert commands(found, command="mg", outcome="hit") == 1
    assert commands(found, command="md", outcome="deleted") == 1


def test_a_multi_key_get_is_one_round_trip_per_server(
    cluster3: Cluster, registry: CollectorRegistry
) -> None:
    keys = [f"key:{i}" for i in range(30)]
    cluster3.set_many(dict.fromkeys(keys, 1))
    assert len(cluster3.get_many(keys)) == 30
    found = samples(registry)
    servers = {cluster3.ring.get_node(k.encode()) for k in keys}
    assert len(servers) == 3
    for server in servers:
        labels = frozenset({"cache": "main", "server": server, "command": "get"}.items())
        assert found[("mcpatterns_command_seconds_count", labels)] == 1
        mine = sum(1 for k in keys if cluster3.ring.get_node(k.encode()) == server)
        assert commands(found, server=server, command="set", outcome="stored") == mine
    assert commands(found, command="get", outcome="hit") == 3


def test_a_write_whose_reply_never_came_is_unknown(
    memcached_1: list[MemcachedServer], registry: CollectorRegistry
) -> None:
    with Proxy(memcached_1[0].port) as proxy:
        cluster = instrumented(
            [proxy.spec], "prometheus", prometheus_registry=registry, timeout=0.3
        )
        assert cluster.set("warm", 1) is True
        proxy.withhold(b"set lost")
        assert cluster.set("lost", 1) is False  # the default view degrades...
        found = samples(registry)
        # ...but the metrics tell it apart from a refused write.
        assert commands(found, command="set", outcome="unknown") == 1
        assert commands(found, command="set", outcome="not_stored") == 0
        up = found[
            ("mcpatterns_server_up", frozenset({"cache": "default", "server": proxy.spec}.items()))
        ]
        assert up == 0  # the timeout counts as a failure of the server


def test_server_up_and_node_events_follow_health(
    memcached_4_fresh: list[MemcachedServer], registry: CollectorRegistry
) -> None:
    server = memcached_4_fresh[0]
    cluster = instrumented(
        [server.spec],
        "prometheus",
        prometheus_registry=registry,
        retry_attempts=1,
        retry_timeout=0.0,
        dead_timeout=0.0,
    )
    up = ("mcpatterns_server_up", frozenset({"cache": "default", "server": server.spec}.items()))
    assert samples(registry)[up] == 1
    assert cluster.set("k", 1) is True
    server.kill()
    assert cluster.get("k") is None
    found = samples(registry)
    assert found[up] == 0
    dead = (
        "mcpatterns_events_total",
        frozenset({"cache": "default", "event": "node_dead"}.items()),
    )
    assert found[dead] == 1
    assert commands(found, command="get", outcome="error") == 1
    server.restart()
    assert cluster.set("k", 2) is True
    found = samples(registry)
    assert found[up] == 1
    revived = (
        "mcpatterns_events_total",
        frozenset({"cache": "default", "event": "node_revived"}.items()),
    )
    assert found[revived] == 1


def test_a_server_in_its_wait_is_counted_unavailable(
    memcached_4_fresh: list[MemcachedServer], registry: CollectorRegistry
) -> None:
    server = memcached_4_fresh[0]
    cluster = instrumented(
        [server.spec], "prometheus", prometheus_registry=registry, retry_timeout=60.0
    )
    server.kill()
    assert cluster.get("a") is None  # fails: the server is now in its retry wait
    assert cluster.get("b") is None  # not sent at all
    found = samples(registry)
    assert commands(found, command="get", outcome="error") == 1
    assert commands(found, command="get", outcome="unavailable") == 1


def test_the_status_page_counts_come_from_the_metrics(cluster3: Cluster) -> None:
    cluster3.set("a", 1)
    cluster3.get("a")
    assert cluster3.observer is not None
    counts = cluster3.observer.counts()
    assert counts is not None
    servers, _ = counts
    row = servers[cluster3.ring.get_node(b"a")]
    assert row["commands"] == 2
    assert row["outcomes"] == {"hit": 1, "stored": 1}
    assert row["seconds"] > 0


def test_without_prometheus_the_process_tally_counts(memcached_1: list[MemcachedServer]) -> None:
    tally.reset()
    cluster = instrumented([memcached_1[0].spec], "opentelemetry", instrumentation_name="t")
    cluster.set("a", 1)
    cluster.get("a")
    cluster.get("b")
    assert tally.servers("t")[memcached_1[0].spec]["outcomes"] == {"hit": 1, "miss": 1, "stored": 1}


# -- configuration -----------------------------------------------------------------


def test_unknown_instrumentation_names_the_valid_ones() -> None:
    with pytest.raises(ConfigurationError, match="'prometheus', 'opentelemetry'") as caught:
        ClusterOptions(instrumentation=("statsd",))
    assert caught.value.option == "instrumentation"


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails as if absent
    with pytest.raises(ConfigurationError, match=r"django-mcpatterns\[prometheus\]"):
        ClusterOptions.from_mapping({"instrumentation": ["prometheus"]})


def test_options_from_a_mapping_take_a_list() -> None:
    options = ClusterOptions.from_mapping({"instrumentation": ["opentelemetry", "prometheus"]})
    assert options.instrumentation == ("opentelemetry", "prometheus")
    hash(options)  # shared clusters are keyed by their options


# -- OpenTelemetry -----------------------------------------------------------------


def test_one_client_span_per_request_with_db_conventions(
    memcached_1: list[MemcachedServer],
) -> None:
    flush(memcached_1)
    server = memcached_1[0]
    cluster = instrumented([server.spec], "opentelemetry")
    with spans_exporter() as exporter:
        cluster.set("user:7", "secret value")
        cluster.get("user:7")
    spans = exporter.get_finished_spans()
    assert [span.name for span in spans] == ["set", "get"]
    get = spans[1]
    assert get.kind.name == "CLIENT"
    attributes = dict(get.attributes or {})
    assert attributes["db.system"] == "memcached"
    assert attributes["db.operation.name"] == "get"
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == server.port
    assert attributes["mcpatterns.outcome"] == "hit"
    everything = repr([dict(span.attributes or {}) for span in spans])
    assert "user:7" not in everything  # keys only when the user opts in
    assert "secret value" not in everything  # values never


def test_keys_are_traced_only_when_asked(memcached_1: list[MemcachedServer]) -> None:
    cluster = instrumented([memcached_1[0].spec], "opentelemetry", trace_keys=True)
    with spans_exporter() as exporter:
        cluster.get_many(["a", "b"])
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes or {})["db.query.text"] in ("get a b", "get b a")


def test_a_failed_request_span_has_error_status(
    memcached_4_fresh: list[MemcachedServer],
) -> None:
    server = memcached_4_fresh[0]
    cluster = instrumented([server.spec], "opentelemetry")
    server.kill()
    with spans_exporter() as exporter:
        assert cluster.get("k") is None
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code.name == "ERROR"
    assert dict(span.attributes or {})["error.type"]


# -- the asyncio twin ----------------------------------------------------------------


def test_the_async_twin_reports_to_the_same_metrics(
    cluster3: Cluster, registry: CollectorRegistry
) -> None:
    twin = cluster3.aio
    keys = [f"async:{i}" for i in range(12)]

    async def work() -> None:
        assert await twin.get("async:0") is None
        assert await twin.set("async:0", "zero") is True
        assert await twin.add("async:0", "again") is False
        # Two tasks read in one loop iteration: one request on the wire, two reads counted.
        assert await asyncio.gather(twin.get("async:0"), twin.get("async:0")) == ["zero"] * 2
        await twin.set_many(dict.fromkeys(keys, 1))
        assert len(await twin.get_many(keys)) == 12
        await twin.close()

    asyncio.run(work())
    found = samples(registry)
    server = cluster3.ring.get_node(b"async:0")
    assert commands(found, server=server, command="get", outcome="miss") == 1
    assert commands(found, server=server, command="get", outcome="hit") >= 2
    assert commands(found, server=server, command="add", outcome="not_stored") == 1
    assert commands(found, command="set", outcome="stored") == 13
    holding = len({cluster3.ring.get_node(k.encode()) for k in keys})  # the ports decide
    assert commands(found, command="get", outcome="hit") == 2 + holding  # get_many: one a server


def test_a_sink_added_later_sees_the_twin_too(memcached_1: list[MemcachedServer]) -> None:
    cluster = Cluster([memcached_1[0].spec])
    twin = cluster.aio
    seen: list[RoundTrip] = []

    class Collect(BaseSink):
        def round_trip(self, trip: RoundTrip) -> None:
            seen.append(trip)

    cluster.observe(Collect())

    async def work() -> None:
        await twin.set("later", 1)
        await twin.get("later")
        await twin.close()

    asyncio.run(work())
    assert [(trip.operation, trip.commands[0][1]) for trip in seen] == [
        ("set", "stored"),
        ("get", "hit"),
    ]
    assert all(trip.nanoseconds > 0 for trip in seen)


def test_no_span_inside_a_trace_that_was_sampled_out(memcached_1: list[MemcachedServer]) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    cluster = instrumented([memcached_1[0].spec], "opentelemetry")
    unsampled = NonRecordingSpan(SpanContext(7, 9, is_remote=True, trace_flags=TraceFlags(0)))
    with spans_exporter() as exporter:
        with trace.use_span(unsampled):
            cluster.set("quiet", 1)  # ParentBased would drop it: not even made
        cluster.get("quiet")  # a root span: the sampler decides (always on here)
    assert [span.name for span in exporter.get_finished_spans()] == ["get"]


@pytest.mark.parametrize("through_the_api", [False, True])
def test_spans_follow_the_request_sampling_however_the_context_is_read(
    memcached_1: list[MemcachedServer], monkeypatch: pytest.MonkeyPatch, through_the_api: bool
) -> None:
    """The sink reads the context's variable directly; another runtime context goes
    through the API, with the same spans."""
    from opentelemetry import context, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    if through_the_api:
        monkeypatch.setattr(
            "django_mcpatterns.core.observe.traces._readers",
            lambda: (context.get_current, None),
        )
    cluster = instrumented([memcached_1[0].spec], "opentelemetry")
    flags = {"in": TraceFlags(TraceFlags.SAMPLED), "out": TraceFlags(0)}
    sampled_in = NonRecordingSpan(SpanContext(7, 9, is_remote=True, trace_flags=flags["in"]))
    sampled_out = NonRecordingSpan(SpanContext(8, 9, is_remote=True, trace_flags=flags["out"]))
    with spans_exporter() as exporter:
        with trace.use_span(sampled_out):
            cluster.set("quiet", 1)
        with trace.use_span(sampled_in):
            cluster.get("quiet")  # a child of the request's span
        cluster.get("quiet")  # a root span
    made = [
        (span.name, span.context.trace_id == 7, span.parent and span.parent.span_id)
        for span in exporter.get_finished_spans()
    ]
    assert made == [("get", True, 9), ("get", False, None)]


def test_a_failing_sink_is_logged_and_never_breaks_the_command(
    memcached_1: list[MemcachedServer], caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(BaseSink):
        def round_trip(self, trip: RoundTrip) -> None:
            raise RuntimeError("dashboard down")

    cluster = Cluster([memcached_1[0].spec])
    cluster.observe(Broken())
    assert cluster.set("still", "works") is True
    assert cluster.get("still") == "works"
    assert "instrumentation sink" in caplog.text


@pytest.mark.parametrize(
    ("option", "value"),
    [("instrumentation", "prometheus"), ("instrumentation_name", ""), ("trace_keys", "yes")],
)
def test_invalid_instrumentation_options_are_named(option: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=option) as caught:
        ClusterOptions.from_mapping({option: value})
    assert caught.value.option == option


def test_batches_of_every_size_and_outcome_keep_the_sink_bounded(
    memcached_1: list[MemcachedServer], registry: CollectorRegistry
) -> None:
    """A long-running process sends delete_many of many sizes, each key hit or missed:
    the sink's memory follows the series (server, command, outcome), not the batches."""
    from django_mcpatterns.core.observe.metrics import PrometheusSink

    flush(memcached_1)
    cluster = instrumented([memcached_1[0].spec], "prometheus", prometheus_registry=registry)
    keys = [f"batch:{j}" for j in range(10)]
    for i in range(64):  # every pattern of present keys: 64 different replies
        cluster.set_many({k: 1 for j, k in enumerate(keys[:6]) if i >> j & 1})
        cluster.delete_many(keys[: 6 + i % 4])
    found = samples(registry)
    assert commands(found, command="delete") == sum(6 + i % 4 for i in range(64))
    (sink,) = [s for s in cluster.observer.sinks if isinstance(s, PrometheusSink)]  # type: ignore[union-attr]
    assert len(sink._children) <= 8  # was one entry per distinct batch: 70 here


@pytest.mark.parametrize(
    ("protocol", "write", "read"), [("text", "set", "get"), ("meta", "set", "get")]
)
def test_async_requests_cancelled_by_a_deadline_are_still_counted_and_timed(
    memcached_1: list[MemcachedServer],
    registry: CollectorRegistry,
    protocol: str,
    write: str,
    read: str,
) -> None:
    """asyncio.timeout() around a call is how async code bounds a stall: the round trips it
    cuts short are the slowest ones, and must show in the counts and the latency histogram
    (the write as unknown: it was sent), as the sync transport's own timeout does."""
    with Proxy(memcached_1[0].port) as proxy:
        cluster = instrumented(
            [proxy.spec], "prometheus", prometheus_registry=registry, protocol=protocol, timeout=30
        )
        twin = cluster.aio

        async def work() -> None:
            assert await twin.set("warm", 1) is True
            proxy.withhold(f"{write} lost".encode())
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await twin.set("lost", 1)
            await twin.close()
            proxy.withhold(b"get cut")  # the text get of a batch, any protocol
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await twin.get_many(["cut", "cut2"])
            await twin.close()

        asyncio.run(work())
        found = samples(registry)
        assert commands(found, command=write, outcome="unknown") == 1
        assert commands(found, command=read, outcome="cancelled") == 1
        timed = sample(
            found,
            "mcpatterns_command_seconds_count",
            cache="default",
            server=proxy.spec,
            command=write,
        )
        assert timed == 2  # the warm write and the cut one


def test_async_multi_key_round_trips_are_timed_per_server(
    memcached_4_fresh: list[MemcachedServer], registry: CollectorRegistry
) -> None:
    """get_many over a stalled server and a quick one: the quick one's round trip is not
    charged the stalled one's wait (the per-server p99 is how an operator finds the slow one).

    The stalled server resumes only once the quick one's reply has been read, so the quick
    one's time is less than the stalled one's unless it was charged the wait."""
    slow = memcached_4_fresh[0]
    with Proxy(memcached_4_fresh[1].port) as quick:
        cluster = instrumented(
            [slow.spec, quick.spec], "prometheus", prometheus_registry=registry, timeout=5
        )
        keys = [f"spread:{i}" for i in range(20)]
        keys.sort(key=lambda k: cluster.ring.get_node(k.encode()) != slow.spec)  # slow's first
        assert {cluster.ring.get_node(k.encode()) for k in keys} == {slow.spec, quick.spec}
        cluster.set_many(dict.fromkeys(keys, 1))
        twin = cluster.aio

        def timed(server: str, what: str) -> float:
            labels = {"cache": "default", "server": server, "command": "get"}
            return sample(samples(registry), f"mcpatterns_command_seconds_{what}", **labels)

        async def work() -> dict[str, float]:
            await twin.get_many(keys)  # connections open before the stall
            before = {server: timed(server, "sum") for server in (slow.spec, quick.spec)}
            answered = len(b"".join(quick.received()))
            slow.pause()
            try:
                reading = asyncio.ensure_future(twin.get_many(keys))
                while len(b"".join(quick.received())) == answered:  # the quick one replied
                    await asyncio.sleep(0.005)
                for _ in range(10):  # the loop reads it: its socket is readable from now on
                    await asyncio.sleep(0)
            finally:
                slow.resume()
            assert len(await reading) == 20
            await twin.close()
            return {server: timed(server, "sum") - before[server] for server in before}

        took = asyncio.run(work())
        assert timed(slow.spec, "count") == timed(quick.spec, "count") == 2
        assert took[quick.spec] < took[slow.spec]


def test_an_async_write_the_failing_channel_never_sent_is_not_unknown(
    memcached_1: list[MemcachedServer], registry: CollectorRegistry
) -> None:
    """A write still queued when its connection fails was certainly not applied
    (NotSentError): an error, as the cluster itself judges it, not an unknown outcome."""
    from django_mcpatterns.core.transport import ConnectionClosedError

    cluster = instrumented([memcached_1[0].spec], "prometheus", prometheus_registry=registry)
    twin = cluster.aio

    async def work() -> None:
        assert await twin.set("warm", 1) is True
        (node,) = twin._nodes.values()
        channel = node.links.current(asyncio.get_running_loop())
        assert channel is not None
        queued = asyncio.ensure_future(twin.set("queued", 1))
        await asyncio.sleep(0)  # the write is queued, not yet written: the flush comes next
        channel.fail(ConnectionClosedError("the connection dropped"))
        assert await queued is False  # degraded, as any failure
        await twin.close()

    asyncio.run(work())
    found = samples(registry)
    assert commands(found, command="set", outcome="unknown") == 0
    assert commands(found, command="set", outcome="error") == 1


def test_replicated_writes_are_counted_on_every_replica_sync_and_async(
    cluster3: Cluster, memcached_3: list[MemcachedServer], registry: CollectorRegistry
) -> None:
    """OPTIONS["replicate"]: a hot key's write goes to all its replicas in one parallel round
    trip; each server's command is counted, by the sync cluster as by its asyncio twin."""
    specs = [s.spec for s in memcached_3]
    cluster = instrumented(specs, "prometheus", prometheus_registry=registry, replicate={"hot:": 3})
    assert cluster.set("hot:a", 1) is True
    assert cluster.delete("hot:a") is True

    async def work() -> None:
        assert await cluster.aio.set("hot:b", 1) is True
        await cluster.aio.close()

    asyncio.run(work())
    found = samples(registry)
    for spec in specs:
        assert commands(found, server=spec, command="set", outcome="stored") == 2, spec
        assert commands(found, server=spec, command="delete", outcome="deleted") == 1, spec


def test_the_counted_round_trip_metrics_expose_what_prometheus_clients_own_do() -> None:
    """One process counts round trips in plain numbers (cheaper); the exposition is the
    one prometheus_client's Counter and Histogram give (its multiprocess mode uses them)."""
    from django_mcpatterns.core.observe.metrics import BUCKETS
    from django_mcpatterns.core.observe.trips import Counted, Shared

    texts = []
    for kind in (Counted, Shared):
        registry = CollectorRegistry()
        trips = kind(registry, BUCKETS)
        hit = trips.children("c", "s1", "get", (("get", "hit", 1),))
        miss = trips.children("c", "s1", "get", (("get", "miss", 1),))
        batch = trips.children("c", "s2", "ms+gets", (("ms", "stored", 3), ("gets", "hit", 2)))
        for nanoseconds in (30_000, 100_000, 100_001, 250_000, 3_000_000_000, 0):
            trips.record(hit, nanoseconds)
        trips.record(miss, 5_000)
        trips.record(batch, 777_777)
        lines = generate_latest(registry).decode().splitlines()
        texts.append(sorted(line for line in lines if "_created" not in line))
    assert texts[0] == texts[1]
    assert (
        'mcpatterns_command_seconds_bucket{cache="c",command="get",le="0.0001",server="s1"} 3.0'
        in texts[0]
    )
