"""``mcpatterns_warm``'s copier (:class:`Warmer`) on five real servers, both protocols.

The old ring is the first four servers, the new ring all five.  What the
command's tests (tests/django, tests/flask) leave out: the TTLs the copies get,
pattern state left where it is, a delete or a write during a copy (exact
interleavings: another process's action slipped in between the copier's steps),
and the pace (a fake clock: nothing here waits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_mcpatterns.core.client.migration import check_migrate_from
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.migrate import MigratingStore, Tally
from django_mcpatterns.core.migrate.warm import Warmer
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.sets import AppendSets
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, memcached_cluster

N = 300


@pytest.fixture(scope="module")
def five() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(5) as servers:
        yield servers


class Rings:
    """The old and new clusters, a process of the ``"old"`` stage, and meta probes."""

    def __init__(self, servers: list[MemcachedServer], protocol: str) -> None:
        for server in servers:
            server.flush()
        self.specs = [server.spec for server in servers]
        options = ClusterOptions(protocol=protocol)  # type: ignore[arg-type]
        self.old = Cluster(self.specs[:4], options)
        self.new = Cluster(self.specs, options)
        source = check_migrate_from({"LOCATION": self.specs[:4], "reads": "old"}, "libmemcached")
        assert source is not None
        self.process = MigratingStore(self.new, self.old, source, Tally())
        self.probe_old = Cluster(self.specs[:4])  # what memcached holds, read in meta mode
        self.probe_new = Cluster(self.specs)

    def moved(self, prefix: str = "key", count: int = N) -> list[str]:
        """Keys whose server on the new ring is another than on the old one."""
        old, new = self.old.router.locate, self.new.router.locate
        keys = (f"{prefix}:{i}" for i in range(count))
        return [k for k in keys if old(k.encode()) != new(k.encode())]

    def close(self) -> None:
        for cluster in (self.old, self.new, self.probe_old, self.probe_new):
            cluster.close()


@pytest.fixture(params=["meta", "text"])
def rings(five: list[MemcachedServer], request: pytest.FixtureRequest) -> Iterator[Rings]:
    made = Rings(five, str(request.param))
    try:
        yield made
    finally:
        made.close()


def test_the_copies_keep_their_ttls_and_a_second_run_copies_nothing(rings):
    keys = [f"key:{i}" for i in range(N)]
    for i, key in enumerate(keys):
        rings.old.set(key, {"n": i}, 600 + 10 * (i % 50))
    rings.old.set("forever", "no expiry", 0)
    moved = rings.moved()
    forever = rings.old.router.locate(b"forever") != rings.new.router.locate(b"forever")
    stats = Warmer(rings.new, rings.old).run()
    assert stats.copied == len(moved) + forever
    assert stats.in_place == N + 1 - stats.copied
    assert stats.failed == stats.lost == stats.gone == 0
    assert rings.new.get_many(keys) == {key: {"n": i} for i, key in enumerate(keys)}
    for key in moved:  # text mode too: the dump's expiry, against the server's clock
        left_old, left_new = rings.probe_old.ttl(key), rings.probe_new.ttl(key)
        assert left_old is not None
        assert left_new is not None
        assert abs(left_old - left_new) <= 5
    again = Warmer(rings.new, rings.old).run()
    assert again.copied == 0
    assert again.present == len(moved) + forever


def test_pattern_state_stays_on_the_old_ring(rings):
    """Locks, set members, counters and raw bytes are not a serializer's value: skipped."""
    counters, raw = rings.moved("counter", 40)[:3], rings.moved("raw", 40)[:3]
    sets, locks = rings.moved("set", 40)[:3], rings.moved("lock", 40)[:3]
    for key in counters:
        rings.old.set(key, 7, 600)
        rings.old.incr(key, 1)
    for key in raw:
        rings.old.set(key, b"\x00raw", 600)
    members = AppendSets(rings.old)
    for key in sets:
        members.sadd(key, "a", "b")
    held = [Lock(rings.old, key, 60) for key in locks]
    for lock in held:
        assert lock.acquire()
    stats = Warmer(rings.new, rings.old).run()
    assert stats.copied == 0
    assert stats.not_plain == len(counters + raw + sets + locks)
    fifth = rings.probe_new.stats()[rings.specs[4]]
    assert int(fifth["curr_items"]) == 0  # every moved key lands there: nothing did
    for lock in held:
        lock.release()  # each still held: its token untouched on the old ring


class Interleaved(Warmer):
    """A warmer that runs ``action`` at one point of its copy (``when``), once."""

    def __init__(self, rings: Rings, when: str, action: Callable[[], object]) -> None:
        super().__init__(rings.new, rings.old)
        self.when = when
        self.action: Callable[[], object] | None = action

    def _fire(self, when: str) -> None:
        if self.when == when and self.action is not None:
            action, self.action = self.action, None
            action()

    def _place(self, kbs: list[bytes]) -> dict[bytes, bytes]:
        self._fire("before the placeholder")
        return super()._place(kbs)

    def _read(self, reads: Any, kbs: list[bytes], exps: Any, server_time: int) -> Any:
        self._fire("before the old item is read")
        items = super()._read(reads, kbs, exps, server_time)
        self._fire("before the fill")
        return items


WHEN = ["before the placeholder", "before the old item is read", "before the fill"]


@pytest.mark.parametrize("when", WHEN)
def test_a_delete_during_a_copy_never_resurrects_the_value(rings, when):
    key = rings.moved()[0]
    rings.old.set(key, "before the delete", 600)
    warmer = Interleaved(rings, when, lambda: rings.process.delete(key))
    stats = warmer.run()
    assert warmer.action is None  # the delete ran
    assert stats.copied == 0
    assert stats.gone + stats.lost == 1
    assert rings.probe_old.get(key) is None
    assert rings.probe_new.get(key) is None  # no value, no placeholder left behind


@pytest.mark.parametrize("when", WHEN)
def test_a_write_during_a_copy_is_never_overwritten_by_the_older_value(rings, when):
    key = rings.moved()[0]
    rings.old.set(key, "older", 600)
    warmer = Interleaved(rings, when, lambda: rings.process.set(key, "newer", 600))
    stats = warmer.run()
    assert warmer.action is None
    assert rings.probe_old.get(key) == "newer"
    assert rings.probe_new.get(key) in (None, "newer")  # a copy of the write, or nothing
    assert stats.copied + stats.lost + stats.gone == 1


def test_the_rate_paces_the_copy_and_progress_counts_every_key(rings):
    for i in range(N):
        rings.old.set(f"key:{i}", i, 600)
    clock, seen = FakeClock(), []
    warmer = Warmer(
        rings.new,
        rings.old,
        rate=50,
        batch=10,
        clock=clock,
        sleep=clock.sleep,
        progress=lambda done, total, stats: seen.append((done, total)),
    )
    started = clock.now
    stats = warmer.run()
    assert stats.listed == N
    assert clock.now - started == pytest.approx(N / 50)  # 50 keys a second: 6 s of sleeps
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert seen[-1] == (N, N)
    with pytest.raises(ValueError, match="rate must be a positive number"):
        Warmer(rings.new, rings.old, rate=0)
