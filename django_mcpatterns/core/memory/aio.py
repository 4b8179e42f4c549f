"""AsyncMemoryStore: the embedded store for asyncio, over a :class:`~.store.MemoryStore`'s data."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..keys import Key, KeyT
from ..store import CasToken, Leased
from .items import Serde
from .store import MemoryStore

__all__ = ["AsyncMemoryStore"]


class AsyncMemoryStore:
    """:class:`MemoryStore` for asyncio (:class:`~.store.AsyncStore`), over the same data.

    Its operations are in-memory and take the store's lock only for a few
    microseconds, so they run on the event loop directly: no thread, no
    ``sync_to_async``.  ``sync`` is the store it reads and writes, so a
    Django backend's sync and async methods see one cache.
    """

    def __init__(self, sync: MemoryStore | None = None) -> None:
        self.sync = sync if sync is not None else MemoryStore()

    async def get(self, key: Key, default: Any = None) -> Any:
        return self.sync.get(key, default)

    async def gets(self, key: Key) -> tuple[Any, CasToken | None]:
        return self.sync.gets(key)

    async def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return self.sync.get_many(keys)

    async def gets_many(self, keys: Iterable[Key]) -> dict[Key, tuple[Any, CasToken]]:
        return self.sync.gets_many(keys)

    async def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        return self.sync.gets_envelope(key)

    async def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return self.sync.get_many_envelopes(keys)

    async def ttl(self, key: Key) -> int | None:
        return self.sync.ttl(key)

    async def set(self, key: Key, value: Any, expire: int = 0) -> bool:
        return self.sync.set(key, value, expire)

    async def set_many(self, values: Mapping[KeyT, Any], expire: int = 0) -> list[KeyT]:
        return self.sync.set_many(values, expire)

    async def add(self, key: Key, value: Any, expire: int = 0) -> bool:
        return self.sync.add(key, value, expire)

    async def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        return self.sync.cas(key, value, cas, expire)

    async def append(self, key: Key, value: bytes) -> bool:
        return self.sync.append(key, value)

    async def prepend(self, key: Key, value: bytes) -> bool:
        return self.sync.prepend(key, value)

    async def incr(self, key: Key, delta: int = 1) -> int | None:
        return self.sync.incr(key, delta)

    async def decr(self, key: Key, delta: int = 1) -> int | None:
        return self.sync.decr(key, delta)

    async def touch(self, key: Key, expire: int = 0) -> bool:
        return self.sync.touch(key, expire)

    async def delete(self, key: Key) -> bool:
        return self.sync.delete(key)

    async def bump(self, key: Key) -> bool:
        return self.sync.bump(key)

    async def forget(self, key: Key, marker: bytes | None = None, expire: int = 0) -> bool:
        return self.sync.forget(key, marker, expire)

    async def delete_many(self, keys: Iterable[Key]) -> None:
        self.sync.delete_many(keys)

    async def gets_ttl(self, key: Key) -> tuple[Any, CasToken | None, int | None]:
        return self.sync.gets_ttl(key)

    async def add_cas(self, key: Key, value: Any, expire: int = 0) -> CasToken | None:
        return self.sync.add_cas(key, value, expire)

    async def recas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> CasToken | None:
        return self.sync.recas(key, value, cas, expire)

    async def delete_cas(self, key: Key, cas: CasToken) -> bool:
        return self.sync.delete_cas(key, cas)

    async def gets_leased(self, key: Key, others: Iterable[Key], ttl: int) -> Leased:
        return self.sync.gets_leased(key, others, ttl)

    async def lease(self, key: Key, ttl: int, replacing: CasToken | None = None) -> Leased:
        return self.sync.lease(key, ttl, replacing)

    async def flush_all(self) -> bool:
        return self.sync.flush_all()

    async def close(self) -> None:
        """Do nothing, as :meth:`MemoryStore.close`."""

    async def stats(self) -> dict[str, int]:
        return self.sync.stats()

    @property
    def serde(self) -> Serde:
        return self.sync.serde
