"""Namespaces: keys invalidated together in O(1), read in one request.

The algorithm of :mod:`django_mcpatterns.core.namespaces` (read its docstring),
written once for an :class:`~django_mcpatterns.core.store.AsyncStore`; the sync
``Namespaces``, ``Namespace`` and ``NamespaceSlot`` are generated from it.  Key
derivation and the value format are ``_model.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from django_mcpatterns.core.concurrency import AsyncCompute
from django_mcpatterns.core.exceptions import (
    ContentionError,
    NodeUnavailableError,
    ValueTooLargeError,
)
from django_mcpatterns.core.keys import Key, Routed, key_bytes
from django_mcpatterns.core.leases import PLACEHOLDER, async_fill_missing
from django_mcpatterns.core.locks import async_strict_view
from django_mcpatterns.core.outages import WriteDegraded, degrades
from django_mcpatterns.core.stampede import AsyncStampede, Fetched, StampedePolicy
from django_mcpatterns.core.store import AsyncStore, CasToken
from django_mcpatterns.core.values.envelope import STALE, Envelope, Serde, with_envelopes
from django_mcpatterns.core.values.refusals import is_refused

from ._model import (
    FORMAT,
    INVALIDATE_ATTEMPTS,
    MAGIC,
    MAX_DEPTH,
    MISSING,
    REMEMBERED_PATHS,
    KeyMaker,
    Part,
    Path,
    layout_of,
    namespace_id,
    path_segment,
    plain_key,
    stale_of,
    unpack,
    version_of,
)

logger = logging.getLogger("django_mcpatterns.namespaces")

T = TypeVar("T")


class AsyncNamespaces:
    """What every namespace over one store shares: the store and the host's key rules.

    ``make_key(local, version)`` turns a local key (``ns:...``) into the final
    key (a Django backend: ``make_and_validate_key``); ``serde`` must be the
    store's (default: its ``serde`` attribute; the inner value of a tagged item
    goes through it, so serializers, signing and envelopes apply); ``clock`` (Unix
    seconds) seeds new versions and dates written values; ``stampede(store)``
    builds the :class:`~django_mcpatterns.core.stampede.Stampede` that ``get_or_compute`` runs on;
    ``on_event`` hears of invalidations given up on
    (:class:`~django_mcpatterns.core.outages.WriteDegraded`).

    The keys derived for a namespace (ids and version keys: percent-encoding
    and the host's key rule) are remembered for the last
    :data:`REMEMBERED_PATHS` namespaces: decorators and template tags call
    ``cache.namespace(...)`` on every use.
    """

    __slots__ = ("_paths", "clock", "degrade", "make_key", "on_event", "serde", "stampede", "store")

    def __init__(
        self,
        store: AsyncStore,
        *,
        make_key: KeyMaker = plain_key,
        serde: Serde | None = None,
        clock: Callable[[], float] = time.time,
        stampede: Callable[[AsyncStore], AsyncStampede] = AsyncStampede,
        on_event: Callable[[WriteDegraded], object] | None = None,
    ) -> None:
        self.store = store
        self.on_event = on_event
        self.degrade = degrades(store)
        self.make_key = make_key
        self.serde = with_envelopes(serde or getattr(store, "serde", None), clock=clock)
        self.clock = clock
        self.stampede = stampede
        self._paths: dict[Path, tuple[str, tuple[Routed, ...]]] = {}

    def namespace(self, *parts: Part, soft: bool = False) -> AsyncNamespace:
        """The namespace named by ``parts`` (see :class:`Namespace`)."""
        return AsyncNamespace(self, (path_segment(parts),), soft)

    async def invalidate(self, *parts: Part) -> int:
        """Invalidate the namespace named by ``parts``; return its new version."""
        return await self.namespace(*parts).invalidate()

    def new_version(self) -> int:
        """A first version for a (re)created namespace: microseconds since the epoch."""
        return int(self.clock() * 1_000_000)

    def keys_of(self, path: Path) -> tuple[str, tuple[Routed, ...]]:
        """The id of the namespace ``path`` and the version key of each of its levels."""
        found = self._paths.get(path)
        if found is None:
            ids = [namespace_id(path[: level + 1]) for level in range(len(path))]
            made = [key_bytes(self.make_key(f"ns:{i}", None)) for i in ids]
            # The root's version key routes every key below it.
            found = ids[-1], tuple(Routed(key, made[0]) for key in made)
            if len(self._paths) >= REMEMBERED_PATHS:
                self._paths.clear()  # forget them all: simple, and safe under threads
            self._paths[path] = found
        return found


class AsyncNamespace:
    """Keys invalidated together: ``invalidate()`` is one ``incr``, a read is one request.

    ``expire`` arguments are memcached exptimes; ``timeout`` of
    :meth:`get_or_compute` is the soft timeout in seconds (:mod:`django_mcpatterns.core.stampede`).
    ``version`` is passed to the host's key rule with the value's key.
    Safe to share between threads and tasks; cheap to create (no I/O).
    """

    __slots__ = ("_ctx", "_id", "_layout", "_route", "_version_keys", "depth", "path", "soft")

    def __init__(self, context: AsyncNamespaces, path: Path, soft: bool = False) -> None:
        if len(path) > MAX_DEPTH:
            raise ValueError(f"namespaces nest at most {MAX_DEPTH} levels deep")
        self._ctx = context
        self.path = path
        self.depth = len(path)
        self._layout = layout_of(self.depth)
        self.soft = soft
        self._id, self._version_keys = context.keys_of(path)
        self._route = self._version_keys[0].route

    def __repr__(self) -> str:
        levels = " / ".join(repr(segment) for segment in self.path)
        return f"<{type(self).__name__} {levels}{' soft' if self.soft else ''}>"

    # -- structure --

    def namespace(self, *parts: Part, soft: bool | None = None) -> AsyncNamespace:
        """A namespace nested in this one: invalidating this one invalidates it too.

        ``soft`` defaults to this namespace's.
        """
        return AsyncNamespace(
            self._ctx, (*self.path, path_segment(parts)), self.soft if soft is None else soft
        )

    def key(self, key: Any, *, version: Any = None) -> Routed:
        """The final memcached key of ``key`` in this namespace, routed by the root's version key.

        A :class:`~django_mcpatterns.core.keys.Routed`, not bytes: it cannot be turned into a key
        that routes on its own bytes (to another server than the namespace's) by accident.
        """
        made = self._ctx.make_key(f"ns:{self._id}|{key}", version)
        # Validated where it is used: every Store runs placed() before any I/O.
        return Routed(made.encode() if isinstance(made, str) else made, self._route)

    async def versions(self) -> tuple[int | None, ...]:
        """The current version of each level, outermost first (None: not created yet)."""
        versions, _ = await self._fetch([])
        return versions

    # -- reads --

    async def get(self, key: Any, default: Any = None, *, version: Any = None) -> Any:
        made = self.key(key, version=version)
        versions, found = await self._fetch([made])
        value = self._open(made, found.get(made, MISSING), versions)
        return default if value is MISSING else value

    async def get_many(self, keys: Iterable[Any], *, version: Any = None) -> dict[Any, Any]:
        """Return the valid values of ``keys`` (hits only), keyed by the keys as given."""
        made = {self.key(key, version=version): key for key in keys}
        versions, found = await self._fetch(list(made))
        hits = {}
        for made_key, key in made.items():
            value = self._open(made_key, found.get(made_key, MISSING), versions)
            if value is not MISSING:
                hits[key] = value
        return hits

    # -- writes --

    async def set(self, key: Any, value: Any, expire: int = 0, *, version: Any = None) -> bool:
        """Store ``value`` under the current versions; False when it was not stored."""
        made = self.key(key, version=version)
        return await self._store(made, value, await self._current(), expire)

    async def set_many(
        self, values: Mapping[Any, Any], expire: int = 0, *, version: Any = None
    ) -> list[Any]:
        """Store every value; return the keys that were *not* stored (as Django does)."""
        made = {self.key(key, version=version): key for key in values}
        versions = await self._current()
        tagged = {m: self._pack(m, values[key], versions) for m, key in made.items()}
        return [made[m] for m in await self._ctx.store.set_many(tagged, expire)]

    async def add(self, key: Any, value: Any, expire: int = 0, *, version: Any = None) -> bool:
        """Store ``value`` unless the key holds a valid value; return whether it was stored.

        An invalidated value does not count: it is replaced (``cas``), so ``add``
        fails only on a value of the current versions, or when another writer
        replaced the same invalidated value first.
        """
        made = self.key(key, version=version)
        store = self._ctx.store
        found = await store.gets_many([*self._version_keys, made])
        versions = [version_of(found[k][0] if k in found else None, k) for k in self._version_keys]
        slot = found.get(made)
        if slot is not None and unpack(made, slot[0], self.depth, self._layout)[5:] == tuple(
            versions
        ):
            return False
        data = self._pack(made, value, await self._complete(versions))
        try:
            if slot is None:
                return await store.add(made, data, expire)
            return bool(await store.cas(made, data, slot[1], expire))
        except ValueTooLargeError:
            logger.warning("value for cache key %r is over the item size limit", made)
            return False

    async def delete(self, key: Any, *, version: Any = None) -> bool:
        """Delete ``key``'s item; return whether there was one (valid or invalidated)."""
        return await self._ctx.store.delete(self.key(key, version=version))

    async def delete_many(self, keys: Iterable[Any], *, version: Any = None) -> None:
        await self._ctx.store.delete_many([self.key(key, version=version) for key in keys])

    async def get_or_set(
        self, key: Any, default: Any, expire: int = 0, *, version: Any = None
    ) -> Any:
        """Return the value of ``key``, or store ``default`` (called if callable) and return it.

        The stored value is tagged with the versions read before ``default`` was
        computed, and missing version keys are created *before* it is computed:
        an invalidation meanwhile, on a warm or a cold namespace, leaves it invalid.
        """
        made = self.key(key, version=version)
        versions, found = await self._fetch([made])
        value = self._open(made, found.get(made, MISSING), versions)
        if value is not MISSING:
            return value
        slot = AsyncNamespaceSlot(self, made, self._ctx.store, seen=await self._complete(versions))
        return await async_fill_missing(slot, made, default, expire)  # type: ignore[arg-type]

    async def get_or_compute(
        self,
        key: Any,
        compute: AsyncCompute[T],
        timeout: float | None,
        *,
        version: Any = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """Stampede-protected :meth:`get_or_set` with soft expiry
        (:mod:`django_mcpatterns.core.stampede`)."""
        fetched = await self.fetch(
            key, compute, timeout, version=version, policy=policy, should_cache=should_cache
        )
        return fetched.value

    async def fetch(
        self,
        key: Any,
        compute: AsyncCompute[T],
        timeout: float | None,
        *,
        version: Any = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> Fetched[T]:
        """Like :meth:`get_or_compute`, saying how the value was obtained."""
        made = self.key(key, version=version)
        held = await self._near_fresh(made)
        if held is not None:
            return Fetched(held.value, "fresh", held)
        slot = AsyncNamespaceSlot(self, made, self._ctx.store)
        stampede = self._ctx.stampede(slot)  # type: ignore[arg-type]
        return await stampede.fetch(
            made, compute, timeout, policy=policy, should_cache=should_cache
        )

    async def recompute(
        self,
        key: Any,
        compute: AsyncCompute[T],
        timeout: float | None,
        *,
        version: Any = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """Compute the value now (no lock) and store it for :meth:`get_or_compute`; return it.

        Tagged with the versions read before computing, like every computed value.
        """
        made = self.key(key, version=version)
        slot = AsyncNamespaceSlot(self, made, self._ctx.store, seen=await self._current())
        stampede = self._ctx.stampede(slot)  # type: ignore[arg-type]
        return await stampede.recompute(
            made, compute, timeout, policy=policy, should_cache=should_cache
        )

    # -- invalidation --

    async def invalidate(self) -> int:
        """Invalidate every key of this namespace and of those nested in it; return the version.

        One ``incr``.  When the namespace's server cannot take it, the version
        key is deleted there, now or before the server serves again (its
        journal): the namespace's values are never read as current afterwards.
        Then 0 is returned (``OPTIONS["on_outage"] = "degrade"``, the default),
        or :class:`~django_mcpatterns.core.exceptions.NodeUnavailableError` raised (``"raise"``).
        """
        key = self._version_keys[-1]
        try:
            return await self._bump(key)
        except NodeUnavailableError as exc:
            context = self._ctx
            await context.store.forget(key)
            if not context.degrade:
                raise
            logger.warning("namespace %r not invalidated now (%s): repaired later", key, exc)
            if context.on_event is not None:
                try:
                    context.on_event(WriteDegraded(key, "invalidate_namespace", exc))
                except Exception:
                    logger.exception("write_degraded receiver failed")
            return 0

    async def _bump(self, key: Routed) -> int:
        store = async_strict_view(self._ctx.store)
        for _ in range(INVALIDATE_ATTEMPTS):
            bumped = await store.incr(key, 1)
            if bumped is not None:
                return bumped
            created = self._ctx.new_version()
            if await store.add(key, b"%d" % created):
                return created
            # A writer created the key between our incr and add; it may have
            # read the data before the change: bump that version too.
        raise ContentionError(
            f"namespace version key {key!r} kept disappearing between incr and add"
        )

    async def invalidate_namespace(self, *parts: Part) -> int:
        """Invalidate the namespace ``parts`` nested in this one; return its new version."""
        return await self.namespace(*parts).invalidate()

    # -- steps (also used by the slot) --

    async def _near_fresh(self, key: Routed) -> Envelope | None:
        """With a near cache in front of the store (:mod:`django_mcpatterns.core.near`): the
        fresh value of ``key`` and its versions, held near (or read through it, then held);
        None otherwise, for the stampede to decide."""
        held_many = getattr(self._ctx.store, "held_many", None)
        if held_many is None:
            return None
        found = held_many([*self._version_keys, key])
        if found is None:
            versions, found = await self._fetch([key])
        else:
            versions = tuple([version_of(found.get(k), k) for k in self._version_keys])
        value = self._open(key, found.get(key, MISSING), versions, envelopes=True)
        if type(value) is Envelope and not value.pending and value.fresh(self._ctx.clock()):
            return value
        return None

    async def _fetch(self, keys: list[Key]) -> tuple[tuple[int | None, ...], dict[Key, Any]]:
        """One multi-get of the version keys and ``keys``: (versions, hits)."""
        found = await self._ctx.store.get_many([*self._version_keys, *keys])
        return tuple([version_of(found.get(k), k) for k in self._version_keys]), found

    def _open(
        self,
        key: Routed,
        raw: Any,
        versions: tuple[int | None, ...],
        *,
        soft: bool = False,
        envelopes: bool = False,
    ) -> Any:
        """The value in ``raw`` if its versions are current, else a miss (soft: stale).

        ``envelopes``: a soft-expiry envelope inside as an :class:`Envelope`
        (the stampede reader's explicit path, :mod:`django_mcpatterns.core.values.envelope`).
        """
        if raw is MISSING:
            return MISSING
        fields = unpack(key, raw, self.depth, self._layout)
        current = fields[5:] == versions
        if not current and not soft:
            return MISSING
        # The serde sees the key memcached stores (a signature binds those bytes).
        serde = self._ctx.serde
        decode = serde.deserialize_envelope if envelopes else serde.deserialize
        value = decode(key.key, raw[self._layout.size :], fields[4])
        if value is STALE:
            return MISSING  # past its soft expiry: plain reads miss (get_or_compute sees it)
        if is_refused(value):
            return MISSING  # the serde refused the item (serializers.py): a miss, logged there
        return value if current else stale_of(value, fields[3])

    async def _current(self) -> tuple[int, ...]:
        """The versions to tag a write with now (one request; creates missing levels)."""
        versions, _ = await self._fetch([])
        return await self._complete(versions)

    async def _complete(self, versions: Iterable[int | None]) -> tuple[int, ...]:
        """``versions`` with every missing level created, for a write about to happen."""
        complete = []
        for key, found in zip(self._version_keys, versions, strict=True):
            complete.append(await self._create(key) if found is None else found)
        return tuple(complete)

    async def _create(self, key: Routed) -> int:
        store = self._ctx.store
        created = self._ctx.new_version()
        if await store.add(key, b"%d" % created):
            return created
        # Lost the race to another creator: use its version.  Unreachable, the
        # write that follows fails too, so our version is as good as any.
        found = version_of(await store.get(key), key)
        return created if found is None else found

    def _pack(self, key: Routed, value: Any, versions: tuple[int, ...]) -> bytes:
        data, flags = self._ctx.serde.serialize(key.key, value)
        if not isinstance(data, bytes):
            data = str(data).encode()  # pymemcache sends non-bytes output (ints) as text
        depth = len(versions)
        header = layout_of(depth).pack(MAGIC, FORMAT, depth, self._ctx.clock(), flags, *versions)
        return header + data

    async def _store(self, key: Routed, value: Any, versions: tuple[int, ...], expire: int) -> bool:
        try:
            return await self._ctx.store.set(key, self._pack(key, value, versions), expire)
        except ValueTooLargeError:
            # memcached (and MemoryStore) dropped the old item: nothing stale remains.
            logger.warning("value for cache key %r is over the item size limit", key)
            return False


class AsyncNamespaceSlot:
    """The store :class:`~django_mcpatterns.core.stampede.Stampede` runs on for one namespaced key.

    Reads of that key go through the namespace (versions and value in one
    request; an invalidated value is a miss, or stale in a soft namespace) and
    remember the versions they saw; the computed value is stored tagged with
    them.  Other keys (the recompute lock) go to the store unchanged.  One per
    call, used by one thread (or task) at a time.
    """

    def __init__(
        self,
        namespace: AsyncNamespace,
        key: Routed,
        store: AsyncStore,
        seen: tuple[int, ...] | None = None,
    ) -> None:
        self._ns = namespace
        self._key = key
        self._store = store
        self._seen = seen

    async def get(self, key: Key, default: Any = None) -> Any:
        if key != self._key:
            return await self._store.get(key, default)
        hits = await self.get_many([key])
        return hits.get(key, default)

    async def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return await self._read_many(keys, envelopes=False)

    async def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return await self._read_many(keys, envelopes=True)

    async def _read_many(self, keys: Iterable[Key], *, envelopes: bool) -> dict[Key, Any]:
        keys = list(keys)
        if self._key not in keys:
            return await self._store.get_many(keys)
        others = [k for k in keys if k != self._key]
        versions, found = await self._ns._fetch([self._key, *others])
        self._seen = await self._ns._complete(versions)
        hits = {k: found[k] for k in others if k in found}
        value = self._ns._open(
            self._key,
            found.get(self._key, MISSING),
            versions,
            soft=self._ns.soft,
            envelopes=envelopes,
        )
        if value is not MISSING:
            hits[self._key] = value
        return hits

    async def set(self, key: Key, value: Any, expire: int = 0) -> bool:
        if key != self._key:
            return await self._store.set(key, value, expire)
        return await self._ns._store(self._key, value, await self._tags(), expire)

    # The lease on the value's key (core/leases.py) and the recompute lock's commands.

    async def add(self, key: Key, value: Any, expire: int = 0) -> bool:
        if key != self._key:
            return await self._store.add(key, value, expire)
        data = self._ns._pack(key, value, await self._tags())
        return await self._store.add(key, data, expire)

    async def gets(self, key: Key) -> tuple[Any, CasToken | None]:
        return await self._store.gets(self._other(key))

    async def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        """The value's key: its value through the namespace, and the item's cas.

        An item there that reads as a miss (invalidated, or another reader's
        placeholder) comes back as the lease placeholder, with its cas: a fill
        may replace it.
        """
        if key != self._key:
            return await self._store.gets_envelope(key)
        # One request, as every namespaced read: the version keys and the value, with its cas.
        version_keys = self._ns._version_keys
        found = await self._store.gets_many([*version_keys, key])
        versions = tuple(version_of(found[k][0] if k in found else None, k) for k in version_keys)
        self._seen = await self._ns._complete(versions)
        if key not in found:
            return None, None
        raw, cas = found[key]
        value = self._ns._open(key, raw, versions, soft=self._ns.soft, envelopes=True)
        return (PLACEHOLDER if value is MISSING else value), cas

    async def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        if key != self._key:
            return await self._store.cas(key, value, cas, expire)
        data = self._ns._pack(key, value, await self._tags())
        return await self._store.cas(key, data, cas, expire)

    async def delete(self, key: Key) -> bool:
        return await self._store.delete(self._other(key))

    def strict(self) -> AsyncNamespaceSlot:
        return AsyncNamespaceSlot(self._ns, self._key, async_strict_view(self._store))

    def _other(self, key: Key) -> Key:
        if key == self._key:
            raise TypeError("a namespaced value is written through the namespace only")
        return key

    async def _tags(self) -> tuple[int, ...]:
        """The versions a write is tagged with: those read before the compute began."""
        if self._seen is None:
            self._seen = await self._ns._current()
        return self._seen
