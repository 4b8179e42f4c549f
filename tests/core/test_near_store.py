"""The near cache in front of real memcached: both drivers, both protocols.

Time in the table is a fake clock (``max_age`` passes when a test says so); the
servers are real, and what reaches them is read from their own counters.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import NeedsMetaProtocolError, ValueTooLargeError
from django_mcpatterns.core.namespaces import Namespaces
from django_mcpatterns.core.near import AsyncNearStore, NearOptions, NearStore, NearTable
from django_mcpatterns.core.options import ClusterOptions
from tests.aio import Blocking
from tests.conftest import flush
from tests.fakes import FakeClock
from tests.harness import (
    MemcachedServer,
    memcached_cluster,
    server_counters,
    server_requests,
)

MAX_AGE = 1.0
BIG = "B" * 20_000  # over LARGE_VALUE: revalidated by its cas past max_age


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


@pytest.fixture
def cluster(memcached_1: list[MemcachedServer]) -> Iterator[Cluster]:
    flush(memcached_1)
    cluster = Cluster([memcached_1[0].spec])
    yield cluster
    cluster.close()


@pytest.fixture
def table(clock: FakeClock) -> NearTable:
    return NearTable(NearOptions(MAX_AGE), clock=clock)


@pytest.fixture(params=["sync", "async"])
def near(request: pytest.FixtureRequest, cluster: Cluster, table: NearTable) -> Iterator[Any]:
    """The near store over the cluster: the generated sync form, or the asyncio source."""
    if request.param == "sync":
        yield NearStore(cluster, table)
        return
    blocking = Blocking(AsyncNearStore(cluster.aio, table))
    yield blocking
    blocking.shutdown()


def requests_to(servers: list[MemcachedServer], action: Callable[[], object]) -> int:
    before = server_requests(servers)
    action()
    return server_requests(servers) - before


# -- hits ------------------------------------------------------------------------------------


def test_a_hit_sends_nothing(near: Any, cluster: Cluster, memcached_1: list[MemcachedServer]):
    cluster.set("k", {"a": 1})
    assert requests_to(memcached_1, lambda: near.get("k")) == 1
    assert requests_to(memcached_1, lambda: near.get("k")) == 0
    assert near.get("k") == {"a": 1}
    assert near.get("absent", "default") == "default"
    assert near.get("absent") is None


def test_get_many_asks_only_for_what_is_not_held(
    near: Any, cluster: Cluster, memcached_1: list[MemcachedServer]
) -> None:
    cluster.set_many({"a": 1, "b": 2, "c": 3})
    near.get("a")
    before = server_counters(memcached_1, ["cmd_get"])["cmd_get"]
    assert near.get_many(["a", "b", "c", "d"]) == {"a": 1, "b": 2, "c": 3}
    assert server_counters(memcached_1, ["cmd_get"])["cmd_get"] - before == 3  # b, c, d
    assert requests_to(memcached_1, lambda: near.get_many(["a", "b", "c"])) == 0
    assert near.get_many([b"a", "c"]) == {b"a": 1, "c": 3}  # keyed as given


def test_another_clients_write_is_seen_once_max_age_passed(
    near: Any, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.set("k", "v1")
    assert near.get("k") == "v1"
    cluster.set("k", "v2")  # another process
    clock.advance(MAX_AGE - 0.001)
    assert near.get("k") == "v1"  # within the bound: allowed
    clock.advance(0.001)
    assert near.get("k") == "v2"


def test_reads_with_a_cas_or_ttl_are_never_answered_from_memory(
    near: Any, cluster: Cluster, memcached_1: list[MemcachedServer]
) -> None:
    cluster.set("k", "v", 100)
    near.get("k")
    for read in (
        lambda: near.gets("k"),
        lambda: near.gets_many(["k"]),
        lambda: near.gets_ttl("k"),
        lambda: near.gets_envelope("k"),
        lambda: near.get_many_envelopes(["k"]),
        lambda: near.ttl("k"),
        lambda: near.gets_leased("k", [], 30),  # the ORM's read
    ):
        assert requests_to(memcached_1, read) == 1


# -- this process's writes -------------------------------------------------------------------

WRITES: dict[str, tuple[Callable[[Any, Cluster], object], Any]] = {
    "set": (lambda n, c: n.set("k", "new"), "new"),
    "set_many": (lambda n, c: n.set_many({"k": "new", "other": 1}), "new"),
    "add": (lambda n, c: (c.delete("k"), n.add("k", "new")), "new"),
    "delete": (lambda n, c: n.delete("k"), None),
    "delete_many": (lambda n, c: n.delete_many(["k", "other"]), None),
    "touch": (lambda n, c: n.touch("k", -1), None),
    "incr": (lambda n, c: (c.set("k", b"1"), n.incr("k", 2)), b"3"),
    "decr": (lambda n, c: (c.set("k", b"5"), n.decr("k", 2)), b"3"),
    "append": (lambda n, c: (c.set("k", b"a"), n.append("k", b"b")), b"ab"),
    "prepend": (lambda n, c: (c.set("k", b"a"), n.prepend("k", b"b")), b"ba"),
    "cas": (lambda n, c: n.cas("k", "new", c.gets("k")[1]), "new"),
    "recas": (lambda n, c: n.recas("k", "new", c.gets("k")[1]), "new"),
    "add_cas": (lambda n, c: (c.delete("k"), n.add_cas("k", "new")), "new"),
    "delete_cas": (lambda n, c: n.delete_cas("k", c.gets("k")[1]), None),
    "cas_stale": (lambda n, c: n.cas_stale("k", "new", c.gets("k")[1]), "new"),
    "flush_all": (lambda n, c: n.flush_all(), None),
    # memcached's own leases (the ORM's): the key's item becomes the lease's, empty
    "lease": (lambda n, c: n.lease("k", 30, c.gets("k")[1]), b""),
    "gets_leased": (lambda n, c: (c.delete("k"), n.gets_leased("k", [], 30)), b""),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_write_of_this_process_is_read_at_once(near: Any, cluster: Cluster, write: str) -> None:
    cluster.set("k", "old")
    assert near.get("k") == "old"  # held
    # Some write a number first, as another client: the copy held is still "old", so
    # the value read next comes from the server.
    change, expected = WRITES[write]
    change(near, cluster)
    assert near.get("k") == expected


def test_a_str_or_bytes_set_is_held_as_written(
    near: Any, cluster: Cluster, table: NearTable, memcached_1: list[MemcachedServer]
) -> None:
    """A set memcached stored of a str or bytes value (living at least max_age) is the key's
    copy: read back with no round trip; any other value, or a shorter life, drops it."""
    for value in ("text", b"bytes"):
        assert near.set("k", value) is True
        assert requests_to(memcached_1, lambda: near.get("k")) == 0
        assert near.get("k") == value
    assert near.set("k", "soon gone", expire=int(MAX_AGE)) is True  # at least max_age: held
    assert requests_to(memcached_1, lambda: near.get("k")) == 0
    for value, expire in ((7, 0), ({"a": 1}, 0), ("short", -1)):
        near.set("k", value, expire)
        assert table.held("k") is None
    with pytest.raises(ValueTooLargeError):  # refused by memcached: nothing held
        near.set("k", "v" * (2 * 2**20))
    assert table.held("k") is None
    assert near.get("k") is None  # the failed set left nothing (expire -1 deleted it)


def test_a_set_is_not_held_when_another_write_may_have_landed_since_it_was_sent(
    cluster: Cluster, clock: FakeClock
) -> None:
    """Two writes of this process to one key whose order on the server is not known: the
    first to return holds its value, the other drops it; reads sent before either are void."""
    table = NearTable(NearOptions(MAX_AGE), clock=clock)
    first, second, read = table.ticket(), table.ticket(), table.ticket()
    assert table.written("k", "second", second) is True
    assert table.written("k", "first", first) is False  # it may have landed before "second"
    assert table.held("k") is None
    assert table.fill("k", "read", read) is False
    assert table.written("k", "third", table.ticket()) is True
    assert table.held("k").value == "third"  # type: ignore[union-attr]


def test_a_flush_clears_every_table(cluster: Cluster, clock: FakeClock) -> None:
    """flush_all empties the servers: every cache's copies go, not only the flushing one's."""
    mine, other = (NearTable(NearOptions(MAX_AGE), clock=clock) for _ in range(2))
    for table in (mine, other):
        assert table.fill("k", "v", table.ticket())
    NearStore(cluster, mine).flush_all()
    assert mine.held("k") is None
    assert other.held("k") is None


def test_a_read_answered_after_a_write_of_this_process_is_not_kept(cluster: Cluster) -> None:
    """The race: a read reaches the server before a write, its reply is handled after the
    write returned.  Its old value is this read's to return, never a later read's."""
    table = NearTable(NearOptions(MAX_AGE))
    cluster.set("k", "old")
    near: NearStore

    class Late:
        """The store, with another thread's write landing between a get and its reply."""

        def __getattr__(self, name: str) -> Any:
            return getattr(cluster, name)

        def get(self, key: Any, default: Any = None) -> Any:
            found = cluster.get(key, default)
            writer = threading.Thread(target=near.set, args=("k", "new"))
            writer.start()
            writer.join()
            return found

    near = NearStore(Late(), table)  # type: ignore[arg-type]
    assert near.get("k") == "old"
    held = table.held("k")
    assert held is None or held.value == "new"  # the write's own value, or none: never "old"
    assert NearStore(cluster, table).get("k") == "new"


