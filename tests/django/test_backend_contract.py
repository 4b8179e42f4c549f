"""The Django cache contract, run against every backend configuration.

One suite in the shape of Django's ``BaseCacheTests`` (tests/cache/tests.py),
subclassed per deployment: a 3-server cluster, a single server, every ketama
variant on the 3-server cluster, and the embedded store.  The expected
behaviour is that of Django's own memcached backends (PyMemcacheCache and
PyLibMCCache): memcached's timeouts, memcached's key rules raised as
``InvalidCacheKey``, ``set_many`` returning the keys that failed.

Caches come from Django's machinery (``override_settings`` + ``caches``), so
what runs here is what a project gets.  Where memcached itself decides (TTLs,
placement, whether a command was sent) the tests read the servers directly.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import itertools
import pickle
import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.cache import caches, close_caches
from django.core.cache.backends.base import InvalidCacheKey, memcache_key_warnings
from django.test import override_settings

from django_mcpatterns.core.ketama import VARIANTS
from tests.django.conftest import Deployment, DeploymentSuite
from tests.harness import memcached_cluster, raw_client

MIB = 1024 * 1024
DEFAULT_TIMEOUT = 300  # Django's default TIMEOUT
THIRTY_DAYS = 60 * 60 * 24 * 30  # memcached's limit for relative expiry times


def custom_key_func(key: str, key_prefix: str, version: int) -> str:
    """A KEY_FUNCTION that differs from Django's default layout."""
    return f"CUSTOM-{key_prefix}-{version}-{key}"


def raw_key_func(key: str, key_prefix: str, version: int) -> str:
    """A KEY_FUNCTION that sends keys unchanged: lets tests read what others wrote."""
    return key


@dataclass
class Point:
    """A picklable user object."""

    x: int
    y: int


class Unpicklable:
    def __getstate__(self) -> dict[str, Any]:
        raise pickle.PickleError("this object refuses to be pickled")


def module_function() -> str:
    return "pickled by reference"


def incompressible(size: int, seed: int = 0) -> bytes:
    """Random bytes: no serializer can compress them under the item limit."""
    return random.Random(seed).randbytes(size)


OVERSIZED = incompressible(MIB + 1)  # memcached's default item limit is 1 MiB (-I 1m)


def assert_ttl_near(actual: int | None, expected: int) -> None:
    # memcached's clock ticks once a second and lags the wall clock, against which
    # absolute expiry times are converted: allow a second or two either way.
    assert actual is not None, "the key is not stored"
    assert abs(actual - expected) <= 2, (actual, expected)


