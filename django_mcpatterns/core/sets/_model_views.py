"""Sets as read: the pure part of the append-based sets (see :mod:`django_mcpatterns.core.sets`).

Both forms of the algorithm (``_async.py`` and the generated
``_sync.py``) read a set into a :class:`SetView` by replaying its log
(:func:`replay`), and rewrite it with :func:`carry_appends` carrying racing
appends over.  :class:`LostShard` is their internal signal for a shard that
eviction took.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..concurrency import AsyncCompute, Compute
from ..store import CasToken
from ._model_layout import (
    Base,
    Header,
    Member,
    check_members,
    decode_record,
    decode_snapshot,
    parse_set_log,
)

__all__ = [
    "STORED",
    "AsyncLoader",
    "Fetched",
    "Loader",
    "LostShard",
    "SetView",
    "carry_appends",
    "difference",
    "intersection",
    "matching",
    "replay",
    "union",
    "unique_members",
]

# A set's source of truth, called when the set is missing (or lost a shard): any
# callable in sync code; a coroutine function or a plain callable (run through
# ``sync_to_async``: it may use the ORM) in async code.
Loader = Compute[Iterable[Member]]
AsyncLoader = AsyncCompute[Iterable[Member]]


def carry_appends(old: bytes, current: bytes, new: bytes) -> bytes | None:
    """Sets: what was appended since ``old`` was read goes after the new content."""
    return new + current[len(old) :] if current.startswith(old) else None


# A root as fetched: (data, token, header, shards, partial, ttl or None: not read).
Fetched = tuple[bytes, CasToken, Header, list[bytes], bool, "int | None"]


class LostShard(Exception):
    """A shard the root names is missing or stale (internal): the root as read, and
    the keys of the shards that were ``missing`` (their server may only be out)."""

    def __init__(
        self,
        kb: bytes,
        data: bytes,
        token: CasToken,
        header: Header,
        missing: Sequence[bytes] = (),
    ) -> None:
        super().__init__(kb)
        self.kb, self.data, self.token, self.header = kb, data, token, header
        self.missing = list(missing)


@dataclass(slots=True)
class SetView:
    """A set as read: its members and what a rewrite needs."""

    data: bytes | None  # the root item; None for a set being created
    token: CasToken | None
    header: Header
    members: set[Member]
    mentioned: set[Member] | None = None  # pending sets: members the log decided
    log_bytes: int = 0
    snapshot_bytes: int = 0
    partial: bool = False  # only the shards of some members were read
    ttl: int | None = None  # seconds left, as read with the root (None: not read)

    @property
    def complete(self) -> bool:
        return self.mentioned is None


def unique_members(members: Iterable[Member]) -> list[Member]:
    return list(dict.fromkeys(check_members(members)))


def replay(view: SetView, data: bytes, start: int) -> None:
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


def matching(members: Iterable[Member], match: str | bytes | None) -> set[Member]:
    """The members a Redis ``SSCAN ... MATCH match`` returns: glob-style (``*``, ``?``,
    ``[abc]``), on a member's text (an int's decimal digits; bytes match bytes, or a str
    pattern encoded as UTF-8).  ``None`` matches every member."""
    if match is None:
        return set(members)
    text = match if isinstance(match, str) else match.decode("utf-8", "surrogateescape")
    raw = text.encode("utf-8", "surrogateescape")
    found: set[Member] = set()
    for member in members:
        if isinstance(member, bytes):
            hit = fnmatch.fnmatchcase(member, raw)
        else:
            hit = fnmatch.fnmatchcase(str(member), text)
        if hit:
            found.add(member)
    return found


# -- the algebra (sunion, sinter, sdiff and their stores) -----------------------


def union(sets: list[set[Member]]) -> set[Member]:
    return set().union(*sets)


def intersection(sets: list[set[Member]]) -> set[Member]:
    ordered = sorted(sets, key=len)
    return ordered[0].intersection(*ordered[1:]) if ordered else set()


def difference(sets: list[set[Member]]) -> set[Member]:
    return sets[0].difference(*sets[1:]) if sets else set()


STORED: dict[str, Callable[[list[set[Member]]], set[Member]]] = {
    "sunionstore": union,
    "sinterstore": intersection,
    "sdiffstore": difference,
}
"""Each ``*store`` command's algebra."""
