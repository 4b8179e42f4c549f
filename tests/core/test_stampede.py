"""get_or_compute's parts that do not depend on the form, and the sync runner's refreshes.

The algorithm is tested once for both forms, in asyncio, by
``tests/core/patterns/_async/test_stampede.py`` (its sync form generated beside it,
whose helpers this module reuses).  Here: the envelope's wire format, the policy's
options, the keys and events (pure), and background refreshes handed to a sync
``runner`` (asyncio runs them as tasks instead: ``test_stampede_async.py``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymemcache.serde import pickle_serde

from django_mcpatterns.core.envelope import FLAG_ENVELOPE, STALE, Envelope, with_envelopes
from django_mcpatterns.core.exceptions import ConfigurationError, EncodingError
from django_mcpatterns.core.locks import exptime_for
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.stampede import (
    NO_VALUE,
    ComputeFailed,
    Recomputed,
    StaleServed,
    Stampede,
    StampedePolicy,
    lock_key,
    read_failure_marker,
)
from tests.core.patterns._sync.test_stampede import (
    COMPUTE_TIME,
    KEY,
    LOCK,
    TIMEOUT,
    Boom,
    Compute,
    cache_stale,
    failing,
)
from tests.fakes import FakeClock, near

# -- the envelope's wire format ---------------------------------------------------------


def test_the_wire_format_is_flagged_versioned_and_wraps_the_inner_serde() -> None:
    serde = with_envelopes(clock=lambda: 99.0)
    data, flags = serde.serialize(b"k", Envelope(7, 100.0, 200.0, 0.5))
    inner_data, inner_flags = pickle_serde.serialize(b"k", 7)
    assert flags == inner_flags | FLAG_ENVELOPE
    assert data[0] == 1  # version
    assert struct.unpack(">ddd", data[1:25]) == (100.0, 200.0, 0.5)
    assert data[25:] == inner_data.encode() if isinstance(inner_data, str) else inner_data
    assert serde.deserialize(b"k", data, flags) == 7
    assert with_envelopes(clock=lambda: 100.0).deserialize(b"k", data, flags) is STALE
    # Ordinary values are the inner serde's, byte for byte.
    assert serde.serialize(b"k", {"a": 1}) == pickle_serde.serialize(b"k", {"a": 1})
    assert with_envelopes(serde) is serde


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)
times = st.floats(min_value=0, allow_nan=False)  # includes +inf: "never"


@given(values, times, times, st.floats(min_value=0, max_value=1e6))
def test_envelopes_round_trip_and_plain_reads_get_the_value(
    value: Any, soft: float, hard: float, compute_time: float
) -> None:
    serde = with_envelopes(clock=lambda: -1.0)  # before every soft expiry
    envelope = Envelope(value, soft, hard, compute_time)
    data, flags = serde.serialize(b"k", envelope)
    assert serde.deserialize(b"k", data, flags) == value
    assert serde.deserialize_envelope(b"k", data, flags) == envelope
    stale = with_envelopes(clock=lambda: soft)  # its soft expiry has come
    assert stale.deserialize(b"k", data, flags) is STALE
    assert stale.deserialize_envelope(b"k", data, flags) == envelope


def test_an_envelope_never_leaks_through_a_serde_that_does_not_know_it() -> None:
    with pytest.raises(EncodingError, match="with_envelopes"):
        pickle_serde.serialize(b"k", Envelope("v"))


# -- options, keys, events -----------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("grace", -1),
        ("lock_timeout", 0),
        ("wait", -1),
        ("beta", -0.5),
        ("on_wait_timeout", "block"),
        ("serve_stale_on_error", "yes"),
        ("runner", 42),
        ("backoff", 0.1),
        ("grace", math.nan),
    ],
)
def test_policy_options_are_validated(option: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=option) as caught:
        StampedePolicy(**{option: value})
    assert caught.value.option == option


def test_lock_keys_are_valid_memcached_keys() -> None:
    assert lock_key("user:42") == b"user:42:stampede-lock"
    long_key = "k" * 250
    derived = lock_key(long_key)
    assert len(derived) <= 250
    assert derived != lock_key("k" * 249)
    assert lock_key(long_key.encode()) == derived
    assert repr(NO_VALUE) == "NO_VALUE"
    assert not NO_VALUE


def test_the_stampede_event_types_are_plain_data() -> None:
    error = Boom("x")
    assert ComputeFailed("k", error).error is error
    assert StaleServed("k", 1.5).age == 1.5


@given(
    st.integers(1, 86_400) | st.floats(1, 86_400),
    st.none() | st.integers(1, 86_400) | st.floats(1, 86_400),
)
def test_memcached_hands_its_recompute_token_from_the_soft_expiry_on(
    timeout: float, grace: float | None
) -> None:
    """The claim's R window against the hard TTL a fill stores (issue 23): memcached answers
    W once the TTL left is under the window, i.e. from ``stored - window`` seconds after the
    fill (give or take its one-second tick), which is the soft expiry, rounded up."""
    policy = StampedePolicy(grace=grace)
    stored = exptime_for(timeout + policy.grace_for(timeout))  # what the fill stores
    window = policy.recache_for(timeout)
    assert window is not None
    assert stored - window == math.ceil(timeout)  # never before the soft expiry
    assert window >= 2  # a TTL of 1 left is in it: the token comes while the item lives
    assert StampedePolicy(grace=0.5).recache_for(timeout) is None  # the lock-based path


# -- background refresh in a sync runner ---------------------------------------------


@pytest.fixture
def make(clock: FakeClock, store: MemoryStore, events: list[object]) -> Callable[..., Stampede]:
    def make(policy: StampedePolicy | None = None) -> Stampede:
        return Stampede(store, policy, clock=clock, sleep=clock.sleep, on_event=events.append)

    return make


def test_background_refresh_serves_stale_and_recomputes_in_the_runner(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock, events: list[object]
) -> None:
    cache_stale(make(), clock)
    jobs: list[Callable[[], None]] = []
    stampede = make(StampedePolicy(runner=jobs.append))
    compute = Compute(clock, "new")
    events.clear()
    fetched = stampede.fetch(KEY, compute, TIMEOUT)
    assert (fetched.value, fetched.outcome, compute.calls) == ("old", "stale", 0)
    assert store.get(LOCK) is not None  # the job owns the lock now
    assert stampede.fetch(KEY, compute, TIMEOUT).outcome == "stale"
    assert len(jobs) == 1  # one job, whatever the number of stale readers
    jobs[0]()
    assert compute.calls == 1
    assert store.get(KEY) == "new1"
    assert store.get(LOCK) is None
    assert Recomputed(KEY, near(COMPUTE_TIME), "stale", True) in events


def test_background_failures_are_logged_signalled_and_leave_a_failure_marker(
    make: Callable[..., Stampede],
    store: MemoryStore,
    clock: FakeClock,
    events: list[object],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache_stale(make(), clock)
    jobs: list[Callable[[], None]] = []
    make(StampedePolicy(runner=jobs.append)).get_or_compute(KEY, failing, TIMEOUT)
    jobs[0]()  # must not raise
    assert read_failure_marker(store.get(LOCK)) is not None  # shared, not released
    failed = [e for e in events if isinstance(e, ComputeFailed)]
    assert failed
    assert failed[0].background
    assert isinstance(failed[0].error, Boom)
    assert "computing the value of 'report' failed" in caplog.text


def test_a_refusing_runner_releases_the_lock_and_serves_stale(
    make: Callable[..., Stampede], store: MemoryStore, clock: FakeClock
) -> None:
    cache_stale(make(), clock)

    def refuse(job: Callable[[], None]) -> None:
        raise RuntimeError("executor shut down")

    fetched = make(StampedePolicy(runner=refuse)).fetch(KEY, Compute(clock), TIMEOUT)
    assert (fetched.value, fetched.outcome) == ("old", "stale")
    assert store.get(LOCK) is None
