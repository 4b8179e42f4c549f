"""Failover: health timing with a fake clock, then drills on real memcached processes."""

from __future__ import annotations

import itertools
import logging
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from pymemcache.client.base import Client
from pymemcache.serde import pickle_serde

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import NodeUnavailableError
from django_mcpatterns.core.health import Admission, HealthSnapshot, NodeEvent, NodeHealth
from django_mcpatterns.core.options import ClusterOptions
from tests.core.test_cluster import SocketSpy, _closed_port
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, start_memcached, stop_all


def make_health(
    clock: FakeClock,
    events: list[NodeEvent],
    attempts: int = 2,
    rng: Callable[[], float] = lambda: 0.0,  # 0: no jitter, every wait is its full step
) -> NodeHealth:
    return NodeHealth(
        "n1",
        retry_attempts=attempts,
        retry_timeout=1.0,
        dead_timeout=10.0,
        clock=clock,
        report=events.append,
        rng=rng,
    )


def probe_after(clock: FakeClock, health: NodeHealth, wait: float) -> Admission:
    """Check that ``health`` refuses until ``wait`` seconds have passed, then return the probe."""
    clock.advance(wait - 0.01)
    assert health.admit() is None
    clock.advance(0.02)
    admission = health.admit()
    assert admission is not None
    assert admission.probe
    return admission


# -- NodeHealth: the timing rules, with a fake clock -------------------------------


def test_a_failure_pauses_the_node_for_retry_timeout_then_one_probe() -> None:
    clock, events = FakeClock(), list[NodeEvent]()
    health = make_health(clock, events)
    admission = health.admit()
    assert admission == Admission(0, probe=False)
    health.failed(OSError("refused"), admission)
    assert health.admit() is None
    probe_after(clock, health, 1.0)
    assert health.admit() is None  # only one prober at a time
    health.succeeded()
    assert health.admit() == Admission(1, probe=False)
    assert [e.kind for e in events] == ["failure"]  # it never died, so no "revived"


def test_requests_in_flight_when_a_server_stalls_count_one_failure() -> None:
    """Eight requests wait on a server that stops answering: one stall, one failure."""
    clock, events = FakeClock(), list[NodeEvent]()
    health = make_health(clock, events)
    in_flight = [health.admit() for _ in range(8)]
    for admission in in_flight:
        assert admission is not None
        clock.advance(0.001)  # their timeouts expire one after the other
        health.failed(TimeoutError("timed out"), admission)
    snapshot = health.snapshot()
    assert snapshot.state == "failing"  # not dead: retry_attempts is 2
    assert snapshot.failures == 1
    assert snapshot.retry_in == pytest.approx(1.0 - 0.007)  # the wait began at the first one
    assert [e.kind for e in events] == ["failure"]
    probe_after(clock, health, 1.0 - 0.007)


def test_a_late_answer_ends_the_wait_and_late_failures_still_count_nothing() -> None:
    clock, events = FakeClock(), list[NodeEvent]()
    health = make_health(clock, events)
    early, late = health.admit(), health.admit()
    assert early is not None
    assert late is not None
    health.failed(TimeoutError("timed out"), early)
    assert health.admit() is None
    clock.advance(0.5)
    health.succeeded()  # a reply to a request sent before the failure: the server answers
    assert health.admit() == Admission(1)
    health.failed(TimeoutError("timed out"), late)  # from before the failure: already counted
    assert health.snapshot().state == "up"
    assert [e.kind for e in events] == ["failure"]


def test_retry_attempts_counts_consecutive_failed_probes() -> None:
    clock, events = FakeClock(), list[NodeEvent]()
    health = make_health(clock, events, attempts=3)
    first = health.admit()
    assert first is not None
    health.failed(OSError("refused"), first)
    stale = Admission(0)  # a request admitted before that failure, failing late
    probe = probe_after(clock, health, 1.0)
    health.failed(OSError("refused"), stale)  # part of the first failure: no count, probe stays
    assert health.snapshot().failures == 1
    assert health.admit() is None
    health.failed(OSError("still refused"), probe)
    assert health.snapshot().failures == 2
    assert health.snapshot().state == "failing"
    probe = probe_after(clock, health, 1.0)
    health.failed(OSError("still refused"), probe)
    assert health.snapshot().state == "dead"
    assert [e.kind for e in events] == ["failure", "failure", "failure", "dead"]


