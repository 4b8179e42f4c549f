"""Thresholds and pure pieces of the append-based write path (sets and lists).

The algorithms are written once, as asyncio code in ``_async*.py`` (sets,
lists and what they share in ``_async_append.py``) and generated into ``_sync*.py``;
what both forms import without doing I/O lives here: :class:`SetOptions`, the
``Carry`` type of a rewrite that carries racing appends over, and
:class:`ReadRewrite`, the guard around a rewrite that a read decided on.  See
:mod:`django_mcpatterns.core.sets` for the algorithm.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ..exceptions import ConfigurationError, NodeUnavailableError
from ..keys import MAX_KEY_LENGTH
from ..memory import FLAGS_SUFFIX, ITEM_OVERHEAD, AsyncMemoryStore, MemoryStore
from ..store import AsyncStore, Store

__all__ = ["Carry", "ReadRewrite", "SetOptions"]

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
        :class:`~django_mcpatterns.core.exceptions.CollectionTooLargeError`.
    ``attempts``
        How often a write retries after losing races before it raises
        :class:`~django_mcpatterns.core.exceptions.ContentionError`.
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
    def for_store(cls, store: Store | AsyncStore, **options: Any) -> SetOptions:
        """Options matching the store's item limit (a MemoryStore's, else memcached's 1 MiB)."""
        if isinstance(store, AsyncMemoryStore):
            store = store.sync
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


class ReadRewrite:
    """Run a rewrite a read decided on: the read's answer stands whatever happens to it.

    ``with ReadRewrite(): rewrite()``.  An unreachable server or an unknown
    outcome left everything in place (it is logged and swallowed); a later
    read compacts again.
    """

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        if isinstance(exc, NodeUnavailableError):
            logger.info("compaction skipped: %s", exc)
            return True
        return False
