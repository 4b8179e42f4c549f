"""Append-based sets and lists (core/sets/): the models, and what does not depend on the form.

The algorithm's behaviour (round trips, compaction, shards, pops, loaders, timeouts,
lists) is tested once for both forms, in asyncio, by
``tests/core/patterns/_async/test_sets.py`` (its sync form generated beside it).
Here: any sequence of operations agrees with a Python model (hypothesis: sets,
algebra, Redis's lists), and the pure parts (shard keys and expiries, options).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from django_mcpatterns.core.exceptions import ConfigurationError
from django_mcpatterns.core.keys import key_bytes
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.sets import (
    SHARD_TTL_MARGIN,
    AppendLists,
    AppendSets,
    SetOptions,
    shard_key,
)
from django_mcpatterns.core.sets._model_layout import Member
from django_mcpatterns.core.sets._model_shards import shard_expire
from django_mcpatterns.core.store import MAX_RELATIVE_EXPIRE
from tests.core.patterns._sync.test_sets import ITEM, SMALL, big_members
from tests.fakes import START, FakeClock

members_st = st.one_of(
    st.text(st.sampled_from("ab\n\x10+-= é"), max_size=6),
    st.binary(max_size=6),
    st.integers(-1000, 1000),
)


def typed(members: Iterable[Member]) -> set[tuple[type, Member]]:
    return {(type(m), m) for m in members}


class SetModel(RuleBasedStateMachine):
    """Any sequence of set operations agrees with a Python set, types included."""

    def __init__(self) -> None:
        super().__init__()
        self.memory = MemoryStore(max_item_size=ITEM)
        self.sets = AppendSets(self.memory, SMALL, rng=random.Random(1))
        self.other = AppendSets(self.memory, SMALL, rng=random.Random(2))
        self.model: set[Member] = set()

    @rule(members=st.lists(members_st, max_size=25))
    def sadd(self, members: list[Member]) -> None:
        assert self.sets.sadd("k", *members) == len(set(typed(members)))
        self.model.update(members)

    @rule(members=st.lists(members_st, max_size=25))
    def srem(self, members: list[Member]) -> None:
        self.other.srem("k", *members)
        self.model.difference_update(members)

    @rule(count=st.none() | st.integers(0, 4))
    def spop(self, count: int | None) -> None:
        popped = self.sets.spop("k", count)
        if count is None:
            if popped is None:
                assert not self.model
            else:
                assert popped in self.model
                self.model.discard(popped)  # type: ignore[arg-type]
        else:
            assert isinstance(popped, set)
            assert len(popped) == min(count, len(self.model))
            assert popped <= self.model
            self.model -= popped

    @rule()
    def compact(self) -> None:
        self.other.compact("k")

    @rule(member=members_st)
    def sismember(self, member: Member) -> None:
        assert self.sets.sismember("k", member) == (member in self.model)

    @precondition(lambda self: len(self.model) < 400)
    @rule(count=st.integers(50, 200))
    def grow(self, count: int) -> None:
        bulk = big_members(count, prefix=f"bulk{len(self.model)}")
        self.sets.sadd("k", *bulk)
        self.model |= bulk

    @invariant()
    def same_members(self) -> None:
        got = self.sets.smembers("k")
        assert typed(got) == typed(self.model)
        assert self.other.scard("k") == len(self.model)


TestSetModel = SetModel.TestCase
TestSetModel.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sets(members_st, max_size=12), min_size=1, max_size=4))
def test_algebra_matches_python_sets(groups: list[set[Member]]) -> None:
    sets = AppendSets(MemoryStore(max_item_size=ITEM), SMALL)
    keys = [f"s{i}" for i in range(len(groups))]
    for key, group in zip(keys, groups, strict=True):
        sets.sadd(key, *group)
    expected_union = set().union(*groups)
    assert typed(sets.sunion(*keys, "missing")) == typed(expected_union)
    assert typed(sets.sinter(*keys)) == typed(groups[0].intersection(*groups[1:]))
    assert typed(sets.sdiff(*keys)) == typed(groups[0].difference(*groups[1:]))
    assert sets.sinter(*keys, "missing") == set()
    assert sets.sunionstore("dest", *keys) == len(expected_union)
    assert typed(sets.smembers("dest")) == typed(expected_union)
    assert sets.sdiffstore("dest", keys[0], keys[0]) == 0
    assert sets.smembers("dest") == set()


def test_shard_keys_stay_valid_memcached_keys() -> None:
    for root in (b"k", b"k" * 250, "ключ".encode() * 40):
        for index in (0, 255):
            key = shard_key(root, b"\xff" * 8, index)
            assert key_bytes(key) == key
            assert len(key) <= 250


@pytest.mark.parametrize(
    ("root", "shards"),
    [
        (0, 0),  # a root that never expires
        (-1, -1),  # one that expires at once
        (300, 300 + SHARD_TTL_MARGIN),
        # Past memcached's 30-day relative limit the exptime must become a Unix time.
        (MAX_RELATIVE_EXPIRE, int(START) + MAX_RELATIVE_EXPIRE + SHARD_TTL_MARGIN),
        (int(START) + 10**8, int(START) + 10**8 + SHARD_TTL_MARGIN),  # absolute already
    ],
)
def test_shards_expire_a_margin_after_their_root(root: int, shards: int) -> None:
    assert shard_expire(root, START) == shards


@pytest.mark.parametrize(
    "options",
    [
        {"item_size_max": 1000},
        {"headroom": -1},
        {"compact_ratio": -0.1},
        {"compact_on_write": 1.5},
        {"max_shards": 0},
        {"attempts": 0},
    ],
    ids=repr,
)
def test_invalid_options_raise_configuration_error(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError) as info:
        SetOptions(**options)
    assert info.value.option == next(iter(options))


def test_options_follow_the_memory_store_item_limit() -> None:
    assert SetOptions.for_store(MemoryStore(max_item_size=64 * 1024)).item_size_max == 64 * 1024
    assert SetOptions.for_store(MemoryStore()).item_size_max == 1024 * 1024


# -- lists ---------------------------------------------------------------------------

list_ops = st.lists(
    st.one_of(
        st.tuples(st.just("rpush"), st.lists(st.sampled_from(["a", "b", b"a", 1]), max_size=4)),
        st.tuples(st.just("lrem"), st.integers(-2, 2), st.sampled_from(["a", "b", b"a", 1])),
        st.tuples(st.just("compact")),
    ),
    max_size=30,
)


def redis_lrem(model: list[Member], count: int, value: Member) -> None:
    hits = [i for i, v in enumerate(model) if type(v) is type(value) and v == value]
    hits = hits[:count] if count > 0 else hits[count:] if count < 0 else hits
    for i in reversed(hits):
        del model[i]


@settings(max_examples=60, deadline=None)
@given(list_ops)
def test_lists_match_redis_semantics(ops: list[tuple[Any, ...]]) -> None:
    clock = FakeClock()
    memory = MemoryStore(max_item_size=ITEM, clock=clock)
    lists = AppendLists(memory, SMALL, clock=clock)
    other = AppendLists(memory, SMALL, clock=clock)
    model: list[Member] = []
    for op, *args in ops:
        clock.now += 0.001
        if op == "rpush":
            lists.rpush("l", *args[0])
            model += args[0]
        elif op == "lrem":
            other.lrem("l", *args)
            redis_lrem(model, *args)
        else:
            assert other.lrange("l", 0, -1) == model  # a read may compact
    got = lists.lrange("l", 0, -1)
    assert [(type(v), v) for v in got] == [(type(v), v) for v in model]
    assert lists.llen("l") == len(model)
