"""The pure parts of a ring migration: placement, copied items, their TTLs, the counters.

No I/O.  :class:`Placement` says which keys live on another server in the old
ring; :class:`Copy` builds the requests of one copy (the old item read, the
lease placeholder on the new ring, the fill) in the protocol the cache speaks;
:class:`Tally` counts what the migration did, for the status page and metrics.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from django_mcpatterns.core.client.routing import Router
from django_mcpatterns.core.keys import Key, placed
from django_mcpatterns.core.protocol.meta import MetaDelete, MetaGet, MetaSet
from django_mcpatterns.core.protocol.wire import (
    EXISTS,
    NOT_FOUND,
    STORED,
    Get,
    MetaReply,
    Request,
    Value,
)
from django_mcpatterns.core.protocol.wire import Store as Storage
from django_mcpatterns.core.store import MAX_RELATIVE_EXPIRE, AsyncStore, Store

__all__ = [
    "COUNTS",
    "EXPIRED",
    "MISSING",
    "AsyncRing",
    "Copy",
    "Item",
    "Placement",
    "Ring",
    "Tally",
    "copy_expire",
    "grouped",
]

MISSING: Final[Any] = object()  # "not on the new ring": a default no value can be
EXPIRED: Final = MAX_RELATIVE_EXPIRE + 1  # an absolute Unix time long past: "gone at once"

COUNTS: Final = (
    "fallbacks",  # misses on the new ring of keys whose old server is another
    "old_hits",  # ...found on the old ring and served from there
    "copied",  # ...written back on the new ring
    "copy_skipped",  # ...not written back: something already held the key on the new ring
    "copy_dropped",  # ...not written back: a delete or a write won the race (never stale)
    "invalidations",  # deletes sent to the other ring (deletes, and writes' copies)
)


class Ring(Store, Protocol):
    """What a migration needs of each ring's cluster: the Store, and a few of its parts."""

    router: Router
    text: bool
    serde: Any
    decoders: Any

    def exchange(self, key: Key, requests: Sequence[Request[Any]]) -> list[Any] | None: ...


class AsyncRing(AsyncStore, Protocol):
    """:class:`Ring` for asyncio (an ``AsyncCluster``)."""

    router: Router
    text: bool
    serde: Any
    decoders: Any

    async def exchange(self, key: Key, requests: Sequence[Request[Any]]) -> list[Any] | None: ...


@dataclass(frozen=True, slots=True)
class Item:
    """An item as memcached holds it: bytes, client flags, cas, and TTL left (None: unknown)."""

    key: bytes
    data: bytes
    flags: int
    cas: bytes
    ttl: int | None

    def value(self) -> Value:
        return Value(self.key, self.flags, self.data, self.cas)


def copy_expire(item: Item, text_ttl: int, now: float) -> int:
    """The exptime that gives a copy the TTL its original has left (``text_ttl`` when unknown).

    Text mode cannot read a TTL: the copy lives ``text_ttl`` seconds at most.
    """
    ttl = item.ttl
    if ttl is None:
        return text_ttl
    if ttl < 0:
        return 0  # never expires
    if ttl > MAX_RELATIVE_EXPIRE:
        return int(now) + ttl  # relative seconds that long would read as a Unix time
    return max(ttl, 1)


def grouped(keys: Iterable[Key], locate: Callable[[bytes], str]) -> dict[str, list[Key]]:
    """Keys by the server ``locate`` names for their ring bytes, in the order given."""
    groups: dict[str, list[Key]] = defaultdict(list)
    for key in keys:
        groups[locate(placed(key)[1])].append(key)
    return groups


class Placement:
    """Which keys the old ring places on another server than the new one.

    ``old`` and ``new`` name the server of a key's ring bytes (remembered
    lookups: :func:`~django_mcpatterns.core.client.routing.remembered`).  A key
    that stays where it was needs none of a migration's extra round trips.
    """

    __slots__ = ("new", "old")

    def __init__(self, old: Callable[[bytes], str], new: Callable[[bytes], str]) -> None:
        self.old = old
        self.new = new

    def moved(self, key: Key) -> bool:
        ring = placed(key)[1]
        return self.old(ring) != self.new(ring)


