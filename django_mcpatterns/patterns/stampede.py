"""``cache.get_or_compute(...)`` and friends: stampede protection on cache objects.

The algorithm is :mod:`django_mcpatterns.core.stampede`; the methods are written
once, in ``_async_stampede.py`` (``aget_or_compute``, ``amark_stale``...), and
``_sync_stampede.py`` is generated from it.  Imports neither Django nor Flask.
"""

from __future__ import annotations

from ._async_stampede import AsyncStampedeMethods
from ._sync_stampede import StampedeMethods
from .host import soft_timeout

__all__ = ["AsyncStampedeMethods", "StampedeMethods", "StampedeMixin", "soft_timeout"]


class StampedeMixin(StampedeMethods, AsyncStampedeMethods):
    """``get_or_compute``, ``get_or_compute_result``, ``recompute``, ``mark_stale``,
    ``get_or_set`` (leased) and ``get_envelope``, with their asyncio forms.

    ``stampede_policy`` is the cache's default
    :class:`~django_mcpatterns.core.stampede.StampedePolicy`; each call may
    pass its own ``policy``.
    """
