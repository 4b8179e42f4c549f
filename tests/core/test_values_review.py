"""Review of issue 17 (values): what a demanding user hits, on real memcached.

- a value over the item limit through ``get_or_compute`` must not leave its
  placeholder behind (every later caller would wait ``policy.wait``, then raise);
- memcached's ``SERVER_ERROR out of memory storing object`` on a write of a
  whole value is "not stored", never an exception into the view.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest
from pymemcache.serde import FLAG_PICKLE

from django_mcpatterns.core.chunks import (
    CHUNKED_MAX_TTL,
    AsyncChunkedStore,
    ChunkedStore,
    ChunkManifest,
)
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.keys import placed
from django_mcpatterns.core.leases import async_get_or_set, get_or_set
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.stampede import AsyncStampede, Stampede, StampedePolicy
from django_mcpatterns.core.values.layout import manifests_read
from tests.conftest import flush
from tests.harness import MemcachedServer, free_port, server_ttl

BIG = os.urandom(2 * 1024 * 1024)  # over memcached's 1 MiB item limit
POLICY = StampedePolicy(wait=3.0)  # a stalled waiter shows within the test's patience


@pytest.fixture(params=["meta", "text"])
def cluster(
    request: pytest.FixtureRequest, memcached_1: list[MemcachedServer]
) -> Iterator[Cluster]:
    flush(memcached_1)
    cluster = Cluster([memcached_1[0].spec], ClusterOptions(protocol=request.param))
    yield cluster
    cluster.close()


# -- get_or_compute of a value over the item limit ------------------------------------


def test_an_uncacheable_value_leaves_no_placeholder_for_the_next_caller(cluster: Cluster) -> None:
    stampede = Stampede(cluster, POLICY)
    assert stampede.fetch("huge", lambda: BIG, 60).value == BIG  # computed, not cached
    impatient = Stampede(cluster, StampedePolicy(wait=0))  # a placeholder left: LockTimeoutError
    fetched = impatient.fetch("huge", lambda: b"next", 60)
    assert (fetched.value, fetched.outcome) == (b"next", "computed")  # not a 3 s wait, then raise
    assert cluster.get("huge") == b"next" or cluster.get("huge") is None


def test_an_uncacheable_value_leaves_no_placeholder_async_too(cluster: Cluster) -> None:
    async def scenario() -> tuple[object, str]:
        stampede = AsyncStampede(cluster.aio, POLICY)
        assert (await stampede.fetch("huge", lambda: BIG, 60)).value == BIG
        impatient = AsyncStampede(cluster.aio, StampedePolicy(wait=0))
        fetched = await impatient.fetch("huge", lambda: b"next", 60)
        return fetched.value, fetched.outcome

    value, outcome = asyncio.run(scenario())
    assert (value, outcome) == (b"next", "computed")  # a placeholder left would raise at once


# -- memcached out of memory ----------------------------------------------------------


@pytest.fixture(scope="module")
def full_server() -> Iterator[MemcachedServer]:
    """A 2 MB memcached that answers "out of memory" instead of evicting (-M)."""
    server = MemcachedServer(free_port(), extra_args=("-M",), memory_mb=2).start()
    yield server
    server.stop()


@pytest.mark.parametrize("protocol", ["meta", "text"])
@pytest.mark.parametrize("command", ["set", "add", "cas"])
def test_out_of_memory_is_not_stored_never_an_exception(
    full_server: MemcachedServer, protocol: str, command: str
) -> None:
    full_server.flush()
    cluster = Cluster([full_server.spec], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]
    answers = []
    try:
        for i in range(40):
            key = f"{command}:{i}"
            value = os.urandom(400_000)
            if command == "cas":
                cluster.set(key, b"")  # a small item to swap, while memory lasts
                _, token = cluster.gets(key)
                answers.append(cluster.cas(key, value, token) if token is not None else False)
            else:
                answers.append(getattr(cluster, command)(key, value))
        assert False in answers  # memory ran out: answered "not stored"
        assert answers[0] is True
        assert asyncio.run(cluster.aio.set("async", os.urandom(400_000))) is False
    finally:
        cluster.close()


# -- touch of a chunked value ---------------------------------------------------------


def chunked(cluster: Cluster) -> ChunkedStore:
    return ChunkedStore(cluster, cluster.options.max_item_size)


def chunk_keys(cluster: Cluster, key: str) -> list[str]:
    with manifests_read():
        manifest = cluster.get(key)
    assert type(manifest) is ChunkManifest
    wire, ring = placed(key)
    return [chunk.key.decode() for chunk in manifest.keys(wire, ring)]


def test_touch_renews_a_chunked_value_whole(
    cluster: Cluster, memcached_1: list[MemcachedServer]
) -> None:
    store = chunked(cluster)
    assert store.set("big", BIG, 2)
    assert store.touch("big", 100)  # Django's touch: True, so the value must outlive 2 s
    server = memcached_1[0]
    ttls = [server_ttl(server, chunk) for chunk in chunk_keys(cluster, "big")]
    assert all(ttl is not None and ttl > 50 for ttl in ttls), ttls
    assert store.touch("big", 0)  # "never": chunked items still expire (30 days)
    ttls = [server_ttl(server, key) for key in ["big", *chunk_keys(cluster, "big")]]
    assert all(ttl is not None and 0 < ttl <= CHUNKED_MAX_TTL for ttl in ttls), ttls
    assert store.get("big") == BIG


def test_touch_of_a_chunked_value_missing_a_chunk_is_false(cluster: Cluster) -> None:
    store = chunked(cluster)
    assert store.set("big", BIG, 100)
    cluster.delete(chunk_keys(cluster, "big")[1])
    assert store.touch("big", 100) is False  # it reads as a miss: not there
    assert store.set("small", b"x", 100)
    assert store.touch("small", 200)
    assert store.touch("absent", 200) is False


def test_async_touch_renews_a_chunked_value_whole(
    cluster: Cluster, memcached_1: list[MemcachedServer]
) -> None:
    store = AsyncChunkedStore(cluster.aio, cluster.options.max_item_size)

    async def scenario() -> bool:
        assert await store.set("big", BIG, 2)
        return await store.touch("big", 100)

    assert asyncio.run(scenario())
    ttls = [server_ttl(memcached_1[0], chunk) for chunk in chunk_keys(cluster, "big")]
    assert all(ttl is not None and ttl > 50 for ttl in ttls), ttls


# -- a chunked value that lost a chunk --------------------------------------------------


def test_a_value_that_lost_a_chunk_is_cached_again(cluster: Cluster) -> None:
    """Eviction takes a chunk (big items sit in their own slab class) and leaves the
    small manifest: the value reads as a miss, and the next fill must land, not be
    refused by the manifest's add forever (get_or_set recomputed on every call)."""
    store = chunked(cluster)
    assert store.set("report", BIG, 600)
    cluster.delete(chunk_keys(cluster, "report")[1])
    assert store.get("report") is None
    assert get_or_set(store, "report", lambda: b"recomputed", 600) == b"recomputed"
    assert get_or_set(store, "report", lambda: b"again", 600) == b"recomputed"
    assert store.add("other", BIG, 600)
    cluster.delete(chunk_keys(cluster, "other")[0])
    assert store.get_many(["other"]) == {}
    assert store.add("other", b"small", 600)  # the broken manifest no longer blocks add


