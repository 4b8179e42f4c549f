"""The journal: what each server missed, repaired before that server serves this process again.

One mechanism for every write that could not reach its server: a replicated
key's copy that missed a write or a delete (:mod:`.replicas`), a key written to
the gutter while its own server was out (:mod:`.gutter`), and what a degraded
pattern gave up on (a set or list write, a namespace invalidation, a counter
change: ``forget`` in :mod:`..protocol.commands`, under ``OPTIONS["on_outage"]``).

Each entry is a key and the request that repairs it on that server: a
``delete`` (the next read rebuilds the key from its source), or for a set or
list a ``set`` of an item that reads as incomplete.  Both are idempotent, so a
replay that runs twice (two threads, a retry) or after a late write lands is
still right; nothing is ever replayed that could apply a change twice (an
``incr`` or an ``append`` whose outcome is unknown is never sent again).

A server with entries is *held* (:meth:`~.health.NodeHealth.hold`): the hot
path skips it, every plan admits it through :func:`admit`, which replays the
entries first, and the hold is lifted once they are answered.  A
:class:`~.repairs.Repairer` thread replays them within about a second of the
server answering, for a process that sends it nothing meanwhile.

Entries live in the process: one that dies with entries leaves those keys as
they were, until their TTL (docs/failures.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..protocol.wire import Delete, Request
from .health import Admission
from .node import Node
from .ops import FAILED, NodePlan, Run

__all__ = ["JOURNAL_WARNING", "REPLAY_BATCH", "Due", "Journal", "admit", "replay"]

logger = logging.getLogger("django_mcpatterns.journal")

# Entries for one server past which a warning is logged (once per server and process):
# each is a key's bytes, so this many are a few tens of MB at most.
JOURNAL_WARNING = 100_000
REPLAY_BATCH = 500  # requests per write when a server replays what it missed

Due = dict[bytes, tuple[int, Request[Any]]]
"""A snapshot of one server's entries: key -> (sequence number, repairing request)."""


class Journal:
    """The keys each server missed writes of, in this process, and how to repair each.

    ``dirty`` is read without the lock on the hot path: the names of the
    servers that have entries.  ``hold(name, held)`` is told when a server
    gets its first entry or loses its last (the cluster holds its health).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, Due] = {}
        self._seq = 0
        self.dirty: frozenset[str] = frozenset()
        self._warned: set[str] = set()
        self.recorded = 0  # entries ever recorded (status page, tests)
        self.replayed_count = 0  # repairs ever replayed
        self.hold: Callable[[str, bool], None] | None = None

    def missed(self, node: str, keys: Iterable[bytes]) -> None:
        """Record that ``node`` missed a write or a delete of ``keys``: delete them there."""
        for key in keys:
            self.record(node, key, Delete(key))

    def record(self, node: str, key: bytes, request: Request[Any]) -> None:
        """Record that ``node`` must run ``request`` (a delete, or a set) before it serves."""
        with self._lock:
            entries = self._entries.setdefault(node, {})
            self._seq += 1
            entries[key] = (self._seq, request)
            self.recorded += 1
            if node not in self.dirty:
                self.dirty = self.dirty | {node}
                if self.hold is not None:
                    self.hold(node, True)
            crowded = len(entries) > JOURNAL_WARNING and node not in self._warned
            if crowded:
                self._warned.add(node)
        if crowded:
            logger.warning(
                "%s has missed writes of %d keys, kept until it answers again: "
                "a server down this long is better removed from LOCATION",
                node,
                len(entries),
            )

    def due(self, node: str) -> Due:
        """A snapshot of ``node``'s entries, to replay there before it serves."""
        with self._lock:
            return dict(self._entries.get(node, {}))

    def replayed(self, node: str, done: Mapping[bytes, tuple[int, Request[Any]]]) -> None:
        """Forget the entries of ``done`` that nobody recorded again since the snapshot."""
        with self._lock:
            entries = self._entries.get(node)
            if entries is None:
                return
            for key, (seq, _) in done.items():
                found = entries.get(key)
                if found is not None and found[0] == seq:
                    del entries[key]
                    self.replayed_count += 1
            if not entries:
                del self._entries[node]
                self.dirty = self.dirty - {node}
                if self.hold is not None:
                    self.hold(node, False)

    def pending(self) -> dict[str, int]:
        """How many keys each server still has to repair."""
        with self._lock:
            return {node: len(entries) for node, entries in self._entries.items()}

    def after_fork(self) -> None:
        """A forked child inherits the parent's entries (as stale for it) and gets a new lock."""
        self._lock = threading.Lock()


def admit(journal: Journal, node: Node) -> NodePlan:
    """Leave to use ``node`` (:meth:`~.health.NodeHealth.admit`), its journal replayed first."""
    if node.name not in journal.dirty:
        return node.health.admit()
    admission = node.health.repairing()
    if admission is None:
        return None
    return (yield from replay(journal, node, admission))


def replay(journal: Journal, node: Node, admission: Admission) -> NodePlan:
    """Run on ``node`` the repairs it owes; its admission afterwards, None when that failed."""
    due = journal.due(node.name)
    entries = list(due.values())
    if not entries and admission.probe:
        node.health.released()  # another thread replayed them meanwhile: no verdict here
    for start in range(0, len(entries), REPLAY_BATCH):
        batch = tuple(request for _, request in entries[start : start + REPLAY_BATCH])
        if (yield Run(node, batch, None, admission)) is FAILED:
            return None
        admission = node.health.repairing() or admission
    journal.replayed(node.name, due)
    return node.health.admit()
