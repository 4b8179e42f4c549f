"""The write path that append-based sets and lists share (the article ``shared/reference/000_…``).

A collection is one raw item that writers change by appending (or prepending)
records, without reading it.  :class:`AppendCollections` holds what
:class:`~.sets.AppendSets` and :class:`~.lists.AppendLists` do alike, on top of
the article:

Missing or full
    ``append`` answers NOT_STORED both for a missing item and for one that would
    pass the item size limit.  Writers try ``append``, then ``add`` (creation),
    then ``append`` again (a lost creation race); only when all three fail do
    they read the item: it is full, so it is compacted with their records folded
    in.  Nothing is dropped silently.
Unreachable servers
    A server that cannot be reached would answer like a missing item, and a
    write would retry and fail as if it lost races.  Writers use the store's
    strict view (:func:`~.locks.authoritative`) instead and raise
    :class:`~.exceptions.NodeUnavailableError` at once, as locks do; reads
    still degrade to the empty answer of a missing collection.
Concurrent appends during a rewrite
    A rewrite (compaction, pop, growth) is a ``cas``.  When it loses to appends
    made since its read, the item still starts with what was read, so the
    rewrite is retried with those appended bytes carried over after the new
    content: a lost race loses nothing and compaction converges under load.  A
    rewrite that finds anything else (another compaction) gives up to it.
Unknown outcomes
    A rewrite's ``cas`` (or ``add``) goes through the strict view, which tells
    "not stored" from "unknown" (:mod:`.store`).  When the reply never came,
    the item is read again: starting with what was sent, it was applied;
    starting with what was read, it was not (a carried retry follows);
    otherwise, or when it cannot be read, the rewrite raises
    :class:`~.exceptions.OutcomeUnknownError` and whatever the item might name
    (a set's old or new shards) is left in place, to expire.  A rewrite that a
    read decided on (compaction) never fails the read.
Expiry
    A rewrite is a ``cas``, which sets a new TTL: it keeps the item's own, so a
    touched collection keeps its extended life.  Readers get it with the value
    (``gets_ttl``: meta's ``mg <key> v c t f``, one request); where the store
    cannot say it there (the text protocol, a multi-key read) the rewrite asks
    (``ttl``, one more request).  A header also records the expiry given at
    creation, for when the store cannot tell (the item is being created).

:class:`SetOptions` holds the thresholds of both algorithms.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .codec import Header
from .exceptions import (
    ConfigurationError,
    ContentionError,
    NeedsMetaProtocolError,
    NodeUnavailableError,
    OutcomeUnknownError,
    ValueTooLargeError,
)
from .keys import MAX_KEY_LENGTH
from .locks import authoritative
from .memory import FLAGS_SUFFIX, ITEM_OVERHEAD, MemoryStore
from .store import MAX_RELATIVE_EXPIRE, CasToken, Store

__all__ = ["AppendCollections", "Carry", "SetOptions"]

logger = logging.getLogger("django_mcpatterns.sets")

# ``carry(old, current, new)``: ``new`` with what was written since ``old`` was
# read (``current`` is the item now), or None when someone else rewrote it.
Carry = Callable[[bytes, bytes, bytes], "bytes | None"]


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

    def wants_compaction(self, waste: float, live: float, key_length: int) -> bool:
        """Whether ``waste`` bytes (a log, removed values) next to ``live`` ones call for a rewrite.

        Past a quarter of an item always: appends must keep room to land.
        """
        wanted = max(self.compact_min_bytes, self.compact_ratio * live)
        return waste > min(wanted, self.budget(key_length) // 4)


class AppendCollections:
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
        self._writer = authoritative(store)  # see "Unreachable servers"
        self.options = options if options is not None else SetOptions.for_store(store)
        self._clock = clock
        # Nonces and shard generations must differ between processes, even ones
        # forked after this object was built: the default draws from the OS.
        self._rng = rng if rng is not None else random.SystemRandom()
        self._init_state()

    def _init_state(self) -> None:
        """Set up a subclass's own state (called once, at the end of ``__init__``)."""

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

    def _rewrite_expiry(
        self, key: bytes, header: Header, left: int | None = None
    ) -> tuple[int, Header]:
        """The exptime to rewrite an item with, and the header to store.

        memcached has no rewrite that keeps a TTL (``cas`` sets a new one), so
        the item's own (seconds ``left``, -1 for never, a ``touch`` included)
        applies: as read with the item, else asked of the store's ``ttl(key)``.
        Without one (the item is being created, or is gone and the ``cas`` will
        fail, or the store speaks the text protocol, which cannot read a TTL)
        the expiry recorded at creation applies and, once it has passed, the
        creation timeout counts again from now: in text mode a ``touch`` lasts
        until the next rewrite.
        """
        if left is None:
            try:
                left = self.store.ttl(key)
            except NeedsMetaProtocolError:  # OPTIONS["protocol"] = "text": the header's expiry
                left = None
        now = int(self._clock())
        if left is None:
            if header.expires_at == 0:
                return 0, header
            left = header.expires_at - now
            if left <= -2:  # memcached's clock ticks in whole seconds, and may lag ours
                timeout = max(header.timeout, 1)
                return timeout, header.with_(expires_at=now + timeout)
        elif left < 0:
            return 0, header  # it never expires
        if left > MAX_RELATIVE_EXPIRE:
            return now + left, header  # memcached reads this as a Unix time
        return max(left, 1), header

    def _concat(self, store: Store, key: bytes, data: bytes, *, prepend: bool) -> bool:
        try:
            return (store.prepend if prepend else store.append)(key, data)
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
        strict: bool = True,
    ) -> bool:
        """Store ``records`` in one append (prepend): the steady state.

        On NOT_STORED (missing *or* full) ``add`` the item when ``create`` gives
        its header, and append again if that lost a creation race.  False means
        the caller must read the item to tell full from missing.  An unreachable
        server raises, unless ``strict`` is False (a reader completing a set).
        """
        if len(records) > self.options.budget(len(key)):
            return False  # memcached would refuse the append outright
        store = self._writer if strict else self.store
        if self._concat(store, key, records, prepend=prepend):
            return True
        if create is None:
            return False
        try:
            if store.add(key, create() + records, expire):
                return True
        except ValueTooLargeError:
            return False
        return self._concat(store, key, records, prepend=prepend)

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
        someone else rewrote or created the item first, or the server refused
        it: then it certainly was not applied.  A write whose reply never came
        is settled by reading the item again (see "Unknown outcomes");
        :class:`OutcomeUnknownError` when that cannot tell, and
        :class:`NodeUnavailableError` when the server cannot be reached.
        """
        if old is None:
            try:
                return self._writer.add(key, new, expire)
            except OutcomeUnknownError as unknown:
                current, _ = self._reread(key, unknown)
                if current is None:
                    raise  # the add may still land
                return current.startswith(new)
        payload = new
        doubt: OutcomeUnknownError | None = None  # an earlier cas may have been applied
        sent: list[bytes] = []  # the payloads of those
        for _ in range(self.options.attempts):
            try:
                if self._writer.cas(key, payload, token, expire):  # type: ignore[arg-type]
                    return True
            except ValueTooLargeError:
                if doubt is not None:
                    raise doubt from doubt.__cause__
                return False  # the carried appends filled it: read again
            except OutcomeUnknownError as exc:
                doubt = exc
                sent.append(payload)
            current, token = self._reread(key, doubt)
            if current is None:
                return False  # gone: no cas of ours can land on it now
            if any(map(current.startswith, sent)):
                return True  # applied; only its reply was lost
            carried = carry(old, current, new)
            if carried is None:
                if doubt is not None:
                    raise doubt  # rewritten since: after our cas, or instead of it
                return False
            payload = carried
        if doubt is not None:
            raise doubt
        return False

    def _reread(
        self, key: bytes, doubt: OutcomeUnknownError | None
    ) -> tuple[bytes | None, CasToken | None]:
        """The item as it is now, to settle a write; unreadable, a doubt stays unknown."""
        try:
            current, token = self._writer.gets(key)
        except NodeUnavailableError:
            if doubt is not None:
                raise doubt from doubt.__cause__
            raise
        return (current, token) if isinstance(current, bytes) else (None, None)

    def _on_read(self, rewrite: Callable[[], object]) -> None:
        """Run a rewrite a read decided on: the read's answer stands whatever happens to it.

        An unreachable server or an unknown outcome left everything in place;
        a later read compacts again.
        """
        try:
            rewrite()
        except NodeUnavailableError as exc:
            logger.info("compaction skipped: %s", exc)

    def _contention(self, key: bytes, what: str) -> ContentionError:
        return ContentionError(
            f"{what} {key!r} failed: its compare-and-swap kept losing to other "
            f"writers ({self.options.attempts} attempts), or a server did not store it"
        )
