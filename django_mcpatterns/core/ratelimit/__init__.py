"""Rate limiters, sync and async: :class:`RateLimiter` and :class:`AsyncRateLimiter`.

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

The pure parts (rates, the window's slots, decisions, the tally's requests and
replies) are in ``_model.py``; ``_async_tally.py`` reads and bumps the slots and
``_async.py`` decides (both written once, their sync forms generated).
"""

from __future__ import annotations

from ._async import AsyncRateLimiter
from ._model import DEFAULT_SLOTS, Decision, FailMode, Rate, Window, parse_rate
from ._sync import RateLimiter

__all__ = [
    "DEFAULT_SLOTS",
    "AsyncRateLimiter",
    "Decision",
    "FailMode",
    "Rate",
    "RateLimiter",
    "Window",
    "parse_rate",
]
