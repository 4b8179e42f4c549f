"""Rate limiting: the pure parts (rates, the window's slots, decisions, the tally's requests).

The algorithm and its argument are in :mod:`django_mcpatterns.core.ratelimit`.  This
module does no I/O: ``_async_tally.py`` sends what :func:`tally_batch` makes.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from ..exceptions import ConfigurationError
from ..keys import Routed, placed
from ..protocol.meta import MetaArithmetic, MetaGet
from ..protocol.wire import Get, Incr, MetaReply, Request
from ..store import MAX_RELATIVE_EXPIRE

__all__ = [
    "CREATE",
    "DEFAULT_SLOTS",
    "Decision",
    "Rate",
    "Tally",
    "Window",
    "count_of",
    "counts_of",
    "parse_rate",
    "tally_batch",
    "tally_replies",
]

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

    Raise :class:`~django_mcpatterns.core.exceptions.ConfigurationError` (a ``ValueError``) naming
    the accepted forms for anything else, and for a zero limit or period.
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


# -- the tally: one write bumps the slot and reads the older ones -----------------------

Tally = tuple[int | None, list[int]]


def count_of(value: Any) -> int:
    """A slot counter's value as an int (memcached answers digits; a miss is 0)."""
    if value is None:
        return 0
    if isinstance(value, bytes | bytearray):
        return int(value)
    return int(value)


class Create:
    """The text protocol's answer for a slot's first use: ``incr`` found no item."""


CREATE: Final = Create()


def counts_of(found: dict[Any, Any], keys: Sequence[Routed]) -> list[int]:
    return [count_of(found.get(key)) for key in keys]


def tally_batch(
    protocol: str, current: Routed, older: Sequence[Routed], cost: int, expire: int
) -> list[Request[Any]]:
    """One write: bump the slot (creating it, in meta), read the older slots."""
    kb = placed(current)[0]
    olds = tuple(placed(key)[0] for key in older)
    if protocol == "text":
        return [Incr(kb, cost), Get(olds)] if olds else [Incr(kb, cost)]
    bump = MetaArithmetic(kb, delta=cost, vivify=expire, initial=cost, value=True)
    return [bump, *(MetaGet(old, value=True) for old in olds)]


def tally_replies(replies: list[Any] | None, batch: list[Request[Any]]) -> tuple[Any, list[int]]:
    """``(current, older)`` from the replies to :func:`tally_batch` (``CREATE``: add the slot)."""
    bump, reads = batch[0], batch[1:]
    if isinstance(bump, Incr):
        olds = list(reads[0].keys) if reads and isinstance(reads[0], Get) else []
    else:
        olds = [read.key for read in reads if isinstance(read, MetaGet)]
    if replies is None:
        return None, [0] * len(olds)
    counts = dict.fromkeys(olds, 0)
    if isinstance(bump, Incr):
        for item in replies[1] if len(replies) > 1 and isinstance(replies[1], list) else []:
            counts[item.key] = count_of(item.data)
        bumped = replies[0]
        if bumped is None:
            return CREATE, [counts[old] for old in olds]
        return (bumped if isinstance(bumped, int) else None), [counts[old] for old in olds]
    for old, reply in zip(olds, replies[1:], strict=True):
        if isinstance(reply, MetaReply) and reply.status == b"VA" and reply.data:
            counts[old] = count_of(reply.data)
    bumped = replies[0]
    if not isinstance(bumped, MetaReply) or bumped.status != b"VA" or bumped.data is None:
        return None, [counts[old] for old in olds]
    return count_of(bumped.data), [counts[old] for old in olds]
