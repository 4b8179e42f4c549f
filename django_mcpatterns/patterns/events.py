"""Which signal each core event is sent as, for the Django and Flask signal modules.

The core reports what happened as plain event objects (``on_event``); the
backends pass them to their ``_pattern_event`` hook, and each framework's signal
module sends the signal named here with the event's fields as keyword
arguments.  One table, so both frameworks name and send the same signals.
Imports neither Django nor Flask.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeVar

from django_mcpatterns.core.locks import LockTimedOut, LockWaited
from django_mcpatterns.core.outages import WriteDegraded
from django_mcpatterns.core.stampede import ComputeFailed, Recomputed, RefreshDropped, StaleServed

__all__ = ["SIGNAL_NAMES", "signals_by_event"]

S = TypeVar("S")

SIGNAL_NAMES: Mapping[type, str] = MappingProxyType(
    {
        Recomputed: "recomputed",
        StaleServed: "stale_served",
        ComputeFailed: "compute_failed",
        RefreshDropped: "refresh_dropped",
        LockWaited: "lock_waited",
        LockTimedOut: "lock_timed_out",
        WriteDegraded: "write_degraded",
    }
)


def signals_by_event(signals: Mapping[str, S]) -> dict[type, S]:
    """Map each event class to its signal, looked up by name in ``signals`` (a module's namespace).

    A missing signal is a :class:`KeyError` at import, not a silently unsent event.
    """
    return {event: signals[name] for event, name in SIGNAL_NAMES.items()}
