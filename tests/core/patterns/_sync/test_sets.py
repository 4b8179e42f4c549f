# Generated from tests/core/patterns/_async/test_sets.py by scripts/generate_sync.py: do not edit.
"""Append-based sets and lists (core/sets/), written once, over the embedded MemoryStore.

This asyncio source is the test of both forms: scripts/generate_sync.py makes
``../_sync/test_sets.py`` (``AsyncAppendSets`` -> ``AppendSets``, ``await`` dropped).
Races are replayed deterministically: :class:`CountingStore` counts every Store call
(one call is one request) and can run a competing writer (``other``, a sync client of
the same data) right before a given call, which is how "a lost race loses nothing" and
"two pops never return the same member" are proven without sleeping.  Small items
(4 KiB) make compaction, fullness and shards happen with few members.  The models
(hypothesis) and the pure parts stay in ``tests/core/test_sets.py``; tasks, loaders
off the loop and the two forms over one cache in ``tests/core/test_sets_async.py``;
real servers in ``test_sets_server.py``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from django_mcpatterns.core.exceptions import (
    CollectionTooLargeError,
    EncodingError,
    IncompleteSetError,
    InvalidKeyError,
    OutcomeUnknownError,
)
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.sets import (
    SHARD_TTL_MARGIN,
    AppendLists,
    AppendSets,
    SetOptions,
    shard_key,
)
from django_mcpatterns.core.sets._model_layout import (
    ADD,
    SET,
    Header,
    Member,
    base_record,
    encode_snapshot,
    read_header,
    set_records,
)
from tests.fakes import CountingStore, FakeClock
from tests.twins import face

ITEM = 4096
SMALL = SetOptions(item_size_max=ITEM, headroom=64, compact_min_bytes=256, max_shards=64)


@pytest.fixture
def memory() -> MemoryStore:
    return MemoryStore(max_item_size=ITEM)


@pytest.fixture
def store(memory: MemoryStore) -> CountingStore:
    return CountingStore(memory)


@pytest.fixture
def sets(store: CountingStore) -> AppendSets:
    return AppendSets(face(store), SMALL, rng=random.Random(7))


@pytest.fixture
def other(memory: MemoryStore) -> AppendSets:
    """Another client of the same store (uncounted, no hooks)."""
    return AppendSets(memory, SMALL, rng=random.Random(8))


def big_members(count: int, prefix: str = "member") -> set[Member]:
    return {f"{prefix}-{i:05d}" for i in range(count)}


# -- the model ----------------------------------------------------------------------


# -- steady-state round trips (one Store call = one request) --------------------------


def test_writes_are_one_append_whatever_the_number_of_members(
    sets: AppendSets, store: CountingStore
) -> None:
    sets.sadd("k", "first")
    store.reset()
    assert sets.sadd("k", *range(100)) == 100
    assert sets.srem("k", *range(50)) == 50
    assert sets.sadd("k", "one") == 1
    assert store.calls == {"append": 3}


def test_reads_are_one_gets(sets: AppendSets, store: CountingStore) -> None:
    sets.sadd("k", *range(20))
    store.reset()
    assert sets.smembers("k") == set(range(20))
    assert sets.sismember("k", 3) is True
    assert sets.smismember("k", 3, 99) == [True, False]
    assert sets.scard("k") == 20
    assert sets.srandmember("k") in range(20)
    assert store.calls == {"gets_ttl": 5}


def test_creating_a_set_is_append_then_add(sets: AppendSets, store: CountingStore) -> None:
    assert sets.sadd("new", "a", "b") == 2
    assert [name for name, _ in store.log] == ["append", "add"]
    assert sets.smembers("new") == {"a", "b"}


def test_a_lost_creation_race_appends_again_and_loses_nothing(
    sets: AppendSets, store: CountingStore, other: AppendSets
) -> None:
    store.before("add", lambda: other.sadd("new", "theirs"))
    sets.sadd("new", "mine")
    assert [name for name, _ in store.log] == ["append", "add", "append"]
    assert other.smembers("new") == {"mine", "theirs"}


def test_removing_from_a_missing_set_creates_nothing(
    sets: AppendSets, store: CountingStore, memory: MemoryStore
) -> None:
    assert sets.srem("missing", "a") == 1
    assert memory.get("missing") is None
    assert [name for name, _ in store.log] == ["append", "gets_ttl"]
    assert sets.smembers("missing") == set()
    assert sets.scard("missing") == 0
    assert sets.spop("missing") is None
    assert sets.srandmember("missing", 3) == []


def test_empty_writes_do_nothing(sets: AppendSets, store: CountingStore) -> None:
    assert sets.sadd("k") == 0
    assert sets.srem("k") == 0
    assert store.requests == 0


def test_return_values_count_distinct_members_written(sets: AppendSets) -> None:
    assert sets.sadd("k", "a", "a", b"a", 1) == 3
    assert sets.sadd("k", "a") == 1  # Redis would say 0: knowing costs a read
    assert sets.srem("k", "zzz") == 1


# -- compaction ----------------------------------------------------------------------


def churn(sets: AppendSets, key: str, rounds: int) -> None:
    for i in range(rounds):
        sets.sadd(key, f"tmp{i}")
        sets.srem(key, f"tmp{i}")


def test_a_dirty_set_is_compacted_by_a_read_with_gets_ttl_and_cas(
    sets: AppendSets, store: CountingStore, memory: MemoryStore
) -> None:
    sets.sadd("k", "keep")
    churn(sets, "k", 40)
    dirty = len(memory.get("k"))
    store.reset()
    assert sets.smembers("k") == {"keep"}
    assert store.calls == {"gets_ttl": 1, "cas": 1}  # the TTL read with the value: kept by the cas
    assert len(memory.get("k")) < dirty / 5
    store.reset()
    assert sets.smembers("k") == {"keep"}
    assert store.calls == {"gets_ttl": 1}  # clean again: no more cas


def test_a_clean_set_is_not_compacted(sets: AppendSets, store: CountingStore) -> None:
    sets.sadd("k", *range(30))
    sets.smembers("k")
    store.reset()
    for _ in range(3):
        sets.smembers("k")
    assert store.calls == {"gets_ttl": 3}


def test_compaction_carries_appends_that_raced_it(
    sets: AppendSets, store: CountingStore, other: AppendSets
) -> None:
    sets.sadd("k", "keep")
    churn(sets, "k", 40)
    store.before("cas", lambda: other.sadd("k", "late"))
    store.before("cas", lambda: other.srem("k", "keep"))
    store.reset()
    assert sets.smembers("k") == {"keep"}  # what it read
    assert store.calls == {"gets_ttl": 1, "gets": 2, "cas": 3}  # two lost races, carried
    assert other.smembers("k") == {"late"}


def test_compaction_gives_way_to_another_rewrite(
    sets: AppendSets, store: CountingStore, other: AppendSets, memory: MemoryStore
) -> None:
    sets.sadd("k", "keep")
    churn(sets, "k", 40)
    store.before("cas", lambda: other.compact("k"))
    assert sets.smembers("k") == {"keep"}
    assert store.calls["cas"] == 1  # lost, and did not overwrite the other rewrite
    assert other.smembers("k") == {"keep"}


def test_compaction_on_writes(memory: MemoryStore) -> None:
    store = CountingStore(memory)
    options = SetOptions(
        item_size_max=ITEM, headroom=64, compact_min_bytes=256, compact_on_write=1.0
    )
    sets = AppendSets(face(store), options)
    sets.sadd("k", "keep")
    for i in range(60):
        sets.sadd("k", f"tmp{i}")
        sets.srem("k", f"tmp{i}")
    assert store.calls["cas"] >= 1  # compacted without any read by the caller
    assert len(memory.get("k")) < 1024
    assert sets.smembers("k") == {"keep"}


# -- size: full items, shards ------------------------------------------------------------


def test_a_full_set_is_compacted_with_the_write_folded_in(
    sets: AppendSets, store: CountingStore, memory: MemoryStore
) -> None:
    sets.sadd("k", "keep")
    while len(memory.get("k")) < ITEM - 300:  # fill with churn, never read
        churn(sets, "k", 1)
    sets.sadd("k", *[f"x{i}" for i in range(30)])
    assert sets.smembers("k") == {"keep"} | {f"x{i}" for i in range(30)}
    assert store.calls["cas"] >= 1


def test_a_large_set_spills_into_shards(
    sets: AppendSets, store: CountingStore, memory: MemoryStore
) -> None:
    members = big_members(3000)
    sets.sadd("big", *members)
    header = read_header(memory.get("big"), SET)
    assert header.shards > 1
    keys = [shard_key(b"big", header.generation, i) for i in range(header.shards)]
    assert all(memory.get(key) is not None for key in keys)
    assert sets.smembers("big") == members
    store.reset()
    assert sets.scard("big") == 3000
    assert store.calls == {"gets_many": 1}  # root and every shard in one multi-get
    [(_, keys)] = store.log
    assert len(keys) == 1 + header.shards


def test_membership_of_a_sharded_set_reads_only_its_shards(
    sets: AppendSets, store: CountingStore
) -> None:
    sets.sadd("big", *big_members(3000))
    sets.smembers("big")
    store.reset()
    assert sets.smismember("big", "member-00001", "nope") == [True, False]
    [(name, keys)] = store.log
    assert name == "gets_many"
    assert len(keys) == 3  # the root and at most two shards


def test_writes_to_a_sharded_set_stay_one_append(sets: AppendSets, store: CountingStore) -> None:
    members = big_members(3000)
    sets.sadd("big", *members)
    store.reset()
    sets.sadd("big", "extra")
    sets.srem("big", "member-00000")
    assert store.calls == {"append": 2}
    assert sets.smembers("big") == (members | {"extra"}) - {"member-00000"}


def test_a_sharded_set_keeps_growing_and_shrinks_back(
    sets: AppendSets, other: AppendSets, memory: MemoryStore
) -> None:
    model: set[Member] = set()
    for batch in range(6):
        new = big_members(800, prefix=f"b{batch}")
        sets.sadd("big", *new)
        model |= new
        assert other.smembers("big") == model
    assert read_header(memory.get("big"), SET).shards > 1
    for member in list(model)[:-10]:
        model.discard(member)
    sets.srem("big", *(big_members(4800) - model))
    for batch in range(6):
        sets.srem("big", *(big_members(800, prefix=f"b{batch}") - model))
    assert other.smembers("big") == model
    other.compact("big")
    assert read_header(memory.get("big"), SET).shards == 0  # back in the root
    assert sets.smembers("big") == model


def test_old_shards_are_deleted_after_a_rewrite(sets: AppendSets, memory: MemoryStore) -> None:
    sets.sadd("big", *big_members(3000))
    old = read_header(memory.get("big"), SET)
    sets.compact("big")
    new = read_header(memory.get("big"), SET)
    assert new.generation != old.generation
    assert all(memory.get(shard_key(b"big", old.generation, i)) is None for i in range(old.shards))


@dataclass
class Loss:
    """How many ``cas`` replies to lose, and whether those ``cas`` are applied."""

    count: int = 0
    applied: bool = True


class LostReplies:
    """A MemoryStore whose ``cas`` replies get lost, reported as a Cluster reports them.

    The strict view raises :class:`OutcomeUnknownError`, the default view
    answers ``False``.  Settling an unknown outcome is our logic, not
    memcached's; the real-server drill is ``tests/drills/test_outcomes.py``.
    """

    def __init__(self, memory: MemoryStore, loss: Loss, *, strict: bool = False) -> None:
        self.memory, self.loss, self.is_strict = memory, loss, strict

    def __getattr__(self, name: str) -> Any:
        return getattr(self.memory, name)

    def strict(self) -> LostReplies:
        return LostReplies(self.memory, self.loss, strict=True)

    def cas(self, key: Any, value: Any, cas: Any, expire: int = 0) -> bool | None:
        if not self.loss.count:
            return self.memory.cas(key, value, cas, expire)
        self.loss.count -= 1
        if self.loss.applied:
            self.memory.cas(key, value, cas, expire)
        if self.is_strict:
            raise OutcomeUnknownError("reply lost", node="memory")
        return False


def test_a_rewrite_settles_a_lost_cas_reply_by_reading_again(memory: MemoryStore) -> None:
    loss = Loss()
    sets = AppendSets(face(LostReplies(memory, loss)), SMALL, rng=random.Random(7))
    expected = big_members(3000)
    sets.sadd("big", *expected)

    def generation() -> list[bytes]:
        header = read_header(memory.get("big"), SET)
        assert header.shards
        return [shard_key(b"big", header.generation, i) for i in range(header.shards)]

    for applied in (True, False):  # the cas was applied (only its reply lost), or not
        old = generation()
        sets.sadd("big", f"late-{applied}")
        expected.add(f"late-{applied}")
        loss.count, loss.applied = 1, applied
        assert sets.compact("big")  # applied: it says so; not applied: retried
        assert loss.count == 0
        assert sets.smembers("big") == expected
        assert memory.get_many(old) == {}  # certain: the old generation is deleted
        assert len(memory.get_many(generation())) > 0


def test_a_reader_with_a_stale_layout_still_reads_the_set(
    sets: AppendSets, other: AppendSets, store: CountingStore
) -> None:
    sets.sadd("big", *big_members(3000))
    assert sets.scard("big") == 3000  # remembers the layout
    other.sadd("big", *big_members(2000, prefix="more"))
    other.compact("big")  # a new shard generation
    store.reset()
    assert sets.scard("big") == 5000
    assert store.calls == {"gets_many": 1, "get_many": 1}  # root + stale guess, then the shards


def test_a_set_past_max_shards_raises_and_stores_nothing_of_the_write(
    memory: MemoryStore,
) -> None:
    options = SetOptions(item_size_max=ITEM, headroom=64, max_shards=4)
    sets = AppendSets(face(memory), options)
    sets.sadd("k", *big_members(200))
    with pytest.raises(CollectionTooLargeError, match="max_shards=4"):
        sets.sadd("k", *big_members(5000, prefix="too-many"))
    assert sets.smembers("k") == big_members(200)


def test_a_member_larger_than_an_item_raises(sets: AppendSets) -> None:
    with pytest.raises(CollectionTooLargeError):
        sets.sadd("k", "x" * (2 * ITEM))
    assert sets.smembers("k") == set()


def test_a_lost_shard_raises_once_and_resets_the_set(sets: AppendSets, memory: MemoryStore) -> None:
    sets.sadd("big", *big_members(3000))
    header = read_header(memory.get("big"), SET)
    memory.delete(shard_key(b"big", header.generation, 0))  # evicted
    with pytest.raises(IncompleteSetError, match="lost a shard"):
        sets.smembers("big")
    assert read_header(memory.get("big"), SET).shards == 0  # reset to an empty set
    assert sets.smembers("big") == set()
    sets.sadd("big", "again")
    assert sets.smembers("big") == {"again"}


def test_algebra_over_a_set_that_lost_a_shard_raises(sets: AppendSets, memory: MemoryStore) -> None:
    sets.sadd("big", *big_members(3000))
    sets.sadd("small", "member-00001")
    header = read_header(memory.get("big"), SET)
    memory.delete(shard_key(b"big", header.generation, 0))
    with pytest.raises(IncompleteSetError):
        sets.sinter("small", "big")
    assert sets.sinter("small", "big") == set()


def test_a_rewrite_between_root_and_shard_reads_is_not_a_lost_shard(
    store: CountingStore, memory: MemoryStore, other: AppendSets
) -> None:
    members = big_members(3000)
    other.sadd("big", *members)
    reader = AppendSets(face(store), SMALL)  # knows no layout yet
    store.before("get_many", lambda: other.compact("big"))  # old shards deleted under it
    assert reader.smembers("big") == members
    assert [name for name, _ in store.log] == ["gets_ttl", "get_many", "gets_ttl", "get_many"]
    assert other.smembers("big") == members


def test_a_lost_shard_of_a_loader_backed_set_is_rebuilt(
    sets: AppendSets, memory: MemoryStore
) -> None:
    members = big_members(3000)
    sets.sadd("big", *members)
    header = read_header(memory.get("big"), SET)
    memory.delete(shard_key(b"big", header.generation, 1))
    assert sets.smembers("big", loader=lambda: members) == members
    assert sets.smembers("big") == members


def test_long_keys_shard_too(memory: MemoryStore) -> None:
    sets = AppendSets(face(memory), SMALL)
    key = "k" * 250
    sets.sadd(key, *big_members(3000))
    assert sets.scard(key) == 3000


# -- pop and move -----------------------------------------------------------------


def test_concurrent_pops_never_return_the_same_member(
    sets: AppendSets, store: CountingStore, other: AppendSets
) -> None:
    sets.sadd("k", *range(10))
    sets.smembers("k")
    seen: list[Any] = []
    store.before("cas", lambda: seen.append(other.spop("k")))
    mine = sets.spop("k")
    assert len(seen) == 1
    assert mine != seen[0]
    assert sets.smembers("k") == set(range(10)) - {mine, seen[0]}


def test_a_pop_carries_unrelated_appends(
    sets: AppendSets, store: CountingStore, other: AppendSets
) -> None:
    sets.sadd("k", "only")
    store.before("cas", lambda: other.sadd("k", "unrelated"))
    assert sets.spop("k") == "only"
    assert store.calls["cas"] == 2
    assert sets.smembers("k") == {"unrelated"}


def test_a_pop_retries_when_its_member_was_touched(
    sets: AppendSets, store: CountingStore, other: AppendSets
) -> None:
    sets.sadd("k", "a")
    store.before("cas", lambda: other.srem("k", "a"))
    assert sets.spop("k") is None  # "a" was removed under it: the retry sees an empty set


def test_pop_and_random_member_counts(sets: AppendSets) -> None:
    sets.sadd("k", *range(5))
    assert sets.spop("k", 0) == set()
    assert sets.srandmember("k", 0) == []
    assert len(sets.srandmember("k", 3)) == 3  # type: ignore[arg-type]
    assert len(set(sets.srandmember("k", 10))) == 5  # type: ignore[arg-type]
    assert len(sets.srandmember("k", -8)) == 8  # type: ignore[arg-type]  # repeats allowed
    assert sets.spop("k", 10) == set(range(5))
    with pytest.raises(ValueError, match="negative"):
        sets.spop("k", -1)


def test_smove(sets: AppendSets, store: CountingStore) -> None:
    sets.sadd("src", "a", "b")
    store.reset()
    assert sets.smove("src", "dst", "a") is True
    assert [name for name, _ in store.log] == ["gets_ttl", "append", "add", "append"]
    assert sets.smove("src", "dst", "zzz") is False
    assert sets.smembers("src") == {"b"}
    assert sets.smembers("dst") == {"a"}


def test_smove_refuses_a_bad_destination_even_for_an_absent_member(
    sets: AppendSets, store: CountingStore
) -> None:
    sets.sadd("src", "a")
    store.reset()
    for bad in ("bad key", "k" * 251, ""):
        with pytest.raises(InvalidKeyError):
            sets.smove("src", bad, "absent")
    assert store.requests == 0  # refused before anything was read


def test_smove_adds_before_it_removes(sets: AppendSets, store: CountingStore) -> None:
    sets.sadd("src", "a")
    sets.sadd("dst", "x")
    store.reset()
    sets.smove("src", "dst", "a")
    appends = [key for name, key in store.log if name == "append"]
    assert appends == [b"dst", b"src"]  # a crash in between leaves "a" in both, not in neither


# -- loaders (eviction) ------------------------------------------------------------------


class Database:
    """The source of truth of a loader-backed set; writers commit here first."""

    def __init__(self, members: Iterable[Member]) -> None:
        self.members = set(members)
        self.loads = 0

    def load(self) -> set[Member]:
        self.loads += 1
        return set(self.members)


def test_a_missed_loader_backed_set_is_built_once(sets: AppendSets, store: CountingStore) -> None:
    db = Database({1, 2, 3})
    assert sets.smembers("k", loader=db.load) == {1, 2, 3}
    assert [name for name, _ in store.log] == ["gets_ttl", "add", "append"]
    store.reset()
    assert sets.smembers("k", loader=db.load) == {1, 2, 3}
    assert sets.sismember("k", 2, loader=db.load)
    assert db.loads == 1
    assert store.calls == {"gets_ttl": 2}


def test_writers_never_create_a_loader_backed_set(sets: AppendSets, memory: MemoryStore) -> None:
    db = Database({1, 2, 3})
    db.members.add(4)
    sets.sadd("k", 4, loader=db.load)
    assert memory.get("k") is None  # a set of {4} would look complete
    assert sets.smembers("k", loader=db.load) == {1, 2, 3, 4}


def test_writes_during_a_load_are_kept(
    sets: AppendSets, store: CountingStore, other: AppendSets
) -> None:
    db = Database({1, 2, 3})

    def write(add: Member | None = None, remove: Member | None = None) -> None:
        if add is not None:
            db.members.add(add)
            other.sadd("k", add, loader=db.load)
        if remove is not None:
            db.members.discard(remove)
            other.srem("k", remove, loader=db.load)

    def loader() -> set[Member]:
        write(add=10, remove=1)  # committed before the snapshot
        snapshot = db.load()
        store.before("append", lambda: write(add=11, remove=2))  # after it
        return snapshot

    assert sets.smembers("k", loader=loader) == {2, 3, 10}  # the snapshot, as loaded
    assert other.smembers("k") == db.members == {3, 10, 11}


def test_a_pending_set_is_not_read_as_complete(
    sets: AppendSets, store: CountingStore, other: AppendSets
) -> None:
    db = Database({1, 2})
    observed: list[Any] = []

    def loader() -> set[Member]:
        with pytest.raises(IncompleteSetError, match="loader"):
            other.smembers("k")  # no loader: must not see {} or a partial set
        observed.append(other.smembers("k", loader=db.load))  # another reader loads too
        return db.load()

    assert sets.smembers("k", loader=loader) == {1, 2}
    assert observed == [{1, 2}]
    assert other.smembers("k") == {1, 2}


def test_a_loader_snapshot_of_another_incarnation_is_ignored(
    sets: AppendSets, memory: MemoryStore
) -> None:
    pending = Header(SET, b"current!", pending=True)
    stale = base_record(b"previous", encode_snapshot({"stale"}))
    memory.set("k", pending.pack() + set_records(ADD, ["logged"]) + stale)
    with pytest.raises(IncompleteSetError):
        sets.smembers("k")
    assert sets.smembers("k", loader=lambda: {"fresh"}) == {"fresh"}
    assert sets.smembers("k") == {"logged", "fresh"}


def test_a_huge_loader_snapshot_is_sharded(sets: AppendSets, memory: MemoryStore) -> None:
    members = big_members(3000)
    assert sets.smembers("k", loader=lambda: members) == members
    assert read_header(memory.get("k"), SET).shards > 1
    assert sets.smembers("k") == members


def test_pop_from_a_missed_loader_backed_set(sets: AppendSets) -> None:
    popped = sets.spop("k", 2, loader=lambda: {1, 2, 3})
    assert isinstance(popped, set)
    assert len(popped) == 2
    assert sets.smembers("k") == {1, 2, 3} - popped


def test_loaders_must_return_members(sets: AppendSets) -> None:
    with pytest.raises(TypeError, match="str, bytes or int"):
        sets.smembers("k", loader=lambda: [1.5])


# -- timeouts ------------------------------------------------------------------------


class NoTtlStore(CountingStore):
    """A store that cannot tell an item's TTL (``ttl`` answers None, as for a missing item)."""

    def ttl(self, key: Any) -> int | None:
        return None

    def gets_ttl(self, key: Any) -> tuple[Any, Any, int | None]:
        return (*self.inner.gets(key), None)


