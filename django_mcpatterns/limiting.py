"""Django glue for rate limits and exact counts: the ``ratelimit`` view decorator and
:class:`ModelCounter` (a model's row count kept in step through signals).

``@ratelimit("10/m", key="ip")`` answers ``429 Too Many Requests`` with a
``Retry-After`` header when the attempt is refused; with ``block=False`` the
view runs and reads ``request.ratelimited`` (and ``request.ratelimit``, the
:class:`~django_mcpatterns.core.ratelimit.Decision`).  Sync and async views.
See ``docs/ratelimit.md`` and ``docs/counters.md``.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.exceptions import ImproperlyConfigured
from django.db import models, router, transaction
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save
from django.http import HttpRequest, HttpResponse

from .core.counters import Change
from .core.ratelimit import Decision, FailMode, Rate, parse_rate
from .patterns.limits import Counter, LimitsMixin

__all__ = ["ModelCounter", "RateLimited", "ratelimit", "request_key"]

V = TypeVar("V", bound=Callable[..., Any])
KeySpec = str | Callable[[HttpRequest], object]


class RateLimited(HttpResponse):
    """The 429 answer of a refused attempt, with ``Retry-After`` in whole seconds."""

    status_code = 429

    def __init__(self, decision: Decision) -> None:
        super().__init__("Too many requests.\n", content_type="text/plain; charset=utf-8")
        self["Retry-After"] = str(max(1, math.ceil(decision.retry_after)))
        self.decision = decision


def request_key(request: HttpRequest, key: KeySpec) -> str:
    """Who the attempt is counted against: ``"ip"``, ``"user"``, ``"header:<name>"`` or a callable.

    ``"user"`` is the authenticated user's pk, and the client address for
    anonymous users (so they do not share one budget).  ``"ip"`` is
    ``REMOTE_ADDR``: behind a proxy, set it from the forwarded header first
    (or count by ``"header:X-Forwarded-For"``, if your proxy sets it).
    """
    if callable(key):
        return str(key(request))
    if key == "ip":
        return "ip:" + str(request.META.get("REMOTE_ADDR", ""))
    if key == "user":
        return _user_key(request, getattr(request, "user", None))
    if key.startswith("header:"):
        name = key[len("header:") :]
        return f"header:{name}:{request.headers.get(name, '')}"
    raise ImproperlyConfigured(
        f"ratelimit key {key!r} is not 'ip', 'user', 'header:<name>' or a callable"
    )


def _user_key(request: HttpRequest, user: Any) -> str:
    """The authenticated user's pk, else the client address (anonymous users apart)."""
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    return request_key(request, "ip")


def ratelimit(
    rate: str | Rate,
    key: KeySpec = "ip",
    *,
    block: bool = True,
    cache: str | LimitsMixin = DEFAULT_CACHE_ALIAS,
    cost: int = 1,
    group: str | None = None,
    fail: FailMode = "open",
    methods: tuple[str, ...] | None = None,
) -> Callable[[V], V]:
    """Limit a view to ``rate`` attempts per ``key``; refused attempts get a 429.

    ``group`` names the budget (default: the view's dotted name), so views
    can share one; ``methods`` limits only those (``("POST",)``: count form
    submissions, not page views); ``cache`` is an alias or a cache object.
    Every counted request carries ``request.ratelimit`` (the decision) and
    ``request.ratelimited``; with ``block=False`` the view always runs.
    """
    parse_rate(rate)  # a bad rate fails at import time, not on the first request

    def decorate(view: V) -> V:
        name = group or f"{view.__module__}.{view.__qualname__}"

        def limiter() -> LimitsMixin:
            found = caches[cache] if isinstance(cache, str) else cache
            if not hasattr(found, "ratelimit"):
                raise ImproperlyConfigured(
                    f"cache {cache!r} has no ratelimit: use a django_mcpatterns backend"
                )
            return cast(LimitsMixin, found)

        def counted(request: HttpRequest) -> str | None:
            if methods is not None and request.method not in methods:
                return None
            who = hashlib.blake2b(request_key(request, key).encode(), digest_size=12).hexdigest()
            return f"ratelimit:{name}:{who}"

        async def acounted(request: HttpRequest) -> str | None:
            if key == "user" and hasattr(request, "auser"):
                # request.user loads lazily from the database: SynchronousOnlyOperation here.
                if methods is not None and request.method not in methods:
                    return None
                who = _user_key(request, await request.auser())
                digest = hashlib.blake2b(who.encode(), digest_size=12).hexdigest()
                return f"ratelimit:{name}:{digest}"
            return counted(request)

        def answer(request: HttpRequest, decision: Decision) -> HttpResponse | None:
            request.ratelimit = decision  # type: ignore[attr-defined]
            request.ratelimited = not decision.allowed  # type: ignore[attr-defined]
            if block and not decision.allowed:
                return RateLimited(decision)
            return None

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                counter = await acounted(request)
                if counter is not None:
                    decision = await limiter().aratelimit(counter, rate, cost=cost, fail=fail)
                    refused = answer(request, decision)
                    if refused is not None:
                        return refused
                return await view(request, *args, **kwargs)

            return cast(V, async_wrapper)

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            counter = counted(request)
            if counter is not None:
                decision = limiter().ratelimit(counter, rate, cost=cost, fail=fail)
                refused = answer(request, decision)
                if refused is not None:
                    return refused
            return view(request, *args, **kwargs)

        return cast(V, wrapper)

    return decorate


