"""Django's cache API over a binding: each method written once, here, in asyncio.

``_sync/cache.py`` is generated from this module (``aget`` there is ``get``, over
``binding.values`` where this one awaits ``binding.async_values``).  The
conventions both forms keep (key making and validation, versions, timeouts, the
item size limit, return values) are :class:`MemcachedContract`'s.  Nothing here
hops to a thread: Django's defaults (``BaseCache.aget`` and friends) run the
sync method through ``sync_to_async``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT

from django_mcpatterns.core.exceptions import ValueTooLargeError
from django_mcpatterns.memcached_contract import (
    MISSING,
    MemcachedContract,
    as_given,
    counted,
    made_values,
    too_large,
)


class AsyncCacheMethods(MemcachedContract):
    """Django's cache API (``add``, ``get``, ``set``, ``touch``, ``delete``, ``get_many``,
    ``has_key``, ``incr``, ``decr``, ``set_many``, ``delete_many``, ``clear``,
    ``incr_version``, ``decr_version``) and ``bump``, in one form.

    Every method Django 6's ``BaseCache`` has an a-form of is defined here, so none
    of them falls back to Django's default (``sync_to_async`` of the sync method,
    a thread hop); ``aclose`` is the backends' own, ``aget_or_set`` the leased one
    of the pattern methods.
    """

    async def aadd(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> bool:
        key, expire = self._write_args(key, timeout, version)
        try:
            return await self.binding.async_near_values.add(key, value, expire)
        except ValueTooLargeError:
            return too_large(key)

    async def aget(self, key: Any, default: Any = None, version: Any = None) -> Any:
        key = self.make_and_validate_key(key, version)
        values = self._async_reads
        if values is None:  # the binding's, kept: reading its cached_property is slower
            values = self._async_reads = self.binding.async_near_values
        return await values.get(key, default)

    async def aset(  # type: ignore[override]  # says whether it stored; Django's returns None
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> bool:
        """Store ``value``; return False (never raise) when it was not stored.

        As in Django's memcached backends, a failed set deletes the old value so
        that readers never see data older than the write that failed (memcached
        refuses values over its 1 MB item limit).
        """
        key, expire = self._write_args(key, timeout, version)
        values = self._async_reads
        if values is None:
            values = self._async_reads = self.binding.async_near_values
        try:  # not a context manager: the hot path of every write
            stored = await values.set(key, value, expire)
        except ValueTooLargeError:
            stored = too_large(key)
        if not stored:
            await values.delete(key)
        return stored

    async def atouch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None) -> bool:
        key, expire = self._write_args(key, timeout, version)
        return bool(await self.binding.async_near_values.touch(key, expire))

    async def adelete(self, key: Any, version: Any = None) -> bool:
        key = self.make_and_validate_key(key, version)
        return bool(await self.binding.async_near_values.delete(key))

    async def aget_many(self, keys: Iterable[Any], version: Any = None) -> dict[Any, Any]:
        """The values found, keyed as given: one call to the store (one pipelined
        request per server)."""
        key_map = self._key_map(keys, version)
        return as_given(await self.binding.async_near_values.get_many(list(key_map)), key_map)

    async def ahas_key(self, key: Any, version: Any = None) -> bool:
        return await self.aget(key, MISSING, version=version) is not MISSING

    async def aincr(self, key: Any, delta: int = 1, version: Any = None) -> int:
        key = self.make_and_validate_key(key, version)
        values = self.binding.async_near_values
        counter = values.decr if delta < 0 else values.incr  # memcached: no negative deltas
        return counted(key, await counter(key, abs(delta)))

    async def adecr(self, key: Any, delta: int = 1, version: Any = None) -> int:
        return await self.aincr(key, -delta, version=version)

    async def aset_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> list[Any]:
        """Store every value; return the keys that failed, as Django does."""
        key_map = self._key_map(data, version)
        expire = self.get_backend_timeout(timeout)
        failed = await self.binding.async_near_values.set_many(made_values(data, key_map), expire)
        return [key_map[k] for k in failed]

    async def adelete_many(self, keys: Iterable[Any], version: Any = None) -> None:
        await self.binding.async_near_values.delete_many(list(self._key_map(keys, version)))

    async def aclear(self) -> None:
        """Flush the whole store: memcached's ``flush_all`` empties every server, whatever
        the key prefix."""
        await self.binding.async_near_values.flush_all()

    async def aincr_version(self, key: Any, delta: int = 1, version: Any = None) -> int:
        """Move the value of ``key`` to version ``version + delta``; return the new version.

        Django's steps (read, write under the new version, delete the old one),
        with a ``ValueError`` for a missing key.
        """
        if version is None:
            version = self.version
        value = await self.aget(key, MISSING, version=version)
        if value is MISSING:
            raise ValueError(f"Key '{key}' not found")
        await self.aset(key, value, version=version + delta)
        await self.adelete(key, version=version)
        return int(version + delta)

    async def adecr_version(self, key: Any, delta: int = 1, version: Any = None) -> int:
        return await self.aincr_version(key, -delta, version)

    async def abump(self, key: Any, version: Any = None) -> bool:
        """Refresh ``key``'s place in memcached's LRU, without fetching it or changing its TTL.

        Return whether it was there: memcached's "touching keys with add"
        (meta ``mg <key>`` with no flags; text ``add``).  A False is the
        playbook's cue that the value is gone and due to be recomputed.
        """
        return await self.binding.async_values.bump(
            self.make_and_validate_key(key, version=version)
        )
