"""The memcached servers of the run: started by conftest.py before the test modules are imported
(Django's test classes name their caches in class decorators), stopped at the end."""

from __future__ import annotations

from tests.harness import MemcachedServer

SERVERS: list[MemcachedServer] = []


def location() -> list[str]:
    """``LOCATION`` for KetamaMemcacheCache: every server of the run."""
    return [server.spec for server in SERVERS]
