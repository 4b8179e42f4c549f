"""``cache.namespace(*parts)`` and ``cache.invalidate_namespace(*parts)`` on cache objects.

The algorithm is :mod:`django_mcpatterns.core.namespaces`; this mixin makes the
namespace's keys with the backend's rules (``_pattern_key``: Django's
``KEY_PREFIX``/``VERSION``/``KEY_FUNCTION``, Flask's key prefix) and turns the
framework's ``timeout`` into memcached exptimes (``_pattern_expire``), so a
namespace reads and writes like the cache it comes from.  ``get_or_compute``
uses the backend's ``stampede_policy`` and reports to its ``_pattern_event``
hook, as ``cache.get_or_compute`` does.  Imports neither Django nor Flask.

What decorators and template tags call: ``cache.namespace(*parts)`` (cheap, no
I/O), then ``get_or_compute(key, compute, timeout)`` on it, ``validate_key(key)``
to check a key before use, ``delete(key)`` to drop one entry and
``invalidate()`` for all.

A namespace hands out no final key: its keys are routed to the server of its
root version key, a route a ``str`` cannot carry, so such a key read or written
elsewhere would reach another server (and a namespaced item is tagged bytes
that only the namespace reads).

Every method has an a-prefixed form for asyncio (``aget``, ``aset``,
``aget_or_compute``, ``ainvalidate``..., ``cache.ainvalidate_namespace``): the
same algorithm (:class:`~django_mcpatterns.core.namespaces.AsyncNamespace`) over
the host's ``astore``, built on first use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from typing import Any, TypeVar, cast

from django_mcpatterns.core.concurrency import AsyncCompute
from django_mcpatterns.core.keys import placed
from django_mcpatterns.core.namespaces import (
    AsyncNamespace,
    AsyncNamespaces,
    Namespace,
    Namespaces,
    Part,
)
from django_mcpatterns.core.stampede import AsyncStampede, Fetched, Stampede, StampedePolicy
from django_mcpatterns.core.store import AsyncStore, Store

from . import DEFAULT, PatternsHost
from .locks import event_hook
from .observed import observe_namespace_methods
from .stampede import soft_timeout

T = TypeVar("T")

__all__ = ["CacheNamespace", "NamespaceArg", "NamespacesMixin", "namespace_parts"]

NamespaceArg = tuple[Part, ...] | list[Part] | Part | Callable[..., Any]
"""A decorator's ``namespace=``: parts, one part, or a callable of the call's arguments."""


def namespace_parts(namespace: NamespaceArg, /, *args: Any, **kwargs: Any) -> tuple[Part, ...]:
    """The parts of ``cache.namespace(*parts)`` that a decorator's ``namespace=`` names for a call.

    ``namespace`` is a tuple (or list) of parts, one ``str``/``int``, or a
    callable taking the call's arguments and returning either.  One rule for
    every decorator (Django's ``cached``, Flask's ``stampede_guard``), so the
    same argument names the same namespace in both; the parts themselves are
    checked by ``cache.namespace``.
    """
    parts = namespace(*args, **kwargs) if callable(namespace) else namespace
    return tuple(parts) if isinstance(parts, tuple | list) else (parts,)


@observe_namespace_methods
class CacheNamespace:
    """A namespace of a cache: the cache's key rules and timeout convention.

    Every key of it (and of the namespaces nested in it) lives on one server;
    a read is one request; :meth:`invalidate` is one ``incr`` after which no
    read, in any process, returns a value written before it.  ``timeout``
    follows the cache's convention (Django: seconds, ``None`` never, 0 do not
    store; Flask-Caching: 0 never, ``None`` the default); omitted, it is the
    cache's default timeout.  ``set_many`` returns the keys that were *not*
    stored, and an invalid key raises, in both frameworks.
    """

    __slots__ = ("_ans", "_host", "_ns")

    def __init__(self, host: PatternsHost, namespace: Namespace) -> None:
        self._host = host
        self._ns = namespace
        self._ans: AsyncNamespace | None = None  # the async form, made on first use

    def __repr__(self) -> str:
        return repr(self._ns)

    @property
    def path(self) -> tuple[tuple[str, ...], ...]:
        """The parts of each level, outermost first, as text."""
        return self._ns.path

    @property
    def soft(self) -> bool:
        return self._ns.soft

    def namespace(self, *parts: Part, soft: bool | None = None) -> CacheNamespace:
        """A namespace nested in this one (``soft`` defaults to this one's)."""
        return CacheNamespace(self._host, self._ns.namespace(*parts, soft=soft))

    def validate_key(self, key: Any, version: int | None = None) -> None:
        """Raise as the cache does for an invalid key if ``key`` is not valid in this namespace.

        The namespace's prefix counts towards memcached's 250 bytes, so a key
        valid on the cache may be too long here.
        """
        placed(self._ns.key(key, version=version))

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
        return self._ns.get_or_set(key, default, self._expire(timeout), version=version)

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
        """``cache.get_or_compute`` in this namespace: soft expiry after ``timeout``.

        In a soft namespace an invalidated value is served stale while one
        caller recomputes it; otherwise it is a miss (one caller computes, the
        others wait for its value).
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
        """Like :meth:`get_or_compute`, returning a ``Fetched`` (value, outcome, envelope)."""
        soft = soft_timeout(self._expire(timeout), time.time())
        return self._ns.fetch(
            key, compute, soft, version=version, policy=policy, should_cache=should_cache
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
        soft = soft_timeout(self._expire(timeout), time.time())
        return self._ns.recompute(
            key, compute, soft, version=version, policy=policy, should_cache=should_cache
        )

    # -- invalidation --

    def invalidate(self) -> int:
        """Invalidate every key of this namespace and the nested ones; return the new version."""
        return self._ns.invalidate()

    def invalidate_namespace(self, *parts: Part) -> int:
        """Invalidate the namespace ``parts`` nested in this one."""
        return self._ns.invalidate_namespace(*parts)

    def versions(self) -> tuple[int | None, ...]:
        """Each level's current version, outermost first (None: not created yet)."""
        return self._ns.versions()

    # -- asyncio: the same methods, awaited, over the host's astore --

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return await self._async.get(key, default, version=version)

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        return await self._async.get_many(keys, version=version)

    async def aset(
        self, key: Any, value: Any, timeout: Any = DEFAULT, version: int | None = None
    ) -> bool:
        return await self._async.set(key, value, self._expire(timeout), version=version)

    async def aadd(
        self, key: Any, value: Any, timeout: Any = DEFAULT, version: int | None = None
    ) -> bool:
        return await self._async.add(key, value, self._expire(timeout), version=version)

    async def aset_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT, version: int | None = None
    ) -> list[Any]:
        return await self._async.set_many(data, self._expire(timeout), version=version)

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        return await self._async.delete(key, version=version)

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        await self._async.delete_many(keys, version=version)

    async def aget_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT, version: int | None = None
    ) -> Any:
        """:meth:`get_or_set`; a callable ``default`` may be a coroutine function."""
        return await self._async.get_or_set(key, default, self._expire(timeout), version=version)

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
        """:meth:`get_or_compute`; ``compute`` may be a coroutine function."""
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
        soft = soft_timeout(self._expire(timeout), time.time())
        return await self._async.fetch(
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
        soft = soft_timeout(self._expire(timeout), time.time())
        return await self._async.recompute(
            key, compute, soft, version=version, policy=policy, should_cache=should_cache
        )

    async def ainvalidate(self) -> int:
        """:meth:`invalidate` for asyncio: one ``incr``."""
        return await self._async.invalidate()

    async def ainvalidate_namespace(self, *parts: Part) -> int:
        return await self._async.invalidate_namespace(*parts)

    async def aversions(self) -> tuple[int | None, ...]:
        return await self._async.versions()

    @property
    def _async(self) -> AsyncNamespace:
        made = self._ans
        if made is None:
            context = cast(NamespacesMixin, self._host)._anamespaces
            made = self._ans = AsyncNamespace(context, self._ns.path, self._ns.soft)
        return made

    def _expire(self, timeout: Any) -> int:
        return self._host._pattern_expire(timeout)


class NamespacesMixin:
    """Adds :meth:`namespace` and :meth:`invalidate_namespace` to a cache backend."""

    def namespace(self, *parts: Part, soft: bool = False) -> CacheNamespace:
        """The namespace named by ``parts`` (str or int; ``42`` and ``"42"`` are the same).

        ``soft``: after an invalidation, ``get_or_compute`` serves the old value
        as stale while one caller recomputes it (plain reads still miss).
        """
        host = cast(PatternsHost, self)
        return CacheNamespace(host, self._namespaces.namespace(*parts, soft=soft))

    def invalidate_namespace(self, *parts: Part) -> int:
        """Invalidate every key of the namespace ``parts`` (one ``incr``); return its version."""
        return self._namespaces.invalidate(*parts)

    async def ainvalidate_namespace(self, *parts: Part) -> int:
        """:meth:`invalidate_namespace` for asyncio."""
        return await self._anamespaces.invalidate(*parts)

    @cached_property
    def _anamespaces(self) -> AsyncNamespaces:
        host = cast(PatternsHost, self)
        return AsyncNamespaces(
            host.astore, make_key=host._pattern_key, stampede=self._anamespace_stampede
        )

    def _anamespace_stampede(self, store: AsyncStore) -> AsyncStampede:
        policy = getattr(self, "stampede_policy", None)
        return AsyncStampede(store, policy, on_event=event_hook(self))

    @cached_property
    def _namespaces(self) -> Namespaces:
        host = cast(PatternsHost, self)
        return Namespaces(host.store, make_key=host._pattern_key, stampede=self._namespace_stampede)

    def _namespace_stampede(self, store: Store) -> Stampede:
        policy = getattr(self, "stampede_policy", None)
        return Stampede(store, policy, on_event=event_hook(self))
