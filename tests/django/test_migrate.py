"""``OPTIONS["migrate_from"]`` on the Django backend: what goes where in each stage.

The store's guarantees are proven in ``tests/core/test_migrate.py``; these tests
check the wiring (the cache API on the migrating store, the pattern methods on
the old ring in every stage) and that caches of the previous stage and of the
next one, running together, never split a pattern key: every lock held once,
no set member lost.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_mcpatterns.core.cluster import Cluster, reset_shared_clusters
from django_mcpatterns.core.migrate import AsyncMigratingStore, MigratingStore
from tests.django.conftest import CLUSTER_BACKEND
from tests.harness import MemcachedServer, memcached_cluster


@pytest.fixture(scope="module")
def five() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(5) as servers:
        yield servers


def entry(servers: list[MemcachedServer], stage: str | None, **options: Any) -> dict[str, Any]:
    """A CACHES entry: the old ring (stage None), or the new ring migrating from it."""
    specs = [server.spec for server in servers]
    if stage is None:
        return {"BACKEND": CLUSTER_BACKEND, "LOCATION": specs[:4], "OPTIONS": options}
    migrate = {"LOCATION": specs[:4], "reads": stage}
    return {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": specs,
        "OPTIONS": {**options, "migrate_from": migrate},
    }


@pytest.fixture
def stages(five: list[MemcachedServer]) -> Iterator[dict[str, Any]]:
    """Caches of the three configurations a rollout runs side by side."""
    for server in five:
        server.flush()
    setting = {"before": entry(five, None), "old": entry(five, "old"), "new": entry(five, "new")}
    with override_settings(CACHES={"default": setting["new"], **setting}):
        yield {name: caches[name] for name in setting}
    reset_shared_clusters()


def moved_keys(cache: Any, count: int = 200) -> list[str]:
    """Keys (as given to the cache) whose server differs between the two rings."""
    values = cache.values
    return [
        key
        for key in (f"k{i}" for i in range(count))
        if values.placement.moved(cache.make_and_validate_key(key))
    ]


def test_the_cache_api_migrates_and_the_patterns_stay_on_the_old_ring(stages):
    before, new = stages["before"], stages["new"]
    assert isinstance(new.values, MigratingStore)
    assert isinstance(new.avalues, AsyncMigratingStore)
    assert isinstance(new.store, Cluster)
    assert new.store.servers != before.store.servers  # the cache's own ring: LOCATION
    assert new.pattern_store.servers == before.store.servers  # the old ring's
    keys = moved_keys(new)
    before.set(keys[0], "cached before the change", 300)
    assert new.get(keys[0]) == "cached before the change"  # served from the old ring...
    assert new.store.get(new.make_and_validate_key(keys[0])) == "cached before the change"
    new.sadd("members", "a")
    assert before.smembers("members") == {"a"}  # ...and the pattern keys live there
    with new.lock("job", timeout=10):
        assert not before.lock("job", timeout=10).acquire(blocking=False)
    assert new.delete(keys[0])
    assert before.get(keys[0]) is None


def test_the_async_cache_api_migrates_too(stages):
    before, new = stages["before"], stages["new"]
    key = moved_keys(new)[0]
    before.set(key, "v", 300)

    async def read() -> Any:
        found = await new.aget(key)
        await new.adelete(key)
        return found

    assert asyncio.run(read()) == "v"
    assert before.get(key) is None


def test_the_old_stage_reads_the_old_ring_and_deletes_on_both(stages):
    before, old_stage, new = stages["before"], stages["old"], stages["new"]
    key = moved_keys(new)[0]
    new.store.set(new.make_and_validate_key(key), "a copy on the new ring", 300)
    before.set(key, "current", 300)
    assert old_stage.get(key) == "current"
    old_stage.set(key, "written", 300)  # the new ring's copy is deleted
    assert new.store.get(new.make_and_validate_key(key)) is None
    assert new.get(key) == "written"  # a process of the next stage reads it through


def test_a_bad_migrate_from_is_improperly_configured(five):
    bad = entry(five, "new")
    bad["OPTIONS"]["migrate_from"]["reads"] = "sideways"
    with (
        override_settings(CACHES={"default": bad}),
        pytest.raises(ImproperlyConfigured, match=r"migrate_from.*'reads' is 'old'"),
    ):
        caches["default"].get("k")


def test_mixed_configurations_hold_every_lock_once_and_lose_no_set_member(stages):
    """Threads on the old configuration and on both stages of the new one, side by side,
    contend for locks and add set members: each lock has at most one holder at a time,
    and every set, read through any of them, has every member added."""
    workers = [stages["before"], stages["old"], stages["new"]] * 2
    holders: dict[str, int] = {}
    overlaps: list[str] = []
    added: list[tuple[str, str]] = []
    guard = threading.Lock()
    sequence = itertools.count()

    def work(cache: Any, worker: int) -> None:
        for round_ in range(30):
            name = f"lock:{round_ % 3}"
            lock = cache.lock(name, timeout=30, blocking_timeout=30)
            with lock:
                with guard:
                    holders[name] = holders.get(name, 0) + 1
                    if holders[name] > 1:
                        overlaps.append(name)
                next(sequence)  # a little work inside
                with guard:
                    holders[name] -= 1
            member = f"w{worker}r{round_}"
            set_name = f"set:{round_ % 4}"
            assert cache.sadd(set_name, member) == 1
            added.append((set_name, member))

    threads = [threading.Thread(target=work, args=(c, i)) for i, c in enumerate(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    expected: dict[str, set[str]] = {}
    for set_name, member in added:
        expected.setdefault(set_name, set()).add(member)
    assert len(added) == 6 * 30
    for cache in stages.values():
        assert {name: cache.smembers(name) for name in expected} == expected
