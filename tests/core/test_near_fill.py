"""The near table's hit and fill on both paths: ``NearTable.hit`` and ``NearTable.fill``
(Python), and the module's ``hit`` and ``fill`` (compiled, ``src/speedups/near.c``, where
the hot path is built).

A near hit is ``hit``; every miss ends in a fill, whose common case (a str or bytes
value, room in memory, with its sweep of expired entries) runs in C, any other case in
``NearTable.fill``.
Both paths must give the same answers and leave the same table: hypothesis drives two
tables through the same fills, hits, tickets, writes, clears and time, one per path.
"""

from __future__ import annotations

import gc
import random
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_mcpatterns.core.near import NearOptions, NearTable
from django_mcpatterns.core.near._model_table import MISS, fill, hit, missed, untrack
from django_mcpatterns.core.protocol import compiled
from tests.core.test_near_table import assert_whole, race
from tests.fakes import FakeClock

PATHS = [pytest.param(NearTable.fill, id="python"), pytest.param(fill, id="module")]

KEYS = [f"k{i}" for i in range(12)] + ["ключ", "k:" + "x" * 300]
VALUES = st.one_of(
    st.text(st.characters(max_codepoint=127), max_size=20),
    st.integers(0, 20_000).map(lambda n: "v" * n),  # some over a quarter of the budget
    st.integers(0, 20_000).map(lambda n: b"b" * n),
    st.text(max_size=50),  # not ASCII: kept by keep()
    st.binary(max_size=20),
    st.integers(),
    st.tuples(st.integers(), st.text(max_size=5)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),  # copied per hit
    st.none(),
)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("fill"), st.sampled_from(KEYS), VALUES, st.integers(0, 5)),
        st.tuples(st.just("ticket")),
        st.tuples(st.just("write"), st.sampled_from(KEYS)),
        st.tuples(st.just("tick"), st.floats(0, 0.4)),
        st.tuples(st.just("clear")),
        st.tuples(st.just("look"), st.sampled_from(KEYS)),
        st.tuples(st.just("hit"), st.sampled_from(KEYS)),
        st.tuples(st.just("missed")),
    ),
    max_size=60,
)


def table_of(clock: FakeClock, **options: Any) -> NearTable:
    rng = random.Random(7).randrange  # eviction's draws: the same for both tables
    return NearTable(NearOptions(**{"max_age": 1.0, **options}), clock=clock, rng=rng)


def state(table: NearTable) -> Any:
    """Everything a fill may change: entries (every field), their order, the expiry queue,
    the bytes counted, the admission sketch, the counts."""
    entries = {
        key: (e.key, e.value, e.copy, e.size, e.expires, e.hits, e.slot, e.envelope, e.cas)
        for key, e in table.entries.items()
    }
    order = [e.key for e in table._order]
    sketch = [bytes(row) for row in table._rows], table._added
    return entries, order, list(table._queue), table._bytes, table._sweep_at, sketch, table.stats()


@pytest.mark.skipif(not compiled.COMPILED, reason=f"pure Python: {compiled.why_pure}")
def test_the_module_hit_and_fill_are_compiled() -> None:
    assert fill is not NearTable.fill
    assert hit is not NearTable.hit
    assert missed is not NearTable.missed


@settings(max_examples=300, deadline=None)
@given(STEPS, st.sampled_from([2**16, 2**17, 2**20]), st.booleans())
def test_both_paths_answer_alike_and_leave_the_same_table(
    steps: list[Any], max_bytes: int, prefixed: bool
) -> None:
    """The same steps on two tables, one filled by ``NearTable.fill``, one by ``fill``: each
    fill answers the same and the tables stay equal (small budgets: the sketch counts,
    admission evicts or refuses, sweeps come; prefixes: each key its own bound)."""
    clock = FakeClock(1000.0)
    options: dict[str, Any] = {"max_bytes": max_bytes}
    if prefixed:
        options["prefixes"] = (("k1", 0.5), ("k", 1.0))
    python, module = table_of(clock, **options), table_of(clock, **options)
    tickets = [python.ticket()]
    assert module.ticket() == tickets[0]
    for step in steps:
        if step[0] == "fill":
            _, key, value, age = step
            ticket = tickets[max(0, len(tickets) - 1 - age)]
            assert NearTable.fill(python, key, value, ticket) == fill(module, key, value, ticket)
        elif step[0] == "missed":
            tickets.append(NearTable.missed(python))
            assert missed(module) == tickets[-1]
        elif step[0] == "ticket":
            tickets.append(python.ticket())
            assert module.ticket() == tickets[-1]
        elif step[0] == "write":
            python.invalidate(step[1])
            module.invalidate(step[1])
        elif step[0] == "tick":
            clock.advance(step[1])
        elif step[0] == "clear":
            python.clear()
            module.clear()
        elif step[0] == "hit":
            a, b = NearTable.hit(python, step[1]), hit(module, step[1])
            assert (a is MISS) == (b is MISS)
            assert a == b
            if isinstance(a, dict):  # each caller its own copy
                assert a is not b
                assert a is not python.entries[step[1]].value
                assert b is not module.entries[step[1]].value
        else:
            a, b = python.lookup(step[1]), module.lookup(step[1])
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert a.out() == b.out()
        assert state(python) == state(module)


