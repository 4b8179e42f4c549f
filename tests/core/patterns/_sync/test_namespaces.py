# Generated from tests/core/patterns/_async/test_namespaces.py by scripts/generate_sync.py: do not edit.
"""Namespaces, written once: versions, invalidation, nesting, soft invalidation, computes.

This asyncio source is the test of both forms: scripts/generate_sync.py makes
``../_sync/test_namespaces.py`` (``AsyncNamespaces`` -> ``Namespaces``, ``await``
dropped).  The behaviour suite runs on the in-process MemoryStore (with a fake clock)
and on a real 3-server cluster; races are shown with deterministic interleavings
(another client acting at an exact point, through :class:`AsyncHooked`).  What does
not depend on the form stays hand-written: key derivation, routing and request counts
on the servers in ``tests/core/test_namespaces.py``, tasks and the two forms over one
cache in ``tests/core/test_namespaces_async.py``, processes in
``tests/core/test_namespaces_processes.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import EncodingError
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.namespaces import Namespace, Namespaces
from django_mcpatterns.core.serializers import ValueSerde
from django_mcpatterns.core.stampede import (
    Recomputed,
    StaleServed,
    Stampede,
    StampedePolicy,
    lock_key,
)
from django_mcpatterns.core.store import Store
from tests.conftest import flush
from tests.fakes import CountingStore, FakeClock, Hooked
from tests.harness import MemcachedServer
from tests.twins import face


class NamespaceContract:
    """Subclasses provide ``store`` (empty) and ``clock``."""

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def store(self, clock: FakeClock) -> Store:
        raise NotImplementedError

    @pytest.fixture
    def events(self) -> list[object]:
        return []

    @pytest.fixture
    def spaces(self, store: Store, clock: FakeClock, events: list[object]) -> Namespaces:
        def stampede(view: Store) -> Stampede:
            return Stampede(view, clock=clock, sleep=clock.sleep, on_event=events.append)

        return Namespaces(face(store), clock=clock, stampede=stampede)

    def test_invalidate_drops_every_key_of_the_namespace_and_only_those(
        self, spaces: Namespaces, store: Store
    ) -> None:
        ns, other = spaces.namespace("user", 42), spaces.namespace("user", 43)
        ns.set_many({"profile": {"name": "ann"}, "avatar": b"\x89PNG", "age": 31})
        other.set("profile", {"name": "bob"})
        store.set("plain", "kept")
        assert ns.get_many(["profile", "avatar", "age", "none"]) == {
            "profile": {"name": "ann"},
            "avatar": b"\x89PNG",
            "age": 31,
        }
        spaces.invalidate("user", 42)
        assert ns.get_many(["profile", "avatar", "age"]) == {}
        assert ns.get("profile", "default") == "default"
        assert other.get("profile") == {"name": "bob"}
        assert store.get("plain") == "kept"
        ns.set("profile", {"name": "ann 2"})  # written under the new version
        assert ns.get("profile") == {"name": "ann 2"}

    def test_values_of_every_kind_round_trip(self, spaces: Namespaces) -> None:
        ns = spaces.namespace("kinds")
        values = {"none": None, "str": "é", "bytes": b"\x00\xff", "int": 2**70, "list": [1, "a"]}
        assert ns.set_many(values) == []
        assert ns.get_many(values) == values
        assert ns.get("none", "default") is None  # a cached None is a hit

    def test_invalidating_the_outer_namespace_invalidates_the_inner(
        self, spaces: Namespaces
    ) -> None:
        org = spaces.namespace("org", 1)
        user = org.namespace("user", 42)
        sibling = org.namespace("user", 43)
        org.set("name", "acme")
        user.set("profile", "ann")
        sibling.set("profile", "bob")
        user.invalidate()
        assert user.get("profile") is None
        assert sibling.get("profile") == "bob"
        assert org.get("name") == "acme"
        user.set("profile", "ann")
        org.invalidate_namespace("user", 43)
        assert sibling.get("profile") is None
        assert user.get("profile") == "ann"
        spaces.invalidate("org", 1)
        assert org.get("name") is None
        assert user.get("profile") is None
        assert spaces.namespace("org", 1).namespace("user", 42).get("profile") is None

    def test_a_nested_namespace_is_not_the_flat_one(self, spaces: Namespaces) -> None:
        spaces.namespace("org", 1).namespace("user", 42).set("k", "nested")
        assert spaces.namespace("org", 1, "user", 42).get("k") is None

    def test_versions_start_at_the_time_in_microseconds(
        self, spaces: Namespaces, clock: FakeClock
    ) -> None:
        ns = spaces.namespace("user", 42).namespace("posts")
        assert ns.versions() == (None, None)
        assert ns.get("k") is None  # a read creates nothing
        assert ns.versions() == (None, None)
        ns.set("k", 1)
        first = int(clock() * 1_000_000)
        assert ns.versions() == (first, first)
        assert ns.invalidate() == first + 1
        assert ns.versions() == (first, first + 1)

    def test_invalidating_a_missing_namespace_creates_its_version(
        self, spaces: Namespaces, clock: FakeClock
    ) -> None:
        assert spaces.invalidate("never", "used") == int(clock() * 1_000_000)

    def test_an_evicted_version_key_never_brings_old_values_back(
        self, spaces: Namespaces, store: Store, clock: FakeClock
    ) -> None:
        ns = spaces.namespace("user", 42)
        ns.set("profile", "old")
        (version_key,) = ns._version_keys
        store.delete(version_key)  # evicted, or its server restarted empty
        assert ns.get("profile") is None
        clock.advance(0.5)
        ns.set("other", "new")  # recreates the version, from the clock
        assert ns.versions() == (int(clock() * 1_000_000),)
        assert ns.get("profile") is None
        assert ns.get("other") == "new"

    def test_add_fails_only_on_a_valid_value(self, spaces: Namespaces) -> None:
        ns = spaces.namespace("user", 42)
        assert ns.add("k", 1) is True
        assert ns.add("k", 2) is False
        assert ns.get("k") == 1
        ns.invalidate()
        assert ns.add("k", 3) is True  # the invalidated value does not count
        assert ns.get("k") == 3

    def test_delete(self, spaces: Namespaces) -> None:
        ns = spaces.namespace("user", 42)
        ns.set_many({"a": 1, "b": 2, "c": 3})
        assert ns.delete("a") is True
        assert ns.delete("a") is False
        ns.delete_many(["b", "c"])
        assert ns.get_many(["a", "b", "c"]) == {}

    def test_get_or_set_tags_with_the_versions_read_before_computing(
        self, spaces: Namespaces
    ) -> None:
        ns = spaces.namespace("user", 42)
        assert ns.get_or_set("k", lambda: "first") == "first"
        assert ns.get_or_set("k", lambda: "second") == "first"
        ns.invalidate()

        def computed_while_invalidated() -> str:
            spaces.invalidate("user", 42)  # the data changed while we computed
            return "stale"

        assert ns.get_or_set("k", computed_while_invalidated) == "stale"
        assert ns.get("k") is None  # stored already invalid
        assert ns.get_or_set("k", "fresh") == "fresh"
        assert ns.get("k") == "fresh"

    @pytest.mark.parametrize("state", ["warm", "first use", "evicted"])
    @pytest.mark.parametrize("levels", [("root", 1), ("root", 2), ("leaf", 2)])
    @pytest.mark.parametrize("method", ["get_or_set", "get_or_compute"])
    def test_an_invalidation_during_the_compute_always_wins(
        self,
        spaces: Namespaces,
        store: Store,
        clock: FakeClock,
        method: str,
        levels: tuple[str, int],
        state: str,
    ) -> None:
        # Issue 12, point 4: on a cold namespace (version key never created,
        # evicted, server restarted) the invalidation used to create the
        # version the computed value was then stored under, so the value read
        # before the change was served afterwards.
        invalidated, depth = levels
        ns = spaces.namespace("org", 1)
        if depth == 2:
            ns = ns.namespace("user", 2)
        # Another process invalidates, through its own Namespaces on the same store.
        other = Namespaces(face(store), clock=clock).namespace("org", 1)
        if invalidated == "leaf":
            other = other.namespace("user", 2)
        if state == "warm":
            ns.set("other", "before")  # creates the version keys
        if state == "evicted":
            ns.set("k", "before")
            for version_key in ns._version_keys:
                store.delete(version_key)
            clock.advance(1)  # a restart happens later than the writes it lost
        computes: list[str] = []

        def compute() -> str:
            computes.append("computed")
            other.invalidate()  # the data changes while it is read
            return "read before the change"

        assert getattr(ns, method)("k", compute, 60) == "read before the change"
        assert ns.get("k") is None  # stored already invalid
        assert ns.get_many(["k"]) == {}
        assert getattr(ns, method)("k", lambda: "read after", 60) == "read after"
        assert ns.get("k") == "read after"
        assert computes == ["computed"]

    def test_get_or_compute_stores_an_envelope_that_never_leaks(
        self, spaces: Namespaces, events: list[object]
    ) -> None:
        ns = spaces.namespace("user", 42)
        calls: list[int] = []

        def compute() -> dict[str, int]:
            calls.append(1)
            return {"total": 7}

        assert ns.get_or_compute("report", compute, 60) == {"total": 7}
        assert ns.get_or_compute("report", compute, 60) == {"total": 7}
        assert calls == [1]
        assert ns.get("report") == {"total": 7}
        assert ns.get_many(["report"]) == {"report": {"total": 7}}
        assert ns.get_or_set("report", "other") == {"total": 7}
        (event,) = events
        assert isinstance(event, Recomputed)
        assert event.key == ns.key("report")

    def test_get_or_compute_after_invalidation_recomputes(self, spaces: Namespaces) -> None:
        ns = spaces.namespace("user", 42)
        ns.get_or_compute("k", lambda: "v1", 60)
        ns.invalidate()
        fetched = ns.fetch("k", lambda: "v2", 60)
        assert (fetched.value, fetched.outcome) == ("v2", "computed")
        assert (ns.fetch("k", lambda: "v3", 60)).value == "v2"

    def test_a_value_computed_during_an_invalidation_is_stored_invalid(
        self, spaces: Namespaces
    ) -> None:
        ns = spaces.namespace("user", 42)

        def compute() -> str:
            ns.invalidate()
            return "computed from old data"

        assert ns.get_or_compute("k", compute, 60) == "computed from old data"
        assert ns.get("k") is None
        assert ns.get_or_compute("k", lambda: "new", 60) == "new"

    def test_recompute_stores_now_tagged_with_the_versions_read_first(
        self, spaces: Namespaces
    ) -> None:
        ns = spaces.namespace("user", 42)
        ns.get_or_compute("k", lambda: "old", 60)
        assert ns.recompute("k", lambda: "new", 60) == "new"
        assert ns.get_or_compute("k", lambda: "never", 60) == "new"

        def invalidated_meanwhile() -> str:
            ns.invalidate()
            return "from old data"

        assert ns.recompute("k", invalidated_meanwhile, 60) == "from old data"
        assert ns.get("k") is None

    def test_hard_invalidation_makes_lock_losers_wait_not_serve_old_values(
        self, spaces: Namespaces, store: Store
    ) -> None:
        ns = spaces.namespace("catalog")
        ns.get_or_compute("page", lambda: "old", 60)
        ns.invalidate()
        holder = recompute_lock(store, ns, "page")
        assert holder.acquire(blocking=False)  # another process is recomputing
        policy = StampedePolicy(wait=0, on_wait_timeout="compute")
        fetched = ns.fetch("page", lambda: "mine", 60, policy=policy)
        assert (fetched.value, fetched.outcome) == ("mine", "computed")  # never "old"

    def test_a_soft_namespace_serves_the_old_value_while_one_caller_recomputes(
        self, spaces: Namespaces, store: Store, clock: FakeClock, events: list[object]
    ) -> None:
        ns = spaces.namespace("catalog", soft=True)
        assert ns.namespace("page", 1).soft  # inherited
        ns.get_or_compute("page", lambda: "old", 60)
        written = clock()
        clock.advance(5)
        ns.invalidate()
        holder = recompute_lock(store, ns, "page")
        assert holder.acquire(blocking=False)  # another caller won the recompute
        fetched = ns.fetch("page", lambda: "never", 60)
        assert (fetched.value, fetched.outcome) == ("old", "stale")
        assert fetched.envelope is not None
        assert fetched.envelope.soft_expiry == written
        stale = [e for e in events if isinstance(e, StaleServed)]
        assert [round(e.age) for e in stale] == [5]
        assert ns.get("page") is None  # plain reads never see an invalidated value
        holder.release()
        fetched = ns.fetch("page", lambda: "new", 60)  # the lock is free: this caller wins
        assert (fetched.value, fetched.outcome) == ("new", "computed")
        assert ns.get_or_compute("page", lambda: "never", 60) == "new"

    def test_soft_staleness_of_a_plain_value(self, spaces: Namespaces) -> None:
        ns = spaces.namespace("catalog", soft=True)
        ns.set("page", "set plainly")
        ns.invalidate()
        assert ns.get_or_compute("page", lambda: "recomputed", 60) == "recomputed"

    def test_a_foreign_value_under_a_namespaced_key_is_an_error(
        self, spaces: Namespaces, store: Store
    ) -> None:
        ns = spaces.namespace("user", 42)
        ns.set("k", 1)
        store.set(ns.key("k"), "written by someone else")
        with pytest.raises(EncodingError, match="namespaced key"):
            ns.get("k")
        assert ns.get_or_compute("k", lambda: "recomputed", 60) == "recomputed"
        store.set(ns._version_keys[0], b"not a number")
        with pytest.raises(EncodingError, match="decimal counter"):
            ns.get("k")

    def test_an_unknown_format_is_an_error(self, spaces: Namespaces, store: Store) -> None:
        ns = spaces.namespace("user", 42)
        ns.set("k", 1)
        data = bytearray(store.get(ns.key("k")))
        data[2] = 9
        store.set(ns.key("k"), bytes(data))
        with pytest.raises(EncodingError, match="format 9"):
            ns.get("k")

    def test_the_value_carries_its_versions(self, spaces: Namespaces, store: Store) -> None:
        ns = spaces.namespace("org", 1).namespace("user", 2)
        ns.set("k", b"value")
        raw = store.get(ns.key("k"))
        magic, fmt, depth, _, flags = struct.unpack_from(">2sBBdI", raw)
        assert (magic, fmt, depth, flags) == (b"ns", 1, 2, 0)
        assert struct.unpack_from(">2Q", raw, 16) == ns.versions()
        assert raw[32:] == b"value"


def recompute_lock(store: Store, ns: Namespace, key: str) -> Any:
    """The lock Stampede takes for ``key`` in ``ns`` (to hold it as another caller)."""
    return Lock(store, lock_key(ns.key(key)), 60)


class TestEmbedded(NamespaceContract):
    @pytest.fixture
    def store(self, clock: FakeClock) -> Store:
        return MemoryStore(clock=clock)

    def test_an_invalidation_that_races_a_creation_bumps_it(
        self, spaces: Namespaces, store: Store, clock: FakeClock
    ) -> None:
        # Hooked hides the strict view (core/locks/), so this interleaving needs the
        # in-process store; the cluster runs the same code.
        hooked = Hooked(face(store))
        racing = Namespaces(hooked, clock=clock).namespace("user", 42)
        writer = spaces.namespace("user", 42)

        def writer_creates_it(*args: Any) -> None:
            writer.set("k", "read before the change")  # creates the version key

        hooked.before["add"] = writer_creates_it
        version = racing.invalidate()  # incr misses; the writer's add comes first
        assert [name for name, _ in hooked.calls] == ["incr", "add", "incr"]
        assert writer.versions() == (version,)
        assert writer.get("k") is None

    def test_a_value_over_the_item_size_limit_is_not_stored(self, clock: FakeClock) -> None:
        ns = Namespaces(face(MemoryStore(max_item_size=1024, clock=clock))).namespace("big")
        ns.set("k", "small")
        assert ns.set("k", "x" * 2000) is False
        assert ns.get("k") is None

    def test_the_stores_serde_guards_the_value_inside(self, clock: FakeClock) -> None:
        # Signing (serializers.py) signs the inner value, bound to its key: a
        # tampered or transplanted value is refused, which reads as a miss.
        store = MemoryStore(clock=clock, serde=ValueSerde(signing_keys=[b"k" * 32]))
        ns = Namespaces(face(store), clock=clock).namespace("user", 42)
        ns.set("a", {"x": 1})
        ns.set("b", {"x": 2})
        assert ns.get("a") == {"x": 1}
        raw = store.get(ns.key("a"))
        store.set(ns.key("a"), raw[:-1] + bytes([raw[-1] ^ 1]))
        assert ns.get("a") is None
        store.set(ns.key("a"), store.get(ns.key("b")))
        assert ns.get("a") is None
        assert ns.get_or_compute("a", lambda: "recomputed", 60) == "recomputed"


class TestThreeServers(NamespaceContract):
    @pytest.fixture
    def clock(self) -> FakeClock:
        import time

        return FakeClock(time.time())  # soft expiries are compared with memcached's clock

    @pytest.fixture
    def store(self, memcached_3: list[MemcachedServer]) -> Iterator[Store]:
        flush(memcached_3)
        cluster = Cluster([s.spec for s in memcached_3])
        yield cluster
        cluster.close()


def test_a_namespaced_read_is_one_request() -> None:
    counting = CountingStore(MemoryStore())
    ns = Namespaces(face(counting)).namespace("user", 1)
    ns.set_many({"a": 1, "b": 2})
    counting.reset()
    assert ns.get_many(["a", "b"]) == {"a": 1, "b": 2}
    assert ns.get("a") == 1
    assert counting.calls == {"get_many": 2}  # versions and values together, per read
