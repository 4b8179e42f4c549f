"""A shard whose server is out is not a lost shard (issue 23: an outage is never data loss).

A large set keeps its members in shard items spread over the servers.  A shard
found missing was evicted, so the set is reset (to empty, or to pending when it
has a loader).  Before, a shard whose server merely stalled read as missing
too: a 0.3 s stall of one server emptied a 3,000-member set without a loader
for good, and the read raised ``IncompleteSetError``.  Now a missing shard is
asked for again through the strict view, which tells "unreachable" from
"missing": the read answers as a degraded read does (empty, or the loader's
members) and the set is left whole.  Real servers, stalled with SIGSTOP.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.sets import AppendSets, SetOptions, shard_key
from django_mcpatterns.core.sets._model_layout import SET, read_header
from tests.core.test_outages import cluster_of, key_on
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