def test_both_paths_alike_at_the_edges() -> None:
    """Where the compiled case ends: a value about the largest held, one key filled again
    until its expiry queue must be rebuilt, the table filled to half and past."""
    clock = FakeClock(1000.0)
    python, module = table_of(clock, max_bytes=2**16), table_of(clock, max_bytes=2**16)
    ticket = python.ticket()
    for table in (python, module):  # the first fill, by NearTable.fill on both: they start alike
        NearTable.fill(table, "first", "v", ticket)
    clock.advance(1.0)  # a read answered exactly max_age after it was sent: not held
    assert NearTable.fill(python, "k", "v", ticket) is fill(module, "k", "v", ticket) is False
    ticket = python.ticket()
    largest = python._largest

    def both(key: str, value: Any) -> None:
        assert NearTable.fill(python, key, value, ticket) == fill(module, key, value, ticket)
        assert state(python) == state(module)

    for n in range(largest - 470, largest - 430):  # around the largest held (str, bytes)
        both("k", "v" * n)
        both("k", b"b" * n)
    for i in range(300):  # one key again and again: the queue outgrows twice the entries
        clock.advance(0.001)
        ticket = python.ticket()
        both("again", "v" * i)
    for i in range(400):  # many keys: half full (the sketch counts), then full (admission)
        both(f"m{i}", "w" * 300)


def test_both_paths_sweep_expired_entries_alike() -> None:
    """A fill past the oldest entry's bound sweeps: at most SWEEP entries a fill, oldest
    first, large ones and those filled again since left; the next sweep dated alike."""
    clock = FakeClock(1000.0)
    python, module = table_of(clock), table_of(clock)
    ticket = python.ticket()
    for table in (python, module):  # the first fill, by NearTable.fill on both: they start alike
        NearTable.fill(table, "first", "v", ticket)
    for i in range(300):
        clock.advance(0.0001)
        ticket = python.ticket()
        value: Any = b"L" * 9000 if i % 50 == 7 else f"v{i}"  # some large: they stay
        assert NearTable.fill(python, f"k{i}", value, ticket) == fill(
            module, f"k{i}", value, ticket
        )
    clock.advance(0.0001)
    ticket = python.ticket()
    for i in (3, 4):  # filled again: their first queue items are not their last
        assert NearTable.fill(python, f"k{i}", "again", ticket) == fill(
            module, f"k{i}", "again", ticket
        )
    assert state(python) == state(module)
    clock.advance(1.5)  # every one past its bound, and past the slack
    for n in range(3):
        ticket = python.ticket()
        assert NearTable.fill(python, f"new{n}", "v", ticket) == fill(
            module, f"new{n}", "v", ticket
        )
        assert state(python) == state(module)
    large = {f"k{i}" for i in range(300) if i % 50 == 7}
    assert set(python.entries) == {"new0", "new1", "new2"} | large


def test_both_paths_count_alike_in_the_sketch() -> None:
    """Past half full and short of full, the compiled fill counts each read in the sketch
    as Python's does, up to a counter's ceiling (255)."""
    clock = FakeClock(1000.0)
    python, module = table_of(clock, max_bytes=2**16), table_of(clock, max_bytes=2**16)
    ticket = python.ticket()
    for i in range(50):  # about 38 KB of 63: past half full
        assert NearTable.fill(python, f"h{i}", "w" * 300, ticket) == fill(
            module, f"h{i}", "w" * 300, ticket
        )
    assert python._bytes > python._sketch_from
    for _ in range(300):  # one key read again and again: its counters reach the ceiling
        assert NearTable.fill(python, "h0", "w" * 300, ticket) == fill(
            module, "h0", "w" * 300, ticket
        )
        assert state(python) == state(module)
    assert max(max(row) for row in module._rows) == 255


class Marked(str):
    """A str subclass (as Django's SafeString): NearTable.fill holds it as it is."""


