"""Django decorators with stampede protection: :func:`stampede_guard` for views, :func:`cached`
for functions and methods.

Both are built on ``cache.get_or_compute`` (:mod:`django_mcpatterns.core.stampede`):
after ``timeout`` a value is *stale*; one caller recomputes it while every
other caller is served the stale value at once, and on a miss one caller
computes while the others wait for its value.  Recomputations, stale values
served, failures and waits reach the signals of :mod:`django_mcpatterns.signals`
through the backend.  See ``docs/stampede.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.cache import (
    get_cache_key,
    get_max_age,
    has_vary_header,
    learn_cache_key,
    patch_response_headers,
    patch_vary_headers,
)
from django.utils.http import parse_http_date_safe

from .core.exceptions import ConfigurationError, EncodingError
from .core.stampede import Fetched, Stampede, StampedePolicy
from .limiting import ratelimit
from .patterns.callkeys import call_key
from .patterns.namespaces import NamespaceArg, namespace_parts
from .patterns.pages import PASS, CachedPage
from .patterns.stampede import soft_timeout

if TYPE_CHECKING:
    from .backend import _StoreCache

__all__ = ["CachedFunction", "cached", "ratelimit", "stampede_guard"]

V = TypeVar("V", bound=Callable[..., HttpResponseBase])
F = TypeVar("F", bound=Callable[..., Any])

_CACHED_METHODS = ("GET", "HEAD")
_PRIVATE_DIRECTIVES = ("private", "no-cache", "no-store")
PAGE_KEY_PREFIX = "mcpatterns"


# -- shared ---------------------------------------------------------------------------


def patterns_cache(alias: str) -> _StoreCache:
    """``caches[alias]``, which must be a django-mcpatterns backend (it has ``get_or_compute``)."""
    cache = caches[alias]
    if not hasattr(cache, "get_or_compute_result"):
        raise ImproperlyConfigured(
            f"cache {alias!r} ({type(cache).__module__}.{type(cache).__qualname__}) has no "
            "stampede protection: use django_mcpatterns.backend.KetamaMemcacheCache or "
            "LocMemPatternsCache"
        )
    return cast("_StoreCache", cache)


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


# -- views: stampede_guard --------------------------------------------------------------


def stampede_guard(
    timeout: int | None = None,
    *,
    cache: str = DEFAULT_CACHE_ALIAS,
    key_prefix: str | None = None,
    policy: StampedePolicy | None = None,
) -> Callable[[V], V]:
    """Cache a view's pages like Django's ``cache_page``, with soft expiry.

    ``timeout`` is the page's soft expiry in seconds (``None``: the
    ``CACHE_MIDDLEWARE_SECONDS`` setting, as ``cache_page(None)``); after it
    one request re-renders the page while the others are served the stale
    page, which the cache keeps ``policy.grace`` seconds longer.  ``cache`` is
    the alias of a django-mcpatterns cache; ``policy`` a
    :class:`~django_mcpatterns.core.stampede.StampedePolicy` (grace period, how
    long requests wait on a cold page, early recomputation; no ``runner``).

    As ``cache_page``: only GET and HEAD are cached, keys come from
    ``django.utils.cache`` (per URL, honouring ``Vary``, the language and time
    zone), a response is cached only if it is a 200, not streaming, not
    ``Cache-Control: private``/``no-cache``/``no-store`` and not ``Vary: *``,
    and cached responses get ``Expires`` and ``Cache-Control: max-age``; a
    served copy gets ``Age``.  Stricter: a response that sets any cookie is
    never cached.  Template responses are rendered before they are cached.

    The view gets ``.key(request, method="GET")`` (the cache key of the page
    this request gets, ``None`` before the URL was first cached),
    ``.invalidate(request)`` (drop it), ``.mark_stale(request)`` (the next
    request re-renders it while the others are still served it) and
    ``.original``.
    """
    if timeout is not None and (type(timeout) is not int or timeout < 0):
        raise ConfigurationError(
            f"stampede_guard timeout must be whole seconds >= 0 or None, not {timeout!r}",
            option="timeout",
        )
    refuse_runner(policy, "stampede_guard")
    guard = _PageGuard(timeout, cache, _page_prefix(key_prefix), policy)

    def decorator(view: V) -> V:
        if iscoroutinefunction(view):
            raise TypeError("stampede_guard decorates synchronous views only")

        @functools.wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not hasattr(request, "META"):
                raise TypeError(
                    "stampede_guard didn't receive an HttpRequest. If you are decorating "
                    "a method, use django.utils.decorators.method_decorator."
                )
            if request.method not in _CACHED_METHODS:
                return view(request, *args, **kwargs)
            return _PageRequest(guard, view, request, args, kwargs).respond()

        helpers = {
            "key": guard.key,
            "invalidate": guard.invalidate,
            "mark_stale": guard.mark_stale,
            "original": view,
        }
        for name, helper in helpers.items():
            setattr(guarded, name, helper)
        return guarded  # type: ignore[return-value]

    return decorator


def _page_prefix(key_prefix: str | None) -> str:
    # Our own prefix: cache_page and Django's cache middleware store pickled
    # HttpResponse objects under the same key scheme; sharing their keys would
    # hand each other values of the wrong kind.
    return PAGE_KEY_PREFIX if not key_prefix else f"{PAGE_KEY_PREFIX}.{key_prefix}"


@dataclasses.dataclass(frozen=True)
class _PageGuard:
    """One ``stampede_guard(...)`` configuration (no per-request state: thread-safe)."""

    timeout: int | None
    alias: str
    prefix: str
    policy: StampedePolicy | None

    def cache(self) -> Any:
        return patterns_cache(self.alias)

    def page_timeout(self) -> int:
        return settings.CACHE_MIDDLEWARE_SECONDS if self.timeout is None else self.timeout

    def key(self, request: HttpRequest, method: str = "GET") -> str | None:
        """The key of the page ``request`` gets, or None when its URL was never cached."""
        return get_cache_key(request, self.prefix, method, cache=self.cache())

    def invalidate(self, request: HttpRequest) -> bool:
        """Delete the GET and HEAD pages ``request`` gets; return whether one was there."""
        cache = self.cache()
        header_lists = _HeaderLists(cache)
        keys = [get_cache_key(request, self.prefix, m, cache=header_lists) for m in _CACHED_METHODS]  # type: ignore[arg-type]
        deleted = [cache.delete(k) for k in keys if k is not None]
        return any(deleted)

    def mark_stale(self, request: HttpRequest) -> bool:
        """Make the page ``request`` gets stale: the next request re-renders it while the
        others are served it.  Return False when no page was cached."""
        key = self.key(request)
        return key is not None and bool(self.cache().mark_stale(key))


class _HeaderLists:
    """Stands in for the cache in ``get_cache_key`` and ``learn_cache_key``.

    Those helpers keep, under a per-URL key, the list of request headers the
    page varies on.  Through this object, reads go to the cache once per
    request, and writes are only recorded: the page must be stored *before*
    its header list, or a request that waited for the header list could find
    no page and render it a second time.  The helpers call only ``get`` and
    ``set``, so it is no ``BaseCache`` (hence the ``arg-type`` ignores).
    """

    def __init__(self, cache: Any) -> None:
        self._cache = cache
        self._read: dict[str, Any] = {}
        self.key: str | None = None  # the URL's header-list key, once a helper used it
        self.learned: list[str] | None = None

    def get(self, key: str, default: Any = None) -> Any:
        self.key = key
        if key not in self._read:
            self._read[key] = self._cache.get(key)
        found = self._read[key]
        return default if found is None else found

    def set(self, key: str, value: list[str], timeout: Any = None) -> None:
        self.key, self.learned = key, value

    def remember(self, value: Any) -> None:
        """Take ``value`` as the header list read from the cache."""
        assert self.key is not None
        self._read[self.key] = value

    def store(self, timeout: int) -> None:
        """Store the learned header list for ``timeout`` seconds."""
        self._cache.set(self.key, self.learned, timeout)


class _PageRequest:
    """One GET or HEAD request through :func:`stampede_guard`.

    The page lives under the key ``get_cache_key`` gives, once the URL's header
    list is known.  Before that (the URL's first request, or after the cache
    lost it) nobody knows the key: the requests then share one computation
    through ``get_or_compute`` on the header-list key itself, whose winner
    renders the view and stores the page, then the header list.
    """

    def __init__(
        self,
        guard: _PageGuard,
        view: Callable[..., HttpResponseBase],
        request: HttpRequest,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.guard = guard
        self.view = view
        self.request = request
        self.args = args
        self.kwargs = kwargs
        self.cache = guard.cache()
        self.timeout = guard.page_timeout()
        self.policy = inline_policy(self.cache, guard.policy)
        # The header list must outlive the stale page it leads to (by a second:
        # memcached's clock ticks in whole seconds).
        self.lifetime = self.timeout + math.ceil(self.policy.grace_for(self.timeout)) + 1
        self.header_lists = _HeaderLists(self.cache)
        self.produced: HttpResponseBase | None = None  # the response this request rendered
        self.relearned = False

    def respond(self) -> HttpResponseBase:
        if not self.timeout:  # cache_page(0): the headers, nothing stored
            return self._render_uncached()
        if self.request.method == "HEAD":
            # As Django's cache middleware: a HEAD is answered from the GET page.
            get_key = self._page_key("GET")
            page = self.cache.get(get_key) if get_key is not None else None
            if isinstance(page, CachedPage):
                return _replay(page)
        method = self.request.method
        assert method in _CACHED_METHODS  # the guard sends other methods to the view
        key = self._page_key(method)
        if key is None:
            self._learn_url()
            if self.produced is not None:
                return self.produced
            key = self._page_key(method)
        if key is None:  # the header list vanished again (evicted)
            return self._render_uncached()
        fetched: Fetched[Any] = self.cache.get_or_compute_result(
            key, functools.partial(self._compute, key), self.timeout, policy=self.policy
        )
        if self.produced is not None:
            if self.relearned:
                self.header_lists.store(self.lifetime)  # after the page: see _HeaderLists
            return self.produced
        if fetched.value is PASS:
            return self._render_uncached()  # hit-for-pass: render in parallel
        if not isinstance(fetched.value, CachedPage):
            raise EncodingError(
                f"cache key {key!r} holds a {type(fetched.value).__qualname__}, not a page "
                "stored by stampede_guard; give the view a key_prefix of its own"
            )
        return _replay(fetched.value)

    # -- computations --

    def _compute(self, key: str) -> CachedPage | Any:
        """Render the page stored under ``key`` (PASS if it must not be cached there)."""
        response = self._render()
        cacheable = self._prepare(response)
        moved = self._learn(response) != key
        self.relearned = True
        # A changed Vary header moves the page to another key: the next request
        # computes it there; requests still on the old key render in parallel.
        return _page_of(response) if cacheable and not moved else PASS

    def _learn_url(self) -> None:
        """The URL's header list is unknown: one request renders, the others wait for it."""
        fetched = self.cache.get_or_compute_result(
            self.header_lists.key,
            self._compute_first,
            self.lifetime,
            policy=dataclasses.replace(self.policy, grace=0),
        )
        self.header_lists.remember(fetched.value)

    def _compute_first(self) -> list[str] | None:
        """Render, store the page where it belongs; return the URL's header list."""
        response = self._render()
        cacheable = self._prepare(response)
        key = self._learn(response)
        # Stored without a "recomputed" signal: this computation is already
        # signalled under the header-list key.
        Stampede(self.cache.store, self.policy).recompute(
            self.cache._pattern_key(key),
            lambda: _page_of(response) if cacheable else PASS,
            soft_timeout(self.cache._pattern_expire(self.timeout), time.time()),
        )
        return self.header_lists.learned

    # -- steps --

    def _page_key(self, method: str) -> str | None:
        return get_cache_key(self.request, self.guard.prefix, method, cache=self.header_lists)  # type: ignore[arg-type]

    def _learn(self, response: HttpResponseBase) -> str:
        """The key of ``response``'s page; its header list is recorded, not stored."""
        return learn_cache_key(
            self.request,
            response,
            self.lifetime,
            self.guard.prefix,
            cache=self.header_lists,  # type: ignore[arg-type]
        )

    def _render(self) -> HttpResponseBase:
        response = self.view(self.request, *self.args, **self.kwargs)
        render = getattr(response, "render", None)
        if callable(render):  # a TemplateResponse: cache its content, not its template
            response = render()
        self.produced = response
        return response

    def _render_uncached(self) -> HttpResponseBase:
        """Render with the headers caching would give, and store nothing."""
        response = self._render()
        self._prepare(response)
        return response

    def _prepare(self, response: HttpResponseBase) -> bool:
        """Add the caching headers where Django's cache middleware does; return whether
        the response may be cached (UpdateCacheMiddleware.process_response's rules)."""
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
        if self.guard.timeout is None and get_max_age(response) == 0:
            return False  # as cache_page(None): "max-age=0" means do not cache
        patch_response_headers(response, self.timeout)
        # RFC 9111 section 3.5: a response to a request with credentials is
        # shared only if it says "public".
        if self.request.headers.get("Authorization") and "public" not in cache_control:
            patch_vary_headers(response, ("Authorization",))
        return response.status_code == 200


