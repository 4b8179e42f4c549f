"""Drills for replicated hot keys and the gutter pool: SIGKILL and SIGSTOP on real servers.

Each drill counts what callers saw: misses, and *stale reads* (a value older
than the last write acknowledged to anyone), which must be zero.  The last
test measures the hit ratio of a one-server outage under each failover policy
(``miss``, ``remap``, ``gutter``, replication) and the stale reads after the
server comes back; run with ``-s`` for the table (docs/failures.md quotes it).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from django_mcpatterns.core.chunks import AsyncChunkedStore, ChunkedStore
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import NodeUnavailableError
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.replicas import CopyToken
from django_mcpatterns.core.stampede import Stampede
from tests.harness import PATIENCE, MemcachedServer, memcached_cluster

pytestmark = pytest.mark.slow

TIMEOUT = 0.25
FAST_FAILOVER = {
    "timeout": TIMEOUT,
    "connect_timeout": TIMEOUT,
    "retry_attempts": 1,
    "retry_timeout": 0.2,
    "dead_timeout": 0.4,
}
# For the drills that stop no server: a quarter second is missed on a loaded machine, and a
# live replica taken for dead would change what they measure.
PATIENT = {"timeout": PATIENCE, "connect_timeout": PATIENCE}


@pytest.fixture
def six() -> Iterator[list[MemcachedServer]]:
    """Four main servers and two for the gutter, the test's own (it kills and stalls them)."""
    with memcached_cluster(6) as servers:
        yield servers


def build(servers: list[MemcachedServer], gutter: list[MemcachedServer] = (), **options) -> Cluster:
    for server in [*servers, *gutter]:
        server.flush()
    settings = dict(FAST_FAILOVER, **options)
    if gutter:
        settings.update(failover="gutter", gutter=[s.spec for s in gutter])
    return Cluster([s.spec for s in servers], ClusterOptions(**settings))


def server_of(servers: list[MemcachedServer], node: str) -> MemcachedServer:
    return next(s for s in servers if s.spec == node)


