"""From a cache's configuration to what its backend serves, for Django and Flask alike.

A backend is thin: it makes keys and timeouts its framework's way and asks a
:class:`Binding` for everything else.  :func:`bind_cluster` and
:func:`bind_embedded` build one from the servers and the options mapping
(Django's ``LOCATION`` and ``OPTIONS``, Flask-Caching's ``CACHE_MEMCACHED_SERVERS``
and ``CACHE_OPTIONS``); each option is wired here, once: the signing keys,
the instrumentation name, the replicate scope, ``long_keys``, ``large_values``
and the embedded store's sizes.  A binding holds the store (shared by every
backend over the same servers and options), ``values`` (chunked with
``large_values="chunk"``), their asyncio forms and the pattern objects.

Where the frameworks differ on purpose, the difference is a parameter, a
:class:`Conventions` each backend fills in, never a second path:

* the embedded store: Django shares one per ``LOCATION`` name between aliases
  and threads, as its ``LocMemCache`` does (``shared=True``); Flask-Caching
  keeps one per backend instance, as its ``SimpleCache`` does;
* the secrets signing keys are derived from (``SECRET_KEY`` and its fallbacks,
  or the Flask app's ``SECRET_KEY``), the instrumentation label (Django: the
  alias), what precedes the caller's key in a made key (``replicate`` prefixes
  are matched after it), who hears of dead nodes and refused values, and how a
  configuration error is raised (``ImproperlyConfigured``, or a
  ``ConfigurationError`` naming the Flask setting).

Key making and timeouts stay with the backends: the pattern methods reach them
through the hooks of :class:`~django_mcpatterns.patterns.host.PatternHost`.
Imports neither Django nor Flask.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, Literal, TypeVar

from .core.aio import AsyncCluster
from .core.chunks import AsyncChunkedStore, ChunkedStore
from .core.client.migration import MigrationSource
from .core.cluster import Cluster, NodeEvent, shared_cluster
from .core.exceptions import ConfigurationError
from .core.memory import AsyncMemoryStore, MemoryStore, memory_options, shared_memory_store
from .core.migrate import AsyncMigratingStore, MigratingStore, Tally
from .core.near import AsyncNearStore, NearOptions, NearStats, NearStore, NearTable
from .core.observe import check_installed
from .core.options import INSTRUMENTATION_OPTIONS, ClusterOptions
from .core.servers import Server, parse_servers
from .core.sets import AppendLists, AppendSets, AsyncAppendLists, AsyncAppendSets, SetOptions
from .core.store import AsyncStore, Store
from .core.values import SerdeOptions, ValueRefused, with_derived_keys

__all__ = [
    "DEFAULT_ITEM_SIZE",
    "Binding",
    "ClusterBinding",
    "Conventions",
    "EmbeddedBinding",
    "Migration",
    "Setting",
    "bind_cluster",
    "bind_embedded",
    "per_store",
]

S = TypeVar("S", bound=Store, covariant=True)
A = TypeVar("A", bound=AsyncStore, covariant=True)
T = TypeVar("T")

Setting = Literal["servers", "options"]
"""Which part of a configuration an error is about (Flask names each its setting)."""

DEFAULT_ITEM_SIZE = 1024 * 1024  # memcached's -I default, the embedded store's too


def _as_is(setting: Setting, error: ConfigurationError) -> Exception:
    return error


@dataclass(frozen=True)
class Conventions:
    """What a framework decides for its backends; the binding follows it.

    secrets
        The secrets a signing key is derived from when ``signed`` is True with
        no key (Django: ``SECRET_KEY`` and ``SECRET_KEY_FALLBACKS``; Flask:
        the app's ``SECRET_KEY``); called only then.  None: derive nothing.
    label
        The instrumentation label when the options name none (Django: the
        cache's alias); called only when instrumentation is on.
    key_scope
        A regular expression for what precedes the caller's key in the key
        sent (Django: ``KEY_PREFIX:version:``; Flask: ``CACHE_KEY_PREFIX``),
        so that ``replicate`` prefixes match the caller's key; None matches
        them on the whole key (a custom ``KEY_FUNCTION``).
    shared
        The embedded store: one per name, shared by every backend naming it
        (Django), or one per binding (Flask-Caching).
    on_node_event, on_value_refused
        Listeners of the store: a server died or came back; a value was refused.
    clock
        The embedded store's clock, when it is the binding's own.
    refused
        Turns a configuration error about ``servers`` or ``options`` into the
        exception the framework raises.
    """

    secrets: Callable[[], Iterable[str | bytes | None]] | None = None
    label: Callable[[], str] | None = None
    key_scope: str | None = None
    shared: bool = False
    on_node_event: Callable[[NodeEvent], object] | None = None
    on_value_refused: Callable[[ValueRefused], object] | None = None
    clock: Callable[[], float] = time.time
    refused: Callable[[Setting, ConfigurationError], Exception] = _as_is


class Binding(Generic[S, A]):
    """A configured store, its values and pattern objects, for one backend.

    ``store`` is made on first use (the embedded store) or given (a shared
    cluster); everything else is made from it once, on first use.  The set
    and list objects are shared by every binding over the same store and set
    options: Django makes a backend per thread and per async task, and a set
    object remembers the layout of sharded sets.
    """

    def __init__(
        self,
        make_store: Callable[[], S],
        make_async: Callable[[S], A],
        *,
        max_item_size: int,
        large_values: str = "refuse",
        long_keys: str = "refuse",
        set_options: Callable[[Store], SetOptions] = SetOptions.for_store,
        near: NearOptions | None = None,
        key_scope: str | None = None,
    ) -> None:
        self._make_store = make_store
        self._make_async = make_async
        self.max_item_size = max_item_size
        self.chunked = large_values == "chunk"
        self.hash_long_keys = long_keys == "hash"
        self._set_options = set_options
        self.near_options = near
        self._key_scope = key_scope

    @cached_property
    def store(self) -> S:
        """The Store: a :class:`Cluster` or a :class:`MemoryStore`."""
        return self._make_store()

    @cached_property
    def async_store(self) -> A:
        """The same store for asyncio (the cluster's twin, or the embedded store on the loop)."""
        return self._make_async(self.store)

    @cached_property
    def values(self) -> Store:
        """What the cache API reads and writes: the store (or, during a ring migration, the
        migrating store over both rings), chunked with ``large_values="chunk"``."""
        plain = self._plain()
        return ChunkedStore(plain, self.max_item_size) if self.chunked else plain

    @cached_property
    def async_values(self) -> AsyncStore:
        """:attr:`values` for asyncio, chunked the same way."""
        plain = self._async_plain()
        return AsyncChunkedStore(plain, self.max_item_size) if self.chunked else plain

    def _plain(self) -> Store:
        return self.store

    def _async_plain(self) -> AsyncStore:
        return self.async_store

    # -- the near cache (OPTIONS["near_cache"]) ---------------------------------------

    @cached_property
    def near(self) -> NearTable | None:
        """This process's near cache of the store (one per store and options), or None."""
        options = self.near_options
        if options is None:
            return None
        scope, store = self._key_scope, self.store

        def report(stats: NearStats) -> None:
            observer = getattr(store, "observer", None)  # a cluster's: there may be none yet
            if observer is not None:
                observer.near(stats)

        return per_store(
            store,
            (NearTable, options, scope),
            lambda: NearTable(options, scope=scope, report=report),
        )

    @property
    def pattern_near(self) -> NearTable | None:
        """The table ``get_or_compute`` answers from and fills: :attr:`near` while
        :attr:`near_store` is in front of it (its writes drop the copies), else None
        (during a ring migration the patterns write the old ring, past the table)."""
        near = self.near
        return None if near is None or self.pattern_store is not self.store else near

    @cached_property
    def near_values(self) -> Store:
        """What the cache API reads and writes: :attr:`values` behind the near cache
        (:attr:`values` itself without one)."""
        near = self.near
        return self.values if near is None else NearStore(self.values, near)

    @cached_property
    def async_near_values(self) -> AsyncStore:
        """:attr:`near_values` for asyncio (the same table)."""
        near = self.near
        return self.async_values if near is None else AsyncNearStore(self.async_values, near)

    @cached_property
    def near_store(self) -> Store:
        """:attr:`pattern_store` behind the near cache, for ``get_or_compute`` and namespaces:
        their reads are held near and their writes drop copies.  Without one, or during a
        ring migration (the patterns then use the old ring, the table holds the values'),
        :attr:`pattern_store` itself."""
        near, store = self.near, self.pattern_store
        return store if near is None or store is not self.store else NearStore(store, near)

    @cached_property
    def async_near_store(self) -> AsyncStore:
        """:attr:`near_store` for asyncio (the same table)."""
        near, store = self.near, self.async_pattern_store
        if near is None or store is not self.async_store:
            return store
        return AsyncNearStore(store, near)

    # -- pattern objects ---------------------------------------------------------

    @property
    def pattern_store(self) -> Store:
        """The store the pattern objects use: :attr:`store`, except during a ring migration
        (the old ring's, in every stage: :mod:`~django_mcpatterns.core.migrate`)."""
        return self.store

    @property
    def async_pattern_store(self) -> AsyncStore:
        """:attr:`pattern_store` for asyncio."""
        return self.async_store

    @cached_property
    def set_options(self) -> SetOptions:
        """The thresholds of this cache's sets and lists."""
        return self._set_options(self.pattern_store)

    @cached_property
    def sets(self) -> AppendSets:
        return self._shared(AppendSets, lambda: AppendSets(self.pattern_store, self.set_options))

    @cached_property
    def async_sets(self) -> AsyncAppendSets:
        return self._shared(
            AsyncAppendSets, lambda: AsyncAppendSets(self.async_pattern_store, self.set_options)
        )

    @cached_property
    def lists(self) -> AppendLists:
        return self._shared(AppendLists, lambda: AppendLists(self.pattern_store, self.set_options))

    @cached_property
    def async_lists(self) -> AsyncAppendLists:
        return self._shared(
            AsyncAppendLists, lambda: AsyncAppendLists(self.async_pattern_store, self.set_options)
        )

    def _shared(self, kind: type[T], build: Callable[[], T]) -> T:
        return per_store(self.pattern_store, (kind, self.set_options), build)


@dataclass(frozen=True)
class Migration:
    """A cache's ring migration (``OPTIONS["migrate_from"]``): the old ring's clusters.

    ``patterns`` is the old ring with the cache's own options: the pattern
    objects' store in every stage, and the values' ring in the ``"old"`` one.
    ``fallback`` is the old ring the ``"new"`` stage reads misses from and
    deletes on: failover ``"miss"``, no gutter, never raising, so an old
    server that is down costs a miss and its deletes are journaled there.
    """

    source: MigrationSource
    patterns: Cluster
    fallback: Cluster
    tally: Tally

    @property
    def old(self) -> Cluster:
        """The old ring the values' store uses in this stage."""
        return self.patterns if self.source.reads == "old" else self.fallback


class ClusterBinding(Binding[Cluster, AsyncCluster]):
    """A binding over a shared :class:`Cluster`; ``servers`` as configured.

    ``migration``: the ring this cache migrates from, if any.
    """

    def __init__(
        self,
        servers: tuple[Server, ...],
        cluster: Cluster,
        *,
        migration: Migration | None = None,
        **values: Any,
    ) -> None:
        super().__init__(lambda: cluster, _twin, **values)
        self.servers = servers
        self.migration = migration

    @property
    def pattern_store(self) -> Store:
        migration = self.migration
        return self.store if migration is None else migration.patterns

    @property
    def async_pattern_store(self) -> AsyncStore:
        migration = self.migration
        return self.async_store if migration is None else migration.patterns.aio

    def _plain(self) -> Store:
        migration = self.migration
        if migration is None:
            return self.store
        return per_store(
            self.store,
            (MigratingStore, migration),
            lambda: MigratingStore(self.store, migration.old, migration.source, migration.tally),
        )

    def _async_plain(self) -> AsyncStore:
        migration = self.migration
        if migration is None:
            return self.async_store
        old = migration.old.aio
        return per_store(
            self.store,
            (AsyncMigratingStore, migration),
            lambda: AsyncMigratingStore(self.async_store, old, migration.source, migration.tally),
        )


class EmbeddedBinding(Binding[MemoryStore, AsyncMemoryStore]):
    """A binding over the embedded :class:`MemoryStore`."""


def _twin(cluster: Cluster) -> AsyncCluster:
    return cluster.aio


def bind_cluster(
    servers: str | Iterable[str],
    options: Mapping[str, Any],
    conventions: Conventions,
    *,
    set_options: Callable[[Store], SetOptions] = SetOptions.for_store,
) -> ClusterBinding:
    """Bind the memcached cluster of ``servers`` with ``options`` (a :class:`ClusterOptions`
    mapping): the process's one :class:`Cluster` for them, built now so that ring
    errors surface at configuration (nothing connects before the first request)."""
    try:
        parsed = parse_servers(servers if isinstance(servers, str) else list(servers))
    except ConfigurationError as exc:
        raise conventions.refused("servers", exc) from exc
    given = _with_label(options, conventions)
    given = _with_secrets(given, conventions)
    near = _near_options(given, conventions)
    if conventions.key_scope is not None and given.get("replicate"):
        given.setdefault("replicate_scope", conventions.key_scope)
    try:
        parsed_options = ClusterOptions.from_mapping(given)
    except ConfigurationError as exc:
        raise conventions.refused("options", exc) from exc
    source = parsed_options.migrate_from
    share = functools.partial(
        shared_cluster,
        on_node_event=conventions.on_node_event,
        on_value_refused=conventions.on_value_refused,
    )
    try:
        cluster = share(parsed, dataclasses.replace(parsed_options, migrate_from=None))
    except ConfigurationError as exc:
        raise conventions.refused("servers", exc) from exc
    migration = None
    if source is not None:
        try:
            migration = _migration(cluster, source, parsed_options, share)
        except ConfigurationError as exc:
            raise conventions.refused("options", exc) from exc
    return ClusterBinding(
        parsed,
        cluster,
        migration=migration,
        max_item_size=parsed_options.max_item_size,
        large_values=parsed_options.large_values,
        long_keys=parsed_options.long_keys,
        set_options=set_options,
        near=near,
        key_scope=conventions.key_scope,
    )


def _migration(
    cluster: Cluster,
    source: MigrationSource,
    options: ClusterOptions,
    share: Callable[[tuple[Server, ...], ClusterOptions], Cluster],
) -> Migration:
    """The old ring's clusters of a migration (see :class:`Migration`), shared per process."""
    old = dataclasses.replace(options, migrate_from=None, ketama=source.ketama)
    patterns = share(source.servers, old)
    bare = dataclasses.replace(old, failover="miss", gutter=(), raise_errors=False)
    fallback = share(source.servers, bare)
    tally = per_store(cluster, (Tally, source), lambda: _observed(Tally(), cluster))
    return Migration(source, patterns, fallback, tally)


def _observed(tally: Tally, cluster: Cluster) -> Tally:
    """``tally``, telling the cluster's observer (metrics) of each count as an event."""

    def tell(name: str, n: int) -> None:
        observer = cluster.observer
        if observer is not None:
            for _ in range(n):
                observer.event(f"migrate_{name}")

    tally.on_count = tell
    return tally


def bind_embedded(
    name: str,
    options: Mapping[str, Any],
    conventions: Conventions,
    *,
    set_options: Callable[[Store], SetOptions] = SetOptions.for_store,
) -> EmbeddedBinding:
    """Bind the embedded store called ``name`` (shared by name, or the binding's own).

    The options are checked now; the store is made on first use, when one
    shared by name must agree with it on how values are encoded.  The
    instrumentation options are accepted (a development configuration may
    share its options with production) and measure nothing: there is no wire.
    """
    try:
        given = _without_instrumentation(options)
        # Checked, and unused: the embedded store is in this process's memory already.
        if "near_cache" in given:
            NearOptions.from_option(given["near_cache"])
            given = {k: v for k, v in given.items() if k != "near_cache"}
        sizes = memory_options(given)
        serde = SerdeOptions.from_mapping(_with_secrets(given, conventions))
    except ConfigurationError as exc:
        raise conventions.refused("options", exc) from exc

    def make_store() -> MemoryStore:
        if not conventions.shared:
            built = serde.build(conventions.on_value_refused)
            return MemoryStore(**sizes, serde=built, clock=conventions.clock)
        try:
            return shared_memory_store(
                name, serde, on_refused=conventions.on_value_refused, **sizes
            )
        except ConfigurationError as exc:
            raise conventions.refused("options", exc) from exc

    return EmbeddedBinding(
        make_store,
        AsyncMemoryStore,
        max_item_size=sizes.get("max_item_size", DEFAULT_ITEM_SIZE),
        large_values=given.get("large_values", "refuse"),
        long_keys=given.get("long_keys", "refuse"),
        set_options=set_options,
    )


def _with_label(options: Mapping[str, Any], conventions: Conventions) -> dict[str, Any]:
    given = dict(options)
    named = "instrumentation_name" in given
    if conventions.label is not None and given.get("instrumentation") and not named:
        given["instrumentation_name"] = conventions.label()
    return given


def _with_secrets(options: Mapping[str, Any], conventions: Conventions) -> dict[str, Any]:
    if conventions.secrets is None:
        return dict(options)
    return with_derived_keys(options, conventions.secrets)


def _near_options(given: dict[str, Any], conventions: Conventions) -> NearOptions | None:
    """Take ``near_cache`` out of ``given`` (it is not the cluster's: aliases over the
    same servers share one cluster), parsed."""
    try:
        return NearOptions.from_option(given.pop("near_cache", None))
    except ConfigurationError as exc:
        raise conventions.refused("options", exc) from exc


def _without_instrumentation(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` without the instrumentation options, once they are checked."""
    if not any(name in options for name in INSTRUMENTATION_OPTIONS):
        return options
    check_installed(options.get("instrumentation", ()))
    return {k: v for k, v in options.items() if k not in INSTRUMENTATION_OPTIONS}


# -- objects kept per store ---------------------------------------------------------

_ATTRIBUTE = "_mcpatterns_pattern_objects"
_guard = threading.Lock()


def per_store(store: object, key: Hashable, build: Callable[[], T]) -> T:
    """The object ``build()`` made for ``store`` and ``key``, made on first use.

    Kept on the store object itself, under a lock: they go when it goes
    (``reset_shared_clusters()``, a test's throwaway cache), which a registry
    keyed by the store could not do, since a pattern object holds its store.
    A store without a ``__dict__`` gets a new object each time.
    """
    try:
        attributes: dict[str, Any] = vars(store)
    except TypeError:  # no __dict__
        return build()
    with _guard:
        made: dict[Hashable, Any] = attributes.setdefault(_ATTRIBUTE, {})
        # By identity too: a shallow copy of the store (Cluster.strict()) shares the dict.
        mine = (id(store), key)
        if mine not in made:
            made[mine] = build()
        found: T = made[mine]
        return found
