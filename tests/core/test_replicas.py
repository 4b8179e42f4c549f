"""Replicated hot keys and the gutter pool: the decisions (pure) and the cluster on real servers.

Drills that kill and stall servers are in tests/drills/test_replication.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from pymemcache.client.base import Client

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import ConfigurationError, ReplicatedKeyError
from django_mcpatterns.core.gutter import allowed, clamp, clamp_expire
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.replicas import (
    CopyToken,
    Fate,
    Journal,
    ReplicaPolicy,
    fate,
    mirror,
)
from django_mcpatterns.core.wire import (
    Delete,
    Get,
    Incr,
    MetaDelete,
    MetaGet,
    MetaSet,
    Store,
    Touch,
)
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer, memcached_cluster

# -- the decisions ------------------------------------------------------------------


def test_longest_prefix_wins_and_other_keys_have_one_copy():
    policy = ReplicaPolicy.build({"hot:": 2, "hot:very:": 3})
    assert policy is not None
    assert policy.copies(b"hot:a") == 2
    assert policy.copies(b"hot:very:a") == 3
    assert policy.copies(b"cold:hot:a") == 1
    assert ReplicaPolicy.build({}) is None


def test_scope_skips_what_the_framework_puts_before_the_callers_key():
    policy = ReplicaPolicy.build({"hot:": 3}, r"site\:\d+:")
    assert policy is not None
    assert policy.copies(b"site:1:hot:a") == 3
    assert policy.copies(b"site:12:hot:a") == 3
    assert policy.copies(b"hot:a") == 1  # not a key this backend made
    assert policy.copies(b"site:1:cold:hot:a") == 1


@pytest.mark.parametrize(
    ("replicate", "message"),
    [
        ({"": 2}, "non-empty"),
        ({"hot:": 0}, ">= 1"),
        ({"hot:": True}, ">= 1"),
        ({"hot:": "3"}, ">= 1"),
        (["hot:"], "mapping"),
    ],
)
def test_bad_replicate_options_are_refused_by_name(replicate, message):
    with pytest.raises(ConfigurationError, match=message) as raised:
        ClusterOptions(replicate=replicate)
    assert raised.value.option == "replicate"


def test_gutter_options_go_together():
    with pytest.raises(ConfigurationError, match="needs OPTIONS\\['gutter'\\]"):
        ClusterOptions(failover="gutter")
    with pytest.raises(ConfigurationError, match="only with failover='gutter'"):
        ClusterOptions(gutter=["127.0.0.1:1"])
    with pytest.raises(ConfigurationError, match="gutter_ttl"):
        ClusterOptions(failover="gutter", gutter=["127.0.0.1:1"], gutter_ttl=0)
    options = ClusterOptions(failover="gutter", gutter="127.0.0.1:1;127.0.0.1:2")
    assert options.gutter == ("127.0.0.1:1", "127.0.0.1:2")
    assert options.gutter_ttl == 10
    hash(options)  # shared clusters are keyed by their options


def test_what_each_command_does_to_a_replicated_key():
    assert fate(Get((b"k",))) is Fate.READ
    assert fate(Get((b"k",), cas=True)) is Fate.TOKEN_READ
    assert fate(Store("set", b"k", b"v")) is Fate.EVERYWHERE
    assert fate(Delete(b"k")) is Fate.EVERYWHERE
    assert fate(Touch(b"k", 5)) is Fate.EVERYWHERE
    assert fate(Store("add", b"k", b"v")) is Fate.HOME_THEN_MIRROR
    assert fate(Store("cas", b"k", b"v", cas_token=b"1")) is Fate.HOME_THEN_MIRROR
    assert fate(MetaSet(b"k", data=b"v", mode="E")) is Fate.HOME_THEN_MIRROR
    assert fate(MetaDelete(b"k", cas=3)) is Fate.HOME_THEN_DROP
    assert fate(MetaGet(b"k", value=True, cas=True)) is Fate.TOKEN_READ
    assert fate(MetaGet(b"k", recache=30)) is Fate.HOME_THEN_DROP
    for edit in (Store("append", b"k", b"v"), Store("prepend", b"k", b"v"), Incr(b"k")):
        assert fate(edit) is Fate.REFUSED
    assert fate((Store("add", b"k", b"v"), Get((b"k",), cas=True))) is Fate.HOME_THEN_DROP


def test_a_homes_store_is_mirrored_as_a_set_with_its_flags_and_ttl():
    assert mirror(Store("cas", b"k", b"v", 4, 60, b"9")) == Store("set", b"k", b"v", 4, 60)
    assert mirror(MetaSet(b"k", data=b"v", client_flags=2, ttl=30, cas=7)) == Store(
        "set", b"k", b"v", 2, 30
    )
    assert mirror(Delete(b"k")) is None


def test_the_journal_forgets_only_what_was_not_recorded_again_since_the_snapshot():
    journal = Journal()
    journal.missed("a", [b"k1", b"k2"])
    assert journal.dirty == {"a"}
    due = journal.due("a")
    journal.missed("a", [b"k2"])  # a newer miss while the replay ran: kept
    journal.replayed("a", due)
    assert journal.pending() == {"a": 1}
    journal.replayed("a", journal.due("a"))
    assert journal.pending() == {}
    assert journal.dirty == frozenset()


def test_gutter_ttls_are_clamped():
    now = 1_700_000_000.0
    assert clamp_expire(0, 10) == 10  # never -> the gutter's TTL
    assert clamp_expire(None, 10) == 10
    assert clamp_expire(5, 10) == 5
    assert clamp_expire(3600, 10) == 10
    assert clamp_expire(int(now) + 3600, 10, lambda: now) == 10  # absolute time
    assert clamp_expire(int(now) + 3, 10, lambda: now) == 3
    assert clamp_expire(int(now) - 5, 10, lambda: now) == int(now) - 5  # gone already
    assert clamp(Store("set", b"k", b"v", 0, 0), 10) == Store("set", b"k", b"v", 0, 10)
    assert clamp(MetaSet(b"k", data=b"v"), 7) == MetaSet(b"k", data=b"v", ttl=7)


def test_a_meta_get_and_touch_in_the_gutter_is_clamped_too():
    clamped = clamp(MetaGet(b"k", value=True, touch=3600), 10)
    assert clamped.touch == 10
    both = clamp(MetaGet(b"k", vivify=3600, touch=0), 7)
    assert (both.vivify, both.touch) == (7, 7)
    assert clamp(MetaGet(b"k", value=True), 10) == MetaGet(b"k", value=True)


def test_in_place_edits_never_go_to_the_gutter():
    assert allowed(Store("set", b"k", b"v"))
    assert allowed(Store("add", b"k", b"v"))
    assert not allowed(Store("append", b"k", b"v"))
    assert not allowed(Incr(b"k"))
    assert not allowed(MetaSet(b"k", data=b"v", mode="A"))


# -- on real servers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def five() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(5) as servers:
        yield servers


def replicated(servers: list[MemcachedServer], **options) -> Cluster:
    for server in servers:
        server.flush()
    settings = {"replicate": {"hot:": 3}, "timeout": 0.3, "connect_timeout": 0.3, **options}
    return Cluster([s.spec for s in servers], ClusterOptions(**settings))


def holders(servers: list[MemcachedServer], key: str) -> dict[str, bytes | None]:
    found = {}
    for server in servers:
        client = Client(("127.0.0.1", server.port))
        try:
            found[server.spec] = client.get(key)
        finally:
            client.close()
    return found


def test_a_replicated_key_lives_on_its_ketama_successors(five):
    cluster = replicated(five[:4])
    assert cluster.set("hot:a", b"v")
    assert cluster.replicas("hot:a") == cluster.ring.get_nodes("hot:a", 3)
    held = {node for node, value in holders(five[:4], "hot:a").items() if value is not None}
    assert held == set(cluster.replicas("hot:a"))
    assert cluster.set("cold:a", b"v")
    held = {node for node, value in holders(five[:4], "cold:a").items() if value is not None}
    assert held == {cluster.ring.get_node("cold:a")}


def test_reads_spread_over_the_replicas(five):
    """3 copies on 4 servers: 300 reads hit, each replica serving at least 15% of them."""
    cluster = replicated(five[:4])
    assert cluster.set("hot:spread", "value")
    before = {node: stats["get_hits"] for node, stats in cluster.stats().items()}
    hits = sum(cluster.get("hot:spread") == "value" for _ in range(300))
    served = {node: stats["get_hits"] - before[node] for node, stats in cluster.stats().items()}
    assert hits == 300
    for node in cluster.replicas("hot:spread"):
        assert served[node] >= 45, served
    assert sum(served.values()) == 300


def test_get_many_reads_each_replicated_key_once_from_a_replica(five):
    cluster = replicated(five[:4])
    keys = [f"hot:m{i}" for i in range(30)]
    assert cluster.set_many(dict.fromkeys(keys, 1) | {"cold:x": 2}) == []
    before = sum(s["get_hits"] for s in cluster.stats().values())
    assert cluster.get_many([*keys, "cold:x"]) == dict.fromkeys(keys, 1) | {"cold:x": 2}
    assert sum(s["get_hits"] for s in cluster.stats().values()) - before == 31
    cluster.delete_many([*keys, "cold:x"])
    assert all(value is None for k in keys for value in holders(five[:4], k).values())


def test_deletes_and_touches_reach_every_copy(five):
    cluster = replicated(five[:4])
    cluster.set("hot:d", b"v")
    assert cluster.touch("hot:d", 100)
    assert cluster.delete("hot:d")
    assert set(holders(five[:4], "hot:d").values()) == {None}


def test_add_is_decided_by_the_home_and_mirrored(five):
    cluster = replicated(five[:4])
    assert cluster.add("hot:lock", b"mine", 30)
    assert not cluster.add("hot:lock", b"theirs", 30)
    held = holders(five[:4], "hot:lock")
    assert {held[node] for node in cluster.replicas("hot:lock")} == {b"mine"}
    value, token = cluster.gets("hot:lock")  # from any replica
    assert value == b"mine"
    assert cluster.cas("hot:lock", b"next", token)
    assert {held for held in holders(five[:4], "hot:lock").values() if held} == {b"next"}


def copy_token(cluster: Cluster, key: str) -> tuple[object, CopyToken]:
    """A gets of ``key`` that a copy (not its home) answered."""
    for _ in range(200):
        value, token = cluster.gets(key)
        if type(token) is CopyToken:
            return value, token
    raise AssertionError("gets never reached a copy")


def test_gets_spread_and_a_copys_token_holds_while_the_home_holds_its_item(five):
    cluster = replicated(five[:4])
    cluster.set("hot:t", b"v1")
    before = {node: s["get_hits"] for node, s in cluster.stats().items()}
    assert {cluster.gets("hot:t")[0] for _ in range(300)} == {b"v1"}
    served = {node: s["get_hits"] - before[node] for node, s in cluster.stats().items()}
    assert all(served[node] >= 45 for node in cluster.replicas("hot:t")), served
    _, token = copy_token(cluster, "hot:t")
    assert cluster.cas("hot:t", b"v2", token)  # the home still held v1: swapped there
    assert set(holders(five[:4], "hot:t").values()) - {None} == {b"v2"}
    _, stale = copy_token(cluster, "hot:t")
    cluster.set("hot:t", b"v3")  # the home moved on
    assert cluster.cas("hot:t", b"v4", stale) is False
    assert cluster.recas("hot:t", b"v4", stale) is None
    assert cluster.delete_cas("hot:t", stale) is False
    assert cluster.get("hot:t") == b"v3"


def test_a_copys_token_is_refused_while_the_home_is_unreachable(five):
    cluster = replicated(five[:4], retry_attempts=1, retry_timeout=30)
    cluster.set("hot:u", b"v")
    home = next(s for s in five[:4] if s.spec == cluster.replicas("hot:u")[0])
    home.pause()
    try:
        value, token = copy_token(cluster, "hot:u")
        assert value == b"v"
        assert cluster.cas("hot:u", b"w", token) is False
        assert cluster.recas("hot:u", b"w", token) is None
        assert cluster.delete_cas("hot:u", token) is False
    finally:
        home.resume()


def test_in_place_edits_of_a_replicated_key_are_refused_before_any_io(five):
    cluster = replicated(five[:4])
    for edit in (
        lambda: cluster.append("hot:s", b"+x"),
        lambda: cluster.prepend("hot:s", b"+x"),
        lambda: cluster.incr("hot:s"),
        lambda: cluster.decr("hot:s"),
    ):
        with pytest.raises(ReplicatedKeyError, match="replicate"):
            edit()
    assert cluster.incr("cold:n") is None  # other keys are untouched


def test_a_replicated_lock_is_held_once_its_home_decides(five):
    cluster = replicated(five[:4], retry_attempts=1, retry_timeout=30)
    first = Lock(cluster, "hot:job", timeout=30)
    second = Lock(cluster, "hot:job", timeout=30)
    assert first.acquire(blocking=False)
    assert not second.acquire(blocking=False)
    first.release()
    assert second.acquire(blocking=False)
    second.release()


@contextlib.contextmanager
def proxied_cluster(servers, **options) -> Iterator[tuple[Cluster, dict[str, Proxy]]]:
    """A replicated cluster whose servers are each behind a :class:`Proxy` (by its spec)."""
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(Proxy(server.port)) for server in servers]
        for server in servers:
            server.flush()
        settings = {"replicate": {"hot:": 3}, **options}
        cluster = Cluster([p.spec for p in proxies], ClusterOptions(**settings))
        try:
            yield cluster, {p.spec: p for p in proxies}
        finally:
            for proxy in proxies:
                if proxy.gate is not None:
                    proxy.gate.set()
            cluster.close()


def test_a_stalled_copy_costs_one_timeout_and_is_journaled(five):
    """The home and the live copy are written before the stalled copy's reply is awaited."""
    events = []
    with proxied_cluster(five[:4], timeout=0.5, retry_attempts=1) as (cluster, proxies):
        cluster.listen(on_node_event=events.append)
        key = "hot:parallel"
        home, live, stalled = (proxies[n] for n in cluster.replicas(key))
        stalled.gate = threading.Event()  # its replies never come
        assert cluster.set(key, b"v")  # the home stored it
        by_port = {s.port: s for s in five}
        holding = holders([by_port[home.upstream[1]], by_port[live.upstream[1]]], key)
        assert holding == {
            s.spec: b"v" for s in (by_port[home.upstream[1]], by_port[live.upstream[1]])
        }
        assert cluster.journal() == {stalled.spec: 1}
        assert stalled.round_trips == 1  # asked once, not again
    failures = [(e.node, type(e.error)) for e in events if e.kind == "failure"]
    assert failures == [(stalled.spec, TimeoutError)]  # one timeout


