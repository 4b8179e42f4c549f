"""Sets and lists on cache objects: ``sadd``, ``smembers``, ``rpush``... and their a-forms.

The algorithms are :class:`~django_mcpatterns.core.sets.AppendSets` and
:class:`~django_mcpatterns.core.lists.AppendLists`; these methods only make keys
(``version=``, the framework's prefix) and timeouts (``timeout=``, applied when
a set or list is created) through the host's hooks.  ``_sync_sets.py`` is
generated from this module (``scripts/generate_sync.py``): ``asadd`` there is
``sadd``, over the host's sync store.  A ``loader=`` of an a-form may be a
coroutine function (awaited) or a plain callable (run through ``sync_to_async``:
it may use the ORM).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from django_mcpatterns.core.sets import AsyncLoader, Member, matching

from .host import DEFAULT, PatternHost


class AsyncSetMethods(PatternHost):
    """Redis-style sets and lists with django-redis's names (see ``docs/sets.md``)."""

    # -- sets: writes --

    async def asadd(
        self,
        key: Any,
        *values: Member,
        version: int | None = None,
        timeout: Any = DEFAULT,
        loader: AsyncLoader | None = None,
    ) -> int:
        """Add members; return how many distinct members were written (Redis: how many were new)."""
        made = self._pattern_key(key, version)
        expire = self._pattern_expire(timeout)
        return await self.binding.async_sets.sadd(
            made, *values, expire=expire, loader=loader, report=self._pattern_event
        )

    async def asrem(
        self,
        key: Any,
        *members: Member,
        version: int | None = None,
        loader: AsyncLoader | None = None,
    ) -> int:
        """Remove members; return how many distinct members were written."""
        made = self._pattern_key(key, version)
        expire = self._pattern_expire(DEFAULT)  # of what is left if the write is lost
        return await self.binding.async_sets.srem(
            made, *members, loader=loader, expire=expire, report=self._pattern_event
        )

    async def aspop(
        self,
        key: Any,
        count: int | None = None,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> Any:
        made = self._pattern_key(key, version)
        expire = self._pattern_expire(timeout)
        return await self.binding.async_sets.spop(
            made, count, expire=expire, loader=loader, report=self._pattern_event
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
        """Move a member: not atomic (a crash in between leaves it in both sets)."""
        return await self.binding.async_sets.smove(
            self._pattern_key(source, version),
            self._pattern_key(destination, version),
            member,
            expire=self._pattern_expire(timeout),
            report=self._pattern_event,
        )

    # -- sets: reads --

    async def asmembers(
        self,
        key: Any,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> set[Member]:
        made = self._pattern_key(key, version)
        expire = self._pattern_expire(timeout)
        return await self.binding.async_sets.smembers(made, expire=expire, loader=loader)

    async def asismember(
        self,
        key: Any,
        member: Member,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> bool:
        made = self._pattern_key(key, version)
        expire = self._pattern_expire(timeout)
        return await self.binding.async_sets.sismember(made, member, expire=expire, loader=loader)

    async def asmismember(
        self,
        key: Any,
        *members: Member,
        version: int | None = None,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> list[bool]:
        made = self._pattern_key(key, version)
        expire = self._pattern_expire(timeout)
        return await self.binding.async_sets.smismember(
            made, *members, expire=expire, loader=loader
        )

    async def ascard(
        self,
        key: Any,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> int:
        made = self._pattern_key(key, version)
        expire = self._pattern_expire(timeout)
        return await self.binding.async_sets.scard(made, expire=expire, loader=loader)

    async def asrandmember(
        self,
        key: Any,
        count: int | None = None,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> Any:
        made = self._pattern_key(key, version)
        expire = self._pattern_expire(timeout)
        return await self.binding.async_sets.srandmember(made, count, expire=expire, loader=loader)

    async def asscan(
        self,
        key: Any,
        match: str | None = None,
        count: int | None = 10,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> set[Member]:
        """The members matching ``match`` (Redis's glob: ``*``, ``?``, ``[abc]``), as
        django-redis's ``sscan`` returns them.

        A set is read whole, in one request: one scan returns every member, as a
        Redis ``SSCAN`` whose cursor comes back 0 at once; ``count`` (Redis's hint
        of members per call) changes nothing.
        """
        return matching(await self.asmembers(key, version, loader=loader, timeout=timeout), match)

    async def asscan_iter(
        self,
        key: Any,
        match: str | None = None,
        count: int | None = 10,
        version: int | None = None,
        *,
        loader: AsyncLoader | None = None,
        timeout: Any = DEFAULT,
    ) -> AsyncIterator[Member]:
        """The members of ``sscan``, one by one (read in one request when iteration starts)."""
        found = await self.asscan(key, match, count, version, loader=loader, timeout=timeout)
        for member in found:
            yield member

    # -- sets: algebra --

    async def asunion(self, *keys: Any, version: int | None = None) -> set[Member]:
        return await self.binding.async_sets.sunion(*self._made_keys(keys, version))

    async def asinter(self, *keys: Any, version: int | None = None) -> set[Member]:
        return await self.binding.async_sets.sinter(*self._made_keys(keys, version))

    async def asdiff(self, *keys: Any, version: int | None = None) -> set[Member]:
        return await self.binding.async_sets.sdiff(*self._made_keys(keys, version))

    async def asunionstore(
        self, destination: Any, *keys: Any, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        made = self._pattern_key(destination, version)
        sources = self._made_keys(keys, version)
        expire = self._pattern_expire(timeout)
        return await self.binding.async_sets.sunionstore(
            made, *sources, expire=expire, report=self._pattern_event
        )

    async def asinterstore(
        self, dest: Any, *keys: Any, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        made = self._pattern_key(dest, version)
        sources = self._made_keys(keys, version)
        expire = self._pattern_expire(timeout)
        return await self.binding.async_sets.sinterstore(
            made, *sources, expire=expire, report=self._pattern_event
        )

    async def asdiffstore(
        self,
        dest: Any,
        *keys: Any,
        version_dest: int | None = None,
        version_keys: int | None = None,
        timeout: Any = DEFAULT,
    ) -> int:
        made = self._pattern_key(dest, version_dest)
        sources = self._made_keys(keys, version_keys)
        expire = self._pattern_expire(timeout)
        return await self.binding.async_sets.sdiffstore(
            made, *sources, expire=expire, report=self._pattern_event
        )

    # -- lists --

    async def arpush(
        self, key: Any, *values: Member, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        """Append values; return how many were pushed (Redis: the new length)."""
        made = self._pattern_key(key, version)
        expire = self._pattern_expire(timeout)
        return await self.binding.async_lists.rpush(
            made, *values, expire=expire, report=self._pattern_event
        )

    async def alrange(
        self, key: Any, start: int, end: int, version: int | None = None
    ) -> list[Any]:
        return await self.binding.async_lists.lrange(self._pattern_key(key, version), start, end)

    async def allen(self, key: Any, version: int | None = None) -> int:
        return await self.binding.async_lists.llen(self._pattern_key(key, version))

    async def alrem(self, key: Any, count: int, value: Member, version: int | None = None) -> int:
        """Remove like ``LREM``; return 1 once recorded, 0 for a missing list (Redis: how many)."""
        return await self.binding.async_lists.lrem(
            self._pattern_key(key, version),
            count,
            value,
            expire=self._pattern_expire(DEFAULT),
            report=self._pattern_event,
        )