def wait_until_served(cluster: Cluster, key: str, expected: object, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cluster.get(key) == expected:
            return
        time.sleep(0.05)


# -- replication ----------------------------------------------------------------------


def test_killing_one_replica_costs_no_miss(six):
    cluster = build(six[:4], replicate={"hot:": 3})
    keys = [f"hot:{i}" for i in range(40)]
    for key in keys:
        assert cluster.set(key, key)
    victim = server_of(six, cluster.replicas(keys[0])[0])
    victim.kill()
    misses = sum(cluster.get(key) != key for _ in range(5) for key in keys)
    assert misses == 0


def test_a_stalled_replica_never_serves_the_value_it_missed(six):
    """SIGSTOP one replica, write a new value, resume it: no read returns the old value."""
    cluster = build(six[:4], replicate={"hot:": 3})
    key = "hot:stalled"
    assert cluster.set(key, "old")
    stalled = server_of(six, cluster.replicas(key)[1])
    stalled.pause()
    try:
        assert cluster.set(key, "new")  # the stalled copy times out: journaled
        assert cluster.journal() == {stalled.spec: 1}
    finally:
        stalled.resume()
    seen = Counter(cluster.get(key) for _ in range(600))
    time.sleep(0.5)  # past every retry wait: the stalled copy serves again
    seen.update(cluster.get(key) for _ in range(300))
    assert seen["old"] == 0, seen
    assert seen["new"] == 900
    assert cluster.journal() == {}
    served = cluster.stats()[stalled.spec]
    assert served["get_hits"] + served["get_misses"] > 0  # it was read from again


def test_a_write_never_sent_to_a_replica_marked_dead_is_never_read_back_from_it(six):
    """The write a stalled copy times out on still lands when it resumes (it was sent): the
    journal matters for the writes sent while the copy was dead, which never reach it."""
    cluster = build(six[:4], replicate={"hot:": 3})
    key = "hot:never-sent"
    assert cluster.set(key, "old")
    stalled = server_of(six, cluster.replicas(key)[2])
    stalled.pause()
    try:
        assert cluster.set(key, "sent")  # times out on the stalled copy: dead now
        assert cluster.health()[stalled.spec].state == "dead"
        assert cluster.set(key, "newest")  # never sent to it
    finally:
        stalled.resume()
    time.sleep(0.6)  # past the dead time: the copy serves again (and holds "sent")
    seen = Counter(cluster.get(key) for _ in range(300))
    assert seen == {"newest": 300}, seen
    served = cluster.stats()[stalled.spec]
    assert served["get_hits"] + served["get_misses"] > 0  # it was read from again


def test_a_delete_the_stalled_replica_missed_is_replayed(six):
    cluster = build(six[:4], replicate={"hot:": 3})
    key = "hot:deleted"
    assert cluster.set(key, "old")
    stalled = server_of(six, cluster.replicas(key)[2])
    stalled.pause()
    try:
        assert cluster.delete(key)
    finally:
        stalled.resume()
    time.sleep(0.5)
    assert [cluster.get(key) for _ in range(300)] == [None] * 300


def test_async_twin_shares_the_replicas_and_the_journal(six):
    cluster = build(six[:4], replicate={"hot:": 3})
    twin = cluster.aio
    key = "hot:async"

    async def write(value: str) -> bool:
        return await twin.set(key, value)

    async def reads(n: int) -> list[object]:
        return [await twin.get(key) for _ in range(n)]

    assert asyncio.run(write("old"))
    before = {node: s["get_hits"] for node, s in cluster.stats().items()}
    assert asyncio.run(reads(150)) == ["old"] * 150
    served = {node: s["get_hits"] - before[node] for node, s in cluster.stats().items()}
    assert all(served[node] >= 20 for node in cluster.replicas(key)), served
    stalled = server_of(six, cluster.replicas(key)[0])
    stalled.pause()
    try:
        assert asyncio.run(write("new"))
        assert cluster.journal() == {stalled.spec: 1}
    finally:
        stalled.resume()
    time.sleep(0.5)
    assert set(asyncio.run(reads(300))) == {"new"}
    assert cluster.journal() == {}

    async def many() -> dict:
        await twin.set_many({"hot:m1": 1, "hot:m2": 2, "cold:m": 3})
        return await twin.get_many(["hot:m1", "hot:m2", "cold:m"])

    assert asyncio.run(many()) == {"hot:m1": 1, "hot:m2": 2, "cold:m": 3}


# -- replicated values in chunks (large_values="chunk") ---------------------------------

ITEM_LIMIT = 1024 * 1024  # memcached's default -I
LARGE = 1_500_000  # two chunks


def test_concurrent_readers_never_delete_a_replicated_chunked_value(six):
    """Each acknowledged set of a value in chunks is readable: its chunks reach every copy
    before its manifest reaches any, so a reader never sees a manifest without its chunks
    (and never deletes a fresh value as broken)."""
    cluster = build(six[:4], replicate={"big:": 3}, **PATIENT)
    store = ChunkedStore(cluster, ITEM_LIMIT)
    key = "big:report"
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            store.get(key)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for thread in readers:
        thread.start()
    lost = 0
    try:
        for _ in range(30):
            value = os.urandom(LARGE)
            assert store.set(key, value)
            lost += store.get(key) != value
    finally:
        stop.set()
        for thread in readers:
            thread.join()
    assert lost == 0


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_replicated_chunked_value_survives_its_homes_death(six, form):
    """The chunks live where the manifest lives: on every replica, not on the home alone."""
    cluster = build(six[:4], replicate={"big:": 3}, retry_attempts=3)
    store = ChunkedStore(cluster, ITEM_LIMIT)
    home = cluster.replicas("big:0")[0]
    homed = [k for k in (f"big:{i}" for i in range(40)) if cluster.replicas(k)[0] == home]
    values = {key: os.urandom(LARGE) for key in homed[:3]}
    for key, value in values.items():
        assert store.set(key, value)
    server_of(six, home).kill()

    def reads() -> list[object]:
        if form == "sync":
            return [store.get(key) for key in values for _ in range(10)]

        async def aread() -> list[object]:
            twin = AsyncChunkedStore(cluster.aio, ITEM_LIMIT)
            return [await twin.get(key) for key in values for _ in range(10)]

        return asyncio.run(aread())

    found = reads()
    assert sum(value is None for value in found) == 0
    assert found == [value for value in values.values() for _ in range(10)]
    many = store.get_many(list(values))
    assert many == values


# -- the gutter -----------------------------------------------------------------------


def test_a_dead_servers_keys_are_served_by_the_gutter_with_short_ttls(six):
    cluster = build(six[:4], six[4:], gutter_ttl=3)
    key = next(f"k{i}" for i in range(1000) if cluster.ring.get_node(f"k{i}") == six[0].spec)
    assert cluster.set(key, "before", 3600)
    six[0].kill()
    assert cluster.get(key) is None  # the gutter has never seen it: one miss
    assert cluster.set(key, "outage", 3600)
    assert cluster.get(key) == "outage"  # from the gutter
    ttls = [t for server in six[4:] if (t := _ttl(server, key)) is not None]
    assert len(ttls) == 1  # one gutter server holds it...
    assert 0 < ttls[0] <= 3  # ...for gutter_ttl seconds, not an hour
    assert cluster.incr(key) is None  # in-place edits fail as under "miss", nothing raises
    six[0].start()  # back, empty
    time.sleep(0.5)
    wait_until_served(cluster, key, None)
    assert cluster.get(key) is None  # its keys went back to it
    assert cluster.set(key, "after")
    assert cluster.get(key) == "after"


def test_a_stalled_server_never_serves_what_it_had_before_its_gutter_time(six):
    cluster = build(six[:4], six[4:])
    keys = [f"k{i}" for i in range(200) if cluster.ring.get_node(f"k{i}") == six[1].spec]
    for key in keys:
        assert cluster.set(key, "before")
    six[1].pause()
    try:
        for key in keys:
            cluster.set(key, "during")  # the first times out, the rest go to the gutter
        assert cluster.journal()[six[1].spec] == len(keys)
        assert {cluster.get(key) for key in keys} <= {"during", None}
    finally:
        six[1].resume()
    time.sleep(0.5)
    seen = Counter(cluster.get(key) for _ in range(3) for key in keys)
    assert seen["before"] == 0, seen
    assert cluster.journal() == {}
    assert cluster.get_many(keys) == {}  # deleted on the server; the gutter's are not read


def test_a_lock_is_never_taken_in_the_gutter(six):
    """One process sees the server dead, another sees it alive: the lock is held once."""
    cluster = build(six[:4], six[4:])
    name = next(f"job{i}" for i in range(1000) if cluster.ring.get_node(f"job{i}") == six[2].spec)
    six[2].pause()
    try:
        seeing_dead = Lock(cluster, name, timeout=30)
        cluster.get(name)  # the server times out: dead for this cluster
        with pytest.raises(NodeUnavailableError):  # as under "miss": never in the gutter
            seeing_dead.acquire(blocking=False)
    finally:
        six[2].resume()
    elsewhere = Cluster([s.spec for s in six[:4]], ClusterOptions(**FAST_FAILOVER))
    seeing_alive = Lock(elsewhere, name, timeout=30)
    assert seeing_alive.acquire(blocking=False)
    seeing_alive.release()


def test_a_dead_replicas_share_goes_to_the_gutter(six):
    """The interplay: a replica in the gutter, then back, with no miss and no stale read."""
    cluster = build(six[:4], six[4:], replicate={"hot:": 2})
    key = "hot:both"
    assert cluster.set(key, "old")
    copy = server_of(six, cluster.replicas(key)[1])
    copy.pause()
    try:
        assert cluster.set(key, "new")  # the copy times out: journaled
        assert cluster.set(key, "newer")  # the copy is dead: its share goes to the gutter
        gutter_sets = sum(s["cmd_set"] for s in cluster.stats(gutter=True).values())
        assert gutter_sets == 1
        assert Counter(cluster.get(key) for _ in range(100)) == {"newer": 100}
    finally:
        copy.resume()
    time.sleep(0.5)
    seen = Counter(cluster.get(key) for _ in range(300))
    assert seen == {"newer": 300}
    assert cluster.journal() == {}


def _ttl(server: MemcachedServer, key: str) -> int | None:
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=2) as sock:
        sock.sendall(b"mg " + key.encode() + b" t\r\n")
        reply = sock.recv(128)
    if not reply.startswith(b"HD"):
        return None
    return int(reply.split(b" t")[1].split()[0])


