"""The soft-expiry envelope's documented path: it lives in :mod:`django_mcpatterns.core.values`."""

from __future__ import annotations

from .values.envelope import (
    FLAG_ENVELOPE,
    STALE,
    VERSION,
    Envelope,
    EnvelopeSerde,
    Serde,
    with_envelopes,
)

__all__ = [
    "FLAG_ENVELOPE",
    "STALE",
    "VERSION",
    "Envelope",
    "EnvelopeSerde",
    "Serde",
    "with_envelopes",
]
