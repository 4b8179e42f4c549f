"""OpenTelemetry's SDK for the tests: one tracer provider per process, spans in memory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter = InMemorySpanExporter()
_installed = False


@contextlib.contextmanager
def spans_exporter() -> Iterator[InMemorySpanExporter]:
    """The exporter holding only the spans finished inside the block.

    OpenTelemetry allows one global provider per process: the first call installs it.
    """
    global _installed
    if not _installed:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
        _installed = True
    _exporter.clear()
    try:
        yield _exporter
    finally:
        pass
