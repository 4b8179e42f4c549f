"""Signals sent by django-mcpatterns.

``node_dead`` / ``node_revived``
    A memcached server was marked dead by failover, or answered again.
    Keyword arguments: ``node`` (``"host:port"``), ``error`` (the exception, or
    ``None``).  The sender is the :class:`~django_mcpatterns.core.cluster.Cluster`.
``value_refused``
    A stored item was refused and read as a miss: unsigned or forged under
    signing, another serializer's format, or corrupt
    (:mod:`django_mcpatterns.core.serializers`).  Keyword arguments: ``key``
    (bytes), ``reason`` (``"unsigned"``, ``"signature"``, ``"format"``,
    ``"corrupt"``), ``flags``, ``detail``.  The sender is the store's class
    (``Cluster`` or ``MemoryStore``).

Stampede protection and locks send the following; the sender is the cache
backend's class, ``cache`` the backend instance, and ``key`` the full memcached
key (after ``KEY_PREFIX``/``VERSION``; a namespace's key is a
:class:`~django_mcpatterns.core.keys.Routed`, whose ``key`` holds those bytes):

``recomputed``
    ``get_or_compute`` (or ``recompute``) computed and stored a value.
    ``compute_time`` (seconds), ``reason`` (``"miss"``, ``"stale"``,
    ``"early"`` for XFetch, ``"refresh"``), ``background`` (ran in the policy's
    runner).
``stale_served``
    A stale value was returned while another caller recomputes it (or because
    computing failed).  ``age``: seconds since its soft expiry.
``compute_failed``
    The compute callable raised ``error`` (also logged); ``background``.  Other
    callers of the key are then served the stale value, or get
    ``ComputeFailedError``, for the policy's ``failure_backoff``.
``refresh_dropped``
    A background refresh was not run; the stale value is served meanwhile.
    ``reason``: ``"full"`` (the runner's queue), ``"refused"`` (the runner
    raised), ``"lapsed"`` (its lock lapsed while it was queued) or
    ``"unreachable"`` (its lock's server was).
``lock_waited``
    A caller waited ``waited`` seconds on a lock (a blocking ``acquire``, or a
    cold-miss caller waiting for another's computation) and got it.
``lock_timed_out``
    A caller gave up after ``waited`` seconds.

``write_degraded``
    A write that could not reach memcached was given up on and its key
    repaired (``OPTIONS["on_outage"] = "degrade"``, the default): a set or list
    write (which returned 0; the set or list reads as incomplete until a
    loader rebuilds it), a namespace invalidation, a counter change, a
    ``mark_stale`` or a lock release.  ``key`` (the memcached key),
    ``command`` (``"sadd"``, ``"rpush"``, ``"invalidate_namespace"``...), ``error``.

``invalidation_failed``
    An ``invalidate_on_change`` receiver could not invalidate a namespace
    after a model change (also logged; the save itself succeeded).  The
    sender is the model class; ``target`` (what ``namespace`` returned for
    it), ``cache`` (the alias), ``error`` (the exception).
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

from .patterns.events import signals_by_event

node_dead = Signal()
node_revived = Signal()
value_refused = Signal()

recomputed = Signal()
stale_served = Signal()
compute_failed = Signal()
refresh_dropped = Signal()
lock_waited = Signal()
lock_timed_out = Signal()
write_degraded = Signal()

invalidation_failed = Signal()

_BY_EVENT: dict[type, Signal] = signals_by_event(globals())


def send_pattern_event(cache: Any, event: object) -> None:
    """Send the signal for a core event (the backends' ``_pattern_event`` hook)."""
    signal = _BY_EVENT.get(type(event))
    if signal is not None and signal.receivers:
        signal.send(sender=type(cache), cache=cache, **vars(event))
