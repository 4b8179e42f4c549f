"""Review of issue 17 on Django's cache API: a full memcached never raises into a view."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from tests.django.conftest import Deployment
from tests.django.test_values import cache_with
from tests.harness import MemcachedServer, free_port

pytestmark = pytest.mark.usefixtures("reset_shared_stores")


@pytest.fixture
def full_server() -> Iterator[MemcachedServer]:
    """A 2 MB memcached that answers "out of memory" instead of evicting (-M)."""
    server = MemcachedServer(free_port(), extra_args=("-M",), memory_mb=2).start()
    yield server
    server.stop()


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_set_on_a_full_server_is_false_and_the_old_value_goes(
    full_server: MemcachedServer, protocol: str
) -> None:
    cache = cache_with(Deployment.cluster([full_server], protocol=protocol))
    assert cache.set("kept", "old value")
    answers = [cache.set(f"filler:{i}", os.urandom(400_000)) for i in range(20)]
    assert False in answers  # memory ran out: a failed set, not a ServerError
    assert cache.set("kept", os.urandom(400_000)) is False
    assert cache.get("kept") is None  # Django's contract: nothing older than the failed write
    assert cache.add("other", os.urandom(400_000)) is False
    assert asyncio.run(cache.aset("kept", os.urandom(400_000))) is False