class CacheContract(DeploymentSuite):
    """The contract; subclasses provide the ``deployment`` fixture."""

    def caches_setting(self, deployment: Deployment) -> dict[str, dict[str, Any]]:
        """Several aliases over the same servers (or the same embedded store)."""
        return {
            "default": deployment.params(),
            "v2": deployment.params(VERSION=2),
            "prefix": deployment.params(KEY_PREFIX="cacheprefix"),
            "custom_key": deployment.params(KEY_FUNCTION=custom_key_func),
            "custom_key2": deployment.params(
                KEY_FUNCTION="tests.django.test_backend_contract.custom_key_func"
            ),
            "raw": deployment.params(KEY_FUNCTION=raw_key_func),
            "forever": deployment.params(TIMEOUT=None),
            "one_minute": deployment.params(TIMEOUT=60),
            "one_second": deployment.params(TIMEOUT=1),
        }

    # -- basics -------------------------------------------------------------

    def test_set_get_delete(self, cache: Any) -> None:
        cache.set("key", "value")
        assert cache.get("key") == "value"
        assert cache.delete("key") is True
        assert cache.delete("key") is False
        assert cache.get("key") is None
        assert cache.get("key", "default") == "default"

    def test_add(self, cache: Any) -> None:
        assert cache.add("addkey1", "value") is True
        assert cache.add("addkey1", "newvalue") is False
        assert cache.get("addkey1") == "value"

    def test_non_string_keys_round_trip_in_get_many(self, cache: Any) -> None:
        cache.set(1, "one")
        cache.set("1.5", "one and a half")
        assert cache.get_many([1, "1.5", 2]) == {1: "one", "1.5": "one and a half"}

    def test_get_many(self, cache: Any) -> None:
        cache.set_many({"a": "a", "b": "b", "c": "c", "d": "d"})
        assert cache.get_many(["a", "c", "d"]) == {"a": "a", "c": "c", "d": "d"}
        assert cache.get_many(["a", "b", "e"]) == {"a": "a", "b": "b"}
        assert cache.get_many(iter(["a", "x"])) == {"a": "a"}
        assert cache.get_many([]) == {}
        assert cache.get_many(["missing1", "missing2"]) == {}

    def test_delete_many(self, cache: Any) -> None:
        cache.set_many({"key1": "spam", "key2": "eggs", "key3": "ham"})
        assert cache.delete_many(["key1", "key2", "never-set"]) is None
        assert cache.get("key1") is None
        assert cache.get("key2") is None
        assert cache.get("key3") == "ham"
        cache.delete_many([])  # nothing to do, nothing raised

    def test_has_key_and_in(self, cache: Any) -> None:
        cache.set("hello1", "goodbye1")
        cache.set("null", None)
        assert cache.has_key("hello1") is True
        assert cache.has_key("goodbye1") is False
        assert cache.has_key("null") is True  # a stored None is a hit
        assert "hello1" in cache
        assert "goodbye1" not in cache
        assert "null" in cache

    def test_clear(self, cache: Any) -> None:
        cache.set_many({"key1": "spam", "key2": "eggs"})
        caches["prefix"].set("key3", "ham")
        cache.clear()
        assert cache.get_many(["key1", "key2"]) == {}
        # memcached's flush_all empties the whole store, whatever the prefix.
        assert caches["prefix"].get("key3") is None

    def test_close_keeps_the_cache_usable(self, cache: Any) -> None:
        store = cache.store
        cache.set("key", "before close")
        cache.close()
        assert cache.get("key") == "before close"
        close_caches()  # what Django's request_finished receiver does to every cache
        cache.set("key", "after close")
        assert cache.get("key") == "after close"
        assert cache.store is store is cache._cache

    # -- values ----------------------------------------------------------------

    def test_none_is_stored_not_a_miss(self, cache: Any) -> None:
        cache.set("key_default_none", None)
        assert cache.get("key_default_none", default="default") is None
        assert cache.add("key_default_none", "other") is False
        assert cache.get_many(["key_default_none"]) == {"key_default_none": None}

    @pytest.mark.parametrize("value", [0, 0.0, "", b"", [], (), {}, set(), False, None], ids=repr)
    def test_falsy_values(self, cache: Any, value: Any) -> None:
        cache.set("falsy", value)
        got = cache.get("falsy", "default")
        assert got == value
        assert type(got) is type(value)
        assert cache.get_many(["falsy"]) == {"falsy": value}

    def test_data_types(self, cache: Any) -> None:
        now = datetime.datetime(2024, 2, 29, 12, 30, 15, 123456, tzinfo=datetime.UTC)
        values: dict[str, Any] = {
            "string": "this is a string",
            "int": 42,
            "negative": -7,
            "huge": 2**100,
            "true": True,
            "float": 3.25,
            "decimal": decimal.Decimal("1.10"),
            "complex": 1 + 2j,
            "list": [1, 2, [3, 4]],
            "tuple": (1, "two", 3.0),
            "dict": {"A": 1, "B": [2, 3], 4: None},
            "set": {1, 2, 3},
            "frozenset": frozenset({"a", "b"}),
            "datetime": now,
            "date": now.date(),
            "timedelta": datetime.timedelta(days=2, seconds=3),
            "object": Point(1, 2),
            "function": module_function,
            "class": Point,
        }
        cache.set_many(values)
        for key, value in values.items():
            got = cache.get(key)
            assert got == value, key
            assert type(got) is type(value), key
        assert cache.get_many(list(values)) == values

    def test_unicode(self, cache: Any) -> None:
        stuff = {
            "ascii": "ascii_value",
            "unicode_ascii": "Iñtërnâtiônàlizætiøn1",
            "Iñtërnâtiônàlizætiøn": "Iñtërnâtiônàlizætiøn2",
            "ключ": {"значение": "Ωμέγα ✓ 🐍"},
            "键": "值",
        }
        for key, value in stuff.items():
            cache.set(key, value)
            assert cache.get(key) == value
            assert cache.delete(key) is True
            assert cache.add(key, value) is True
            assert cache.get(key) == value
        cache.clear()
        assert cache.set_many(stuff) == []
        assert cache.get_many(list(stuff)) == stuff

    def test_binary(self, cache: Any) -> None:
        every_byte = bytes(range(256)) * 8  # includes \r\n and NUL inside the value
        compressed = zlib.compress(b"value to be compressed " * 50)
        cache.set("every_byte", every_byte)
        assert cache.add("compressed", compressed) is True
        assert cache.get("every_byte") == every_byte
        assert cache.get("compressed") == compressed
        assert zlib.decompress(cache.get("compressed")) == b"value to be compressed " * 50
        assert cache.get_or_set("binary_default", every_byte) == every_byte
        assert cache.get_many(["every_byte", "compressed"]) == {
            "every_byte": every_byte,
            "compressed": compressed,
        }

    def test_large_values_below_the_item_limit(self, cache: Any) -> None:
        values = {
            "large_bytes": incompressible(500 * 1024),
            "large_text": "é" * (250 * 1024),  # 500 KiB once UTF-8 encoded
            "large_list": list(range(50_000)),
        }
        for key, value in values.items():
            cache.set(key, value)
            assert cache.get(key) == value
        assert cache.get_many(list(values)) == values

    def test_unpicklable_values_raise_pickle_errors(self, cache: Any) -> None:
        with pytest.raises(pickle.PickleError):
            cache.set("unpicklable", Unpicklable())
        with pytest.raises(pickle.PickleError):
            cache.add("unpicklable", Unpicklable())
        assert cache.get("unpicklable") is None

    # -- the item size limit ---------------------------------------------------

    def test_oversized_set_returns_false_and_deletes_the_old_value(self, cache: Any) -> None:
        # Readers must never see data older than a write that failed (Django's
        # cache_db sessions rely on it).
        cache.set("small_value", "a")
        assert cache.get("small_value") == "a"
        assert cache.set("small_value", OVERSIZED) is False
        assert cache.get("small_value") is None

    def test_oversized_add_returns_false(self, cache: Any) -> None:
        assert cache.add("big", OVERSIZED) is False
        assert cache.get("big") is None
        assert cache.has_key("big") is False

    def test_set_many_returns_the_keys_that_failed(self, cache: Any) -> None:
        cache.set("big", "old value")
        failed = cache.set_many({"a": 1, "big": OVERSIZED, "b": 2})
        assert failed == ["big"]
        assert cache.get_many(["a", "b"]) == {"a": 1, "b": 2}
        assert cache.get("big") is None  # memcached drops the old item of a failed set

    def test_set_many_returns_empty_list_when_all_stored(self, cache: Any) -> None:
        assert cache.set_many({"key1": "spam", "key2": "eggs"}) == []
        assert cache.set_many({}) == []
        assert cache.get_many(["key1", "key2"]) == {"key1": "spam", "key2": "eggs"}

    # -- timeouts ----------------------------------------------------------------

    def test_zero_timeout_expires_at_once(self, cache: Any) -> None:
        cache.set("key1", "eggs", 0)
        assert cache.get("key1") is None
        cache.add("key2", "ham", 0)
        assert cache.get("key2") is None
        assert cache.add("key2", "ham again") is True  # the expired add left nothing behind
        assert cache.set_many({"key3": "sausage", "key4": "lobster bisque"}, 0) == []
        assert cache.get_many(["key3", "key4"]) == {}
        cache.set("key5", "belgian fries", timeout=60)
        assert cache.touch("key5", timeout=0) is True
        assert cache.get("key5") is None
        assert cache.get_or_set("key6", "computed", timeout=0) == "computed"
        assert cache.has_key("key6") is False

    def test_negative_timeout_expires_at_once(self, cache: Any) -> None:
        cache.set("key1", "eggs", -1)
        assert cache.get("key1") is None

    def test_none_timeout_is_forever(self, cache: Any, deployment: Deployment) -> None:
        cache.set("key1", "eggs", None)
        assert cache.get("key1") == "eggs"
        assert cache.add("key2", "ham", None) is True
        assert cache.add("key2", "new ham", None) is False
        assert cache.get("key2") == "ham"
        cache.set_many({"key3": "sausage"}, None)
        cache.set("key4", "soon gone", 60)
        assert cache.touch("key4", None) is True
        assert cache.get_many(["key1", "key2", "key3", "key4"]) == {
            "key1": "eggs",
            "key2": "ham",
            "key3": "sausage",
            "key4": "soon gone",
        }
        if deployment.has_servers:
            for key in ("key1", "key2", "key3", "key4"):
                assert deployment.ttl(cache.make_key(key)) == -1  # memcached: never expires

    def test_timeouts_over_30_days_are_absolute(self, cache: Any, deployment: Deployment) -> None:
        # memcached reads expiry times over 30 days as Unix timestamps: passed on
        # as relative seconds they would lie in 1970 and expire at once.
        long = THIRTY_DAYS + 1
        cache.set("key1", "eggs", long)
        assert cache.add("key2", "ham", long) is True
        assert cache.set_many({"key3": "sausage"}, long) == []
        cache.set("key4", "lobster", 60)
        assert cache.touch("key4", long) is True
        assert cache.get_many(["key1", "key2", "key3", "key4"]) == {
            "key1": "eggs",
            "key2": "ham",
            "key3": "sausage",
            "key4": "lobster",
        }
        if deployment.has_servers:
            for key in ("key1", "key2", "key3", "key4"):
                assert_ttl_near(deployment.ttl(cache.make_key(key)), long)

    def test_a_year_is_kept(self, cache: Any) -> None:
        cache.set("key", "a year", 60 * 60 * 24 * 365)
        assert cache.get("key") == "a year"

    def test_float_timeout(self, cache: Any, deployment: Deployment) -> None:
        cache.set("key1", "spam", 100.2)
        assert cache.get("key1") == "spam"
        assert cache.add("key2", "eggs", 0.5) is True  # truncated to 0: expire now
        assert cache.get("key2") is None
        if deployment.has_servers:
            assert_ttl_near(deployment.ttl(cache.make_key("key1")), 100)

    def test_default_timeout_comes_from_settings(self, deployment: Deployment) -> None:
        deployment.require_servers()
        cases = {"default": DEFAULT_TIMEOUT, "one_minute": 60}
        for alias, expected in cases.items():
            cache = caches[alias]
            cache.set("set", 1)
            cache.add("add", 1)
            cache.set_many({"set_many": 1})
            cache.get_or_set("get_or_set", 1)
            cache.set("touched", 1, 5)
            assert cache.touch("touched") is True
            for key in ("set", "add", "set_many", "get_or_set", "touched"):
                assert_ttl_near(deployment.ttl(cache.make_key(key)), expected)
            cache.clear()

    def test_timeout_none_in_settings_is_forever(self, deployment: Deployment) -> None:
        forever = caches["forever"]
        assert forever.default_timeout is None
        forever.set("set", 1)
        forever.add("add", 1)
        forever.set("touched", 1, 60)
        assert forever.touch("touched") is True
        assert forever.get_many(["set", "add", "touched"]) == {"set": 1, "add": 1, "touched": 1}
        if deployment.has_servers:
            for key in ("set", "add", "touched"):
                assert deployment.ttl(forever.make_key(key)) == -1

    def test_touch(self, cache: Any, deployment: Deployment) -> None:
        cache.set("key", "value", 10)
        assert cache.touch("key", 100) is True
        assert cache.get("key") == "value"
        assert cache.touch("nonexistent") is False
        assert cache.touch("nonexistent", 0) is False
        if deployment.has_servers:
            assert_ttl_near(deployment.ttl(cache.make_key("key")), 100)
            assert cache.touch("key") is True
            assert_ttl_near(deployment.ttl(cache.make_key("key")), DEFAULT_TIMEOUT)

    @pytest.mark.slow
    def test_short_timeouts_really_expire(self, cache: Any) -> None:
        # The one real sleep of the suite: everything with a 1 s lifetime at once.
        cache.set("set", "v", timeout=1)
        cache.add("add", "v", timeout=1)
        cache.set_many({"set_many": "v"}, timeout=1)
        cache.get_or_set("get_or_set", "v", timeout=1)
        caches["one_second"].set("from_settings", "v")
        # A 1 s item lives until memcached's clock next ticks, which may come at once: the
        # items touched get 2 s (they outlive the calls before their touch), then live on.
        cache.set("touched", "v", timeout=2)
        assert cache.touch("touched", 60) is True
        cache.set("forever", "v", timeout=None)
        cache.set("touched_forever", "v", timeout=2)
        assert cache.touch("touched_forever", None) is True
        # Gone within about 2 s on memcached's whole-second clock, whose tick a busy machine
        # delays: wait for the expiry itself (a 10 s hang guard), then check what lasts.
        # Each item's own second counts: wait for the last one written with a 1 s lifetime.
        for _ in range(200):
            gone = not cache.get_many(["set", "add", "set_many", "get_or_set"])
            if gone and caches["one_second"].get("from_settings") is None:
                break
            time.sleep(0.05)
        assert cache.get_many(["set", "add", "set_many", "get_or_set"]) == {}
        assert caches["one_second"].get("from_settings") is None
        assert cache.has_key("set") is False
        assert cache.get_many(["touched", "forever", "touched_forever"]) == {
            "touched": "v",
            "forever": "v",
            "touched_forever": "v",
        }
        assert cache.add("set", "again", timeout=60) is True  # expired keys can be added

    # -- keys ----------------------------------------------------------------

    def test_longest_valid_keys(self, cache: Any) -> None:
        made_len = len(cache.make_key(""))
        ascii_key = "k" * (250 - made_len)
        unicode_key = "é" * ((250 - made_len) // 2)  # two UTF-8 bytes each
        for key in (ascii_key, unicode_key):
            assert len(cache.make_key(key).encode()) <= 250
            cache.set(key, key)
            assert cache.get(key) == key
            assert cache.get_many([key]) == {key: key}
            assert cache.delete(key) is True

    @pytest.mark.parametrize(
        ("bad_key", "django_detects"),
        [
            pytest.param("k" * 248, True, id="251 characters once made"),
            pytest.param("é" * 124, False, id="127 characters but 251 UTF-8 bytes"),
            pytest.param("key with spaces", True, id="space"),
            pytest.param("key\nnewline", True, id="newline"),
            pytest.param("key\r\nflush_all", True, id="crlf injection"),
            pytest.param("\tkey", True, id="tab"),
            pytest.param("key\x00", True, id="nul"),
            pytest.param("key\x7f", True, id="del"),
            pytest.param("key\x1b", True, id="escape"),
        ],
    )
    def test_invalid_keys_raise_before_the_wire(
        self, cache: Any, deployment: Deployment, bad_key: str, django_detects: bool
    ) -> None:
        made = cache.make_key(bad_key)
        cache.set("ok", "kept")
        operations: dict[str, Callable[[], Any]] = {
            "get": lambda: cache.get(bad_key),
            "set": lambda: cache.set(bad_key, 1),
            "add": lambda: cache.add(bad_key, 1),
            "delete": lambda: cache.delete(bad_key),
            "get_many": lambda: cache.get_many(["ok", bad_key]),
            "set_many": lambda: cache.set_many({"ok": "overwritten", bad_key: 1}),
            "delete_many": lambda: cache.delete_many(["ok", bad_key]),
            "incr": lambda: cache.incr(bad_key),
            "decr": lambda: cache.decr(bad_key),
            "touch": lambda: cache.touch(bad_key),
            "has_key": lambda: cache.has_key(bad_key),
            "in": lambda: bad_key in cache,
            "get_or_set": lambda: cache.get_or_set(bad_key, 1),
            "incr_version": lambda: cache.incr_version(bad_key),
        }
        before = deployment.wire_counters()
        for name, operation in operations.items():
            with pytest.raises(InvalidCacheKey) as caught:
                operation()
            if django_detects:
                # Word for word what Django's memcached backends raise.
                assert str(caught.value) == next(memcache_key_warnings(made)), name
            else:
                assert "250" in str(caught.value), name
        assert deployment.wire_counters() == before  # nothing reached any server
        assert cache.get("ok") == "kept"  # the valid keys of a batch were not touched

    def test_key_limit_applies_after_the_prefix(self) -> None:
        prefixed = caches["prefix"]
        key = "k" * (250 - len(caches["default"].make_key("")))
        caches["default"].set(key, 1)  # fits without the prefix
        with pytest.raises(InvalidCacheKey):
            prefixed.set(key, 1)

    # -- get_or_set --------------------------------------------------------------

    def test_get_or_set(self, cache: Any) -> None:
        assert cache.get("projector") is None
        assert cache.get_or_set("projector", 42) == 42
        assert cache.get("projector") == 42
        assert cache.get_or_set("projector", 43) == 42

    def test_get_or_set_callable(self, cache: Any) -> None:
        calls: list[int] = []

        def compute() -> str:
            calls.append(1)
            return "computed"

        assert cache.get_or_set("mykey", compute) == "computed"
        assert cache.get_or_set("mykey", compute) == "computed"
        assert len(calls) == 1
        assert cache.get_or_set("null", lambda: None) is None
        assert cache.get("null", "default") is None

    def test_get_or_set_none_default_is_stored(self, cache: Any) -> None:
        assert cache.get_or_set("null", None) is None
        assert cache.get("null", "default") is None  # stored, not missing
        assert cache.has_key("null") is True

    def test_get_or_set_does_not_overwrite_a_racing_writer(self, cache: Any) -> None:
        # get_or_set stores with add(): a value written meanwhile by someone else wins.
        def compute_while_another_process_writes() -> str:
            caches["v2"].set("race", "winner", version=1)
            return "loser"

        assert cache.get_or_set("race", compute_while_another_process_writes) == "winner"
        assert cache.get("race") == "winner"

    def test_get_or_set_fill_never_lands_over_a_concurrent_delete(self, cache: Any) -> None:
        # A lease (core/leases/): the row changed and the key was deleted while
        # the old row was being read; the old value is returned, never cached.
        def compute_while_another_process_invalidates() -> str:
            caches["v2"].delete("race", version=1)
            return "old"

        assert cache.get_or_set("race", compute_while_another_process_invalidates) == "old"
        assert cache.get("race") is None
        assert cache.get_or_set("race", "new") == "new"

    def test_get_or_compute_fill_never_lands_over_a_concurrent_write(self, cache: Any) -> None:
        def compute_while_another_process_deletes() -> str:
            caches["v2"].delete("race", version=1)
            return "old"

        def compute_while_another_process_writes() -> str:
            caches["v2"].set("race", "written", version=1)
            return "old"

        assert cache.get_or_compute("race", compute_while_another_process_deletes, 60) == "old"
        assert cache.get("race") is None
        assert cache.get_or_compute("race", compute_while_another_process_writes, 60) == "old"
        assert cache.get("race") == "written"

    def test_get_or_set_version(self, cache: Any) -> None:
        assert cache.get_or_set("brian", 1979, version=2) == 1979
        assert cache.get("brian", version=1) is None
        assert cache.get("brian", version=2) == 1979
        assert caches["v2"].get("brian") == 1979

    # -- incr / decr -------------------------------------------------------------

    def test_incr_decr(self, cache: Any) -> None:
        cache.set("answer", 41)
        assert cache.incr("answer") == 42
        assert cache.get("answer") == 42
        assert cache.incr("answer", 10) == 52
        assert cache.decr("answer") == 51
        assert cache.decr("answer", 10) == 41
        assert cache.incr("answer", -5) == 36  # a negative delta decrements
        assert cache.decr("answer", -5) == 41
        assert cache.get("answer") == 41
        assert type(cache.get("answer")) is int

    def test_incr_decr_missing_key_raises_value_error(self, cache: Any) -> None:
        for operation in (cache.incr, cache.decr):
            for delta in (1, -1):
                with pytest.raises(ValueError, match="not found"):
                    operation("does_not_exist", delta)
        assert cache.has_key("does_not_exist") is False

    @pytest.mark.parametrize("value", ["spam", 1.5, [1], b"\xff"], ids=repr)
    def test_incr_decr_non_integer_raises_value_error(self, cache: Any, value: Any) -> None:
        cache.set("not_a_number", value)
        # memcached: "CLIENT_ERROR cannot increment or decrement non-numeric value"
        with pytest.raises(ValueError, match="non-numeric"):
            cache.incr("not_a_number")
        with pytest.raises(ValueError, match="non-numeric"):
            cache.decr("not_a_number")
        assert cache.get("not_a_number") == value

    def test_incr_decr_non_integer_is_also_a_type_error(self, cache: Any) -> None:
        # Django's own test_incr/test_decr: cache.set("null", None) then
        # assertRaises(self.incr_decr_type_error), TypeError for its backends.
        cache.set("null", None)
        with pytest.raises(TypeError):
            cache.incr("null")
        with pytest.raises(TypeError):
            cache.decr("null")
        with pytest.raises(ValueError, match="non-numeric"):  # and still a ValueError, as before
            cache.incr("null")

    def test_memcached_counter_limits(self, cache: Any) -> None:
        # memcached's counters are unsigned 64-bit: decr stops at 0, incr wraps.
        cache.set("counter", 5)
        assert cache.decr("counter", 10) == 0
        cache.set("counter", 2**64 - 1)
        assert cache.incr("counter") == 0

    # -- versions, prefixes, key functions ----------------------------------------

    def test_key_layout_is_djangos(self) -> None:
        raw = caches["raw"]
        caches["default"].set("answer", 1)
        caches["v2"].set("answer", 2)
        caches["prefix"].set("answer", 3)
        caches["custom_key"].set("answer", 4)
        assert raw.get_many([":1:answer", ":2:answer", "cacheprefix:1:answer"]) == {
            ":1:answer": 1,
            ":2:answer": 2,
            "cacheprefix:1:answer": 3,
        }
        assert raw.get("CUSTOM--1-answer") == 4

    def test_key_prefix_isolates(self, cache: Any) -> None:
        prefixed = caches["prefix"]
        cache.set("somekey", "value")
        assert prefixed.has_key("somekey") is False
        prefixed.set("somekey", "prefixed value")
        assert cache.get("somekey") == "value"
        assert prefixed.get("somekey") == "prefixed value"
        assert prefixed.delete("somekey") is True
        assert cache.get("somekey") == "value"

    def test_custom_key_function(self, cache: Any) -> None:
        custom, custom_by_path = caches["custom_key"], caches["custom_key2"]
        custom.set("answer1", 42)
        assert cache.get("answer1") is None
        assert custom.get("answer1") == 42
        assert custom_by_path.get("answer1") == 42
        custom_by_path.set("answer2", 42)
        assert cache.get("answer2") is None
        assert custom.get_many(["answer1", "answer2"]) == {"answer1": 42, "answer2": 42}

    def test_keys_are_made_as_django_makes_them_whatever_changes(self, cache: Any) -> None:
        """A key made once is made again when the cache's prefix, version or key function
        changes, and a subclass's make_key is used: each time what Django would make."""

        def made(key: str) -> str:
            answer: str = cache.make_and_validate_key(key)
            assert answer == cache.make_key(key)
            return answer

        saved = cache.key_prefix, cache.version, cache.key_func
        try:
            first = made("answer")
            assert made("answer") == first
            cache.version = saved[1] + 1
            assert made("answer") != first
            cache.key_prefix = "other"
            assert made("answer").startswith("other:")
            cache.key_func = custom_key_func
            assert made("answer") == custom_key_func("answer", "other", saved[1] + 1)
        finally:
            cache.key_prefix, cache.version, cache.key_func = saved
        assert made("answer") == first
        for i in range(5000):  # more than are kept
            made(f"key{i}")
        for _ in range(2):  # a refused key is refused every time
            with pytest.raises(InvalidCacheKey):
                cache.make_and_validate_key("with space")

        def shouting(self: Any, key: Any, version: Any = None) -> str:
            return str(type(cache).make_key(self, key, version)).upper()

        loud = type("Loud", (type(cache),), {"make_key": shouting})(cache._location, {})
        assert loud.make_and_validate_key("answer") == first.upper()

    def test_versioning_get_set(self, cache: Any) -> None:
        v2 = caches["v2"]
        cache.set("answer1", 42)
        assert cache.get("answer1") == 42
        assert cache.get("answer1", version=1) == 42
        assert cache.get("answer1", version=2) is None
        assert v2.get("answer1") is None
        assert v2.get("answer1", version=1) == 42

        cache.set("answer2", 42, version=2)
        assert cache.get("answer2") is None
        assert cache.get("answer2", version=2) == 42
        assert v2.get("answer2") == 42

        v2.set("answer3", 42)
        assert cache.get("answer3") is None
        assert cache.get("answer3", version=2) == 42

    def test_versioning_add_delete_has_key_touch(self, cache: Any) -> None:
        v2 = caches["v2"]
        assert cache.add("answer", 37, version=2) is True
        assert cache.add("answer", 42) is True  # version 1 is another key
        assert v2.add("answer", 43) is False
        assert v2.get("answer") == 37
        assert cache.has_key("answer", version=2) is True
        assert cache.touch("answer", 100, version=2) is True
        assert cache.delete("answer", version=2) is True
        assert cache.has_key("answer", version=2) is False
        assert cache.get("answer") == 42

    def test_versioning_incr_decr(self, cache: Any) -> None:
        cache.set("answer", 1, version=1)
        cache.set("answer", 1, version=2)
        assert cache.incr("answer", version=2) == 2
        assert caches["v2"].decr("answer", 2) == 0
        assert cache.get("answer") == 1
        assert cache.get("answer", version=2) == 0

    def test_versioning_get_set_many(self, cache: Any) -> None:
        v2 = caches["v2"]
        assert cache.set_many({"ford1": 37, "arthur1": 42}) == []
        assert cache.get_many(["ford1", "arthur1"]) == {"ford1": 37, "arthur1": 42}
        assert cache.get_many(["ford1", "arthur1"], version=2) == {}
        assert v2.get_many(["ford1", "arthur1"], version=1) == {"ford1": 37, "arthur1": 42}
        assert cache.set_many({"ford2": 37}, version=2) == []
        assert v2.get_many(["ford2"]) == {"ford2": 37}
        assert cache.get_many(["ford2"]) == {}
        cache.delete_many(["ford2"], version=2)
        assert v2.get_many(["ford2"]) == {}

    def test_incr_version(self, cache: Any) -> None:
        cache.set("answer", 42, version=2)
        assert cache.incr_version("answer", version=2) == 3
        assert cache.get("answer", version=2) is None
        assert cache.get("answer", version=3) == 42
        assert cache.incr_version("answer", 2, version=3) == 5
        assert cache.get("answer", version=5) == 42

        v2 = caches["v2"]
        v2.set("answer2", 42)
        assert v2.incr_version("answer2") == 3  # starts from the cache's VERSION
        assert v2.get("answer2") is None
        assert v2.get("answer2", version=3) == 42

        cache.set("none", None)
        assert cache.incr_version("none") == 2
        assert cache.has_key("none", version=2) is True
        with pytest.raises(ValueError, match="not found"):
            cache.incr_version("does_not_exist")

    def test_decr_version(self, cache: Any) -> None:
        cache.set("answer", 42, version=2)
        assert cache.decr_version("answer", version=2) == 1
        assert cache.get("answer") == 42
        assert cache.get("answer", version=2) is None
        v2 = caches["v2"]
        v2.set("answer2", 42)
        assert v2.decr_version("answer2") == 1
        assert cache.get("answer2") == 42
        with pytest.raises(ValueError, match="not found"):
            cache.decr_version("does_not_exist", version=2)

    # -- async -----------------------------------------------------------------

    def test_async_api(self, cache: Any) -> None:
        async def scenario() -> None:
            await cache.aset("a", 1)
            assert await cache.aget("a") == 1
            assert await cache.aget("missing", "default") == "default"
            assert await cache.aadd("a", 2) is False
            assert await cache.aadd("b", 2) is True
            assert await cache.aset_many({"c": 3, "d": 4}) == []
            assert await cache.aget_many(["a", "b", "c", "d", "e"]) == {
                "a": 1,
                "b": 2,
                "c": 3,
                "d": 4,
            }
            assert await cache.ahas_key("c") is True
            assert await cache.ahas_key("e") is False
            assert await cache.atouch("c", 100) is True
            assert await cache.atouch("e", 100) is False
            assert await cache.aincr("a", 5) == 6
            assert await cache.adecr("a") == 5
            with pytest.raises(ValueError, match="not found"):
                await cache.aincr("e")
            assert await cache.adelete("d") is True
            assert await cache.adelete("d") is False
            await cache.adelete_many(["c"])
            assert await cache.aget("c") is None
            assert await cache.aget_or_set("e", lambda: 5) == 5
            assert await cache.aget_or_set("e", 6) == 5
            assert await cache.aincr_version("e") == 2
            assert await cache.aget("e", version=2) == 5
            assert await cache.adecr_version("e", version=2) == 1
            with pytest.raises(InvalidCacheKey):
                await cache.aget("bad key")
            await cache.aclose()
            await cache.aclear()
            assert await cache.aget_many(["a", "b", "e"]) == {}

        asyncio.run(scenario())
        assert cache.get("a") is None

    # -- threads -------------------------------------------------------------

    def test_threads_share_one_store_and_count_exactly(self, cache: Any) -> None:
        threads_count, increments = 8, 50
        cache.set("counter", 0)
        barrier = threading.Barrier(threads_count)
        instances: list[Any] = []
        errors: list[BaseException] = []

        def work() -> None:
            try:
                mine = caches["default"]  # Django builds one instance per thread
                instances.append(mine)
                barrier.wait(timeout=10)
                for _ in range(increments):
                    mine.incr("counter")
                mine.close()  # as after every request
            except BaseException as exc:  # reported below, in the main thread
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(threads_count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert errors == []
        assert cache.get("counter") == threads_count * increments
        assert len({id(instance) for instance in instances} | {id(cache)}) == threads_count + 1
        assert all(instance.store is cache.store for instance in instances)
        assert all(instance._cache is cache.store for instance in instances)

    # -- routing (cluster deployments) -------------------------------------------

    def test_keys_live_on_the_server_the_continuum_names(
        self, cache: Any, deployment: Deployment
    ) -> None:
        from django_mcpatterns.core.ketama import Continuum

        servers = deployment.require_servers()
        ring = Continuum([s.spec for s in servers], variant=deployment.variant)
        aliases = [cache, caches["prefix"], caches["v2"]]
        base = [f"route:{i}" for i in range(40)] + ["Iñtërnâtiônàlizætiøn", "键"]
        owners: set[str] = set()
        for alias in aliases:
            # Ports are random, and a ring can leave a server few points: add, for each
            # server, the first key it owns, so every server is exercised in every run.
            owned = {ring.get_node(alias.make_key(key)): key for key in reversed(base)}
            for i in itertools.count(40):
                if len(owned) == len(servers):
                    break
                owned.setdefault(ring.get_node(alias.make_key(f"route:{i}")), f"route:{i}")
            keys = list(dict.fromkeys([*base, *owned.values()]))
            alias.set_many({key: key for key in keys})
            for key in keys:
                made = alias.make_key(key)
                owner = ring.get_node(made)
                owners.add(owner)
                assert deployment.holders(made) == [owner], made
            assert alias.get_many(keys) == {key: key for key in keys}
        assert owners == {s.spec for s in servers}  # every server holds keys of every alias


class TestThreeServers(CacheContract):
    """The default ketama variant over three memcached servers."""

    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)


class TestSingleServer(CacheContract):
    @pytest.fixture
    def deployment(self, memcached_1: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_1)


class TestTextProtocol(CacheContract):
    """``OPTIONS["protocol"] = "text"``: the whole contract without a meta command."""

    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3, protocol="text")


