"""The Django and Flask cluster backends hand the asyncio twin of their cluster as ``astore``."""

from __future__ import annotations

import asyncio

from django.core.cache import caches
from django.test import override_settings

from django_mcpatterns.core.aio import AsyncCluster
from tests.conftest import flush
from tests.harness import MemcachedServer


def test_django_astore_is_the_twin_of_store(memcached_3: list[MemcachedServer]) -> None:
    flush(memcached_3)
    location = [s.spec for s in memcached_3]
    caches_setting = {
        "default": {
            "BACKEND": "django_mcpatterns.backend.KetamaMemcacheCache",
            "LOCATION": location,
        }
    }
    with override_settings(CACHES=caches_setting):
        cache = caches["default"]
        twin = cache.astore
        assert isinstance(twin, AsyncCluster)
        assert twin.sync is cache.store
        assert twin is cache.astore  # one twin, however often asked
        cache.store.set("raw", [1, 2])
        assert asyncio.run(twin.get("raw")) == [1, 2]  # one cache, both APIs


def test_flask_astore_is_the_twin_of_store(memcached_1: list[MemcachedServer]) -> None:
    from flask import Flask
    from flask_caching import Cache

    app = Flask(__name__)
    cache = Cache(
        app,
        config={
            "CACHE_TYPE": "django_mcpatterns.flask.KetamaMemcachedCache",
            "CACHE_MEMCACHED_SERVERS": [memcached_1[0].spec],
        },
    )
    backend = cache.cache
    assert isinstance(backend.astore, AsyncCluster)
    assert backend.astore.sync is backend.store
