"""The near cache's table, on a fake clock: the bound, this process's writes, admission.

No server and no wall clock: time moves when a test says so.  The store-level
behaviour (real memcached, both drivers) is ``test_near_store.py``; the
multi-process drill is ``tests/drills/test_near_staleness.py``.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import pickle
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_mcpatterns.core.exceptions import ConfigurationError
from django_mcpatterns.core.near import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_BYTES,
    LARGE_VALUE,
    NearOptions,
    NearTable,
    keep,
    near_key,
)
from django_mcpatterns.core.values.envelope import Envelope
from tests.fakes import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


def table_of(clock: FakeClock, **options: Any) -> NearTable:
    rng = random.Random(7).randrange  # which entries eviction looks at: the same every run
    return NearTable(NearOptions(**{"max_age": 1.0, **options}), clock=clock, rng=rng)


def race(reader: Callable[[int], None], writer: Callable[[int], None]) -> None:
    """Four readers and two writers, switching threads every microsecond."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
        threads += [threading.Thread(target=writer, args=(10 + i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)


def assert_whole(table: NearTable) -> None:
    """The table's byte count, entries and expiry order agree, within its budget."""
    entries = list(table.entries.values())
    assert table.stats().bytes == sum(entry.size for entry in entries) <= table.budget
    assert sorted(map(id, table._order)) == sorted(map(id, entries))
    assert all(table._order[entry.slot] is entry for entry in entries)


def value_of(table: NearTable, key: str) -> Any:
    entry = table.lookup(key)
    return None if entry is None else entry.out()


# -- options -----------------------------------------------------------------------------


def test_options_default_and_off() -> None:
    assert NearOptions.from_option(None) is None
    assert NearOptions.from_option({}) == NearOptions(DEFAULT_MAX_AGE, DEFAULT_MAX_BYTES, None)
    parsed = NearOptions.from_option({"max_age": 2, "max_bytes": 2**20, "prefixes": ["a", "bc"]})
    assert parsed == NearOptions(2, 2**20, (("bc", 2.0), ("a", 2.0)))  # longest first


def test_options_a_shorter_bound_for_chosen_prefixes() -> None:
    parsed = NearOptions.from_option({"max_age": 1, "prefixes": {"flag:": 0.05, "page:": 1}})
    assert parsed is not None
    assert parsed.prefixes == (("flag:", 0.05), ("page:", 1.0))


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("yes", "must be a mapping"),
        ({"max_age": 1, "ttl": 3}, "unknown near_cache option 'ttl'; valid options"),
        ({"max_age": 0}, "'max_age' must be a number of seconds > 0"),
        ({"max_age": float("inf")}, "'max_age' must be a number of seconds > 0"),
        ({"max_age": True}, "'max_age' must be a number"),
        ({"max_bytes": 100}, "'max_bytes' must be an integer >= 65536"),
        ({"max_bytes": 1.5e6}, "'max_bytes' must be an integer"),
        ({"prefixes": "user:"}, "'prefixes' must be a list of key prefixes"),
        ({"prefixes": ["", "a"]}, "prefixes are non-empty strings"),
        ({"prefixes": [3]}, "prefixes are non-empty strings"),
        ({"max_age": 1, "prefixes": {"a": 2}}, "a number > 0, <= max_age"),
    ],
)
def test_options_refuse_bad_values_by_name(given: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        NearOptions.from_option(given)
    assert caught.value.option == "near_cache"


# -- the bound ----------------------------------------------------------------------------


def test_an_entry_ages_from_when_its_request_was_sent(clock: FakeClock) -> None:
    table = table_of(clock)
    ticket = table.ticket()  # the request leaves now...
    clock.advance(0.4)  # ...and its reply comes 0.4 s later
    assert table.fill("k", "v", ticket)
    clock.advance(0.59)
    assert value_of(table, "k") == "v"
    clock.advance(0.01)  # max_age after the request was sent, not after the reply
    assert value_of(table, "k") is None


def test_a_reply_slower_than_the_bound_is_not_kept(clock: FakeClock) -> None:
    table = table_of(clock)
    ticket = table.ticket()
    clock.advance(1.0)
    assert not table.fill("k", "v", ticket)
    assert table.held("k") is None


def test_a_read_sent_before_a_write_of_this_process_is_not_kept(clock: FakeClock) -> None:
    table = table_of(clock)
    before = table.ticket()  # a read leaves, the server answers the old value...
    table.invalidate("k")  # ...a write of this process completes...
    assert not table.fill("k", "old", before)  # ...the old answer is dropped
    assert table.held("k") is None
    after = table.ticket()
    assert table.fill("k", "new", after)
    assert value_of(table, "k") == "new"


def test_a_write_drops_the_copy_at_once(clock: FakeClock) -> None:
    table = table_of(clock)
    table.fill("k", "v", table.ticket())
    table.invalidate("k")
    assert value_of(table, "k") is None
    assert table.stats().invalidations == 1


def test_clear_voids_reads_under_way(clock: FakeClock) -> None:
    table = table_of(clock)
    table.fill("a", 1, table.ticket())
    under_way = table.ticket()
    table.clear()
    assert table.held("a") is None
    assert not table.fill("b", 2, under_way)
    assert table.fill("b", 2, table.ticket())


def test_prefixes_choose_the_keys_and_their_bound(clock: FakeClock) -> None:
    table = NearTable(
        NearOptions(1.0, prefixes=(("flag:", 0.1), ("page:", 1.0))),
        scope=r"app:\d+:",
        clock=clock,
    )
    ticket = table.ticket()
    assert table.fill("app:1:flag:x", True, ticket)
    assert table.fill("app:1:page:/", "html", ticket)
    assert not table.fill("app:1:user:1", "u", ticket)  # under no prefix
    assert not table.fill("flag:x", True, ticket) or table.bound("flag:x") == 0.1
    clock.advance(0.2)
    assert value_of(table, "app:1:flag:x") is None  # its own, shorter bound
    assert value_of(table, "app:1:page:/") == "html"


def test_a_get_or_compute_value_is_held_until_its_soft_expiry_at_most(clock: FakeClock) -> None:
    table = NearTable(NearOptions(1.0), clock=clock, wall=lambda: 5000.0)
    envelope = Envelope(["v"], soft_expiry=5000.3, hard_expiry=5100.0)
    assert table.fill("k", ["v"], table.ticket(), envelope=envelope)
    held = table.envelope("k")
    assert held is not None
    assert held.value == ["v"]
    assert held.soft_expiry == 5000.3
    clock.advance(0.31)
    assert table.envelope("k") is None  # stale: memcached decides who recomputes


def test_a_plain_value_is_no_envelope(clock: FakeClock) -> None:
    table = table_of(clock)
    table.fill("k", "plain", table.ticket())
    assert table.envelope("k") is None
    assert value_of(table, "k") == "plain"


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["read", "reply", "write", "tick", "look"]),
            st.sampled_from(["a", "b"]),
            st.floats(0, 0.7),
        ),
        max_size=40,
    )
)
def test_no_lookup_breaks_the_bound_or_misses_a_write(steps: list[Any]) -> None:
    """Any interleaving of reads (sent, then answered), writes of this process and time.

    A value looked up at ``t`` was answered by a read sent no earlier than
    ``t - max_age``, and after every write of this process to its key that
    completed before the lookup.
    """
    clock = FakeClock(0.0)
    table = NearTable(NearOptions(1.0), clock=clock)
    version = {"a": 0, "b": 0}  # the server: a write makes a new version
    written_at = {"a": 0, "b": 0}  # the version of the last completed write
    pending: list[tuple[str, Any, float, int]] = []
    for action, key, amount in steps:
        if action == "read":  # sent now; the server answers the current version
            pending.append((key, table.ticket(), clock(), version[key]))
        elif action == "reply" and pending:
            k, ticket, sent, seen = pending.pop(0)
            table.fill(k, (seen, sent), ticket)
        elif action == "write":
            version[key] += 1
            written_at[key] = version[key]
            table.invalidate(key)
        elif action == "tick":
            clock.advance(amount)
        elif action == "look":
            found = value_of(table, key)
            if found is not None:
                seen, sent = found
                assert sent > clock() - 1.0
                assert seen >= written_at[key]


