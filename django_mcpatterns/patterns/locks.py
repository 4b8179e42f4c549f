"""``cache.lock(...)``: add-based, owner-safe, expiring locks on cache objects.

The algorithm is :mod:`django_mcpatterns.core.locks`; this mixin names the lock
with the backend's key rules (``KEY_PREFIX``, ``VERSION``, ``KEY_FUNCTION`` in
Django) and reports waits and timeouts through the backend's optional
``_pattern_event(event)`` hook (the Django backend turns them into signals).
Imports neither Django nor Flask.
"""

from __future__ import annotations

from typing import Any, cast

from django_mcpatterns.core.locks import DEFAULT_TIMEOUT, Backoff, EventHook, Lock

from . import PatternsHost


def event_hook(host: object) -> EventHook | None:
    """The backend's ``_pattern_event`` hook, if it has one."""
    return getattr(host, "_pattern_event", None)


class LocksMixin:
    """Adds :meth:`lock` to a cache backend (see :mod:`django_mcpatterns.patterns`)."""

    def lock(
        self,
        name: Any,
        timeout: float = DEFAULT_TIMEOUT,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        *,
        backoff: Backoff | None = None,
        version: int | None = None,
    ) -> Lock:
        """Return a lock stored under the cache key ``name``, expiring after ``timeout`` seconds.

        ``blocking``/``blocking_timeout`` are the defaults of ``acquire()``
        (``None``: wait as long as it takes).  The lock is a context manager and
        a decorator; ``release()`` and ``extend()`` raise ``LockNotOwnedError``
        once its TTL lapsed.  An unreachable server raises
        ``NodeUnavailableError`` instead of looking like a held lock.  The lock
        lives under the same key as ``cache.get(name)`` would read: give locks
        names of their own.
        """
        host = cast(PatternsHost, self)
        return Lock(
            host.store,
            host._pattern_key(name, version),
            timeout,
            blocking,
            blocking_timeout,
            backoff=backoff,
            on_event=event_hook(self),
        )
