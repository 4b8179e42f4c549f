"""get_or_compute: soft expiry, one recomputing winner, early recomputation.

Like dogpile's lock, this knows nothing about frameworks: it takes a Store, a
key and a ``compute`` callable.  Values are stored in a soft-expiry
:class:`~.envelope.Envelope` (one item: value, soft expiry, hard expiry,
measured compute time).  What a caller does depends on what one ``get`` finds:

fresh (now < soft expiry)
    Return the value.  One request.  With ``beta > 0`` (XFetch, Vattani et al.
    2015) a caller may instead recompute *early*, when
    ``now - Δ·β·ln(rand()) >= soft_expiry`` with Δ the stored compute time, so
    hot keys are refreshed before anyone sees them stale.
stale (soft expiry <= now < hard expiry)
    Try the recompute lock (``add``, see :mod:`.locks`).  Losers return the
    stale value at once (two requests).  The winner reads the key again (a
    caller that finished just before may have refreshed it: then it returns
    that), computes, stores and releases the lock (six requests in all), or
    hands the recompute to ``policy.runner`` and returns the stale value.
miss
    Try the recompute lock.  The winner computes; every other caller polls the
    value and the lock (one pipelined ``get_many``, with back-off) until the
    value appears (returned) or the lock goes without a value (they race for
    the lock again), for at most ``policy.wait`` seconds, then computes
    itself or raises :class:`~.exceptions.LockTimeoutError`
    (``policy.on_wait_timeout``).

The invariant: the hard TTL (memcached's exptime) is the soft one plus
``policy.grace`` (default: the soft timeout again), so a stale value outlives
its soft expiry by at least the grace period and can be served while it is
recomputed.  Losing it (eviction, restart) only turns a stale hit into a miss.

Failure modes
    ``compute`` raises: the error is logged and sent as :class:`ComputeFailed`,
    the lock is released, and the stale value is served
    (``serve_stale_on_error``) or the error raised; a cold miss has nothing to
    serve and raises.  The lock's server is unreachable: stale values are
    served until their hard expiry, cold misses compute without the lock.  The
    value's server is unreachable: every read is a miss, so callers compute.  An
    envelope this release cannot read is logged and recomputed.

A value stored under the key with a plain ``set`` is returned as is, fresh until
its own TTL.  Plain reads of an envelope return the value (:mod:`.envelope`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar

from .envelope import Envelope, envelopes_visible
from .exceptions import (
    ConfigurationError,
    EncodingError,
    LockNotOwnedError,
    LockTimeoutError,
    NodeUnavailableError,
    ValueTooLargeError,
)
from .keys import MAX_KEY_LENGTH, Key, key_bytes
from .locks import Backoff, EventHook, Lock, LockTimedOut, LockWaited, emit, exptime_for
from .store import Store

__all__ = [
    "NO_VALUE",
    "ComputeFailed",
    "Fetched",
    "Recomputed",
    "Runner",
    "StaleServed",
    "Stampede",
    "StampedePolicy",
    "lock_key",
]

logger = logging.getLogger("django_mcpatterns.stampede")

T = TypeVar("T")

Runner = Callable[[Callable[[], None]], object]
"""Runs a zero-argument job off the request path, e.g. ``ThreadPoolExecutor(2).submit``."""

Reason = Literal["miss", "stale", "early", "refresh"]
Outcome = Literal["fresh", "stale", "computed", "waited"]
WAIT_TIMEOUT_ACTIONS = ("compute", "raise")

LOCK_SUFFIX = b":stampede-lock"
_MARK_STALE_ATTEMPTS = 5


class _NoValue:
    """The type of :data:`NO_VALUE`: a miss, distinct from a cached ``None``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_VALUE"

    def __bool__(self) -> bool:
        return False


NO_VALUE: Final = _NoValue()


# -- events ------------------------------------------------------------------------


@dataclass(frozen=True)
class Recomputed:
    """A value was computed and stored.

    ``reason``: ``"miss"``, ``"stale"``, ``"early"`` (XFetch) or ``"refresh"``
    (:meth:`Stampede.recompute`); ``background``: it ran in ``policy.runner``.
    """

    key: Key
    compute_time: float
    reason: Reason
    background: bool = False


