"""``stampede_guard`` and ``cached`` through Django: test client, real threads, real servers.

The algorithm (one recomputing winner, waiting on a cold miss) is proven in
``tests/core``; here it is reached as a project reaches it, on a 3-server
cluster and on the embedded store: Django's page keys and headers, the
cacheability rules of its cache middleware, the decorated functions' keys and
helpers, the signals, and real threads contending for one stale page.
A competitor is simulated deterministically by holding the recompute lock.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import iscoroutinefunction
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template import engines
from django.template.response import TemplateResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path
from django.utils.cache import _generate_cache_key, get_cache_key
from django.utils.decorators import method_decorator
from django.utils.http import http_date
from django.views import View
from django.views.decorators.vary import vary_on_headers
from hypothesis import given, settings
from hypothesis import strategies as st

from django_mcpatterns import signals
from django_mcpatterns.core.exceptions import ConfigurationError, EncodingError
from django_mcpatterns.core.keys import key_bytes
from django_mcpatterns.core.stampede import StampedePolicy
from django_mcpatterns.decorators import cached, stampede_guard
from django_mcpatterns.patterns.callkeys import MAX_READABLE, call_key, encode
from django_mcpatterns.patterns.pages import PASS, CachedPage
from tests.django.conftest import Deployment, DeploymentSuite, received
from tests.harness import server_requests
from tests.recompute import drop_recompute, hold_recompute

SLOW = 0.3  # seconds a "slow" view takes: long enough for every thread to arrive
THREADS = 8
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]


def run_together(count: int, job: Callable[[], Any]) -> list[Any]:
    """Run ``job`` in ``count`` real threads released at the same instant."""
    barrier = threading.Barrier(count)

    def start(_: int) -> Any:
        barrier.wait()
        return job()

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(start, range(count)))


# -- the site --------------------------------------------------------------------------


@dataclasses.dataclass
class Site:
    """What the views did: one entry per run (appends are atomic under the GIL)."""

    runs: list[str] = dataclasses.field(default_factory=list)
    fail: bool = False
    vary: bool = False
    # Views asked "?together" wait here until all its parties run at once (None: no wait).
    together: threading.Barrier | None = None
    # What the slow view waits for instead of SLOW seconds, when set.
    hold: Callable[[], object] | None = None

    def run(self, name: str) -> int:
        self.runs.append(name)
        return len(self.runs)


site = Site()


@stampede_guard(60)
def page(request: HttpRequest, n: int) -> HttpResponse:
    return HttpResponse(f"page {n} #{site.run(f'page {n}')}")


@stampede_guard(60)
def slow(request: HttpRequest) -> HttpResponse:
    run = site.run("slow")
    if site.hold is not None:
        site.hold()
    else:
        time.sleep(SLOW)
    if site.fail:
        raise RuntimeError("database down")
    return HttpResponse(f"slow #{run}")


@stampede_guard(60)
@vary_on_headers("X-Variant")
def varying(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"{request.headers.get('X-Variant')} #{site.run('varying')}")


@stampede_guard(60)
def moving(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(f"{request.headers.get('X-Variant')} #{site.run('moving')}")
    if site.vary:
        response["Vary"] = "X-Variant"
    return response


@stampede_guard(60)
def templated(request: HttpRequest) -> TemplateResponse:
    template = engines["django"].from_string("hello {{ name }} #{{ run }}")
    return TemplateResponse(request, template, {"name": "ann", "run": site.run("templated")})


@stampede_guard(60)
def uncacheable(request: HttpRequest, kind: str) -> HttpResponse:
    run = site.run(kind)
    if "sleep" in request.GET:
        time.sleep(SLOW)
    if "together" in request.GET and site.together is not None:
        site.together.wait(timeout=30)  # broken (an error) unless every party renders at once
    if kind == "streaming":
        return StreamingHttpResponse(iter([b"a", b"b"]))
    response = HttpResponse(f"{kind} #{run}", status=404 if kind == "missing" else 200)
    if kind == "cookie":
        response.set_cookie("visitor", "ann")
    elif kind == "private":
        response["Cache-Control"] = "private"
    elif kind == "no-store":
        response["Cache-Control"] = "no-store"
    elif kind == "vary-star":
        response["Vary"] = "*"
    return response


@stampede_guard()
def default_timeout(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(f"default #{site.run('default')}")
    if request.GET.get("max-age") is not None:
        response["Cache-Control"] = f"max-age={request.GET['max-age']}"
    return response


@stampede_guard(0)
def never(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"never #{site.run('never')}")


@stampede_guard(60, key_prefix="shop")
def shop(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"shop #{site.run('shop')}")


@stampede_guard(60, cache="other")
def elsewhere(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"elsewhere #{site.run('elsewhere')}")


@method_decorator(stampede_guard(60), name="get")
class ClassBased(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(f"class #{site.run('class')}")


urlpatterns = [
    path("page/<int:n>/", page),
    path("slow/", slow),
    path("varying/", varying),
    path("moving/", moving),
    path("templated/", templated),
    path("uncacheable/<str:kind>/", uncacheable),
    path("default/", default_timeout),
    path("never/", never),
    path("shop/", shop),
    path("elsewhere/", elsewhere),
    path("class/", ClassBased.as_view()),
]


# -- the contract, on every deployment ---------------------------------------------------


class DecoratorsContract(DeploymentSuite):
    def caches_setting(self, deployment: Deployment) -> dict[str, dict[str, Any]]:
        return {"default": deployment.params(), "other": deployment.params(KEY_PREFIX="other")}

    @pytest.fixture(autouse=True)
    def _site(self) -> Iterator[None]:
        global site
        site = Site()
        with override_settings(ROOT_URLCONF=__name__, TEMPLATES=TEMPLATES):
            yield

    @pytest.fixture
    def client(self) -> Client:
        return Client()

    @staticmethod
    def request(url: str, **headers: str) -> HttpRequest:
        return RequestFactory().get(url, headers=headers)

    # -- stampede_guard: what cache_page does --

    def test_a_page_is_rendered_once_with_cache_page_headers(self, client: Client) -> None:
        first = client.get("/page/1/")
        second = client.get("/page/1/")
        assert first.content == second.content == b"page 1 #1"
        assert first["Cache-Control"] == second["Cache-Control"] == "max-age=60"
        assert first["Expires"] == second["Expires"]
        assert "Age" not in first
        assert int(second["Age"]) in (0, 1)  # from max-age and Expires, as Django's middleware
        assert client.get("/page/2/").content == b"page 2 #2"
        assert client.get("/page/1/?q=1").content == b"page 1 #3"  # the query is in the URL
        assert site.runs == ["page 1", "page 2", "page 1"]

    def test_keys_are_djangos_per_url_keys_under_our_prefix(self, cache: Any) -> None:
        request = self.request("/page/1/")
        assert page.key(request) is None  # the URL was never cached
        page(request, n=1)
        key = page.key(request)
        assert key == get_cache_key(request, "mcpatterns", "GET", cache=cache)
        assert key.startswith("views.decorators.cache.cache_page.mcpatterns.GET.")
        stored = cache.get(key)  # plain data: status, headers, body
        assert isinstance(stored, CachedPage)
        assert (stored.status, stored.body) == (200, b"page 1 #1")
        assert ("Cache-Control", "max-age=60") in stored.headers
        assert page.key(self.request("/page/2/")) is None
        assert page.original is not page
        assert page.original(request, 1).content == b"page 1 #2"

    def test_vary_headers_select_the_page(self, client: Client) -> None:
        assert client.get("/varying/", headers={"X-Variant": "a"}).content == b"a #1"
        assert client.get("/varying/", headers={"X-Variant": "b"}).content == b"b #2"
        assert client.get("/varying/", headers={"X-Variant": "a"}).content == b"a #1"
        assert client.get("/varying/").content == b"None #3"
        # Pages are keyed by Django's own helpers: Django 5.2 (and security releases
        # since) keys an empty header apart from an absent one (RFC 9111 §4.1); older
        # releases give both one key, and the page follows whichever Django runs.
        empty = b" #4" if _django_keys_empty_apart_from_absent() else b"None #3"
        assert client.get("/varying/", headers={"X-Variant": ""}).content == empty

    def test_a_changed_vary_header_moves_the_page(self, client: Client) -> None:
        assert client.get("/moving/", headers={"X-Variant": "a"}).content == b"a #1"
        site.vary = True
        moving.mark_stale(self.request("/moving/"))
        # The recompute learns the new Vary and is not stored under the old key.
        assert client.get("/moving/", headers={"X-Variant": "a"}).content == b"a #2"
        assert client.get("/moving/", headers={"X-Variant": "b"}).content == b"b #3"
        assert client.get("/moving/", headers={"X-Variant": "b"}).content == b"b #3"
        assert client.get("/moving/", headers={"X-Variant": "a"}).content == b"a #4"
        assert client.get("/moving/", headers={"X-Variant": "a"}).content == b"a #4"

    def test_only_get_and_head_are_cached(self, client: Client) -> None:
        client.post("/page/1/")
        client.post("/page/1/")
        assert site.runs == ["page 1", "page 1"]

    def test_head_is_answered_from_the_get_page(self, client: Client) -> None:
        client.get("/page/1/")
        head = client.head("/page/1/")
        assert (head.status_code, head.content, head["Cache-Control"]) == (200, b"", "max-age=60")
        assert site.runs == ["page 1"]
        client.head("/page/2/")  # no GET page: HEAD is rendered and cached on its own
        client.head("/page/2/")
        assert site.runs == ["page 1", "page 2"]

    @pytest.mark.parametrize(
        "kind", ["missing", "cookie", "private", "no-store", "vary-star", "streaming"]
    )
    def test_uncacheable_responses_are_rendered_every_time(
        self, client: Client, cache: Any, kind: str
    ) -> None:
        for _ in range(3):
            response = client.get(f"/uncacheable/{kind}/")
            assert "Expires" not in response
        assert site.runs == [kind] * 3
        # "Hit-for-pass": the page key holds a marker telling requests to render
        # at once, in parallel, instead of waiting for each other.
        assert cache.get(uncacheable.key(self.request(f"/uncacheable/{kind}/"))) is PASS

    def test_concurrent_requests_for_an_uncacheable_page_do_not_queue(self) -> None:
        Client().get("/uncacheable/private/?together")  # learns the URL, stores PASS
        site.together = threading.Barrier(4)  # the four render at once, or none finishes
        try:
            run_together(4, lambda: Client().get("/uncacheable/private/?together"))
        finally:
            site.together = None
        assert site.runs == ["private"] * 5

    def test_template_responses_are_rendered_before_caching(self, client: Client) -> None:
        assert client.get("/templated/").content == b"hello ann #1"
        assert client.get("/templated/").content == b"hello ann #1"
        assert site.runs == ["templated"]

    def test_authorization_makes_the_page_vary_on_it(self, client: Client) -> None:
        response = client.get("/page/1/", headers={"Authorization": "Bearer a"})
        assert response["Vary"] == "Authorization"
        assert client.get("/page/1/", headers={"Authorization": "Bearer b"}).content == (
            b"page 1 #2"
        )

    def test_timeout_none_is_cache_middleware_seconds(self, client: Client) -> None:
        with override_settings(CACHE_MIDDLEWARE_SECONDS=42):
            assert client.get("/default/")["Cache-Control"] == "max-age=42"
            assert client.get("/default/").content == b"default #1"
            # A response's own max-age=0 means "do not cache" (cache_page(None) too).
            assert client.get("/default/?max-age=0")["Cache-Control"] == "max-age=0"
            assert client.get("/default/?max-age=0").content == b"default #3"
            # A shorter max-age is kept in the header (Django's patch_cache_control).
            assert client.get("/default/?max-age=5")["Cache-Control"] == "max-age=5"

    def test_timeout_zero_sets_the_headers_and_stores_nothing(self, client: Client) -> None:
        assert client.get("/never/")["Cache-Control"] == "max-age=0"
        assert client.get("/never/").content == b"never #2"

    def test_key_prefix_and_cache_alias(self, client: Client, cache: Any) -> None:
        client.get("/shop/")
        request = self.request("/shop/")
        assert shop.key(request).startswith("views.decorators.cache.cache_page.mcpatterns.shop.")
        assert client.get("/shop/").content == b"shop #1"
        client.get("/elsewhere/")
        assert client.get("/elsewhere/").content == b"elsewhere #2"
        key = elsewhere.key(self.request("/elsewhere/"))
        assert caches["other"].get(key) is not None
        assert cache.get(key) is None

    def test_class_based_views(self, client: Client) -> None:
        assert client.get("/class/").content == client.get("/class/").content == b"class #1"

    def test_invalidate_and_mark_stale(self, client: Client, cache: Any) -> None:
        request = self.request("/page/1/")
        assert page.invalidate(request) is False
        assert page.mark_stale(request) is False
        client.get("/page/1/")
        client.head("/page/1/")
        assert page.invalidate(request) is True
        assert client.get("/page/1/").content == b"page 1 #2"
        assert page.mark_stale(request) is True
        # Someone else is re-rendering it: this request is served the stale page.
        held = cache.make_key(page.key(request))
        hold_recompute(cache.store, held)
        assert client.get("/page/1/").content == b"page 1 #2"
        drop_recompute(cache.store, held)
        assert client.get("/page/1/").content == b"page 1 #3"
        assert client.get("/page/1/").content == b"page 1 #3"

    def test_a_stale_page_is_served_with_its_true_age(self, client: Client, cache: Any) -> None:
        client.get("/page/1/")
        key = page.key(self.request("/page/1/"))
        # A page rendered 100 s ago by its clock: Expires 40 s in the past.
        old = CachedPage(
            200,
            (("Content-Type", "text/plain"), ("Cache-Control", "max-age=60")),
            b"old",
        )
        old = dataclasses.replace(
            old, headers=(*old.headers, ("Expires", http_date(time.time() - 40)))
        )
        cache.set(key, old, 60)
        response = client.get("/page/1/")
        assert response.content == b"old"
        assert int(response["Age"]) in (100, 101)  # older than max-age: stale downstream too

    def test_a_foreign_value_under_a_page_key_raises(self, client: Client, cache: Any) -> None:
        client.get("/page/1/")
        cache.set(page.key(self.request("/page/1/")), "not a page", 60)
        with pytest.raises(EncodingError, match="not a page"):
            client.get("/page/1/")

    def test_signals(self, client: Client, cache: Any) -> None:
        with received(signals.recomputed) as first:
            client.get("/page/1/")
        # The URL's first render is signalled under its header-list key.
        (call,) = first
        assert call["reason"] == "miss"
        assert call["key"].startswith(cache.make_key("views.decorators.cache.cache_header."))
        request = self.request("/page/1/")
        page.mark_stale(request)
        held = cache.make_key(page.key(request))
        hold_recompute(cache.store, held)
        with received(signals.stale_served) as stale:
            client.get("/page/1/")
        assert [c["key"] for c in stale] == [cache.make_key(page.key(request))]
        drop_recompute(cache.store, held)
        with received(signals.recomputed) as again:
            client.get("/page/1/")
        assert [(c["key"], c["reason"]) for c in again] == [
            (cache.make_key(page.key(request)), "stale")
        ]

    def test_a_failing_view_keeps_the_stale_page(self, client: Client) -> None:
        first = client.get("/slow/")
        slow.mark_stale(self.request("/slow/"))
        site.fail = True
        with received(signals.compute_failed) as failed:
            assert client.get("/slow/").content == first.content
        assert isinstance(failed[0]["error"], RuntimeError)
        with pytest.raises(RuntimeError):
            client.get("/slow/?cold")  # nothing to serve

    # -- stampede_guard: real threads --

    def test_threads_on_a_stale_page_run_the_view_once(self) -> None:
        old = Client().get("/slow/").content
        slow.mark_stale(self.request("/slow/"))
        with received(signals.stale_served) as stale:

            def until_the_others_are_served() -> None:  # the recompute outlasts them all
                for _ in range(3000):
                    if len(stale) >= THREADS - 1:
                        return
                    time.sleep(0.01)

            site.hold = until_the_others_are_served
            try:
                pages = run_together(THREADS, lambda: Client().get("/slow/").content)
            finally:
                site.hold = None
        assert site.runs == ["slow", "slow"]  # the warm-up and one recompute
        assert pages.count(b"slow #2") == 1  # the winner's own page
        assert pages.count(old) == THREADS - 1  # everyone else at once, stale
        assert len(stale) == THREADS - 1

    def test_threads_on_a_new_url_run_the_view_once(self) -> None:
        with received(signals.lock_waited) as waited:
            pages = run_together(THREADS, lambda: Client().get("/slow/").content)
        assert site.runs == ["slow"]
        assert pages == [b"slow #1"] * THREADS
        assert len(waited) == THREADS - 1  # everyone else waited for that one rendering
        assert Client().get("/slow/").content == b"slow #1"

    def test_threads_on_an_expired_page_of_a_known_url_run_the_view_once(self, cache: Any) -> None:
        Client().get("/slow/")
        cache.delete(slow.key(self.request("/slow/")))  # the page went, its header list stays
        pages = run_together(THREADS, lambda: Client().get("/slow/").content)
        assert site.runs == ["slow", "slow"]
        assert pages == [b"slow #2"] * THREADS

    # -- stampede_guard: configuration --

    def test_configuration_errors(self) -> None:
        with pytest.raises(ConfigurationError, match="runner"):
            stampede_guard(60, policy=StampedePolicy(runner=lambda job: None))
        for bad in (-1, 1.5, "60", True):
            with pytest.raises(ConfigurationError, match="timeout"):
                stampede_guard(bad)  # type: ignore[arg-type]

        async def view(request: HttpRequest) -> HttpResponse:
            raise AssertionError

        # An async view gets an async guard (tests/django/test_async_decorators.py).
        assert iscoroutinefunction(stampede_guard(60)(view))
        with pytest.raises(TypeError, match="method_decorator"):
            page(object(), 1)  # type: ignore[arg-type]

    def test_a_cache_without_stampede_protection_is_refused(self) -> None:
        locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
        with (
            override_settings(CACHES={"default": locmem}),
            pytest.raises(ImproperlyConfigured, match="no stampede protection"),
        ):
            Client().get("/page/1/")

    def test_the_caches_background_runner_is_not_used_for_pages(self, cache: Any) -> None:
        ran: list[Any] = []
        cache.stampede_policy = StampedePolicy(runner=ran.append)
        try:
            Client().get("/page/1/")
            page.mark_stale(self.request("/page/1/"))
            assert Client().get("/page/1/").content == b"page 1 #2"
        finally:
            del cache.stampede_policy
        assert ran == []

    # -- cached: functions --

    def test_cached_function(self, cache: Any) -> None:
        runs: list[tuple[Any, ...]] = []

        @cached(60)
        def total(year: int, region: str = "eu", *rest: Any, **options: Any) -> int:
            runs.append((year, region, rest, options))
            return year * 2

        assert total(2024) == total(2024, "eu") == total(year=2024, region="eu") == 4048
        assert len(runs) == 1
        total(2024, "us")
        total(2024, "eu", 1, flag=True)
        assert len(runs) == 3
        key = total.key(2024)
        assert key == f'{__name__}.{total.__qualname__}(2024,"eu",(),{{}})'
        assert cache.get(key) == 4048
        assert cache.get_envelope(key).soft_expiry == pytest.approx(time.time() + 60, abs=2)
        assert total.__name__ == "total"
        assert total.original(1) == 2

    def test_cached_helpers(self, cache: Any) -> None:
        runs: list[int] = []

        @cached(60)
        def square(n: int) -> int:
            runs.append(n)
            return n * n + len(runs)

        assert square(3) == 10
        assert square.refresh(3) == 11  # computed and stored now
        assert square(3) == 11
        assert square.invalidate(3) is True
        assert square.invalidate(3) is False
        assert square(3) == 12
        assert cache.mark_stale(square.key(3))  # soft invalidation: served while recomputed
        assert square(3) == 13
        assert runs == [3, 3, 3, 3]

    def test_cached_timeouts_follow_django(self, cache: Any) -> None:
        @cached()
        def default() -> str:
            return "d"

        @cached(None)
        def forever() -> str:
            return "f"

        @cached(0)
        def uncached() -> list[int]:
            return []

        default(), forever(), uncached()
        assert cache.get_envelope(default.key()).soft_expiry == pytest.approx(
            time.time() + 300, abs=2
        )
        assert cache.get_envelope(forever.key()).soft_expiry == float("inf")
        assert cache.get(uncached.key()) is None
        assert uncached() is not uncached()

    def test_cached_caches_none(self) -> None:
        runs: list[int] = []

        @cached(60)
        def nothing() -> None:
            runs.append(1)

        assert nothing() is None
        assert nothing() is None
        assert runs == [1]

    def test_cached_methods_key_each_instance_apart(self) -> None:
        runs: list[tuple[str, int]] = []

        class Report:
            def __init__(self, name: str) -> None:
                self.name = name

            def __cache_key__(self) -> str:
                return self.name

            @cached(60)
            def total(self, year: int) -> str:
                runs.append((self.name, year))
                return f"{self.name} {year}"

            @cached(60, key=lambda self, year: year)
            def shared(self, year: int) -> str:
                runs.append((self.name, year))
                return f"{self.name} {year}"

            @staticmethod
            @cached(60)
            def static(year: int) -> int:
                return year

        a, b, a_again = Report("a"), Report("b"), Report("a")
        assert a.total(1) == "a 1"
        assert b.total(1) == "b 1"  # not a's result
        assert a_again.total(1) == "a 1"  # an equal instance (same __cache_key__) shares it
        assert runs == [("a", 1), ("b", 1)]
        assert a.total.key(1) == Report.total.key(a, 1) != b.total.key(1)
        assert a.shared(1) == b.shared(1) == "a 1"  # key= decides: shared on purpose
        assert a.total.invalidate(1) is True
        assert b.total(1) == "b 1"  # b's entry untouched
        assert a.total(1) == "a 1"
        assert b.total.refresh(1) == "b 1"
        assert a.total.original(2) == "a 2"
        assert Report.static(5) == 5
        assert Report.static.key(5).endswith("static(5)")

    def test_cached_methods_of_unkeyable_instances_raise_instead_of_sharing(self) -> None:
        class Service:
            @cached(60)
            def lookup(self, name: str) -> str:
                return name

        with pytest.raises(TypeError, match="__cache_key__"):
            Service().lookup("x")

    def test_cached_methods_of_model_instances_key_by_primary_key(self) -> None:
        class Meta:
            label_lower = "shop.product"

        class Product:
            _meta = Meta()

            def __init__(self, pk: int) -> None:
                self.pk = pk

            @cached(60)
            def price(self) -> int:
                return self.pk * 10

        assert Product(1).price() == 10
        assert Product(2).price() == 20
        assert Product(1).price.key().endswith("price(shop.product:1)")

    def test_cached_keys_are_valid_for_any_argument(self, cache: Any) -> None:
        @cached(60)
        def echo(value: Any) -> Any:
            return value

        for value in ("a b", "é" * 300, b"\x00" * 10, "x" * 500, ("nested", ["list"], {1: 2})):
            assert echo(value) == value
            assert echo.key(value).startswith(f"{__name__}.")
            cache.make_and_validate_key(echo.key(value))
        assert "#" in echo.key("a b")  # unsafe characters: hashed
        assert "#" not in echo.key("ab")

    def test_cached_refuses_arguments_it_cannot_key(self) -> None:
        @cached(60)
        def describe(thing: Any) -> str:
            return str(thing)

        with pytest.raises(TypeError, match="key=callable"):
            describe(object())

        @cached(60, key=lambda thing: type(thing).__name__)
        def by_type(thing: Any) -> str:
            return type(thing).__name__

        assert by_type(object()) == "object"
        with pytest.raises(TypeError, match="parentheses"):
            cached(by_type)

        @cached(60)
        async def coroutine() -> None:
            pass

        # A coroutine function gets the async forms (tests/django/test_async_decorators.py).
        assert iscoroutinefunction(coroutine)
        with pytest.raises(TypeError, match="arefresh"):
            coroutine.refresh()

    def test_cached_with_a_background_runner(self, cache: Any) -> None:
        jobs: list[Callable[[], None]] = []
        runs: list[int] = []

        @cached(60, policy=StampedePolicy(runner=jobs.append))
        def value() -> int:
            runs.append(1)
            return len(runs)

        assert value() == 1
        cache.mark_stale(value.key())
        assert value() == 1  # stale, at once: the recompute is queued
        jobs.pop()()
        assert value() == 2

    def test_cached_signals(self, cache: Any) -> None:
        @cached(60)
        def value(n: int) -> int:
            return n

        with received(signals.recomputed) as recomputed:
            value(1)
        assert [(c["key"], c["reason"]) for c in recomputed] == [
            (cache.make_key(value.key(1)), "miss")
        ]
        cache.mark_stale(value.key(1))
        hold_recompute(cache.store, cache.make_key(value.key(1)))
        with received(signals.stale_served) as stale:
            value(1)
        assert len(stale) == 1

    def test_threads_on_a_stale_value_compute_it_once(self, cache: Any) -> None:
        runs: list[int] = []

        @cached(60)
        def report() -> int:
            runs.append(1)
            time.sleep(SLOW)
            return len(runs)

        assert report() == 1
        cache.mark_stale(report.key())
        results = run_together(THREADS, report)
        assert runs == [1, 1]
        assert sorted(results) == [1] * (THREADS - 1) + [2]

    # -- cached: namespaces --

    def test_cached_in_a_namespace(self, cache: Any) -> None:
        runs: list[tuple[int, str]] = []

        @cached(60, namespace=lambda user, field: ("user", user))
        def profile(user: int, field: str) -> str:
            runs.append((user, field))
            return f"{user}.{field} #{len(runs)}"

        @cached(60, namespace="catalog")
        def product(sku: str) -> str:
            runs.append((0, sku))
            return sku

        assert profile(1, "name") == profile(1, "name") == "1.name #1"
        assert profile(2, "name") == "2.name #2"
        assert profile.key(1, "name") == f'{profile._name}(1,"name")'
        cache.invalidate_namespace("user", 1)  # O(1): user 1's entries only
        assert profile(1, "name") == "1.name #3"
        assert profile(2, "name") == "2.name #2"
        assert profile.invalidate(2, "name") is True
        assert profile(2, "name") == "2.name #4"
        assert profile.refresh(2, "name") == "2.name #5"
        assert profile(2, "name") == "2.name #5"
        assert product("x") == product("x") == "x"
        cache.namespace("catalog").invalidate()
        product("x")
        assert runs.count((0, "x")) == 2


class TestThreeServers(DecoratorsContract):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)

    def test_requests_per_page(self, deployment: Deployment, cache: Any) -> None:
        """What memcached answers for a page, per path (documented in docs/stampede.md)."""
        servers = deployment.require_servers()
        client = Client()

        def requests(url: str = "/page/1/") -> int:
            before = server_requests(servers)
            client.get(url)
            return server_requests(servers) - before

        # A new URL: read the header list; its stampede over meta (mg + the placeholder's
        # add, won; the fill by cas), set header list.
        assert requests() == 5
        assert requests() == 3  # fresh: header list, page (mg + the refused add: 1 round trip)
        request = self.request("/page/1/")
        page.mark_stale(request)
        held = cache.make_key(page.key(request))
        hold_recompute(cache.store, held)
        assert requests() == 3  # stale, another holds W: header list, mg (Z) + refused add
        drop_recompute(cache.store, held)
        # The stale winner (W): header list, mg + refused add, the fill by cas, header list.
        assert requests() == 5
        assert site.runs == ["page 1", "page 1"]

    def test_requests_per_cached_call(self, deployment: Deployment) -> None:
        servers = deployment.require_servers()

        @cached(60)
        def value() -> int:
            return 1

        before = server_requests(servers)
        value()
        cold = server_requests(servers) - before
        value()
        # Cold over meta: mg + the placeholder's add (won), then the fill by its cas.
        # Fresh: mg + the refused add, one round trip.
        assert (cold, server_requests(servers) - before - cold) == (3, 2)


class TestEmbedded(DecoratorsContract):
    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded("decorators")


# -- call keys ------------------------------------------------------------------------------

leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.decimals(allow_nan=False)
    | st.datetimes()
    | st.uuids()
)
arguments = st.recursive(
    leaves,
    lambda inner: st.lists(inner) | st.tuples(inner, inner) | st.dictionaries(st.text(), inner),
    max_leaves=20,
)


@settings(max_examples=50, deadline=None)
@given(st.lists(arguments, max_size=4))
def test_call_keys_are_always_valid_memcached_keys(args: list[Any]) -> None:
    key = call_key("app.module.function", tuple(args))
    assert len(key) <= MAX_READABLE
    key_bytes(key)
    assert key == call_key("app.module.function", tuple(args))


def test_call_keys_tell_types_apart() -> None:
    values = [1, 1.0, True, "1", b"1", Decimal(1), (1,), [1], {1}, {1: 1}, None, "None"]
    assert len({encode(v) for v in values}) == len(values)
    assert encode({"b": 1, "a": 2}) == encode({"a": 2, "b": 1})
    assert encode({3, 1, 2}) == encode({2, 3, 1})


def test_call_keys_of_model_instances_are_label_and_primary_key() -> None:
    class Meta:
        label_lower = "shop.product"

    class Product:
        _meta = Meta()

        def __init__(self, pk: int | None) -> None:
            self.pk = pk

    assert encode(Product(42)) == "shop.product:42"
    with pytest.raises(TypeError, match="unsaved"):
        encode(Product(None))


def _django_keys_empty_apart_from_absent() -> bool:
    absent = RequestFactory().get("/")
    empty = RequestFactory().get("/", HTTP_X_VARIANT="")
    headers = ["HTTP_X_VARIANT"]
    return _generate_cache_key(absent, "GET", headers, "") != _generate_cache_key(
        empty, "GET", headers, ""
    )
