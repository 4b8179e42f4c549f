"""A shard whose server is out is not a lost shard (issue 23: an outage is never data loss).

A large set keeps its members in shard items spread over the servers.  A shard
found missing was evicted, so the set is reset (to empty, or to pending when it
has a loader).  Before, a shard whose server merely stalled read as missing
too: a 0.3 s stall of one server emptied a 3,000-member set without a loader
for good, and the read raised ``IncompleteSetError``.  Now a missing shard is
asked for again through the strict view, which tells "unreachable" from
"missing": the read answers as a degraded read does (empty, or the loader's
members) and the set is left whole.  A ``*store`` whose sets cannot all be read
stores nothing (it read them as empty and stored the rest).  Real servers,
stalled with SIGSTOP.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import IncompleteSetError
from django_mcpatterns.core.outages import WriteDegraded
from django_mcpatterns.core.sets import AppendSets, SetOptions, shard_key
from django_mcpatterns.core.sets._model_layout import SET, read_header
from tests.core.test_outages import cluster_of, key_on, wait_for
from tests.harness import MemcachedServer, memcached_cluster

SMALL = SetOptions(item_size_max=8192, headroom=0)  # a few thousand members make shards
MEMBERS = {f"member-{i:05d}" for i in range(3000)}


@pytest.fixture
def three() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(3) as servers:
        yield servers


def sharded(cluster: Cluster, root: MemcachedServer, other: MemcachedServer) -> str:
    """A sharded set whose root is on ``root`` and one of whose shards is on ``other``."""
    sets = AppendSets(cluster, SMALL)
    key = key_on(cluster, root, "big")
    sets.sadd(key, *MEMBERS)
    for _ in range(50):  # each compaction draws a new shard generation, placed anew
        sets.compact(key)
        header = read_header(cluster.get(key), SET)
        shards = [shard_key(key.encode(), header.generation, i) for i in range(header.shards)]
        if any(cluster.ring.get_node(shard) == other.spec for shard in shards):
            return key
    raise AssertionError("no shard generation placed a shard on the other server")


def test_a_stalled_shard_server_leaves_the_set_whole(three: list[MemcachedServer]) -> None:
    cluster = cluster_of(three)
    key = sharded(cluster, three[0], three[1])
    sets = AppendSets(cluster, SMALL)
    three[1].pause()
    try:
        assert sets.smembers(key) == set()  # before: IncompleteSetError, and the set reset
        assert sets.smembers(key, loader=lambda: set(MEMBERS)) == MEMBERS
        assert sets.spop(key) is None  # a degraded pop: nothing popped
    finally:
        three[1].resume()
    assert AppendSets(cluster_of(three), SMALL).smembers(key) == MEMBERS  # before: empty


def test_set_algebra_reads_a_set_whose_shard_server_is_out_as_empty(
    three: list[MemcachedServer],
) -> None:
    cluster = cluster_of(three)
    key = sharded(cluster, three[0], three[1])
    small = key_on(cluster, three[0], "small")
    sets = AppendSets(cluster, SMALL)
    sets.sadd(small, "member-00001", "alone")
    three[1].pause()
    try:
        # As smembers answers (a degraded read: empty); before, NodeUnavailableError.
        assert sets.sunion(key, small) == {"member-00001", "alone"}
        assert sets.sinter(key, small) == set()
        assert sets.sdiff(small, key) == {"member-00001", "alone"}
    finally:
        three[1].resume()
    assert AppendSets(cluster_of(three), SMALL).sunion(key, small) == MEMBERS | {"alone"}


@pytest.mark.parametrize("command", ["sunionstore", "sinterstore", "sdiffstore"])
def test_a_store_of_sets_one_of_which_is_out_stores_no_result_without_it(
    three: list[MemcachedServer], command: str
) -> None:
    """A ``*store`` reads its sets strictly: a set whose server is out fails the write (0,
    ``write_degraded``, the destination repaired), where it was read as empty and a result
    without it was stored as if whole (the union of the others, an empty intersection, the
    difference from nothing)."""
    cluster = cluster_of(three)
    out, kept = key_on(cluster, three[1], "out"), key_on(cluster, three[0], "kept")
    destination = key_on(cluster, three[2], "destination")
    sets = AppendSets(cluster, SMALL)
    sets.sadd(out, "shared", "only-out")
    sets.sadd(kept, "shared", "only-kept")
    sets.sadd(destination, "an earlier result")
    events: list[WriteDegraded] = []
    three[1].pause()
    try:
        stored = getattr(sets, command)(destination, kept, out, report=events.append)
    finally:
        three[1].resume()
    assert stored == 0  # before: 2 for sunionstore and sdiffstore; sinterstore deleted it
    assert [(e.command, e.key) for e in events] == [(command, destination.encode())]
    wait_for(lambda: not cluster.journal(), "the repair")
    # Neither the result without the set that was out, nor the earlier result: incomplete.
    with pytest.raises(IncompleteSetError):
        AppendSets(cluster_of(three), SMALL).smembers(destination)