@dataclass(frozen=True)
class StaleServed:
    """A stale value was returned, ``age`` seconds after its soft expiry."""

    key: Key
    age: float


@dataclass(frozen=True)
class ComputeFailed:
    """``compute`` raised ``error`` (logged; the lock was released)."""

    key: Key
    error: BaseException
    background: bool = False


# -- options -----------------------------------------------------------------------


@dataclass(frozen=True)
class StampedePolicy:
    """How :meth:`Stampede.get_or_compute` behaves; one frozen object, shared freely.

    grace
        Seconds a value stays servable after its soft expiry (the hard TTL is
        ``timeout + grace``); ``None``: as long as the timeout itself.
    lock_timeout
        TTL of the recompute lock; make it longer than ``compute`` takes, or a
        second caller may recompute once it lapses.
    wait
        Cold miss: seconds a caller waits for another one's computation.
    on_wait_timeout
        ``"compute"`` (compute and store it yourself) or ``"raise"``
        (:class:`~.exceptions.LockTimeoutError`) once ``wait`` is over.
    beta
        XFetch's β for early recomputation; 0 disables it, 1 is the paper's
        choice, larger values recompute earlier.
    serve_stale_on_error
        When ``compute`` raises on a stale value, return the stale value
        (the error is logged and signalled) instead of raising.
    runner
        Recompute stale values off the request path: called with a zero-argument
        job, e.g. ``ThreadPoolExecutor(2).submit``.  ``None``: the winner
        recomputes inline.  Cold misses always compute inline.
    backoff
        Polling schedule of cold-miss waiters.
    """

    grace: float | None = None
    lock_timeout: float = 30.0
    wait: float = 10.0
    on_wait_timeout: Literal["compute", "raise"] = "compute"
    beta: float = 0.0
    serve_stale_on_error: bool = True
    runner: Runner | None = None
    backoff: Backoff = dataclasses.field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if self.grace is not None:
            _check_number("grace", self.grace, zero=True)
        _check_number("lock_timeout", self.lock_timeout)
        _check_number("wait", self.wait, zero=True)
        _check_number("beta", self.beta, zero=True)
        if self.on_wait_timeout not in WAIT_TIMEOUT_ACTIONS:
            raise ConfigurationError(
                f"invalid value {self.on_wait_timeout!r} for option 'on_wait_timeout'; "
                "valid choices: " + ", ".join(repr(c) for c in WAIT_TIMEOUT_ACTIONS),
                option="on_wait_timeout",
                choices=WAIT_TIMEOUT_ACTIONS,
            )
        if not isinstance(self.serve_stale_on_error, bool):
            raise ConfigurationError(
                "option 'serve_stale_on_error' must be True or False", option="serve_stale_on_error"
            )
        if self.runner is not None and not callable(self.runner):
            raise ConfigurationError("option 'runner' must be callable", option="runner")
        if not isinstance(self.backoff, Backoff):
            raise ConfigurationError("option 'backoff' must be a Backoff", option="backoff")

    def grace_for(self, timeout: float) -> float:
        return timeout if self.grace is None else self.grace


@dataclass(frozen=True)
class Fetched(Generic[T]):
    """What :meth:`Stampede.fetch` returned and how.

    ``outcome``: ``"fresh"`` (a fresh hit), ``"stale"`` (served stale),
    ``"computed"`` (this caller computed it) or ``"waited"`` (another caller
    computed it while this one waited).  ``envelope``: the metadata of the
    returned value (a value stored with a plain ``set`` reads as never
    soft-expiring), ``None`` when a computed value was not stored.
    """

    value: T
    outcome: Outcome
    envelope: Envelope | None


@dataclass(frozen=True)
class _Job(Generic[T]):
    key: Key
    compute: Callable[[], T]
    timeout: float | None  # soft TTL in seconds; None: never soft-expires; 0: do not store
    policy: StampedePolicy
    should_cache: Callable[[T], bool] | None


