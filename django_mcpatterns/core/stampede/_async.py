"""get_or_compute with soft expiry, one recomputing winner, early recomputation.

The algorithm of :mod:`django_mcpatterns.core.stampede` (read its docstring),
written once for an :class:`~django_mcpatterns.core.store.AsyncStore`; the sync
:class:`~django_mcpatterns.core.stampede.Stampede` is generated from it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django_mcpatterns.core.concurrency import (
    AsyncCompute,
    AsyncExtender,
    AsyncSleeper,
    AsyncUndo,
    async_finish_then_undo,
    async_sleep,
)
from django_mcpatterns.core.exceptions import (
    ComputeFailedError,
    EncodingError,
    LockTimeoutError,
    NodeUnavailableError,
)
from django_mcpatterns.core.keys import Key
from django_mcpatterns.core.leases import PLACEHOLDER
from django_mcpatterns.core.locks import (
    EventHook,
    LockTimedOut,
    LockWaited,
    async_strict_view,
    emit,
    exptime_for,
    new_token,
)
from django_mcpatterns.core.outages import WriteDegraded
from django_mcpatterns.core.store import AsyncStore, AsyncTokenStore, CasToken, Claimed
from django_mcpatterns.core.values.envelope import Envelope

from .. import chance
from ._async_steps import AsyncStampedeSteps, Held, Job, Won
from ._model import (
    MARK_STALE_ATTEMPTS,
    NO_VALUE,
    OVERWRITE,
    Claim,
    ComputeFailed,
    Fetched,
    Reason,
    StampedePolicy,
    as_envelope,
    checked_timeout,
    failure_marker,
    lock_key,
    read_failure_marker,
    recent_failures,
)

logger = logging.getLogger("django_mcpatterns.stampede")

T = TypeVar("T")


class AsyncStampede(AsyncStampedeSteps):
    """Stampede-protected computation of values cached in ``store``.

    ``store``'s serde must know envelopes (both stores' default does, see
    :mod:`django_mcpatterns.core.values.envelope`).  ``clock`` is wall time in seconds (soft
    expiries are shared between processes); ``sleep`` and ``rng`` drive the waits and
    XFetch; ``on_event`` receives :class:`Recomputed`, :class:`StaleServed`,
    :class:`ComputeFailed`, :class:`RefreshDropped`,
    :class:`~django_mcpatterns.core.locks.LockWaited` and
    :class:`~django_mcpatterns.core.locks.LockTimedOut`.  Stateless apart from these (and the
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
        rng: Callable[[], float] = chance.uniform,
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
        job = Job(key, compute, checked_timeout(timeout), policy or self.policy, should_cache)
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
        job = Job(key, compute, checked_timeout(timeout), policy or self.policy, should_cache)
        fetched = await self._compute(job, "refresh", OVERWRITE)
        return fetched.value

    async def mark_stale(self, key: Key) -> bool:
        """Make the cached value stale now, keeping it servable until its hard expiry.

        The next :meth:`get_or_compute` recomputes it (one caller) while the
        others are served the old value: an invalidation without a stampede.
        Return False when there is no envelope to mark (a miss, or a plain value).
        When its server cannot be reached the key is deleted there instead, now
        or before the server serves again (its journal: ``OPTIONS["on_outage"]``),
        reported as :class:`~django_mcpatterns.core.outages.WriteDegraded`, and
        False returned: the old value is never served as fresh afterwards.
        """
        try:
            return await self._mark_stale(key)
        except NodeUnavailableError as exc:
            await self.store.forget(key)
            logger.warning("mark_stale of %r not sent (%s): the key is dropped", key, exc)
            emit(self._on_event, WriteDegraded(key, "mark_stale", exc))
            return False

    async def _mark_stale(self, key: Key) -> bool:
        reader = async_strict_view(self.store)  # an unreachable server is not "no value"
        for _ in range(MARK_STALE_ATTEMPTS):
            found, cas = await reader.gets_envelope(key)
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

    # -- server-side tokens (meta mode: memcached picks the winner, see
    # :mod:`django_mcpatterns.core.store`) --

    async def _claim_tokens(self, job: Job[Any]) -> Claimed | None:
        """Round trip 1: the item with a recompute token, and a placeholder's add on a miss."""
        if self._tokens is None:
            return None
        recache = None if job.timeout is None else job.policy.recache_for(job.timeout)
        try:
            # Sync code runs the claim here, so within the try.
            claim = self._tokens.claim(
                job.key, recache, PLACEHOLDER, exptime_for(job.policy.lock_timeout)
            )
            return await async_finish_then_undo(claim, self._unclaim_placeholder(job))
        except EncodingError:
            return None  # unreadable: the lock-based path logs and overwrites it

    def _unclaim_placeholder(self, job: Job[Any]) -> AsyncUndo[Claimed | None]:
        """What hands back a placeholder a cancelled caller's claim added
        (:mod:`django_mcpatterns.core.concurrency`)."""

        async def undo(claimed: Claimed | None) -> None:
            if claimed is not None and claimed.cas is None and claimed.added is not None:
                await self.store.cas(job.key, PLACEHOLDER, claimed.added, -1)

        return undo

    async def _by_tokens(self, job: Job[T], claimed: Claimed | None) -> Fetched[T]:
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

    async def _hit(self, job: Job[T], seen: Envelope, claimed: Claimed) -> Fetched[T]:
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
            if claimed.lost or _token_due(job, claimed):
                return self._serve(job, seen, "stale")  # another caller holds the token, or
                # memcached hands it out within its next tick or two (see _token_due)
            return await self._refresh(job, seen, "stale")  # no token (clocks disagree): the lock
        if self._early(seen, now, job.policy.beta):
            return await self._refresh(job, seen, "early")  # XFetch: the lock-based path
        return Fetched(seen.value, "fresh", seen)

    async def _won_miss(self, job: Job[T], cas: CasToken) -> Fetched[T]:
        """This caller's placeholder won the miss: compute, keeping it alive; fill by its cas."""
        lease = Won(cas)
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

    def _extend_placeholder(self, job: Job[Any], lease: Won) -> AsyncExtender:
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

    async def _refresh(self, job: Job[T], seen: Envelope, reason: Reason) -> Fetched[T]:
        """A stale (or XFetch-chosen) value: one caller recomputes, the others serve ``seen``."""
        held = await self._claim(job)
        if not isinstance(held, Held):
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

    async def _cold(self, job: Job[T]) -> Fetched[T]:
        """A miss: one caller computes; the others wait for its value, for a bounded time."""
        lock = lock_key(job.key)
        start = self._clock()
        attempt = 0
        while True:
            held = await self._claim(job)
            if held is Claim.UNREACHABLE:
                # No lock to share the work through (and likely no lease either).
                return await self._compute(job, "miss", OVERWRITE)
            if isinstance(held, Held):
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

    async def _wait_timed_out(self, job: Job[T], key: Key, start: float) -> Fetched[T]:
        waited = self._clock() - start
        emit(self._on_event, LockTimedOut(key, waited))
        if job.policy.on_wait_timeout == "raise":
            raise LockTimeoutError(
                f"gave up after {waited:.3g}s waiting for another caller to compute {job.key!r}"
            )
        _, lease = await self._lease(job, missing=False)
        return await self._compute(job, "miss", lease)

    def _shared_failure(self, job: Job[Any], token: bytes, error: str) -> ComputeFailedError:
        """The error for a caller that found another caller's failure marker."""
        failed = ComputeFailedError(
            f"computing {job.key!r} failed moments ago ({error}); it is not retried for up "
            f"to {job.policy.failure_backoff:g}s",
            key=job.key,
            error=error,
        )
        failed.__cause__ = recent_failures.get(token)  # the original, in the process it failed in
        return failed


def _token_due(job: Job[Any], claimed: Claimed) -> bool:
    """Whether memcached hands the recompute token out within two of its ticks.

    Its clock ticks in whole seconds, so between a value's soft expiry (by our
    clock) and the first read that finds less TTL left than the claim's
    ``R``, up to a second (two for a timeout with a fraction) may pass with
    no token given: a caller then is served the stale value, as while another
    recomputes, instead of taking the lock-based path (4 more round trips,
    and a second computation beside the token's winner).
    """
    if job.timeout is None or claimed.ttl is None or claimed.ttl < 0:
        return False
    recache = job.policy.recache_for(job.timeout)
    return recache is not None and claimed.ttl <= recache + 1