def test_a_dead_server_is_probed_with_a_back_off_growing_to_dead_timeout() -> None:
    clock, events = FakeClock(), list[NodeEvent]()
    health = make_health(clock, events)  # retry_timeout 1, dead_timeout 10, no jitter
    admission = health.admit()
    assert admission is not None
    health.failed(OSError("refused"), admission)
    waits = [1.0, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]  # failing, then dead: doubling, capped
    for wait, following in itertools.pairwise(waits):
        probe = probe_after(clock, health, wait)
        health.failed(OSError("still refused"), probe)
        assert health.snapshot().retry_in == pytest.approx(following)
    assert [e.kind for e in events].count("dead") == 1
    probe = probe_after(clock, health, 10.0)
    health.succeeded()
    assert events[-1] == NodeEvent("n1", "revived")
    assert health.snapshot() == HealthSnapshot("n1", "up", 0, 0.0, "OSError: still refused")
    # The next outage starts over from retry_timeout.
    admission = health.admit()
    assert admission is not None
    health.failed(OSError("refused"), admission)
    probe = probe_after(clock, health, 1.0)
    health.failed(OSError("refused"), probe)
    assert health.snapshot().retry_in == pytest.approx(1.0)


def test_a_dead_servers_waits_are_jittered_by_the_injected_rng() -> None:
    clock, events = FakeClock(), list[NodeEvent]()
    draws = iter([0.5, 1.0])
    health = make_health(clock, events, attempts=1, rng=lambda: next(draws))
    admission = health.admit()
    assert admission is not None
    health.failed(OSError("refused"), admission)  # dead at once: a wait of 1 s, shortened
    assert health.snapshot().retry_in == pytest.approx(1.0 * (1 - 0.25 * 0.5))
    probe = probe_after(clock, health, 0.875)
    health.failed(OSError("refused"), probe)
    assert health.snapshot().retry_in == pytest.approx(2.0 * (1 - 0.25 * 1.0))


def test_a_probe_ended_without_a_verdict_lets_the_next_one_through() -> None:
    clock, events = FakeClock(), list[NodeEvent]()
    health = make_health(clock, events, attempts=5)
    admission = health.admit()
    assert admission is not None
    health.failed(OSError("a"), admission)
    probe_after(clock, health, 1.0)
    clock.advance(1.5)
    assert health.admit() is None  # the probe is still out
    health.released()  # the probe ended without a verdict
    assert health.admit() == Admission(1, probe=True)


def test_snapshot_reports_state_and_wait() -> None:
    clock, events = FakeClock(), list[NodeEvent]()
    health = make_health(clock, events)
    assert health.snapshot().state == "up"
    admission = health.admit()
    assert admission is not None
    health.failed(TimeoutError("timed out"), admission)
    snapshot = health.snapshot()
    assert snapshot.state == "failing"
    assert snapshot.retry_in == pytest.approx(1.0)
    assert snapshot.last_error == "TimeoutError: timed out"
    probe = probe_after(clock, health, 1.0)
    health.failed(TimeoutError("timed out"), probe)
    assert health.snapshot().state == "dead"
    assert health.snapshot().retry_in == pytest.approx(1.0)  # the back-off starts at retry_timeout


# -- Cluster failover logic, fake clock, a port that refuses connections -----------


def make_cluster(
    live: MemcachedServer, dead_port: int, clock: FakeClock, spy: SocketSpy, **options: Any
) -> tuple[Cluster, list[NodeEvent]]:
    events: list[NodeEvent] = []
    opts = ClusterOptions(
        retry_timeout=1.0, dead_timeout=10.0, client_options={"socket_module": spy}, **options
    )
    cluster = Cluster(
        [live.spec, f"127.0.0.1:{dead_port}"],
        opts,
        clock=clock,
        rng=lambda: 0.0,  # no jitter: a dead server's waits are 1, 2, 4, 8, 10, 10... s
        on_node_event=events.append,
    )
    return cluster, events


def keys_on(cluster: Cluster, node: str, count: int = 5, prefix: str = "k") -> list[str]:
    keys = (f"{prefix}{i}" for i in range(10_000))
    return [k for k in keys if cluster.ring.get_node(k) == node][:count]