def dirty_and_compact(sets: AppendSets, key: str) -> None:
    churn(sets, key, 40)
    assert sets.compact(key)


def test_a_set_keeps_its_creation_timeout_through_compaction() -> None:
    clock = FakeClock()
    memory = MemoryStore(max_item_size=ITEM, clock=clock)
    sets = AppendSets(face(memory), SMALL, clock=clock)
    sets.sadd("k", "a", expire=10)
    clock.now += 6
    dirty_and_compact(sets, "k")  # a rewrite sets a new exptime: the remaining 4 s
    clock.now += 3.5
    assert sets.smembers("k") == {"a"}
    clock.now += 1
    assert sets.smembers("k") == set()


def test_shards_of_an_expiring_set_expire_with_it() -> None:
    clock = FakeClock()
    memory = MemoryStore(max_item_size=ITEM, clock=clock)
    sets = AppendSets(face(memory), SMALL, clock=clock)
    sets.sadd("k", *range(2000), expire=100)
    header = read_header(memory.get("k"), SET)
    assert header.shards
    keys = [shard_key(b"k", header.generation, i) for i in range(header.shards)]
    assert {memory.ttl(key) for key in keys} == {100 + SHARD_TTL_MARGIN}
    memory.delete("k")
    clock.now += 100 + SHARD_TTL_MARGIN + 1
    assert memory.get_many(keys) == {}


