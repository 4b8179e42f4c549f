"""Sets and lists on real memcached servers: what memcached itself decides.

* Round trips are read from memcached's ``stats`` counters (``cmd_get`` counts
  keys, and a meta get ``mg`` as one; ``cmd_set`` every storage command:
  set/add/append/prepend/cas), and
  cross-checked with :class:`~tests.fakes.CountingStore` (one call is one
  request, a multi-get over several servers included).
* The item limit is memcached's own 1 MiB: ``append`` past it answers NOT_STORED
  like a missing key, and sets must still lose nothing.
* Eight real processes write one set at once, compaction forced often, on a
  3-server cluster and on the embedded store (shared through a multiprocessing
  manager, so its real code runs under real interleavings).
"""

from __future__ import annotations

import functools
import multiprocessing
import random
from collections.abc import Callable, Iterator
from multiprocessing.managers import BaseManager
from typing import Any

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import NodeUnavailableError
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.outages import WriteDegraded
from django_mcpatterns.core.sets import (
    SHARD_TTL_MARGIN,
    AppendLists,
    AppendSets,
    SetOptions,
    shard_key,
)
from django_mcpatterns.core.sets._model_layout import SET, read_header
from tests.conftest import flush
from tests.core.patterns._sync.test_sets import churn
from tests.fakes import CountingStore
from tests.harness import (
    MemcachedServer,
    cluster_on,
    free_port,
    server_counters,
    servers_holding,
)

COUNTERS = ("cmd_get", "cmd_set", "cmd_touch", "cas_hits", "cas_misses", "cas_badval")
MIB = 1024 * 1024


class Wire:
    """memcached's counters, summed over servers, as deltas since the last look."""

    def __init__(self, servers: list[MemcachedServer]) -> None:
        self.servers = servers
        self.last = server_counters(servers, COUNTERS)

    def delta(self) -> dict[str, int]:
        now = server_counters(self.servers, COUNTERS)
        moved = {name: now[name] - self.last[name] for name in COUNTERS}
        self.last = now
        return {name: value for name, value in moved.items() if value}


@pytest.fixture
def one(memcached_1: list[MemcachedServer]) -> Iterator[tuple[CountingStore, Wire]]:
    with cluster_on(memcached_1) as cluster:
        yield CountingStore(cluster), Wire(memcached_1)


@pytest.fixture
def three(memcached_3: list[MemcachedServer]) -> Iterator[Cluster]:
    with cluster_on(memcached_3) as cluster:
        yield cluster
        flush(memcached_3)


# -- round trips, counted by memcached ---------------------------------------------------


def test_round_trips_on_a_real_server(one: tuple[CountingStore, Wire]) -> None:
    store, wire = one
    sets = AppendSets(store)  # type: ignore[arg-type]
    wire.delta()

    sets.sadd("k", "a")  # creation: append (NOT_STORED), add
    assert wire.delta() == {"cmd_set": 2}
    sets.sadd("k", *range(1000))  # any number of members: one append
    assert wire.delta() == {"cmd_set": 1}
    sets.srem("k", *range(500))
    assert wire.delta() == {"cmd_set": 1}
    assert sets.smembers("k") == {"a", *range(500, 1000)}  # its log is dirty: mg v c t f, cas
    assert wire.delta() == {"cmd_get": 1, "cmd_set": 1, "cas_hits": 1}
    assert sets.smembers("k") == {"a", *range(500, 1000)}  # steady state
    assert wire.delta() == {"cmd_get": 1}
    assert sets.sismember("k", 999)
    assert wire.delta() == {"cmd_get": 1}
    assert sets.scard("k") == 501
    assert wire.delta() == {"cmd_get": 1}

    churn(sets, "k", 300)
    wire.delta()
    sets.smembers("k")  # a dirty set: mg v c t f (value, cas and TTL), cas
    assert wire.delta() == {"cmd_get": 1, "cmd_set": 1, "cas_hits": 1}
    assert sets.spop("k") is not None  # mg v c t f, cas
    assert wire.delta() == {"cmd_get": 1, "cmd_set": 1, "cas_hits": 1}
    assert sets.smove("k", "other", 999)  # read + two appends (+ add: "other" is new)
    assert wire.delta() == {"cmd_get": 1, "cmd_set": 3}

    lists = AppendLists(store)  # type: ignore[arg-type]
    lists.rpush("l", "a", "b")  # creation
    assert wire.delta() == {"cmd_set": 2}
    lists.rpush("l", "c")
    lists.lrem("l", 1, "a")
    assert wire.delta() == {"cmd_set": 2}
    assert lists.lrange("l", 0, -1) == ["b", "c"]
    assert wire.delta() == {"cmd_get": 1}


