"""Flask-Caching's backend contract, on a 3-server cluster, a single server and the embedded store.

In the shape of Flask-Caching's own backend tests (``tests/test_backend_cache.py``):
a ``make_cache`` fixture, :class:`GenericCacheTests` with the ``test_generic_*``
checks every Flask-Caching backend passes, and memcached-specific checks
(huge timeouts, ``has`` after expiry).  :class:`ContractTests` then pins what
Flask-Caching promises and Django does not: timeout 0 never expires, ``None`` is
the default, ``set_many`` returns the keys stored, invalid keys are misses,
``inc``/``dec`` start from 0.  Each ``Test*`` class at the end is one
deployment; where memcached itself decides (TTLs, placement) the tests read
the servers.
"""

from __future__ import annotations

import datetime
import pickle
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pymemcache.serde import pickle_serde

from django_mcpatterns.core.exceptions import NonNumericValueError
from django_mcpatterns.core.ketama import Continuum
from django_mcpatterns.flask.backend import memcached_exptime
from tests.flask.conftest import PREFIX, FlaskDeployment
from tests.harness import raw_client

THIRTY_DAYS = 60 * 60 * 24 * 30
OVERSIZED = random.Random(0).randbytes(1024 * 1024 + 1)  # over memcached's default -I 1m


def assert_ttl_near(actual: int | None, expected: int) -> None:
    # memcached's clock ticks in whole seconds and lags the wall clock.
    assert actual is not None, "the key is not stored"
    assert abs(actual - expected) <= 2, (actual, expected)


class Unpicklable:
    def __reduce__(self) -> Any:
        raise pickle.PicklingError("this object refuses to be pickled")


class CacheTestsBase:
    """``make_cache(**config)`` builds a backend through Flask-Caching; ``c`` is one."""

    @pytest.fixture
    def deployment(self) -> FlaskDeployment:
        raise NotImplementedError

    @pytest.fixture
    def make_cache(self, deployment: FlaskDeployment) -> Callable[..., Any]:
        deployment.flush()
        return deployment.make_cache

    @pytest.fixture
    def c(self, make_cache: Callable[..., Any]) -> Any:
        return make_cache()


class GenericCacheTests(CacheTestsBase):
    """What every Flask-Caching backend does."""

    def test_generic_get_dict(self, c: Any) -> None:
        assert c.set("a", "a")
        assert c.set("b", "b")
        d = c.get_dict("a", "b")
        assert d == {"a": "a", "b": "b"}

    def test_generic_set_get(self, c: Any) -> None:
        for i in range(3):
            assert c.set(str(i), i * i)
        for i in range(3):
            assert c.get(str(i)) == i * i

    def test_generic_get_set(self, c: Any) -> None:
        assert c.set("foo", ["bar"])
        assert c.get("foo") == ["bar"]

    def test_generic_get_many(self, c: Any) -> None:
        assert c.set("foo", ["bar"])
        assert c.set("spam", "eggs")
        assert c.get_many("foo", "spam") == [["bar"], "eggs"]

    def test_generic_set_many(self, c: Any) -> None:
        assert c.set_many({"foo": "bar", "spam": ["eggs"]})
        assert c.get("foo") == "bar"
        assert c.get("spam") == ["eggs"]

    def test_generic_add(self, c: Any) -> None:
        assert c.add("foo", "bar")
        assert c.get("foo") == "bar"
        assert not c.add("foo", "qux")
        assert c.get("foo") == "bar"

    def test_generic_delete(self, c: Any) -> None:
        assert c.add("foo", "bar")
        assert c.get("foo") == "bar"
        assert c.delete("foo")
        assert c.get("foo") is None

    def test_generic_delete_many(self, c: Any) -> None:
        assert c.add("foo", "bar")
        assert c.add("spam", "eggs")
        assert c.delete_many("foo", "spam")
        assert c.get("foo") is None
        assert c.get("spam") is None

    def test_generic_inc_dec(self, c: Any) -> None:
        assert c.set("foo", 1)
        assert c.inc("foo") == c.get("foo") == 2
        assert c.dec("foo") == c.get("foo") == 1
        assert c.delete("foo")

    def test_generic_true_false(self, c: Any) -> None:
        assert c.set("foo", True)
        assert c.get("foo") in (True, 1)
        assert c.set("bar", False)
        assert c.get("bar") in (False, 0)

    def test_generic_timeout(self, c: Any, deployment: FlaskDeployment) -> None:
        c.set("foo", "bar", 0)
        assert c.get("foo") == "bar"
        c.set("baz", "qux", 1)
        assert c.get("baz") == "qux"
        deployment.advance(2.1)  # memcached's clock ticks once a second
        assert c.get("foo") == "bar"  # timeout 0: never expires
        assert c.get("baz") is None
        assert c.has("baz") is False

    def test_generic_has(self, c: Any) -> None:
        assert c.has("foo") is False
        assert c.has("spam") is False
        assert c.set("foo", "bar")
        assert c.has("foo") is True
        assert c.has("spam") is False
        c.delete("foo")
        assert c.has("foo") is False

    def test_generic_get_bytes(self, c: Any) -> None:
        assert c.set("foo", b"bar")
        assert c.get("foo") == b"bar"

    def test_huge_timeouts(self, c: Any) -> None:
        # Over 30 days memcached reads exptimes as Unix times; relative ones would be in 1970.
        c.set("foo", "bar", THIRTY_DAYS + 100)
        assert c.get("foo") == "bar"


