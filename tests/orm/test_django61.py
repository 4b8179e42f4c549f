"""Django 6.1's fetch modes on cached reads: a hit's rows fetch as Django's would.

``QuerySet.fetch_mode()`` decides what touching a deferred field or an unloaded relation
of a row does: one query for that row (``FETCH_ONE``), one for every row read with it
(``FETCH_PEERS``), or ``FieldFetchBlocked`` (``FETCH_RAISE``).  A cached hit's rows are
made from the cache, not by Django's ModelIterable, and must carry the same mode and peers.
Run by CI's second leg (Django 6.1); skipped before 6.1.
"""

from __future__ import annotations

from typing import Any

import django
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_mcpatterns.orm import invalidate_all
from tests.orm.shop.models import Category, Product

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(django.VERSION < (6, 1), reason="fetch modes are Django 6.1's"),
]

STATES = ["miss", "refill", "hit"]
"""The read measured: the plan's first miss, a later miss (its statement), a hit."""


@pytest.fixture
def cats(shop: Any) -> list[Category]:
    made = [Category.objects.create(name=f"c{i}") for i in range(4)]
    for i in range(8):
        Product.objects.create(name=f"p{i}", category=made[i % 4], supplier=made[0], price=i)
    return made


def read(first: bool, mode: Any, state: str, *related: str) -> list[Product]:
    def once() -> list[Product]:
        qs = Product.objects.cache() if first else Product.objects.all()
        qs = qs.fetch_mode(mode).order_by("pk")
        if related:
            qs = qs.select_related(*related)
        return list(qs if first else qs.cache())

    if state != "miss":
        once()
    if state == "refill":
        invalidate_all()
    return once()


def queries(fn: Any) -> int:
    with CaptureQueriesContext(connection) as ctx:
        fn()
    return len(ctx.captured_queries)


@pytest.mark.parametrize("first", [True, False], ids=["cache-first", "cache-last"])
@pytest.mark.parametrize("state", STATES)
def test_peers_fetch_a_relation_for_every_row_at_once(
    cats: list[Category], first: bool, state: str
) -> None:
    from django.db.models import FETCH_PEERS

    rows = read(first, FETCH_PEERS, state)
    assert queries(lambda: [p.category.name for p in rows]) == 1
    through = read(first, FETCH_PEERS, state, "category")  # the related rows' own peers
    assert queries(lambda: [p.supplier.name for p in through]) == 1


@pytest.mark.parametrize("state", STATES)
def test_raise_blocks_a_fetch(cats: list[Category], state: str) -> None:
    from django.core.exceptions import FieldFetchBlocked
    from django.db.models import FETCH_RAISE

    rows = read(True, FETCH_RAISE, state)
    with pytest.raises(FieldFetchBlocked):
        rows[0].category  # noqa: B018


@pytest.mark.parametrize("state", STATES)
def test_a_related_managers_rows_do_not_read_a_deferred_key(
    cats: list[Category], state: str
) -> None:
    """Django 6.1 leaves a row whose foreign key is deferred without the manager's object."""

    def names() -> list[str]:
        return [p.name for p in cats[1].products.cache().only("name")]  # type: ignore[attr-defined]

    if state != "miss":
        names()
    if state == "refill":
        invalidate_all()
    assert queries(names) <= 1
