"""Stampede protection on cache objects: ``get_or_compute`` and friends, and their a-forms.

The algorithm is :mod:`django_mcpatterns.core.stampede`; these methods make keys
with the backend's rules and turn the framework's ``timeout`` (``_pattern_expire``:
Django's ``DEFAULT_TIMEOUT``, ``None`` for never, 0 for "do not cache") into the
soft TTL in seconds.  Events go to the host's ``_pattern_event``.  A ``compute``
may be a coroutine function (awaited) or a plain callable (run through
``sync_to_async``, since it may use the ORM).  ``_sync_stampede.py`` is generated
from this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django_mcpatterns.core.concurrency import AsyncCompute
from django_mcpatterns.core.leases import async_get_or_set
from django_mcpatterns.core.near import near_key
from django_mcpatterns.core.stampede import Fetched, StampedePolicy
from django_mcpatterns.core.values import Envelope

from .host import DEFAULT, PatternHost

T = TypeVar("T")


class AsyncStampedeMethods(PatternHost):
    """``get_or_compute`` (soft expiry, one recomputation at a time) and ``get_or_set`` (leased)."""

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
        """Return the cached value of ``key``, or compute it, with stampede protection.

        After ``timeout`` (the cache's convention; default: its ``TIMEOUT``) the
        value is stale: one caller recomputes it while the others are served
        the stale value, which memcached keeps ``policy.grace`` seconds longer.
        On a miss one caller computes and the others wait for its value.
        ``should_cache(value)`` decides whether a computed value is stored.
        A plain ``cache.get(key)`` returns the value until ``timeout`` and
        misses after it: only ``get_or_compute`` serves it stale.
        """
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
        """Like ``get_or_compute``, returning a ``Fetched`` (``value``, ``outcome``:
        fresh/stale/computed/waited, and the value's ``envelope`` with its expiries)."""
        made = self._pattern_key(key, version)
        near = self.binding.pattern_near
        if near is None:
            return await self._astampede(policy).fetch(
                made, compute, self._soft_timeout(timeout), should_cache=should_cache
            )
        # Near: a fresh value read within max_age is served from memory (never a stale one:
        # who recomputes is memcached's to decide).
        name = near_key(made)
        held = near.envelope(name)
        if held is not None:
            return Fetched(held.value, "fresh", held)
        ticket = near.ticket()
        fetched = await self._astampede(policy).fetch(
            made, compute, self._soft_timeout(timeout), should_cache=should_cache
        )
        if fetched.outcome == "fresh" and fetched.envelope is not None:
            near.fill(name, fetched.value, ticket, envelope=fetched.envelope)
        return fetched

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
        """Compute the value now and store it for ``get_or_compute`` readers; return it."""
        return await self._astampede(policy).recompute(
            self._pattern_key(key, version),
            compute,
            self._soft_timeout(timeout),
            should_cache=should_cache,
        )

    async def amark_stale(self, key: Any, *, version: int | None = None) -> bool:
        """Make the value of ``key`` stale now: the next reader recomputes it while the
        others are still served it (an invalidation without a stampede).  Return
        False when there was no ``get_or_compute`` value to mark."""
        return await self._astampede(None).mark_stale(self._pattern_key(key, version))

    async def aget_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT, version: int | None = None
    ) -> Any:
        """Return the value of ``key``, or store ``default`` (called if callable) and return it.

        The fill holds a lease (:mod:`django_mcpatterns.core.leases`): a delete
        or set of ``key`` while ``default`` is computed keeps the computed value
        out of the cache (it is still returned), so a concurrent invalidation wins.
        """
        made = self._pattern_key(key, version)
        values = self.binding.async_near_values
        return await async_get_or_set(values, made, default, self._pattern_expire(timeout))

    async def aget_envelope(self, key: Any, *, version: int | None = None) -> Envelope | None:
        """The value of ``key`` with its soft/hard expiry and compute time, or None."""
        return await self._astampede(None).read(self._pattern_key(key, version))
