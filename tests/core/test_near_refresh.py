"""The near cache's refresh ahead: hot keys renewed by the misses' own requests.

A hit on an entry read before in its life, past ``refresh_ahead`` of its
``max_age``, notes its key as due; the next miss carrying enough due keys on the
same server reads them in its request, and each is held as that miss's read: aged
from when the request was sent, dropped when memcached no longer holds it, never
over a write of this process made meanwhile.  Table rules on a fake clock (both
hit paths: compiled and Python), then the store's, on real memcached (sync and
asyncio).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import ConfigurationError
from django_mcpatterns.core.near import AsyncNearStore, NearOptions, NearStore, NearTable
from django_mcpatterns.core.near._model_table import CARRIED, CARRY_FROM, DUE_LIMIT, hit
from tests.aio import Blocking
from tests.conftest import flush
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, server_counters

MAX_AGE = 1.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


def table_of(clock: FakeClock, **options: Any) -> NearTable:
    return NearTable(NearOptions(**{"max_age": MAX_AGE, **options}), clock=clock)


@pytest.fixture(params=["compiled", "python"])
def look(request: pytest.FixtureRequest) -> Callable[[NearTable, str], Any]:
    """A get's lookup: the compiled hit (the store's) or the table's own method."""
    if request.param == "compiled":
        return hit
    return lambda table, key: table.hit(key)


def hot(table: NearTable, clock: FakeClock, look: Callable[[NearTable, str], Any], key: str):
    """Fill ``key``, read it young, then past half its life: due."""
    table.fill(key, f"{key}-v1", table.ticket())
    look(table, key)
    clock.advance(0.6 * MAX_AGE)
    look(table, key)
    clock.advance(-0.6 * MAX_AGE)


# -- options -------------------------------------------------------------------------------


def test_options_default_on_and_off() -> None:
    assert NearOptions.from_option({}).refresh_ahead == 0.5  # type: ignore[union-attr]
    for off in (None, False):
        parsed = NearOptions.from_option({"refresh_ahead": off})
        assert parsed is not None
        assert parsed.refresh_ahead is None
    parsed = NearOptions.from_option({"refresh_ahead": 0.75})
    assert parsed is not None
    assert parsed.refresh_ahead == 0.75


@pytest.mark.parametrize("given", [0, 1, 1.5, -0.5, True, "half", float("nan")])
def test_options_refuse_a_fraction_out_of_range(given: Any) -> None:
    with pytest.raises(ConfigurationError, match="'refresh_ahead' must be a fraction"):
        NearOptions.from_option({"refresh_ahead": given})


# -- what is noted -------------------------------------------------------------------------


def test_a_hot_entry_past_the_window_is_noted_once(clock: FakeClock, look: Any) -> None:
    table = table_of(clock)
    table.fill("k", "v", table.ticket())
    assert look(table, "k") == "v"
    clock.advance(0.4)
    assert look(table, "k") == "v"  # read again, but young: not due
    assert table.due == {}
    clock.advance(0.2)
    assert look(table, "k") == "v"
    assert list(table.due) == ["k"]
    entry = table.due["k"]
    table.due.clear()
    assert look(table, "k") == "v"  # noted once per entry
    assert table.due == {}
    assert entry.due


def test_an_entry_read_once_is_not_noted(clock: FakeClock, look: Any) -> None:
    table = table_of(clock)
    table.fill("k", "v", table.ticket())
    clock.advance(0.9)
    assert look(table, "k") == "v"
    assert table.due == {}


def test_nothing_is_noted_when_off_or_under_prefixes(clock: FakeClock, look: Any) -> None:
    for table in (table_of(clock, refresh_ahead=None), table_of(clock, prefixes=(("k", 1.0),))):
        hot(table, clock, look, "k")
        assert table.due == {}


def test_envelopes_are_not_noted(clock: FakeClock, look: Any) -> None:
    from django_mcpatterns.core.values.envelope import Envelope

    table = NearTable(NearOptions(MAX_AGE), clock=clock, wall=lambda: 5000.0)
    envelope = Envelope("v", soft_expiry=8000.0, hard_expiry=9000.0)
    assert table.fill("k", "v", table.ticket(), envelope=envelope)
    look(table, "k")
    clock.advance(0.6)
    look(table, "k")
    assert table.due == {}


