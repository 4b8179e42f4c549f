"""OpenTelemetry spans (``OPTIONS["instrumentation"] = ["opentelemetry"]``).

One CLIENT span per memcached round trip, named for its operation (``get``,
``mg``, ``ms+gets`` for a pipelined batch), with the database semantic
conventions: ``db.system`` / ``db.system.name`` ``memcached``,
``db.operation.name``, ``server.address``, ``server.port`` (a unix socket:
``network.transport`` ``unix`` and its path as ``server.address``),
``db.operation.batch.size`` for a batch, and ``mcpatterns.outcome``.  A
round trip with no reply has status ERROR and ``error.type``.  Values are never
recorded; keys only with ``OPTIONS["trace_keys"] = True`` (``db.query.text``:
``get user:42``), because keys often hold user ids or emails.

One INTERNAL span per pattern call (``cache.sadd``, ``cache.get_or_compute``,
``cache.asadd``...), made current while the call runs, so the round trips it
causes are its children; pattern events (``recomputed``, ``lock_waited``...)
become span events of the current span.

Inside a trace that was sampled out, no span is made at all (the default
``ParentBased`` sampler would drop them; this skips the SDK's work), so
sampling 1% of requests costs little on the other 99%.

Spans come from the global tracer provider (``opentelemetry.trace``), or the
one given as ``OPTIONS["tracer_provider"]``: the application configures the
SDK, its sampler and its exporters, as with any instrumentation.
Round-trip spans are made when the reply is in, with the request's start
time, so the hot path does no context switching.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from ..client.servers import Server
from .records import BaseSink, PatternCall, RoundTrip

__all__ = ["TRACER_NAME", "TraceSink"]

TRACER_NAME = "django_mcpatterns"
_MOST_KEYS = 16  # of a multi-key command, in db.query.text
_SAMPLED = trace.TraceFlags.SAMPLED
_get = dict.get  # a Context is a dict: its get, without looking the method up
_FLAGS, _VALID = 3, 5  # a SpanContext's trace_flags and is_valid (see _context_is_a_tuple)


class TraceSink(BaseSink):
    """Makes the spans; see the module docstring for their names and attributes."""

    def __init__(
        self,
        servers: Sequence[Server],
        *,
        trace_keys: bool = False,
        provider: trace.TracerProvider | None = None,
    ) -> None:
        self.trace_keys = trace_keys
        self._tracer = trace.get_tracer(TRACER_NAME, tracer_provider=provider)
        # With the global provider, spans exist only once the application sets one
        # (OpenTelemetry sets it once per process): until then every span is a no-op.
        self._awaiting_provider = provider is None
        # The last context, its verdict and whether it holds a request's span (see _off).
        self._seen: tuple[object, bool, bool] = (None, False, False)
        self._current, self._span_key = _readers()
        # What sampling may look at, made once per server: db.system, server.*.
        self._servers: dict[str, dict[str, Any]] = {}
        for server in servers:
            where: dict[str, Any] = {
                "db.system": "memcached",
                "db.system.name": "memcached",
                "server.address": server.host,
            }
            if server.port is None:
                where["network.transport"] = "unix"
            else:
                where["server.port"] = server.port
            self._servers[server.node] = where

    def round_trip(self, trip: RoundTrip) -> None:
        if self._off():
            return
        end = time.time_ns()
        where = self._servers.get(trip.server)
        if where is None:
            where = self._servers[trip.server] = {
                "db.system": "memcached",
                "db.system.name": "memcached",
                "server.address": trip.server,
            }
        start = end - trip.nanoseconds
        if self._seen[2]:  # a request's trace, sampled in: all the attributes at once
            span = self._tracer.start_span(
                trip.operation,
                kind=SpanKind.CLIENT,
                attributes=where | self._attributes(trip),
                start_time=start,
            )
        else:  # a root span: the sampler sees where it goes; the rest if it is recorded
            span = self._tracer.start_span(
                trip.operation, kind=SpanKind.CLIENT, attributes=where, start_time=start
            )
            if span.is_recording():
                span.set_attributes(self._attributes(trip))
        if not span.is_recording():  # no SDK, or not sampled: nothing more to make
            return
        if trip.error is not None:
            span.set_attribute("error.type", type(trip.error).__qualname__)
            span.set_status(Status(StatusCode.ERROR, str(trip.error)))
        elif any(result == "unavailable" for _, result in trip.commands):
            span.set_attribute("error.type", "unavailable")
            span.set_status(Status(StatusCode.ERROR, f"{trip.server} is in its retry wait"))
        span.end(end_time=end)

    def _attributes(self, trip: RoundTrip) -> dict[str, Any]:
        """A recorded span's attributes, but for where it goes (``self._servers``)."""
        commands = trip.commands
        attributes: dict[str, Any] = {
            "db.operation.name": trip.operation,
            "mcpatterns.cache": trip.cache,
            "mcpatterns.outcome": (
                commands[0][1] if len(commands) == 1 else ",".join(r for _, r in commands)
            ),
        }
        if len(commands) > 1:
            attributes["db.operation.batch.size"] = len(commands)
        if self.trace_keys:
            attributes["db.query.text"] = _query_text(trip)
        return attributes

    def _off(self) -> bool:
        """Whether no span would be recorded: no SDK configured yet, or a trace sampled out.

        Keeps its verdict with the context, and whether the context holds a request's
        span (a valid parent: the round trip's span is its child).
        """
        if self._awaiting_provider:
            if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
                return True  # the API alone: every span a no-op, so none is made
            self._awaiting_provider = False
        # A request's gets run in one context (nothing is attached in a trace sampled
        # out): its verdict is kept with it, one identity check instead of the API's calls.
        current = self._current()
        seen = self._seen
        if seen[0] is current:
            return seen[1]
        # What trace.get_current_span(current) does, without its two calls.
        span: Any = (
            _get(current, self._span_key) if self._span_key else trace.get_current_span(current)
        )
        off = parented = False
        if span is not None:  # else no parent: a root span, not off
            try:
                parent = span.get_span_context()
                if type(parent) is _Fields:  # a SpanContext read by index, not its properties
                    fields: Any = parent
                    parented = fields[_VALID]
                    off = parented and not fields[_FLAGS] & _SAMPLED
                else:
                    parented = parent.is_valid
                    off = parented and not parent.trace_flags & _SAMPLED
            except AttributeError:  # not a span: the API reads none, as here
                off = parented = False
        # Sampled out: the SDK's default sampler (ParentBased) would drop its children.
        self._seen = (current, off, parented)  # one tuple: a context never gets another's
        return off

    quiet = _off  # what the observer asks before it makes a record for round_trip

    def event(self, cache: str, name: str) -> None:
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(name, {"mcpatterns.cache": cache})

    def begin(self, call: PatternCall) -> Any:
        if self._off():
            return None
        attributes: dict[str, Any] = {"mcpatterns.cache": call.cache, "code.function": call.name}
        if self.trace_keys and call.args and isinstance(call.args[0], str | bytes | int):
            attributes["mcpatterns.key"] = str(call.args[0])
        span = self._tracer.start_span(
            f"cache.{call.name}", kind=SpanKind.INTERNAL, attributes=attributes
        )
        return span, context.attach(trace.set_span_in_context(span))

    def end(self, call: PatternCall, state: Any, result: Any, error: BaseException | None) -> None:
        if state is None:
            return
        span, token = state
        context.detach(token)
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()


