"""What the Flask tests share: deployments under test, apps built as users build them.

A :class:`FlaskDeployment` is one backend configuration: the ketama cluster on
the session's memcached servers, or the embedded store with a fake clock.
Caches are made through Flask-Caching itself (``Cache(app, config=...)``), so
``CACHE_TYPE`` loading, the factory and the config keys are exercised on every
test.  Nothing here imports Django.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from flask import Flask
from flask_caching import Cache

from tests.fakes import FakeClock
from tests.harness import MemcachedServer, server_ttl

CLUSTER = "django_mcpatterns.flask.KetamaMemcachedCache"
EMBEDDED = "django_mcpatterns.flask.LocMemPatternsCache"
PREFIX = "flask_test_"


@dataclass
class FlaskDeployment:
    """One backend configuration the Flask suites run against."""

    cache_type: str
    servers: Sequence[MemcachedServer] = ()
    options: dict[str, Any] = field(default_factory=dict)
    clock: FakeClock | None = None

    @classmethod
    def cluster(cls, servers: Sequence[MemcachedServer], **options: Any) -> FlaskDeployment:
        return cls(CLUSTER, servers, options)

    @classmethod
    def embedded(cls, **options: Any) -> FlaskDeployment:
        # Unix time now: the embedded store's and the backend's clock.
        return cls(EMBEDDED, (), options, FakeClock(float(int(time.time()))))

    @property
    def has_servers(self) -> bool:
        return bool(self.servers)

    def config(self, **extra: Any) -> dict[str, Any]:
        """The Flask config a user would write for this deployment."""
        options = dict(self.options)
        if self.clock is not None:
            options["clock"] = self.clock
        config: dict[str, Any] = {"CACHE_TYPE": self.cache_type, "CACHE_KEY_PREFIX": PREFIX}
        if self.servers:
            config["CACHE_MEMCACHED_SERVERS"] = [server.spec for server in self.servers]
        if options:
            config["CACHE_OPTIONS"] = options
        config.update(extra)
        return config

    def make_app(self, **extra: Any) -> tuple[Flask, Cache]:
        app = Flask(__name__)
        app.config.update(self.config(**extra))
        return app, Cache(app)

    def make_cache(self, **extra: Any) -> Any:
        """The backend object (``cache.cache``) of a fresh app."""
        app, cache = self.make_app(**extra)
        with app.app_context():
            return cache.cache

    def flush(self) -> None:
        for server in self.servers:
            server.flush()

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: for real on servers, on the fake clock otherwise."""
        if self.clock is not None:
            self.clock.advance(seconds)
        else:
            time.sleep(seconds)

    def ttl(self, made_key: str) -> int | None:
        """The TTL of a key on whichever server holds it (servers only)."""
        held = [t for t in (server_ttl(s, made_key) for s in self.servers) if t is not None]
        assert len(held) <= 1, f"{made_key!r} is on several servers"
        return held[0] if held else None

    def holders(self, made_key: str) -> list[str]:
        """The specs of the servers that hold ``made_key``."""
        return [s.spec for s in self.servers if server_ttl(s, made_key) is not None]


def make_deployment(request: pytest.FixtureRequest, name: str) -> FlaskDeployment:
    """The deployment called ``name`` (``cluster3``, ``single``, ``embedded``), flushed."""
    if name == "embedded":
        return FlaskDeployment.embedded()
    servers = request.getfixturevalue("memcached_3" if name == "cluster3" else "memcached_1")
    deployment = FlaskDeployment.cluster(servers)
    deployment.flush()
    return deployment


def deployments(*names: str) -> Any:
    """A ``deployment`` fixture that runs each test using it once per named configuration.

    In a test module: ``deployment = deployments("cluster3", "embedded")``.
    """

    @pytest.fixture(params=names)
    def deployment(request: pytest.FixtureRequest) -> FlaskDeployment:
        return make_deployment(request, request.param)

    return deployment
