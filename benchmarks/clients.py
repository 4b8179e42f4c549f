"""The contenders of bench_clients.py: each client made as its docs say, on its own keys.

Every factory connects, stores its own keys (100-byte ``bytes`` values, which every client
stores as they are) and returns its operations as calls bound to them, with the settings
it was made with (printed beside the results).  A peer that is not installed raises
ImportError: ``INSTALL`` says how to install it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from typing import Any

from django_mcpatterns.core.aio import AsyncCluster
from django_mcpatterns.core.cluster import Cluster

VALUE = b"v" * 100
MANY = 100
THREADS = 8
TASKS, TASK_GETS = 50, 200

INSTALL = {
    "pylibmc": "pip install --no-binary pylibmc pylibmc (needs libmemcached-dev, gcc)",
    "pymemcache": "pip install pymemcache",
    "meta-memcache": "pip install meta-memcache meta-memcache-socket",
    "aiomcache": "pip install aiomcache",
    "emcache": "pip install emcache",
}


@dataclass
class SyncClient:
    """One sync contender: its operations as calls of no argument, bound to its own keys."""

    name: str
    config: str
    get: Callable[[], object]
    set: Callable[[], object]
    get_many: Callable[[], object]
    # One get function per thread (the same client shared, or one client each).
    thread_gets: Callable[[int], list[Callable[[], object]]]
    check: Callable[[], bool]


@dataclass
class AsyncClient:
    """One asyncio contender: ``get(key)`` returns an awaitable.

    ``one`` (the key of the sequential gets) and ``distinct`` (a key for each get of the
    50-task case) are stored before the rounds.
    """

    name: str
    config: str
    get: Callable[[Any], Awaitable[object]]
    one: Any
    distinct: list[Any]
    close: Callable[[], Awaitable[object]]
    check: Callable[[], Awaitable[bool]]


def keys(tag: str) -> tuple[str, list[str], list[str]]:
    """A contender's own keys: the single key, the many keys, one key per thread."""
    return (
        f"bc:{tag}:one",
        [f"bc:{tag}:m{i}" for i in range(MANY)],
        [f"bc:{tag}:t{i}" for i in range(THREADS)],
    )


# -- the sync contenders ----------------------------------------------------------------


def ours_sync(spec: str) -> SyncClient:
    cluster = Cluster([spec])
    one, many, per_thread = keys("ours")
    cluster.set(one, VALUE)
    cluster.set_many(dict.fromkeys(many + per_thread, VALUE))
    return SyncClient(
        "ours Cluster",
        "defaults (meta protocol); shared by the threads",
        get=lambda: cluster.get(one),
        set=lambda: cluster.set(one, VALUE),
        get_many=lambda: cluster.get_many(many),
        thread_gets=lambda n: [partial(cluster.get, k) for k in per_thread[:n]],
        check=lambda: cluster.get(one) == VALUE and len(cluster.get_many(many)) == MANY,
    )


def pylibmc_sync(spec: str) -> SyncClient:
    import pylibmc

    client = pylibmc.Client([spec], binary=False)
    one, many, per_thread = keys("pylibmc")
    client.set(one, VALUE)
    client.set_multi(dict.fromkeys(many + per_thread, VALUE))

    def thread_gets(n: int) -> list[Callable[[], object]]:
        return [partial(client.clone().get, k) for k in per_thread[:n]]

    return SyncClient(
        "pylibmc",
        f"{metadata.version('pylibmc')}, text protocol, default behaviors; a clone per thread",
        get=lambda: client.get(one),
        set=lambda: client.set(one, VALUE),
        get_many=lambda: client.get_multi(many),
        thread_gets=thread_gets,
        check=lambda: client.get(one) == VALUE and len(client.get_multi(many)) == MANY,
    )


def pymemcache_sync(spec: str) -> SyncClient:
    from pymemcache.client.base import Client

    host, port = spec.rsplit(":", 1)
    address = (host, int(port))
    client = Client(address, default_noreply=False)
    one, many, per_thread = keys("pymemcache")
    client.set(one, VALUE)
    client.set_many(dict.fromkeys(many + per_thread, VALUE))

    def thread_gets(n: int) -> list[Callable[[], object]]:
        return [partial(Client(address, default_noreply=False).get, k) for k in per_thread[:n]]

    return SyncClient(
        "pymemcache",
        f"{metadata.version('pymemcache')}, base Client, replies on (noreply is its default)"
        "; one Client per thread",
        get=lambda: client.get(one),
        set=lambda: client.set(one, VALUE),
        get_many=lambda: client.get_many(many),
        thread_gets=thread_gets,
        check=lambda: client.get(one) == VALUE and len(client.get_many(many)) == MANY,
    )


