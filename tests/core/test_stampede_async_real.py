"""AsyncStampede and AsyncNamespaces on real memcached (AsyncCluster), in both protocols.

Meta mode: memcached picks the winner (``mg N``/``R`` tokens, a placeholder add);
text mode: the add-based recompute lock.  Either way 50 tasks on a cold key
compute once, the waiting tasks never stall the loop, a winner cancelled
mid-compute leaves the key usable, and a stale value is served while one task
recomputes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import pytest

from django_mcpatterns.core.aio import AsyncCluster
from django_mcpatterns.core.keys import placed
from django_mcpatterns.core.namespaces import AsyncNamespaces
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.stampede import AsyncStampede, StampedePolicy, lock_key
from tests.conftest import flush
from tests.core.asyncio_tools import Computes, Ticker, loop_never_blocks, others_finished, run
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer, server_requests

PROTOCOLS = ["meta", "text"]
TASKS = 50


def cluster(servers: list[MemcachedServer], protocol: str) -> AsyncCluster:
    return AsyncCluster([s.spec for s in servers], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_50_tasks_on_one_cold_key_compute_once_without_stalling_the_loop(
    memcached_3: list[MemcachedServer], protocol: str
) -> None:
    flush(memcached_3)
    store = cluster(memcached_3, protocol)
    stampede = AsyncStampede(store)
    key = f"cold-{protocol}"

    async def scenario() -> None:
        try:
            async with Ticker() as ticker:
                # The compute ends after 50 turns of another task: the loop ran all along.
                compute = Computes({"rows": list(range(100))}, until=lambda: ticker.reached(50))
                values = await asyncio.gather(
                    *(stampede.get_or_compute(key, compute, 60) for _ in range(TASKS))
                )
            assert values == [{"rows": list(range(100))}] * TASKS
            assert compute.calls == 1
        finally:
            await store.close()

    with loop_never_blocks():
        run(scenario)
    assert store.sync.get(key) == {"rows": list(range(100))}  # the sync Cluster reads it


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_cancelled_winner_does_not_wedge_the_key(
    memcached_3: list[MemcachedServer], protocol: str
) -> None:
    flush(memcached_3)
    computing = asyncio.Event()

    async def started() -> None:
        computing.set()

    slow = Computes("never", seconds=10, until=started)

    async def scenario() -> Any:
        store = cluster(memcached_3, protocol)
        stampede = AsyncStampede(store, StampedePolicy(wait=2.0))
        # No wait at all: a lock or placeholder left behind would raise LockTimeoutError.
        impatient = AsyncStampede(store, StampedePolicy(wait=0))
        try:
            winner = asyncio.ensure_future(stampede.get_or_compute("wedge", slow, 60))
            await asyncio.wait_for(computing.wait(), 30)  # cancelled while it computes
            winner.cancel()
            with pytest.raises(asyncio.CancelledError):
                await winner
            return await impatient.get_or_compute("wedge", Computes("next"), 60)
        finally:
            await store.close()

    assert run(scenario) == "next"  # computed at once: no lock or placeholder left to wait for
    assert slow.calls == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_stale_value_is_served_while_one_task_recomputes(
    memcached_3: list[MemcachedServer], protocol: str
) -> None:
    flush(memcached_3)
    fresh = Computes("new", seconds=0.1)

    async def scenario() -> tuple[list[Any], Any]:
        store = cluster(memcached_3, protocol)
        stampede = AsyncStampede(store)
        try:
            await stampede.get_or_compute("page", Computes("old"), 60)
            assert await stampede.mark_stale("page")
            values = await asyncio.gather(
                *(stampede.get_or_compute("page", fresh, 60) for _ in range(TASKS))
            )
            return values, await stampede.get_or_compute("page", fresh, 60)
        finally:
            await store.close()

    with loop_never_blocks():
        values, after = run(scenario)
    assert sorted(values) == ["new"] + ["old"] * (TASKS - 1)
    assert fresh.calls == 1
    assert after == "new"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_async_namespaces_on_real_servers(
    memcached_3: list[MemcachedServer], protocol: str
) -> None:
    flush(memcached_3)
    compute = Computes("v", seconds=0.1)

    async def scenario() -> tuple[list[Any], list[int], Any]:
        store = cluster(memcached_3, protocol)
        try:
            ns = AsyncNamespaces(store).namespace("user", 42)
            values = await asyncio.gather(
                *(ns.get_or_compute("profile", compute, 60) for _ in range(TASKS))
            )
            await ns.set_many({"a": 1, "b": 2})
            before = [server_requests([s]) for s in memcached_3]
            assert await ns.get_many(["a", "b", "profile"]) == {"a": 1, "b": 2, "profile": "v"}
            moved = [server_requests([s]) - b for s, b in zip(memcached_3, before, strict=True)]
            await ns.invalidate()
            return values, moved, await ns.get("a")
        finally:
            await store.close()

    values, moved, after = run(scenario)
    assert values == ["v"] * TASKS
    assert compute.calls == 1
    # One server answered the read: the version key and the three values, together.
    assert sorted(moved) == [0, 0, 4]
    assert after is None


@pytest.mark.slow  # real time on memcached's clock: a loop starved for a second misses a beat
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_keepalive_task_holds_the_key_through_a_compute_longer_than_the_lock(
    memcached_3: list[MemcachedServer], protocol: str
) -> None:
    """A 2.5 s compute under a 1 s lock (or placeholder): a task arriving at 2.2 s waits."""
    flush(memcached_3)
    slow = Computes("slow", seconds=2.5)
    late = Computes("late")

    async def scenario() -> list[Any]:
        store = cluster(memcached_3, protocol)
        stampede = AsyncStampede(store, StampedePolicy(lock_timeout=1.0, max_lock_time=10.0))
        try:
            first = asyncio.ensure_future(stampede.get_or_compute("long", slow, 60))
            await asyncio.sleep(2.2)  # past the lock's own TTL (exptime 2)
            second = await stampede.get_or_compute("long", late, 60)
            return [await first, second]
        finally:
            await store.close()

    assert run(scenario) == ["slow", "slow"]
    assert (slow.calls, late.calls) == (1, 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cancellations_at_random_points_never_wedge_a_key(
    memcached_3: list[MemcachedServer], protocol: str
) -> None:
    """Seeded drill: tasks cancelled anywhere (mid-claim, mid-compute, mid-wait, mid-fill).

    After each round a new caller must get a value within a second: a lock or a
    placeholder left behind by a cancelled task would make it wait (``wait``, 10 s)
    for a computation nobody runs.
    """
    flush(memcached_3)
    rng = random.Random(14)

    async def scenario() -> int:
        store = cluster(memcached_3, protocol)
        stampede = AsyncStampede(store)
        cancelled = 0
        try:
            for round_ in range(40):
                key = f"drill-{protocol}-{round_}"
                if round_ % 2:  # half the rounds on a stale value, half on a cold key
                    await stampede.get_or_compute(key, Computes("old"), 60)
                    await stampede.mark_stale(key)
                compute = Computes("new", seconds=rng.choice([0, 0.002, 0.02]))
                tasks = [
                    asyncio.ensure_future(stampede.get_or_compute(key, compute, 60))
                    for _ in range(6)
                ]
                for _ in range(rng.randrange(8)):  # a few loop iterations: mid-request
                    await asyncio.sleep(0)
                if rng.random() < 0.5:
                    await asyncio.sleep(rng.random() * 0.01)
                for task in tasks:
                    if rng.random() < 0.5:
                        cancelled += task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                value = await asyncio.wait_for(
                    stampede.get_or_compute(key, Computes("after"), 60), 1.0
                )
                assert value in ("new", "old", "after")
        finally:
            await store.close()
        return cancelled

    assert run(scenario) > 40


def test_a_recompute_lock_release_cancelled_midway_still_frees_the_lock(
    memcached_1: list[MemcachedServer],
) -> None:
    """Text mode releases the recompute lock by ``gets`` then ``cas``: a winner cancelled
    between them (a timeout, a client disconnect) left the lock held for ``lock_timeout``,
    and every refresh of the key was skipped meanwhile (stale values served)."""
    flush(memcached_1)
    lock = lock_key("page")

    async def scenario() -> Any:
        with Proxy(memcached_1[0].port) as proxy:
            store = AsyncCluster([proxy.spec], ClusterOptions(protocol="text"))
            stampede = AsyncStampede(store, StampedePolicy(lock_timeout=60))
            try:
                await store.get("warm")  # connected
                proxy.delay = 0.05  # every reply takes a while: the cancel lands in the gets
                winner = asyncio.ensure_future(stampede.get_or_compute("page", Computes("v"), 60))
                release = b"gets " + placed(lock)[0]
                while release not in b"".join(proxy.sent()):
                    await asyncio.sleep(0.002)
                winner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await winner
                await others_finished()  # whatever still runs, finishes
                proxy.delay = 0.0
                return await store.get(lock)
            finally:
                await store.close()

    assert run(scenario) is None  # the lock is free: the next refresh may run
