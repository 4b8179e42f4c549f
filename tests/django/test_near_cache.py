"""``OPTIONS["near_cache"]`` on the Django backend: its API, patterns, pages and metrics.

The whole cache contract runs again with a near cache on (``TestNearCache``): a
process's own reads and writes behave as without one.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings
from django.urls import path

from django_mcpatterns.views import StatusView
from tests.aio import Blocking
from tests.django.conftest import CLUSTER_BACKEND, EMBEDDED_BACKEND, Deployment
from tests.django.test_backend_contract import CacheContract
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, memcached_cluster, raw_client, server_requests

pytestmark = pytest.mark.usefixtures("reset_shared_stores")

urlpatterns = [path("status/", StatusView.as_view(permission=lambda request: True))]
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]


class TestNearCache(CacheContract):
    """The whole contract with values held near: this process sees its own writes at once."""

    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3, near_cache={"max_age": 0.5})


@pytest.fixture
def cache(memcached_1: list[MemcachedServer]) -> Iterator[Any]:
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": [memcached_1[0].spec],
        "KEY_PREFIX": "app",
        "OPTIONS": {"near_cache": {"max_age": 60}},
    }
    for server in memcached_1:
        server.flush()
    with override_settings(CACHES={"default": entry}):
        cache = caches["default"]
        cache.clear()
        clock = FakeClock(100.0)
        cache.binding.near.clock = clock  # time in the table moves when the test says so
        cache.clock = clock
        yield cache


def sent(servers: list[MemcachedServer], action: Any) -> int:
    before = server_requests(servers)
    action()
    return server_requests(servers) - before


def test_get_is_served_from_memory_and_a_set_is_seen_at_once(
    cache: Any, memcached_1: list[MemcachedServer]
) -> None:
    cache.set("front", {"title": "News"})
    assert sent(memcached_1, lambda: cache.get("front")) == 1
    assert sent(memcached_1, lambda: cache.get("front")) == 0
    assert sent(memcached_1, lambda: cache.get_many(["front"])) == 0
    assert cache.has_key("front")
    mine = cache.get("front")
    mine["title"] = "changed by a caller"
    assert cache.get("front") == {"title": "News"}
    cache.set("front", {"title": "Sport"})
    assert cache.get("front") == {"title": "Sport"}
    cache.delete("front")
    assert cache.get("front") is None


def test_another_processs_write_is_seen_after_max_age(
    cache: Any, memcached_1: list[MemcachedServer]
) -> None:
    cache.set("flag", "off")
    assert cache.get("flag") == "off"
    other = raw_client(memcached_1[0])
    other.set(cache.make_key("flag"), b"on")  # another client (raw bytes: flags 0)
    assert cache.get("flag") == "off"
    cache.clock.advance(60)
    assert cache.get("flag") == b"on"


def test_get_or_compute_serves_a_fresh_value_from_memory(
    cache: Any, memcached_1: list[MemcachedServer]
) -> None:
    calls: list[int] = []

    def compute() -> list[int]:
        calls.append(1)
        return [1, 2, 3]

    assert cache.get_or_compute("report", compute, timeout=300) == [1, 2, 3]
    assert cache.get_or_compute("report", compute, timeout=300) == [1, 2, 3]  # from memcached
    assert sent(memcached_1, lambda: cache.get_or_compute("report", compute, 300)) == 0
    fetched = cache.get_or_compute_result("report", compute, timeout=300)
    assert fetched.outcome == "fresh"
    fetched.value.append(4)
    assert cache.get_or_compute("report", compute, timeout=300) == [1, 2, 3]
    assert calls == [1]
    cache.recompute("report", lambda: [9], timeout=300)  # this process's write: at once
    assert cache.get_or_compute("report", compute, timeout=300) == [9]
    assert cache.mark_stale("report")
    assert cache.get_or_compute_result("report", compute, timeout=300).outcome != "fresh"


def test_namespaces_are_held_with_their_version(
    cache: Any, memcached_1: list[MemcachedServer]
) -> None:
    ns = cache.namespace("user", 7)
    ns.set("profile", "Ada")
    assert ns.get("profile") == "Ada"
    assert sent(memcached_1, lambda: ns.get("profile")) == 0
    cache.invalidate_namespace("user", 7)
    assert ns.get("profile") is None
    assert ns.get_or_compute("card", lambda: "card of Ada", 300) == "card of Ada"
    assert ns.get_or_compute("card", lambda: "recomputed", 300) == "card of Ada"
    assert sent(memcached_1, lambda: ns.get_or_compute("card", lambda: "x", 300)) == 0


def test_sets_lists_counters_locks_and_limits_are_never_held(
    cache: Any, memcached_1: list[MemcachedServer]
) -> None:
    cache.sadd("tags", "a", "b")
    cache.rpush("log", "one")
    cache.counter("visits", lambda: 3).incr(1)
    for _ in range(2):
        assert sent(memcached_1, lambda: cache.smembers("tags")) >= 1
        assert sent(memcached_1, lambda: cache.lrange("log", 0, -1)) >= 1
        assert sent(memcached_1, lambda: cache.counter("visits", lambda: 0).get()) >= 1
        assert sent(memcached_1, lambda: cache.ratelimit("login", "5/m")) >= 1
        with cache.lock("job", timeout=10):
            assert sent(memcached_1, lambda: cache.lock("job").locked()) >= 1
    assert cache.binding.near.stats().entries == 0


def test_prefixes_limit_what_is_held(memcached_1: list[MemcachedServer]) -> None:
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": [memcached_1[0].spec],
        "KEY_PREFIX": "site",
        "OPTIONS": {"near_cache": {"max_age": 60, "prefixes": ["config:"]}},
    }
    with override_settings(CACHES={"default": entry}):
        cache = caches["default"]
        cache.set_many({"config:theme": "dark", "user:1": "Ada"})
        for _ in range(2):
            assert cache.get_many(["config:theme", "user:1"]) == {
                "config:theme": "dark",
                "user:1": "Ada",
            }
        assert sent(memcached_1, lambda: cache.get("config:theme")) == 0  # KEY_PREFIX skipped
        assert sent(memcached_1, lambda: cache.get("user:1")) == 1


def test_async_reads_share_the_table(cache: Any, memcached_1: list[MemcachedServer]) -> None:
    async def main() -> None:
        await cache.aset("k", "v")
        assert await cache.aget("k") == "v"
        assert sent(memcached_1, lambda: cache.get("k")) == 0  # the sync API sees it too
        cache.set("k", "w")  # a sync write drops the copy the async API reads
        assert await cache.aget("k") == "w"
        await cache.aclose()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"max_age": -1}, "near_cache option 'max_age' must be a number of seconds > 0"),
        ({"max_ages": 1}, "unknown near_cache option 'max_ages'"),
        ("on", "option 'near_cache' must be a mapping"),
    ],
)
def test_a_bad_option_is_a_configuration_error(
    memcached_1: list[MemcachedServer], given: Any, message: str
) -> None:
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": [memcached_1[0].spec],
        "OPTIONS": {"near_cache": given},
    }
    with (
        override_settings(CACHES={"default": entry}),
        pytest.raises(ImproperlyConfigured, match=re.escape(message)),
    ):
        caches["default"].get("k")


def test_the_embedded_store_accepts_the_option_and_needs_none() -> None:
    entry = {"BACKEND": EMBEDDED_BACKEND, "OPTIONS": {"near_cache": {"max_age": 1}}}
    with override_settings(CACHES={"default": entry}):
        cache = caches["default"]
        cache.set("k", 1)
        assert cache.get("k") == 1
        assert cache.binding.near is None
    with (
        override_settings(CACHES={"default": {**entry, "OPTIONS": {"near_cache": 3}}}),
        pytest.raises(ImproperlyConfigured, match="must be a mapping"),
    ):
        caches["default"].get("k")


def test_the_status_page_shows_the_near_cache(cache: Any) -> None:
    cache.set("k", 1)  # not a str: the set drops the copy (a str set is held: no miss)
    for _ in range(3):
        cache.get("k")
    with override_settings(ROOT_URLCONF=__name__, TEMPLATES=TEMPLATES):
        html = Client().get("/status/").content.decode()
    assert "Near cache" in html
    ratio = re.search(r'<td class="hit-ratio">(\d+)%</td>', html)
    assert ratio is not None
    assert int(ratio.group(1)) == 67  # one miss, two hits
    assert '<td class="count saved">2</td>' in html


def test_prometheus_counts_hits_and_round_trips_saved(memcached_1: list[MemcachedServer]) -> None:
    prometheus = pytest.importorskip("prometheus_client")
    registry = prometheus.CollectorRegistry()
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": [memcached_1[0].spec],
        "OPTIONS": {
            "near_cache": {"max_age": 60},
            "instrumentation": ["prometheus"],
            "prometheus_registry": registry,
        },
    }
    with override_settings(CACHES={"metered": entry}):
        cache = caches["metered"]
        clock = FakeClock(100.0)
        cache.binding.near.clock = clock
        cache.set("k", 1)  # not a str: the set drops the copy (a str set is held: no miss)
        cache.get("k")  # a miss: reports (the first report)
        for _ in range(4):
            cache.get("k")
        clock.advance(2)  # the next report is due, on the next read memcached answers
        cache.get("other")  # a miss: counted, then reported

        def value(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, {"cache": "metered", **labels})

        assert value("mcpatterns_near_lookups_total", result="hit") == 4
        assert value("mcpatterns_near_lookups_total", result="miss") == 2
        assert value("mcpatterns_near_round_trips_saved_total") == 4
        assert value("mcpatterns_near_entries") == 1
        assert (value("mcpatterns_near_bytes") or 0) > 0


def test_the_debug_toolbar_shows_what_the_near_cache_served(
    memcached_3: list[MemcachedServer],
) -> None:
    from tests.django.test_debug_toolbar import TOOLBAR_APPS, TOOLBAR_SETTINGS, text

    for server in memcached_3:
        server.flush()
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": [server.spec for server in memcached_3],
        "OPTIONS": {"near_cache": {"max_age": 60}},
    }
    with (
        override_settings(CACHES={"default": entry}, **TOOLBAR_SETTINGS),
        override_settings(INSTALLED_APPS=TOOLBAR_APPS),
    ):
        caches["default"].clear()
        Client().get("/page/", REMOTE_ADDR="127.0.0.1")  # "answer" computed
        Client().get("/page/", REMOTE_ADDR="127.0.0.1")  # "answer" read: fresh, held
        response = Client().get("/page/", REMOTE_ADDR="127.0.0.1")
    html = response.content.decode()
    near = html.split('class="mcpatterns-near"')[1].split("</table>")[0]
    # get_or_compute("answer") served from memory; the plain key is a miss memcached answers.
    assert re.search(r"<td>default</td><td>1</td><td>1</td><td>50%</td><td>1</td>", near)
    assert "Near cache" in text(html)


# -- the near cache at the seams: migrations, outages ------------------------------------------


class Patterns:
    """``get_or_compute`` and its writers, through the sync API or the async one (run on
    one event loop kept for the test, as a server keeps its own)."""

    def __init__(self, cache: Any, api: str) -> None:
        self.cache = cache
        self.blocking = None if api == "sync" else Blocking(cache)

    def _call(self, name: str, *args: Any) -> Any:
        if self.blocking is None:
            return getattr(self.cache, name)(*args)
        return getattr(self.blocking, f"a{name}")(*args)

    def _compute(self, value: str) -> Any:
        if self.blocking is None:
            return lambda: value

        async def compute() -> str:
            return value

        return compute

    def get_or_compute(self, key: str, value: str) -> Any:
        return self._call("get_or_compute_result", key, self._compute(value), 300)

    def recompute(self, key: str, value: str) -> Any:
        return self._call("recompute", key, self._compute(value), 300)

    def mark_stale(self, key: str) -> bool:
        return bool(self._call("mark_stale", key))

    def close(self) -> None:
        if self.blocking is not None:
            self.blocking.run(self.cache.aclose)
            self.blocking.loop.close()


@pytest.mark.parametrize("api", ["sync", "async"])
def test_get_or_compute_during_a_migration_sees_this_processs_writes(
    api: str, memcached_3: list[MemcachedServer]
) -> None:
    """During a ring migration the patterns write the old ring, past the near table: a
    value held near would outlive this process's recompute and mark_stale."""
    specs = [server.spec for server in memcached_3]
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": specs,
        "OPTIONS": {
            "near_cache": {"max_age": 60},
            "migrate_from": {"LOCATION": specs[:2], "reads": "new"},
        },
    }
    for server in memcached_3:
        server.flush()
    with override_settings(CACHES={"default": entry}):
        patterns = Patterns(caches["default"], api)
        try:
            assert patterns.get_or_compute("page", "v1").value == "v1"
            assert patterns.get_or_compute("page", "unused").value == "v1"
            patterns.recompute("page", "v2")
            assert patterns.get_or_compute("page", "unused").value == "v2"
            assert patterns.mark_stale("page")
            assert patterns.get_or_compute("page", "v3").outcome != "fresh"
        finally:
            patterns.close()


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_mark_stale_that_could_not_be_sent_drops_the_copy_held_near(api: str) -> None:
    """A mark_stale whose server stalls forgets the key (deleted there now or before it
    serves again): the copy held near goes too, never served as fresh afterwards."""
    with memcached_cluster(1) as servers:
        entry = {
            "BACKEND": CLUSTER_BACKEND,
            "LOCATION": [servers[0].spec],
            "OPTIONS": {"near_cache": {"max_age": 60}, "timeout": 0.3, "connect_timeout": 0.3},
        }
        with override_settings(CACHES={"default": entry}):
            patterns = Patterns(caches["default"], api)
            try:
                assert patterns.get_or_compute("page", "v1").value == "v1"
                assert patterns.get_or_compute("page", "unused").value == "v1"  # held near
                servers[0].pause()
                try:
                    assert not patterns.mark_stale("page")  # not sent: the key is forgotten
                    fetched = patterns.get_or_compute("page", "recomputed")
                finally:
                    servers[0].resume()
                assert (fetched.value, fetched.outcome) != ("v1", "fresh")
            finally:
                patterns.close()
