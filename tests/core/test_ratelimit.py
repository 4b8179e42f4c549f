"""The rate limiter on real memcached (meta and text), the embedded store and asyncio.

What users rely on: exactly ``N`` admissions however the attempts race, never
more than ``N`` in any interval of the period (no double burst at a window
edge), one round trip per admitted decision, the same decisions on every
store, and a dead server that fails open (or closed) without raising.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import pytest

from django_mcpatterns.core.aio import AsyncCluster
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import ConfigurationError, InvalidKeyError
from django_mcpatterns.core.limiters import AsyncRateLimiter, RateLimiter
from django_mcpatterns.core.memory import AsyncMemoryStore, MemoryStore
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.ratelimit import Rate, Window, parse_rate
from tests.drills.proxy import Proxy
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, start_memcached, stop_all


def test_rates_parse_in_every_documented_form() -> None:
    assert parse_rate("5/s") == Rate(5, 1)
    assert parse_rate("100/m") == Rate(100, 60)
    assert parse_rate("1000/h") == Rate(1000, 3600)
    assert parse_rate("10/30s") == Rate(10, 30)
    assert parse_rate(" 2 / 1d ") == Rate(2, 86400)
    for bad in ["5", "5/x", "x/s", "0/s", "5/0s", "-1/s", "5 per second", ""]:
        with pytest.raises(ConfigurationError, match="rate"):
            parse_rate(bad)


def _key() -> str:
    return f"rl-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["meta", "text"])
def cluster(
    request: pytest.FixtureRequest, memcached_1: list[MemcachedServer]
) -> Iterator[Cluster]:
    # The live server gets time to answer on a busy machine: a timeout would be a degraded
    # (local) decision, not the server's.  These tests are not about timeouts.
    options = ClusterOptions(protocol=request.param, timeout=30, connect_timeout=30)
    cluster = Cluster([memcached_1[0].spec], options)
    yield cluster
    cluster.close()


def test_racing_threads_admit_exactly_the_limit(cluster: Cluster) -> None:
    limiter = RateLimiter(cluster, "100/30s")
    key = _key()
    admitted: list[int] = []
    start = threading.Barrier(8)

    def attempts() -> None:
        start.wait()
        mine = sum(limiter.hit(key).allowed for _ in range(40))
        admitted.append(mine)

    threads = [threading.Thread(target=attempts) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(admitted) == 100  # 320 attempts, 8 threads
    after = limiter.hit(key)
    assert not after.allowed
    assert after.remaining == 0
    assert 0 < after.retry_after <= 33  # a period and a slot at most


def test_racing_tasks_admit_exactly_the_limit() -> None:
    limiter = AsyncRateLimiter(AsyncMemoryStore(MemoryStore()), "100/30s")

    async def attempts() -> int:
        admitted = 0
        for _ in range(40):
            admitted += (await limiter.hit("k")).allowed
            await asyncio.sleep(0)
        return admitted

    async def race() -> list[int]:
        return list(await asyncio.gather(*(attempts() for _ in range(8))))

    assert sum(asyncio.run(race())) == 100


def test_racing_tasks_on_memcached_admit_exactly_the_limit(cluster: Cluster) -> None:
    aio = AsyncCluster.twin_of(cluster)
    limiter = AsyncRateLimiter(aio, "100/30s")
    key = _key()

    async def attempts() -> int:
        return sum([(await limiter.hit(key)).allowed for _ in range(40)])

    async def race() -> list[int]:
        admitted = list(await asyncio.gather(*(attempts() for _ in range(8))))
        await aio.close()
        return admitted

    assert sum(asyncio.run(race())) == 100


def _decisions(limiter: RateLimiter, clock: FakeClock, key: str) -> list[tuple[bool, int, float]]:
    """A scripted run crossing window edges: what each attempt was told."""
    told = []
    for step, cost in [(0, 1), (0.5, 3), (4, 2), (5.5, 1), (0.1, 1), (9.7, 4), (0.2, 1)] * 3:
        clock.advance(step)
        decision = limiter.hit(key, cost)
        told.append((decision.allowed, decision.remaining, round(decision.retry_after, 3)))
    return told


def test_embedded_and_memcached_decide_alike(cluster: Cluster) -> None:
    clock = FakeClock(1_800_000_000.0)
    embedded = _decisions(RateLimiter(MemoryStore(clock=clock), "5/10s", clock=clock), clock, "k")
    clock = FakeClock(1_800_000_000.0)
    served = _decisions(RateLimiter(cluster, "5/10s", clock=clock), clock, _key())
    assert served == embedded
    assert any(not allowed for allowed, _, _ in served)


def test_no_double_burst_across_a_window_edge() -> None:
    clock = FakeClock(1_800_000_000.0)
    limiter = RateLimiter(MemoryStore(clock=clock), "10/m", clock=clock)
    clock.advance(59.9 - clock.now % 60)  # the end of a fixed minute
    assert sum(limiter.hit("k").allowed for _ in range(20)) == 10
    clock.advance(0.2)  # a fixed window would start afresh here and admit 10 more
    assert sum(limiter.hit("k").allowed for _ in range(20)) == 0
    refused = limiter.hit("k")
    clock.advance(refused.retry_after)
    assert limiter.hit("k").allowed  # retry_after is when the first slot left


def _round_trips(protocol: str, server: MemcachedServer) -> tuple[int, int, int]:
    # A generous timeout through the proxy too: a timed-out hit is decided locally, off the wire.
    with Proxy(server.port) as proxy:
        cluster = Cluster(
            [proxy.spec], ClusterOptions(protocol=protocol, timeout=30, connect_timeout=30)
        )
        limiter = RateLimiter(cluster, "3/m")
        key = _key()
        limiter.hit(key)  # connects; creates the slot
        proxy.forget()
        assert limiter.hit(key).allowed
        admitted = proxy.round_trips
        assert limiter.hit(key).allowed
        proxy.forget()
        assert not limiter.hit(key).allowed
        refused = proxy.round_trips
        proxy.forget()
        first = RateLimiter(cluster, "3/m").hit(_key())
        assert first.allowed
        created = proxy.round_trips
        cluster.close()
    return admitted, refused, created


def test_one_round_trip_per_admitted_decision(memcached_1: list[MemcachedServer]) -> None:
    assert _round_trips("meta", memcached_1[0]) == (1, 2, 1)
    assert _round_trips("text", memcached_1[0]) == (1, 2, 2)  # text: a slot's first use adds


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_async_round_trips(protocol: str, memcached_1: list[MemcachedServer]) -> None:
    with Proxy(memcached_1[0].port) as proxy:
        options = ClusterOptions(
            protocol=protocol,  # type: ignore[arg-type]
            timeout=30,  # the proxied server's: a timed-out hit is decided off the wire
            connect_timeout=30,
        )
        aio = AsyncCluster([proxy.spec], options)
        limiter = AsyncRateLimiter(aio, "2/m")
        key = _key()

        async def run() -> list[tuple[bool, int]]:
            told = []
            await limiter.hit(key)
            for _ in range(2):
                proxy.forget()
                told.append(((await limiter.hit(key)).allowed, proxy.round_trips))
            await aio.close()
            return told

        assert asyncio.run(run()) == [(True, 1), (False, 2)]


def test_dead_server_fails_open_by_default_and_closed_when_asked() -> None:
    servers = start_memcached(1)
    try:
        cluster = Cluster([servers[0].spec], ClusterOptions(timeout=0.5, connect_timeout=0.5))
        open_, closed = RateLimiter(cluster, "1/m"), RateLimiter(cluster, "1/m", fail="closed")
        assert open_.hit("k").allowed
        assert not open_.hit("k").allowed
        servers[0].kill()
        decision = open_.hit("fresh")
        assert decision.allowed
        assert decision.degraded
        # The local fallback: at most the limit per process and window, seeded with what the
        # server counted last ("k" was used up before the kill), never everything.
        assert not open_.hit("fresh").allowed
        assert not open_.hit("k").allowed
        refused = closed.hit("k")
        assert not refused.allowed
        assert refused.degraded
        assert refused.retry_after > 0
        strict = RateLimiter(cluster.strict(), "1/m")  # the raising view: still no raise
        assert strict.hit("other").allowed
        cluster.close()
    finally:
        stop_all(servers)


def test_cost_above_the_limit_is_refused_and_bad_costs_raise() -> None:
    limiter = RateLimiter(MemoryStore(), "3/s")
    assert not limiter.hit("k", 4).allowed
    assert limiter.hit("k", 3).allowed
    with pytest.raises(ValueError, match="cost"):
        limiter.hit("k", -1)
    # A name with no room left for the slot's suffix: its slots take their digest form.
    assert limiter.hit("k" * 245).allowed
    with pytest.raises(InvalidKeyError):
        limiter.hit("k" * 251)  # the caller's own key too long: an error, not a pass
    with pytest.raises(ConfigurationError, match="fail"):
        RateLimiter(MemoryStore(), "3/s", fail="maybe")  # type: ignore[arg-type]


def test_window_arithmetic_counts_one_slot_more_than_the_period() -> None:
    window = Window(Rate(10, 30))
    assert window.slot_ms == 3000
    assert window.expire >= 34  # read until 11 slots after its start, plus a tick


@pytest.mark.parametrize("rate", ["3/30d", "1000/31d", "3/24d"])
def test_monthly_quotas_are_remembered(cluster: Cluster, rate: str) -> None:
    """A period over ~23 days must not give slots an exptime memcached reads as a date.

    memcached takes an exptime over 30 days (2592000 s) as an absolute Unix
    time: a slot item stored with one in 1970 expires at once, and the limiter
    then admits every attempt.
    """
    limit = parse_rate(rate).limit
    limiter = RateLimiter(cluster, rate)
    key = _key()
    admitted = sum(limiter.hit(key).allowed for _ in range(limit + 2))
    assert admitted == limit
    assert limiter.peek(key).remaining == 0