def test_each_replica_gets_one_round_trip_per_write(five):
    with Proxy(five[0].port) as a, Proxy(five[1].port) as b, Proxy(five[2].port) as c:
        for server in five[:3]:
            server.flush()
        cluster = Cluster([a.spec, b.spec, c.spec], ClusterOptions(replicate={"hot:": 3}))
        assert cluster.set("hot:x", b"v")
        assert [p.round_trips for p in (a, b, c)] == [1, 1, 1]
        reads = Counter()
        for _ in range(30):
            before = [p.round_trips for p in (a, b, c)]
            assert cluster.get("hot:x") == b"v"
            after = [p.round_trips for p in (a, b, c)]
            assert sum(after) - sum(before) == 1  # one replica, one round trip
            reads[after.index(next(x for x, y in zip(after, before, strict=True) if x != y))] += 1
        assert len(reads) == 3


def test_two_stalled_copies_cost_one_timeout_not_two(five):
    """Every copy is written before any reply is awaited, and the replies are awaited together.

    The second stalled copy answers as soon as the client gives up on the first (closes
    its connection): a client waiting for them one after the other would get that answer
    within its second wait; waiting together, both are judged at the one deadline.
    """
    with proxied_cluster(five[:4], timeout=0.5, retry_attempts=1) as (cluster, proxies):
        key = "hot:both-stalled"
        first, second = (proxies[n] for n in cluster.replicas(key)[1:])
        first.gate = threading.Event()  # never answers
        second.gate = first.client_closed  # answers once the client has given up on the first
        assert cluster.set(key, b"v")  # the home stored it
        assert cluster.journal() == {first.spec: 1, second.spec: 1}


