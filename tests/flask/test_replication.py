"""OPTIONS["replicate"] through Flask-Caching: prefixes match the key after CACHE_KEY_PREFIX."""

from __future__ import annotations

from django_mcpatterns.core.cluster import reset_shared_clusters
from django_mcpatterns.flask import KetamaMemcachedCache
from tests.harness import MemcachedServer, servers_holding


def test_replicated_prefixes_match_after_the_key_prefix(memcached_4_fresh: list[MemcachedServer]):
    reset_shared_clusters()
    cache = KetamaMemcachedCache(
        [s.spec for s in memcached_4_fresh], key_prefix="app:", replicate={"hot:": 3}
    )
    try:
        assert cache.set("hot:a", 1)
        assert cache.set("cold:a", 1)
        assert len(servers_holding(memcached_4_fresh, "app:hot:a")) == 3
        assert len(servers_holding(memcached_4_fresh, "app:cold:a")) == 1
        assert [cache.get("hot:a") for _ in range(30)] == [1] * 30
        assert cache.delete("hot:a")
        assert servers_holding(memcached_4_fresh, "app:hot:a") == []
    finally:
        reset_shared_clusters()