def meta_memcache_sync(spec: str) -> SyncClient:
    from meta_memcache import CacheClient, ServerAddress, connection_pool_factory_builder

    host, port = spec.rsplit(":", 1)
    client = CacheClient.cache_client_from_servers(
        [ServerAddress(host, int(port))],
        # Its default read buffer (4 KiB) stalls about 200 ms on most get_many(100) here.
        connection_pool_factory_fn=connection_pool_factory_builder(
            max_pool_size=THREADS, read_buffer_size=65536
        ),
    )
    one, many, per_thread = keys("meta")
    for key in [one, *many, *per_thread]:
        client.set(key, VALUE, ttl=0)
    return SyncClient(
        "meta-memcache",
        f"{metadata.version('meta-memcache')} with meta-memcache-socket "
        f"{metadata.version('meta-memcache-socket')}; shared, pool of {THREADS}, 64 KiB"
        " read buffer (its default 4 KiB stalls 200 ms on get_many(100))",
        get=lambda: client.get(one),
        set=lambda: client.set(one, VALUE, ttl=0),
        get_many=lambda: client.multi_get(many),
        thread_gets=lambda n: [partial(client.get, k) for k in per_thread[:n]],
        check=lambda: client.get(one) == VALUE and len(client.multi_get(many)) == MANY,
    )


SYNC_PEERS: dict[str, Callable[[str], SyncClient]] = {
    "pylibmc": pylibmc_sync,
    "pymemcache": pymemcache_sync,
    "meta-memcache": meta_memcache_sync,
}


# -- the asyncio contenders -------------------------------------------------------------


def distinct(tag: str, encode: bool) -> tuple[Any, list[Any]]:
    one = f"bc:{tag}:aone"
    many = [f"bc:{tag}:d{i}" for i in range(TASKS * TASK_GETS)]
    if encode:
        return one.encode(), [k.encode() for k in many]
    return one, many


async def ours_async(spec: str) -> AsyncClient:
    cluster = AsyncCluster([spec])
    one, many = distinct("ours", encode=False)
    await cluster.set_many(dict.fromkeys([one, *many], VALUE))

    async def check() -> bool:
        return await cluster.get(one) == VALUE and await cluster.get(many[-1]) == VALUE

    return AsyncClient(
        "ours AsyncCluster", "defaults", cluster.get, one, many, cluster.close, check
    )


async def aiomcache_async(spec: str) -> AsyncClient:
    import aiomcache

    host, port = spec.rsplit(":", 1)
    client = aiomcache.Client(host, int(port))
    one, many = distinct("aiomcache", encode=True)
    for key in [one, *many]:
        await client.set(key, VALUE)

    async def check() -> bool:
        return await client.get(one) == VALUE and await client.get(many[-1]) == VALUE

    return AsyncClient(
        "aiomcache",
        f"{metadata.version('aiomcache')}, defaults (pool_size 2)",
        client.get,
        one,
        many,
        client.close,
        check,
    )


async def emcache_async(spec: str, autobatching: bool) -> AsyncClient:
    import emcache

    host, port = spec.rsplit(":", 1)
    # A get queued behind its 2 connections can wait past the default 1 s timeout when the
    # machine is busy: the benchmark would measure timeouts.
    client = await emcache.create_client(
        [emcache.MemcachedHostAddress(host, int(port))], autobatching=autobatching, timeout=10
    )
    one, many = distinct(f"emcache{int(autobatching)}", encode=True)
    for key in [one, *many]:
        await client.set(key, VALUE)

    async def check() -> bool:
        first, last = await client.get(one), await client.get(many[-1])
        return all(item is not None and item.value == VALUE for item in (first, last))

    async def close() -> None:
        await client.close()

    state = "on" if autobatching else "off"
    return AsyncClient(
        f"emcache batching {state}",
        f"{metadata.version('emcache')}, autobatching {state}, timeout 10 s,"
        " defaults (2 connections)",
        client.get,
        one,
        many,
        close,
        check,
    )


# (the package, its contender)
ASYNC_PEERS: list[tuple[str, Callable[[str], Coroutine[Any, Any, AsyncClient]]]] = [
    ("aiomcache", aiomcache_async),
    ("emcache", lambda spec: emcache_async(spec, autobatching=True)),
    ("emcache", lambda spec: emcache_async(spec, autobatching=False)),
]
