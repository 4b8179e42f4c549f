"""Serializers, signing and TLS through the Django and Flask backends, on real servers.

The attack the signed mode exists for, end to end: a forged pickle written
straight into memcached is refused by the Django and Flask caches (a miss, a
logged and counted event, the ``value_refused`` signal), never unpickled.  The
signing key comes from ``SECRET_KEY`` (with ``SECRET_KEY_FALLBACKS`` for
rotation); TLS is configured through ``OPTIONS["tls_context"]``; system check
W005 knows which configurations can run code from memcached.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from flask import Flask
from flask_caching import Cache

from django_mcpatterns import signals
from django_mcpatterns.backend import KetamaMemcacheCache, LocMemPatternsCache
from django_mcpatterns.checks import check_caches
from django_mcpatterns.core.cluster import reset_shared_clusters
from django_mcpatterns.core.exceptions import ConfigurationError, EncodingError
from django_mcpatterns.core.memory import reset_shared_memory_stores
from django_mcpatterns.core.serializers import FLAG_JSON
from django_mcpatterns.counters import counters
from django_mcpatterns.flask import signals as flask_signals
from tests.drills.tls import Certificate
from tests.harness import MemcachedServer, free_port, raw_client

CLUSTER = "django_mcpatterns.backend.KetamaMemcacheCache"
JSON = "django_mcpatterns.core.serializers.JSONSerializer"
RAN: list[str] = []


def _ran(marker: str) -> str:
    RAN.append(marker)
    return marker


class Exploit:
    def __reduce__(self) -> Any:
        return (_ran, ("code ran",))


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    RAN.clear()
    yield
    assert RAN == [], "a forged pickle was loaded"
    reset_shared_clusters()
    reset_shared_memory_stores()


@pytest.fixture
def server(memcached_1: list[MemcachedServer]) -> MemcachedServer:
    memcached_1[0].flush()
    return memcached_1[0]


def forge(server: MemcachedServer, key: str) -> None:
    """Write a code-running pickle under ``key`` with a raw client, as an attacker would."""
    client = raw_client(server)
    client.set(key, pickle.dumps(Exploit()), flags=1)
    client.close()


# -- Django ---------------------------------------------------------------------------


def test_django_signed_cache_refuses_a_forged_pickle_with_a_signal(
    server: MemcachedServer, caplog: pytest.LogCaptureFixture
) -> None:
    received: list[dict[str, Any]] = []

    def receiver(sender: type, **kwargs: Any) -> None:
        received.append({"sender": sender, **kwargs})

    signals.value_refused.connect(receiver)
    entry = {"BACKEND": CLUSTER, "LOCATION": server.spec, "OPTIONS": {"signed": True}}
    before = counters.get("value_refused")
    try:
        with override_settings(CACHES={"default": entry}):
            cache = caches["default"]
            cache.set("profile", {"name": "ada"})
            assert cache.get("profile") == {"name": "ada"}
            forge(server, cache.make_key("profile"))
            assert cache.get("profile", "miss") == "miss"
            forge(server, cache.make_key("profile"))
            assert cache.get_many(["profile"]) == {}
            forge(server, cache.make_key("profile"))
            # Refused, and left in place: get_or_set (an add) answers without caching...
            assert cache.get_or_set("profile", {"name": "regenerated"}) == {"name": "regenerated"}
            assert cache.get("profile") is None
            # ...and a set replaces it.
            assert cache.set("profile", {"name": "regenerated"})
            assert cache.get("profile") == {"name": "regenerated"}
    finally:
        signals.value_refused.disconnect(receiver)
    assert [r["reason"] for r in received] == ["unsigned"] * 5
    assert received[0]["key"] == b":1:profile"
    assert received[0]["sender"].__name__ == "Cluster"
    assert counters.get("value_refused") - before == 5
    assert "refused the cached value of b':1:profile' (unsigned)" in caplog.text


def test_django_key_derives_from_secret_key_and_fallbacks_verify(server: MemcachedServer) -> None:
    entry = {"BACKEND": CLUSTER, "LOCATION": server.spec, "OPTIONS": {"signed": True}}

    def write_with_the_old_secret() -> None:
        reset_shared_clusters()
        with override_settings(CACHES={"default": entry}, SECRET_KEY="old-secret " * 5):
            caches["default"].set("k", ["signed", "with", "old"])
        reset_shared_clusters()

    write_with_the_old_secret()
    with override_settings(
        CACHES={"default": entry}, SECRET_KEY="new-secret " * 5, SECRET_KEY_FALLBACKS=[]
    ):
        assert caches["default"].get("k") is None  # another key signed it: refused
    write_with_the_old_secret()
    with override_settings(
        CACHES={"default": entry},
        SECRET_KEY="new-secret " * 5,
        SECRET_KEY_FALLBACKS=["old-secret " * 5],
    ):
        cache = caches["default"]
        assert cache.get("k") == ["signed", "with", "old"]
        cache.set("k", "re-signed")
    with override_settings(CACHES={"default": entry}, SECRET_KEY="new-secret " * 5):
        reset_shared_clusters()
        assert caches["default"].get("k") == "re-signed"


def test_django_explicit_keys_and_bad_options(server: MemcachedServer) -> None:
    key = "explicit-signing-key-of-32-bytes!"
    options = {"signing_keys": [key], "serializer": JSON}
    cache = KetamaMemcacheCache(server.spec, {"OPTIONS": options})
    cache.set("k", {"a": (1, 2)})
    assert cache.get("k") == {"a": [1, 2]}  # JSON: tuples come back as lists
    assert key not in repr(cache.store.options)
    with pytest.raises(ImproperlyConfigured, match="serializer"):
        KetamaMemcacheCache(server.spec, {"OPTIONS": {"serializer": "json"}})
    with pytest.raises(ImproperlyConfigured, match="at least 32 bytes"):
        KetamaMemcacheCache(server.spec, {"OPTIONS": {"signing_key": "short"}})


def test_django_embedded_takes_the_same_options() -> None:
    cache = LocMemPatternsCache("serializer-options", {"OPTIONS": {"serializer": JSON}})
    cache.set("k", (1, 2))
    assert cache.get("k") == [1, 2]
    with pytest.raises(EncodingError):
        cache.set("k", {1, 2})
    signed = LocMemPatternsCache("signed-options", {"OPTIONS": {"signed": True}})
    signed.set("k", {"v": 1})
    assert signed.get("k") == {"v": 1}
    assert signed.store.serde.inner.signer is not None
    with pytest.raises(ImproperlyConfigured, match="unknown option 'ketama'; valid options"):
        LocMemPatternsCache("bad", {"OPTIONS": {"ketama": "libmemcached"}})


@pytest.mark.parametrize(
    ("options", "warned"),
    [
        ({}, True),
        ({"signed": True}, False),
        ({"serializer": JSON}, False),
        ({"serializer": "django_mcpatterns.core.serializers.PickleSerializer"}, True),
        ({"signing_key": "k" * 32}, False),
    ],
)
def test_w005_warns_only_when_memcached_writers_can_run_code(
    options: dict[str, Any], warned: bool
) -> None:
    entry = {"BACKEND": CLUSTER, "LOCATION": ["10.0.0.7:11211"], "OPTIONS": options}
    with override_settings(CACHES={"default": entry}):
        found = [message.id for message in check_caches(None)]
    assert ("mcpatterns.W005" in found) is warned


def test_w005_hint_names_signing_and_serializers() -> None:
    entry = {"BACKEND": CLUSTER, "LOCATION": ["10.0.0.7:11211"]}
    with override_settings(CACHES={"default": entry}):
        (warning,) = check_caches(None)
    assert "OPTIONS['signed'] = True" in warning.hint
    assert "JSONSerializer" in warning.hint


# -- Flask ----------------------------------------------------------------------------


def flask_cache(server: MemcachedServer, **config: Any) -> Any:
    base = {
        "CACHE_TYPE": "django_mcpatterns.flask.KetamaMemcachedCache",
        "CACHE_MEMCACHED_SERVERS": [server.spec],
        "CACHE_KEY_PREFIX": "flask_",
    }
    return Cache(Flask(__name__), config={**base, **config}).cache


def test_flask_signed_cache_refuses_a_forged_pickle_with_a_signal(server: MemcachedServer) -> None:
    received: list[dict[str, Any]] = []

    def receiver(sender: Any = None, **kwargs: Any) -> None:
        received.append(kwargs)

    flask_signals.value_refused.connect(receiver)
    try:
        cache = flask_cache(server, SECRET_KEY="flask secret", CACHE_OPTIONS={"signed": True})
        cache.set("cart", {"items": 3})
        forge(server, "flask_cart")
        assert cache.get("cart") is None
        forge(server, "flask_cart")
        assert cache.has("cart") is False
        assert cache.add("cart", {"items": 0}) is False  # the refused item stays in place
        assert cache.set("cart", {"items": 0})  # a set replaces it
        assert cache.get("cart") == {"items": 0}
    finally:
        flask_signals.value_refused.disconnect(receiver)
    assert [r["reason"] for r in received] == ["unsigned", "unsigned"]
    assert received[0]["key"] == b"flask_cart"


def test_flask_signed_needs_a_secret(server: MemcachedServer) -> None:
    with pytest.raises(ConfigurationError, match="CACHE_OPTIONS: option 'signed' needs"):
        flask_cache(server, SECRET_KEY=None, CACHE_OPTIONS={"signed": True})
    embedded = Cache(
        Flask(__name__),
        config={
            "CACHE_TYPE": "django_mcpatterns.flask.LocMemPatternsCache",
            "SECRET_KEY": "s",
            "CACHE_OPTIONS": {"signed": True, "serializer": JSON},
        },
    ).cache
    embedded.set("k", (1, 2))
    assert embedded.get("k") == [1, 2]


# -- Django and Flask sharing one cluster ------------------------------------------------


def test_django_signals_fire_on_a_cluster_flask_built_first(server: MemcachedServer) -> None:
    dead = f"127.0.0.1:{free_port()}"
    django: list[tuple[str, object]] = []
    flask: list[object] = []

    def on_dead(sender: type, **kwargs: Any) -> None:
        django.append(("node_dead", kwargs["node"]))

    def on_refused(sender: type, **kwargs: Any) -> None:
        django.append(("value_refused", kwargs["key"]))

    def on_flask_refused(sender: Any = None, **kwargs: Any) -> None:
        flask.append(kwargs["key"])

    signals.node_dead.connect(on_dead)
    signals.value_refused.connect(on_refused)
    flask_signals.value_refused.connect(on_flask_refused)
    try:
        servers = [server.spec, dead]
        store = flask_cache(
            server, CACHE_MEMCACHED_SERVERS=servers, CACHE_OPTIONS={"retry_attempts": 1}
        ).store  # Flask builds the process's cluster for these servers first
        django_cache = KetamaMemcacheCache(servers, {"OPTIONS": {"retry_attempts": 1}})
        assert django_cache.store is store
        keys = {store.ring.get_node(key): key for key in map(str, range(100))}
        raw_client(server).set(keys[server.spec], b"{}", flags=FLAG_JSON)  # not pickle's
        assert store.get(keys[server.spec]) is None
        assert store.get(keys[dead]) is None
    finally:
        signals.node_dead.disconnect(on_dead)
        signals.value_refused.disconnect(on_refused)
        flask_signals.value_refused.disconnect(on_flask_refused)
    assert django == [("value_refused", keys[server.spec].encode()), ("node_dead", dead)]
    assert flask == [keys[server.spec].encode()]


# -- TLS through the frameworks ---------------------------------------------------------


def test_django_and_flask_over_tls(tls_server: MemcachedServer, certificate: Certificate) -> None:
    context = certificate.client_context()
    entry = {
        "BACKEND": CLUSTER,
        "LOCATION": tls_server.spec,
        "OPTIONS": {"tls_context": context, "signed": True},
    }
    with override_settings(CACHES={"default": entry}):
        cache = caches["default"]
        cache.set("k", {"over": "tls"})
        cache.sadd("s", "a", "b")
        assert cache.get_many(["k"]) == {"k": {"over": "tls"}}
        assert cache.smembers("s") == {"a", "b"}
    flask = flask_cache(tls_server, CACHE_OPTIONS={"tls_context": context})
    assert flask.set("k", [1])
    assert flask.get("k") == [1]
