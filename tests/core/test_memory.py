"""MemoryStore only: TTL boundaries on a fake clock, eviction, threads, the registry.

What every Store must do is proven against real memcached in
``test_store_contract.py``; here are the parts a server cannot show
deterministically (time, memory pressure, interleavings).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymemcache.serde import CompressedSerde

from django_mcpatterns.core.exceptions import ConfigurationError, ValueTooLargeError
from django_mcpatterns.core.memory import (
    ITEM_OVERHEAD,
    MAX_COUNTER,
    MemoryStore,
    item_size,
    memory_options,
    parse_counter,
    reset_shared_memory_stores,
    shared_memory_store,
)
from django_mcpatterns.core.store import MAX_RELATIVE_EXPIRE
from tests.fakes import START, FakeClock

DAY = 24 * 60 * 60


def run_threads(count: int, target: Callable[[int], object]) -> list[object]:
    """Run ``target(i)`` in ``count`` threads released together; return the results."""
    barrier = threading.Barrier(count)
    results: list[object] = [None] * count

    def run(index: int) -> None:
        barrier.wait()
        results[index] = target(index)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


# -- time: memcached's whole-second clock ------------------------------------------


@pytest.mark.parametrize(
    ("stored_at", "lifetime"),
    [(0.0, 10.0), (0.25, 9.75), (0.999, 9.001)],
)
def test_relative_ttl_ends_on_the_whole_second(
    store: MemoryStore, clock: FakeClock, stored_at: float, lifetime: float
) -> None:
    # Like memcached: expire=10 stored at 100.25 is gone when the clock reads 110.
    clock.advance(stored_at)
    store.set("k", 1, expire=10)
    clock.advance(lifetime - 0.001)
    assert store.get("k") == 1
    clock.advance(0.001)
    assert store.get("k") is None


def test_expire_one_may_last_only_a_moment(store: MemoryStore, clock: FakeClock) -> None:
    clock.advance(0.999)
    store.set("k", 1, expire=1)
    assert store.get("k") == 1
    clock.advance(0.001)
    assert store.get("k") is None


def test_thirty_days_is_the_longest_relative_exptime(store: MemoryStore, clock: FakeClock) -> None:
    store.set("relative", 1, expire=MAX_RELATIVE_EXPIRE)
    store.set("absolute", 1, expire=MAX_RELATIVE_EXPIRE + 1)  # 1970-01-31: long past
    assert store.get("absolute") is None
    clock.advance(30 * DAY - 1)
    assert store.get("relative") == 1
    clock.advance(1)
    assert store.get("relative") is None


def test_absolute_exptime_boundary(store: MemoryStore, clock: FakeClock) -> None:
    deadline = int(START) + 100
    store.set("k", 1, expire=deadline)
    clock.now = deadline - 0.001
    assert store.get("k") == 1
    clock.now = deadline
    assert store.get("k") is None


def test_absolute_exptime_of_this_second_expires_at_once(
    store: MemoryStore, clock: FakeClock
) -> None:
    clock.advance(0.5)
    assert store.set("now", 1, expire=int(clock.now)) is True
    assert store.get("now") is None
    assert store.set("next", 1, expire=int(clock.now) + 1) is True
    assert store.get("next") == 1


def test_touch_replaces_the_ttl(store: MemoryStore, clock: FakeClock) -> None:
    store.set_many({"longer": 1, "shorter": 1, "forever": 1, "gone": 1}, expire=10)
    clock.advance(5)
    assert store.touch("longer", 10)
    assert store.touch("shorter", 1)
    assert store.touch("forever", 0)
    assert store.touch("gone", -1)
    assert store.get("gone") is None
    clock.advance(1)
    assert store.get("shorter") is None
    clock.advance(9)
    assert store.get_many(["longer", "forever"]) == {"forever": 1}
    clock.advance(10 * 365 * DAY)
    assert store.get("forever") == 1


def test_ttl_counts_whole_seconds_like_mg(store: MemoryStore, clock: FakeClock) -> None:
    # memcached's "mg <key> t": deadline minus its whole-second clock, so a live
    # item always has at least 1 second left; -1 for never, None once expired.
    clock.advance(0.9)
    store.set("k", 1, expire=2)
    store.set("forever", 1)
    store.set("absolute", 1, expire=int(START) + 100)
    assert store.ttl("k") == 2
    assert store.ttl("forever") == -1
    assert store.ttl("absolute") == 100
    clock.advance(0.1)
    assert store.ttl("k") == 1
    assert store.ttl("absolute") == 99
    clock.advance(0.999)
    assert store.ttl("k") == 1
    clock.advance(0.001)
    assert store.ttl("k") is None
    assert store.get("k") is None


def test_append_incr_decr_keep_the_ttl_set_and_cas_replace_it(
    store: MemoryStore, clock: FakeClock
) -> None:
    store.set_many({"appended": b"a", "counted": 1, "reset": 1, "swapped": 1}, expire=10)
    clock.advance(5)
    store.append("appended", b"b")
    store.prepend("appended", b"c")
    store.incr("counted", 100)
    store.decr("counted")
    store.set("reset", 2, expire=10)
    store.cas("swapped", 2, store.gets("swapped")[1])  # expire=0: never
    clock.advance(5)
    assert store.get_many(["appended", "counted", "reset", "swapped"]) == {
        "reset": 2,
        "swapped": 2,
    }


def test_expired_key_is_free_for_add_and_missing_for_the_rest(
    store: MemoryStore, clock: FakeClock
) -> None:
    store.set_many({"a": b"1", "b": b"1"}, expire=1)
    _, token = store.gets("b")
    clock.advance(1)
    assert store.incr("a") is None
    assert store.append("a", b"x") is False
    assert store.touch("a", 10) is False
    assert store.delete("a") is False
    assert store.cas("b", b"2", token) is None
    assert store.add("a", b"fresh") is True
    assert store.get("a") == b"fresh"


def test_negative_exptimes_store_nothing_visible(store: MemoryStore) -> None:
    store.set("k", 1)
    assert store.set("k", 2, expire=-5) is True
    assert store.get("k") is None
    assert store.add("k", 3, expire=-1) is True
    assert store.get("k") is None
    assert store.stats()["curr_items"] == 0


# -- sizes and memory ---------------------------------------------------------------


def test_item_size_is_memcacheds_allocation() -> None:
    # Measured on memcached 1.6.18 with -I 1m: a 4-byte key takes a 1048513-byte
    # value with flags 0 and a 1048509-byte one with flags set.
    assert item_size(b"abcd", b"x" * 1048513, 0) == 1024 * 1024
    assert item_size(b"abcd", b"x" * 1048509, 1) == 1024 * 1024
    assert ITEM_OVERHEAD == 59


def test_size_limit_applies_to_serialised_bytes(clock: FakeClock) -> None:
    # 2 MiB of zeros compresses far below the 1 MiB item limit.
    store = MemoryStore(serde=CompressedSerde(), clock=clock)
    value = b"\0" * (2 * 1024 * 1024)
    assert store.set("zeros", value) is True
    assert store.get("zeros") == value
    with pytest.raises(ValueTooLargeError):
        store.set("random", random.Random(0).randbytes(2 * 1024 * 1024))


def test_smaller_item_size_limit(clock: FakeClock) -> None:
    store = MemoryStore(max_item_size=2048, max_bytes=8192, clock=clock)
    fits = 2048 - ITEM_OVERHEAD - len("k")
    assert store.set("k", b"x" * fits) is True
    with pytest.raises(ValueTooLargeError):
        store.set("k", b"x" * (fits + 1))
    assert store.get("k") is None  # a failed set removes the old item, as memcached does
    store.set("k", b"x" * (fits - 1))
    assert store.append("k", b"y") is True
    assert store.append("k", b"y") is False


def test_least_recently_used_items_are_evicted_first(clock: FakeClock) -> None:
    size = item_size(b"key:0", b"x" * 1000, 0)
    store = MemoryStore(max_item_size=2048, max_bytes=4 * size, clock=clock)
    for i in range(4):
        store.set(f"key:{i}", b"x" * 1000)
    store.get("key:0")  # reads refresh recency
    store.touch("key:1", 0)  # so does touch, as in memcached
    store.set("key:4", b"x" * 1000)
    store.set("key:5", b"x" * 1000)
    assert sorted(store.get_many([f"key:{i}" for i in range(6)])) == [
        "key:0",
        "key:1",
        "key:4",
        "key:5",
    ]
    assert store.stats()["evictions"] == 2
    assert store.stats()["bytes"] == 4 * size


def test_expired_items_are_reclaimed_before_live_ones_are_evicted(clock: FakeClock) -> None:
    size = item_size(b"key:0", b"x" * 1000, 0)
    store = MemoryStore(max_item_size=2048, max_bytes=4 * size, clock=clock)
    store.set("key:0", b"x" * 1000)
    store.set("key:1", b"x" * 1000, expire=5)
    store.set("key:2", b"x" * 1000, expire=5)
    store.set("key:3", b"x" * 1000)
    store.get("key:1")
    store.get("key:2")  # the expiring items are the most recently used
    clock.advance(5)
    store.set("key:4", b"x" * 1000)
    store.set("key:5", b"x" * 1000)
    assert sorted(store.get_many([f"key:{i}" for i in range(6)])) == [
        "key:0",
        "key:3",
        "key:4",
        "key:5",
    ]
    assert store.stats()["evictions"] == 0
    assert store.stats()["reclaimed"] == 2


def test_memory_accounting_survives_churn(store: MemoryStore, clock: FakeClock) -> None:
    for round_ in range(200):
        store.set("k", b"v" * round_, expire=1 + round_ % 3)
        store.append("k", b"tail")
        if store.incr("n") is None:
            store.set("n", 1)
        clock.advance(0.5)
    store.delete_many(["k", "n"])
    assert store.stats()["bytes"] == 0
    assert store.stats()["curr_items"] == 0


def test_a_full_store_keeps_accepting_writes(clock: FakeClock) -> None:
    store = MemoryStore(max_item_size=2048, max_bytes=16 * 1024, clock=clock)
    for i in range(1000):
        store.set(f"key:{i}", b"x" * (i % 1500), expire=i % 7)
        assert store.stats()["bytes"] <= 16 * 1024
    assert store.get(f"key:{999}") == b"x" * (999 % 1500)


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"max_item_size": 1023}, "max_item_size"),
        ({"max_item_size": 1024 * 1024, "max_bytes": 1024 * 1024}, "max_bytes"),
    ],
)
def test_invalid_sizes_are_configuration_errors(options: dict[str, int], option: str) -> None:
    with pytest.raises(ConfigurationError, match=option) as raised:
        MemoryStore(**options)
    assert raised.value.option == option


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"MAX_ENTRIES": 10}, "MAX_ENTRIES"),
        ({"ketama": "libmemcached"}, "ketama"),
        ({"max_bytes": "64m"}, "max_bytes"),
        ({"max_item_size": True}, "max_item_size"),
        ({"max_item_size": 100}, "max_item_size"),
        ({"max_item_size": 4096, "max_bytes": 5000}, "max_bytes"),
    ],
)
def test_embedded_options_are_checked_for_both_frameworks(
    options: dict[str, Any], option: str
) -> None:
    with pytest.raises(ConfigurationError, match=option) as raised:
        memory_options(options)
    assert raised.value.option == option


def test_embedded_options_give_the_store_its_sizes() -> None:
    given = {"max_bytes": 2**22, "serializer": "django_mcpatterns.core.serializers.JSONSerializer"}
    assert memory_options(given) == {"max_bytes": 2**22}
    assert memory_options({}) == {}


# -- serialisation --------------------------------------------------------------------


class TaggingSerde:
    """A serde of its own: text with flags 7, to prove the store uses what it is given."""

    def serialize(self, key: Any, value: Any) -> tuple[bytes, int]:
        return repr(value).encode(), 7

    def deserialize(self, key: Any, value: bytes, flags: int) -> Any:
        return ("tagged", flags, value)


def test_custom_serde_and_flags_survive_append(clock: FakeClock) -> None:
    store = MemoryStore(serde=TaggingSerde(), clock=clock)
    store.set("k", [1])
    store.append("k", b"!")
    assert store.get("k") == ("tagged", 7, b"[1]!")


def test_values_are_stored_serialised(store: MemoryStore) -> None:
    value = {"mutable": [1]}
    store.set("k", value)
    value["mutable"].append(2)
    assert store.get("k") == {"mutable": [1]}
    assert store.get("k") is not store.get("k")


# -- incr/decr parsing ----------------------------------------------------------------


@given(st.integers(min_value=0, max_value=MAX_COUNTER), st.integers(0, 5), st.integers(0, 5))
def test_parse_counter_reads_padded_decimals(number: int, before: int, after: int) -> None:
    assert parse_counter(b" " * before + b"%d" % number + b" " * after) == number


@given(st.integers(min_value=MAX_COUNTER + 1))
def test_parse_counter_refuses_overflow(number: int) -> None:
    assert parse_counter(b"%d" % number) is None


@given(st.integers(min_value=1, max_value=2**63))
def test_parse_counter_refuses_negative_numbers(number: int) -> None:
    assert parse_counter(b"-%d" % number) is None


def test_parse_counter_quirks_of_strtoull() -> None:
    # A minus sign is refused only when it wraps past 2**63 (memcached's safe_strtoull).
    assert parse_counter(b"-0") == 0
    assert parse_counter(b"-18446744073709551615") == 1
    assert parse_counter(b"5\x00junk") == 5
    assert parse_counter(b"\v\f5") == 5
    assert parse_counter(b"+") is None
    assert parse_counter(b"5-") is None


# -- CAS tokens ----------------------------------------------------------------------


def test_cas_tokens_are_unique_across_keys_and_writes(store: MemoryStore) -> None:
    tokens = []
    for i in range(50):
        store.set(f"key:{i}", i)
        tokens.append(store.gets(f"key:{i}")[1])
        store.incr(f"key:{i}")
        tokens.append(store.gets(f"key:{i}")[1])
    assert len(set(tokens)) == 100
    assert store.gets_many(["key:0"]) == {"key:0": (1, tokens[1])}


def test_reads_count_hits_and_misses_per_key_as_memcached(store: MemoryStore) -> None:
    store.set_many({"a": 1, "b": 2})
    assert store.stats()["get_hits"] == store.stats()["get_misses"] == 0
    store.get("a")
    store.gets("missing")
    store.get_many(["a", "b", "missing", "other"])
    store.gets_many(["b"])
    store.ttl("a")  # a meta get counts too
    store.add("a", 3)  # writes do not
    store.touch("missing", 1)
    stats = store.stats()
    assert (stats["get_hits"], stats["get_misses"]) == (5, 3)
    store.flush_all()  # memcached keeps its counters over a flush
    assert store.stats()["get_hits"] == 5


def test_hit_and_miss_counts_are_exact_under_threads(store: MemoryStore) -> None:
    store.set("hit", 1)
    run_threads(8, lambda _: [store.get_many(["hit", "miss"]) for _ in range(500)])
    stats = store.stats()
    assert (stats["get_hits"], stats["get_misses"]) == (4000, 4000)


# -- threads: one lock, no lost updates --------------------------------------------------


def test_concurrent_incr_reaches_the_exact_total(store: MemoryStore) -> None:
    store.set("counter", 0)
    run_threads(8, lambda _: [store.incr("counter") for _ in range(2000)])
    assert store.get("counter") == 8 * 2000


def test_concurrent_add_has_exactly_one_winner() -> None:
    store = MemoryStore()
    for round_ in range(50):
        results = run_threads(8, lambda i, r=round_: store.add(f"lock:{r}", i))
        assert results.count(True) == 1
        assert store.get(f"lock:{round_}") == results.index(True)


def test_concurrent_append_loses_nothing(store: MemoryStore) -> None:
    store.set("log", b"")

    def append_many(thread: int) -> None:
        for i in range(300):
            assert store.append("log", b"%d.%d," % (thread, i))

    run_threads(8, append_many)
    entries = store.get("log").split(b",")[:-1]
    assert sorted(entries) == sorted(b"%d.%d" % (t, i) for t in range(8) for i in range(300))


def test_concurrent_cas_loops_lose_no_update(store: MemoryStore) -> None:
    store.set("total", 0)

    def add_one_many_times(_: int) -> int:
        conflicts = 0
        for _ in range(300):
            while True:
                value, token = store.gets("total")
                if store.cas("total", value + 1, token):
                    break
                conflicts += 1
        return conflicts

    run_threads(8, add_one_many_times)
    assert store.get("total") == 8 * 300


# -- the process-wide registry ----------------------------------------------------------


@pytest.fixture
def fresh_registry():
    reset_shared_memory_stores()
    yield
    reset_shared_memory_stores()


@pytest.mark.usefixtures("fresh_registry")
def test_shared_stores_are_one_per_name_across_threads() -> None:
    found = run_threads(8, lambda i: shared_memory_store("default" if i % 2 else "other"))
    assert len({id(found[i]) for i in range(1, 8, 2)}) == 1
    assert len({id(found[i]) for i in range(0, 8, 2)}) == 1
    assert found[0] is not found[1]
    shared_memory_store("default").set("k", 1)
    assert shared_memory_store("default").get("k") == 1
    assert shared_memory_store("other").get("k") is None


@pytest.mark.usefixtures("fresh_registry")
def test_shared_store_options_apply_on_creation() -> None:
    store = shared_memory_store("small", max_item_size=2048, max_bytes=4096)
    assert store.stats()["item_size_max"] == 2048
    assert shared_memory_store("small", max_bytes=10**9) is store


@pytest.mark.usefixtures("fresh_registry")
def test_reset_forgets_and_empties_shared_stores() -> None:
    old = shared_memory_store("default")
    old.set("k", 1)
    reset_shared_memory_stores()
    assert old.get("k") is None
    new = shared_memory_store("default")
    assert new is not old
    assert new.get("k") is None