def test_flush_all_flushes_the_gutter_too(five):
    for server in five:
        server.flush()
    options = ClusterOptions(failover="gutter", gutter=[five[4].spec])
    cluster = Cluster([s.spec for s in five[:4]], options)
    twin = cluster.aio
    spare = Client(("127.0.0.1", five[4].port))
    try:
        # noreply=False: pymemcache's default set does not wait, and could land after the flush
        assert spare.set("left-in-gutter", b"x", noreply=False)
        assert cluster.flush_all()
        assert spare.get("left-in-gutter") is None
        assert spare.set("left-in-gutter", b"x", noreply=False)
        assert asyncio.run(twin.flush_all())
        assert spare.get("left-in-gutter") is None
    finally:
        spare.close()


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_owner_writes_are_mirrored_so_every_read_hits(five, protocol):
    """add_cas/recas (a lock's or a lease's item) reach the copies in both protocols: text
    sends them as a store and a gets in one write, which used to delete the copies instead."""
    cluster = replicated(five[:4], protocol=protocol)
    token = cluster.add_cas("hot:owned", "first", 60)
    assert token is not None
    assert [cluster.get("hot:owned") for _ in range(150)] == ["first"] * 150
    assert cluster.recas("hot:owned", "second", token, 60) is not None
    assert [cluster.get("hot:owned") for _ in range(150)] == ["second"] * 150
    held = holders(five[:4], "hot:owned")
    assert all(held[node] is not None for node in cluster.replicas("hot:owned")), held


@pytest.mark.parametrize("form", ["sync", "async"])
def test_get_many_checks_a_copys_miss_on_another_copy(five, form):
    """A server restarted empty answers "miss" for the copies it held: get_many asks one
    more copy for those keys, as get does (docs/replication.md), in one more round trip."""
    cluster = replicated(five[:4])
    keys = [f"hot:r{i}" for i in range(100)]
    assert cluster.set_many({key: key for key in keys}) == []
    five[0].flush()  # what a restart leaves: the server answers, empty
    assert [cluster.get(key) for key in keys] == keys

    def get_many() -> dict:
        if form == "sync":
            return cluster.get_many(keys)
        return asyncio.run(cluster.aio.get_many(keys))

    missed = [len(keys) - len(get_many()) for _ in range(3)]
    assert missed == [0, 0, 0]
    assert cluster.get_many(["hot:absent", *keys[:2]]) == {k: k for k in keys[:2]}
