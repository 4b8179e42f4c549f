"""``cache.lock(...)``: add-based, owner-safe, expiring locks on cache objects.

The algorithm is :mod:`django_mcpatterns.core.locks`; this mixin names the lock
with the backend's key rules (``KEY_PREFIX``, ``VERSION``, ``KEY_FUNCTION`` in
Django) and reports waits and timeouts through the backend's optional
``_pattern_event(event)`` hook (the Django backend turns them into signals).

One lock object serves both worlds: :class:`CacheLock` is the sync
:class:`~django_mcpatterns.core.locks.Lock` (over the host's ``store``) and
carries the a-prefixed forms (``aacquire``, ``arelease``, ``aextend``,
``alocked``, ``aowned``, ``async with``, decorating coroutine functions), which
delegate to an :class:`~django_mcpatterns.core.locks.AsyncLock` over the host's
``astore``, built on first use.  The two forms keep their owners apart (per
thread for the sync one, per task for the async one): release a lock with the
form that acquired it.  Imports neither Django nor Flask.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from django_mcpatterns.core.keys import Key
from django_mcpatterns.core.locks import DEFAULT_TIMEOUT, AsyncLock, Backoff, EventHook, Lock
from django_mcpatterns.core.store import AsyncStore, Store

from .host import PatternHost
from .observed import observe_lock_methods

__all__ = ["CacheLock", "LocksMixin"]

F = TypeVar("F", bound=Callable[..., Any])


@observe_lock_methods
class CacheLock(Lock):
    """A :class:`Lock` with its asyncio forms, as ``cache.lock(...)`` returns it.

    ``astore`` gives the host's :class:`~django_mcpatterns.core.store.AsyncStore`;
    it is asked once, on the first a-prefixed call (a sync-only user never
    builds the async side).
    """

    def __init__(
        self,
        store: Store,
        astore: Callable[[], AsyncStore],
        key: Key,
        timeout: float = DEFAULT_TIMEOUT,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        *,
        backoff: Backoff | None = None,
        on_event: EventHook | None = None,
    ) -> None:
        super().__init__(
            store,
            key,
            timeout,
            blocking,
            blocking_timeout,
            backoff=backoff,
            on_event=on_event,
        )
        self._host_store = store
        self._astore = astore
        self._async: AsyncLock | None = None
        self._async_guard = threading.Lock()

    def copy(self) -> CacheLock:
        """A new, unacquired owner of the same lock with the same settings."""
        return CacheLock(
            self._host_store,
            self._astore,
            self.key,
            self.timeout,
            self.blocking,
            self.blocking_timeout,
            backoff=self.backoff,
            on_event=self._on_event,
        )

    @property
    def aio(self) -> AsyncLock:
        """The asyncio form of this lock (one owner per task), over the host's ``astore``."""
        if self._async is None:
            with self._async_guard:
                if self._async is None:
                    self._async = AsyncLock(
                        self._astore(),
                        self.key,
                        self.timeout,
                        self.blocking,
                        self.blocking_timeout,
                        backoff=self.backoff,
                        on_event=self._on_event,
                    )
        return self._async

    # -- the asyncio forms, with Django's a-prefix --

    async def aacquire(
        self,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: bytes | None = None,
    ) -> bool:
        """:meth:`acquire` for asyncio: waiting never blocks the event loop."""
        return await self.aio.acquire(blocking, blocking_timeout, token)

    async def arelease(self, token: bytes | None = None) -> None:
        """:meth:`release` for asyncio (the task that took the lock releases it)."""
        await self.aio.release(token)

    async def aextend(
        self, additional_time: float, replace_ttl: bool = False, token: bytes | None = None
    ) -> None:
        """:meth:`extend` for asyncio."""
        await self.aio.extend(additional_time, replace_ttl, token)

    async def alocked(self) -> bool:
        """:meth:`locked` for asyncio."""
        return await self.aio.locked()

    async def aowned(self) -> bool:
        """:meth:`owned` for asyncio: whether this task holds the lock."""
        return await self.aio.owned()

    async def __aenter__(self) -> CacheLock:
        await self.aio.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aio.__aexit__(*exc_info)

    def __call__(self, func: F) -> F:
        """Decorate ``func`` (a function or a coroutine function) to run under the lock.

        Each call is a fresh owner; a coroutine function waits without blocking
        the event loop.
        """
        if not inspect.iscoroutinefunction(func):
            return super().__call__(func)
        coroutine = cast(Callable[..., Awaitable[Any]], func)

        @functools.wraps(func)
        async def locked_call(*args: Any, **kwargs: Any) -> Any:
            async with self.copy():
                return await coroutine(*args, **kwargs)

        return cast(F, locked_call)


class LocksMixin(PatternHost):
    """Adds :meth:`lock` to a cache backend (see :mod:`django_mcpatterns.patterns.host`)."""

    def lock(
        self,
        name: Any,
        timeout: float = DEFAULT_TIMEOUT,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        *,
        backoff: Backoff | None = None,
        version: int | None = None,
    ) -> CacheLock:
        """Return a lock stored under the cache key ``name``, expiring after ``timeout`` seconds.

        ``blocking``/``blocking_timeout`` are the defaults of ``acquire()``
        (``None``: wait as long as it takes).  The lock is a context manager and
        a decorator; ``release()`` and ``extend()`` raise ``LockNotOwnedError``
        once its TTL lapsed.  An unreachable server raises
        ``NodeUnavailableError`` instead of looking like a held lock.  The lock
        lives under the same key as ``cache.get(name)`` would read: give locks
        names of their own.  In async code: ``async with cache.lock(...)``,
        ``await lock.aacquire()``, ``arelease()``, ``aextend()``, ``alocked()``,
        ``aowned()``.
        """
        return CacheLock(
            self.pattern_store,
            lambda: self.apattern_store,
            self._pattern_key(name, version),
            timeout,
            blocking,
            blocking_timeout,
            backoff=backoff,
            on_event=self._pattern_event,
        )
