"""What each pattern costs in round trips, counted on the wire by the proxy.

The counts are the figures the docs quote (docs/benchmarks.md, the pattern
pages); a change that adds a round trip to a pattern fails here.  The proxy
counts a burst of client bytes after a reply as one round trip (see
:mod:`tests.drills.proxy`), so a pipelined batch is one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.leases import get_or_set
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.stampede import Stampede, StampedePolicy, lock_key
from tests.conftest import flush
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer


@pytest.fixture
def proxy(memcached_1: list[MemcachedServer]) -> Iterator[Proxy]:
    flush(memcached_1)
    with Proxy(memcached_1[0].port) as proxy:
        yield proxy


@pytest.fixture
def cluster(proxy: Proxy) -> Cluster:
    cluster = Cluster([proxy.spec], ClusterOptions(timeout=2.0))
    cluster.set("warm", b"up")  # the connection is open: what follows is counted alone
    proxy.forget()
    return cluster


def test_plain_commands_cost_one_round_trip_each(cluster: Cluster, proxy: Proxy) -> None:
    cluster.set("k", "v")
    assert proxy.round_trips == 1
    assert cluster.get("k") == "v"
    assert proxy.round_trips == 2
    assert cluster.set_many({f"m{i}": i for i in range(50)}) == []
    assert proxy.round_trips == 3  # pipelined: one batch, one round trip
    assert len(cluster.get_many([f"m{i}" for i in range(50)])) == 50
    assert proxy.round_trips == 4


def test_a_lock_cycle_costs_at_most_three_round_trips(cluster: Cluster, proxy: Proxy) -> None:
    lock = Lock(cluster, "lock:rt", timeout=10)
    assert lock.acquire(blocking=False)
    lock.release()
    assert proxy.round_trips <= 3


def test_stampede_paths_round_trips(cluster: Cluster, proxy: Proxy) -> None:
    """get_or_compute per path, its fills under a lease (docs/stampede.md#round-trips)."""
    stampede = Stampede(cluster, StampedePolicy(grace=60))

    def trips(action: Callable[[], object]) -> int:
        proxy.forget()
        action()
        return proxy.round_trips

    def lock_held_elsewhere() -> None:
        cluster.add(lock_key("rt:key"), b"someone else", 10)

    counted = {
        "miss, computing": trips(lambda: stampede.get_or_compute("rt:key", lambda: "v", 60)),
        "fresh": trips(lambda: stampede.get_or_compute("rt:key", lambda: "v", 60)),
    }
    stampede.mark_stale("rt:key")
    lock_held_elsewhere()
    counted["stale, another recomputes"] = trips(
        lambda: stampede.get_or_compute("rt:key", lambda: "v", 60)
    )
    cluster.delete(lock_key("rt:key"))
    counted["stale, recomputing"] = trips(
        lambda: stampede.get_or_compute("rt:key", lambda: "v", 60)
    )
    counted["get_or_set, miss"] = trips(lambda: get_or_set(cluster, "rt:other", "v", 60))
    assert counted == {
        "miss, computing": 7,  # get, add lock, add placeholder, gets, cas fill, gets + cas
        "fresh": 1,
        "stale, another recomputes": 2,  # get, add refused
        "stale, recomputing": 6,  # get, add lock, gets (lease), cas fill, gets + cas
        "get_or_set, miss": 4,  # get, add placeholder, gets, cas fill
    }
