"""``handle_cache_unavailable(app)``: a lock whose server is down answers 503 in Flask.

On a port nobody listens on, and on a real memcached stalled (SIGSTOP) as in
the issue's drill: lock views answer 503, views whose writes degrade answer
200 and send the ``write_degraded`` blinker signal.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask_caching import Cache

from django_mcpatterns.core.exceptions import LockUnavailableError
from django_mcpatterns.flask import handle_cache_unavailable, signals
from tests.harness import LOOPBACK, MemcachedServer, free_port, memcached_cluster


def app_on_a_dead_server(server: str | None = None, **config: object) -> Flask:
    app = Flask(__name__)
    app.config.update(config)
    cache = Cache(
        app,
        config={
            "CACHE_TYPE": "django_mcpatterns.flask.KetamaMemcachedCache",
            "CACHE_MEMCACHED_SERVERS": [server or f"{LOOPBACK}:{free_port()}"],
            "CACHE_OPTIONS": {"timeout": 0.3, "connect_timeout": 0.3, "retry_timeout": 0.05},
        },
    )
    app.extensions["test_cache"] = cache

    @app.get("/writes")
    def writes() -> str:
        added = cache.cache.sadd("flask:set", "a", "b")
        pushed = cache.cache.rpush("flask:list", "x")
        return f"{added} {pushed}"

    @app.get("/async-writes")
    async def async_writes() -> str:
        added = await cache.cache.asadd("flask:set", "a")
        return f"{added}"

    @app.get("/locked")
    def locked() -> str:
        with cache.cache.lock("flask:lock", timeout=5):
            return "done"

    @app.get("/async-locked")
    async def async_locked() -> str:
        async with cache.cache.lock("flask:lock", timeout=5):
            return "done"

    @app.get("/broken")
    def broken() -> str:
        raise ValueError("not the cache's")

    return app


def test_a_lock_whose_server_is_down_answers_503_with_retry_after() -> None:
    app = handle_cache_unavailable(app_on_a_dead_server())
    client = app.test_client()
    for url in ("/locked", "/async-locked"):
        response = client.get(url)
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "1"
    assert client.get("/broken").status_code == 500


def test_retry_after_follows_the_config_and_the_error_is_a_lock_error() -> None:
    app = handle_cache_unavailable(app_on_a_dead_server(MCPATTERNS_RETRY_AFTER=5))
    assert app.test_client().get("/locked").headers["Retry-After"] == "5"
    bare = app_on_a_dead_server()
    bare.config["PROPAGATE_EXCEPTIONS"] = True
    with pytest.raises(LockUnavailableError):  # without the handler: a 500
        bare.test_client().get("/locked")


@pytest.fixture
def stalled() -> Iterator[MemcachedServer]:
    with memcached_cluster(1) as servers:
        yield servers[0]


def test_a_stalled_server_answers_503_for_locks_and_200_for_degraded_writes(
    stalled: MemcachedServer,
) -> None:
    # Before (the issue): 500s from cache.lock and cache.sadd raising NodeUnavailableError.
    app = handle_cache_unavailable(app_on_a_dead_server(stalled.spec))
    client = app.test_client()
    assert app.extensions["test_cache"].cache.set("flask:warm", 1)  # connected first
    degraded: list[dict[str, Any]] = []

    def heard(sender: Any, **kwargs: Any) -> None:
        degraded.append(kwargs)

    stalled.pause()
    try:
        with signals.write_degraded.connected_to(heard):
            writes = client.get("/writes")
            async_writes = client.get("/async-writes")
        locked = client.get("/locked")
    finally:
        stalled.resume()
    assert (writes.status_code, writes.text) == (200, "0 0")
    assert (async_writes.status_code, async_writes.text) == (200, "0")
    assert [d["command"] for d in degraded] == ["sadd", "rpush", "sadd"]
    assert locked.status_code == 503
    assert locked.headers["Retry-After"] == "1"
