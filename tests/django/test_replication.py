"""OPTIONS["replicate"] through Django: every API writes a replicated key to all its replicas.

The prefixes match the key as the caller gives it (``cache.set("hot:a")``), not
the ``KEY_PREFIX:version:`` the backend puts before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.template import engines
from django.test import override_settings

from django_mcpatterns.core.cluster import reset_shared_clusters
from django_mcpatterns.core.exceptions import ReplicatedKeyError
from django_mcpatterns.decorators import cached
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
