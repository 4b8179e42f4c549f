# Generated from tests/core/patterns/_async/test_stampede.py by scripts/generate_sync.py: do not edit.
"""get_or_compute, written once: the envelope, the three states, XFetch, failures.

This asyncio source is the test of both forms: scripts/generate_sync.py makes
``../_sync/test_stampede.py`` (``AsyncStampede`` -> ``Stampede``, ``await`` dropped).
Everything here runs on the in-process MemoryStore with one fake clock shared by the
store and the algorithm (``sleep`` advances it).  Concurrency is shown with
deterministic interleavings: another caller's whole call is run at an exact point of
the first one (inside its ``compute``, before its lock ``add``, during its waits), so
"exactly one caller recomputes" is proven step by step rather than by sleeping.  What
does not depend on the form (the wire format, options, keys) and the sync runner's
background refreshes stay in ``tests/core/test_stampede.py``; real tasks in
``tests/core/test_stampede_async.py``; real memcached and processes in
``test_stampede_real.py`` and ``test_stampede_async_real.py``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import pytest
from pymemcache.serde import CompressedSerde

from django_mcpatterns.core.envelope import FLAG_ENVELOPE, Envelope, EnvelopeSerde
from django_mcpatterns.core.exceptions import (
    ConfigurationError,
    EncodingError,
    LockTimeoutError,
    NodeUnavailableError,
)
from django_mcpatterns.core.locks import Backoff, Lock, LockTimedOut, LockWaited
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.stampede import (
    Recomputed,
    Stampede,
    StampedePolicy,
    lock_key,
    read_failure_marker,
)
from tests.fakes import FakeClock, Hooked, near
from tests.twins import face

KEY = "report"
LOCK = lock_key(KEY)
TIMEOUT = 60.0
COMPUTE_TIME = 0.2


class Compute:
    """A compute callable that takes COMPUTE_TIME on the fake clock and counts its calls.

    ``during`` runs inside the call (another caller arriving meanwhile).
    """

    def __init__(
        self, clock: FakeClock, value: Any = "v", during: Callable[[], object] | None = None
    ):
        self.clock = clock
        self.value = value
        self.during = during
        self.calls = 0
        self.seen_during: list[object] = []

    def __call__(self) -> Any:
        self.calls += 1
        self.clock.advance(COMPUTE_TIME)
        if self.during is not None:
            during, self.during = self.during, None  # once
            self.seen_during.append(during())
        return f"{self.value}{self.calls}" if isinstance(self.value, str) else self.value


class Boom(Exception):
    pass


def failing() -> Any:
    raise Boom("backend down")


@pytest.fixture
def make(clock: FakeClock, store: MemoryStore, events: list[object]) -> Callable[..., Stampede]:
    def make(policy: StampedePolicy | None = None, **kwargs: Any) -> Stampede:
        kwargs.setdefault("rng", lambda: 0.5)
        kwargs.setdefault("sleep", clock.sleep)
        backend = kwargs.pop("store", None)
        backend = face(store) if backend is None else backend
        return Stampede(backend, policy, clock=clock, on_event=events.append, **kwargs)

    return make


@pytest.fixture
def stampede(make: Callable[..., Stampede]) -> Stampede:
    return make()


def envelope_value(stampede: Stampede, key: str) -> Any:
    """The value the stampede reader finds under ``key``, fresh or stale (None: a miss)."""
    found = stampede.read(key)
    return None if found is None else found.value


def kinds(events: list[object]) -> list[str]:
    return [type(e).__name__ for e in events]


def cache_stale(stampede: Stampede, clock: FakeClock, value: str = "old") -> Envelope:
    """Cache ``value`` and let it go stale (but not hard-expire)."""
    stampede.get_or_compute(KEY, lambda: value, TIMEOUT)
    clock.advance(TIMEOUT + 1)
    envelope = stampede.read(KEY)
    assert envelope is not None
    assert not envelope.fresh(clock())
    return envelope


# -- the envelope ---------------------------------------------------------------------


def test_a_plain_get_returns_the_plain_value(stampede: Stampede, store: MemoryStore) -> None:
    stampede.get_or_compute(KEY, lambda: {"total": 42}, TIMEOUT)
    assert store.get(KEY) == {"total": 42}
    assert store.get_many([KEY]) == {KEY: {"total": 42}}
    assert store.gets(KEY)[0] == {"total": 42}
    # Only the explicit path returns the envelope.
    assert type(store.gets_envelope(KEY)[0]) is Envelope
    assert type(store.get_many_envelopes([KEY])[KEY]) is Envelope
    assert store.get(KEY) == {"total": 42}


def test_the_envelope_records_soft_and_hard_expiry_and_compute_time(
    stampede: Stampede, clock: FakeClock
) -> None:
    start = clock()
    fetched = stampede.fetch(KEY, Compute(clock), TIMEOUT)
    assert fetched.outcome == "computed"
    envelope = stampede.read(KEY)
    assert envelope == fetched.envelope
    assert envelope.value == "v1"
    assert envelope.compute_time == near(COMPUTE_TIME)
    assert envelope.soft_expiry == near(start + COMPUTE_TIME + TIMEOUT)
    # The documented invariant: hard = soft + grace, grace defaulting to the timeout.
    assert envelope.hard_expiry == near(envelope.soft_expiry + TIMEOUT)


@pytest.mark.parametrize("grace", [None, 0, 5, 3600])
def test_memcached_keeps_the_item_for_soft_ttl_plus_grace(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock, grace: float | None
) -> None:
    stampede = make(StampedePolicy(grace=grace))
    stampede.get_or_compute(KEY, lambda: "v", 10)
    kept = 10 + (10 if grace is None else grace)
    clock.advance(kept - 0.001)
    # A plain read misses once the timeout has passed (with no grace, it has not yet).
    assert store.get(KEY) == ("v" if grace == 0 else None)
    assert envelope_value(stampede, KEY) == "v"  # stale but still servable
    clock.advance(2.002)
    assert stampede.read(KEY) is None  # gone within memcached's one-second rounding


def test_a_compressing_inner_serde_round_trips(clock: FakeClock) -> None:
    store = MemoryStore(serde=CompressedSerde(min_compress_len=10), clock=clock)
    value = "x" * 5000
    Stampede(face(store), clock=clock).get_or_compute(KEY, lambda: value, TIMEOUT)
    assert store.get(KEY) == value


def test_an_envelope_of_an_unknown_version_is_an_error_not_garbage(
    stampede: Stampede, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    serde = EnvelopeSerde()
    with pytest.raises(EncodingError, match="version 9"):
        serde.deserialize(b"k", b"\x09" + b"\0" * 30, FLAG_ENVELOPE)
    with pytest.raises(EncodingError, match="no header"):
        serde.deserialize(b"k", b"", FLAG_ENVELOPE)
    # Planted in the store: a plain get raises, get_or_compute logs and regenerates.
    store.set(KEY, Envelope("v"))
    store._items[KEY.encode()] = store._items[KEY.encode()].__class__(
        b"\x09" + b"\0" * 30, FLAG_ENVELOPE, None, 999, 100
    )
    with pytest.raises(EncodingError):
        store.get(KEY)
    assert stampede.get_or_compute(KEY, lambda: "fresh", TIMEOUT) == "fresh"
    assert store.get(KEY) == "fresh"
    assert "unreadable cached value" in caplog.text


# -- fresh, stale, miss ------------------------------------------------------------------


def test_a_fresh_hit_is_one_get(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    make().get_or_compute(KEY, lambda: "v", TIMEOUT)
    hooked = Hooked(face(store))
    compute = Compute(clock)
    fetched = make(store=hooked).fetch(KEY, compute, TIMEOUT)
    assert (fetched.value, fetched.outcome, compute.calls) == ("v", "fresh", 0)
    assert hooked.calls == [("gets_envelope", KEY)]


def test_a_value_set_plainly_is_returned_as_fresh(
    stampede: Stampede, store: MemoryStore, clock: FakeClock
) -> None:
    store.set(KEY, "set by hand", 5)
    compute = Compute(clock)
    assert (stampede.fetch(KEY, compute, TIMEOUT)).outcome == "fresh"
    assert compute.calls == 0
    clock.advance(6)  # its own TTL
    assert stampede.get_or_compute(KEY, compute, TIMEOUT) == "v1"


def test_soft_expired_one_winner_recomputes_the_others_get_stale_at_once(
    stampede: Stampede, clock: FakeClock, events: list[object]
) -> None:
    cache_stale(stampede, clock)
    events.clear()
    other = Compute(clock)
    winner = Compute(clock, during=lambda: stampede.fetch(KEY, other, TIMEOUT))
    fetched = stampede.fetch(KEY, winner, TIMEOUT)
    assert (fetched.value, fetched.outcome) == ("v1", "computed")
    (during,) = winner.seen_during
    assert (during.value, during.outcome, other.calls) == ("old", "stale", 0)
    assert kinds(events) == ["StaleServed", "Recomputed"]
    assert events[0].age == near(1 + COMPUTE_TIME)
    assert events[1] == Recomputed(KEY, near(COMPUTE_TIME), "stale", False)
    assert stampede.store.get(LOCK) is None  # released
    assert (stampede.fetch(KEY, other, TIMEOUT)).outcome == "fresh"


def test_stale_requests_are_get_plus_add_for_losers_and_six_for_the_winner(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    cache_stale(make(), clock)
    hooked = Hooked(face(store))
    stampede = make(store=hooked)
    loser_span: list[int] = []

    def loser() -> None:
        loser_span.append(len(hooked.calls))
        stampede.fetch(KEY, Compute(clock), TIMEOUT)
        loser_span.append(len(hooked.calls))

    stampede.fetch(KEY, Compute(clock, during=loser), TIMEOUT)
    names = [name for name, _ in hooked.calls]
    start, end = loser_span
    assert names[start:end] == ["gets_envelope", "add"]
    # The winner's re-read takes the lease (its cas) and its fill is a cas against it.
    assert names[:start] + names[end:] == [
        *("gets_envelope", "add", "gets_envelope", "cas"),
        *("gets", "cas"),  # release the lock
    ]


def test_a_refresh_that_lands_between_get_and_add_is_not_recomputed_again(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock, events: list[object]
) -> None:
    # R reads the stale value; W then refreshes it completely (computes, stores,
    # releases the lock) before R's add: R wins the free lock but must not compute.
    cache_stale(make(), clock)
    hooked = Hooked(face(store))
    late = make(store=hooked)
    first = Compute(clock, "first")
    hooked.before["add"] = lambda *args: make().get_or_compute(KEY, first, TIMEOUT)
    second = Compute(clock, "second")
    fetched = late.fetch(KEY, second, TIMEOUT)
    assert (first.calls, second.calls) == (1, 0)
    assert (fetched.value, fetched.outcome) == ("first1", "fresh")
    assert store.get(LOCK) is None


def test_cold_miss_one_caller_computes_and_stores(
    stampede: Stampede, clock: FakeClock, events: list[object]
) -> None:
    compute = Compute(clock)
    fetched = stampede.fetch(KEY, compute, TIMEOUT)
    assert (fetched.value, fetched.outcome, compute.calls) == ("v1", "computed", 1)
    assert events == [Recomputed(KEY, near(COMPUTE_TIME), "miss", False)]
    assert stampede.store.get(LOCK) is None


def test_cold_miss_waiters_get_the_winners_value(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock, events: list[object]
) -> None:
    # The winner holds the lock and stores its value after the waiter's third sleep.
    winner_lock = Lock(store, LOCK, 30, clock=clock)
    assert winner_lock.acquire()
    sleeps = 0

    def sleep(seconds: float) -> None:
        nonlocal sleeps
        clock.sleep(seconds)
        sleeps += 1
        if sleeps == 3:
            Stampede(face(store), clock=clock).recompute(KEY, lambda: "winner's", TIMEOUT)
            winner_lock.release()

    waiter = Compute(clock)
    fetched = make(sleep=sleep).fetch(KEY, waiter, TIMEOUT)
    assert (fetched.value, fetched.outcome, waiter.calls) == ("winner's", "waited", 0)
    assert kinds(events) == ["LockWaited"]
    assert events[0] == LockWaited(LOCK, near(sum(clock.sleeps)))
    # Waiting polls value and lock together, with the capped back-off.
    assert clock.sleeps == near([0.005 * 0.75, 0.01 * 0.75, 0.02 * 0.75])


def test_cold_miss_waiters_poll_value_and_lock_in_one_request(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    Lock(store, LOCK, 30, clock=clock).acquire()
    hooked = Hooked(face(store))
    policy = StampedePolicy(wait=0.05, on_wait_timeout="compute")
    make(policy, store=hooked).get_or_compute(KEY, Compute(clock), TIMEOUT)
    names = [name for name, _ in hooked.calls]
    assert names[:2] == ["gets_envelope", "add"]
    # Then it gave up and computed (opted in), filling under a lease: read, placeholder, cas.
    assert set(names[2:-4]) == {"get_many_envelopes"}
    assert names[-4:] == ["gets_envelope", "add", "gets_envelope", "cas"]


@pytest.mark.parametrize("action", ["compute", "raise"])
def test_cold_miss_waiters_give_up_after_wait(
    make: Callable[..., Stampede],
    store: MemoryStore,
    clock: FakeClock,
    events: list[object],
    action: str,
) -> None:
    Lock(store, LOCK, 30, clock=clock).acquire()  # a winner that never delivers
    stampede = make(StampedePolicy(wait=2.0, on_wait_timeout=action))
    compute = Compute(clock)
    start = clock()
    if action == "raise":
        with pytest.raises(LockTimeoutError, match="waiting for another caller"):
            stampede.get_or_compute(KEY, compute, TIMEOUT)
        assert compute.calls == 0
    else:
        assert stampede.get_or_compute(KEY, compute, TIMEOUT) == "v1"
        assert store.get(KEY) == "v1"  # stored for everyone else
    assert sum(clock.sleeps) == near(2.0)  # bounded, exactly
    assert max(clock.sleeps) <= Backoff().maximum
    assert events[0] == LockTimedOut(LOCK, near(2.0))
    assert clock() - start == near(2.0 + (COMPUTE_TIME if action == "compute" else 0))


def test_when_the_winner_leaves_without_a_value_the_waiters_race_again(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    failed_winner = Lock(store, LOCK, 30, clock=clock)
    failed_winner.acquire()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if failed_winner.token is not None:
            failed_winner.release()  # its compute raised: no value, lock released

    waiter = Compute(clock)
    fetched = make(sleep=sleep).fetch(KEY, waiter, TIMEOUT)
    assert (fetched.outcome, waiter.calls) == ("computed", 1)
    assert len(clock.sleeps) == 1  # noticed at the first poll, not after `wait`


def test_a_cold_winner_rereads_before_computing(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    hooked = Hooked(face(store))
    hooked.before["add"] = lambda *args: store.set(KEY, Envelope("stored meanwhile", math.inf))
    compute = Compute(clock)
    fetched = make(store=hooked).fetch(KEY, compute, TIMEOUT)
    assert (fetched.value, compute.calls) == ("stored meanwhile", 0)
    assert store.get(LOCK) is None


# -- timeouts and what is stored --------------------------------------------------------


def test_timeout_none_never_goes_stale(stampede: Stampede, clock: FakeClock) -> None:
    stampede.get_or_compute(KEY, lambda: "forever", None)
    envelope = stampede.read(KEY)
    assert envelope.soft_expiry == envelope.hard_expiry == math.inf
    clock.advance(10 * 365 * 86400)
    assert (stampede.fetch(KEY, failing, None)).outcome == "fresh"


@pytest.mark.parametrize("timeout", [0, -5])
def test_timeout_zero_computes_every_time_and_stores_nothing(
    stampede: Stampede, clock: FakeClock, timeout: float
) -> None:
    compute = Compute(clock)
    assert stampede.get_or_compute(KEY, compute, timeout) == "v1"
    assert stampede.get_or_compute(KEY, compute, timeout) == "v2"
    assert stampede.store.get(KEY) is None


def test_should_cache_decides_what_is_stored(stampede: Stampede, clock: FakeClock) -> None:
    compute = Compute(clock, value={"status": 500})
    fetched = stampede.fetch(KEY, compute, TIMEOUT, should_cache=lambda r: r["status"] == 200)
    assert (fetched.value, fetched.envelope) == ({"status": 500}, None)
    assert stampede.store.get(KEY) is None
    assert stampede.store.get(LOCK) is None


def test_a_value_too_large_is_returned_and_not_cached(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore(max_item_size=1024, max_bytes=4096, clock=clock)
    big = b"x" * 2000
    assert Stampede(face(store), clock=clock).get_or_compute(KEY, lambda: big, TIMEOUT) == big
    assert store.get(KEY) is None
    assert "over the item size limit" in caplog.text


def test_long_timeouts_use_absolute_exptimes(
    stampede: Stampede, store: MemoryStore, clock: FakeClock
) -> None:
    sixty_days = 60 * 86400.0
    stampede.get_or_compute(KEY, lambda: "long", sixty_days)
    clock.advance(2 * sixty_days - 10)
    assert envelope_value(stampede, KEY) == "long"
    clock.advance(20)
    assert stampede.read(KEY) is None


def test_timeout_must_be_a_number(stampede: Stampede) -> None:
    with pytest.raises(ConfigurationError, match="timeout"):
        stampede.get_or_compute(KEY, lambda: 1, "60")  # type: ignore[arg-type]


# -- XFetch early recomputation ------------------------------------------------------------


@pytest.mark.parametrize(
    ("left", "rng", "beta", "early"),
    [
        # -ln(1 - 0.5) = 0.693...: with Δ = 0.2 s, β = 1 the window is 0.139 s.
        (0.14, 0.5, 1.0, False),
        (0.13, 0.5, 1.0, True),
        (0.27, 0.5, 2.0, True),  # a larger β recomputes earlier
        (0.28, 0.5, 2.0, False),
        (3.0, 0.9999999, 1.0, True),  # rare, very early draws: -ln(1e-7) = 16.1
        (0.01, 0.5, 0.0, False),  # β = 0 disables it
    ],
)
def test_xfetch_recomputes_when_now_minus_delta_beta_log_rand_passes_expiry(
    make: Callable[..., Stampede],
    clock: FakeClock,
    events: list[object],
    left: float,
    rng: float,
    beta: float,
    early: bool,
) -> None:
    make().get_or_compute(KEY, Compute(clock), TIMEOUT)  # Δ = 0.2 s stored
    envelope = make().read(KEY)
    clock.now = envelope.soft_expiry - left
    events.clear()
    compute = Compute(clock, "new")
    fetched = make(StampedePolicy(beta=beta), rng=lambda: rng).fetch(KEY, compute, TIMEOUT)
    assert compute.calls == (1 if early else 0)
    assert fetched.outcome == ("computed" if early else "fresh")
    if early:
        assert events == [Recomputed(KEY, near(COMPUTE_TIME), "early", False)]


def test_xfetch_losers_keep_getting_the_fresh_value(
    make: Callable[..., Stampede], clock: FakeClock, events: list[object]
) -> None:
    make().get_or_compute(KEY, Compute(clock, "old"), TIMEOUT)
    # Early by 0.25 s (window 2 * 0.2 * 0.693 = 0.277 s): still fresh after the 0.2 s compute.
    clock.now = (make().read(KEY)).soft_expiry - 0.25
    events.clear()
    early = make(StampedePolicy(beta=2.0))
    other = Compute(clock)
    winner = Compute(clock, "new", during=lambda: early.fetch(KEY, other, TIMEOUT))
    assert (early.fetch(KEY, winner, TIMEOUT)).value == "new1"
    assert winner.seen_during[0].outcome == "fresh"
    assert other.calls == 0
    assert "StaleServed" not in kinds(events)


# -- background refresh -----------------------------------------------------------------------


# -- compute errors ----------------------------------------------------------------------------


def test_an_error_on_a_stale_value_serves_stale_marks_the_failure_logs_and_signals(
    make: Callable[..., Stampede],
    store: MemoryStore,
    clock: FakeClock,
    events: list[object],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache_stale(make(), clock)
    events.clear()
    with caplog.at_level(logging.WARNING, "django_mcpatterns.stampede"):
        fetched = make().fetch(KEY, failing, TIMEOUT)
    assert (fetched.value, fetched.outcome) == ("old", "stale")
    assert read_failure_marker(store.get(LOCK)) is not None  # shared, not released
    assert kinds(events) == ["ComputeFailed", "StaleServed"]
    assert isinstance(events[0].error, Boom)
    assert not events[0].background
    (record,) = caplog.records
    assert record.exc_info is not None
    assert record.exc_info[0] is Boom


def test_an_error_on_a_stale_value_can_be_raised(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    cache_stale(make(), clock)
    with pytest.raises(Boom):
        make(StampedePolicy(serve_stale_on_error=False)).get_or_compute(KEY, failing, TIMEOUT)
    assert read_failure_marker(store.get(LOCK)) is not None  # shared, not released
    assert envelope_value(make(), KEY) == "old"  # kept for the next attempt


def test_an_error_on_a_cold_miss_raises_and_marks_the_failure(
    stampede: Stampede, store: MemoryStore, events: list[object]
) -> None:
    with pytest.raises(Boom):
        stampede.get_or_compute(KEY, failing, TIMEOUT)
    assert read_failure_marker(store.get(LOCK)) is not None  # shared, not released
    assert kinds(events) == ["ComputeFailed"]


def test_an_error_in_early_recomputation_keeps_serving_the_fresh_value(
    make: Callable[..., Stampede], clock: FakeClock
) -> None:
    make().get_or_compute(KEY, Compute(clock, "old"), TIMEOUT)
    clock.now = (make().read(KEY)).soft_expiry - 0.01
    policy = StampedePolicy(beta=1.0, serve_stale_on_error=False)
    assert (make(policy).fetch(KEY, failing, TIMEOUT)).outcome == "fresh"


def test_a_base_exception_still_releases_the_lock(stampede: Stampede, store: MemoryStore) -> None:
    def interrupted() -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stampede.get_or_compute(KEY, interrupted, TIMEOUT)
    assert store.get(LOCK) is None


def test_a_compute_outliving_the_lock_is_logged(
    make: Callable[..., Stampede],
    store: MemoryStore,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def slow() -> str:
        clock.advance(10)
        return "slow"

    assert make(StampedePolicy(lock_timeout=2)).get_or_compute(KEY, slow, TIMEOUT) == "slow"
    assert "outlived the recompute lock" in caplog.text


# -- an unreachable lock server ------------------------------------------------------------------


class LockServerDown:
    """A store whose lock keys live on an unreachable server (its strict view raises)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def strict(self) -> Any:
        return LockKeysDown(self.store)


