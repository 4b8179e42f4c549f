"""Django cache backends: ketama-routed memcached clusters and the embedded store.

Both backends keep the exact rules of Django's own memcached backends (timeouts,
key validation, return values) by subclassing ``BaseMemcachedCache``; they only
swap the client for a Store: the process-wide :class:`Cluster` for
``KetamaMemcacheCache`` and a process-wide :class:`MemoryStore` for
``LocMemPatternsCache``.  Django builds one backend instance per thread and per
alias; sharing the Store keeps connection pools, node health and (for the
embedded store) the data common to all threads.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.cache.backends.base import (
    DEFAULT_TIMEOUT,
    InvalidCacheKey,
    default_key_func,
    memcache_key_warnings,
)
from django.core.cache.backends.memcached import BaseMemcachedCache
from django.core.exceptions import ImproperlyConfigured
from django.utils.functional import cached_property

from .core.aio import AsyncCluster
from .core.chunks import AsyncChunkedStore, ChunkedStore
from .core.cluster import Cluster, NodeEvent, shared_cluster
from .core.exceptions import ConfigurationError, InvalidKeyError, ValueTooLargeError
from .core.keys import key_bytes, shorten
from .core.memory import AsyncMemoryStore, MemoryStore, memory_options, shared_memory_store
from .core.observe import check_installed
from .core.options import INSTRUMENTATION_OPTIONS, ClusterOptions
from .core.servers import parse_servers
from .core.store import AsyncStore, Store
from .core.values.refusals import ValueRefused
from .core.values.serde import SerdeOptions
from .core.values.signing import with_derived_keys
from .patterns import DEFAULT
from .patterns.limits import LimitsMixin
from .patterns.locks import LocksMixin
from .patterns.namespaces import NamespacesMixin
from .patterns.observed import observe_event, observe_patterns
from .patterns.sets import SetsMixin
from .patterns.stampede import StampedeMixin

logger = logging.getLogger("django_mcpatterns.backend")


@observe_patterns(SetsMixin, LocksMixin, StampedeMixin, NamespacesMixin, LimitsMixin)
class _StoreCache(
    SetsMixin, LocksMixin, StampedeMixin, NamespacesMixin, LimitsMixin, BaseMemcachedCache
):
    """Django's memcached contract over a Store; subclasses say which Store.

    The pattern mixins (``django_mcpatterns.patterns``) add sets, locks,
    ``get_or_compute`` and namespaces through the hooks below.
    """

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        # BaseMemcachedCache.__init__ wants a client library; we bring a Store.
        super(BaseMemcachedCache, self).__init__(params)
        self._location = server
        self._options = params.get("OPTIONS") or {}
        self.LibraryValueNotFoundException = KeyError  # our stores return None instead
        self._hash_long_keys = self._options.get("long_keys") == "hash"

    @property
    def _cache(self) -> Store:
        return self.values

    @cached_property
    def values(self) -> Store:
        """What Django's cache API reads and writes: :attr:`store`, chunking large values
        when ``OPTIONS["large_values"]`` is ``"chunk"`` (a ``ChunkedStore`` over it)."""
        store = self.store
        if self._options.get("large_values") != "chunk":
            return store
        return ChunkedStore(store, self._max_item_size)

    @cached_property
    def avalues(self) -> AsyncStore:
        """:attr:`values` for asyncio: :attr:`astore`, chunked the same way."""
        store = self.astore
        if self._options.get("large_values") != "chunk":
            return store
        return AsyncChunkedStore(store, self._max_item_size)

    @property
    def _max_item_size(self) -> int:
        raise NotImplementedError

    @property
    def store(self) -> Store:
        """The Store behind this cache (a Cluster or a MemoryStore)."""
        raise NotImplementedError

    @property
    def astore(self) -> AsyncStore:
        """The same store for asyncio (an AsyncCluster or an AsyncMemoryStore)."""
        raise NotImplementedError

    if TYPE_CHECKING:
        # django-stubs gives BaseCache's signature (float | None); memcached's returns an int.
        def get_backend_timeout(self, timeout: Any = DEFAULT_TIMEOUT) -> int: ...

    def _pattern_key(self, key: Any, version: int | None = None) -> str:
        return self.make_and_validate_key(key, version=version)

    def make_and_validate_key(self, key: Any, version: Any = None) -> str:
        """Django's key (``KEY_PREFIX``, version, ``KEY_FUNCTION``), validated.

        With ``OPTIONS["long_keys"] = "hash"``, a key over 250 bytes becomes its
        digest form first (:func:`~django_mcpatterns.core.keys.shorten`).
        """
        made = self.make_key(key, version=version)
        if self._hash_long_keys:
            made = shorten(made)
        self.validate_key(made)
        return made

    def bump(self, key: Any, version: Any = None) -> bool:
        """Refresh ``key``'s place in memcached's LRU, without fetching it or changing its TTL.

        Return whether it was there: memcached's "touching keys with add"
        (meta ``mg <key>`` with no flags; text ``add``).  A False is the
        playbook's cue that the value is gone and due to be recomputed.
        """
        return self.store.bump(self.make_and_validate_key(key, version=version))

    async def abump(self, key: Any, version: Any = None) -> bool:
        """:meth:`bump` for asyncio, on :attr:`astore` (no thread hop)."""
        return await self.astore.bump(self.make_and_validate_key(key, version=version))

    def _pattern_expire(self, timeout: Any = DEFAULT) -> int:
        return self.get_backend_timeout(DEFAULT_TIMEOUT if timeout is DEFAULT else timeout)

    def _pattern_event(self, event: object) -> None:
        from . import signals

        observe_event(self, event)
        signals.send_pattern_event(self, event)

    def validate_key(self, key: str) -> None:
        # Ours is the stricter check (memcached's 250 limit is on the UTF-8
        # bytes, where Django counts characters) and the cheaper one, run per
        # key on every call; a key it refuses gets Django's own message first,
        # word for word that of its memcached backends.
        try:
            key_bytes(key)
        except InvalidKeyError as exc:
            for warning in memcache_key_warnings(key):
                raise InvalidCacheKey(warning) from exc
            raise InvalidCacheKey(str(exc)) from exc

    # -- Django's cache API, sync and async --------------------------------------
    #
    # Each pair shares its conventions (key making and validation, version,
    # timeouts, the item size limit, return values) through the pure helpers
    # below; the async form differs only by awaiting ``avalues`` where the sync
    # one calls ``values``.  Nothing here hops to a thread: Django's defaults
    # (``BaseCache.aget`` and friends) run the sync method through
    # ``sync_to_async`` and loop ``aget_many`` over ``aget``.

    def add(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> bool:
        key, expire = self._write_args(key, timeout, version)
        with _size_limited(key) as outcome:
            outcome.stored = self._cache.add(key, value, expire)
        return outcome.stored

    async def aadd(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> bool:
        key, expire = self._write_args(key, timeout, version)
        with _size_limited(key) as outcome:
            outcome.stored = await self.avalues.add(key, value, expire)
        return outcome.stored

    async def aget(self, key: Any, default: Any = None, version: Any = None) -> Any:
        return await self.avalues.get(self.make_and_validate_key(key, version=version), default)

    def set(  # type: ignore[override]  # says whether it stored; Django's returns None
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> bool:
        """Store ``value``; return False (never raise) when it was not stored.

        As in Django's memcached backends, a failed set deletes the old value so
        that readers never see data older than the write that failed (memcached
        refuses values over its 1 MB item limit).
        """
        key, expire = self._write_args(key, timeout, version)
        with _size_limited(key) as outcome:
            outcome.stored = self._cache.set(key, value, expire)
        if not outcome.stored:
            self._cache.delete(key)
        return outcome.stored

    async def aset(  # type: ignore[override]  # as set()
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> bool:
        """See :meth:`set`."""
        key, expire = self._write_args(key, timeout, version)
        with _size_limited(key) as outcome:
            outcome.stored = await self.avalues.set(key, value, expire)
        if not outcome.stored:
            await self.avalues.delete(key)
        return outcome.stored

    async def atouch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None) -> bool:
        key, expire = self._write_args(key, timeout, version)
        return bool(await self.avalues.touch(key, expire))

    async def adelete(self, key: Any, version: Any = None) -> bool:
        return bool(await self.avalues.delete(self.make_and_validate_key(key, version=version)))

    def get_many(self, keys: Iterable[Any], version: Any = None) -> dict[Any, Any]:
        key_map = self._key_map(keys, version)
        return _as_given(self._cache.get_many(list(key_map)), key_map)

    async def aget_many(self, keys: Iterable[Any], version: Any = None) -> dict[Any, Any]:
        """See ``get_many``: one call to the store (one pipelined request per server)."""
        key_map = self._key_map(keys, version)
        return _as_given(await self.avalues.get_many(list(key_map)), key_map)

    def incr(self, key: Any, delta: int = 1, version: Any = None) -> int:
        key = self.make_and_validate_key(key, version=version)
        counter = self._cache.decr if delta < 0 else self._cache.incr  # no negative deltas
        return _counted(key, counter(key, abs(delta)))

    async def aincr(self, key: Any, delta: int = 1, version: Any = None) -> int:
        key = self.make_and_validate_key(key, version=version)
        counter = self.avalues.decr if delta < 0 else self.avalues.incr
        return _counted(key, await counter(key, abs(delta)))

    def set_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> list[Any]:
        """Store every value; return the keys that failed, as Django does."""
        key_map = self._key_map(data, version)
        failed = self._cache.set_many(_made_values(data, key_map), self._expire(timeout))
        return [key_map[k] for k in failed]

    async def aset_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> list[Any]:
        """See :meth:`set_many`."""
        key_map = self._key_map(data, version)
        failed = await self.avalues.set_many(_made_values(data, key_map), self._expire(timeout))
        return [key_map[k] for k in failed]

    def delete_many(self, keys: Iterable[Any], version: Any = None) -> None:
        self._cache.delete_many(list(self._key_map(keys, version)))

    async def adelete_many(self, keys: Iterable[Any], version: Any = None) -> None:
        await self.avalues.delete_many(list(self._key_map(keys, version)))

    async def aclear(self) -> None:
        await self.avalues.flush_all()

    # Django's own aincr_version/adecr_version/ahas_key/adecr are built on the
    # methods above, so they are native too; aclose() does nothing, as close().
    # aget_or_set is StampedeMixin's: leased, as get_or_set is.

    # -- the conventions both forms share --

    def _write_args(self, key: Any, timeout: Any, version: Any) -> tuple[str, int]:
        return self.make_and_validate_key(key, version=version), self._expire(timeout)

    def _expire(self, timeout: Any) -> int:
        return self.get_backend_timeout(timeout)

    def _key_map(self, keys: Iterable[Any], version: Any) -> dict[str, Any]:
        """The made key of each key as given (validated before any I/O)."""
        return {self.make_and_validate_key(key, version=version): key for key in keys}

    def close(self, **kwargs: Any) -> None:
        # Django calls close() after every request.  Connections are pooled per
        # process and node health must survive, so there is nothing to drop here
        # (like PyLibMCCache, unlike PyMemcacheCache which reconnects each time).
        pass


class _Stored:
    """What a write answered: False until the store says otherwise."""

    stored: bool = False


@contextmanager
def _size_limited(key: str) -> Iterator[_Stored]:
    """Answer False (logged) for a value over memcached's item size limit, as Django does.

    A sync context manager, so a sync call and an awaited one share it.
    """
    outcome = _Stored()
    try:
        yield outcome
    except ValueTooLargeError:
        logger.warning("value for cache key %r is over the item size limit", key)
        outcome.stored = False


def _as_given(found: Mapping[Any, Any], key_map: Mapping[Any, Any]) -> dict[Any, Any]:
    """``found`` (keyed by made keys) keyed by the keys as the caller gave them."""
    return {key_map[k]: v for k, v in found.items()}


def _made_values(data: Mapping[Any, Any], key_map: Mapping[str, Any]) -> dict[str, Any]:
    return {made: data[key] for made, key in key_map.items()}


def _counted(key: str, value: int | None) -> int:
    """``incr``'s answer; a missing key is Django's ValueError."""
    if value is None:
        raise ValueError(f"Key '{key}' not found")
    return value


def _improperly_configured(exc: ConfigurationError) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"django-mcpatterns cache configuration: {exc}")


def _with_signing_keys(options: Mapping[str, Any]) -> dict[str, Any]:
    """``OPTIONS``, with keys derived from ``SECRET_KEY`` when ``signed`` is True without one.

    ``SECRET_KEY_FALLBACKS`` verify too, so rotating the secret as Django
    documents does not turn every cached value into a miss at once.
    """
    return with_derived_keys(
        options,
        lambda: [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ())],
    )


def _named_for_instrumentation(
    options: Mapping[str, Any], location: str | list[str]
) -> Mapping[str, Any]:
    """``OPTIONS``, with the cache's alias as ``instrumentation_name`` when instrumented.

    Django hands a backend a copy of its ``CACHES`` entry without the alias;
    the entry's ``OPTIONS`` mapping is the very object of the settings, so
    it names the alias, with ``LOCATION``: settings often share one
    ``OPTIONS`` dict between caches (equal entries share one cluster anyway).
    """
    if not options.get("instrumentation") or "instrumentation_name" in options:
        return options
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
    return {**options, "instrumentation_name": alias}


def _without_instrumentation(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``OPTIONS`` without the instrumentation options, once they are checked.

    The embedded store sends nothing over a wire: a project that shares its
    ``OPTIONS`` between memcached and the embedded backend (development) may
    keep them, and they measure nothing there.
    """
    if not any(name in options for name in INSTRUMENTATION_OPTIONS):
        return options
    check_installed(options.get("instrumentation", ()))
    return {k: v for k, v in options.items() if k not in INSTRUMENTATION_OPTIONS}


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


