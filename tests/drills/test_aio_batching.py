"""Auto-batching on the wire: what concurrent asyncio tasks cost, counted by the proxy.

Three servers, each behind a :class:`~tests.drills.proxy.Proxy`; the figures are
those docs/async.md and docs/benchmarks.md quote.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

from django_mcpatterns.core.aio import AsyncCluster
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.options import ClusterOptions
from tests.aio import Blocking
from tests.conftest import flush
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer


@pytest.fixture
def proxies(memcached_3: list[MemcachedServer]) -> Iterator[list[Proxy]]:
    flush(memcached_3)
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(Proxy(server.port)) for server in memcached_3]


@pytest.fixture
def cluster(proxies: list[Proxy]) -> Iterator[Blocking]:
    adapter = Blocking(AsyncCluster([p.spec for p in proxies], ClusterOptions(timeout=2.0)))
    # Open every server's channel: what follows is counted alone.
    adapter.set_many({f"warm:{i}": i for i in range(30)})
    assert all(p.connections for p in proxies)
    for proxy in proxies:
        proxy.forget()
    yield adapter
    adapter.shutdown()


def round_trips(proxies: list[Proxy]) -> int:
    return sum(p.round_trips for p in proxies)


def wire(proxies: list[Proxy]) -> bytes:
    return b"".join(b"".join(p.sent()) for p in proxies)


KEYS = [f"key:{i}" for i in range(50)]


def test_50_concurrent_gets_of_different_keys_cost_one_request_per_server(
    cluster: Blocking, proxies: list[Proxy]
) -> None:
    cluster.set_many({key: key.upper() for key in KEYS})
    for proxy in proxies:
        proxy.forget()

    async def gets() -> list[object]:
        return await asyncio.gather(*[cluster.store.get(key) for key in KEYS])

    assert cluster.run(gets) == [key.upper() for key in KEYS]
    assert round_trips(proxies) == 3
    assert wire(proxies).count(b"get ") == 3  # one multi-key get per server


def test_50_concurrent_gets_of_one_key_put_it_on_the_wire_once(
    cluster: Blocking, proxies: list[Proxy]
) -> None:
    cluster.set("hot", {"n": 1})
    for proxy in proxies:
        proxy.forget()

    async def gets() -> list[object]:
        return await asyncio.gather(*[cluster.store.get("hot") for _ in range(50)])

    values = cluster.run(gets)
    assert values == [{"n": 1}] * 50
    assert len({id(value) for value in values}) == 50  # each caller its own copy
    assert round_trips(proxies) == 1
    assert wire(proxies).count(b"hot") == 1


def test_a_get_joins_the_fetch_of_its_key_already_in_flight(
    cluster: Blocking, proxies: list[Proxy]
) -> None:
    cluster.set("slow", "value")
    for proxy in proxies:
        proxy.forget()
        proxy.delay = 0.1  # the first fetch is still on its way when the others ask

    async def staggered() -> list[object]:
        first = asyncio.ensure_future(cluster.store.get("slow"))
        await asyncio.sleep(0.02)  # written, not answered
        later = [asyncio.ensure_future(cluster.store.get("slow")) for _ in range(10)]
        await asyncio.sleep(0.02)
        later += [asyncio.ensure_future(cluster.store.gets("slow"))]  # wants a cas: its own
        return await asyncio.gather(first, *later)

    values = cluster.run(staggered)
    assert values[:11] == ["value"] * 11
    assert values[11][0] == "value"
    assert values[11][1] is not None
    assert wire(proxies).count(b"get slow") == 1
    assert wire(proxies).count(b"gets slow") == 1


def test_a_get_issued_after_a_completed_write_reads_it(cluster: Blocking) -> None:
    """Deduplication never serves a write's caller the value from before it."""

    async def write_then_read() -> list[object]:
        await cluster.store.set("k", 0)
        reader = asyncio.ensure_future(cluster.store.get("k"))
        await asyncio.sleep(0)  # the read is in flight
        await cluster.store.set("k", 1)
        after = await cluster.store.get("k")
        return [await reader, after]

    assert cluster.run(write_then_read) == [0, 1]


def test_a_get_issued_after_a_write_through_another_connection_reads_it(
    proxies: list[Proxy],
) -> None:
    """A fetch already on the wire is not shared with a read issued after a write that
    completed on another connection of this process (the sync API, as a ``post_save``
    receiver run through ``sync_to_async`` uses, or another loop): it was sent before
    the write, so it may answer the value from before it.  Both forms of read, both APIs.
    """
    cluster = Cluster([p.spec for p in proxies], ClusterOptions(timeout=2.0))
    aio = cluster.aio

    async def scenario() -> list[object]:
        await aio.set_many({"hot": "old", "hot2": "old"})
        for proxy in proxies:
            proxy.delay = 0.1  # a read of the hot keys is always on its way
        readers = [
            asyncio.ensure_future(aio.get("hot")),
            asyncio.ensure_future(aio.get_many(["hot2"])),
        ]
        await asyncio.sleep(0.02)  # written, not answered
        cluster.delete("hot")  # this request's invalidation, through the sync API
        other = Cluster([p.spec for p in proxies])  # another client of this process
        other.set("hot2", "new")
        other.close()
        after = await asyncio.gather(aio.get("hot"), aio.get_many(["hot2"]))
        await asyncio.gather(*readers)
        await aio.close()
        return after

    try:
        assert asyncio.run(scenario()) == [None, {"hot2": "new"}]
    finally:
        cluster.close()


def test_get_many_and_concurrent_gets_share_one_request_per_server(
    cluster: Blocking, proxies: list[Proxy]
) -> None:
    cluster.set_many({key: key for key in KEYS})
    for proxy in proxies:
        proxy.forget()

    async def mixed() -> list[object]:
        return await asyncio.gather(
            cluster.store.get_many(KEYS[:25]),
            cluster.store.get_many(KEYS[20:]),
            *[cluster.store.get(key) for key in KEYS[10:40]],
        )

    first, second, *singles = cluster.run(mixed)
    assert first == {key: key for key in KEYS[:25]}
    assert second == {key: key for key in KEYS[20:]}
    assert singles == KEYS[10:40]
    assert round_trips(proxies) == 3
    sent = wire(proxies)
    assert all(
        sent.count(key.encode() + b" ") + sent.count(key.encode() + b"\r") == 1 for key in KEYS
    )


def test_concurrent_writes_are_pipelined_one_round_trip_per_server(
    cluster: Blocking, proxies: list[Proxy]
) -> None:
    async def writes() -> list[object]:
        return await asyncio.gather(*[cluster.store.set(key, i) for i, key in enumerate(KEYS)])

    assert cluster.run(writes) == [True] * 50
    assert round_trips(proxies) == 3
    assert cluster.get_many(KEYS) == {key: i for i, key in enumerate(KEYS)}
