"""The page flow of :func:`~django_mcpatterns.decorators.stampede_guard`, written once.

This asyncio source serves ``async def`` views; ``django_mcpatterns/_sync/page_guard.py``,
generated from it by ``scripts/generate_sync.py``, serves sync views.  The cache
calls go through :class:`~django_mcpatterns.page_rules.AsyncPageCache` (the
backend's ``a``-methods) or its sync twin :class:`~django_mcpatterns.page_rules.PageCache`;
what needs no I/O is in :mod:`django_mcpatterns.page_rules`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponseBase
from django.utils.cache import get_cache_key, learn_cache_key

from django_mcpatterns.core.concurrency import async_call
from django_mcpatterns.core.exceptions import EncodingError
from django_mcpatterns.page_rules import (
    CACHED_METHODS,
    AsyncPageCache,
    PageGuard,
    inline_policy,
    page_of,
    prepare,
    replay,
)
from django_mcpatterns.patterns.pages import PASS, CachedPage


class AsyncHeaderLists:
    """Stands in for the cache in ``get_cache_key`` and ``learn_cache_key``.

    Those helpers keep, under a per-URL key, the list of request headers the
    page varies on.  They call ``get`` and ``set`` synchronously, so here
    ``get`` never does I/O: it records the key asked for and answers from what
    :meth:`page_key` read before (once per request).  Writes are only
    recorded: the page must be stored *before* its header list, or a request
    that waited for the header list could find no page and render it a second
    time.  No ``BaseCache`` (hence the ``arg-type`` ignores).
    """

    def __init__(self, cache: AsyncPageCache) -> None:
        self._cache = cache
        self._read: dict[str, Any] = {}
        self.key: str | None = None  # the URL's header-list key, once a helper used it
        self.learned: list[str] | None = None

    def get(self, key: str, default: Any = None) -> Any:
        self.key = key
        found = self._read.get(key)
        return default if found is None else found

    def set(self, key: str, value: list[str], timeout: Any = None) -> None:
        self.key, self.learned = key, value

    async def page_key(self, request: HttpRequest, prefix: str, method: str) -> str | None:
        """The key of the page ``request`` gets, or None when its URL's header list is unknown."""
        key = get_cache_key(request, prefix, method, cache=self)  # type: ignore[arg-type]
        if self.key is not None and self.key not in self._read:
            self._read[self.key] = await self._cache.get(self.key)
            key = get_cache_key(request, prefix, method, cache=self)  # type: ignore[arg-type]
        return key

    def remember(self, value: Any) -> None:
        """Take ``value`` as the header list read from the cache."""
        assert self.key is not None
        self._read[self.key] = value

    async def store(self, timeout: int) -> None:
        """Store the learned header list for ``timeout`` seconds."""
        assert self.key is not None
        await self._cache.set(self.key, self.learned, timeout)


