"""Configuring the Flask backends: Flask-Caching's config keys, our options, clear errors."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from flask import Flask
from flask_caching import Cache

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import ConfigurationError, NodeUnavailableError
from django_mcpatterns.core.ketama import Continuum
from django_mcpatterns.flask import KetamaMemcachedCache, LocMemPatternsCache
from django_mcpatterns.flask.backend import CAS_ATTEMPTS
from tests.flask.conftest import CLUSTER, EMBEDDED, PREFIX, FlaskDeployment
from tests.harness import free_port


def backend(**config: Any) -> Any:
    """The backend Flask-Caching builds for this config."""
    app = Flask(__name__)
    app.config.update(config)
    cache = Cache(app)
    with app.app_context():
        return cache.cache


# -- loading through CACHE_TYPE ------------------------------------------------------


def test_cache_type_loads_the_cluster_backend() -> None:
    c = backend(
        CACHE_TYPE=CLUSTER,
        CACHE_MEMCACHED_SERVERS="10.0.0.1:11211;10.0.0.2:11211:2",
        CACHE_KEY_PREFIX="shop_",
        CACHE_DEFAULT_TIMEOUT=42,
        CACHE_IGNORE_ERRORS=True,
    )
    assert type(c) is KetamaMemcachedCache
    assert c.servers == ["10.0.0.1:11211", "10.0.0.2:11211"]
    assert c.key_prefix == "shop_"
    assert c.default_timeout == 42
    assert c.ignore_delete_many_errors is True
    assert "store" not in vars(c)  # no Cluster (and no socket) before first use


def test_cluster_defaults_follow_flask_caching() -> None:
    c = backend(CACHE_TYPE=CLUSTER)
    assert c.servers == ["127.0.0.1:11211"]  # Flask-Caching's MemcachedCache default
    assert c.key_prefix == "flask_cache_"
    assert c.default_timeout == 300
    assert c.ignore_delete_many_errors is False


def test_cache_type_loads_the_embedded_backend() -> None:
    c = backend(CACHE_TYPE=EMBEDDED, CACHE_OPTIONS={"max_item_size": 2048, "max_bytes": 65536})
    assert type(c) is LocMemPatternsCache
    assert c.store.stats()["item_size_max"] == 2048
    assert c.set("big", b"x" * 4096) is False


def test_embedded_backends_do_not_share_data() -> None:
    first, second = backend(CACHE_TYPE=EMBEDDED), backend(CACHE_TYPE=EMBEDDED)
    first.set("key", 1)
    assert second.get("key") is None


def test_options_reach_the_cluster(memcached_3: Any) -> None:
    servers = [s.spec for s in memcached_3]
    c = backend(
        CACHE_TYPE=CLUSTER,
        CACHE_MEMCACHED_SERVERS=servers,
        CACHE_OPTIONS={"ketama": "twemproxy", "failover": "remap", "no_delay": True},
    )
    assert c.store.options.ketama == "twemproxy"
    assert c.store.options.failover == "remap"
    assert c.store.options.client_options == {"no_delay": True}


def test_the_ketama_variant_decides_placement(memcached_3: Any) -> None:
    deployment = FlaskDeployment.cluster(memcached_3, ketama="twemproxy")
    deployment.flush()
    c = deployment.make_cache()
    ring = Continuum([s.spec for s in memcached_3], variant="twemproxy")
    keys = [f"item:{i}" for i in range(20)]
    c.set_many(dict.fromkeys(keys, 1))
    for key in keys:
        assert deployment.holders(PREFIX + key) == [ring.get_node(PREFIX + key)]


def test_apps_with_the_same_servers_share_one_cluster(memcached_1: Any) -> None:
    config = {"CACHE_TYPE": CLUSTER, "CACHE_MEMCACHED_SERVERS": [memcached_1[0].spec]}
    first, second = backend(**config), backend(**config, CACHE_KEY_PREFIX="other_")
    assert isinstance(first.store, Cluster)
    assert first.store is second.store  # one pool and one health record per server
    third = backend(**config, CACHE_OPTIONS={"failover": "remap"})
    assert third.store is not first.store


# -- errors name the setting -----------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"CACHE_OPTIONS": {"ketama": "md5"}},
            r"CACHE_OPTIONS: invalid value 'md5' for .*'ketama'",
        ),
        ({"CACHE_OPTIONS": {"failover": "retry"}}, r"CACHE_OPTIONS: .*'failover'.*'miss', 'remap'"),
        (
            {"CACHE_OPTIONS": {"protocol": "binary"}},
            r"CACHE_OPTIONS: invalid value 'binary' for option 'protocol'; "
            r"valid choices: 'meta', 'text'",
        ),
        ({"CACHE_OPTIONS": {"retry_atempts": 3}}, r"CACHE_OPTIONS: unknown option 'retry_atempts'"),
        ({"CACHE_OPTIONS": {"timeout": -1}}, r"CACHE_OPTIONS: option 'timeout' must be"),
        ({"CACHE_OPTIONS": {"serde": object()}}, r"CACHE_OPTIONS: option 'serde' is managed"),
        ({"CACHE_MEMCACHED_SERVERS": ["host:port"]}, r"CACHE_MEMCACHED_SERVERS: invalid port"),
        ({"CACHE_MEMCACHED_SERVERS": []}, r"CACHE_MEMCACHED_SERVERS: no memcached servers"),
        (
            {"CACHE_MEMCACHED_SERVERS": ["127.0.0.1:11211:1 alpha"]},
            r"CACHE_MEMCACHED_SERVERS: server names only apply to the twemproxy variants",
        ),
        ({"CACHE_KEY_PREFIX": "my app "}, r"CACHE_KEY_PREFIX: .*whitespace"),
        ({"CACHE_KEY_PREFIX": b"bytes"}, r"CACHE_KEY_PREFIX must be a string"),
        ({"CACHE_ARGS": ["127.0.0.1:11211"]}, r"CACHE_ARGS is not used"),
    ],
)
def test_invalid_cluster_config_fails_at_init(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        backend(CACHE_TYPE=CLUSTER, **config)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_size": 10}, r"CACHE_OPTIONS: unknown option 'max_size'; valid options: 'max_bytes'"),
        ({"max_bytes": "64m"}, r"CACHE_OPTIONS: option 'max_bytes' must be a positive integer"),
        ({"max_item_size": 10}, r"CACHE_OPTIONS: max_item_size must be at least 1024"),
    ],
)
def test_invalid_embedded_config_fails_at_init(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        backend(CACHE_TYPE=EMBEDDED, CACHE_OPTIONS=options)


def test_errors_say_which_option() -> None:
    with pytest.raises(ConfigurationError) as info:
        backend(CACHE_TYPE=CLUSTER, CACHE_OPTIONS={"ketama": "md5"})
    assert info.value.option == "ketama"
    assert "libmemcached" in info.value.choices


# -- unreachable servers: Flask-Caching's "False/None for backend errors" ---------------


def dead_server_backend(**options: Any) -> Any:
    return backend(
        CACHE_TYPE=CLUSTER,
        CACHE_MEMCACHED_SERVERS=[f"127.0.0.1:{free_port()}"],  # nobody listens there
        CACHE_OPTIONS={"connect_timeout": 0.5, **options},
    )


def test_an_unreachable_server_reads_as_misses_and_failed_writes() -> None:
    c = dead_server_backend()
    assert c.set("key", 1) is False
    assert c.get("key") is None
    assert c.has("key") is False
    assert c.set_many({"a": 1}) == []
    assert c.get_many("a", "b") == [None, None]
    assert c.inc("n") is None


def test_raise_errors_surfaces_an_unreachable_server_and_views_still_render(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Flask(__name__)
    app.config.update(
        CACHE_TYPE=CLUSTER,
        CACHE_MEMCACHED_SERVERS=[f"127.0.0.1:{free_port()}"],
        CACHE_OPTIONS={"raise_errors": True, "connect_timeout": 0.5},
    )
    cache = Cache(app)

    @app.route("/")
    @cache.cached(timeout=60)
    def index() -> str:
        return "rendered without a cache"

    with app.app_context(), pytest.raises(NodeUnavailableError):
        cache.get("key")
    with caplog.at_level(logging.ERROR, logger="flask_caching"):
        assert app.test_client().get("/").text == "rendered without a cache"
    assert "Exception possibly due to cache backend" in caplog.text


# -- counters under contention -----------------------------------------------------------


def test_dec_backs_off_and_gives_up_under_endless_contention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sleeps: list[float] = []
    c = LocMemPatternsCache(sleep=sleeps.append, rng=lambda: 1.0)
    c.set("n", 5)
    monkeypatch.setattr(c.store, "cas", lambda *args: False)  # someone always wrote first
    assert c.dec("n") is None
    assert len(sleeps) == CAS_ATTEMPTS
    assert sleeps[:3] == [0.0005, 0.001, 0.002]
    assert max(sleeps) == 0.02
    assert c.get("n") == 5
