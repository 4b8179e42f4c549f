"""Leases (core/leases/): a fill that started before a concurrent write never lands.

Deterministic interleavings: the compute itself deletes or sets the key (or
invalidates the namespace, or marks the value stale), as a writer that
updated the database meanwhile would.  Each case checks what users rely on:
the caller gets its computed value, the cache does not hold it, and the next
read computes afresh.  On real memcached and on the embedded store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.leases import get_or_set
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.namespaces import Namespaces
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.stampede import Stampede, StampedePolicy
from django_mcpatterns.core.store import Store
from tests.conftest import flush
from tests.harness import MemcachedServer

KEY = "lease:key"

Writer = Callable[[Store, str], object]
WRITERS: dict[str, Writer] = {
    "delete": lambda store, key: store.delete(key),
    "set": lambda store, key: store.set(key, "written meanwhile", 60),
}
# What the key holds once the writer is done and the stale fill was refused.
AFTER = {"delete": None, "set": "written meanwhile"}


@pytest.fixture(params=["embedded", "meta", "text"])
def target(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "embedded":
        yield MemoryStore()
        return
    servers: list[MemcachedServer] = request.getfixturevalue("memcached_1")
    flush(servers)
    cluster = Cluster([s.spec for s in servers], ClusterOptions(protocol=request.param))
    yield cluster
    cluster.close()


def writing(store: Store, key: str, writer: Writer, value: str = "old") -> Callable[[], str]:
    """A compute that reads its source (``value``) and meanwhile sees ``writer`` change it."""

    def compute() -> str:
        writer(store, key)
        return value

    return compute


@pytest.mark.parametrize("write", sorted(WRITERS))
def test_a_cold_fill_never_lands_over_a_concurrent_write(target: Store, write: str) -> None:
    stampede = Stampede(target)
    assert stampede.get_or_compute(KEY, writing(target, KEY, WRITERS[write]), 60) == "old"
    assert target.get(KEY) == AFTER[write]
    fetched = stampede.fetch(KEY, lambda: "new", 60)
    assert (fetched.value, fetched.outcome) == (
        ("new", "computed") if write == "delete" else ("written meanwhile", "fresh")
    )


@pytest.mark.parametrize("write", [*sorted(WRITERS), "mark_stale"])
def test_a_stale_refill_never_lands_over_a_concurrent_write(target: Store, write: str) -> None:
    stampede = Stampede(target)
    stampede.get_or_compute(KEY, lambda: "first", 60)
    assert stampede.mark_stale(KEY)
    writer = WRITERS.get(write) or (lambda store, key: Stampede(store).mark_stale(key))
    fetched = stampede.fetch(KEY, writing(target, KEY, writer), 60)
    assert (fetched.value, fetched.outcome) == ("old", "computed")
    assert fetched.envelope is None  # not stored
    if write == "mark_stale":
        # Marked stale again while recomputing: still the first value, stale, not ours.
        assert target.get(KEY) is None
        assert stampede.fetch(KEY, lambda: "new", 60).value == "new"
    else:
        assert target.get(KEY) == AFTER[write]


def test_an_undisturbed_fill_lands_and_plain_reads_never_see_the_placeholder(
    target: Store,
) -> None:
    seen: list[Any] = []

    def compute() -> str:
        seen.append((target.get(KEY, "miss"), target.get_many([KEY]), target.add(KEY, "x")))
        return "v"

    assert Stampede(target).get_or_compute(KEY, compute, 60) == "v"
    # During the compute a lease placeholder is there: reads miss, add is refused.
    assert seen == [("miss", {}, False)]
    assert target.get(KEY) == "v"


@pytest.mark.parametrize("write", sorted(WRITERS))
def test_get_or_set_never_lands_over_a_concurrent_write(target: Store, write: str) -> None:
    result = get_or_set(target, KEY, writing(target, KEY, WRITERS[write]), 60)
    # As Django's get_or_set: the racing writer's value when there is one, else ours.
    assert result == (AFTER[write] or "old")
    assert target.get(KEY) == AFTER[write]
    assert get_or_set(target, KEY, lambda: "new", 60) == (AFTER[write] or "new")


@pytest.mark.parametrize("write", [*sorted(WRITERS), "invalidate"])
@pytest.mark.parametrize("method", ["get_or_set", "get_or_compute"])
def test_a_namespaced_fill_never_lands_over_a_concurrent_write(
    target: Store, write: str, method: str
) -> None:
    ns = Namespaces(target).namespace("user", 42)
    made = ns.key("profile")

    def compute() -> str:
        if write == "invalidate":
            ns.invalidate()
        else:
            WRITERS[write](_Through(ns), "profile")
        return "old"

    if method == "get_or_set":
        result = ns.get_or_set("profile", compute, 60)
    else:
        result = ns.get_or_compute("profile", compute, 60)
    assert result == ("written meanwhile" if (write, method) == ("set", "get_or_set") else "old")
    assert ns.get("profile") == (AFTER.get(write) if write != "invalidate" else None)
    assert target.get(made) != "old"
    if write != "set":
        assert ns.get_or_compute("profile", lambda: "new", 60) == "new"


class _Through:
    """A namespace written to like a Store, so the writers above apply to it."""

    def __init__(self, ns: Any) -> None:
        self._ns = ns

    def delete(self, key: str) -> bool:
        return bool(self._ns.delete(key))

    def set(self, key: str, value: Any, expire: int = 0) -> bool:
        return bool(self._ns.set(key, value, expire))


@pytest.mark.parametrize("outcome", ["raises", "not cached"])
def test_a_fill_that_stores_nothing_removes_its_placeholder(target: Store, outcome: str) -> None:
    def compute() -> str:
        if outcome == "raises":
            raise RuntimeError("the database is down")
        return "uncacheable"

    stampede = Stampede(target, StampedePolicy(failure_backoff=0))
    if outcome == "raises":
        with pytest.raises(RuntimeError):
            stampede.get_or_compute(KEY, compute, 60)
    else:
        assert stampede.get_or_compute(KEY, compute, 60, should_cache=lambda v: False) == (
            "uncacheable"
        )
    # Nothing left behind: the key is free for add, as before the call.
    assert target.gets_envelope(KEY) == (None, None)
    assert target.add(KEY, "added")
