"""Per-server health: when to stop contacting a failing memcached, and when to try again.

Epochs
    Every operation is admitted under the server's current *epoch*, the
    number of failures recorded so far.  When a server stalls, every request
    in flight times out at about the same moment; the first of them records
    the failure and opens a new epoch, and the others, admitted before it,
    belong to that same failure and count nothing.  One stall is one failure,
    however many threads were waiting on it.
Waits and probes
    After a failure the server is not contacted for ``retry_timeout`` seconds
    (its operations fail at once instead of each waiting for a timeout).  When
    the wait is over exactly one operation, the *probe*, is let through; the
    others keep failing fast until it answers (the server is up again) or
    fails (the next wait starts).  The drivers end the wait only on an answer
    to a request admitted since the failure (:meth:`NodeHealth.current`): a
    reply to one admitted before may have been read before the failure.
Dead
    ``retry_attempts`` consecutive failures (the one that took the server out,
    then each failed probe) make it *dead*.  A dead server is probed with a
    back-off: the first wait is about ``retry_timeout``, each failed probe
    doubles it, up to ``dead_timeout``; each wait is shortened by up to a
    quarter through the injected ``rng``, so processes that saw the same
    outage do not probe in step.  A restarted server is found again within
    about one wait.

One :class:`NodeHealth` per server is shared by every thread of the process
(Django builds a backend per thread) and survives ``Cluster.close()``; a forked
child starts from its parent's view (:meth:`NodeHealth.after_fork`).  Time and
randomness come from an injected ``clock`` and ``rng`` so the rules are tested
deterministically.

Held
    A server this process owes repairs to (writes it missed, journaled in
    :mod:`.journal`) is *held*: ``open`` is None and :meth:`admit` refuses,
    so nothing reaches it but the journal's replay (:meth:`repairing`), which
    lifts the hold once the server deleted what it missed.  While held, a
    failing server is probed at least every :data:`HELD_WAIT` seconds, so the
    repair lands within about a second of the server answering again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from .. import chance

__all__ = [
    "HELD_WAIT",
    "JITTER",
    "Admission",
    "EventKind",
    "HealthSnapshot",
    "NodeEvent",
    "NodeHealth",
    "State",
]

EventKind = Literal["failure", "dead", "revived", "recovered"]
State = Literal["up", "failing", "dead"]

JITTER = 0.25  # a dead server's waits are shortened by up to this fraction
HELD_WAIT = 1.0  # the longest wait between probes of a server this process owes repairs to
_MAX_DOUBLINGS = 60  # any timeout times 2.0**60 is past any dead_timeout, and still a float


@dataclass(frozen=True, slots=True)
class Admission:
    """Leave to contact a server, from :meth:`NodeHealth.admit`; pass it back with the outcome.

    ``epoch`` is the server's epoch when the operation was admitted: a failure
    seen by an operation admitted before the latest recorded failure is part
    of that failure.  ``probe`` marks the one operation trying a failing
    server again.
    """

    epoch: int
    probe: bool = False


@dataclass(frozen=True)
class NodeEvent:
    """A change in a server's health, reported to ``on_node_event``.

    ``kind`` is ``"failure"`` for every failure counted (one per stall or
    outage, then one per failed probe; see the module docstring), ``"dead"``
    when the server reaches ``retry_attempts`` consecutive failures and
    ``"revived"`` when a dead server answers again.  ``"recovered"``, a failing
    or dead server answering again, goes to the health's ``back`` hook only.
    ``error`` is the exception behind a failure; ``failures`` the consecutive
    failures counted, this one included (1: the failure that took the server
    out); ``down`` the seconds since that first failure, for ``"revived"`` and
    ``"recovered"``.
    """

    node: str
    kind: EventKind
    error: BaseException | None = None
    failures: int = field(default=0, compare=False)
    down: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class HealthSnapshot:
    """A server's health at one instant (for status pages and management commands)."""

    node: str
    state: State
    failures: int  # consecutive failures counted: the first one, then failed probes
    retry_in: float  # seconds until the next probe may be made (0: now)
    last_error: str | None


