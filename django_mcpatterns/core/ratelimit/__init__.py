"""Rate limiters, sync and async: :class:`RateLimiter` and :class:`AsyncRateLimiter`.

The algorithm (a slotted sliding window) and its argument are in :mod:`.ratelimit`
(pure parts) and ``core/_async/ratelimit.py`` (written once; the sync form is
generated).  Imported from here so neither form's path is part of the API.
"""

from __future__ import annotations

from ._async.ratelimit import AsyncRateLimiter
from ._sync.ratelimit import RateLimiter
from .ratelimit import Decision, Rate, parse_rate

__all__ = ["AsyncRateLimiter", "Decision", "Rate", "RateLimiter", "parse_rate"]
