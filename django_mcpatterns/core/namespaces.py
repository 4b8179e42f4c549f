"""Namespaces: keys invalidated together in O(1), read in one request.

The recipe (memcached's programming tricks, "Deleting By Namespace"): a
*version key* per namespace, created with ``add`` from a time-based value and
bumped with ``incr`` to invalidate every key of the namespace at once.  Values
of an older version are never returned again and fall off the LRU.

One request per read, not the recipe's two
    The recipe reads the version, then the value.  Here every key of a
    namespace, and of the namespaces nested in it, is routed to the server of
    the *root* namespace's version key (a :class:`~.keys.Routed` key, honoured
    by the :class:`~.cluster.Cluster` only), the value carries the versions it was
    written under, and one multi-get to that one server reads the versions and
    the value together.  A value whose versions are not the current ones is a
    miss.  A nested namespace's value carries every level's version, so
    invalidating an outer namespace invalidates the inner ones.

Keys, before the backend's ``KEY_PREFIX``/``VERSION``
    ``ns:<id>`` is a namespace's version key and ``ns:<id>|<key>`` a value key.
    ``<id>`` is the parts percent-encoded (RFC 3986 unreserved characters stay,
    everything else, UTF-8 encoded, becomes ``%XX``), joined with ``:``, levels
    joined with ``/``: ``ns:org:1/user:42|profile``.  Over
    :data:`MAX_READABLE_ID` bytes it is ``#`` and a BLAKE2b-160 digest of that
    text instead.  So whatever the parts hold (spaces, newlines, unicode,
    megabytes) the id has no whitespace, control bytes, ``|`` or ``#`` and is
    at most 64 bytes: distinct namespaces never share a key, a value key is
    never a version key, and nothing can reach the protocol.  Parts are ``str``
    or ``int``; an int is its decimal text (as Django turns keys into text), so
    ``("user", 42)`` and ``("user", "42")`` are one namespace.

Versions
    Decimal text stored as raw bytes (so ``incr`` works whatever the serde),
    never expiring (evicted by the LRU only; every read refreshes them).  A
    missing version key is created with ``add`` of the microseconds since the
    epoch.  Versions are compared for equality, so a recreated key (evicted,
    server restarted) never matches the version older values carry, unless the
    namespace saw over a million invalidations per second of its life.

Tagged values (wire format)
    Raw bytes (flags 0, as the Store protocol keeps ``bytes``)::

        magic  format  depth  written_at   inner flags  versions       inner data
        b"ns"  u8 (=1) u8     f64 (Unix s) u32          depth x u64    ...
        big-endian

    The inner data and flags are the store's serde output for the value, so a
    soft-expiry :class:`~.envelope.Envelope` (:mod:`.stampede`) nests inside.
    Any other value under a value key raises :class:`~.exceptions.EncodingError`.

Writes
    ``set`` tags the value with the versions current when it is stored.
    ``get_or_set``, ``get_or_compute`` and ``recompute`` tag it with the
    versions read *before* computing it, so a value computed while the
    namespace was invalidated is stored already invalid.  A missing version
    key (first use, eviction, restart) is created before the value is
    computed, for the same reason: an invalidation during the compute then
    bumps that version instead of creating the one the value would be stored
    under.  So an invalidation during any namespaced compute wins, warm or
    cold, at every level.

Invalidation
    ``incr`` of the version key: one request.  On a missing key, ``add`` of a
    new time-based version; if that ``add`` loses a race with a writer creating
    the key, ``incr`` again (that writer may have read the data before the
    change).  It runs on the store's strict view: an unreachable server raises
    :class:`~.exceptions.NodeUnavailableError` rather than losing the
    invalidation silently.

Soft namespaces (``soft=True``)
    ``get_or_compute`` serves an invalidated value as *stale*: one caller
    recomputes it under the stampede lock while the others are served it
    (``get``, ``get_many`` and ``get_or_set`` still miss).  Likewise a
    ``get_or_compute`` value past its soft expiry is a miss for those plain
    reads, in any namespace (:mod:`.envelope`).

The guarantee
    Once :meth:`Namespace.invalidate` has returned, every read that starts
    later, in any process, misses every value written before it (soft
    namespaces: ``get_or_compute`` serves them stale, by choice).  The read
    fetches the version key from the same server in the same request, and
    memcached answers it after the ``incr``.  With ``failover="remap"`` an
    invalidation made while the namespace's server is out goes to the next
    server and is lost when the first one comes back, like any write during an
    outage: prefer ``"miss"`` (the default), where the namespace's keys and its
    version are out together.

Requests (steady state; ``d`` = nesting depth, all keys on one server)
    ``get``, ``get_many``, ``get_or_set`` hit, ``get_or_compute`` fresh: 1
    multi-get of ``d`` + n keys.  ``set``, ``set_many``: 2 (versions, then the
    write).  ``add``: 2 (``gets`` of versions and value, ``add``/``cas``).
    ``delete``, ``delete_many``, ``invalidate``: 1.  ``get_or_set`` miss: 4 (the
    lease of :mod:`.leases`: ``add`` of a placeholder, ``gets``, then a ``cas`` fill).
    A missing version key adds one ``add`` to the first write.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any, Final, TypeVar
from urllib.parse import quote

from .envelope import STALE, Envelope, Serde, with_envelopes
from .exceptions import ContentionError, EncodingError, ValueTooLargeError
from .keys import Key, PlainKey, Routed, key_bytes
from .leases import PLACEHOLDER, fill_missing
from .locks import authoritative
from .serializers import is_refused
from .stampede import Fetched, Stampede, StampedePolicy
from .store import CasToken, Store

__all__ = [
    "MAX_DEPTH",
    "MAX_READABLE_ID",
    "REMEMBERED_PATHS",
    "Namespace",
    "Namespaces",
    "namespace_id",
    "part_text",
]

logger = logging.getLogger("django_mcpatterns.namespaces")

T = TypeVar("T")
Part = str | int
Path = tuple[tuple[str, ...], ...]
KeyMaker = Callable[[str, Any], PlainKey]
"""``(local key, version) -> final key``: the host's key rules (prefix, version)."""

