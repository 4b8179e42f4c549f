"""A memcached outage is never an application outage (issue 23): the journal and its repairs.

Each test stalls (SIGSTOP) or kills a real server of its own, and checks what
the issue found broken: writes lost in a stall left sets shorter and counters
wrong for their whole TTL, silently.  Now a write the server could not take
is repaired before that server serves the process again (the journal), and
other processes are told of a restart.  Clusters built side by side stand for
processes: each has its own health and journal.  Waits wait for the repair, a
request or the repair thread; nothing is timed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest

from django_mcpatterns.core.client.outcomes import answered
from django_mcpatterns.core.client.shared import Shared
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.counters import CachedCounter
from django_mcpatterns.core.exceptions import IncompleteListError, IncompleteSetError
from django_mcpatterns.core.health import NodeEvent, NodeHealth
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.outages import WriteDegraded
from django_mcpatterns.core.sets import AppendLists, AppendSets, AsyncAppendSets
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, memcached_cluster

PATIENCE = 10.0  # seconds to wait for something that happens within about one


@pytest.fixture
def two() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(2) as servers:
        yield servers


def cluster_of(servers: list[MemcachedServer], **options: object) -> Cluster:
    settings = {"timeout": 0.3, "connect_timeout": 0.3, "retry_timeout": 0.05, **options}
    return Cluster([s.spec for s in servers], ClusterOptions(**settings))  # type: ignore[arg-type]


def key_on(cluster: Cluster, server: MemcachedServer, prefix: str) -> str:
    return next(
        f"{prefix}{i}" for i in range(1000) if cluster.ring.get_node(f"{prefix}{i}") == server.spec
    )


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what}")
        time.sleep(0.005)


def test_a_set_without_loader_that_lost_writes_reads_as_incomplete_never_shorter(
    two: list[MemcachedServer],
) -> None:
    cluster = cluster_of(two)
    other = cluster_of(two)  # another process: it never saw the stall
    sets, their_sets = AppendSets(cluster), AppendSets(other)
    key = key_on(cluster, two[0], "set")
    assert sets.sadd(key, *range(10), expire=60) == 10
    events: list[WriteDegraded] = []
    two[0].pause()
    try:
        assert sets.sadd(key, 10, 11, expire=60, report=events.append) == 0  # no error
        assert sets.srem(key, 3, report=events.append) == 0
    finally:
        two[0].resume()
    assert [e.command for e in events] == ["sadd", "srem"]
    wait_for(lambda: not cluster.journal(), "the repair")  # no request needed: the repair thread
    for reader in (sets, their_sets):  # before: {0..9}, silently without 10, 11 and with 3
        with pytest.raises(IncompleteSetError):
            reader.smembers(key)
    truth = {*range(10), 10, 11} - {3}
    assert their_sets.smembers(key, loader=lambda: truth) == truth  # a loader rebuilds it


def test_a_loader_backed_set_equals_its_source_after_a_stall(two: list[MemcachedServer]) -> None:
    cluster = cluster_of(two)
    sets = AppendSets(cluster)
    key = key_on(cluster, two[0], "loaded")
    truth = set(range(5))
    assert sets.smembers(key, loader=lambda: set(truth)) == truth
    two[0].pause()
    try:
        truth |= {5, 6}  # the source changes; the set's writes cannot reach memcached
        assert sets.sadd(key, 5, 6, loader=lambda: set(truth)) == 0
    finally:
        two[0].resume()
    wait_for(lambda: not cluster.journal(), "the repair")
    assert sets.smembers(key, loader=lambda: set(truth)) == truth  # rebuilt: never the old five
    assert AppendSets(cluster_of(two)).smembers(key) == truth  # stored whole, for every process


def test_a_list_that_lost_writes_reads_as_incomplete(two: list[MemcachedServer]) -> None:
    cluster = cluster_of(two)
    lists = AppendLists(cluster)
    key = key_on(cluster, two[1], "list")
    assert lists.rpush(key, "a", "b", expire=60) == 2
    two[1].pause()
    try:
        assert lists.rpush(key, "c", expire=60) == 0
    finally:
        two[1].resume()
    wait_for(lambda: not cluster.journal(), "the repair")
    with pytest.raises(IncompleteListError):
        lists.lrange(key, 0, -1)


def test_an_exact_counter_stays_exact_across_a_stall(two: list[MemcachedServer]) -> None:
    # The issue: 20 changes during a 1.5 s stall, and the count read 11 against a true 31.
    cluster = cluster_of(two)
    rows = [11]
    key = key_on(cluster, two[0], "count")
    counter = CachedCounter(cluster, key, lambda: rows[0])
    assert counter.get() == 11
    two[0].pause()
    try:
        for _ in range(20):
            with counter.change(+1):
                rows[0] += 1  # the source of truth commits; the cache cannot be told
    finally:
        two[0].resume()
    wait_for(lambda: not cluster.journal(), "the repair")
    assert counter.get() == 31


def test_the_repair_runs_before_the_server_serves_this_process_again(
    two: list[MemcachedServer],
) -> None:
    cluster = cluster_of(two, retry_timeout=30.0)  # no probe by itself for a long while
    other = cluster_of(two)
    key = key_on(cluster, two[0], "value")
    assert cluster.set(key, "old")
    two[0].pause()
    try:
        assert not cluster.forget(key)  # could not be deleted now: journaled
        assert cluster.journal() == {two[0].spec: 1}
    finally:
        two[0].resume()
    # Held: the hot path skips a server that owes repairs; its first probe (the journal
    # shortens the wait to about a second) deletes the key, then serves.
    wait_for(lambda: cluster.get(key) is None and not cluster.journal(), "the repair")
    assert other.get(key) is None  # every process sees it deleted


def test_every_process_recognises_a_server_that_restarted_empty(
    two: list[MemcachedServer],
) -> None:
    restarts: list[tuple[str, str]] = []
    lock = threading.Lock()
    clock = FakeClock()  # the processes met the server long before it restarted (below)
    options = ClusterOptions(timeout=0.3, connect_timeout=0.3, retry_timeout=0.05)
    clusters = [Cluster([s.spec for s in two], options, clock=clock) for _ in range(2)]
    for name, cluster in zip("ab", clusters, strict=True):

        def heard(node: str, name: str = name) -> None:
            with lock:
                restarts.append((name, node))

        cluster.listen(on_restart=heard)
        for i in range(20):
            cluster.set(f"warm{i}", i)
    clusters[0].forget(key_on(clusters[0], two[0], "journaled"))  # only "a" journals
    # A process knows no epoch before its first outage there: a server younger than its
    # first connection to it restarted (one that restarts within seconds of that connection
    # is not told from a stall, and a stall is never taken for a restart).
    clock.advance(60)
    two[0].kill()
    two[0].start()

    def back(cluster: Cluster) -> bool:
        clock.advance(1)  # past each retry wait
        return _answers(cluster, two[0])

    for cluster in clusters:  # each meets the dead connections, then the new server
        wait_for(lambda c=cluster: back(c), "the server back")
    wait_for(lambda: len(restarts) == 2, "both processes to recognise the restart")
    assert sorted(restarts) == [("a", two[0].spec), ("b", two[0].spec)]


def _answers(cluster: Cluster, server: MemcachedServer) -> bool:
    key = key_on(cluster, server, "probe")
    cluster.set(key, 1)
    return bool(cluster.get(key) == 1)


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    two: list[MemcachedServer], caplog: pytest.LogCaptureFixture
) -> None:
    cluster = cluster_of(two)
    keys = [key_on(cluster, two[0], f"k{i}:") for i in range(8)]
    stop = threading.Event()

    def load(key: str) -> None:
        while not stop.is_set():
            cluster.set(key, "v")
            cluster.get(key)

    caplog.set_level(logging.WARNING, logger="django_mcpatterns.cluster")
    threads = [threading.Thread(target=load, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    try:
        two[0].kill()
        wait_for(lambda: cluster.health()[two[0].spec].state == "dead", "it marked dead")
        two[0].start()
        wait_for(lambda: cluster.health()[two[0].spec].state == "up", "it back")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("is unavailable" in line for line in lines) == 1
    assert sum("is back" in line for line in lines) == 1


def test_async_set_writes_degrade_too(two: list[MemcachedServer]) -> None:
    cluster = cluster_of(two)
    sets = AsyncAppendSets(cluster.aio)
    key = key_on(cluster, two[0], "aset")

    async def scenario() -> int:
        await sets.sadd(key, 1, expire=60)
        two[0].pause()
        try:
            return await sets.sadd(key, 2, expire=60)
        finally:
            two[0].resume()

    assert asyncio.run(scenario()) == 0
    wait_for(lambda: not cluster.journal(), "the repair")
    with pytest.raises(IncompleteSetError):
        AppendSets(cluster).smembers(key)


def test_an_answer_read_before_the_failure_does_not_end_the_outage() -> None:
    # The race behind "is back (unavailable for 0.0s)" then "is unavailable" again: one
    # thread's request was answered just before the kill, another's failed, and the first
    # reported its answer after the failure was recorded.  Only an answer to a request
    # admitted since the failure (the probe) ends the outage.
    clock, backs = FakeClock(), list[NodeEvent]()
    health = NodeHealth(
        "n1",
        retry_attempts=2,
        retry_timeout=1.0,
        dead_timeout=10.0,
        clock=clock,
        report=lambda event: None,
        back=backs.append,
    )
    node = SimpleNamespace(health=health, drop_idle=lambda: None)
    early, failing = health.admit(), health.admit()
    assert early is not None
    assert failing is not None
    health.failed(ConnectionResetError("reset"), failing)
    answered(node, None, early)  # type: ignore[arg-type]
    assert health.snapshot().state == "failing"  # before: "up", and logged back
    assert backs == []
    clock.advance(1.0)
    probe = health.admit()
    assert probe is not None
    assert probe.probe
    answered(node, None, probe)  # type: ignore[arg-type]
    assert health.snapshot().state == "up"
    assert [event.kind for event in backs] == ["recovered"]


def test_a_server_back_while_the_repairer_takes_the_checks_is_still_checked() -> None:
    """A request thread tells the repairer that a server is back at the instant the repairer
    takes the checks asked for: the check is read, never left in the dict taken away."""
    shared = Shared(
        ["127.0.0.1:1", "127.0.0.1:2"], ClusterOptions(), None, FakeClock(), random.random
    )
    shared.epochs["127.0.0.1:1"] = (1, 1)  # not the first outage: only the server back is read
    read: list[str] = []
    shared._read_epoch = lambda name, down: read.append(name)  # type: ignore[method-assign]
    repairer = threading.Thread(target=shared.repair_round)

    class Racing(dict[str, float | None]):
        def __setitem__(self, name: str, down: float | None) -> None:
            repairer.start()  # the repairer's round, while the check is being added
            repairer.join(0.5)  # done by now, unless the addition holds it off
            super().__setitem__(name, down)

    shared._checks = Racing()
    shared._back(NodeEvent("127.0.0.1:2", "recovered", None, 1, 2.0))
    repairer.join()
    shared.repair_round()
    assert read == ["127.0.0.1:2"]
