"""Compiled statements (``orm.statements``): a cached query's SQL compiled once per plan.

A miss after the first runs the statement the plan's first miss compiled: the same SQL
on the current thread's connection, the rows made by Django's ``ModelIterable``.  What
a user relies on: a refill returns what Django's own read returns (rows, related objects,
one query), from any thread, and shapes a statement cannot keep are read Django's way.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections, models
from django.db.models import Exists, OuterRef
from django.db.models.query import ModelIterable
from django.db.models.sql.compiler import SQLCompiler
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_mcpatterns.orm import invalidate_all, invalidate_obj
from django_mcpatterns.orm import statements as orm_statements
from django_mcpatterns.orm.reads import reader
from tests.orm.shop.models import Category, Product

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cats(shop: Any) -> list[Category]:
    found = [Category.objects.create(name=f"c{i}") for i in range(2)]
    for i in range(8):
        Product.objects.create(name=f"p{i}", category=found[i % 2], price=i, status="live")
    return found


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL Django compiles for SELECTs while the test runs (a spy, Django's logic)."""
    compiled: list[str] = []
    original = SQLCompiler.as_sql

    def as_sql(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
        sql, params = original(self, *args, **kwargs)
        compiled.append(sql)
        return sql, params

    monkeypatch.setattr(SQLCompiler, "as_sql", as_sql)
    return compiled


def page(cat: Category, first: bool = True) -> list[Product]:
    """The page query, spelled ``.cache()`` first (recorded) or last (Django's Query)."""
    if first:
        qs = Product.objects.cache().filter(category=cat, status="live")
        return list(qs.select_related("category").order_by("-price", "pk")[:3])
    qs = Product.objects.filter(category=cat, status="live").select_related("category")
    return list(qs.order_by("-price", "pk").cache()[:3])


def uncached(cat: Category) -> list[tuple[int, int, str]]:
    qs = Product.objects.nocache().filter(category=cat, status="live").select_related("category")
    return [(p.pk, p.price, p.category.name) for p in qs.order_by("-price", "pk")[:3]]


def seen(products: list[Product]) -> list[tuple[int, int, str]]:
    return [(p.pk, p.price, p.category.name) for p in products]


def write(cat: Category) -> None:
    """A write to one of ``cat``'s products: the cached page is void."""
    product = Product.objects.nocache().filter(category=cat).order_by("price")[0]
    product.price += 100
    product.save()


def refill(cat: Category, read: Callable[[], list[Product]]) -> list[Product]:
    write(cat)
    return read()


@pytest.mark.parametrize("first", [True, False], ids=["cache-first", "cache-last"])
def test_a_refill_runs_the_statement_its_plan_compiled(
    cats: list[Category], compiles: list[str], first: bool
) -> None:
    page(cats[0], first)  # the plan's first miss compiles its statement
    write(cats[0])
    compiles.clear()
    with CaptureQueriesContext(connection) as ctx:
        refilled = page(cats[0], first)
    assert compiles == []  # nothing compiled: the statement ran
    assert len(ctx.captured_queries) == 1  # the page, its category joined
    assert seen(refilled) == uncached(cats[0])  # and the write is in it
    assert refilled[0].price >= 100


def test_related_objects_of_a_refill_cost_no_query(cats: list[Category]) -> None:
    page(cats[1])
    refilled = refill(cats[1], lambda: page(cats[1]))
    with CaptureQueriesContext(connection) as ctx:
        names = {p.category.name for p in refilled}
    assert names == {"c1"}
    assert ctx.captured_queries == []


def test_two_values_two_statements(cats: list[Category]) -> None:
    """The plan holds the values: a statement never answers another value's query."""
    assert seen(page(cats[0])) == uncached(cats[0])
    assert seen(page(cats[1])) == uncached(cats[1])
    assert seen(refill(cats[0], lambda: page(cats[0]))) == uncached(cats[0])
    assert seen(refill(cats[1], lambda: page(cats[1]))) == uncached(cats[1])


def test_a_statement_runs_on_each_threads_own_connection(cats: list[Category]) -> None:
    """Compiled in this thread, refilled in another: the other thread's connection runs
    it (SQLite refuses a connection used from a thread that did not open it)."""
    page(cats[0])
    got: list[Any] = []

    def other() -> None:
        try:
            got.append(seen(refill(cats[0], lambda: page(cats[0]))))
        except BaseException as error:  # reported to the test's thread
            got.append(error)
        finally:  # Django keeps an in-memory SQLite database's connection open: close it
            raw = connections["default"].connection
            if raw is not None:
                raw.close()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert got == [uncached(cats[0])]


def test_an_empty_in_list_is_read_djangos_way(cats: list[Category]) -> None:
    """Django finds ``pk__in=[]`` empty before running anything: no statement to keep."""
    qs = Product.objects.filter(pk__in=[]).cache()
    assert list(qs) == []
    invalidate_obj(Product.objects.nocache().first())
    with CaptureQueriesContext(connection) as ctx:
        assert list(Product.objects.filter(pk__in=[]).cache()) == []
    assert ctx.captured_queries == []


def test_values_are_read_djangos_way(cats: list[Category]) -> None:
    def names() -> list[dict[str, Any]]:
        qs = Product.objects.cache().filter(category=cats[0]).order_by("pk")
        return list(qs.values("name", "category__name"))

    assert names() == [{"name": f"p{i}", "category__name": "c0"} for i in (0, 2, 4, 6)]
    product = Product.objects.nocache().get(name="p0")
    product.name = "renamed"
    product.save()
    assert names()[0] == {"name": "renamed", "category__name": "c0"}


class _Document(str):
    """A parameter of a type a statement cannot know to be immutable."""


def test_a_parameter_that_may_change_is_never_kept(
    cats: list[Category], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parameter that is not a plain immutable value (a JSON document's adapter, an
    array) could change after compiling: such a plan is compiled again on each miss."""
    original = SQLCompiler.as_sql

    def as_sql(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
        sql, params = original(self, *args, **kwargs)
        return sql, [_Document(p) if type(p) is str else p for p in params]

    monkeypatch.setattr(SQLCompiler, "as_sql", as_sql)

    def names() -> list[str]:
        qs = Product.objects.filter(category=cats[0], status="live").order_by("pk").cache()
        return [p.name for p in qs]

    assert names() == ["p0", "p2", "p4", "p6"]
    qs = Product.objects.filter(category=cats[0], status="live").order_by("pk").cache()
    planned = reader().plan(qs.query, qs.db, "fetch", ModelIterable, None)
    assert planned is not None
    assert planned.statement is orm_statements.DJANGO
    assert [p.name for p in refill(cats[0], lambda: list(qs))] == ["p0", "p2", "p4", "p6"]


def test_postgres_refills_run_the_statement(pg: str, shop: Any, compiles: list[str]) -> None:
    cat = Category.objects.using(pg).create(name="a")
    for i in range(4):
        Product.objects.using(pg).create(name=f"p{i}", category=cat, price=i, status="live")

    def read() -> list[tuple[str, int, str]]:
        qs = Product.objects.cache().using(pg).filter(category=cat, status="live")
        rows = qs.select_related("category").order_by("-price", "pk")[:2]
        return [(p.name, p.price, p.category.name) for p in rows]

    assert read() == [("p3", 3, "a"), ("p2", 2, "a")]
    product = Product.objects.using(pg).get(name="p0")
    product.price = 9
    product.save(using=pg)
    compiles.clear()
    with CaptureQueriesContext(connections[pg]) as ctx:
        assert read() == [("p0", 9, "a"), ("p3", 3, "a")]
    assert compiles == []
    assert len(ctx.captured_queries) == 1


def test_a_process_keeps_a_bounded_number_of_statements(
    cats: list[Category], monkeypatch: pytest.MonkeyPatch, compiles: list[str]
) -> None:
    """Past ``BUDGET`` bytes, the oldest statements are dropped: their plans compile again."""
    monkeypatch.setattr(orm_statements, "BUDGET", 1)  # room for the newest only
    monkeypatch.setattr(orm_statements, "_kept", orm_statements.deque())
    monkeypatch.setattr(orm_statements, "_held", [0])
    page(cats[0])
    page(cats[1])  # the second plan's statement drops the first's
    for compiled in (1, 0):  # compiled again, then kept again
        write(cats[0])
        expected = uncached(cats[0])
        compiles.clear()
        assert seen(page(cats[0])) == expected
        assert len(compiles) == compiled


def test_a_statement_keeps_no_value_alive(cats: list[Category]) -> None:
    """A statement keeps its parameters, not what the query was built from (an instance
    given to ``filter()``, with its caches: a request's user...)."""
    cat = Category.objects.nocache().get(pk=cats[1].pk)
    cat.load = list(range(1000))  # type: ignore[attr-defined]
    alive = weakref.ref(cat)
    list(Product.objects.filter(category=cat, price__gte=0).cache())
    invalidate_obj(cat)
    list(cat.products.cache().filter(price__gte=1))  # type: ignore[attr-defined]
    del cat
    gc.collect()
    assert alive() is None


def test_a_subquery_is_read_djangos_way(cats: list[Category]) -> None:
    """A selected subquery's conditions hold the values they were built with: not kept."""
    cheap = Product.objects.filter(category=OuterRef("pk"), price__lt=2)
    qs = Category.objects.annotate(cheap=Exists(cheap)).order_by("pk").cache()
    assert [(c.name, c.cheap) for c in qs] == [("c0", True), ("c1", True)]
    planned = reader().plan(qs.query, qs.db, "fetch", ModelIterable, None)
    assert planned is not None
    assert planned.statement is orm_statements.DJANGO


class Status(models.TextChoices):
    LIVE = "live"


def test_a_choices_member_is_a_value_kept(cats: list[Category], compiles: list[str]) -> None:
    def live() -> list[str]:
        return [p.name for p in Product.objects.cache().filter(status=Status.LIVE, price__lt=3)]

    assert live() == ["p0", "p1", "p2"]
    write(cats[0])
    compiles.clear()
    assert live() == ["p1", "p2"]  # p0 now costs 100
    assert compiles == []


class RoundRobin:
    """A read router balancing products over two aliases (Django's replica router's kind)."""

    turn = [0]

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        if model is not Product:
            return None
        self.turn[0] += 1
        return ("default", "pg")[self.turn[0] % 2]

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return None


def test_rows_are_of_the_database_the_statement_ran_on(pg: str, shop: Any) -> None:
    """A router asked again may answer another alias: each row says where it was read."""
    for db in ("default", pg):
        cat = Category.objects.using(db).create(name=db)
        Product.objects.using(db).create(name=f"from-{db}", category=cat)
    with override_settings(DATABASE_ROUTERS=[RoundRobin()]):
        for _ in range(4):
            invalidate_all()
            for product in Product.objects.cache().filter(price__gte=0):
                assert product.name == f"from-{product._state.db}"
