"""Namespaces on cache objects: ``ns.get``, ``ns.get_or_compute``... and their a-forms.

The algorithm is :mod:`django_mcpatterns.core.namespaces`; a cache namespace makes
its keys with the cache's rules and turns the framework's ``timeout`` into
memcached exptimes, so it reads and writes like the cache it comes from.
``_sync_namespaces.py`` is generated from this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from django_mcpatterns.core.concurrency import AsyncCompute
from django_mcpatterns.core.namespaces import Part
from django_mcpatterns.core.stampede import Fetched, StampedePolicy

from .host import DEFAULT, NamespaceHost, PatternHost

T = TypeVar("T")


class AsyncCacheNamespaces(PatternHost):
    """Invalidation of a cache's namespaces by name."""

    async def ainvalidate_namespace(self, *parts: Part) -> int:
        """Invalidate every key of the namespace ``parts`` (one ``incr``); return its version."""
        return await self._anamespaces.invalidate(*parts)


class AsyncNamespaceMethods(NamespaceHost):
    """A cache namespace's reads, writes, ``get_or_compute`` and invalidation."""

    __slots__ = ()

    # -- reads --

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return await self._ans.get(key, default, version=version)

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        return await self._ans.get_many(keys, version=version)

    # -- writes --

    async def aset(
        self, key: Any, value: Any, timeout: Any = DEFAULT, version: int | None = None
    ) -> bool:
        return await self._ans.set(key, value, self._expire(timeout), version=version)

    async def aadd(
        self, key: Any, value: Any, timeout: Any = DEFAULT, version: int | None = None
    ) -> bool:
        return await self._ans.add(key, value, self._expire(timeout), version=version)

    async def aset_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT, version: int | None = None
    ) -> list[Any]:
        return await self._ans.set_many(data, self._expire(timeout), version=version)

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        return await self._ans.delete(key, version=version)

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        await self._ans.delete_many(keys, version=version)

    async def aget_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT, version: int | None = None
    ) -> Any:
        """``get_or_set`` in this namespace (leased); a callable ``default`` is called on a miss."""
        return await self._ans.get_or_set(key, default, self._expire(timeout), version=version)

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
        """``cache.get_or_compute`` in this namespace: soft expiry after ``timeout``.

        In a soft namespace an invalidated value is served stale while one
        caller recomputes it; otherwise it is a miss (one caller computes, the
        others wait for its value).
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
        """Like ``get_or_compute``, returning a ``Fetched`` (value, outcome, envelope)."""
        soft = self._soft_timeout(timeout)
        return await self._ans.fetch(
            key, compute, soft, version=version, policy=policy, should_cache=should_cache
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
        """Compute the value now and store it for ``get_or_compute`` readers; return it."""
        soft = self._soft_timeout(timeout)
        return await self._ans.recompute(
            key, compute, soft, version=version, policy=policy, should_cache=should_cache
        )

    # -- invalidation --

    async def ainvalidate(self) -> int:
        """Invalidate every key of this namespace and the nested ones (one ``incr``);
        return the new version."""
        return await self._ans.invalidate()

    async def ainvalidate_namespace(self, *parts: Part) -> int:
        """Invalidate the namespace ``parts`` nested in this one."""
        return await self._ans.invalidate_namespace(*parts)

    async def aversions(self) -> tuple[int | None, ...]:
        """Each level's current version, outermost first (None: not created yet)."""
        return await self._ans.versions()
