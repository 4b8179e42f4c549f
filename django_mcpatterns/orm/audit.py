"""The consistency auditor: re-read a sample of cache hits from the database, off the request path.

With ``MCPATTERNS_ORM["audit"] = 0.01`` one hit in a hundred is queued to a
background thread that runs the query again and compares.  A difference that
the stamps do not explain (the cached result is still valid after the
re-read, and again a moment later, when any write's invalidation has
arrived) is a *stale hit*: counted (``stale``), logged, and sent as the
``orm_stale_hit`` signal.  The expected count is 0; anything else is a bug
report with its evidence.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import close_old_connections
from django.db.models import Model

from django_mcpatterns.core import stamps
from django_mcpatterns.core.refresh import RefreshQueueFull, RefreshRunner
from django_mcpatterns.core.store import Store

from ..core import chance
from . import observe
from .rows import unpack

__all__ = ["comparable", "run_inline", "sample"]

logger = logging.getLogger("django_mcpatterns.orm.audit")
GRACE = 0.05  # seconds a re-read waits for the invalidation of a write it may have seen

_runner: list[Callable[[Callable[[], object]], object] | None] = [None]


def run_inline(inline: bool) -> None:
    """Run audits in the caller's thread (tests), or in the background pool (default)."""
    _runner[0] = _call if inline else None


def _call(job: Callable[[], object]) -> object:
    return job()


def _background(job: Callable[[], object]) -> None:
    runner = _runner[0]
    if runner is None:
        _pool()(job)
    else:
        runner(job)


_pools: list[RefreshRunner] = []


def _pool() -> RefreshRunner:
    if not _pools:
        _pools.append(
            RefreshRunner(1, 20, after_job=close_old_connections, name="mcpatterns-orm-audit")
        )
    return _pools[0]


def sample(
    rate: float,
    store: Store,
    plan: stamps.Plan,
    label: str,
    cached: Any,
    compute: Callable[[], Any],
) -> None:
    """Maybe (at ``rate``) queue an audit of a hit of ``plan`` read from ``store``."""
    if rate <= 0 or chance.uniform() >= rate:
        return
    try:
        _background(lambda: _check(store, plan, label, cached, compute))
    except RefreshQueueFull:
        logger.debug("audit queue full; sample dropped")


def _check(
    store: Store, plan: stamps.Plan, label: str, cached: Any, compute: Callable[[], Any]
) -> None:
    fresh = compute()
    for pause in (0.0, GRACE):
        if pause:
            time.sleep(pause)
        if not stamps.read(store, plan).hit:
            return  # a write voided the result meanwhile: nothing to judge
    observe.record("audited", label)
    cached = unpack(cached)
    if comparable(fresh) != comparable(cached):
        observe.record("stale", label)
        logger.error("stale ORM cache hit for %s (%s)", label, plan.key)
        observe.orm_stale_hit.send(
            sender=None, model=label, key=plan.key, cached=cached, fresh=fresh
        )


def comparable(value: Any) -> Any:
    """``value`` as plain data: model instances as their label, pk, fields and related rows."""
    if isinstance(value, Model):
        fields = tuple(
            sorted(
                (name, comparable(item))
                for name, item in value.__dict__.items()
                if not name.startswith("_")
            )
        )
        related = tuple(
            sorted((name, comparable(item)) for name, item in value._state.fields_cache.items())
        )
        return (value._meta.label, fields, related)
    if isinstance(value, (list, tuple)):
        return tuple(comparable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((key, comparable(item)) for key, item in value.items()))
    return value
