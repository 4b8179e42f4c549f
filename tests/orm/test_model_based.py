"""The proof: seeded random operations; every cached read equals the uncached one."""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.db import connections

from django_mcpatterns.orm import observe
from tests.harness import LOOPBACK, MemcachedServer
from tests.orm import model_based


def _run(
    seed: int,
    operations: int,
    evictions: float,
    remote: bool,
    pg_server: Any,
    server: MemcachedServer,
) -> model_based.Tally:
    second = None
    if remote:
        second = model_based.Remote(pg_server.database_settings(), [server.spec], seed + 1)
    try:
        tally = model_based.run(
            seed, operations, host=LOOPBACK, port=server.port, evictions=evictions, remote=second
        )
    finally:
        if second is not None:
            second.close()
    totals = observe.totals()
    print(
        f"\nseed {seed}: {tally.operations} operations, {tally.reads} reads compared, "
        f"{tally.remote_writes} by the second process, {tally.evicted} keys evicted, "
        f"stale reads: {len(tally.stale)}; cache: {totals}"
    )
    return tally


@pytest.fixture
def memcached_shop(pg: str, memcached_1: list[MemcachedServer]) -> Any:
    from django.core.cache import caches

    from tests.django.conftest import CLUSTER_BACKEND
    from tests.orm.conftest import orm_cache

    memcached_1[0].flush()
    with orm_cache(CLUSTER_BACKEND, [s.spec for s in memcached_1]):
        caches["default"].clear()
        observe.reset()
        yield memcached_1[0]
    connections[pg].close()


@pytest.mark.parametrize(
    ("seed", "evictions", "remote"), [(1, 0.0, False), (2, 0.2, False), (3, 0.1, True)]
)
def test_every_cached_read_equals_the_uncached_read(
    seed: int, evictions: float, remote: bool, pg_server: Any, memcached_shop: MemcachedServer
) -> None:
    tally = _run(seed, 300, evictions, remote, pg_server, memcached_shop)
    assert tally.stale == []
    assert observe.totals()["hit"] > 0


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("MCPATTERNS_LONG"), reason="long variant: set MCPATTERNS_LONG=1 to run it"
)
@pytest.mark.parametrize(
    ("seed", "evictions", "remote"), [(11, 0.0, False), (12, 0.2, False), (13, 0.1, True)]
)
def test_every_cached_read_equals_the_uncached_read_long(
    seed: int, evictions: float, remote: bool, pg_server: Any, memcached_shop: MemcachedServer
) -> None:
    tally = _run(seed, 3000, evictions, remote, pg_server, memcached_shop)
    assert tally.stale == []


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("MCPATTERNS_LONG"), reason="long variant: set MCPATTERNS_LONG=1 to run it"
)
@pytest.mark.parametrize(
    ("protocol", "lease"), [("text", "meta"), ("meta", "placeholder"), ("meta", "cas")]
)
@pytest.mark.parametrize(
    ("seed", "evictions", "remote"), [(21, 0.0, False), (22, 0.2, False), (23, 0.1, True)]
)
def test_every_cached_read_equals_the_uncached_read_in_other_lease_modes(
    protocol: str,
    lease: str,
    seed: int,
    evictions: float,
    remote: bool,
    pg_server: Any,
    memcached_shop: MemcachedServer,
) -> None:
    """Text mode (which leases with a placeholder) and the two other lease modes."""
    from django.core.cache import caches
    from django.test import override_settings

    from tests.django.conftest import CLUSTER_BACKEND

    location = {"BACKEND": CLUSTER_BACKEND, "LOCATION": [memcached_shop.spec]}
    with override_settings(
        CACHES={"default": {**location, "OPTIONS": {"protocol": protocol}}},
        MCPATTERNS_ORM={"cache": "default", "lease": lease},
    ):
        assert caches["default"].store.text == (protocol == "text")
        caches["default"].clear()
        observe.reset()
        tally = _run(seed, 1000, evictions, remote, pg_server, memcached_shop)
    assert tally.stale == []
