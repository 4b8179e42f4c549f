"""What each pattern costs in round trips, counted on the wire by the proxy.

The counts are the figures the docs quote (docs/benchmarks.md, the pattern
pages); a change that adds a round trip to a pattern fails here.  The proxy
counts a burst of client bytes after a reply as one round trip (see
:mod:`tests.drills.proxy`), so a pipelined batch is one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings

from django_mcpatterns.core.cluster import Cluster, reset_shared_clusters
from django_mcpatterns.core.leases import get_or_set
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.namespaces import Namespaces
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.sets import AppendLists, AppendSets, SetOptions
from django_mcpatterns.core.stampede import Stampede, StampedePolicy, lock_key
from django_mcpatterns.core.wire import MetaGet
from django_mcpatterns.flask import KetamaMemcachedCache
from tests.conftest import flush
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer, ttl_over_meta


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


# -- per protocol: what the meta commands save -----------------------------------------

# The cost of each operation by protocol, as docs/locks.md and docs/sets.md quote it.
LOCK_CYCLE = {"meta": 2, "text": 3}  # add_cas; delete_cas (text: gets + cas)
COMPACTING_READ = {"meta": 2, "text": 2}  # mg v c t f + cas; text: gets + cas (no TTL read)


@pytest.fixture(params=["meta", "text"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def spoken(proxy: Proxy, protocol: str) -> Cluster:
    """A cluster through the proxy speaking ``protocol``, its connection already open."""
    cluster = Cluster([proxy.spec], ClusterOptions(timeout=2.0, protocol=protocol))  # type: ignore[arg-type]
    cluster.set("warm", b"up")
    proxy.forget()
    return cluster


def test_a_lock_cycle_costs_two_round_trips_over_meta(
    spoken: Cluster, proxy: Proxy, protocol: str
) -> None:
    lock = Lock(spoken, "lock:rt", timeout=10)
    assert lock.acquire(blocking=False)
    assert proxy.round_trips == 1  # the add hands back the cas
    lock.release()
    assert proxy.round_trips == LOCK_CYCLE[protocol]
    assert spoken.get("lock:rt") is None


def test_extending_a_lock_costs_one_round_trip(
    spoken: Cluster, proxy: Proxy, protocol: str
) -> None:
    lock = Lock(spoken, "lock:rt", timeout=10)
    assert lock.acquire(blocking=False)
    proxy.forget()
    lock.extend(20)
    assert proxy.round_trips == 1  # a cas that hands back the new cas
    assert 28 <= (ttl_over_meta(spoken, "lock:rt") or 0) <= 31
    proxy.forget()
    lock.release()  # with the extend's cas: still the fast path
    assert proxy.round_trips == LOCK_CYCLE[protocol] - 1


def dirty_set(cluster: Cluster) -> AppendSets:
    sets = AppendSets(cluster, SetOptions(compact_min_bytes=0, compact_ratio=0.5))
    sets.sadd("set:rt", *range(50), expire=600)
    sets.srem("set:rt", *range(40))  # a log twice its snapshot: the next read compacts
    return sets


def test_a_compacting_set_read_costs_two_round_trips_over_meta(
    spoken: Cluster, proxy: Proxy, protocol: str
) -> None:
    sets = dirty_set(spoken)
    before = len(spoken.get("set:rt"))
    proxy.forget()
    assert sets.smembers("set:rt") == set(range(40, 50))
    assert proxy.round_trips == COMPACTING_READ[protocol]
    assert len(spoken.get("set:rt")) < before  # compacted
    assert 590 <= (ttl_over_meta(spoken, "set:rt") or 0) <= 600  # keeping its TTL
    proxy.forget()
    assert sets.smembers("set:rt") == set(range(40, 50))
    assert proxy.round_trips == 1  # clean now: a plain read


def test_spop_costs_two_round_trips_over_meta(spoken: Cluster, proxy: Proxy, protocol: str) -> None:
    sets = AppendSets(spoken)
    sets.sadd("set:pop", *range(5), expire=600)
    proxy.forget()
    popped = sets.spop("set:pop")
    assert proxy.round_trips == COMPACTING_READ[protocol]
    assert sets.smembers("set:pop") == set(range(5)) - {popped}
    assert 590 <= (ttl_over_meta(spoken, "set:pop") or 0) <= 600


def test_a_compacting_list_read_costs_two_round_trips_over_meta(
    spoken: Cluster, proxy: Proxy, protocol: str
) -> None:
    lists = AppendLists(spoken, SetOptions(compact_min_bytes=0, compact_ratio=0.5))
    lists.rpush("list:rt", *range(20), expire=600)
    for value in range(15):
        lists.lrem("list:rt", 1, value)
    proxy.forget()
    assert lists.lrange("list:rt", 0, -1) == list(range(15, 20))
    assert proxy.round_trips == COMPACTING_READ[protocol]


def test_a_namespaced_read_and_an_invalidation_cost_one_round_trip_each(
    spoken: Cluster, proxy: Proxy
) -> None:
    ns = Namespaces(spoken).namespace("user", 42)
    ns.set("profile", {"name": "Ada"})
    proxy.forget()
    assert ns.get("profile") == {"name": "Ada"}
    assert proxy.round_trips == 1  # versions and value in one multi-get
    ns.invalidate()
    assert proxy.round_trips == 2  # one incr
    assert ns.get("profile") is None
    assert proxy.round_trips == 3


@pytest.fixture
def django_cache(proxy: Proxy, protocol: str) -> Iterator[Any]:
    reset_shared_clusters()
    entry = {
        "BACKEND": "django_mcpatterns.backend.KetamaMemcacheCache",
        "LOCATION": [proxy.spec],
        "OPTIONS": {"protocol": protocol, "timeout": 2.0},
    }
    with override_settings(CACHES={"default": entry}):
        cache = caches["default"]
        cache.set("warm", "up")
        proxy.forget()
        yield cache
    reset_shared_clusters()


def test_django_namespaced_reads_and_invalidations_cost_one_round_trip_each(
    django_cache: Any, proxy: Proxy
) -> None:
    ns = django_cache.namespace("user", 42)
    ns.set("profile", "Ada")
    proxy.forget()
    assert ns.get("profile") == "Ada"
    assert proxy.round_trips == 1
    django_cache.invalidate_namespace("user", 42)
    assert proxy.round_trips == 2
    assert ns.get("profile") is None
    assert proxy.round_trips == 3


def test_django_lock_cycle_per_protocol(django_cache: Any, proxy: Proxy, protocol: str) -> None:
    with django_cache.lock("report", timeout=10):
        pass
    assert proxy.round_trips == LOCK_CYCLE[protocol]


def test_flask_dec_costs_two_round_trips_over_meta(proxy: Proxy, protocol: str) -> None:
    reset_shared_clusters()
    cache = KetamaMemcachedCache([proxy.spec], protocol=protocol, timeout=2.0)
    assert cache.set("n", 10, timeout=60)
    proxy.forget()
    assert cache.dec("n", 3) == 7  # value, cas and TTL in one read, then the cas
    assert proxy.round_trips == COMPACTING_READ[protocol]
    # Its TTL kept; text mode cannot read it, and rewrites with the default timeout.
    kept = (58, 61) if protocol == "meta" else (298, 300)
    assert kept[0] <= (ttl_over_meta(cache.store, "n") or 0) <= kept[1]
    reset_shared_clusters()


STAMPEDE_PATHS = {
    "meta": {  # memcached picks the winner: W/Z tokens, the add in the read's write
        "miss, computing": 2,  # mg + ms ME placeholder (won); ms C<cas> fill
        "fresh": 1,
        "stale, another recomputes": 1,  # mg: Z, served stale
        "stale, recomputing": 2,  # mg: W; ms C<cas> fill
        "get_or_set, miss": 4,  # get, add placeholder, gets, cas fill
    },
    "text": {  # the recompute lock and the lease: today's counts
        "miss, computing": 7,  # get, add lock, add placeholder, gets, cas fill, gets + cas
        "fresh": 1,
        "stale, another recomputes": 2,  # get, add refused
        "stale, recomputing": 6,  # get, add lock, gets (lease), cas fill, gets + cas
        "get_or_set, miss": 4,
    },
}


def test_stampede_paths_round_trips(spoken: Cluster, proxy: Proxy, protocol: str) -> None:
    """get_or_compute per path and protocol, fills under a lease (docs/stampede.md#round-trips)."""
    stampede = Stampede(spoken, StampedePolicy(grace=60))

    def trips(action: Callable[[], object]) -> int:
        proxy.forget()
        action()
        return proxy.round_trips

    def another_recomputes() -> None:
        if protocol == "meta":  # another client's mg took the W token
            replies = spoken.exchange("rt:key", [MetaGet(b"rt:key", recache=60)])
            assert replies is not None
            assert replies[0].won
        else:
            spoken.add(lock_key("rt:key"), b"someone else", 10)

    def get_or_compute() -> object:
        return stampede.get_or_compute("rt:key", lambda: "v", 60)

    counted = {"miss, computing": trips(get_or_compute), "fresh": trips(get_or_compute)}
    stampede.mark_stale("rt:key")
    another_recomputes()
    counted["stale, another recomputes"] = trips(get_or_compute)
    spoken.delete(lock_key("rt:key"))
    stampede.mark_stale("rt:key")
    counted["stale, recomputing"] = trips(get_or_compute)
    assert spoken.get("rt:key") == "v"  # the fill landed: fresh again
    counted["get_or_set, miss"] = trips(lambda: get_or_set(spoken, "rt:other", "v", 60))
    assert counted == STAMPEDE_PATHS[protocol]


@pytest.mark.slow
@pytest.mark.parametrize("timeout", [1, 2])
def test_a_natural_soft_expiry_costs_two_round_trips_and_one_in_meta_mode(
    proxy: Proxy, timeout: int
) -> None:
    """Default options (grace = the timeout), values left to go stale on memcached's clock.

    Callers come one at a time once the value is past its soft expiry: each is
    served the stale value in 1 round trip until memcached hands one the
    recompute token, which recomputes in 2 (the token's read, the fill); while
    it computes, the others are served stale in 1 (issue 23).
    """
    cluster = Cluster([proxy.spec], ClusterOptions(timeout=2.0))
    stampede = Stampede(cluster)
    computing, release = threading.Event(), threading.Event()

    def slow() -> str:
        computing.set()
        release.wait(10)
        return "new"

    for cycle in range(2):
        key = f"soft:{timeout}:{cycle}"
        stampede.get_or_compute(key, lambda: "old", timeout)
        envelope = stampede.read(key)
        assert envelope is not None
        time.sleep(max(0.0, envelope.soft_expiry - time.time()) + 0.01 + 0.3 * cycle)
        computing.clear()
        release.clear()
        served: list[int] = []  # round trips of each caller served stale before the token
        fetched: dict[str, Any] = {}

        def fetch(key: str = key, fetched: dict[str, Any] = fetched) -> None:
            fetched["f"] = stampede.fetch(key, slow, timeout)

        while True:
            proxy.forget()
            caller = threading.Thread(target=fetch)
            caller.start()
            while caller.is_alive() and not computing.is_set():
                time.sleep(0.002)
            if computing.is_set():
                break
            caller.join()
            assert fetched["f"].outcome == "stale", fetched
            served.append(proxy.round_trips)
            time.sleep(0.05)
        before = proxy.round_trips
        others: list[int] = []

        # memcached's clock ticks in whole seconds: the item may be gone up to 1 s
        # before the hard expiry the client computed.  A caller that comes later
        # (a busy machine) may rightly find no stale value: that cycle says nothing.
        def undecided(hard_expiry: float = envelope.hard_expiry) -> bool:
            return time.time() > hard_expiry - 1

        for _ in range(3):
            if undecided():
                break
            proxy.forget()
            other = stampede.fetch(key, slow, timeout)
            if other.outcome != "stale" and undecided():
                break
            assert other.outcome == "stale", (other, served, time.time() - envelope.soft_expiry)
            others.append(proxy.round_trips)
        proxy.forget()
        release.set()
        caller.join()
        assert fetched["f"].outcome == "computed"
        if len(others) < 3:
            print(f"cycle {cycle}: the others came past memcached's expiry: not decided")
            continue
        recompute = before + proxy.round_trips
        assert (recompute, others, set(served) | {1}) == (2, [1, 1, 1], {1}), served
        assert stampede.get_or_compute(key, slow, timeout) == "new"
