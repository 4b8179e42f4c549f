"""Fixtures shared by every test: real memcached servers on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import MemcachedServer, memcached_cluster


@pytest.fixture(scope="session")
def memcached_1() -> Iterator[list[MemcachedServer]]:
    """One memcached server for the whole session (flush it where state matters)."""
    with memcached_cluster(1) as servers:
        yield servers


@pytest.fixture(scope="session")
def memcached_3() -> Iterator[list[MemcachedServer]]:
    """Three memcached servers for the whole session."""
    with memcached_cluster(3) as servers:
        yield servers


@pytest.fixture
def memcached_4_fresh() -> Iterator[list[MemcachedServer]]:
    """Four servers of the test's own, for tests that kill, pause or restart them."""
    with memcached_cluster(4) as servers:
        yield servers


def flush(servers: list[MemcachedServer]) -> None:
    for server in servers:
        server.flush()