def test_a_touched_set_keeps_its_new_timeout_through_rewrites() -> None:
    # A rewrite is a cas, which sets a new TTL: the store's ttl() gives the item's own.
    clock = FakeClock()
    memory = MemoryStore(max_item_size=ITEM, clock=clock)
    sets = AppendSets(face(memory), SMALL, clock=clock)
    sets.sadd("k", *"abc", expire=10)
    memory.touch("k", 100)
    clock.now += 20
    dirty_and_compact(sets, "k")
    assert sets.spop("k") in set("abc")  # a rewrite too
    clock.now += 70
    assert len(sets.smembers("k")) == 2
    assert memory.ttl("k") == 10
    clock.now += 10
    assert sets.smembers("k") == set()
    # A set made to live for ever keeps doing so.
    sets.sadd("j", "a", expire=10)
    memory.touch("j", 0)
    clock.now += 20
    dirty_and_compact(sets, "j")
    assert memory.ttl("j") == -1


def test_a_store_that_cannot_tell_the_ttl_gets_the_recorded_expiry() -> None:
    clock = FakeClock()
    memory = MemoryStore(max_item_size=ITEM, clock=clock)
    sets = AppendSets(face(NoTtlStore(memory)), SMALL, clock=clock)
    sets.sadd("k", "a", expire=10)
    memory.touch("k", 100)
    clock.now += 5
    dirty_and_compact(sets, "k")  # back to the recorded expiry (5 s left)
    clock.now += 6
    assert sets.smembers("k") == set()
    # Past the recorded expiry, a touched set gets its creation timeout again.
    sets.sadd("j", "a", expire=10)
    memory.touch("j", 100)
    clock.now += 30
    dirty_and_compact(sets, "j")
    clock.now += 9
    assert sets.smembers("j") == {"a"}
    clock.now += 2
    assert sets.smembers("j") == set()


