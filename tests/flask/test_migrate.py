"""``CACHE_OPTIONS["migrate_from"]`` on the Flask backend: the same wiring as Django's.

The store is proven in ``tests/core/test_migrate.py``; here, the Flask cache
API (``get``, ``has``, ``delete``, ``inc``...) goes through the migrating
store, and the patterns on ``cache.cache`` stay on the old ring.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask_caching import Cache

from django_mcpatterns.core.cluster import reset_shared_clusters
from django_mcpatterns.core.exceptions import ConfigurationError
from django_mcpatterns.flask import warm_command
from tests.flask.conftest import CLUSTER, PREFIX
from tests.harness import MemcachedServer, memcached_cluster


@pytest.fixture(scope="module")
def five() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(5) as servers:
        yield servers


def make(servers: list[MemcachedServer], migrate: dict[str, Any] | None) -> Any:
    specs = [server.spec for server in servers]
    config: dict[str, Any] = {"CACHE_TYPE": CLUSTER, "CACHE_KEY_PREFIX": PREFIX}
    if migrate is None:
        config["CACHE_MEMCACHED_SERVERS"] = specs[:4]
    else:
        config["CACHE_MEMCACHED_SERVERS"] = specs
        config["CACHE_OPTIONS"] = {"migrate_from": {"LOCATION": specs[:4], **migrate}}
    app = Flask(__name__)
    app.config.update(config)
    cache = Cache(app)
    with app.app_context():
        return cache.cache


@pytest.fixture
def pair(five: list[MemcachedServer]) -> Iterator[tuple[Any, Any]]:
    for server in five:
        server.flush()
    yield make(five, None), make(five, {})
    reset_shared_clusters()


def test_the_flask_cache_api_migrates_and_patterns_stay(pair):
    before, new = pair
    keys = [k for k in (f"k{i}" for i in range(200)) if new.values.placement.moved(PREFIX + k)]
    before.set(keys[0], "old value", 300)
    before.set(keys[1], 41, 300)
    assert new.has(keys[0])
    assert new.get(keys[0]) == "old value"
    assert new.inc(keys[1]) == 42
    assert new.delete(keys[0])
    assert before.get(keys[0]) is None
    new.sadd("s", "m")
    assert before.smembers("s") == {"m"}


def test_a_bad_migrate_from_names_the_flask_setting(five):
    with pytest.raises(ConfigurationError, match="CACHE_OPTIONS: option 'migrate_from'"):
        make(five, {"until": "soon"})


def test_flask_mcpatterns_warm_copies_what_moved(five):
    for server in five:
        server.flush()
    before = make(five, None)
    specs = [server.spec for server in five]
    app = Flask(__name__)
    app.config.update(
        CACHE_TYPE=CLUSTER,
        CACHE_KEY_PREFIX=PREFIX,
        CACHE_MEMCACHED_SERVERS=specs,
        CACHE_OPTIONS={"migrate_from": {"LOCATION": specs[:4], "reads": "old"}},
    )
    cache = Cache(app)
    app.cli.add_command(warm_command)
    keys = [f"k{i}" for i in range(200)]
    for key in keys:
        before.set(key, key, 300)
    result = app.test_cli_runner().invoke(args=["mcpatterns-warm", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["copied"] > 0
    assert report["copied"] + report["in_place"] == len(keys)
    with app.app_context():
        backend = cache.cache
        assert len(backend.store.get_many([PREFIX + key for key in keys])) == len(keys)
    result = app.test_cli_runner().invoke(args=["mcpatterns-warm", "--rate", "0"])
    assert result.exit_code != 0
    assert "--rate must be a positive number" in result.output
    reset_shared_clusters()
