"""Rate limiting: the pure parts (rates, the window's slots, decisions).

The algorithm is a *slotted sliding window* (``docs/ratelimit.md`` argues the
choice).  A rate ``N/T`` splits time into slots of ``T / slots`` seconds; each
slot has one memcached counter.  A decision at time ``t`` in slot ``k`` adds its
cost to slot ``k`` with one atomic ``incr`` and reads slots ``k - slots`` ..
``k - 1`` in the same round trip; it is admitted when the sum (its own cost
included) is at most ``N``, and a refused decision takes its cost back.

Why this shape:

* **No double burst, ever.**  The slots read cover ``[(k - slots)·s, t]``, which
  contains ``[t - T, t]``: every admission of the last ``T`` seconds is counted,
  so no interval of length ``T`` (aligned or not) ever holds more than ``N``
  admissions.  A fixed window (django-ratelimit's ``add`` + ``incr``) admits
  ``2N`` across its edge; a token bucket/GCRA admits ``N`` at once and then one
  per ``T/N``, so up to ``2N - 1`` in an interval of length ``T``.
* **Exact under concurrency.**  ``incr`` is atomic: racing decisions see
  distinct running totals, so exactly the first ``N`` units fit.  A refusal
  undoes its ``incr``; until the undo lands it can only make another decision
  stricter, never looser.
* **One round trip.**  ``ma`` (autovivifying ``N``/``J``) and the ``mg`` of the
  older slots go out in one write (all slots route by the limiter's key, so
  they live on one server).  GCRA needs a read and a ``cas`` (two), and its
  clamp ``max(TAT, now)`` cannot be an ``incr``.
* **The price:** admissions are counted up to one slot (``T / slots``) longer
  than ``T`` (a little stricter than a true sliding log), and ``slots + 1``
  tiny items per key.

This module imports nothing that does I/O; :mod:`.tallies` reads and bumps the
slots, ``core/_async/ratelimit.py`` (and its generated sync form) decides.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Final, Literal

from .exceptions import ConfigurationError
from .store import MAX_RELATIVE_EXPIRE

__all__ = ["DEFAULT_SLOTS", "Decision", "Rate", "Window", "parse_rate"]

DEFAULT_SLOTS: Final = 10
"""Slots per window: admissions are remembered up to ``T / 10`` longer than ``T``."""

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*$")

FailMode = Literal["open", "closed"]


@dataclass(frozen=True, slots=True)
class Rate:
    """``limit`` units per ``period`` seconds."""

    limit: int
    period: int

    def __str__(self) -> str:
        return f"{self.limit}/{self.period}s"


def parse_rate(rate: str | Rate) -> Rate:
    """Return the :class:`Rate` for ``"5/s"``, ``"100/m"``, ``"1000/h"``, ``"10/30s"``, ``"2/d"``.

    Raise :class:`~.exceptions.ConfigurationError` (a ``ValueError``) naming the
    accepted forms for anything else, and for a zero limit or period.
    """
    if isinstance(rate, Rate):
        return rate
    if not isinstance(rate, str):
        raise ConfigurationError(f"rate {rate!r} is not a string like '100/m'", option="rate")
    return _parse(rate)


@functools.lru_cache(maxsize=256)
def _parse(rate: str) -> Rate:
    """:func:`parse_rate` of a string, once per distinct rate (views parse theirs per request)."""
    match = _RATE.match(rate)
    if match is None:
        raise ConfigurationError(
            f"rate {rate!r} is not of the form '<count>/<unit>' or '<count>/<n><unit>' "
            "with unit s, m, h or d (e.g. '5/s', '100/m', '1000/h', '10/30s')",
            option="rate",
        )
    count, multiple, unit = match.groups()
    limit, period = int(count), int(multiple or 1) * _UNITS[unit]
    if limit <= 0 or period <= 0:
        raise ConfigurationError(f"rate {rate!r} admits nothing: use a positive count and period")
    return Rate(limit, period)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the limiter decided for one attempt.

    ``remaining``: units still admissible in the window after this decision;
    ``retry_after``: seconds until an attempt of the same cost could be admitted
    (0 when admitted); ``degraded``: the store could not be asked (the decision
    is the configured ``fail`` mode's, open or closed).
    """

    allowed: bool
    limit: int
    remaining: int
    retry_after: float
    degraded: bool = False

    def __bool__(self) -> bool:
        return self.allowed


@dataclass(frozen=True, slots=True)
class Window:
    """How a :class:`Rate` maps onto slot counters; the decision arithmetic."""

    rate: Rate
    slots: int = DEFAULT_SLOTS

    def __post_init__(self) -> None:
        if not isinstance(self.slots, int) or self.slots < 1:
            raise ConfigurationError(f"slots must be a positive int, not {self.slots!r}")

    @property
    def slot_ms(self) -> int:
        """A slot's length in milliseconds (at least 1)."""
        return max(1, math.ceil(self.rate.period * 1000 / self.slots))

    @property
    def expire(self) -> int:
        """A slot item's exptime: it is read until ``slots + 1`` slots after its start.

        Whole seconds on memcached's clock, plus one for its coarse ticking.
        """
        return math.ceil((self.slots + 1) * self.slot_ms / 1000) + 1

    def exptime(self, now: float) -> int:
        """The exptime to store a slot with at ``now``: :attr:`expire`, absolute past 30 days.

        Sent as is, an ``expire`` over 30 days would be read as a date in 1970
        and the slot would expire at once (a monthly quota admitting everything).
        """
        expire = self.expire
        return expire if expire <= MAX_RELATIVE_EXPIRE else math.ceil(now) + expire

    def slot(self, now: float) -> int:
        """The index of the slot holding time ``now`` (seconds)."""
        return math.floor(now * 1000) // self.slot_ms

    def decide(self, current: int, older: list[int], cost: int, now: float) -> Decision:
        """Decide from the current slot's total (``cost`` included) and the older slots'.

        ``older`` runs from the oldest slot read to the newest.
        """
        limit = self.rate.limit
        used = current + sum(older)
        if used <= limit:
            return Decision(True, limit, limit - used, 0.0)
        return Decision(
            False, limit, max(0, limit - (used - cost)), self.wait(current - cost, older, cost, now)
        )

    def wait(self, current: int, older: list[int], cost: int, now: float) -> float:
        """Seconds until ``cost`` fits, as older slots leave the window (0 if it never will)."""
        limit = self.rate.limit
        if cost > limit:
            return 0.0
        counts = [*older, current]  # oldest first; slot k - slots .. k
        start = self.slot(now) - self.slots
        total = sum(counts)
        for dropped, count in enumerate(counts, 1):
            total -= count
            if total + cost <= limit:
                at = (start + dropped + self.slots) * self.slot_ms / 1000
                return max(0.0, at - now)
        return 0.0  # unreachable: dropping every slot leaves 0 + cost <= limit

    def keys(self, key: str, now: float) -> tuple[str, list[str]]:
        """The current slot's key and the older slots' (oldest first) for ``key`` at ``now``."""
        k = self.slot(now)
        return f"{key}:{k}", [f"{key}:{i}" for i in range(k - self.slots, k)]
