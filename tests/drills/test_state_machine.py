"""The embedded backend and a memcached cluster, driven side by side, agree.

A hypothesis state machine calls the public API of two Django caches, the
embedded ``LocMemPatternsCache`` and a ``KetamaMemcacheCache`` on three real
servers, with the same arguments: plain values, counters, many-key calls, sets,
lists, namespaces, locks and ``get_or_compute``, over valid and invalid keys.
After every step both must have answered the same (or raised the same
exception type).  What the embedded default does in development is what the
cluster does in production.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from django_mcpatterns.backend import KetamaMemcacheCache, LocMemPatternsCache
from tests.harness import MemcachedServer

KEYS = st.sampled_from(["a", "b", "ü", "k" * 240, "bad key", "x" * 251, "line\nbreak"])
SET_KEYS = st.sampled_from(["s1", "s2"])
LIST_KEYS = st.sampled_from(["l1", "l2"])
LOCKS = st.sampled_from(["lock:1", "lock:2"])
PARTS = st.sampled_from(["user", 42, "a b", "é"])
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=10)
    | st.binary(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=5,
)
MEMBERS = st.text(max_size=4) | st.binary(max_size=4) | st.integers(-(2**70), 2**70)
_names = itertools.count()


class Outcome:
    """A call's result, or the type of what it raised."""

    def __init__(self, call: Callable[[], Any], normalise: Callable[[Any], Any]) -> None:
        try:
            self.value = ("returned", normalise(call()))
        except Exception as exc:
            self.value = ("raised", type(exc).__name__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Outcome) and self.value == other.value

    def __repr__(self) -> str:
        return repr(self.value)


def same(value: Any) -> Any:
    return value


class SideBySide(RuleBasedStateMachine):
    specs: list[str] = []

    def __init__(self) -> None:
        super().__init__()
        self.embedded = LocMemPatternsCache(f"state-machine-{next(_names)}", {})
        self.cluster = KetamaMemcacheCache(self.specs, {"OPTIONS": {"timeout": 5}})
        self.cluster.clear()
        self.locks: list[Any] = []

    def teardown(self) -> None:
        self.embedded.clear()
        self.cluster.clear()

    def agree(self, call: Callable[[Any], Any], normalise: Callable[[Any], Any] = same) -> None:
        embedded = Outcome(lambda: call(self.embedded), normalise)
        cluster = Outcome(lambda: call(self.cluster), normalise)
        assert embedded == cluster, f"embedded {embedded!r} != cluster {cluster!r}"

    # -- plain values --

    @rule(key=KEYS, value=VALUES)
    def set(self, key: str, value: Any) -> None:
        self.agree(lambda c: c.set(key, value))

    @rule(key=KEYS, value=VALUES)
    def add(self, key: str, value: Any) -> None:
        self.agree(lambda c: c.add(key, value))

    @rule(key=KEYS)
    def get(self, key: str) -> None:
        self.agree(lambda c: c.get(key, "default"))

    @rule(key=KEYS)
    def delete(self, key: str) -> None:
        self.agree(lambda c: c.delete(key))

    @rule(key=KEYS)
    def has_key(self, key: str) -> None:
        self.agree(lambda c: c.has_key(key))

    @rule(key=KEYS, delta=st.integers(-3, 2**65))
    def incr(self, key: str, delta: int) -> None:
        self.agree(lambda c: c.incr(key, delta))

    @rule(key=KEYS, delta=st.integers(0, 5))
    def decr(self, key: str, delta: int) -> None:
        self.agree(lambda c: c.decr(key, delta))

    @rule(key=KEYS)
    def touch(self, key: str) -> None:
        self.agree(lambda c: c.touch(key, None))

    @rule(keys=st.lists(KEYS, max_size=4))
    def get_many(self, keys: list[str]) -> None:
        self.agree(lambda c: c.get_many(keys))

    @rule(data=st.dictionaries(KEYS, VALUES, max_size=3))
    def set_many(self, data: dict[str, Any]) -> None:
        self.agree(lambda c: c.set_many(data), sorted)

    @rule(keys=st.lists(KEYS, max_size=3))
    def delete_many(self, keys: list[str]) -> None:
        self.agree(lambda c: c.delete_many(keys))

    @rule(key=KEYS, value=VALUES)
    def get_or_set(self, key: str, value: Any) -> None:
        self.agree(lambda c: c.get_or_set(key, value))

    @rule(key=KEYS, value=VALUES)
    def get_or_compute(self, key: str, value: Any) -> None:
        self.agree(lambda c: c.get_or_compute(key, lambda: value, timeout=60))

    # -- sets and lists --

    @rule(key=SET_KEYS, members=st.lists(MEMBERS, min_size=1, max_size=4))
    def sadd(self, key: str, members: list[Any]) -> None:
        self.agree(lambda c: c.sadd(key, *members))

    @rule(key=SET_KEYS, members=st.lists(MEMBERS, min_size=1, max_size=3))
    def srem(self, key: str, members: list[Any]) -> None:
        self.agree(lambda c: c.srem(key, *members))

    @rule(key=SET_KEYS)
    def smembers(self, key: str) -> None:
        self.agree(lambda c: c.smembers(key))

    @rule(key=SET_KEYS, member=MEMBERS)
    def sismember(self, key: str, member: Any) -> None:
        self.agree(lambda c: (c.sismember(key, member), c.scard(key)))

    @rule(source=SET_KEYS, destination=SET_KEYS, member=MEMBERS)
    def smove(self, source: str, destination: str, member: Any) -> None:
        self.agree(lambda c: c.smove(source, destination, member))

    @rule(first=SET_KEYS, second=SET_KEYS)
    def algebra(self, first: str, second: str) -> None:
        self.agree(
            lambda c: (c.sunion(first, second), c.sinter(first, second), c.sdiff(first, second))
        )

    @rule(key=LIST_KEYS, members=st.lists(MEMBERS, min_size=1, max_size=3))
    def rpush(self, key: str, members: list[Any]) -> None:
        self.agree(lambda c: c.rpush(key, *members))

    @rule(key=LIST_KEYS, start=st.integers(-3, 3), end=st.integers(-3, 3))
    def lrange(self, key: str, start: int, end: int) -> None:
        self.agree(lambda c: (c.lrange(key, start, end), c.llen(key)))

    @rule(key=LIST_KEYS, count=st.integers(-2, 2), member=MEMBERS)
    def lrem(self, key: str, count: int, member: Any) -> None:
        self.agree(lambda c: c.lrem(key, count, member))

    # -- namespaces and locks --

    @rule(part=PARTS, key=KEYS, value=VALUES)
    def namespace_set(self, part: Any, key: str, value: Any) -> None:
        self.agree(lambda c: c.namespace("drill", part).set(key, value))

    @rule(part=PARTS, key=KEYS)
    def namespace_get(self, part: Any, key: str) -> None:
        self.agree(lambda c: c.namespace("drill", part).get(key, "default"))

    @rule(part=PARTS)
    def invalidate(self, part: Any) -> None:
        # The new version is time-based: equal only in kind.
        self.agree(lambda c: c.namespace("drill", part).invalidate(), type)

    @rule(name=LOCKS)
    def lock(self, name: str) -> None:
        self.agree(lambda c: c.lock(name, timeout=60, blocking=False).acquire())
        self.agree(lambda c: c.lock(name).locked())


@pytest.mark.slow
def test_embedded_and_cluster_agree(memcached_3: list[MemcachedServer]) -> None:
    SideBySide.specs = [server.spec for server in memcached_3]
    run_state_machine_as_test(
        SideBySide,
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
