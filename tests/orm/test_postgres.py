"""The ORM cache on PostgreSQL: fills inside READ COMMITTED transactions, locks on save."""

from __future__ import annotations

from typing import Any

from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from django_mcpatterns.orm import observe
from tests.orm.shop.models import Category, Product


def test_postgres_reads_are_cached_and_invalidated(pg: str, shop: Any) -> None:
    a = Category.objects.using(pg).create(name="a")
    Product.objects.using(pg).create(name="p", category=a, price=1)
    qs = Product.objects.using(pg).filter(category=a).cache()
    assert [p.price for p in qs.all()] == [1]
    with CaptureQueriesContext(connections[pg]) as ctx:
        assert [p.price for p in qs.all()] == [1]
    assert len(ctx.captured_queries) == 0
    with transaction.atomic(using=pg):
        p = Product.objects.using(pg).get(name="p")
        p.price = 2
        p.save(using=pg)
    assert [p.price for p in qs.all()] == [2]
    assert observe.totals()["stale"] == 0
