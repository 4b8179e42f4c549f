"""How fast a stalled or restarted server serves again, with default options, under load.

Eight threads keep requests in flight on four real servers while one of them is
stopped (SIGSTOP) or killed (SIGKILL) and brought back.  What a user relies on:
one stall is one failure, not one per request that was waiting, so the server
is used again about ``retry_timeout`` after it resumes; a killed server is
skipped from its first failure on, and once restarted it is found again by the
next probe of a back-off that starts near ``retry_timeout``, not after
``dead_timeout``.  The servers fail in real time; the retry timers run on a fake
clock the drill moves, so no assertion depends on how busy the machine is.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.health import NodeEvent
from django_mcpatterns.core.options import ClusterOptions
from tests.fakes import FakeClock
from tests.harness import MemcachedServer

pytestmark = pytest.mark.slow

THREADS = 8
PATIENCE = 1000  # tries (10 ms apart) for something that happens at once: a hang guard


class Events:
    """Node events as reported (thread-safe)."""

    def __init__(self) -> None:
        self.seen: list[NodeEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: NodeEvent) -> None:
        with self._lock:
            self.seen.append(event)

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(1 for e in self.seen if e.kind == kind)


@contextmanager
def load(cluster: Cluster) -> Iterator[list[BaseException]]:
    """``THREADS`` threads setting and getting keys of every server until the block ends."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        keys = [f"load:{seed}:{i}" for i in range(64)]
        while not stop.is_set():
            key = rng.choice(keys)
            try:
                if rng.random() < 0.5:
                    cluster.set(key, seed)
                else:
                    cluster.get(key)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        yield errors
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)


def served(cluster: Cluster, node: str) -> bool:
    """Whether a key of ``node`` is written and read back within a few tries (real time passes
    only for the tries: the cluster's retry timers run on the test's fake clock)."""
    key = next(
        k for k in (f"probe:{i}" for i in itertools.count()) if cluster.ring.get_node(k) == node
    )
    for _ in range(PATIENCE):
        if cluster.set(key, "back") and cluster.get(key) == "back":
            return True
        time.sleep(0.01)
    return False


def wait_for(events: Events, kind: str) -> None:
    """Until the cluster has reported an event of ``kind`` (real failures take real time)."""
    for _ in range(PATIENCE):
        if events.count(kind):
            return
        time.sleep(0.01)
    pytest.fail(f"no {kind!r} event")


def test_a_stall_under_load_is_one_failure_and_the_server_serves_soon_after(
    memcached_4_fresh: list[MemcachedServer],
) -> None:
    servers, events, clock = memcached_4_fresh, Events(), FakeClock()
    victim = servers[1]
    options = ClusterOptions()
    cluster = Cluster([s.spec for s in servers], options, on_node_event=events, clock=clock)
    with load(cluster) as errors:
        time.sleep(0.5)
        victim.pause()
        try:
            time.sleep(1.5)  # longer than the 1 s timeout: every waiting request times out
        finally:
            victim.resume()
        wait_for(events, "failure")
        clock.advance(options.retry_timeout)  # the wait is over: the next request probes
        recovered = served(cluster, victim.spec)
    print(
        f"\nSIGSTOP 1.5 s, {THREADS} threads, default options: {events.count('failure')} "
        f"failures counted, {events.count('dead')} dead"
    )
    assert errors == []
    assert events.count("failure") == 1  # one stall, one failure
    assert events.count("dead") == 0
    assert recovered  # used again once retry_timeout passed, by the cluster's clock


def test_a_killed_server_is_skipped_at_once_and_used_soon_after_its_restart(
    memcached_4_fresh: list[MemcachedServer],
) -> None:
    servers, events, clock = memcached_4_fresh, Events(), FakeClock()
    victim = servers[2]
    options = ClusterOptions()
    cluster = Cluster(
        [s.spec for s in servers], options, on_node_event=events, clock=clock, rng=lambda: 0.0
    )
    with load(cluster) as errors:
        time.sleep(0.5)
        victim.kill()
        wait_for(events, "failure")
        # Skipped from its first failure on: while its wait lasts, nobody contacts it.
        assert cluster.health()[victim.spec].state in ("failing", "dead")
        # Declared dead once the probe after retry_timeout fails too.
        for _ in range(PATIENCE):
            if events.count("dead"):
                break
            clock.advance(cluster.health()[victim.spec].retry_in)
            time.sleep(0.01)
        wait_for(events, "dead")
        victim.start()  # same port, empty
        # Found again by the next probe of a back-off that starts at retry_timeout (rng 0:
        # no jitter), not after dead_timeout.
        wait = cluster.health()[victim.spec].retry_in
        clock.advance(wait)
        recovered = served(cluster, victim.spec)
    print(
        f"\nSIGKILL, {THREADS} threads, default options: {events.count('failure')} failures, "
        f"{events.count('dead')} dead, revived: {events.count('revived')}"
    )
    assert errors == []
    assert wait < options.dead_timeout
    assert recovered
    assert events.count("revived") == 1