class ModelCounter:
    """The number of rows of ``model`` (matching ``filters``), cached and kept in step.

    Saves and deletes of ``model`` instances enter a flight before their
    write (``pre_save``/``pre_delete``) and apply their delta when the
    transaction commits (``transaction.on_commit``), exactly as
    ``counter.change`` does around a write.  Bulk operations
    (``QuerySet.update``/``delete``, ``bulk_create``) send no per-row signal:
    call :meth:`invalidate` after them.  A write rolled back leaves its flight
    open: readers then load without caching until the flight record expires
    (``FLIGHT_TTL``); the count stays right.
    """

    def __init__(
        self,
        model: type[models.Model],
        *,
        cache: str | LimitsMixin = DEFAULT_CACHE_ALIAS,
        key: str | None = None,
        timeout: Any = None,
        **filters: Any,
    ) -> None:
        self.model = model
        self.filters = filters
        self.cache_alias = cache
        self.key = (
            key
            or f"count:{model._meta.label_lower}:"
            + hashlib.blake2b(repr(sorted(filters.items())).encode(), digest_size=8).hexdigest()
        )
        self.timeout = timeout
        uid = f"mcpatterns-count-{id(self)}"
        pre_save.connect(self._before_save, sender=model, weak=False, dispatch_uid=uid)
        post_save.connect(self._after_save, sender=model, weak=False, dispatch_uid=uid)
        pre_delete.connect(self._before_delete, sender=model, weak=False, dispatch_uid=uid)
        post_delete.connect(self._after_delete, sender=model, weak=False, dispatch_uid=uid)

    @property
    def counter(self) -> Counter:
        cache = caches[self.cache_alias] if isinstance(self.cache_alias, str) else self.cache_alias
        return cast(LimitsMixin, cache).counter(self.key, self._count, self.timeout)

    def get(self) -> int:
        """The row count (cached)."""
        return self.counter.get()

    async def aget(self) -> int:
        return await self.counter.aget()

    def invalidate(self) -> None:
        self.counter.invalidate()

    def disconnect(self) -> None:
        """Stop following the model's signals (tests, reloading)."""
        uid = f"mcpatterns-count-{id(self)}"
        for signal in (pre_save, post_save, pre_delete, post_delete):
            signal.disconnect(sender=self.model, dispatch_uid=uid)

    def _count(self) -> int:
        return self.model._default_manager.filter(**self.filters).count()

    def _matches(self, pk: Any, using: str) -> bool:
        if pk is None:
            return False
        manager = self.model._default_manager.using(using)
        return manager.filter(pk=pk, **self.filters).exists()

    def _open(self, instance: models.Model, using: str) -> None:
        if instance._state.adding:
            was = False
        else:  # an update may move the row into or out of the filter
            was = self._matches(instance.pk, using) if self.filters else True
        flights = instance.__dict__.setdefault("_mcpatterns_flights", {})
        change = self.counter.change(0)
        change.__enter__()
        flights[id(self)] = (change, was)

    def _close(self, instance: models.Model, using: str, now: bool) -> None:
        flights = instance.__dict__.get("_mcpatterns_flights", {})
        entry: tuple[Change, bool] | None = flights.pop(id(self), None)
        if entry is None:
            return
        change, was = entry
        change.delta = int(now) - int(was)

        def done() -> None:
            change.__exit__(None, None, None)

        transaction.on_commit(done, using=using)

    def _before_save(self, sender: Any, instance: models.Model, **kwargs: Any) -> None:
        self._open(instance, kwargs.get("using") or router.db_for_write(sender))

    def _after_save(self, sender: Any, instance: models.Model, **kwargs: Any) -> None:
        using = kwargs.get("using") or router.db_for_write(sender)
        self._close(instance, using, self._matches(instance.pk, using) if self.filters else True)

    def _before_delete(self, sender: Any, instance: models.Model, **kwargs: Any) -> None:
        self._open(instance, kwargs.get("using") or router.db_for_write(sender))

    def _after_delete(self, sender: Any, instance: models.Model, **kwargs: Any) -> None:
        self._close(instance, kwargs.get("using") or router.db_for_write(sender), False)
