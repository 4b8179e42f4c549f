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
from django_mcpatterns.core.namespaces import AsyncNamespace, AsyncNamespaces
from django_mcpatterns.core.serializers import ValueSerde
from django_mcpatterns.core.stampede import (
    AsyncStampede,
    Recomputed,
    StaleServed,
    StampedePolicy,
    lock_key,
)
from django_mcpatterns.core.store import AsyncStore, Store
from tests.conftest import flush
from tests.fakes import AsyncHooked, CountingStore, FakeClock
from tests.harness import MemcachedServer
from tests.twins import async_face


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
    def spaces(self, store: Store, clock: FakeClock, events: list[object]) -> AsyncNamespaces:
        def stampede(view: AsyncStore) -> AsyncStampede:
            return AsyncStampede(view, clock=clock, sleep=clock.async_sleep, on_event=events.append)

        return AsyncNamespaces(async_face(store), clock=clock, stampede=stampede)

    async def test_invalidate_drops_every_key_of_the_namespace_and_only_those(
        self, spaces: AsyncNamespaces, store: Store
    ) -> None:
        ns, other = spaces.namespace("user", 42), spaces.namespace("user", 43)
        await ns.set_many({"profile": {"name": "ann"}, "avatar": b"\x89PNG", "age": 31})
        await other.set("profile", {"name": "bob"})
        store.set("plain", "kept")
        assert await ns.get_many(["profile", "avatar", "age", "none"]) == {
            "profile": {"name": "ann"},
            "avatar": b"\x89PNG",
            "age": 31,
        }
        await spaces.invalidate("user", 42)
        assert await ns.get_many(["profile", "avatar", "age"]) == {}
        assert await ns.get("profile", "default") == "default"
        assert await other.get("profile") == {"name": "bob"}
        assert store.get("plain") == "kept"
        await ns.set("profile", {"name": "ann 2"})  # written under the new version
        assert await ns.get("profile") == {"name": "ann 2"}

    async def test_values_of_every_kind_round_trip(self, spaces: AsyncNamespaces) -> None:
        ns = spaces.namespace("kinds")
        values = {"none": None, "str": "é", "bytes": b"\x00\xff", "int": 2**70, "list": [1, "a"]}
        assert await ns.set_many(values) == []
        assert await ns.get_many(values) == values
        assert await ns.get("none", "default") is None  # a cached None is a hit

    async def test_invalidating_the_outer_namespace_invalidates_the_inner(
        self, spaces: AsyncNamespaces
    ) -> None:
        org = spaces.namespace("org", 1)
        user = org.namespace("user", 42)
        sibling = org.namespace("user", 43)
        await org.set("name", "acme")
        await user.set("profile", "ann")
        await sibling.set("profile", "bob")
        await user.invalidate()
        assert await user.get("profile") is None
        assert await sibling.get("profile") == "bob"
        assert await org.get("name") == "acme"
        await user.set("profile", "ann")
        await org.invalidate_namespace("user", 43)
        assert await sibling.get("profile") is None
        assert await user.get("profile") == "ann"
        await spaces.invalidate("org", 1)
        assert await org.get("name") is None
        assert await user.get("profile") is None
        assert await spaces.namespace("org", 1).namespace("user", 42).get("profile") is None

    async def test_a_nested_namespace_is_not_the_flat_one(self, spaces: AsyncNamespaces) -> None:
        await spaces.namespace("org", 1).namespace("user", 42).set("k", "nested")
        assert await spaces.namespace("org", 1, "user", 42).get("k") is None

    async def test_versions_start_at_the_time_in_microseconds(
        self, spaces: AsyncNamespaces, clock: FakeClock
    ) -> None:
        ns = spaces.namespace("user", 42).namespace("posts")
        assert await ns.versions() == (None, None)
        assert await ns.get("k") is None  # a read creates nothing
        assert await ns.versions() == (None, None)
        await ns.set("k", 1)
        first = int(clock() * 1_000_000)
        assert await ns.versions() == (first, first)
        assert await ns.invalidate() == first + 1
        assert await ns.versions() == (first, first + 1)

    async def test_invalidating_a_missing_namespace_creates_its_version(
        self, spaces: AsyncNamespaces, clock: FakeClock
    ) -> None:
        assert await spaces.invalidate("never", "used") == int(clock() * 1_000_000)

    async def test_an_evicted_version_key_never_brings_old_values_back(
        self, spaces: AsyncNamespaces, store: Store, clock: FakeClock
    ) -> None:
        ns = spaces.namespace("user", 42)
        await ns.set("profile", "old")
        (version_key,) = ns._version_keys
        store.delete(version_key)  # evicted, or its server restarted empty
        assert await ns.get("profile") is None
        clock.advance(0.5)
        await ns.set("other", "new")  # recreates the version, from the clock
        assert await ns.versions() == (int(clock() * 1_000_000),)
        assert await ns.get("profile") is None
        assert await ns.get("other") == "new"

    async def test_add_fails_only_on_a_valid_value(self, spaces: AsyncNamespaces) -> None:
        ns = spaces.namespace("user", 42)
        assert await ns.add("k", 1) is True
        assert await ns.add("k", 2) is False
        assert await ns.get("k") == 1
        await ns.invalidate()
        assert await ns.add("k", 3) is True  # the invalidated value does not count
        assert await ns.get("k") == 3

    async def test_delete(self, spaces: AsyncNamespaces) -> None:
        ns = spaces.namespace("user", 42)
        await ns.set_many({"a": 1, "b": 2, "c": 3})
        assert await ns.delete("a") is True
        assert await ns.delete("a") is False
        await ns.delete_many(["b", "c"])
        assert await ns.get_many(["a", "b", "c"]) == {}

    async def test_get_or_set_tags_with_the_versions_read_before_computing(
        self, spaces: AsyncNamespaces
    ) -> None:
        ns = spaces.namespace("user", 42)
        assert await ns.get_or_set("k", lambda: "first") == "first"
        assert await ns.get_or_set("k", lambda: "second") == "first"
        await ns.invalidate()

        async def computed_while_invalidated() -> str:
            await spaces.invalidate("user", 42)  # the data changed while we computed
            return "stale"

        assert await ns.get_or_set("k", computed_while_invalidated) == "stale"
        assert await ns.get("k") is None  # stored already invalid
        assert await ns.get_or_set("k", "fresh") == "fresh"
        assert await ns.get("k") == "fresh"

    @pytest.mark.parametrize("state", ["warm", "first use", "evicted"])
    @pytest.mark.parametrize("levels", [("root", 1), ("root", 2), ("leaf", 2)])
    @pytest.mark.parametrize("method", ["get_or_set", "get_or_compute"])
    async def test_an_invalidation_during_the_compute_always_wins(
        self,
        spaces: AsyncNamespaces,
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
        other = AsyncNamespaces(async_face(store), clock=clock).namespace("org", 1)
        if invalidated == "leaf":
            other = other.namespace("user", 2)
        if state == "warm":
            await ns.set("other", "before")  # creates the version keys
        if state == "evicted":
            await ns.set("k", "before")
            for version_key in ns._version_keys:
                store.delete(version_key)
            clock.advance(1)  # a restart happens later than the writes it lost
        computes: list[str] = []

        async def compute() -> str:
            computes.append("computed")
            await other.invalidate()  # the data changes while it is read
            return "read before the change"

        assert await getattr(ns, method)("k", compute, 60) == "read before the change"
        assert await ns.get("k") is None  # stored already invalid
        assert await ns.get_many(["k"]) == {}
        assert await getattr(ns, method)("k", lambda: "read after", 60) == "read after"
        assert await ns.get("k") == "read after"
        assert computes == ["computed"]

    async def test_get_or_compute_stores_an_envelope_that_never_leaks(
        self, spaces: AsyncNamespaces, events: list[object]
    ) -> None:
        ns = spaces.namespace("user", 42)
        calls: list[int] = []

        def compute() -> dict[str, int]:
            calls.append(1)
            return {"total": 7}

        assert await ns.get_or_compute("report", compute, 60) == {"total": 7}
        assert await ns.get_or_compute("report", compute, 60) == {"total": 7}
        assert calls == [1]
        assert await ns.get("report") == {"total": 7}
        assert await ns.get_many(["report"]) == {"report": {"total": 7}}
        assert await ns.get_or_set("report", "other") == {"total": 7}
        (event,) = events
        assert isinstance(event, Recomputed)
        assert event.key == ns.key("report")

    async def test_get_or_compute_after_invalidation_recomputes(
        self, spaces: AsyncNamespaces
    ) -> None:
        ns = spaces.namespace("user", 42)
        await ns.get_or_compute("k", lambda: "v1", 60)
        await ns.invalidate()
        fetched = await ns.fetch("k", lambda: "v2", 60)
        assert (fetched.value, fetched.outcome) == ("v2", "computed")
        assert (await ns.fetch("k", lambda: "v3", 60)).value == "v2"

    async def test_a_value_computed_during_an_invalidation_is_stored_invalid(
        self, spaces: AsyncNamespaces
    ) -> None:
        ns = spaces.namespace("user", 42)

        async def compute() -> str:
            await ns.invalidate()
            return "computed from old data"

        assert await ns.get_or_compute("k", compute, 60) == "computed from old data"
        assert await ns.get("k") is None
        assert await ns.get_or_compute("k", lambda: "new", 60) == "new"

    async def test_recompute_stores_now_tagged_with_the_versions_read_first(
        self, spaces: AsyncNamespaces
    ) -> None:
        ns = spaces.namespace("user", 42)
        await ns.get_or_compute("k", lambda: "old", 60)
        assert await ns.recompute("k", lambda: "new", 60) == "new"
        assert await ns.get_or_compute("k", lambda: "never", 60) == "new"

        async def invalidated_meanwhile() -> str:
            await ns.invalidate()
            return "from old data"

        assert await ns.recompute("k", invalidated_meanwhile, 60) == "from old data"
        assert await ns.get("k") is None

    async def test_hard_invalidation_makes_lock_losers_wait_not_serve_old_values(
        self, spaces: AsyncNamespaces, store: Store
    ) -> None:
        ns = spaces.namespace("catalog")
        await ns.get_or_compute("page", lambda: "old", 60)
        await ns.invalidate()
        holder = recompute_lock(store, ns, "page")
        assert holder.acquire(blocking=False)  # another process is recomputing
        policy = StampedePolicy(wait=0, on_wait_timeout="compute")
        fetched = await ns.fetch("page", lambda: "mine", 60, policy=policy)
        assert (fetched.value, fetched.outcome) == ("mine", "computed")  # never "old"

    async def test_a_soft_namespace_serves_the_old_value_while_one_caller_recomputes(
        self, spaces: AsyncNamespaces, store: Store, clock: FakeClock, events: list[object]
    ) -> None:
        ns = spaces.namespace("catalog", soft=True)
        assert ns.namespace("page", 1).soft  # inherited
        await ns.get_or_compute("page", lambda: "old", 60)
        written = clock()
        clock.advance(5)
        await ns.invalidate()
        holder = recompute_lock(store, ns, "page")
        assert holder.acquire(blocking=False)  # another caller won the recompute
        fetched = await ns.fetch("page", lambda: "never", 60)
        assert (fetched.value, fetched.outcome) == ("old", "stale")
        assert fetched.envelope is not None
        assert fetched.envelope.soft_expiry == written
        stale = [e for e in events if isinstance(e, StaleServed)]
        assert [round(e.age) for e in stale] == [5]
        assert await ns.get("page") is None  # plain reads never see an invalidated value
        holder.release()
        fetched = await ns.fetch("page", lambda: "new", 60)  # the lock is free: this caller wins
        assert (fetched.value, fetched.outcome) == ("new", "computed")
        assert await ns.get_or_compute("page", lambda: "never", 60) == "new"

    async def test_soft_staleness_of_a_plain_value(self, spaces: AsyncNamespaces) -> None:
        ns = spaces.namespace("catalog", soft=True)
        await ns.set("page", "set plainly")
        await ns.invalidate()
        assert await ns.get_or_compute("page", lambda: "recomputed", 60) == "recomputed"

    async def test_a_foreign_value_under_a_namespaced_key_is_an_error(
        self, spaces: AsyncNamespaces, store: Store
    ) -> None:
        ns = spaces.namespace("user", 42)
        await ns.set("k", 1)
        store.set(ns.key("k"), "written by someone else")
        with pytest.raises(EncodingError, match="namespaced key"):
            await ns.get("k")
        assert await ns.get_or_compute("k", lambda: "recomputed", 60) == "recomputed"
        store.set(ns._version_keys[0], b"not a number")
        with pytest.raises(EncodingError, match="decimal counter"):
            await ns.get("k")

    async def test_an_unknown_format_is_an_error(
        self, spaces: AsyncNamespaces, store: Store
    ) -> None:
        ns = spaces.namespace("user", 42)
        await ns.set("k", 1)
        data = bytearray(store.get(ns.key("k")))
        data[2] = 9
        store.set(ns.key("k"), bytes(data))
        with pytest.raises(EncodingError, match="format 9"):
            await ns.get("k")

    async def test_the_value_carries_its_versions(
        self, spaces: AsyncNamespaces, store: Store
    ) -> None:
        ns = spaces.namespace("org", 1).namespace("user", 2)
        await ns.set("k", b"value")
        raw = store.get(ns.key("k"))
        magic, fmt, depth, _, flags = struct.unpack_from(">2sBBdI", raw)
        assert (magic, fmt, depth, flags) == (b"ns", 1, 2, 0)
        assert struct.unpack_from(">2Q", raw, 16) == await ns.versions()
        assert raw[32:] == b"value"


def recompute_lock(store: Store, ns: AsyncNamespace, key: str) -> Any:
    """The lock Stampede takes for ``key`` in ``ns`` (to hold it as another caller)."""
    return Lock(store, lock_key(ns.key(key)), 60)


class TestEmbedded(NamespaceContract):
    @pytest.fixture
    def store(self, clock: FakeClock) -> Store:
        return MemoryStore(clock=clock)

    async def test_an_invalidation_that_races_a_creation_bumps_it(
        self, spaces: AsyncNamespaces, store: Store, clock: FakeClock
    ) -> None:
        # Hooked hides the strict view (core/locks/), so this interleaving needs the
        # in-process store; the cluster runs the same code.
        hooked = AsyncHooked(async_face(store))
        racing = AsyncNamespaces(hooked, clock=clock).namespace("user", 42)
        writer = spaces.namespace("user", 42)

        async def writer_creates_it(*args: Any) -> None:
            await writer.set("k", "read before the change")  # creates the version key

        hooked.before["add"] = writer_creates_it
        version = await racing.invalidate()  # incr misses; the writer's add comes first
        assert [name for name, _ in hooked.calls] == ["incr", "add", "incr"]
        assert await writer.versions() == (version,)
        assert await writer.get("k") is None

    async def test_a_value_over_the_item_size_limit_is_not_stored(self, clock: FakeClock) -> None:
        ns = AsyncNamespaces(async_face(MemoryStore(max_item_size=1024, clock=clock))).namespace(
            "big"
        )
        await ns.set("k", "small")
        assert await ns.set("k", "x" * 2000) is False
        assert await ns.get("k") is None

    async def test_the_stores_serde_guards_the_value_inside(self, clock: FakeClock) -> None:
        # Signing (serializers.py) signs the inner value, bound to its key: a
        # tampered or transplanted value is refused, which reads as a miss.
        store = MemoryStore(clock=clock, serde=ValueSerde(signing_keys=[b"k" * 32]))
        ns = AsyncNamespaces(async_face(store), clock=clock).namespace("user", 42)
        await ns.set("a", {"x": 1})
        await ns.set("b", {"x": 2})
        assert await ns.get("a") == {"x": 1}
        raw = store.get(ns.key("a"))
        store.set(ns.key("a"), raw[:-1] + bytes([raw[-1] ^ 1]))
        assert await ns.get("a") is None
        store.set(ns.key("a"), store.get(ns.key("b")))
        assert await ns.get("a") is None
        assert await ns.get_or_compute("a", lambda: "recomputed", 60) == "recomputed"


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


async def test_a_namespaced_read_is_one_request() -> None:
    counting = CountingStore(MemoryStore())
    ns = AsyncNamespaces(async_face(counting)).namespace("user", 1)
    await ns.set_many({"a": 1, "b": 2})
    counting.reset()
    assert await ns.get_many(["a", "b"]) == {"a": 1, "b": 2}
    assert await ns.get("a") == 1
    assert counting.calls == {"get_many": 2}  # versions and values together, per read
