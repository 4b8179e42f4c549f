"""ORM cache fixtures: the app's hooks installed for these tests only, caches, tables."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings

from django_mcpatterns.orm import observe
from django_mcpatterns.orm.testing import installed
from tests.django.conftest import CLUSTER_BACKEND, EMBEDDED_BACKEND
from tests.harness import MemcachedServer


@pytest.fixture(scope="session")
def orm_hooks() -> Iterator[None]:
    with installed():
        yield


def orm_cache(backend: str, location: Any, **orm: Any) -> Any:
    return override_settings(
        CACHES={"default": {"BACKEND": backend, "LOCATION": location}},
        MCPATTERNS_ORM={"cache": "default", **orm},
    )


@pytest.fixture(params=["embedded", "memcached"])
def shop(
    request: pytest.FixtureRequest, orm_hooks: None, memcached_1: list[MemcachedServer]
) -> Iterator[Any]:
    """Tables on SQLite in memory and an ORM cache (embedded store, or a real memcached)."""
    if request.param == "embedded":
        settings = orm_cache(EMBEDDED_BACKEND, "orm-tests")
    else:
        memcached_1[0].flush()
        settings = orm_cache(CLUSTER_BACKEND, [s.spec for s in memcached_1])
    with settings:
        caches["default"].clear()
        observe.reset()
        yield caches["default"]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    from tests.orm.postgres import postgres

    with postgres() as server:
        yield server


@pytest.fixture
def pg(pg_server: Any, django_db_blocker: Any, orm_hooks: None) -> Iterator[str]:
    """The ``pg`` database alias on the session's PostgreSQL, with the shop's tables."""
    from tests.orm.postgres import add_database, remove_database
    from tests.orm.shop.models import create_tables, drop_tables

    with django_db_blocker.unblock():
        add_database("pg", pg_server.database_settings())
        create_tables("pg")
        try:
            yield "pg"
        finally:
            drop_tables("pg")
            remove_database("pg")
