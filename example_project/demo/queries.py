"""The example's expensive reads, and how each one is cached."""

import time
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count
from django.utils import timezone

from django_mcpatterns.decorators import cached

from .models import Interest, Profile

LEADERBOARD_KEY = "leaderboard"
REBUILD_LOCK = "leaderboard:rebuild"


def community_report() -> dict[str, Any]:
    """The front page's report: a deliberately slow aggregation.

    Not cached here: the front page's view is, whole, by ``stampede_guard``.
    """
    started = time.perf_counter()
    time.sleep(settings.EXAMPLE_REPORT_SECONDS)  # stands in for a heavy query
    cities = Profile.objects.values("city").annotate(members=Count("id"))
    top_interests = Interest.objects.values("name").annotate(members=Count("profile"))
    return {
        "members": Profile.objects.count(),
        "cities": list(cities.order_by("-members", "city")),
        "interests": list(top_interests.order_by("-members", "name")[:5]),
        "generated_at": timezone.now(),
        "seconds": time.perf_counter() - started,
    }


@cached(timeout=300, namespace=lambda profile_id: ("profile", profile_id))
def profile_card(profile_id: int) -> dict[str, Any] | None:
    """A profile page's data, cached in the profile's namespace: saving the profile
    invalidates the namespace (``apps.py``), so its page never shows old data.

    None for an unknown profile, cached as well: creating it invalidates the namespace.
    """
    fields = ("id", "name", "city", "bio", "updated_at")
    card = Profile.objects.filter(pk=profile_id).values(*fields).first()
    return None if card is None else {**card, "loaded_at": timezone.now()}


def leaderboard() -> dict[str, Any] | None:
    """The last leaderboard built, or None (never built, or evicted)."""
    return cache.get(LEADERBOARD_KEY)


def rebuild_running() -> bool:
    return cache.lock(REBUILD_LOCK).locked()


def rebuild_leaderboard() -> bool:
    """Build the leaderboard and store it, unless a rebuild is already running
    (in any process, on any machine sharing the cache); return whether it ran.

    The lock expires by itself, so a process that dies mid-rebuild blocks the
    next one for at most ``timeout`` seconds.
    """
    lock = cache.lock(REBUILD_LOCK, timeout=60, blocking=False)
    if not lock.acquire():
        return False
    try:
        cache.set(LEADERBOARD_KEY, _build_leaderboard(), timeout=None)
    finally:
        lock.release()
    return True


def _build_leaderboard() -> dict[str, Any]:
    time.sleep(settings.EXAMPLE_REBUILD_SECONDS)  # stands in for a long batch job
    ranked = Profile.objects.annotate(interest_count=Count("interests"))
    rows = ranked.order_by("-interest_count", "name").values("id", "name", "interest_count")
    return {"rows": list(rows[:10]), "built_at": timezone.now()}
