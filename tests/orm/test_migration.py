"""The ORM cache during a ring migration (``OPTIONS["migrate_from"]``), processes of two stages.

A table's scheme registry is an append-only item that can move to the new server.
A stage-2 process that registers a scheme appends to the copy on the new ring
and deletes the old ring's; a stage-1 process, which reads the old ring, then
finds no registry.  A writer that finds none must still void what other
processes built on it: here one process switches its settings between the two
stages, as two processes of a rolling deploy would run side by side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings

from django_mcpatterns.core import stamps
from django_mcpatterns.core.cluster import reset_shared_clusters
from django_mcpatterns.orm import observe
from tests.django.conftest import CLUSTER_BACKEND
from tests.harness import MemcachedServer, memcached_cluster
from tests.orm.shop.models import Category, Product

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def five() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(5) as servers:
        yield servers


def settings(five: list[MemcachedServer], prefix: str, stage: str | None) -> Any:
    """The ORM's cache in a stage ("old", "new"), or before the change (None)."""
    specs = [server.spec for server in five]
    if stage is None:
        entry: dict[str, Any] = {"BACKEND": CLUSTER_BACKEND, "LOCATION": specs[:4]}
    else:
        migrate = {"LOCATION": specs[:4], "reads": stage}
        entry = {
            "BACKEND": CLUSTER_BACKEND,
            "LOCATION": specs,
            "OPTIONS": {"migrate_from": migrate},
        }
    return override_settings(
        CACHES={"default": entry}, MCPATTERNS_ORM={"cache": "default", "prefix": prefix}
    )


def moving(five: list[MemcachedServer], *keys: Callable[[str], str]) -> str:
    """An ORM prefix under which every one of ``keys(prefix)`` moves to the fifth server."""
    for i in range(500):
        prefix = f"orm{i}:"
        with settings(five, prefix, "new"):
            placement = caches["default"].values.placement
            if all(placement.moved(key(prefix)) for key in keys):
                return prefix
    raise AssertionError("no prefix moves those keys")


@pytest.fixture
def staged(five: list[MemcachedServer], orm_hooks: None) -> Iterator[Any]:
    """``staged(stage, *keys)``: the settings of a stage, under a prefix that moves ``keys``."""
    for server in five:
        server.flush()
    observe.reset()
    prefixes: dict[tuple[Any, ...], str] = {}

    def stage(name: str | None, *keys: Callable[[str], str]) -> Any:
        if keys not in prefixes:
            prefixes[keys] = moving(five, *keys)
        return settings(five, prefixes[keys], name)

    yield stage
    reset_shared_clusters()


def prices(category: Category, driver: str = "sync") -> list[int]:
    """The category's prices, read through the ORM cache (the asyncio path: ``async for``)."""
    qs = Product.objects.filter(category=category).cache()
    if driver == "sync":
        return sorted(p.price for p in qs)

    async def read() -> list[int]:
        return sorted([p.price async for p in qs.all()])

    return asyncio.run(read())


@pytest.fixture(params=["sync", "async"])
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def registry(prefix: str) -> str:
    return stamps.registry_key(prefix, "", Product._meta.db_table)


def conjunction(category: Category) -> Callable[[str], str]:
    table = Product._meta.db_table
    return lambda prefix: stamps.conjunction_key(
        prefix, "", table, ("category_id",), [str(category.pk)]
    )


def test_a_write_before_the_change_voids_what_stage_1_cached(staged, driver):
    """Old configuration and stage 1 side by side: a stamp whose server changes."""
    a = Category.objects.create(name="a")
    first = Product.objects.create(name="p0", category=a, price=1)
    Product.objects.create(name="p1", category=a, price=2)
    keys = (conjunction(a),)
    with staged(None, *keys):
        assert prices(a, driver) == [1, 2]
    with staged("old", *keys):  # a stage-1 process caches the result
        assert prices(a, driver) == [1, 2]
    with staged(None, *keys):  # a process not restarted yet changes a row
        first.price = 10
        first.save()
    with staged("old", *keys):
        assert prices(a, driver) == [2, 10]


def test_a_write_in_stage_1_voids_a_result_stage_2_registered_a_scheme_beside(staged, driver):
    """Stage 1 and stage 2 side by side: the registry moves, stage 2 adds a scheme to it."""
    a = Category.objects.create(name="a")
    first = Product.objects.create(name="p0", category=a, price=1)
    Product.objects.create(name="p1", category=a, price=2)
    with staged("old", registry):  # stage 1 everywhere: scheme (category_id) registered
        assert prices(a, driver) == [1, 2]
    with staged("new", registry):  # a stage-2 process: the result copied, a scheme added
        assert prices(a, driver) == [1, 2]
        assert [p.name for p in Product.objects.filter(name="p1").cache()] == ["p1"]
    with staged("old", registry):  # a stage-1 process, still running, changes a row
        first.price = 10
        first.save()
    with staged("new", registry):
        assert prices(a, driver) == [2, 10]
