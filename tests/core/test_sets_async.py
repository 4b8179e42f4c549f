"""Append-based sets and lists in asyncio (``AsyncAppendSets``, ``AsyncAppendLists``).

The behaviour of both forms is tested once, in asyncio, by
``tests/core/patterns/_async/test_sets.py`` (its sync form generated beside it).
Here is what needs both forms at once or asyncio alone: on the embedded store
(``AsyncMemoryStore`` sharing a ``MemoryStore`` with a sync reader, so both forms
must agree on every byte), with real tasks interleaving at every request
(:class:`Yielding`), and on real memcached through the AsyncCluster twin of a
Cluster (``Cluster.aio``).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import IncompleteSetError
from django_mcpatterns.core.memory import AsyncMemoryStore, MemoryStore
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.sets import (
    AppendLists,
    AppendSets,
    AsyncAppendLists,
    AsyncAppendSets,
    SetOptions,
)
from django_mcpatterns.core.sets._model_layout import Member
from tests.conftest import flush
from tests.fakes import STORE_METHODS
from tests.harness import MemcachedServer

T = TypeVar("T")

ITEM = 4096
SMALL = SetOptions(item_size_max=ITEM, headroom=64, compact_min_bytes=256, max_shards=64)
EAGER = SetOptions(
    item_size_max=ITEM, headroom=64, compact_min_bytes=256, max_shards=64, compact_on_write=1.0
)


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


class Yielding:
    """An AsyncStore that lets every other ready task run before each request,
    as a network round trip would: the tasks of a test interleave at every
    ``await`` of the algorithm.  ``most`` is the largest number of requests
    that were in flight at once."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.in_flight = 0
        self.most = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in STORE_METHODS:
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                await asyncio.sleep(0)
                return await attr(*args, **kwargs)
            finally:
                self.in_flight -= 1

        return call


@pytest.fixture
def memory() -> MemoryStore:
    return MemoryStore(max_item_size=ITEM)


@pytest.fixture
def asets(memory: MemoryStore) -> AsyncAppendSets:
    return AsyncAppendSets(AsyncMemoryStore(memory), SMALL, rng=random.Random(7))


@pytest.fixture
def sets(memory: MemoryStore) -> AppendSets:
    """A sync reader and writer of the same data."""
    return AppendSets(memory, SMALL, rng=random.Random(8))


# -- the API, side by side with the sync form ---------------------------------------


def test_every_set_method_answers_as_its_sync_form(
    asets: AsyncAppendSets, sets: AppendSets
) -> None:
    async def scenario() -> None:
        assert await asets.sadd("a", 1, "x", b"y", 1) == 3
        assert await asets.srem("a", "x") == 1
        assert await asets.smembers("a") == sets.smembers("a") == {1, b"y"}
        assert await asets.sismember("a", 1) is True
        assert await asets.smismember("a", 1, "x", b"y") == [True, False, True]
        assert await asets.scard("a") == 2
        assert await asets.srandmember("a") in {1, b"y"}
        assert sorted(map(repr, await asets.srandmember("a", 5))) == ["1", "b'y'"]
        sets.sadd("b", 1, 2, 3)
        assert await asets.sunion("a", "b") == {1, 2, 3, b"y"}
        assert await asets.sinter("a", "b") == {1}
        assert await asets.sdiff("b", "a") == {2, 3}
        assert await asets.sunionstore("u", "a", "b") == 4
        assert await asets.sinterstore("i", "a", "b") == 1
        assert await asets.sdiffstore("d", "b", "a") == 2
        assert sets.smembers("u") == {1, 2, 3, b"y"}
        assert sets.smembers("i") == {1}
        assert sets.smembers("d") == {2, 3}
        assert await asets.smove("b", "c", 2) is True
        assert await asets.smove("b", "c", 99) is False
        assert sets.smembers("c") == {2}
        assert await asets.spop("c") == 2
        assert await asets.spop("c") is None
        assert await asets.spop("d", 5) == {2, 3}
        assert await asets.smembers("missing") == set()
        assert await asets.scard("missing") == 0

    run(scenario())


