# Generated from core/near/_async.py by scripts/generate_sync.py: do not edit.
"""The near cache in front of a store: hot values served from this process's memory.

The algorithm of :mod:`django_mcpatterns.core.near` (read its docstring), written
once for an :class:`~django_mcpatterns.core.store.AsyncStore`; the sync
:class:`~django_mcpatterns.core.near.NearStore` is generated from it.  The table
(entries, ages, admission, counts) is ``_model_table.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django_mcpatterns.core.keys import Key, KeyT
from django_mcpatterns.core.store import (
    CasToken,
    Claimed,
    Leased,
    LeaseStore,
    Store,
    TokenStore,
)

from ._model import LARGE_VALUE, near_key
from ._model_table import CARRY_FROM, MISS, Entry, NearTable, Ticket, clear_all, fill, hit, missed

_MISS: Any = object()


class NearStore:
    """An :class:`~django_mcpatterns.core.store.AsyncStore` whose ``get`` and ``get_many``
    are answered from ``table`` while an answer is younger than its bound.

    Everything else goes to ``store``; each write, delete, touch or counter change
    drops the key's copy once the store answered (or failed), and voids the
    answers of reads sent before it, so a read that starts after a write of this
    process returns never sees an older value.  ``gets`` and the envelope,
    cas and TTL reads are never answered from memory: what they return is used
    to write (locks, sets, leases).  Safe to share between threads and tasks.
    """

    def __init__(self, store: Store, table: NearTable) -> None:
        self.store = store
        self.table = table
        self.leases = store if isinstance(store, LeaseStore) else None  # memcached's own
        # Large values are revalidated by their cas, read without the value, where the
        # store can say it and name its server's epoch (a Cluster in meta mode).
        self._revalidates = (
            hasattr(store, "cas_of")
            and hasattr(store, "server_epoch")
            and getattr(store, "text", True) is False
        )
        # Refresh ahead rides on misses where the store can add keys to a miss's request
        # (a Cluster without replicas or gutter): elsewhere no key is noted for it.
        self._along = getattr(store, "carries", False) is True
        if not self._along:
            table.no_refresh()

    @property
    def serde(self) -> Any:
        """The store's serde (namespaces and the stampede encode with it)."""
        return self.store.serde  # type: ignore[attr-defined]  # Cluster/MemoryStore/chunked

    # What the store says of itself, named here (not a ``__getattr__`` passing any name
    # through: the interpreter would then specialise none of this class's attribute reads,
    # the hot path's among them); each is missing where the store has none.

    @property
    def options(self) -> Any:
        """The store's options (whether its patterns degrade on an outage)."""
        return getattr(self.store, "options")  # noqa: B009  # AttributeError when it has none

    @property
    def observer(self) -> Any:
        """The store's observer (instrumentation)."""
        return getattr(self.store, "observer")  # noqa: B009

    @property
    def text(self) -> Any:
        """Whether the store speaks memcached's text protocol."""
        return getattr(self.store, "text")  # noqa: B009

    def __repr__(self) -> str:
        return f"<{type(self).__name__} over {self.store!r}>"

    def strict(self) -> NearStore:
        """The store's strict view, with the same table (its writes drop copies too)."""
        strict = getattr(self.store, "strict", None)
        return self if strict is None else NearStore(strict(), self.table)

    # -- reads answered from memory --

    def get(self, key: Key, default: Any = None) -> Any:
        table = self.table
        if type(key) is str:
            name = key
            value = hit(table, key)
        else:  # bytes or a Routed key: never noted for a refresh ahead (read as a str)
            name = near_key(key)
            value = table.hit(name, False)
        if value is not MISS:
            return value
        # A miss: as cheap as this table can make it (every third read or so pays it).
        ticket = missed(table)
        if (
            self._revalidates
            and (held := table.entries.get(name)) is not None
            and (held.cas is not None or held.size >= LARGE_VALUE)
        ):  # a large value past its bound: revalidated by its cas, or read with it
            return self._far(key, name, held, default)
        if len(table.due) >= CARRY_FROM and self._along and type(key) is str:
            value = self._along_due(key, ticket)
        else:
            value = self.store.get(key, _MISS)
        if value is _MISS:
            return default
        fill(table, name, value, ticket)
        return value

    def _along_due(self, key: str, ticket: Ticket) -> Any:
        """A miss's read of ``key`` carrying keys due for a refresh ahead (those on its
        server), one request; their answers are held as the miss's own, aged from
        ``ticket`` (taken before it is sent)."""
        table = self.table
        taken = table.take_due(key)
        along = None
        if taken:
            along = self.store.get_along(key, [entry.key for entry in taken])  # type: ignore[attr-defined]  # Cluster
        if along is None:  # nothing due on its server: a plain get
            table.refreshed({}, (), taken, ticket)
            return self.store.get(key, _MISS)
        found, sent = along
        value = found.pop(key, _MISS)
        table.refreshed(found, sent, taken, ticket)
        return value

    def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        """Return the hits only, keyed as given: those held near, then one ``get_many`` of
        the others."""
        table = self.table
        found: dict[Key, Any] = {}
        far: list[Key] = []
        for key in keys:
            entry = table.lookup(near_key(key))
            if entry is None:
                far.append(key)
            else:
                found[key] = entry.out()
        if not far:
            table.saved()
            return found
        ticket = table.ticket()
        fetched = self.store.get_many(far)
        for key, value in fetched.items():
            fill(table, near_key(key), value, ticket)
        found.update(fetched)
        return found

    def held_many(self, keys: Iterable[Key]) -> dict[Key, Any] | None:
        """The values of ``keys`` when every one is held near and younger than its bound
        (hits only: a key memcached does not hold is never held), else None; no I/O.

        What a reader that needs several items together (a namespaced value and its
        versions) asks before it reads them otherwise; counted only when it answers.
        """
        entries, now = self.table.entries, self.table.clock()
        found = {}
        for key in keys:
            entry = entries.get(near_key(key))
            if entry is None or entry.expires <= now:
                return None
            found[key] = entry
        table = self.table
        for entry in found.values():
            table.lookup(entry.key)  # counted as the hits they are
        table.saved()
        return {key: entry.out() for key, entry in found.items()}

    def _far(self, key: Key, name: str, held: Entry, default: Any) -> Any:
        """A large value memcached must answer, its entry ``held`` past its bound:
        revalidated by its cas (no value sent), else read with its cas."""
        if held.cas is not None and self._revalidate(key, held):
            self.table.saved()
            return held.out()
        return self._far_large(key, name, default)

    def _far_large(self, key: Key, name: str, default: Any) -> Any:
        """Read a large value with its cas, so the next time it is past ``max_age`` no value
        travels."""
        table = self.table
        ticket = table.ticket()
        epoch = self.store.server_epoch(key)  # type: ignore[attr-defined]  # Cluster
        value, cas = self.store.gets(key)
        if cas is None:
            return default
        # No epoch (a replicated key, a failing server): no cas that proves anything.
        table.fill(name, value, ticket, cas=None if epoch is None else cas, epoch=epoch)
        return value

    def _revalidate(self, key: Key, held: Entry) -> bool:
        """Whether ``held`` is still the item on its server: one ``mg <key> c``, no value.

        A cas is a counter of one server's life: it restarts with the server, so
        the answer counts only if the server's epoch did not change around it.
        """
        store: Any = self.store
        epoch = store.server_epoch(key)
        if epoch is None or epoch != held.epoch:  # None: no cas of that server proves anything
            return False
        ticket = self.table.ticket()
        cas = store.cas_of(key)
        if cas is None or int(cas) != int(held.cas or 0) or store.server_epoch(key) != epoch:
            return False
        return self.table.renew(held, ticket)

    # -- reads that go to the store (what they return is used to write) --

    def gets(self, key: Key) -> tuple[Any, CasToken | None]:
        return self.store.gets(key)

    def gets_many(self, keys: Iterable[Key]) -> dict[Key, tuple[Any, CasToken]]:
        return self.store.gets_many(keys)

    def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        return self.store.gets_envelope(key)

    def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]:
        return self.store.get_many_envelopes(keys)

    def gets_ttl(self, key: Key) -> tuple[Any, CasToken | None, int | None]:
        return self.store.gets_ttl(key)

    def ttl(self, key: Key) -> int | None:
        return self.store.ttl(key)

    def bump(self, key: Key) -> bool:
        return self.store.bump(key)  # the LRU only: the value stays

    def claim(
        self, key: Key, recache: int | None, placeholder: Any = None, placeholder_ttl: int = 0
    ) -> Claimed | None:
        """The store's stampede tokens where it has them; None sends the stampede
        reader down its lock-based path."""
        if not isinstance(self.store, TokenStore):
            return None
        return self.store.claim(key, recache, placeholder, placeholder_ttl)

    # -- writes: the copy is dropped once the store answered, or failed --

    def set(self, key: Key, value: Any, expire: int = 0) -> bool:
        """Store ``value``; a str or bytes value memcached stored (to live at least
        ``max_age``) becomes the key's copy, as a read sent with the set would have
        answered it; any other outcome drops the copy."""
        kind, table = type(value), self.table
        if (
            (kind is str or kind is bytes)
            and type(key) is str
            and (expire == 0 or expire >= table.max_age)
        ):
            ticket = table.ticket()  # before it is sent: the copy is dated from then
            stored = False
            try:
                stored = self.store.set(key, value, expire)
                return stored
            finally:
                if stored is True:
                    table.written(key, value, ticket)
                else:
                    table.invalidate(key)
        try:
            return self.store.set(key, value, expire)
        finally:
            self._drop(key)

    def set_many(self, values: Mapping[KeyT, Any], expire: int = 0) -> list[KeyT]:
        try:
            return self.store.set_many(values, expire)
        finally:
            self._drop_many(values)

    def add(self, key: Key, value: Any, expire: int = 0) -> bool:
        try:
            return self.store.add(key, value, expire)
        finally:
            self._drop(key)

    def append(self, key: Key, value: bytes) -> bool:
        try:
            return self.store.append(key, value)
        finally:
            self._drop(key)

    def prepend(self, key: Key, value: bytes) -> bool:
        try:
            return self.store.prepend(key, value)
        finally:
            self._drop(key)

    def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        try:
            return self.store.cas(key, value, cas, expire)
        finally:
            self._drop(key)

    def cas_stale(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        try:
            if isinstance(self.store, TokenStore):
                return self.store.cas_stale(key, value, cas, expire)
            return self.store.cas(key, value, cas, expire)
        finally:
            self._drop(key)

    def incr(self, key: Key, delta: int = 1) -> int | None:
        try:
            return self.store.incr(key, delta)
        finally:
            self._drop(key)

    def decr(self, key: Key, delta: int = 1) -> int | None:
        try:
            return self.store.decr(key, delta)
        finally:
            self._drop(key)

    def delete(self, key: Key) -> bool:
        try:
            return self.store.delete(key)
        finally:
            self._drop(key)

    def delete_many(self, keys: Iterable[Key]) -> None:
        keys = list(keys)
        try:
            self.store.delete_many(keys)
        finally:
            self._drop_many(keys)

    def forget(self, key: Key, marker: bytes | None = None, expire: int = 0) -> bool:
        """The store's repair of a write that failed: the copy goes too."""
        try:
            return self.store.forget(key, marker, expire)
        finally:
            self._drop(key)

    def touch(self, key: Key, expire: int = 0) -> bool:
        try:
            return self.store.touch(key, expire)
        finally:
            self._drop(key)  # a negative expire deletes it

    def add_cas(self, key: Key, value: Any, expire: int = 0) -> CasToken | None:
        try:
            return self.store.add_cas(key, value, expire)
        finally:
            self._drop(key)

    def recas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> CasToken | None:
        try:
            return self.store.recas(key, value, cas, expire)
        finally:
            self._drop(key)

    def delete_cas(self, key: Key, cas: CasToken) -> bool:
        try:
            return self.store.delete_cas(key, cas)
        finally:
            self._drop(key)

    def exchange(self, key: Key, requests: Any) -> Any:
        """The store's raw exchange (what it sends is not known here: the copy goes)."""
        try:
            return self.store.exchange(key, requests)  # type: ignore[attr-defined]
        finally:
            self._drop(key)

    # -- leasing reads (the ORM's): they may store a lease, so they are writes here --

    def gets_leased(self, key: Key, others: Iterable[Key], ttl: int) -> Leased:
        """The store's leasing read (a plain ``gets_many`` over a store that takes no
        leases); a lease taken stored an item, so the copy of ``key`` goes."""
        leases = self.leases
        if leases is None:
            return Leased(self.store.gets_many([key, *others]), leasing=False)
        try:
            leased = leases.gets_leased(key, others, ttl)
        except BaseException:  # a lease may have been taken
            self._drop(key)
            raise
        if leased.lease is not None:
            self._drop(key)
        return leased

    def lease(self, key: Key, ttl: int, replacing: CasToken | None = None) -> Leased:
        leases = self.leases
        if leases is None:
            return Leased({}, leasing=False)
        try:
            return leases.lease(key, ttl, replacing)
        finally:
            self._drop(key)

    def flush_all(self) -> bool:
        """Empty the servers, and every table of this process: another cache (another
        ``KEY_PREFIX``, another alias) may hold what the flush removed."""
        try:
            return self.store.flush_all()
        finally:
            clear_all()

    def close(self) -> None:
        self.store.close()  # connections only: what is held near stays

    def _drop(self, key: Key) -> None:
        if type(key) is str:  # the common case, first
            self.table.invalidate(key)
            return
        try:
            name = near_key(key)
        except TypeError:  # not a key: the store refused it before any I/O
            return
        self.table.invalidate(name)

    def _drop_many(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self._drop(key)
