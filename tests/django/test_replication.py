"""OPTIONS["replicate"] through Django: every API writes a replicated key to all its replicas.

The prefixes match the key as the caller gives it (``cache.set("hot:a")``), not
the ``KEY_PREFIX:version:`` the backend puts before it.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.management import call_command
from django.template import engines
from django.test import RequestFactory, override_settings

from django_mcpatterns.checks import check_caches
from django_mcpatterns.core.cluster import reset_shared_clusters
from django_mcpatterns.core.exceptions import ReplicatedKeyError
from django_mcpatterns.decorators import cached
from django_mcpatterns.views import StatusView
from tests.django.conftest import CLUSTER_BACKEND
from tests.harness import MemcachedServer, servers_holding

TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]
REPLICATE = {
    "hot:": 3,
    "template.cache.sidebar": 3,  # the fragment tag's keys for the fragment "sidebar"
    f"{__name__}.popular": 3,  # @cached keys start with the function's dotted name
}


@pytest.fixture
def cache(memcached_4_fresh: list[MemcachedServer]) -> Iterator[Any]:
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": [s.spec for s in memcached_4_fresh],
        "KEY_PREFIX": "site",
        "OPTIONS": {"replicate": REPLICATE},
    }
    reset_shared_clusters()
    with override_settings(CACHES={"default": entry}, TEMPLATES=TEMPLATES):
        yield caches["default"]
    reset_shared_clusters()


def copies(cache: Any, servers: list[MemcachedServer], key: str) -> int:
    return len(servers_holding(servers, cache.make_key(key)))


def test_prefixes_match_the_callers_key_not_the_made_one(cache, memcached_4_fresh):
    cache.set("hot:a", 1)
    cache.set("cold:a", 1)
    assert copies(cache, memcached_4_fresh, "hot:a") == 3
    assert copies(cache, memcached_4_fresh, "cold:a") == 1
    assert cache.get("hot:a") == 1
    cache.delete("hot:a")
    assert copies(cache, memcached_4_fresh, "hot:a") == 0


def test_get_or_compute_fills_every_replica(cache, memcached_4_fresh):
    assert cache.get_or_compute("hot:page", lambda: "rendered", timeout=60) == "rendered"
    assert copies(cache, memcached_4_fresh, "hot:page") == 3
    assert cache.get_or_compute("hot:page", lambda: "again", timeout=60) == "rendered"


def popular(n: int) -> int:
    popular.calls += 1  # type: ignore[attr-defined]
    return n * 2


popular.calls = 0  # type: ignore[attr-defined]
popular_cached = cached(timeout=60)(popular)


def test_cached_functions_and_fragments_are_replicated(cache, memcached_4_fresh):
    assert popular_cached(21) == 42
    assert popular_cached(21) == 42
    assert popular.calls == 1  # type: ignore[attr-defined]
    assert copies(cache, memcached_4_fresh, popular_cached.key(21)) == 3
    template = engines["django"].from_string(
        "{% load mcpatterns %}{% cachefragment 60 sidebar %}side{% endcachefragment %}"
    )
    assert template.render({}) == "side"
    from django.core.cache.utils import make_template_fragment_key

    assert copies(cache, memcached_4_fresh, make_template_fragment_key("sidebar")) == 3


def test_sets_are_refused_under_a_replicated_prefix(cache):
    with pytest.raises(ReplicatedKeyError, match="replicate"):
        cache.sadd("hot:members", "a")
    assert cache.sadd("cold:members", "a") == 1


def test_a_replicated_lock_is_held_once(cache):
    first = cache.lock("hot:job", timeout=30)
    assert first.acquire(blocking=False)
    assert not cache.lock("hot:job", timeout=30).acquire(blocking=False)
    first.release()
    assert cache.lock("hot:job", timeout=30).acquire(blocking=False)


# -- what operators see --------------------------------------------------------------


def test_checks_warn_of_more_copies_than_servers_and_a_gutter_server_in_location():
    location = ["127.0.0.1:11211", "127.0.0.1:11212", "127.0.0.1:11213"]
    options = {
        "replicate": {"hot:": 4, "warm:": 2},
        "failover": "gutter",
        "gutter": ["127.0.0.1:11212", "127.0.0.1:11311"],
    }
    reset_shared_clusters()
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": location, "OPTIONS": options}
    with override_settings(CACHES={"default": entry}):
        messages = check_caches(None)
    assert [m.id for m in messages] == ["mcpatterns.W008", "mcpatterns.W009"]
    assert "'hot:': 4" in messages[0].msg
    assert "warm" not in messages[0].msg
    assert "127.0.0.1:11212" in messages[1].msg
    reset_shared_clusters()


def test_bad_replication_options_stop_the_backend_with_their_name():
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": ["127.0.0.1:11211"],
        "OPTIONS": {"failover": "gutter"},
    }
    with override_settings(CACHES={"default": entry}):
        (error,) = check_caches(None)
    assert error.id == "mcpatterns.E005"
    assert "gutter" in error.msg


def test_health_command_and_status_page_show_replicas_the_gutter_and_the_journal(
    memcached_4_fresh,
):
    main, spare = memcached_4_fresh[:3], memcached_4_fresh[3]
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": [s.spec for s in main],
        "OPTIONS": {
            "replicate": {"hot:": 2},
            "failover": "gutter",
            "gutter": [spare.spec],
            "timeout": 0.3,
            "retry_attempts": 1,
        },
    }
    reset_shared_clusters()
    with override_settings(CACHES={"default": entry}, TEMPLATES=TEMPLATES):
        cache = caches["default"]
        key = "hot:seen"
        stalled = next(s for s in main if s.spec == cache.store.replicas(cache.make_key(key))[1])
        stalled.pause()
        try:
            cache.set(key, 1)  # the stalled copy misses it: one key to delete there
        finally:
            stalled.resume()
        out = io.StringIO()
        call_command("mcpatterns_health", stdout=out)
        text = out.getvalue()
        response = StatusView.as_view(permission=lambda request: True)(RequestFactory().get("/"))
        html = response.render().content.decode()
    reset_shared_clusters()
    assert "failover 'gutter'" in text
    assert "Replicated key prefixes: 'hot:' x2" in text
    assert "Gutter pool (TTLs of at most 10 s):" in text
    assert spare.spec in text
    assert "to delete" in text
    assert "<code>hot:</code> on 2 servers" in html
    assert "Gutter pool" in html
    assert html.count('<td class="journal">1</td>') == 1


def test_aget_or_compute_fills_every_replica_and_reads_spread(cache, memcached_4_fresh):
    async def compute() -> str:
        return "rendered"

    async def work() -> list[str]:
        first = await cache.aget_or_compute("hot:apage", compute, timeout=60)
        return [first] + [
            await cache.aget_or_compute("hot:apage", compute, timeout=60) for _ in range(150)
        ]

    store = cache.store
    before = {node: s["get_hits"] for node, s in store.stats().items()}
    assert asyncio.run(work()) == ["rendered"] * 151
    hits = {node: s["get_hits"] - before[node] for node, s in store.stats().items()}
    assert copies(cache, memcached_4_fresh, "hot:apage") == 3
    replicas = store.replicas(cache.make_key("hot:apage"))
    assert all(hits[node] >= 20 for node in replicas), hits
