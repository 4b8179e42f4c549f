"""A pop its server could not take (issue 23 item 1): no error, no member dropped unseen.

``spop`` reads the set, then removes the chosen member with a ``cas``.  Before,
a server that stalled between the two raised ``OutcomeUnknownError`` into the
caller under ``on_outage="degrade"``, the default.  Now the pop returns what a
degraded read returns (None, or an empty set) and reports ``write_degraded``;
one whose ``cas`` may have been applied leaves the set incomplete (the member
it may have removed is rebuilt from the loader, never silently gone), and one
certainly not applied leaves it whole.  Real servers, stalled with SIGSTOP;
waits wait for the repair, nothing is timed.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Any

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import IncompleteSetError, OutcomeUnknownError
from django_mcpatterns.core.outages import WriteDegraded
from django_mcpatterns.core.sets import AppendSets, AsyncAppendSets
from tests.core.test_outages import cluster_of, key_on, wait_for
from tests.harness import MemcachedServer, memcached_cluster

MEMBERS = {f"m{i}" for i in range(10)}


@pytest.fixture
def two() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(2) as servers:
        yield servers


class BeforeCas:
    """A store whose strict view (the one writers use) runs ``hook`` before its first ``cas``:
    between a pop's read and its write.  Sync or asyncio, as the wrapped store."""

    def __init__(self, store: Any, hook: Any) -> None:
        self.store, self.hook = store, hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def strict(self) -> Any:
        view, outer = self.store.strict(), self

        class Strict:
            def __getattr__(self, name: str) -> Any:
                return getattr(view, name)

            if inspect.iscoroutinefunction(view.cas):

                async def cas(self, *args: Any, **kwargs: Any) -> Any:
                    outer.fire()
                    return await view.cas(*args, **kwargs)

            else:

                def cas(self, *args: Any, **kwargs: Any) -> Any:
                    outer.fire()
                    return view.cas(*args, **kwargs)

        return Strict()

    def fire(self) -> None:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()


def filled(cluster: Cluster, server: MemcachedServer) -> str:
    key = key_on(cluster, server, "pop")
    assert AppendSets(cluster).sadd(key, *MEMBERS, expire=60) == len(MEMBERS)
    return key


def test_a_pop_stalled_between_read_and_cas_pops_nothing_and_drops_no_member(
    two: list[MemcachedServer],
) -> None:
    cluster = cluster_of(two)
    key = filled(cluster, two[0])
    sets = AppendSets(BeforeCas(cluster, two[0].pause))
    events: list[WriteDegraded] = []
    try:
        # Before: OutcomeUnknownError (the cas was sent, its reply never came).
        assert sets.spop(key, report=events.append) is None
        assert sets.spop(key, 3, report=events.append) == set()  # a degraded read: nothing
    finally:
        two[0].resume()
    assert [e.command for e in events] == ["spop"]  # the second read missed: nothing to pop
    wait_for(lambda: not cluster.journal(), "the repair")
    # The cas may have landed once the server resumed: the set reads as incomplete, and its
    # loader rebuilds every member, never a set silently one short.
    with pytest.raises(IncompleteSetError):
        AppendSets(cluster_of(two)).smembers(key)
    assert AppendSets(cluster).smembers(key, loader=lambda: set(MEMBERS)) == MEMBERS


def test_a_pop_refused_before_it_was_sent_leaves_the_set_whole(
    two: list[MemcachedServer],
) -> None:
    cluster = cluster_of(two, retry_timeout=30.0)  # failing: nothing is sent to it for a while
    key = filled(cluster, two[0])
    other = key_on(cluster, two[0], "other")

    def fail_it() -> None:
        two[0].pause()
        assert cluster.get(other) is None  # times out: the server is failing, in its retry wait

    sets = AppendSets(BeforeCas(cluster, fail_it))
    events: list[WriteDegraded] = []
    try:
        assert sets.spop(key, report=events.append) is None  # before: NodeUnavailableError
    finally:
        two[0].resume()
    assert [e.command for e in events] == ["spop"]
    assert cluster.journal() == {}  # certainly not applied: nothing to repair
    assert AppendSets(cluster_of(two)).smembers(key) == MEMBERS  # whole, for every process


def test_an_async_pop_stalled_between_read_and_cas_degrades_too(
    two: list[MemcachedServer],
) -> None:
    cluster = cluster_of(two)
    key = filled(cluster, two[0])
    sets = AsyncAppendSets(BeforeCas(cluster.aio, two[0].pause))
    events: list[WriteDegraded] = []

    async def pop() -> Any:
        try:
            return await sets.spop(key, report=events.append)
        finally:
            two[0].resume()

    assert asyncio.run(pop()) is None  # before: OutcomeUnknownError
    assert [e.command for e in events] == ["spop"]
    wait_for(lambda: not cluster.journal(), "the repair")
    with pytest.raises(IncompleteSetError):
        AppendSets(cluster).smembers(key)


def test_under_on_outage_raise_the_pop_raises_and_is_repaired_all_the_same(
    two: list[MemcachedServer],
) -> None:
    cluster = cluster_of(two, on_outage="raise")
    key = filled(cluster, two[0])
    sets = AppendSets(BeforeCas(cluster, two[0].pause))
    try:
        with pytest.raises(OutcomeUnknownError):
            sets.spop(key)
    finally:
        two[0].resume()
    wait_for(lambda: not cluster.journal(), "the repair")
    assert AppendSets(cluster).smembers(key, loader=lambda: set(MEMBERS)) == MEMBERS


def test_a_pop_from_a_loader_backed_set_while_its_server_is_out_pops_nothing(
    two: list[MemcachedServer],
) -> None:
    cluster = cluster_of(two)
    sets = AppendSets(cluster)
    key = key_on(cluster, two[0], "loaded")
    assert sets.smembers(key, loader=lambda: set(MEMBERS)) == MEMBERS
    two[0].pause()
    try:
        # Before: IncompleteSetError ("could not be rebuilt from its loader"): the read missed,
        # the rebuild could not be stored, and the read after it missed again.
        assert sets.spop(key, loader=lambda: set(MEMBERS)) is None
        assert sets.spop(key, 2, loader=lambda: set(MEMBERS)) == set()
    finally:
        two[0].resume()
    wait_for(lambda: AppendSets(cluster_of(two)).smembers(key) == MEMBERS, "the server back")