def test_the_due_keys_are_bounded(clock: FakeClock, look: Any) -> None:
    table = table_of(clock)
    for i in range(DUE_LIMIT + 10):
        hot(table, clock, look, f"k{i}")
    assert len(table.due) == DUE_LIMIT


def test_a_forked_child_and_a_flush_start_with_nothing_due(clock: FakeClock, look: Any) -> None:
    table = table_of(clock)
    hot(table, clock, look, "k")
    table.after_fork()  # what the at-fork hook runs in the child
    assert table.due == {}
    hot(table, clock, look, "k")
    table.clear()
    assert table.due == {}


def test_take_due_leaves_the_misses_own_key_and_takes_at_most_carried(
    clock: FakeClock, look: Any
) -> None:
    table = table_of(clock)
    for i in range(CARRIED + 3):
        hot(table, clock, look, f"k{i}")
    taken = table.take_due("k0")
    assert len(taken) == CARRIED
    assert "k0" not in {entry.key for entry in taken}
    taken = table.take_due("k0")
    assert {entry.key for entry in taken} == {f"k{i}" for i in range(1, 3)}
    assert table.due == {}  # k0 left out: the miss reads it itself


# -- what a refresh does ---------------------------------------------------------------------


def test_a_refreshed_entry_ages_from_its_requests_send(clock: FakeClock, look: Any) -> None:
    table = table_of(clock)
    hot(table, clock, look, "k")
    clock.advance(0.6)
    taken = table.take_due("other")
    ticket = table.ticket()  # the miss's, before it is sent
    sent = clock.now
    clock.advance(0.2)  # the reply takes its time
    table.refreshed({"k": "v2"}, ["k"], taken, ticket)
    assert table.held("k").expires == sent + MAX_AGE  # type: ignore[union-attr]
    assert table.stats().refreshed == 1
    clock.advance(MAX_AGE - 0.2 - 1e-6)
    assert look(table, "k") == "v2"
    clock.advance(2e-6)
    assert look(table, "k") is not None
    assert table.lookup("k") is None


def test_a_key_memcached_no_longer_holds_is_dropped(clock: FakeClock, look: Any) -> None:
    table = table_of(clock)
    hot(table, clock, look, "k")
    clock.advance(0.6)
    taken = table.take_due("other")
    table.refreshed({}, ["k"], taken, table.ticket())
    assert table.held("k") is None


def test_a_write_of_this_process_during_the_refresh_wins(clock: FakeClock, look: Any) -> None:
    table = table_of(clock)
    for key in ("dropped", "written"):
        hot(table, clock, look, key)
    clock.advance(0.6)
    taken = table.take_due("other")
    ticket = table.ticket()
    table.invalidate("dropped")  # a delete of this process, answered while the read is away
    table.written("written", "mine", table.ticket())  # a set, likewise
    table.refreshed({"dropped": "old", "written": "old"}, ["dropped", "written"], taken, ticket)
    assert table.held("dropped") is None
    assert look(table, "written") == "mine"
    assert table.stats().refreshed == 0


def test_a_replaced_entry_is_not_dropped_by_an_older_answer(clock: FakeClock, look: Any) -> None:
    table = table_of(clock)
    hot(table, clock, look, "k")
    clock.advance(0.6)
    taken = table.take_due("other")
    ticket = table.ticket()
    table.fill("k", "newer", table.ticket())  # another thread's miss filled it meanwhile
    table.refreshed({}, ["k"], taken, ticket)  # memcached said "absent" before that
    assert look(table, "k") == "newer"


def test_keys_not_carried_are_due_again(clock: FakeClock, look: Any) -> None:
    table = table_of(clock)
    for key in ("a", "b"):
        hot(table, clock, look, key)
    clock.advance(0.6)
    taken = table.take_due("other")
    table.refreshed({"a": "a2"}, ["a"], taken, table.ticket())  # b is on another server
    assert list(table.due) == ["b"]


# -- the store: misses carry the due keys ----------------------------------------------------