def _page_of(response: HttpResponseBase) -> CachedPage:
    assert isinstance(response, HttpResponse)
    return CachedPage(response.status_code, tuple(response.items()), response.content)


def _replay(page: CachedPage) -> HttpResponse:
    """A response from a cached page, with its ``Age`` as Django's cache middleware sets it."""
    response = HttpResponse(page.body, status=page.status, headers=dict(page.headers))
    max_age = get_max_age(response)
    expires = parse_http_date_safe(response.get("Expires", ""))
    if max_age is not None and expires is not None:
        # A stale page is older than its max-age: downstream caches see it stale.
        response["Age"] = max(0, max_age - (expires - int(time.time())))
    return response


# -- functions: cached ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _CallOptions:
    timeout: Any
    alias: str
    key: Callable[..., Any] | None
    policy: StampedePolicy | None
    namespace: NamespaceArg | None


def cached(
    timeout: Any = DEFAULT_TIMEOUT,
    *,
    cache: str = DEFAULT_CACHE_ALIAS,
    key: Callable[..., Any] | None = None,
    policy: StampedePolicy | None = None,
    namespace: NamespaceArg | None = None,
) -> Callable[[F], CachedFunction]:
    """Cache a function's (or method's) results with stampede protection.

    ``timeout`` follows Django's convention: the cache's ``TIMEOUT`` when
    omitted, ``None`` never stale, ``0`` not cached.  After it, one caller
    recomputes while the others get the stale value.  ``policy`` is a
    :class:`~django_mcpatterns.core.stampede.StampedePolicy` (a ``runner`` is
    allowed: the recompute then runs in the background).

    The key is the function's module and qualified name with its arguments
    (bound to its signature, defaults applied, so ``f(1)`` and ``f(a=1)``
    share it), written by :func:`~django_mcpatterns.patterns.callkeys.encode`:
    ``str``, ``int``, ``float``, ``bool``, ``None``, ``bytes``, ``Decimal``,
    dates and times, ``UUID``, enums, classes, model instances (label and
    primary key) and tuples, lists, dicts and sets of them; anything else
    raises ``TypeError``; an object of your own gets in by defining
    ``__cache_key__()`` returning such a value.  For other arguments give
    ``key``: a callable taking the function's arguments and returning such a
    value (a tuple: several), used in their place.  Methods: ``self`` is an
    argument like the others, so each instance has its own entries: a model
    instance by its primary key, another object by its ``__cache_key__()``;
    a method of a class with neither raises ``TypeError`` when called, rather
    than give one instance another's result (give ``key``, or a
    ``__cache_key__`` returning a constant to share the entries).

    ``namespace``: the parts of a ``cache.namespace(*parts)`` (a tuple, or one
    ``str``/``int``), or a callable taking the function's arguments and
    returning them; the entries are then invalidated with the namespace.

    The result has ``.key(*args, **kwargs)``, ``.invalidate(*args, **kwargs)``
    (delete the entry: the next call recomputes it, concurrent calls wait for
    that one computation), ``.refresh(*args, **kwargs)`` (recompute and store
    now; return the value) and ``.original``.
    """
    if callable(timeout):
        raise TypeError("use @cached() with parentheses (its arguments are keywords)")
    options = _CallOptions(timeout, cache, key, policy, namespace)
    return functools.partial(CachedFunction, options=options)


