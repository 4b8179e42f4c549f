"""The Store protocol: the memcached primitives the patterns are written against.

:class:`~django_mcpatterns.core.cluster.Cluster` (real servers) and
:class:`~django_mcpatterns.core.memory.MemoryStore` (in-process) implement it with
the same semantics, proven by one shared contract test suite:

* ``expire`` is memcached's exptime: ``0`` never expires, up to 30 days it is
  relative seconds, beyond that an absolute Unix time, negative expires at once.
* Values go through the store's serde (pymemcache's ``serialize``/``deserialize``
  pair), which records the type in the item's flags.  ``bytes`` are stored raw
  with flags 0, so ``append``/``prepend`` work on them; both keep the item's
  flags and TTL.
* ``add`` fails on an existing key, ``cas`` fails on a changed token (``None``
  when the key is missing), ``incr``/``decr`` return ``None`` on a missing key
  and raise :class:`~.exceptions.NonNumericValueError` on a non-number; ``incr``
  wraps at 2**64 and ``decr`` stops at 0.
* ``set``/``add``/``cas`` of a value over the item size limit raise
  :class:`~.exceptions.ValueTooLargeError` (a failed ``set`` also removes the
  old item, as memcached does); ``set_many`` stores the others and returns the
  oversized keys among the failed ones.  ``append``/``prepend`` past the limit
  return ``False``, the same answer as for a missing key (memcached's
  ``NOT_STORED``), so callers must tell the two apart themselves.
* ``ttl`` answers memcached's meta get ``mg <key> t`` (memcached 1.6+): the
  seconds an item has left on the server's whole-second clock (at least 1 for
  a live item), ``-1`` when it never expires, ``None`` when it is missing.
  Like ``get`` it counts as a hit or a miss.
* Invalid keys raise :class:`~.exceptions.InvalidKeyError` before any I/O.
  A key is plain (``str``/``bytes``: placed by its own bytes) or a
  :class:`~.keys.Routed` (placed by its route; a store with one place ignores
  it); stores read keys with :func:`~.keys.placed`, and answers name keys as given.
* A store never returns partial garbage: on an unreachable server a Cluster
  answers misses and failed writes (or raises
  :class:`~.exceptions.NodeUnavailableError` when configured to).
* A write has three outcomes: stored (``True``), not stored (``False``, or
  ``None`` for a ``cas`` of a missing key), and *unknown*: the command left
  and no reply came (a timeout, a connection lost mid-exchange), so memcached
  may have applied it.  The default view of a Cluster answers an unknown write
  ``False``, as Django's backends do, so ``False`` there means "not stored, or
  unknown".  The strict view (``Cluster.strict()``, what
  :func:`~.locks.authoritative` returns) raises
  :class:`~.exceptions.OutcomeUnknownError` for it, and
  :class:`~.exceptions.NodeUnavailableError` when nothing was sent (certainly
  not stored).  An exception rather than a third return value: every
  existing handler of unreachable servers still catches it, and code that
  ignores it cannot mistake it for either answer.  Code that cleans up
  (deleting a set's shard generation, releasing a lock) acts on certainty
  only: it reads the item again, or leaves what it may name to expire.  The
  in-process MemoryStore always answers, so its outcomes are never unknown.

Stampede tokens (:class:`TokenStore`, :class:`AsyncTokenStore`: meta protocol)
    memcached's server-side stampede tokens, as the stampede reader needs them.
    One round trip writes ``mg <key> v c f t R<recache>`` and, optionally, an add
    (``ms <key> ME T<ttl> c``) of a lease placeholder (:mod:`.leases`):

    * a hit whose TTL left is under ``recache`` seconds, or an item marked stale
      by ``md <key> I``, hands ``W`` (win) to exactly one client, across every
      process and language, and ``Z`` to the others; ``X`` marks the latter;
    * on a miss exactly one caller's add stores the placeholder and gets its cas:
      that caller won the cold miss.  On a hit the add fails with no effect.

    The cas read (the item's, or the placeholder's) is the fill's lease.  Stores
    that cannot do this (text mode, the embedded store) do not offer it, and the
    stampede reader takes its lock-based path.

Leasing reads (:class:`LeaseStore`, :class:`AsyncLeaseStore`)
    memcached's own leases, taken by the read itself: ``mg <key> v c f N<ttl>``
    vivifies a miss (an empty item for ``ttl`` seconds) and hands that reader the
    win token ``W`` with the new item's cas, and every later reader ``Z``, until
    the winner stores over it by cas or gives it back (``delete_cas``), or it
    expires.  ``gets_leased`` reads one key so, and others as ``gets_many`` does,
    in one round trip per server; ``lease`` takes the lease on a key whose value
    the caller found useless (delete that version, vivify: one write).  The
    embedded store does the same in process; in text mode, or for a replicated
    key, no lease is taken (``leasing`` False) and the caller leases some other way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .keys import Key, KeyT

# memcached treats exptimes above 30 days as absolute Unix timestamps.
MAX_RELATIVE_EXPIRE = 60 * 60 * 24 * 30

CasToken = bytes | int


@runtime_checkable
class Store(Protocol):
    """Memcached's primitives, with memcached's semantics (see the module docstring)."""

    def get(self, key: Key, default: Any = None) -> Any: ...

    def gets(self, key: Key) -> tuple[Any, CasToken | None]:
        """Return ``(value, cas_token)``, or ``(None, None)`` on a miss."""
        ...

    def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        """Return the hits only, keyed by the keys as given."""
        ...

    def gets_many(self, keys: Iterable[Key]) -> dict[Key, tuple[Any, CasToken]]: ...

    def set(self, key: Key, value: Any, expire: int = 0) -> bool: ...

    def set_many(self, values: Mapping[KeyT, Any], expire: int = 0) -> list[KeyT]:
        """Store every value; return the keys that were *not* stored.

        Each item is stored independently: an oversized value (its old item
        removed) or an unreachable server fails only its own keys.
        """
        ...

    def add(self, key: Key, value: Any, expire: int = 0) -> bool: ...

    def append(self, key: Key, value: bytes) -> bool: ...

    def prepend(self, key: Key, value: bytes) -> bool: ...

    def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None: ...

    def incr(self, key: Key, delta: int = 1) -> int | None: ...

    def decr(self, key: Key, delta: int = 1) -> int | None: ...

    def delete(self, key: Key) -> bool:
        """Return whether the key existed."""
        ...

    def delete_many(self, keys: Iterable[Key]) -> None: ...

    def forget(self, key: Key, marker: bytes | None = None, expire: int = 0) -> bool:
        """Delete ``key`` now, or before its server serves again; True when done now.

        The repair of a write that could not reach its server: a cluster
        journals it for the server (docs/failures.md) and never raises for it.
        ``marker``: store these raw bytes (``expire``) instead of deleting.
        """
        ...

    def touch(self, key: Key, expire: int = 0) -> bool: ...

    def bump(self, key: Key) -> bool:
        """Refresh the item's place in the LRU, keeping its value and TTL; return whether it exists.

        memcached's "touching keys with add": nothing is fetched or rewritten.
        Meta ``mg <key>`` (no flags); text ``add`` of an already-expired item.
        """
        ...

    def ttl(self, key: Key) -> int | None:
        """Return the seconds the item has left, ``-1`` for never, ``None`` when it is missing.

        memcached cannot rewrite an item keeping its TTL (``cas`` sets a new
        one), so rewriters (sets, lists) read it first.
        """
        ...

    # -- owner primitives: a write that hands back its cas, a read with the TTL --
    #
    # What locks and rewriters (sets, lists) need in one request each where the
    # protocol allows it.  Tokens are memcached's cas as ASCII digits (bytes).

    def gets_ttl(self, key: Key) -> tuple[Any, CasToken | None, int | None]:
        """Return ``(value, cas_token, ttl)``, ``(None, None, None)`` on a miss.

        ``ttl`` as :meth:`ttl` answers it, read in the same request (meta's
        ``mg <key> v c t f``); None for a hit when the protocol cannot say it
        there (text), so a caller that needs it asks :meth:`ttl`.
        """
        ...

    def add_cas(self, key: Key, value: Any, expire: int = 0) -> CasToken | None:
        """``add``; return the new item's cas token, None when it was not stored.

        Meta: ``ms <key> ME T<expire> c``, one request.  Text: ``add`` and
        ``gets`` written together (one round trip); None also when the item
        read back is not the one added (it was replaced in between).
        """
        ...

    def recas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> CasToken | None:
        """``cas``; return the new item's cas token, None when it was not stored.

        Meta: ``ms <key> C<cas> T<expire> c``; text: ``cas`` and ``gets``
        written together.  One round trip either way.  With a negative
        ``expire`` (for both of these) the item is gone at once and what they
        return is unspecified: delete a version with :meth:`delete_cas`.
        """
        ...

    def delete_cas(self, key: Key, cas: CasToken) -> bool:
        """Delete the item only while its cas token is ``cas``; return whether it was deleted.

        Meta: ``md <key> C<cas>``, one request.  Text has no such delete: ``gets``
        then a ``cas`` of the same bytes with a negative exptime (two requests,
        exactly as safe: the ``cas`` only matches that version).
        """
        ...

    def flush_all(self) -> bool: ...

    # -- the soft-expiry envelope's explicit read path (core/values/envelope.py, core/stampede/) --

    def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        """``gets`` returning a soft-expiry envelope as an
        :class:`~django_mcpatterns.core.values.envelope.Envelope`.

        Fresh, stale or a lease placeholder (:mod:`.leases`), where ``gets``
        returns the plain value or a miss; other values as ``gets`` does.
        """
        ...

    def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]:
        """``get_many`` returning soft-expiry envelopes as
        :class:`~django_mcpatterns.core.values.envelope.Envelope`."""
        ...

    def close(self) -> None:
        """Release connections; node health and stored data are kept."""
        ...


@runtime_checkable
class AsyncStore(Protocol):
    """:class:`Store` for asyncio: the same methods, names and semantics, as coroutines.

    :class:`~django_mcpatterns.core.aio.AsyncCluster` (real servers) and
    :class:`~django_mcpatterns.core.memory.AsyncMemoryStore` implement it.  The
    async pattern classes (``core/<pattern>/_async*.py``) are written against it; their sync
    forms (``_sync*.py`` beside them, against :class:`Store`) are generated from them by
    ``scripts/generate_sync.py`` (see ``docs/architecture.md``).  Nothing here blocks the
    event loop.
    """

    async def get(self, key: Key, default: Any = None) -> Any: ...

    async def gets(self, key: Key) -> tuple[Any, CasToken | None]: ...

    async def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]: ...

    async def gets_many(self, keys: Iterable[Key]) -> dict[Key, tuple[Any, CasToken]]: ...

    async def set(self, key: Key, value: Any, expire: int = 0) -> bool: ...

    async def set_many(self, values: Mapping[KeyT, Any], expire: int = 0) -> list[KeyT]: ...

    async def add(self, key: Key, value: Any, expire: int = 0) -> bool: ...

    async def append(self, key: Key, value: bytes) -> bool: ...

    async def prepend(self, key: Key, value: bytes) -> bool: ...

    async def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None: ...

    async def incr(self, key: Key, delta: int = 1) -> int | None: ...

    async def decr(self, key: Key, delta: int = 1) -> int | None: ...

    async def delete(self, key: Key) -> bool: ...

    async def delete_many(self, keys: Iterable[Key]) -> None: ...

    async def forget(self, key: Key, marker: bytes | None = None, expire: int = 0) -> bool: ...

    async def touch(self, key: Key, expire: int = 0) -> bool: ...

    async def bump(self, key: Key) -> bool: ...

    async def ttl(self, key: Key) -> int | None: ...

    async def gets_ttl(self, key: Key) -> tuple[Any, CasToken | None, int | None]: ...

    async def add_cas(self, key: Key, value: Any, expire: int = 0) -> CasToken | None: ...

    async def recas(
        self, key: Key, value: Any, cas: CasToken, expire: int = 0
    ) -> CasToken | None: ...

    async def delete_cas(self, key: Key, cas: CasToken) -> bool: ...

    async def flush_all(self) -> bool: ...

    async def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]: ...

    async def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]: ...

    async def close(self) -> None: ...


# -- stampede tokens (meta protocol) -----------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    """What one claiming read found.

    ``found``: the item as :meth:`~.store.Store.gets_envelope` returns it
    (``None`` with ``cas`` None on a miss); ``cas``: its cas token;
    ``won``/``lost``/``stale``: memcached's ``W``/``Z``/``X`` flags;
    ``added``: the placeholder's cas when this caller's add stored it;
    ``ttl``: the seconds the item had left (-1: never expires; None: unknown).
    """

    found: Any
    cas: CasToken | None
    won: bool = False
    lost: bool = False
    stale: bool = False
    added: CasToken | None = None
    ttl: int | None = None


@runtime_checkable
class TokenStore(Protocol):
    """A store whose server chooses recompute winners (meta protocol)."""

    def claim(
        self, key: Key, recache: int | None, placeholder: Any = None, placeholder_ttl: int = 0
    ) -> Claimed | None:
        """Read ``key`` with a recompute token; add ``placeholder`` on a miss.

        ``recache``: seconds of TTL left under which one reader wins
        (``R``); ``placeholder`` None: no add.  None when the store cannot
        (text mode): the caller takes the lock-based path.
        """
        ...

    def cas_stale(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        """``cas``, then mark the item stale on the server (``md <key> I``) where it can."""
        ...


@runtime_checkable
class AsyncTokenStore(Protocol):
    """:class:`TokenStore` for asyncio (an ``AsyncCluster`` in meta mode): the same, awaited."""

    async def claim(
        self, key: Key, recache: int | None, placeholder: Any = None, placeholder_ttl: int = 0
    ) -> Claimed | None: ...

    async def cas_stale(
        self, key: Key, value: Any, cas: CasToken, expire: int = 0
    ) -> bool | None: ...


# -- leasing reads (meta protocol's vivify-on-miss; the embedded store's own) ----------


@dataclass(frozen=True, slots=True)
class Leased:
    """What a leasing read found (:class:`LeaseStore`).

    ``found``: the items read, as :meth:`Store.gets_many` answers (the empty item
    a lease vivified is not one); ``lease``: the cas of the item this caller's
    read vivified (memcached's ``W``): fill the key with ``cas(key, value, lease)``
    or give it back with ``delete_cas(key, lease)``; ``pending``: another caller
    holds the key's lease (``Z``); ``leasing``: whether a lease could be taken
    at all (False in text mode, for a replicated key, or when the key's server
    did not answer).
    """

    found: dict[Any, tuple[Any, CasToken]]
    lease: CasToken | None = None
    pending: bool = False
    leasing: bool = True


@runtime_checkable
class LeaseStore(Protocol):
    """A store whose reads take leases on misses (a Cluster, the embedded store)."""

    def gets_leased(self, key: Key, others: Iterable[Key], ttl: int) -> Leased:
        """``gets_many`` of ``key`` and ``others`` in one round trip per server, leasing
        ``key`` for ``ttl`` seconds when it is missing."""
        ...

    def lease(self, key: Key, ttl: int, replacing: CasToken | None = None) -> Leased:
        """Lease ``key`` for ``ttl`` seconds if it is missing, or once the version
        ``replacing`` (a value found useless) is deleted: one write."""
        ...


@runtime_checkable
class AsyncLeaseStore(Protocol):
    """:class:`LeaseStore` for asyncio: the same, awaited."""

    async def gets_leased(self, key: Key, others: Iterable[Key], ttl: int) -> Leased: ...

    async def lease(self, key: Key, ttl: int, replacing: CasToken | None = None) -> Leased: ...
