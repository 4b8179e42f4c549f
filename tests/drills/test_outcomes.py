"""Writes whose reply never came: stored, not stored, or unknown (design.md, "The wire").

A :class:`~tests.drills.proxy.Proxy` in front of one real memcached withholds the
reply to a chosen command: memcached applies it, and the client only sees a
timeout.  Code that cleans up (a set's old or new shard generation) must act on
certainty only; a write the client cannot settle raises
:class:`~django_mcpatterns.core.exceptions.OutcomeUnknownError` from the strict
view and is re-read where it can be.

The node clock is a :class:`~tests.fakes.FakeClock`: after the timeout the
proxied server stays in its retry wait (so nothing can be re-read) until a test
moves the clock; ``retry_timeout=0`` lets the re-read through at once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Literal

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import (
    IncompleteSetError,
    NodeUnavailableError,
    OutcomeUnknownError,
)
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.sets import AppendSets, shard_key
from django_mcpatterns.core.sets._model_layout import SET, read_header
from tests.conftest import flush
from tests.drills.proxy import Proxy
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, free_port, raw_client

# Long enough for a loaded machine to answer every request that is not withheld (and for the
# in-process proxy to forward the withheld one before the client gives up): each withheld
# reply costs it once.
TIMEOUT = 2.0
MEMBERS = 144_000  # the reproduced case: ~3.3 MB, a dozen shards over three servers


@pytest.fixture
def proxied(memcached_3: list[MemcachedServer]) -> Iterator[Proxy]:
    """A proxy in front of the first server, the others reached directly."""
    flush(memcached_3)
    with Proxy(memcached_3[0].port) as proxy:
        yield proxy
    flush(memcached_3)


def cluster_through(
    proxy: Proxy,
    servers: list[MemcachedServer],
    clock: FakeClock,
    retry_timeout: float = 1.0,
    protocol: Literal["meta", "text"] = "meta",
    on_outage: str = "degrade",
) -> Cluster:
    specs = [proxy.spec, *(server.spec for server in servers[1:])]
    options = ClusterOptions(
        timeout=TIMEOUT, retry_timeout=retry_timeout, protocol=protocol, on_outage=on_outage
    )
    return Cluster(specs, options, clock=clock)


def key_on(cluster: Cluster, node: str, prefix: str) -> str:
    """A key the ring places on ``node``."""
    return next(
        key
        for key in (f"{prefix}-{i}" for i in range(10_000))
        if cluster.ring.get_node(key.encode()) == node
    )


# -- the Store: three outcomes -----------------------------------------------------------


def test_a_write_whose_reply_is_lost_is_unknown_not_refused(
    proxied: Proxy, memcached_3: list[MemcachedServer]
) -> None:
    cluster = cluster_through(proxied, memcached_3, FakeClock())
    key = key_on(cluster, proxied.spec, "k")
    proxied.withhold(b"set ")
    with pytest.raises(OutcomeUnknownError) as raised:
        cluster.strict().set(key, b"landed")
    assert raised.value.node == proxied.spec
    assert isinstance(raised.value, NodeUnavailableError)  # existing handlers still catch it
    assert proxied.withheld == 1
    server = raw_client(memcached_3[0])
    assert server.get(key) == b"landed"  # memcached stored it: "not stored" would be a lie
    server.close()
    # Where nothing listens nothing was sent: that write certainly did not happen.
    nowhere = Cluster([f"127.0.0.1:{free_port()}"], ClusterOptions(timeout=TIMEOUT))
    with pytest.raises(NodeUnavailableError) as refused:
        nowhere.strict().set("k", b"v")
    assert not isinstance(refused.value, OutcomeUnknownError)


def test_a_multi_key_write_whose_reply_is_lost_is_unknown(
    proxied: Proxy, memcached_3: list[MemcachedServer]
) -> None:
    cluster = cluster_through(proxied, memcached_3, FakeClock())
    keys = [key_on(cluster, proxied.spec, f"m{i}") for i in range(3)]
    proxied.withhold(b"set ")
    with pytest.raises(OutcomeUnknownError):
        cluster.strict().set_many(dict.fromkeys(keys, b"v"))
    # The default view keeps Django's answer: those keys are reported as not stored.
    proxied.withhold(b"set ")
    degrading = cluster_through(proxied, memcached_3, FakeClock())  # its node is healthy
    assert sorted(degrading.set_many(dict.fromkeys(keys, b"w"))) == sorted(keys)


# -- sets: a rewrite acts only on certainty -----------------------------------------------


def big_set(cluster: Cluster, key: str) -> tuple[AppendSets, set[str]]:
    sets = AppendSets(cluster)
    members = {f"member-{i:013d}" for i in range(MEMBERS)}
    sets.sadd(key, *members)
    sets.sadd(key, "late")  # a log record, so a compaction has something to do
    return sets, members | {"late"}


def read_back(sets: AppendSets, key: str) -> set[str]:
    try:
        return sets.smembers(key)  # type: ignore[return-value]
    except IncompleteSetError:  # it lost a shard and was reset to empty
        return set()


def test_a_compaction_whose_root_reply_is_lost_loses_no_member(
    proxied: Proxy, memcached_3: list[MemcachedServer]
) -> None:
    """The reproduced failure: the root's ``cas`` is applied, its reply never comes."""
    clock = FakeClock()
    cluster = cluster_through(proxied, memcached_3, clock)
    key = key_on(cluster, proxied.spec, "big")
    sets, expected = big_set(cluster, key)
    before = read_header(cluster.get(key), SET)
    assert before.shards >= 3
    proxied.withhold(b"cas ")
    with pytest.raises(OutcomeUnknownError):
        sets.compact(key)  # the root cannot be re-read: its server is in its retry wait
    assert proxied.withheld == 1
    clock.advance(60)  # past the retry wait
    after = read_header(cluster.get(key), SET)
    assert after.generation != before.generation  # the cas was applied
    lost = len(expected - read_back(sets, key))
    assert lost == 0
    # The old generation was left in place (to expire), not deleted on a guess.
    old = [shard_key(key.encode(), before.generation, i) for i in range(before.shards)]
    assert len(cluster.get_many(old)) == before.shards


