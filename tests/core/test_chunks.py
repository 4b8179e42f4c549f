"""Values over the item size limit, stored in chunks (``large_values="chunk"``).

On real servers: the chunks live on the key's server, a read costs at most two
round trips (counted on the wire), a lost or mismatched chunk reads as a miss,
and every item a chunked write leaves behind expires.  The algorithm is the
async source's; the embedded store runs both its forms.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_mcpatterns.core.chunks import (
    CHUNKED_MAX_TTL,
    FLAG_CHUNKED,
    AsyncChunkedStore,
    ChunkedStore,
    ChunkManifest,
)
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.envelope import Envelope
from django_mcpatterns.core.exceptions import ValueTooLargeError
from django_mcpatterns.core.keys import placed
from django_mcpatterns.core.memory import AsyncMemoryStore, MemoryStore
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.serializers import SerdeOptions, ValueRefused
from django_mcpatterns.core.values.layout import manifests_read
from tests.conftest import flush
from tests.drills.proxy import Proxy
from tests.harness import LOOPBACK, MemcachedServer, server_ttl, servers_holding

MIB = 1024 * 1024
BIG = os.urandom(3 * MIB + 12345)  # random: compression cannot make it fit


def chunked_memory(max_item_size: int = 64 * 1024, **options: Any) -> ChunkedStore:
    serde = SerdeOptions(**options).build()
    store = MemoryStore(serde=serde, max_item_size=max_item_size, max_bytes=64 * MIB)
    return ChunkedStore(store, max_item_size)


def manifest_of(store: ChunkedStore, key: str) -> ChunkManifest:
    with manifests_read():
        found = store.store.get(key)
    assert type(found) is ChunkManifest
    return found


def metadump(server: MemcachedServer) -> dict[str, int]:
    """Every key memcached holds, with its exptime (-1: never), from ``lru_crawler metadump``."""
    with socket.create_connection((LOOPBACK, server.port), timeout=5) as conn:
        conn.sendall(b"lru_crawler metadump all\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            data += conn.recv(65536)
    items = {}
    for line in data.decode().splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "key" in fields:
            items[fields["key"]] = int(fields["exp"])
    return items


# -- the embedded store: both forms of the algorithm ------------------------------------


def test_a_value_over_the_limit_reads_back_whole() -> None:
    store = chunked_memory()
    value = {"blob": BIG[: 300 * 1024], "n": 1}
    assert store.set("big", value)
    assert store.get("big") == value
    manifest = manifest_of(store, "big")
    assert manifest.count == 5  # 300 KB in chunks under 64 KB items
    assert store.store.stats()["curr_items"] == 1 + manifest.count


def test_values_that_fit_are_plain_items() -> None:
    store = chunked_memory()
    assert store.set("small", "x" * 1000)
    assert store.store.stats()["curr_items"] == 1
    assert store.get("small") == "x" * 1000


def test_without_chunks_a_value_over_the_limit_is_refused() -> None:
    store = MemoryStore(max_item_size=64 * 1024)
    store.set("big", "old")
    with pytest.raises(ValueTooLargeError):
        store.set("big", BIG[: 300 * 1024])
    assert store.get("big") is None  # Django's contract: a failed set removes the old value


def test_async_form_stores_and_reads_what_the_sync_form_does() -> None:
    sync = chunked_memory()
    astore = AsyncChunkedStore(AsyncMemoryStore(sync.store), sync.max_item_size)  # type: ignore[arg-type]
    value = BIG[: 200 * 1024]

    async def scenario() -> None:
        assert await astore.set("a", value)
        assert await astore.get("a") == value
        assert await astore.get_many(["a", "nope"]) == {"a": value}
        assert await astore.add("a", b"other") is False

    asyncio.run(scenario())
    assert sync.get("a") == value  # one store, two forms


def test_a_lost_chunk_reads_as_a_miss_never_a_partial_value() -> None:
    store = chunked_memory()
    store.set("big", BIG[: 300 * 1024])
    manifest = manifest_of(store, "big")
    store.store.delete(manifest.keys(*placed("big"))[2])  # evicted, or its server restarted
    assert store.get("big", "miss") == "miss"
    assert store.get_many(["big"]) == {}
    assert store.gets("big") == (None, None)


def test_a_chunk_of_another_write_reads_as_a_miss_never_a_wrong_value() -> None:
    store = chunked_memory()
    store.set("big", b"a" * 300 * 1024)
    chunks = manifest_of(store, "big").keys(*placed("big"))
    store.store.set(chunks[1], b"b" * len(store.store.get(chunks[1])))  # same size, other bytes
    assert store.get("big", "miss") == "miss"


def test_add_that_loses_leaves_the_current_value_whole() -> None:
    store = chunked_memory()
    store.set("big", b"first" * 60_000)
    assert store.add("big", b"second" * 60_000) is False
    assert store.get("big") == b"first" * 60_000


def test_cas_of_a_chunked_value() -> None:
    store = chunked_memory()
    store.set("big", b"first" * 60_000)
    value, token = store.gets("big")
    assert value == b"first" * 60_000
    assert store.cas("big", b"second" * 60_000, token)
    assert store.cas("big", b"third" * 60_000, token) is False
    assert store.get("big") == b"second" * 60_000


def test_soft_expiry_envelopes_are_chunked_too() -> None:
    store = chunked_memory()
    envelope = Envelope(b"e" * 200_000, soft_expiry=4e9, hard_expiry=4e9, compute_time=0.5)
    assert store.set("env", envelope)
    assert store.gets_envelope("env")[0] == envelope
    assert store.get_many_envelopes(["env"]) == {"env": envelope}
    assert store.get("env") == b"e" * 200_000


def test_set_many_mixes_chunked_and_plain_values() -> None:
    store = chunked_memory()
    values = {"small": 1, "big1": b"1" * 150_000, "big2": "2" * 150_000}
    assert store.set_many(values) == []
    assert store.get_many(["small", "big1", "big2"]) == values


def test_the_plain_store_never_hands_out_a_manifest() -> None:
    """Patterns read through the plain store: a chunked value is a miss there, not an object."""
    store = chunked_memory()
    store.set("big", b"x" * 100_000)
    assert store.store.get("big", "miss") == "miss"
    assert store.store.gets_envelope("big") == (None, None)
    assert store.store.get_many(["big"]) == {}
    assert store.get("big") == b"x" * 100_000


def test_a_reader_without_chunks_refuses_the_manifest() -> None:
    store = chunked_memory()
    store.set("big", b"x" * 100_000)
    refused: list[ValueRefused] = []
    plain = MemoryStore(serde=SerdeOptions().build(refused.append))
    plain._items[b"big"] = store.store._items[b"big"]
    assert plain.get("big", "miss") == "miss"
    assert refused[0].reason == "format"
    assert "large_values" in refused[0].detail
    assert refused[0].flags == FLAG_CHUNKED


# -- real servers --------------------------------------------------------------------


@pytest.fixture
def servers(memcached_3: list[MemcachedServer]) -> list[MemcachedServer]:
    flush(memcached_3)
    return memcached_3


def chunked_cluster(specs: list[str], **options: Any) -> ChunkedStore:
    cluster = Cluster(specs, ClusterOptions(large_values="chunk", timeout=5.0, **options))
    return ChunkedStore(cluster, cluster.options.max_item_size)


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_chunks_live_on_the_keys_own_server(servers: list[MemcachedServer], protocol: str) -> None:
    store = chunked_cluster([s.spec for s in servers], protocol=protocol)
    for key in ("big:a", "big:b", "big:c"):
        assert store.set(key, BIG)
        home = servers_holding(servers, key)
        assert len(home) == 1
        for chunk in manifest_of(store, key).keys(*placed(key)):
            assert servers_holding(servers, chunk) == home
        assert store.get(key) == BIG


def test_signed_compressed_and_chunked(servers: list[MemcachedServer]) -> None:
    store = chunked_cluster(
        [s.spec for s in servers], signing_key="k" * 32, compressor="zlib", compress_min_len=1024
    )
    value = {"noise": BIG, "text": "abc" * 300_000}
    assert store.set("mixed", value)
    assert store.get("mixed") == value


@pytest.fixture
def proxy(memcached_1: list[MemcachedServer]) -> Iterator[Proxy]:
    flush(memcached_1)
    with Proxy(memcached_1[0].port) as proxy:
        yield proxy


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_a_chunked_read_costs_two_round_trips(proxy: Proxy, protocol: str) -> None:
    store = chunked_cluster([proxy.spec], protocol=protocol)
    store.set_many({"one": BIG, "two": BIG[::-1], "small": 1})
    proxy.forget()
    assert store.get("one") == BIG
    assert proxy.round_trips == 2  # the manifest, then every chunk in one multi-get
    proxy.forget()
    assert store.get_many(["one", "two", "small", "absent"]) == {
        "one": BIG,
        "two": BIG[::-1],
        "small": 1,
    }
    assert proxy.round_trips == 2  # however many values are chunked
    proxy.forget()
    assert store.get("small") == 1
    assert proxy.round_trips == 1


def test_everything_a_chunked_write_leaves_expires(memcached_1: list[MemcachedServer]) -> None:
    server = memcached_1[0]
    flush(memcached_1)
    store = chunked_cluster([server.spec])
    store.set("never", BIG)  # no TTL asked: chunks must still expire, so the value gets 30 days
    store.set("never", BIG[::-1])  # overwritten: the first chunks are orphans
    store.set("never", "small now")
    store.set("gone", BIG, 600)
    store.delete("gone")
    dumped = metadump(server)
    assert len(dumped) == 1 + 4 * 3  # the small value, and three generations of four chunks
    assert dumped.pop("never") == -1  # the small value keeps its "never"
    assert all(exp != -1 for exp in dumped.values())
    for key in [k for k in dumped if k.startswith("mcp:chunk:")]:
        ttl = server_ttl(server, key)
        assert ttl is not None
        assert 0 < ttl <= CHUNKED_MAX_TTL


def test_racing_writers_and_readers_see_whole_values_or_misses(
    memcached_1: list[MemcachedServer],
) -> None:
    """Real threads: two writers replace a chunked value while two readers read it."""
    flush(memcached_1)
    spec = memcached_1[0].spec
    values = [os.urandom(1024) * (1500 + 300 * i) for i in range(4)]  # 1.5 to 2.4 MB
    seen: list[Any] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def write(offset: int) -> None:
        store = chunked_cluster([spec])
        i = offset
        try:
            while not stop.is_set():
                store.set("raced", values[i % len(values)])  # False when memcached had no room
                i += 2
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        store = chunked_cluster([spec])
        try:
            while not stop.is_set():
                seen.append(store.get("raced"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in (0, 1)]
    threads += [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert errors == []
    whole = [value for value in seen if value is not None]
    assert whole, "no read completed"
    assert all(any(value == v for v in values) for value in whole)


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_the_async_form_over_async_cluster(proxy: Proxy, protocol: str) -> None:
    """AsyncChunkedStore on real servers: the same items, and two round trips a read."""
    cluster = Cluster([proxy.spec], ClusterOptions(protocol=protocol, timeout=5.0))  # type: ignore[arg-type]
    store = AsyncChunkedStore(cluster.aio, cluster.options.max_item_size)

    async def scenario() -> None:
        assert await store.set("big", BIG)
        await store.get("warm")  # the channel is open
        proxy.forget()
        assert await store.get("big") == BIG
        assert proxy.round_trips == 2
        values = await asyncio.gather(store.get("big"), store.get_many(["big", "absent"]))
        assert values == [BIG, {"big": BIG}]

    asyncio.run(scenario())
    assert ChunkedStore(cluster, cluster.options.max_item_size).get("big") == BIG  # the sync form


@pytest.mark.parametrize("message", ["out of memory storing object", "Out of memory during read"])
def test_a_chunk_memcached_had_no_memory_for_is_a_failed_write_not_an_error(message: str) -> None:
    """Under a stream of large items memcached may answer SERVER_ERROR out of memory."""
    from django_mcpatterns.core.protocol.decoding import StoreMany
    from django_mcpatterns.core.wire import STORED, ErrorReply

    many = StoreMany({b"a": (b"1", 0), b"b": (b"2", 0)}, 0)
    replies = [STORED, ErrorReply("SERVER_ERROR", message)]
    assert many.result(replies, [b"a", b"b"]) == [b"b"]
