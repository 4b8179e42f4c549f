"""Pattern calls seen by instrumentation: a span (and a debug-toolbar row) per ``cache.sadd``.

:func:`observe_patterns` is a class decorator for the backends: it wraps every
public method the pattern mixins define (``sadd``, ``get_or_compute``,
``asadd``, ``aget_or_compute``... whatever they hold when the backend class is
made), so a method added to a mixin is observed without touching this module.
The wrapper asks the cache's store for its observer (``store.observer``, a
:class:`~django_mcpatterns.core.observe.Observer` or None) on every call: with
instrumentation off that lookup is all it costs.

Only the outermost call is observed: a pattern method that calls another
(``get_or_compute`` runs ``get_or_compute_result``) is one call, one span,
whose commands are all its own.  A context variable says a call is running,
so threads and asyncio tasks each have their own.

Coroutine methods get an ``async`` wrapper (the call is observed until it
returns, on the task's own context); generator methods are left alone (their
work happens after the call returns).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from django_mcpatterns.core.observe import Observer

__all__ = [
    "observe_lock_methods",
    "observe_namespace_methods",
    "observe_patterns",
    "observer_of",
    "pattern_methods",
]

C = TypeVar("C", bound=type)

_inside: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "mcpatterns_pattern_call", default=False
)


def observer_of(host: Any) -> Observer | None:
    """The observer of ``host``'s store, or None (instrumentation off, embedded store)."""
    binding = getattr(host, "binding", None)
    store = host.store if binding is None else binding.store
    observer: Observer | None = getattr(store, "observer", None)
    return observer


def _namespace_observer(namespace: Any) -> Observer | None:
    return observer_of(namespace._host)


def pattern_methods(*mixins: type, skip: tuple[str, ...] = ()) -> dict[str, Callable[..., Any]]:
    """The public methods the mixins and their bases define (properties and generators excluded)."""
    found: dict[str, Callable[..., Any]] = {}
    for mixin in mixins:
        for cls in mixin.__mro__[:-1]:  # not object's
            for name, member in vars(cls).items():
                if name.startswith("_") or name in skip or not inspect.isfunction(member):
                    continue
                if inspect.isgeneratorfunction(member) or inspect.isasyncgenfunction(member):
                    continue
                found.setdefault(name, member)
    return found


def observe_patterns(*mixins: type) -> Callable[[C], C]:
    """Wrap the mixins' public methods on the decorated class (see the module docstring)."""

    def decorate(cls: C) -> C:
        for name in pattern_methods(*mixins):
            setattr(cls, name, observed(name, getattr(cls, name)))
        return cls

    return decorate


def observe_namespace_methods(*methods: type) -> Callable[[C], C]:
    """Wrap a cache namespace's methods (those ``methods`` define) as ``namespace.<name>``
    calls of its cache."""

    def decorate(cls: C) -> C:
        for name in pattern_methods(*methods):
            method = getattr(cls, name)
            setattr(cls, name, observed(f"namespace.{name}", method, _namespace_observer))
        return cls

    return decorate


# A cache lock's calls, by the method that makes each (``__aenter__`` takes the lock).
LOCK_CALLS = {
    "acquire": "lock.acquire",
    "release": "lock.release",
    "extend": "lock.extend",
    "aacquire": "lock.aacquire",
    "arelease": "lock.arelease",
    "aextend": "lock.aextend",
    "__aenter__": "lock.aacquire",
    "__aexit__": "lock.arelease",
}


def observe_lock_methods(cls: C) -> C:
    """Wrap a cache lock's calls (:data:`LOCK_CALLS`) as pattern calls keyed by its key.

    ``__enter__``/``__exit__`` call ``acquire``/``release``; the async forms
    are wrapped themselves, as they go to the lock's asyncio form directly.
    """
    for method, name in LOCK_CALLS.items():
        wrapped = observed(name, getattr(cls, method), _lock_observer, _lock_args)
        setattr(cls, method, wrapped)
    return cls


def _lock_observer(lock: Any) -> Observer | None:
    observer: Observer | None = getattr(lock._host_store, "observer", None)
    return observer


def _lock_args(lock: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (lock.key,)  # what a call shows (toolbar) or traces (trace_keys): the lock's key


def _as_given(host: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return args


def observed(
    name: str,
    method: Callable[..., Any],
    observer_of: Callable[[Any], Observer | None] = observer_of,
    args_of: Callable[[Any, tuple[Any, ...]], tuple[Any, ...]] = _as_given,
) -> Callable[..., Any]:
    """``method``, reported to the host's observer as the pattern call ``name``."""
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def observed_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            observer = observer_of(self)
            if observer is None or _inside.get():
                return await method(self, *args, **kwargs)
            call = observer.begin(name, args_of(self, args))
            token = _inside.set(True)
            try:
                result = await method(self, *args, **kwargs)
            except BaseException as exc:
                _inside.reset(token)
                observer.end(call, None, exc)
                raise
            _inside.reset(token)
            observer.end(call, result, None)
            return result

        return observed_async

    @functools.wraps(method)
    def observed_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        observer = observer_of(self)
        if observer is None or _inside.get():
            return method(self, *args, **kwargs)
        call = observer.begin(name, args_of(self, args))
        token = _inside.set(True)
        try:
            result = method(self, *args, **kwargs)
        except BaseException as exc:
            _inside.reset(token)
            observer.end(call, None, exc)
            raise
        _inside.reset(token)
        observer.end(call, result, None)
        return result

    return observed_sync


def observe_event(host: Any, event: object) -> None:
    """Count a core event (``_pattern_event``'s argument) under its signal's name."""
    observer = observer_of(host)
    if observer is not None:
        observer.event(event_name(event))


def event_name(event: object) -> str:
    """The signal name of a core event (``recomputed``...); else its class name in snake case."""
    from .events import SIGNAL_NAMES

    name = SIGNAL_NAMES.get(type(event))
    if name is not None:
        return name
    words = "".join(f"_{c.lower()}" if c.isupper() else c for c in type(event).__name__)
    return words.lstrip("_")