def test_a_compaction_settles_a_lost_reply_by_reading_the_root(
    proxied: Proxy, memcached_3: list[MemcachedServer]
) -> None:
    # retry_timeout=0: the root's server may be asked again at once.
    cluster = cluster_through(proxied, memcached_3, FakeClock(), retry_timeout=0)
    key = key_on(cluster, proxied.spec, "big")
    sets, expected = big_set(cluster, key)
    before = read_header(cluster.get(key), SET)
    proxied.withhold(b"cas ")
    assert sets.compact(key) is True  # the re-read root names the new generation
    assert proxied.withheld == 1
    assert sets.smembers(key) == expected
    old = [shard_key(key.encode(), before.generation, i) for i in range(before.shards)]
    assert cluster.get_many(old) == {}  # certain now: the old generation is deleted


def small_set(cluster: Cluster, proxy: Proxy) -> tuple[AppendSets, str, set[str]]:
    key = key_on(cluster, proxy.spec, "s")
    sets = AppendSets(cluster)
    members = {f"m{i}" for i in range(20)}
    sets.sadd(key, *members)
    return sets, key, members


def test_a_pop_whose_reply_is_lost_returns_the_member_it_removed(
    proxied: Proxy, memcached_3: list[MemcachedServer]
) -> None:
    cluster = cluster_through(proxied, memcached_3, FakeClock(), retry_timeout=0)
    sets, key, members = small_set(cluster, proxied)
    proxied.withhold(b"cas ")
    popped = sets.spop(key)
    assert proxied.withheld == 1
    left = sets.smembers(key)
    assert popped in members
    assert left == members - {popped}  # removed once, and returned: never dropped


