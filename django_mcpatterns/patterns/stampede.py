"""``cache.get_or_compute(...)`` and friends: stampede protection on cache objects.

The algorithm is :mod:`django_mcpatterns.core.stampede`; this mixin makes keys
with the backend's rules and turns the framework's ``timeout`` (through the
``_pattern_expire`` hook: Django's ``DEFAULT_TIMEOUT``, ``None`` for never,
0 for "do not cache") into the soft TTL in seconds.  Events go to the backend's
optional ``_pattern_event(event)`` hook.  Imports neither Django nor Flask.

The a-prefixed forms (``aget_or_compute``, ``amark_stale``...) run the same
algorithm as asyncio code (:class:`~django_mcpatterns.core.stampede.AsyncStampede`)
over the host's ``astore``: nothing blocks the event loop, and a ``compute``
may be a coroutine function (awaited) or a plain callable (run through
``sync_to_async``, since it may use the ORM).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django_mcpatterns.core.concurrency import AsyncCompute
from django_mcpatterns.core.leases import async_get_or_set, get_or_set
from django_mcpatterns.core.stampede import AsyncStampede, Fetched, Stampede, StampedePolicy
from django_mcpatterns.core.store import MAX_RELATIVE_EXPIRE
from django_mcpatterns.core.values.envelope import Envelope

from . import DEFAULT, PatternsHost
from .locks import event_hook

T = TypeVar("T")


def soft_timeout(exptime: int, now: float) -> float | None:
    """Seconds until a value stored with memcached ``exptime`` expires (None: never; 0: at once)."""
    if exptime == 0:
        return None
    if exptime < 0:
        return 0.0
    if exptime > MAX_RELATIVE_EXPIRE:
        return max(exptime - now, 0.0)  # an absolute Unix time
    return float(exptime)


class StampedeMixin:
    """Adds :meth:`get_or_compute` and friends to a cache backend.

    ``stampede_policy`` is the cache's default
    :class:`~django_mcpatterns.core.stampede.StampedePolicy`; each call may
    pass its own ``policy``.
    """

    stampede_policy: StampedePolicy = StampedePolicy()  # frozen: safe as a class default

    def get_or_compute(
        self,
        key: Any,
        compute: Callable[[], T],
        timeout: Any = DEFAULT,
        *,
        version: int | None = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """Return the cached value of ``key``, or compute it, with stampede protection.

        After ``timeout`` (the cache's convention; default: its ``TIMEOUT``) the
        value is stale: one caller recomputes it while the others are served
        the stale value, which memcached keeps ``policy.grace`` seconds longer.
        On a miss one caller computes and the others wait for its value.
        ``should_cache(value)`` decides whether a computed value is stored.
        A plain ``cache.get(key)`` returns the value until ``timeout`` and
        misses after it: only ``get_or_compute`` serves it stale.
        """
        return self.get_or_compute_result(
            key, compute, timeout, version=version, policy=policy, should_cache=should_cache
        ).value

    def get_or_compute_result(
        self,
        key: Any,
        compute: Callable[[], T],
        timeout: Any = DEFAULT,
        *,
        version: int | None = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> Fetched[T]:
        """Like :meth:`get_or_compute`, returning a ``Fetched`` (``value``, ``outcome``:
        fresh/stale/computed/waited, and the value's ``envelope`` with its expiries)."""
        host = cast(PatternsHost, self)
        return self._stampede(policy).fetch(
            host._pattern_key(key, version),
            compute,
            self._soft_timeout(timeout),
            should_cache=should_cache,
        )

    def recompute(
        self,
        key: Any,
        compute: Callable[[], T],
        timeout: Any = DEFAULT,
        *,
        version: int | None = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """Compute the value now and store it for :meth:`get_or_compute` readers; return it."""
        host = cast(PatternsHost, self)
        return self._stampede(policy).recompute(
            host._pattern_key(key, version),
            compute,
            self._soft_timeout(timeout),
            should_cache=should_cache,
        )

    def mark_stale(self, key: Any, *, version: int | None = None) -> bool:
        """Make the value of ``key`` stale now: the next reader recomputes it while the
        others are still served it (an invalidation without a stampede).  Return
        False when there was no ``get_or_compute`` value to mark."""
        host = cast(PatternsHost, self)
        return self._stampede(None).mark_stale(host._pattern_key(key, version))

    def get_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT, version: int | None = None
    ) -> Any:
        """Return the value of ``key``, or store ``default`` (called if callable) and return it.

        The fill holds a lease (:mod:`django_mcpatterns.core.leases`): a delete
        or set of ``key`` while ``default`` is computed keeps the computed value
        out of the cache (it is still returned), so a concurrent invalidation wins.
        """
        host = cast(PatternsHost, self)
        return get_or_set(
            host.values, host._pattern_key(key, version), default, host._pattern_expire(timeout)
        )

    def get_envelope(self, key: Any, *, version: int | None = None) -> Envelope | None:
        """The value of ``key`` with its soft/hard expiry and compute time, or None."""
        host = cast(PatternsHost, self)
        return self._stampede(None).read(host._pattern_key(key, version))

    # -- asyncio: the same, awaited, over the host's astore --

    async def aget_or_compute(
        self,
        key: Any,
        compute: AsyncCompute[T],
        timeout: Any = DEFAULT,
        *,
        version: int | None = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """:meth:`get_or_compute` for asyncio; ``compute`` may be a coroutine function."""
        fetched = await self.aget_or_compute_result(
            key, compute, timeout, version=version, policy=policy, should_cache=should_cache
        )
        return fetched.value

    async def aget_or_compute_result(
        self,
        key: Any,
        compute: AsyncCompute[T],
        timeout: Any = DEFAULT,
        *,
        version: int | None = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> Fetched[T]:
        """:meth:`get_or_compute_result` for asyncio."""
        host = cast(PatternsHost, self)
        return await self._astampede(policy).fetch(
            host._pattern_key(key, version),
            compute,
            self._soft_timeout(timeout),
            should_cache=should_cache,
        )

    async def arecompute(
        self,
        key: Any,
        compute: AsyncCompute[T],
        timeout: Any = DEFAULT,
        *,
        version: int | None = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """:meth:`recompute` for asyncio."""
        host = cast(PatternsHost, self)
        return await self._astampede(policy).recompute(
            host._pattern_key(key, version),
            compute,
            self._soft_timeout(timeout),
            should_cache=should_cache,
        )

    async def amark_stale(self, key: Any, *, version: int | None = None) -> bool:
        """:meth:`mark_stale` for asyncio."""
        host = cast(PatternsHost, self)
        return await self._astampede(None).mark_stale(host._pattern_key(key, version))

    async def aget_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT, version: int | None = None
    ) -> Any:
        """:meth:`get_or_set` for asyncio, leased the same way; a callable ``default``
        may be a coroutine function (awaited) or a plain one (``sync_to_async``)."""
        host = cast(PatternsHost, self)
        return await async_get_or_set(
            host.avalues, host._pattern_key(key, version), default, host._pattern_expire(timeout)
        )

    async def aget_envelope(self, key: Any, *, version: int | None = None) -> Envelope | None:
        """:meth:`get_envelope` for asyncio."""
        host = cast(PatternsHost, self)
        return await self._astampede(None).read(host._pattern_key(key, version))

    def _astampede(self, policy: StampedePolicy | None) -> AsyncStampede:
        host = cast(PatternsHost, self)
        return AsyncStampede(host.astore, policy or self.stampede_policy, on_event=event_hook(self))

    def _stampede(self, policy: StampedePolicy | None) -> Stampede:
        host = cast(PatternsHost, self)
        return Stampede(host.store, policy or self.stampede_policy, on_event=event_hook(self))

    def _soft_timeout(self, timeout: Any) -> float | None:
        host = cast(PatternsHost, self)
        return soft_timeout(host._pattern_expire(timeout), time.time())
