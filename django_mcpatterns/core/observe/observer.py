"""What instrumentation sees: one record per memcached round trip, pattern calls, events.

``OPTIONS["instrumentation"]`` (``"prometheus"``, ``"opentelemetry"``) gives a
cluster an :class:`Observer`; without it the cluster's ``observer`` is None and
every request pays for one attribute check, nothing more.  The observer hands
each request to its sinks (:mod:`.metrics`, :mod:`.traces`, the process tally
of the status page, the debug toolbar's recorder) as a :class:`RoundTrip`:
the server, the commands with their outcomes, the time it took.

The records and their outcomes are in :mod:`.records`.

Pattern calls (``cache.sadd``...) reach the sinks through :meth:`Observer.begin`
and :meth:`Observer.end`, which the pattern mixins' wrapper calls
(:mod:`django_mcpatterns.patterns.observed`); events (``recomputed``,
``node_dead``...) through :meth:`Observer.event`.

Imports only the standard library; the sinks that need a package import it
when they are built, and :func:`check_installed` names the extra to install.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from time import perf_counter_ns
from typing import Any

from ..exceptions import ConfigurationError
from ..protocol.wire import Get, Request
from .records import (
    COMMAND_NAMES,
    FOLD_AT,
    BaseSink,
    PatternCall,
    RoundTrip,
    Sink,
    command_name,
    failure_outcome,
    outcome,
)

__all__ = [
    "INSTRUMENTATIONS",
    "Observer",
    "Tally",
    "build_observer",
    "check_installed",
    "tally",
]

logger = logging.getLogger("django_mcpatterns.observe")

# name -> (module that must import, the extra that installs it)
INSTRUMENTATIONS: dict[str, tuple[str, str]] = {
    "prometheus": ("prometheus_client", "prometheus"),
    "opentelemetry": ("opentelemetry.trace", "opentelemetry"),
}


def check_installed(names: Sequence[str]) -> tuple[str, ...]:
    """Return ``names`` as a tuple once each is known and its package importable.

    A misspelt name or a missing package is a :class:`ConfigurationError`
    naming the extra to install (``option="instrumentation"``).
    """
    if isinstance(names, str) or not isinstance(names, Sequence | set | frozenset):
        raise ConfigurationError(
            f"option 'instrumentation' must be a list of names, not {names!r}; valid names: "
            + ", ".join(repr(n) for n in INSTRUMENTATIONS),
            option="instrumentation",
            choices=tuple(INSTRUMENTATIONS),
        )
    chosen: list[str] = []
    for name in names:
        if name not in INSTRUMENTATIONS:
            raise ConfigurationError(
                f"unknown instrumentation {name!r} in option 'instrumentation'; valid names: "
                + ", ".join(repr(n) for n in INSTRUMENTATIONS),
                option="instrumentation",
                choices=tuple(INSTRUMENTATIONS),
            )
        module, extra = INSTRUMENTATIONS[name]
        if not _importable(module):
            raise ConfigurationError(
                f"instrumentation {name!r} needs the {module.split('.')[0]} package: "
                f"pip install 'django-mcpatterns[{extra}]'",
                option="instrumentation",
            )
        if name not in chosen:
            chosen.append(name)
    return tuple(chosen)


def _importable(module: str) -> bool:
    # Imported, not only found: a broken install is missing too.  The sink imports it anyway.
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


class Observer:
    """A cluster's instrumentation: fans each request, call and event out to the sinks.

    A sink that raises is logged and never breaks the cache operation.
    Adding a sink swaps in a new tuple, so sending needs no lock.
    """

    def __init__(self, cache: str, servers: Sequence[str], sinks: Sequence[Sink] = ()) -> None:
        self.cache = cache
        self.servers = tuple(servers)
        self.sinks: tuple[Sink, ...] = ()
        self._lock = threading.Lock()
        # The hot path's plan, swapped whole when a sink is added (see _plan):
        self._counting: tuple[Any, ...] = ()  # the sinks with series(): counted per series
        self._whole: tuple[tuple[Sink, Any], ...] = ()  # the others with their quiet(), or None
        self._series: dict[tuple[str, str, str], tuple[Callable[[int], object], ...]] = {}
        _observers.add(self)
        for sink in sinks:
            self.add(sink)

    def add(self, sink: Sink) -> None:
        """Also send to ``sink`` (once, however often it is added); it learns every server is up."""
        with self._lock:
            if sink in self.sinks:
                return
            self.sinks = (*self.sinks, sink)
            self._plan()
        for server in self.servers:
            _safely(sink.server_state, self.cache, server, True)

    def _plan(self) -> None:
        """Sort the sinks for the hot path: those that count a series of round trips
        (:meth:`Sink.series`) and those that take each record (with their ``quiet()``)."""
        self._counting = tuple(s for s in self.sinks if callable(getattr(s, "series", None)))
        self._whole = tuple(
            (s, getattr(s, "quiet", None)) for s in self.sinks if s not in self._counting
        )
        self._series = {}  # a new dict: a request reading the old one is unharmed

    def _forget_series(self) -> None:
        """In a forked child: ask the sinks again (a sink may have to set itself up there)."""
        self._series = {}

    def request(
        self,
        server: str,
        request: Request[Any] | tuple[Request[Any], ...],
        replies: object,
        started: int,
    ) -> None:
        """A request answered: ``replies`` is its reply (a batch: the list of replies).

        The hot path (one command): the sinks that count series get the time
        through the series' hooks, made once per server, command and outcome;
        the record is made only when a sink that takes records is not quiet.
        """
        elapsed = perf_counter_ns() - started
        if type(request) is tuple:
            batch: tuple[Request[Any], ...] = request
            commands = tuple(
                (command_name(r), outcome(r, reply))
                for r, reply in zip(batch, replies, strict=False)  # type: ignore[call-overload]
            )
            operation = _operation(commands)
            self._send(RoundTrip(self.cache, server, operation, commands, elapsed, batch))
            return
        if type(request) is Get:  # the hottest: named and judged here, not in two calls
            name = "gets" if request.cas else "get"
            kind = type(replies)
            result = "hit" if kind is list and replies else "miss" if replies == [] else "error"
        else:
            name = COMMAND_NAMES.get(type(request)) or command_name(request)  # type: ignore[arg-type]
            result = outcome(request, replies)  # type: ignore[arg-type]
        if self._counting:
            hooks = self._series.get((server, name, result))
            if hooks is None:
                hooks = self._hooks(server, name, result)
            for hook in hooks:
                try:
                    hook(elapsed)
                except Exception:
                    logger.exception("instrumentation sink %r failed", hook)
        trip = None
        for sink, quiet in self._whole:
            try:
                if quiet is not None and quiet():
                    continue
                if trip is None:
                    commands = ((name, result),)
                    record = (self.cache, server, name, commands, elapsed, (request,), None)
                    trip = _new_trip(RoundTrip, record)
                sink.round_trip(trip)
            except Exception:
                logger.exception("instrumentation sink %r failed", sink)

    def _hooks(self, server: str, name: str, result: str) -> tuple[Callable[[int], object], ...]:
        table = self._series  # before the sinks: _plan swaps the sinks, then the table
        hooks = tuple(
            hook
            for sink in self._counting
            if (hook := _safely(sink.series, self.cache, server, name, result)) is not None
        )
        table[(server, name, result)] = hooks
        return hooks

    def failed(
        self,
        server: str,
        request: Request[Any] | Sequence[Request[Any]],
        error: BaseException,
        sent: bool,
        started: int,
    ) -> None:
        """No reply came: ``unknown`` for a write that was ``sent``, else ``error``
        (``cancelled`` when ``error`` is asyncio's cancellation of the caller)."""
        elapsed = perf_counter_ns() - started
        batch = tuple(request) if isinstance(request, tuple | list) else (request,)
        commands = tuple((command_name(r), failure_outcome(r, sent, error)) for r in batch)
        trip = RoundTrip(self.cache, server, _operation(commands), commands, elapsed, batch, error)
        self._send(trip)

    def skipped(self, server: str, request: Request[Any] | Sequence[Request[Any]]) -> None:
        """Nothing was sent: the server is in its retry or dead wait."""
        batch = tuple(request) if isinstance(request, tuple | list) else (request,)
        commands = tuple((command_name(r), "unavailable") for r in batch)
        self._send(RoundTrip(self.cache, server, _operation(commands), commands, 0, batch))

    def _send(self, trip: RoundTrip) -> None:
        for sink in self.sinks:
            _safely(sink.round_trip, trip)

    def event(self, name: str) -> None:
        """A pattern or node event (``recomputed``, ``node_dead``...: a signal's name)."""
        for sink in self.sinks:
            _safely(sink.event, self.cache, name)

    def server_state(self, server: str, up: bool) -> None:
        for sink in self.sinks:
            _safely(sink.server_state, self.cache, server, up)

    def near(self, stats: Any) -> None:
        """The near cache's counts so far (:mod:`django_mcpatterns.core.near`), to the sinks
        that take them."""
        for sink in self.sinks:
            near = getattr(sink, "near", None)
            if near is not None:
                _safely(near, self.cache, stats)

    def counts(self) -> tuple[dict[str, dict[str, Any]], dict[str, int]] | None:
        """This process's per-server counts and per-event counts (the status page), or None.

        From the Prometheus sink when there is one, else from :data:`tally`.
        """
        for sink in self.sinks:
            servers = getattr(sink, "servers", None)
            events = getattr(sink, "events", None)
            if callable(servers) and callable(events):
                return servers(self.cache), events(self.cache)
        return None

    def begin(self, name: str, args: tuple[Any, ...]) -> PatternCall:
        """A pattern call starts; pass the result to :meth:`end` when it returns or raises."""
        call = PatternCall(self.cache, name, args)
        # The sinks of this call, kept with their state: one added meanwhile is not ended.
        call.state = [(sink, _safely(sink.begin, call)) for sink in self.sinks]
        return call

    def end(self, call: PatternCall, result: Any, error: BaseException | None) -> None:
        # In reverse order, so context a sink attached is detached in turn.
        for sink, state in reversed(call.state):
            _safely(sink.end, call, state, result, error)


# Every observer of the process, to forget its series' hooks in a forked child.
_observers: weakref.WeakSet[Observer] = weakref.WeakSet()


def _after_fork() -> None:
    for observer in list(_observers):
        observer._forget_series()


os.register_at_fork(after_in_child=_after_fork)

_new_trip = tuple.__new__  # a RoundTrip from a tuple, in C (NamedTuple's __new__ is Python)


def _operation(commands: tuple[tuple[str, str], ...]) -> str:
    if len(commands) == 1:
        return commands[0][0]
    names: list[str] = []
    for name, _ in commands:
        if name not in names:
            names.append(name)
    return "+".join(names)


def _safely(method: Any, *args: Any) -> Any:
    try:
        return method(*args)
    except Exception:
        logger.exception("instrumentation sink %r failed", method)
        return None


# -- the process's own counts (the status page) ------------------------------------


class _Row:
    """One server's counts: round-trip time in total, commands by outcome."""

    __slots__ = ("nanoseconds", "outcomes")

    def __init__(self) -> None:
        self.nanoseconds = 0
        self.outcomes: dict[str, int] = {}


class Tally(BaseSink):
    """Per-server command counts by outcome and total time, and events, for this process.

    What the status page shows; every observer of the process feeds the one
    :data:`tally` (the status page reads it; tests reset it).  One lock, held
    for a few dict operations per request.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], _Row] = {}
        self._events: dict[tuple[str, str], int] = {}
        self._pending: list[tuple[list[int], _Row, str]] = []  # the hot path's series

    def round_trip(self, trip: RoundTrip) -> None:
        where = (trip[0], trip[1])  # cache, server
        with self._lock:
            row = self._rows.get(where)
            if row is None:
                row = self._rows[where] = _Row()
            row.nanoseconds += trip[4]
            outcomes = row.outcomes
            for _, result in trip[3]:
                outcomes[result] = outcomes.get(result, 0) + 1

    def series(self, cache: str, server: str, command: str, result: str) -> Callable[[int], None]:
        """What counts one command of ``server`` with this ``result`` (the hot path): it
        appends the nanoseconds to a list, folded into the row under the lock when read
        or once it holds ``FOLD_AT`` (as :class:`~.trips.Counted` does)."""
        pending: list[int] = []
        with self._lock:
            row = self._rows.get((cache, server))
            if row is None:
                row = self._rows[(cache, server)] = _Row()
            self._pending.append((pending, row, result))
        fold = self._fold

        def count(nanoseconds: int) -> None:
            pending.append(nanoseconds)
            if len(pending) >= FOLD_AT:
                fold()

        return count

    def _fold(self) -> None:
        with self._lock:
            self._fold_held()

    def _fold_held(self) -> None:
        for pending, row, result in self._pending:
            n = len(pending)  # appended later: left for the next fold
            if n:
                row.nanoseconds += sum(pending[:n])
                del pending[:n]
                row.outcomes[result] = row.outcomes.get(result, 0) + n

    def event(self, cache: str, name: str) -> None:
        with self._lock:
            self._events[(cache, name)] = self._events.get((cache, name), 0) + 1

    def servers(self, cache: str) -> dict[str, dict[str, Any]]:
        """``{server: {"commands": n, "seconds": s, "outcomes": {outcome: n}}}`` of one cache."""
        with self._lock:
            self._fold_held()
            return {
                server: {
                    "commands": sum(row.outcomes.values()),
                    "seconds": row.nanoseconds / 1e9,
                    "outcomes": dict(sorted(row.outcomes.items())),
                }
                for (name, server), row in sorted(self._rows.items())
                if name == cache and row.outcomes
            }

    def events(self, cache: str) -> dict[str, int]:
        with self._lock:
            return {name: n for (c, name), n in sorted(self._events.items()) if c == cache}

    def reset(self) -> None:
        with self._lock:
            self._fold_held()
            for row in self._rows.values():  # emptied in place: the series' hooks hold them
                row.nanoseconds = 0
                row.outcomes.clear()
            self._events.clear()


tally = Tally()


def build_observer(
    cache: str,
    servers: Sequence[Any],
    instrumentation: Sequence[str],
    *,
    registry: Any = None,
    tracer_provider: Any = None,
    trace_keys: bool = False,
) -> Observer | None:
    """The observer ``instrumentation`` asks for, or None (instrumentation off: free).

    ``servers`` are :class:`~django_mcpatterns.core.servers.Server` objects (their ``node`` names
    the server in metrics and spans).
    """
    if not instrumentation:
        return None
    sinks: list[Sink] = []
    if "prometheus" in instrumentation:
        from .metrics import PrometheusSink

        sinks.append(PrometheusSink(registry))  # it counts for the status page too
    else:
        sinks.append(tally)
    if "opentelemetry" in instrumentation:
        from .traces import TraceSink

        sinks.append(TraceSink(servers, trace_keys=trace_keys, provider=tracer_provider))
    return Observer(cache, [s.node for s in servers], sinks)
