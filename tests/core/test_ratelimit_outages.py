"""Rate limits across faults: the local fallback of ``fail="open"`` (issue 23).

Before it, an open limit whose server could not be asked admitted everything
(5,784 attempts of "50/20s" on 4 workers with every server stalled 2 s), and a
restarted server forgot its counts (115 to 164 admitted in one "50/20s" window).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.limiters import AsyncRateLimiter, Decision, RateLimiter
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.ratelimit import Window, parse_rate
from django_mcpatterns.core.ratelimit._model_fallback import Fallback, fallback_for
from tests.fakes import FakeClock
from tests.harness import LOOPBACK, free_port, start_memcached, stop_all


def test_an_open_limit_whose_server_is_unreachable_admits_the_limit_per_window() -> None:
    clock = FakeClock(1_800_000_000.0)
    cluster = Cluster([f"{LOOPBACK}:{free_port()}"])  # nobody listens there
    limiter = RateLimiter(cluster, "5/10s", clock=clock)
    key = f"outage:{uuid.uuid4().hex}"
    decisions = [limiter.hit(key) for _ in range(20)]
    assert all(d.degraded for d in decisions)
    assert sum(d.allowed for d in decisions) == 5  # before: 20
    assert decisions[5].retry_after > 0
    clock.advance(11)  # the window slid past those five
    assert sum(limiter.hit(key).allowed for _ in range(20)) == 5


def test_the_fallback_starts_from_what_the_server_counted_last() -> None:
    window = Window(parse_rate("10/10s"))
    fallback = Fallback()
    now = 1_800_000_000.0
    k = window.slot(now)
    fallback.seen("a", k, 4, [3] + [0] * (window.slots - 1))  # 7 of 10 counted
    admitted = [fallback.decide(window, "a", 1, now).allowed for _ in range(5)]
    assert admitted == [True, True, True, False, False]
    owed = fallback.take("a", window, now)
    # Given back once: the slot seen with 4 and 3 admitted alone, the older one seen with 3.
    assert owed == {k - window.slots: (3, 0), k: (4, 3)}
    assert not fallback.owes("a")
    fallback.give_back("a", owed)  # the server was out again: kept for the next try
    assert fallback.take("a", window, now)[k] == (4, 3)


def test_across_a_restart_the_window_keeps_the_counts_it_had() -> None:
    servers = start_memcached(1)
    try:
        options = ClusterOptions(timeout=0.5, connect_timeout=0.5, retry_timeout=0.05)
        cluster = Cluster([servers[0].spec], options)
        limiter = RateLimiter(cluster, "5/m")
        key = f"restart:{uuid.uuid4().hex}"
        assert sum(limiter.hit(key).allowed for _ in range(5)) == 5
        servers[0].kill()
        during = [limiter.hit(key) for _ in range(3)]
        assert [(d.allowed, d.degraded) for d in during] == [(False, True)] * 3
        servers[0].start()  # empty: its counts are gone
        deadline = time.monotonic() + 10
        decision = limiter.hit(key)
        while decision.degraded and time.monotonic() < deadline:  # until its probe is let through
            time.sleep(0.05)
            decision = limiter.hit(key)
        assert not decision.degraded
        # The process gave back what it saw: the restarted server refuses, where it would
        # have admitted five more (2 x limit in the window) without the fallback's counts.
        assert not decision.allowed
        assert sum(limiter.hit(key).allowed for _ in range(5)) == 0
        cluster.close()
    finally:
        stop_all(servers)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_limit_decided_alone_for_one_cluster_is_never_counted_on_another(driver: str) -> None:
    """Two caches on other clusters make the same keys (the same prefix and limit name): what
    one admitted alone while its server was out is not the other's to count or give back."""
    servers = start_memcached(1)
    clock = FakeClock(1_800_000_000.0)
    out = Cluster([f"{LOOPBACK}:{free_port()}"])  # nobody listens there
    up = Cluster([servers[0].spec])
    key = f"shared-name:{uuid.uuid4().hex}"
    try:
        if driver == "sync":
            alone = [RateLimiter(out, "3/m", clock=clock).hit(key) for _ in range(3)]
            decision = RateLimiter(up, "3/m", clock=clock).hit(key)
        else:

            async def hits() -> tuple[list[Decision], Decision]:
                limiter = AsyncRateLimiter(out.aio, "3/m", clock=clock)
                alone = [await limiter.hit(key) for _ in range(3)]
                return alone, await AsyncRateLimiter(up.aio, "3/m", clock=clock).hit(key)

            alone, decision = asyncio.run(hits())
        assert [(d.allowed, d.degraded) for d in alone] == [(True, True)] * 3
        assert (decision.allowed, decision.degraded, decision.remaining) == (True, False, 2)
        # ...and the sync and async limiters of one cluster share its fallback.
        assert fallback_for(out) is fallback_for(out.aio) is not fallback_for(up)
    finally:
        out.close()
        up.close()
        stop_all(servers)


def test_across_a_kill_and_restart_each_bound_holds_by_decision() -> None:
    """Four processes (a cluster each, so a fallback each) share a limit not yet used up when
    its server is killed: each decides alone while it is out, at most the limit less what it
    last saw; the server's decisions, before the kill and after its empty return, at most
    2 x the limit (docs/ratelimit.md: the two bounds add up)."""
    servers = start_memcached(1)
    clock = FakeClock(1_800_000_000.0)
    options = ClusterOptions(timeout=0.5, connect_timeout=0.5, retry_timeout=0.05)
    clusters = [Cluster([servers[0].spec], options) for _ in range(4)]
    limiters = [RateLimiter(cluster, "10/m", clock=clock) for cluster in clusters]
    key = f"kill:{uuid.uuid4().hex}"
    try:
        before = [limiter.hit(key) for limiter in limiters for _ in range(2)]  # 8 of 10
        assert [d.allowed for d in before] == [True] * 8
        assert not any(d.degraded for d in before)
        servers[0].kill()
        alone = [[limiter.hit(key) for _ in range(10)] for limiter in limiters]
        assert all(d.degraded for decisions in alone for d in decisions)
        # Each saw its own last count (2, 4, 6, 8 of the 8 counted): 8, 6, 4 and 2 alone.
        assert [sum(d.allowed for d in decisions) for decisions in alone] == [8, 6, 4, 2]
        servers[0].start()  # empty
        deadline = time.monotonic() + 10
        after: list[Decision] = []
        for limiter in limiters:
            decision = limiter.hit(key)
            while decision.degraded and time.monotonic() < deadline:  # until its probe passes
                time.sleep(0.05)
                decision = limiter.hit(key)
            after.append(decision)
        after += [limiter.hit(key) for limiter in limiters for _ in range(5)]
        assert not any(d.degraded for d in after)
        # What each gave back (its last count and what it admitted alone) left nothing to
        # admit: without the fallback's counts the empty server would have admitted 10 more.
        by_server = sum(d.allowed for d in before + after)
        assert by_server <= 2 * 10
        assert sum(d.allowed for d in after) == 0
    finally:
        for cluster in clusters:
            cluster.close()
        stop_all(servers)
