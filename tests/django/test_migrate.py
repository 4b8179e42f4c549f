"""``OPTIONS["migrate_from"]`` on the Django backend: what goes where in each stage.

The store's guarantees are proven in ``tests/core/test_migrate.py``; these tests
check the wiring (the cache API on the migrating store, the pattern methods on
the old ring in every stage) and that caches of the previous stage and of the
next one, running together, never split a pattern key: every lock held once,
no set member lost.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_mcpatterns.core.cluster import Cluster, reset_shared_clusters
from django_mcpatterns.core.migrate import AsyncMigratingStore, MigratingStore
from django_mcpatterns.inspection import cache_status
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


# -- manage.py mcpatterns_warm ----------------------------------------------------------


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("mcpatterns_warm", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_the_warm_command_copies_what_moved_once(stages, five):
    before, new = stages["before"], stages["new"]
    keys = [f"k{i}" for i in range(300)]
    before.set_many({key: {"n": key} for key in keys}, 300)
    before.set("a-number", 7, 300)  # maybe a pattern's state: not copied
    before.sadd("a-set", "m")
    moved = moved_keys(new, 300)
    out, err = run("--cache", "old")
    assert "warning" not in err  # the "old" stage: deletes reach both rings
    assert "items copied" in out
    assert f"{len(moved)}" in out
    made = [new.make_and_validate_key(key) for key in keys]
    assert len(new.store.get_many(made)) == len(keys)  # every key on its new server
    report = json.loads(run("--cache", "old", "--json")[0])
    assert report["copied"] == 0  # a second run: all there already
    assert report["present"] == len(moved)
    assert report["from"] == [server.spec for server in five[:4]]
    _, err = run("--cache", "new", "--rate", "100000")
    assert "warning: warm a new ring while every process runs the 'old' stage" in err
    with pytest.raises(CommandError, match="--from HOST:PORT"):
        run("--cache", "before")
    out, _ = run("--cache", "before", "--from", ",".join(s.spec for s in five[:4]))
    assert "items copied" in out


# -- what the reports show ---------------------------------------------------------------


def run_command(name: str, *args: str) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def test_mcpatterns_ring_prices_a_change_and_gives_its_settings(stages, five):
    before = stages["before"]
    before.set_many({f"k{i}": "x" * 100 for i in range(2000)}, 300)
    fifth = five[4].spec
    report = json.loads(
        run_command("mcpatterns_ring", "--cache", "before", "--add", fifth, "--json")
    )
    change = report["change"]
    old = [server.spec for server in five[:4]]
    assert change["migration"] == {
        "LOCATION": [*old, fifth],
        "stage_old": {"LOCATION": old, "reads": "old"},
        "stage_new": {"LOCATION": old, "reads": "new"},
    }
    moved = sum(
        1
        for i in range(2000)
        if before.store.ring.get_node(f":1:k{i}") != stages["new"].store.ring.get_node(f":1:k{i}")
    )
    assert abs(change["cost"]["items"] - moved) < 0.05 * 2000  # spread evenly over each arc
    text = run_command("mcpatterns_ring", "--cache", "before", "--add", fifth)
    assert "Without migrate_from, about" in text
    assert "'reads': 'old'" in text
    assert "mcpatterns_warm" in text


def test_the_status_page_and_health_show_the_migration(stages):
    before, new = stages["before"], stages["new"]
    key = moved_keys(new)[0]
    before.set(key, "v", 300)
    new.get(key)
    new.get(moved_keys(new)[1])  # on neither ring
    status = cache_status("new")
    assert status.migration is not None
    assert status.migration.reads == "new"
    assert [s.node for s in status.migration.servers] == [s.node for s in before.store.servers]
    counts = status.migration.counts
    assert counts["fallbacks"] == 2
    assert counts["old_hits"] == counts["copied"] == 1
    assert status.migration.served_from_old == 0.5
    assert cache_status("before").migration is None
    assert status.as_dict()["migration"]["served_from_old"] == 0.5
    text = run_command("mcpatterns_health", "--cache", "new")
    assert "Migrating from the old ring (reads 'new'): 2 misses of moved keys, 1 served" in text
    html = render_status("new")
    assert "Ring migration" in html
    assert '<span class="old-hits">1</span> served from the old ring (50%)' in html


def render_status(alias: str) -> str:
    from django.test import RequestFactory

    from django_mcpatterns.views import StatusView

    templates = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]
    with override_settings(TEMPLATES=templates):
        view = StatusView.as_view(permission=lambda request: True, aliases=[alias])
        response = view(RequestFactory().get("/"))
        response.render()
        return str(response.content.decode())