def test_a_sweep_past_a_key_of_a_str_subclass_drops_it_on_both_paths() -> None:
    """An expired entry whose key is a str subclass is swept as any other: the compiled
    fill leaves such a sweep to NearTable.fill (the key's lookup is Python's) rather than
    pop its queue item and keep the entry for good."""
    clock = FakeClock(1000.0)
    python, module = table_of(clock), table_of(clock)
    ticket = python.ticket()
    for table in (python, module):  # filled by NearTable.fill on both: they start alike
        NearTable.fill(table, "first", "v", ticket)
        NearTable.fill(table, Marked("marked"), "v", ticket)
        NearTable.fill(table, "last", "v", ticket)
    clock.advance(1.5)  # all three past their bound, and past the slack
    ticket = python.ticket()
    assert NearTable.fill(python, "new", "v", ticket) is fill(module, "new", "v", ticket) is True
    assert set(module.entries) == set(python.entries) == {"new"}
    assert state(python) == state(module)


@pytest.mark.parametrize("filling", PATHS)
def test_a_key_comparing_by_python_code_is_compared_only_under_the_lock(filling: Any) -> None:
    """A key of a str subclass with its own __eq__, held: the sweep's lookup of an equal
    str runs that __eq__, which must not run inside near.c's change (the table's lock is
    not held there: another thread could fill meanwhile), so the compiled fill leaves the
    table to NearTable.fill once such a key is held."""
    clock = FakeClock(1000.0)
    table = table_of(clock)
    under_lock: list[bool] = []

    class Odd(str):
        def __eq__(self, other: object) -> bool:
            under_lock.append(table._lock.locked())
            return str.__eq__(self, other)

        __hash__ = str.__hash__

    NearTable.fill(table, "k", "v", table.ticket())  # queued to expire at 1001.0
    clock.advance(0.5)
    NearTable.fill(table, Odd("k"), "v", table.ticket())  # held under the Odd key since
    clock.advance(0.6)  # past the first item's bound and the slack: a sweep is due
    assert filling(table, "new", "v", table.ticket()) is True
    assert len(under_lock) == 2  # the Odd fill's lookup, the sweep's
    assert all(under_lock)
    assert set(table.entries) == {"k", "new"}
    table.clear()
    assert filling(table, "k", "v", table.ticket()) is True  # cleared: compiled again


class Unordered:
    """A clock's reading no number compares with."""

    def __lt__(self, other: Any) -> bool:
        raise ValueError("no order")

    __gt__ = __lt__


@pytest.mark.parametrize("hitting", [NearTable.hit, hit])
def test_a_hit_whose_clock_cannot_be_compared_raises_its_error(hitting: Any) -> None:
    """The comparison's own error, not a SystemError (its bound read as -1.0 once cleared it)."""
    readings: list[Any] = [-3]
    table = NearTable(NearOptions(max_age=1), clock=lambda: readings[-1])
    assert NearTable.fill(table, "k", "v", (-2, table.ticket()[1]))  # expires at -1
    readings.append(Unordered())
    with pytest.raises(ValueError, match="no order"):
        hitting(table, "k")


@pytest.mark.parametrize(("hitting", "filling"), [(NearTable.hit, NearTable.fill), (hit, fill)])
def test_a_hit_until_the_bound_each_caller_its_own_copy(hitting: Any, filling: Any) -> None:
    clock = FakeClock(1000.0)
    table = table_of(clock)
    ticket = table.ticket()
    filling(table, "first", "v", ticket)  # the first fill sweeps (nothing yet)
    clock.advance(0.25)
    assert filling(table, "plain", "v", ticket)
    assert filling(table, "flat", {"a": 1}, ticket)
    first, second = hitting(table, "flat"), hitting(table, "flat")
    assert first == second == {"a": 1}
    assert first is not second
    assert hitting(table, "plain") == "v"
    assert hitting(table, "none") is MISS
    clock.advance(0.75)  # exactly max_age after the read was sent: no longer served
    assert hitting(table, "plain") is MISS
    stats = table.stats()
    assert (stats.hits, stats.round_trips_saved, stats.misses) == (3, 3, 0)
    assert table.entries["flat"].hits == 2


