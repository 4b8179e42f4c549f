"""``CacheUnavailableMiddleware``: a lock whose server is down answers 503 with Retry-After.

Sync and async views, on a cluster whose only server nobody listens on (so
``cache.lock(...)`` raises ``LockUnavailableError``), and on a real memcached
stalled (SIGSTOP) mid-test, as in the issue's drill: a lock view answers 503,
a view whose writes degrade (``sadd``, ``rpush``, a namespace invalidation)
answers 200 and signals ``write_degraded``; other errors stay 500s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from asgiref.sync import iscoroutinefunction
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path

from django_mcpatterns import signals
from django_mcpatterns.core.exceptions import LockUnavailableError, NodeUnavailableError
from django_mcpatterns.middleware import CacheUnavailableMiddleware
from tests.django.conftest import CLUSTER_BACKEND, received
from tests.harness import LOOPBACK, MemcachedServer, free_port, memcached_cluster

MIDDLEWARE = ["django_mcpatterns.middleware.CacheUnavailableMiddleware"]


def locked_view(request: HttpRequest) -> HttpResponse:
    with cache.lock("middleware:lock", timeout=5):
        return HttpResponse("done")


async def async_locked_view(request: HttpRequest) -> HttpResponse:
    async with cache.lock("middleware:lock", timeout=5):
        return HttpResponse("done")


def broken_view(request: HttpRequest) -> HttpResponse:
    raise ValueError("not the cache's")


def unavailable_view(request: HttpRequest) -> HttpResponse:
    raise NodeUnavailableError("down", node="x")


def writes_view(request: HttpRequest) -> HttpResponse:
    added = cache.sadd("middleware:set", "a", "b")  # type: ignore[attr-defined]
    pushed = cache.rpush("middleware:list", "x")  # type: ignore[attr-defined]
    cache.namespace("middleware", 1).invalidate()  # type: ignore[attr-defined]
    return HttpResponse(f"{added} {pushed}")


async def async_writes_view(request: HttpRequest) -> HttpResponse:
    added = await cache.asadd("middleware:set", "a", "b")  # type: ignore[attr-defined]
    removed = await cache.asrem("middleware:set", "a")  # type: ignore[attr-defined]
    return HttpResponse(f"{added} {removed}")


urlpatterns = [
    path("locked/", locked_view),
    path("async-locked/", async_locked_view),
    path("writes/", writes_view),
    path("async-writes/", async_writes_view),
    path("broken/", broken_view),
    path("unavailable/", unavailable_view),
]


@pytest.fixture
def down() -> Iterator[None]:
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": f"{LOOPBACK}:{free_port()}"}
    with override_settings(CACHES={"default": entry}, MIDDLEWARE=MIDDLEWARE, ROOT_URLCONF=__name__):
        yield


@pytest.mark.usefixtures("down", "reset_shared_stores")
@pytest.mark.parametrize("url", ["/locked/", "/unavailable/"])
def test_a_sync_view_whose_cache_is_down_answers_503_with_retry_after(url: str) -> None:
    response = Client(raise_request_exception=False).get(url)
    assert response.status_code == 503
    assert response["Retry-After"] == "1"


@pytest.mark.usefixtures("down", "reset_shared_stores")
def test_an_async_view_whose_lock_server_is_down_answers_503() -> None:
    async def fetch() -> HttpResponse:
        answer: HttpResponse = await AsyncClient(raise_request_exception=False).get(
            "/async-locked/"
        )
        return answer

    response = asyncio.run(fetch())
    assert response.status_code == 503
    assert response["Retry-After"] == "1"


@pytest.mark.usefixtures("down", "reset_shared_stores")
def test_retry_after_follows_the_setting_and_other_errors_stay_500() -> None:
    client = Client(raise_request_exception=False)
    with override_settings(MCPATTERNS_RETRY_AFTER=7):
        assert client.get("/locked/")["Retry-After"] == "7"
    assert client.get("/broken/").status_code == 500


@pytest.mark.usefixtures("down", "reset_shared_stores")
def test_without_the_middleware_the_lock_error_is_a_500() -> None:
    # What the middleware is for (and what the drill saw: 500s from cache.lock).
    with override_settings(MIDDLEWARE=[]):
        response = Client(raise_request_exception=False).get("/locked/")
    assert response.status_code == 500
    with override_settings(MIDDLEWARE=[]), pytest.raises(LockUnavailableError):
        Client().get("/locked/")


def test_the_middleware_runs_in_the_request_s_own_mode() -> None:
    async def async_get_response(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    def get_response(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    assert CacheUnavailableMiddleware.sync_capable
    assert CacheUnavailableMiddleware.async_capable
    assert iscoroutinefunction(CacheUnavailableMiddleware(async_get_response))
    assert not iscoroutinefunction(CacheUnavailableMiddleware(get_response))


# -- a real server, stalled (SIGSTOP) as in the drill ---------------------------


@pytest.fixture
def stalled() -> Iterator[MemcachedServer]:
    """The cache on a real memcached, stalled for the test (resumed after it)."""
    with memcached_cluster(1) as servers:
        server = servers[0]
        entry = {
            "BACKEND": CLUSTER_BACKEND,
            "LOCATION": server.spec,
            "OPTIONS": {"timeout": 0.3, "connect_timeout": 0.3, "retry_timeout": 0.05},
        }
        with override_settings(
            CACHES={"default": entry}, MIDDLEWARE=MIDDLEWARE, ROOT_URLCONF=__name__
        ):
            # Connected and answering before the stall.  The timeout is short for the stall;
            # a loaded machine may run the first set past it (the node then waits out its
            # retry_timeout): the server is healthy, so try again until the set lands.
            for _ in range(200):
                if cache.set("middleware:warm", 1):
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("the healthy server never stored the warm-up set")
            server.pause()
            try:
                yield server
            finally:
                server.resume()


@pytest.mark.usefixtures("stalled", "reset_shared_stores")
def test_a_stalled_lock_server_answers_503_and_degraded_writes_answer_200() -> None:
    # Before (the issue): both views were 500s, from cache.lock and cache.sadd raising
    # NodeUnavailableError.
    client = Client(raise_request_exception=False)
    with received(signals.write_degraded) as degraded:
        writes = client.get("/writes/")
    assert (writes.status_code, writes.content) == (200, b"0 0")
    assert [d["command"] for d in degraded] == ["sadd", "rpush", "invalidate_namespace"]
    locked = client.get("/locked/")
    assert locked.status_code == 503
    assert locked["Retry-After"] == "1"


@pytest.mark.usefixtures("stalled", "reset_shared_stores")
def test_an_async_view_s_degraded_writes_answer_200_and_its_lock_503() -> None:
    async def fetch(url: str) -> HttpResponse:
        answer: HttpResponse = await AsyncClient(raise_request_exception=False).get(url)
        return answer

    with received(signals.write_degraded) as degraded:
        writes = asyncio.run(fetch("/async-writes/"))
    assert (writes.status_code, writes.content) == (200, b"0 0")
    assert [d["command"] for d in degraded] == ["sadd", "srem"]
    assert asyncio.run(fetch("/async-locked/")).status_code == 503


@pytest.mark.usefixtures("reset_shared_stores")
def test_on_outage_raise_makes_a_stalled_write_a_503_under_the_middleware(
    stalled: MemcachedServer,
) -> None:
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": stalled.spec,
        "OPTIONS": {"timeout": 0.3, "connect_timeout": 0.3, "on_outage": "raise"},
    }
    with override_settings(CACHES={"default": entry}):
        response = Client(raise_request_exception=False).get("/writes/")
    assert response.status_code == 503  # the error reached the view: answered, not a 500