def test_a_value_that_lost_a_chunk_is_cached_again_async(cluster: Cluster) -> None:
    store = AsyncChunkedStore(cluster.aio, cluster.options.max_item_size)

    async def scenario() -> list[object]:
        assert await store.set("report", BIG, 600)
        cluster.delete(chunk_keys(cluster, "report")[2])
        first = await async_get_or_set(store, "report", lambda: b"recomputed", 600)
        return [first, await async_get_or_set(store, "report", lambda: b"again", 600)]

    assert asyncio.run(scenario()) == [b"recomputed", b"recomputed"]


# -- a manifest nobody could have written -------------------------------------------------


class CountingStore:
    """The cluster, counting the keys each ``get_many`` asks for."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.serde = cluster.serde
        self.asked: list[int] = []

    def get_many(self, keys: Any) -> dict[Any, Any]:
        keys = list(keys)
        self.asked.append(len(keys))
        return self.cluster.get_many(keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cluster, name)


def test_a_forged_manifest_cannot_make_a_reader_ask_for_millions_of_chunks(
    cluster: Cluster,
) -> None:
    """The manifest is not signed (41 bytes anyone with write access can put there):
    its chunk count must not decide how much memory and traffic a reader spends."""
    forged = ChunkManifest(FLAG_PICKLE, 2**40, 200_000, os.urandom(8), bytes(16)).encoded()
    assert cluster.set("forged", forged, 600)
    counting = CountingStore(cluster)
    store = ChunkedStore(counting, cluster.options.max_item_size)  # type: ignore[arg-type]
    assert store.get("forged", "miss") == "miss"
    assert max(counting.asked, default=0) < 1000, counting.asked
