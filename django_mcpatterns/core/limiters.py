"""The rate limiters' documented path: they live in :mod:`django_mcpatterns.core.ratelimit`."""

from __future__ import annotations

from .ratelimit import AsyncRateLimiter, Decision, Rate, RateLimiter, parse_rate

__all__ = ["AsyncRateLimiter", "Decision", "Rate", "RateLimiter", "parse_rate"]
