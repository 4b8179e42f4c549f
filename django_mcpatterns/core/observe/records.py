"""What instrumentation records: one :class:`RoundTrip` per memcached round trip, pattern calls.

Outcomes (label values, a closed set: never a key)
    ``hit``/``miss`` (reads, incr/decr), ``stored``/``not_stored``,
    ``exists``/``not_found`` (cas, cas-deletes), ``deleted``, ``touched``,
    ``ok`` (flush_all, stats, mn), ``error`` (memcached's error reply, or a
    failure before anything was sent), ``unknown`` (a write was sent and no
    reply came: it may have been applied) and ``unavailable`` (nothing sent:
    the server is in its retry or dead wait), ``cancelled`` (an asyncio caller
    gave up before the reply: a read, or a write not sent yet).

A :class:`Sink` receives them (:mod:`.observer` fans them out); this module
imports only the standard library and the wire's request types.
"""

from __future__ import annotations

import time
from asyncio import CancelledError
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from ..protocol.meta import MetaArithmetic, MetaDelete, MetaGet, MetaNoop, MetaSet
from ..protocol.wire import (
    DELETED,
    EXISTS,
    NOT_FOUND,
    NOT_STORED,
    STORED,
    TOUCHED,
    Delete,
    ErrorReply,
    FlushAll,
    Get,
    Incr,
    MetaReply,
    Request,
    Stats,
    Store,
    Touch,
    Version,
)

__all__ = [
    "COMMAND_NAMES",
    "FOLD_AT",
    "OUTCOMES",
    "BaseSink",
    "PatternCall",
    "RoundTrip",
    "Sink",
    "command_name",
    "failure_outcome",
    "outcome",
    "request_keys",
]

FOLD_AT = 256  # round trips a hot-path series keeps before a sink counts them (a read: sooner)

OUTCOMES = (
    "hit",
    "miss",
    "stored",
    "not_stored",
    "exists",
    "not_found",
    "deleted",
    "touched",
    "ok",
    "error",
    "unknown",
    "unavailable",
    "cancelled",
)


# -- commands and their outcomes ---------------------------------------------------

_WRITES = (Store, Delete, Touch, Incr, MetaSet, MetaDelete, MetaArithmetic, FlushAll)
_META_NAMES: dict[type, str] = {
    MetaGet: "mg",
    MetaSet: "ms",
    MetaDelete: "md",
    MetaArithmetic: "ma",
    MetaNoop: "mn",
}
_TEXT_NAMES: dict[type, str] = {
    Delete: "delete",
    Touch: "touch",
    FlushAll: "flush_all",
    Stats: "stats",
    Version: "version",
}
_STATUS_OUTCOMES = {
    STORED: "stored",
    NOT_STORED: "not_stored",
    EXISTS: "exists",
    NOT_FOUND: "not_found",
    DELETED: "deleted",
    TOUCHED: "touched",
}
_META_OUTCOMES = {
    b"EN": "miss",
    b"NS": "not_stored",
    b"EX": "exists",
    b"NF": "not_found",
    b"MN": "ok",
}
_META_HIT = {MetaGet: "hit", MetaSet: "stored", MetaDelete: "deleted", MetaArithmetic: "hit"}


# Commands whose name does not depend on their fields.
COMMAND_NAMES: dict[type, str] = {**_META_NAMES, **_TEXT_NAMES}


def command_name(request: Request[Any]) -> str:
    """The command's name on the wire (``get``, ``cas``, ``mg``...), without encoding it."""
    kind = type(request)
    if kind is Get:
        return "gets" if request.cas else "get"  # type: ignore[attr-defined]
    if kind is Store:
        return request.command  # type: ignore[attr-defined,no-any-return]
    if kind is Incr:
        return "decr" if request.decr else "incr"  # type: ignore[attr-defined]
    name = _META_NAMES.get(kind) or _TEXT_NAMES.get(kind)
    return name if name is not None else kind.__name__.lower()


