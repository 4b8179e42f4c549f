# Generated from core/ratelimit/_async.py by scripts/generate_sync.py: do not edit.
"""The rate limiter: a slotted sliding window over any store (see
:mod:`django_mcpatterns.core.ratelimit`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django_mcpatterns.core.exceptions import ConfigurationError, McPatternsError
from django_mcpatterns.core.keys import Routed, placed, shorten
from django_mcpatterns.core.store import Store

from ._model import DEFAULT_SLOTS, Decision, FailMode, Rate, Window, parse_rate
from ._model_fallback import fallback_for
from ._sync_tally import restore, tally, untally

__all__ = ["RateLimiter"]

logger = logging.getLogger("django_mcpatterns.ratelimit")


class RateLimiter:
    """Decide attempts against ``rate`` for keys of one store.

    ``fail="open"`` (the default) decides alone when the store cannot be
    asked: at most ``limit`` per process and window, seeded with the counts the
    store last answered (``_model_fallback.py``); ``"closed"`` refuses.
    Either way nothing is raised (the decision says ``degraded``).  ``clock``
    returns seconds (``time.time``): every client of a limiter must share it,
    so wall clocks in step across hosts.
    """

    def __init__(
        self,
        store: Store,
        rate: str | Rate,
        *,
        slots: int = DEFAULT_SLOTS,
        fail: FailMode = "open",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if fail not in ("open", "closed"):
            raise ConfigurationError(
                f"fail must be 'open' or 'closed', not {fail!r}",
                option="fail",
                choices=("open", "closed"),
            )
        self.store = store
        self.window = Window(parse_rate(rate), slots)
        self.fail = fail
        self.clock = clock
        self._suffix = f"|{self.window.rate}|{slots}"  # the fallback's name for a key
        self._fallback = fallback_for(store)  # its servers': not another cluster's same keys

    def hit(self, key: str | bytes, cost: int = 1) -> Decision:
        """Count an attempt of ``cost`` units under ``key``; return the decision.

        Admitted: 1 round trip (meta or text once the slot exists).  Refused: 1
        more, to take the cost back.  A ``cost`` above the limit is refused
        without touching the store; a negative one raises ``ValueError``.
        """
        if not isinstance(cost, int) or cost < 0:
            raise ValueError(f"cost must be a non-negative int, not {cost!r}")
        window = self.window
        limit = window.rate.limit
        if cost > limit:
            return Decision(False, limit, limit, 0.0)
        now = self.clock()
        route = placed(key)[0]
        name = route.decode("utf-8")
        current, older = window.keys(name, now)
        # A name near 250 bytes: its slots' keys take their digest form (keys.py).
        slot = Routed(shorten(current.encode()), route)
        olds = [Routed(shorten(old.encode()), route) for old in older]
        alone = name + self._suffix
        fallback = self._fallback
        if fallback.owes(alone):  # admitted alone while its server was out: give it back first
            owed = fallback.take(alone, window, now)
            if not restore(self.store, name, route, owed, window.exptime(now)):
                fallback.give_back(alone, owed)
        try:
            total, counts = tally(self.store, slot, olds, cost, window.exptime(now))
        except McPatternsError as exc:
            logger.warning("rate limit %r not decided (%s): failing %s", name, exc, self.fail)
            total, counts = None, []
        if total is None:
            if self.fail == "open":
                return fallback.decide(window, alone, cost, now)
            return self._degraded()
        fallback.seen(alone, window.slot(now), total, counts)
        decision = window.decide(total, counts, cost, now)
        if not decision.allowed and cost:
            untally(self.store, slot, cost)
        return decision

    def peek(self, key: str | bytes) -> Decision:
        """The decision a zero-cost attempt gets now: what is left, without spending it."""
        return self.hit(key, 0)

    def _degraded(self) -> Decision:
        limit = self.window.rate.limit
        if self.fail == "open":
            return Decision(True, limit, limit, 0.0, degraded=True)
        return Decision(False, limit, 0, float(self.window.slot_ms) / 1000, degraded=True)
