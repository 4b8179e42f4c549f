"""The patterns on ``cache.cache`` of the Flask backends, with Flask-Caching's conventions.

Each algorithm is proven in ``tests/core``; these tests check what the Flask
layer adds: the patterns are there, keys carry ``CACHE_KEY_PREFIX``, timeouts
follow Flask-Caching (``0`` never expires, ``None`` is ``CACHE_DEFAULT_TIMEOUT``),
an invalid key raises (unlike the cache API, where it is a miss), and events
reach the blinker signals.

To cover a new pattern: add a :class:`PatternTests` subclass naming the methods
it needs in ``methods``; its tests skip while the pattern's mixin is still a
placeholder.  Tests get ``c`` (the backend, ``CACHE_DEFAULT_TIMEOUT`` =
:data:`DEFAULT_TIMEOUT`) and ``deployment`` (to read TTLs on the servers).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_mcpatterns.core.exceptions import InvalidKeyError, LockTimeoutError
from django_mcpatterns.core.stampede import StampedePolicy
from django_mcpatterns.flask import signals
from django_mcpatterns.patterns.events import SIGNAL_NAMES
from tests.flask.conftest import PREFIX, FlaskDeployment, deployments

DEFAULT_TIMEOUT = 60

deployment = deployments("cluster3", "embedded")


def assert_ttl_near(actual: int | None, expected: int) -> None:
    assert actual is not None, "the key is not stored"
    assert abs(actual - expected) <= 2, (actual, expected)


class PatternTests:
    """Base of one pattern's Flask tests: ``methods`` must exist on the backend."""

    methods: tuple[str, ...] = ()

    @pytest.fixture
    def c(self, deployment: FlaskDeployment) -> Any:
        cache = deployment.make_cache(CACHE_DEFAULT_TIMEOUT=DEFAULT_TIMEOUT)
        missing = [name for name in self.methods if not hasattr(cache, name)]
        if missing:
            pytest.skip(f"pattern not on the backends yet: {', '.join(missing)}")
        return cache

    @staticmethod
    def stored(c: Any, deployment: FlaskDeployment, key: str) -> bool:
        """Whether the full key ``CACHE_KEY_PREFIX + key`` is in the store."""
        if deployment.has_servers:
            return bool(deployment.holders(PREFIX + key))
        return c.store.get(PREFIX + key) is not None


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every pattern signal sent during the test, as (name, keyword arguments)."""
    events: list[tuple[str, dict[str, Any]]] = []
    receivers = []
    for name in SIGNAL_NAMES.values():

        def receiver(sender: Any, _name: str = name, **kwargs: Any) -> None:
            events.append((_name, kwargs))

        getattr(signals, name).connect(receiver)
        receivers.append((name, receiver))
    yield events
    for name, receiver in receivers:
        getattr(signals, name).disconnect(receiver)


@pytest.mark.parametrize(("event_type", "name"), SIGNAL_NAMES.items())
def test_each_core_event_is_sent_as_its_signal(
    event_type: type, name: str, received: list[Any]
) -> None:
    event = event_type(**{f.name: f"{f.name}-value" for f in dataclasses.fields(event_type)})
    cache = object()
    signals.send_pattern_event(cache, event)
    assert received == [(name, {"cache": cache, **vars(event)})]


class TestLocks(PatternTests):
    methods = ("lock",)

    def test_lock_lives_under_the_prefixed_key(self, c: Any, deployment: FlaskDeployment) -> None:
        with c.lock("nightly-report", timeout=10) as lock:
            assert lock.owned()
            assert self.stored(c, deployment, "nightly-report")
            assert c.has("nightly-report")
        assert not c.has("nightly-report")

    def test_a_held_lock_is_not_taken_twice(self, c: Any) -> None:
        first = c.lock("job", timeout=10)
        assert first.acquire()
        second = c.lock("job", timeout=10, blocking=False)
        assert second.acquire() is False
        assert second.locked()
        assert not second.owned()
        first.release()
        assert second.acquire()
        second.release()

    def test_timed_out_wait_is_signalled(self, c: Any, received: list[Any]) -> None:
        holder = c.lock("busy", timeout=10)
        holder.acquire()
        try:
            with pytest.raises(LockTimeoutError), c.lock("busy", timeout=10, blocking_timeout=0.05):
                pass
        finally:
            holder.release()
        names = [name for name, _ in received]
        assert "lock_timed_out" in names
        (kwargs,) = [kw for name, kw in received if name == "lock_timed_out"]
        assert kwargs["cache"] is c

    def test_invalid_lock_name_raises(self, c: Any) -> None:
        with pytest.raises(InvalidKeyError):
            c.lock("has space")


class TestStampede(PatternTests):
    methods = ("get_or_compute", "get_or_compute_result", "get_envelope", "mark_stale")

    def test_computes_once_and_get_reads_the_value(self, c: Any) -> None:
        calls: list[int] = []

        def compute() -> dict[str, int]:
            calls.append(1)
            return {"answer": 42}

        assert c.get_or_compute("report", compute) == {"answer": 42}
        assert c.get_or_compute("report", compute) == {"answer": 42}
        assert calls == [1]
        assert c.get("report") == {"answer": 42}  # plain reads unwrap the envelope
        assert c.get_many("report") == [{"answer": 42}]

    def test_a_fill_never_lands_over_a_concurrent_delete(self, c: Any) -> None:
        # Leases (core/leases/), through Flask's conventions.
        def compute_while_another_process_invalidates() -> str:
            c.delete("report")
            return "old"

        assert c.get_or_compute("report", compute_while_another_process_invalidates) == "old"
        assert c.get("report") is None
        assert c.get_or_set("report", compute_while_another_process_invalidates) == "old"
        assert c.get("report") is None
        assert c.get_or_set("report", lambda: "new") == "new"
        assert c.get("report") == "new"

    def test_plain_reads_miss_once_the_timeout_has_passed(
        self, c: Any, deployment: FlaskDeployment
    ) -> None:
        # Issue 12, point 5: plain reads returned the value until soft + grace.
        grace = StampedePolicy(grace=60)  # memcached keeps the item well past the test
        assert c.get_or_compute("report", lambda: "old", timeout=2, policy=grace) == "old"
        assert c.get("report") == "old"
        # Just past the timeout (soft expiries are exact), well within the grace.  The
        # backend's get_or_compute dates values by time.time(), also on the embedded
        # deployment, whose fake clock (the store's) starts up to 1 s behind it.
        soft = c.get_envelope("report").soft_expiry
        time.sleep(max(0.0, soft - time.time()) + 0.05)
        if deployment.clock is not None:
            deployment.clock.advance(soft - deployment.clock() + 0.05)
        assert c.get("report") is None
        assert not c.has("report")
        assert c.get_many("report") == [None]
        assert c.get_dict("report") == {"report": None}
        served: list[str] = []

        def recompute() -> str:
            served.append(c.get_or_compute("report", lambda: "never", timeout=1))
            return "new"

        # memcached hands its recompute token out within a tick or two of the soft
        # expiry; until then each caller is served the stale value (docs/stampede.md).
        for _ in range(100):  # a hang guard
            got = c.get_or_compute("report", recompute, timeout=60)
            if got == "new":
                break
            assert (got, served) == ("old", [])
            time.sleep(0.05)
        assert got == "new"
        assert served == ["old"]  # stale for get_or_compute while one caller recomputes
        assert c.get("report") == "new"

    def test_none_timeout_is_the_default_timeout(self, c: Any, deployment: FlaskDeployment) -> None:
        before = time.time()
        c.get_or_compute("default", lambda: 1, timeout=None)
        c.get_or_compute("omitted", lambda: 1)
        for key in ("default", "omitted"):
            envelope = c.get_envelope(key)
            assert envelope.soft_expiry - before == pytest.approx(DEFAULT_TIMEOUT, abs=2)
            if deployment.has_servers:
                # memcached keeps it a grace period (by default the timeout again) longer.
                assert_ttl_near(deployment.ttl(PREFIX + key), 2 * DEFAULT_TIMEOUT)

    def test_zero_timeout_never_goes_stale(self, c: Any, deployment: FlaskDeployment) -> None:
        c.get_or_compute("forever", lambda: "kept", timeout=0)
        envelope = c.get_envelope("forever")
        assert envelope.soft_expiry == math.inf
        assert envelope.value == "kept"
        if deployment.has_servers:
            assert deployment.ttl(PREFIX + "forever") == -1

    def test_mark_stale_makes_one_caller_recompute(self, c: Any, received: list[Any]) -> None:
        c.get_or_compute("page", lambda: "v1", timeout=60)
        assert c.mark_stale("page") is True
        fetched = c.get_or_compute_result("page", lambda: "v2", timeout=60)
        assert (fetched.value, fetched.outcome) == ("v2", "computed")
        assert c.get_or_compute("page", lambda: "v3", timeout=60) == "v2"
        recomputed = [kw for name, kw in received if name == "recomputed"]
        assert [kw["reason"] for kw in recomputed] == ["miss", "stale"]
        assert recomputed[0]["cache"] is c
        assert recomputed[0]["key"] in (PREFIX + "page", (PREFIX + "page").encode())

    def test_invalid_key_raises(self, c: Any) -> None:
        with pytest.raises(InvalidKeyError):
            c.get_or_compute("has space", lambda: 1)


class TestSets(PatternTests):
    methods = ("sadd", "srem", "smembers", "sismember", "scard")

    def test_members_round_trip_with_their_types(self, c: Any) -> None:
        assert c.sadd("tags", "a", "b", 3, b"raw") == 4
        c.sadd("tags", "a")  # append-only: written again, still one member
        assert c.smembers("tags") == {"a", "b", 3, b"raw"}
        assert c.sismember("tags", "a") is True
        assert c.sismember("tags", "z") is False
        c.srem("tags", "a", "z")
        assert c.smembers("tags") == {"b", 3, b"raw"}
        assert c.scard("tags") == 3

    def test_set_lives_under_the_prefixed_key(self, c: Any, deployment: FlaskDeployment) -> None:
        c.sadd("online", "ann")
        assert self.stored(c, deployment, "online")

    def test_timeouts_follow_flask_caching(self, c: Any, deployment: FlaskDeployment) -> None:
        c.sadd("forever", "a", timeout=0)
        c.sadd("default", "a")
        if deployment.has_servers:
            assert deployment.ttl(PREFIX + "forever") == -1
            assert_ttl_near(deployment.ttl(PREFIX + "default"), DEFAULT_TIMEOUT)
        else:
            deployment.advance(DEFAULT_TIMEOUT)
            assert c.smembers("forever") == {"a"}
            assert c.smembers("default") == set()

    def test_invalid_key_raises(self, c: Any) -> None:
        with pytest.raises(InvalidKeyError):
            c.sadd("has space", "a")


class TestLists(PatternTests):
    methods = ("rpush", "lrange", "llen", "lrem")

    def test_push_range_and_remove(self, c: Any, deployment: FlaskDeployment) -> None:
        c.rpush("log", "a", "b", "c", timeout=0)
        assert c.lrange("log", 0, -1) == ["a", "b", "c"]
        c.lrem("log", 0, "b")
        assert c.lrange("log", 0, -1) == ["a", "c"]
        assert c.llen("log") == 2
        if deployment.has_servers:
            assert deployment.ttl(PREFIX + "log") == -1


class TestNamespaces(PatternTests):
    methods = ("namespace", "invalidate_namespace")

    def test_invalidate_drops_every_key_of_the_namespace(self, c: Any) -> None:
        ns = c.namespace("user", 42)
        other = c.namespace("user", 43)
        ns.set("profile", {"name": "ann"})
        other.set("profile", {"name": "bob"})
        assert ns.get("profile") == {"name": "ann"}
        c.invalidate_namespace("user", 42)
        assert c.namespace("user", 42).get("profile") is None
        assert other.get("profile") == {"name": "bob"}

    def test_timeouts_follow_flask_caching(self, c: Any, deployment: FlaskDeployment) -> None:
        ns = c.namespace("catalog")
        ns.set("forever", 1, timeout=0)
        ns.set("default", 1)
        if not deployment.has_servers:
            deployment.advance(DEFAULT_TIMEOUT)
            assert ns.get("forever") == 1
            assert ns.get("default") is None
