"""What each pattern costs in round trips, counted on the wire by the proxy.

The counts are the figures the docs quote (docs/benchmarks.md, the pattern
pages); a change that adds a round trip to a pattern fails here.  The proxy
counts a burst of client bytes after a reply as one round trip (see
:mod:`tests.drills.proxy`), so a pipelined batch is one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.options import ClusterOptions
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
