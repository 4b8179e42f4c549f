"""``handle_cache_unavailable(app)``: a lock whose server is down answers 503 in Flask."""

from __future__ import annotations

import pytest
from flask import Flask
from flask_caching import Cache

from django_mcpatterns.core.exceptions import LockUnavailableError
from django_mcpatterns.flask import handle_cache_unavailable
from tests.harness import LOOPBACK, free_port


def app_on_a_dead_server(**config: object) -> Flask:
    app = Flask(__name__)
    app.config.update(config)
    cache = Cache(
        app,
        config={
            "CACHE_TYPE": "django_mcpatterns.flask.KetamaMemcachedCache",
            "CACHE_MEMCACHED_SERVERS": [f"{LOOPBACK}:{free_port()}"],
        },
    )

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
