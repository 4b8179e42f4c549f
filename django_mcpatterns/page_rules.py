"""What :func:`~django_mcpatterns.decorators.stampede_guard` decides without I/O.

Which responses may be cached and the headers they get (the rules of
Django's cache middleware), how a page is stored and replayed, and the pair
of adapters through which the page flow (``_async/page_guard.py``, written
once; its sync form generated) reaches the cache: :class:`PageCache` calls the
sync API, :class:`AsyncPageCache` awaits the ``a``-prefixed one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.cache import (
    get_max_age,
    has_vary_header,
    patch_response_headers,
    patch_vary_headers,
)
from django.utils.http import parse_http_date_safe

from .core.exceptions import ConfigurationError
from .core.stampede import AsyncStampede, Stampede, StampedePolicy
from .patterns.pages import CachedPage
from .patterns.stampede import soft_timeout

if TYPE_CHECKING:
    from .backend import StoreCache

CACHED_METHODS = ("GET", "HEAD")
_PRIVATE_DIRECTIVES = ("private", "no-cache", "no-store")


def patterns_cache(alias: str) -> StoreCache:
    """``caches[alias]``, which must be a django-mcpatterns backend (it has ``get_or_compute``)."""
    cache = caches[alias]
    if not hasattr(cache, "get_or_compute_result"):
        raise ImproperlyConfigured(
            f"cache {alias!r} ({type(cache).__module__}.{type(cache).__qualname__}) has no "
            "stampede protection: use django_mcpatterns.backend.KetamaMemcacheCache or "
            "LocMemPatternsCache"
        )
    return cast("StoreCache", cache)


def refuse_runner(policy: StampedePolicy | None, user: str) -> None:
    """Refuse a background ``runner`` where the computation needs the request it runs in."""
    if policy is not None and policy.runner is not None:
        raise ConfigurationError(
            f"{user} renders in the request: a policy with a background runner is not supported",
            option="policy",
        )


def inline_policy(cache: Any, policy: StampedePolicy | None) -> StampedePolicy:
    """``policy``, or the cache's own ``stampede_policy`` without its background runner."""
    if policy is not None:
        return policy
    default: StampedePolicy = cache.stampede_policy
    return default if default.runner is None else dataclasses.replace(default, runner=None)


@dataclasses.dataclass(frozen=True)
class PageGuard:
    """One ``stampede_guard(...)`` configuration (no per-request state: thread-safe)."""

    timeout: int | None
    alias: str
    prefix: str
    policy: StampedePolicy | None

    def cache(self) -> Any:
        return patterns_cache(self.alias)

    def page_timeout(self) -> int:
        return settings.CACHE_MIDDLEWARE_SECONDS if self.timeout is None else self.timeout


def prepare(
    guard: PageGuard, request: HttpRequest, response: HttpResponseBase, timeout: int
) -> bool:
    """Add the caching headers where Django's cache middleware does; return whether the
    response may be cached (UpdateCacheMiddleware.process_response's rules)."""
    if response.streaming or response.status_code not in (200, 304):
        return False
    # Django refuses cookies only with "Vary: Cookie"; any cookie belongs to
    # one visitor, and a cached copy would hand it to everyone.
    if response.cookies:
        return False
    cache_control = response.get("Cache-Control", "").lower()
    if any(directive in cache_control for directive in _PRIVATE_DIRECTIVES):
        return False
    if has_vary_header(response, "*"):
        return False
    if guard.timeout is None and get_max_age(response) == 0:
        return False  # as cache_page(None): "max-age=0" means do not cache
    patch_response_headers(response, timeout)
    # RFC 9111 section 3.5: a response to a request with credentials is
    # shared only if it says "public".
    if request.headers.get("Authorization") and "public" not in cache_control:
        patch_vary_headers(response, ("Authorization",))
    return response.status_code == 200


def page_of(response: HttpResponseBase) -> CachedPage:
    assert isinstance(response, HttpResponse)
    return CachedPage(response.status_code, tuple(response.items()), response.content)


def replay(page: CachedPage) -> HttpResponse:
    """A response from a cached page, with its ``Age`` as Django's cache middleware sets it."""
    response = HttpResponse(page.body, status=page.status, headers=dict(page.headers))
    max_age = get_max_age(response)
    expires = parse_http_date_safe(response.get("Expires", ""))
    if max_age is not None and expires is not None:
        # A stale page is older than its max-age: downstream caches see it stale.
        response["Age"] = max(0, max_age - (expires - int(time.time())))
    return response


# -- the cache calls of the page flow, in a sync and an async form ---------------------


class PageCache:
    """The cache calls of the page flow, through the backend's sync API."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def get(self, key: str) -> Any:
        return self.backend.get(key)

    def set(self, key: str, value: Any, timeout: int) -> None:
        self.backend.set(key, value, timeout)

    def delete(self, key: str) -> bool:
        return bool(self.backend.delete(key))

    def mark_stale(self, key: str) -> bool:
        return bool(self.backend.mark_stale(key))

    def get_or_compute(
        self, key: str, compute: Callable[[], Any], timeout: int, policy: StampedePolicy
    ) -> Any:
        return self.backend.get_or_compute(key, compute, timeout, policy=policy)

    def recompute_quietly(
        self, key: str, compute: Callable[[], Any], timeout: int, policy: StampedePolicy
    ) -> None:
        """Store ``compute()`` under ``key`` for ``get_or_compute`` readers, with no
        "recomputed" signal (the computation is signalled under another key)."""
        backend = self.backend
        soft = soft_timeout(backend._pattern_expire(timeout), time.time())
        Stampede(backend.pattern_store, policy).recompute(backend._pattern_key(key), compute, soft)


class AsyncPageCache:
    """:class:`PageCache` through the backend's async API: nothing blocks the loop."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    async def get(self, key: str) -> Any:
        return await self.backend.aget(key)

    async def set(self, key: str, value: Any, timeout: int) -> None:
        await self.backend.aset(key, value, timeout)

    async def delete(self, key: str) -> bool:
        return bool(await self.backend.adelete(key))

    async def mark_stale(self, key: str) -> bool:
        return bool(await self.backend.amark_stale(key))

    async def get_or_compute(
        self, key: str, compute: Callable[[], Any], timeout: int, policy: StampedePolicy
    ) -> Any:
        return await self.backend.aget_or_compute(key, compute, timeout, policy=policy)

    async def recompute_quietly(
        self, key: str, compute: Callable[[], Any], timeout: int, policy: StampedePolicy
    ) -> None:
        backend = self.backend
        soft = soft_timeout(backend._pattern_expire(timeout), time.time())
        await AsyncStampede(backend.apattern_store, policy).recompute(
            backend._pattern_key(key), compute, soft
        )
