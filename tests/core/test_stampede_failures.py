"""get_or_compute under failure: shared failures, waits that end, keepalive, background jobs.

On the in-process MemoryStore and one fake clock, with deterministic
interleavings as in ``patterns/_async/test_stampede.py``; real threads and processes on real
memcached are in ``test_stampede_failures_real.py``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_mcpatterns.core.exceptions import (
    ComputeFailedError,
    LockTimeoutError,
    NodeUnavailableError,
    ServerError,
)
from django_mcpatterns.core.keepalive import Keepalive
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.refresh import RefreshQueueFull, RefreshRunner
from django_mcpatterns.core.stampede import (
    RefreshDropped,
    Stampede,
    StampedePolicy,
    lock_key,
    read_failure_marker,
    recent_failures,
)
from tests.fakes import FakeClock

KEY = "report"
LOCK = lock_key(KEY)
TIMEOUT = 60.0


class Boom(Exception):
    pass


class Computes:
    """A compute callable counting its calls; raises ``Boom`` while ``failing``."""

    def __init__(self, failing: bool = False) -> None:
        self.failing = failing
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failing:
            raise Boom("backend down")
        return f"v{self.calls}"


@pytest.fixture
def make(clock: FakeClock, store: MemoryStore, events: list[object]) -> Callable[..., Stampede]:
    def make(policy: StampedePolicy | None = None, **kwargs: Any) -> Stampede:
        kwargs.setdefault("rng", lambda: 0.5)
        kwargs.setdefault("sleep", clock.sleep)
        return Stampede(store, policy, clock=clock, on_event=events.append, **kwargs)

    return make


@pytest.fixture(autouse=True)
def _no_remembered_failures() -> Iterator[None]:
    recent_failures.clear()
    yield
    recent_failures.clear()


def cache_stale(make: Callable[..., Stampede], clock: FakeClock) -> None:
    make().get_or_compute(KEY, lambda: "old", TIMEOUT)
    clock.advance(TIMEOUT + 1)


# -- a failing compute is shared, not multiplied --------------------------------------------


def test_a_failed_cold_compute_is_shared_until_the_failure_backoff_ends(
    make: Callable[..., Stampede], clock: FakeClock
) -> None:
    stampede = make()
    compute = Computes(failing=True)
    with pytest.raises(Boom) as original:
        stampede.get_or_compute(KEY, compute, TIMEOUT)
    # The next callers get the failure at once instead of a turn at computing it.
    with pytest.raises(ComputeFailedError, match="Boom: backend down") as shared:
        stampede.get_or_compute(KEY, compute, TIMEOUT)
    assert compute.calls == 1
    assert shared.value.__cause__ is original.value  # chained: it failed in this process
    assert shared.value.key == KEY
    assert shared.value.error == "tests.core.test_stampede_failures.Boom: backend down"
    # Another process has only what memcached carries: the description, no cause.
    recent_failures.clear()
    with pytest.raises(ComputeFailedError, match="Boom: backend down") as elsewhere:
        stampede.get_or_compute(KEY, compute, TIMEOUT)
    assert elsewhere.value.__cause__ is None
    assert compute.calls == 1
    # failure_backoff=1 is memcached exptime 2: gone within 2 s; then it is computed again.
    clock.advance(2.0)
    compute.failing = False
    assert stampede.get_or_compute(KEY, compute, TIMEOUT) == "v2"


def test_a_waiter_that_finds_the_failure_raises_at_once_without_computing(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    winner = Lock(store, LOCK, 30, clock=clock)
    assert winner.acquire()

    def sleep(seconds: float) -> None:  # the winner's compute fails during the first wait
        clock.sleep(seconds)
        if winner.token is not None:
            winner.release()
            with pytest.raises(Boom):
                make().get_or_compute(KEY, Computes(failing=True), TIMEOUT)

    compute = Computes()
    with pytest.raises(ComputeFailedError) as shared:
        make(sleep=sleep).get_or_compute(KEY, compute, TIMEOUT)
    assert compute.calls == 0
    assert isinstance(shared.value.__cause__, Boom)
    assert len(clock.sleeps) == 1  # noticed at the first poll


def test_stale_callers_are_served_the_stale_value_during_the_failure_backoff(
    make: Callable[..., Stampede], clock: FakeClock, events: list[object]
) -> None:
    cache_stale(make, clock)
    compute = Computes(failing=True)
    assert make().fetch(KEY, compute, TIMEOUT).outcome == "stale"
    for _ in range(5):
        assert make().fetch(KEY, compute, TIMEOUT).value == "old"
    assert compute.calls == 1
    clock.advance(2.0)
    compute.failing = False
    assert make().fetch(KEY, compute, TIMEOUT).outcome == "computed"


def test_a_failure_backoff_of_zero_releases_the_lock_for_the_next_caller(
    make: Callable[..., Stampede], store: MemoryStore
) -> None:
    compute = Computes(failing=True)
    stampede = make(StampedePolicy(failure_backoff=0))
    for _ in range(2):
        with pytest.raises(Boom):
            stampede.get_or_compute(KEY, compute, TIMEOUT)
    assert compute.calls == 2
    assert store.get(LOCK) is None


def test_the_failure_marker_names_the_error_and_never_looks_like_a_token() -> None:
    marker = read_failure_marker(b"!compute-failed abc123 builtins.ValueError: bad input")
    assert marker == (b"abc123", "builtins.ValueError: bad input")
    assert read_failure_marker(b"0123456789abcdef0123456789abcdef") is None  # a lock token
    assert read_failure_marker(None) is None


# -- waiting ends in an answer, never in an unlocked compute ------------------------------------


def test_waiters_past_wait_raise_by_default_and_never_compute(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    assert Lock(store, LOCK, 30, clock=clock).acquire()  # a holder still computing
    compute = Computes()
    with pytest.raises(LockTimeoutError, match="waiting for another caller"):
        make(StampedePolicy(wait=2.0)).get_or_compute(KEY, compute, TIMEOUT)
    assert compute.calls == 0
    assert StampedePolicy().on_wait_timeout == "raise"


# -- keepalive ----------------------------------------------------------------------------------


class Extensions:
    """The ``extend`` callable of a Keepalive: records TTLs, answers as told."""

    def __init__(self) -> None:
        self.ttls: list[float] = []
        self.answers: list[bool | Exception] = []

    def __call__(self, ttl: float) -> bool:
        self.ttls.append(ttl)
        answer = self.answers.pop(0) if self.answers else True
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_keepalive_extends_by_the_lock_timeout_until_the_maximum_hold(clock: FakeClock) -> None:
    extend = Extensions()
    keepalive = Keepalive(extend, 30.0, 100.0, start=clock(), clock=clock)
    beats = []
    for _ in range(5):
        clock.advance(10.0)  # every third of the lock timeout
        beats.append(keepalive.beat())
    assert beats == [True] * 5
    assert extend.ttls == [30.0] * 5
    clock.advance(40.0)  # 90 s held: the last extension reaches exactly 100 s
    assert keepalive.beat()
    assert extend.ttls[-1] == pytest.approx(10.0)
    clock.advance(10.0)
    assert not keepalive.beat()  # the maximum hold: it lapses by itself now
    assert len(extend.ttls) == 6


def test_keepalive_stops_when_the_lock_is_lost_and_retries_when_unreachable(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    extend = Extensions()
    extend.answers = [NodeUnavailableError("down"), ServerError("busy"), True, False]
    keepalive = Keepalive(extend, 30.0, 300.0, start=clock(), clock=clock, name="the lock")
    with caplog.at_level(logging.WARNING, "django_mcpatterns.stampede"):
        assert [keepalive.beat() for _ in range(4)] == [True, True, True, False]
    assert "the lock: lapsed before it could be extended" in caplog.text


def test_keepalive_thread_extends_while_the_block_runs_and_stops_after() -> None:
    extended = threading.Event()
    calls: list[float] = []

    def extend(ttl: float) -> bool:
        calls.append(ttl)
        extended.set()
        return True

    with Keepalive(extend, 0.03, 60.0, start=0.0, clock=lambda: 1.0):
        assert extended.wait(10)  # beats every 10 ms of real time
    count = len(calls)
    threading.Event().wait(0.05)
    assert len(calls) == count  # stopped with the block


def test_a_policy_whose_max_lock_time_is_the_lock_timeout_starts_no_keepalive(
    make: Callable[..., Stampede],
) -> None:
    seen: list[bool] = []

    def compute() -> str:
        seen.append(any(t.name == "mcpatterns-keepalive" for t in threading.enumerate()))
        return "v"

    make(StampedePolicy(lock_timeout=5, max_lock_time=5)).get_or_compute(KEY, compute, TIMEOUT)
    make().get_or_compute("other", compute, TIMEOUT)
    assert seen == [False, True]  # the default keeps the lock alive from a thread


# -- background refreshes -----------------------------------------------------------------------


def test_a_job_whose_lock_lapsed_while_queued_is_dropped(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock, events: list[object]
) -> None:
    cache_stale(make, clock)
    jobs: list[Callable[[], None]] = []
    policy = StampedePolicy(lock_timeout=5, runner=jobs.append)
    compute = Computes()
    assert make(policy).fetch(KEY, compute, TIMEOUT).outcome == "stale"
    clock.advance(10)  # the queue was slow: the lock lapsed
    other = Lock(store, LOCK, 30, clock=clock)
    assert other.acquire()  # and another caller recomputes meanwhile
    jobs[0]()
    assert compute.calls == 0
    assert RefreshDropped(KEY, "lapsed") in events
    assert other.owned()  # its lock is left alone


def test_a_queued_job_renews_its_lock_before_computing(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    cache_stale(make, clock)
    jobs: list[Callable[[], None]] = []
    seen_ttl: list[int | None] = []

    def compute() -> str:
        seen_ttl.append(store.ttl(LOCK))
        return "new"

    make(StampedePolicy(lock_timeout=5, runner=jobs.append)).fetch(KEY, compute, TIMEOUT)
    clock.advance(4)
    jobs[0]()
    assert seen_ttl == [6]  # a full lock_timeout again (exptime 6), not the 2 s left
    assert store.get(KEY) == "new"


def test_a_full_runner_queue_drops_the_refresh_and_serves_stale(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock, events: list[object]
) -> None:
    cache_stale(make, clock)
    runner = RefreshRunner(workers=1, max_queue=1)
    busy, release = threading.Event(), threading.Event()
    runner(lambda: (busy.set(), release.wait(10)))  # occupies the worker
    assert busy.wait(10)
    runner(lambda: None)  # fills the queue
    try:
        compute = Computes()
        fetched = make(StampedePolicy(runner=runner)).fetch(KEY, compute, TIMEOUT)
        assert (fetched.value, fetched.outcome) == ("old", "stale")
        assert RefreshDropped(KEY, "full") in events
        assert store.get(LOCK) is None  # released: a later reader queues it again
        with pytest.raises(RefreshQueueFull):
            runner(lambda: None)
    finally:
        release.set()
        runner.shutdown()
    assert compute.calls == 0


def test_the_runner_calls_after_job_in_its_worker_after_every_job() -> None:
    where: list[str] = []
    done = threading.Semaphore(0)

    def after_job() -> None:
        where.append(threading.current_thread().name)
        done.release()

    def failing_job() -> None:
        raise Boom("logged, not raised")

    runner = RefreshRunner(workers=1, max_queue=4, after_job=after_job, name="refresh")
    runner(lambda: None)
    runner(failing_job)
    assert done.acquire(timeout=10)
    assert done.acquire(timeout=10)
    runner.shutdown()
    assert where == ["refresh-0", "refresh-0"]


@pytest.mark.parametrize("option", ["workers", "max_queue"])
def test_runner_sizes_are_validated(option: str) -> None:
    with pytest.raises(ValueError, match=option):
        RefreshRunner(**{option: 0})


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_runner_threads() -> None:
    runner = RefreshRunner(workers=1, max_queue=4)
    ran = threading.Event()
    runner(ran.set)  # the parent's thread exists from now on
    assert ran.wait(10)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is gone; a job must still run
        done = threading.Event()
        try:
            runner(done.set)
            os.write(write, b"ran" if done.wait(10) else b"stuck")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    runner.shutdown()
    assert answer == b"ran"


@pytest.mark.parametrize("option", ["failure_backoff", "max_lock_time"])
def test_new_policy_options_are_validated(option: str) -> None:
    with pytest.raises(ValueError, match=option):
        StampedePolicy(**{option: -1})
