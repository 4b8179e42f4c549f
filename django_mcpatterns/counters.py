"""Process-wide counts of what the patterns did, fed by django-mcpatterns' signals.

The status page shows them (recomputes, stale values served, lock waits, nodes
marked dead...).  Each process counts its own: with several worker processes,
each page view reports the process that served it.  Counting starts when the
app is ready (``AppConfig.ready`` calls :func:`connect`).

To count another signal, add its name to :data:`COUNTED` (a signal of that
name that :mod:`django_mcpatterns.signals` does not define yet is skipped, so
the list can name signals before they exist).
"""

from __future__ import annotations

import threading
from typing import Any

from . import signals

# Signal name -> label shown on the status page, in display order.
COUNTED = {
    "recomputed": "Values recomputed",
    "stale_served": "Stale values served",
    "compute_failed": "Recomputes failed",
    "refresh_dropped": "Background refreshes dropped",
    "lock_waited": "Lock waits",
    "lock_timed_out": "Lock wait timeouts",
    "namespace_invalidated": "Namespaces invalidated",
    "node_dead": "Servers marked dead",
    "node_revived": "Servers revived",
    "value_refused": "Cached values refused (unsigned, forged or unreadable)",
}


class Counters:
    """Named, labelled counters; thread-safe, resettable (for tests)."""

    def __init__(self) -> None:
        self._labels: dict[str, str] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def track(self, name: str, label: str) -> bool:
        """Show ``name`` under ``label``; return False when it was already tracked."""
        with self._lock:
            if name in self._labels:
                return False
            self._labels[name] = label
            return True

    def incr(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + amount

    def get(self, name: str) -> int:
        with self._lock:
            return self._counts.get(name, 0)

    def snapshot(self) -> list[tuple[str, str, int]]:
        """Return ``(name, label, count)`` of every tracked counter, in the order tracked."""
        with self._lock:
            return [
                (name, label, self._counts.get(name, 0)) for name, label in self._labels.items()
            ]

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


counters = Counters()


def _receiver(name: str) -> Any:
    def count(sender: object, **kwargs: object) -> None:
        counters.incr(name)

    return count


def connect() -> None:
    """Count every signal of :data:`COUNTED` that exists; calling it again is harmless."""
    for name, label in COUNTED.items():
        signal = getattr(signals, name, None)
        if signal is not None and counters.track(name, label):
            # weak=False: the receiver is a closure nobody else holds.
            signal.connect(_receiver(name), weak=False, dispatch_uid=f"mcpatterns.counters.{name}")
