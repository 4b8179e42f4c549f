"""What instrumentation sees: one record per memcached round trip, pattern calls, events.

:mod:`.records` holds what the sinks receive (:class:`RoundTrip`, :class:`PatternCall`,
the outcomes); :mod:`.observer` the :class:`Observer` a cluster reports to, the
process :data:`tally` and :func:`build_observer`; :mod:`.metrics` (Prometheus) and
:mod:`.traces` (OpenTelemetry) are sinks, imported when built.
"""

from __future__ import annotations

from .observer import INSTRUMENTATIONS, Observer, Tally, build_observer, check_installed, tally
from .records import (
    OUTCOMES,
    BaseSink,
    PatternCall,
    RoundTrip,
    Sink,
    command_name,
    outcome,
)

__all__ = [
    "INSTRUMENTATIONS",
    "OUTCOMES",
    "BaseSink",
    "Observer",
    "PatternCall",
    "RoundTrip",
    "Sink",
    "Tally",
    "build_observer",
    "check_installed",
    "command_name",
    "outcome",
    "tally",
]
