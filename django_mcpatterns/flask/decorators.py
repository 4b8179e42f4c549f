"""Flask view decorators: page caching with stampede protection, optionally namespaced.

``@cache.cached`` (Flask-Caching) lets every worker recompute an expired page
at once.  :func:`stampede_guard` caches the page with ``get_or_compute``
instead: after ``timeout`` one request recomputes it while the others are
served the stale page, and on a cold miss the others wait for that one
request's page rather than all running the view.

The page is cached as a :class:`CachedPage` (status, headers, body), not a
pickled ``Response``, and only when ``should_cache(response)`` says so (by
default: a 200 that sets no cookie).  Only ``GET`` and ``HEAD`` are cached.

With ``namespace=`` the pages live in ``cache.cache.namespace(*parts)``
(:mod:`django_mcpatterns.patterns.namespaces`): one ``incr`` drops every page
of the namespace (every path and query variant) in every process, and a fresh
read stays one request.  ``namespace=`` takes what Django's ``cached`` takes
(:func:`~django_mcpatterns.patterns.namespaces.namespace_parts`), called with
the view's arguments.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlencode

from flask import Response, current_app, make_response, request
from flask_caching import Cache
from werkzeug.datastructures import MultiDict

from ..core.exceptions import ConfigurationError, InvalidKeyError
from ..core.stampede import StampedePolicy
from ..patterns import pages
from ..patterns.namespaces import CacheNamespace, NamespaceArg, namespace_parts

if TYPE_CHECKING:
    from .backend import PatternsCache

__all__ = ["CachedPage", "cacheable", "stampede_guard"]

logger = logging.getLogger("django_mcpatterns.flask")

F = TypeVar("F", bound=Callable[..., Any])
Query = Mapping[str, Any] | MultiDict[str, Any] | None

_CACHED_METHODS = frozenset({"GET", "HEAD"})


class CachedPage(pages.CachedPage):
    """A response as stored (:class:`django_mcpatterns.patterns.pages.CachedPage`), from and to
    Flask responses."""

    __slots__ = ()

    @classmethod
    def of(cls, response: Response) -> CachedPage:
        return cls(response.status_code, tuple(response.headers.items()), response.get_data())

    def response(self) -> Response:
        return Response(self.body, status=self.status, headers=list(self.headers))


def cacheable(response: Response) -> bool:
    """Cache a 200 that sets no cookie: a cookie belongs to one visitor, not to the page."""
    return response.status_code == 200 and "Set-Cookie" not in response.headers


def stampede_guard(
    cache: Cache,
    timeout: int | datetime.timedelta | None = None,
    *,
    key: str = "view/%s",
    query_string: bool = False,
    namespace: NamespaceArg | None = None,
    policy: StampedePolicy | None = None,
    should_cache: Callable[[Response], bool] = cacheable,
) -> Callable[[F], F]:
    """Cache a view's page with soft expiry after ``timeout`` (Flask-Caching's convention).

    ``cache`` is the Flask-Caching :class:`~flask_caching.Cache` whose backend
    is one of ours.  ``timeout``: ``None`` is ``CACHE_DEFAULT_TIMEOUT``, ``0``
    never goes stale.  ``key`` is formatted with the request path; with
    ``query_string`` the sorted query arguments are part of the key (as a
    digest).  ``policy`` tunes the grace period, waits and early
    recomputation (:class:`~django_mcpatterns.core.stampede.StampedePolicy`).

    ``namespace``: the parts of a ``cache.cache.namespace(*parts)`` (a tuple,
    or one ``str``/``int``), or a callable taking the view's arguments (the URL
    variables, as keywords) and returning them; the pages then live in that
    namespace and are dropped with it.

    The decorated view carries ``.key(path, query=None)``,
    ``.invalidate(path, query=None, **view_kwargs)`` (delete the page; the
    keywords name its namespace), ``.original`` and, without a namespace,
    ``.mark_stale(path, query=None)`` (the next request recomputes the page
    while the others are still served it), with one,
    ``.invalidate_namespace(**view_kwargs)`` (drop every page of the
    namespace those view arguments name; return its new version).  All but
    ``.key`` need an application context.
    """

    if policy is not None and policy.runner is not None:
        # A view needs its request: it cannot be rendered later on another thread.
        raise ConfigurationError(
            "stampede_guard renders pages in the request: a policy with a runner is not supported",
            option="policy",
        )

    def cache_key(path: str, query: Query = None) -> str:
        made = key % path
        if query_string:
            pairs = sorted(MultiDict(query or {}).items(multi=True))
            digest = hashlib.md5(urlencode(pairs).encode(), usedforsecurity=False).hexdigest()
            made = f"{made}?{digest}"
        return made

    def pages_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> PatternsCache | CacheNamespace:
        """Where a call's pages live: the backend, or the namespace ``namespace`` names."""
        backend = _backend(cache)
        if namespace is None:
            return backend
        return backend.namespace(*namespace_parts(namespace, *args, **kwargs))

    def decorator(view: F) -> F:
        # An ``async def`` view is run as Flask runs it, and as Flask-Caching's
        # cached/memoize run one: through ``app.ensure_sync`` (asgiref's
        # async_to_sync, an event loop for this call).  The guard itself stays
        # sync: Flask is WSGI, and Flask-Caching's backend API has no async form.
        run = _ensure_sync(view)

        @functools.wraps(view)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if request.method not in _CACHED_METHODS:
                return run(*args, **kwargs)
            where = pages_of(args, kwargs)
            made = cache_key(request.path, request.args)
            try:
                _validate_key(where, made)
            except InvalidKeyError as exc:
                logger.warning("page not cached: %s", exc)
                return run(*args, **kwargs)
            produced: list[Response] = []

            def render() -> CachedPage:
                response = make_response(run(*args, **kwargs))
                produced.append(response)
                return CachedPage.of(response)

            page = where.get_or_compute(
                made,
                render,
                timeout,
                policy=policy or dataclasses.replace(_backend(cache).stampede_policy, runner=None),
                should_cache=lambda _page: should_cache(produced[-1]),
            )
            # The request that ran the view returns its own response object.
            return produced[-1] if produced else page.response()

        def invalidate(path: str, query: Query = None, /, **view_kwargs: Any) -> bool:
            return bool(pages_of((), view_kwargs).delete(cache_key(path, query)))

        def mark_stale(path: str, query: Query = None) -> bool:
            return _backend(cache).mark_stale(cache_key(path, query))

        def invalidate_namespace(**view_kwargs: Any) -> int:
            where = pages_of((), view_kwargs)
            assert isinstance(where, CacheNamespace)  # the helper of namespaced views only
            return where.invalidate()

        helpers: dict[str, Any] = {"key": cache_key, "invalidate": invalidate, "original": view}
        if namespace is None:
            helpers["mark_stale"] = mark_stale
        else:
            # A namespaced page has no mark_stale: the namespace's keys are
            # written through the namespace only (core/namespaces.py, _Slot).
            helpers["invalidate_namespace"] = invalidate_namespace
        for name, helper in helpers.items():
            setattr(guarded, name, helper)
        return guarded  # type: ignore[return-value]

    return decorator


def _ensure_sync(view: Callable[..., Any]) -> Callable[..., Any]:
    """``view``, callable from sync code: an ``async def`` one through the app's ``ensure_sync``."""
    if not inspect.iscoroutinefunction(view):
        return view

    def run(*args: Any, **kwargs: Any) -> Any:
        return current_app.ensure_sync(view)(*args, **kwargs)

    return run


def _backend(cache: Cache) -> PatternsCache:
    """``cache.cache``: one of our backends, where Flask-Caching's annotation says SimpleCache."""
    return cast("PatternsCache", cache.cache)


def _validate_key(where: PatternsCache | CacheNamespace, key: str) -> None:
    """Raise InvalidKeyError when memcached would refuse the key of ``key`` in ``where``."""
    if isinstance(where, CacheNamespace):
        where.validate_key(key)
    else:
        where._pattern_key(key)
