"""The cache API's store while a ring changes: the new ring, the old one behind it.

:class:`AsyncMigratingStore` answers the :class:`~django_mcpatterns.core.store.AsyncStore`
protocol over two clusters, as ``OPTIONS["migrate_from"]`` asks (see the
package's docstring for the stages and the guarantees):

* reads go to the ring of the stage (``reads``); in the ``"new"`` stage, until
  ``until``, a miss of a key whose old server is another is read there and
  written back with the TTL it has left (:class:`~._model.Copy`);
* writes go to the ring of the stage, then the key is deleted on the other
  ring, so no copy there can be read stale by a process of the other stage;
* deletes go to the old ring first, then the new one (what makes a copy in
  flight lose against a delete).

On the ring that is not the stage's, a delete is a repair (``forget``): sent
now, or, while that server cannot be used, journaled and run before it serves
again, so a server back from a stall never hands a deleted value to a copy or
to a process of the other stage.

A key whose server is the same on both rings costs nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django_mcpatterns.core.client.migration import MigrationSource
from django_mcpatterns.core.keys import Key, KeyT, placed
from django_mcpatterns.core.leases import PLACEHOLDER, PLACEHOLDER_TTL
from django_mcpatterns.core.protocol.commands import encoded
from django_mcpatterns.core.protocol.plans import MISS
from django_mcpatterns.core.store import AsyncStore, CasToken

from ._model import MISSING, AsyncRing, Copy, Item, Placement, Tally, copy_expire, grouped

__all__ = ["AsyncMigratingStore"]


class AsyncMigratingStore(AsyncStore):
    """The values' store of a cache whose ring changes (see the module docstring).

    ``new`` is the cluster of the cache's ``LOCATION``; ``old`` the cluster of
    ``migrate_from``'s servers (for the ``"new"`` stage, one that never uses a
    gutter or remaps: an old server that is down is a miss, and a delete aimed
    at it is journaled there).  ``tally`` counts what the migration does.
    """

    def __init__(
        self,
        new: AsyncRing,
        old: AsyncRing,
        source: MigrationSource,
        tally: Tally,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.new = new
        self.old = old
        self.source = source
        self.tally = tally
        self.clock = clock
        reads_old = source.reads == "old"
        self.primary = old if reads_old else new  # where reads and writes go
        self.secondary = new if reads_old else old  # where writes' keys are deleted
        self.placement = Placement(old.router.locate, new.router.locate)
        serde = self.serde = new.serde  # the cache's, for a chunked store over this one
        self.copy = Copy(new.text, lambda kb: encoded(serde, kb, PLACEHOLDER))

    def __repr__(self) -> str:
        reads = self.source.reads
        return f"<{type(self).__name__} reads={reads} new={self.new!r} old={self.old!r}>"

    def _falls_back(self, key: Key) -> bool:
        return self.source.falls_back(self.clock()) and self.placement.moved(key)

    # -- reads --

    async def get(self, key: Key, default: Any = None) -> Any:
        value = await self.primary.get(key, MISSING)
        if value is not MISSING or not self._falls_back(key):
            return default if value is MISSING else value
        item = (await self._copied([key])).get(key)
        return default if item is None else self._decoded(item, default)

    async def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        keys = list(keys)
        found = await self.primary.get_many(keys)
        if len(found) == len(keys) or not self.source.falls_back(self.clock()):
            return found
        missed = [key for key in keys if key not in found and self.placement.moved(key)]
        for key, item in (await self._copied(missed)).items():
            value = self._decoded(item, MISSING)
            if value is not MISSING:
                found[key] = value
        return found

    async def gets(self, key: Key) -> tuple[Any, CasToken | None]:
        found = await self.primary.gets(key)
        if found[1] is None and self._falls_back(key) and await self._copied([key]):
            return await self.primary.gets(key)  # the copy's token: a cas goes to the new ring
        return found

    async def gets_many(self, keys: Iterable[Key]) -> dict[Key, tuple[Any, CasToken]]:
        keys = list(keys)
        found = await self.primary.gets_many(keys)
        if len(found) == len(keys) or not self.source.falls_back(self.clock()):
            return found
        missed = [key for key in keys if key not in found and self.placement.moved(key)]
        copied = await self._copied(missed)
        if copied:
            found.update(await self.primary.gets_many(list(copied)))
        return found

    async def gets_ttl(self, key: Key) -> tuple[Any, CasToken | None, int | None]:
        found = await self.primary.gets_ttl(key)
        if found[1] is None and self._falls_back(key) and await self._copied([key]):
            return await self.primary.gets_ttl(key)
        return found

    async def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        found = await self.primary.gets_envelope(key)
        if found[1] is None and self._falls_back(key) and await self._copied([key]):
            return await self.primary.gets_envelope(key)
        return found

    async def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]:
        keys = list(keys)
        found = await self.primary.get_many_envelopes(keys)
        if len(found) == len(keys) or not self.source.falls_back(self.clock()):
            return found
        missed = [key for key in keys if key not in found and self.placement.moved(key)]
        copied = await self._copied(missed)
        if copied:
            found.update(await self.primary.get_many_envelopes(list(copied)))
        return found

    async def ttl(self, key: Key) -> int | None:
        left = await self.primary.ttl(key)
        if left is None and self._falls_back(key):
            return await self.old.ttl(key)
        return left

    async def bump(self, key: Key) -> bool:
        if await self.primary.bump(key):
            return True
        return self._falls_back(key) and bool(await self._copied([key]))

    # -- writes: the stage's ring, then the key deleted on the other --

    async def set(self, key: Key, value: Any, expire: int = 0) -> bool:
        stored = await self.primary.set(key, value, expire)
        await self._invalidate(key)  # a failed set removes the old item too (memcached)
        return stored

    async def add(self, key: Key, value: Any, expire: int = 0) -> bool:
        stored = await self.primary.add(key, value, expire)
        if stored:
            await self._invalidate(key)
        return stored

    async def set_many(self, values: Mapping[KeyT, Any], expire: int = 0) -> list[KeyT]:
        failed = await self.primary.set_many(values, expire)
        moved: list[Key] = [key for key in values if self.placement.moved(key)]
        if moved:
            await self._invalidate_many(moved)
        return failed

    async def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        stored = await self.primary.cas(key, value, cas, expire)
        if stored:
            await self._invalidate(key)
        return stored

    async def recas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> CasToken | None:
        token = await self.primary.recas(key, value, cas, expire)
        if token is not None:
            await self._invalidate(key)
        return token

    async def add_cas(self, key: Key, value: Any, expire: int = 0) -> CasToken | None:
        token = await self.primary.add_cas(key, value, expire)
        if token is not None:
            await self._invalidate(key)
        return token

    async def append(self, key: Key, value: bytes) -> bool:
        stored = await self.primary.append(key, value)
        if not stored and self._falls_back(key) and await self._copied([key]):
            stored = await self.primary.append(key, value)
        if stored:
            await self._invalidate(key)
        return stored

    async def prepend(self, key: Key, value: bytes) -> bool:
        stored = await self.primary.prepend(key, value)
        if not stored and self._falls_back(key) and await self._copied([key]):
            stored = await self.primary.prepend(key, value)
        if stored:
            await self._invalidate(key)
        return stored

    async def incr(self, key: Key, delta: int = 1) -> int | None:
        count = await self.primary.incr(key, delta)
        if count is None and self._falls_back(key) and await self._copied([key]):
            count = await self.primary.incr(key, delta)
        if count is not None:
            await self._invalidate(key)
        return count

    async def decr(self, key: Key, delta: int = 1) -> int | None:
        count = await self.primary.decr(key, delta)
        if count is None and self._falls_back(key) and await self._copied([key]):
            count = await self.primary.decr(key, delta)
        if count is not None:
            await self._invalidate(key)
        return count

    async def touch(self, key: Key, expire: int = 0) -> bool:
        touched = await self.primary.touch(key, expire)
        if not touched and self._falls_back(key) and await self._copied([key]):
            touched = await self.primary.touch(key, expire)
        return touched

    # -- deletes: the old ring first, then the new one --

    async def delete(self, key: Key) -> bool:
        if not self.placement.moved(key):
            return await self.primary.delete(key)
        self.tally.add("invalidations")
        if self.primary is self.old:  # the new ring is not read in this stage
            gone = await self.old.delete(key)
            await self.new.forget(key)
            return gone
        # Both rings are read: True when either held the key.  A delete that failed on the
        # old ring (or found nothing there) is sent again as a repair, journaled while that
        # server cannot be used.
        gone = await self.old.delete(key)
        if not gone:
            await self.old.forget(key)
        return await self.new.delete(key) or gone

    async def forget(self, key: Key, marker: bytes | None = None, expire: int = 0) -> bool:
        """A repair: on the other ring too when the key moves, the old ring first in either
        stage, as delete (a copy in flight then finds nothing, or its placeholder gone);
        ``marker`` on the stage's ring."""
        if not self.placement.moved(key):
            return await self.primary.forget(key, marker, expire)
        self.tally.add("invalidations")
        if self.primary is self.old:
            done = await self.old.forget(key, marker, expire)
            return await self.new.forget(key) and done
        gone = await self.old.forget(key)
        return await self.new.forget(key, marker, expire) and gone

    async def delete_cas(self, key: Key, cas: CasToken) -> bool:
        deleted = await self.primary.delete_cas(key, cas)
        if deleted:
            await self._invalidate(key)
        return deleted

    async def delete_many(self, keys: Iterable[Key]) -> None:
        keys = list(keys)
        moved = [key for key in keys if self.placement.moved(key)]
        self.tally.add("invalidations", len(moved))
        if self.primary is self.old:
            if keys:
                await self.old.delete_many(keys)
            await self._forget_all(self.new, moved)
        else:
            await self._forget_all(self.old, moved)
            if keys:
                await self.new.delete_many(keys)

    async def flush_all(self) -> bool:
        old = await self.old.flush_all()
        return await self.new.flush_all() and old

    async def close(self) -> None:
        await self.new.close()
        await self.old.close()

    # -- the steps --

    async def _invalidate(self, key: Key) -> None:
        """After a write on the stage's ring: delete the key on the other (if another server),
        or journal the delete there while that server cannot be used."""
        if self.placement.moved(key):
            self.tally.add("invalidations")
            await self.secondary.forget(key)

    async def _invalidate_many(self, keys: list[Key]) -> None:
        self.tally.add("invalidations", len(keys))
        await self._forget_all(self.secondary, keys)

    @staticmethod
    async def _forget_all(ring: AsyncRing, keys: list[Key]) -> None:
        """Delete ``keys`` on ``ring`` now, each journaled on a server that cannot be used."""
        for key in keys:
            await ring.forget(key)

    def _decoded(self, item: Item, default: Any) -> Any:
        value = self.new.decoders.value([item.value()])
        return default if value is MISS else value

    async def _copied(self, keys: list[Key]) -> dict[Key, Item]:
        """Read ``keys`` (missed on the new ring) from the old ring, and write them back.

        Return the old items found (what the caller serves), whether or not
        their copy landed; the steps are :class:`~._model.Copy`'s.
        """
        if not keys:
            return {}
        tally = self.tally
        tally.add("fallbacks", len(keys))
        present = await self._present(keys)
        if not present:
            return {}
        tokens = await self._place(present)
        items = await self._read(present)
        tally.add("old_hits", len(items))
        tally.add("copy_skipped", len(present) - len(tokens))
        await self._fill(items, tokens)
        return items

    async def _present(self, keys: list[Key]) -> list[Key]:
        copy, found = self.copy, []
        for group in grouped(keys, self.old.router.locate).values():
            kbs = [placed(key)[0] for key in group]
            present = copy.present(kbs, await self.old.exchange(group[0], copy.probe(kbs)))
            found += [key for key, kb in zip(group, kbs, strict=True) if kb in present]
        return found

    async def _place(self, keys: list[Key]) -> dict[Key, bytes]:
        copy, held = self.copy, {}
        for group in grouped(keys, self.new.router.locate).values():
            kbs = [placed(key)[0] for key in group]
            replies = await self.new.exchange(group[0], copy.place(kbs, PLACEHOLDER_TTL))
            tokens = copy.tokens(kbs, replies)
            held.update({k: tokens[kb] for k, kb in zip(group, kbs, strict=True) if kb in tokens})
        return held

    async def _read(self, keys: list[Key]) -> dict[Key, Item]:
        copy, found = self.copy, {}
        for group in grouped(keys, self.old.router.locate).values():
            kbs = [placed(key)[0] for key in group]
            items = copy.items(kbs, await self.old.exchange(group[0], copy.read(kbs)))
            found.update({k: items[kb] for k, kb in zip(group, kbs, strict=True) if kb in items})
        return found

    async def _fill(self, items: dict[Key, Item], tokens: dict[Key, bytes]) -> None:
        """Fill each held placeholder with its item, or give it back (the item is gone)."""
        copy, now, text_ttl = self.copy, self.clock(), self.source.text_ttl
        held = list(tokens)
        copied = dropped = 0
        for group in grouped(held, self.new.router.locate).values():
            batch = []
            for key in group:
                item = items.get(key)
                if item is None:  # deleted on the old ring since the probe
                    batch.append(copy.give_back(placed(key)[0], tokens[key]))
                else:
                    batch.append(copy.fill(item, tokens[key], copy_expire(item, text_ttl, now)))
            replies = await self.new.exchange(group[0], batch)
            for key, reply in zip(group, replies or [None] * len(group), strict=True):
                if key not in items:
                    continue
                if copy.filled(reply):
                    copied += 1
                else:
                    dropped += 1
        self.tally.add("copied", copied)
        self.tally.add("copy_dropped", dropped)