@pytest.fixture
def cluster(memcached_1: list[MemcachedServer]) -> Iterator[Cluster]:
    flush(memcached_1)
    cluster = Cluster([memcached_1[0].spec])
    yield cluster
    cluster.close()


@pytest.fixture(params=["sync", "async"])
def near(request: pytest.FixtureRequest, cluster: Cluster, clock: FakeClock) -> Iterator[Any]:
    table = NearTable(NearOptions(MAX_AGE), clock=clock)
    if request.param == "sync":
        yield NearStore(cluster, table)
        return
    blocking = Blocking(AsyncNearStore(cluster.aio, table))
    yield blocking
    blocking.shutdown()


def table_in(near: Any) -> NearTable:
    store = near if isinstance(near, NearStore) else near.store
    table: NearTable = store.table
    return table


HOT = [f"hot:{i}" for i in range(CARRY_FROM)]


def make_due(near: Any, cluster: Cluster, clock: FakeClock) -> None:
    cluster.set_many(dict.fromkeys(HOT, "v1"))
    for key in HOT:
        assert near.get(key) == "v1"
        assert near.get(key) == "v1"
    clock.advance(0.6 * MAX_AGE)
    for key in HOT:
        assert near.get(key) == "v1"
    assert sorted(table_in(near).due) == HOT


def test_a_miss_renews_the_due_keys_in_its_own_request(
    near: Any, cluster: Cluster, clock: FakeClock, memcached_1: list[MemcachedServer]
) -> None:
    make_due(near, cluster, clock)
    cluster.set_many(dict.fromkeys(HOT, "v2"))  # another process
    cluster.set("cold", "c")
    before = server_counters(memcached_1, ["cmd_get", "get_hits"])
    sent = clock.now
    assert near.get("cold") == "c"
    after = server_counters(memcached_1, ["cmd_get", "get_hits"])
    assert after["cmd_get"] - before["cmd_get"] == 1 + len(HOT)  # one request: all the keys
    table = table_in(near)
    assert table.due == {}
    assert table.stats().refreshed == len(HOT)
    for key in HOT:
        assert table.held(key).expires == sent + MAX_AGE  # type: ignore[union-attr]
    clock.advance(0.9 * MAX_AGE)  # past the first copies' bound: served, renewed
    assert server_counters(memcached_1, ["cmd_get"])["cmd_get"] == after["cmd_get"]
    assert [near.get(key) for key in HOT] == ["v2"] * len(HOT)
    assert server_counters(memcached_1, ["cmd_get"])["cmd_get"] == after["cmd_get"]


def test_a_key_deleted_on_the_server_is_dropped_by_the_refresh(
    near: Any, cluster: Cluster, clock: FakeClock
) -> None:
    make_due(near, cluster, clock)
    cluster.delete(HOT[0])  # another process
    assert near.get("cold", "none") == "none"
    assert table_in(near).held(HOT[0]) is None
    assert near.get(HOT[0]) is None


def test_fewer_due_keys_wait_for_more(near: Any, cluster: Cluster, clock: FakeClock) -> None:
    make_due(near, cluster, clock)
    table = table_in(near)
    table.due.popitem()
    near.get("cold")
    assert len(table.due) == CARRY_FROM - 1
    assert table.stats().refreshed == 0


def test_a_store_that_cannot_carry_keys_notes_none(clock: FakeClock) -> None:
    from django_mcpatterns.core.memory import MemoryStore

    table = NearTable(NearOptions(MAX_AGE), clock=clock)
    near = NearStore(MemoryStore(), table)
    near.set("k", "v")
    for _ in range(3):
        near.get("k")
        clock.advance(0.3)
    assert table.due == {}


def test_a_forked_child_starts_with_nothing_due(cluster: Cluster, clock: FakeClock) -> None:
    table = NearTable(NearOptions(MAX_AGE), clock=clock)
    near = NearStore(cluster, table)
    make_due(near, cluster, clock)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the at-fork hook emptied the table
        os.write(write, b"%d" % len(table.due))
        os._exit(0)
    os.close(write)
    assert os.read(read, 16) == b"0"
    os.close(read)
    os.waitpid(pid, 0)
    assert len(table.due) == len(HOT)  # the parent's own