def test_threads_filling_evicting_and_writing_keep_the_table_whole() -> None:
    """Real threads on one table, switching as often as the interpreter allows: readers
    fill (past half full, so the sketch counts and admission evicts; entries expire and
    are swept), writers of this process write and invalidate.  No lookup returns a value
    older than a write that completed before it began, and the table's books balance."""
    table = NearTable(NearOptions(max_age=0.02, max_bytes=2**16))
    keys = [f"k{i}" for i in range(400)]  # about a third fit: evictions and refusals
    server = dict.fromkeys(keys, 0)  # the item's version on "memcached"
    completed = dict.fromkeys(keys, 0)  # the newest version whose write has returned
    guard = threading.Lock()  # the server's own atomicity
    errors: list[str] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(3000):
            key = rng.choice(keys[:50] if rng.random() < 0.5 else keys)  # half on hot keys
            began = completed[key]
            entry = table.lookup(key)
            if entry is not None:
                if entry.value[1] < began:
                    errors.append(f"{key}: version {entry.value[1]} after {began} returned")
                continue
            ticket = table.ticket()
            with guard:
                seen = server[key]
            time.sleep(0)  # the reply's way back: other threads run (a write may land)
            table.fill(key, (key, seen), ticket)

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(1500):
            key = rng.choice(keys[:50])
            with guard:
                server[key] += 1
                version = server[key]
            table.invalidate(key)
            with guard:
                completed[key] = max(completed[key], version)

    race(reader, writer)
    assert errors == []
    stats = table.stats()
    assert_whole(table)
    assert stats.fills > 0
    assert stats.evictions + stats.refused > 0
    assert stats.invalidations > 0


