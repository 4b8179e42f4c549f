"""The example's async pages: the same patterns, awaited on the event loop.

Served by an ASGI server (``uvicorn example_site.asgi:application``, see the
README); under ``runserver`` they work too, one event loop per request.

- ``overview``: Django's async cache API (``aadd``/``aincr``/``aget_many``), a
  set of visitors (``asadd``/``ascard``) and the community counts from
  ``aget_or_compute``, whose compute is a plain function using the ORM: it
  runs through ``sync_to_async``, the only thread hop, and only for this code;
- ``tally``: a read-modify-write under ``async with cache.lock(...)``: the
  waiters sleep on the loop (other requests go on), and no update is lost;
- ``front``: an async view behind ``stampede_guard``.
"""

from typing import Any

from django.core.cache import cache
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone

from django_mcpatterns.decorators import stampede_guard

from .models import Interest, Profile

VISITS = "async:visits"
VISITORS = "async:visitors"
TALLY = "async:tally"
COUNTS_SECONDS = 30


def community_counts() -> dict[str, Any]:
    """Members and interests counted by the ORM: sync code, as most of a project is."""
    return {
        "members": Profile.objects.count(),
        "interests": Interest.objects.values("name").distinct().count(),
        "cities": Profile.objects.values("city").annotate(n=Count("id")).count(),
        "counted_at": timezone.now().isoformat(),
    }


async def overview(request: HttpRequest) -> JsonResponse:
    await cache.aadd(VISITS, 0, timeout=None)
    visits = await cache.aincr(VISITS)
    visitor = request.headers.get("X-Visitor") or request.META.get("REMOTE_ADDR") or "anon"
    await cache.asadd(VISITORS, visitor)
    counts = await cache.aget_or_compute("async:counts", community_counts, COUNTS_SECONDS)
    found = await cache.aget_many([VISITS, TALLY])
    return JsonResponse(
        {
            "visits": visits,
            "visitors": await cache.ascard(VISITORS),
            "counts": counts,
            "tally": found.get(TALLY, 0),
        }
    )


async def tally(request: HttpRequest) -> JsonResponse:
    # Not an atomic incr on purpose: a read, an await, a write.  The lock makes
    # it safe across tasks, processes and machines sharing the cache.
    async with cache.lock("async:tally:lock", timeout=10, blocking_timeout=10):
        count = await cache.aget(TALLY, 0)
        await cache.aset(TALLY, count + 1, timeout=None)
    return JsonResponse({"tally": count + 1})


@stampede_guard(COUNTS_SECONDS)
async def front(request: HttpRequest) -> HttpResponse:
    counts = await cache.aget_or_compute("async:counts", community_counts, COUNTS_SECONDS)
    return HttpResponse(f"{counts['members']} members, rendered {timezone.now().isoformat()}")