class Copy:
    """The requests of a copy from the old ring to the new one, in one protocol.

    1. :meth:`probe`: is the item on the old ring?  (Meta: ``mg <key>``, no
       value sent; text: ``get``.)
    2. :meth:`place`: ``add`` a lease placeholder on the new ring, reading
       its cas (meta ``ms ME c``; text ``add`` then ``gets``).  Held, it is
       what a delete or a write on the new ring removes or replaces.
    3. :meth:`read`: the old item, *after* the placeholder (meta
       ``mg v f c t``: its TTL too; text ``gets``).  A delete runs on the
       old ring first, then the new one, so a value read here before a
       delete finds the placeholder still to be removed by it.
    4. :meth:`fill`: ``cas`` of the item against the placeholder: a delete
       or write on the new ring since step 2 wins, and the copy is dropped.
       :meth:`give_back` removes a placeholder that was not filled.
    """

    __slots__ = ("placeholder", "text")

    def __init__(self, text: bool, placeholder: Callable[[bytes], tuple[bytes, int]]) -> None:
        self.text = text
        self.placeholder = placeholder  # kb -> (data, flags): reads as a miss (leases.PLACEHOLDER)

    # -- requests (one batch per server) --

    def probe(self, kbs: list[bytes]) -> list[Request[Any]]:
        if self.text:
            return [Get(tuple(kbs))]
        return [MetaGet(kb) for kb in kbs]

    def place(self, kbs: list[bytes], ttl: int) -> list[Request[Any]]:
        batch: list[Request[Any]] = []
        for kb in kbs:
            data, flags = self.placeholder(kb)
            if self.text:
                batch += [Storage("add", kb, data, flags, ttl), Get((kb,), cas=True)]
            else:
                batch.append(
                    MetaSet(kb, data=data, mode="E", ttl=ttl, client_flags=flags, return_cas=True)
                )
        return batch

    def read(self, kbs: list[bytes]) -> list[Request[Any]]:
        if self.text:
            return [Get(tuple(kbs), cas=True)]
        return [MetaGet(kb, value=True, cas=True, ttl=True, client_flags=True) for kb in kbs]

    def fill(self, item: Item, token: bytes, expire: int) -> Request[Any]:
        if self.text:
            return Storage("cas", item.key, item.data, item.flags, expire, token)
        data, flags = item.data, item.flags
        return MetaSet(item.key, data=data, ttl=expire, client_flags=flags, cas=int(token))

    def give_back(self, kb: bytes, token: bytes) -> Request[Any]:
        if self.text:  # text has no delete by cas: that version, expired at once
            data, flags = self.placeholder(kb)
            return Storage("cas", kb, data, flags, EXPIRED, token)
        return MetaDelete(kb, cas=int(token))

    # -- replies --

    def present(self, kbs: list[bytes], replies: list[Any] | None) -> set[bytes]:
        """The keys the probe found."""
        if replies is None:
            return set()
        if self.text:
            values = replies[0]
            return {v.key for v in values} if type(values) is list else set()
        return {kb for kb, r in zip(kbs, replies, strict=True) if _status(r) == b"HD"}

    def tokens(self, kbs: list[bytes], replies: list[Any] | None) -> dict[bytes, bytes]:
        """The placeholders this copy holds: key -> the placeholder's cas."""
        if replies is None:
            return {}
        held: dict[bytes, bytes] = {}
        if self.text:
            for i, kb in enumerate(kbs):
                status, values = replies[2 * i], replies[2 * i + 1]
                if status != STORED or type(values) is not list or not values:
                    continue
                read = values[0]  # the placeholder, unless replaced in between
                if (read.data, read.flags) == self.placeholder(kb) and read.cas is not None:
                    held[kb] = read.cas
            return held
        for kb, reply in zip(kbs, replies, strict=True):
            if type(reply) is MetaReply and reply.status == b"HD" and reply.cas is not None:
                held[kb] = b"%d" % reply.cas
        return held

    def items(self, kbs: list[bytes], replies: list[Any] | None) -> dict[bytes, Item]:
        """The old items read."""
        if replies is None:
            return {}
        found: dict[bytes, Item] = {}
        if self.text:
            values = replies[0]
            if type(values) is list:
                for v in values:
                    if v.cas is not None:
                        found[v.key] = Item(v.key, v.data, v.flags, v.cas, None)
            return found
        for kb, reply in zip(kbs, replies, strict=True):
            if type(reply) is not MetaReply or reply.status != b"VA" or reply.data is None:
                continue
            cas = reply.cas
            if cas is not None:
                found[kb] = Item(kb, reply.data, reply.client_flags or 0, b"%d" % cas, reply.ttl)
        return found

    def filled(self, reply: Any) -> bool:
        """Whether a fill was stored (else a delete or write on the new ring won)."""
        if self.text:
            return bool(reply == STORED)
        return _status(reply) == b"HD"

    def lost(self, reply: Any) -> bool:
        """Whether a fill found the placeholder gone or replaced (not a failure)."""
        if self.text:
            return bool(reply in (EXISTS, NOT_FOUND))
        return _status(reply) in (b"EX", b"NF")


def _status(reply: Any) -> bytes | None:
    return reply.status if type(reply) is MetaReply else None


class Tally:
    """What a migration did in this process (see :data:`COUNTS`), thread-safe.

    Shared by the sync and asyncio stores of a cache, and by every backend
    instance over it (Django makes one per thread): the status page reads it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTS, 0)
        self.on_count: Callable[[str, int], object] | None = None  # e.g. the observer's events

    def add(self, name: str, n: int = 1) -> None:
        if n <= 0:
            return
        with self._lock:
            self._counts[name] += n
        listener = self.on_count
        if listener is not None:
            listener(name, n)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