class KetamaMemcacheCache(_StoreCache):
    """Memcached cluster with ketama routing compatible with libmemcached,
    twemproxy, libketama and spymemcached (``OPTIONS["ketama"]``)."""

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(server, params)
        try:
            self._servers = parse_servers(server)
            options = ClusterOptions.from_mapping(
                self._scoped(_with_signing_keys(_named_for_instrumentation(self._options, server)))
            )
            # Built here so that ring errors (twemproxy names on another variant,
            # two servers hashing alike) surface now; nothing connects before use.
            self._cluster = shared_cluster(
                self._servers,
                options,
                on_node_event=_send_node_signal,
                on_value_refused=_send_cluster_refused_signal,
            )
        except ConfigurationError as exc:
            raise _improperly_configured(exc) from exc

    def _scoped(self, options: dict[str, Any]) -> dict[str, Any]:
        """``OPTIONS``, with ``replicate`` prefixes matched on the caller's key.

        With Django's own key function the key sent is ``KEY_PREFIX:version:key``:
        the prefixes are matched after it.  A custom ``KEY_FUNCTION`` makes keys
        of its own shape, so the prefixes are matched on the key it makes.
        """
        ours = self.key_func is default_key_func
        if ours and options.get("replicate") and "replicate_scope" not in options:
            options = {**options, "replicate_scope": re.escape(self.key_prefix) + r":\d+:"}
        return options

    @property
    def client_servers(self) -> list[str]:
        return [server.node for server in self._servers]

    @property
    def _max_item_size(self) -> int:
        return self._cluster.options.max_item_size

    @property
    def store(self) -> Cluster:
        """The Cluster behind this cache."""
        return self._cluster

    @property
    def astore(self) -> AsyncCluster:
        """The Cluster's asyncio twin (same servers, node health and serde; its own connections)."""
        return self._cluster.aio


