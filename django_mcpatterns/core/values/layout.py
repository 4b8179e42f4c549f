"""The chunk layout: values over memcached's item size limit, stored in chunks.

What the chunked stores (:mod:`django_mcpatterns.core.chunks`, ``large_values="chunk"``)
write for a value whose encoded item would not fit in one memcached item::

    <key>                       a manifest, flags FLAG_CHUNKED (1 << 21), 41 bytes:
                                version u8, the value's flags u32, its length u64,
                                the chunk count u32, a random generation (8 bytes),
                                BLAKE2b-128 of the value's bytes (16 bytes)
    mcp:chunk:<h>:<gen>:<i>     chunk i of the value's encoded bytes (flags 0), for
                                i < count; <h> is a digest of the key, <gen> the
                                manifest's generation

Every chunk key is :class:`~django_mcpatterns.core.keys.Routed` by the key's own ring bytes, so the
chunks live on the key's server (a replicated key's: on each of its replicas, written there
before the manifest is written anywhere): a read is the manifest (one round trip), then
every chunk in one multi-get (a second round trip).  The checksum makes that
read all or nothing: a chunk lost to eviction or a restart, or a manifest
read while another writer replaces it, reads as a miss, never as a partial or
wrong value.  Each write uses a fresh generation, so an ``add`` or ``cas``
that loses leaves the current value's chunks alone.

Chunks are written before the manifest and with the same TTL; a value with
no TTL gets :data:`CHUNKED_MAX_TTL` (30 days, memcached's longest relative
one) on the manifest and the chunks alike, because chunks must expire: the
chunks of a value that was overwritten or deleted are never read again and
stay only until that TTL (memcached's LRU evicts such never-read items
first).  Nothing written here outlives its TTL.

Only the chunked store sees manifests: it reads inside :func:`manifests_read`
(a context variable, so per thread and per asyncio task), and the serde
refuses a manifest anywhere else (:mod:`.serde`).  A pattern reading
the key through the plain store, or a cache without ``large_values="chunk"``,
gets a miss, never the manifest.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from ..exceptions import EncodingError, ValueTooLargeError
from ..keys import Routed

__all__ = [
    "CHUNKED_MAX_TTL",
    "CHUNK_PREFIX",
    "FLAG_CHUNKED",
    "LARGE_VALUES",
    "ChunkManifest",
    "Encoded",
    "ManifestsRead",
    "chunk_expire",
    "fits",
    "manifests_read",
    "reading_manifests",
    "split",
]

FLAG_CHUNKED = 1 << 21
# Every chunk key starts so; a replicated value's chunks follow its replicas (client/routes.py).
CHUNK_PREFIX = b"mcp:chunk:"
LARGE_VALUES = ("refuse", "chunk")
CHUNKED_MAX_TTL = 60 * 60 * 24 * 30  # memcached's longest relative exptime
VERSION = 1
_MANIFEST = struct.Struct(">BIQI8s16s")
# memcached 1.6 counts 59 bytes of item header plus 4 for non-zero flags
# (core/memory/items.py, item_size); chunk payloads keep a margin below the limit.
_ITEM_HEADER = 59 + 4
_MARGIN = 64
# A reader asks for at most this many chunks (64 GiB in 1 MiB items): the manifest is
# not signed, and its count must not decide how much a reader allocates and sends.
MAX_CHUNKS = 1 << 16
_MANIFESTS: ContextVar[bool] = ContextVar("django_mcpatterns_manifests", default=False)


class ManifestsRead:
    """:func:`manifests_read`'s context (a class: a generator-based one costs a chunked
    store's every read some 4k instructions)."""

    __slots__ = ("token",)

    def __enter__(self) -> None:
        self.token = _MANIFESTS.set(True)

    def __exit__(self, *exc: object) -> None:
        _MANIFESTS.reset(self.token)


def manifests_read() -> ManifestsRead:
    """Within it, reads hand chunk manifests over instead of refusing them."""
    return ManifestsRead()


