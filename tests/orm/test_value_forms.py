"""Value forms: one database value, written and read in different Python forms, has one stamp.

A query pinning ``field=value`` depends on the stamp of the value's canonical text
(``orm.pins``); a writer renews the stamps of a row's old and new values.  Every form
a user may give (a choices member, a str or int subclass, a to_field instance, an
expression, a date subclass...) and every write path must land on the same stamp, or
a write does not void a cached read: a stale read.  Fields whose stored or compared
form is not their Python value (a lower-casing field, a case-insensitive column type,
``char(n)``) are not pinned at all.  Also: tables joined only when the SQL is compiled
(``select_related``, ordering across a relation, a parent's table) are read by the plan.
Found by review; each test failed before its fix.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import models
from django.db.models import F, Value
from django.db.models.functions import Lower

from tests.orm.shop.models import LABEL, Category, Product

pytestmark = pytest.mark.django_db(transaction=True)


class Supplier(models.Model):
    code = models.CharField(max_length=10, unique=True)

    class Meta:
        app_label = LABEL


class LowerField(models.CharField):
    """Stores lower case (a common e-mail field): Django's get_prep_value is what is saved."""

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return value.lower() if isinstance(value, str) else value


class NoCaseField(models.CharField):
    """A case-insensitive column declared by its type, not by ``db_collation``."""

    def db_type(self, connection: Any) -> str:
        if connection.vendor == "postgresql":
            return "citext"
        return f"varchar({self.max_length}) COLLATE NOCASE"


class Item(models.Model):
    name = models.CharField(max_length=20, default="")
    status = models.CharField(max_length=10, default="live")
    price = models.IntegerField(default=0)
    supplier = models.ForeignKey(Supplier, models.CASCADE, to_field="code", null=True)
    email = LowerField(max_length=40, default="")
    code = NoCaseField(max_length=20, default="")

    class Meta:
        app_label = LABEL
        ordering = ["id"]


class Defaulted(models.Model):
    status = models.CharField(max_length=10, db_default="live")
    rank = models.IntegerField(db_default=1)

    class Meta:
        app_label = LABEL


class Pair(models.Model):
    pk = models.CompositePrimaryKey("a", "b")
    a = models.IntegerField()
    b = models.IntegerField()
    status = models.CharField(max_length=10, default="live")

    class Meta:
        app_label = LABEL


SCRATCH = [Supplier, Item, Defaulted, Pair]


@pytest.fixture
def tables(shop: Any) -> str:
    """pytest-django made these tables with the shop's (models registered at import)."""
    return "default"


def both(qs: Any) -> tuple[list[Any], list[Any]]:
    """(cached, uncached) primary keys of ``qs``."""
    return [o.pk for o in qs.cache()], [o.pk for o in qs.nocache()]


def fresh(qs: Any) -> list[Any]:
    return [o.pk for o in qs.cache()]


# -- a to_field foreign key given an instance: update() and a related manager's add() --


def test_update_of_a_to_field_fk_given_an_instance(tables: str) -> None:
    s1 = Supplier.objects.create(code="one")
    s2 = Supplier.objects.create(code="two")
    item = Item.objects.create(supplier=s1)
    assert fresh(Item.objects.filter(supplier=s2)) == []
    Item.objects.filter(pk=item.pk).update(supplier=s2)
    cached, db = both(Item.objects.filter(supplier=s2))
    assert cached == db == [item.pk]


def test_related_manager_add_of_a_to_field_fk(tables: str) -> None:
    s1 = Supplier.objects.create(code="one")
    s2 = Supplier.objects.create(code="two")
    item = Item.objects.create(supplier=s1)
    assert fresh(Item.objects.filter(supplier="two")) == []
    s2.item_set.add(item)  # bulk: QuerySet.update(supplier=s2)
    cached, db = both(Item.objects.filter(supplier="two"))
    assert cached == db == [item.pk]


# -- a field whose saved form is not its Python value --