class CachedFunction:
    """A function decorated with :func:`cached`; a descriptor, so it also decorates methods."""

    def __init__(self, func: Callable[..., Any], *, options: _CallOptions) -> None:
        if iscoroutinefunction(func):
            raise TypeError("cached decorates synchronous functions only")
        functools.update_wrapper(self, func)
        self.original = func
        self._options = options
        self._signature = inspect.signature(func)
        self._name = f"{func.__module__}.{func.__qualname__}"

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else _BoundCachedFunction(self, instance)

    def __repr__(self) -> str:
        return f"<cached {self._name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key, target = self._locate(args, kwargs)
        compute = functools.partial(self.original, *args, **kwargs)
        return target.get_or_compute(
            key, compute, self._options.timeout, policy=self._options.policy
        )

    def key(self, *args: Any, **kwargs: Any) -> str:
        """The cache key of this call (within its namespace, if any)."""
        if self._options.key is not None:
            made = self._options.key(*args, **kwargs)
            return call_key(self._name, made if isinstance(made, tuple) else (made,))
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        # Every argument, self included: one instance never gets another's result.
        return call_key(self._name, tuple(bound.arguments.values()))

    def invalidate(self, *args: Any, **kwargs: Any) -> bool:
        """Delete this call's entry; return whether it was there."""
        key, target = self._locate(args, kwargs)
        return bool(target.delete(key))

    def refresh(self, *args: Any, **kwargs: Any) -> Any:
        """Compute this call's value now, store it and return it."""
        key, target = self._locate(args, kwargs)
        compute = functools.partial(self.original, *args, **kwargs)
        timeout, policy = self._options.timeout, self._options.policy
        recompute = getattr(target, "recompute", None)
        if recompute is not None:
            return recompute(key, compute, timeout, policy=policy)
        # A namespace has no recompute: drop the entry and compute it, concurrent
        # callers waiting for this one computation.
        target.delete(key)
        return target.get_or_compute(key, compute, timeout, policy=policy)

    def _locate(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
        """The call's key and where it lives: the cache, or a namespace of it."""
        cache = patterns_cache(self._options.alias)
        namespace = self._options.namespace
        if namespace is None:
            return self.key(*args, **kwargs), cache
        parts = namespace_parts(namespace, *args, **kwargs)
        return self.key(*args, **kwargs), cache.namespace(*parts)


class _BoundCachedFunction:
    """A :class:`CachedFunction` method bound to an instance: the helpers take it as ``self``."""

    __slots__ = ("__func__", "__self__")

    def __init__(self, func: CachedFunction, instance: Any) -> None:
        self.__func__ = func
        self.__self__ = instance

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(self.__self__, *args, **kwargs)

    def key(self, *args: Any, **kwargs: Any) -> str:
        return self.__func__.key(self.__self__, *args, **kwargs)

    def invalidate(self, *args: Any, **kwargs: Any) -> bool:
        return self.__func__.invalidate(self.__self__, *args, **kwargs)

    def refresh(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__.refresh(self.__self__, *args, **kwargs)

    @property
    def original(self) -> Any:
        return self.__func__.original.__get__(self.__self__, type(self.__self__))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__func__, name)  # __name__, __wrapped__... of the function

    def __repr__(self) -> str:
        return f"<bound {self.__func__!r} of {self.__self__!r}>"
