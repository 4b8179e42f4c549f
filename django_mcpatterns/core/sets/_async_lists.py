"""Append-based lists over any Store (``shared/reference/004_…``).

A list is one raw item, with memcached's prepend-blacklist trick.  Values are
appended with a timestamp; ``lrem`` *prepends* a removal (the blacklist, read
before the items) that hides matching values pushed before it.  Compaction
applies the removals.  The write path is :mod:`django_mcpatterns.core.sets`'s, the encodings are in
:mod:`django_mcpatterns.core.sets`.

Round trips in steady state: ``rpush``/``lrem`` 1, ``lrange``/``llen`` 1 (``gets``).

Written once: ``AsyncAppendLists`` over an
:class:`~django_mcpatterns.core.store.AsyncStore`, here; the generated ``AppendLists``
over a :class:`~django_mcpatterns.core.store.Store`.  Lists as read are in
``_model_lists.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django_mcpatterns.core.exceptions import (
    CollectionTooLargeError,
    IncompleteListError,
    NodeUnavailableError,
)
from django_mcpatterns.core.keys import PlainKey, key_bytes

from ._async_append import AsyncAppendCollections, Report
from ._model import ReadRewrite
from ._model_layout import (
    LIST,
    Header,
    Member,
    Removal,
    check_members,
    parse_list,
    push_records,
    removal_record,
)
from ._model_lists import ListView, carry_list

__all__ = ["AsyncAppendLists"]


class AsyncAppendLists(AsyncAppendCollections):
    """Lists with memcached's append/prepend-blacklist trick (``shared/reference/004_…``).

    ``rpush`` appends, ``lrem`` prepends a removal read before the items.  Each
    push and removal carries a microsecond timestamp from ``clock`` (strictly
    increasing per instance), so a removal hides only values pushed before it,
    across processes as far as their clocks agree.  Lists are one item: one
    that would outgrow it raises
    :class:`~django_mcpatterns.core.exceptions.CollectionTooLargeError`.
    """

    def _init_state(self) -> None:
        self._last_stamp = 0
        self._stamp_lock = threading.Lock()

    async def rpush(
        self, key: PlainKey, *values: Member, expire: int = 0, report: Report | None = None
    ) -> int:
        """Append values (creating the list with ``expire``); return how many were pushed.

        A write its server could not take returns 0 and leaves the list
        incomplete (``OPTIONS["on_outage"]``, :mod:`._async_append`).
        """
        listed = check_members(values)
        if listed:
            stamp = self._stamp()
            kb = key_bytes(key)

            def create() -> bytes:
                return self._new_header(LIST, expire).pack()

            def fold(view: ListView) -> None:
                view.pushes += [(stamp, value) for value in listed]

            records = push_records(stamp, listed)
            try:
                await self._modify(kb, records, create, expire, fold, prepend=False)
            except NodeUnavailableError as exc:
                return await self._lost(kb, LIST, "rpush", exc, expire, report)
        return len(listed)

    async def lrem(
        self,
        key: PlainKey,
        count: int,
        value: Member,
        *,
        expire: int = 0,
        report: Report | None = None,
    ) -> int:
        """Remove like Redis ``LREM`` (``count`` > 0 from the head, < 0 from the tail,
        0 all); return 1 once the removal is recorded, 0 when the list is missing
        (or its server could not take the write: see :meth:`rpush`; ``expire`` is
        then the exptime of the incomplete list left in its place)."""
        check_members([value])
        stamp = self._stamp()

        def fold(view: ListView) -> None:
            view.removals.append(Removal(stamp, count, value))

        record = removal_record(stamp, count, value)
        kb = key_bytes(key)
        try:
            return int(await self._modify(kb, record, None, 0, fold, prepend=True))
        except NodeUnavailableError as exc:
            return await self._lost(kb, LIST, "lrem", exc, expire, report)

    async def lrange(self, key: PlainKey, start: int, end: int) -> list[Member]:
        """Values from ``start`` to ``end`` inclusive; negative indexes count from the end."""
        items = await self._items(key_bytes(key))
        size = len(items)
        first = start if start >= 0 else max(size + start, 0)
        last = min(end if end >= 0 else size + end, size - 1)
        return items[first : last + 1] if first <= last else []

    async def llen(self, key: PlainKey) -> int:
        return len(await self._items(key_bytes(key)))

    def _stamp(self) -> int:
        with self._stamp_lock:
            self._last_stamp = max(int(self._clock() * 1_000_000), self._last_stamp + 1)
            return self._last_stamp

    async def _modify(
        self,
        kb: bytes,
        records: bytes,
        create: Callable[[], bytes] | None,
        expire: int,
        fold: Callable[[ListView], None],
        *,
        prepend: bool,
    ) -> bool:
        for _ in range(self.options.attempts):
            if await self._write(kb, records, create, expire, prepend=prepend):
                return True
            view = await self._read(kb)
            if view is None:
                if create is None:
                    return False
                view = ListView(None, None, self._new_header(LIST, expire))
            fold(view)
            if await self._rewrite(kb, view, view.items()):
                return True
        raise self._contention(kb, "write to list")

    async def _read(self, kb: bytes) -> ListView | None:
        data, token, ttl = await self.store.gets_ttl(kb)
        if data is None:
            return None
        removals, _, header, pushes = parse_list(data)
        return ListView(data, token, header, removals, pushes, ttl)

    async def _items(self, kb: bytes) -> list[Member]:
        view = await self._read(kb)
        if view is None:
            return []
        if view.header.pending:
            raise IncompleteListError(
                f"list {kb!r} lost writes in an outage: it reads whole again once it "
                "expires or is deleted"
            )
        items = view.items()
        if view.removals:
            assert view.data is not None
            live = sum(len(push_records(stamp, [value])) for stamp, value in items)
            waste = len(view.data) - Header.SIZE - live
            if self.options.wants_compaction(waste, live, len(kb)):
                with ReadRewrite():
                    await self._rewrite(kb, view, items)
        return [value for _, value in items]

    async def _rewrite(self, kb: bytes, view: ListView, items: list[tuple[int, Member]]) -> bool:
        expire, header = await self._rewrite_expiry(kb, view.header, view.ttl)
        body = b"".join([push_records(stamp, [value]) for stamp, value in items])
        new = header.pack() + body
        if len(new) > self.options.budget(len(kb)):
            raise CollectionTooLargeError(
                f"list {kb!r} would outgrow one item ({len(new)} bytes; lists do not shard)"
            )
        return await self._commit(kb, view.data, view.token, new, expire, carry_list)
