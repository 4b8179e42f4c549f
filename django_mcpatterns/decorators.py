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
from collections.abc import Callable
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.cache import DEFAULT_CACHE_ALIAS
from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.http import HttpRequest, HttpResponseBase
from django.utils.cache import get_cache_key

from ._sync.page_guard import PageRequest, invalidate_page, mark_page_stale
from .core.exceptions import ConfigurationError
from .core.stampede import StampedePolicy
from .limiting import ratelimit
from .page_rules import CACHED_METHODS, PageGuard, refuse_runner
from .page_rules import inline_policy as inline_policy  # importable from here, as before
from .page_rules import patterns_cache as patterns_cache
from .patterns.callkeys import call_key
from .patterns.namespaces import NamespaceArg, namespace_parts

__all__ = ["CachedFunction", "cached", "ratelimit", "stampede_guard"]

V = TypeVar("V", bound=Callable[..., HttpResponseBase])
F = TypeVar("F", bound=Callable[..., Any])

PAGE_KEY_PREFIX = "mcpatterns"


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
    request re-renders it while the others are still served it), their
    async forms ``.ainvalidate(request)`` and ``.amark_stale(request)``, and
    ``.original``.  An ``async def`` view gets an async guard: the same page
    flow (``_async/page_guard.py``), awaited on the event loop.
    """
    if timeout is not None and (type(timeout) is not int or timeout < 0):
        raise ConfigurationError(
            f"stampede_guard timeout must be whole seconds >= 0 or None, not {timeout!r}",
            option="timeout",
        )
    refuse_runner(policy, "stampede_guard")
    guard = PageGuard(timeout, cache, _page_prefix(key_prefix), policy)

    def decorator(view: V) -> V:
        if iscoroutinefunction(view):
            return cast(V, _async_guarded(guard, view))

        @functools.wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            _check_request(request)
            if request.method not in CACHED_METHODS:
                return view(request, *args, **kwargs)
            return PageRequest(guard, view, request, args, kwargs).respond()

        return cast(V, _with_helpers(guarded, guard, view))

    return decorator


def _async_guarded(guard: PageGuard, view: Callable[..., Any]) -> Callable[..., Any]:
    """``stampede_guard`` on an ``async def`` view: the async page flow, on the loop."""
    from ._async.page_guard import AsyncPageRequest

    @functools.wraps(view)
    async def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        _check_request(request)
        if request.method not in CACHED_METHODS:
            response: HttpResponseBase = await view(request, *args, **kwargs)
            return response
        return await AsyncPageRequest(guard, view, request, args, kwargs).respond()

    return _with_helpers(guarded, guard, view)


def _check_request(request: Any) -> None:
    if not hasattr(request, "META"):
        raise TypeError(
            "stampede_guard didn't receive an HttpRequest. If you are decorating "
            "a method, use django.utils.decorators.method_decorator."
        )


def _with_helpers(
    guarded: Callable[..., Any], guard: PageGuard, view: Callable[..., Any]
) -> Callable[..., Any]:
    from ._async.page_guard import invalidate_page as ainvalidate_page
    from ._async.page_guard import mark_page_stale as amark_page_stale

    helpers = {
        "key": functools.partial(_page_key, guard),
        "invalidate": functools.partial(invalidate_page, guard),
        "mark_stale": functools.partial(mark_page_stale, guard),
        "ainvalidate": functools.partial(ainvalidate_page, guard),
        "amark_stale": functools.partial(amark_page_stale, guard),
        "original": view,
    }
    for name, helper in helpers.items():
        setattr(guarded, name, helper)
    return guarded


def _page_prefix(key_prefix: str | None) -> str:
    # Our own prefix: cache_page and Django's cache middleware store pickled
    # HttpResponse objects under the same key scheme; sharing their keys would
    # hand each other values of the wrong kind.
    return PAGE_KEY_PREFIX if not key_prefix else f"{PAGE_KEY_PREFIX}.{key_prefix}"


def _page_key(guard: PageGuard, request: HttpRequest, method: str = "GET") -> str | None:
    """The key of the page ``request`` gets, or None when its URL was never cached."""
    return get_cache_key(request, guard.prefix, method, cache=guard.cache())


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
    now; return the value) and ``.original``, and the async forms
    ``.ainvalidate(...)`` and ``.arefresh(...)``.

    A coroutine function (``async def``) is cached through ``aget_or_compute``:
    calling the decorated function returns a coroutine, concurrent tasks on a
    cold key await one computation, and nothing blocks the event loop
    (``.refresh`` raises ``TypeError``: await ``.arefresh``).
    """
    if callable(timeout):
        raise TypeError("use @cached() with parentheses (its arguments are keywords)")
    options = _CallOptions(timeout, cache, key, policy, namespace)
    return functools.partial(CachedFunction, options=options)


class CachedFunction:
    """A function decorated with :func:`cached`; a descriptor, so it also decorates methods."""

    def __init__(self, func: Callable[..., Any], *, options: _CallOptions) -> None:
        functools.update_wrapper(self, func)
        # A coroutine function gets the async forms: calling it returns a coroutine
        # that awaits ``aget_or_compute`` (the compute is awaited on the loop).
        self.is_async = iscoroutinefunction(func)
        if self.is_async:
            markcoroutinefunction(self)
        self.original = func
        self._options = options
        self._signature = inspect.signature(func)
        self._name = f"{func.__module__}.{func.__qualname__}"

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else _BoundCachedFunction(self, instance)

    def __repr__(self) -> str:
        return f"<cached {self._name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_async:
            return self._acall(args, kwargs)
        key, target = self._locate(args, kwargs)
        compute = functools.partial(self.original, *args, **kwargs)
        return target.get_or_compute(
            key, compute, self._options.timeout, policy=self._options.policy
        )

    async def _acall(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key, target = self._locate(args, kwargs)
        compute = functools.partial(self.original, *args, **kwargs)
        return await target.aget_or_compute(
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

    async def ainvalidate(self, *args: Any, **kwargs: Any) -> bool:
        """:meth:`invalidate` for async code."""
        key, target = self._locate(args, kwargs)
        return bool(await target.adelete(key))

    def refresh(self, *args: Any, **kwargs: Any) -> Any:
        """Compute this call's value now, store it and return it."""
        if self.is_async:
            raise TypeError(f"{self._name} is a coroutine function: await its .arefresh()")
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

    async def arefresh(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`refresh` for async code (the function may be sync or a coroutine function)."""
        key, target = self._locate(args, kwargs)
        compute = functools.partial(self.original, *args, **kwargs)
        timeout, policy = self._options.timeout, self._options.policy
        recompute = getattr(target, "arecompute", None)
        if recompute is not None:
            return await recompute(key, compute, timeout, policy=policy)
        await target.adelete(key)
        return await target.aget_or_compute(key, compute, timeout, policy=policy)

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

    async def ainvalidate(self, *args: Any, **kwargs: Any) -> bool:
        return await self.__func__.ainvalidate(self.__self__, *args, **kwargs)

    async def arefresh(self, *args: Any, **kwargs: Any) -> Any:
        return await self.__func__.arefresh(self.__self__, *args, **kwargs)

    @property
    def original(self) -> Any:
        return self.__func__.original.__get__(self.__self__, type(self.__self__))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__func__, name)  # __name__, __wrapped__... of the function

    def __repr__(self) -> str:
        return f"<bound {self.__func__!r} of {self.__self__!r}>"
