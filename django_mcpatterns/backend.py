"""Django cache backends: ketama-routed memcached clusters and the embedded store.

Both keep the rules of Django's own memcached backends (timeouts, key
validation, return values: :mod:`.memcached_contract`) over a
:class:`~django_mcpatterns.binding.Binding` instead of a client library: the
process-wide :class:`Cluster` for ``KetamaMemcacheCache`` and a process-wide
:class:`MemoryStore` per ``LOCATION`` for ``LocMemPatternsCache``.  Django builds
one backend instance per thread and per async task; sharing the store keeps
connection pools, node health and (for the embedded store) the data common
to all of them.  The class names follow Django's (``PyMemcacheCache``,
``PyLibMCCache``); the Flask backends follow Flask-Caching's
(``MemcachedCache``): ``django_mcpatterns.flask.KetamaMemcachedCache``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.cache.backends.base import default_key_func
from django.core.exceptions import ImproperlyConfigured

from ._async.cache import AsyncCacheMethods
from ._sync.cache import CacheMethods
from .binding import (
    ClusterBinding,
    Conventions,
    EmbeddedBinding,
    Setting,
    bind_cluster,
    bind_embedded,
)
from .core.aio import AsyncCluster
from .core.cluster import Cluster, NodeEvent
from .core.exceptions import ConfigurationError
from .core.memory import AsyncMemoryStore, MemoryStore
from .core.sets import SetOptions
from .core.store import Store
from .core.values import ValueRefused
from .patterns import PatternMethods
from .patterns.observed import observe_event

__all__ = ["KetamaMemcacheCache", "LocMemPatternsCache", "StoreCache"]


class StoreCache(PatternMethods, CacheMethods, AsyncCacheMethods):
    """Django's memcached contract over a binding, with every pattern method.

    The base of both backends (for type hints and ``isinstance``); subclasses
    say which store.  The pattern methods (:mod:`django_mcpatterns.patterns`)
    add sets, locks, ``get_or_compute`` and namespaces, with Django's key and
    timeout conventions and its signals.
    """

    @property
    def _cache(self) -> Store:
        # What Django's memcached backends call their client: the values' store.
        return self.binding.values

    def _pattern_event(self, event: object) -> None:
        from . import signals

        observe_event(self, event)
        signals.send_pattern_event(self, event)

    def close(self, **kwargs: Any) -> None:
        # Django calls close() after every request.  Connections are pooled per
        # process and node health must survive, so there is nothing to drop here
        # (like PyLibMCCache, unlike PyMemcacheCache which reconnects each time).
        pass

    async def aclose(self, **kwargs: Any) -> None:
        """Close this event loop's connections, once idle (no thread hop, unlike Django's
        default ``aclose``); they reopen on the next call.  A loop that ends without it
        closes them as it shuts down (``core/loops.py``)."""
        if "async_store" in vars(self.binding):  # made: there may be connections
            await self.binding.async_store.close()

    def _conventions(self, **listeners: Any) -> Conventions:
        """Django's conventions for this cache's binding (see :mod:`.binding`)."""
        ours = self.key_func is default_key_func
        return Conventions(
            secrets=_secrets,
            label=functools.partial(_alias, self._options, self._location),
            # With Django's own key function the key sent is KEY_PREFIX:version:key:
            # replicate prefixes are matched after it.  A custom KEY_FUNCTION makes
            # keys of its own shape, so they are matched on the key it makes.
            key_scope=re.escape(self.key_prefix) + r":\d+:" if ours else None,
            shared=True,
            refused=_improperly_configured,
            **listeners,
        )

    def _bound_set_options(self, store: Store) -> SetOptions:
        return self._set_options()


class KetamaMemcacheCache(StoreCache):
    """Memcached cluster with ketama routing compatible with libmemcached,
    twemproxy, libketama and spymemcached (``OPTIONS["ketama"]``)."""

    binding: ClusterBinding

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(server, params)
        conventions = self._conventions(
            on_node_event=_send_node_signal, on_value_refused=_send_cluster_refused_signal
        )
        self.binding = bind_cluster(
            server, self._options, conventions, set_options=self._bound_set_options
        )

    @property
    def client_servers(self) -> list[str]:
        return [server.node for server in self.binding.servers]

    @property
    def store(self) -> Cluster:
        """The Cluster behind this cache."""
        return self.binding.store

    @property
    def astore(self) -> AsyncCluster:
        """The Cluster's asyncio twin (same servers, node health and serde; its own connections)."""
        return self.binding.async_store


class LocMemPatternsCache(StoreCache):
    """The embedded default: an in-process store with memcached's semantics.

    Every thread of a process shares the data of one ``LOCATION`` name, as with
    Django's ``LocMemCache``.  ``OPTIONS``: ``max_bytes`` (total memory before
    least-recently-used items are evicted), ``max_item_size``, and the
    cluster's ``serializer`` and signing options, so values behave as they
    will on memcached.  Aliases naming one ``LOCATION`` must agree on how
    values are encoded (serializer, signing): the store is theirs together.
    """

    binding: EmbeddedBinding

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(server, params)
        conventions = self._conventions(
            on_value_refused=functools.partial(_send_refused_signal, MemoryStore)
        )
        name = server if isinstance(server, str) else ";".join(server)
        self.binding = bind_embedded(
            name, self._options, conventions, set_options=self._bound_set_options
        )

    @property
    def store(self) -> MemoryStore:
        """The MemoryStore behind this cache (shared by every alias naming its LOCATION)."""
        return self.binding.store

    @property
    def astore(self) -> AsyncMemoryStore:
        """The embedded store for asyncio: the same data, on the event loop."""
        return self.binding.async_store


# -- Django's side of the conventions -------------------------------------------------


def _improperly_configured(setting: Setting, exc: ConfigurationError) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"django-mcpatterns cache configuration: {exc}")


def _secrets() -> list[str | bytes | None]:
    """What signing keys are derived from for ``signed=True`` without a key.

    ``SECRET_KEY_FALLBACKS`` verify too, so rotating the secret as Django
    documents does not turn every cached value into a miss at once.
    """
    return [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ())]


def _alias(options: Mapping[str, Any], location: str | list[str]) -> str:
    """The alias of the ``CACHES`` entry whose ``OPTIONS`` these are: the instrumentation label.

    Django hands a backend a copy of its ``CACHES`` entry without the alias;
    the entry's ``OPTIONS`` mapping is the very object of the settings, so
    it names the alias, with ``LOCATION``: settings often share one
    ``OPTIONS`` dict between caches (equal entries share one cluster anyway).
    """
    entries = getattr(settings, "CACHES", {})
    alias = next(
        (
            a
            for a, e in entries.items()
            if e.get("OPTIONS") is options and e.get("LOCATION") == location
        ),
        None,
    )
    if alias is None:
        alias = next((a for a, e in entries.items() if e.get("OPTIONS") is options), None)
    if alias is None:
        alias = next((a for a, e in entries.items() if e.get("OPTIONS") == options), "default")
    return alias


def _send_refused_signal(sender: type, event: ValueRefused) -> None:
    from . import signals

    signals.value_refused.send(sender=sender, **vars(event))


def _send_cluster_refused_signal(event: ValueRefused) -> None:
    # One function for every backend: a cluster adds each listener once (Cluster.listen).
    _send_refused_signal(Cluster, event)


def _send_node_signal(event: NodeEvent) -> None:
    from . import signals

    signal = {"dead": signals.node_dead, "revived": signals.node_revived}.get(event.kind)
    if signal is not None:
        signal.send(sender=Cluster, node=event.node, error=event.error)