def test_absolute_expiry_over_thirty_days_survives_a_rewrite() -> None:
    clock = FakeClock()
    memory = MemoryStore(max_item_size=ITEM, clock=clock)
    sets = AppendSets(face(memory), SMALL, clock=clock)
    sixty_days = 60 * 24 * 3600
    sets.sadd("k", "a", expire=int(clock.now) + sixty_days)  # memcached: a Unix time
    clock.now += 10
    dirty_and_compact(sets, "k")
    assert memory.ttl("k") == sixty_days - 10
    assert sets.smembers("k") == {"a"}


def test_timeouts_apply_at_creation_only() -> None:
    clock = FakeClock()
    memory = MemoryStore(max_item_size=ITEM, clock=clock)
    sets = AppendSets(face(memory), SMALL, clock=clock)
    sets.sadd("k", "a", expire=10)
    clock.now += 8
    sets.sadd("k", "b", expire=100)  # an append keeps the item's TTL
    clock.now += 3
    assert sets.smembers("k") == set()


# -- errors and options --------------------------------------------------------------


def test_a_value_that_is_not_a_set_raises_encoding_error(
    sets: AppendSets, memory: MemoryStore
) -> None:
    memory.set("k", {"a pickled": "dict"})
    with pytest.raises(EncodingError):
        sets.smembers("k")
    memory.set("k", b"+sa\n")
    with pytest.raises(EncodingError):
        sets.smembers("k")
    with pytest.raises(EncodingError):
        sets.sunion("k")


