"""Flask: ``@ratelimit(cache, rate, key=...)`` and ``cache.cache.counter`` on both backends."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask, g
from flask_caching import Cache

from django_mcpatterns.flask import ratelimit
from tests.harness import MemcachedServer

CLUSTER = "django_mcpatterns.flask.KetamaMemcachedCache"
EMBEDDED = "django_mcpatterns.flask.LocMemPatternsCache"


@pytest.fixture(params=["embedded", "memcached"])
def app_cache(request: pytest.FixtureRequest, memcached_1: list[MemcachedServer]) -> Any:
    app = Flask(__name__)
    config: dict[str, Any] = {"CACHE_TYPE": EMBEDDED}
    if request.param == "memcached":
        memcached_1[0].flush()
        config = {"CACHE_TYPE": CLUSTER, "CACHE_MEMCACHED_SERVERS": [memcached_1[0].spec]}
    cache = Cache(app, config=config)
    return app, cache


def test_flask_ratelimit_answers_429_with_retry_after(app_cache: Any) -> None:
    app, cache = app_cache
    marks: list[bool] = []

    @app.route("/form", methods=["GET", "POST"])
    @ratelimit(cache, "2/m", methods=("POST",))
    def form() -> str:
        return "ok"

    @app.route("/soft")
    @ratelimit(cache, "1/m", key="header:X-Api-Key", block=False)
    def soft() -> str:
        marks.append(g.ratelimited)
        return "ok"

    client = app.test_client()
    assert [client.post("/form").status_code for _ in range(3)] == [200, 200, 429]
    refused = client.post("/form")
    assert 1 <= int(refused.headers["Retry-After"]) <= 66
    assert client.get("/form").status_code == 200  # only POSTs are counted
    assert [client.get("/soft", headers={"X-Api-Key": "a"}).status_code for _ in range(2)] == [
        200,
        200,
    ]
    assert marks == [False, True]


def test_flask_counter(app_cache: Any) -> None:
    _, cache = app_cache
    rows = [1]
    counter = cache.cache.counter("rows", lambda: len(rows))
    assert counter.get() == 1
    with counter.change(+2):
        rows += [2, 3]
    assert counter.get() == 3
