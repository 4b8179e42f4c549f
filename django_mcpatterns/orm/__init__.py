"""ORM caching on memcached: querysets cached and invalidated automatically (docs/orm.md).

Add ``"django_mcpatterns.orm"`` to ``INSTALLED_APPS``; then every queryset has
``.cache(timeout=None)`` and ``.nocache()``, ``MCPATTERNS_ORM["models"]``
caches chosen models' operations automatically, and every ORM write path
invalidates what it can change, after the commit.
"""

from __future__ import annotations

from .decorators import cached_as
from .invalidation import (
    Journal,
    invalidate_all,
    invalidate_model,
    invalidate_obj,
    invalidate_table,
    set_journal,
)
from .observe import orm_event, orm_stale_hit, stats

__all__ = [
    "Journal",
    "cached_as",
    "invalidate_all",
    "invalidate_model",
    "invalidate_obj",
    "invalidate_table",
    "orm_event",
    "orm_stale_hit",
    "set_journal",
    "stats",
]
