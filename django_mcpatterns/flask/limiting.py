"""``@ratelimit(cache, "10/m", key="ip")`` for Flask views: 429 with ``Retry-After`` when refused.

The limiter is ``cache.cache.ratelimit`` (:mod:`django_mcpatterns.patterns.limits`:
a slotted sliding window, one round trip per admitted attempt).  With
``block=False`` the view runs and reads ``flask.g.ratelimited`` and
``flask.g.ratelimit`` (the decision).  See ``docs/ratelimit.md``.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

from flask import Request, Response, g, request
from flask_caching import Cache

from ..core.exceptions import ConfigurationError
from ..core.ratelimit import Decision, FailMode, Rate, parse_rate
from ..patterns.limits import LimitsMixin

__all__ = ["ratelimit", "request_key"]

F = TypeVar("F", bound=Callable[..., Any])
KeySpec = str | Callable[[Request], object]


def request_key(current: Request, key: KeySpec) -> str:
    """``"ip"`` (``remote_addr``), ``"header:<name>"`` or a callable taking the request."""
    if callable(key):
        return str(key(current))
    if key == "ip":
        return f"ip:{current.remote_addr or ''}"
    if key.startswith("header:"):
        name = key[len("header:") :]
        return f"header:{name}:{current.headers.get(name, '')}"
    raise ConfigurationError(
        f"ratelimit key {key!r} is not 'ip', 'header:<name>' or a callable", option="key"
    )


def too_many(decision: Decision) -> Response:
    """The 429 answer, with ``Retry-After`` in whole seconds."""
    response = Response("Too many requests.\n", status=429, mimetype="text/plain")
    response.headers["Retry-After"] = str(max(1, math.ceil(decision.retry_after)))
    return response


def ratelimit(
    cache: Cache,
    rate: str | Rate,
    *,
    key: KeySpec = "ip",
    block: bool = True,
    cost: int = 1,
    group: str | None = None,
    fail: FailMode = "open",
    methods: tuple[str, ...] | None = None,
) -> Callable[[F], F]:
    """Limit a view to ``rate`` attempts per ``key`` (see the Django ``ratelimit``)."""
    parse_rate(rate)

    def decorate(view: F) -> F:
        name = group or f"{view.__module__}.{view.__qualname__}"

        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if methods is None or request.method in methods:
                who = request_key(request, key).encode()
                digest = hashlib.blake2b(who, digest_size=12).hexdigest()
                backend = cast(LimitsMixin, cache.cache)
                decision = backend.ratelimit(
                    f"ratelimit:{name}:{digest}", rate, cost=cost, fail=fail
                )
                g.ratelimit = decision
                g.ratelimited = not decision.allowed
                if block and not decision.allowed:
                    return too_many(decision)
            return view(*args, **kwargs)

        return cast(F, wrapper)

    return decorate