class LockKeysDown:
    """The strict view of :class:`AsyncLockServerDown`: a request for the lock key raises."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.store, name)

        def call(key: Any, *args: Any) -> Any:
            if key == LOCK:
                raise NodeUnavailableError("memcached server 10.0.0.9:11211 is unavailable")
            return target(key, *args)

        return call


def test_with_the_lock_server_down_stale_values_are_served(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    cache_stale(make(), clock)
    compute = Compute(clock)
    fetched = make(store=LockServerDown(face(store))).fetch(KEY, compute, TIMEOUT)
    assert (fetched.outcome, compute.calls) == ("stale", 0)


def test_with_the_lock_server_down_misses_compute_without_the_lock(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    compute = Compute(clock)
    fetched = make(store=LockServerDown(face(store))).fetch(KEY, compute, TIMEOUT)
    assert (fetched.outcome, compute.calls) == ("computed", 1)
    assert store.get(KEY) == "v1"


# -- recompute, mark_stale, read ------------------------------------------------------------------


def test_recompute_stores_a_new_value_now(stampede: Stampede, clock: FakeClock) -> None:
    stampede.get_or_compute(KEY, lambda: "old", TIMEOUT)
    assert stampede.recompute(KEY, lambda: "new", TIMEOUT) == "new"
    found = stampede.read(KEY)
    assert found is not None
    assert found.value == "new"
    assert stampede.get_or_compute(KEY, failing, TIMEOUT) == "new"


def test_mark_stale_makes_the_next_reader_recompute_while_others_get_the_old_value(
    stampede: Stampede, store: MemoryStore, clock: FakeClock
) -> None:
    stampede.get_or_compute(KEY, lambda: "old", TIMEOUT)
    hard = (stampede.read(KEY)).hard_expiry
    assert stampede.mark_stale(KEY) is True
    marked = stampede.read(KEY)
    assert not marked.fresh(clock())
    assert marked.hard_expiry == hard
    other = Compute(clock)
    winner = Compute(clock, "new", during=lambda: stampede.fetch(KEY, other, TIMEOUT))
    assert stampede.get_or_compute(KEY, winner, TIMEOUT) == "new1"
    assert winner.seen_during[0].value == "old"
    assert other.calls == 0
    assert stampede.mark_stale(KEY) is True


def test_mark_stale_keeps_the_hard_expiry(
    stampede: Stampede, store: MemoryStore, clock: FakeClock
) -> None:
    stampede.get_or_compute(KEY, lambda: "v", 10)  # hard expiry: 20 s
    clock.advance(5)
    stampede.mark_stale(KEY)
    clock.advance(15 - 0.001)
    assert envelope_value(stampede, KEY) == "v"
    clock.advance(2.002)
    assert stampede.read(KEY) is None


def test_mark_stale_without_an_envelope_is_false(stampede: Stampede, store: MemoryStore) -> None:
    assert stampede.mark_stale(KEY) is False
    store.set(KEY, "plain")
    assert stampede.mark_stale(KEY) is False
    assert store.get(KEY) == "plain"


def test_mark_stale_retries_when_the_value_changes_under_it(
    make: Callable[..., Stampede], store: MemoryStore
) -> None:
    make().get_or_compute(KEY, lambda: "v", TIMEOUT)
    hooked = Hooked(face(store))
    hooked.before["cas"] = lambda *args: make().recompute(KEY, lambda: "newer", TIMEOUT)
    assert make(store=hooked).mark_stale(KEY) is True
    assert [name for name, _ in hooked.calls] == ["gets_envelope", "cas", "gets_envelope", "cas"]
    assert envelope_value(make(), KEY) == "newer"
    assert store.get(KEY) is None  # stale now: plain reads miss


def test_read_returns_envelopes_and_none(stampede: Stampede, store: MemoryStore) -> None:
    assert stampede.read(KEY) is None
    store.set(KEY, "plain")
    assert stampede.read(KEY) == Envelope("plain")


# -- keys ------------------------------------------------------------------------------------------
