"""Query keys: different queries never share one, the same query always gets the same plan.

(Queries that are the same SQL may share one: ``filter(a=1, b=2)`` and ``filter(a=1).filter(b=2)``.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db.models import F, Q
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_mcpatterns.orm.reads import reader
from tests.orm.shop.models import Category, Product

pytestmark = pytest.mark.django_db(transaction=True)

Build = Callable[[Any], Any]
"""A queryset from a category (its pk pinned or compared)."""

SHAPES: list[Build] = [
    lambda c: Product.objects.filter(category=c),
    lambda c: Product.objects.exclude(category=c),
    lambda c: Product.objects.filter(category=c, status="live"),
    lambda c: Product.objects.filter(category=c, status="draft"),
    lambda c: Product.objects.filter(Q(category=c) | Q(status="live")),
    lambda c: Product.objects.filter(category__in=[c]),
    lambda c: Product.objects.filter(category__in=[c, c.pk + 1]),
    lambda c: Product.objects.filter(price__gt=c.pk),
    lambda c: Product.objects.filter(price__gte=c.pk),
    lambda c: Product.objects.filter(price__lt=c.pk),
    lambda c: Product.objects.filter(price=F("category_id") + c.pk),
    lambda c: Product.objects.filter(category=c).order_by("price"),
    lambda c: Product.objects.filter(category=c).order_by("-price"),
    lambda c: Product.objects.filter(category=c)[:5],
    lambda c: Product.objects.filter(category=c)[5:10],
    lambda c: Product.objects.filter(category=c).select_related("category"),
    lambda c: Product.objects.filter(category=c).values("name"),
    lambda c: Product.objects.filter(category=c).values_list("name", flat=True),
    lambda c: Product.objects.filter(category=c).only("name"),
    lambda c: Product.objects.filter(category__name="a"),
    lambda c: Product.objects.filter(supplier=c),
    lambda c: Product.objects.filter(supplier__isnull=True),
    lambda c: Product.objects.filter(supplier__isnull=False),
    lambda c: Category.objects.filter(pk=c.pk),
    lambda c: Category.objects.filter(products__price=c.pk),
]


def key_of(qs: Any) -> Any:
    planned = reader().plan(qs.query, qs.db, "fetch", qs._iterable_class, qs._fields)
    assert planned is not None
    return planned


def test_different_queries_have_different_keys(shop: Any) -> None:
    a = Category.objects.create(name="a")
    b = Category.objects.create(name="b")
    owner: dict[str, int] = {}
    for i, build in enumerate(SHAPES):
        for key in {key_of(build(c).cache()).plan.key for c in (a, b)}:
            assert key not in owner, f"shape {i} keyed as shape {owner[key]}"
            owner[key] = i
    for build in SHAPES[:9]:  # these pin or compare the category
        assert key_of(build(a).cache()).plan.key != key_of(build(b).cache()).plan.key


def test_the_same_query_built_again_reuses_its_plan(shop: Any) -> None:
    a = Category.objects.create(name="a")
    for build in SHAPES:
        first, again = key_of(build(a).cache()), key_of(build(a).cache())
        assert again is first  # made once per shape: the stamps and pins too


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.integers(-3, 3) | st.text(max_size=3) | st.none(), min_size=1, max_size=4),
    st.lists(st.integers(-3, 3) | st.text(max_size=3) | st.none(), min_size=1, max_size=4),
)
def test_values_in_lookups_are_part_of_the_key(
    shop: Any, left: list[object], right: list[object]
) -> None:
    def build(values: list[object]) -> Any:
        return Product.objects.filter(name__in=[repr(v) for v in values]).cache()

    same = [repr(v) for v in left] == [repr(v) for v in right]
    assert (key_of(build(left)).plan.key == key_of(build(right)).plan.key) == same