def test_a_field_that_prepares_its_value(tables: str) -> None:
    assert fresh(Item.objects.filter(email="a@x.org")) == []
    item = Item.objects.create(email="A@X.org")
    cached, db = both(Item.objects.filter(email="a@x.org"))
    assert cached == db == [item.pk]


def test_a_case_insensitive_column_type(tables: str) -> None:
    assert fresh(Item.objects.filter(code="abc")) == []
    item = Item.objects.create(code="ABC")
    cached, db = both(Item.objects.filter(code="abc"))
    assert cached == db == [item.pk]


# -- expressions a writer holds instead of the value saved --


@pytest.mark.parametrize(
    "value", [Value("draft"), Lower(Value("DRAFT")), F("name")], ids=["value", "lower", "F"]
)
def test_save_of_a_text_column_given_an_expression(tables: str, value: Any) -> None:
    item = Item.objects.create(name="draft")
    assert fresh(Item.objects.filter(status="draft")) == []
    item.status = value
    item.save()
    cached, db = both(Item.objects.filter(status="draft"))
    assert cached == db == [item.pk]


def test_create_of_a_text_column_given_an_expression(tables: str) -> None:
    assert fresh(Item.objects.filter(status="draft")) == []
    item = Item.objects.create(status=Lower(Value("DRAFT")))
    cached, db = both(Item.objects.filter(status="draft"))
    assert cached == db == [item.pk]


def test_bulk_update_of_a_text_column_given_an_expression(tables: str) -> None:
    item = Item.objects.create()
    assert fresh(Item.objects.filter(status="draft")) == []
    item.status = Value("draft")
    Item.objects.bulk_update([item], ["status"])
    cached, db = both(Item.objects.filter(status="draft"))
    assert cached == db == [item.pk]


def test_save_of_an_integer_given_f(tables: str) -> None:  # expected right: unknown -> table
    item = Item.objects.create(price=1)
    assert fresh(Item.objects.filter(price=2)) == []
    item.price = F("price") + 1
    item.save()
    cached, db = both(Item.objects.filter(price=2))
    assert cached == db == [item.pk]


# -- bulk_update: duplicates, and a primary key in another form --


def test_bulk_update_with_duplicates(tables: str) -> None:
    item = Item.objects.create()
    first, second = Item.objects.get(pk=item.pk), Item.objects.get(pk=item.pk)
    first.status, second.status = "draft", "gone"
    assert fresh(Item.objects.filter(status="draft")) == []
    Item.objects.bulk_update([first, second], ["status"])  # Django: the first one wins
    assert Item.objects.nocache().get(pk=item.pk).status == "draft"
    cached, db = both(Item.objects.filter(status="draft"))
    assert cached == db == [item.pk]


def test_bulk_update_given_a_primary_key_as_text(tables: str) -> None:
    item = Item.objects.create()
    assert fresh(Item.objects.filter(status="draft")) == []
    Item.objects.bulk_update([Item(pk=str(item.pk), status="draft")], ["status"])
    cached, db = both(Item.objects.filter(status="draft"))
    assert cached == db == [item.pk]


# -- values known only to the database, a composite key --


def test_db_default(tables: str) -> None:
    assert fresh(Defaulted.objects.filter(status="live")) == []
    assert fresh(Defaulted.objects.filter(rank=1)) == []
    row = Defaulted.objects.create()
    assert both(Defaulted.objects.filter(status="live")) == ([row.pk], [row.pk])
    assert both(Defaulted.objects.filter(rank=1)) == ([row.pk], [row.pk])


def test_composite_primary_key(tables: str) -> None:
    row = Pair.objects.create(a=1, b=2)
    assert fresh(Pair.objects.filter(status="draft")) == []
    assert fresh(Pair.objects.filter(a=1, b=2)) == [(1, 2)]
    row.status = "draft"
    row.save()
    assert both(Pair.objects.filter(status="draft")) == ([(1, 2)], [(1, 2)])
    Pair.objects.filter(a=1).update(status="gone")
    assert both(Pair.objects.filter(status="gone")) == ([(1, 2)], [(1, 2)])
    Pair.objects.bulk_update([Pair(a=1, b=2, status="x")], ["status"])
    assert both(Pair.objects.filter(status="x")) == ([(1, 2)], [(1, 2)])
    row.delete()
    assert both(Pair.objects.filter(status="x")) == ([], [])


