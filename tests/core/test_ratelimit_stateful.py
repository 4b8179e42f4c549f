"""Hypothesis drives the rate limiter with a fake clock against a log of what it admitted.

The properties users rely on, checked after every step of random attempts
(random costs, random pauses, several keys):

* no interval of length ``period`` holds more than ``limit`` admitted units,
  wherever it starts (the double burst at a window edge never happens);
* a refusal is never gratuitous: the admitted units of the last period plus
  one slot, with this cost, would pass the limit;
* ``remaining`` is what the log leaves, and waiting ``retry_after`` admits the
  same attempt (when nothing else is admitted meanwhile).

The same machine runs on the embedded store and on real memcached (both protocols).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.limiters import RateLimiter
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.ratelimit import Decision
from django_mcpatterns.core.store import Store
from tests.fakes import FakeClock
from tests.harness import MemcachedServer

LIMIT, PERIOD = 7, 10


class LimiterMachine(RuleBasedStateMachine):
    store: Callable[[FakeClock], Store] = staticmethod(lambda clock: MemoryStore(clock=clock))

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(1_800_000_000.0)
        store = self.store(self.clock)
        self.limiter = RateLimiter(store, f"{LIMIT}/{PERIOD}s", clock=self.clock)
        self.window = self.limiter.window
        run = uuid.uuid4().hex[:8]  # each example's keys are its own on a shared server
        self.keys = {"a": f"{run}-a", "b": f"{run}-b"}
        self.log: dict[str, list[tuple[float, int]]] = {"a": [], "b": []}

    def _recent(self, key: str, now: float) -> int:
        """Admitted units the limiter may still count: from the oldest slot it reads."""
        since = (self.window.slot(now) - self.window.slots) * self.window.slot_ms / 1000
        return sum(cost for at, cost in self.log[key] if at >= since - 1e-9)

    def _hit(self, key: str, cost: int) -> Decision:
        now = self.clock()
        before = self._recent(key, now)
        decision = self.limiter.hit(self.keys[key], cost)
        if decision.allowed:
            self.log[key].append((now, cost))
            assert decision.remaining == LIMIT - before - cost
        else:
            assert before + cost > LIMIT, "refused although the window had room"
            assert decision.remaining == LIMIT - before
        return decision

    @rule(key=st.sampled_from(["a", "b"]), cost=st.integers(0, 3))
    def attempt(self, key: str, cost: int) -> None:
        self._hit(key, cost)

    @rule(seconds=st.floats(0, 4, allow_nan=False))
    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(key=st.sampled_from(["a", "b"]), cost=st.integers(1, 3))
    def retry_when_told(self, key: str, cost: int) -> None:
        decision = self._hit(key, cost)
        if not decision.allowed:
            self.clock.advance(decision.retry_after)
            assert self._hit(key, cost).allowed, "refused again after retry_after"

    @invariant()
    def no_interval_of_a_period_holds_more_than_the_limit(self) -> None:
        for entries in self.log.values():
            for start, _ in entries:  # the worst interval starts at an admission
                inside = sum(c for at, c in entries if start <= at < start + PERIOD - 1e-9)
                assert inside <= LIMIT, f"{inside} units admitted in {PERIOD}s from {start}"


LimiterMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLimiter = LimiterMachine.TestCase


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_memcached_holds_the_same_properties(
    protocol: str, memcached_1: list[MemcachedServer]
) -> None:
    cluster = Cluster([memcached_1[0].spec], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]

    class OnMemcached(LimiterMachine):
        store = staticmethod(lambda clock: cluster)

    try:
        run_state_machine_as_test(
            OnMemcached, settings=settings(max_examples=40, stateful_step_count=30, deadline=None)
        )
    finally:
        cluster.close()


def test_slots_cover_the_whole_period() -> None:
    window = RateLimiter(MemoryStore(), "7/10s").window
    assert window.slots * window.slot_ms >= PERIOD * 1000
    assert window.expire >= math.ceil((window.slots + 1) * window.slot_ms / 1000)
