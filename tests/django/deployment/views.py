"""The drill's pages: each answers JSON about what it saw, for the test to check."""

import random
import time

from django.core.cache import cache
from django.http import HttpRequest, JsonResponse

from .apps import HELD, KEYS, expected


def critical(request: HttpRequest) -> JsonResponse:
    """Enter a lock-protected section; report when it was entered and left.

    Also try the lock the starting process holds: taking it would be stealing.
    """
    stolen = cache.lock(HELD, timeout=30).acquire(blocking=False)
    lock = cache.lock("drill:critical", timeout=30, blocking_timeout=10)
    if not lock.acquire():
        return JsonResponse({"acquired": False, "stolen": stolen})
    try:
        entered = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
        time.sleep(0.002)
        left = time.monotonic()
    finally:
        lock.release()
    return JsonResponse({"acquired": True, "entered": entered, "left": left, "stolen": stolen})


def multiget(request: HttpRequest) -> JsonResponse:
    """Read a sample of the warm-up's keys; count values that are not their key's."""
    keys = random.sample(KEYS, 10)
    found = cache.get_many(keys)
    single = random.choice(KEYS)
    wrong = sum(value != expected(key) for key, value in found.items())
    value = cache.get(single)
    wrong += value is not None and value != expected(single)
    return JsonResponse({"wrong": wrong, "missing": len(keys) - len(found) + (value is None)})