def test_asyncio_a_read_answered_after_a_write_of_another_task_is_not_kept(
    cluster: Cluster,
) -> None:
    table = NearTable(NearOptions(MAX_AGE))
    twin = cluster.aio
    cluster.set("k", "old")

    class Late:
        def __init__(self) -> None:
            self.gate = asyncio.Event()

        def __getattr__(self, name: str) -> Any:
            return getattr(twin, name)

        async def get(self, key: Any, default: Any = None) -> Any:
            found = await twin.get(key, default)
            await self.gate.wait()  # the other task's write completes meanwhile
            return found

    async def main() -> None:
        late = Late()
        near = AsyncNearStore(late, table)  # type: ignore[arg-type]
        writer_near = AsyncNearStore(twin, table)

        async def write() -> None:
            await asyncio.sleep(0)
            await writer_near.set("k", "new")
            late.gate.set()

        found, _ = await asyncio.gather(near.get("k"), write())
        assert found == "old"
        assert await writer_near.get("k") == "new"
        await twin.close()

    asyncio.run(main())


def test_threads_read_their_writes(cluster: Cluster, table: NearTable) -> None:
    """Each reader reads the count of completed writes before its lookup: it never gets less."""
    near = NearStore(cluster, table)  # the fake clock never moves: only writes refresh
    near.set("counter", 0)
    completed = [0]
    stop = threading.Event()
    failures: list[str] = []

    def writer() -> None:
        for i in range(1, 301):
            near.set("counter", i)
            completed[0] = i
        stop.set()

    def reader() -> None:
        while not stop.is_set():
            floor = completed[0]
            found = near.get("counter")
            if found < floor:
                failures.append(f"read {found} after write {floor} completed")

    threads = [threading.Thread(target=reader) for _ in range(4)]
    threads.append(threading.Thread(target=writer))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert table.stats().hits > 0


