"""``bump``: the playbook's "touching keys with add", on both stores and both protocols.

It refreshes an item's place in the LRU without fetching its value or changing
its TTL, says whether the item was there, and never creates one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.options import ClusterOptions
from tests.conftest import flush
from tests.drills.proxy import Proxy
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, raw_client, server_ttl


def test_memory_bump_says_whether_the_item_is_there_and_creates_nothing() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    store.set("here", "value", 100)
    _, token = store.gets("here")
    clock.advance(40)
    assert store.bump("here") is True
    assert store.bump("absent") is False
    assert store.get("absent") is None
    assert store.gets("here") == ("value", token)  # value and cas untouched
    assert store.ttl("here") == 60  # TTL untouched


def test_memory_bump_keeps_an_item_from_eviction() -> None:
    store = MemoryStore(max_item_size=1024, max_bytes=8 * 1024)
    for i in range(9):  # 9 items of 861 bytes: the next one does not fit in 8 KiB
        store.set(f"k{i}", b"x" * 800)
    assert store.stats()["evictions"] == 0
    assert store.bump("k0")  # the least recently used becomes the most recent
    store.set("newcomer", b"x" * 800)  # evicts the least recently used: k1, not k0
    assert store.get("k0") == b"x" * 800
    assert store.get("k1") is None
    assert store.stats()["evictions"] == 1


@pytest.fixture
def proxy(memcached_1: list[MemcachedServer]) -> Iterator[Proxy]:
    flush(memcached_1)
    with Proxy(memcached_1[0].port) as proxy:
        yield proxy


@pytest.mark.parametrize(("protocol", "sent"), [("meta", b"mg here\r\n"), ("text", b"add here ")])
def test_cluster_bump_is_one_command_without_the_value(
    proxy: Proxy, memcached_1: list[MemcachedServer], protocol: str, sent: bytes
) -> None:
    server = memcached_1[0]
    cluster = Cluster([proxy.spec], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]
    cluster.set("here", b"v" * 50_000, 300)
    _, token = cluster.gets("here")
    proxy.forget()
    assert cluster.bump("here") is True
    assert proxy.round_trips == 1
    assert b"".join(proxy.sent()).startswith(sent)
    assert len(b"".join(proxy.received())) < 100  # "HD" or "NOT_STORED": no value came back
    assert cluster.bump("absent") is False
    assert raw_client(server).get("absent") is None  # nothing was created
    assert cluster.gets("here") == (b"v" * 50_000, token)
    ttl = server_ttl(server, "here")
    assert ttl is not None
    assert 295 <= ttl <= 300


def test_meta_bump_counts_as_a_fetch_for_the_lru(memcached_1: list[MemcachedServer]) -> None:
    """memcached's segmented LRU keeps fetched items out of the cold tail; mg h tells.

    (Over text, the ``add`` only refreshes the item's last access, which memcached
    updates at most once a minute: ITEM_UPDATE_INTERVAL.  docs/values.md says so.)
    """
    server = memcached_1[0]
    flush(memcached_1)
    cluster = Cluster([server.spec], ClusterOptions(protocol="meta"))
    cluster.set("idle", 1)
    cluster.set("bumped", 1)
    assert cluster.bump("bumped")
    client = raw_client(server)

    def fetched_before(key: str) -> bytes:  # mg h: whether the item was fetched before
        return client.raw_command(b"mg " + key.encode() + b" h", end_tokens=b"\r\n")

    assert fetched_before("idle") == b"HD h0"
    assert fetched_before("bumped") == b"HD h1"
