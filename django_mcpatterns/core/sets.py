"""Append-based sets and lists over any Store (the article ``shared/reference/000_…``).

A set is one raw item: members are *added* and *removed* by appending ``+member``
and ``-member`` records (one ``append`` for any number of members, nothing read),
a missing set is created with ``add``, and a read that finds too many records
*compacts* the item with ``gets`` + ``cas``.  The encodings are in :mod:`.codec`.
On top of the article:

Missing or full
    ``append`` answers NOT_STORED both for a missing item and for one that would
    pass the item size limit.  Writers try ``append``, then ``add`` (creation),
    then ``append`` again (a lost creation race); only when all three fail do
    they read the item: it is full, so it is compacted with their records folded
    in.  Nothing is dropped silently.
Concurrent appends during a rewrite
    A rewrite (compaction, pop, growth) is a ``cas``.  When it loses to appends
    made since its read, the item still starts with what was read, so the
    rewrite is retried with those appended bytes carried over after the new
    content: a lost race loses nothing and compaction converges under load.  A
    rewrite that finds anything else (another compaction) gives up to it.
Shards
    A set whose compacted form outgrows 70% of an item spills into
    *shards*: immutable snapshot items under keys derived from the root key and
    a random generation (so memcached spreads them over the cluster), members
    routed by a stable hash.  The root keeps the header and the log of recent
    writes, so writes stay one ``append``; a rewrite writes a new generation of
    shards and switches the root to it with ``cas``.  Readers fetch the root and
    the shards they know of in one parallel multi-get.  ``max_shards`` bounds a
    set; a write past it raises :class:`~.exceptions.CollectionTooLargeError`.
Loaders (eviction)
    A set declared with a ``loader`` (its source of truth) is never created by a
    writer.  A reader that misses ``add``\\ s an empty *pending* item, calls the
    loader and appends the snapshot; writes that land in between are kept
    (a member the log decided keeps the log's verdict), and readers never take a
    pending set for a complete one.
Lists
    Values are appended with a timestamp; ``lrem`` *prepends* a removal (the
    blacklist, read before the items) that hides matching values pushed before
    it.  Compaction applies the removals.

Round trips in steady state (one Store call; a multi-key call is one parallel
request): ``sadd``/``srem``/``rpush``/``lrem`` 1; ``smembers``/``sismember``/
``scard``/``lrange``/``llen`` 1 (``gets``, or the multi-get of a sharded set);
creating a set 2 (append, add) or 3 (a lost race); a compacting read 2 (+1 per
carried race); ``spop`` 2 (``gets``, ``cas``); ``smove`` 3 (read, append, append);
algebra 1 (+1 for shards it did not know of).  The full table is in
``docs/sets.md``.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .codec import (
    ADD,
    LIST,
    REMOVE,
    SET,
    SHARD,
    Base,
    Header,
    Member,
    Removal,
    base_record,
    check_members,
    decode_record,
    decode_snapshot,
    encode_snapshot,
    list_header_offset,
    member_hash,
    parse_list,
    parse_set_log,
    push_records,
    read_header,
    removal_record,
    set_records,
)
from .exceptions import (
    CollectionTooLargeError,
    ConfigurationError,
    ContentionError,
    IncompleteSetError,
    ValueTooLargeError,
)
from .keys import MAX_KEY_LENGTH, Key, key_bytes
from .memory import FLAGS_SUFFIX, ITEM_OVERHEAD, MemoryStore
from .store import MAX_RELATIVE_EXPIRE, CasToken, Store

__all__ = ["AppendLists", "AppendSets", "Loader", "SetOptions", "shard_key"]

Loader = Callable[[], Iterable[Member]]
Carry = Callable[[bytes, bytes, bytes], "bytes | None"]

_LAYOUT_CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class SetOptions:
    """Thresholds of the set and list algorithms.  The defaults suit memcached's 1 MiB items.

    ``item_size_max``
        memcached's ``-I``.  Items are kept ``headroom`` bytes under it (after
        memcached's own per-item bytes), so a server with a slightly smaller
        limit still takes them.
    ``compact_ratio``, ``compact_min_bytes``
        A read compacts a set when its log (the records appended since the last
        compaction: additions, tombstones, repeats) holds more bytes than
        ``compact_ratio`` times its snapshot, and at least ``compact_min_bytes``
        (and always past a quarter of an item).
    ``compact_on_write``
        The probability that a write then reads and, if needed, compacts: for
        write-heavy sets that are rarely read (the article's closing advice).
    ``max_shards``
        The largest set, in shard items; a write past it raises
        :class:`~.exceptions.CollectionTooLargeError`.
    ``attempts``
        How often a write retries after losing races before it raises
        :class:`~.exceptions.ContentionError`.
    """

    item_size_max: int = 1024 * 1024
    headroom: int = 1024
    compact_ratio: float = 0.5
    compact_min_bytes: int = 4096
    compact_on_write: float = 0.0
    max_shards: int = 256
    attempts: int = 16

    def __post_init__(self) -> None:
        checks = {
            "item_size_max": self.budget(MAX_KEY_LENGTH) >= 1024,
            "headroom": self.headroom >= 0,
            "compact_ratio": self.compact_ratio >= 0,
            "compact_min_bytes": self.compact_min_bytes >= 0,
            "compact_on_write": 0 <= self.compact_on_write <= 1,
            "max_shards": self.max_shards >= 1,
            "attempts": self.attempts >= 1,
        }
        for option, valid in checks.items():
            if not valid:
                raise ConfigurationError(
                    f"invalid SetOptions.{option}: {getattr(self, option)!r}", option=option
                )

    @classmethod
    def for_store(cls, store: Store, **options: Any) -> SetOptions:
        """Options matching the store's item limit (a MemoryStore's, else memcached's 1 MiB)."""
        if isinstance(store, MemoryStore):
            options.setdefault("item_size_max", store.stats()["item_size_max"])
        return cls(**options)

    def budget(self, key_length: int) -> int:
        """The largest value stored under a key of ``key_length`` bytes.

        memcached counts 59 bytes of item header, the key, the value and 4 bytes
        of non-zero flags against ``-I`` (measured on 1.6).
        """
        used = ITEM_OVERHEAD + FLAGS_SUFFIX + key_length + self.headroom
        return self.item_size_max - used


def shard_key(root: bytes, generation: bytes, index: int) -> bytes:
    """The key of shard ``index`` of a root's shard ``generation`` (at most 250 bytes)."""
    suffix = b"/%s/%d" % (generation.hex().encode(), index)
    if len(root) + len(suffix) <= MAX_KEY_LENGTH:
        return root + suffix
    return (
        b"mcpatterns-shard/" + hashlib.blake2b(root, digest_size=20).hexdigest().encode() + suffix
    )


def _carry_appends(old: bytes, current: bytes, new: bytes) -> bytes | None:
    """Sets: what was appended since ``old`` was read goes after the new content."""
    return new + current[len(old) :] if current.startswith(old) else None


def _carry_list(old: bytes, current: bytes, new: bytes) -> bytes | None:
    """Lists: removals prepended since the read stay in front, pushes stay behind."""
    shift = list_header_offset(current) - list_header_offset(old)
    if shift < 0 or current[shift : shift + len(old)] != old:
        return None
    return current[:shift] + new + current[shift + len(old) :]


class _Collections:
    """What sets and lists share: expiry, the write path and the carrying ``cas``."""

    def __init__(
        self,
        store: Store,
        options: SetOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.options = options if options is not None else SetOptions.for_store(store)
        self._clock = clock
        # Nonces and shard generations must differ between processes, even ones
        # forked after this object was built: the default draws from the OS.
        self._rng = rng if rng is not None else random.SystemRandom()

    def _new_header(self, kind: bytes, expire: int, *, pending: bool = False) -> Header:
        """A header for a new item stored with memcached exptime ``expire``."""
        if expire == 0:
            expires_at, timeout = 0, 0
        else:
            now = int(self._clock())
            if expire < 0:
                expires_at, timeout = now, 0
            elif expire > MAX_RELATIVE_EXPIRE:
                expires_at, timeout = expire, max(expire - now, 1)
            else:
                expires_at, timeout = now + expire, expire
        return Header(kind, self._rng.randbytes(8), expires_at, timeout, pending)

    def _rewrite_expiry(self, key: bytes, header: Header) -> tuple[int, Header]:
        """The exptime to rewrite an item with, and the header to store.

        memcached has no rewrite that keeps a TTL (``cas`` sets a new one).  A
        store offering ``ttl(key)`` (memcached's ``mg <key> t``: seconds left,
        -1 for never) gives the item's own; otherwise the expiry recorded at
        creation is reapplied and, once it has passed while the item lives on
        (it was touched), the creation timeout counts again from now.
        """
        ttl = getattr(self.store, "ttl", None)
        if ttl is not None:
            left = ttl(key)
            if left is not None:
                return (0 if left < 0 else max(left, 1)), header
        if header.expires_at == 0:
            return 0, header
        now = int(self._clock())
        left = header.expires_at - now
        if left > MAX_RELATIVE_EXPIRE:
            return header.expires_at, header
        if left > -2:  # memcached's clock ticks in whole seconds, and may lag ours
            return max(left, 1), header
        timeout = max(header.timeout, 1)
        return timeout, header.with_(expires_at=now + timeout)

    def _concat(self, key: bytes, data: bytes, *, prepend: bool) -> bool:
        try:
            return (self.store.prepend if prepend else self.store.append)(key, data)
        except ValueTooLargeError:
            return False  # a server with a smaller -I refused the bytes outright

    def _write(
        self,
        key: bytes,
        records: bytes,
        create: Callable[[], bytes] | None,
        expire: int,
        *,
        prepend: bool = False,
    ) -> bool:
        """Store ``records`` in one append (prepend): the steady state.

        On NOT_STORED (missing *or* full) ``add`` the item when ``create`` gives
        its header, and append again if that lost a creation race.  False means
        the caller must read the item to tell full from missing.
        """
        if len(records) > self.options.budget(len(key)):
            return False  # memcached would refuse the append outright
        if self._concat(key, records, prepend=prepend):
            return True
        if create is None:
            return False
        try:
            if self.store.add(key, create() + records, expire):
                return True
        except ValueTooLargeError:
            return False
        return self._concat(key, records, prepend=prepend)

    def _commit(
        self,
        key: bytes,
        old: bytes | None,
        token: CasToken | None,
        new: bytes,
        expire: int,
        carry: Carry,
    ) -> bool:
        """Replace ``old`` (read with ``token``) by ``new``; ``add`` when ``old`` is None.

        A ``cas`` lost to appends is retried with them carried over; False when
        someone else rewrote or created the item first.
        """
        if old is None:
            return self.store.add(key, new, expire)
        payload = new
        for _ in range(self.options.attempts):
            try:
                if self.store.cas(key, payload, token, expire):  # type: ignore[arg-type]
                    return True
            except ValueTooLargeError:
                return False  # the carried appends filled it: read again
            current, token = self.store.gets(key)
            if not isinstance(current, bytes):
                return False
            carried = carry(old, current, new)
            if carried is None:
                return False
            payload = carried
        return False

    def _contention(self, key: bytes, what: str) -> ContentionError:
        return ContentionError(
            f"{what} {key!r} failed: its compare-and-swap kept losing to other "
            f"writers ({self.options.attempts} attempts), or a server did not store it"
        )


# -- sets -------------------------------------------------------------------------


class _LostShard(Exception):
    """A shard the root names is missing or stale (internal): the root as read."""

    def __init__(self, kb: bytes, data: bytes, token: CasToken, header: Header) -> None:
        super().__init__(kb)
        self.kb, self.data, self.token, self.header = kb, data, token, header


@dataclass(slots=True)
class _SetView:
    """A set as read: its members and what a rewrite needs."""

    data: bytes | None  # the root item; None for a set being created
    token: CasToken | None
    header: Header
    members: set[Member]
    mentioned: set[Member] | None = None  # pending sets: members the log decided
    log_bytes: int = 0
    snapshot_bytes: int = 0
    partial: bool = False  # only the shards of some members were read

    @property
    def complete(self) -> bool:
        return self.mentioned is None


def _unique(members: Iterable[Member]) -> list[Member]:
    return list(dict.fromkeys(check_members(members)))


def _replay(view: _SetView, data: bytes, start: int) -> None:
    """Apply the records of ``data[start:]`` to ``view``, in order."""
    members, mentioned = view.members, view.mentioned
    for chunk in parse_set_log(data, start):
        if isinstance(chunk, Base):
            # A loader snapshot completes a pending set of its own incarnation;
            # members the log already decided keep the log's verdict.
            if mentioned is not None and chunk.nonce == view.header.nonce:
                loaded = decode_snapshot(chunk.snapshot)
                loaded.difference_update(mentioned)
                members.update(loaded)
                mentioned = None
            continue
        for record in chunk:
            added, member = decode_record(record)
            if added:
                members.add(member)
            else:
                members.discard(member)
            if mentioned is not None:
                mentioned.add(member)
    view.mentioned = mentioned


class AppendSets(_Collections):
    """Redis-style sets (django-redis 6 names) on memcached items; see the module docstring.

    Keys are final memcached keys; members are ``str``, ``bytes`` or ``int`` and
    come back with their type.  ``expire`` is memcached's exptime, applied when
    a set is created.  Return values differ from Redis where knowing the answer
    would cost a read: ``sadd``/``srem`` return the number of distinct members
    written.  Thread-safe.
    """

    def __init__(
        self,
        store: Store,
        options: SetOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(store, options, clock=clock, rng=rng)
        # root -> (generation, shard count) of sharded sets, to fetch their
        # shards in the same multi-get as the root.
        self._layouts: dict[bytes, tuple[bytes, int]] = {}

    # -- writes --------------------------------------------------------------

    def sadd(
        self, key: Key, *members: Member, expire: int = 0, loader: Loader | None = None
    ) -> int:
        """Add members; return the number of distinct members written.

        A missing set is created (with ``expire``), unless it is loader-backed:
        a writer never creates those, since the set would look complete.
        """
        unique = _unique(members)
        if unique:
            creating = None if loader is not None else expire
            self._modify(key_bytes(key), set_records(ADD, unique), creating, loader)
        return len(unique)

    def srem(self, key: Key, *members: Member, loader: Loader | None = None) -> int:
        """Remove members; return the number of distinct members written."""
        unique = _unique(members)
        if unique:
            self._modify(key_bytes(key), set_records(REMOVE, unique), None, loader)
        return len(unique)

    def smove(self, source: Key, destination: Key, member: Member, *, expire: int = 0) -> bool:
        """Move ``member``: one read of ``source``, then two appends (not atomic).

        The member is added to ``destination`` first, so a crash between the two
        appends leaves it in both sets, never in neither.
        """
        src = key_bytes(source)
        if member not in self._members(src, None, 0, only=check_members([member])):
            return False
        self.sadd(destination, member, expire=expire)
        self.srem(src, member)
        return True

    def spop(
        self, key: Key, count: int | None = None, *, loader: Loader | None = None, expire: int = 0
    ) -> Member | set[Member] | None:
        """Remove and return a random member (``count``: a set of up to ``count``).

        The removal is a ``cas`` on the read item, so two concurrent pops never
        return the same member.
        """
        if count is not None and count < 0:
            raise ValueError(f"spop count must not be negative, not {count}")
        kb = key_bytes(key)
        for _ in range(self.options.attempts):
            view = self._whole(kb, loader, expire)
            if view is None or not view.members or count == 0:
                return None if count is None else set()
            chosen = self._rng.sample(list(view.members), min(count or 1, len(view.members)))
            if self._pop(kb, view, chosen):
                return chosen[0] if count is None else set(chosen)
        raise self._contention(kb, "spop of")

    def compact(self, key: Key) -> bool:
        """Compact a set now; return whether this call rewrote it."""
        kb = key_bytes(key)
        view = self._read(kb, None)
        return view is not None and self._rewrite(kb, view)

    # -- reads ---------------------------------------------------------------

    def smembers(self, key: Key, *, loader: Loader | None = None, expire: int = 0) -> set[Member]:
        return self._members(key_bytes(key), loader, expire)

    def sismember(
        self, key: Key, member: Member, *, loader: Loader | None = None, expire: int = 0
    ) -> bool:
        return self.smismember(key, member, loader=loader, expire=expire)[0]

    def smismember(
        self, key: Key, *members: Member, loader: Loader | None = None, expire: int = 0
    ) -> list[bool]:
        """Membership of each member; a sharded set reads only their shards."""
        listed = check_members(members)
        found = self._members(key_bytes(key), loader, expire, only=listed)
        return [member in found for member in listed]

    def scard(self, key: Key, *, loader: Loader | None = None, expire: int = 0) -> int:
        return len(self._members(key_bytes(key), loader, expire))

    def srandmember(
        self, key: Key, count: int | None = None, *, loader: Loader | None = None, expire: int = 0
    ) -> Member | list[Member] | None:
        """A random member, or a list: ``count`` distinct ones, or ``-count`` with repeats."""
        members = list(self._members(key_bytes(key), loader, expire))
        if count is None:
            return self._rng.choice(members) if members else None
        if count >= 0:
            return self._rng.sample(members, min(count, len(members)))
        return [self._rng.choice(members) for _ in range(-count)] if members else []

    # -- algebra -------------------------------------------------------------

    def sunion(self, *keys: Key) -> set[Member]:
        return set().union(*self._many(keys))

    def sinter(self, *keys: Key) -> set[Member]:
        sets = sorted(self._many(keys), key=len)
        return sets[0].intersection(*sets[1:]) if sets else set()

    def sdiff(self, *keys: Key) -> set[Member]:
        sets = self._many(keys)
        return sets[0].difference(*sets[1:]) if sets else set()

    def sunionstore(self, destination: Key, *keys: Key, expire: int = 0) -> int:
        return self._store_result(destination, self.sunion(*keys), expire)

    def sinterstore(self, destination: Key, *keys: Key, expire: int = 0) -> int:
        return self._store_result(destination, self.sinter(*keys), expire)

    def sdiffstore(self, destination: Key, *keys: Key, expire: int = 0) -> int:
        return self._store_result(destination, self.sdiff(*keys), expire)

    # -- the write path --------------------------------------------------------

    def _modify(
        self, kb: bytes, records: bytes, create_expire: int | None, loader: Loader | None
    ) -> None:
        create = None
        if create_expire is not None:

            def create() -> bytes:
                return self._new_header(SET, create_expire).pack()

        for _ in range(self.options.attempts):
            if self._write(kb, records, create, create_expire or 0):
                self._compact_after_write(kb)
                return
            view = self._read(kb, loader)  # full, or missing: it tells which
            if view is None:
                if create_expire is None:
                    return  # nothing to remove from; loader-backed sets are built by readers
                view = _SetView(None, None, self._new_header(SET, create_expire), set())
            _replay(view, records, 0)
            if self._rewrite(kb, view):
                return
        raise self._contention(kb, "write to set")

    def _compact_after_write(self, kb: bytes) -> None:
        chance = self.options.compact_on_write
        if chance and self._rng.random() < chance:
            try:
                view = self._view(self._fetch([kb], None).get(kb))
            except _LostShard:
                return  # readers deal with it
            if view is not None and view.complete and self._dirty(kb, view):
                self._rewrite(kb, view)

    def _pop(self, kb: bytes, view: _SetView, chosen: list[Member]) -> bool:
        """Append removal records with a ``cas``: fails if any chosen member was touched."""
        assert view.data is not None
        records = set_records(REMOVE, chosen)
        if len(view.data) + len(records) > self.options.budget(len(kb)):
            self._rewrite(kb, view)  # make room, then pop from a fresh read
            return False
        expire, header = self._rewrite_expiry(kb, view.header)
        old = view.data
        fresh = header.pack() + old[Header.SIZE :]

        def carry(old: bytes, current: bytes, new: bytes) -> bytes | None:
            appended = current[len(old) :] if current.startswith(old) else None
            if appended is None or appended.startswith(b"=") or b"\n=" in appended:
                return None
            decided = _SetView(None, None, view.header, set(), mentioned=set())
            _replay(decided, appended, 0)
            assert decided.mentioned is not None
            if decided.mentioned.intersection(chosen):
                return None  # another pop, or a write, decided a chosen member
            return fresh + appended + records

        return self._commit(kb, old, view.token, fresh + records, expire, carry)

    # -- reading -----------------------------------------------------------------

    def _members(
        self,
        kb: bytes,
        loader: Loader | None,
        expire: int,
        only: Sequence[Member] | None = None,
    ) -> set[Member]:
        view = self._read(kb, loader, only)
        if view is not None and view.complete:
            if not view.partial and self._dirty(kb, view):
                self._rewrite(kb, view)
            return view.members
        return self._build(kb, view, loader, expire)

    def _whole(self, kb: bytes, loader: Loader | None, expire: int) -> _SetView | None:
        """A complete, whole view (built from the loader first when needed)."""
        view = self._read(kb, loader)
        if view is None or not view.complete:
            if view is None and loader is None:
                return None
            self._build(kb, view, loader, expire)
            view = self._read(kb, loader)
            if view is None or not view.complete:
                raise IncompleteSetError(f"set {kb!r} could not be rebuilt from its loader")
        return view

    def _build(
        self, kb: bytes, view: _SetView | None, loader: Loader | None, expire: int
    ) -> set[Member]:
        """Serve a missing or pending set from its loader, caching it race-safely."""
        if loader is None:
            if view is None:
                return set()
            raise IncompleteSetError(
                f"set {kb!r} is being rebuilt from its loader: read it with the loader"
            )
        if view is None:
            placeholder = self._new_header(SET, expire, pending=True)
            nonce = placeholder.nonce
            if not self.store.add(kb, placeholder.pack(), expire):
                view = self._read(kb, loader)  # someone else created it first
                if view is not None and view.complete:
                    return view.members
        if view is not None:
            nonce = view.header.nonce
        # The snapshot is taken after the pending item exists: every write whose
        # append missed the set is in it, every later write is in the log.
        members = check_members(loader())
        record = base_record(nonce, encode_snapshot(members))
        if not self._write(kb, record, None, 0):
            current = self._read(kb, loader)  # full (or gone): fold it in
            if current is not None and not current.complete and current.header.nonce == nonce:
                _replay(current, record, 0)
                self._rewrite(kb, current)
        return set(members)

    def _read(
        self, kb: bytes, loader: Loader | None, only: Sequence[Member] | None = None
    ) -> _SetView | None:
        """Read a set; one that lost a shard is reset (and raises unless it has a loader)."""
        suspect = None  # a shard generation found incomplete once
        for _ in range(self.options.attempts):
            try:
                return self._view(self._fetch([kb], {kb: only} if only else None).get(kb))
            except _LostShard as lost:
                if lost.header.generation != suspect:
                    suspect = lost.header.generation  # maybe a rewrite moved it: look again
                    continue
                suspect = None
                if self._reset(lost, pending=loader is not None) and loader is None:
                    raise IncompleteSetError(
                        f"set {kb!r} lost a shard to eviction and has no loader to rebuild "
                        "it; it was reset to an empty set"
                    ) from None
        raise self._contention(kb, "reading set")

    def _reset(self, lost: _LostShard, *, pending: bool) -> bool:
        """Replace a root whose shard was evicted, if unchanged since read: by an
        empty set, or by a pending one that readers rebuild from the loader."""
        self._layouts.pop(lost.kb, None)
        expire, header = self._rewrite_expiry(lost.kb, lost.header)
        fresh = header.with_(nonce=self._rng.randbytes(8), pending=pending, shards=0, snapshot=0)
        return bool(self.store.cas(lost.kb, fresh.pack(), lost.token, expire))

    def _many(self, keys: Iterable[Key]) -> list[set[Member]]:
        """Read every set in one parallel multi-get (plus one for unknown shards)."""
        kbs = [key_bytes(key) for key in keys]
        for _ in range(self.options.attempts):
            try:
                fetched = self._fetch(list(dict.fromkeys(kbs)), None)
                break
            except _LostShard as lost:
                self._read(lost.kb, None)  # resets it and raises if the shard is really lost
        else:
            raise self._contention(kbs[0], "reading sets")
        views = {kb: self._view(item) for kb, item in fetched.items()}
        result = []
        for kb in kbs:
            view = views.get(kb)
            if view is not None and not view.complete:
                raise IncompleteSetError(f"set {kb!r} is being rebuilt from its loader")
            result.append(set() if view is None else view.members)
        return result

    def _fetch(
        self, kbs: list[bytes], only: dict[bytes, Sequence[Member]] | None
    ) -> dict[bytes, tuple[bytes, CasToken, Header, list[bytes], bool]]:
        """Fetch roots and their shards: ``root -> (data, token, header, shards, partial)``."""
        only = only or {}
        keys = [*kbs]
        for kb in kbs:
            layout = self._layouts.get(kb)
            if layout is not None:
                keys += self._shard_keys(kb, *layout, only.get(kb))
        if len(keys) == 1:
            data, token = self.store.gets(keys[0])
            got: dict[Any, tuple[Any, Any]] = {} if data is None else {keys[0]: (data, token)}
        else:
            got = self.store.gets_many(keys)
        roots = {}
        missing: list[bytes] = []
        for kb in kbs:
            if kb not in got:
                self._layouts.pop(kb, None)
                continue
            data, token = got[kb]
            header = read_header(data, SET)
            wanted = self._shard_keys(kb, header.generation, header.shards, only.get(kb))
            roots[kb] = (data, token, header, wanted)
            missing += [shard for shard in wanted if shard not in got]
        if missing:
            got.update(
                (shard, (data, None)) for shard, data in self.store.get_many(missing).items()
            )
        fetched = {}
        for kb, (data, token, header, wanted) in roots.items():
            shards = [got[shard][0] for shard in wanted if shard in got]
            if len(shards) < len(wanted) or not all(map(header.names_shard, shards)):
                raise _LostShard(kb, data, token, header)
            if header.shards:
                self._remember(kb, (header.generation, header.shards))
            fetched[kb] = (data, token, header, shards, bool(only.get(kb)) and bool(header.shards))
        return fetched

    def _shard_keys(
        self, kb: bytes, generation: bytes, count: int, only: Sequence[Member] | None
    ) -> list[bytes]:
        if not count:
            return []
        indexes = sorted({member_hash(m) % count for m in only}) if only else range(count)
        return [shard_key(kb, generation, index) for index in indexes]

    def _remember(self, kb: bytes, layout: tuple[bytes, int]) -> None:
        if len(self._layouts) >= _LAYOUT_CACHE_SIZE:
            self._layouts.clear()
        self._layouts[kb] = layout

    def _view(
        self, item: tuple[bytes, CasToken, Header, list[bytes], bool] | None
    ) -> _SetView | None:
        if item is None:
            return None
        data, token, header, shards, partial = item
        start = Header.SIZE + header.snapshot
        members = decode_snapshot(data, Header.SIZE, start)
        snapshot_bytes = header.snapshot
        for shard in shards:
            length = Header.unpack(shard).snapshot
            members.update(decode_snapshot(shard, Header.SIZE, Header.SIZE + length))
            snapshot_bytes += length
        view = _SetView(
            data,
            token,
            header,
            members,
            set() if header.pending else None,
            len(data) - start,
            snapshot_bytes,
            partial,
        )
        _replay(view, data, start)
        return view

    # -- rewriting -----------------------------------------------------------------

    def _dirty(self, kb: bytes, view: _SetView) -> bool:
        options = self.options
        wanted = max(options.compact_min_bytes, options.compact_ratio * view.snapshot_bytes)
        return view.log_bytes > min(wanted, options.budget(len(kb)) // 4)

    def _rewrite(self, kb: bytes, view: _SetView) -> bool:
        """Write ``view`` compacted (sharded if large); False if another rewrite won."""
        expire, header = self._rewrite_expiry(kb, view.header)
        root, shards = self._layout(kb, view, header)
        if shards and self.store.set_many(shards, 0):
            self.store.delete_many(list(shards))  # a server refused: keep the old layout
            return False
        committed = self._commit(kb, view.data, view.token, root, expire, _carry_appends)
        if committed:
            if header.shards or shards:
                new = Header.unpack(root)
                if new.shards:
                    self._remember(kb, (new.generation, new.shards))
                else:
                    self._layouts.pop(kb, None)
            old = view.header
            if view.data is not None and old.shards:
                self.store.delete_many(
                    [shard_key(kb, old.generation, i) for i in range(old.shards)]
                )
        elif shards:
            self.store.delete_many(list(shards))
        return committed

    def _layout(
        self, kb: bytes, view: _SetView, header: Header
    ) -> tuple[bytes, dict[bytes, bytes]]:
        """The root item (and shard items) holding ``view`` compactly."""
        budget = self.options.budget(len(kb))
        if view.mentioned is not None:  # pending: keep the log, one record per member
            body = set_records(ADD, view.members) + set_records(
                REMOVE, view.mentioned - view.members
            )
            root = header.with_(shards=0, snapshot=0).pack() + body
            if len(root) > budget:
                raise CollectionTooLargeError(f"set {kb!r} outgrew an item while being loaded")
            return root, {}
        header = header.with_(pending=False)
        snapshot = encode_snapshot(view.members)
        # Stay in the root while the log keeps room to grow: reads compact it
        # past a quarter of an item.  Once sharded, return only well below that.
        limit = budget * 35 // 100 if header.shards else budget * 70 // 100
        if Header.SIZE + len(snapshot) <= limit:
            return header.with_(shards=0, snapshot=len(snapshot)).pack() + snapshot, {}
        generation = self._rng.randbytes(8)
        shards = self._shard(kb, header.nonce, generation, view.members, len(snapshot))
        root = header.with_(shards=len(shards), generation=generation, snapshot=0).pack()
        return root, shards

    def _shard(
        self, kb: bytes, nonce: bytes, generation: bytes, members: set[Member], size: int
    ) -> dict[bytes, bytes]:
        budget = self.options.budget(MAX_KEY_LENGTH) - Header.SIZE
        count = max(1, math.ceil(size / (budget * 0.8)))
        while count <= self.options.max_shards:
            groups: list[list[Member]] = [[] for _ in range(count)]
            for member in members:
                groups[member_hash(member) % count].append(member)
            blocks = [encode_snapshot(group) for group in groups]
            if max(map(len, blocks)) <= budget:
                return {
                    shard_key(kb, generation, index): Header(
                        SHARD, nonce, shards=index, generation=generation, snapshot=len(block)
                    ).pack()
                    + block
                    for index, block in enumerate(blocks)
                }
            count += max(1, count // 4)
        raise CollectionTooLargeError(
            f"set {kb!r} would need more than max_shards={self.options.max_shards} items "
            f"({size} bytes of {len(members)} members)"
        )

    def _store_result(self, destination: Key, members: set[Member], expire: int) -> int:
        """Replace ``destination`` by ``members`` (the ``*store`` commands); empty: delete it."""
        kb = key_bytes(destination)
        self._layouts.pop(kb, None)
        if not members:
            self.store.delete(kb)
            return 0
        header = self._new_header(SET, expire)
        root, shards = self._layout(kb, _SetView(None, None, header, members), header)
        if (shards and self.store.set_many(shards, 0)) or not self.store.set(kb, root, expire):
            raise self._contention(kb, "storing the set")
        return len(members)


# -- lists ------------------------------------------------------------------------


@dataclass(slots=True)
class _ListView:
    data: bytes | None
    token: CasToken | None
    header: Header
    removals: list[Removal] = field(default_factory=list)
    pushes: list[tuple[int, Member]] = field(default_factory=list)

    def items(self) -> list[tuple[int, Member]]:
        """The pushes that the removals leave, in order."""
        items = self.pushes
        for removal in sorted(self.removals, key=lambda r: r.stamp):
            hits = [
                i
                for i, (stamp, member) in enumerate(items)
                if stamp < removal.stamp and member == removal.member
            ]
            if removal.count > 0:
                hits = hits[: removal.count]
            elif removal.count < 0:
                hits = hits[removal.count :]
            drop = set(hits)
            items = [item for i, item in enumerate(items) if i not in drop]
        return items


class AppendLists(_Collections):
    """Lists with memcached's append/prepend-blacklist trick (``shared/reference/004_…``).

    ``rpush`` appends, ``lrem`` prepends a removal read before the items.  Each
    push and removal carries a microsecond timestamp from ``clock`` (strictly
    increasing per instance), so a removal hides only values pushed before it,
    across processes as far as their clocks agree.  Lists are one item: one
    that would outgrow it raises :class:`~.exceptions.CollectionTooLargeError`.
    """

    def __init__(
        self,
        store: Store,
        options: SetOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(store, options, clock=clock, rng=rng)
        self._last_stamp = 0
        self._stamp_lock = threading.Lock()

    def rpush(self, key: Key, *values: Member, expire: int = 0) -> int:
        """Append values (creating the list with ``expire``); return how many were pushed."""
        listed = check_members(values)
        if listed:
            stamp = self._stamp()
            kb = key_bytes(key)

            def create() -> bytes:
                return self._new_header(LIST, expire).pack()

            def fold(view: _ListView) -> None:
                view.pushes += [(stamp, value) for value in listed]

            self._modify(kb, push_records(stamp, listed), create, expire, fold, prepend=False)
        return len(listed)

    def lrem(self, key: Key, count: int, value: Member) -> int:
        """Remove like Redis ``LREM`` (``count`` > 0 from the head, < 0 from the tail,
        0 all); return 1 once the removal is recorded, 0 when the list is missing."""
        check_members([value])
        stamp = self._stamp()

        def fold(view: _ListView) -> None:
            view.removals.append(Removal(stamp, count, value))

        record = removal_record(stamp, count, value)
        return int(self._modify(key_bytes(key), record, None, 0, fold, prepend=True))

    def lrange(self, key: Key, start: int, end: int) -> list[Member]:
        """Values from ``start`` to ``end`` inclusive; negative indexes count from the end."""
        items = self._items(key_bytes(key))
        size = len(items)
        first = start if start >= 0 else max(size + start, 0)
        last = min(end if end >= 0 else size + end, size - 1)
        return items[first : last + 1] if first <= last else []

    def llen(self, key: Key) -> int:
        return len(self._items(key_bytes(key)))

    def _stamp(self) -> int:
        with self._stamp_lock:
            self._last_stamp = max(int(self._clock() * 1_000_000), self._last_stamp + 1)
            return self._last_stamp

    def _modify(
        self,
        kb: bytes,
        records: bytes,
        create: Callable[[], bytes] | None,
        expire: int,
        fold: Callable[[_ListView], None],
        *,
        prepend: bool,
    ) -> bool:
        for _ in range(self.options.attempts):
            if self._write(kb, records, create, expire, prepend=prepend):
                return True
            view = self._read(kb)
            if view is None:
                if create is None:
                    return False
                view = _ListView(None, None, self._new_header(LIST, expire))
            fold(view)
            if self._rewrite(kb, view, view.items()):
                return True
        raise self._contention(kb, "write to list")

    def _read(self, kb: bytes) -> _ListView | None:
        data, token = self.store.gets(kb)
        if data is None:
            return None
        removals, _, header, pushes = parse_list(data)
        return _ListView(data, token, header, removals, pushes)

    def _items(self, kb: bytes) -> list[Member]:
        view = self._read(kb)
        if view is None:
            return []
        items = view.items()
        if view.removals:
            assert view.data is not None
            live = sum(len(push_records(stamp, [value])) for stamp, value in items)
            waste = len(view.data) - Header.SIZE - live
            options = self.options
            wanted = max(options.compact_min_bytes, options.compact_ratio * live)
            if waste > min(wanted, options.budget(len(kb)) // 4):
                self._rewrite(kb, view, items)
        return [value for _, value in items]

    def _rewrite(self, kb: bytes, view: _ListView, items: list[tuple[int, Member]]) -> bool:
        expire, header = self._rewrite_expiry(kb, view.header)
        body = b"".join([push_records(stamp, [value]) for stamp, value in items])
        new = header.pack() + body
        if len(new) > self.options.budget(len(kb)):
            raise CollectionTooLargeError(
                f"list {kb!r} would outgrow one item ({len(new)} bytes; lists do not shard)"
            )
        return self._commit(kb, view.data, view.token, new, expire, _carry_list)