def test_tasks_read_their_writes(cluster: Cluster, table: NearTable) -> None:
    async def main() -> list[str]:
        near = AsyncNearStore(cluster.aio, table)
        await near.set("counter", 0)
        completed = [0]
        done = asyncio.Event()
        failures: list[str] = []

        async def writer() -> None:
            for i in range(1, 201):
                await near.set("counter", i)
                completed[0] = i
            done.set()

        async def reader() -> None:
            while not done.is_set():
                floor = completed[0]
                found = await near.get("counter")
                if found < floor:
                    failures.append(f"read {found} after write {floor} completed")
                await asyncio.sleep(0)

        await asyncio.gather(writer(), *(reader() for _ in range(20)))
        await cluster.aio.close()
        return failures

    assert asyncio.run(main()) == []


def test_a_cancelled_write_still_drops_the_copy(cluster: Cluster, table: NearTable) -> None:
    async def main() -> None:
        near = AsyncNearStore(cluster.aio, table)
        cluster.set("k", "old")
        assert await near.get("k") == "old"
        task = asyncio.ensure_future(near.set("k", "new"))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert table.held("k") is None  # its outcome is unknown: the copy went
        await cluster.aio.close()

    asyncio.run(main())


def test_the_strict_view_shares_the_table(cluster: Cluster, table: NearTable) -> None:
    near = NearStore(cluster, table)
    cluster.set("n", b"1")
    near.get("n")
    strict = near.strict()
    assert strict.table is table
    assert strict.incr("n") == 2
    assert near.get("n") == b"2"


