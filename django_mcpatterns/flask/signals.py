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
``refresh_dropped``
    A background refresh was not run (the stale value is served): ``reason``,
    ``"full"``, ``"refused"``, ``"lapsed"`` or ``"unreachable"``.
``lock_waited``
    A caller waited ``waited`` seconds on a lock and got it.
``lock_timed_out``
    A caller gave up after ``waited`` seconds.
``write_degraded``
    A write that could not reach memcached was given up on and its key
    repaired (``CACHE_OPTIONS["on_outage"] = "degrade"``, the default): a set or
    list write (it returned 0), a namespace invalidation, a counter change, a
    ``mark_stale`` or a lock release: ``command``, ``error``.

``value_refused`` is sent by the store, not a cache: a stored item was read as
a miss because it was unsigned or forged under signing, of another serializer,
or corrupt (:mod:`django_mcpatterns.core.serializers`).  It gets ``key``
(bytes), ``reason`` (``"unsigned"``, ``"signature"``, ``"format"``,
``"corrupt"``), ``flags`` and ``detail``.
"""

from __future__ import annotations

from typing import Any

from blinker import Namespace, Signal

from ..core.values.refusals import ValueRefused
from ..patterns.events import signals_by_event

_signals = Namespace()

recomputed = _signals.signal("mcpatterns-recomputed")
stale_served = _signals.signal("mcpatterns-stale-served")
compute_failed = _signals.signal("mcpatterns-compute-failed")
refresh_dropped = _signals.signal("mcpatterns-refresh-dropped")
lock_waited = _signals.signal("mcpatterns-lock-waited")
lock_timed_out = _signals.signal("mcpatterns-lock-timed-out")
write_degraded = _signals.signal("mcpatterns-write-degraded")
value_refused = _signals.signal("mcpatterns-value-refused")

_BY_EVENT: dict[type, Signal] = signals_by_event(globals())


def send_pattern_event(cache: Any, event: object) -> None:
    """Send the signal for a core event (the backends' ``_pattern_event`` hook)."""
    signal = _BY_EVENT.get(type(event))
    if signal is not None and signal.receivers:
        signal.send(cache=cache, **vars(event))


def send_value_refused(event: ValueRefused) -> None:
    """The stores' ``on_refused`` hook: send :data:`value_refused`."""
    value_refused.send(**vars(event))
