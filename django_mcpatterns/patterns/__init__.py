"""The patterns' methods on cache objects, shared by the Django and Flask backends.

Each pattern's algorithm lives in :mod:`django_mcpatterns.core` and knows nothing
of frameworks.  The mixins here put it on a cache object with the public names of
``design.md`` (``sadd``, ``lock``, ``get_or_compute``, ``namespace``...), adapting
keys and timeouts through three hooks every backend provides, and reporting what
they did through an optional fourth:

``store``
    the :class:`~django_mcpatterns.core.store.Store` behind the cache;
``values``
    the store the cache API reads and writes values through: ``store``, or a
    chunked store over it (``OPTIONS["large_values"] = "chunk"``); ``avalues``
    is the same over ``astore``;
    ``get_or_set`` uses it, as Django's ``get``/``set`` do;
``astore``
    the same store for asyncio (:class:`~django_mcpatterns.core.store.AsyncStore`),
    what the async forms (``asadd``, ``aget_or_compute``...) use;
``_pattern_key(key, version=None) -> str``
    the full, validated memcached key (Django: ``make_and_validate_key``, with
    ``KEY_PREFIX``/``VERSION``/``KEY_FUNCTION``; Flask: its key prefix);
``_pattern_expire(timeout) -> int``
    memcached's exptime for the framework's ``timeout`` convention, where
    :data:`DEFAULT` means the cache's default timeout;
``_pattern_event(event)`` (optional)
    receives the core's events (:class:`~django_mcpatterns.core.stampede.Recomputed`,
    ``StaleServed``, ``ComputeFailed``, :class:`~django_mcpatterns.core.locks.LockWaited`,
    ``LockTimedOut``...; an exception it raises is logged, never raised into
    the caller).  The Django backends send them as
    :mod:`django_mcpatterns.signals`, the Flask ones as blinker signals.  The
    mixins look it up with ``getattr`` (:func:`.locks.event_hook`), so a host
    without it simply reports nothing.

The mixins import neither Django nor Flask.
"""

from __future__ import annotations

from typing import Any, Protocol

from django_mcpatterns.core.store import AsyncStore, Store


class _Default:
    """The "use the cache's default timeout" sentinel."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()


class PatternsHost(Protocol):
    """What a backend gives the pattern mixins."""

    @property
    def store(self) -> Store: ...

    @property
    def values(self) -> Store: ...

    @property
    def astore(self) -> AsyncStore: ...

    @property
    def avalues(self) -> AsyncStore: ...

    def _pattern_key(self, key: Any, version: int | None = None) -> str: ...

    def _pattern_expire(self, timeout: Any = DEFAULT) -> int: ...