class TestKetamaVariants(CacheContract):
    """Every compatibility variant must keep the whole contract, not only routing."""

    @pytest.fixture(params=VARIANTS)
    def deployment(self, request: pytest.FixtureRequest, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3, ketama=request.param)


class TestEmbedded(CacheContract):
    """The in-process store: same contract, no server."""

    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded()


# -- node health across requests ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("reset_shared_stores")
def test_close_between_requests_keeps_node_health() -> None:
    """Django calls close() after every request: a dead node must stay dead."""
    from django_mcpatterns import signals
    from django_mcpatterns.core.ketama import Continuum

    dead_timeout = 1.0
    events: list[tuple[str, str]] = []

    def on_dead(sender: Any, node: str, error: Any, **kwargs: Any) -> None:
        events.append(("dead", node))

    def on_revived(sender: Any, node: str, error: Any, **kwargs: Any) -> None:
        events.append(("revived", node))

    signals.node_dead.connect(on_dead)
    signals.node_revived.connect(on_revived)
    try:
        with memcached_cluster(3) as servers:
            specs = [s.spec for s in servers]
            setting = {
                "default": {
                    "BACKEND": "django_mcpatterns.backend.KetamaMemcacheCache",
                    "LOCATION": specs,
                    "OPTIONS": {
                        "retry_attempts": 2,
                        "retry_timeout": 0,
                        "dead_timeout": dead_timeout,
                        "connect_timeout": 0.5,
                        "timeout": 0.5,
                    },
                }
            }
            with override_settings(CACHES=setting):
                cache = caches["default"]
                victim = servers[0]
                ring = Continuum(specs)
                key = next(
                    k
                    for k in (f"k{i}" for i in range(1000))
                    if ring.get_node(cache.make_key(k)) == victim.spec
                )
                assert cache.set(key, "alive") is True

                victim.kill()
                for _ in range(10):
                    assert cache.get(key) is None  # a dead server reads as a miss
                    if node_state(cache, victim.spec) == "dead":
                        break
                assert node_state(cache, victim.spec) == "dead"
                assert ("dead", victim.spec) in events

                close_caches()  # Django's request_finished receiver for caches
                assert node_state(cache, victim.spec) == "dead"
                other_thread: list[str] = []
                thread = threading.Thread(
                    target=lambda: other_thread.append(node_state(caches["default"], victim.spec))
                )
                thread.start()
                thread.join()
                assert other_thread == ["dead"]  # health is per process, not per thread
                # While dead it fails fast, not timing out: refused (retry_timeout 0 probes a
                # dead server at every request; its back-off is 0 s doubled).
                assert cache.set(key, "lost") is False
                last_error = cache.store.health()[victim.spec].last_error
                assert last_error.startswith("ConnectionRefusedError"), last_error

                victim.start()
                time.sleep(dead_timeout + 0.2)
                close_caches()
                deadline = time.monotonic() + 5
                while cache.set(key, "back") is not True and time.monotonic() < deadline:
                    time.sleep(0.1)
                probe = raw_client(victim)
                assert probe.get(cache.make_key(key)) is not None
                probe.close()
                assert cache.get(key) == "back"
                assert node_state(cache, victim.spec) == "up"
                assert ("revived", victim.spec) in events
    finally:
        signals.node_dead.disconnect(on_dead)
        signals.node_revived.disconnect(on_revived)


def node_state(cache: Any, node: str) -> str:
    """The health state ("up", "failing", "dead") the cluster reports for a node."""
    return cache.store.health()[node].state
