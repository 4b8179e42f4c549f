"""Shards of large sets: immutable snapshot items spread over the cluster.

A set whose compacted form outgrows 70% of an item spills into *shards*, keyed
by the root key and a random *generation* (so memcached's hashing spreads them
over the servers); a member lives in shard ``member_hash(member) % count``.
Shards are written once and never appended to: a rewrite writes a new
generation and switches the root to it with ``cas`` (:mod:`django_mcpatterns.core.sets`).

Every shard expires at most :data:`SHARD_TTL_MARGIN` seconds after the root it
was written for (:func:`shard_expire`): a deleted or expired set, an old
generation a rewrite could not delete with certainty, or one replaced by a
``*store`` leaves nothing behind for longer than that.  The margin covers the
time between writing the shards and switching the root to them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Collection, Sequence

from ..exceptions import CollectionTooLargeError
from ..keys import MAX_KEY_LENGTH
from ..store import MAX_RELATIVE_EXPIRE
from ._model import SetOptions
from ._model_layout import (
    ADD,
    REMOVE,
    SHARD,
    Header,
    Member,
    encode_snapshot,
    member_hash,
    set_records,
)
from ._model_views import SetView

__all__ = [
    "SHARD_TTL_MARGIN",
    "LayoutCache",
    "layout",
    "shard_expire",
    "shard_items",
    "shard_key",
    "shard_keys",
]

# Seconds a shard may outlive its root: more than a rewrite takes from writing
# the shards to its last cas, plus memcached's whole-second clock.
SHARD_TTL_MARGIN = 60

Layout = tuple[bytes, int]  # (generation, shard count)

_LAYOUT_CACHE_SIZE = 4096


def shard_key(root: bytes, generation: bytes, index: int) -> bytes:
    """The key of shard ``index`` of a root's shard ``generation`` (at most 250 bytes)."""
    suffix = b"/%s/%d" % (generation.hex().encode(), index)
    if len(root) + len(suffix) <= MAX_KEY_LENGTH:
        return root + suffix
    return (
        b"mcpatterns-shard/" + hashlib.blake2b(root, digest_size=20).hexdigest().encode() + suffix
    )


def shard_keys(
    root: bytes, generation: bytes, count: int, only: Sequence[Member] | None = None
) -> list[bytes]:
    """The keys of a generation's shards: all of them, or those holding ``only``."""
    if not count:
        return []
    indexes = sorted({member_hash(m) % count for m in only}) if only else range(count)
    return [shard_key(root, generation, index) for index in indexes]


def shard_expire(root_expire: int, now: float) -> int:
    """The exptime of shards written for a root stored with exptime ``root_expire``.

    ``now`` is the Unix time, for exptimes that pass memcached's 30-day
    relative limit (absolute ones).  A root that never expires (0) has shards
    that never do either.
    """
    if root_expire <= 0:
        return root_expire
    if root_expire > MAX_RELATIVE_EXPIRE:
        return root_expire + SHARD_TTL_MARGIN  # already an absolute Unix time
    relative = root_expire + SHARD_TTL_MARGIN
    return relative if relative <= MAX_RELATIVE_EXPIRE else int(now) + relative


def shard_items(
    root: bytes,
    nonce: bytes,
    generation: bytes,
    members: Collection[Member],
    size: int,
    options: SetOptions,
) -> dict[bytes, bytes]:
    """The shard items (key -> value) holding ``members``, whose snapshot is ``size`` bytes.

    Shards start 80% full, and their number grows until the fullest fits.
    """
    budget = options.budget(MAX_KEY_LENGTH) - Header.SIZE
    count = max(1, math.ceil(size / (budget * 0.8)))
    while count <= options.max_shards:
        groups: list[list[Member]] = [[] for _ in range(count)]
        for member in members:
            groups[member_hash(member) % count].append(member)
        blocks = [encode_snapshot(group) for group in groups]
        if max(map(len, blocks)) <= budget:
            return {
                shard_key(root, generation, index): Header(
                    SHARD, nonce, shards=index, generation=generation, snapshot=len(block)
                ).pack()
                + block
                for index, block in enumerate(blocks)
            }
        count += max(1, count // 4)
    raise CollectionTooLargeError(
        f"set {root!r} would need more than max_shards={options.max_shards} items "
        f"({size} bytes of {len(members)} members)"
    )


class LayoutCache:
    """Root -> layout of the sharded sets seen, to fetch shards with their root.

    Bounded: it is emptied when full (a missing or stale entry costs one more
    round trip: the root names its shards).
    """

    def __init__(self, size: int = _LAYOUT_CACHE_SIZE) -> None:
        self._size = size
        self._layouts: dict[bytes, Layout] = {}

    def get(self, root: bytes) -> Layout | None:
        return self._layouts.get(root)

    def remember(self, root: bytes, layout: Layout) -> None:
        if len(self._layouts) >= self._size:
            self._layouts.clear()
        self._layouts[root] = layout

    def forget(self, root: bytes) -> None:
        self._layouts.pop(root, None)


def layout(
    kb: bytes,
    view: SetView,
    header: Header,
    options: SetOptions,
    randbytes: Callable[[int], bytes],
) -> tuple[bytes, dict[bytes, bytes]]:
    """The root item (and shard items) holding ``view`` compactly (``randbytes``: a
    new shard generation)."""
    budget = options.budget(len(kb))
    if view.mentioned is not None:  # pending: keep the log, one record per member
        body = set_records(ADD, view.members) + set_records(REMOVE, view.mentioned - view.members)
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
    generation = randbytes(8)
    shards = shard_items(kb, header.nonce, generation, view.members, len(snapshot), options)
    root = header.with_(shards=len(shards), generation=generation, snapshot=0).pack()
    return root, shards
