"""The drill's pages: a write whose transaction adds to a set, a lock, a limit, a read."""

import os
from functools import partial

from django.core.cache import cache
from django.db import transaction
from django.http import HttpRequest, JsonResponse

from demo.models import Interest

RATE = "10/20s"  # used up within the drill, however slow the machine


def set_key(profile_id: int) -> str:
    return f"profile:{profile_id}:interests"


def load(profile_id: int) -> set[str]:
    return set(Interest.objects.filter(profile_id=profile_id).values_list("name", flat=True))


def add(request: HttpRequest) -> JsonResponse:
    """A row and its set member in one transaction: the cache must never roll it back."""
    profile_id, name = int(request.GET["p"]), request.GET["n"]
    with transaction.atomic():
        Interest.objects.create(profile_id=profile_id, name=name)
        added = cache.sadd(set_key(profile_id), name, loader=partial(load, profile_id))
    return JsonResponse({"added": added})


def locked(request: HttpRequest) -> JsonResponse:
    """A lock-protected section: a lock server that cannot be reached is a 503."""
    lock = cache.lock(f"outage:lock:{request.GET['k']}", timeout=5, blocking_timeout=2)
    if not lock.acquire():
        return JsonResponse({"acquired": False})
    lock.release()
    return JsonResponse({"acquired": True})


def limited(request: HttpRequest) -> JsonResponse:
    """A limited page: says whether its worker decided alone (its server out) and which it is."""
    decision = cache.ratelimit(f"outage:limit:{request.GET['k']}", RATE)
    answer = {"allowed": decision.allowed, "degraded": decision.degraded, "pid": os.getpid()}
    return JsonResponse(answer, status=200 if decision.allowed else 429)


def members(request: HttpRequest) -> JsonResponse:
    """A profile's set as the cache reads it (its loader: the rows), and the rows."""
    profile_id = int(request.GET["p"])
    cached = cache.smembers(set_key(profile_id), loader=partial(load, profile_id))
    rows = sorted(load(profile_id))
    return JsonResponse({"cached": sorted(cached), "rows": rows, "pid": os.getpid()})