# -- measured: a one-server outage under each policy ---------------------------------------


POLICIES = {
    "miss": {},
    "remap": {"failover": "remap"},
    "gutter": {"gutter": True},
    "replicate x2": {"replicate": {"key:": 2}},
    "replicate x2 + gutter": {"replicate": {"key:": 2}, "gutter": True},
}


def outage(servers: list[MemcachedServer], policy: dict) -> tuple[float, int, float]:
    """Read-through traffic over 400 keys while one of 4 servers is down, then after it heals.

    Each round reads every key; a miss computes and stores the value (as
    get_or_set does).  Each round also bumps 10% of the keys to a new version.
    The server is SIGSTOPped (it comes back holding what it had) after the
    first round.  Returns the hit ratio during the outage, the stale reads after
    it heals (a value older than the key's latest version), and the hit ratio
    after.
    """
    options = dict(policy)
    gutter = servers[4:] if options.pop("gutter", False) else []
    cluster = build(servers[:4], gutter, **options)
    keys = [f"key:{i}" for i in range(400)]
    version = dict.fromkeys(keys, 0)

    def round_(count: Counter, bump: int) -> None:
        for i, key in enumerate(keys):
            found = cluster.get(key)
            if found is None:
                count["miss"] += 1
                cluster.set(key, (key, version[key]))
            else:
                count["hit"] += 1
                if found != (key, version[key]):
                    count["stale"] += 1
            if i % 10 == bump:
                version[key] += 1
                cluster.set(key, (key, version[key]))

    round_(Counter(), -1)
    servers[3].pause()
    during: Counter = Counter()
    try:
        for r in range(5):
            round_(during, r)
    finally:
        servers[3].resume()
    time.sleep(0.6)  # every retry wait is over: the server is used again
    after: Counter = Counter()
    for r in range(3):
        round_(after, 5 + r)
    cluster.close()
    return (
        during["hit"] / (during["hit"] + during["miss"]),
        after["stale"],
        after["hit"] / (after["hit"] + after["miss"]),
    )


