"""Per-server health: when to stop contacting a failing memcached, and when to try again.

A server that fails once is left alone for ``retry_timeout`` seconds, so its
operations fail at once instead of each waiting out a socket timeout; after
``retry_attempts`` consecutive failures it is *dead* for ``dead_timeout``
seconds.  When the wait is over, exactly one operation (the *prober*) is let
through; every other one keeps failing fast until the probe succeeds (the
server is back) or fails (the wait starts again).  Any success resets the count.

One :class:`NodeHealth` per server is shared by every thread of the process
(Django builds a backend per thread) and survives ``Cluster.close()``; a forked
child starts from its parent's view (:meth:`NodeHealth.after_fork`).  Time
comes from an injected ``clock`` so the timing rules are tested with a fake one.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

EventKind = Literal["failure", "dead", "revived"]
State = Literal["up", "failing", "dead"]


class Admission(enum.IntEnum):
    """Whether an operation may contact a server (falsy when it may not)."""

    REFUSED = 0
    ADMITTED = 1
    PROBE = 2  # the one operation trying a failing server again


@dataclass(frozen=True)
class NodeEvent:
    """A change in a server's health, reported to ``on_node_event``.

    ``kind`` is ``"failure"`` for every failed operation, ``"dead"`` when the
    server reaches ``retry_attempts`` consecutive failures and ``"revived"`` when
    a dead server answers again.  ``error`` is the exception behind a failure.
    """

    node: str
    kind: EventKind
    error: BaseException | None = None


@dataclass(frozen=True)
class HealthSnapshot:
    """A server's health at one instant (for status pages and management commands)."""

    node: str
    state: State
    failures: int
    retry_in: float  # seconds until the server may be contacted again (0: now)
    last_error: str | None


class NodeHealth:
    """The failure count and retry timer of one server, shared by all threads.

    ``failures`` is read without the lock on the hot path: while it is 0 the
    server is healthy and nothing else needs checking.
    """

    __slots__ = (
        "_attempts",
        "_clock",
        "_dead_timeout",
        "_last_error",
        "_lock",
        "_probing",
        "_report",
        "_retry_at",
        "_retry_timeout",
        "failures",
        "node",
    )

    def __init__(
        self,
        node: str,
        *,
        retry_attempts: int,
        retry_timeout: float,
        dead_timeout: float,
        clock: Callable[[], float],
        report: Callable[[NodeEvent], object],
    ) -> None:
        self.node = node
        self.failures = 0
        self._retry_at = 0.0
        self._probing = False
        self._last_error: str | None = None
        self._attempts = retry_attempts
        self._retry_timeout = retry_timeout
        self._dead_timeout = dead_timeout
        self._clock = clock
        self._report = report
        self._lock = threading.Lock()

    @property
    def dead(self) -> bool:
        return self.failures >= self._attempts

    def admit(self) -> Admission:
        """Return whether an operation may contact the server now.

        A healthy server always may.  A failing or dead one may only once its
        wait is over, and then only for one operation at a time: that caller
        gets ``PROBE`` and must end with :meth:`succeeded`,
        ``failed(..., probe=True)`` or :meth:`released`.
        """
        if not self.failures:
            return Admission.ADMITTED
        with self._lock:
            if not self.failures:
                return Admission.ADMITTED
            if self._probing or self._clock() < self._retry_at:
                return Admission.REFUSED
            self._probing = True
            return Admission.PROBE

    def succeeded(self) -> None:
        """Record an answer from the server: it is healthy again."""
        with self._lock:
            was_dead = self.dead
            self.failures = 0
            self._retry_at = 0.0
            self._probing = False
        if was_dead:
            self._report(NodeEvent(self.node, "revived"))

    def failed(self, error: BaseException, *, probe: bool = False) -> None:
        """Record a connection failure or timeout and start the wait before the next try.

        ``probe`` says the failed operation was the prober; an operation that
        began while the server looked healthy leaves a running probe alone.
        """
        with self._lock:
            was_dead = self.dead
            self.failures += 1
            now_dead = self.dead
            wait = self._dead_timeout if now_dead else self._retry_timeout
            self._retry_at = self._clock() + wait
            if probe:
                self._probing = False
            self._last_error = f"{type(error).__name__}: {error}"
        self._report(NodeEvent(self.node, "failure", error))
        if now_dead and not was_dead:
            self._report(NodeEvent(self.node, "dead", error))

    def released(self) -> None:
        """End a probe that reached no verdict (e.g. its value could not be serialised)."""
        with self._lock:
            self._probing = False

    def after_fork(self) -> None:
        """Start a forked child's copy from the parent's view, minus what was the parent's.

        The failure count and timers still describe the server (the clock is
        the machine's monotonic one), so a server the parent knows is dead is
        not hammered by every new worker.  A probe in flight belongs to a parent
        thread that does not exist here, and so may the lock: both start anew.
        """
        self._lock = threading.Lock()
        self._probing = False

    def snapshot(self) -> HealthSnapshot:
        with self._lock:
            failures = self.failures
            retry_in = max(0.0, self._retry_at - self._clock()) if failures else 0.0
            state: State = "up" if not failures else "dead" if self.dead else "failing"
            return HealthSnapshot(self.node, state, failures, retry_in, self._last_error)
