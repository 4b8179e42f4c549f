"""``CACHE_OPTIONS["near_cache"]`` on the Flask-Caching backend.

The whole contract runs again with a near cache on; then what it changes: reads
served from process memory, this process's writes seen at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.fakes import FakeClock
from tests.flask.conftest import FlaskDeployment
from tests.flask.test_backend_contract import ServerContractTests
from tests.harness import MemcachedServer, raw_client, server_requests


class TestNearCache(ServerContractTests):
    @pytest.fixture
    def deployment(self, memcached_3: Any) -> FlaskDeployment:
        return FlaskDeployment.cluster(memcached_3, near_cache={"max_age": 0.5})

    @pytest.fixture
    def make_cache(self, deployment: FlaskDeployment) -> Callable[..., Any]:
        # The suite empties the servers behind the caches' back between tests (another
        # process's flush, for a near cache: seen within max_age); this process's clear()
        # is seen at once.
        deployment.flush()
        deployment.make_cache().clear()
        return deployment.make_cache


@pytest.fixture
def cache(memcached_1: list[MemcachedServer]) -> Any:
    deployment = FlaskDeployment.cluster(memcached_1, near_cache={"max_age": 60})
    deployment.flush()
    cache = deployment.make_cache()
    cache.clear()
    cache.clock = FakeClock(100.0)
    cache.binding.near.clock = cache.clock
    return cache


def sent(servers: list[MemcachedServer], action: Any) -> int:
    before = server_requests(servers)
    action()
    return server_requests(servers) - before


def test_reads_from_memory_and_writes_seen_at_once(
    cache: Any, memcached_1: list[MemcachedServer]
) -> None:
    assert cache.set("k", {"a": 1})
    assert sent(memcached_1, lambda: cache.get("k")) == 1
    assert sent(memcached_1, lambda: cache.get("k")) == 0
    assert sent(memcached_1, lambda: cache.get_dict("k")) == 0
    assert cache.has("k")
    cache.get("k")["a"] = 2  # a caller's change stays its own
    assert cache.get("k") == {"a": 1}
    assert cache.inc("n") == 1
    assert cache.get("n") == 1
    assert cache.inc("n") == 2
    assert cache.get("n") == 2
    assert cache.dec("n", 5) == -3
    assert cache.get("n") == -3
    cache.delete_many("k", "n")
    assert cache.get_many("k", "n") == [None, None]
    cache.set("k", 1)
    cache.get("k")
    cache.clear()
    assert cache.get("k") is None


def test_another_processs_write_is_seen_after_max_age(
    cache: Any, memcached_1: list[MemcachedServer]
) -> None:
    cache.set("flag", "off")
    assert cache.get("flag") == "off"
    raw_client(memcached_1[0]).set("flask_test_flag", b"on")
    assert cache.get("flag") == "off"
    cache.clock.advance(60)
    assert cache.get("flag") == b"on"
