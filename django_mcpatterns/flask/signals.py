"""Blinker signals for the patterns on Flask, the counterparts of the Django signals.

Sent the way Flask-Caching sends its own (``flask_caching.signals``): without a
sender, with keyword arguments.  Each gets ``cache`` (the backend, i.e.
``Cache().cache``) and ``key`` (the full memcached key, after
``CACHE_KEY_PREFIX``), plus:

``recomputed``
    ``get_or_compute`` (or ``recompute``) computed and stored a value:
    ``compute_time`` (seconds), ``reason`` (``"miss"``, ``"stale"``,
    ``"early"``, ``"refresh"``), ``background``.
``stale_served``
    A stale value was returned while another caller recomputes it: ``age``,
    seconds since its soft expiry.
``compute_failed``
    The compute callable raised ``error`` (also logged); ``background``.
``lock_waited``
    A caller waited ``waited`` seconds on a lock and got it.
``lock_timed_out``
    A caller gave up after ``waited`` seconds.
"""

from __future__ import annotations

from typing import Any

from blinker import Namespace, Signal

from ..core.locks import LockTimedOut, LockWaited
from ..core.stampede import ComputeFailed, Recomputed, StaleServed

_signals = Namespace()

recomputed = _signals.signal("mcpatterns-recomputed")
stale_served = _signals.signal("mcpatterns-stale-served")
compute_failed = _signals.signal("mcpatterns-compute-failed")
lock_waited = _signals.signal("mcpatterns-lock-waited")
lock_timed_out = _signals.signal("mcpatterns-lock-timed-out")

_BY_EVENT: dict[type, Signal] = {
    Recomputed: recomputed,
    StaleServed: stale_served,
    ComputeFailed: compute_failed,
    LockWaited: lock_waited,
    LockTimedOut: lock_timed_out,
}


def send_pattern_event(cache: Any, event: object) -> None:
    """Send the signal for a core event (the backends' ``_pattern_event`` hook)."""
    signal = _BY_EVENT.get(type(event))
    if signal is not None and signal.receivers:
        signal.send(cache=cache, **vars(event))
