"""``cache.ratelimit(...)`` and ``cache.counter(...)``: rate limits and exact cached counts.

The algorithms are :mod:`django_mcpatterns.core.ratelimit` (a slotted sliding
window) and :mod:`django_mcpatterns.core.flights` (a cached count kept exact
by a flight record); this mixin names their items with the backend's key rules
and gives each a sync and an async form (``ratelimit`` is written once, in
``_async_limits.py``; a :class:`Counter` delegates to the core's two forms).
Imports neither Django nor Flask.
"""

from __future__ import annotations

from typing import Any

from django_mcpatterns.core.counters import AsyncCachedCounter, AsyncChange, CachedCounter, Change

from ._async_limits import AsyncLimitMethods
from ._sync_limits import LimitMethods
from .host import PatternHost

__all__ = ["Counter", "LimitsMixin"]


class Counter:
    """What ``cache.counter(...)`` returns: one count, sync and async methods.

    ``get``/``incr``/``decr``/``invalidate``/``change`` and their a-prefixed
    async forms (``async with counter.achange(+1):``).  See ``docs/counters.md``.
    """

    def __init__(self, host: PatternHost, key: str, loader: Any, expire: int) -> None:
        self.key = key
        self._host = host
        self._loader = loader
        self._expire = expire
        self.sync = CachedCounter(host.pattern_store, key, loader, expire=expire)
        self._async: AsyncCachedCounter | None = None

    @property
    def aio(self) -> AsyncCachedCounter:
        """The asyncio form, over the cache's ``apattern_store`` (built on first use)."""
        if self._async is None:
            self._async = AsyncCachedCounter(
                self._host.apattern_store, self.key, self._loader, expire=self._expire
            )
        return self._async

    def get(self) -> int:
        """Return the count (cached, or loaded and cached when no writer is in flight)."""
        return self.sync.get()

    def change(self, delta: int) -> Change:
        """``with counter.change(+1): insert; commit`` keeps the cached count exact."""
        return self.sync.change(delta)

    def incr(self, n: int = 1) -> None:
        """Add ``n`` to the cached count (see ``docs/counters.md``: prefer :meth:`change`)."""
        self.sync.incr(n)

    def decr(self, n: int = 1) -> None:
        """Subtract ``n`` from the cached count."""
        self.sync.decr(n)

    def invalidate(self) -> None:
        """Forget the cached count; the next read loads it."""
        self.sync.invalidate()

    async def aget(self) -> int:
        return await self.aio.get()

    def achange(self, delta: int) -> AsyncChange:
        return self.aio.change(delta)

    async def aincr(self, n: int = 1) -> None:
        await self.aio.incr(n)

    async def adecr(self, n: int = 1) -> None:
        await self.aio.decr(n)

    async def ainvalidate(self) -> None:
        await self.aio.invalidate()

    def __repr__(self) -> str:
        return f"<Counter {self.key!r}>"


class LimitsMixin(LimitMethods, AsyncLimitMethods):
    """Adds :meth:`ratelimit`, :meth:`aratelimit` and :meth:`counter` to a cache backend."""

    def counter(
        self, key: Any, loader: Any, timeout: Any = None, *, version: int | None = None
    ) -> Counter:
        """Return the exact cached count stored under ``key``, loaded by ``loader()``.

        ``loader`` returns the count from the source of truth (a coroutine
        function works for the async methods); ``timeout`` is the cache's
        convention, ``None`` (the default) keeps the count until evicted.
        """
        expire = 0 if timeout is None else self._pattern_expire(timeout)
        return Counter(self, self._pattern_key(key, version), loader, expire)
