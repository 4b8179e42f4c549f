"""Async hits without a thread hop, an unreachable cache, the auditor, bad settings."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_mcpatterns.orm import audit, observe, orm_stale_hit, queryset
from django_mcpatterns.orm.conf import parse
from tests.django.conftest import CLUSTER_BACKEND
from tests.harness import memcached_cluster
from tests.orm.shop.models import Category, Product

pytestmark = pytest.mark.django_db(transaction=True)


def test_async_hits_are_served_in_the_event_loop(
    shop: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Category.objects.create(name="c")
    p = Product.objects.create(name="p", category=c, price=3)
    qs = Product.objects.filter(category=c).cache()
    list(qs.all())
    qs.count()
    qs.exists()
    Product.objects.cache().get(pk=p.pk)

    def no_hop(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a hit hopped to a thread")

    monkeypatch.setattr(queryset, "sync_to_async", no_hop)

    async def reads() -> tuple[Any, ...]:
        rows = [x.pk async for x in qs.all()]
        return (
            rows,
            await qs.acount(),
            await qs.aexists(),
            await Product.objects.cache().aget(pk=p.pk),
        )

    rows, count, exists, got = asyncio.run(reads())
    assert rows == [p.pk]
    assert count == 1
    assert exists is True
    assert got.price == 3


def test_an_unreachable_cache_reads_the_database(orm_hooks: None, tmp_path: Any) -> None:
    # A socket nothing will ever listen on: the invalidations journaled here outlive the test
    # (the process's cluster keeps them for a server that may answer later), and a free TCP
    # port would be taken by a later test's server or proxy, which would receive them (the
    # asyncio cancellation drill once counted those connections as its own).
    dead = {"BACKEND": CLUSTER_BACKEND, "LOCATION": [f"unix:{tmp_path}/never.sock"]}
    with override_settings(CACHES={"default": dead}, MCPATTERNS_ORM={"cache": "default"}):
        c = Category.objects.create(name="c")
        p = Product.objects.create(name="p", category=c)
        assert [x.pk for x in Product.objects.filter(category=c).cache()] == [p.pk]
        p.price = 9
        p.save()  # the invalidation cannot be sent: kept by the journal, no error
        assert Product.objects.filter(category=c).cache().get().price == 9
        p.delete()
        assert Product.objects.filter(category=c).cache().count() == 0


def test_the_auditor_finds_a_stale_hit(shop: Any) -> None:
    c = Category.objects.create(name="c")
    Product.objects.create(name="p", category=c, price=1)
    found: list[dict[str, Any]] = []

    def listener(**kwargs: Any) -> None:
        found.append(kwargs)

    orm_stale_hit.connect(listener)
    audit.run_inline(True)
    try:
        with override_settings(MCPATTERNS_ORM={**settings.MCPATTERNS_ORM, "audit": 1.0}):
            assert Product.objects.filter(category=c).cache().get().price == 1
            assert Product.objects.filter(category=c).cache().get().price == 1  # audited: fine
            with connection.cursor() as cursor:  # a write the ORM does not see
                cursor.execute(f"UPDATE {Product._meta.db_table} SET price = 2")
            Product.objects.filter(category=c).cache().get()  # stale: found by the auditor
    finally:
        audit.run_inline(False)
        orm_stale_hit.disconnect(listener)
    assert observe.totals()["audited"] == 2
    assert observe.totals()["stale"] == 1
    assert len(found) == 1
    assert found[0]["model"] == "mcpatterns_orm_shop.product"


def test_reads_inside_atomic_on_sqlite_are_served_not_filled(shop: Any) -> None:
    from django.db import transaction

    c = Category.objects.create(name="c")
    with transaction.atomic():
        Product.objects.filter(category=c).cache().count()
    with CaptureQueriesContext(connection) as ctx:
        Product.objects.filter(category=c).cache().count()
    assert len(ctx.captured_queries) == 1  # not stored inside the transaction: filled now


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"tiemout": 3}, "unknown keys ['tiemout']"),
        ({"models": {"shop.product": {"ops": ["fetch", "scan"]}}}, "['scan']"),
        ({"models": {"product": {}}}, "app_label.model"),
        ({"timeout": 0}, "positive number of seconds"),
        ({"lease": "lock"}, "'placeholder', 'cas'"),
        ({"audit": 2}, "fraction"),
    ],
)
def test_bad_settings_name_what_is_valid(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse(raw)


def test_an_invalidation_lost_in_a_stall_is_repaired_before_the_server_serves_again(
    orm_hooks: None,
) -> None:
    # The journal seam (RepairJournal, the default): a stamp that could not be renewed is
    # deleted on its server before that server serves this process again.  The first
    # journal (MemoryJournal) kept it for the next invalidation, and meanwhile served the
    # result cached before the write.
    with memcached_cluster(1) as servers:
        entry = {
            "BACKEND": CLUSTER_BACKEND,
            "LOCATION": [servers[0].spec],
            "OPTIONS": {"timeout": 0.5, "retry_timeout": 0.05},
        }
        with override_settings(CACHES={"default": entry}, MCPATTERNS_ORM={"cache": "default"}):
            c = Category.objects.create(name="c")
            p = Product.objects.create(name="p", category=c, price=1)
            assert Product.objects.filter(category=c).cache().get().price == 1  # cached
            servers[0].pause()
            try:
                p.price = 2
                p.save()  # its invalidation times out: journaled, no error
            finally:
                servers[0].resume()
            store = caches["default"].store
            deadline = time.monotonic() + 10
            while store.journal() and time.monotonic() < deadline:
                time.sleep(0.01)  # the repair thread, or the next request there
            assert store.journal() == {}
            assert Product.objects.filter(category=c).cache().get().price == 2