class _Claim(enum.Enum):
    WON = "won"
    LOST = "lost"
    UNREACHABLE = "unreachable"


def lock_key(key: Key) -> bytes:
    """The key of ``key``'s recompute lock: the key plus a suffix, or a digest if too long."""
    raw = key_bytes(key)
    if len(raw) + len(LOCK_SUFFIX) <= MAX_KEY_LENGTH:
        return raw + LOCK_SUFFIX
    return hashlib.sha256(raw).hexdigest().encode() + LOCK_SUFFIX


# -- the algorithm ---------------------------------------------------------------------


class Stampede:
    """Stampede-protected computation of values cached in ``store``.

    ``store``'s serde must know envelopes (both stores' default does, see
    :mod:`.envelope`).  ``clock`` is wall time in seconds (soft expiries are
    shared between processes); ``sleep`` and ``rng`` drive the waits and
    XFetch; ``on_event`` receives :class:`Recomputed`, :class:`StaleServed`,
    :class:`ComputeFailed`, :class:`~.locks.LockWaited` and
    :class:`~.locks.LockTimedOut`.  Stateless apart from these: thread-safe.
    """

    def __init__(
        self,
        store: Store,
        policy: StampedePolicy | None = None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] = time.sleep,
        rng: Callable[[], float] = random.random,
        on_event: EventHook | None = None,
    ) -> None:
        self.store = store
        self.policy = policy or StampedePolicy()
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._on_event = on_event

    # -- public --

    def get_or_compute(
        self,
        key: Key,
        compute: Callable[[], T],
        timeout: float | None,
        *,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """Return the value of ``key``, computing it with ``compute`` at most once at a time.

        ``timeout``: seconds until the value is stale (``None``: never; 0 or
        less: compute and store nothing).  ``should_cache(value)``: store only
        values it accepts (e.g. cacheable responses).
        """
        return self.fetch(key, compute, timeout, policy=policy, should_cache=should_cache).value

    def fetch(
        self,
        key: Key,
        compute: Callable[[], T],
        timeout: float | None,
        *,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> Fetched[T]:
        """Like :meth:`get_or_compute`, also saying how the value was obtained."""
        job = _Job(key, compute, _soft_timeout(timeout), policy or self.policy, should_cache)
        if job.timeout == 0:
            return self._compute(job, "miss")
        seen = self._read(key)
        if seen is NO_VALUE:
            return self._cold(job)
        now = self._clock()
        if not seen.fresh(now):
            return self._refresh(job, seen, "stale")
        if self._early(seen, now, job.policy.beta):
            return self._refresh(job, seen, "early")
        return Fetched(seen.value, "fresh", seen)

    def recompute(
        self,
        key: Key,
        compute: Callable[[], T],
        timeout: float | None,
        *,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """Compute and store the value now, whatever is cached (no lock); return it."""
        job = _Job(key, compute, _soft_timeout(timeout), policy or self.policy, should_cache)
        return self._compute(job, "refresh").value

    def mark_stale(self, key: Key) -> bool:
        """Make the cached value stale now, keeping it servable until its hard expiry.

        The next :meth:`get_or_compute` recomputes it (one caller) while the
        others are served the old value: an invalidation without a stampede.
        Return False when there is no envelope to mark (a miss, or a plain value).
        """
        for _ in range(_MARK_STALE_ATTEMPTS):
            with envelopes_visible():
                found, cas = self.store.gets(key)
            if type(found) is not Envelope or cas is None:
                return False
            now = self._clock()
            if not found.fresh(now):
                return True
            remaining = found.hard_expiry - now
            if remaining <= 0:
                return True  # memcached drops it any moment
            stale = dataclasses.replace(found, soft_expiry=now)
            if self.store.cas(key, stale, cas, exptime_for(remaining, now=now)):
                return True
        return False  # rewritten under us every time: someone keeps refreshing it

    def read(self, key: Key) -> Envelope | None:
        """The envelope cached under ``key`` (a plain value wrapped as never stale), or None."""
        found = self._read(key)
        return None if found is NO_VALUE else found

    # -- the three states --

    def _refresh(self, job: _Job[T], seen: Envelope, reason: Reason) -> Fetched[T]:
        """A stale (or XFetch-chosen) value: one caller recomputes, the others serve ``seen``."""
        lock = self._lock(job)
        if self._claim(lock) is not _Claim.WON:
            return self._serve(job, seen, reason)
        current = self._read(job.key)
        if current is not NO_VALUE and current.soft_expiry > seen.soft_expiry:
            self._release(lock)  # another caller refreshed it between our get and our add
            return Fetched(current.value, "fresh", current)
        if job.policy.runner is not None:
            self._dispatch(job, lock, reason)
            return self._serve(job, seen, reason)
        try:
            return self._recompute_locked(job, lock, reason)
        except Exception:
            if reason == "stale" and not job.policy.serve_stale_on_error:
                raise
            return self._serve(job, seen, reason)

    def _cold(self, job: _Job[T]) -> Fetched[T]:
        """A miss: one caller computes; the others wait for its value, for a bounded time."""
        lock = self._lock(job)
        start = self._clock()
        attempt = 0
        while True:
            claim = self._claim(lock)
            if claim is _Claim.UNREACHABLE:
                return self._compute(job, "miss")  # no lock to share the work through
            if claim is _Claim.WON:
                current = self._read(job.key)
                if current is not NO_VALUE:
                    self._release(lock)  # stored between our get and our add
                    return Fetched(current.value, "fresh", current)
                return self._recompute_locked(job, lock, "miss")
            while True:  # lost: poll until the value appears or the lock goes
                remaining = start + job.policy.wait - self._clock()
                if remaining <= 0:
                    return self._wait_timed_out(job, lock.key, start)
                self._sleep(min(job.policy.backoff.delay(attempt, self._rng), remaining))
                attempt += 1
                value, locked = self._poll(job.key, lock.key)
                if value is not NO_VALUE:
                    emit(self._on_event, LockWaited(lock.key, self._clock() - start))
                    return Fetched(value.value, "waited", value)
                if not locked:
                    break  # its holder left without storing a value: race for the lock again

    def _wait_timed_out(self, job: _Job[T], key: Key, start: float) -> Fetched[T]:
        waited = self._clock() - start
        emit(self._on_event, LockTimedOut(key, waited))
        if job.policy.on_wait_timeout == "raise":
            raise LockTimeoutError(
                f"gave up after {waited:.3g}s waiting for another caller to compute {job.key!r}"
            )
        return self._compute(job, "miss")

    # -- steps --

    def _compute(self, job: _Job[T], reason: Reason, background: bool = False) -> Fetched[T]:
        start = self._clock()
        value = job.compute()
        end = self._clock()
        compute_time = max(0.0, end - start)
        envelope = None
        if job.timeout != 0 and (job.should_cache is None or job.should_cache(value)):
            envelope = self._store(job, value, end, compute_time)
        emit(self._on_event, Recomputed(job.key, compute_time, reason, background))
        return Fetched(value, "computed", envelope)

    def _recompute_locked(
        self, job: _Job[T], lock: Lock, reason: Reason, background: bool = False
    ) -> Fetched[T]:
        """Compute under ``lock``, release it whatever happens; log and signal errors."""
        try:
            return self._compute(job, reason, background)
        except Exception as exc:
            logger.warning("computing the value of %r failed", job.key, exc_info=True)
            emit(self._on_event, ComputeFailed(job.key, exc, background))
            raise
        finally:
            self._release(lock)

    def _dispatch(self, job: _Job[Any], lock: Lock, reason: Reason) -> None:
        """Hand the recompute (which owns ``lock`` from now on) to the runner."""

        def refresh() -> None:
            with contextlib.suppress(Exception):  # logged and signalled already
                self._recompute_locked(job, lock, reason, background=True)

        try:
            job.policy.runner(refresh)  # type: ignore[misc]
        except Exception:
            logger.exception("the stampede runner refused to refresh %r", job.key)
            self._release(lock)

    def _store(
        self, job: _Job[Any], value: Any, now: float, compute_time: float
    ) -> Envelope | None:
        if job.timeout is None:
            soft = hard = math.inf
        else:
            soft = now + job.timeout
            hard = soft + job.policy.grace_for(job.timeout)
        envelope = Envelope(value, soft, hard, compute_time)
        try:
            stored = self.store.set(job.key, envelope, exptime_for(hard - now, now=now))
        except ValueTooLargeError:
            logger.warning("the value of %r is over the item size limit; not cached", job.key)
            return None
        return envelope if stored else None

    def _serve(self, job: _Job[T], seen: Envelope, reason: Reason) -> Fetched[T]:
        if reason == "early":
            return Fetched(seen.value, "fresh", seen)  # still fresh: nothing stale served
        emit(self._on_event, StaleServed(job.key, self._clock() - seen.soft_expiry))
        return Fetched(seen.value, "stale", seen)

    def _early(self, seen: Envelope, now: float, beta: float) -> bool:
        """XFetch: recompute when ``now - Δ·β·ln(rand()) >= soft_expiry``."""
        if beta <= 0 or seen.compute_time <= 0 or seen.soft_expiry == math.inf:
            return False
        # rng() is in [0, 1); 1 - rng() is in (0, 1], so the log is finite and <= 0.
        return now - seen.compute_time * beta * math.log(1.0 - self._rng()) >= seen.soft_expiry

    def _lock(self, job: _Job[Any]) -> Lock:
        return Lock(
            self.store,
            lock_key(job.key),
            job.policy.lock_timeout,
            blocking=False,
            clock=self._clock,
            sleep=self._sleep,
            rng=self._rng,
            on_event=self._on_event,
            thread_local=False,  # _dispatch hands it to the runner's thread, which releases it
        )

    def _claim(self, lock: Lock) -> _Claim:
        try:
            return _Claim.WON if lock.acquire(blocking=False) else _Claim.LOST
        except NodeUnavailableError as exc:
            logger.warning(
                "recompute lock unavailable (%s): stale values are served, misses "
                "computed without the lock",
                exc,
            )
            return _Claim.UNREACHABLE

    def _release(self, lock: Lock) -> None:
        try:
            lock.release()
        except LockNotOwnedError:
            logger.warning(
                "computing %r outlived the recompute lock (lock_timeout=%gs): another caller "
                "may have recomputed it too",
                lock.key,
                lock.timeout,
            )
        except NodeUnavailableError as exc:
            logger.warning("could not release %r (%s); it lapses by itself", lock.key, exc)

    def _read(self, key: Key) -> Envelope | _NoValue:
        try:
            with envelopes_visible():
                found = self.store.get(key, NO_VALUE)
        except EncodingError:
            logger.warning("unreadable cached value at %r; recomputing it", key, exc_info=True)
            return NO_VALUE
        return _as_envelope(found)

    def _poll(self, key: Key, lock: bytes) -> tuple[Envelope | _NoValue, bool]:
        """Read the value and its lock in one pipelined request: (value, lock still held)."""
        try:
            with envelopes_visible():
                found = self.store.get_many([key, lock])
        except EncodingError:
            # Unreadable: race for the lock; its winner reads it again and overwrites it.
            return NO_VALUE, False
        return _as_envelope(found.get(key, NO_VALUE)), lock in found


def _as_envelope(found: Any) -> Envelope | _NoValue:
    if found is NO_VALUE or type(found) is Envelope:
        return found  # type: ignore[no-any-return]
    return Envelope(found)  # stored with a plain set: the user's value and TTL


def _soft_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    _check_number("timeout", timeout, zero=True, negative=True)
    return max(float(timeout), 0.0)


def _check_number(
    option: str, value: object, *, zero: bool = False, negative: bool = False
) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if (
        not number
        or math.isnan(value)
        or (  # type: ignore[arg-type]
            not negative and (value < 0 if zero else value <= 0)  # type: ignore[operator]
        )
    ):
        bound = "" if negative else " >= 0" if zero else " > 0"
        raise ConfigurationError(
            f"option {option!r} must be a number{bound}, not {value!r}", option=option
        )
