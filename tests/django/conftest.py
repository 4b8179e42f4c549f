"""What the Django backend tests share: deployments under test, server probes, signals.

A :class:`Deployment` is one backend configuration (a memcached cluster of the
session fixtures, or the embedded store).  Tests build their caches through
Django's own machinery (``override_settings(CACHES=...)`` and
``django.core.cache.caches``), so per-thread instances, ``KEY_PREFIX``,
``VERSION``, ``KEY_FUNCTION`` and ``TIMEOUT`` behave as in a real project.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.cache import caches
from django.dispatch import Signal
from django.test import override_settings

from tests.harness import (
    COMMAND_COUNTERS,
    MemcachedServer,
    server_counters,
    server_ttl,
    servers_holding,
)

CLUSTER_BACKEND = "django_mcpatterns.backend.KetamaMemcacheCache"
EMBEDDED_BACKEND = "django_mcpatterns.backend.LocMemPatternsCache"

WIRE_COUNTERS = COMMAND_COUNTERS  # what Deployment.wire_counters() sums


@dataclass
class Deployment:
    """One backend configuration the contract suite runs against."""

    backend: str
    location: str | list[str]
    options: dict[str, Any] = field(default_factory=dict)
    servers: Sequence[MemcachedServer] = ()
    variant: str = "libmemcached"

    @classmethod
    def cluster(cls, servers: Sequence[MemcachedServer], **options: Any) -> Deployment:
        variant = options.get("ketama", "libmemcached")
        return cls(CLUSTER_BACKEND, [s.spec for s in servers], options, servers, variant)

    @classmethod
    def embedded(cls, name: str = "contract", **options: Any) -> Deployment:
        return cls(EMBEDDED_BACKEND, name, options)

    @property
    def has_servers(self) -> bool:
        return bool(self.servers)

    def require_servers(self) -> Sequence[MemcachedServer]:
        if not self.servers:
            pytest.skip("needs real memcached servers (embedded store has no wire)")
        return self.servers

    def params(self, **extra: Any) -> dict[str, Any]:
        """One ``CACHES`` entry for this deployment, with extra Django settings."""
        entry: dict[str, Any] = {"BACKEND": self.backend, "LOCATION": self.location}
        if self.options:
            entry["OPTIONS"] = dict(self.options)
        entry.update(extra)
        return entry

    def flush(self) -> None:
        """Empty the servers behind our back (the embedded store is cleared by the suite)."""
        for server in self.servers:
            server.flush()

    def ttl(self, made_key: str) -> int | None:
        """The TTL of a key as memcached reports it, from whichever server holds it."""
        found = [server_ttl(s, made_key) for s in self.require_servers()]
        held = [ttl for ttl in found if ttl is not None]
        assert len(held) <= 1, f"{made_key!r} is on several servers"
        return held[0] if held else None

    def wire_counters(self) -> Counter[str]:
        """The sum over all servers of the counters any command would move."""
        return server_counters(self.servers, WIRE_COUNTERS)

    def holders(self, made_key: str) -> list[str]:
        """The specs of the servers that hold ``made_key`` (read directly)."""
        return servers_holding(self.require_servers(), made_key)


class DeploymentSuite:
    """Tests run once per deployment, each on freshly flushed and cleared caches.

    Subclasses provide the ``deployment`` fixture and may add ``CACHES`` aliases
    (:meth:`caches_setting`); tests get ``cache``, the ``default`` alias.
    """

    @pytest.fixture
    def deployment(self) -> Deployment:
        raise NotImplementedError

    def caches_setting(self, deployment: Deployment) -> dict[str, dict[str, Any]]:
        """The ``CACHES`` setting of every test: aliases over the same deployment."""
        return {"default": deployment.params()}

    @pytest.fixture(autouse=True)
    def _configured(self, deployment: Deployment) -> Iterator[None]:
        deployment.flush()
        with override_settings(CACHES=self.caches_setting(deployment)):
            caches["default"].clear()
            yield
        # Leaving override_settings closes every cache Django opened (setting_changed).

    @pytest.fixture
    def cache(self) -> Any:
        return caches["default"]


@pytest.fixture
def reset_shared_stores() -> Iterator[None]:
    """Forget process-wide clusters and stores after a test that built throwaway ones."""
    yield
    from django_mcpatterns.core.cluster import reset_shared_clusters
    from django_mcpatterns.core.memory import reset_shared_memory_stores

    reset_shared_clusters()
    reset_shared_memory_stores()


@contextmanager
def received(signal: Signal) -> Iterator[list[dict[str, Any]]]:
    """Collect the keyword arguments (with ``sender``) of every ``signal`` sent in the block."""
    calls: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        calls.append({"sender": sender, **kwargs})

    signal.connect(receiver, weak=False)
    try:
        yield calls
    finally:
        signal.disconnect(receiver)