# -- isolation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "text",
        b"bytes",
        42,
        3.5,
        None,
        True,
        decimal.Decimal("1.5"),
        datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        uuid.UUID(int=7),
        (1, "a", (2, b"b")),
        frozenset({1, 2}),
    ],
)
def test_immutable_values_are_handed_out_as_they_are(value: Any) -> None:
    kept = keep(value)
    assert kept is not None
    assert kept[0] is value
    assert kept[1] is None


@pytest.mark.parametrize("value", [{"a": 1, "b": "x"}, [1, 2, "three"], {1, 2, 3}])
def test_flat_containers_are_copied_per_hit(clock: FakeClock, value: Any) -> None:
    table = table_of(clock)
    table.fill("k", value, table.ticket())
    mine = value_of(table, "k")
    assert mine == value
    assert mine is not value
    if isinstance(mine, dict):
        mine["a"] = "changed"
    elif isinstance(mine, list):
        mine.append("more")
    else:
        mine.add(4)
    value_copy = copy.deepcopy(value)
    if isinstance(value, list):
        value.append("the caller of the read changes its own too")
    assert value_of(table, "k") == value_copy


def test_anything_else_is_kept_pickled(clock: FakeClock) -> None:
    value = {"nested": [1, {"deep": "x"}], "tuple": (1, [2])}
    table = table_of(clock)
    table.fill("k", value, table.ticket())
    first = value_of(table, "k")
    first["nested"][1]["deep"] = "changed"
    first["tuple"][1].append(3)
    assert value_of(table, "k") == {"nested": [1, {"deep": "x"}], "tuple": (1, [2])}
    kept = keep(value)
    assert kept is not None
    assert kept[1] is pickle.loads


def test_a_value_that_cannot_be_kept_apart_is_not_held(clock: FakeClock) -> None:
    table = table_of(clock)
    unpicklable = [threading.Lock()]
    assert keep(unpicklable) is None
    assert not table.fill("k", unpicklable, table.ticket())
    assert table.held("k") is None
    assert table.stats().refused == 1


def test_keys_of_every_form_are_one_entry() -> None:
    from django_mcpatterns.core.keys import Routed

    assert near_key("k:é") == near_key("k:é".encode()) == near_key(Routed("k:é".encode(), b"r"))
    assert near_key(b"\xff") != near_key("\udcff\udcff")  # not UTF-8: its own identity
    with pytest.raises(TypeError):
        near_key(3)  # type: ignore[arg-type]