def test_a_lost_creation_race_costs_one_more_append(one: tuple[CountingStore, Wire]) -> None:
    store, wire = one
    other = AppendSets(store.inner)
    store.before("add", lambda: other.sadd("k", "theirs"))  # theirs: append, add
    AppendSets(store).sadd("k", "mine")  # type: ignore[arg-type]
    assert [name for name, _ in store.log] == ["append", "add", "append"]
    assert wire.delta() == {"cmd_set": 5}
    assert other.smembers("k") == {"mine", "theirs"}


# -- an unreachable server ----------------------------------------------------------


def unreachable(on_outage: str = "degrade") -> tuple[AppendSets, AppendLists]:
    options = ClusterOptions(retry_attempts=1, on_outage=on_outage)
    cluster = Cluster([f"127.0.0.1:{free_port()}"], options)
    return AppendSets(cluster), AppendLists(cluster)


WRITES: dict[str, Callable[[AppendSets, AppendLists], object]] = {
    "sadd": lambda sets, lists: sets.sadd("s", "a"),
    "srem": lambda sets, lists: sets.srem("s", "a"),
    "rpush": lambda sets, lists: lists.rpush("l", "a"),
    "lrem": lambda sets, lists: lists.lrem("l", 0, "a"),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_writes_to_an_unreachable_server_raise_at_once(write: str) -> None:
    # An unreachable server answers like a missing item: writers use the strict
    # view, so a lost write says why instead of retrying as if it were contended.
    sets, lists = unreachable(on_outage="raise")
    with pytest.raises(NodeUnavailableError):
        WRITES[write](sets, lists)
    assert sets.store.journal() == {sets.store.servers[0].node: 1}  # repaired when back


@pytest.mark.parametrize("write", list(WRITES))
def test_writes_to_an_unreachable_server_degrade_to_0_and_journal_a_repair(write: str) -> None:
    # OPTIONS["on_outage"] = "degrade", the default: no error reaches the caller, the
    # write says 0, and the collection is replaced by an incomplete one when the server is back.
    sets, lists = unreachable()
    events: list[WriteDegraded] = []
    report = events.append
    degraded = {
        "sadd": lambda: sets.sadd("s", "a", report=report),
        "srem": lambda: sets.srem("s", "a", report=report),
        "rpush": lambda: lists.rpush("l", "a", report=report),
        "lrem": lambda: lists.lrem("l", 0, "a", report=report),
    }
    assert degraded[write]() == 0
    assert [event.command for event in events] == [write]
    assert isinstance(events[0].error, NodeUnavailableError)
    assert sets.store.journal() == {sets.store.servers[0].node: 1}


def test_reads_of_an_unreachable_server_degrade() -> None:
    sets, lists = unreachable()
    assert sets.smembers("s") == set()
    assert sets.smembers("s", loader=lambda: {"from", "loader"}) == {"from", "loader"}
    assert sets.spop("s") is None
    assert sets.smove("s", "t", "a") is False  # it reads the source first
    assert lists.lrange("l", 0, -1) == []


# -- the item limit -------------------------------------------------------------------


def test_a_full_item_is_told_from_a_missing_one(three: Cluster) -> None:
    """Fill a set to memcached's 1 MiB limit with writes only: nothing is lost."""
    store = CountingStore(three)
    sets = AppendSets(store)  # type: ignore[arg-type]
    sets.sadd("k", "keep")
    big = "x" * 2000
    for i in range(600):  # ~1.2 MB of records: past the limit, never read
        sets.sadd("k", f"{big}{i}")
        sets.srem("k", f"{big}{i}")
    assert store.calls["cas"] >= 1  # full: compacted with the write folded in
    assert len(three.get("k")) < MIB
    assert sets.smembers("k") == {"keep"}


def test_a_set_past_one_item_shards_over_the_cluster(
    three: Cluster, memcached_3: list[MemcachedServer]
) -> None:
    store = CountingStore(three)
    sets = AppendSets(store)  # type: ignore[arg-type]
    members = {f"member-{i:013d}" for i in range(120_000)}  # 20 bytes each, ~2.8 MB
    sets.sadd("big", *members)
    header = read_header(three.get("big"), SET)
    assert header.shards >= 3
    # Each shard is routed by its own key (not the set's), so shards spread over the
    # cluster: every one sits exactly where the ring puts it.  (Asserting "on at least two
    # servers" would fail whenever the random generation puts all of them on one.)
    for index in range(header.shards):
        key = shard_key(b"big", header.generation, index)
        held = set(servers_holding(memcached_3, key))
        assert held == {three.ring.get_node(key)}
    assert sets.smembers("big") == members
    wire = Wire(memcached_3)
    store.reset()
    assert sets.scard("big") == 120_000
    assert store.calls == {"gets_many": 1}  # one parallel multi-get
    assert wire.delta() == {"cmd_get": 1 + header.shards}


def test_every_shard_expires_with_its_root(three: Cluster) -> None:
    """No item of a set outlives its root by more than the margin, whatever happens to it.

    The TTLs are memcached's own (``mg <key> t`` through ``Store.ttl``).
    """
    sets = AppendSets(three)

    def generation(key: str) -> list[str]:
        header = read_header(three.get(key), SET)
        assert header.shards >= 3
        return [
            shard_key(key.encode(), header.generation, i).decode() for i in range(header.shards)
        ]

    def expiring(keys: list[str], root_ttl: int) -> None:
        ttls = [three.ttl(key) for key in keys]
        assert all(ttl is not None and 0 < ttl <= root_ttl + SHARD_TTL_MARGIN for ttl in ttls), ttls

    members = {f"member-{i:013d}" for i in range(120_000)}
    sets.sadd("big", *members, expire=300)  # created sharded
    first = generation("big")
    expiring(first, 300)
    sets.sunionstore("copy", "big", expire=200)  # *store writing shards
    copied = generation("copy")
    expiring(copied, 200)
    sets.sadd("big", "late")
    assert sets.compact("big")  # a rewrite: a new generation, the old one deleted
    second = generation("big")
    expiring(second, 300)
    assert three.get_many(first) == {}
    sets.sadd("small", "a", expire=200)
    sets.sunionstore("copy", "small", expire=200)  # *store over a sharded destination
    assert three.get_many(copied) == {}
    three.delete("big")  # what a deleted set leaves behind expires too
    expiring(second, 300)


@pytest.mark.slow
def test_a_million_member_set(three: Cluster) -> None:
    store = CountingStore(three)
    sets = AppendSets(store)  # type: ignore[arg-type]
    members = {f"member-{i:013d}" for i in range(1_000_000)}
    assert sets.sadd("million", *members) == 1_000_000
    sets.sadd("million", "one more")
    sets.srem("million", "member-0000000000000")
    expected = (members | {"one more"}) - {"member-0000000000000"}
    store.reset()
    assert sets.scard("million") == 1_000_000
    assert store.calls == {"gets_many": 1}
    assert sets.sismember("million", "member-0000000999999")
    assert not sets.sismember("million", "member-0000000000000")
    assert sets.smembers("million") == expected


# -- eight processes, one set --------------------------------------------------------------

KEY = "shared-set"
PROCESSES = 8
OPERATIONS = 2000
# Compaction forced often: every read compacts a set with any log, and a tenth
# of the writes compact too.
RACY = SetOptions(compact_ratio=0, compact_min_bytes=0, compact_on_write=0.1)


def hammer(make_store: Callable[[], Any], index: int) -> set[str]:
    """One process: random sadd/srem of its own members; returns its final view."""
    store = make_store()
    rng = random.Random(index)
    sets = AppendSets(store, RACY, rng=random.Random(index + 100))
    mine = [f"p{index}:{j}" for j in range(40)]
    view: set[str] = set()
    for step in range(OPERATIONS):
        member = rng.choice(mine)
        if rng.random() < 0.6:
            sets.sadd(KEY, member)
            view.add(member)
        else:
            sets.srem(KEY, member)
            view.discard(member)
        if step % 10 == 0:
            sets.smembers(KEY)  # reads compact (cas), racing the others' appends
    return view


def run_processes(make_store: Callable[[], Any]) -> set[str]:
    context = multiprocessing.get_context("fork")
    with context.Pool(PROCESSES) as pool:
        views = pool.map(functools.partial(hammer, make_store), range(PROCESSES))
    return set().union(*views)


@pytest.mark.slow
def test_eight_processes_on_a_three_server_cluster(
    three: Cluster, memcached_3: list[MemcachedServer]
) -> None:
    wire = Wire(memcached_3)
    expected = run_processes(functools.partial(Cluster, [s.spec for s in memcached_3]))
    assert wire.delta()["cas_hits"] > 50  # compaction really raced the writers
    assert AppendSets(three).smembers(KEY) == expected


class _StoreManager(BaseManager):
    pass


_StoreManager.register("MemoryStore", MemoryStore)


def _given(store: Any) -> Any:
    return store


@pytest.mark.slow
def test_eight_processes_on_the_embedded_store() -> None:
    with _StoreManager(ctx=multiprocessing.get_context("fork")) as manager:
        shared = manager.MemoryStore()  # type: ignore[attr-defined]
        expected = run_processes(functools.partial(_given, shared))
        assert AppendSets(shared, RACY).smembers(KEY) == expected
