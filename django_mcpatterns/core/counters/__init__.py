"""Exact cached counters, sync and async: :class:`CachedCounter`, :class:`AsyncCachedCounter`.

The argument is in :mod:`.flights`; the algorithm is written once in
``core/_async/counter.py`` (the sync form is generated).  Imported from here so
neither form's path is part of the API.
"""

from __future__ import annotations

from ._async.counter import AsyncCachedCounter, AsyncChange
from ._sync.counter import CachedCounter, Change
from .flights import FLIGHT_TTL, Flight

__all__ = ["FLIGHT_TTL", "AsyncCachedCounter", "AsyncChange", "CachedCounter", "Change", "Flight"]
