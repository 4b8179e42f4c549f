"""What the pattern methods are written against: a cache object's binding and its hooks.

Both backends (Django's and Flask-Caching's) are subclasses of :class:`PatternHost`.
The pattern methods (``sadd``, ``get_or_compute``, ``namespace``...; their asyncio
source is ``_async_*.py`` beside this module) reach the store through ``binding``
and adapt keys and timeouts through hooks each backend overrides:

``binding``
    the :class:`~django_mcpatterns.binding.Binding` the backend was configured
    with: the store, ``values`` (chunked with ``large_values="chunk"``), their
    asyncio forms, and the set and list objects;
``_pattern_key(key, version=None) -> str``
    the full, validated memcached key (Django: ``make_and_validate_key``, with
    ``KEY_PREFIX``/``VERSION``/``KEY_FUNCTION``; Flask: its key prefix);
``_pattern_expire(timeout) -> int``
    memcached's exptime for the framework's ``timeout`` convention, where
    :data:`DEFAULT` means the cache's default timeout;
``_pattern_event(event)``
    receives the core's events (``Recomputed``, ``StaleServed``,
    ``LockWaited``...; an exception it raises is logged, never raised into the
    caller): counted by instrumentation here, sent as signals by the backends;
``_set_options()``
    the thresholds of the cache's sets (a documented override).

Imports neither Django nor Flask.
"""

from __future__ import annotations

import time
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django_mcpatterns.core.namespaces import AsyncNamespace, AsyncNamespaces, Namespace, Namespaces
from django_mcpatterns.core.sets import SetOptions
from django_mcpatterns.core.stampede import AsyncStampede, Stampede, StampedePolicy
from django_mcpatterns.core.store import MAX_RELATIVE_EXPIRE, AsyncStore, Store

from .observed import observe_event

if TYPE_CHECKING:
    from django_mcpatterns.binding import Binding

__all__ = ["DEFAULT", "NamespaceHost", "PatternHost", "soft_timeout"]


class Default:
    """The type of :data:`DEFAULT`: "use the cache's default timeout"."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = Default()


def soft_timeout(exptime: int, now: float) -> float | None:
    """Seconds until a value stored with memcached ``exptime`` expires (None: never; 0: at once)."""
    if exptime == 0:
        return None
    if exptime < 0:
        return 0.0
    if exptime > MAX_RELATIVE_EXPIRE:
        return max(exptime - now, 0.0)  # an absolute Unix time
    return float(exptime)


class PatternHost:
    """A cache object, as the pattern methods see it (see the module docstring).

    ``stampede_policy`` is the cache's default
    :class:`~django_mcpatterns.core.stampede.StampedePolicy` (a class
    attribute a subclass or an instance may replace); each call may pass its own.
    """

    binding: Binding[Store, AsyncStore]
    stampede_policy: StampedePolicy = StampedePolicy()  # frozen: safe as a class default

    @property
    def store(self) -> Store:
        """The Store behind this cache (a Cluster or a MemoryStore)."""
        return self.binding.store

    @property
    def astore(self) -> AsyncStore:
        """The same store for asyncio (an AsyncCluster or an AsyncMemoryStore)."""
        return self.binding.async_store

    @property
    def pattern_store(self) -> Store:
        """The Store the pattern methods use: :attr:`store`, except during a ring migration
        (``OPTIONS["migrate_from"]``), when pattern keys stay on the old ring."""
        return self.binding.pattern_store

    @property
    def apattern_store(self) -> AsyncStore:
        """:attr:`pattern_store` for asyncio."""
        return self.binding.async_pattern_store

    @property
    def values(self) -> Store:
        """What the cache API reads and writes: :attr:`store`, chunking values over the
        item size limit when ``OPTIONS["large_values"]`` is ``"chunk"``."""
        return self.binding.values

    @property
    def avalues(self) -> AsyncStore:
        """:attr:`values` for asyncio: :attr:`astore`, chunked the same way."""
        return self.binding.async_values

    def _pattern_key(self, key: Any, version: int | None = None) -> str:
        raise NotImplementedError

    def _pattern_expire(self, timeout: Any = DEFAULT) -> int:
        raise NotImplementedError

    def _made_keys(self, keys: tuple[Any, ...], version: int | None) -> list[str]:
        return [self._pattern_key(key, version) for key in keys]

    def _pattern_event(self, event: object) -> None:
        observe_event(self, event)

    def _set_options(self) -> SetOptions:
        """The thresholds for this cache's sets and lists (override to tune them)."""
        return SetOptions.for_store(self.pattern_store)

    def _soft_timeout(self, timeout: Any) -> float | None:
        """The soft TTL of a ``get_or_compute`` value for the framework's ``timeout``."""
        return soft_timeout(self._pattern_expire(timeout), time.time())

    # Stampede protection with the call's policy, or the cache's (read at each call), over
    # the near cache where there is one (its reads held near, its writes dropping copies).

    def _stampede(self, policy: StampedePolicy | None) -> Stampede:
        return Stampede(
            self.binding.near_store, policy or self.stampede_policy, on_event=self._pattern_event
        )

    def _astampede(self, policy: StampedePolicy | None) -> AsyncStampede:
        return AsyncStampede(
            self.binding.async_near_store,
            policy or self.stampede_policy,
            on_event=self._pattern_event,
        )

    # The cache's namespaces: their keys are made by this cache's rules, and their
    # get_or_compute runs with its stampede policy (read at each call) and events.

    @cached_property
    def _namespaces(self) -> Namespaces:
        store = self.binding.near_store
        return Namespaces(
            store,
            make_key=self._pattern_key,
            stampede=self._stampede_on,
            on_event=self._pattern_event,
        )

    @cached_property
    def _anamespaces(self) -> AsyncNamespaces:
        store = self.binding.async_near_store
        return AsyncNamespaces(
            store,
            make_key=self._pattern_key,
            stampede=self._astampede_on,
            on_event=self._pattern_event,
        )

    def _stampede_on(self, store: Store) -> Stampede:
        return Stampede(store, self.stampede_policy, on_event=self._pattern_event)

    def _astampede_on(self, store: AsyncStore) -> AsyncStampede:
        return AsyncStampede(store, self.stampede_policy, on_event=self._pattern_event)


class NamespaceHost:
    """A namespace of a cache, as its methods see it: the cache's hooks and the core namespace.

    ``_ns`` is the :class:`~django_mcpatterns.core.namespaces.Namespace`; ``_ans``
    its asyncio form, made on first use from the cache's async namespaces.
    """

    __slots__ = ("_host", "_made_ans", "_namespace")

    def __init__(self, host: PatternHost, namespace: Namespace) -> None:
        self._host = host
        self._namespace = namespace
        self._made_ans: AsyncNamespace | None = None

    @property
    def _ns(self) -> Namespace:
        return self._namespace

    @property
    def _ans(self) -> AsyncNamespace:
        made = self._made_ans
        if made is None:
            ns = self._namespace
            made = self._made_ans = AsyncNamespace(self._host._anamespaces, ns.path, ns.soft)
        return made

    def _expire(self, timeout: Any) -> int:
        return self._host._pattern_expire(timeout)

    def _soft_timeout(self, timeout: Any) -> float | None:
        return self._host._soft_timeout(timeout)
