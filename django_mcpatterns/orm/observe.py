"""What the ORM cache did, per model: hits, misses, invalidations, stale hits found by the audit.

Counted in process (``stats()``, the status page and the debug toolbar read
it) and sent as Django signals (``orm_event``, ``orm_stale_hit``) that the
Prometheus integration and projects can listen to.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from django.dispatch import Signal

__all__ = ["EVENTS", "orm_event", "orm_stale_hit", "record", "reset", "stats"]

EVENTS = ("hit", "miss", "uncached", "bypass", "invalidation", "audited", "stale")

orm_event = Signal()
"""Sent for each cache event: ``event`` (one of EVENTS), ``model`` (label), ``count``."""

orm_stale_hit = Signal()
"""Sent when the auditor finds a cached result that differs from the database: ``model``,
``key``, ``cached``, ``fresh``."""

_lock = threading.Lock()
_counts: Counter[tuple[str, str]] = Counter()


def record(event: str, model: str, count: int = 1) -> None:
    """Count ``event`` for ``model`` and tell the listeners."""
    with _lock:
        _counts[event, model] += count
    if orm_event.receivers:
        orm_event.send(sender=None, event=event, model=model, count=count)


def stats() -> dict[str, dict[str, int]]:
    """Counts by model label, then event: ``{"shop.product": {"hit": 12, ...}}``."""
    with _lock:
        items = list(_counts.items())
    out: dict[str, dict[str, int]] = {}
    for (event, model), count in sorted(items):
        out.setdefault(model, dict.fromkeys(EVENTS, 0))[event] = count
    return out


def reset() -> None:
    """Forget the counts (tests, benchmarks)."""
    with _lock:
        _counts.clear()


def totals() -> dict[str, int]:
    """Counts by event over every model."""
    out = dict.fromkeys(EVENTS, 0)
    with _lock:
        for (event, _), count in _counts.items():
            out[event] += count
    return out


def describe() -> dict[str, Any]:
    """The status page's view: totals and per model."""
    return {"totals": totals(), "models": stats()}