MAX_READABLE_ID: Final = 64
MAX_DEPTH: Final = 255  # the depth is one byte of the value header
REMEMBERED_PATHS: Final = 1024
MAGIC: Final = b"ns"
FORMAT: Final = 1
_INVALIDATE_ATTEMPTS = 5


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


_MISSING: Final = _Missing()


# -- key derivation ------------------------------------------------------------------


def part_text(part: Part) -> str:
    """The text of one namespace part: a ``str`` as is, an ``int`` in decimal."""
    if isinstance(part, str):
        return part
    if isinstance(part, int) and not isinstance(part, bool):
        return int.__repr__(part)  # decimal, also for IntEnum members
    raise TypeError(f"namespace parts are str or int, not {type(part).__name__}: {part!r}")


def _segment(parts: tuple[Part, ...]) -> tuple[str, ...]:
    if not parts:
        raise ValueError("a namespace needs at least one part")
    return tuple(part_text(part) for part in parts)


def namespace_id(path: Path) -> str:
    """The ``<id>`` of a namespace's keys: readable, or ``#`` and a digest when long.

    Percent-encoding leaves only ``A-Z a-z 0-9 _ . - ~`` and ``%XX``; ``:``
    separates parts and ``/`` levels, so the text is injective, and it never
    holds ``|`` (which ends the id in value keys) or ``#`` (which starts a
    digest).
    """
    readable = "/".join(
        ":".join(quote(part, safe="", errors="surrogatepass") for part in segment)
        for segment in path
    )
    if len(readable) <= MAX_READABLE_ID:
        return readable
    return "#" + hashlib.blake2b(readable.encode(), digest_size=20).hexdigest()


def _plain_key(key: str, version: Any) -> str:
    """The core's key rule: the local key, after ``<version>:`` when one is given."""
    return key if version is None else f"{version}:{key}"


# -- the value header ----------------------------------------------------------------


@lru_cache(maxsize=MAX_DEPTH + 1)
def _layout(depth: int) -> struct.Struct:
    """The header and versions of a value written at ``depth``, unpacked in one call."""
    return struct.Struct(f">2sBBdI{depth}Q")