def reading_manifests() -> bool:
    """Whether the current thread or task reads inside :func:`manifests_read`."""
    return _MANIFESTS.get()


@dataclass(frozen=True, slots=True)
class Encoded:
    """An item already encoded: the stores' serde sends ``data`` under ``flags`` as they are."""

    data: bytes
    flags: int


@dataclass(frozen=True, slots=True)
class ChunkManifest:
    """What the item under a chunked value's key says: how to find and check its chunks."""

    flags: int
    length: int
    count: int
    generation: bytes
    digest: bytes

    @classmethod
    def parse(cls, data: bytes) -> ChunkManifest:
        """Read a manifest; :class:`EncodingError` for any other layout."""
        if len(data) != _MANIFEST.size or data[0] != VERSION:
            raise EncodingError(
                f"a chunk manifest of {len(data)} bytes is not version {VERSION} of the layout"
            )
        _, flags, length, count, generation, digest = _MANIFEST.unpack(data)
        if flags & FLAG_CHUNKED:
            raise EncodingError("a chunk manifest cannot name a chunked value")
        if not 0 < count <= min(length, MAX_CHUNKS):
            raise EncodingError(f"a chunk manifest of {count} chunks for {length} bytes")
        return cls(flags, length, count, generation, digest)

    def encoded(self) -> Encoded:
        packed = _MANIFEST.pack(
            VERSION, self.flags, self.length, self.count, self.generation, self.digest
        )
        return Encoded(packed, FLAG_CHUNKED)

    def keys(self, wire: bytes, ring: bytes) -> list[Routed]:
        """The chunk keys of the value stored under ``wire`` (placed by ``ring``), in order."""
        owner = hashlib.blake2b(wire, digest_size=12).hexdigest().encode()
        stem = CHUNK_PREFIX + owner + b":" + self.generation.hex().encode() + b":"
        return [Routed(stem + b"%d" % i, ring) for i in range(self.count)]

    def assemble(self, parts: Sequence[object]) -> bytes | None:
        """The value's bytes from its chunks in order, or None when any is missing or wrong."""
        if len(parts) != self.count or not all(type(part) is bytes for part in parts):
            return None
        data = b"".join(parts)  # type: ignore[arg-type]  # checked: all bytes
        if len(data) != self.length or _digest(data) != self.digest:
            return None
        return data


def fits(wire: bytes, data: bytes, max_item_size: int) -> bool:
    """Whether one memcached item holds ``data`` under ``wire`` (memcached 1.6's accounting)."""
    return _ITEM_HEADER + len(wire) + len(data) + _MARGIN <= max_item_size


def split(
    wire: bytes, ring: bytes, data: bytes, flags: int, max_item_size: int
) -> tuple[Encoded, dict[Routed, Encoded]]:
    """The manifest and the chunks (by key) that store ``data`` under ``wire``."""
    generation = os.urandom(8)
    # Chunk keys are all as long as the last one's, give or take its index's digits.
    probe = ChunkManifest(flags, len(data), 1, generation, b"").keys(wire, ring)[0]
    size = max_item_size - _ITEM_HEADER - len(probe.key) - 10 - _MARGIN
    if size < 1:
        raise EncodingError(f"an item size limit of {max_item_size} bytes leaves no room")
    if -(-len(data) // size) > MAX_CHUNKS:
        raise ValueTooLargeError(f"{len(data)} bytes are over {MAX_CHUNKS} chunks")
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    manifest = ChunkManifest(flags, len(data), len(pieces), generation, _digest(data))
    keys = manifest.keys(wire, ring)
    return manifest.encoded(), {k: Encoded(p, 0) for k, p in zip(keys, pieces, strict=True)}


def chunk_expire(expire: int) -> int:
    """The TTL of a chunked value's items: ``expire``, or 30 days for "never" (see above)."""
    return CHUNKED_MAX_TTL if expire == 0 else expire


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()
