"""``stampede_guard``: Flask views cached with soft expiry, through Flask's test client.

The stampede itself (one recomputing winner, waiting on a cold miss) is proven
in ``tests/core``; here a competing worker is simulated deterministically by
holding the page's recompute lock, as another process would.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask import Flask, Response, make_response, request
from flask_caching import Cache

from django_mcpatterns.core.exceptions import ConfigurationError
from django_mcpatterns.core.stampede import StampedePolicy, lock_key
from django_mcpatterns.flask import CachedPage, stampede_guard
from tests.flask.conftest import PREFIX, FlaskDeployment, deployments

deployment = deployments("cluster3", "embedded")


@pytest.fixture
def app_cache(deployment: FlaskDeployment) -> tuple[Flask, Cache]:
    return deployment.make_app(CACHE_DEFAULT_TIMEOUT=60)


@pytest.fixture
def calls() -> list[str]:
    return []


@pytest.fixture
def client(app_cache: tuple[Flask, Cache], calls: list[str]) -> Iterator[Any]:
    """A test client for an app with a few guarded views that count their runs."""
    app, cache = app_cache

    @app.route("/report/<int:n>", methods=["GET", "POST"])
    @stampede_guard(cache, timeout=60)
    def report(n: int) -> Any:
        calls.append(f"report {n}")
        return {"n": n, "run": len(calls)}

    @app.route("/search")
    @stampede_guard(cache, query_string=True)
    def search() -> str:
        calls.append("search")
        return f"{request.args.get('q')} #{len(calls)}"

    @app.route("/missing")
    @stampede_guard(cache)
    def missing() -> Any:
        calls.append("missing")
        return "not here", 404

    @app.route("/cookie")
    @stampede_guard(cache)
    def cookie() -> Response:
        calls.append("cookie")
        response = make_response("hello")
        response.set_cookie("visitor", "ann")
        return response

    @app.route("/forever")
    @stampede_guard(cache, timeout=0)
    def forever() -> str:
        calls.append("forever")
        return "kept"

    @app.route("/with space")
    @stampede_guard(cache)
    def spaced() -> str:
        calls.append("spaced")
        return "spaced"

    with app.test_client() as test_client:
        yield test_client


def test_a_page_is_rendered_once(client: Any, calls: list[str]) -> None:
    first = client.get("/report/1")
    second = client.get("/report/1")
    assert first.status_code == second.status_code == 200
    assert first.json == second.json == {"n": 1, "run": 1}
    assert second.headers["Content-Type"] == "application/json"
    assert client.get("/report/2").json == {"n": 2, "run": 2}
    assert calls == ["report 1", "report 2"]


def test_head_is_served_from_the_cache(client: Any, calls: list[str]) -> None:
    client.get("/report/1")
    head = client.head("/report/1")
    assert head.status_code == 200
    assert head.data == b""
    assert calls == ["report 1"]


def test_other_methods_are_not_cached(client: Any, calls: list[str]) -> None:
    client.post("/report/1")
    client.post("/report/1")
    assert calls == ["report 1", "report 1"]


def test_query_string_is_part_of_the_key(client: Any, calls: list[str]) -> None:
    assert client.get("/search?q=a&page=2").text == "a #1"
    assert client.get("/search?page=2&q=a").text == "a #1"
    assert client.get("/search?q=b").text == "b #2"


def test_uncacheable_responses_are_not_stored(client: Any, calls: list[str]) -> None:
    for _ in range(2):
        assert client.get("/missing").status_code == 404
        assert client.get("/cookie").headers["Set-Cookie"].startswith("visitor=ann")
    assert calls == ["missing", "cookie", "missing", "cookie"]


def test_an_invalid_key_renders_every_time(client: Any, calls: list[str]) -> None:
    assert client.get("/with space").text == "spaced"
    assert client.get("/with space").text == "spaced"
    assert calls == ["spaced", "spaced"]


def test_timeouts_follow_flask_caching(
    client: Any, app_cache: tuple[Flask, Cache], deployment: FlaskDeployment
) -> None:
    app, cache = app_cache
    client.get("/forever")
    client.get("/report/1")
    with app.app_context():
        assert cache.cache.get_envelope("view//forever").soft_expiry == math.inf
        report = cache.cache.get_envelope("view//report/1")
        assert report.hard_expiry - report.soft_expiry == pytest.approx(60)  # grace: the timeout
    if deployment.has_servers:
        assert deployment.ttl(PREFIX + "view//forever") == -1


def test_a_stale_page_is_served_while_another_worker_recomputes(
    client: Any, app_cache: tuple[Flask, Cache], calls: list[str]
) -> None:
    app, cache = app_cache
    client.get("/report/1")
    report = app.view_functions["report"]
    with app.app_context():
        assert report.mark_stale("/report/1")
        # Another worker won the recompute lock and is rendering the page.
        cache.cache.store.add(lock_key(PREFIX + report.key("/report/1")), b"other", 30)
    assert client.get("/report/1").json == {"n": 1, "run": 1}  # stale, at once
    assert calls == ["report 1"]


def test_mark_stale_recomputes_once_and_invalidate_deletes(
    client: Any, app_cache: tuple[Flask, Cache], calls: list[str]
) -> None:
    app, _ = app_cache
    client.get("/report/1")
    report = app.view_functions["report"]
    assert report.original.__name__ == "report"
    with app.app_context():
        assert report.mark_stale("/report/1") is True
    assert client.get("/report/1").json["run"] == 2
    assert client.get("/report/1").json["run"] == 2
    with app.app_context():
        assert report.invalidate("/report/1") is True
        assert report.invalidate("/report/1") is False
    assert client.get("/report/1").json["run"] == 3


def test_concurrent_cold_requests_render_once(
    app_cache: tuple[Flask, Cache], deployment: FlaskDeployment
) -> None:
    app, cache = app_cache
    started: list[int] = []

    @app.route("/slow")
    @stampede_guard(cache, policy=StampedePolicy(wait=5))
    def slow() -> str:
        started.append(1)
        time.sleep(0.3)
        return "slow page"

    def fetch(_: int) -> str:
        with app.test_client() as own:
            return own.get("/slow").text

    with ThreadPoolExecutor(4) as pool:
        pages = list(pool.map(fetch, range(4)))
    assert pages == ["slow page"] * 4
    assert started == [1]


def test_a_policy_with_a_runner_is_refused(app_cache: tuple[Flask, Cache]) -> None:
    _, cache = app_cache
    with pytest.raises(ConfigurationError, match="runner"):
        stampede_guard(cache, policy=StampedePolicy(runner=lambda job: None))


def test_cached_page_round_trip() -> None:
    response = Response(b"body", status=201, headers={"X-Answer": "42"})
    page = CachedPage.of(response)
    again = page.response()
    assert (again.status_code, again.get_data(), again.headers["X-Answer"]) == (201, b"body", "42")
