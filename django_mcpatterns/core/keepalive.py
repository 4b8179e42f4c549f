"""Keep a held lock alive while the work it protects runs.

A recompute lock's TTL (``lock_timeout``) is what frees it when its holder
crashes, so it should be short; a computation may still take longer.  While
the computation runs, a daemon thread extends the lock every third of its TTL,
so it never lapses under a live holder, and stops when the computation ends
(or, at the latest, after a maximum hold time, so a hung computation cannot
wedge its key forever).  The extension is a callable given the new TTL: it
carries the owner's token itself (:func:`~.locks.rewrite_owned`), as this
thread is not the one that acquired the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from .exceptions import ClusterError

__all__ = ["Keepalive"]

logger = logging.getLogger("django_mcpatterns.stampede")


class Keepalive:
    """Extend a lock from a daemon thread while the ``with`` block runs.

    ``extend(ttl)`` rewrites the lock to expire ``ttl`` seconds from now and
    returns whether it was still ours; ``timeout`` is the lock's TTL (extended
    every ``timeout / 3``), ``limit`` the longest the lock is held in all,
    counted from ``start`` (when it was taken).  ``clock`` is injectable for
    tests, which call :meth:`beat` directly.
    """

    def __init__(
        self,
        extend: Callable[[float], bool],
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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> bool:
        """Extend the lock once; return whether to keep going."""
        ttl = min(self._timeout, self._deadline - self._clock())
        if ttl <= 0:
            logger.warning("%s: held for its maximum time; it is not extended any more", self._name)
            return False
        try:
            if self._extend(ttl):
                return True
        except ClusterError as exc:  # unreachable or refused this time: the next beat may pass
            logger.warning("%s: could not extend it (%s); trying again", self._name, exc)
            return True
        logger.warning(
            "%s: lapsed before it could be extended; another caller may hold it", self._name
        )
        return False

    def __enter__(self) -> Keepalive:
        self._thread = threading.Thread(target=self._run, name="mcpatterns-keepalive", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()  # an extension in flight finishes before the caller releases

    def _run(self) -> None:
        while not self._stop.wait(self._timeout / 3) and self.beat():
            pass
