"""The debug toolbar's PatternsPanel, rendered by the toolbar on a real page over memcached."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings

from tests.harness import MemcachedServer
from tests.links import broken, served_by_django

pytestmark = pytest.mark.usefixtures("reset_shared_stores")


def page(request: HttpRequest) -> HttpResponse:
    cache = caches["default"]
    cache.sadd("tags", "red", "green")
    members = cache.smembers("tags")
    answer = cache.get_or_compute("answer", lambda: 42, timeout=60)
    cache.get("plain-key")
    return HttpResponse(f"<html><body><p>{sorted(members)} {answer}</p></body></html>")


def orm_page(request: HttpRequest) -> HttpResponse:
    from django_mcpatterns.orm.observe import record

    record("hit", "shop.product", 2)  # what the ORM cache's reader records for cached reads
    record("miss", "shop.product")
    return HttpResponse("<html><body><p>orm</p></body></html>")


async def apage(request: HttpRequest) -> HttpResponse:
    cache = caches["default"]
    await cache.asadd("tags", "red", "green")
    members = await cache.asmembers("tags")
    answer = await cache.aget_or_compute("answer", lambda: 42, timeout=60)
    await cache.aget("plain-key")
    return HttpResponse(f"<html><body><p>{sorted(members)} {answer}</p></body></html>")


# Installed last: override_settings installs apps before it applies the other settings.
TOOLBAR_APPS = ["django.contrib.staticfiles", "django_mcpatterns", "debug_toolbar"]
TOOLBAR_SETTINGS = {
    "MIDDLEWARE": ["debug_toolbar.middleware.DebugToolbarMiddleware"],
    "ROOT_URLCONF": "tests.django.toolbar_urls",  # imports the toolbar: once it is installed
    "TEMPLATES": [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}],
    "STATIC_URL": "/static/",
    "DEBUG": True,
    "INTERNAL_IPS": ["127.0.0.1"],
    "DEBUG_TOOLBAR_PANELS": ["django_mcpatterns.debug_toolbar.PatternsPanel"],
    # Panels rendered into the page (not fetched later), and on although tests are running.
    "DEBUG_TOOLBAR_CONFIG": {"RENDER_PANELS": True, "IS_RUNNING_TESTS": False},
}


@pytest.fixture
def toolbar_site(memcached_3: list[MemcachedServer]) -> Iterator[None]:
    for server in memcached_3:
        server.flush()
    location = [server.spec for server in memcached_3]
    backend = "django_mcpatterns.backend.KetamaMemcacheCache"
    caches_setting = {"default": {"BACKEND": backend, "LOCATION": location}}
    with (
        override_settings(CACHES=caches_setting, **TOOLBAR_SETTINGS),
        override_settings(INSTALLED_APPS=TOOLBAR_APPS),
    ):
        yield


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


@pytest.mark.usefixtures("toolbar_site")
def test_the_panel_lists_pattern_calls_and_their_round_trips() -> None:
    response = Client().get("/page/", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200
    html = response.content.decode()
    assert "['green', 'red'] 42" in html  # the page itself
    assert "djDebug" in html  # the toolbar was injected
    calls = re.findall(r'<tr class="mcpatterns-call">(.*?)</tr>', html, re.S)
    names = [re.search(r"cache\.(\w+)", call).group(1) for call in calls]  # type: ignore[union-attr]
    assert names == ["sadd", "smembers", "get_or_compute"]
    assert "&#x27;tags&#x27;" in calls[0]  # the key, escaped by the template
    assert "set of 2" in text(calls[1])  # the result, summarised
    # Each call's round trips follow it: server, command, outcome, time.
    trips = re.findall(r'<tr class="mcpatterns-trip">(.*?)</tr>', html, re.S)
    assert any("127.0.0.1:" in trip and "hit" in trip for trip in trips)
    plain = html.split('class="mcpatterns-plain"')[1]
    assert "get :1:plain-key" in text(plain)  # Django's own get, not a pattern call
    assert "miss" in plain
    # Totals in the toolbar's nav: N calls, M round trips in T ms.
    nav = re.search(r"(\d+) calls, (\d+) round trips in [\d.]+ ms", html)
    assert nav is not None
    assert int(nav.group(1)) == 3
    assert int(nav.group(2)) == len(trips) >= 4


@pytest.mark.usefixtures("toolbar_site")
def test_requests_without_the_toolbar_record_nothing() -> None:
    Client().get("/page/", REMOTE_ADDR="127.0.0.1")  # the toolbar adds its sink
    # Outside a request the panel enabled, the sink records nothing and costs a lookup.
    from django_mcpatterns.debug_toolbar import _recording

    assert _recording.get() is None
    assert caches["default"].sismember("tags", "red") is True


@pytest.mark.usefixtures("toolbar_site")
def test_the_panel_lists_the_calls_of_an_async_view() -> None:
    from django.test import AsyncClient

    async def fetch() -> HttpResponse:
        response: HttpResponse = await AsyncClient().get("/apage/", REMOTE_ADDR="127.0.0.1")
        return response

    response = asyncio.run(fetch())
    assert response.status_code == 200
    html = response.content.decode()
    assert "['green', 'red'] 42" in html
    calls = re.findall(r'<tr class="mcpatterns-call">(.*?)</tr>', html, re.S)
    names = [re.search(r"cache\.(\w+)", call).group(1) for call in calls]  # type: ignore[union-attr]
    assert names == ["asadd", "asmembers", "aget_or_compute"]
    trips = re.findall(r'<tr class="mcpatterns-trip">(.*?)</tr>', html, re.S)
    assert len(trips) >= 4
    plain = html.split('class="mcpatterns-plain"')[1]
    assert "get :1:plain-key" in text(plain)
    nav = re.search(r"(\d+) calls, (\d+) round trips in [\d.]+ ms", html)
    assert nav is not None
    assert int(nav.group(1)) == 3


@pytest.mark.usefixtures("toolbar_site")
def test_the_panel_counts_the_requests_orm_cache_events() -> None:
    response = Client().get("/orm/", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200
    html = text(response.content.decode())
    assert "ORM cache" in html
    assert "shop.product 2 1 0 0 0" in html  # hits, misses, not stored, bypassed, renewed


@pytest.mark.usefixtures("toolbar_site")
def test_every_link_of_the_page_with_the_panel_is_served() -> None:
    """The panel names the operations documentation; it links nowhere the site does not serve."""
    html = Client().get("/page/", REMOTE_ADDR="127.0.0.1").content.decode()
    assert "“Metrics and traces” in the operations documentation" in html
    assert "docs/operations.md" not in html
    assert broken(html, "/page/", served_by_django) == []
