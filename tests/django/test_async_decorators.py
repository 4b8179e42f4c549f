"""``stampede_guard`` on ``async def`` views and ``cached`` on coroutine functions.

Both run on the event loop through the async forms (``aget_or_compute``...):
concurrent tasks on a cold page or call run the view or function once, the
others wait for its value without blocking the loop, and the sync helpers
(``.key``, ``.invalidate``) still work on the async forms.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import iscoroutinefunction
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.template import engines
from django.template.response import TemplateResponse
from django.test import RequestFactory, override_settings

from django_mcpatterns.backend import LocMemPatternsCache
from django_mcpatterns.decorators import cached, stampede_guard
from tests.core.asyncio_tools import Ticker, loop_never_blocks
from tests.django.conftest import Deployment, DeploymentSuite
from tests.django.test_decorators import TEMPLATES

TASKS = 50


@pytest.fixture(autouse=True)
def _async_patterns_landed() -> None:
    if not hasattr(LocMemPatternsCache, "aget_or_compute"):
        pytest.skip("aget_or_compute (convstamp) is not on this branch yet")


class AsyncDecorators(DeploymentSuite):
    # -- cached ----------------------------------------------------------------

    def test_cached_coroutine_function_computes_once_for_concurrent_callers(self) -> None:
        calls: list[int] = []

        @cached(60)
        async def square(n: int) -> int:
            calls.append(n)
            await asyncio.sleep(0.05)  # the others arrive while this one computes
            return n * n

        assert iscoroutinefunction(square)

        async def run() -> list[int]:
            return await asyncio.gather(*(square(7) for _ in range(TASKS)))

        assert asyncio.run(run()) == [49] * TASKS
        assert calls == [7]
        assert asyncio.run(square(7)) == 49
        assert calls == [7]
        # The entry is the one the sync key names, and the helpers reach it.
        assert caches["default"].get(square.key(7)) == 49
        assert asyncio.run(square.ainvalidate(7)) is True
        assert asyncio.run(square(7)) == 49
        assert calls == [7, 7]
        assert asyncio.run(square.arefresh(7)) == 49
        assert calls == [7, 7, 7]

    def test_cached_coroutine_method_has_entries_per_instance(self) -> None:
        class Account:
            def __init__(self, pk: int) -> None:
                self.pk = pk

            def __cache_key__(self) -> int:
                return self.pk

            @cached(60)
            async def balance(self) -> int:
                return self.pk * 100

        async def run() -> tuple[int, int]:
            return await Account(1).balance(), await Account(2).balance()

        assert asyncio.run(run()) == (100, 200)
        assert asyncio.run(Account(2).balance.ainvalidate()) is True

    # -- stampede_guard ------------------------------------------------------------

    def test_async_view_renders_once_for_concurrent_requests(self) -> None:
        renders: list[str] = []

        @stampede_guard(60)
        async def page(request: HttpRequest) -> HttpResponse:
            renders.append(request.path)
            await asyncio.sleep(0.05)
            return HttpResponse(f"page #{len(renders)}")

        assert iscoroutinefunction(page)
        factory = RequestFactory()

        async def run() -> list[Any]:
            return await asyncio.gather(*(page(factory.get("/a")) for _ in range(TASKS)))

        responses = asyncio.run(run())
        assert {r.content for r in responses} == {b"page #1"}
        assert renders == ["/a"]
        # Cached afterwards, with cache_page's headers; HEAD is answered from it.
        again = asyncio.run(page(factory.get("/a")))
        assert again.content == b"page #1"
        assert "max-age=60" in again["Cache-Control"]
        head = asyncio.run(page(factory.head("/a")))
        assert head.content == b"page #1"
        assert renders == ["/a"]
        # The sync helpers work on the async view's pages.
        assert page.key(factory.get("/a")) is not None
        assert page.invalidate(factory.get("/a")) is True
        assert asyncio.run(page(factory.get("/a"))).content == b"page #2"
        # And their async forms, for async code.
        assert asyncio.run(page.amark_stale(factory.get("/a"))) is True
        assert asyncio.run(page.ainvalidate(factory.get("/a"))) is True
        assert asyncio.run(page.ainvalidate(factory.get("/a"))) is False
        assert asyncio.run(page(factory.get("/a"))).content == b"page #3"

    def test_async_view_uncacheable_responses_and_methods(self) -> None:
        renders: list[str] = []

        @stampede_guard(60)
        async def page(request: HttpRequest) -> HttpResponse:
            renders.append(request.method or "")
            response = HttpResponse("private")
            if request.GET.get("cookie"):
                response.set_cookie("session", "secret")
            return response

        factory = RequestFactory()
        for _ in range(2):
            asyncio.run(page(factory.post("/p")))
            asyncio.run(page(factory.get("/p", {"cookie": "1"})))
        assert renders == ["POST", "GET", "POST", "GET"]

    @override_settings(TEMPLATES=TEMPLATES)
    def test_async_view_template_response_is_rendered_and_cached(self) -> None:
        template = engines["django"].from_string("hello {{ name }}")
        renders: list[int] = []

        @stampede_guard(60)
        async def page(request: HttpRequest) -> TemplateResponse:
            renders.append(1)
            return TemplateResponse(request, template, {"name": "async"})

        factory = RequestFactory()
        assert asyncio.run(page(factory.get("/t"))).content == b"hello async"
        assert asyncio.run(page(factory.get("/t"))).content == b"hello async"
        assert renders == [1]

    def test_waiting_requests_do_not_block_the_loop(self) -> None:
        """While one task renders a slow page, the others wait without stalling the loop."""
        ticker = Ticker()

        @stampede_guard(60)
        async def slow(request: HttpRequest) -> HttpResponse:
            await ticker.reached(50)  # rendered once the loop ran another task 50 times
            return HttpResponse("slow")

        factory = RequestFactory()

        async def run() -> None:
            async with ticker:
                await asyncio.gather(*(slow(factory.get("/slow")) for _ in range(20)))

        with loop_never_blocks():
            asyncio.run(run())


class TestEmbedded(AsyncDecorators):
    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded("async-decorators")


class TestMemcached(AsyncDecorators):
    @pytest.fixture(autouse=True)
    def _async_cluster(self) -> None:
        import importlib.util

        if importlib.util.find_spec("django_mcpatterns.core.aio") is None:
            pytest.skip("the AsyncCluster (django_mcpatterns.core.aio) has not landed yet")

    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)