def _unpack(key: Key, raw: Any, depth: int, layout: struct.Struct) -> tuple[Any, ...]:
    """``(magic, format, depth, written_at, flags, *versions)`` of a tagged value, or raise."""
    if type(raw) is not bytes or raw[:2] != MAGIC:
        found = f"{len(raw)} bytes" if isinstance(raw, bytes) else type(raw).__name__
        raise EncodingError(
            f"cache key {key!r} is a namespaced key but holds something else ({found}); "
            "only the namespace API writes namespaced keys"
        )
    if len(raw) < layout.size or raw[2] != FORMAT or raw[3] != depth:
        fmt, found_depth = (raw[2], raw[3]) if len(raw) >= 4 else ("?", "?")
        raise EncodingError(
            f"cache key {key!r} holds a namespaced value of format {fmt} and depth "
            f"{found_depth} ({len(raw)} bytes); this release reads format {FORMAT} "
            f"and the namespace is {depth} deep"
        )
    return layout.unpack_from(raw)


def _version(raw: Any, key: Key) -> int | None:
    """A version key's value as a number (None: missing)."""
    if raw is None:
        return None
    if type(raw) is bytes:
        try:
            return int(raw)  # memcached's incr may leave trailing spaces; int() skips them
        except ValueError:
            pass
    elif type(raw) is int:
        return raw
    raise EncodingError(f"namespace version key {key!r} holds {raw!r}, not a decimal counter")


def _stale(value: Any, written_at: float) -> Envelope:
    """An invalidated value as stampede sees it in a soft namespace: stale since written.

    Deterministic for the stored item, so a re-read after winning the recompute
    lock tells "still the invalidated value" from "refreshed meanwhile".
    """
    if type(value) is Envelope:
        return dataclasses.replace(value, soft_expiry=min(value.soft_expiry, written_at))
    return Envelope(value, soft_expiry=written_at)


# -- namespaces ------------------------------------------------------------------------


class Namespaces:
    """What every namespace over one store shares: the store and the host's key rules.

    ``make_key(local, version)`` turns a local key (``ns:...``) into the final
    key (a Django backend: ``make_and_validate_key``); ``serde`` must be the
    store's (default: its ``serde`` attribute; the inner value of a tagged item
    goes through it, so serializers, signing and envelopes apply); ``clock`` (Unix
    seconds) seeds new versions and dates written values; ``stampede(store)``
    builds the :class:`~.stampede.Stampede` that ``get_or_compute`` runs on.

    The keys derived for a namespace (ids and version keys: percent-encoding
    and the host's key rule) are remembered for the last
    :data:`REMEMBERED_PATHS` namespaces: decorators and template tags call
    ``cache.namespace(...)`` on every use.
    """

    __slots__ = ("_paths", "clock", "make_key", "serde", "stampede", "store")

    def __init__(
        self,
        store: Store,
        *,
        make_key: KeyMaker = _plain_key,
        serde: Serde | None = None,
        clock: Callable[[], float] = time.time,
        stampede: Callable[[Store], Stampede] = Stampede,
    ) -> None:
        self.store = store
        self.make_key = make_key
        self.serde = with_envelopes(serde or getattr(store, "serde", None), clock=clock)
        self.clock = clock
        self.stampede = stampede
        self._paths: dict[Path, tuple[str, tuple[Routed, ...]]] = {}

    def namespace(self, *parts: Part, soft: bool = False) -> Namespace:
        """The namespace named by ``parts`` (see :class:`Namespace`)."""
        return Namespace(self, (_segment(parts),), soft)

    def invalidate(self, *parts: Part) -> int:
        """Invalidate the namespace named by ``parts``; return its new version."""
        return self.namespace(*parts).invalidate()

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


