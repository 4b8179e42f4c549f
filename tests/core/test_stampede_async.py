"""AsyncStampede alone: the issue's targets with real tasks on one event loop (AsyncMemoryStore).

The algorithm's behaviour is tested once for both forms, in asyncio, by
``tests/core/patterns/_async/test_stampede.py`` (its sync form generated beside
it); these tests prove what only asyncio can break: waiters that must not block
the loop, a winner cancelled mid-compute, the keepalive and background refreshes
as tasks, and a plain (ORM-using) compute run off the loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from django_mcpatterns.core.exceptions import ComputeFailedError
from django_mcpatterns.core.keepalive import AsyncKeepalive
from django_mcpatterns.core.leases import PLACEHOLDER, async_get_or_set
from django_mcpatterns.core.memory import AsyncMemoryStore, MemoryStore
from django_mcpatterns.core.refresh import RefreshRunner
from django_mcpatterns.core.stampede import (
    AsyncStampede,
    ComputeFailed,
    Recomputed,
    StaleServed,
    Stampede,
    StampedePolicy,
    lock_key,
)
from tests.core.asyncio_tools import Computes, Ticker, loop_never_blocks, others_finished, run
from tests.fakes import FakeClock

KEY = "report"
TASKS = 50


def stores(clock: FakeClock | None = None) -> tuple[MemoryStore, AsyncMemoryStore]:
    sync = MemoryStore() if clock is None else MemoryStore(clock=clock)
    return sync, AsyncMemoryStore(sync)


# -- one compute for a crowd ---------------------------------------------------------------


def test_50_tasks_on_one_cold_key_compute_once_and_the_loop_never_stalls() -> None:
    sync, store = stores()

    async def scenario() -> None:
        events: list[object] = []
        stampede = AsyncStampede(store, on_event=events.append)
        async with Ticker() as ticker:
            # The compute ends after 50 turns of another task: the loop ran all along.
            compute = Computes("report", until=lambda: ticker.reached(50))
            values = await asyncio.gather(
                *(stampede.get_or_compute(KEY, compute, 60) for _ in range(TASKS))
            )
        assert values == ["report"] * TASKS
        assert compute.calls == 1
        assert [type(e) for e in events].count(Recomputed) == 1
        assert sync.get(KEY) == "report"  # the sync API reads it

    with loop_never_blocks():
        run(scenario)


def test_a_plain_callable_compute_runs_once_off_the_loop() -> None:
    """A plain callable may use the ORM: it runs in a thread, once, and the waiters wait."""
    _, store = stores()

    async def scenario() -> None:
        threads: list[str] = []

        def compute() -> str:
            threads.append(threading.current_thread().name)
            threading.Event().wait(0.1)  # blocking, as a database query is
            return "from the ORM"

        stampede = AsyncStampede(store)
        values = await asyncio.gather(
            *(stampede.get_or_compute(KEY, compute, 60) for _ in range(20))
        )
        assert values == ["from the ORM"] * 20
        assert len(threads) == 1
        assert threads[0] != threading.main_thread().name

    with loop_never_blocks():  # the Event.wait above would fail the test on the loop
        run(scenario)


def test_the_async_and_sync_forms_share_the_cache() -> None:
    sync, store = stores()
    Stampede(sync).get_or_compute(KEY, lambda: "sync", 60)
    compute = Computes("async")

    async def scenario() -> Any:
        return await AsyncStampede(store).get_or_compute(KEY, compute, 60)

    assert run(scenario) == "sync"
    assert compute.calls == 0


# -- cancellation ----------------------------------------------------------------------------


def test_a_cancelled_winner_releases_its_lock_and_placeholder() -> None:
    """Cancelled mid-compute, the winner leaves nothing behind: the next caller computes."""
    sync, store = stores()
    slow = Computes("never", seconds=10)

    async def scenario() -> tuple[Any, Any]:
        stampede = AsyncStampede(store)
        winner = asyncio.ensure_future(stampede.get_or_compute(KEY, slow, 60))
        await asyncio.sleep(0.05)
        assert sync.get(lock_key(KEY)) is not None  # it holds the recompute lock
        winner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await winner
        held = sync.get(lock_key(KEY)), sync.gets_envelope(KEY)[0]
        value = await asyncio.wait_for(stampede.get_or_compute(KEY, Computes("next"), 60), 1)
        return held, value

    (lock, placeholder), value = run(scenario)
    assert lock is None
    assert placeholder is None
    assert value == "next"
    assert slow.calls == 1


def test_waiters_cancelled_at_random_points_leave_the_key_usable() -> None:
    _, store = stores()
    compute = Computes("v", seconds=0.05)

    async def scenario() -> Any:
        stampede = AsyncStampede(store)
        for delay in (0.0, 0.001, 0.01, 0.03, 0.06):
            tasks = [
                asyncio.ensure_future(stampede.get_or_compute(f"k{delay}", compute, 60))
                for _ in range(5)
            ]
            await asyncio.sleep(delay)
            for task in tasks[::2]:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # Whatever was cancelled where, the key answers within the compute time.
            assert await asyncio.wait_for(stampede.get_or_compute(f"k{delay}", compute, 60), 1)
        return True

    assert run(scenario)


# -- stale-while-revalidate ----------------------------------------------------------------


def test_stale_values_are_served_while_one_task_recomputes() -> None:
    clock = FakeClock()
    _, store = stores(clock)

    async def scenario() -> None:
        events: list[object] = []
        fresh = Computes("new", seconds=0.1)
        stampede = AsyncStampede(store, clock=clock, on_event=events.append)
        await stampede.get_or_compute(KEY, Computes("old"), 60)
        clock.advance(61)  # stale, still within the grace period
        values = await asyncio.gather(
            *(stampede.get_or_compute(KEY, fresh, 60) for _ in range(TASKS))
        )
        assert sorted(values) == ["new"] + ["old"] * (TASKS - 1)
        assert fresh.calls == 1
        assert await stampede.get_or_compute(KEY, fresh, 60) == "new"
        assert sum(isinstance(e, StaleServed) for e in events) == TASKS - 1

    with loop_never_blocks():
        run(scenario)


def test_a_background_refresh_is_a_task_not_a_thread() -> None:
    clock = FakeClock()
    _, store = stores(clock)
    runner = RefreshRunner(workers=1, max_queue=1)
    fresh = Computes("new", seconds=0.05)
    policy = StampedePolicy(runner=runner)
    events: list[object] = []

    async def scenario() -> tuple[list[Any], Any]:
        stampede = AsyncStampede(store, policy, clock=clock, on_event=events.append)
        await stampede.get_or_compute(KEY, Computes("old"), 60)
        clock.advance(61)
        served = [await stampede.get_or_compute(KEY, fresh, 60) for _ in range(3)]
        await others_finished()  # the refresh task finishes
        return served, await stampede.get_or_compute(KEY, fresh, 60)

    served, after = run(scenario)
    assert served == ["old"] * 3  # nobody waited for the refresh
    assert after == "new"
    assert fresh.calls == 1
    assert runner._threads == []  # the runner's threads never started
    assert any(isinstance(e, Recomputed) and e.background for e in events)


def test_async_background_refreshes_are_bounded_by_the_runner() -> None:
    clock = FakeClock()
    _, store = stores(clock)
    runner = RefreshRunner(workers=1, max_queue=1)  # at most 2 tasks in flight per loop
    slow = Computes("new", seconds=0.2)
    events: list[object] = []

    async def scenario() -> None:
        policy = StampedePolicy(runner=runner)
        stampede = AsyncStampede(store, policy, clock=clock, on_event=events.append)
        for n in range(3):
            await stampede.get_or_compute(f"k{n}", Computes("old"), 60)
        clock.advance(61)
        for n in range(3):  # three stale keys: two refresh tasks, the third is dropped
            assert await stampede.get_or_compute(f"k{n}", slow, 60) == "old"
        await asyncio.sleep(0.3)

    run(scenario)
    assert slow.calls == 2
    assert [getattr(e, "reason", None) for e in events].count("full") == 1


# -- failures ----------------------------------------------------------------------------------


def test_a_failed_compute_is_shared_with_the_waiting_tasks() -> None:
    _, store = stores()
    events: list[object] = []
    calls = 0

    async def failing() -> Any:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        raise RuntimeError("backend down")

    async def scenario() -> list[Any]:
        stampede = AsyncStampede(store, on_event=events.append)
        return await asyncio.gather(
            *(stampede.get_or_compute(KEY, failing, 60) for _ in range(10)),
            return_exceptions=True,
        )

    outcomes = run(scenario)
    assert calls == 1
    assert sum(isinstance(o, RuntimeError) for o in outcomes) == 1
    assert sum(isinstance(o, ComputeFailedError) for o in outcomes) == 9
    assert sum(isinstance(e, ComputeFailed) for e in events) == 1


# -- mark_stale, recompute, read, get_or_set ------------------------------------------------------


def test_mark_stale_then_one_recompute_while_the_others_are_served_the_old_value() -> None:
    _, store = stores()
    fresh = Computes("new", seconds=0.05)

    async def scenario() -> tuple[bool, list[Any]]:
        stampede = AsyncStampede(store)
        await stampede.get_or_compute(KEY, Computes("old"), 60)
        marked = await stampede.mark_stale(KEY)
        values = await asyncio.gather(*(stampede.get_or_compute(KEY, fresh, 60) for _ in range(10)))
        return marked, values

    marked, values = run(scenario)
    assert marked
    assert sorted(values) == ["new"] + ["old"] * 9
    assert fresh.calls == 1


def test_async_get_or_set_fills_under_a_lease() -> None:
    """A delete while ``default`` is computed wins: the value is returned, not stored."""
    sync, store = stores()

    async def scenario() -> tuple[Any, Any]:
        async def default() -> str:
            assert type(sync.gets_envelope(KEY)[0]) is type(PLACEHOLDER)  # the lease is taken
            await store.delete(KEY)  # another client invalidates meanwhile
            return "computed"

        first = await async_get_or_set(store, KEY, default, 60)
        second = await async_get_or_set(store, KEY, lambda: "again", 60)
        return first, second

    first, second = run(scenario)
    assert first == "computed"
    assert second == "again"
    assert sync.get(KEY) == "again"


# -- the keepalive task ----------------------------------------------------------------------------


def test_the_async_keepalive_extends_from_a_task_until_the_block_ends() -> None:
    ttls: list[float] = []

    async def extend(ttl: float) -> bool:
        ttls.append(ttl)
        return True

    async def scenario() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        async with AsyncKeepalive(extend, 0.03, 10.0, start=loop.time(), clock=loop.time):
            await asyncio.sleep(0.1)
        during = len(ttls)
        await asyncio.sleep(0.05)
        return during, len(ttls)

    during, after = run(scenario)
    assert during >= 2
    assert after == during  # stopped with the block
    assert all(ttl == pytest.approx(0.03) for ttl in ttls)


def test_no_keepalive_task_when_the_lock_outlives_the_longest_hold() -> None:
    async def extend(ttl: float) -> bool:
        raise AssertionError("not extended")

    async def scenario() -> int:
        before = len(asyncio.all_tasks())
        async with AsyncKeepalive(extend, 30.0, 10.0, start=0.0):
            return len(asyncio.all_tasks()) - before

    assert run(scenario) == 0
