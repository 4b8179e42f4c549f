"""The ORM cache on the shop: hits, invalidation by every write path, fine grain, transactions."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, models, transaction
from django.db.models import Count, Sum
from django.test.utils import CaptureQueriesContext

from django_mcpatterns.orm import (
    cached_as,
    invalidate_all,
    invalidate_model,
    invalidate_obj,
    observe,
)
from tests.orm.shop.models import Category, Product, Special, Tag

pytestmark = pytest.mark.django_db(transaction=True)


def queries(fn: Any) -> tuple[Any, int]:
    with CaptureQueriesContext(connection) as ctx:
        value = fn()
    return value, len(ctx.captured_queries)


@pytest.fixture
def data(shop: Any) -> dict[str, Any]:
    a = Category.objects.create(name="a")
    b = Category.objects.create(name="b")
    tags = [Tag.objects.create(name=f"t{i}") for i in range(3)]
    products = [
        Product.objects.create(name=f"p{i}", category=a if i % 2 else b, price=i) for i in range(6)
    ]
    products[0].tags.add(tags[0], tags[1])
    return {"a": a, "b": b, "tags": tags, "products": products}


def test_a_second_read_is_a_hit_and_costs_no_query(data: dict[str, Any]) -> None:
    a = data["a"]
    first, n1 = queries(lambda: list(Product.objects.filter(category=a).cache()))
    second, n2 = queries(lambda: list(Product.objects.filter(category=a).cache()))
    assert n1 == 1
    assert n2 == 0
    assert [p.pk for p in first] == [p.pk for p in second]
    assert observe.totals()["hit"] == 1


@pytest.mark.parametrize(
    "op",
    [
        lambda qs: qs.count(),
        lambda qs: qs.exists(),
        lambda qs: qs.aggregate(total=Sum("price")),
        lambda qs: list(qs.values("name", "price")),
        lambda qs: list(qs.values_list("pk", flat=True)),
        lambda qs: list(qs.select_related("category")),
        lambda qs: list(qs.annotate(n=Count("tags"))),
        lambda qs: qs.get(name="p1"),
        lambda qs: list(qs.order_by("-price")[1:3]),
    ],
)
def test_each_operation_is_cached_and_invalidated(data: dict[str, Any], op: Any) -> None:
    qs = Product.objects.filter(category=data["a"]).cache()
    first, _ = queries(lambda: op(qs))
    again, n = queries(lambda: op(qs))
    assert n == 0
    assert snapshot(first) == snapshot(again)
    Product.objects.filter(name="p1").update(price=100)
    fresh, n = queries(lambda: op(qs))
    assert n >= 1
    assert snapshot(fresh) == snapshot(op(Product.objects.filter(category=data["a"]).nocache()))


def snapshot(value: Any) -> Any:
    from tests.orm.shop.models import snapshot as plain

    return plain(value)


def test_fine_grained_a_write_leaves_other_pins_valid(data: dict[str, Any]) -> None:
    a, b = data["a"], data["b"]
    list(Product.objects.filter(category=a).cache())
    list(Product.objects.filter(pk=data["products"][1].pk).cache())
    other = data["products"][0]  # in b
    other.price = 50
    other.save()
    _, n = queries(lambda: list(Product.objects.filter(category=a).cache()))
    assert n == 0
    _, n = queries(lambda: list(Product.objects.filter(pk=data["products"][1].pk).cache()))
    assert n == 0
    _, n = queries(lambda: list(Product.objects.filter(category=b).cache()))
    assert n == 1


def test_moving_a_row_invalidates_its_old_and_new_pins(data: dict[str, Any]) -> None:
    a, b = data["a"], data["b"]
    in_a = list(Product.objects.filter(category=a).cache())
    in_b = list(Product.objects.filter(category=b).cache())
    moved = in_a[0]
    moved.category = b
    moved.save()
    assert moved.pk not in [p.pk for p in Product.objects.filter(category=a).cache()]
    assert moved.pk in [p.pk for p in Product.objects.filter(category=b).cache()]
    assert len(in_b) + 1 == Product.objects.filter(category=b).cache().count()


def test_stale_in_memory_instance_saved_still_invalidates_the_db_value(
    data: dict[str, Any],
) -> None:
    a, b = data["a"], data["b"]
    p = Product.objects.get(pk=data["products"][1].pk)  # in a
    stale = Product.objects.get(pk=p.pk)
    p.category = b
    p.save()
    list(Product.objects.filter(category=b).cache())
    stale.name = "renamed"  # still says category a; the row is in b
    stale.save()
    names = [x.name for x in Product.objects.filter(category=a).cache()]
    assert "renamed" in names  # the save wrote category a back
    assert "renamed" not in [x.name for x in Product.objects.filter(category=b).cache()]


def test_delete_cascade_and_set_null(data: dict[str, Any]) -> None:
    a, b = data["a"], data["b"]
    p = data["products"][0]
    p.supplier = a
    p.save()
    assert Product.objects.filter(supplier=a).cache().count() == 1
    assert Product.objects.filter(category=a).cache().count() == 3
    a_pk = a.pk
    assert Product.objects.filter(supplier__isnull=True).cache().count() == 5
    a.delete()  # cascades to a's products, sets p.supplier to NULL
    assert Product.objects.filter(category=a_pk).cache().count() == 0
    assert Product.objects.filter(supplier=a_pk).cache().count() == 0
    assert Product.objects.filter(supplier__isnull=True).cache().count() == 3
    assert Product.objects.filter(category=b).cache().count() == 3
    Product.objects.filter(category=b).delete()
    assert Product.objects.cache().count() == 0


def test_m2m_add_remove_clear_set(data: dict[str, Any]) -> None:
    p = data["products"][0]
    t0, _t1, t2 = data["tags"]

    def names() -> list[str]:
        return sorted(t.name for t in p.tags.all().cache())

    assert names() == ["t0", "t1"]
    p.tags.add(t2)
    assert names() == ["t0", "t1", "t2"]
    p.tags.remove(t0)
    assert names() == ["t1", "t2"]
    p.tags.set([t0])
    assert names() == ["t0"]
    t0.products.clear()
    assert names() == []
    assert Tag.objects.filter(products=p).cache().count() == 0


def test_bulk_create_and_bulk_update(data: dict[str, Any]) -> None:
    a, b = data["a"], data["b"]
    assert Product.objects.filter(category=a).cache().count() == 3
    made = Product.objects.bulk_create([Product(name=f"n{i}", category=a) for i in range(4)])
    assert Product.objects.filter(category=a).cache().count() == 7
    for p in made:
        p.category = b
    Product.objects.bulk_update(made, ["category"])
    assert Product.objects.filter(category=a).cache().count() == 3
    assert Product.objects.filter(category=b).cache().count() == 7


def test_rolled_back_transaction_changes_nothing_and_reads_its_writes(data: dict[str, Any]) -> None:
    a = data["a"]
    before = Product.objects.filter(category=a).cache().count()
    seen = []

    def write_then_fail() -> None:
        with transaction.atomic():
            Product.objects.create(name="x", category=a)
            seen.append(queries(lambda: Product.objects.filter(category=a).cache().count()))
            raise RuntimeError

    with pytest.raises(RuntimeError):
        write_then_fail()
    assert seen == [(before + 1, 1)]  # read your writes: the cache was bypassed
    _, n = queries(lambda: Product.objects.filter(category=a).cache().count())
    assert n == 0
    assert Product.objects.filter(category=a).cache().count() == before


def test_child_model_writes_invalidate_parent_queries(data: dict[str, Any]) -> None:
    a = data["a"]
    assert Product.objects.filter(category=a).cache().count() == 3
    s = Special.objects.create(name="s", category=a, badge="x")
    assert Product.objects.filter(category=a).cache().count() == 4
    assert Special.objects.filter(badge="x").cache().count() == 1
    s.badge = "y"
    s.save()
    assert Special.objects.filter(badge="x").cache().count() == 0


def test_invalidate_calls(data: dict[str, Any]) -> None:
    a = data["a"]
    qs = Product.objects.filter(category=a).cache()
    qs.count()
    for call in (
        lambda: invalidate_obj(data["products"][1]),
        lambda: invalidate_model(Product),
        invalidate_all,
    ):
        call()
        _, n = queries(lambda: Product.objects.filter(category=a).cache().count())
        assert n == 1


def test_cached_as(data: dict[str, Any]) -> None:
    calls = []

    @cached_as(Product.objects.filter(category=data["a"]))
    def total(scale: int) -> int:
        calls.append(scale)
        return scale * sum(p.price for p in Product.objects.filter(category=data["a"]))

    assert total(2) == total(2) == 2 * (1 + 3 + 5)
    assert calls == [2]
    Product.objects.filter(name="p1").update(price=11)
    assert total(2) == 2 * (11 + 3 + 5)


def test_never_cached_shapes(data: dict[str, Any]) -> None:
    from django.db.models import FloatField, Func
    from django.db.models.functions import Now

    for build in (  # each built afresh: a queryset once read holds what its SQL compiled
        lambda: Product.objects.order_by("?").cache(),
        lambda: Product.objects.order_by("name", "?").cache(),
        lambda: Product.objects.annotate(t=Now()).cache(),
        lambda: Product.objects.extra(where=["1=1"]).cache(),
        lambda: Product.objects.annotate(
            r=Func(function="RANDOM", output_field=FloatField())
        ).cache(),
        lambda: Product.objects.annotate(
            r=Func(template="RANDOM()", output_field=FloatField())
        ).cache(),
    ):
        list(build())
        _, n = queries(lambda build=build: list(build()))
        assert n == 1


def test_models_setting_caches_without_cache_call(data: dict[str, Any]) -> None:
    from django.conf import settings
    from django.test import override_settings

    orm = {**settings.MCPATTERNS_ORM, "models": {"mcpatterns_orm_shop.product": {"ops": ["count"]}}}
    with override_settings(MCPATTERNS_ORM=orm):
        Product.objects.count()
        _, n = queries(lambda: Product.objects.count())
        assert n == 0
        _, n = queries(lambda: list(Product.objects.all()))
        assert n == 1
        _, n = queries(lambda: Product.objects.nocache().count())
        assert n == 1


class Status(models.TextChoices):
    LIVE = "live"
    DRAFT = "draft"


class Price(models.IntegerChoices):
    ONE = 1


@pytest.mark.parametrize("read", ["member", "text"])
@pytest.mark.parametrize("written", ["member", "text"])
def test_a_choices_member_pins_its_value(data: dict[str, Any], read: str, written: str) -> None:
    """A ``TextChoices`` member is the text the database compares: a query pinned by one
    and a row saved with the other share their stamps (its repr is not its text)."""
    status = Status.DRAFT if read == "member" else "draft"
    price = Price.ONE if read == "member" else 1

    def pinned() -> tuple[list[str], list[str]]:
        by_status = Product.objects.filter(status=status).order_by("pk").cache()
        by_price = Product.objects.filter(price=price).order_by("pk").cache()
        return [p.name for p in by_status], [p.name for p in by_price]

    assert pinned() == ([], ["p1"])
    product = data["products"][3]
    product.status = Status.DRAFT if written == "member" else "draft"
    product.price = Price.ONE if written == "member" else 1
    product.save()
    assert pinned() == (["p3"], ["p1", "p3"])
