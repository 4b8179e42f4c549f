"""Redis-style sets and lists on cache objects, with django-redis's names.

``sadd``, ``srem``, ``smembers``... and ``rpush``, ``lrange``, ``llen``, ``lrem``,
each with its asyncio form (``asadd``...): the methods are written once, in
``_async_sets.py``, and ``_sync_sets.py`` is generated from it.  Readers also
take ``loader=`` (the set's source of truth, called on a miss) and ``timeout=``
for the set they then cache; writers take ``loader=`` to say the set is
loader-backed, so they never create it.  See ``docs/sets.md``.

It imports neither Django nor Flask.
"""

from __future__ import annotations

from ._async_sets import AsyncSetMethods
from ._sync_sets import SetMethods

__all__ = ["AsyncSetMethods", "SetMethods", "SetsMixin"]


class SetsMixin(SetMethods, AsyncSetMethods):
    """``sadd``, ``srem``, ``smembers``... and ``rpush``, ``lrange``, ``llen``, ``lrem``,
    each with its asyncio form (``asadd``...)."""
