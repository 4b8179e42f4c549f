"""The example's pages."""

import time

from django.conf import settings
from django.core.cache import cache
from django.shortcuts import render


def expensive_report() -> dict:
    """Stand-in for a slow query: what a real site would want to cache."""
    time.sleep(0.2)
    return {"generated_at": time.time(), "top_items": [f"item {i}" for i in range(1, 6)]}


def home(request):
    started = time.perf_counter()
    report = cache.get("home:report")
    hit = report is not None
    if not hit:
        report = expensive_report()
        cache.set("home:report", report, timeout=30)
    cache.add("home:views", 0, timeout=None)  # add: never resets a running count
    try:
        views = cache.incr("home:views")
    except ValueError:  # evicted, or its server is down: the page still renders
        views = None
    context = {
        "report": report,
        "hit": hit,
        "views": views if views is not None else "unknown",
        "elapsed_ms": (time.perf_counter() - started) * 1000,
        "backend": settings.CACHES["default"]["BACKEND"].rsplit(".", 1)[-1],
        "servers": getattr(settings, "MEMCACHED_SERVERS", "") or "in-process",
    }
    return render(request, "demo/home.html", context)
