"""Flask-Caching's own features on our backends, through Flask's test client.

``@cache.cached`` views, ``@cache.memoize`` with ``delete_memoized``, and the
Jinja ``{% cache %}`` tag must work unchanged: they rely on timeout 0 meaning
"never" (memoize's version keys), on ``has`` telling a cached ``None`` from a
miss, and on ``get_many``/``set_many``/``delete_many`` returning Flask-Caching's
shapes.  Each test runs on the 3-server cluster and on the embedded store.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask, render_template_string
from flask_caching import Cache
from flask_caching.utils import function_namespace

from tests.flask.conftest import PREFIX, FlaskDeployment, deployments

deployment = deployments("cluster3", "embedded")


@pytest.fixture
def app_cache(deployment: FlaskDeployment) -> Iterator[tuple[Flask, Cache]]:
    app, cache = deployment.make_app()
    with app.app_context():
        yield app, cache


def test_cached_view(app_cache: tuple[Flask, Cache]) -> None:
    app, cache = app_cache
    calls: list[str] = []

    @app.route("/page/<name>")
    @cache.cached(timeout=60)
    def page(name: str) -> str:
        calls.append(name)
        return f"{name} #{len(calls)}"

    client = app.test_client()
    assert client.get("/page/a").text == "a #1"
    assert client.get("/page/a").text == "a #1"
    assert client.get("/page/b").text == "b #2"
    assert calls == ["a", "b"]
    assert cache.cache.has("view//page/a")
    assert cache.delete("view//page/a")
    assert client.get("/page/a").text == "a #3"


def test_cached_view_with_query_string(app_cache: tuple[Flask, Cache]) -> None:
    app, cache = app_cache
    calls: list[str] = []

    @app.route("/search")
    @cache.cached(timeout=60, query_string=True)
    def search() -> str:
        calls.append("x")
        return f"search #{len(calls)}"

    client = app.test_client()
    assert client.get("/search?q=1&p=2").text == "search #1"
    assert client.get("/search?p=2&q=1").text == "search #1"  # same arguments, same page
    assert client.get("/search?q=2").text == "search #2"


def test_memoize_and_delete_memoized(app_cache: tuple[Flask, Cache]) -> None:
    _, cache = app_cache
    calls: list[tuple[int, int]] = []

    @cache.memoize(timeout=60)
    def add(a: int, b: int) -> int:
        calls.append((a, b))
        return a + b

    assert add(1, 2) == 3
    assert add(1, 2) == 3
    assert add(2, 2) == 4
    assert calls == [(1, 2), (2, 2)]
    cache.delete_memoized(add, 1, 2)  # one set of arguments
    assert add(1, 2) == 3
    assert add(2, 2) == 4
    assert calls == [(1, 2), (2, 2), (1, 2)]
    cache.delete_memoized(add)  # every call: memoize bumps its version key
    add(1, 2)
    add(2, 2)
    assert len(calls) == 5


def test_memoize_version_key_never_expires(
    app_cache: tuple[Flask, Cache], deployment: FlaskDeployment
) -> None:
    # delete_memoized(f) writes a new version key with timeout 0 (VERSION_TIMEOUT):
    # on memcached that must mean "never", not "expire now" as in Django.
    _, cache = app_cache

    @cache.memoize(timeout=60)
    def square(x: int) -> int:
        return x * x

    square(3)
    cache.delete_memoized(square)
    version_key = cache._memvname(function_namespace(square)[0])
    assert cache.cache.has(version_key)
    if deployment.has_servers:
        assert deployment.ttl(PREFIX + version_key) == -1
    else:
        deployment.advance(60 * 60 * 24 * 365)
        assert cache.cache.has(version_key)


def test_memoize_caches_none_with_has(app_cache: tuple[Flask, Cache]) -> None:
    _, cache = app_cache
    calls: list[int] = []

    @cache.memoize(timeout=60, cache_none=True)
    def nothing(x: int) -> None:
        calls.append(x)

    nothing(1)
    nothing(1)
    assert calls == [1]  # the cached None was found through has()


def test_jinja_cache_tag(app_cache: tuple[Flask, Cache]) -> None:
    app, _ = app_cache
    counter = iter(range(1, 100))
    template = "{% cache 60, 'sidebar', user %}sidebar {{ next(counter) }}{% endcache %}"

    @app.route("/<user>")
    def home(user: str) -> str:
        return render_template_string(template, counter=counter, next=next, user=user)

    client = app.test_client()
    assert client.get("/ann").text == "sidebar 1"
    assert client.get("/ann").text == "sidebar 1"
    assert client.get("/bob").text == "sidebar 2"
    deleting = "{% cache 'del', 'sidebar', user %}sidebar {{ next(counter) }}{% endcache %}"
    with app.test_request_context():
        assert render_template_string(deleting, counter=counter, next=next, user="ann") == (
            "sidebar 3"
        )
    assert client.get("/ann").text == "sidebar 4"


def test_cache_clear_through_the_extension(app_cache: tuple[Flask, Cache]) -> None:
    _, cache = app_cache
    cache.set("a", 1)
    assert cache.clear() is True
    assert cache.get("a") is None
