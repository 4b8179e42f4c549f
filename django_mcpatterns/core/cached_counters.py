"""The cached counters' documented path: they live in :mod:`django_mcpatterns.core.counters`."""

from __future__ import annotations

from .counters import FLIGHT_TTL, AsyncCachedCounter, AsyncChange, CachedCounter, Change, Flight

__all__ = ["FLIGHT_TTL", "AsyncCachedCounter", "AsyncChange", "CachedCounter", "Change", "Flight"]