class ContractTests(GenericCacheTests):
    """Flask-Caching's conventions where they differ from Django's, and memcached's limits."""

    # -- timeouts ---------------------------------------------------------------

    def test_zero_timeout_never_expires(self, c: Any, deployment: FlaskDeployment) -> None:
        assert c.set("set", 1, timeout=0)
        assert c.add("add", 1, timeout=0)
        assert c.set_many({"set_many": 1}, timeout=0) == ["set_many"]
        if deployment.has_servers:
            for key in ("set", "add", "set_many"):
                assert deployment.ttl(PREFIX + key) == -1  # memcached: never expires
        else:
            deployment.advance(THIRTY_DAYS * 2)
        assert c.get_many("set", "add", "set_many") == [1, 1, 1]

    def test_none_timeout_is_the_default_timeout(
        self, make_cache: Callable[..., Any], deployment: FlaskDeployment
    ) -> None:
        c = make_cache(CACHE_DEFAULT_TIMEOUT=60)
        assert c.default_timeout == 60
        c.set("set", 1)
        c.set("set_none", 1, timeout=None)
        c.add("add", 1)
        c.set_many({"set_many": 1})
        keys = ("set", "set_none", "add", "set_many")
        if deployment.has_servers:
            for key in keys:
                assert_ttl_near(deployment.ttl(PREFIX + key), 60)
        else:
            deployment.advance(59)
            assert c.get_many(*keys) == [1, 1, 1, 1]
            deployment.advance(1)
            assert c.get_many(*keys) == [None, None, None, None]

    def test_default_timeout_zero_never_expires(
        self, make_cache: Callable[..., Any], deployment: FlaskDeployment
    ) -> None:
        c = make_cache(CACHE_DEFAULT_TIMEOUT=0)
        c.set("key", "kept")
        if deployment.has_servers:
            assert deployment.ttl(PREFIX + "key") == -1
        else:
            deployment.advance(THIRTY_DAYS * 2)
        assert c.get("key") == "kept"

    def test_timedelta_default_timeout(
        self, make_cache: Callable[..., Any], deployment: FlaskDeployment
    ) -> None:
        c = make_cache(CACHE_DEFAULT_TIMEOUT=datetime.timedelta(minutes=2))
        assert c.default_timeout == 120
        c.set("key", 1)
        c.set("explicit", 1, timeout=datetime.timedelta(seconds=30))
        if deployment.has_servers:
            assert_ttl_near(deployment.ttl(PREFIX + "key"), 120)
            assert_ttl_near(deployment.ttl(PREFIX + "explicit"), 30)

    def test_negative_timeout_expires_at_once(self, c: Any) -> None:
        c.set("old", "value")
        assert c.set("old", "new", timeout=-1)  # stored, and expired at once
        assert c.get("old") is None
        assert c.add("added", "value", timeout=-5)
        assert c.has("added") is False

    def test_timeouts_over_30_days_are_absolute(self, c: Any, deployment: FlaskDeployment) -> None:
        long = THIRTY_DAYS + 1
        c.set("set", 1, long)
        c.add("add", 1, long)
        c.set_many({"set_many": 1}, long)
        assert c.get_many("set", "add", "set_many") == [1, 1, 1]
        if deployment.has_servers:
            for key in ("set", "add", "set_many"):
                assert_ttl_near(deployment.ttl(PREFIX + key), long)

    # -- invalid keys: misses and False, never exceptions ------------------------

    @pytest.mark.parametrize(
        "key",
        [
            "with space",
            "tab\there",
            "new\nline",
            "nul\x00",
            "del\x7f",
            "k" * (251 - len(PREFIX)),  # 251 bytes once prefixed
            "é" * 120,  # 240 characters, 240 + 11 bytes prefixed: over 250 bytes
            42,
        ],
        ids=["space", "tab", "newline", "nul", "del", "long", "long-utf8", "int"],
    )
    def test_invalid_keys_miss(self, c: Any, key: Any) -> None:
        assert c.get(key) is None
        assert c.has(key) is False
        assert c.set(key, "value") is False
        assert c.add(key, "value") is False
        assert c.delete(key) is False
        assert c.inc(key) is None
        assert c.dec(key) is None
        assert c.get_many("ok", key) == [None, None]
        assert c.set_many({"ok": 1, key: 2}) == ["ok"]
        assert c.get_dict("ok", key) == {"ok": 1, key: None}
        assert c.delete_many("ok", key) == ["ok"]

    def test_longest_valid_key(self, c: Any) -> None:
        key = "k" * (250 - len(PREFIX))
        assert c.set(key, "fits")
        assert c.get(key) == "fits"

    def test_unicode_keys(self, c: Any) -> None:
        stuff = {"ключ": "значение", "键": "值", "Iñtërnâtiônàlizætiøn": {"Ω": "✓"}}
        assert c.set_many(stuff) == list(stuff)
        assert c.get_dict(*stuff) == stuff
        assert c.delete_many(*stuff) == list(stuff)

    # -- return values -----------------------------------------------------------

    def test_set_many_returns_the_keys_stored(self, c: Any) -> None:
        c.set("big", "old value")
        stored = c.set_many({"a": 1, "big": OVERSIZED, "b": 2})
        assert stored == ["a", "b"]
        assert c.get_many("a", "b") == [1, 2]
        assert c.get("big") is None  # memcached drops the old item of a failed set
        assert c.set_many({}) == []

    def test_oversized_set_and_add_return_false(self, c: Any) -> None:
        c.set("key", "small")
        assert c.set("key", OVERSIZED) is False
        assert c.get("key") is None
        assert c.add("other", OVERSIZED) is False
        assert c.has("other") is False

    def test_stored_none_is_a_hit_for_has(self, c: Any) -> None:
        assert c.set("none", None)
        assert c.get("none") is None
        assert c.has("none") is True
        assert c.add("none", "other") is False

    @pytest.mark.parametrize("value", [0, 0.0, "", b"", [], {}, None, -7, 2**100, 3.25, ("a", 1)])
    def test_values_keep_their_type(self, c: Any, value: Any) -> None:
        c.set("value", value)
        got = c.get("value")
        assert got == value
        assert type(got) is type(value)

    def test_unpicklable_values_raise_pickle_errors(self, c: Any) -> None:
        # cachelib: "Pickling errors, however, will raise a subclass of pickle.PickleError".
        with pytest.raises(pickle.PickleError):
            c.set("unpicklable", Unpicklable())
        assert c.get("unpicklable") is None

    def test_get_many_and_get_dict_keep_the_order_given(self, c: Any) -> None:
        c.set_many({"a": 1, "c": 3})
        assert c.get_many("c", "b", "a", "c") == [3, None, 1, 3]
        assert list(c.get_dict("c", "b", "a")) == ["c", "b", "a"]
        assert c.get_many() == []

    def test_delete_returns_whether_the_key_existed(self, c: Any) -> None:
        c.set("key", 1)
        assert c.delete("key") is True
        assert c.delete("key") is False

    def test_delete_many_returns_the_keys_gone_including_absent_ones(self, c: Any) -> None:
        c.set_many({"a": 1, "b": 2, "keep": 3})
        assert c.delete_many("a", "b", "never-set") == ["a", "b", "never-set"]
        assert c.get_many("a", "b", "keep") == [None, None, 3]
        assert c.delete_many() == []

    def test_delete_many_raises_for_keys_still_there(
        self, c: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        c.set_many({"a": 1, "b": 2})
        monkeypatch.setattr(c.store, "delete_many", lambda keys: None)  # a delete that failed
        with pytest.raises(RuntimeError, match="Failed to delete keys"):
            c.delete_many("a", "b")
        c.ignore_delete_many_errors = True
        assert c.delete_many("a", "b") == []

    def test_clear(self, c: Any) -> None:
        c.set_many({"a": 1, "b": 2})
        assert c.clear() is True
        assert c.get_many("a", "b") == [None, None]

    # -- counters ----------------------------------------------------------------

    def test_inc_and_dec_start_from_zero(self, c: Any) -> None:
        assert c.inc("up") == 1
        assert c.inc("up", 5) == 6
        assert c.dec("down") == -1
        assert c.dec("down", 2) == -3
        assert c.get_many("up", "down") == [6, -3]

    def test_dec_goes_below_zero_and_back(self, c: Any) -> None:
        c.set("n", 2)
        assert c.dec("n", 5) == -3  # memcached's decr would stop at 0
        assert c.inc("n", 4) == 1
        assert c.inc("n", -2) == -1
        assert c.dec("n", -3) == 2
        assert c.get("n") == 2

    def test_inc_of_a_float(self, c: Any) -> None:
        c.set("f", 1.5)
        assert c.inc("f") == 2.5

    def test_inc_of_a_non_number_raises(self, c: Any) -> None:
        c.set("text", ["not", "a", "number"])
        with pytest.raises(NonNumericValueError):
            c.inc("text")
        with pytest.raises(NonNumericValueError):
            c.dec("text")

    def test_inc_keeps_the_ttl(self, c: Any, deployment: FlaskDeployment) -> None:
        c.set("n", 1, timeout=60)
        assert c.inc("n") == 2
        if deployment.has_servers:
            assert_ttl_near(deployment.ttl(PREFIX + "n"), 60)
        c.inc("fresh")
        if deployment.has_servers:
            assert_ttl_near(deployment.ttl(PREFIX + "fresh"), c.default_timeout)

    def test_dec_keeps_the_ttl_as_inc_does(self, c: Any) -> None:
        assert c.default_timeout != 60
        c.set("n", 5, timeout=60)
        assert c.dec("n") == 4
        assert_ttl_near(c.store.ttl(PREFIX + "n"), 60)
        assert c.dec("n", 10) == -6  # below zero: the compare-and-swap path
        assert_ttl_near(c.store.ttl(PREFIX + "n"), 60)
        assert c.inc("n") == -5  # memcached's incr cannot parse "-6": the same path
        assert_ttl_near(c.store.ttl(PREFIX + "n"), 60)
        c.set("forever", 5, timeout=0)
        assert c.dec("forever") == 4
        assert c.store.ttl(PREFIX + "forever") == -1
        assert c.dec("fresh") == -1  # a new counter takes the default timeout, as inc's
        assert_ttl_near(c.store.ttl(PREFIX + "fresh"), c.default_timeout)

    def test_concurrent_inc_and_dec_lose_nothing(self, c: Any) -> None:
        c.set("n", 0)

        def work(step: Callable[[str], Any]) -> list[Any]:
            return [step("n") for _ in range(25)]

        with ThreadPoolExecutor(6) as pool:
            runs = [pool.submit(work, step) for step in (c.inc, c.dec) * 3]
            results = [n for run in runs for n in run.result()]
        assert None not in results
        assert c.get("n") == 0

    # -- keys on the wire ----------------------------------------------------------

    def test_prefixes_keep_caches_apart(self, c: Any, make_cache: Callable[..., Any]) -> None:
        other = make_cache(CACHE_KEY_PREFIX="other_")
        c.set("key", "mine")
        other.set("key", "theirs")
        assert c.get("key") == "mine"
        assert other.get("key") == "theirs"
        assert c.delete("key")
        assert other.get("key") == "theirs"

    def test_no_prefix(self, make_cache: Callable[..., Any]) -> None:
        c = make_cache(CACHE_KEY_PREFIX=None)
        assert c.key_prefix == ""
        c.set("bare", 1)
        assert c.store.get("bare") == 1


class ServerContractTests(ContractTests):
    """What only real servers can show: the bytes and the placement."""

    def test_compat_with_a_plain_client(self, c: Any, deployment: FlaskDeployment) -> None:
        # Flask-Caching's test_compat: the item is prefix + key, in pymemcache's format.
        c.set("foo", {"bar": 1})
        (holder,) = deployment.holders(PREFIX + "foo")
        server = next(s for s in deployment.servers if s.spec == holder)
        client = raw_client(server)
        client.serde = pickle_serde
        try:
            assert client.get(PREFIX + "foo") == {"bar": 1}
            client.set(PREFIX + "written", "by another client")
        finally:
            client.close()
        if len(deployment.servers) == 1:
            assert c.get("written") == "by another client"

    def test_clear_flushes_every_prefix(self, c: Any, make_cache: Callable[..., Any]) -> None:
        # memcached has no per-prefix flush: clear() empties the servers (as cachelib warns).
        other = make_cache(CACHE_KEY_PREFIX="other_")
        other.set("key", 1)
        assert c.clear() is True
        assert other.get("key") is None

    def test_keys_live_where_ketama_puts_them(self, c: Any, deployment: FlaskDeployment) -> None:
        ring = Continuum([s.spec for s in deployment.servers], variant="libmemcached")
        keys = [f"user:{i}" for i in range(30)]
        assert c.set_many(dict.fromkeys(keys, 1)) == keys
        for key in keys:
            assert deployment.holders(PREFIX + key) == [ring.get_node(PREFIX + key)]


# -- one class per deployment ------------------------------------------------------------


class TestCluster(ServerContractTests):
    @pytest.fixture
    def deployment(self, memcached_3: Any) -> FlaskDeployment:
        return FlaskDeployment.cluster(memcached_3)


class TestSingleServer(ServerContractTests):
    @pytest.fixture
    def deployment(self, memcached_1: Any) -> FlaskDeployment:
        return FlaskDeployment.cluster(memcached_1)


class TestTextProtocol(ServerContractTests):
    """``CACHE_OPTIONS = {"protocol": "text"}``: no meta command, so no TTL read."""

    @pytest.fixture
    def deployment(self, memcached_3: Any) -> FlaskDeployment:
        return FlaskDeployment.cluster(memcached_3, protocol="text")

    def test_dec_keeps_the_ttl_as_inc_does(self, c: Any, deployment: FlaskDeployment) -> None:
        # The text protocol cannot read a TTL: dec's compare-and-swap stores the
        # counter with the default timeout (docs/twemproxy.md); inc keeps it.
        c.set("n", 5, timeout=60)
        assert c.inc("n") == 6
        assert_ttl_near(deployment.ttl(PREFIX + "n"), 60)
        assert c.dec("n", 10) == -4
        assert_ttl_near(deployment.ttl(PREFIX + "n"), c.default_timeout)
        c.set("forever", 5, timeout=0)
        assert c.dec("forever") == 4
        assert_ttl_near(deployment.ttl(PREFIX + "forever"), c.default_timeout)


class TestEmbedded(ContractTests):
    @pytest.fixture
    def deployment(self) -> FlaskDeployment:
        return FlaskDeployment.embedded()


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0, 0), (1, 1), (-1, -1), (-100, -1), (THIRTY_DAYS, THIRTY_DAYS), (THIRTY_DAYS + 1, None)],
)
def test_memcached_exptime(seconds: int, expected: int | None) -> None:
    now = 1_700_000_000.7
    want = int(now) + seconds if expected is None else expected
    assert memcached_exptime(seconds, now) == want