class LocMemPatternsCache(_StoreCache):
    """The embedded default: an in-process store with memcached's semantics.

    Every thread of a process shares the data of one ``LOCATION`` name, as with
    Django's ``LocMemCache``.  ``OPTIONS``: ``max_bytes`` (total memory before
    least-recently-used items are evicted), ``max_item_size``, and the
    cluster's ``serializer`` and signing options, so values behave as they
    will on memcached.
    """

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(server, params)
        try:
            options = _without_instrumentation(self._options)
            self._memory_options = memory_options(options)
            self._serde_options = SerdeOptions.from_mapping(_with_signing_keys(options))
        except ConfigurationError as exc:
            raise _improperly_configured(exc) from exc
        self._name = server if isinstance(server, str) else ";".join(server)

    @property
    def _max_item_size(self) -> int:
        return int(self._memory_options.get("max_item_size", 1024 * 1024))

    @property
    def store(self) -> MemoryStore:
        """The MemoryStore behind this cache (shared by every alias naming its LOCATION)."""
        return self._memory

    @cached_property
    def _memory(self) -> MemoryStore:
        # One LOCATION, one store: aliases naming it must agree on how values are
        # encoded (serializer, signing), or the first one's would apply to all.
        try:
            return shared_memory_store(
                self._name,
                self._serde_options,
                on_refused=functools.partial(_send_refused_signal, MemoryStore),
                **self._memory_options,
            )
        except ConfigurationError as exc:
            raise _improperly_configured(exc) from exc

    @cached_property
    def astore(self) -> AsyncMemoryStore:
        """The embedded store for asyncio: the same data, on the event loop."""
        return AsyncMemoryStore(self._memory)
