"""Exact cached counters: each interleaving that breaks the obvious designs, replayed exactly.

The truth is a list; a writer is ``counter.change(delta)`` around appending to
it.  Hooks slip another caller's steps in at the moment that matters (inside
the loader, between a commit and its apply, after an eviction); every test
ends with ``counter.get() == truth``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from django_mcpatterns.core.aio import AsyncCluster
from django_mcpatterns.core.cached_counters import AsyncCachedCounter, CachedCounter
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.keys import Routed
from django_mcpatterns.core.memory import AsyncMemoryStore, MemoryStore
from django_mcpatterns.core.options import ClusterOptions
from tests.core.asyncio_tools import others_finished
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer


class Truth:
    def __init__(self) -> None:
        self.rows = 0
        self.loads = 0
        self.during_load: list[Callable[[], object]] = []
        self.before_load: list[Callable[[], object]] = []

    def count(self) -> int:
        while self.before_load:  # another caller commits just before the count is taken
            self.before_load.pop(0)()
        seen = self.rows
        self.loads += 1
        while self.during_load:  # another caller acts after the count was taken
            self.during_load.pop(0)()
        return seen


@pytest.fixture
def truth() -> Truth:
    return Truth()


@pytest.fixture
def counter(truth: Truth) -> CachedCounter:
    return CachedCounter(MemoryStore(), "n", truth.count)


def write(counter: CachedCounter, truth: Truth, delta: int = 1) -> None:
    with counter.change(delta):
        truth.rows += delta


def test_hits_are_cached_and_changes_keep_them_exact(counter: CachedCounter, truth: Truth) -> None:
    truth.rows = 5
    assert counter.get() == 5
    assert counter.get() == 5
    assert truth.loads == 1
    write(counter, truth, +3)
    write(counter, truth, -2)
    assert counter.get() == 6
    assert truth.loads == 1


def test_a_rolled_back_write_changes_nothing(counter: CachedCounter, truth: Truth) -> None:
    assert counter.get() == 0
    with pytest.raises(RuntimeError), counter.change(+1):
        raise RuntimeError("rolled back before the commit")
    assert counter.get() == 0


def test_stale_load_is_not_filled_after_a_write_that_found_no_item(
    counter: CachedCounter, truth: Truth
) -> None:
    truth.rows = 2
    truth.during_load.append(lambda: write(counter, truth))  # commits and applies after the count
    assert counter.get() == 2  # that read was concurrent with the write: either answer
    assert counter.get() == 3 == truth.rows  # but the stale 2 was never cached


def test_load_that_saw_a_commit_is_not_filled_before_its_apply(
    counter: CachedCounter, truth: Truth
) -> None:
    change = counter.change(+1)
    change.__enter__()
    truth.rows += 1  # committed; the apply is still to come
    assert counter.get() == 1  # a writer in flight: loaded, not cached
    change.__exit__(None, None, None)
    assert counter.get() == 1 == truth.rows


def test_writer_entering_during_a_load_voids_the_fill(counter: CachedCounter, truth: Truth) -> None:
    change = counter.change(+1)

    def commit_during_load() -> None:
        change.__enter__()
        truth.rows += 1

    truth.before_load.append(commit_during_load)
    assert counter.get() == 1  # the count saw the commit; the apply is still to come
    change.__exit__(None, None, None)  # so the fill was refused, or this would count it twice
    assert counter.get() == 1 == truth.rows


def test_evicted_flight_record_and_a_quiet_looking_fill(
    counter: CachedCounter, truth: Truth
) -> None:
    store = counter.store
    change = counter.change(+1)
    change.__enter__()
    truth.rows += 1
    store.delete(counter.flight_key)  # evicted while the writer is in flight
    assert counter.get() == 1  # a new record looks quiet: this fill lands (1)
    change.__exit__(None, None, None)  # applies (2, doubled), then finds another incarnation
    assert counter.get() == 1 == truth.rows  # ... so it took its exit back and voided the count
    later = counter.change(+1)  # the new record must still count this writer as in flight
    later.__enter__()
    truth.rows += 1
    counter.invalidate()
    assert counter.get() == 2  # loaded while a writer is in flight: not cached
    later.__exit__(None, None, None)
    assert counter.get() == 2 == truth.rows


def test_count_evicted_between_commit_and_apply(counter: CachedCounter, truth: Truth) -> None:
    assert counter.get() == 0
    change = counter.change(+1)
    change.__enter__()
    truth.rows += 1
    counter.store.delete("n")
    change.__exit__(None, None, None)
    assert counter.get() == 1 == truth.rows


def test_invalidate_and_plain_incr(counter: CachedCounter, truth: Truth) -> None:
    assert counter.get() == 0
    truth.rows = 4  # changed behind the counter's back
    counter.invalidate()
    assert counter.get() == 4
    counter.incr(2)
    counter.decr()
    assert counter.get() == 5


def test_async_counter_shares_the_store_and_the_algorithm(truth: Truth) -> None:
    sync = MemoryStore()
    counter = AsyncCachedCounter(AsyncMemoryStore(sync), "n", truth.count)
    truth.rows = 7

    async def scenario() -> list[int]:
        first = await counter.get()
        async with counter.change(+1):
            truth.rows += 1
        async with counter.change(-3):
            truth.rows -= 3
        await counter.invalidate()
        return [first, await counter.get(), await counter.get()]

    assert asyncio.run(scenario()) == [7, 5, 5]
    assert CachedCounter(sync, "n", truth.count).get() == 5  # one store, two forms


def test_async_loader_may_be_a_coroutine() -> None:
    async def load() -> int:
        return 11

    counter = AsyncCachedCounter(AsyncMemoryStore(), "n", load)
    assert asyncio.run(counter.get()) == 11


def test_loader_returning_a_non_int_is_an_error() -> None:
    with pytest.raises(TypeError, match="not an int"):
        CachedCounter(MemoryStore(), "n", lambda: "3").get()  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_round_trips(protocol: str, memcached_1: list[MemcachedServer]) -> None:
    memcached_1[0].flush()
    with Proxy(memcached_1[0].port) as proxy:
        cluster = Cluster([proxy.spec], ClusterOptions(protocol=protocol))
        counter = CachedCounter(cluster, "rt-count", lambda: 3)
        cluster.get("warm")
        proxy.forget()
        assert counter.get() == 3
        miss = proxy.round_trips
        proxy.forget()
        assert counter.get() == 3
        hit = proxy.round_trips
        proxy.forget()
        counter.incr()
        change = proxy.round_trips
        counter.invalidate()
        proxy.forget()
        assert counter.get() == 4 - 1  # the loader's count, cached again
        refill = proxy.round_trips
        assert cluster.get(Routed(b"rt-count:f", b"rt-count")) is not None
        cluster.close()
    assert (hit, change) == (1, 3)
    assert miss == 8  # get; gets, add and gets of the new flight record; add, gets; gets; cas
    assert refill == 6  # get, gets flight, add placeholder, gets lease, gets flight, cas


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_async_counter_with_racing_tasks_and_evictions(
    protocol: str, memcached_1: list[MemcachedServer]
) -> None:
    cluster = Cluster([memcached_1[0].spec], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]
    aio = AsyncCluster.twin_of(cluster)

    async def run(seed: int) -> tuple[int, int]:
        rng = random.Random(seed)
        truth = [0]
        done = asyncio.Event()
        key = f"acount-{seed}-{protocol}"

        async def load() -> int:
            seen = truth[0]
            await asyncio.sleep(rng.random() / 1000)
            return seen

        counter = AsyncCachedCounter(aio, key, load)

        async def writer() -> None:
            for _ in range(30):
                # Never below 0, as a count: memcached's decr stops at 0.  Four writers may
                # each take one away between a look and their commit: keep 4 in hand.
                delta = 1 if truth[0] < 4 or rng.random() < 0.6 else -1
                async with counter.change(delta):
                    await asyncio.sleep(rng.random() / 1000)
                    truth[0] += delta  # the commit
                    await asyncio.sleep(rng.random() / 1000)

        async def reader() -> None:
            while not done.is_set():
                await counter.get()
                await asyncio.sleep(0)

        async def evictor() -> None:
            while not done.is_set():
                await asyncio.sleep(rng.random() / 200)
                await aio.delete(key if rng.random() < 0.5 else counter.flight_key)

        others = [asyncio.create_task(task()) for task in (reader, reader, evictor)]
        await asyncio.gather(*(writer() for _ in range(4)))
        done.set()
        await asyncio.gather(*others)
        return await counter.get(), truth[0]

    async def runs() -> list[tuple[int, int]]:
        results = [await run(seed) for seed in range(5)]
        await aio.close()
        return results

    for cached, truth in asyncio.run(runs()):
        assert cached == truth
    cluster.close()


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_caching_survives_a_million_changes(
    protocol: str, memcached_1: list[MemcachedServer]
) -> None:
    """The flight record's 20-bit fields must not carry into each other.

    A busy counter (12 writes a second) makes 2**20 changes within the flight
    record's day: ``exited`` then carries into ``entered`` and ``entered`` into
    the incarnation, the record never looks quiet again, and every ``get``
    runs the loader until the record expires.  The record is put where a
    counter that old would have it: quiet after ``2**20 - 3`` changes.
    """
    cluster = Cluster([memcached_1[0].spec], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]
    truth = Truth()
    key = f"busy-{protocol}-{random.randrange(1 << 30)}"
    counter = CachedCounter(cluster, key, truth.count)
    assert counter.get() == 0
    done = (1 << 20) - 3
    cluster.set(counter.flight_key, b"%d" % ((7 << 40) + done * (1 << 20) + done))
    for _ in range(6):
        write(counter, truth)
    counter.invalidate()  # evicted: the next get loads it, and caches it again
    loads = truth.loads
    assert [counter.get() for _ in range(3)] == [6, 6, 6]
    assert truth.loads == loads + 1
    write(counter, truth)
    assert counter.get() == 7
    cluster.close()


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_a_writer_cancelled_while_it_applies_still_exits(
    protocol: str, memcached_1: list[MemcachedServer]
) -> None:
    """A task cancelled after its commit, while its apply waits for a reply, leaves no flight open.

    Left open, the flight record keeps every reader from caching the count
    for its TTL (a day by default): each miss runs the loader.
    """
    memcached_1[0].flush()
    key = f"cancelled-apply-{protocol}"
    truth = Truth()
    direct = Cluster([memcached_1[0].spec], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]
    with Proxy(memcached_1[0].port) as proxy:
        aio = AsyncCluster([proxy.spec], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]
        apply = b"incr " + key.encode() + b" "

        async def main() -> None:
            counter = AsyncCachedCounter(aio, key, truth.count)
            assert await counter.get() == 0

            async def writer() -> None:
                async with counter.change(+1):
                    truth.rows += 1  # committed

            proxy.delay = 0.1  # every reply takes a while: the cancel lands during the apply
            task = asyncio.create_task(writer())
            while not any(apply in sent for sent in proxy.sent()):
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await others_finished()  # whatever still runs, finishes
            await aio.close()

        asyncio.run(main())
    counter = CachedCounter(direct, key, truth.count)
    counter.invalidate()  # evicted: the next get loads, and should cache again
    loads = truth.loads
    assert [counter.get() for _ in range(3)] == [1, 1, 1]
    assert truth.loads == loads + 1
    direct.close()


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_a_writer_cancelled_while_awaiting_its_commit_leaves_no_stale_count(
    protocol: str, memcached_1: list[MemcachedServer]
) -> None:
    """The body's outcome is unknown when it is cancelled (the commit may have landed).

    A task cancelled while it awaits its database's answer to COMMIT (a
    client gone, an ``asyncio.timeout``): the database committed, the
    counter applied nothing, and the cached count was one short for good.
    """
    cluster = Cluster([memcached_1[0].spec], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]
    aio = AsyncCluster.twin_of(cluster)
    key = f"cancelled-commit-{protocol}-{random.randrange(1 << 30)}"
    truth = Truth()

    async def main() -> int:
        counter = AsyncCachedCounter(aio, key, truth.count)
        assert await counter.get() == 0
        committed = asyncio.Event()

        async def writer() -> None:
            async with counter.change(+1):
                truth.rows += 1  # COMMIT reached the database...
                committed.set()
                await asyncio.sleep(10)  # ...and its answer is on the way

        task = asyncio.create_task(writer())
        await committed.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        count = await counter.get()
        await aio.close()
        return count

    assert asyncio.run(main()) == truth.rows == 1
    cluster.close()


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_a_writer_cancelled_while_it_enters_leaves_no_flight_open(
    protocol: str, memcached_1: list[MemcachedServer]
) -> None:
    """Cancelled while its enter waits for the reply: the enter may have landed; it is exited."""
    memcached_1[0].flush()
    key = f"cancelled-enter-{protocol}"
    truth = Truth()
    direct = Cluster([memcached_1[0].spec], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]
    with Proxy(memcached_1[0].port) as proxy:
        aio = AsyncCluster([proxy.spec], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]
        enter = b"incr " + key.encode() + b":f "

        async def main() -> None:
            counter = AsyncCachedCounter(aio, key, truth.count)
            assert await counter.get() == 0

            async def writer() -> None:
                async with counter.change(+1):
                    truth.rows += 1  # never reached

            proxy.delay = 0.1
            task = asyncio.create_task(writer())
            while not any(enter in sent for sent in proxy.sent()):
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await others_finished()
            await aio.close()

        asyncio.run(main())
    counter = CachedCounter(direct, key, truth.count)
    counter.invalidate()
    loads = truth.loads
    assert [counter.get() for _ in range(3)] == [0, 0, 0]
    assert truth.loads == loads + 1
    direct.close()
