"""The near table's compiled paths where Python code runs in the middle of them: a clock
that lets another write in (as a test's clock, or a thread switch at its call, may)."""

from __future__ import annotations

from typing import Any

import pytest

from django_mcpatterns.core.near import NearOptions, NearTable
from django_mcpatterns.core.near._model_table import fill, missed
from tests.fakes import FakeClock


class WritingClock:
    """A clock whose every read is followed by a write of the process (before the caller
    goes on): what another thread may do while a Python clock runs."""

    def __init__(self) -> None:
        self.table: NearTable | None = None

    def __call__(self) -> float:
        if self.table is not None:
            self.table.invalidate("elsewhere")
        return 1000.0


@pytest.mark.parametrize("missing", [NearTable.missed, missed], ids=["python", "module"])
@pytest.mark.parametrize("reported", [False, True])
def test_a_miss_ticket_holds_the_write_sequence_read_after_the_clock(
    missing: Any, reported: bool
) -> None:
    clock = WritingClock()
    reports: list[Any] = []
    table = NearTable(
        NearOptions(max_age=1.0), clock=clock, report=reports.append if reported else None
    )
    for _ in range(1000):  # a sequence number no small int: freed when it is replaced
        table.invalidate("k")
    clock.table = table
    for _ in range(3):
        ticket = missing(table)
        assert ticket == (1000.0, table._seq)
    assert table.stats().misses == 3
    assert len(reports) == reported  # the first miss reports, the next two are not due


@pytest.mark.parametrize("filling", [NearTable.fill, fill], ids=["python", "module"])
def test_a_clock_of_ints_leaves_the_deadlines_python_adds(filling: Any) -> None:
    """``sent + max_age`` as Python adds them: ints stay ints (a fake clock's), floats floats."""
    clock = FakeClock(1000)
    table = NearTable(NearOptions(max_age=5), clock=clock)
    assert filling(table, "first", "v", table.ticket())  # the first fill sweeps: Python's
    assert filling(table, "k", "v", table.ticket())
    assert filling(table, "b", b"v", (1000.5, table._seq))
    deadlines = [(type(e.expires), e.expires) for e in table._order]
    assert deadlines == [(int, 1005), (int, 1005), (float, 1005.5)]
    assert [type(expires) for expires, _ in table._queue] == [int, int, float]


class CountingClock(FakeClock):
    def __init__(self, now: float) -> None:
        super().__init__(now)
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


@pytest.mark.parametrize("filling", [NearTable.fill, fill], ids=["python", "module"])
def test_a_fill_of_a_value_kept_apart_reads_the_clock_once(filling: Any) -> None:
    """A value copied or pickled (``keep``) goes Python's way before the clock is read:
    one read, as Python's fill makes (a clock moving between two reads could answer
    otherwise than one fill)."""
    clock = CountingClock(1000.0)
    table = NearTable(NearOptions(max_age=5.0), clock=clock)
    ticket = table.ticket()
    for value in ([1, 2], {"a": 1}, 7, "ключ"):
        clock.reads = 0
        assert filling(table, "k", value, ticket)
        assert clock.reads == 1


def whole(table: NearTable) -> None:
    """The table's parts agree: every entry in order at its slot, the bytes counted."""
    assert len(table.entries) == len(table._order)
    for i, entry in enumerate(table._order):
        assert entry.slot == i
        assert table.entries[entry.key] is entry
    assert table._bytes == sum(entry.size for entry in table._order)


@pytest.mark.parametrize("filling", [NearTable.fill, fill], ids=["python", "module"])
def test_a_key_held_under_a_str_subclass_whose_eq_lets_a_write_in(filling: Any) -> None:
    """A fill's lookup may run a key's ``__eq__`` (the key held under a str subclass):
    another thread may write meanwhile, unless the lock is held (Python's fill holds it;
    the compiled one, which has not taken it, must see the table changed)."""
    table = NearTable(NearOptions(max_age=5.0), clock=FakeClock(1000.0))

    class Key(str):
        __hash__ = str.__hash__

        def __eq__(self, other: object) -> bool:
            if not table._lock.locked():  # what another thread may do now
                table.invalidate("a")
                NearTable.fill(table, "b", "v" * 50, table.ticket())
            return str.__eq__(self, other)

    ticket = table.ticket()
    for key, value in (("first", "v"), ("a", "v" * 100), (Key("k"), "v")):
        NearTable.fill(table, key, value, ticket)
    assert filling(table, "k", "w", table.ticket())
    whole(table)
    assert type(table.entries["k"].key) is str
    assert table.entries["k"].value == "w"
