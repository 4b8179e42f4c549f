"""Query keys: the compiled walk (src/speedups/shape.c) writes every query down as the pure one.

Same parts in the same order and the same tables, for the key tests' shapes and more
(subqueries, expressions, aggregates, m2m, values), for random nested values, and the
same refusals (never-cached shapes, unknown kinds, nesting past the recursion limit).
No database: a queryset is keyed without SQL.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import Count, Exists, F, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Lower, Now
from hypothesis import given, settings
from hypothesis import strategies as st

from django_mcpatterns.orm import shape
from tests.orm.shop.models import Category, Product, Special, Tag
from tests.orm.test_keys import SHAPES

pytestmark = pytest.mark.skipif(
    (shape._walk, shape._walk_named) == shape.PURE_WALK,
    reason="the compiled walk is not built",
)
COMPILED = (shape._walk, shape._walk_named)


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Key with one walk, then the other: ``walks(fn)`` is fn's answer under each."""

    def both(fn: Any) -> tuple[Any, Any]:
        answers = []
        for walk, named in (shape.PURE_WALK, COMPILED):
            monkeypatch.setattr(shape, "_walk", walk)
            monkeypatch.setattr(shape, "_walk_named", named)
            try:
                answers.append(("ok", fn()))
            except Exception as exc:  # the refusal itself must match
                answers.append((type(exc).__name__, str(exc)))
        return answers[0], answers[1]

    return both


def written(qs: Any) -> tuple[list[str], set[str]]:
    found = shape.shape_of(qs.query, qs.db, "fetch", qs._iterable_class, qs._fields)
    return found.parts, found.tables


MORE = [
    lambda c: Product.objects.filter(Q(price__gt=1) & ~Q(category=c)).distinct(),
    lambda c: Product.objects.annotate(n=Count("tags")).filter(n__gt=c.pk),
    lambda c: Product.objects.filter(tags__name="x").order_by("-pk")[2:4],
    lambda c: Product.objects.values("category").annotate(total=Sum("price")),
    lambda c: Product.objects.filter(Exists(Tag.objects.filter(products=OuterRef("pk"), name="t"))),
    lambda c: Category.objects.filter(
        pk__in=Subquery(Product.objects.filter(price__lt=c.pk).values("category"))
    ),
    lambda c: Product.objects.annotate(low=Lower("name")).filter(low="a"),
    lambda c: Product.objects.filter(price=F("category__id") * 2),
    lambda c: Special.objects.filter(badge="b", category=c).select_related("category"),
    lambda c: Product.objects.annotate(at=Now()).filter(category=c),
    lambda c: Product.objects.select_for_update().filter(category=c),
    lambda c: Product.objects.order_by("?"),
    lambda c: Product.objects.defer("name").filter(name__startswith=c.name),
    lambda c: Tag.objects.filter(products__category__name__in=["a", "b", c.name]),
]


@pytest.mark.parametrize("build", SHAPES + MORE)
def test_queries_are_written_down_alike(walks: Any, build: Any) -> None:
    category = Category(pk=7, name="seven")
    pure, compiled = walks(lambda: written(build(category)))
    assert compiled == pure
    assert pure[0] in ("ok", "Uncacheable")


def test_never_cached_shapes_are_refused_by_both(walks: Any) -> None:
    for build in MORE[-5:-2]:
        pure, compiled = walks(lambda build=build: written(build(Category(pk=7, name="x"))))
        assert compiled[0] == pure[0] == "Uncacheable"


atoms = st.integers() | st.text(max_size=4) | st.none() | st.booleans() | st.floats()
values = st.recursive(
    atoms,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=4)
        | st.frozensets(st.integers() | st.text(max_size=3), max_size=3)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(values, max_size=3))
def test_values_are_written_down_alike(parts: list[Any]) -> None:
    pure = []
    for walk in (shape.PURE_WALK[0], COMPILED[0]):
        found = shape.Shape()
        for part in parts:
            walk(part, found)
        pure.append(found.parts)
    assert pure[1] == pure[0]


def test_an_unknown_kind_is_refused_alike(walks: Any) -> None:
    pure, compiled = walks(lambda: shape.digest_of([1, {"a": lambda: 0}]))
    assert compiled == pure
    assert pure[0] == "Uncacheable"


def test_nesting_past_the_recursion_limit_raises_alike(walks: Any) -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    pure, compiled = walks(lambda: shape.digest_of(deep))
    assert compiled[0] == pure[0] == "RecursionError"