def test_a_list_is_not_a_set(sets: AppendSets, memory: MemoryStore) -> None:
    AppendLists(memory, SMALL).rpush("k", "a")
    with pytest.raises(EncodingError):
        sets.smembers("k")


def test_list_round_trips(memory: MemoryStore) -> None:
    store = CountingStore(memory)
    lists = AppendLists(face(store), SMALL)
    assert lists.rpush("l", "a", "b", "c") == 3
    assert [name for name, _ in store.log] == ["append", "add"]
    store.reset()
    lists.rpush("l", "d")
    assert lists.lrem("l", 1, "a") == 1
    assert lists.lrange("l", 0, -1) == ["b", "c", "d"]
    assert lists.llen("l") == 3
    assert store.calls == {"append": 1, "prepend": 1, "gets_ttl": 2}


def test_lrem_prepends_and_hides_only_older_values(memory: MemoryStore) -> None:
    lists = AppendLists(face(memory), SMALL)
    lists.rpush("l", "x", "y", "x")
    lists.lrem("l", 0, "x")
    assert memory.get("l").startswith(b"-")  # the blacklist comes first
    lists.rpush("l", "x")  # pushed after the removal: visible
    assert lists.lrange("l", 0, -1) == ["y", "x"]
    assert lists.lrem("missing", 0, "x") == 0