# -- a key that is not the query: a value whose repr is not its value --


class Masked(str):
    def __repr__(self) -> str:
        return "Masked(***)"


def test_values_with_one_repr_are_two_queries(tables: str) -> None:
    a = Item.objects.create(name="a")
    b = Item.objects.create(name="b")
    assert fresh(Item.objects.filter(name=Masked("a"))) == [a.pk]
    assert both(Item.objects.filter(name=Masked("b"))) == ([b.pk], [b.pk])


# -- m2m through a custom model whose key to the source is a to_field --


class Vendor(models.Model):
    code = models.CharField(max_length=10, unique=True)
    # Relations to the shop's models neither cascade nor add accessors: other test modules
    # delete shop rows on databases without these tables (the model-based test's PostgreSQL).
    tags = models.ManyToManyField("mcpatterns_orm_shop.Tag", through="VendorTag", related_name="+")

    class Meta:
        app_label = LABEL


class VendorTag(models.Model):
    vendor = models.ForeignKey(Vendor, models.CASCADE, to_field="code")
    tag = models.ForeignKey(
        "mcpatterns_orm_shop.Tag", models.DO_NOTHING, db_constraint=False, related_name="+"
    )

    class Meta:
        app_label = LABEL


def test_m2m_add_through_a_to_field_key(tables: str) -> None:
    from tests.orm.shop.models import Tag

    vendor = Vendor.objects.create(code="v1")
    tag = Tag.objects.create(name="t")
    assert fresh(VendorTag.objects.filter(vendor=vendor)) == []
    vendor.tags.add(tag)
    cached, db = both(VendorTag.objects.filter(vendor=vendor))
    assert cached == db
    assert len(db) == 1


