"""Replicated hot keys: which servers hold a key's copies, and what each command does to them.

``OPTIONS["replicate"] = {"hot:": 3}`` keeps every key whose name, as the caller
gives it, starts with ``hot:`` on 3 distinct servers: the key's ketama
successors (:meth:`~.ketama.Continuum.get_nodes`).  The first of them, the
server the key has without replication, is its *home*.  This module holds the
decisions (sans-IO, shared by the sync and the async cluster); the clusters
do the I/O.

What each command does (:func:`fate`)
    ``get`` (no cas)
        One live replica, chosen at random per read: reads spread over the copies.
    ``set``, ``delete``, ``touch``
        Every replica, in one parallel round trip.
    ``gets`` (cas tokens)
        One live replica, as ``get``; a copy's token is a :class:`CopyToken`,
        which a ``cas`` checks against the home's item first (one round trip
        more).  The owner primitives' own reads go to the home.
    ``add``, ``cas`` and the meta stores
        The home decides (an ``add`` lock is held at most once: one server
        arbitrates it), then the copies are brought in line in a second round
        trip: the stored value is ``set`` on them, or, when the home's outcome
        is unknown, they are deleted.
    ``append``, ``prepend``, ``incr``, ``decr``
        Refused with :class:`~.exceptions.ReplicatedKeyError`: an in-place edit
        that reached some copies and not others would leave them different for
        good.  Sets, lists, counters and namespace versions live outside
        replicated prefixes.

A copy that missed a write or a delete (dead, timed out, stalled) is recorded in
the process's :class:`~.journal.Journal` and deleted there before that server
serves a read again (docs/replication.md).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import ConfigurationError
from ..protocol.meta import MetaArithmetic, MetaDelete, MetaGet, MetaSet
from ..protocol.plans import CopyToken
from ..protocol.wire import DELETED, STORED, TOUCHED, Delete, Get, Incr, MetaReply, Request, Store
from .journal import Journal

__all__ = [
    "CopyToken",
    "Fate",
    "Journal",
    "ReplicaPolicy",
    "changed",
    "check_replicate",
    "copy_tokens",
    "fate",
    "is_write",
    "mirror",
    "mirrored_batch",
    "request_key",
]


class Fate(enum.Enum):
    """Where a command on a replicated key goes (see the module docstring)."""

    READ = "one live replica"
    TOKEN_READ = "the home, else a live copy (CopyToken)"  # the owner primitives' own reads
    EVERYWHERE = "every replica"
    HOME_THEN_MIRROR = "the home, then the stored value on the copies"
    HOME_THEN_DROP = "the home, then the copies deleted"
    REFUSED = "refused"


_EDITS = frozenset({"append", "prepend"})


def fate(request: Request[Any] | tuple[Request[Any], ...]) -> Fate:
    """Return what ``request`` (or a batch) on a replicated key does to its replicas."""
    if isinstance(request, tuple):
        if any(fate(r) is Fate.REFUSED for r in request):
            return Fate.REFUSED
        return Fate.HOME_THEN_DROP if any(is_write(r) for r in request) else Fate.TOKEN_READ
    if isinstance(request, Get):
        return Fate.TOKEN_READ if request.cas else Fate.READ
    if isinstance(request, Store):
        command = request.command
        if command in _EDITS:
            return Fate.REFUSED
        return Fate.EVERYWHERE if command == "set" else Fate.HOME_THEN_MIRROR
    if isinstance(request, Delete):
        return Fate.EVERYWHERE
    if isinstance(request, Incr | MetaArithmetic):
        return Fate.REFUSED
    if isinstance(request, MetaSet):
        mode = request.mode
        if mode in ("A", "P"):
            return Fate.REFUSED
        return Fate.HOME_THEN_MIRROR
    if isinstance(request, MetaDelete):
        plain = request.cas is None and not request.invalidate
        return Fate.EVERYWHERE if plain else Fate.HOME_THEN_DROP
    if isinstance(request, MetaGet):
        return Fate.HOME_THEN_DROP if is_write(request) else Fate.TOKEN_READ
    return Fate.EVERYWHERE  # touch


def is_write(request: Request[Any] | tuple[Request[Any], ...]) -> bool:
    """Whether ``request`` may change what the server holds for its key."""
    if isinstance(request, tuple):
        return any(is_write(r) for r in request)
    if isinstance(request, Get):
        return False
    if isinstance(request, MetaGet):
        return (
            request.vivify is not None or request.touch is not None or request.recache is not None
        )
    return True


def request_key(request: Request[Any] | tuple[Request[Any], ...]) -> bytes | None:
    """The key a single-key request (or a batch's first request) is about."""
    first = request[0] if isinstance(request, tuple) else request
    if isinstance(first, Get):
        keys = first.keys
        return keys[0] if len(keys) == 1 else None
    key = getattr(first, "key", None)
    return key if isinstance(key, bytes) else None


def mirror(request: Request[Any]) -> Store | None:
    """The ``set`` that copies what a home's store stored, or None (not a whole value)."""
    if isinstance(request, Store):
        return Store("set", request.key, request.data, request.flags, request.expire)
    if isinstance(request, MetaSet):
        return Store("set", request.key, request.data, request.client_flags or 0, request.ttl or 0)
    return None


@dataclass(frozen=True)
class ReplicaPolicy:
    """Which keys are replicated, and on how many servers.

    ``prefixes`` maps a key prefix (as the caller gives the key) to its number
    of copies; the longest matching prefix wins.  ``scope`` is a regular
    expression for what a framework puts before the caller's key in the bytes
    sent to memcached (Django's ``KEY_PREFIX:version:``), skipped before
    matching; empty for keys given to a cluster directly.
    """

    prefixes: tuple[tuple[bytes, int], ...]
    scope: str = ""
    _scope: re.Pattern[bytes] | None = field(init=False, repr=False, compare=False, default=None)

    @classmethod
    def build(cls, replicate: Mapping[str, int], scope: str = "") -> ReplicaPolicy | None:
        """Return the policy for ``OPTIONS["replicate"]``, None when nothing is replicated."""
        entries = check_replicate(replicate)
        if not entries:
            return None
        ordered = sorted(((p.encode(), n) for p, n in entries.items()), key=lambda e: -len(e[0]))
        return cls(tuple(ordered), scope)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_scope", re.compile(self.scope.encode()) if self.scope else None)

    def copies(self, key: bytes) -> int:
        """How many servers hold ``key`` (1: not replicated)."""
        scope = self._scope
        start = 0
        if scope is not None:
            matched = scope.match(key)
            if matched is None:
                return 1
            start = matched.end()
        for prefix, copies in self.prefixes:
            if key.startswith(prefix, start):
                return copies
        return 1

    @property
    def most(self) -> int:
        return max(copies for _, copies in self.prefixes)


def check_replicate(replicate: object) -> dict[str, int]:
    """Validate ``OPTIONS["replicate"]``: a mapping of non-empty str prefixes to copies >= 1."""
    if replicate is None:
        return {}
    if not isinstance(replicate, Mapping):
        raise ConfigurationError(
            "option 'replicate' must be a mapping of key prefix to number of copies, "
            f"not {replicate!r}",
            option="replicate",
        )
    checked: dict[str, int] = {}
    for prefix, copies in replicate.items():
        if not isinstance(prefix, str) or not prefix:
            raise ConfigurationError(
                f"option 'replicate': prefixes are non-empty strings, not {prefix!r}",
                option="replicate",
            )
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
            raise ConfigurationError(
                f"option 'replicate': copies of {prefix!r} must be an integer >= 1, not {copies!r}",
                option="replicate",
            )
        checked[prefix] = copies
    return checked


# -- what a home's reply means for the copies (routes.py's plans) ---------------


def copy_tokens(reply: Any) -> Any:
    """A ``gets`` reply from a copy, its tokens as CopyTokens carrying their item."""
    if type(reply) is not list:
        return reply
    return [v._replace(cas=CopyToken(v.cas, v.data, v.flags)) if v.cas else v for v in reply]


def mirrored_batch(batch: tuple[Request[Any], ...], replies: Any) -> Store | None:
    """The ``set`` copying a batch's one store (``_text_cas``: the store, then a ``gets``).

    None (the copies are deleted instead) unless the batch's only write is a
    whole-value store that the home applied.
    """
    if type(replies) is not list or len(replies) != len(batch):
        return None
    writes = [(r, reply) for r, reply in zip(batch, replies, strict=True) if is_write(r)]
    if len(writes) != 1:
        return None
    request, reply = writes[0]
    if fate(request) not in (Fate.HOME_THEN_MIRROR, Fate.EVERYWHERE) or not changed(reply):
        return None
    return mirror(request)


def changed(reply: Any) -> bool:
    """Whether a write's reply says the server changed the item (stored, deleted...)."""
    if isinstance(reply, MetaReply):
        return reply.status == b"HD"
    if type(reply) is list:  # a batch: any of its writes
        return any(changed(r) for r in reply)
    return reply in (STORED, DELETED, TOUCHED)
