"""get_or_compute with soft expiry, one recomputing winner, early recomputation.

The algorithm of :mod:`django_mcpatterns.core.stampede` (read its docstring),
written once for an :class:`~django_mcpatterns.core.store.AsyncStore`; the sync
:class:`~django_mcpatterns.core.stampede.Stampede` is generated from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import queue
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from django_mcpatterns.core._async.keepalive import AsyncKeepalive
from django_mcpatterns.core._async.leases import async_fill, async_take
from django_mcpatterns.core._async.ownership import async_rewrite_owned, strict_view
from django_mcpatterns.core.background import (
    AsyncExtender,
    AsyncGuard,
    AsyncUndo,
    async_finish_then_undo,
    async_run_in_background,
)
from django_mcpatterns.core.envelope import Envelope
from django_mcpatterns.core.exceptions import (
    ComputeFailedError,
    EncodingError,
    LockTimeoutError,
    NodeUnavailableError,
    ValueTooLargeError,
)
from django_mcpatterns.core.keys import Key
from django_mcpatterns.core.locks import (
    EventHook,
    LockTimedOut,
    LockWaited,
    Ownership,
    emit,
    exptime_for,
    new_token,
)
from django_mcpatterns.core.placeholder import PLACEHOLDER
from django_mcpatterns.core.stampede_model import (
    MARK_STALE_ATTEMPTS,
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
    checked_timeout,
    failure_marker,
    lock_key,
    read_failure_marker,
    recent_failures,
)
from django_mcpatterns.core.store import AsyncStore, CasToken
from django_mcpatterns.core.syncio import AsyncCompute, AsyncSleeper, async_call, async_sleep
from django_mcpatterns.core.tokens import AsyncTokenStore, Claimed

logger = logging.getLogger("django_mcpatterns.stampede")

T = TypeVar("T")


@dataclass(frozen=True)
class _Job(Generic[T]):
    key: Key
    compute: AsyncCompute[T]
    timeout: float | None  # soft TTL in seconds; None: never soft-expires; 0: do not store
    policy: StampedePolicy
    should_cache: Callable[[T], bool] | None


@dataclass
class _Won:
    """A lease on a placeholder this caller's add created (meta mode): it is the lock too.

    The keepalive extends the placeholder by cas (so never another writer's
    item) and keeps the new cas here; ``guard`` keeps that apart from the fill.
    """

    cas: CasToken
    filled: bool = False
    guard: AsyncGuard = field(default_factory=AsyncGuard, repr=False, compare=False)


Lease = CasToken | None | Overwrite | OnPlaceholder | _Won
"""The cas a fill must match (:mod:`.leases`); None: it may not land; OVERWRITE: ``set``."""


@dataclass(frozen=True)
class _Held:
    """The recompute lock, won: the token travels with it.

    The keepalive and a background worker extend, release or mark it,
    so it cannot be a :class:`~.locks.Lock`, whose token belongs to the
    acquiring owner.
    """

    store: AsyncStore  # the strict view
    key: Key
    token: bytes
    timeout: float
    taken_at: float  # by the Stampede's clock

    async def rewrite(self, exptime: int, value: bytes | None = None) -> Ownership:
        return await async_rewrite_owned(self.store, self.key, self.token, exptime, value)


class AsyncStampede:
    """Stampede-protected computation of values cached in ``store``.

    ``store``'s serde must know envelopes (both stores' default does, see
    :mod:`.envelope`).  ``clock`` is wall time in seconds (soft expiries are
    shared between processes); ``sleep`` and ``rng`` drive the waits and
    XFetch; ``on_event`` receives :class:`Recomputed`, :class:`StaleServed`,
    :class:`ComputeFailed`, :class:`RefreshDropped`, :class:`~.locks.LockWaited`
    and :class:`~.locks.LockTimedOut`.  Stateless apart from these (and the
    process's :data:`recent_failures`): safe to share between threads and tasks.

    ``compute`` may be a coroutine function (awaited) or a plain callable (in
    async, run through ``sync_to_async``: it may use the ORM); waiting for
    another caller's computation is ``sleep`` (``asyncio.sleep`` in async), so
    it never blocks the event loop; the lock's keepalive is a task in async, a
    thread in sync (:mod:`~django_mcpatterns.core.background`).
    """

    def __init__(
        self,
        store: AsyncStore,
        policy: StampedePolicy | None = None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: AsyncSleeper = async_sleep,
        rng: Callable[[], float] = random.random,
        on_event: EventHook | None = None,
    ) -> None:
        self.store = store
        self.policy = policy or StampedePolicy()
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._on_event = on_event
        self._tokens = store if isinstance(store, AsyncTokenStore) else None

    # -- public --

    async def get_or_compute(
        self,
        key: Key,
        compute: AsyncCompute[T],
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
        fetched = await self.fetch(key, compute, timeout, policy=policy, should_cache=should_cache)
        return fetched.value

    async def fetch(
        self,
        key: Key,
        compute: AsyncCompute[T],
        timeout: float | None,
        *,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> Fetched[T]:
        """Like :meth:`get_or_compute`, also saying how the value was obtained."""
        job = _Job(key, compute, checked_timeout(timeout), policy or self.policy, should_cache)
        if job.timeout == 0:
            return await self._compute(job, "miss")
        claimed = await self._claim_tokens(job)
        if claimed is not None:
            return await self._by_tokens(job, claimed)
        seen = await self._read(key)
        if seen is NO_VALUE:
            return await self._cold(job)
        now = self._clock()
        if not seen.fresh(now):
            return await self._refresh(job, seen, "stale")
        if self._early(seen, now, job.policy.beta):
            return await self._refresh(job, seen, "early")
        return Fetched(seen.value, "fresh", seen)

    async def recompute(
        self,
        key: Key,
        compute: AsyncCompute[T],
        timeout: float | None,
        *,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """Compute and store the value now, whatever is cached (no lock); return it."""
        job = _Job(key, compute, checked_timeout(timeout), policy or self.policy, should_cache)
        fetched = await self._compute(job, "refresh", OVERWRITE)
        return fetched.value

    async def mark_stale(self, key: Key) -> bool:
        """Make the cached value stale now, keeping it servable until its hard expiry.

        The next :meth:`get_or_compute` recomputes it (one caller) while the
        others are served the old value: an invalidation without a stampede.
        Return False when there is no envelope to mark (a miss, or a plain value).
        """
        for _ in range(MARK_STALE_ATTEMPTS):
            found, cas = await self.store.gets_envelope(key)
            if type(found) is not Envelope or cas is None or found.pending:
                return False
            now = self._clock()
            remaining = found.hard_expiry - now
            if remaining <= 0:
                return True  # memcached drops it any moment
            # Rewritten even when already stale: the new cas voids the lease of a
            # recompute under way, which may have read the data before this change.
            stale = dataclasses.replace(found, soft_expiry=min(found.soft_expiry, now))
            expire = exptime_for(remaining, now=now)
            if self._tokens is not None:  # meta: also md <key> I, so memcached hands out W
                if await self._tokens.cas_stale(key, stale, cas, expire):
                    return True
            elif await self.store.cas(key, stale, cas, expire):
                return True
        return False  # rewritten under us every time: someone keeps refreshing it

    async def read(self, key: Key) -> Envelope | None:
        """The envelope cached under ``key`` (a plain value wrapped as never stale), or None."""
        found = await self._read(key)
        return None if found is NO_VALUE else found

    # -- server-side tokens (meta mode: memcached picks the winner, see :mod:`.tokens`) --

    async def _claim_tokens(self, job: _Job[Any]) -> Claimed | None:
        """Round trip 1: the item with a recompute token, and a placeholder's add on a miss."""
        if self._tokens is None:
            return None
        recache = None
        if job.timeout is not None:
            grace = int(job.policy.grace_for(job.timeout))
            recache = grace if grace >= 1 else None  # TTL left < grace: past the soft expiry
        try:
            # Sync code runs the claim here, so within the try.
            claim = self._tokens.claim(
                job.key, recache, PLACEHOLDER, exptime_for(job.policy.lock_timeout)
            )
            return await async_finish_then_undo(claim, self._unclaim_placeholder(job))
        except EncodingError:
            return None  # unreadable: the lock-based path logs and overwrites it

    def _unclaim_placeholder(self, job: _Job[Any]) -> AsyncUndo[Claimed | None]:
        """What hands back a placeholder a cancelled caller's claim added (:mod:`.background`)."""

        async def undo(claimed: Claimed | None) -> None:
            if claimed is not None and claimed.cas is None and claimed.added is not None:
                await self.store.cas(job.key, PLACEHOLDER, claimed.added, -1)

        return undo

    async def _by_tokens(self, job: _Job[T], claimed: Claimed | None) -> Fetched[T]:
        """Act on what memcached said: serve, recompute (``W``), win a miss, or wait."""
        start = self._clock()
        attempt = 0
        while True:
            if claimed is None:
                return await self._cold(job)  # text mode or unreadable: the lock-based path
            if claimed.cas is None and claimed.added is not None:
                return await self._won_miss(job, claimed.added)
            seen = NO_VALUE if claimed.cas is None else as_envelope(claimed.found)
            if seen is not NO_VALUE:
                if attempt:
                    emit(self._on_event, LockWaited(job.key, self._clock() - start))
                    return Fetched(seen.value, "waited", seen)
                return await self._hit(job, seen, claimed)
            found = claimed.found
            failure = read_failure_marker(found.value if type(found) is Envelope else None)
            if failure is not None:
                raise self._shared_failure(job, *failure)
            # A placeholder: another caller computes.  Poll (re-claiming: if it
            # vanished, this caller's add wins) until its value or failure shows.
            remaining = start + job.policy.wait - self._clock()
            if remaining <= 0:
                return await self._wait_timed_out(job, job.key, start)
            await self._sleep(min(job.policy.backoff.delay(attempt, self._rng), remaining))
            attempt += 1
            claimed = await self._claim_tokens(job)

    async def _hit(self, job: _Job[T], seen: Envelope, claimed: Claimed) -> Fetched[T]:
        now = self._clock()
        stale = claimed.stale or not seen.fresh(now)
        reason: Reason = "stale" if stale else "early"
        if claimed.won and type(claimed.found) is Envelope:
            if job.policy.runner is not None:
                return await self._refresh(job, seen, reason)  # the runner needs the lock's owner
            try:
                return await self._compute(job, reason, claimed.cas)  # lease: the item's cas
            except Exception as exc:
                logger.warning("computing the value of %r failed", job.key, exc_info=True)
                emit(self._on_event, ComputeFailed(job.key, exc))
                if stale and not job.policy.serve_stale_on_error:
                    raise
                return self._serve(job, seen, reason)
        if stale:
            if claimed.lost:
                return self._serve(job, seen, "stale")  # another caller holds the token
            return await self._refresh(job, seen, "stale")  # no token (clocks disagree): the lock
        if self._early(seen, now, job.policy.beta):
            return await self._refresh(job, seen, "early")  # XFetch: the lock-based path
        return Fetched(seen.value, "fresh", seen)

    async def _won_miss(self, job: _Job[T], cas: CasToken) -> Fetched[T]:
        """This caller's placeholder won the miss: compute, keeping it alive; fill by its cas."""
        lease = _Won(cas)
        taken_at = self._clock()
        try:
            async with self._keepalive(job, taken_at, self._extend_placeholder(job, lease)):
                return await self._compute(job, "miss", lease)
        except Exception as exc:
            logger.warning("computing the value of %r failed", job.key, exc_info=True)
            emit(self._on_event, ComputeFailed(job.key, exc))
            if job.policy.failure_backoff <= 0:
                await self._drop_placeholder(job, lease)
            else:  # the placeholder becomes the failure marker every waiter reads
                token = new_token()
                recent_failures.remember(token, exc)
                failed = Envelope(failure_marker(token, exc), -math.inf, -math.inf)
                expire = exptime_for(job.policy.failure_backoff)
                await self.store.cas(job.key, failed, lease.cas, expire)
            raise
        except BaseException:
            await self._drop_placeholder(job, lease)
            raise

    def _extend_placeholder(self, job: _Job[Any], lease: _Won) -> AsyncExtender:
        """Extend the won placeholder while it is ours: a cas, never a blind ``touch``.

        A writer may replace the placeholder meanwhile; a ``touch`` would then
        keep rewriting the writer's TTL.  The new cas becomes the lease's.
        """

        async def extend(ttl: float) -> bool:
            async with lease.guard:
                if lease.filled:
                    return False
                cas = await self.store.recas(job.key, PLACEHOLDER, lease.cas, exptime_for(ttl))
                if cas is None:
                    return False  # replaced or gone: the fill will not land either
                lease.cas = cas
                return True

        return extend

    # -- the three states --

    async def _refresh(self, job: _Job[T], seen: Envelope, reason: Reason) -> Fetched[T]:
        """A stale (or XFetch-chosen) value: one caller recomputes, the others serve ``seen``."""
        held = await self._claim(job)
        if not isinstance(held, _Held):
            return self._serve(job, seen, reason)  # recomputing, failed moments ago, or unreachable
        current, lease = await self._lease_held(job, held, missing=False)
        if current is not NO_VALUE and current.soft_expiry > seen.soft_expiry:
            await self._release(held)  # another caller refreshed it between our get and our add
            return Fetched(current.value, "fresh", current)
        if job.policy.runner is not None:
            await self._dispatch(job, held, reason, lease)
            return self._serve(job, seen, reason)
        try:
            return await self._recompute_locked(job, held, reason, lease)
        except Exception:
            if reason == "stale" and not job.policy.serve_stale_on_error:
                raise
            return self._serve(job, seen, reason)

    async def _cold(self, job: _Job[T]) -> Fetched[T]:
        """A miss: one caller computes; the others wait for its value, for a bounded time."""
        lock = lock_key(job.key)
        start = self._clock()
        attempt = 0
        while True:
            held = await self._claim(job)
            if held is Claim.UNREACHABLE:
                # No lock to share the work through (and likely no lease either).
                return await self._compute(job, "miss", OVERWRITE)
            if isinstance(held, _Held):
                current, lease = await self._lease_held(job, held, missing=True)
                if current is not NO_VALUE:
                    await self._release(held)  # stored between our get and our add
                    return Fetched(current.value, "fresh", current)
                return await self._recompute_locked(job, held, "miss", lease)
            while True:  # lost: poll until the value appears, the lock goes, or it failed
                remaining = start + job.policy.wait - self._clock()
                if remaining <= 0:
                    return await self._wait_timed_out(job, lock, start)
                await self._sleep(min(job.policy.backoff.delay(attempt, self._rng), remaining))
                attempt += 1
                value, holder = await self._poll(job.key, lock)
                if value is not NO_VALUE:
                    emit(self._on_event, LockWaited(lock, self._clock() - start))
                    return Fetched(value.value, "waited", value)
                failure = read_failure_marker(holder)
                if failure is not None:
                    raise self._shared_failure(job, *failure)
                if holder is None:
                    break  # its holder left without storing a value: race for the lock again

    async def _wait_timed_out(self, job: _Job[T], key: Key, start: float) -> Fetched[T]:
        waited = self._clock() - start
        emit(self._on_event, LockTimedOut(key, waited))
        if job.policy.on_wait_timeout == "raise":
            raise LockTimeoutError(
                f"gave up after {waited:.3g}s waiting for another caller to compute {job.key!r}"
            )
        _, lease = await self._lease(job, missing=False)
        return await self._compute(job, "miss", lease)

    def _shared_failure(self, job: _Job[Any], token: bytes, error: str) -> ComputeFailedError:
        """The error for a caller that found another caller's failure marker."""
        failed = ComputeFailedError(
            f"computing {job.key!r} failed moments ago ({error}); it is not retried for up "
            f"to {job.policy.failure_backoff:g}s",
            key=job.key,
            error=error,
        )
        failed.__cause__ = recent_failures.get(token)  # the original, in the process it failed in
        return failed

    # -- steps --

    async def _compute(
        self, job: _Job[T], reason: Reason, lease: Lease = None, background: bool = False
    ) -> Fetched[T]:
        start = self._clock()
        try:
            value = await async_call(job.compute)
        except BaseException:
            if not isinstance(lease, _Won):  # its owner leaves the failure marker
                await self._drop_placeholder(job, lease)
            raise
        end = self._clock()
        compute_time = max(0.0, end - start)
        envelope = None
        if job.timeout != 0 and (job.should_cache is None or job.should_cache(value)):
            envelope = await self._store(job, value, end, compute_time, lease)
            if envelope is None:
                # Not stored (over the item limit, no memory, or the lease lost):
                # a placeholder still there would hold every later caller for
                # policy.wait.  The delete is by its cas, so a writer's value stays.
                await self._drop_placeholder(job, lease)
        else:
            await self._drop_placeholder(job, lease)
        emit(self._on_event, Recomputed(job.key, compute_time, reason, background))
        return Fetched(value, "computed", envelope)

    async def _recompute_locked(
        self, job: _Job[T], held: _Held, reason: Reason, lease: Lease, background: bool = False
    ) -> Fetched[T]:
        """Compute under the lock, kept alive meanwhile; release it, or leave a failure marker."""
        try:
            async with self._keepalive(job, held.taken_at, self._held_extend(held), held.key):
                fetched = await self._compute(job, reason, lease, background)
        except Exception as exc:
            logger.warning("computing the value of %r failed", job.key, exc_info=True)
            emit(self._on_event, ComputeFailed(job.key, exc, background))
            await self._mark_failed(job, held, exc)
            raise
        except BaseException:
            await self._release(held)  # interrupted (KeyboardInterrupt...): nothing to share
            raise
        await self._release(held)
        return fetched

    def _keepalive(
        self,
        job: _Job[Any],
        taken_at: float,
        extend: AsyncExtender,
        lock: Key | None = None,
    ) -> AsyncKeepalive:
        """Extend the lock (or the won placeholder) while ``compute`` runs.

        Nothing runs beside it when ``max_lock_time <= lock_timeout``.
        """
        return AsyncKeepalive(
            extend,
            job.policy.lock_timeout,
            job.policy.max_lock_time,
            start=taken_at,
            clock=self._clock,
            name=f"recompute lock {job.key if lock is None else lock!r}",
        )

    @staticmethod
    def _held_extend(held: _Held) -> AsyncExtender:
        async def extend(ttl: float) -> bool:
            return await held.rewrite(exptime_for(ttl)) == "ours"

        return extend

    async def _dispatch(self, job: _Job[Any], held: _Held, reason: Reason, lease: Lease) -> None:
        """Hand the recompute (which owns the lock and the lease from now on) to the runner."""

        async def refresh() -> None:
            if await self._still_held(job, held):
                with contextlib.suppress(Exception):  # logged and signalled already
                    await self._recompute_locked(job, held, reason, lease, background=True)

        runner = job.policy.runner
        assert runner is not None
        try:
            await async_run_in_background(runner, refresh)
        except queue.Full:
            logger.warning("the stampede runner's queue is full: not refreshing %r", job.key)
            self._drop(job, "full")
            await self._release(held)
        except Exception:
            logger.exception("the stampede runner refused to refresh %r", job.key)
            self._drop(job, "refused")
            await self._release(held)

    async def _still_held(self, job: _Job[Any], held: _Held) -> bool:
        """Whether a queued job still owns its lock: renew it (the queue ate into it) or drop."""
        try:
            ownership = await held.rewrite(exptime_for(held.timeout))
        except NodeUnavailableError as exc:
            logger.warning("refresh of %r dropped: its lock is unreachable (%s)", job.key, exc)
            self._drop(job, "unreachable")
            return False
        if ownership == "ours":
            return True
        logger.warning("refresh of %r dropped: its lock lapsed while it was queued", job.key)
        self._drop(job, "lapsed")
        return False

    def _drop(self, job: _Job[Any], reason: DropReason) -> None:
        emit(self._on_event, RefreshDropped(job.key, reason))

    async def _store(
        self, job: _Job[Any], value: Any, now: float, compute_time: float, lease: Lease
    ) -> Envelope | None:
        """Store the value: a fill under ``lease`` (:mod:`.leases`), or a plain ``set``."""
        if job.timeout is None:
            soft = hard = math.inf
        else:
            soft = now + job.timeout
            hard = soft + job.policy.grace_for(job.timeout)
        envelope = Envelope(value, soft, hard, compute_time)
        exptime = exptime_for(hard - now, now=now)
        if isinstance(lease, _Won):
            async with lease.guard:  # not while the keepalive moves the placeholder's cas
                lease.filled = True
                filled = await async_fill(self.store, job.key, envelope, lease.cas, exptime)
                return envelope if filled else None
        if lease is not OVERWRITE:
            cas = lease.cas if isinstance(lease, OnPlaceholder) else lease
            filled = await async_fill(self.store, job.key, envelope, cas, exptime)
            return envelope if filled else None
        try:
            stored = await self.store.set(job.key, envelope, exptime)
        except ValueTooLargeError:
            logger.warning("the value of %r is over the item size limit; not cached", job.key)
            return None
        return envelope if stored else None

    async def _lease(self, job: _Job[Any], *, missing: bool) -> tuple[Envelope | NoValue, Lease]:
        """What the key holds now, and the lease a fill must match (:func:`.leases.take`).

        The placeholder outlives the longest computation the lock allows.  An
        unreadable item is overwritten (it would never read again otherwise).
        """
        ttl = exptime_for(max(job.policy.lock_timeout, job.policy.max_lock_time))
        try:
            found, cas = await async_take(self.store, job.key, ttl, missing=missing)
            if cas is None:  # deleted between our add and gets, or an item nobody can read
                found, cas = await async_take(self.store, job.key, ttl)
        except EncodingError:
            logger.warning("unreadable cached value at %r; recomputing it", job.key, exc_info=True)
            return NO_VALUE, OVERWRITE
        if cas is None:
            return NO_VALUE, OVERWRITE  # refused by the serde (or unreachable): overwrite it
        current = as_envelope(found)
        return current, (OnPlaceholder(cas) if current is NO_VALUE else cas)

    async def _lease_held(
        self, job: _Job[Any], held: _Held, *, missing: bool
    ) -> tuple[Envelope | NoValue, Lease]:
        """:meth:`_lease` under the won lock, which an interruption (a cancelled task) releases."""
        try:
            return await self._lease(job, missing=missing)
        except BaseException:
            await self._release(held)
            raise

    async def _drop_placeholder(self, job: _Job[Any], lease: Lease) -> None:
        """No value will fill the placeholder: delete it (if unchanged), so ``add`` works again."""
        if isinstance(lease, OnPlaceholder | _Won):
            await self.store.cas(job.key, PLACEHOLDER, lease.cas, -1)  # a negative exptime deletes

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

    async def _claim(self, job: _Job[Any]) -> _Held | Claim:
        """Try the recompute lock once (``add`` on the strict view)."""
        store = strict_view(self.store)
        key = lock_key(job.key)
        token = new_token()
        taken_at = self._clock()
        try:
            add = store.add(key, token, exptime_for(job.policy.lock_timeout))  # sync: runs here
            if not await async_finish_then_undo(add, self._unclaim_lock(store, key, token)):
                return Claim.LOST
        except NodeUnavailableError as exc:
            logger.warning(
                "recompute lock unavailable (%s): stale values are served, misses "
                "computed without the lock",
                exc,
            )
            return Claim.UNREACHABLE
        return _Held(store, key, token, job.policy.lock_timeout, taken_at)

    @staticmethod
    def _unclaim_lock(store: AsyncStore, key: Key, token: bytes) -> AsyncUndo[bool]:
        """What releases a lock a cancelled caller's ``add`` took (:mod:`.background`)."""

        async def undo(added: bool) -> None:
            if added:
                await async_rewrite_owned(store, key, token, -1)

        return undo

    async def _release(self, held: _Held) -> None:
        await self._let_go(held, -1)  # cas with a negative exptime deletes

    async def _mark_failed(self, job: _Job[Any], held: _Held, error: BaseException) -> None:
        """Share ``error`` for ``failure_backoff`` seconds: the lock becomes its marker."""
        if job.policy.failure_backoff <= 0:
            await self._release(held)
            return
        recent_failures.remember(held.token, error)
        marker = failure_marker(held.token, error)
        await self._let_go(held, exptime_for(job.policy.failure_backoff), marker)

    async def _let_go(self, held: _Held, exptime: int, marker: bytes | None = None) -> None:
        """Release the lock, or turn it into ``marker``, if it is still ours."""
        try:
            # To its end even if this task is cancelled meanwhile: the rewrite is a gets
            # then a cas, and a lock left halfway blocks every refresh for lock_timeout.
            ownership = await async_finish_then_undo(held.rewrite(exptime, marker), _rewritten)
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

    async def _read(self, key: Key) -> Envelope | NoValue:
        try:
            found, cas = await self.store.gets_envelope(key)
        except EncodingError:
            logger.warning("unreadable cached value at %r; recomputing it", key, exc_info=True)
            return NO_VALUE
        return NO_VALUE if cas is None else as_envelope(found)

    async def _poll(self, key: Key, lock: Key) -> tuple[Envelope | NoValue, object]:
        """Read the value and its lock in one pipelined request: (value, the lock item or None)."""
        try:
            found = await self.store.get_many_envelopes([key, lock])
        except EncodingError:
            # Unreadable: race for the lock; its winner reads it again and overwrites it.
            return NO_VALUE, None
        return as_envelope(found.get(key, NO_VALUE)), found.get(lock)


async def _rewritten(_: Ownership) -> None:
    """Nothing to hand back once a cancelled caller's release of the lock is done."""