def test_hit_ratios_of_a_one_server_outage_under_each_policy(six):
    results = {name: outage(six, policy) for name, policy in POLICIES.items()}
    print("\npolicy                   hit ratio (outage)   stale reads after   hit ratio after")
    for name, (during, stale, after) in results.items():
        print(f"{name:<24} {during:>18.1%} {stale:>19} {after:>17.1%}")
    assert results["miss"][0] < 0.85  # a quarter of the keys miss on every round
    assert results["remap"][1] > 0  # the server came back with old values: served
    assert results["miss"][1] > 0  # writes it missed while stalled: its old values too
    for name in ("gutter", "replicate x2", "replicate x2 + gutter"):
        assert results[name][1] == 0, name
    assert results["gutter"][0] > results["miss"][0]
    assert results["replicate x2"][0] > 0.99


def test_async_twin_uses_the_gutter_and_never_for_locks(six):
    cluster = build(six[:4], six[4:])
    twin = cluster.aio
    keys = [f"a{i}" for i in range(300) if cluster.ring.get_node(f"a{i}") == six[3].spec][:20]
    six[3].kill()

    async def outage() -> tuple[dict, object, object]:
        await twin.get(keys[0])  # the server fails: dead for this process
        await twin.set_many(dict.fromkeys(keys, "gutter"))
        one = await twin.get(keys[1])
        many = await twin.get_many(keys)
        try:
            added = await twin.strict().add(keys[2], b"token", 30)
        except NodeUnavailableError:
            added = "refused"
        return many, one, added

    many, one, added = asyncio.run(outage())
    assert one == "gutter"
    assert many == dict.fromkeys(keys, "gutter")
    assert added == "refused"  # the strict view (every lock) never uses the gutter
    assert cluster.journal() == {six[3].spec: len(keys)}


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_get_or_compute_survives_its_homes_death_without_recomputing(six, protocol):
    cluster = build(six[:4], replicate={"hot:": 3}, protocol=protocol)
    stampede = Stampede(cluster)
    calls = Counter()

    def compute() -> str:
        calls["compute"] += 1
        return "page"

    assert stampede.get_or_compute("hot:page", compute, 60) == "page"
    server_of(six, cluster.replicas("hot:page")[0]).kill()
    served = [stampede.get_or_compute("hot:page", compute, 60) for _ in range(50)]
    assert served == ["page"] * 50
    assert calls["compute"] == 1  # read from a copy: no miss, no recompute


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_get_or_compute_reads_spread_over_the_replicas(six, protocol):
    cluster = build(six[:4], replicate={"hot:": 3}, protocol=protocol, **PATIENT)
    stampede = Stampede(cluster)
    assert stampede.get_or_compute("hot:spread", lambda: "page", 60) == "page"
    before = {node: s["get_hits"] for node, s in cluster.stats().items()}
    served = [stampede.get_or_compute("hot:spread", lambda: "again", 60) for _ in range(300)]
    hits = {node: s["get_hits"] - before[node] for node, s in cluster.stats().items()}
    assert served == ["page"] * 300
    assert all(hits[node] >= 45 for node in cluster.replicas("hot:spread")), hits


