"""Keep a held lock alive while the work it protects runs.

A recompute lock's TTL (``lock_timeout``) is what frees it when its holder
crashes, so it should be short; a computation may still take longer.  While
the computation runs, a daemon thread (sync) or a task (async) extends the
lock every third of its TTL, so it never lapses under a live holder, and stops
when the computation ends
(or, at the latest, after a maximum hold time, so a hung computation cannot
wedge its key forever).  The extension is a callable given the new TTL: it
carries the owner's token itself (:func:`~django_mcpatterns.core.locks.rewrite_owned`), as this
thread is not the one that acquired the lock.

Written once here (:class:`AsyncKeepalive`); the sync ``Keepalive`` is generated
from it, the thread/task difference is
:mod:`~django_mcpatterns.core.concurrency`'s ``Ticker``/``AsyncTicker`` pair.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import TracebackType

from django_mcpatterns.core.concurrency import AsyncExtender, AsyncTicker
from django_mcpatterns.core.exceptions import ClusterError

logger = logging.getLogger("django_mcpatterns.stampede")


class AsyncKeepalive:
    """Extend a lock beside the ``with`` block (a thread in sync, a task in async).

    ``extend(ttl)`` rewrites the lock to expire ``ttl`` seconds from now and
    returns whether it was still ours; ``timeout`` is the lock's TTL (extended
    every ``timeout / 3``), ``limit`` the longest the lock is held in all,
    counted from ``start`` (when it was taken): when ``limit <= timeout`` the
    lock's own TTL covers it and nothing runs beside the block.  ``clock`` is
    injectable for tests, which call :meth:`beat` directly.
    """

    def __init__(
        self,
        extend: AsyncExtender,
        timeout: float,
        limit: float,
        *,
        start: float,
        clock: Callable[[], float] = time.monotonic,
        name: str = "lock",
    ) -> None:
        self._extend = extend
        self._timeout = timeout
        self._deadline = start + limit
        self._clock = clock
        self._name = name
        self._ticker = (
            AsyncTicker(self.beat, timeout / 3, "mcpatterns-keepalive") if limit > timeout else None
        )

    async def beat(self) -> bool:
        """Extend the lock once; return whether to keep going."""
        ttl = min(self._timeout, self._deadline - self._clock())
        if ttl <= 0:
            logger.warning("%s: held for its maximum time; it is not extended any more", self._name)
            return False
        try:
            if await self._extend(ttl):
                return True
        except ClusterError as exc:  # unreachable or refused this time: the next beat may pass
            logger.warning("%s: could not extend it (%s); trying again", self._name, exc)
            return True
        logger.warning(
            "%s: lapsed before it could be extended; another caller may hold it", self._name
        )
        return False

    async def __aenter__(self) -> AsyncKeepalive:
        if self._ticker is not None:
            await self._ticker.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ticker is not None:
            await self._ticker.stop()  # an extension in flight finishes before the caller releases
