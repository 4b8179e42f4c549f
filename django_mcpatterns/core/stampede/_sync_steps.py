# Generated from core/stampede/_async_steps.py by scripts/generate_sync.py: do not edit.
"""The steps of the stampede's algorithm: compute, store, lock, lease (see :mod:`._async`).

:class:`AsyncStampedeSteps` is the base of ``AsyncStampede``: the public methods and
the three states (fresh, stale, cold) are in ``_async.py``, the steps they take here.
Written once for an :class:`~django_mcpatterns.core.store.AsyncStore`; the sync
``StampedeSteps`` is generated from it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from django_mcpatterns.core.concurrency import (
    Compute,
    Extender,
    Guard,
    Undo,
    call,
    finish_then_undo,
    run_in_background,
)
from django_mcpatterns.core.exceptions import (
    EncodingError,
    NodeUnavailableError,
    ValueTooLargeError,
)
from django_mcpatterns.core.keys import Key
from django_mcpatterns.core.leases import PLACEHOLDER, fill, take
from django_mcpatterns.core.locks import (
    EventHook,
    Ownership,
    emit,
    exptime_for,
    new_token,
    rewrite_owned,
    strict_view,
)
from django_mcpatterns.core.store import CasToken, Store
from django_mcpatterns.core.values.envelope import Envelope

from ._model import (
    NO_VALUE,
    OVERWRITE,
    Claim,
    ComputeFailed,
    DropReason,
    Fetched,
    NoValue,
    OnPlaceholder,
    Overwrite,
    Reason,
    Recomputed,
    RefreshDropped,
    StaleServed,
    StampedePolicy,
    as_envelope,
    failure_marker,
    lock_key,
    recent_failures,
)
from ._sync_keepalive import Keepalive

logger = logging.getLogger("django_mcpatterns.stampede")

T = TypeVar("T")


@dataclass(frozen=True)
class Job(Generic[T]):
    """One call of ``get_or_compute``: what to compute for which key, under which policy."""

    key: Key
    compute: Compute[T]
    timeout: float | None  # soft TTL in seconds; None: never soft-expires; 0: do not store
    policy: StampedePolicy
    should_cache: Callable[[T], bool] | None


@dataclass
class Won:
    """A lease on a placeholder this caller's add created (meta mode): it is the lock too.

    The keepalive extends the placeholder by cas (so never another writer's
    item) and keeps the new cas here; ``guard`` keeps that apart from the fill.
    """

    cas: CasToken
    filled: bool = False
    guard: Guard = field(default_factory=Guard, repr=False, compare=False)


Lease = CasToken | None | Overwrite | OnPlaceholder | Won
"""The cas a fill must match (:mod:`django_mcpatterns.core.leases`); None: it may not land;
OVERWRITE: ``set``."""


@dataclass(frozen=True)
class Held:
    """The recompute lock, won: the token travels with it.

    The keepalive and a background worker extend, release or mark it,
    so it cannot be a :class:`~django_mcpatterns.core.locks.Lock`, whose token belongs to the
    acquiring owner.
    """

    store: Store  # the strict view
    key: Key
    token: bytes
    timeout: float
    taken_at: float  # by the Stampede's clock

    def rewrite(self, exptime: int, value: bytes | None = None) -> Ownership:
        return rewrite_owned(self.store, self.key, self.token, exptime, value)


class StampedeSteps:
    """The steps of :class:`~django_mcpatterns.core.stampede.AsyncStampede` (its base)."""

    store: Store
    policy: StampedePolicy
    _clock: Callable[[], float]
    _rng: Callable[[], float]
    _on_event: EventHook | None

    def _compute(
        self, job: Job[T], reason: Reason, lease: Lease = None, background: bool = False
    ) -> Fetched[T]:
        start = self._clock()
        try:
            value = call(job.compute)
        except BaseException:
            if not isinstance(lease, Won):  # its owner leaves the failure marker
                self._drop_placeholder(job, lease)
            raise
        end = self._clock()
        compute_time = max(0.0, end - start)
        envelope = None
        if job.timeout != 0 and (job.should_cache is None or job.should_cache(value)):
            envelope = self._store(job, value, end, compute_time, lease)
            if envelope is None:
                # Not stored (over the item limit, no memory, or the lease lost):
                # a placeholder still there would hold every later caller for
                # policy.wait.  The delete is by its cas, so a writer's value stays.
                self._drop_placeholder(job, lease)
        else:
            self._drop_placeholder(job, lease)
        emit(self._on_event, Recomputed(job.key, compute_time, reason, background))
        return Fetched(value, "computed", envelope)

    def _recompute_locked(
        self, job: Job[T], held: Held, reason: Reason, lease: Lease, background: bool = False
    ) -> Fetched[T]:
        """Compute under the lock, kept alive meanwhile; release it, or leave a failure marker."""
        try:
            with self._keepalive(job, held.taken_at, self._held_extend(held), held.key):
                fetched = self._compute(job, reason, lease, background)
        except Exception as exc:
            logger.warning("computing the value of %r failed", job.key, exc_info=True)
            emit(self._on_event, ComputeFailed(job.key, exc, background))
            self._mark_failed(job, held, exc)
            raise
        except BaseException:
            self._release(held)  # interrupted (KeyboardInterrupt...): nothing to share
            raise
        self._release(held)
        return fetched

    def _keepalive(
        self,
        job: Job[Any],
        taken_at: float,
        extend: Extender,
        lock: Key | None = None,
    ) -> Keepalive:
        """Extend the lock (or the won placeholder) while ``compute`` runs.

        Nothing runs beside it when ``max_lock_time <= lock_timeout``.
        """
        return Keepalive(
            extend,
            job.policy.lock_timeout,
            job.policy.max_lock_time,
            start=taken_at,
            clock=self._clock,
            name=f"recompute lock {job.key if lock is None else lock!r}",
        )

    @staticmethod
    def _held_extend(held: Held) -> Extender:
        def extend(ttl: float) -> bool:
            return held.rewrite(exptime_for(ttl)) == "ours"

        return extend

    def _dispatch(self, job: Job[Any], held: Held, reason: Reason, lease: Lease) -> None:
        """Hand the recompute (which owns the lock and the lease from now on) to the runner."""

        def refresh() -> None:
            if self._still_held(job, held):
                with contextlib.suppress(Exception):  # logged and signalled already
                    self._recompute_locked(job, held, reason, lease, background=True)

        runner = job.policy.runner
        assert runner is not None
        try:
            run_in_background(runner, refresh)
        except queue.Full:
            logger.warning("the stampede runner's queue is full: not refreshing %r", job.key)
            self._drop(job, "full")
            self._release(held)
        except Exception:
            logger.exception("the stampede runner refused to refresh %r", job.key)
            self._drop(job, "refused")
            self._release(held)

    def _still_held(self, job: Job[Any], held: Held) -> bool:
        """Whether a queued job still owns its lock: renew it (the queue ate into it) or drop."""
        try:
            ownership = held.rewrite(exptime_for(held.timeout))
        except NodeUnavailableError as exc:
            logger.warning("refresh of %r dropped: its lock is unreachable (%s)", job.key, exc)
            self._drop(job, "unreachable")
            return False
        if ownership == "ours":
            return True
        logger.warning("refresh of %r dropped: its lock lapsed while it was queued", job.key)
        self._drop(job, "lapsed")
        return False

    def _drop(self, job: Job[Any], reason: DropReason) -> None:
        emit(self._on_event, RefreshDropped(job.key, reason))

    def _store(
        self, job: Job[Any], value: Any, now: float, compute_time: float, lease: Lease
    ) -> Envelope | None:
        """Store the value: a fill under ``lease`` (:mod:`django_mcpatterns.core.leases`), or a
        plain ``set``."""
        if job.timeout is None:
            soft = hard = math.inf
        else:
            soft = now + job.timeout
            hard = soft + job.policy.grace_for(job.timeout)
        envelope = Envelope(value, soft, hard, compute_time)
        exptime = exptime_for(hard - now, now=now)
        if isinstance(lease, Won):
            with lease.guard:  # not while the keepalive moves the placeholder's cas
                lease.filled = True
                filled = fill(self.store, job.key, envelope, lease.cas, exptime)
                return envelope if filled else None
        if lease is not OVERWRITE:
            cas = lease.cas if isinstance(lease, OnPlaceholder) else lease
            filled = fill(self.store, job.key, envelope, cas, exptime)
            return envelope if filled else None
        try:
            stored = self.store.set(job.key, envelope, exptime)
        except ValueTooLargeError:
            logger.warning("the value of %r is over the item size limit; not cached", job.key)
            return None
        return envelope if stored else None

    def _lease(self, job: Job[Any], *, missing: bool) -> tuple[Envelope | NoValue, Lease]:
        """What the key holds now, and the lease a fill must match
        (:func:`django_mcpatterns.core.leases.take`).

        The placeholder outlives the longest computation the lock allows.  An
        unreadable item is overwritten (it would never read again otherwise).
        """
        ttl = exptime_for(max(job.policy.lock_timeout, job.policy.max_lock_time))
        try:
            found, cas = take(self.store, job.key, ttl, missing=missing)
            if cas is None:  # deleted between our add and gets, or an item nobody can read
                found, cas = take(self.store, job.key, ttl)
        except EncodingError:
            logger.warning("unreadable cached value at %r; recomputing it", job.key, exc_info=True)
            return NO_VALUE, OVERWRITE
        if cas is None:
            return NO_VALUE, OVERWRITE  # refused by the serde (or unreachable): overwrite it
        current = as_envelope(found)
        return current, (OnPlaceholder(cas) if current is NO_VALUE else cas)

    def _lease_held(
        self, job: Job[Any], held: Held, *, missing: bool
    ) -> tuple[Envelope | NoValue, Lease]:
        """:meth:`_lease` under the won lock, which an interruption (a cancelled task) releases."""
        try:
            return self._lease(job, missing=missing)
        except BaseException:
            self._release(held)
            raise

    def _drop_placeholder(self, job: Job[Any], lease: Lease) -> None:
        """No value will fill the placeholder: delete it (if unchanged), so ``add`` works again."""
        if isinstance(lease, OnPlaceholder | Won):
            self.store.cas(job.key, PLACEHOLDER, lease.cas, -1)  # a negative exptime deletes

    def _serve(self, job: Job[T], seen: Envelope, reason: Reason) -> Fetched[T]:
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

    def _claim(self, job: Job[Any]) -> Held | Claim:
        """Try the recompute lock once (``add`` on the strict view)."""
        store = strict_view(self.store)
        key = lock_key(job.key)
        token = new_token()
        taken_at = self._clock()
        try:
            add = store.add(key, token, exptime_for(job.policy.lock_timeout))  # sync: runs here
            if not finish_then_undo(add, self._unclaim_lock(store, key, token)):
                return Claim.LOST
        except NodeUnavailableError as exc:
            logger.warning(
                "recompute lock unavailable (%s): stale values are served, misses "
                "computed without the lock",
                exc,
            )
            return Claim.UNREACHABLE
        return Held(store, key, token, job.policy.lock_timeout, taken_at)

    @staticmethod
    def _unclaim_lock(store: Store, key: Key, token: bytes) -> Undo[bool]:
        """What releases a lock a cancelled caller's ``add`` took
        (:mod:`django_mcpatterns.core.concurrency`)."""

        def undo(added: bool) -> None:
            if added:
                rewrite_owned(store, key, token, -1)

        return undo

    def _release(self, held: Held) -> None:
        self._let_go(held, -1)  # cas with a negative exptime deletes

    def _mark_failed(self, job: Job[Any], held: Held, error: BaseException) -> None:
        """Share ``error`` for ``failure_backoff`` seconds: the lock becomes its marker."""
        if job.policy.failure_backoff <= 0:
            self._release(held)
            return
        recent_failures.remember(held.token, error)
        marker = failure_marker(held.token, error)
        self._let_go(held, exptime_for(job.policy.failure_backoff), marker)

    def _let_go(self, held: Held, exptime: int, marker: bytes | None = None) -> None:
        """Release the lock, or turn it into ``marker``, if it is still ours."""
        try:
            # To its end even if this task is cancelled meanwhile: the rewrite is a gets
            # then a cas, and a lock left halfway blocks every refresh for lock_timeout.
            ownership = finish_then_undo(held.rewrite(exptime, marker), _rewritten)
        except NodeUnavailableError as exc:
            logger.warning("could not release %r (%s); it lapses by itself", held.key, exc)
            return
        if ownership != "ours":
            logger.warning(
                "computing %r outlived the recompute lock (lock_timeout=%gs): another caller "
                "may have recomputed it too",
                held.key,
                held.timeout,
            )

    def _read(self, key: Key) -> Envelope | NoValue:
        try:
            found, cas = self.store.gets_envelope(key)
        except EncodingError:
            logger.warning("unreadable cached value at %r; recomputing it", key, exc_info=True)
            return NO_VALUE
        return NO_VALUE if cas is None else as_envelope(found)

    def _poll(self, key: Key, lock: Key) -> tuple[Envelope | NoValue, object]:
        """Read the value and its lock in one pipelined request: (value, the lock item or None)."""
        try:
            found = self.store.get_many_envelopes([key, lock])
        except EncodingError:
            # Unreadable: race for the lock; its winner reads it again and overwrites it.
            return NO_VALUE, None
        return as_envelope(found.get(key, NO_VALUE)), found.get(lock)


def _rewritten(_: Ownership) -> None:
    """Nothing to hand back once a cancelled caller's release of the lock is done."""