def test_forget_drops_the_copy(near: Any, cluster: Cluster) -> None:
    """The repair of a write that failed (a degraded mark_stale) deletes the key: the
    copy goes with it."""
    cluster.set("k", "old")
    assert near.get("k") == "old"
    assert near.forget("k")
    assert near.get("k") is None
    assert cluster.get("k") is None


# What a cluster says of itself or its servers, and the plumbing under its commands
# (``run`` a command's plan, ``repair`` replay deletes whose copies went at ``forget``):
# the near store passes these on.  Every other public method reaches a key, and a write
# that the near store did not override would leave a copy behind.
PASSED_ON = {
    "cas_of",
    "copies",
    "epochs",
    "gutter_health",
    "health",
    "journal",
    "listen",
    "observe",
    "get_along",  # a read the near store sends itself (a refresh ahead rides on a miss)
    "of_shared",
    "repair",
    "replicas",
    "replicated_keys",
    "run",
    "run_on",
    "server_epoch",
    "stats",
    "twin_of",
}


def test_every_command_of_a_cluster_is_the_near_stores_own(cluster: Cluster) -> None:
    for store, near in ((cluster, NearStore), (cluster.aio, AsyncNearStore)):
        public = {name for name in dir(type(store)) if not name.startswith("_")}
        methods = {name for name in public if callable(getattr(type(store), name))}
        missing = methods - PASSED_ON - set(vars(near))
        assert not missing, f"{near.__name__} passes {sorted(missing)} on: add them"


# -- large values: revalidated by their cas --------------------------------------------------


def bytes_sent(servers: list[MemcachedServer]) -> int:
    return server_counters(servers, ["bytes_written"])["bytes_written"]


def test_a_large_value_is_revalidated_without_sending_it(
    near: Any, cluster: Cluster, clock: FakeClock, table: NearTable, memcached_1: Any
) -> None:
    cluster.set("big", BIG)
    assert near.get("big") == BIG  # held, without its cas (a plain get)
    clock.advance(MAX_AGE)
    assert near.get("big") == BIG  # read again, with its cas
    clock.advance(MAX_AGE)
    # memcached counts a reply's bytes once its send returned, which may be after the reply
    # arrived here: one more round trip on the connection settles that count first.
    assert near.get("absent") is None
    before, requests = bytes_sent(memcached_1), server_requests(memcached_1)
    assert near.get("big") == BIG
    assert server_requests(memcached_1) - requests == 1  # mg big c
    assert bytes_sent(memcached_1) - before < len(BIG) // 2  # the stats replies, not BIG
    assert table.stats().revalidated == 1
    clock.advance(MAX_AGE - 0.001)
    assert requests_to(memcached_1, lambda: near.get("big")) == 0  # for another max_age
    clock.advance(0.001)
    cluster.set("big", BIG.lower())  # changed: its cas changed
    assert near.get("big") == BIG.lower()
    assert table.stats().revalidated == 1


