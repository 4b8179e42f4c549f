# Generated from core/sets/_async.py by scripts/generate_sync.py: do not edit.
"""Append-based sets, written once (see :mod:`django_mcpatterns.core.sets`).

``AsyncAppendSets`` over an :class:`~django_mcpatterns.core.store.AsyncStore`
(a loader may be a coroutine function or a plain callable, see
:func:`~django_mcpatterns.core.concurrency.async_call`); the generated ``AppendSets``
over a :class:`~django_mcpatterns.core.store.Store`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django_mcpatterns.core.concurrency import call
from django_mcpatterns.core.exceptions import (
    EncodingError,
    IncompleteSetError,
    NodeUnavailableError,
    OutcomeUnknownError,
)
from django_mcpatterns.core.keys import PlainKey, key_bytes
from django_mcpatterns.core.store import Store

from ._model import ReadRewrite
from ._model_layout import (
    ADD,
    REMOVE,
    SET,
    Header,
    Member,
    base_record,
    check_members,
    decode_snapshot,
    encode_snapshot,
    read_header,
    set_records,
)
from ._model_shards import LayoutCache, layout, shard_expire, shard_key, shard_keys
from ._model_views import (
    STORED,
    Fetched,
    Loader,
    LostShard,
    SetView,
    carry_appends,
    difference,
    intersection,
    replay,
    union,
    unique_members,
)
from ._sync_append import AppendCollections, Report

__all__ = ["AppendSets"]


class AppendSets(AppendCollections):
    """Redis-style sets (django-redis 6 names) on memcached items; see the module docstring.

    Keys are final memcached keys; members are ``str``, ``bytes`` or ``int`` and
    come back with their type.  ``expire`` is memcached's exptime, applied when
    a set is created.  Return values differ from Redis where knowing the answer
    would cost a read: ``sadd``/``srem`` return the number of distinct members
    written.  Thread-safe.
    """

    def _init_state(self) -> None:
        # root -> (generation, shard count) of sharded sets, to fetch their
        # shards in the same multi-get as the root.
        self._layouts = LayoutCache()

    # -- writes --------------------------------------------------------------

    def sadd(
        self,
        key: PlainKey,
        *members: Member,
        expire: int = 0,
        loader: Loader | None = None,
        report: Report | None = None,
    ) -> int:
        """Add members; return the number of distinct members written.

        A missing set is created (with ``expire``), unless it is loader-backed:
        a writer never creates those, since the set would look complete.  A
        write its server could not take returns 0 (``OPTIONS["on_outage"]``:
        see :mod:`._async_append`, "Unreachable servers"; ``report`` hears of it).
        """
        unique = unique_members(members)
        if unique:
            kb = key_bytes(key)
            creating = None if loader is not None else expire
            try:
                self._modify(kb, set_records(ADD, unique), creating, loader)
            except NodeUnavailableError as exc:
                return self._lost_set(kb, "sadd", exc, expire, report)
        return len(unique)

    def srem(
        self,
        key: PlainKey,
        *members: Member,
        loader: Loader | None = None,
        expire: int = 0,
        report: Report | None = None,
    ) -> int:
        """Remove members; return the number of distinct members written.

        ``expire``: the exptime of the incomplete set left in its place when
        the write cannot be made (0 when its server cannot take it, see :meth:`sadd`).
        """
        unique = unique_members(members)
        if unique:
            kb = key_bytes(key)
            try:
                self._modify(kb, set_records(REMOVE, unique), None, loader)
            except NodeUnavailableError as exc:
                return self._lost_set(kb, "srem", exc, expire, report)
        return len(unique)

    def smove(
        self,
        source: PlainKey,
        destination: PlainKey,
        member: Member,
        *,
        expire: int = 0,
        report: Report | None = None,
    ) -> bool:
        """Move ``member``: one read of ``source``, then two appends (not atomic).

        The member is added to ``destination`` first, so a crash between the two
        appends leaves it in both sets, never in neither.  A set whose write
        could not be made reads as incomplete afterwards (see :meth:`sadd`).
        """
        src, dst = key_bytes(source), key_bytes(destination)
        if member not in self._members(src, None, 0, only=check_members([member])):
            return False
        self.sadd(dst, member, expire=expire, report=report)
        self.srem(src, member, expire=expire, report=report)
        return True

    def _lost_set(
        self,
        kb: bytes,
        command: str,
        error: NodeUnavailableError,
        expire: int,
        report: Report | None,
    ) -> int:
        self._layouts.forget(kb)
        return self._lost(kb, SET, command, error, expire, report)

    def spop(
        self,
        key: PlainKey,
        count: int | None = None,
        *,
        loader: Loader | None = None,
        expire: int = 0,
        report: Report | None = None,
    ) -> Member | set[Member] | None:
        """Remove and return a random member (``count``: a set of up to ``count``).

        The removal is a ``cas`` on the read item, so two concurrent pops never
        return the same member.  A pop its server could not take pops nothing (a
        degraded read's answer; see :meth:`sadd`); one whose reply never came
        leaves the set incomplete, so no member is dropped unseen.
        """
        if count is not None and count < 0:
            raise ValueError(f"spop count must not be negative, not {count}")
        kb = key_bytes(key)
        try:
            for _ in range(self.options.attempts):
                view = self._whole(kb, loader, expire)
                if view is None or not view.members or count == 0:
                    return None if count is None else set()
                chosen = self._rng.sample(list(view.members), min(count or 1, len(view.members)))
                if self._pop(kb, view, chosen):
                    return chosen[0] if count is None else set(chosen)
        except NodeUnavailableError as exc:  # repaired only if it may have been applied
            unknown = isinstance(exc, OutcomeUnknownError)
            self._lost(kb, SET, "spop", exc, expire, report, repair=unknown)
            return None if count is None else set()
        raise self._contention(kb, "spop of")

    def compact(self, key: PlainKey) -> bool:
        """Compact a set now; return whether this call rewrote it."""
        kb = key_bytes(key)
        view = self._read(kb, None)
        return view is not None and self._rewrite(kb, view)

    # -- reads ---------------------------------------------------------------

    def smembers(
        self, key: PlainKey, *, loader: Loader | None = None, expire: int = 0
    ) -> set[Member]:
        return self._members(key_bytes(key), loader, expire)

    def sismember(
        self, key: PlainKey, member: Member, *, loader: Loader | None = None, expire: int = 0
    ) -> bool:
        found = self.smismember(key, member, loader=loader, expire=expire)
        return found[0]

    def smismember(
        self, key: PlainKey, *members: Member, loader: Loader | None = None, expire: int = 0
    ) -> list[bool]:
        """Membership of each member; a sharded set reads only their shards."""
        listed = check_members(members)
        found = self._members(key_bytes(key), loader, expire, only=listed)
        return [member in found for member in listed]

    def scard(self, key: PlainKey, *, loader: Loader | None = None, expire: int = 0) -> int:
        return len(self._members(key_bytes(key), loader, expire))

    def srandmember(
        self,
        key: PlainKey,
        count: int | None = None,
        *,
        loader: Loader | None = None,
        expire: int = 0,
    ) -> Member | list[Member] | None:
        """A random member, or a list: ``count`` distinct ones, or ``-count`` with repeats."""
        members = list(self._members(key_bytes(key), loader, expire))
        if count is None:
            return self._rng.choice(members) if members else None
        if count >= 0:
            return self._rng.sample(members, min(count, len(members)))
        return [self._rng.choice(members) for _ in range(-count)] if members else []

    # -- algebra -------------------------------------------------------------

    def sunion(self, *keys: PlainKey) -> set[Member]:
        return union(self._many(keys))

    def sinter(self, *keys: PlainKey) -> set[Member]:
        return intersection(self._many(keys))

    def sdiff(self, *keys: PlainKey) -> set[Member]:
        return difference(self._many(keys))

    def sunionstore(
        self, destination: PlainKey, *keys: PlainKey, expire: int = 0, report: Report | None = None
    ) -> int:
        return self._store_result(destination, keys, expire, "sunionstore", report)

    def sinterstore(
        self, destination: PlainKey, *keys: PlainKey, expire: int = 0, report: Report | None = None
    ) -> int:
        return self._store_result(destination, keys, expire, "sinterstore", report)

    def sdiffstore(
        self, destination: PlainKey, *keys: PlainKey, expire: int = 0, report: Report | None = None
    ) -> int:
        return self._store_result(destination, keys, expire, "sdiffstore", report)

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
                view = SetView(None, None, self._new_header(SET, create_expire), set())
            replay(view, records, 0)
            if self._rewrite(kb, view):
                return
        raise self._contention(kb, "write to set")

    def _compact_after_write(self, kb: bytes) -> None:
        chance = self.options.compact_on_write
        if chance and self._rng.random() < chance:
            try:
                fetched = self._fetch([kb], None)
                view = self._view(fetched.get(kb))
            except LostShard:
                return  # readers deal with it
            if view is not None and view.complete and self._dirty(kb, view):
                with ReadRewrite():
                    self._rewrite(kb, view)

    def _pop(self, kb: bytes, view: SetView, chosen: list[Member]) -> bool:
        """Append removal records with a ``cas``: fails if any chosen member was touched."""
        assert view.data is not None
        records = set_records(REMOVE, chosen)
        if len(view.data) + len(records) > self.options.budget(len(kb)):
            self._rewrite(kb, view)  # make room, then pop from a fresh read
            return False
        expire, header = self._rewrite_expiry(kb, view.header, view.ttl)
        old = view.data
        fresh = header.pack() + old[Header.SIZE :]

        def carry(old: bytes, current: bytes, new: bytes) -> bytes | None:
            appended = current[len(old) :] if current.startswith(old) else None
            if appended is None or appended.startswith(b"=") or b"\n=" in appended:
                return None
            decided = SetView(None, None, view.header, set(), mentioned=set())
            replay(decided, appended, 0)
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
        try:
            view = self._read(kb, loader, only)
        except NodeUnavailableError:  # a shard's server is out: a degraded read's answer
            return set() if loader is None else set(check_members(call(loader)))
        if view is not None and view.complete:
            if not view.partial and self._dirty(kb, view):
                with ReadRewrite():
                    self._rewrite(kb, view)
            return view.members
        return self._build(kb, view, loader, expire)

    def _whole(self, kb: bytes, loader: Loader | None, expire: int) -> SetView | None:
        """A complete, whole view (built from the loader first when needed); None when
        missing, or unreadable once built (its server failed: a degraded read's answer)."""
        view = self._read(kb, loader)
        if view is None or not view.complete:
            if view is None and loader is None:
                return None
            self._build(kb, view, loader, expire)
            view = self._read(kb, loader)
            if view is not None and not view.complete:
                raise IncompleteSetError(f"set {kb!r} could not be rebuilt from its loader")
        return view

    def _build(
        self, kb: bytes, view: SetView | None, loader: Loader | None, expire: int
    ) -> set[Member]:
        """Serve a missing or pending set from its loader, caching it race-safely."""
        if loader is None:
            if view is None:
                return set()
            raise IncompleteSetError(
                f"set {kb!r} is incomplete (it lost writes in an outage, or is being rebuilt "
                "from its loader): read it with its loader, or delete it"
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
        members = check_members(call(loader))
        record = base_record(nonce, encode_snapshot(members))
        if not self._write(kb, record, None, 0, strict=False):  # a read: it degrades
            current = self._read(kb, loader)  # full (or gone): fold it in
            if current is not None and not current.complete and current.header.nonce == nonce:
                replay(current, record, 0)
                with ReadRewrite():
                    self._rewrite(kb, current)
        return set(members)

    def _read(
        self, kb: bytes, loader: Loader | None, only: Sequence[Member] | None = None
    ) -> SetView | None:
        """Read a set; one that lost a shard is reset (and raises unless it has a loader)."""
        suspect = None  # a shard generation found incomplete once
        for _ in range(self.options.attempts):
            try:
                fetched = self._fetch([kb], {kb: only} if only else None)
                return self._view(fetched.get(kb))
            except LostShard as lost:
                if lost.header.generation != suspect:
                    suspect = lost.header.generation  # maybe a rewrite moved it: look again
                    continue
                suspect = None
                # A shard whose server cannot be reached is not lost: that raises, nothing reset.
                if lost.missing and len(self._writer.get_many(lost.missing)) == len(lost.missing):
                    continue  # back meanwhile
                if self._reset(lost, pending=loader is not None) and loader is None:
                    raise IncompleteSetError(
                        f"set {kb!r} lost a shard to eviction and has no loader to rebuild "
                        "it; it was reset to an empty set"
                    ) from None
        raise self._contention(kb, "reading set")

    def _reset(self, lost: LostShard, *, pending: bool) -> bool:
        """Replace a root whose shard was evicted, if unchanged since read: by an
        empty set, or by a pending one that readers rebuild from the loader."""
        self._layouts.forget(lost.kb)
        expire, header = self._rewrite_expiry(lost.kb, lost.header)
        fresh = header.with_(nonce=self._rng.randbytes(8), pending=pending, shards=0, snapshot=0)
        return bool(self.store.cas(lost.kb, fresh.pack(), lost.token, expire))

    def _many(self, keys: Iterable[PlainKey], reader: Store | None = None) -> list[set[Member]]:
        """Read every set in one parallel multi-get (plus one for unknown shards); with the
        strict ``reader`` a set whose server is out raises rather than reads as empty."""
        kbs = [key_bytes(key) for key in keys]
        out: set[bytes] = set()  # sets a shard of which is on a server that is out
        for _ in range(self.options.attempts):
            try:
                wanted = [kb for kb in dict.fromkeys(kbs) if kb not in out]
                fetched = self._fetch(wanted, None, reader)
                break
            except LostShard as lost:
                try:
                    self._read(lost.kb, None)  # resets it, raises if really lost
                except NodeUnavailableError:  # read as a degraded read answers: empty
                    if reader is not None:
                        raise
                    out.add(lost.kb)
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
        self,
        kbs: list[bytes],
        only: dict[bytes, Sequence[Member]] | None,
        reader: Store | None = None,
    ) -> dict[bytes, Fetched]:
        """Fetch roots and their shards: ``root -> (data, token, header, shards, partial, ttl)``.

        One root alone is read with its TTL (``gets_ttl``), for a rewrite that follows.
        """
        only, store = only or {}, reader or self.store
        keys = [*kbs]
        for kb in kbs:
            layout = self._layouts.get(kb)
            if layout is not None:
                keys += shard_keys(kb, *layout, only.get(kb))
        ttl: int | None = None
        if len(keys) == 1:
            data, token, ttl = store.gets_ttl(keys[0])
            got: dict[Any, tuple[Any, Any]] = {} if data is None else {keys[0]: (data, token)}
        else:
            got = store.gets_many(keys)
        roots = {}
        missing: list[bytes] = []
        for kb in kbs:
            if kb not in got:
                self._layouts.forget(kb)
                continue
            data, token = got[kb]
            header = read_header(data, SET)
            wanted = shard_keys(kb, header.generation, header.shards, only.get(kb))
            roots[kb] = (data, token, header, wanted)
            missing += [shard for shard in wanted if shard not in got]
        if missing:
            shards_got = store.get_many(missing)
            got.update((shard, (data, None)) for shard, data in shards_got.items())
        fetched = {}
        for kb, (data, token, header, wanted) in roots.items():
            shards = [got[shard][0] for shard in wanted if shard in got]
            if len(shards) < len(wanted) or not all(map(header.names_shard, shards)):
                raise LostShard(kb, data, token, header, [s for s in wanted if s not in got])
            if header.shards:
                self._layouts.remember(kb, (header.generation, header.shards))
            partial = bool(only.get(kb)) and bool(header.shards)
            fetched[kb] = (data, token, header, shards, partial, ttl)
        return fetched

    def _view(self, item: Fetched | None) -> SetView | None:
        if item is None:
            return None
        data, token, header, shards, partial, ttl = item
        start = Header.SIZE + header.snapshot
        members = decode_snapshot(data, Header.SIZE, start)
        snapshot_bytes = header.snapshot
        for shard in shards:
            length = Header.unpack(shard).snapshot
            members.update(decode_snapshot(shard, Header.SIZE, Header.SIZE + length))
            snapshot_bytes += length
        mentioned: set[Member] | None = set() if header.pending else None
        view = SetView(
            data, token, header, members, mentioned, len(data) - start, snapshot_bytes, partial, ttl
        )
        replay(view, data, start)
        return view

    # -- rewriting -----------------------------------------------------------------

    def _dirty(self, kb: bytes, view: SetView) -> bool:
        return self.options.wants_compaction(view.log_bytes, view.snapshot_bytes, len(kb))

    def _rewrite(self, kb: bytes, view: SetView) -> bool:
        """Write ``view`` compacted (sharded if large); False if another rewrite won.

        Shards are deleted on certainty only: the old generation once the root
        names the new one, the new one once the root certainly does not.  An
        unknown outcome raises :class:`~django_mcpatterns.core.exceptions.OutcomeUnknownError` and
        leaves both generations to expire (:func:`~django_mcpatterns.core.sets.shard_expire`).
        """
        expire, header = self._rewrite_expiry(kb, view.header, view.ttl)
        root, shards = self._layout(kb, view, header)
        if shards and self.store.set_many(shards, shard_expire(expire, self._clock())):
            self.store.delete_many(list(shards))  # not stored: nothing names them yet
            return False
        committed = self._commit(kb, view.data, view.token, root, expire, carry_appends)
        if committed:
            if header.shards or shards:
                new = Header.unpack(root)
                if new.shards:
                    self._layouts.remember(kb, (new.generation, new.shards))
                else:
                    self._layouts.forget(kb)
            old = view.header
            if view.data is not None and old.shards:
                self.store.delete_many(
                    [shard_key(kb, old.generation, i) for i in range(old.shards)]
                )
        elif shards:
            self.store.delete_many(list(shards))
        return committed

    def _layout(self, kb: bytes, view: SetView, header: Header) -> tuple[bytes, dict[bytes, bytes]]:
        return layout(kb, view, header, self.options, self._rng.randbytes)

    def _store_result(
        self,
        destination: PlainKey,
        keys: Sequence[PlainKey],
        expire: int,
        command: str,
        report: Report | None,
    ) -> int:
        """Replace ``destination`` by the ``command``'s result, its sets read strictly.

        A set whose server is out fails the write rather than being stored as
        empty; the destination is then repaired as for :meth:`sadd`.  The shards
        it had are deleted once its root certainly no longer names them.
        """
        kb = key_bytes(destination)
        try:
            members = STORED[command](self._many(keys, self._writer))
            return self._replace(kb, members, expire)
        except NodeUnavailableError as exc:
            return self._lost_set(kb, command, exc, expire, report)

    def _replace(self, kb: bytes, members: set[Member], expire: int) -> int:
        self._layouts.forget(kb)
        replaced = self._named_shards(kb)
        if not members:
            self._writer.delete(kb)
        else:
            header = self._new_header(SET, expire)
            root, shards = self._layout(kb, SetView(None, None, header, members), header)
            stored = not (
                shards and self.store.set_many(shards, shard_expire(expire, self._clock()))
            )
            if not (stored and self._writer.set(kb, root, expire)):
                self.store.delete_many(list(shards))  # not stored: nothing names them
                raise self._contention(kb, "storing the set")
        if replaced:
            self.store.delete_many(replaced)
        return len(members)

    def _named_shards(self, kb: bytes) -> list[bytes]:
        """The keys of the shards the item at ``kb`` names, if it is a sharded set."""
        try:
            header = read_header(self.store.get(kb), SET)
        except EncodingError:  # missing, or not a set
            return []
        return shard_keys(kb, header.generation, header.shards)
