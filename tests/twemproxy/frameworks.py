"""A cache through nutcracker as Django or Flask users configure it (shared fixture body)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.core.cache import caches
from django.test import override_settings
from flask import Flask
from flask_caching import Cache

from tests.harness import Nutcracker

FRAMEWORKS = ["django", "flask"]


@contextmanager
def cache_through(
    nutcracker: Nutcracker, framework: str, options: Mapping[str, Any]
) -> Iterator[Any]:
    """Flush the proxy's servers, then yield a Django or Flask cache with ``options``."""
    nutcracker.flush()
    if framework == "django":
        backend = "django_mcpatterns.backend.KetamaMemcacheCache"
        setting = {"BACKEND": backend, "LOCATION": nutcracker.spec, "OPTIONS": dict(options)}
        with override_settings(CACHES={"default": setting}):
            yield caches["default"]
    else:
        app = Flask(__name__)
        app.config.update(
            CACHE_TYPE="django_mcpatterns.flask.KetamaMemcachedCache",
            CACHE_MEMCACHED_SERVERS=[nutcracker.spec],
            CACHE_OPTIONS=dict(options),
        )
        with app.app_context():
            yield Cache(app).cache