ops_st = st.lists(
    st.tuples(
        st.sampled_from(["sadd", "srem"]),
        st.sampled_from(["s", "t"]),
        st.lists(st.integers(0, 400) | st.text("ab", max_size=3), min_size=1, max_size=30),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops_st)
def test_async_writes_match_a_python_model_and_the_sync_reader(
    ops: list[tuple[str, str, list[Member]]],
) -> None:
    """Small items: compaction, fullness and shards all happen, and both forms agree."""
    memory = MemoryStore(max_item_size=ITEM)
    asets = AsyncAppendSets(AsyncMemoryStore(memory), SMALL, rng=random.Random(1))
    sets = AppendSets(memory, SMALL, rng=random.Random(2))
    model: dict[str, set[Member]] = {"s": set(), "t": set()}

    async def scenario() -> None:
        for op, key, members in ops:
            await getattr(asets, op)(key, *members)
            getattr(model[key], "update" if op == "sadd" else "difference_update")(members)
            assert await asets.smembers(key) == model[key]
        assert await asets.sunion("s", "t") == model["s"] | model["t"]
        assert await asets.sinter("s", "t") == model["s"] & model["t"]

    run(scenario())
    assert sets.smembers("s") == model["s"]
    assert sets.smembers("t") == model["t"]


def test_a_large_set_spills_into_shards_and_reads_back(
    asets: AsyncAppendSets, sets: AppendSets
) -> None:
    members = [f"member-{i:05d}" for i in range(3000)]

    async def scenario() -> None:
        for start in range(0, len(members), 300):
            await asets.sadd("big", *members[start : start + 300])
        assert await asets.smembers("big") == set(members)
        assert await asets.smismember("big", "member-00007", "nope") == [True, False]
        await asets.srem("big", *members[:2900])
        assert await asets.smembers("big") == set(members[2900:])

    run(scenario())
    assert sets.smembers("big") == set(members[2900:])


# -- loaders: a coroutine function, or a plain callable off the loop ------------------


def test_a_coroutine_loader_is_awaited_on_the_loop_once(asets: AsyncAppendSets) -> None:
    calls: list[int] = []

    async def load() -> list[Member]:
        calls.append(threading.get_ident())
        await asyncio.sleep(0)
        return [1, 2, 3]

    async def scenario() -> None:
        assert await asets.smembers("loaded", loader=load) == {1, 2, 3}
        assert await asets.sismember("loaded", 2, loader=load) is True
        assert await asets.sadd("loaded", 4, loader=load) == 1
        assert await asets.smembers("loaded", loader=load) == {1, 2, 3, 4}

    run(scenario())
    assert calls == [threading.get_ident()]  # asyncio.run runs the loop on this thread


def test_a_plain_loader_runs_off_the_loop_thread_once(asets: AsyncAppendSets) -> None:
    """It may use Django's ORM, which refuses to run in an event loop."""
    threads: list[int] = []

    def load() -> list[Member]:
        threads.append(threading.get_ident())
        with pytest.raises(RuntimeError):
            asyncio.get_running_loop()  # not on the loop's thread
        return ["a", "b"]

    async def scenario() -> None:
        assert await asets.smembers("orm", loader=load) == {"a", "b"}
        assert await asets.scard("orm", loader=load) == 2

    run(scenario())
    assert len(threads) == 1
    assert threads[0] != threading.get_ident()


def test_a_loader_backed_set_is_never_created_by_a_writer(asets: AsyncAppendSets) -> None:
    async def scenario() -> None:
        assert await asets.sadd("lazy", 1, loader=lambda: [9]) == 1
        assert await asets.smembers("lazy", loader=lambda: [9]) == {9}  # the loader's, then
        assert await asets.sadd("lazy", 1, loader=lambda: [9]) == 1
        assert await asets.smembers("lazy", loader=lambda: [9]) == {1, 9}

    run(scenario())


def test_a_set_being_loaded_is_not_read_as_complete(
    asets: AsyncAppendSets, memory: MemoryStore
) -> None:
    async def scenario() -> None:
        blocked = asyncio.Event()

        async def slow() -> list[Member]:
            await blocked.wait()
            return [1]

        loading = asyncio.create_task(asets.smembers("pending", loader=slow))
        await asyncio.sleep(0.01)  # the pending item exists, the loader waits
        with pytest.raises(IncompleteSetError):
            await asets.smembers("pending")
        blocked.set()
        assert await loading == {1}
        assert await asets.smembers("pending") == {1}

    run(scenario())


# -- real tasks: concurrent writers lose nothing ------------------------------------


def test_fifty_tasks_adding_distinct_members_lose_none(memory: MemoryStore) -> None:
    """Every request yields to the other tasks; writes compact as they go (rewrite races)."""
    store = Yielding(AsyncMemoryStore(memory))
    asets = AsyncAppendSets(store, EAGER)  # type: ignore[arg-type]

    async def writer(task: int) -> None:
        for i in range(20):
            await asets.sadd("shared", f"t{task}-m{i}")
            if i % 5 == 0:
                await asets.srem("shared", f"t{task}-gone")

    async def scenario() -> set[Member]:
        await asyncio.gather(*(writer(task) for task in range(50)))
        return await asets.smembers("shared")

    got = run(scenario())
    assert got == {f"t{task}-m{i}" for task in range(50) for i in range(20)}
    assert store.most >= 40  # the tasks really were in flight together
    assert AppendSets(memory, SMALL).smembers("shared") == got


def test_concurrent_pops_in_tasks_never_return_a_member_twice(memory: MemoryStore) -> None:
    store = Yielding(AsyncMemoryStore(memory))
    asets = AsyncAppendSets(store, SMALL)  # type: ignore[arg-type]

    async def scenario() -> list[Any]:
        await asets.sadd("pool", *range(200))
        return await asyncio.gather(*(asets.spop("pool") for _ in range(60)))

    popped = run(scenario())
    assert len(set(popped)) == 60
    assert AppendSets(memory, SMALL).scard("pool") == 140


def _cancel_at_random(asets: AsyncAppendSets, seed: int) -> tuple[set[Member], set[Member]]:
    """50 writers, cancelled at random points: (members acknowledged, members read back)."""
    rng = random.Random(seed)
    acknowledged: set[Member] = set()

    async def writer(task: int) -> None:
        for i in range(8):
            member = f"{task}:{i}"
            await asets.sadd("cancelled", member)
            acknowledged.add(member)

    async def scenario() -> set[Member]:
        tasks = [asyncio.create_task(writer(task)) for task in range(50)]
        for _ in range(40):
            await asyncio.sleep(rng.choice([0, 0, 0.0005]))
            rng.choice(tasks).cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return await asets.smembers("cancelled")

    return acknowledged, run(scenario())


@pytest.mark.parametrize("seed", range(3))
def test_writers_cancelled_at_random_points_lose_no_acknowledged_member(
    memory: MemoryStore, seed: int
) -> None:
    asets = AsyncAppendSets(Yielding(AsyncMemoryStore(memory)), EAGER)  # type: ignore[arg-type]
    acknowledged, found = _cancel_at_random(asets, seed)
    assert acknowledged <= found  # a cancelled write may land or not; an answered one did
    assert 0 < len(acknowledged) < 50 * 8  # the cancellations cut writers short


# -- lists ---------------------------------------------------------------------------


def test_lists_in_asyncio(memory: MemoryStore) -> None:
    alists = AsyncAppendLists(AsyncMemoryStore(memory), SMALL)
    lists = AppendLists(memory, SMALL)

    async def scenario() -> None:
        assert await alists.rpush("l", "a", "b", "a", "c") == 4
        assert await alists.lrange("l", 0, -1) == ["a", "b", "a", "c"]
        assert await alists.llen("l") == 4
        assert await alists.lrem("l", 1, "a") == 1
        assert await alists.lrange("l", 0, -1) == ["b", "a", "c"]
        assert await alists.lrem("missing", 0, "a") == 0
        assert await alists.lrange("l", -2, -1) == ["a", "c"]

    run(scenario())
    assert lists.lrange("l", 0, -1) == ["b", "a", "c"]


def test_fifty_tasks_pushing_lose_nothing() -> None:
    memory = MemoryStore(max_item_size=4 * ITEM)
    store = Yielding(AsyncMemoryStore(memory))
    options = SetOptions(item_size_max=4 * ITEM, headroom=64, compact_min_bytes=256)
    alists = AsyncAppendLists(store, options)  # type: ignore[arg-type]

    async def pusher(task: int) -> None:
        for i in range(4):
            await alists.rpush("log", task * 100 + i)
        await alists.lrem("log", 0, task * 100)  # removals prepend: compaction applies them

    async def scenario() -> list[Member]:
        await asyncio.gather(*(pusher(task) for task in range(50)))
        return await alists.lrange("log", 0, -1)

    got = run(scenario())
    assert sorted(got) == sorted(t * 100 + i for t in range(50) for i in range(1, 4))
    assert store.most >= 40


# -- on real memcached, through the AsyncCluster twin --------------------------------


def _twin(cluster: Cluster) -> Any:
    twin = getattr(type(cluster), "aio", None)
    if twin is None:
        pytest.skip("AsyncCluster (Cluster.aio) is not on this branch yet")
    return cluster.aio  # type: ignore[attr-defined]


@pytest.fixture(params=["meta", "text"])
def on_memcached(
    request: pytest.FixtureRequest, memcached_3: list[MemcachedServer]
) -> Iterator[tuple[AsyncAppendSets, AsyncAppendLists, AppendSets]]:
    flush(memcached_3)
    options = ClusterOptions.from_mapping({"protocol": request.param})
    cluster = Cluster([s.spec for s in memcached_3], options)
    twin = _twin(cluster)
    thresholds = SetOptions(item_size_max=64 * 1024, compact_min_bytes=256)
    yield (
        AsyncAppendSets(twin, thresholds),
        AsyncAppendLists(twin, thresholds),
        AppendSets(cluster, thresholds),
    )
    cluster.close()


def test_sets_and_lists_on_memcached(
    on_memcached: tuple[AsyncAppendSets, AsyncAppendLists, AppendSets],
) -> None:
    asets, alists, sets = on_memcached
    members = [f"m{i:05d}" for i in range(12000)]  # about 90 KB: sharded over the servers

    async def scenario() -> None:
        assert await asets.sadd("s", "a", 1, b"b") == 3
        assert await asets.smembers("s") == {"a", 1, b"b"}
        for start in range(0, len(members), 2000):
            await asets.sadd("big", *members[start : start + 2000])
        assert await asets.scard("big") == len(members)
        assert await asets.smismember("big", "m00001", "zz") == [True, False]
        assert await alists.rpush("l", 1, 2, 1) == 3
        assert await alists.lrem("l", -1, 1) == 1
        assert await alists.lrange("l", 0, -1) == [1, 2]

    run(scenario())
    assert sets.smembers("big") == set(members)


def test_writers_cancelled_at_random_points_on_memcached(
    on_memcached: tuple[AsyncAppendSets, AsyncAppendLists, AppendSets],
) -> None:
    """Cancellations land mid-request: every later request still gets its own reply."""
    asets, _, sets = on_memcached
    acknowledged, found = _cancel_at_random(asets, 11)
    assert acknowledged <= found
    assert sets.smembers("cancelled") == found


def test_fifty_tasks_adding_on_memcached_lose_none(
    on_memcached: tuple[AsyncAppendSets, AsyncAppendLists, AppendSets],
) -> None:
    asets, _, sets = on_memcached

    async def writer(task: int) -> None:
        for i in range(10):
            await asets.sadd("shared", f"t{task}-m{i}")

    async def scenario() -> set[Member]:
        await asyncio.gather(*(writer(task) for task in range(50)))
        return await asets.smembers("shared")

    expected = {f"t{task}-m{i}" for task in range(50) for i in range(10)}
    assert run(scenario()) == expected
    assert sets.smembers("shared") == expected
