"""Values over memcached's item size limit, stored in chunks (``OPTIONS["large_values"]``).

:class:`ChunkedStore` (and :class:`AsyncChunkedStore`, over an ``AsyncStore``) wraps a
store and keeps a value whose item would not fit in one memcached item as a manifest
and chunks.  The layout, the checksum and the TTL rules are in
:mod:`django_mcpatterns.core.values.layout`, which the serde reads too; the store is
written once in ``_async.py`` and its sync form generated.
"""

from __future__ import annotations

from ..values.layout import CHUNKED_MAX_TTL, FLAG_CHUNKED, LARGE_VALUES, ChunkManifest
from ._async import AsyncChunkedStore
from ._sync import ChunkedStore

__all__ = [
    "CHUNKED_MAX_TTL",
    "FLAG_CHUNKED",
    "LARGE_VALUES",
    "AsyncChunkedStore",
    "ChunkManifest",
    "ChunkedStore",
]
