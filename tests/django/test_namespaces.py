"""Namespaces on the Django backends, and ``manage.py mcpatterns_invalidate``.

The algorithm is proven in ``tests/core``; here namespaces are reached the way a
project reaches them (``caches[...]`` from ``settings.CACHES``), on a 3-server
cluster and on the embedded store: Django's key rules (``KEY_PREFIX``,
``VERSION``) and timeout conventions apply, invalidation reaches every backend
instance, stampede events arrive as signals, and the command invalidates what
``cache.invalidate_namespace`` does.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import InvalidCacheKey, caches
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_mcpatterns import signals
from django_mcpatterns.core.keys import Routed
from django_mcpatterns.core.stampede import lock_key
from django_mcpatterns.patterns.namespaces import CacheNamespace
from tests.django.conftest import CLUSTER_BACKEND, WIRE_COUNTERS, Deployment
from tests.django.test_locks_stampede import received
from tests.harness import LOOPBACK, free_port


def final_key(ns: CacheNamespace, key: str, version: int | None = None) -> Routed:
    """The memcached key of ``key`` in ``ns`` (routed: the namespace hands out none)."""
    return ns._ns.key(key, version=version)


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("mcpatterns_invalidate", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


class NamespacesContract:
    """Run against every deployment; subclasses provide ``deployment``."""

    @pytest.fixture
    def deployment(self) -> Deployment:
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    def _configured(self, deployment: Deployment) -> Iterator[None]:
        deployment.flush()
        setting = {
            "default": deployment.params(),
            "prefixed": deployment.params(KEY_PREFIX="site2", VERSION=3),
            "long": deployment.params(KEY_PREFIX="p" * 80),
        }
        with override_settings(CACHES=setting):
            caches["default"].clear()
            yield

    @pytest.fixture
    def cache(self) -> Any:
        return caches["default"]

    def test_invalidate_namespace(self, cache: Any) -> None:
        ns = cache.namespace("user", 42)
        assert isinstance(ns, CacheNamespace)
        ns.set("profile", {"name": "ann"})
        cache.set("profile", "plain")
        assert cache.invalidate_namespace("user", 42) == ns.versions()[0]
        assert ns.get("profile") is None
        assert cache.get("profile") == "plain"

    def test_keys_follow_the_cache_key_rules(self, cache: Any) -> None:
        prefixed = caches["prefixed"]
        ns = prefixed.namespace("user", 42)
        assert final_key(ns, "profile").key == b"site2:3:ns:user:42|profile"
        assert final_key(ns, "profile", version=4).key == b"site2:4:ns:user:42|profile"
        ns.set("profile", "v3")
        ns.set("profile", "v4", version=4)
        assert ns.get("profile") == "v3"
        assert ns.get("profile", version=4) == "v4"
        assert prefixed.get("ns:user:42") is not None  # the version key, prefixed too
        assert cache.namespace("user", 42).get("profile") is None  # another prefix

    def test_any_parts_make_valid_keys_under_a_long_prefix(self) -> None:
        long = caches["long"]
        parts = ("spaces and\nnewlines\x00", "é" * 300, -(10**40))
        ns = long.namespace(*parts).namespace("\r\n", "")
        ns.set("k", "stored")
        assert ns.get("k") == "stored"
        long.namespace(*parts).invalidate()
        assert ns.get("k") is None

    def test_user_keys_are_validated_as_django_does(self, cache: Any) -> None:
        with pytest.raises(InvalidCacheKey):
            cache.namespace("user", 42).get("has space")

    def test_a_namespace_validates_keys_and_hands_out_none(self, cache: Any) -> None:
        # Issue 12, point 4: ns.key() returned a str that routed on its own
        # bytes, to another server than the namespace's (10 of 20 keys on two
        # servers).  A namespace now gives out no key; it checks them.
        ns = cache.namespace("user", 42)
        assert not hasattr(ns, "key")
        long = "k" * 240  # valid on the cache; the namespace's prefix makes it too long
        cache.validate_key(cache.make_key(long))
        ns.validate_key("short")
        with pytest.raises(InvalidCacheKey):
            ns.validate_key(long)
        with pytest.raises(InvalidCacheKey):
            ns.validate_key("has space")

    def test_timeouts_follow_django(self, cache: Any, deployment: Deployment) -> None:
        ns = cache.namespace("catalog")
        ns.set("zero", 1, 0)  # Django: timeout 0 expires at once
        assert ns.get("zero") is None
        ns.set("default", 1)
        ns.set("forever", 1, None)
        if deployment.has_servers:
            assert deployment.ttl(final_key(ns, "default").key.decode()) in (299, 300)
            assert deployment.ttl(final_key(ns, "forever").key.decode()) == -1
            assert deployment.ttl(cache.make_key("ns:catalog")) == -1  # versions never expire

    def test_get_or_set_and_get_or_compute(self, cache: Any) -> None:
        ns = cache.namespace("user", 42)
        assert ns.get_or_set("a", lambda: "computed") == "computed"
        assert ns.get_or_set("a", "other") == "computed"
        with received(signals.recomputed) as recomputed:
            assert ns.get_or_compute("b", lambda: {"n": 1}, 60) == {"n": 1}
            assert ns.get_or_compute("b", lambda: {"n": 2}, 60) == {"n": 1}
        assert ns.get("b") == {"n": 1}  # never the envelope
        (call,) = recomputed
        assert call["cache"] is cache
        assert call["key"] == final_key(ns, "b")
        fetched = ns.get_or_compute_result("b", lambda: {"n": 3})
        assert fetched.outcome == "fresh"

    def test_an_invalidation_during_a_cold_compute_wins(self, cache: Any) -> None:
        # Issue 12, point 4, through the cache: the namespace's version key does
        # not exist yet when get_or_set / get_or_compute / {% cachefragment %} compute.
        for n, method in enumerate(["get_or_set", "get_or_compute"]):
            ns = cache.namespace("org", n).namespace("user", 42)

            def compute(n: int = n) -> str:
                cache.invalidate_namespace("org", n)  # a model saved meanwhile
                return "read before the change"

            assert getattr(ns, method)("k", compute, 60) == "read before the change"
            assert ns.get("k") is None
            assert getattr(ns, method)("k", lambda: "read after", 60) == "read after"

    def test_a_soft_namespace_serves_stale_with_a_signal(self, cache: Any) -> None:
        ns = cache.namespace("catalog", soft=True)
        ns.get_or_compute("page", lambda: "old", 60)
        ns.invalidate()
        # Another process is recomputing it: this caller is served the old value.
        assert cache.store.add(lock_key(final_key(ns, "page")), b"other", 10)
        with received(signals.stale_served) as stale:
            assert ns.get_or_compute("page", lambda: "new", 60) == "old"
        assert stale[0]["key"] == final_key(ns, "page")
        assert ns.get("page") is None  # plain reads never see it
        cache.store.delete(lock_key(final_key(ns, "page")))
        assert ns.get_or_compute("page", lambda: "new", 60) == "new"

    def test_an_invalidation_reaches_every_thread(self, cache: Any) -> None:
        ns = cache.namespace("org", 1).namespace("user", 42)
        ns.set("k", "v")
        other: list[Any] = []
        thread = threading.Thread(target=lambda: other.append(caches["default"]))
        thread.start()
        thread.join()
        assert other[0] is not cache  # Django's per-thread instance
        other[0].invalidate_namespace("org", 1)
        assert ns.get("k") is None

    # -- the management command --

    def test_command_invalidates_a_namespace(self, cache: Any) -> None:
        ns = cache.namespace("user", 42)
        ns.set("k", "v")
        out, _ = run("user", "42")  # text parts: "42" is the int 42
        assert ns.get("k") is None
        assert out.startswith("Invalidated namespace user 42 in cache 'default' (version ")

    def test_command_nested_and_json(self, cache: Any) -> None:
        inner = cache.namespace("org", 1).namespace("user", 42)
        sibling = cache.namespace("org", 1).namespace("user", 43)
        inner.set("k", "v")
        sibling.set("k", "v")
        out, _ = run("org", "1", "--nested", "user", "42", "--json")
        report = json.loads(out)
        assert report["cache"] == "default"
        assert report["namespace"] == [["org", "1"], ["user", "42"]]
        assert report["version"] == inner.versions()[1]
        assert inner.get("k") is None
        assert sibling.get("k") == "v"

    def test_command_on_another_alias(self) -> None:
        ns = caches["prefixed"].namespace("a b")
        ns.set("k", "v")
        run("--cache", "prefixed", "a b")
        assert ns.get("k") is None

    def test_command_refuses_an_unknown_alias(self) -> None:
        with pytest.raises(CommandError, match="no cache 'nope'"):
            run("--cache", "nope", "user")


class TestThreeServers(NamespacesContract):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)

    def test_a_namespaced_get_is_one_request(self, cache: Any, deployment: Deployment) -> None:
        ns = cache.namespace("org", 1).namespace("user", 42)
        ns.set("k", "v")
        before = deployment.wire_counters()
        assert ns.get("k") == "v"
        moved = deployment.wire_counters() - before
        # One multi-get of three keys (two versions and the value), nothing else.
        cmd_get = next(name for name in WIRE_COUNTERS if name in ("cmd_get", b"cmd_get"))
        assert dict(moved) == {cmd_get: 3}


class TestEmbedded(NamespacesContract):
    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded("namespaces")

    def test_command_warns_that_the_store_is_this_processes(self, cache: Any) -> None:
        _, err = run("user", "42")
        assert "embedded in-process store" in err


@pytest.mark.usefixtures("reset_shared_stores")
def test_command_reports_an_unreachable_server() -> None:
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": f"{LOOPBACK}:{free_port()}"}
    with (
        override_settings(CACHES={"default": entry}),
        pytest.raises(CommandError, match="not invalidated"),
    ):
        run("user", "42")
