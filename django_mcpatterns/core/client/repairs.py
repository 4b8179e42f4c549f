"""Repairs in the background: journals replayed, and servers that restarted empty recognised.

A process that journaled writes for a server (:mod:`.journal`) replays them
before its next request there; one that sends that server nothing for a
while would leave the stale keys for other processes to read.  The
:class:`Repairer`, one daemon thread per process started on the first
outage, replays every held server's journal as soon as its health admits a
probe (at least every :data:`~.health.HELD_WAIT` second while it owes
repairs), every :data:`INTERVAL` seconds.

Epochs
    When a failing server answers again, the repairer asks it for ``stats``
    (on a connection of its own, outside the pool and the observer): its pid
    and start time (``time - uptime``) are its *epoch*.  A new epoch means it
    restarted, empty: logged as a warning and told to the cluster's restart
    listeners (``Cluster.listen(on_restart=...)``), in every process that
    sees it come back, not only in those that journaled.  Before a process
    knows a server's epoch, a server younger than this process's first
    connection to it (noted when the connection opened, no request) counts
    as a restart: a stall never does, whenever the server started.  Epochs
    of the other servers are read at the first outage, for later comparison.

Nothing runs in a process that never sees a server fail.  A forked child
starts its own thread when it first needs one.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = [
    "EPOCH_SLACK",
    "INTERVAL",
    "UPTIME_SLACK",
    "Epoch",
    "Repairer",
    "epoch_of",
    "repairer",
    "restarted",
]

logger = logging.getLogger("django_mcpatterns.cluster")

INTERVAL = 0.2  # seconds between the repairer's rounds while it has work
EPOCH_SLACK = 2  # seconds a start time may move (memcached's clock ticks in whole seconds)
UPTIME_SLACK = 1  # seconds memcached's uptime may lag its age (a late tick of its clock)

Epoch = tuple[int, int]
"""A server's incarnation: its pid and its start time (Unix seconds, from its own clock)."""


class Repairable(Protocol):
    """What the repairer asks of a cluster's shared state (:class:`~.shared.Shared`)."""

    def repair_round(self) -> bool:
        """Replay what may be replayed and check the epochs asked for; True while work is left."""
        ...


def epoch_of(stats: object) -> tuple[Epoch | None, int]:
    """The epoch in a ``stats`` reply and the server's uptime ((None, 0): no such reply)."""
    if not isinstance(stats, Mapping):
        return None, 0
    try:
        pid, uptime, now = int(stats["pid"]), int(stats["uptime"]), int(stats["time"])
    except (KeyError, TypeError, ValueError):
        return None, 0  # a proxy's stats, or something else
    return (pid, now - uptime), uptime


def restarted(
    known: Epoch | None, epoch: Epoch, uptime: int, down: float, met: float | None = None
) -> bool:
    """Whether a server whose epoch is now ``epoch`` restarted since ``known`` was read.

    Without ``known`` (this process's first outage there): whether it is
    younger than this process's first connection to it, ``met`` seconds ago
    (it was up then), by more than memcached's uptime can be off.  A stall
    is never taken for a restart, whenever the server started; a restart
    within a few seconds of that first connection is not recognised.  Never
    connected (``met`` None): whether it started after the outage began
    (``down`` seconds ago).
    """
    if known is None:
        # memcached's uptime counts whole seconds from 2 s before its start, ticking once a
        # second: it exceeds the server's age by less than 3 s, and falls short of it only
        # by a late tick.
        if met is not None:
            return uptime + UPTIME_SLACK < met
        return uptime <= down + 3
    return known[0] != epoch[0] or abs(known[1] - epoch[1]) > EPOCH_SLACK


class Repairer:
    """The process's repair thread (see the module docstring): wake it with work."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._work: weakref.WeakSet[Any] = weakref.WeakSet()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        os.register_at_fork(after_in_child=self._after_fork)
        self.rounds = 0  # rounds run (tests wait on it)
        self.idle = threading.Event()  # set while it has nothing to do
        self.idle.set()

    def wake(self, shared: Repairable) -> None:
        """Have ``shared``'s repairs done within a round; start the thread if it is not running."""
        with self._lock:
            self._work.add(shared)
            self.idle.clear()
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._wake = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, name="mcpatterns-repairs", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _after_fork(self) -> None:
        """In a forked child: the parent's thread is not here, and its lock, or the locks
        inside its events (held for an instant by each set, clear or wait), may be held."""
        self._lock = threading.Lock()
        self._thread = None
        self._wake = threading.Event()
        idle, self.idle = self.idle, threading.Event()
        if idle.is_set():  # reads the flag without the event's lock
            self.idle.set()

    def _run(self) -> None:
        wake = self._wake
        while True:
            wake.wait(self.interval)
            wake.clear()
            with self._lock:
                work = list(self._work)
            for shared in work:
                try:
                    busy = shared.repair_round()
                except Exception:  # never let the thread die: log, and try again next round
                    logger.exception("memcached repairs failed; retrying")
                    busy = True
                if not busy:
                    with self._lock:
                        self._work.discard(shared)
            self.rounds += 1
            with self._lock:
                if not self._work:
                    self.idle.set()
            if self.idle.is_set():
                wake.wait()


_repairer = Repairer()


def repairer() -> Repairer:
    """The process's repairer."""
    return _repairer
