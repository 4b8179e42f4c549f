"""Ring migration (``OPTIONS["migrate_from"]``): the store over two rings, on real servers.

Five memcached servers: the old ring is the first four, the new ring all five
(a server added), unless a test says otherwise.  Both protocols, both drivers
(the asyncio store run through ``tests.aio.Blocking``).  Interleavings are
exact (``tests.fakes.Hooked`` runs another client's actions at a chosen
request), the concurrency drill uses real threads; nothing waits on the clock
but the TTL checks, which read what memcached holds.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_mcpatterns.core.client.migration import check_migrate_from
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import ConfigurationError
from django_mcpatterns.core.migrate import AsyncMigratingStore, MigratingStore, Tally
from django_mcpatterns.core.options import ClusterOptions
from tests.aio import Blocking
from tests.fakes import FakeClock, Hooked
from tests.harness import MemcachedServer, memcached_cluster

N = 400


@pytest.fixture(scope="module")
def five() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(5) as servers:
        yield servers


class Rings:
    """The old and new clusters of a test, and the migrating stores made over them."""

    def __init__(self, servers: list[MemcachedServer], protocol: str, driver: str) -> None:
        for server in servers:
            server.flush()
        self.five = servers
        self.specs = [server.spec for server in servers]
        self.options = ClusterOptions(protocol=protocol)  # type: ignore[arg-type]
        self.old = Cluster(self.specs[:4], self.options)
        self.new = Cluster(self.specs, self.options)
        # What memcached holds, read in meta mode whatever the test's protocol.
        self.probe_new = Cluster(self.specs)
        self.probe_old = Cluster(self.specs[:4])
        self.driver = driver
        self.clock = FakeClock()
        self.made: list[Blocking] = []

    def store(
        self,
        reads: str = "new",
        until: float | None = None,
        old: Any = None,
        new: Any = None,
        driver: str | None = None,
    ) -> Any:
        settings: dict[str, Any] = {"LOCATION": self.specs[:4], "reads": reads, "text_ttl": 30}
        if until is not None:
            settings["until"] = until
        source = check_migrate_from(settings, "libmemcached")
        assert source is not None
        old, new = old or self.old, new or self.new
        if (driver or self.driver) == "sync":
            return MigratingStore(new, old, source, Tally(), clock=self.clock)
        made = Blocking(
            AsyncMigratingStore(_twin(new), _twin(old), source, Tally(), clock=self.clock)
        )
        self.made.append(made)
        return made

    def moved(self, count: int = N) -> list[str]:
        """Keys the old ring places on another server than the new one."""
        store = self.store()
        return [k for k in (f"key:{i}" for i in range(count)) if store.placement.moved(k)]

    def stayed(self, count: int = N) -> list[str]:
        store = self.store()
        return [k for k in (f"key:{i}" for i in range(count)) if not store.placement.moved(k)]

    def close(self) -> None:
        for made in self.made:
            made.shutdown()
        for cluster in (self.old, self.new, self.probe_new, self.probe_old):
            cluster.close()


def _twin(cluster: Any) -> Any:
    """The asyncio twin of a cluster, or of the cluster a Hooked wraps (hooked too)."""
    if isinstance(cluster, Hooked):
        return _AsyncHooked(cluster)
    return cluster.aio


class _AsyncHooked:
    """A Hooked cluster's twin: the hooks run (sync) before the twin's coroutine is made."""

    def __init__(self, hooked: Hooked) -> None:
        self.hooked = hooked
        self.twin = hooked.store.aio

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.twin, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            hook = self.hooked.before.pop(name, None)
            if hook is not None:
                hook(*args)
            self.hooked.calls.append((name, args[0] if args else None))
            return target(*args, **kwargs)

        return call


@pytest.fixture(params=["meta", "text"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["sync", "async"])
def rings(
    five: list[MemcachedServer], protocol: str, request: pytest.FixtureRequest
) -> Iterator[Rings]:
    made = Rings(five, protocol, request.param)
    try:
        yield made
    finally:
        made.close()


def then(hooked: Hooked, name: str, skip: int, action: Callable[..., object]) -> None:
    """Run ``action`` before the ``skip + 1``-th call of ``name`` on ``hooked``."""
    if skip == 0:
        hooked.before[name] = action
    else:
        hooked.before[name] = lambda *args: then(hooked, name, skip - 1, action)


# -- the read fallback -----------------------------------------------------------------


def test_a_miss_of_a_moved_key_is_read_from_the_old_ring_and_copied_with_its_ttl(rings):
    moved, stayed = rings.moved(), rings.stayed()
    assert 0.1 < len(moved) / N < 0.35  # a fifth server takes about a fifth of the keys
    for i, key in enumerate(moved + stayed):
        rings.old.set(key, {"n": i}, 600)
    store = rings.store()
    assert [store.get(key) for key in moved + stayed] == [{"n": i} for i in range(N)]
    counts = store.tally.counts()
    assert counts["fallbacks"] == counts["old_hits"] == counts["copied"] == len(moved)
    assert all(rings.new.get(key) is not None for key in moved)
    ttls = [rings.probe_new.ttl(key) for key in moved]
    if rings.options.protocol == "meta":  # read with the value: within seconds of the original
        assert all(595 <= ttl <= 600 for ttl in ttls), ttls
    else:  # no TTL in text mode: the copy lives text_ttl seconds at most
        assert all(0 < ttl <= 30 for ttl in ttls), ttls
    store.get(moved[0])  # a hit on the new ring now: no fallback
    assert store.tally.counts()["fallbacks"] == len(moved)


def test_a_key_on_neither_ring_is_a_miss_and_copies_nothing(rings):
    store = rings.store()
    key = rings.moved()[0]
    assert store.get(key, "default") == "default"
    assert store.tally.counts() == {**store.tally.counts(), "old_hits": 0, "copied": 0}
    assert rings.probe_new.get(key) is None


def test_get_many_reads_the_moved_misses_from_the_old_ring(rings):
    keys = [f"key:{i}" for i in range(N)]
    for key in keys:
        rings.old.set(key, key.encode(), 300)
    store = rings.store()
    assert store.get_many(keys) == {key: key.encode() for key in keys}
    moved = rings.moved()
    assert store.tally.counts()["copied"] == len(moved)
    assert rings.new.get_many(moved) == {key: key.encode() for key in moved}


def test_in_place_edits_of_a_moved_key_start_from_its_old_value(rings):
    counter, text = rings.moved()[:2]
    rings.old.set(counter, 41, 300)
    rings.old.set(text, b"ab", 300)
    store = rings.store()
    assert store.incr(counter, 1) == 42
    assert store.append(text, b"c")
    assert rings.new.get(counter) == 42
    assert rings.new.get(text) == b"abc"
    assert rings.old.get(counter) is None
    assert rings.old.get(text) is None


def test_gets_of_a_moved_key_hands_out_the_new_rings_token(rings):
    key = rings.moved()[0]
    rings.old.set(key, "v", 300)
    store = rings.store()
    value, token = store.gets(key)
    assert value == "v"
    assert token is not None
    assert store.cas(key, "w", token, 300)
    assert rings.new.get(key) == "w"


def test_until_ends_the_read_fallback_and_never_the_deletes(rings):
    key, other = rings.moved()[:2]
    rings.old.set(key, "old", 300)
    rings.old.set(other, "old", 300)
    store = rings.store(until=rings.clock.now + 60)
    rings.clock.advance(61)
    assert store.get(key) is None  # the fallback is over: a plain miss on the new ring
    assert rings.old.get(key) == "old"
    store.delete(other)
    assert rings.old.get(other) is None


# -- deletes and writes -----------------------------------------------------------------


def test_a_delete_reaches_both_rings(rings):
    key = rings.moved()[0]
    rings.old.set(key, "old copy", 300)
    rings.new.set(key, "new copy", 300)
    store = rings.store()
    assert store.delete(key)
    assert rings.old.get(key) is None
    assert rings.new.get(key) is None
    keys = rings.moved()[1:6] + rings.stayed()[:5]
    for key in keys:
        rings.old.set(key, 1)
        rings.new.set(key, 1)
    store.delete_many(keys)
    assert rings.old.get_many(keys) == {}
    assert rings.new.get_many(keys) == {}


@pytest.mark.parametrize("reads", ["old", "new"])
def test_a_write_deletes_the_key_on_the_other_ring(rings, reads):
    key = rings.moved()[0]
    rings.old.set(key, "old copy", 300)
    rings.new.set(key, "new copy", 300)
    store = rings.store(reads=reads)
    assert store.set(key, "written", 300)
    written, other = (rings.old, rings.new) if reads == "old" else (rings.new, rings.old)
    assert written.get(key) == "written"
    assert other.get(key) is None
    many = rings.moved()[1:4]
    for k in many:
        other.set(k, "stale", 300)
    assert store.set_many(dict.fromkeys(many, "x"), 300) == []
    assert written.get_many(many) == dict.fromkeys(many, "x")
    assert other.get_many(many) == {}


def test_a_key_whose_server_stays_is_written_once_and_never_deleted_after(rings):
    key = rings.stayed()[0]
    store = rings.store()
    assert store.set(key, "v", 300)
    assert rings.old.get(key) == "v"  # the same server on both rings: kept
    assert store.tally.counts()["invalidations"] == 0


def test_the_old_stage_reads_and_writes_the_old_ring_and_copies_nothing(rings):
    key = rings.moved()[0]
    rings.old.set(key, "old", 300)
    store = rings.store(reads="old")
    assert store.get(key) == "old"
    assert rings.probe_new.get(key) is None
    assert store.tally.counts()["fallbacks"] == 0


# -- races: a delete or a write during a copy never leaves a stale value -------------------


@pytest.mark.parametrize(
    "when", ["before the placeholder", "before the old item is read", "before the fill"]
)
def test_a_delete_during_a_copy_wins(rings, when):
    key = rings.moved()[0]
    rings.old.set(key, "before the delete", 300)
    old, new = Hooked(rings.old), Hooked(rings.new)
    deleter = rings.store(driver="sync")  # another process, same stage

    def delete(*args: Any) -> None:
        assert deleter.delete(key)

    if when == "before the placeholder":
        then(new, "exchange", 0, delete)
    elif when == "before the old item is read":
        then(old, "exchange", 1, delete)  # the probe, then the read
    else:
        then(new, "exchange", 1, delete)  # the placeholder, then the fill
    reader = rings.store(old=old, new=new)
    reader.get(key)  # served what it read (before the delete, or nothing): concurrent
    assert not old.before
    assert not new.before
    assert rings.probe_new.get(key) is None
    assert rings.probe_old.get(key) is None
    assert reader.get(key) is None
    assert reader.tally.counts()["copied"] == 0


def test_a_copy_between_the_deletes_on_the_two_rings_finds_nothing_to_copy(rings):
    """The delete's first ring is done, its second not yet, when a reader copies the key:
    deleting the old ring first is what makes that reader find nothing (or its
    placeholder removed by the second delete)."""
    key = rings.moved()[0]
    rings.old.set(key, "before the delete", 300)
    reader = rings.store(driver="sync")  # another process
    old, new = Hooked(rings.old), Hooked(rings.new)
    calls: list[str] = []

    def between(*args: Any) -> None:
        calls.append("delete")
        if len(calls) == 2:  # the first ring's delete is done, the second's not sent yet
            reader.get(key)

    old.before["delete"] = new.before["delete"] = between
    deleter = rings.store(old=old, new=new)
    deleter.delete(key)
    assert calls == ["delete", "delete"]
    assert rings.probe_new.get(key) is None
    assert rings.probe_old.get(key) is None


def test_a_write_during_a_copy_wins(rings):
    key = rings.moved()[0]
    rings.old.set(key, "old", 300)
    new = Hooked(rings.new)
    writer = rings.store(driver="sync")
    then(new, "exchange", 1, lambda *args: writer.set(key, "written", 300))
    reader = rings.store(new=new)
    reader.get(key)
    assert rings.new.get(key) == "written"
    assert rings.old.get(key) is None
    assert reader.tally.counts()["copy_dropped"] == 1


def test_a_copy_in_flight_elsewhere_serves_the_old_value_without_a_second_copy(rings):
    key = rings.moved()[0]
    rings.old.set(key, "old", 300)
    new = Hooked(rings.new)
    other = rings.store(driver="sync")  # another process's reader
    reader = rings.store(new=new)
    then(new, "exchange", 0, lambda *args: other.get(key))  # its copy lands first
    assert reader.get(key) == "old"
    assert reader.tally.counts()["copy_skipped"] == 1
    assert rings.new.get(key) == "old"


def test_no_read_after_a_delete_returns_the_deleted_value(rings):
    """Readers copy keys while a deleter deletes them: once a delete has returned, no read
    that starts after it serves the value (real threads or tasks, many interleavings)."""
    keys = rings.moved(2000)[:200]
    for key in keys:
        rings.old.set(key, "v", 300)
    sequence = itertools.count()
    deleted: dict[str, int] = {}
    stale: list[tuple[str, int, int]] = []
    lock = threading.Lock()
    done = threading.Event()

    def reader(seed: int) -> None:
        store = rings.store(driver="sync")
        rng = random.Random(seed)
        while not done.is_set():
            key = rng.choice(keys)
            started = next(sequence)
            if store.get(key) is not None:
                with lock:
                    gone = deleted.get(key)
                if gone is not None and started > gone:
                    stale.append((key, started, gone))

    if rings.driver == "async":  # tasks of one loop: readers and the deleter interleave there
        store = rings.store()

        async def aread(seed: int) -> None:
            rng = random.Random(seed)
            while not done.is_set():
                key = rng.choice(keys)
                started = next(sequence)
                if await store.store.get(key) is not None and deleted.get(key, started) < started:
                    stale.append((key, started, deleted[key]))

        async def adelete() -> None:
            for key in random.Random(7).sample(keys, len(keys)):
                await store.store.delete(key)
                deleted[key] = next(sequence)
            done.set()

        async def drill() -> None:
            await asyncio.gather(adelete(), *(aread(seed) for seed in range(8)))

        store.run(drill)
    else:
        threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        deleter = rings.store()
        try:
            for key in random.Random(7).sample(keys, len(keys)):
                deleter.delete(key)
                with lock:
                    deleted[key] = next(sequence)
        finally:
            done.set()
            for thread in threads:
                thread.join()
    assert stale == []
    assert rings.probe_new.get_many(keys) == {}
    assert rings.probe_old.get_many(keys) == {}


# -- an old server that is down ---------------------------------------------------------


def test_a_dead_old_server_is_a_miss_and_deletes_aimed_at_it_are_journaled(protocol):
    with memcached_cluster(5) as servers:  # a server removed: the old ring has five
        specs = [s.spec for s in servers]
        options = ClusterOptions(protocol=protocol, retry_timeout=60)  # type: ignore[arg-type]
        old = Cluster(specs, dataclass_replace(options, failover="miss"))
        new = Cluster(specs[:4], options)
        source = check_migrate_from({"LOCATION": specs}, "libmemcached")
        assert source is not None
        store = MigratingStore(new, old, source, Tally())
        gone = servers[4].spec
        keys = [f"key:{i}" for i in range(N)]
        on_gone = [k for k in keys if old.ring.get_node(k) == gone]
        for key in on_gone:
            old.set(key, "v", 300)
        servers[4].kill()
        assert store.get(on_gone[0]) is None
        assert store.delete(on_gone[1]) is False
        assert old.journal() == {gone: 1}  # run before it serves again (harmless if empty)
        assert store.get_many(on_gone) == {}
        old.close()
        new.close()


def test_deletes_on_an_old_server_in_its_retry_wait_run_before_it_serves_again(rings):
    """A stalled old server fails fast during its retry wait; the deletes the new stage aims
    at it (a delete, a write's invalidation, both in bulk) are journaled there, so once it
    answers no miss on the new ring copies a deleted value back, and no process of the old
    stage reads one."""
    stalled = rings.five[0]
    settings: dict[str, Any] = {"timeout": 0.3, "connect_timeout": 0.3, "retry_timeout": 30.0}
    old = Cluster(rings.specs[:4], dataclass_replace(rings.options, **settings))
    try:
        # How many of N moved keys the stalled server held depends on the ports the ring
        # hashes: draw from ten times as many, so four are there whatever the ports.
        on_stalled = [k for k in rings.moved(10 * N) if old.ring.get_node(k) == stalled.spec]
        keys = on_stalled[:4]
        assert len(keys) == 4
        for key in keys:
            rings.probe_old.set(key, "before", 300)  # written by a process of the old stage
        store = rings.store(old=old)
        stalled.pause()
        try:
            assert store.delete(keys[0]) is False  # the new ring did not hold it
            store.delete_many([keys[1]])
            assert store.set(keys[2], "written", 300)
            assert store.set_many({keys[3]: "written"}, 300) == []
            assert old.journal() == {stalled.spec: 4}
        finally:
            stalled.resume()
        wait_for(lambda: not old.journal(), "the repairs")
        assert rings.probe_old.get_many(keys) == {}
        assert store.get_many(keys) == dict.fromkeys(keys[2:], "written")
    finally:
        old.close()


def wait_for(condition: Callable[[], bool], what: str, patience: float = 10.0) -> None:
    deadline = time.monotonic() + patience
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what}")
        time.sleep(0.005)


def dataclass_replace(options: ClusterOptions, **changes: Any) -> ClusterOptions:
    import dataclasses

    return dataclasses.replace(options, **changes)


# -- the option -----------------------------------------------------------------------


def test_the_option_is_checked_with_the_names_of_its_keys():
    with pytest.raises(ConfigurationError, match="needs 'LOCATION'"):
        check_migrate_from({}, "libmemcached")
    with pytest.raises(ConfigurationError, match="unknown key 'until_'; valid keys: 'LOCATION'"):
        check_migrate_from({"LOCATION": "a:1", "until_": 1}, "libmemcached")
    with pytest.raises(ConfigurationError, match="'reads' is 'old'"):
        check_migrate_from({"LOCATION": "a:1", "reads": "both"}, "libmemcached")
    with pytest.raises(ConfigurationError, match="needs a time zone"):
        check_migrate_from({"LOCATION": "a:1", "until": "2026-12-01T00:00:00"}, "libmemcached")
    with pytest.raises(ConfigurationError, match="invalid 'ketama'"):
        check_migrate_from({"LOCATION": "a:1", "ketama": "md5"}, "libmemcached")
    with pytest.raises(ConfigurationError, match="option 'migrate_from'"):
        ClusterOptions.from_mapping({"migrate_from": ["a:1"]})
    until = "2026-12-01T00:00:00Z"
    source = check_migrate_from({"LOCATION": "a:1;b:2", "until": until}, "twemproxy")
    assert source is not None
    assert source.nodes == ["a:1", "b:2"]
    assert source.ketama == "twemproxy"
    assert source.until == 1796083200.0
    assert source.reads == "new"


@given(
    until=st.one_of(st.none(), st.floats(0, 2e9), st.datetimes(timezones=st.timezones())),
    now=st.floats(0, 2e9),
    reads=st.sampled_from(["old", "new"]),
)
def test_the_fallback_is_open_in_the_new_stage_until_until(until, now, reads):
    source = check_migrate_from({"LOCATION": "a:1", "until": until, "reads": reads}, "libketama")
    assert source is not None
    end = None if until is None else (until if isinstance(until, float) else until.timestamp())
    assert source.falls_back(now) == (reads == "new" and (end is None or now < end))


# -- the warm-up's key listing ------------------------------------------------------------


class _Dump:
    """A connection whose socket answers metadump with ``reply``, in the given chunks."""

    address = ("127.0.0.1", 1)

    def __init__(self, chunks: list[bytes | None]) -> None:
        self.chunks = chunks  # None: a read that timed out
        self.sent: list[bytes] = []

    def connect(self) -> _Dump:
        return self

    def sendall(self, data: bytes) -> None:
        self.sent.append(data)

    def recv(self, size: int) -> bytes:
        chunk = self.chunks.pop(0) if self.chunks else b""
        if chunk is None:  # the socket's I/O timeout (SO_RCVTIMEO): EAGAIN
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return chunk


@given(
    keys=st.lists(st.binary(min_size=1, max_size=40), unique=True, max_size=30),
    cuts=st.lists(st.integers(1, 50), max_size=60),
)
def test_metadump_reads_every_key_whatever_the_chunks(keys, cuts):
    from urllib.parse import quote_from_bytes

    from django_mcpatterns.core.migrate.warm import metadump

    lines = [
        b"key=%s exp=%d la=1 cas=%d fetch=no cls=1 size=%d\n"
        % (quote_from_bytes(key).encode(), -1 if i % 2 else 1_700_000_000 + i, i + 1, 60 + i)
        for i, key in enumerate(keys)
    ]
    reply = b"".join(lines) + b"END\r\n"
    chunks, start = [], 0
    for cut in cuts:
        if start >= len(reply):
            break
        chunks.append(reply[start : start + cut])
        start += cut
    chunks.append(reply[start:])
    dump = _Dump([c for c in chunks if c])
    listed = [entry for page in metadump(dump) for entry in page]
    assert dump.sent == [b"lru_crawler metadump hash\r\n"]
    assert [e.key for e in listed] == keys
    assert [e.exp for e in listed] == [-1 if i % 2 else 1_700_000_000 + i for i in range(len(keys))]
    assert [e.size for e in listed] == [60 + i for i in range(len(keys))]


def test_metadump_refused_is_a_warm_error_naming_the_reply():
    from django_mcpatterns.core.migrate.warm import WarmError, metadump

    dump = _Dump([b"CLIENT_ERROR bad command line format\r\n"])
    with pytest.raises(WarmError, match="CLIENT_ERROR bad command line format"):
        list(metadump(dump))
    with pytest.raises(WarmError, match="closed the connection"):
        list(metadump(_Dump([b"key=a exp=-1 size=1\n"])))


# -- chunked values (large_values="chunk") -------------------------------------------------


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_chunked_values_migrate_too(five, protocol):
    from django_mcpatterns.binding import Conventions, bind_cluster
    from django_mcpatterns.core.cluster import reset_shared_clusters

    for server in five:
        server.flush()
    specs = [server.spec for server in five]
    options: dict[str, Any] = {"protocol": protocol, "large_values": "chunk"}
    before = bind_cluster(specs[:4], options, Conventions())
    migrate = {"LOCATION": specs[:4], "reads": "new"}
    after = bind_cluster(specs, {**options, "migrate_from": migrate}, Conventions())
    try:
        big = {f"big:{i}": bytes([i]) * 2_500_000 for i in range(6)}  # chunked at 1 MB
        for key, value in big.items():
            assert before.values.set(key, value, 300)
        assert after.values.get_many(list(big)) == big  # read through from the old ring
        for key in big:
            after.values.delete(key)
        assert before.values.get_many(list(big)) == {}  # deleted on both rings
        assert after.values.get_many(list(big)) == {}
    finally:
        reset_shared_clusters()


def test_metadump_waits_through_timeouts_then_gives_up_naming_the_server():
    from django_mcpatterns.core.migrate.warm import DUMP_WAITS, WarmError, metadump

    slow = [None, b"key=a exp=-1 size=1\n", *[None] * DUMP_WAITS, b"key=b exp=-1 size=2\nEND\r\n"]
    assert [e.key for page in metadump(_Dump(slow)) for e in page] == [b"a", b"b"]
    stuck = [b"key=a exp=-1 size=1\n", *[None] * (DUMP_WAITS + 1)]
    with pytest.raises(WarmError, match="sent no more of its metadump"):
        list(metadump(_Dump(stuck)))


@pytest.mark.parametrize("stage", ["old", "new"])
def test_a_copy_between_the_two_rings_forgets_finds_nothing_to_copy(rings, stage):
    """A repair (``forget``: the ORM's dropped registries, a stamp not renewed) goes to the
    old ring first in either stage, as a delete does: a stage-2 reader copying between
    the two rings' forgets finds nothing, or its placeholder removed by the second."""
    key = rings.moved()[0]
    rings.old.set(key, "before the repair", 300)
    reader = rings.store(driver="sync")  # a stage-2 process
    old, new = Hooked(rings.old), Hooked(rings.new)
    calls: list[str] = []

    def between(*args: Any) -> None:
        calls.append("forget")
        if len(calls) == 2:  # the first ring's forget is done, the second's not sent yet
            reader.get(key)

    old.before["forget"] = new.before["forget"] = between
    repairer = rings.store(stage, old=old, new=new)
    repairer.forget(key)
    assert calls == ["forget", "forget"]
    assert rings.probe_new.get(key) is None
    assert rings.probe_old.get(key) is None
