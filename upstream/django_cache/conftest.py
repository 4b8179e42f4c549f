"""Three real memcached servers for the whole run (tests/harness.py: free loopback ports,
stopped by their pid)."""

from __future__ import annotations

import pytest

from tests.harness import start_memcached, stop_all
from upstream.django_cache import servers


def pytest_configure(config: pytest.Config) -> None:
    servers.SERVERS[:] = start_memcached(3)


def pytest_unconfigure(config: pytest.Config) -> None:
    stop_all(servers.SERVERS)
    servers.SERVERS.clear()
