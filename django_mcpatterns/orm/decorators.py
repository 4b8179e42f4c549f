"""``cached_as``: cache a function's result for as long as the querysets it reads are unchanged."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from django.db import router
from django.db.models import Model, QuerySet

from django_mcpatterns.core import stamps

from .reads import Planned, Reader, reader
from .shape import Uncacheable, digest_of

__all__ = ["cached_as"]

P = ParamSpec("P")
R = TypeVar("R")
Sample = QuerySet[Any] | type[Model] | Model


def cached_as(
    *samples: Sample, timeout: int | None = None, extra: Any = None
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Cache the decorated function's result, keyed by its arguments, until a sample changes.

    ``samples``: querysets (the function's result depends on their rows), models
    (on their whole tables) or instances (on their rows).  ``extra``: more key
    material (a version).  Arguments must be values the key can be made of.
    """
    if not samples:
        raise TypeError("cached_as() needs at least one queryset, model or instance")
    for sample in samples:
        if not isinstance(sample, (QuerySet, Model)) and not (
            isinstance(sample, type) and issubclass(sample, Model)
        ):
            raise TypeError(
                f"cached_as() samples are querysets, models or instances, not {sample!r}"
            )

    def decorator(func: Callable[P, R]) -> Callable[P, R]:
        name = f"{func.__module__}.{func.__qualname__}"

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            read = reader()
            planned = _plan(read, samples, name, extra, args, kwargs)
            if planned is None:
                return func(*args, **kwargs)
            ttl = timeout or read.settings.timeout
            return read.fetch(planned, lambda: func(*args, **kwargs), ttl)

        return wrapper

    return decorator


def _plan(
    read: Reader, samples: tuple[Sample, ...], name: str, extra: Any, args: Any, kwargs: Any
) -> Planned | None:
    parts: list[Planned] = []
    for sample in samples:
        if isinstance(sample, QuerySet):
            planned = read.plan(sample.query, sample.db, "fetch", sample._iterable_class)
        else:
            model = sample if isinstance(sample, type) else type(sample)
            qs = model._default_manager.all()
            if isinstance(sample, Model):
                qs = qs.filter(pk=sample.pk)
            planned = read.plan(qs.query, router.db_for_read(model), "fetch")
        if planned is None:
            return None
        parts.append(planned)
    try:
        key = digest_of(
            name, extra, args, dict(sorted(kwargs.items())), [p.plan.key for p in parts]
        )
    except Uncacheable:
        return None
    stamp_keys = tuple(dict.fromkeys(k for p in parts for k in p.plan.stamps))
    schemes = tuple(dict.fromkeys(s for p in parts for s in p.plan.schemes))
    plan = stamps.Plan(f"{read.prefix}f:{key}", stamp_keys, schemes)
    tables = set().union(*(p.tables for p in parts))
    return Planned(plan, tables, parts[0].db, parts[0].label)
