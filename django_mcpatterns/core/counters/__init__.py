"""Exact cached counters, sync and async: :class:`CachedCounter`, :class:`AsyncCachedCounter`.

The argument is in ``_model.py``; the algorithm is written once in
``_async.py`` (the sync form is generated).  Imported from here so
neither form's path is part of the API.
"""

from __future__ import annotations

from ._async import AsyncCachedCounter, AsyncChange
from ._model import FLIGHT_TTL, Flight
from ._sync import CachedCounter, Change

__all__ = ["FLIGHT_TTL", "AsyncCachedCounter", "AsyncChange", "CachedCounter", "Change", "Flight"]
