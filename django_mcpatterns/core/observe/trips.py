"""The two round-trip metrics, ``mcpatterns_commands_total`` and ``mcpatterns_command_seconds``.

In one process they are plain numbers under one lock, handed to
prometheus_client when it collects (:class:`Counted`): a get's round trip
costs a lock, two additions and a C bisect, where prometheus_client's own
``Counter.inc`` and ``Histogram.observe`` take a lock per value and a Python
loop over the buckets (about 3 µs together: most of what Prometheus added to
a get, docs/operations.md).  Under prometheus_client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``) every worker must write its own files, which
only prometheus_client's metrics do: :class:`Shared` uses them.

Both hand out *children*: ``(counters, timer)`` for one series of commands,
``counters`` a tuple of ``(cell, n)``, made once and kept by the sink; and,
for the hot path, a *counter*: a function of the nanoseconds that counts one
command of one series (made once per server, command and outcome and kept by
the observer).
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from .records import FOLD_AT

__all__ = ["COMMANDS", "SECONDS", "Counted", "Shared"]

COMMANDS = (
    "mcpatterns_commands",
    "memcached commands sent, by server, command and outcome",
    ("cache", "server", "command", "outcome"),
)
SECONDS = (
    "mcpatterns_command_seconds",
    "Time from sending a request to its last reply, by server and command",
    ("cache", "server", "command"),
)

Children = tuple[tuple[tuple[Any, int], ...], Any]


class Counted:
    """The two metrics as plain counts of this process, collected on a scrape.

    A timer cell holds a count per bucket, then the ``+Inf`` bucket's, then
    the sum of the seconds observed.
    """

    def __init__(self, registry: CollectorRegistry, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self._bounds = [round(bound * 1e9) for bound in buckets]  # nanoseconds: int compares
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, ...], list[int]] = {}
        self._timers: dict[tuple[str, ...], list[float]] = {}
        # The hot path's series: the nanoseconds not yet counted, their counter and timer.
        self._pending: list[tuple[list[int], list[int], list[float]]] = []
        registry.register(self)

    def children(
        self, cache: str, server: str, operation: str, commands: Iterable[tuple[str, str, int]]
    ) -> Children:
        """The cells of one round trip's series: ``commands`` are (command, outcome, times)."""
        with self._lock:
            counters = tuple(
                (self._counters.setdefault((cache, server, c, o), [0]), n) for c, o, n in commands
            )
            timer = self._timers.setdefault(
                (cache, server, operation), [0] * (len(self._bounds) + 1) + [0.0]
            )
        return counters, timer

    def counter(self, cache: str, server: str, command: str, result: str) -> Callable[[int], None]:
        """What counts one command of this series and times its round trip: the hot path.

        It appends the nanoseconds to the series' list (atomic, no lock: a lock's
        ``with`` alone costs more than the rest); the lists are folded into the
        counts under the lock on a scrape, or once one holds :data:`FOLD_AT`.
        """
        ((cell, _),), timer = self.children(cache, server, command, ((command, result, 1),))
        pending: list[int] = []
        with self._lock:
            self._pending.append((pending, cell, timer))
        fold = self._fold

        def count(nanoseconds: int) -> None:
            pending.append(nanoseconds)
            if len(pending) >= FOLD_AT:
                fold()

        return count

    def _fold(self) -> None:
        """Count what the series' lists hold: sorted, a bucket's count is one bisect."""
        with self._lock:
            for pending, cell, timer in self._pending:
                n = len(pending)  # appended later: left for the next fold
                if not n:
                    continue
                times = sorted(pending[:n])
                del pending[:n]
                cell[0] += n
                below = bisect_right(times, 0)  # no time to tell (nothing was sent)
                for i, bound in enumerate(self._bounds):
                    upto = bisect_right(times, bound, below)
                    timer[i] += upto - below
                    below = upto
                timer[-2] += n - below  # +Inf
                timer[-1] += sum(times) / 1e9

    def record(self, children: Children, nanoseconds: int) -> None:
        counters, timer = children
        with self._lock:
            for cell, n in counters:
                cell[0] += n
            if nanoseconds:  # nothing was sent to a server in its wait: no time to tell
                timer[bisect_left(self._bounds, nanoseconds)] += 1
                timer[-1] += nanoseconds / 1e9

    def describe(self) -> list[Metric]:
        return [
            CounterMetricFamily(*COMMANDS[:2], labels=COMMANDS[2]),
            HistogramMetricFamily(*SECONDS[:2], labels=SECONDS[2]),
        ]

    def collect(self) -> Iterator[Metric]:
        self._fold()
        with self._lock:
            counters = [(labels, cell[0]) for labels, cell in self._counters.items()]
            timers = [(labels, list(cell)) for labels, cell in self._timers.items()]
        commands = CounterMetricFamily(*COMMANDS[:2], labels=COMMANDS[2])
        for labels, value in counters:
            commands.add_metric(labels, value)
        seconds = HistogramMetricFamily(*SECONDS[:2], labels=SECONDS[2])
        bounds = [*(floatToGoString(b) for b in self.buckets), "+Inf"]  # type: ignore[no-untyped-call]
        for labels, cell in timers:
            cumulative, running = [], 0
            for bound, count in zip(bounds, cell[:-1], strict=True):
                running += int(count)
                cumulative.append((bound, float(running)))
            seconds.add_metric(labels, cumulative, sum_value=cell[-1])
        yield commands
        yield seconds


class Shared:
    """The two metrics as prometheus_client's own (its multiprocess mode writes them)."""

    def __init__(self, registry: CollectorRegistry, buckets: Sequence[float]) -> None:
        self.commands = Counter(*COMMANDS, registry=registry)
        self.seconds = Histogram(*SECONDS, buckets=buckets, registry=registry)

    def children(
        self, cache: str, server: str, operation: str, commands: Iterable[tuple[str, str, int]]
    ) -> Children:
        counters = tuple((self.commands.labels(cache, server, c, o), n) for c, o, n in commands)
        return counters, self.seconds.labels(cache, server, operation)

    def counter(self, cache: str, server: str, command: str, result: str) -> Callable[[int], None]:
        """What counts one command of this series and times its round trip."""
        children = self.children(cache, server, command, ((command, result, 1),))
        return lambda nanoseconds: self.record(children, nanoseconds)

    def record(self, children: Children, nanoseconds: int) -> None:
        counters, timer = children
        for counter, n in counters:
            counter.inc(n)
        if nanoseconds:
            timer.observe(nanoseconds / 1e9)

    def collect(self) -> Iterator[Metric]:
        yield from self.commands.collect()
        yield from self.seconds.collect()