def test_lrange_indexes_like_redis(memory: MemoryStore) -> None:
    lists = AppendLists(face(memory), SMALL)
    lists.rpush("l", *range(5))
    assert lists.lrange("l", 1, 3) == [1, 2, 3]
    assert lists.lrange("l", -2, -1) == [3, 4]
    assert lists.lrange("l", 0, 100) == [0, 1, 2, 3, 4]
    assert lists.lrange("l", 3, 1) == []
    assert lists.lrange("l", -100, 0) == [0]
    assert lists.lrange("missing", 0, -1) == []


def test_a_list_is_compacted_and_keeps_concurrent_pushes_and_removals(
    memory: MemoryStore,
) -> None:
    store = CountingStore(memory)
    lists = AppendLists(face(store), SMALL)
    other = AppendLists(memory, SMALL)
    lists.rpush("l", "keep")
    for i in range(40):
        lists.rpush("l", f"t{i}")
        lists.lrem("l", 0, f"t{i}")
    store.before("cas", lambda: other.rpush("l", "late"))
    store.before("cas", lambda: other.lrem("l", 0, "keep"))
    assert lists.lrange("l", 0, -1) == ["keep"]
    assert store.calls["cas"] == 3
    assert other.lrange("l", 0, -1) == ["late"]
    assert len(memory.get("l")) < 200


def test_a_list_that_outgrows_an_item_raises(memory: MemoryStore) -> None:
    lists = AppendLists(face(memory), SMALL)
    lists.rpush("l", "first")
    pushed = 1
    while len(memory.get("l")) < ITEM - 400:
        lists.rpush("l", f"value-{pushed}")
        pushed += 1
    with pytest.raises(CollectionTooLargeError, match="lists do not shard"):
        lists.rpush("l", *[f"more-{i}" for i in range(40)])
    assert lists.lrange("l", 0, 0) == ["first"]
    assert lists.llen("l") == pushed  # nothing of the refused push, nothing lost


def test_list_timeouts_apply_at_creation() -> None:
    clock = FakeClock()
    memory = MemoryStore(max_item_size=ITEM, clock=clock)
    lists = AppendLists(face(memory), SMALL, clock=clock)
    lists.rpush("l", "a", expire=10)
    clock.now += 8
    lists.rpush("l", "b", expire=100)
    assert lists.llen("l") == 2
    clock.now += 3
    assert lists.llen("l") == 0