def test_m2m_add_keeps_other_pairs_cached(tables: str) -> None:
    """Fine grain (issue 26, point 4): adding a tag to p2 leaves p1's pairs cached."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.orm.shop.models import Tag

    c = Category.objects.create(name="c")
    p1 = Product.objects.create(name="p1", category=c)
    p2 = Product.objects.create(name="p2", category=c)
    tag = Tag.objects.create(name="t")
    Through = Product.tags.through
    assert fresh(Through.objects.filter(product=p1)) == []
    p2.tags.add(tag)
    with CaptureQueriesContext(connection) as ctx:
        assert fresh(Through.objects.filter(product=p1)) == []
    assert len(ctx.captured_queries) == 0


# -- the base table read a second time (a self join, a subquery) by a pinned query --


class Node(models.Model):
    name = models.CharField(max_length=20)
    parent = models.ForeignKey("self", models.CASCADE, null=True, related_name="children")

    class Meta:
        app_label = LABEL


def test_select_related_of_a_self_fk(tables: str) -> None:
    root = Node.objects.create(name="root")
    Node.objects.create(name="leaf", parent=root)

    def names(qs: Any) -> list[str]:
        return [n.parent.name for n in qs.select_related("parent")]

    assert names(Node.objects.filter(parent=root).cache()) == ["root"]
    root.name = "ROOT"
    root.save()
    assert names(Node.objects.filter(parent=root).cache()) == ["ROOT"]


def test_select_related_of_another_table(tables: str) -> None:
    a = Category.objects.create(name="a")
    Product.objects.create(name="p1", category=a)

    def names() -> list[str]:
        qs = Product.objects.filter(status="live").select_related("category")
        return [p.category.name for p in qs.cache()]

    assert names() == ["a"]
    a.name = "A"
    a.save()
    assert names() == ["A"]


def test_order_by_a_related_column(tables: str) -> None:
    a = Category.objects.create(name="a")
    b = Category.objects.create(name="b")
    p1 = Product.objects.create(name="p1", category=a)
    p2 = Product.objects.create(name="p2", category=b)
    assert fresh(Product.objects.all().order_by("category__name")) == [p1.pk, p2.pk]
    a.name = "z"
    a.save()
    assert both(Product.objects.all().order_by("category__name")) == ([p2.pk, p1.pk],) * 2


def test_a_subquery_on_the_same_table(tables: str) -> None:
    a = Category.objects.create(name="a")
    b = Category.objects.create(name="b")
    p1 = Product.objects.create(name="p1", category=a, status="live")
    p2 = Product.objects.create(name="p2", category=b, status="live")
    p3 = Product.objects.create(name="p3", category=a, status="draft")
    drafts = Product.objects.filter(status="draft").values("category_id")

    def live() -> tuple[list[Any], list[Any]]:
        return both(Product.objects.filter(status="live", category__in=drafts))

    assert live() == ([p1.pk], [p1.pk])
    p3.category = b
    p3.save()
    assert live() == ([p2.pk], [p2.pk])


def test_a_child_read_after_a_write_through_the_parent(tables: str) -> None:
    """Multi-table inheritance: a child's rows hold the parent's columns, joined when the
    SQL is compiled; a write through the parent model changes them."""
    from tests.orm.shop.models import Special

    a = Category.objects.create(name="a")
    s = Special.objects.create(name="s", category=a)

    def names() -> list[str]:
        return [x.name for x in Special.objects.filter(badge="new").cache()]

    assert names() == ["s"]
    Product.objects.filter(pk=s.pk).update(name="renamed")
    assert names() == ["renamed"]


# -- expected right (checked) --


def test_checked_update_through_a_join(tables: str) -> None:
    a = Category.objects.create(name="a")
    b = Category.objects.create(name="b")
    p = Product.objects.create(name="p", category=a)
    assert fresh(Product.objects.filter(supplier=b)) == []
    Product.objects.filter(category__name="a").update(supplier=b)
    assert both(Product.objects.filter(supplier=b)) == ([p.pk], [p.pk])


def test_checked_deferred_save(tables: str) -> None:
    a = Category.objects.create(name="a")
    p = Product.objects.create(name="p", category=a, status="live")
    assert fresh(Product.objects.filter(status="draft", category=a)) == []
    d = Product.objects.nocache().only("name").get(pk=p.pk)
    d.status = "draft"
    d.save()
    assert both(Product.objects.filter(status="draft", category=a)) == ([p.pk], [p.pk])


def test_checked_upsert(tables: str) -> None:
    s1 = Supplier.objects.create(code="one")
    assert fresh(Supplier.objects.filter(code="one", pk=s1.pk)) == [s1.pk]
    Item.objects.create(name="i", status="live")
    assert fresh(Item.objects.filter(name="i", status="draft")) == []
    Supplier.objects.bulk_create(
        [Supplier(code="one")],
        update_conflicts=True,
        unique_fields=["code"],
        update_fields=["code"],
    )
    it = Item.objects.nocache().get(name="i")
    Item.objects.bulk_create(
        [Item(pk=it.pk, name="i", status="draft")],
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["status"],
    )
    assert both(Item.objects.filter(name="i", status="draft")) == ([it.pk], [it.pk])


def test_checked_parent_field_through_child(tables: str) -> None:
    from tests.orm.shop.models import Special

    a = Category.objects.create(name="a")
    s = Special.objects.create(name="s", category=a, status="live")
    assert fresh(Product.objects.filter(status="draft")) == []
    s.status = "draft"
    s.save()
    assert both(Product.objects.filter(status="draft")) == ([s.pk], [s.pk])
    Special.objects.filter(pk=s.pk).update(status="gone")
    assert both(Product.objects.filter(status="gone")) == ([s.pk], [s.pk])
    assert both(Special.objects.filter(pk=s.pk, badge="new")) == ([s.pk], [s.pk])
    Product.objects.filter(pk=s.pk).update(name="renamed")
    assert [x.name for x in Special.objects.filter(pk=s.pk).cache()] == ["renamed"]


def test_checked_uuid_and_date_forms_on_save(tables: str) -> None:
    u = uuid.uuid4()
    assert fresh(Forms.objects.filter(uid=u)) == []
    assert fresh(Forms.objects.filter(day=datetime.date(2026, 1, 1))) == []
    f = Forms.objects.create(uid=str(u).upper(), day="2026-01-01")
    assert both(Forms.objects.filter(uid=u)) == ([f.pk], [f.pk])
    assert both(Forms.objects.filter(day=datetime.date(2026, 1, 1))) == ([f.pk], [f.pk])


# -- PostgreSQL: citext, char(n) --


class FixedField(models.CharField):
    """``char(n)``: PostgreSQL pads it, and compares it without its trailing spaces."""

    def db_type(self, connection: Any) -> str:
        return f"char({self.max_length})"


class Coded(models.Model):
    code = NoCaseField(max_length=20, default="")
    fixed = FixedField(max_length=8, default="")
    status = models.CharField(max_length=10, default="live")
    supplier = models.ForeignKey(Supplier, models.CASCADE, to_field="code", null=True)

    class Meta:
        app_label = LABEL


@pytest.fixture
def pgtables(pg: str, shop: Any) -> Any:
    from django.db import connections

    with connections[pg].cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS citext")
    with connections[pg].schema_editor() as editor:
        editor.create_model(Supplier)
        editor.create_model(Coded)
    try:
        yield pg
    finally:
        with connections[pg].schema_editor() as editor:
            editor.delete_model(Coded)
            editor.delete_model(Supplier)


def test_pg_citext(pgtables: str) -> None:
    objects = Coded.objects.using(pgtables)
    assert fresh(objects.filter(code="abc")) == []
    row = objects.create(code="ABC")
    cached, db = both(objects.filter(code="abc"))
    assert cached == db == [row.pk]


def test_pg_char_n_trailing_spaces(pgtables: str) -> None:
    objects = Coded.objects.using(pgtables)
    assert fresh(objects.filter(fixed="ab")) == []
    row = objects.create(fixed="ab  ")
    cached, db = both(objects.filter(fixed="ab"))
    assert cached == db == [row.pk]


def test_pg_update_of_a_to_field_fk(pgtables: str) -> None:
    s1 = Supplier.objects.using(pgtables).create(code="one")
    s2 = Supplier.objects.using(pgtables).create(code="two")
    objects = Coded.objects.using(pgtables)
    row = objects.create(supplier=s1)
    assert fresh(objects.filter(supplier=s2)) == []
    objects.filter(pk=row.pk).update(supplier=s2)
    cached, db = both(objects.filter(supplier=s2))
    assert cached == db == [row.pk]


def test_pg_save_of_text_given_an_expression(pgtables: str) -> None:
    objects = Coded.objects.using(pgtables)
    row = objects.create()
    assert fresh(objects.filter(status="draft")) == []
    row.status = Lower(Value("DRAFT"))
    row.save(using=pgtables)
    cached, db = both(objects.filter(status="draft"))
    assert cached == db == [row.pk]


# -- Hypothesis: every written form and read form of one value share a stamp --

import datetime  # noqa: E402
import decimal  # noqa: E402
import uuid  # noqa: E402

from django.utils.safestring import SafeString  # noqa: E402
from django.utils.translation import gettext_lazy  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from django_mcpatterns.orm.pins import pins, row_values  # noqa: E402


class Forms(models.Model):
    n = models.IntegerField(null=True)
    flag = models.BooleanField(null=True)
    uid = models.UUIDField(null=True)
    day = models.DateField(null=True)
    text = models.CharField(max_length=20, null=True)
    cat = models.ForeignKey(
        Category, models.DO_NOTHING, null=True, db_constraint=False, related_name="+"
    )

    class Meta:
        app_label = LABEL


class Shout(str):
    def __str__(self) -> str:
        return self.upper()

    def __repr__(self) -> str:
        return "Shout()"


class Level(models.IntegerChoices):
    ONE = 1
    TWO = 2


def int_forms(v: int) -> list[Any]:
    forms: list[Any] = [v, str(v), f" {v} ", float(v), decimal.Decimal(v), v + 0.4]
    if v in (0, 1):
        forms.append(bool(v))
    if v in (1, 2):
        forms.append(Level(v))
    return forms


def bool_forms(v: bool) -> list[Any]:
    return [v, int(v), str(int(v)), "t" if v else "f", str(v), float(v)]


def uuid_forms(v: uuid.UUID) -> list[Any]:
    return [v, str(v), v.hex, str(v).upper(), v.hex.upper(), v.int]


def date_forms(v: datetime.date) -> list[Any]:
    utc = datetime.UTC
    return [
        v,
        MyDate(v.year, v.month, v.day),
        v.isoformat(),
        datetime.datetime(v.year, v.month, v.day, 12, 0),
        datetime.datetime(v.year, v.month, v.day, 12, 0, tzinfo=utc),
        datetime.datetime(v.year, v.month, v.day, 23, 30, tzinfo=utc),
        datetime.datetime(
            v.year, v.month, v.day, 0, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=5))
        ),
    ]


def text_forms(v: str) -> list[Any]:
    return [v, SafeString(v), gettext_lazy(v), Shout(v), v + " ", v.upper(), f"{v}\u0301"]


FIELDS = {
    "n": st.integers(-3, 3).map(int_forms),
    "flag": st.booleans().map(bool_forms),
    "uid": st.uuids().map(uuid_forms),
    "day": st.dates(datetime.date(1999, 12, 30), datetime.date(2001, 1, 2)).map(date_forms),
    "text": st.sampled_from(["a", "Ab", "x y", "é"]).map(text_forms),
}


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_written_and_read_forms_share_a_stamp(tables: str, data: Any) -> None:
    name = data.draw(st.sampled_from(sorted(FIELDS)))
    forms = data.draw(FIELDS[name])
    written = data.draw(st.sampled_from(forms))
    read = data.draw(st.sampled_from(forms))
    Forms.objects.all().delete()
    try:
        obj = Forms(**{name: written})
        obj.save()
    except Exception:
        return  # a form Django cannot save
    try:
        qs = Forms.objects.nocache().filter(**{name: read})
        matches = qs.filter(pk=obj.pk).exists()
    except Exception:
        return  # a form Django cannot query
    if not matches:
        return
    found = pins(qs.query, "sqlite")
    assert found is not None
    _, combos = found
    mine = row_values(Forms, obj, "default")
    field = Forms._meta.get_field(name)
    assert field.attname in mine, (written, read)
    assert (mine[field.attname],) in combos, (written, read, mine[field.attname], combos)


def test_fk_forms_share_a_stamp(tables: str) -> None:
    c = Category.objects.create(name="c")
    for written in (c, c.pk, str(c.pk)):
        for read in (c, c.pk, str(c.pk)):
            obj = Forms(cat=written) if isinstance(written, Category) else Forms(cat_id=written)
            obj.save()
            qs = Forms.objects.nocache().filter(cat=read)
            assert qs.filter(pk=obj.pk).exists()
            _, combos = pins(qs.query, "sqlite") or ((), [])
            assert (row_values(Forms, obj, "default")["cat_id"],) in combos


class MyDate(datetime.date):
    """A date subclass, as freezegun's FakeDate or pendulum's Date: its repr names it."""


def test_a_date_subclass_written(tables: str) -> None:
    assert fresh(Forms.objects.filter(day=datetime.date(2026, 1, 1))) == []
    f = Forms.objects.create(day=MyDate(2026, 1, 1))
    assert both(Forms.objects.filter(day=datetime.date(2026, 1, 1))) == ([f.pk], [f.pk])
