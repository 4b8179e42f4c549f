"""Rate limits on cache objects: ``ratelimit`` and ``aratelimit``.

The algorithm is :mod:`django_mcpatterns.core.ratelimit` (a slotted sliding
window); this method names its items with the backend's key rules.
``_sync_limits.py`` is generated from this module.
"""

from __future__ import annotations

from typing import Any

from django_mcpatterns.core.ratelimit import (
    DEFAULT_SLOTS,
    AsyncRateLimiter,
    Decision,
    FailMode,
    Rate,
)

from .host import PatternHost


class AsyncLimitMethods(PatternHost):
    """``ratelimit``: a sliding-window limit per name."""

    async def aratelimit(
        self,
        name: Any,
        rate: str | Rate,
        *,
        cost: int = 1,
        fail: FailMode = "open",
        slots: int = DEFAULT_SLOTS,
        version: int | None = None,
    ) -> Decision:
        """Count an attempt of ``cost`` against ``rate`` (``"5/s"``, ``"100/m"``, ``"10/30s"``).

        Return a :class:`~django_mcpatterns.core.ratelimit.Decision` with
        ``allowed``, ``remaining`` and ``retry_after`` (seconds).  Never more
        than the limit in any interval of the period; 1 round trip when
        admitted.  An unreachable server admits (``fail="open"``) or refuses
        (``"closed"``); it never raises.
        """
        limiter = AsyncRateLimiter(self.apattern_store, rate, slots=slots, fail=fail)
        return await limiter.hit(self._pattern_key(name, version), cost)