# -- memory, eviction and admission ---------------------------------------------------------


def test_memory_stays_under_max_bytes(clock: FakeClock) -> None:
    table = table_of(clock, max_bytes=2**16)
    for i in range(2000):
        table.fill(f"k{i}", f"{i:04d}" + "v" * 200, table.ticket())
        assert table.stats().bytes <= table.budget <= 2**16
    stats = table.stats()
    assert stats.evictions > 0
    assert stats.entries == len(table.entries)


def test_a_scan_of_cold_keys_does_not_flush_the_hot_ones(clock: FakeClock) -> None:
    table = table_of(clock, max_bytes=2**16, max_age=100.0)
    hot = [f"hot{i}" for i in range(20)]
    for _ in range(5):  # read often: counted by the sketch, and hit while held
        for key in hot:
            if table.lookup(key) is None:
                table.fill(key, "h" * 100, table.ticket())
    for i in range(3000):  # a scan: each key once
        table.fill(f"cold{i}", "c" * 100, table.ticket())
    assert all(table.held(key) is not None for key in hot)
    assert table.stats().evictions > 2500


def test_expired_entries_go_first(clock: FakeClock) -> None:
    table = table_of(clock, max_bytes=2**16)
    for i in range(100):
        table.fill(f"old{i}", "o" * 200, table.ticket())
    clock.advance(2.0)  # all past max_age: worth nothing
    for i in range(50):
        assert table.fill(f"new{i}", "n" * 200, table.ticket())
    assert all(table.held(f"new{i}") is not None for i in range(50))


def test_entries_past_their_bound_are_dropped_as_fills_come(clock: FakeClock) -> None:
    table = table_of(clock, max_bytes=2**20)
    for i in range(100):
        table.fill(f"old{i}", "o" * 100, table.ticket())
    table.fill("large", b"L" * LARGE_VALUE, table.ticket())
    clock.advance(0.5)
    table.fill("young", "y", table.ticket())
    clock.advance(0.6)  # the old ones and the large one past max_age, "young" not
    for i in range(40):
        table.fill(f"new{i}", "n" * 100, table.ticket())
    stats = table.stats()
    assert stats.entries == 1 + 1 + 40  # the old ones gone, with no eviction
    assert stats.evictions == 0
    assert table.held("large") is not None  # kept: past max_age it may be revalidated
    assert value_of(table, "young") == "y"


def test_the_expiry_queue_stays_within_twice_the_entries(clock: FakeClock) -> None:
    table = table_of(clock, max_bytes=2**16, max_age=100.0)
    for i in range(3000):  # evictions, writes and fills again: queue items outlive entries
        table.invalidate(f"k{(i * 7) % 500}")
        table.fill(f"k{i % 500}", "v" * 100, table.ticket())
        assert len(table._queue) <= 2 * len(table.entries) + 64  # after each fill
    assert table.stats().evictions > 0


def test_a_value_over_a_quarter_of_the_budget_is_not_held(clock: FakeClock) -> None:
    table = table_of(clock, max_bytes=2**16)
    assert not table.fill("big", b"x" * 2**15, table.ticket())


def test_stats_count_hits_misses_and_round_trips_saved(clock: FakeClock) -> None:
    table = table_of(clock)
    assert table.lookup("k") is None
    table.fill("k", "v", table.ticket())
    assert table.lookup("k") is not None
    table.saved()
    stats = table.stats()
    assert (stats.hits, stats.misses, stats.fills, stats.round_trips_saved) == (1, 1, 1, 1)
    assert stats.hit_ratio == 0.5
    assert stats.as_dict()["hit_ratio"] == 0.5
    assert stats.entries == 1
    assert 0 < stats.bytes < 1000


def test_a_forked_child_starts_empty(clock: FakeClock) -> None:
    table = table_of(clock)
    table.fill("k", "v", table.ticket())
    table.after_fork()  # what the at-fork hook runs in the child (a real fork: test_near_store)
    assert table.held("k") is None
    assert table.stats().entries == 0