def outcome(request: Request[Any], reply: object) -> str:
    """What ``reply`` says happened to ``request`` (one of :data:`OUTCOMES`).

    A multi-key get is a ``hit`` when any key was found.
    """
    kind = type(request)
    if kind is Get:
        return "hit" if type(reply) is list and reply else ("miss" if reply == [] else "error")
    if isinstance(reply, bytes):
        return _STATUS_OUTCOMES.get(reply, "ok")
    if isinstance(reply, MetaReply):
        found = _META_OUTCOMES.get(reply.status)
        return found if found is not None else _META_HIT.get(kind, "ok")
    if kind is Incr:
        return "hit" if isinstance(reply, int) else ("miss" if reply is None else "error")
    if isinstance(reply, ErrorReply) or reply is None:
        return "error"
    return "ok"  # stats, version


def failure_outcome(request: Request[Any], sent: bool, error: BaseException | None) -> str:
    if sent and isinstance(request, _WRITES):
        return "unknown"
    # The caller gave up (asyncio's timeout, a client gone): not the server's error.
    return "cancelled" if isinstance(error, CancelledError) else "error"


def request_keys(request: Request[Any]) -> tuple[bytes, ...]:
    if type(request) is Get:
        return tuple(request.keys)
    key = getattr(request, "key", None)
    return (key,) if isinstance(key, bytes) else ()


# -- what the sinks receive --------------------------------------------------------


class RoundTrip(NamedTuple):
    """One request (or pipelined batch) to one server and what came back.

    ``operation`` is the command's name, or the names of a batch joined with
    ``+`` (``ms+gets``: the text protocol's add-with-cas); ``commands`` holds
    each command's ``(name, outcome)``.  ``nanoseconds`` is the time from
    checkout to the last reply; ``error`` the exception when none came.
    A named tuple: one is made per request, and a tuple is the cheapest record.
    """

    cache: str
    server: str
    operation: str
    commands: tuple[tuple[str, str], ...]
    nanoseconds: int
    requests: tuple[Request[Any], ...]
    error: BaseException | None = None

    @property
    def seconds(self) -> float:
        return self.nanoseconds / 1e9

    @property
    def keys(self) -> tuple[bytes, ...]:
        """The keys sent (for opt-in traces and the debug toolbar; never a metric label)."""
        return tuple(key for request in self.requests for key in request_keys(request))


@dataclass
class PatternCall:
    """One call of a pattern method (``cache.sadd(...)``), for the sinks that track them.

    ``state`` holds each sink with what it returned from :meth:`Sink.begin`,
    handed back to its :meth:`Sink.end`.
    """

    cache: str
    name: str
    args: tuple[Any, ...]
    started: int = field(default_factory=time.perf_counter_ns)
    state: list[tuple[Sink, Any]] = field(default_factory=list)


class Sink(Protocol):
    """Where an :class:`Observer` sends what it sees; every method may be a no-op.

    Two optional methods make a get cheaper (the observer looks for them when the
    sink is added).  ``series(cache, server, command, outcome)`` returns a function
    of the nanoseconds that counts one command of that series: the observer asks
    once per series and then calls it for each single-command round trip that was
    answered, instead of :meth:`round_trip` (batches, failures and skips still come
    as records).  ``quiet()`` says whether the sink would ignore a round trip now
    (the trace sink in a request sampled out): when every sink that takes records
    is quiet, none is made.
    """

    def round_trip(self, trip: RoundTrip) -> None: ...

    def event(self, cache: str, name: str) -> None: ...

    def server_state(self, cache: str, server: str, up: bool) -> None: ...

    def begin(self, call: PatternCall) -> Any: ...

    def end(self, call: PatternCall, state: Any, result: Any, error: BaseException | None) -> None:
        """Close what :meth:`begin` opened; ``state`` is what it returned."""


class BaseSink:
    """A sink that ignores everything; subclasses override what they track."""

    def round_trip(self, trip: RoundTrip) -> None:
        pass

    def event(self, cache: str, name: str) -> None:
        pass

    def server_state(self, cache: str, server: str, up: bool) -> None:
        pass

    def begin(self, call: PatternCall) -> Any:
        return None

    def end(self, call: PatternCall, state: Any, result: Any, error: BaseException | None) -> None:
        pass

    def near(self, cache: str, stats: Any) -> None:
        """The near cache's counts so far in this process (a
        :class:`~django_mcpatterns.core.near.NearStats`), sent at most once a second.
        Optional: an observer sends them only to sinks that have this method."""