class NodeHealth:
    """The failure count, epoch and retry timer of one server, shared by all threads.

    ``open`` is read without the lock on the hot path: while the server is up
    it is the admission every operation gets, and None otherwise.
    """

    __slots__ = (
        "_attempts",
        "_back",
        "_clock",
        "_dead_timeout",
        "_down_since",
        "_epoch",
        "_held",
        "_last_error",
        "_lock",
        "_probing",
        "_report",
        "_retry_at",
        "_retry_timeout",
        "_rng",
        "failures",
        "node",
        "open",
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
        rng: Callable[[], float] = chance.uniform,
        back: Callable[[NodeEvent], object] | None = None,
    ) -> None:
        self.node = node
        self.failures = 0
        self._epoch = 0
        self.open: Admission | None = Admission(0)
        self._retry_at = 0.0
        self._probing = False
        self._last_error: str | None = None
        self._held = False
        self._down_since = 0.0
        self._attempts = retry_attempts
        self._retry_timeout = retry_timeout
        self._dead_timeout = dead_timeout
        self._clock = clock
        self._rng = rng
        self._report = report
        self._back = back
        self._lock = threading.Lock()

    @property
    def dead(self) -> bool:
        return self.failures >= self._attempts

    def admit(self) -> Admission | None:
        """Return leave to contact the server now, or None.

        A healthy server always gives it.  A failing or dead one only once its
        wait is over, and then to one operation at a time: that caller's
        admission is a probe, which must end with :meth:`succeeded`,
        :meth:`failed` or :meth:`released`.
        """
        admission = self.open
        if admission is not None:
            return admission
        with self._lock:
            if self.open is not None:
                return self.open
            if self._held:
                return None  # only the journal's replay may use it (repairing)
            return self._probe()

    def repairing(self) -> Admission | None:
        """Leave to replay the journal on a held server: :meth:`admit`, ignoring the hold.

        An answering server admits every replayer at once (deletes are
        idempotent); a failing one only its probe, once its wait is over.
        """
        admission = self.open
        if admission is not None:
            return admission
        with self._lock:
            if self.open is not None:
                return self.open
            if not self.failures:
                return Admission(self._epoch)
            return self._probe()

    def _probe(self) -> Admission | None:
        if self._probing or self._clock() < self._retry_at:
            return None
        self._probing = True
        return Admission(self._epoch, probe=True)

    def hold(self, held: bool) -> None:
        """Hold the server (``held``: it owes repairs, see the module docstring), or release it."""
        with self._lock:
            self._held = held
            if held:
                self.open = None
                if self.failures:  # probe it soon, whatever its back-off says
                    self._retry_at = min(self._retry_at, self._clock() + HELD_WAIT)
            elif not self.failures:
                self.open = Admission(self._epoch)

    def current(self, admission: Admission) -> bool:
        """Whether ``admission`` was given since the latest recorded failure."""
        return admission.epoch == self._epoch

    @property
    def held(self) -> bool:
        return self._held

    def succeeded(self) -> None:
        """Record an answer from a failing or dead server: it is up again.

        The epoch stays: a request admitted before the failure that fails
        later still belongs to that failure.
        """
        with self._lock:
            failures = self.failures
            was_dead = self.dead
            self.failures = 0
            self._retry_at = 0.0
            self._probing = False
            self.open = None if self._held else Admission(self._epoch)
            down = self._clock() - self._down_since
        if was_dead:
            self._report(NodeEvent(self.node, "revived", failures=failures, down=max(down, 0.0)))
        if failures and self._back is not None:
            self._back(NodeEvent(self.node, "recovered", failures=failures, down=max(down, 0.0)))

    def failed(self, error: BaseException, admission: Admission) -> None:
        """Record a connection failure or timeout of an operation admitted with ``admission``.

        A failure from an earlier epoch is part of the failure that ended it
        and changes nothing (a running probe included).  Otherwise the count
        goes up and the wait before the next probe starts.
        """
        with self._lock:
            if admission.epoch != self._epoch:
                return
            was_dead = self.dead
            self.failures += 1
            self._epoch += 1
            self.open = None
            # Of a failing server, only the probe is admitted in the current epoch.
            self._probing = False
            now = self._clock()
            if self.failures == 1:
                self._down_since = now
            wait = self._wait()
            self._retry_at = now + (min(wait, HELD_WAIT) if self._held else wait)
            self._last_error = f"{type(error).__name__}: {error}"
            now_dead = self.dead
            failures = self.failures
        self._report(NodeEvent(self.node, "failure", error, failures))
        if now_dead and not was_dead:
            self._report(NodeEvent(self.node, "dead", error, failures))

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

    def _wait(self) -> float:
        """Seconds before the next probe, after ``failures`` consecutive failures."""
        failed_probes_while_dead = self.failures - self._attempts
        if failed_probes_while_dead < 0:
            return self._retry_timeout
        doublings = min(failed_probes_while_dead, _MAX_DOUBLINGS)
        step = min(self._retry_timeout * 2.0**doublings, self._dead_timeout)
        return step * (1.0 - JITTER * self._rng())
