"""A store that keeps values over the item size limit in chunks (``large_values="chunk"``).

The layout, the checksum and the TTL rules are in :mod:`django_mcpatterns.core.values.layout`;
this module does the I/O: a write of a value that does not fit in one item sends
its chunks and then its manifest, a read that finds a manifest fetches every chunk
in one multi-get from the key's server.  Round trips: ``get`` of a chunked value
2 (manifest, chunks), ``get_many`` 2 whatever the number of chunked values, ``set``
and ``set_many`` 1 (chunks and manifests pipelined in one write per server; 2 for a
``set_many`` without a TTL that mixes chunked values with values that fit),
``add``/``cas``/``add_cas``/``recas`` 2 (the chunks, then the conditional write of
the manifest).  A value that fits costs what it costs on the store underneath.

Its reads run inside :func:`~django_mcpatterns.core.values.layout.manifests_read`, so the
store's serde hands manifests here as :class:`~django_mcpatterns.core.chunks.ChunkManifest`
(and refuses them to every other reader).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django_mcpatterns.core.keys import Key, KeyT, Routed, placed
from django_mcpatterns.core.protocol.compiled import maker
from django_mcpatterns.core.store import AsyncLeaseStore, AsyncStore, CasToken, Leased
from django_mcpatterns.core.values.envelope import STALE
from django_mcpatterns.core.values.layout import (
    ChunkManifest,
    Encoded,
    chunk_expire,
    fits,
    manifests_read,
    split,
)
from django_mcpatterns.core.values.refusals import is_refused

_MISS: Any = object()
new_encoded = maker(Encoded)
"""Encoded from its two fields, in C where compiled (a write of a value that fits makes one)."""


class AsyncChunkedStore:
    """:class:`~django_mcpatterns.core.store.AsyncStore` over ``store``, chunking large values.

    ``max_item_size`` is the servers' item size limit (memcached's ``-I``).
    Methods that carry no value (``delete``, ``incr``...) are the store's
    own: ``delete`` removes the manifest, and the chunks expire (see
    :mod:`django_mcpatterns.core.values.layout`); ``touch`` renews the chunks too;
    ``bump`` refreshes the manifest only.
    """

    def __init__(self, store: AsyncStore, max_item_size: int) -> None:
        self.store = store
        self.max_item_size = max_item_size
        self.serde: Any = store.serde  # type: ignore[attr-defined]  # Cluster/MemoryStore
        # Leasing reads pass through when the store underneath takes leases.
        self.leases = store if isinstance(store, AsyncLeaseStore) else None

    # -- reads --------------------------------------------------------------

    async def get(self, key: Key, default: Any = None) -> Any:
        with manifests_read():
            found = await self.store.get(key, _MISS)
        if type(found) is ChunkManifest:
            found = (await self._assemble({key: found}))[key]
        return default if found is _MISS else found

    async def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        with manifests_read():
            found = await self.store.get_many(keys)
        manifests = {k: v for k, v in found.items() if type(v) is ChunkManifest}
        if manifests:
            for key, value in (await self._assemble(manifests)).items():
                if value is _MISS:
                    del found[key]
                else:
                    found[key] = value
        return found

    async def gets(self, key: Key) -> tuple[Any, CasToken | None]:
        with manifests_read():
            value, cas = await self.store.gets(key)
        if type(value) is ChunkManifest:
            value = (await self._assemble({key: value}))[key]
            return (None, None) if value is _MISS else (value, cas)
        return value, cas

    async def gets_many(self, keys: Iterable[Key]) -> dict[Key, tuple[Any, CasToken]]:
        with manifests_read():
            found = await self.store.gets_many(keys)
        manifests = {k: v[0] for k, v in found.items() if type(v[0]) is ChunkManifest}
        if manifests:
            for key, value in (await self._assemble(manifests)).items():
                if value is _MISS:
                    del found[key]
                else:
                    found[key] = (value, found[key][1])
        return found

    async def gets_leased(self, key: Key, others: Iterable[Key], ttl: int) -> Leased:
        """The store's leasing read, chunked values assembled; a plain ``gets_many`` (no
        lease, ``leasing`` False) over a store that takes none."""
        if self.leases is None:
            return Leased(await self.gets_many([key, *others]), leasing=False)
        with manifests_read():
            leased = await self.leases.gets_leased(key, others, ttl)
        found = leased.found
        manifests = {k: v[0] for k, v in found.items() if type(v[0]) is ChunkManifest}
        if manifests:
            for k, value in (await self._assemble(manifests)).items():
                if value is _MISS:
                    del found[k]
                else:
                    found[k] = (value, found[k][1])
        return leased

    async def lease(self, key: Key, ttl: int, replacing: CasToken | None = None) -> Leased:
        if self.leases is None:
            return Leased({}, leasing=False)
        return await self.leases.lease(key, ttl, replacing)

    async def gets_ttl(self, key: Key) -> tuple[Any, CasToken | None, int | None]:
        with manifests_read():
            value, cas, ttl = await self.store.gets_ttl(key)
        if type(value) is ChunkManifest:
            value = (await self._assemble({key: value}))[key]
            return (None, None, None) if value is _MISS else (value, cas, ttl)
        return value, cas, ttl

    async def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        with manifests_read():
            value, cas = await self.store.gets_envelope(key)
        if type(value) is ChunkManifest:
            value = (await self._assemble({key: value}, envelopes=True))[key]
            return (None, None) if value is _MISS else (value, cas)
        return value, cas

    async def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]:
        with manifests_read():
            found = await self.store.get_many_envelopes(keys)
        manifests = {k: v for k, v in found.items() if type(v) is ChunkManifest}
        if manifests:
            for key, value in (await self._assemble(manifests, envelopes=True)).items():
                if value is _MISS:
                    del found[key]
                else:
                    found[key] = value
        return found

    async def _assemble(
        self, manifests: Mapping[Key, ChunkManifest], *, envelopes: bool = False
    ) -> dict[Key, Any]:
        """Each manifest's value, from one multi-get; ``_MISS`` where a chunk is gone or wrong."""
        chunk_keys: dict[Key, list[Routed]] = {}
        for key, manifest in manifests.items():
            wire, ring = placed(key)
            chunk_keys[key] = manifest.keys(wire, ring)
        wanted = [chunk for chunks in chunk_keys.values() for chunk in chunks]
        parts: dict[Any, Any] = await self.store.get_many(wanted)
        decode = self.serde.deserialize_envelope if envelopes else self.serde.deserialize
        values: dict[Key, Any] = {}
        broken: dict[Key, ChunkManifest] = {}
        for key, manifest in manifests.items():
            data = manifest.assemble([parts.get(chunk) for chunk in chunk_keys[key]])
            if data is None:
                broken[key] = manifest
            value = _MISS if data is None else decode(placed(key)[0], data, manifest.flags)
            values[key] = _MISS if value is STALE or is_refused(value) else value
        if broken:
            await self._drop_broken(broken)
        return values

    async def _drop_broken(self, broken: Mapping[Key, ChunkManifest]) -> None:
        """Delete each manifest whose chunks are gone, if it is still the same item (by cas).

        A chunk evicted alone (large items have slab classes of their own) leaves a
        manifest that reads as a miss yet makes every ``add`` fail: fills under a
        lease (``get_or_set``) would never land again until its TTL, up to 30 days.
        A manifest replaced meanwhile has another generation and is left alone.
        """
        for key, manifest in broken.items():
            with manifests_read():
                found, cas = await self.store.gets(key)
            if found == manifest and cas is not None:
                await self.store.delete_cas(key, cas)

    # -- writes -------------------------------------------------------------

    def _encode(self, key: Key, value: Any) -> tuple[Encoded, dict[Routed, Encoded]]:
        """The item for ``key``: the encoded value, or a manifest and the chunks it names."""
        wire, ring = placed(key)
        data, flags = self.serde.serialize(wire, value)
        if not isinstance(data, bytes):
            data = str(data).encode()  # pymemcache-style serdes give an int's digits as str
        if fits(wire, data, self.max_item_size):
            return new_encoded(data, flags), {}
        return split(wire, ring, data, flags, self.max_item_size)

    async def set(self, key: Key, value: Any, expire: int = 0) -> bool:
        item, chunks = self._encode(key, value)
        if not chunks:
            return await self.store.set(key, item, expire)
        # Chunks first, the manifest last, in one pipelined write to the key's server.
        failed = await self.store.set_many({**chunks, key: item}, chunk_expire(expire))
        return not failed

    async def set_many(self, values: Mapping[KeyT, Any], expire: int = 0) -> list[KeyT]:
        plain: dict[Any, Encoded] = {}
        chunked: dict[Any, Encoded] = {}
        owners: dict[Any, KeyT] = {}
        for key, value in values.items():
            item, chunks = self._encode(key, value)
            group = chunked if chunks else plain
            group.update(chunks)
            group[key] = item  # after its chunks
            owners.update(dict.fromkeys(chunks, key))
            owners[key] = key
        if chunk_expire(expire) == expire:  # one TTL for all: one pipelined write
            failed = await self.store.set_many({**plain, **chunked}, expire)
        else:  # "never" for the plain values, 30 days for the chunked ones (see chunks.py)
            failed = await self.store.set_many(plain, expire) if plain else []
            failed += await self.store.set_many(chunked, chunk_expire(expire)) if chunked else []
        lost = {owners[key] for key in failed}
        return [key for key in values if key in lost]

    async def add(self, key: Key, value: Any, expire: int = 0) -> bool:
        item, expire = await self._write_chunks(key, value, expire)
        return item is not None and await self.store.add(key, item, expire)

    async def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        item, expire = await self._write_chunks(key, value, expire)
        return False if item is None else await self.store.cas(key, item, cas, expire)

    async def add_cas(self, key: Key, value: Any, expire: int = 0) -> CasToken | None:
        item, expire = await self._write_chunks(key, value, expire)
        return None if item is None else await self.store.add_cas(key, item, expire)

    async def recas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> CasToken | None:
        item, expire = await self._write_chunks(key, value, expire)
        return None if item is None else await self.store.recas(key, item, cas, expire)

    async def _write_chunks(self, key: Key, value: Any, expire: int) -> tuple[Encoded | None, int]:
        """Store a large value's chunks; return the item for ``key`` and its TTL.

        None when a chunk was not stored.  Chunks carry a fresh generation, so
        a conditional write of the manifest that then fails leaves the current
        value whole; its chunks expire.
        """
        item, chunks = self._encode(key, value)
        if not chunks:
            return item, expire
        expire = chunk_expire(expire)
        if await self.store.set_many(chunks, expire):
            return None, expire
        return item, expire

    # -- the store's own ----------------------------------------------------

    async def append(self, key: Key, value: bytes) -> bool:
        return await self.store.append(key, value)

    async def prepend(self, key: Key, value: bytes) -> bool:
        return await self.store.prepend(key, value)

    async def incr(self, key: Key, delta: int = 1) -> int | None:
        return await self.store.incr(key, delta)

    async def decr(self, key: Key, delta: int = 1) -> int | None:
        return await self.store.decr(key, delta)

    async def delete(self, key: Key) -> bool:
        return await self.store.delete(key)

    async def delete_many(self, keys: Iterable[Key]) -> None:
        await self.store.delete_many(keys)

    async def forget(self, key: Key, marker: bytes | None = None, expire: int = 0) -> bool:
        """The manifest (or value) goes; its chunks are named by nothing, and expire."""
        return await self.store.forget(key, marker, expire)

    async def touch(self, key: Key, expire: int = 0) -> bool:
        """Renew ``key``'s TTL; a chunked value's chunks with it (a "never" is 30 days).

        Touching the manifest alone would say True and then lose the value when
        its chunks' first TTL ran out.  Costs a read of the item first, then one
        touch per chunk: False when a chunk is gone (the value reads as a miss).
        """
        with manifests_read():
            found = await self.store.get(key, _MISS)
        if type(found) is not ChunkManifest:
            return await self.store.touch(key, expire)  # the item as it is, whatever it holds
        wire, ring = placed(key)
        expire = chunk_expire(expire)
        for chunk in found.keys(wire, ring):
            if not await self.store.touch(chunk, expire):
                return False
        return await self.store.touch(key, expire)

    async def bump(self, key: Key) -> bool:
        return await self.store.bump(key)

    async def ttl(self, key: Key) -> int | None:
        return await self.store.ttl(key)

    async def delete_cas(self, key: Key, cas: CasToken) -> bool:
        return await self.store.delete_cas(key, cas)

    async def flush_all(self) -> bool:
        return await self.store.flush_all()

    async def close(self) -> None:
        await self.store.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store!r}, max_item_size={self.max_item_size})"