class Namespace:
    """Keys invalidated together: ``invalidate()`` is one ``incr``, a read is one request.

    ``expire`` arguments are memcached exptimes; ``timeout`` of
    :meth:`get_or_compute` is the soft timeout in seconds (:mod:`.stampede`).
    ``version`` is passed to the host's key rule with the value's key.
    Thread-safe; cheap to create (no I/O).
    """

    __slots__ = ("_ctx", "_id", "_layout", "_route", "_version_keys", "depth", "path", "soft")

    def __init__(self, context: Namespaces, path: Path, soft: bool = False) -> None:
        if len(path) > MAX_DEPTH:
            raise ValueError(f"namespaces nest at most {MAX_DEPTH} levels deep")
        self._ctx = context
        self.path = path
        self.depth = len(path)
        self._layout = _layout(self.depth)
        self.soft = soft
        self._id, self._version_keys = context.keys_of(path)
        self._route = self._version_keys[0].route

    def __repr__(self) -> str:
        levels = " / ".join(repr(segment) for segment in self.path)
        return f"<Namespace {levels}{' soft' if self.soft else ''}>"

    # -- structure --

    def namespace(self, *parts: Part, soft: bool | None = None) -> Namespace:
        """A namespace nested in this one: invalidating this one invalidates it too.

        ``soft`` defaults to this namespace's.
        """
        return Namespace(
            self._ctx, (*self.path, _segment(parts)), self.soft if soft is None else soft
        )

    def key(self, key: Any, *, version: Any = None) -> Routed:
        """The final memcached key of ``key`` in this namespace, routed by the root's version key.

        A :class:`~.keys.Routed`, not bytes: it cannot be turned into a key that
        routes on its own bytes (to another server than the namespace's) by accident.
        """
        made = self._ctx.make_key(f"ns:{self._id}|{key}", version)
        # Validated where it is used: every Store runs placed() before any I/O.
        return Routed(made.encode() if isinstance(made, str) else made, self._route)

    def versions(self) -> tuple[int | None, ...]:
        """The current version of each level, outermost first (None: not created yet)."""
        return self._fetch([])[0]

    # -- reads --

    def get(self, key: Any, default: Any = None, *, version: Any = None) -> Any:
        made = self.key(key, version=version)
        versions, found = self._fetch([made])
        value = self._open(made, found.get(made, _MISSING), versions)
        return default if value is _MISSING else value

    def get_many(self, keys: Iterable[Any], *, version: Any = None) -> dict[Any, Any]:
        """Return the valid values of ``keys`` (hits only), keyed by the keys as given."""
        made = {self.key(key, version=version): key for key in keys}
        versions, found = self._fetch(list(made))
        hits = {}
        for made_key, key in made.items():
            value = self._open(made_key, found.get(made_key, _MISSING), versions)
            if value is not _MISSING:
                hits[key] = value
        return hits

    # -- writes --

    def set(self, key: Any, value: Any, expire: int = 0, *, version: Any = None) -> bool:
        """Store ``value`` under the current versions; False when it was not stored."""
        made = self.key(key, version=version)
        return self._store(made, value, self._current(), expire)

    def set_many(
        self, values: Mapping[Any, Any], expire: int = 0, *, version: Any = None
    ) -> list[Any]:
        """Store every value; return the keys that were *not* stored (as Django does)."""
        made = {self.key(key, version=version): key for key in values}
        versions = self._current()
        tagged = {m: self._pack(m, values[key], versions) for m, key in made.items()}
        return [made[m] for m in self._ctx.store.set_many(tagged, expire)]

    def add(self, key: Any, value: Any, expire: int = 0, *, version: Any = None) -> bool:
        """Store ``value`` unless the key holds a valid value; return whether it was stored.

        An invalidated value does not count: it is replaced (``cas``), so ``add``
        fails only on a value of the current versions, or when another writer
        replaced the same invalidated value first.
        """
        made = self.key(key, version=version)
        store = self._ctx.store
        found = store.gets_many([*self._version_keys, made])
        versions = [_version(found[k][0] if k in found else None, k) for k in self._version_keys]
        slot = found.get(made)
        if slot is not None and _unpack(made, slot[0], self.depth, self._layout)[5:] == tuple(
            versions
        ):
            return False
        data = self._pack(made, value, self._complete(versions))
        try:
            if slot is None:
                return store.add(made, data, expire)
            return bool(store.cas(made, data, slot[1], expire))
        except ValueTooLargeError:
            logger.warning("value for cache key %r is over the item size limit", made)
            return False

    def delete(self, key: Any, *, version: Any = None) -> bool:
        """Delete ``key``'s item; return whether there was one (valid or invalidated)."""
        return self._ctx.store.delete(self.key(key, version=version))

    def delete_many(self, keys: Iterable[Any], *, version: Any = None) -> None:
        self._ctx.store.delete_many([self.key(key, version=version) for key in keys])

    def get_or_set(self, key: Any, default: Any, expire: int = 0, *, version: Any = None) -> Any:
        """Return the value of ``key``, or store ``default`` (called if callable) and return it.

        The stored value is tagged with the versions read before ``default`` was
        computed, and missing version keys are created *before* it is computed:
        an invalidation meanwhile, on a warm or a cold namespace, leaves it invalid.
        """
        made = self.key(key, version=version)
        versions, found = self._fetch([made])
        value = self._open(made, found.get(made, _MISSING), versions)
        if value is not _MISSING:
            return value
        slot = _Slot(self, made, self._ctx.store, seen=self._complete(versions))
        return fill_missing(slot, made, default, expire)  # type: ignore[arg-type]

    def get_or_compute(
        self,
        key: Any,
        compute: Callable[[], T],
        timeout: float | None,
        *,
        version: Any = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """Stampede-protected :meth:`get_or_set` with soft expiry (:mod:`.stampede`)."""
        return self.fetch(
            key, compute, timeout, version=version, policy=policy, should_cache=should_cache
        ).value

    def fetch(
        self,
        key: Any,
        compute: Callable[[], T],
        timeout: float | None,
        *,
        version: Any = None,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> Fetched[T]:
        """Like :meth:`get_or_compute`, saying how the value was obtained."""
        made = self.key(key, version=version)
        stampede = self._ctx.stampede(_Slot(self, made, self._ctx.store))  # type: ignore[arg-type]
        return stampede.fetch(made, compute, timeout, policy=policy, should_cache=should_cache)

    def recompute(
        self,
        key: Any,
        compute: Callable[[], T],
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
        slot = _Slot(self, made, self._ctx.store, seen=self._current())
        stampede = self._ctx.stampede(slot)  # type: ignore[arg-type]
        return stampede.recompute(made, compute, timeout, policy=policy, should_cache=should_cache)

    # -- invalidation --

    def invalidate(self) -> int:
        """Invalidate every key of this namespace and of those nested in it; return the version.

        One ``incr``.  Raise :class:`~.exceptions.NodeUnavailableError` when the
        namespace's server cannot be reached.
        """
        store = authoritative(self._ctx.store)
        key = self._version_keys[-1]
        for _ in range(_INVALIDATE_ATTEMPTS):
            bumped = store.incr(key, 1)
            if bumped is not None:
                return bumped
            created = self._ctx.new_version()
            if store.add(key, b"%d" % created):
                return created
            # A writer created the key between our incr and add; it may have
            # read the data before the change: bump that version too.
        raise ContentionError(
            f"namespace version key {key!r} kept disappearing between incr and add"
        )

    def invalidate_namespace(self, *parts: Part) -> int:
        """Invalidate the namespace ``parts`` nested in this one; return its new version."""
        return self.namespace(*parts).invalidate()

    # -- steps (also used by _Slot) --

    def _fetch(self, keys: list[Key]) -> tuple[tuple[int | None, ...], dict[Key, Any]]:
        """One multi-get of the version keys and ``keys``: (versions, hits)."""
        found = self._ctx.store.get_many([*self._version_keys, *keys])
        return tuple([_version(found.get(k), k) for k in self._version_keys]), found

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
        (the stampede reader's explicit path, :mod:`.envelope`).
        """
        if raw is _MISSING:
            return _MISSING
        fields = _unpack(key, raw, self.depth, self._layout)
        current = fields[5:] == versions
        if not current and not soft:
            return _MISSING
        # The serde sees the key memcached stores (a signature binds those bytes).
        serde = self._ctx.serde
        decode = serde.deserialize_envelope if envelopes else serde.deserialize
        value = decode(key.key, raw[self._layout.size :], fields[4])
        if value is STALE:
            return _MISSING  # past its soft expiry: plain reads miss (get_or_compute sees it)
        if is_refused(value):
            return _MISSING  # the serde refused the item (serializers.py): a miss, logged there
        return value if current else _stale(value, fields[3])

    def _current(self) -> tuple[int, ...]:
        """The versions to tag a write with now (one request; creates missing levels)."""
        return self._complete(self._fetch([])[0])

    def _complete(self, versions: Iterable[int | None]) -> tuple[int, ...]:
        """``versions`` with every missing level created, for a write about to happen."""
        return tuple(
            self._create(key) if found is None else found
            for key, found in zip(self._version_keys, versions, strict=True)
        )

    def _create(self, key: Routed) -> int:
        store = self._ctx.store
        created = self._ctx.new_version()
        if store.add(key, b"%d" % created):
            return created
        # Lost the race to another creator: use its version.  Unreachable, the
        # write that follows fails too, so our version is as good as any.
        found = _version(store.get(key), key)
        return created if found is None else found

    def _pack(self, key: Routed, value: Any, versions: tuple[int, ...]) -> bytes:
        data, flags = self._ctx.serde.serialize(key.key, value)
        if not isinstance(data, bytes):
            data = str(data).encode()  # pymemcache sends non-bytes output (ints) as text
        depth = len(versions)
        return _layout(depth).pack(MAGIC, FORMAT, depth, self._ctx.clock(), flags, *versions) + data

    def _store(self, key: Routed, value: Any, versions: tuple[int, ...], expire: int) -> bool:
        try:
            return self._ctx.store.set(key, self._pack(key, value, versions), expire)
        except ValueTooLargeError:
            # memcached (and MemoryStore) dropped the old item: nothing stale remains.
            logger.warning("value for cache key %r is over the item size limit", key)
            return False


class _Slot:
    """The store :class:`~.stampede.Stampede` runs on for one namespaced key.

    Reads of that key go through the namespace (versions and value in one
    request; an invalidated value is a miss, or stale in a soft namespace) and
    remember the versions they saw; the computed value is stored tagged with
    them.  Other keys (the recompute lock) go to the store unchanged.  One per
    call, used by one thread at a time.
    """

    def __init__(
        self,
        namespace: Namespace,
        key: Routed,
        store: Store,
        seen: tuple[int, ...] | None = None,
    ) -> None:
        self._ns = namespace
        self._key = key
        self._store = store
        self._seen = seen

    def get(self, key: Key, default: Any = None) -> Any:
        if key != self._key:
            return self._store.get(key, default)
        return self.get_many([key]).get(key, default)

    def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return self._read_many(keys, envelopes=False)

    def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return self._read_many(keys, envelopes=True)

    def _read_many(self, keys: Iterable[Key], *, envelopes: bool) -> dict[Key, Any]:
        keys = list(keys)
        if self._key not in keys:
            return self._store.get_many(keys)
        others = [k for k in keys if k != self._key]
        versions, found = self._ns._fetch([self._key, *others])
        self._seen = self._ns._complete(versions)
        hits = {k: found[k] for k in others if k in found}
        value = self._ns._open(
            self._key,
            found.get(self._key, _MISSING),
            versions,
            soft=self._ns.soft,
            envelopes=envelopes,
        )
        if value is not _MISSING:
            hits[self._key] = value
        return hits

    def set(self, key: Key, value: Any, expire: int = 0) -> bool:
        if key != self._key:
            return self._store.set(key, value, expire)
        return self._ns._store(self._key, value, self._tags(), expire)

    # The lease on the value's key (core/leases.py) and the recompute lock's commands.

    def add(self, key: Key, value: Any, expire: int = 0) -> bool:
        if key != self._key:
            return self._store.add(key, value, expire)
        return self._store.add(key, self._ns._pack(key, value, self._tags()), expire)

    def gets(self, key: Key) -> tuple[Any, CasToken | None]:
        return self._store.gets(self._other(key))

    def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        """The value's key: its value through the namespace, and the item's cas.

        An item there that reads as a miss (invalidated, or another reader's
        placeholder) comes back as the lease placeholder, with its cas: a fill
        may replace it.
        """
        if key != self._key:
            return self._store.gets_envelope(key)
        # One request, as every namespaced read: the version keys and the value, with its cas.
        version_keys = self._ns._version_keys
        found = self._store.gets_many([*version_keys, key])
        versions = tuple(_version(found[k][0] if k in found else None, k) for k in version_keys)
        self._seen = self._ns._complete(versions)
        if key not in found:
            return None, None
        raw, cas = found[key]
        value = self._ns._open(key, raw, versions, soft=self._ns.soft, envelopes=True)
        return (PLACEHOLDER if value is _MISSING else value), cas

    def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        if key != self._key:
            return self._store.cas(key, value, cas, expire)
        return self._store.cas(key, self._ns._pack(key, value, self._tags()), cas, expire)

    def delete(self, key: Key) -> bool:
        return self._store.delete(self._other(key))

    def strict(self) -> _Slot:
        return _Slot(self._ns, self._key, authoritative(self._store))

    def _other(self, key: Key) -> Key:
        if key == self._key:
            raise TypeError("a namespaced value is written through the namespace only")
        return key

    def _tags(self) -> tuple[int, ...]:
        """The versions a write is tagged with: those read before the compute began."""
        if self._seen is None:
            self._seen = self._ns._current()
        return self._seen
