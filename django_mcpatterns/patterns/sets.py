"""Redis-style sets and lists on cache objects, with django-redis 6's names.

The algorithms are :class:`~django_mcpatterns.core.sets.AppendSets` and
:class:`~django_mcpatterns.core.sets.AppendLists`; this mixin only makes keys
(``version=``, the framework's prefix) and timeouts (``timeout=``, applied when
a set or list is created) through the hooks of :mod:`django_mcpatterns.patterns`.
Readers also take ``loader=`` (the set's source of truth, called on a miss) and
``timeout=`` for the set they then cache; writers take ``loader=`` to say the set
is loader-backed, so they never create it.  See ``docs/sets.md``.

It imports neither Django nor Flask.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django_mcpatterns.core.codec import Member
from django_mcpatterns.core.sets import AppendLists, AppendSets, Loader, SetOptions

from . import DEFAULT, PatternsHost


class SetsMixin:
    """``sadd``, ``srem``, ``smembers``... and ``rpush``, ``lrange``, ``llen``, ``lrem``."""

    def _set_options(self: PatternsHost) -> SetOptions:
        """The thresholds for this cache's sets (override to tune them)."""
        return SetOptions.for_store(self.store)

    @cached_property
    def _append_sets(self) -> AppendSets:
        host: Any = self
        return AppendSets(host.store, host._set_options())

    @cached_property
    def _append_lists(self) -> AppendLists:
        host: Any = self
        return AppendLists(host.store, host._set_options())

    # -- sets: writes --------------------------------------------------------

    def sadd(
        self: Any,
        key: Any,
        *values: Member,
        version: int | None = None,
        timeout: Any = DEFAULT,
        loader: Loader | None = None,
    ) -> int:
        """Add members; return how many distinct members were written (Redis: how many were new)."""
        made = self._pattern_key(key, version)
        expire = self._pattern_expire(timeout)
        return self._append_sets.sadd(made, *values, expire=expire, loader=loader)

    def srem(
        self: Any,
        key: Any,
        *members: Member,
        version: int | None = None,
        loader: Loader | None = None,
    ) -> int:
        """Remove members; return how many distinct members were written."""
        made = self._pattern_key(key, version)
        return self._append_sets.srem(made, *members, loader=loader)

    def spop(
        self: Any,
        key: Any,
        count: int | None = None,
        version: int | None = None,
        *,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> Any:
        made, expire = self._pattern_key(key, version), self._pattern_expire(timeout)
        return self._append_sets.spop(made, count, loader=loader, expire=expire)

    def smove(
        self: Any,
        source: Any,
        destination: Any,
        member: Member,
        version: int | None = None,
        *,
        timeout: Any = DEFAULT,
    ) -> bool:
        """Move a member: not atomic (a crash in between leaves it in both sets)."""
        return self._append_sets.smove(
            self._pattern_key(source, version),
            self._pattern_key(destination, version),
            member,
            expire=self._pattern_expire(timeout),
        )

    # -- sets: reads ---------------------------------------------------------

    def smembers(
        self: Any,
        key: Any,
        version: int | None = None,
        *,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> set[Member]:
        made, expire = self._pattern_key(key, version), self._pattern_expire(timeout)
        return self._append_sets.smembers(made, loader=loader, expire=expire)

    def sismember(
        self: Any,
        key: Any,
        member: Member,
        version: int | None = None,
        *,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> bool:
        made, expire = self._pattern_key(key, version), self._pattern_expire(timeout)
        return self._append_sets.sismember(made, member, loader=loader, expire=expire)

    def smismember(
        self: Any,
        key: Any,
        *members: Member,
        version: int | None = None,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> list[bool]:
        made, expire = self._pattern_key(key, version), self._pattern_expire(timeout)
        return self._append_sets.smismember(made, *members, loader=loader, expire=expire)

    def scard(
        self: Any,
        key: Any,
        version: int | None = None,
        *,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> int:
        made, expire = self._pattern_key(key, version), self._pattern_expire(timeout)
        return self._append_sets.scard(made, loader=loader, expire=expire)

    def srandmember(
        self: Any,
        key: Any,
        count: int | None = None,
        version: int | None = None,
        *,
        loader: Loader | None = None,
        timeout: Any = DEFAULT,
    ) -> Any:
        made, expire = self._pattern_key(key, version), self._pattern_expire(timeout)
        return self._append_sets.srandmember(made, count, loader=loader, expire=expire)

    # -- sets: algebra -------------------------------------------------------

    def sunion(self: Any, *keys: Any, version: int | None = None) -> set[Member]:
        return self._append_sets.sunion(*[self._pattern_key(k, version) for k in keys])

    def sinter(self: Any, *keys: Any, version: int | None = None) -> set[Member]:
        return self._append_sets.sinter(*[self._pattern_key(k, version) for k in keys])

    def sdiff(self: Any, *keys: Any, version: int | None = None) -> set[Member]:
        return self._append_sets.sdiff(*[self._pattern_key(k, version) for k in keys])

    def sunionstore(
        self: Any, destination: Any, *keys: Any, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        return self._append_sets.sunionstore(
            self._pattern_key(destination, version),
            *[self._pattern_key(k, version) for k in keys],
            expire=self._pattern_expire(timeout),
        )

    def sinterstore(
        self: Any, dest: Any, *keys: Any, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        return self._append_sets.sinterstore(
            self._pattern_key(dest, version),
            *[self._pattern_key(k, version) for k in keys],
            expire=self._pattern_expire(timeout),
        )

    def sdiffstore(
        self: Any,
        dest: Any,
        *keys: Any,
        version_dest: int | None = None,
        version_keys: int | None = None,
        timeout: Any = DEFAULT,
    ) -> int:
        return self._append_sets.sdiffstore(
            self._pattern_key(dest, version_dest),
            *[self._pattern_key(k, version_keys) for k in keys],
            expire=self._pattern_expire(timeout),
        )

    # -- lists ---------------------------------------------------------------

    def rpush(
        self: Any, key: Any, *values: Member, version: int | None = None, timeout: Any = DEFAULT
    ) -> int:
        """Append values; return how many were pushed (Redis: the new length)."""
        made = self._pattern_key(key, version)
        return self._append_lists.rpush(made, *values, expire=self._pattern_expire(timeout))

    def lrange(self: Any, key: Any, start: int, end: int, version: int | None = None) -> list[Any]:
        return self._append_lists.lrange(self._pattern_key(key, version), start, end)

    def llen(self: Any, key: Any, version: int | None = None) -> int:
        return self._append_lists.llen(self._pattern_key(key, version))

    def lrem(self: Any, key: Any, count: int, value: Member, version: int | None = None) -> int:
        """Remove like ``LREM``; return 1 once recorded, 0 for a missing list (Redis: how many)."""
        return self._append_lists.lrem(self._pattern_key(key, version), count, value)
