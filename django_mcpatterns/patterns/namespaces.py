"""``cache.namespace(*parts)`` and ``cache.invalidate_namespace(*parts)`` on cache objects.

The algorithm is :mod:`django_mcpatterns.core.namespaces`; this mixin makes the
namespace's keys with the backend's rules (``_pattern_key``: Django's
``KEY_PREFIX``/``VERSION``/``KEY_FUNCTION``, Flask's key prefix) and turns the
framework's ``timeout`` into memcached exptimes (``_pattern_expire``), so a
namespace reads and writes like the cache it comes from.  ``get_or_compute``
uses the backend's ``stampede_policy`` and reports to its ``_pattern_event``
hook, as ``cache.get_or_compute`` does.  Imports neither Django nor Flask.

What decorators and template tags call: ``cache.namespace(*parts)`` (cheap, no
I/O), then ``get_or_compute(key, compute, timeout)`` on it, ``validate_key(key)``
to check a key before use, ``delete(key)`` to drop one entry and
``invalidate()`` for all.

A namespace hands out no final key: its keys are routed to the server of its
root version key, a route a ``str`` cannot carry, so such a key read or written
elsewhere would reach another server (and a namespaced item is tagged bytes
that only the namespace reads).

Every method has an a-prefixed form for asyncio (``aget``, ``aset``,
``aget_or_compute``, ``ainvalidate``..., ``cache.ainvalidate_namespace``): the
same algorithm (:class:`~django_mcpatterns.core.namespaces.AsyncNamespace`) over
the host's ``astore``, built on first use.  The methods are written once, in
``_async_namespaces.py``; ``_sync_namespaces.py`` is generated from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django_mcpatterns.core.keys import placed
from django_mcpatterns.core.namespaces import Part

from ._async_namespaces import AsyncCacheNamespaces, AsyncNamespaceMethods
from ._sync_namespaces import CacheNamespaces, NamespaceMethods
from .observed import observe_namespace_methods

__all__ = ["CacheNamespace", "NamespaceArg", "NamespacesMixin", "namespace_parts"]

NamespaceArg = tuple[Part, ...] | list[Part] | Part | Callable[..., Any]
"""A decorator's ``namespace=``: parts, one part, or a callable of the call's arguments."""


def namespace_parts(namespace: NamespaceArg, /, *args: Any, **kwargs: Any) -> tuple[Part, ...]:
    """The parts of ``cache.namespace(*parts)`` that a decorator's ``namespace=`` names for a call.

    ``namespace`` is a tuple (or list) of parts, one ``str``/``int``, or a
    callable taking the call's arguments and returning either.  One rule for
    every decorator (Django's ``cached``, Flask's ``stampede_guard``), so the
    same argument names the same namespace in both; the parts themselves are
    checked by ``cache.namespace``.
    """
    parts = namespace(*args, **kwargs) if callable(namespace) else namespace
    return tuple(parts) if isinstance(parts, tuple | list) else (parts,)


@observe_namespace_methods(NamespaceMethods, AsyncNamespaceMethods)
class CacheNamespace(NamespaceMethods, AsyncNamespaceMethods):
    """A namespace of a cache: the cache's key rules and timeout convention.

    Every key of it (and of the namespaces nested in it) lives on one server;
    a read is one request; :meth:`invalidate` is one ``incr`` after which no
    read, in any process, returns a value written before it.  ``timeout``
    follows the cache's convention (Django: seconds, ``None`` never, 0 do not
    store; Flask-Caching: 0 never, ``None`` the default); omitted, it is the
    cache's default timeout.  ``set_many`` returns the keys that were *not*
    stored, and an invalid key raises, in both frameworks.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(self._ns)

    @property
    def path(self) -> tuple[tuple[str, ...], ...]:
        """The parts of each level, outermost first, as text."""
        return self._ns.path

    @property
    def soft(self) -> bool:
        return self._ns.soft

    def namespace(self, *parts: Part, soft: bool | None = None) -> CacheNamespace:
        """A namespace nested in this one (``soft`` defaults to this one's)."""
        return CacheNamespace(self._host, self._ns.namespace(*parts, soft=soft))

    def validate_key(self, key: Any, version: int | None = None) -> None:
        """Raise as the cache does for an invalid key if ``key`` is not valid in this namespace.

        The namespace's prefix counts towards memcached's 250 bytes, so a key
        valid on the cache may be too long here.
        """
        placed(self._ns.key(key, version=version))


class NamespacesMixin(CacheNamespaces, AsyncCacheNamespaces):
    """Adds :meth:`namespace`, :meth:`invalidate_namespace` and its asyncio form."""

    def namespace(self, *parts: Part, soft: bool = False) -> CacheNamespace:
        """The namespace named by ``parts`` (str or int; ``42`` and ``"42"`` are the same).

        ``soft``: after an invalidation, ``get_or_compute`` serves the old value
        as stale while one caller recomputes it (plain reads still miss).
        """
        return CacheNamespace(self, self._namespaces.namespace(*parts, soft=soft))
