"""The gutter pool: where a dead server's keys are served from meanwhile (sans-IO decisions).

``OPTIONS["failover"] = "gutter"`` with ``OPTIONS["gutter"]`` (a few spare
servers, their own ketama ring) follows Facebook's memcache paper: while a
server cannot be used its keys are read from and written to the gutter with
every TTL clamped to ``gutter_ttl`` (10 s by default), instead of missing (a herd
on the database) or moving onto live servers for good (``"remap"``: stale data
when the server returns).  A write sent to the gutter is recorded in the
cluster's :class:`~.replicas.Journal` for the dead server, which deletes those
keys before it serves again: a stalled server that comes back never serves
the value it had before the outage.

What goes to the gutter (:func:`allowed`)
    Plain keys' reads, ``set``, ``add``, ``cas``, ``delete``, ``touch`` and the
    meta equivalents: values, get_or_compute fills and its stampede tokens.
Never
    ``append``, ``prepend``, ``incr``, ``decr`` (in-place edits of items the
    gutter does not hold: sets, lists, counters, namespace versions fail as
    under ``"miss"``), namespaced (:class:`~.keys.Routed`) keys, and anything
    on the strict view (:meth:`Cluster.strict`, what every lock uses): a lock
    taken in the gutter by a process that thinks a server is dead could be
    taken again on that server by a process that sees it alive, so locks
    fail as under ``"miss"`` and are never held twice.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from ..protocol.meta import MetaArithmetic, MetaDelete, MetaGet, MetaSet
from ..protocol.wire import Incr, Request, Store, Touch
from ..store import MAX_RELATIVE_EXPIRE

__all__ = ["DEFAULT_GUTTER_TTL", "allowed", "clamp", "clamp_expire"]

DEFAULT_GUTTER_TTL = 10


def allowed(request: Request[Any] | tuple[Request[Any], ...]) -> bool:
    """Whether ``request`` (or every request of a batch) may go to the gutter."""
    if isinstance(request, tuple):
        return all(allowed(r) for r in request)
    if isinstance(request, Incr | MetaArithmetic):
        return False
    if isinstance(request, Store):
        return request.command not in ("append", "prepend")
    if isinstance(request, MetaSet):
        return request.mode not in ("A", "P")
    return True


def clamp_expire(expire: int | None, ttl: int, now: Callable[[], float] = time.time) -> int:
    """``expire`` (memcached's exptime) cut to at most ``ttl`` seconds from now.

    0 or None (never) becomes ``ttl``; an absolute Unix time (over 30 days) in
    the future becomes the shorter of its distance and ``ttl``; an expiry in
    the past stays as it is (the item is gone at once).
    """
    if not expire:
        return ttl
    if expire < 0:
        return expire
    if expire <= MAX_RELATIVE_EXPIRE:
        return min(expire, ttl)
    left = expire - now()
    return expire if left <= 0 else min(int(left) or 1, ttl)


def clamp(request: Request[Any], ttl: int) -> Request[Any]:
    """``request`` with every TTL it sets cut to ``ttl`` seconds (gutter items expire soon)."""
    if isinstance(request, Store):
        return dataclasses.replace(request, expire=clamp_expire(request.expire, ttl))
    if isinstance(request, Touch):
        return dataclasses.replace(request, expire=clamp_expire(request.expire, ttl))
    if isinstance(request, MetaSet):
        return dataclasses.replace(request, ttl=clamp_expire(request.ttl, ttl))
    if isinstance(request, MetaGet) and (request.vivify is not None or request.touch is not None):
        vivify, touch = request.vivify, request.touch  # N<ttl> and T<ttl> both set a TTL
        return dataclasses.replace(
            request,
            vivify=None if vivify is None else clamp_expire(vivify, ttl),
            touch=None if touch is None else clamp_expire(touch, ttl),
        )
    if isinstance(request, MetaDelete) and request.ttl is not None:
        return dataclasses.replace(request, ttl=clamp_expire(request.ttl, ttl))
    return request
