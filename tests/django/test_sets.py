"""Sets and lists on the Django backends: django-redis 6's API over append-based items.

The suite runs on a 3-server cluster and on the embedded store, through Django's
own cache machinery (``override_settings`` + ``caches``), so key prefixes,
versions and default timeouts behave as in a project.  The algorithm itself is
tested in ``tests/core/test_sets*.py``; here: names, signatures, key making,
timeouts, return values and the requests that reach memcached.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from django.core.cache import caches
from django.core.cache.backends.base import InvalidCacheKey

from django_mcpatterns.core.exceptions import IncompleteSetError, WrongTypeError
from tests.django.conftest import Deployment, DeploymentSuite

DEFAULT_TIMEOUT = 300

# django-redis 6 (django_redis/client/default.py): parameters before the ones we add.
DJANGO_REDIS_SIGNATURES = {
    "sadd": ["key", "*values", "version"],
    "srem": ["key", "*members", "version"],
    "smembers": ["key", "version"],
    "sismember": ["key", "member", "version"],
    "smismember": ["key", "*members", "version"],
    "scard": ["key", "version"],
    "spop": ["key", "count", "version"],
    "srandmember": ["key", "count", "version"],
    "smove": ["source", "destination", "member", "version"],
    "sunion": ["*keys", "version"],
    "sinter": ["*keys", "version"],
    "sdiff": ["*keys", "version"],
    "sunionstore": ["destination", "*keys", "version"],
    "sinterstore": ["dest", "*keys", "version"],
    "sdiffstore": ["dest", "*keys", "version_dest", "version_keys"],
    # django-redis 7
    "sscan": ["key", "match", "count", "version"],
    "rpush": ["key", "*values", "version"],
    "lrange": ["key", "start", "end", "version"],
    "llen": ["key", "version"],
    "lrem": ["key", "count", "value", "version"],
}


def parameters(method: Any) -> list[str]:
    names = []
    for p in inspect.signature(method).parameters.values():
        names.append(f"*{p.name}" if p.kind is p.VAR_POSITIONAL else p.name)
    return names


class SetsOnDjango(DeploymentSuite):
    """The contract; subclasses provide ``deployment``."""

    def caches_setting(self, deployment: Deployment) -> dict[str, dict[str, Any]]:
        return {
            "default": deployment.params(),
            "v2": deployment.params(VERSION=2),
            "prefix": deployment.params(KEY_PREFIX="other"),
            "one_minute": deployment.params(TIMEOUT=60),
            "forever": deployment.params(TIMEOUT=None),
        }

    # -- the API -------------------------------------------------------------

    @pytest.mark.parametrize("name", list(DJANGO_REDIS_SIGNATURES))
    def test_django_redis_names_and_signatures(self, cache: Any, name: str) -> None:
        expected = DJANGO_REDIS_SIGNATURES[name]
        assert parameters(getattr(cache, name))[: len(expected)] == expected

    def test_sscan_returns_every_member_at_once_filtered_by_match(self, cache: Any) -> None:
        cache.sadd("s", "bar1", "bar2", "zoo", b"bar3", 12)
        assert cache.sscan("s") == {"bar1", "bar2", "zoo", b"bar3", 12}
        assert cache.sscan("s", match="bar*") == {"bar1", "bar2", b"bar3"}
        assert cache.sscan("s", match="1?", count=1) == {12}
        assert cache.sscan("s", match="[bz]??") == {"zoo"}
        assert cache.sscan("missing") == set()
        assert parameters(cache.sscan_iter)[:4] == ["key", "match", "count", "version"]
        assert set(cache.sscan_iter("s", match="bar?")) == {"bar1", "bar2", b"bar3"}
        cache.sadd("s", "a", version=2)
        assert cache.sscan("s", version=2) == {"a"}

    def test_members_keep_their_type(self, cache: Any) -> None:
        assert cache.sadd("s", "1", b"1", 1, "", "ünï\ncödé") == 5
        got = cache.smembers("s")
        assert {(type(m), m) for m in got} == {
            (str, "1"),
            (bytes, b"1"),
            (int, 1),
            (str, ""),
            (str, "ünï\ncödé"),
        }
        with pytest.raises(TypeError, match="str, bytes or int"):
            cache.sadd("s", 1.5)

    def test_set_reads_and_writes(self, cache: Any) -> None:
        assert cache.sadd("s", "a", "b", "c") == 3
        assert cache.srem("s", "b") == 1
        assert cache.smembers("s") == {"a", "c"}
        assert cache.sismember("s", "a") is True
        assert cache.sismember("s", "b") is False
        assert cache.smismember("s", "a", "b", "c") == [True, False, True]
        assert cache.scard("s") == 2
        assert cache.srandmember("s") in {"a", "c"}
        assert sorted(cache.srandmember("s", 5)) == ["a", "c"]
        assert cache.smembers("missing") == set()
        assert cache.scard("missing") == 0
        assert cache.spop("missing") is None

    @pytest.mark.parametrize("value", [{"plain": True}, b"raw bytes", "text", [1, 2]], ids=repr)
    def test_a_key_holding_a_plain_value_is_refused_by_set_and_list_reads(
        self, cache: Any, value: Any
    ) -> None:
        cache.set("plain", value)
        with pytest.raises(WrongTypeError, match="holds a plain"):
            cache.smembers("plain")
        # sadd is a blind append (one request, nothing read): memcached takes it...
        assert cache.sadd("plain", "x") == 1
        written = cache.get("plain")
        # ...and every read of the set refuses the key, rewriting nothing.
        reads = [
            lambda: cache.smembers("plain"),
            lambda: cache.scard("plain"),
            lambda: cache.sismember("plain", "x"),
            lambda: cache.srandmember("plain"),
            lambda: cache.spop("plain"),
            lambda: cache.sunion("plain", "other"),
            lambda: cache.smove("plain", "other", "x"),
            lambda: cache.lrange("plain", 0, -1),
        ]
        for read in reads:
            with pytest.raises(WrongTypeError, match="holds a plain"):
                read()
        assert cache.get("plain") == written
        assert cache.smembers("other") == set()
        if not isinstance(value, bytes | str):
            assert written == value  # pickle stops at its own end: the value reads as before
        cache.delete("plain")
        assert cache.sadd("plain", "x") == 1
        assert cache.smembers("plain") == {"x"}

    def test_a_list_is_not_a_set(self, cache: Any) -> None:
        cache.rpush("l", 1)
        with pytest.raises(WrongTypeError, match="holds a list, not a set"):
            cache.smembers("l")
        cache.sadd("s", 1)
        with pytest.raises(WrongTypeError, match="holds a set, not a list"):
            cache.lrange("s", 0, -1)

    def test_spop_and_smove(self, cache: Any) -> None:
        cache.sadd("s", 1, 2, 3)
        popped = cache.spop("s")
        assert popped in {1, 2, 3}
        assert cache.spop("s", 5) == {1, 2, 3} - {popped}
        assert cache.smembers("s") == set()
        cache.sadd("src", "m")
        assert cache.smove("src", "dst", "m") is True
        assert cache.smove("src", "dst", "m") is False
        assert cache.smembers("dst") == {"m"}

    def test_algebra(self, cache: Any) -> None:
        cache.sadd("a", 1, 2, 3)
        cache.sadd("b", 2, 3, 4)
        assert cache.sunion("a", "b") == {1, 2, 3, 4}
        assert cache.sinter("a", "b") == {2, 3}
        assert cache.sdiff("a", "b") == {1}
        assert cache.sunionstore("u", "a", "b") == 4
        assert cache.sinterstore("i", "a", "b") == 2
        assert cache.sdiffstore("d", "a", "b") == 1
        assert (cache.smembers("u"), cache.smembers("i"), cache.smembers("d")) == (
            {1, 2, 3, 4},
            {2, 3},
            {1},
        )

    def test_versions_and_prefixes_isolate_sets(self, cache: Any) -> None:
        cache.sadd("s", "v1")
        cache.sadd("s", "v2", version=2)
        caches["prefix"].sadd("s", "prefixed")
        assert cache.smembers("s") == {"v1"}
        assert cache.smembers("s", version=2) == {"v2"}
        assert caches["v2"].smembers("s") == {"v2"}
        assert caches["prefix"].smembers("s") == {"prefixed"}
        assert cache.sunion("s", version=2) == {"v2"}
        cache.sadd("o", "v1", "x")
        assert cache.sdiffstore("d", "s", "o", version_dest=3, version_keys=None) == 0
        assert cache.sdiffstore("d", "o", "s", version_dest=3) == 1
        assert cache.smembers("d", version=3) == {"x"}
        assert cache.smove("s", "t", "v2", version=2) is True
        assert cache.smembers("t", version=2) == {"v2"}

    def test_invalid_keys_raise_before_the_wire(self, cache: Any) -> None:
        for call in (
            lambda: cache.sadd("with space", 1),
            lambda: cache.smembers("k" * 300),
            lambda: cache.rpush("new\nline", 1),
        ):
            with pytest.raises(InvalidCacheKey):
                call()

    def test_lists(self, cache: Any) -> None:
        assert cache.rpush("l", "a", "b", "a", 1) == 4
        assert cache.lrange("l", 0, -1) == ["a", "b", "a", 1]
        assert cache.lrem("l", 1, "a") == 1
        assert cache.lrange("l", 0, -1) == ["b", "a", 1]
        assert cache.llen("l") == 3
        assert cache.lrange("l", -2, -1) == ["a", 1]
        assert cache.lrem("missing", 0, "a") == 0
        assert cache.rpush("l", "v2", version=2) == 1
        assert cache.lrange("l", 0, -1, version=2) == ["v2"]

    def test_loader_backed_sets(self, cache: Any, deployment: Deployment) -> None:
        source = {"alice", "bob"}
        loads: list[int] = []

        def loader() -> set[str]:
            loads.append(1)
            return set(source)

        source.add("carol")
        cache.sadd("friends", "carol", loader=loader)  # never creates the set
        assert cache.smembers("friends", loader=loader) == {"alice", "bob", "carol"}
        assert cache.scard("friends", loader=loader) == 3
        assert loads == [1]
        source.discard("bob")
        cache.srem("friends", "bob", loader=loader)
        assert cache.smembers("friends") == {"alice", "carol"}

    def test_a_pending_set_is_never_read_as_empty(self, cache: Any) -> None:
        def loader() -> set[str]:
            with pytest.raises(IncompleteSetError):
                caches["default"].smembers("friends")
            return {"alice"}

        assert cache.smembers("friends", loader=loader) == {"alice"}

    # -- timeouts --------------------------------------------------------------

    def test_timeouts_follow_djangos_conventions(self, cache: Any, deployment: Deployment) -> None:
        cache.sadd("default", 1)
        cache.sadd("minute", 1, timeout=60)
        cache.sadd("never", 1, timeout=None)
        cache.sadd("gone", 1, timeout=0)
        caches["one_minute"].rpush("list", 1)
        caches["forever"].sadd("forever", 1)
        assert cache.smembers("gone") == set()
        assert caches["forever"].smembers("forever") == {1}
        if deployment.has_servers:
            assert abs(deployment.ttl(cache.make_key("default")) - DEFAULT_TIMEOUT) <= 2
            assert abs(deployment.ttl(cache.make_key("minute")) - 60) <= 2
            assert abs(deployment.ttl(caches["one_minute"].make_key("list")) - 60) <= 2
            assert deployment.ttl(cache.make_key("never")) == -1
            assert deployment.ttl(caches["forever"].make_key("forever")) == -1

    def test_a_timeout_is_given_at_creation_and_touch_extends_it(
        self, cache: Any, deployment: Deployment
    ) -> None:
        cache.sadd("s", 1, timeout=60)
        cache.sadd("s", 2, timeout=600)  # an append keeps the item's TTL
        assert cache.touch("s", 1000) is True
        assert cache.smembers("s") == {1, 2}
        if deployment.has_servers:
            assert abs(deployment.ttl(cache.make_key("s")) - 1000) <= 2


class TestThreeServers(SetsOnDjango):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)

    def test_requests_that_reach_memcached(self, cache: Any, deployment: Deployment) -> None:
        cache.sadd("s", "a")  # creation: append, add
        before = deployment.wire_counters()
        cache.sadd("s", *range(100))
        cache.srem("s", *range(50))
        cache.rpush("l", 1)  # creation: append, add
        cache.lrem("l", 0, 1)
        moved = deployment.wire_counters() - before
        assert moved == {"cmd_set": 5}
        cache.smembers("s")  # the log is dirty: the read compacts it (gets + cas)
        before = deployment.wire_counters()
        assert cache.smembers("s") == {"a", *range(50, 100)}
        assert cache.sismember("s", "a")
        assert cache.scard("s") == 51
        assert cache.lrange("l", 0, -1) == []
        assert deployment.wire_counters() - before == {"cmd_get": 4}


class TestEmbedded(SetsOnDjango):
    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded(name="sets")