def _readers() -> tuple[Callable[[], context.Context], str | None]:
    """How to read the current context, and the key of its span, in the fewest calls.

    With the API's default runtime context (a ``ContextVar``), its ``get``
    and the span's key read them directly: the API's ``get_current`` and
    ``get_current_span`` go through four Python calls for the same objects, on
    the first round trip of every request.  Any other runtime context, or an
    API that no longer has these names, goes through the API.
    """
    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    current = getattr(runtime, "_current_context", None)
    key = getattr(trace.propagation, "_SPAN_KEY", None)
    if (
        type(runtime).__name__ == "ContextVarsRuntimeContext"
        and isinstance(current, ContextVar)
        and isinstance(key, str)
    ):
        return current.get, key
    return context.get_current, None


def _context_is_a_tuple() -> bool:
    """Whether a ``SpanContext`` is the tuple its properties read (``is_valid`` at
    :data:`_VALID`, ``trace_flags`` at :data:`_FLAGS`): the API has made it so since 1.0;
    an API that changes it is read through the properties."""
    try:
        probe = trace.SpanContext(1, 2, False, trace.TraceFlags(_SAMPLED))
        return bool(probe[_VALID] is True and probe[_FLAGS] == _SAMPLED)
    except Exception:
        return False


class _Unknown:
    """No span context is of this class: with a SpanContext of another layout, the
    properties are read."""


_Fields: type = trace.SpanContext if _context_is_a_tuple() else _Unknown


def _query_text(trip: RoundTrip) -> str:
    keys = trip.keys
    shown = b" ".join(keys[:_MOST_KEYS]).decode("utf-8", "replace")
    more = f" (+{len(keys) - _MOST_KEYS} keys)" if len(keys) > _MOST_KEYS else ""
    return f"{trip.operation} {shown}{more}".rstrip()