# -- review (rev-replicate): cancellation of an async replicated write ------------------


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_a_cancelled_async_cas_never_leaves_copies_serving_the_old_value(six, protocol):
    """The home ran the cas (its reply never came: the caller was cancelled), so the
    copies must not keep serving the value it replaced (as when the home times out)."""
    cluster = build(six[:3], replicate={"hot:": 3}, protocol=protocol, timeout=2.0)
    twin = cluster.aio
    key = "hot:cancelled"
    home = server_of(six, cluster.replicas(key)[0])

    async def drill() -> list[object]:
        assert await twin.set(key, "old")
        for _ in range(200):
            value, token = await twin.gets(key)
            if type(token) is not CopyToken:
                break
        assert value == "old"
        assert type(token) is not CopyToken
        home.pause()
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(twin.cas(key, "new", token), 0.2)
        finally:
            home.resume()
        await asyncio.sleep(0.3)  # the home runs the cas it had received
        return [await twin.get(key) for _ in range(60)]

    async_reads = asyncio.run(drill())
    sync_reads = [cluster.get(key) for _ in range(60)]
    assert "old" not in async_reads + sync_reads, Counter(async_reads + sync_reads)


def test_async_get_many_spreads_replicated_keys_over_their_replicas(six):
    """AsyncCluster's multi-key path reads each replicated key from the replica chosen per read."""
    cluster = build(six[:4], replicate={"hot:": 3}, **PATIENT)
    twin = cluster.aio
    key = "hot:many-spread"

    async def reads() -> list[dict]:
        assert await twin.set(key, "v")
        return [await twin.get_many([key, "cold:other"]) for _ in range(150)]

    before = {node: s["get_hits"] for node, s in cluster.stats().items()}
    found = asyncio.run(reads())
    served = {node: s["get_hits"] - before[node] for node, s in cluster.stats().items()}
    assert all(f.get(key) == "v" for f in found)
    assert all(served[node] >= 22 for node in cluster.replicas(key)), served  # >= 15% each


def test_async_set_many_to_the_gutter_clamps_every_ttl(six):
    # A killed server refuses at once; the live ones get time to answer on a busy machine.
    cluster = build(six[:4], six[4:], gutter_ttl=3, timeout=2.0, connect_timeout=2.0)
    twin = cluster.aio
    keys = [f"t{i}" for i in range(300) if cluster.ring.get_node(f"t{i}") == six[1].spec][:10]
    six[1].kill()

    async def outage() -> dict:
        await twin.get(keys[0])  # the server fails: dead for this process
        assert await twin.set_many(dict.fromkeys(keys, "gutter"), 3600) == []
        return await twin.get_many(keys)

    assert asyncio.run(outage()) == dict.fromkeys(keys, "gutter")
    ttls = [t for key in keys for server in six[4:] if (t := _ttl(server, key)) is not None]
    assert len(ttls) == len(keys)
    assert all(0 < t <= 3 for t in ttls), ttls


@pytest.mark.parametrize("form", ["sync", "async"])
def test_killing_one_replica_costs_get_many_no_miss(six, form):
    """The replica a multi-get chose for a key may be the one that just died: the key is
    then read from another replica in the same call, as a single get does."""
    cluster = build(six[:4], replicate={"hot:": 3}, retry_attempts=3)
    keys = [f"hot:{i}" for i in range(40)]
    assert cluster.set_many({key: key for key in keys}) == []
    six[0].kill()

    def get_many() -> dict:
        if form == "sync":
            return cluster.get_many(keys)
        return asyncio.run(cluster.aio.get_many(keys))

    found = [get_many() for _ in range(4)]
    misses = sum(len(keys) - len(f) for f in found)
    assert misses == 0, [len(f) for f in found]


def test_async_a_write_never_sent_to_a_replica_marked_dead_is_never_read_back(six):
    """As the sync drill: the AsyncCluster's writes while a copy is dead reach the journal."""
    cluster = build(six[:4], replicate={"hot:": 3})
    twin = cluster.aio
    key = "hot:async-never-sent"
    stalled = server_of(six, cluster.replicas(key)[1])

    async def during() -> None:
        assert await twin.set(key, "old")
        stalled.pause()
        try:
            assert await twin.set(key, "sent")  # times out on the stalled copy: dead now
            assert cluster.health()[stalled.spec].state == "dead"
            assert await twin.set(key, "newest")  # never sent to it
        finally:
            stalled.resume()

    async def reads() -> Counter:
        return Counter([await twin.get(key) for _ in range(300)])

    asyncio.run(during())
    time.sleep(0.6)
    assert asyncio.run(reads()) == {"newest": 300}
    served = cluster.stats()[stalled.spec]
    assert served["get_hits"] + served["get_misses"] > 0