@pytest.mark.skipif(not compiled.COMPILED, reason=f"pure Python: {compiled.why_pure}")
@pytest.mark.parametrize("filling", PATHS)
def test_entries_are_left_out_of_the_cycle_collectors_work(filling: Any) -> None:
    """A table of max_bytes is made of entries a fill makes: left to the collector, each
    is traversed at every collection it survives.  None can be part of a cycle (near.c),
    so none is tracked; a value with a cycle of its own is kept pickled."""
    clock = FakeClock(1000.0)
    table = table_of(clock)
    ticket = table.ticket()
    looped: list[Any] = []
    looped.append(looped)
    for key, value in [("str", "v"), ("bytes", b"v"), ("dict", {"a": 1}), ("loop", looped)]:
        assert filling(table, key, value, ticket)
    assert filling(table, "str", "w", table.ticket())  # a replaced entry too
    assert sorted(table.entries) == ["bytes", "dict", "loop", "str"]
    assert not any(gc.is_tracked(entry) for entry in table.entries.values())
    if filling is fill:  # C's (time, key) in the expiry queue too (Python's: at a collection)
        assert not gc.is_tracked(table._queue[-1])
    again = hit(table, "loop")
    assert again is not looped
    assert again[0] is again
    with pytest.raises(TypeError, match="Entry"):
        untrack(object())


class Tagged(str):
    """A key of a str subclass: its instances may hold anything, even their own table."""


def test_an_entry_whose_key_may_refer_back_stays_tracked() -> None:
    clock = FakeClock(1000.0)
    table = table_of(clock)
    key = Tagged("tagged")
    key.table = table  # type: ignore[attr-defined]  # a cycle through the entry
    assert NearTable.fill(table, key, "v", table.ticket())
    assert gc.is_tracked(table.entries["tagged"])


@pytest.mark.parametrize("missing", [NearTable.missed, missed])
def test_a_miss_is_counted_and_reported_at_most_every_second(missing: Any) -> None:
    clock = FakeClock(1000.0)
    reports: list[Any] = []
    table = NearTable(NearOptions(max_age=1.0), clock=clock, report=reports.append)
    table.invalidate("k")  # the write sequence moves: the ticket carries it
    assert missing(table) == (1000.0, 1)
    clock.advance(0.5)
    assert missing(table) == (1000.5, 1)
    clock.advance(0.5)
    missing(table)
    assert [r.misses for r in reports] == [1, 3]  # the first miss, and the third: a second on
    assert table.stats().misses == 3


@pytest.mark.parametrize("filling", PATHS)
def test_a_fill_while_another_thread_holds_the_lock_waits_for_it(filling: Any) -> None:
    """A fill that finds the table's lock held (another thread inside a fill or a write)
    waits for it rather than changing the table under it."""
    clock = FakeClock(1000.0)
    table = table_of(clock)
    ticket = table.ticket()
    table._lock.acquire()
    done: list[bool] = []
    thread = threading.Thread(target=lambda: done.append(filling(table, "k", "v", ticket)))
    thread.start()
    thread.join(0.05)
    assert done == []
    assert table.entries == {}
    table._lock.release()
    thread.join()
    assert done == [True]
    assert table.lookup("k") is not None


@pytest.mark.parametrize("holding", [False, True], ids=["writes drop", "writes hold"])
@pytest.mark.parametrize("filling", PATHS)
def test_threads_filling_and_writing_str_values_keep_the_table_whole(
    filling: Any, holding: bool
) -> None:
    """Real threads on one table, switching as often as the interpreter allows, filling str
    values (the compiled case) past half full (the sketch, admission, sweeps: Python's),
    writers of this process invalidating, or holding what they wrote (``written``: two
    writers of one key race).  No lookup returns a value older than a write that
    completed before it began, and the table's books balance."""
    table = NearTable(NearOptions(max_age=0.02, max_bytes=2**16))
    keys = [f"k{i}" for i in range(400)]
    server = dict.fromkeys(keys, 0)
    completed = dict.fromkeys(keys, 0)
    guard = threading.Lock()
    errors: list[str] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(3000):
            key = rng.choice(keys[:50] if rng.random() < 0.5 else keys)
            began = completed[key]
            entry = table.lookup(key)
            if entry is not None:
                if int(entry.value) < began:
                    errors.append(f"{key}: version {entry.value} after {began} returned")
                continue
            ticket = table.ticket()
            with guard:
                seen = server[key]
            time.sleep(0)  # the reply's way back: other threads run (a write may land)
            filling(table, key, str(seen), ticket)

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(1500):
            key = rng.choice(keys[:50])
            ticket = table.ticket()  # before the write is sent
            with guard:
                server[key] += 1
                version = server[key]
            time.sleep(0)  # the reply's way back: another writer's may return first
            if holding:
                table.written(key, str(version), ticket)
            else:
                table.invalidate(key)
            with guard:
                completed[key] = max(completed[key], version)

    race(reader, writer)
    assert errors == []
    stats = table.stats()
    assert_whole(table)
    assert stats.fills > 0
    assert stats.invalidations > 0
