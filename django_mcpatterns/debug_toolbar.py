"""A django-debug-toolbar panel: every pattern call of the request and its memcached commands.

::

    DEBUG_TOOLBAR_PANELS = [
        ...,
        "django_mcpatterns.debug_toolbar.PatternsPanel",
    ]

The toolbar's own cache panel wraps Django's plain methods only (``get``,
``set``...): of the commands a view using the patterns sends, it sees a few.
This panel lists each pattern call (``sadd``, ``get_or_compute``,
``aget_or_compute``...: name, key, a summary of the result, time) with the
round trips behind it (server, command, outcome, time), then the round trips
of plain calls; the toolbar's nav shows the totals.  With a near cache
(``OPTIONS["near_cache"]``) it also shows the reads served from process memory
while the request ran (those of other threads of the process included), and
what the near cache holds.

It works with instrumentation off: while the toolbar is on, it adds one
recording sink to the clusters of the caches served by our backends
(:meth:`~django_mcpatterns.core.cluster.Cluster.observe`), which records only
for requests the panel is enabled for (a context variable says which: threads
and asyncio tasks of other requests are not recorded).  The embedded store has
no wire, so its caches show nothing here.
"""

from __future__ import annotations

import contextvars
import time
from typing import Any

from debug_toolbar.panels import Panel
from django.core.cache import caches

from .core.observe import BaseSink, PatternCall, RoundTrip
from .inspection import pattern_aliases

__all__ = ["PatternsPanel", "summary"]

_MOST = 80  # characters of a key or result shown


class _Recording:
    """One request's pattern calls and round trips (JSON-ready: the toolbar stores them)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.plain: list[dict[str, Any]] = []  # round trips outside any pattern call
        self.orm: dict[str, dict[str, int]] = {}  # ORM cache events by model


_recording: contextvars.ContextVar[_Recording | None] = contextvars.ContextVar(
    "mcpatterns_debug_toolbar_recording", default=None
)
_call: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "mcpatterns_debug_toolbar_call", default=None
)


class _RecordingSink(BaseSink):
    """Hands round trips and outermost pattern calls to the current request's recording."""

    def round_trip(self, trip: RoundTrip) -> None:
        recording = _recording.get()
        if recording is None:
            return
        row = {
            "server": trip.server,
            "command": trip.operation,
            "commands": len(trip.commands),
            "outcome": ", ".join(result for _, result in trip.commands),
            "keys": summary(b" ".join(trip.keys).decode("utf-8", "replace"), quote=False),
            "time": trip.nanoseconds / 1e6,
        }
        call = _call.get()
        (call["round_trips"] if call is not None else recording.plain).append(row)

    def begin(self, call: PatternCall) -> Any:
        recording = _recording.get()
        if recording is None or _call.get() is not None:
            return None  # not recorded, or inside another pattern call (its trips are that one's)
        row: dict[str, Any] = {
            "name": call.name,
            "cache": call.cache,
            "key": summary(call.args[0]) if call.args else "",
            "round_trips": [],
        }
        recording.calls.append(row)
        return row, _call.set(row)

    def end(self, call: PatternCall, state: Any, result: Any, error: BaseException | None) -> None:
        if state is None:
            return
        row, token = state
        _call.reset(token)
        row["time"] = (time.perf_counter_ns() - call.started) / 1e6
        row["result"] = f"raised {type(error).__name__}" if error is not None else summary(result)


_SINK = _RecordingSink()


def summary(value: Any, quote: bool = True) -> str:
    """A short text for a key or a result: collections by size, long text cut."""
    if isinstance(value, set | frozenset | list | tuple | dict):
        return f"{type(value).__name__} of {len(value)}"
    text = repr(value) if quote else str(value)
    return text if len(text) <= _MOST else text[: _MOST - 1] + "…"


def _near_counts() -> dict[str, Any]:
    """Each near cache's counts now (``OPTIONS["near_cache"]``), by alias."""
    found = {}
    for alias in pattern_aliases():
        near = getattr(caches[alias], "binding", None)
        table = getattr(near, "near", None)
        if table is not None:
            found[alias] = table.stats()
    return found


def _near_rows(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """What each near cache did during the request (the process's threads and tasks
    included: a lookup is not worth recording one by one), and what it holds."""
    rows = []
    for alias, now in after.items():
        then = before.get(alias)
        hits = now.hits - (then.hits if then else 0)
        misses = now.misses - (then.misses if then else 0)
        saved = now.round_trips_saved - (then.round_trips_saved if then else 0)
        rows.append(
            {
                "cache": alias,
                "hits": hits,
                "misses": misses,
                "saved": saved,
                "hit_ratio": round(100 * hits / (hits + misses)) if hits + misses else None,
                "entries": now.entries,
                "bytes": now.bytes,
                "max_bytes": now.max_bytes,
                "evictions": now.evictions,
            }
        )
    return rows


def _orm_event(event: str, model: str, count: int, **_: Any) -> None:
    """An ORM cache event (django_mcpatterns.orm): counted in the current request's recording."""
    recording = _recording.get()
    if recording is not None:
        events = recording.orm.setdefault(model, {})
        events[event] = events.get(event, 0) + count


def _listen_to_orm() -> None:
    from django_mcpatterns.orm.observe import orm_event  # no models: importable without the app

    orm_event.connect(_orm_event, dispatch_uid="mcpatterns_debug_toolbar_orm")


class PatternsPanel(Panel):
    """The pattern calls of the request and the memcached round trips behind each."""

    title = "Cache patterns"
    template = "django_mcpatterns/debug_toolbar/patterns.html"
    is_async = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._recording = _Recording()
        self._token: contextvars.Token[_Recording | None] | None = None
        self._near: dict[str, Any] = {}  # each near cache's counts when the request began

    def enable_instrumentation(self) -> None:
        self._near = _near_counts()
        for alias in pattern_aliases():
            cache = caches[alias]
            for name in ("store", "astore"):
                try:
                    store = getattr(cache, name)
                except NotImplementedError:  # no asyncio store (yet) for this backend
                    continue
                observe = getattr(store, "observe", None)
                if observe is not None:
                    observe(_SINK)
        _listen_to_orm()
        if self._token is None:
            self._token = _recording.set(self._recording)

    def disable_instrumentation(self) -> None:
        if self._token is not None:
            try:
                _recording.reset(self._token)
            except ValueError:  # another context (an ASGI handler's): just stop recording
                _recording.set(None)
            self._token = None

    def generate_stats(self, request: Any, response: Any) -> None:
        orm = [{"model": model, **events} for model, events in sorted(self._recording.orm.items())]
        calls = self._recording.calls
        plain = self._recording.plain
        trips = [trip for call in calls for trip in call["round_trips"]] + plain
        self.record_stats(  # type: ignore[no-untyped-call]
            {
                "calls": calls,
                "plain": plain,
                "orm": orm,
                "total_calls": len(calls),
                "total_round_trips": len(trips),
                "total_commands": sum(trip["commands"] for trip in trips),
                "total_time": sum(call.get("time", 0.0) for call in calls)
                + sum(trip["time"] for trip in plain),
                "near": _near_rows(self._near, _near_counts()),
            }
        )

    @property
    def nav_subtitle(self) -> str:
        stats = self.get_stats()  # type: ignore[no-untyped-call]
        calls = stats.get("total_calls", 0)
        trips = stats.get("total_round_trips", 0)
        return (
            f"{calls} call{'s' if calls != 1 else ''}, {trips} round "
            f"trip{'s' if trips != 1 else ''} in {stats.get('total_time', 0.0):.2f} ms"
        )
