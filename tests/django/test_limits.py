"""Django: ``cache.ratelimit``, the ``ratelimit`` view decorator, ``cache.counter`` and
:class:`ModelCounter`, on the embedded backend and on real memcached."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.db import connection, models, transaction
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from django_mcpatterns.decorators import ratelimit
from django_mcpatterns.limiting import ModelCounter
from tests.django.conftest import CLUSTER_BACKEND, EMBEDDED_BACKEND
from tests.harness import MemcachedServer, start_memcached, stop_all

factory = RequestFactory()


@pytest.fixture(params=["embedded", "memcached"])
def cache(request: pytest.FixtureRequest, memcached_1: list[MemcachedServer]) -> Iterator[Any]:
    if request.param == "embedded":
        entry: dict[str, Any] = {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "limits"}
    else:
        memcached_1[0].flush()
        entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": [memcached_1[0].spec]}
    with override_settings(CACHES={"default": entry}):
        yield caches["default"]
        caches["default"].clear()


def test_cache_ratelimit_admits_the_limit_then_tells_when(cache: Any) -> None:
    told = [cache.ratelimit("login:alice", "3/m") for _ in range(5)]
    assert [d.allowed for d in told] == [True, True, True, False, False]
    assert [d.remaining for d in told] == [2, 1, 0, 0, 0]
    assert 0 < told[-1].retry_after <= 66
    assert cache.ratelimit("login:bob", "3/m").allowed  # another key, another budget


def test_cache_ratelimit_with_a_cost(cache: Any) -> None:
    assert cache.ratelimit("upload", "10/h", cost=7).allowed
    assert not cache.ratelimit("upload", "10/h", cost=4).allowed
    assert cache.ratelimit("upload", "10/h", cost=3).remaining == 0


def test_decorator_answers_429_with_retry_after(cache: Any) -> None:
    @ratelimit("2/m", key="ip")
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    answers = [view(factory.get("/", REMOTE_ADDR="10.0.0.1")) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert 1 <= int(answers[-1]["Retry-After"]) <= 66
    assert view(factory.get("/", REMOTE_ADDR="10.0.0.2")).status_code == 200


def test_decorator_marks_instead_of_blocking(cache: Any) -> None:
    seen: list[bool] = []

    @ratelimit("1/m", key="header:X-Api-Key", block=False)
    def view(request: HttpRequest) -> HttpResponse:
        seen.append(request.ratelimited)  # type: ignore[attr-defined]
        return HttpResponse("ok")

    for _ in range(2):
        assert view(factory.get("/", HTTP_X_API_KEY="k1")).status_code == 200
    assert seen == [False, True]


def test_decorator_on_async_views_and_only_for_given_methods(cache: Any) -> None:
    @ratelimit("1/m", key=lambda request: "everyone", methods=("POST",))
    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    async def run() -> list[int]:
        codes = [(await view(factory.get("/"))).status_code for _ in range(2)]
        codes += [(await view(factory.post("/"))).status_code for _ in range(2)]
        return codes

    assert asyncio.run(run()) == [200, 200, 200, 429]


def test_cache_counter_sync_and_async(cache: Any) -> None:
    rows = [1, 2, 3]
    counter = cache.counter("rows", lambda: len(rows))
    assert counter.get() == 3
    with counter.change(+1):
        rows.append(4)
    assert counter.get() == 4

    async def run() -> int:
        async with counter.achange(-1):
            rows.pop()
        return await counter.aget()

    assert asyncio.run(run()) == 3


def test_dead_server_never_raises_into_the_view() -> None:
    servers = start_memcached(1)
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": [servers[0].spec],
        "OPTIONS": {"timeout": 0.5, "connect_timeout": 0.5},
    }
    try:
        with override_settings(CACHES={"default": entry}):

            @ratelimit("1/m")
            def open_view(request: HttpRequest) -> HttpResponse:
                return HttpResponse("ok")

            @ratelimit("1/m", fail="closed")
            async def closed_view(request: HttpRequest) -> HttpResponse:
                return HttpResponse("ok")

            servers[0].kill()
            # fail="open" decides alone meanwhile: the limit per process, never everything.
            assert [open_view(factory.get("/")).status_code for _ in range(3)] == [200, 429, 429]
            refused = asyncio.run(closed_view(factory.get("/")))
            assert refused.status_code == 429
            assert int(refused["Retry-After"]) >= 1
    finally:
        stop_all(servers)


class Item(models.Model):
    id = models.AutoField(primary_key=True)
    published = models.BooleanField(default=False)

    class Meta:
        app_label = "mcpatterns_limits_tests"


@pytest.fixture
def table(cache: Any) -> Iterator[None]:
    with connection.schema_editor() as editor:
        editor.create_model(Item)
    yield
    with connection.schema_editor() as editor:
        editor.delete_model(Item)


def _create_and_roll_back() -> None:
    with transaction.atomic():
        Item.objects.create()
        raise RuntimeError("rolled back")


@pytest.mark.django_db(transaction=True)
def test_model_counter_follows_saves_deletes_and_transactions(table: None, cache: Any) -> None:
    everything = ModelCounter(Item)
    published = ModelCounter(Item, published=True)
    try:
        assert (everything.get(), published.get()) == (0, 0)
        first = Item.objects.create(published=True)
        Item.objects.create()
        assert (everything.get(), published.get()) == (2, 1)
        first.published = False
        first.save()
        assert (everything.get(), published.get()) == (2, 0)
        with transaction.atomic():
            Item.objects.create(published=True)
            assert everything.get() == 2  # not committed: the cached count waits for it
        assert (everything.get(), published.get()) == (3, 1)
        with pytest.raises(RuntimeError):
            _create_and_roll_back()
        assert (everything.get(), published.get()) == (3, 1)
        first.delete()
        assert (everything.get(), published.get()) == (2, 1)
        assert everything.get() == Item.objects.count()
    finally:
        everything.disconnect()
        published.disconnect()


@pytest.mark.django_db
def test_decorator_counts_by_user_on_async_views(cache: Any) -> None:
    """``key="user"`` on an async view: the user is loaded with ``request.auser()``.

    ``AuthenticationMiddleware`` sets ``request.user`` to a lazy object whose
    loading queries the database; touched in an async view it raises
    ``SynchronousOnlyOperation``.  Django gives async code ``request.auser()``.
    """
    from asgiref.sync import sync_to_async
    from django.utils.functional import SimpleLazyObject

    class User:
        is_authenticated = True

        def __init__(self, pk: int) -> None:
            self.pk = pk

    def load_user(pk: int) -> User:
        with connection.cursor() as cursor:  # as django.contrib.auth.get_user does
            cursor.execute("SELECT %s", [pk])
            return User(cursor.fetchone()[0])

    def request_of(pk: int) -> HttpRequest:
        request = factory.get("/", REMOTE_ADDR="10.0.0.1")  # one address, two users
        request.user = SimpleLazyObject(lambda: load_user(pk))  # type: ignore[attr-defined]
        request.auser = sync_to_async(lambda: load_user(pk))  # type: ignore[attr-defined]
        return request

    @ratelimit("1/m", key="user")
    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    async def run() -> list[int]:
        return [(await view(request_of(pk))).status_code for pk in (1, 2, 1, 2)]

    assert asyncio.run(run()) == [200, 200, 429, 429]
