"""How fast a stalled or restarted server serves again, with default options, under load.

Eight threads keep requests in flight on four real servers while one of them is
stopped (SIGSTOP) or killed (SIGKILL) and brought back.  What a user relies on:
one stall is one failure, not one per request that was waiting, so the server
is used again about ``retry_timeout`` after it resumes; a killed server is
skipped from its first failure on, and once restarted it is found again by the
next probe of a back-off that starts near ``retry_timeout``, not after
``dead_timeout``.  Run with ``-s`` for the figures.
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
from tests.harness import MemcachedServer

pytestmark = pytest.mark.slow

THREADS = 8
LIMIT = 40.0  # seconds to wait for a server to serve again: past dead_timeout (30 s)


class Events:
    """Node events with the time they were reported (thread-safe)."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, NodeEvent]] = []
        self._lock = threading.Lock()

    def __call__(self, event: NodeEvent) -> None:
        with self._lock:
            self.seen.append((time.monotonic(), event))

    def first(self, kind: str, since: float) -> float:
        """Seconds from ``since`` to the first event of ``kind`` after it (inf: none)."""
        with self._lock:
            times = [t for t, e in self.seen if e.kind == kind and t >= since]
        return times[0] - since if times else float("inf")

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(1 for _, e in self.seen if e.kind == kind)


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


def seconds_until_served(cluster: Cluster, node: str, since: float) -> float:
    """Seconds from ``since`` until a key of ``node`` is written and read back (inf: never)."""
    key = next(
        k for k in (f"probe:{i}" for i in itertools.count()) if cluster.ring.get_node(k) == node
    )
    while time.monotonic() - since < LIMIT:
        if cluster.set(key, "back") and cluster.get(key) == "back":
            return time.monotonic() - since
        time.sleep(0.01)
    return float("inf")


def test_a_stall_under_load_is_one_failure_and_the_server_serves_soon_after(
    memcached_4_fresh: list[MemcachedServer],
) -> None:
    servers, events = memcached_4_fresh, Events()
    victim = servers[1]
    cluster = Cluster([s.spec for s in servers], ClusterOptions(), on_node_event=events)
    with load(cluster) as errors:
        time.sleep(0.5)
        victim.pause()
        try:
            time.sleep(1.5)  # longer than the 1 s timeout: every waiting request times out
        finally:
            victim.resume()
        resumed_at = time.monotonic()
        recovery = seconds_until_served(cluster, victim.spec, resumed_at)
    print(
        f"\nSIGSTOP 1.5 s, {THREADS} threads, default options: served again "
        f"{recovery:.2f} s after SIGCONT; {events.count('failure')} failures counted, "
        f"{events.count('dead')} dead"
    )
    assert errors == []
    assert events.count("failure") == 1  # one stall, one failure
    assert events.count("dead") == 0
    assert recovery <= 2.5


def test_a_killed_server_is_skipped_at_once_and_used_soon_after_its_restart(
    memcached_4_fresh: list[MemcachedServer],
) -> None:
    servers, events = memcached_4_fresh, Events()
    victim = servers[2]
    options = ClusterOptions()
    cluster = Cluster([s.spec for s in servers], options, on_node_event=events)
    with load(cluster) as errors:
        time.sleep(0.5)
        killed_at = time.monotonic()
        victim.kill()
        time.sleep(2.0)
        detected, dead = events.first("failure", killed_at), events.first("dead", killed_at)
        victim.start()  # same port, empty
        restarted_at = time.monotonic()
        recovery = seconds_until_served(cluster, victim.spec, restarted_at)
    print(
        f"\nSIGKILL, restart after 2 s, {THREADS} threads, default options: first failure "
        f"{detected:.3f} s after the kill, dead after {dead:.2f} s, used again "
        f"{recovery:.2f} s after the restart"
    )
    assert errors == []
    # Skipped from its first failure on: the requests that were in flight fail at once.
    assert detected < 0.5
    # Declared dead once the probe after retry_timeout fails too.
    assert dead < options.retry_timeout + 0.5
    assert recovery <= 3.0