class AsyncPageRequest:
    """One GET or HEAD request through :func:`stampede_guard`.

    The page lives under the key ``get_cache_key`` gives, once the URL's header
    list is known.  Before that (the URL's first request, or after the cache
    lost it) nobody knows the key: the requests then share one computation
    through ``get_or_compute`` on the header-list key itself, whose winner
    renders the view and stores the page, then the header list.
    """

    def __init__(
        self,
        guard: PageGuard,
        view: Callable[..., Any],
        request: HttpRequest,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.guard = guard
        self.view = view
        self.request = request
        self.args = args
        self.kwargs = kwargs
        backend = guard.cache()
        self.cache = AsyncPageCache(backend)
        self.timeout = guard.page_timeout()
        self.policy = inline_policy(backend, guard.policy)
        # The header list must outlive the stale page it leads to (by a second:
        # memcached's clock ticks in whole seconds).
        self.lifetime = self.timeout + math.ceil(self.policy.grace_for(self.timeout)) + 1
        self.header_lists = AsyncHeaderLists(self.cache)
        self.produced: HttpResponseBase | None = None  # the response this request rendered
        self.relearned = False

    async def respond(self) -> HttpResponseBase:
        if not self.timeout:  # cache_page(0): the headers, nothing stored
            return await self._render_uncached()
        if self.request.method == "HEAD":
            # As Django's cache middleware: a HEAD is answered from the GET page.
            get_key = await self._page_key("GET")
            page = await self.cache.get(get_key) if get_key is not None else None
            if isinstance(page, CachedPage):
                return replay(page)
        method = self.request.method
        assert method in CACHED_METHODS  # the guard sends other methods to the view
        key = await self._page_key(method)
        if key is None:
            await self._learn_url()
            if self.produced is not None:
                return self.produced
            key = await self._page_key(method)
        if key is None:  # the header list vanished again (evicted)
            return await self._render_uncached()
        value = await self.cache.get_or_compute(
            key, functools.partial(self._compute, key), self.timeout, self.policy
        )
        if self.produced is not None:
            if self.relearned:
                await self.header_lists.store(self.lifetime)  # after the page: see HeaderLists
            return self.produced
        if value is PASS:
            return await self._render_uncached()  # hit-for-pass: render in parallel
        if not isinstance(value, CachedPage):
            raise EncodingError(
                f"cache key {key!r} holds a {type(value).__qualname__}, not a page "
                "stored by stampede_guard; give the view a key_prefix of its own"
            )
        return replay(value)

    # -- computations --

    async def _compute(self, key: str) -> CachedPage | Any:
        """Render the page stored under ``key`` (PASS if it must not be cached there)."""
        response = await self._render()
        cacheable = prepare(self.guard, self.request, response, self.timeout)
        moved = self._learn(response) != key
        self.relearned = True
        # A changed Vary header moves the page to another key: the next request
        # computes it there; requests still on the old key render in parallel.
        return page_of(response) if cacheable and not moved else PASS

    async def _learn_url(self) -> None:
        """The URL's header list is unknown: one request renders, the others wait for it."""
        assert self.header_lists.key is not None
        value = await self.cache.get_or_compute(
            self.header_lists.key,
            self._compute_first,
            self.lifetime,
            dataclasses.replace(self.policy, grace=0),
        )
        self.header_lists.remember(value)

    async def _compute_first(self) -> list[str] | None:
        """Render, store the page where it belongs; return the URL's header list."""
        response = await self._render()
        cacheable = prepare(self.guard, self.request, response, self.timeout)
        key = self._learn(response)

        async def page() -> Any:
            return page_of(response) if cacheable else PASS

        # Stored without a "recomputed" signal: this computation is already
        # signalled under the header-list key.
        await self.cache.recompute_quietly(key, page, self.timeout, self.policy)
        return self.header_lists.learned

    # -- steps --

    async def _page_key(self, method: str) -> str | None:
        return await self.header_lists.page_key(self.request, self.guard.prefix, method)

    def _learn(self, response: HttpResponseBase) -> str:
        """The key of ``response``'s page; its header list is recorded, not stored."""
        return learn_cache_key(
            self.request,
            response,
            self.lifetime,
            self.guard.prefix,
            cache=self.header_lists,  # type: ignore[arg-type]
        )

    async def _render(self) -> HttpResponseBase:
        response: HttpResponseBase = await self.view(self.request, *self.args, **self.kwargs)
        render = getattr(response, "render", None)
        if callable(render):
            # A TemplateResponse: cache its content, not its template.  Rendering
            # may touch the ORM (lazy querysets), so in async it runs as Django's
            # handler runs it, through sync_to_async: the user's code.
            response = await async_call(render)
        self.produced = response
        return response

    async def _render_uncached(self) -> HttpResponseBase:
        """Render with the headers caching would give, and store nothing."""
        response = await self._render()
        prepare(self.guard, self.request, response, self.timeout)
        return response


# -- the decorated view's helpers --


async def invalidate_page(guard: PageGuard, request: HttpRequest) -> bool:
    """Delete the GET and HEAD pages ``request`` gets; return whether one was there."""
    cache = AsyncPageCache(guard.cache())
    header_lists = AsyncHeaderLists(cache)  # one read of the URL's header list
    deleted = False
    for method in CACHED_METHODS:
        key = await header_lists.page_key(request, guard.prefix, method)
        if key is not None:
            deleted = await cache.delete(key) or deleted
    return deleted


async def mark_page_stale(guard: PageGuard, request: HttpRequest) -> bool:
    """Make the page ``request`` gets stale: the next request re-renders it while the
    others are served it.  Return False when no page was cached."""
    cache = AsyncPageCache(guard.cache())
    key = await AsyncHeaderLists(cache).page_key(request, guard.prefix, "GET")
    return key is not None and await cache.mark_stale(key)
