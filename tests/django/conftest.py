"""What the Django backend tests share: deployments under test and server probes.

A :class:`Deployment` is one backend configuration (a memcached cluster of the
session fixtures, or the embedded store).  Tests build their caches through
Django's own machinery (``override_settings(CACHES=...)`` and
``django.core.cache.caches``), so per-thread instances, ``KEY_PREFIX``,
``VERSION``, ``KEY_FUNCTION`` and ``TIMEOUT`` behave as in a real project.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from pymemcache.client.base import Client

from tests.harness import LOOPBACK, MemcachedServer

CLUSTER_BACKEND = "django_mcpatterns.backend.KetamaMemcacheCache"
EMBEDDED_BACKEND = "django_mcpatterns.backend.LocMemPatternsCache"

# Server counters that move whenever a command reaches memcached.
WIRE_COUNTERS = (
    b"cmd_get",
    b"cmd_set",
    b"cmd_touch",
    b"cmd_meta",
    b"cmd_flush",
    b"delete_hits",
    b"delete_misses",
    b"incr_hits",
    b"incr_misses",
    b"decr_hits",
    b"decr_misses",
    b"cas_hits",
    b"cas_misses",
    b"cas_badval",
)


def raw_client(server: MemcachedServer) -> Client:
    """A plain pymemcache client on one server, bypassing everything of ours."""
    return Client(
        (LOOPBACK, server.port), default_noreply=False, allow_unicode_keys=True, timeout=5
    )


def server_ttl(server: MemcachedServer, made_key: str) -> int | None:
    """The remaining TTL memcached reports for a key (-1: never), None when absent."""
    client = raw_client(server)
    try:
        # Meta get with the `t` flag (memcached >= 1.6): "HD t<seconds>" or "EN".
        line = client.raw_command(b"mg " + made_key.encode() + b" t", end_tokens=b"\r\n")
    finally:
        client.close()
    if line.startswith(b"EN"):
        return None
    assert line.startswith(b"HD"), line
    (flag,) = [token for token in line.split()[1:] if token.startswith(b"t")]
    return int(flag[1:])


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

    def wire_counters(self) -> Counter[bytes]:
        """The sum over all servers of the counters any command would move."""
        total: Counter[bytes] = Counter()
        for server in self.servers:
            client = raw_client(server)
            try:
                stats = client.stats()
            finally:
                client.close()
            total.update({name: int(stats[name]) for name in WIRE_COUNTERS})
        return total

    def holders(self, made_key: str) -> list[str]:
        """The specs of the servers that hold ``made_key`` (read directly)."""
        found = []
        for server in self.require_servers():
            client = raw_client(server)
            try:
                if client.get(made_key) is not None:
                    found.append(server.spec)
            finally:
                client.close()
        return found


@pytest.fixture
def reset_shared_stores() -> Iterator[None]:
    """Forget process-wide clusters and stores after a test that built throwaway ones."""
    yield
    from django_mcpatterns.core.cluster import reset_shared_clusters
    from django_mcpatterns.core.memory import reset_shared_memory_stores

    reset_shared_clusters()
    reset_shared_memory_stores()
