"""The lease placeholder: what a filler ``add``\\ s on a miss
(:mod:`django_mcpatterns.core.leases`)."""

from __future__ import annotations

import math
from typing import Final

from ..values.envelope import Envelope

__all__ = ["PLACEHOLDER", "PLACEHOLDER_TTL"]

PLACEHOLDER: Final = Envelope(None, -math.inf, -math.inf)
"""A pending envelope, which plain reads see as a miss."""

PLACEHOLDER_TTL: Final = 301
"""Default exptime of a placeholder: a crashed filler's only blocks ``add`` that long."""
