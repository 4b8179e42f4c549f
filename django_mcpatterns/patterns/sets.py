"""Redis-style sets and lists on cache objects, with django-redis 6's names.

The algorithms are :class:`~django_mcpatterns.core.sets.AppendSets` and
:class:`~django_mcpatterns.core.lists.AppendLists`; this mixin only makes keys
(``version=``, the framework's prefix) and timeouts (``timeout=``, applied when
a set or list is created) through the hooks of :mod:`django_mcpatterns.patterns`.
Readers also take ``loader=`` (the set's source of truth, called on a miss) and
``timeout=`` for the set they then cache; writers take ``loader=`` to say the set
is loader-backed, so they never create it.  See ``docs/sets.md``.

Every method has an asyncio form with Django's a-prefix (``asadd``,
``asmembers``, ``arpush``...), the same signature, over the host's ``astore``:
thin delegates to :class:`~django_mcpatterns.core.sets.AsyncAppendSets` and
:class:`~django_mcpatterns.core.lists.AsyncAppendLists`, the algorithms the sync
ones are generated from.  Their ``loader=`` may be a coroutine function
(awaited) or a plain callable (run through ``sync_to_async``: it may use the ORM).

It imports neither Django nor Flask.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cached_property
from typing import Any, TypeVar, cast

from django_mcpatterns.core.sets import (
    AppendLists,
    AppendSets,
    AsyncAppendLists,
    AsyncAppendSets,
    AsyncLoader,
    Loader,
    Member,
    SetOptions,
)

from . import DEFAULT, PatternsHost
from .shared import per_store

T = TypeVar("T")


class SetsMixin:
    """``sadd``, ``srem``, ``smembers``... and ``rpush``, ``lrange``, ``llen``, ``lrem``,
    each with its asyncio form (``asadd``...)."""

    def _set_options(self: PatternsHost) -> SetOptions:
        """The thresholds for this cache's sets (override to tune them)."""
        return SetOptions.for_store(self.store)

    # One algorithm object per store and options, whichever backend instance asks
    # (Django makes one per thread, and per task in async code): see .shared.

    @cached_property
    def _append_sets(self) -> AppendSets:
        host: Any = self
        options = host._set_options()
        return per_store(host.store, (AppendSets, options), lambda: AppendSets(host.store, options))

    @cached_property
    def _append_lists(self) -> AppendLists:
        host: Any = self
        options = host._set_options()
        return per_store(
            host.store, (AppendLists, options), lambda: AppendLists(host.store, options)
        )

    @cached_property
    def _async_append_sets(self) -> AsyncAppendSets:
        host: Any = self
        options = host._set_options()
        return per_store(
            host.store, (AsyncAppendSets, options), lambda: AsyncAppendSets(host.astore, options)
        )

    @cached_property
    def _async_append_lists(self) -> AsyncAppendLists:
        host: Any = self
        options = host._set_options()
        return per_store(
            host.store, (AsyncAppendLists, options), lambda: AsyncAppendLists(host.astore, options)
        )

    def _set_key(self, key: Any, version: int | None) -> str:
        """The host's full key for ``key`` (its ``_pattern_key`` hook)."""
        return cast(PatternsHost, self)._pattern_key(key, version)

    def _set_expire(self, timeout: Any) -> int:
        """The host's exptime for ``timeout`` (its ``_pattern_expire`` hook)."""
        return cast(PatternsHost, self)._pattern_expire(timeout)

    def _with_expire(
        self,
        call: Callable[..., T],
        key: Any,
        version: int | None,
        timeout: Any,
        *args: Any,
        **kwargs: Any,
    ) -> T:
        """``call(made key, *args, expire=..., **kwargs)``: the cache's key and timeout rules."""
        made = self._set_key(key, version)
        return call(made, *args, expire=self._set_expire(timeout), **kwargs)

    def _store_command(
        self,
        call: Callable[..., T],
        destination: Any,
        keys: Iterable[Any],
        destination_version: int | None,
        keys_version: int | None,
        timeout: Any,
    ) -> T:
        """A ``*store`` command: ``call(destination, *keys, expire=...)`` on made keys."""
        made = self._set_key(destination, destination_version)
        sources = [self._set_key(k, keys_version) for k in keys]
        return call(made, *sources, expire=self._set_expire(timeout))

    # -- sets: writes --------------------------------------------------------

    def sadd(
        self,
        key: Any,
        *values: Member,
        version: int | None = None,
        timeout: Any = DEFAULT,
        loader: Loader | None = None,
    ) -> int:
        """Add members; return how many distinct members were written (Redis: how many were new)."""
        return self._with_expire(
            self._append_sets.sadd, key, version, timeout, *values, loader=loader
        )

    def srem(
        self,
        key: Any,
        *members: Member,
        version: int | None = None,
        loader: Loader | None = None,
    ) -> int:
        """Remove members; return how many distinct members were written."""
        made = self._set_key(key, version)
        return self._append_sets.srem(made, *members, loader=loader)

    def spop(
        self,
        key: Any,
        count: int | None = None,
        version: int | None = None,
        *,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> Any:
        return self._with_expire(
            self._append_sets.spop, key, version, timeout, count, loader=loader
        )

    def smove(
        self,
        source: Any,
        destination: Any,
        member: Member,
        version: int | None = None,
        *,
        timeout: Any = DEFAULT,
    ) -> bool:
        """Move a member: not atomic (a crash in between leaves it in both sets)."""
        return self._append_sets.smove(
            self._set_key(source, version),
            self._set_key(destination, version),
            member,
            expire=self._set_expire(timeout),
        )

    # -- sets: reads ---------------------------------------------------------

    def smembers(
        self,
        key: Any,
        version: int | None = None,
        *,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> set[Member]:
        return self._with_expire(self._append_sets.smembers, key, version, timeout, loader=loader)

    def sismember(
        self,
        key: Any,
        member: Member,
        version: int | None = None,
        *,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> bool:
        return self._with_expire(
            self._append_sets.sismember, key, version, timeout, member, loader=loader
        )

    def smismember(
        self,
        key: Any,
        *members: Member,
        version: int | None = None,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> list[bool]:
        return self._with_expire(
            self._append_sets.smismember, key, version, timeout, *members, loader=loader
        )

    def scard(
        self,
        key: Any,
        version: int | None = None,
        *,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> int:
        return self._with_expire(self._append_sets.scard, key, version, timeout, loader=loader)

    def srandmember(
        self,
        key: Any,
        count: int | None = None,
        version: int | None = None,
        *,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> Any:
        return self._with_expire(
            self._append_sets.srandmember, key, version, timeout, count, loader=loader
        )

    # -- sets: algebra -------------------------------------------------------

    def sunion(self, *keys: Any, version: int | None = None) -> set[Member]:
        return self._append_sets.sunion(*[self._set_key(k, version) for k in keys])

    def sinter(self, *keys: Any, version: int | None = None) -> set[Member]:
        return self._append_sets.sinter(*[self._set_key(k, version) for k in keys])

    def sdiff(self, *keys: Any, version: int | None = None) -> set[Member]:
        return self._append_sets.sdiff(*[self._set_key(k, version) for k in keys])

    def sunionstore(
        self, destination: Any, *keys: Any, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        return self._store_command(
            self._append_sets.sunionstore, destination, keys, version, version, timeout
        )

    def sinterstore(
        self, dest: Any, *keys: Any, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        return self._store_command(
            self._append_sets.sinterstore, dest, keys, version, version, timeout
        )

    def sdiffstore(
        self,
        dest: Any,
        *keys: Any,
        version_dest: int | None = None,
        version_keys: int | None = None,
        timeout: Any = DEFAULT,
    ) -> int:
        return self._store_command(
            self._append_sets.sdiffstore, dest, keys, version_dest, version_keys, timeout
        )

    # -- lists ---------------------------------------------------------------

    def rpush(
        self, key: Any, *values: Member, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        """Append values; return how many were pushed (Redis: the new length)."""
        return self._with_expire(self._append_lists.rpush, key, version, timeout, *values)

    def lrange(self, key: Any, start: int, end: int, version: int | None = None) -> list[Any]:
        return self._append_lists.lrange(self._set_key(key, version), start, end)

    def llen(self, key: Any, version: int | None = None) -> int:
        return self._append_lists.llen(self._set_key(key, version))

    def lrem(self, key: Any, count: int, value: Member, version: int | None = None) -> int:
        """Remove like ``LREM``; return 1 once recorded, 0 for a missing list (Redis: how many)."""
        return self._append_lists.lrem(self._set_key(key, version), count, value)

    # -- asyncio forms (Django's a-prefix): the same signatures ---------------

    async def asadd(
        self,
        key: Any,
        *values: Member,
        version: int | None = None,
        timeout: Any = DEFAULT,
        loader: AsyncLoader | None = None,
    ) -> int:
        """:meth:`sadd` for asyncio."""
        return await self._with_expire(
            self._async_append_sets.sadd, key, version, timeout, *values, loader=loader
        )

    async def asrem(
        self,
        key: Any,
        *members: Member,
        version: int | None = None,
        loader: AsyncLoader | None = None,
    ) -> int:
        """:meth:`srem` for asyncio."""
        made = self._set_key(key, version)
        return await self._async_append_sets.srem(made, *members, loader=loader)

    async def aspop(
        self,
        key: Any,
        count: int | None = None,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> Any:
        """:meth:`spop` for asyncio."""
        return await self._with_expire(
            self._async_append_sets.spop, key, version, timeout, count, loader=loader
        )

    async def asmove(
        self,
        source: Any,
        destination: Any,
        member: Member,
        version: int | None = None,
        *,
        timeout: Any = DEFAULT,
    ) -> bool:
        """:meth:`smove` for asyncio (not atomic either)."""
        return await self._async_append_sets.smove(
            self._set_key(source, version),
            self._set_key(destination, version),
            member,
            expire=self._set_expire(timeout),
        )

    async def asmembers(
        self,
        key: Any,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> set[Member]:
        """:meth:`smembers` for asyncio."""
        return await self._with_expire(
            self._async_append_sets.smembers, key, version, timeout, loader=loader
        )

    async def asismember(
        self,
        key: Any,
        member: Member,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> bool:
        """:meth:`sismember` for asyncio."""
        return await self._with_expire(
            self._async_append_sets.sismember, key, version, timeout, member, loader=loader
        )

    async def asmismember(
        self,
        key: Any,
        *members: Member,
        version: int | None = None,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> list[bool]:
        """:meth:`smismember` for asyncio."""
        return await self._with_expire(
            self._async_append_sets.smismember, key, version, timeout, *members, loader=loader
        )

    async def ascard(
        self,
        key: Any,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> int:
        """:meth:`scard` for asyncio."""
        return await self._with_expire(
            self._async_append_sets.scard, key, version, timeout, loader=loader
        )

    async def asrandmember(
        self,
        key: Any,
        count: int | None = None,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> Any:
        """:meth:`srandmember` for asyncio."""
        return await self._with_expire(
            self._async_append_sets.srandmember, key, version, timeout, count, loader=loader
        )

    async def asunion(self, *keys: Any, version: int | None = None) -> set[Member]:
        """:meth:`sunion` for asyncio."""
        return await self._async_append_sets.sunion(*[self._set_key(k, version) for k in keys])

    async def asinter(self, *keys: Any, version: int | None = None) -> set[Member]:
        """:meth:`sinter` for asyncio."""
        return await self._async_append_sets.sinter(*[self._set_key(k, version) for k in keys])

    async def asdiff(self, *keys: Any, version: int | None = None) -> set[Member]:
        """:meth:`sdiff` for asyncio."""
        return await self._async_append_sets.sdiff(*[self._set_key(k, version) for k in keys])

    async def asunionstore(
        self, destination: Any, *keys: Any, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        """:meth:`sunionstore` for asyncio."""
        return await self._store_command(
            self._async_append_sets.sunionstore, destination, keys, version, version, timeout
        )

    async def asinterstore(
        self, dest: Any, *keys: Any, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        """:meth:`sinterstore` for asyncio."""
        return await self._store_command(
            self._async_append_sets.sinterstore, dest, keys, version, version, timeout
        )

    async def asdiffstore(
        self,
        dest: Any,
        *keys: Any,
        version_dest: int | None = None,
        version_keys: int | None = None,
        timeout: Any = DEFAULT,
    ) -> int:
        """:meth:`sdiffstore` for asyncio."""
        return await self._store_command(
            self._async_append_sets.sdiffstore, dest, keys, version_dest, version_keys, timeout
        )

    async def arpush(
        self, key: Any, *values: Member, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        """:meth:`rpush` for asyncio."""
        return await self._with_expire(
            self._async_append_lists.rpush, key, version, timeout, *values
        )

    async def alrange(
        self, key: Any, start: int, end: int, version: int | None = None
    ) -> list[Any]:
        """:meth:`lrange` for asyncio."""
        return await self._async_append_lists.lrange(self._set_key(key, version), start, end)

    async def allen(self, key: Any, version: int | None = None) -> int:
        """:meth:`llen` for asyncio."""
        return await self._async_append_lists.llen(self._set_key(key, version))

    async def alrem(self, key: Any, count: int, value: Member, version: int | None = None) -> int:
        """:meth:`lrem` for asyncio."""
        return await self._async_append_lists.lrem(self._set_key(key, version), count, value)