def test_default_policy_misses_then_fails_fast_then_revives(
    memcached_1: list[MemcachedServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="django_mcpatterns.cluster")
    clock, spy, port = FakeClock(), SocketSpy(), _closed_port()
    cluster, events = make_cluster(memcached_1[0], port, clock, spy)
    dead = f"127.0.0.1:{port}"
    dead_keys, live_keys = keys_on(cluster, dead), keys_on(cluster, memcached_1[0].spec)

    # a refused connection: a miss and a failed write, nothing raised
    assert cluster.get(dead_keys[0], "dflt") == "dflt"
    assert cluster.set(dead_keys[0], 1) is False  # in its retry wait: not contacted
    assert spy.count("connect", port) == 1
    assert cluster.add(dead_keys[1], 1) is False
    assert cluster.incr(dead_keys[1]) is None
    assert cluster.gets(dead_keys[1]) == (None, None)
    assert cluster.delete(dead_keys[1]) is False
    assert spy.count("connect", port) == 1
    # the other server's keys are unaffected, also inside multi-key calls
    assert cluster.set_many(dict.fromkeys(dead_keys + live_keys, "v")) == dead_keys
    assert cluster.get_many(dead_keys + live_keys) == dict.fromkeys(live_keys, "v")

    clock.advance(1.01)  # retry_timeout over: the next operation probes, fails: dead
    assert cluster.get(dead_keys[0]) is None
    assert spy.count("connect", port) == 2
    assert [e.kind for e in events] == ["failure", "failure", "dead"]
    assert cluster.health()[dead].state == "dead"
    assert f"{dead} is dead" in caplog.text

    for wait, connects in [(1.0, 3), (2.0, 4), (4.0, 5)]:  # dead: probed with a back-off
        clock.advance(wait - 0.01)
        for key in dead_keys:
            cluster.set(key, 1)
        cluster.get_many(dead_keys)
        assert spy.count("connect", port) == connects - 1
        clock.advance(0.02)
        assert cluster.get_many(dead_keys) == {}  # the probe, refused
        assert spy.count("connect", port) == connects
    assert [e.kind for e in events] == [
        "failure",
        "failure",
        "dead",
        "failure",
        "failure",
        "failure",
    ]

    revived = start_memcached(1, ports=[port])
    try:
        clock.advance(8.01)
        assert cluster.set(dead_keys[0], "back") is True  # the probe succeeds
        assert events[-1] == NodeEvent(dead, "revived")
        assert f"{dead} is back" in caplog.text
        assert cluster.get(dead_keys[0]) == "back"
        assert cluster.health()[dead].state == "up"
    finally:
        stop_all(revived)


def test_raise_errors_raises_node_unavailable(memcached_1: list[MemcachedServer]) -> None:
    clock, spy, port = FakeClock(), SocketSpy(), _closed_port()
    cluster, _ = make_cluster(memcached_1[0], port, clock, spy, raise_errors=True)
    dead = f"127.0.0.1:{port}"
    dead_key, live_key = keys_on(cluster, dead, 1)[0], keys_on(cluster, memcached_1[0].spec, 1)[0]
    with pytest.raises(NodeUnavailableError) as failure:
        cluster.get(dead_key)
    assert failure.value.node == dead
    assert isinstance(failure.value.__cause__, ConnectionRefusedError)
    with pytest.raises(NodeUnavailableError, match=r"failing, next try in 1\.0s") as fast:
        cluster.set(dead_key, 1)  # fails fast, still an error
    assert fast.value.node == dead
    assert cluster.set(live_key, 1) is True
    with pytest.raises(NodeUnavailableError):
        cluster.get_many([live_key, dead_key])
    # the error came after every reply was read: the live server's connection is fine
    assert cluster.get_many([live_key]) == {live_key: 1}
    assert cluster.stats().keys() == {memcached_1[0].spec}  # stats() never raises for a node


def test_remap_sends_a_failing_nodes_keys_to_the_next_live_node(
    memcached_1: list[MemcachedServer],
) -> None:
    memcached_1[0].flush()
    clock, spy, port = FakeClock(), SocketSpy(), _closed_port()
    cluster, _ = make_cluster(memcached_1[0], port, clock, spy, failover="remap")
    dead = f"127.0.0.1:{port}"
    dead_keys = keys_on(cluster, dead)
    assert cluster.set(dead_keys[0], 0) is False  # the failure itself is not retried elsewhere
    assert cluster.set_many(dict.fromkeys(dead_keys, "moved")) == []
    assert cluster.get_many(dead_keys) == dict.fromkeys(dead_keys, "moved")
    raw = Client(("127.0.0.1", memcached_1[0].port), serde=pickle_serde)
    assert raw.get(dead_keys[0]) == "moved"
    assert spy.count("connect", port) == 1


def test_a_probe_is_made_once_per_multi_key_call(memcached_1: list[MemcachedServer]) -> None:
    clock, spy, port = FakeClock(), SocketSpy(), _closed_port()
    cluster, events = make_cluster(memcached_1[0], port, clock, spy, retry_attempts=5)
    dead_keys = keys_on(cluster, f"127.0.0.1:{port}", 20)
    cluster.get(dead_keys[0])
    clock.advance(1.01)
    assert cluster.get_many(dead_keys) == {}
    assert spy.count("connect", port) == 2  # one probe for all 20 keys
    assert [e.kind for e in events] == ["failure", "failure"]


def test_pool_is_refreshed_after_a_failure(memcached_4_fresh: list[MemcachedServer]) -> None:
    """Pooled connections to a restarted server are dropped, not tried one by one."""
    victim = memcached_4_fresh[0]
    cluster = Cluster(
        [victim.spec], ClusterOptions(retry_timeout=0.0, retry_attempts=1, dead_timeout=0.0)
    )
    barrier = threading.Barrier(4)

    def warm() -> None:
        barrier.wait()
        for i in range(50):
            cluster.set(f"w{i}", i)

    threads = [threading.Thread(target=warm) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    victim.kill()
    victim.start()
    assert cluster.get("w1") is None  # a stale pooled connection fails once...
    assert cluster.set("w1", "fresh") is True  # ...and the next operation reconnects
    assert cluster.get("w1") == "fresh"


# -- drills on real processes --------------------------------------------------------


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def test_sigkill_drill_under_load(memcached_4_fresh: list[MemcachedServer]) -> None:
    """Kill one of four servers mid-load, restart it on the same port."""
    servers = memcached_4_fresh
    victim = servers[2]
    events: list[NodeEvent] = []
    clock = FakeClock()  # the retry timers: moved by the drill, so no wait is a race
    # The live servers get time to answer on a busy machine (a killed one refuses at once).
    options = ClusterOptions(retry_timeout=0.2, dead_timeout=1.0, timeout=30, connect_timeout=30)
    cluster = Cluster(
        [s.spec for s in servers], options, on_node_event=events.append, clock=clock, rng=lambda: 0
    )
    stop = threading.Event()
    latencies: list[float] = []
    errors: list[BaseException] = []
    wrong: list[str] = []  # live servers' keys that did not hit
    live_hits = [0] * 3  # one count a thread: no increment lost between them

    def load(thread_id: int) -> None:
        rng = random.Random(thread_id)
        keys = [f"drill:{thread_id}:{i}" for i in range(80)]
        live = [k for k in keys if cluster.ring.get_node(k) != victim.spec]
        written: dict[str, int] = {}
        operations: list[Callable[[int], None]] = []

        def do_set(i: int) -> None:
            key = rng.choice(keys)
            if cluster.set(key, i) and key in live:
                written[key] = i

        def do_get(i: int) -> None:
            key = rng.choice(live)
            if key in written:
                if cluster.get(key) != written[key]:
                    wrong.append(key)
                else:
                    live_hits[thread_id] += 1
            else:
                cluster.get(rng.choice(keys))

        def do_get_many(i: int) -> None:
            batch = rng.sample(keys, 20)
            got = cluster.get_many(batch)
            for key in batch:
                if key in written and got.get(key) != written[key]:
                    wrong.append(key)

        def do_set_many(i: int) -> None:
            batch = dict.fromkeys(rng.sample(keys, 20), i)
            failed = set(cluster.set_many(batch))
            for key in batch:
                if key in live and key not in failed:
                    written[key] = i
                elif key in live:
                    wrong.append(key)

        operations.extend([do_set, do_get, do_get_many, do_set_many])
        i = 0
        while not stop.is_set():
            i += 1
            operation = rng.choice(operations)
            start = time.monotonic()
            try:
                operation(i)
            except BaseException as exc:
                errors.append(exc)
            latencies.append(time.monotonic() - start)

    threads = [threading.Thread(target=load, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()

    def until(kind: str, advance: bool) -> None:
        for _ in range(1000):  # a hang guard: each step takes the load a few requests
            if any(e.kind == kind for e in list(events)):
                return
            if advance:  # the wait is over: the next request probes
                clock.advance(cluster.health()[victim.spec].retry_in)
            time.sleep(0.01)

    def hits(count: int) -> None:
        """Until the live servers have served ``count`` checked hits (however slow the
        machine: a count, not a time window); the bound only guards against a hang."""
        for _ in range(3000):
            if sum(live_hits) >= count or errors:
                return
            time.sleep(0.01)

    try:
        hits(40)  # the load runs on every server
        victim.kill()
        until("failure", advance=False)
        until("dead", advance=True)
        hits(sum(live_hits) + 30)  # the live servers serve while one is dead
        victim.start()
        wait = cluster.health()[victim.spec].retry_in  # a dead server's next probe
        until("revived", advance=True)
        hits(sum(live_hits) + 31)  # ...and after it is back
    finally:
        stop.set()
        for thread in threads:
            thread.join()

    revived = [e for e in events if e.kind == "revived"]
    dead = [e for e in events if e.kind == "dead"]
    print(
        f"\nSIGKILL drill: {len(latencies)} ops, {len(errors)} exceptions, "
        f"max {max(latencies) * 1000:.1f} ms, p99 {p99(latencies) * 1000:.2f} ms, "
        f"live-server hits checked {sum(live_hits)}, wrong {len(wrong)}"
    )
    assert errors == []
    assert wrong == []
    assert sum(live_hits) > 100
    # A killed server refuses at once: no caller ever waited for a timeout on it.
    assert not [e for e in events if isinstance(e.error, TimeoutError)]
    assert dead, "the killed server should be marked dead"
    assert revived, "the restarted server should be used again"
    assert wait <= options.dead_timeout  # probed again within dead_timeout
    victim_key = next(
        k for k in (f"after:{i}" for i in range(1000)) if cluster.ring.get_node(k) == victim.spec
    )
    assert cluster.set(victim_key, "back")
    assert Client(("127.0.0.1", victim.port), serde=pickle_serde).get(victim_key) == "back"


def test_sigkill_with_remap_moves_keys_to_the_next_live_node(
    memcached_4_fresh: list[MemcachedServer],
) -> None:
    servers = memcached_4_fresh
    victim = servers[0]
    cluster = Cluster([s.spec for s in servers], ClusterOptions(failover="remap", dead_timeout=30))
    keys = [k for k in (f"r{i}" for i in range(2000)) if cluster.ring.get_node(k) == victim.spec]
    keys = keys[:40]
    assert cluster.set_many(dict.fromkeys(keys, "before")) == []
    victim.kill()
    cluster.get_many(keys)  # the failure: these are misses
    assert cluster.set_many(dict.fromkeys(keys, "after")) == []
    assert cluster.get_many(keys) == dict.fromkeys(keys, "after")
    by_port = {s.spec: Client(("127.0.0.1", s.port), serde=pickle_serde) for s in servers[1:]}
    for key in keys[:10]:
        successor = cluster.ring.get_nodes(key, 4)[1]
        assert by_port[successor].get(key) == "after"


def test_sigkill_with_raise_errors(memcached_4_fresh: list[MemcachedServer]) -> None:
    servers = memcached_4_fresh
    victim = servers[3]
    cluster = Cluster([s.spec for s in servers], ClusterOptions(raise_errors=True))
    key = next(k for k in (f"e{i}" for i in range(1000)) if cluster.ring.get_node(k) == victim.spec)
    other = next(
        k for k in (f"o{i}" for i in range(1000)) if cluster.ring.get_node(k) != victim.spec
    )
    cluster.set(key, 1)
    victim.kill()
    for _ in range(3):  # the failure, then failing fast
        with pytest.raises(NodeUnavailableError) as excinfo:
            cluster.get(key)
        assert excinfo.value.node == victim.spec
    assert cluster.set(other, 1) is True


def test_hung_server_costs_one_timeout_then_fails_fast(
    memcached_4_fresh: list[MemcachedServer],
) -> None:
    servers = memcached_4_fresh
    victim = servers[1]
    timeout = 0.3
    clock = FakeClock()  # the retry timer; the timeout itself is the socket's, real
    events: list[NodeEvent] = []
    options = ClusterOptions(timeout=timeout, connect_timeout=timeout, retry_timeout=0.6)
    cluster = Cluster([s.spec for s in servers], options, on_node_event=events.append, clock=clock)
    keys = [f"h{i}" for i in range(100)]
    cluster.set_many(dict.fromkeys(keys, 1))
    hung = [k for k in keys if cluster.ring.get_node(k) == victim.spec]
    others = [k for k in keys if k not in hung]
    victim.pause()
    try:
        got = cluster.get_many(keys)  # the hung server holds the call for one timeout
        assert got == dict.fromkeys(others, 1)
        for key in hung[:10]:
            assert cluster.get(key) is None
        assert cluster.get_many(keys) == dict.fromkeys(others, 1)
    finally:
        victim.resume()
    # One timeout: the first call's.  Every later call failed fast: one that had reached
    # the hung server would have timed out too, a failure of its own.
    (failure,) = events
    assert isinstance(failure.error, TimeoutError)
    clock.advance(options.retry_timeout)  # retry_timeout over: the next operation probes
    assert cluster.get(hung[0]) == 1
    assert cluster.health()[victim.spec].state == "up"


def test_an_exhausted_pool_degrades_without_blaming_the_server(
    memcached_1: list[MemcachedServer],
) -> None:
    spy = SocketSpy(latency=0.3)  # keeps the only connection busy for a while
    cluster = Cluster(
        [memcached_1[0].spec],
        ClusterOptions(max_pool_size=1, client_options={"socket_module": spy}),
    )
    cluster.set("busy", 1)
    holder = threading.Thread(target=cluster.get, args=("busy",))
    holder.start()
    time.sleep(0.1)
    try:
        assert cluster.get("busy", "dflt") == "dflt"
        assert cluster.set("other", 1) is False
    finally:
        holder.join()
    assert cluster.health()[memcached_1[0].spec].state == "up"
    assert cluster.get("busy") == 1


def test_a_failing_event_handler_does_not_break_operations(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handler(event: NodeEvent) -> None:
        raise RuntimeError("handler bug")

    cluster = Cluster([f"127.0.0.1:{_closed_port()}"], on_node_event=handler)
    assert cluster.get("k", "dflt") == "dflt"
    assert "on_node_event handler failed" in caplog.text


@pytest.mark.parametrize("servers", [1, 2])
def test_a_multi_key_call_to_a_server_that_died_unnoticed_loses_only_its_keys(
    servers: int,
) -> None:
    """The driver sends a multi-key call itself while every server is healthy: a server
    that died since its last answer fails its own keys there (its health records it),
    the others' answer, nothing is raised; with raise_errors, the error comes after
    every reply was read."""
    started = start_memcached(servers)
    try:
        for raise_errors in (False, True):
            specs = [s.spec for s in started]
            cluster = Cluster(specs, ClusterOptions(raise_errors=raise_errors))
            dying = started[0]
            dead_keys = keys_on(cluster, dying.spec)
            live_keys = keys_on(cluster, started[1].spec) if servers == 2 else []
            keys = dead_keys + live_keys
            assert cluster.set_many(dict.fromkeys(keys, "v")) == []
            assert cluster.get_many(keys) == dict.fromkeys(keys, "v")  # connected, healthy
            dying.stop()
            try:
                assert cluster.health()[dying.spec].state == "up"
                if raise_errors:
                    with pytest.raises(NodeUnavailableError):
                        cluster.gets_many(keys)
                else:
                    assert cluster.gets_many(keys).keys() == set(live_keys)
                assert cluster.health()[dying.spec].state != "up"
                if live_keys:  # its connection was read to the end: still in use
                    assert cluster.get_many(live_keys) == dict.fromkeys(live_keys, "v")
            finally:
                started[0] = dying = start_memcached(1, ports=[dying.port])[0]
    finally:
        stop_all(started)