def test_a_cas_from_before_a_restart_proves_nothing(clock: FakeClock) -> None:
    """memcached's cas counter restarts with the server: a new item can draw the cas an
    old one had.  The epoch tells them apart."""
    with memcached_cluster(1) as servers:
        # No wait before the first request to the restarted server: no sleep in a test.
        cluster = Cluster([servers[0].spec], ClusterOptions(retry_timeout=0))
        table = NearTable(NearOptions(MAX_AGE), clock=clock)
        near = NearStore(cluster, table)
        for i in range(5):
            cluster.set(f"filler{i}", "x")
        cluster.set("big", BIG)
        near.get("big")
        clock.advance(MAX_AGE)
        near.get("big")  # held with its cas
        held = table.held("big")
        assert held is not None
        assert held.cas is not None
        old_cas = int(held.cas)
        servers[0].restart()
        while not cluster.set("wake", 1):  # the first requests find the old server gone
            pass
        woken = int(cluster.gets("wake")[1])
        for i in range(old_cas - woken - 1):  # the new server's cas counter reaches the old one
            cluster.set(f"filler{i}", "y")
        cluster.set("big", BIG.lower())
        assert int(cluster.gets("big")[1]) == old_cas  # the same cas, another value
        clock.advance(MAX_AGE)
        assert near.get("big") == BIG.lower()
        assert table.stats().revalidated == 0
        cluster.close()


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_cas_without_an_epoch_proves_nothing(
    api: str, memcached_3: list[MemcachedServer], clock: FakeClock
) -> None:
    """A key kept on several servers has no epoch (None: whose restart would void its
    cas?), so its cas never renews a copy: the value is read again past max_age."""
    flush(memcached_3)
    cluster = Cluster(
        [server.spec for server in memcached_3], ClusterOptions(replicate={"hot:": 2})
    )
    table = NearTable(NearOptions(MAX_AGE), clock=clock)
    near: Any = NearStore(cluster, table)
    if api == "async":
        near = Blocking(AsyncNearStore(cluster.aio, table))
    try:
        assert cluster.server_epoch("hot:big") is None
        cluster.set("hot:big", BIG)
        for _ in range(3):
            assert near.get("hot:big") == BIG
            held = table.held("hot:big")
            assert held is not None
            assert held.cas is None  # no cas kept without an epoch
            clock.advance(MAX_AGE)
        assert table.stats().revalidated == 0
    finally:
        if api == "async":
            near.shutdown()
        cluster.close()


def test_text_mode_reads_a_large_value_again(
    memcached_1: list[MemcachedServer], clock: FakeClock
) -> None:
    flush(memcached_1)
    cluster = Cluster([memcached_1[0].spec], ClusterOptions(protocol="text"))
    table = NearTable(NearOptions(MAX_AGE), clock=clock)
    near = NearStore(cluster, table)
    cluster.set("big", BIG)
    for _ in range(3):
        before = bytes_sent(memcached_1)
        assert near.get("big") == BIG
        assert bytes_sent(memcached_1) - before > len(BIG)
        clock.advance(MAX_AGE)
    assert table.stats().revalidated == 0
    with pytest.raises(NeedsMetaProtocolError):
        cluster.cas_of("big")
    assert near.claim("k", 10) is None  # no stampede tokens in text mode either
    cluster.close()


# -- namespaces --------------------------------------------------------------------------------


def test_namespaced_values_are_held_with_their_version(
    cluster: Cluster, table: NearTable, clock: FakeClock, memcached_1: list[MemcachedServer]
) -> None:
    ours = Namespaces(NearStore(cluster, table)).namespace("user", 42)
    theirs = Namespaces(cluster).namespace("user", 42)  # another process
    ours.set("profile", {"name": "Ada"})
    assert ours.get("profile") == {"name": "Ada"}
    assert requests_to(memcached_1, lambda: ours.get("profile")) == 0
    ours.invalidate()  # this process: at once
    assert ours.get("profile") is None
    ours.set("profile", {"name": "Grace"})
    assert ours.get("profile") == {"name": "Grace"}
    theirs.invalidate()  # another process: within max_age
    assert ours.get("profile") == {"name": "Grace"}
    clock.advance(MAX_AGE)
    assert ours.get("profile") is None


# -- processes ---------------------------------------------------------------------------------

FORKED = textwrap.dedent(
    """
    import os, sys
    from django_mcpatterns.core.cluster import Cluster
    from django_mcpatterns.core.near import NearOptions, NearStore, NearTable

    cluster = Cluster([sys.argv[1]])
    table = NearTable(NearOptions(3600))
    near = NearStore(cluster, table)
    cluster.set("k", "parent's")
    near.get("k")
    pid = os.fork()
    if pid == 0:
        held = table.stats().entries
        cluster.set("k", "child's")  # not through the near store: only a read shows it
        print(held, near.get("k"), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    print(table.stats().entries, near.get("k"), flush=True)
    """
)


def test_a_forked_child_starts_empty(memcached_1: list[MemcachedServer]) -> None:
    flush(memcached_1)
    result = subprocess.run(
        [sys.executable, "-c", FORKED, memcached_1[0].spec],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    child, parent = result.stdout.splitlines()
    assert child == "0 child's"
    assert parent == "1 parent's"  # the parent's copy, within its (long) bound