@pytest.mark.parametrize("on_outage", ["degrade", "raise"])
def test_a_pop_that_cannot_be_settled_drops_no_member_unseen(
    proxied: Proxy, memcached_3: list[MemcachedServer], on_outage: str
) -> None:
    clock = FakeClock()
    cluster = cluster_through(proxied, memcached_3, clock, on_outage=on_outage)
    sets, key, members = small_set(cluster, proxied)
    proxied.withhold(b"cas ")
    if on_outage == "raise":
        with pytest.raises(OutcomeUnknownError):
            sets.spop(key)  # not None: the set is not empty, and a member may be gone
    else:
        assert sets.spop(key) is None  # issue 23: a degraded pop, not an error; nothing popped
    assert proxied.wait_withheld_answered()  # memcached applied the cas by now
    clock.advance(60)
    # The pop was applied and its member returned to nobody: the set reads as incomplete
    # (repaired once its server answered again), and its loader rebuilds that member.
    with pytest.raises(IncompleteSetError):
        sets.smembers(key)
    assert sets.smembers(key, loader=lambda: members) == members


# -- locks: a release whose reply was lost is not "released" nor "not owned" ----------------


# The command that carries each lock step, per protocol (core/locks/).
LOCK_STEPS = {
    "meta": {"acquire": b"ms ", "extend": b"ms ", "release": b"md "},
    "text": {"acquire": b"add ", "extend": b"cas ", "release": b"cas "},  # release: gets + cas
}


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_a_lock_release_whose_reply_is_lost_is_unknown(
    proxied: Proxy, memcached_3: list[MemcachedServer], protocol: Literal["meta", "text"]
) -> None:
    cluster = cluster_through(
        proxied, memcached_3, FakeClock(), protocol=protocol, on_outage="raise"
    )
    key = key_on(cluster, proxied.spec, "lock")
    lock = Lock(cluster, key, timeout=30)
    assert lock.acquire(blocking=False)
    proxied.withhold(LOCK_STEPS[protocol]["release"])
    with pytest.raises(OutcomeUnknownError):
        lock.release()  # freed on the server, but the caller cannot know
    assert proxied.withheld == 1
    assert Cluster([memcached_3[0].spec]).get(key) is None  # it was


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_a_lock_release_whose_reply_is_lost_does_not_raise_when_degrading(
    proxied: Proxy, memcached_3: list[MemcachedServer], protocol: Literal["meta", "text"]
) -> None:
    cluster = cluster_through(proxied, memcached_3, FakeClock(), protocol=protocol)
    key = key_on(cluster, proxied.spec, "lock")
    events: list[object] = []
    lock = Lock(cluster, key, timeout=30, on_event=events.append)
    assert lock.acquire(blocking=False)
    proxied.withhold(LOCK_STEPS[protocol]["release"])
    lock.release()  # on_outage="degrade": logged and reported; it lapses if it was not freed
    assert [type(event).__name__ for event in events] == ["WriteDegraded"]
    assert proxied.withheld == 1
    assert Cluster([memcached_3[0].spec]).get(key) is None


@pytest.mark.parametrize("protocol", ["meta", "text"])
@pytest.mark.parametrize("step", ["acquire", "extend"])
def test_a_lock_write_whose_reply_is_lost_is_unknown(
    proxied: Proxy, memcached_3: list[MemcachedServer], protocol: Literal["meta", "text"], step: str
) -> None:
    cluster = cluster_through(proxied, memcached_3, FakeClock(), protocol=protocol)
    lock = Lock(cluster, key_on(cluster, proxied.spec, "lock"), timeout=30)
    if step == "extend":
        assert lock.acquire(blocking=False)
    act = functools.partial(lock.extend, 10) if step == "extend" else lock.acquire
    proxied.withhold(LOCK_STEPS[protocol][step])
    with pytest.raises(OutcomeUnknownError):
        act()  # an acquire answers neither True nor False: it may hold the lock now
    assert proxied.withheld == 1
