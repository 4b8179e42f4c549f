# Generated from patterns/_async_namespaces.py by scripts/generate_sync.py: do not edit.
"""Namespaces on cache objects: ``ns.get``, ``ns.get_or_compute``... and their a-forms.

The algorithm is :mod:`django_mcpatterns.core.namespaces`; a cache namespace makes
its keys with the cache's rules and turns the framework's ``timeout`` into
memcached exptimes, so it reads and writes like the cache it comes from.
``_sync_namespaces.py`` is generated from this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from django_mcpatterns.core.concurrency import Compute
from django_mcpatterns.core.namespaces import Part
from django_mcpatterns.core.stampede import Fetched, StampedePolicy

from .host import DEFAULT, NamespaceHost, PatternHost

T = TypeVar("T")


class CacheNamespaces(PatternHost):
    """Invalidation of a cache's namespaces by name."""

    def invalidate_namespace(self, *parts: Part) -> int:
        """Invalidate every key of the namespace ``parts`` (one ``incr``); return its version."""
        return self._namespaces.invalidate(*parts)


class NamespaceMethods(NamespaceHost):
    """A cache namespace's reads, writes, ``get_or_compute`` and invalidation."""

    __slots__ = ()

    # -- reads --

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return self._ns.get(key, default, version=version)

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        return self._ns.get_many(keys, version=version)

    # -- writes --

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT, version: int | None = None) -> bool:
        return self._ns.set(key, value, self._expire(timeout), version=version)

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT, version: int | None = None) -> bool:
        return self._ns.add(key, value, self._expire(timeout), version=version)

    def set_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT, version: int | None = None
    ) -> list[Any]:
        return self._ns.set_many(data, self._expire(timeout), version=version)

    def delete(self, key: Any, version: int | None = None) -> bool:
        return self._ns.delete(key, version=version)

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        self._ns.delete_many(keys, version=version)

    def get_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT, version: int | None = None
    ) -> Any:
        """``get_or_set`` in this namespace (leased); a callable ``default`` is called on a miss."""
        return self._ns.get_or_set(key, default, self._expire(timeout), version=version)

    def get_or_compute(
        self,
        key: Any,
        compute: Compute[T],
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
        fetched = self.get_or_compute_result(
            key, compute, timeout, version=version, policy=policy, should_cache=should_cache
        )
        return fetched.value

    def get_or_compute_result(
        self,
        key: Any,
        compute: Compute[T],
        timeout: Any = DEFAULT,
        *,
        version: int | None = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> Fetched[T]:
        """Like ``get_or_compute``, returning a ``Fetched`` (value, outcome, envelope)."""
        soft = self._soft_timeout(timeout)
        return self._ns.fetch(
            key, compute, soft, version=version, policy=policy, should_cache=should_cache
        )

    def recompute(
        self,
        key: Any,
        compute: Compute[T],
        timeout: Any = DEFAULT,
        *,
        version: int | None = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """Compute the value now and store it for ``get_or_compute`` readers; return it."""
        soft = self._soft_timeout(timeout)
        return self._ns.recompute(
            key, compute, soft, version=version, policy=policy, should_cache=should_cache
        )

    # -- invalidation --

    def invalidate(self) -> int:
        """Invalidate every key of this namespace and the nested ones (one ``incr``);
        return the new version."""
        return self._ns.invalidate()

    def invalidate_namespace(self, *parts: Part) -> int:
        """Invalidate the namespace ``parts`` nested in this one."""
        return self._ns.invalidate_namespace(*parts)

    def versions(self) -> tuple[int | None, ...]:
        """Each level's current version, outermost first (None: not created yet)."""
        return self._ns.versions()
