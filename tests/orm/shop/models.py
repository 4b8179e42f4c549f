"""The shop the ORM cache tests run on: FKs, an M2M, a child model (multi-table inheritance).

An installed app of the test settings (cached instances unpickle through the
app registry); its tables are made by pytest-django on the default database and
by :func:`create_tables` on the PostgreSQL one.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import connections, models

LABEL = "mcpatterns_orm_shop"


class Category(models.Model):
    name = models.CharField(max_length=40)
    active = models.BooleanField(default=True)

    class Meta:
        app_label = LABEL


class Tag(models.Model):
    name = models.CharField(max_length=40)

    class Meta:
        app_label = LABEL


class Product(models.Model):
    name = models.CharField(max_length=60)
    category = models.ForeignKey(Category, models.CASCADE, related_name="products")
    price = models.IntegerField(default=0)
    status = models.CharField(max_length=10, default="live")
    supplier = models.ForeignKey(
        Category, models.SET_NULL, null=True, blank=True, related_name="supplied"
    )
    tags = models.ManyToManyField(Tag, related_name="products", blank=True)

    class Meta:
        app_label = LABEL
        ordering = ["id"]


class Special(Product):
    """A product with more columns in a table of its own."""

    badge = models.CharField(max_length=20, default="new")

    class Meta:
        app_label = LABEL


class FeaturedQuerySet(models.QuerySet["Featured"]):
    def live(self) -> FeaturedQuerySet:
        return self.filter(status="live")


class PricedQuerySet(models.QuerySet["Featured"]):
    """A queryset whose own ``__init__`` changes the query it starts from."""

    def __init__(self, model: Any = None, query: Any = None, using: Any = None, hints: Any = None):
        super().__init__(model, query, using, hints)
        if query is None and model is not None:
            self.query.add_q(models.Q(price__gt=0))


SCOPE = ["live"]
"""The status :class:`ScopedQuerySet` adds to every filter (state no call names)."""


class ScopedQuerySet(models.QuerySet["Scoped"]):
    """A queryset whose own building adds a condition from state outside the calls."""

    def _filter_or_exclude_inplace(self, negate: bool, args: Any, kwargs: Any) -> None:
        # Django's private method (not in every django-stubs release), called by name.
        inplace = super()._filter_or_exclude_inplace  # type: ignore[misc,unused-ignore]
        inplace(negate, args, {**kwargs, "status": SCOPE[0]})


class Scoped(Product):
    objects: ClassVar[Any] = models.Manager.from_queryset(ScopedQuerySet)()

    class Meta:
        app_label = LABEL
        proxy = True


class Featured(Product):
    """A proxy with managers made from custom querysets."""

    objects: ClassVar[Any] = models.Manager.from_queryset(FeaturedQuerySet)()
    odd = models.Manager.from_queryset(PricedQuerySet)()

    class Meta:
        app_label = LABEL
        proxy = True


class Event(models.Model):
    """A datetime: its date lookups are compiled in the active time zone."""

    at = models.DateTimeField()

    class Meta:
        app_label = LABEL


MODELS: list[type[models.Model]] = [Category, Tag, Product, Special]


def create_tables(using: str = "default") -> None:
    with connections[using].schema_editor() as editor:
        for model in MODELS:
            editor.create_model(model)


def drop_tables(using: str = "default") -> None:
    with connections[using].schema_editor() as editor:
        for model in reversed(MODELS):
            editor.delete_model(model)


def snapshot(value: Any) -> Any:
    """A result as plain data, for comparing cached and uncached reads."""
    from django_mcpatterns.orm.audit import comparable

    return comparable(value)
