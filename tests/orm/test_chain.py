"""Recorded querysets (``orm.chain``): a chain seen before is read with the plan its Query had.

The plan kept by a chain's fingerprint must be the plan Django's Query for that chain
gets (the same result key, stamps and tables): that is what keeps a recorded read as
fresh as an eager one.  Hypothesis draws chains of filters, excludes, orderings,
``select_related`` and slices, in both spellings (``.cache()`` first, and a model
whose ``MCPATTERNS_ORM["models"]`` rule caches fetches).  Everything not recorded
materializes: Django's behaviour, only later.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import FieldError
from django.db import models, transaction
from django.db.models import F, Q
from django.db.models.query import ModelIterable
from django.test import override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_mcpatterns.orm import chain
from django_mcpatterns.orm import queryset as orm_queryset
from django_mcpatterns.orm.reads import reader
from tests.orm.shop.models import SCOPE, Category, Featured, Product, Scoped, Tag, snapshot

pytestmark = pytest.mark.django_db(transaction=True)

STATUSES = ["live", "draft", "gone"]
RULE = {"mcpatterns_orm_shop.product": {"ops": "all"}}


def _data() -> list[Category]:
    cats = list(Category.objects.nocache().order_by("pk"))
    if cats:
        return cats
    cats = [Category.objects.create(name=f"c{i}") for i in range(3)]
    for i in range(12):
        Product.objects.create(
            name=f"p{i}",
            category=cats[i % 3],
            price=i * 3 % 10,
            status=STATUSES[i % 3],
            supplier=None if i % 4 == 0 else cats[(i + 1) % 3],
        )
    return cats


Value = Callable[[list[Category]], Any]
_cat = st.integers(0, 2)
_values: dict[str, st.SearchStrategy[Value]] = {
    "category": _cat.map(lambda i: lambda c: c[i]),
    "category_id": _cat.map(lambda i: lambda c: c[i].pk),
    "category__exact": _cat.map(lambda i: lambda c: c[i]),
    "category__in": st.lists(_cat, max_size=3).map(lambda ix: lambda c: [c[i].pk for i in ix]),
    "supplier": (_cat.map(lambda i: lambda c: c[i]) | st.just(lambda c: None)),
    "status": st.sampled_from(STATUSES).map(lambda s: lambda c: s),
    "status__in": st.lists(st.sampled_from(STATUSES), max_size=3).map(
        lambda ss: lambda c: tuple(ss)
    ),
    "price__gte": st.integers(0, 10).map(lambda n: lambda c: n),
    "price": st.integers(0, 10).map(lambda n: lambda c: n),
    "supplier__isnull": st.booleans().map(lambda b: lambda c: b),
}
_kwargs = st.dictionaries(
    st.sampled_from(sorted(_values)), st.none(), min_size=1, max_size=3
).flatmap(lambda d: st.fixed_dictionaries({k: _values[k] for k in d}))
_step = st.one_of(
    st.tuples(st.sampled_from(["filter", "exclude"]), _kwargs),
    st.tuples(
        st.just("order_by"),
        st.lists(st.sampled_from(["price", "-price", "pk", "-name", "status"]), max_size=2),
    ),
    st.tuples(
        st.just("select_related"),
        st.lists(st.sampled_from(["category", "supplier"]), max_size=2, unique=True),
    ),
)
_slice = st.none() | st.tuples(st.integers(0, 3) | st.none(), st.integers(0, 8) | st.none())
Chain = tuple[list[tuple[str, Any]], tuple[int | None, int | None] | None]


def build(start: Any, steps: list[tuple[str, Any]], cut: Any, cats: list[Category]) -> Any:
    qs = start
    for name, arg in steps:
        if name in ("filter", "exclude"):
            qs = getattr(qs, name)(**{k: v(cats) for k, v in arg.items()})
        else:
            qs = getattr(qs, name)(*arg)
    if cut is not None:
        qs = qs[cut[0] : cut[1]]
    return qs


def eager_plan(qs: Any) -> Any:
    return reader().plan(qs.query, qs.db, "fetch", ModelIterable, None)


@pytest.fixture(params=["first", "rule"])
def spelling(request: pytest.FixtureRequest, shop: Any) -> Iterator[Callable[[], Any]]:
    """How a recorded queryset starts: ``.cache()`` first, or a rule caching the model."""
    if request.param == "first":
        yield lambda: Product.objects.cache()
        return
    with override_settings(MCPATTERNS_ORM={**settings.MCPATTERNS_ORM, "models": RULE}):
        yield lambda: Product.objects.all()


@hsettings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_step, max_size=4), _slice)
def test_a_recorded_chain_is_planned_as_its_query(
    spelling: Callable[[], Any], steps: list[tuple[str, Any]], cut: Any
) -> None:
    cats = _data()
    first = build(spelling(), steps, cut, cats)
    assert chain.recording(first) is not None
    eager = build(Product.objects.nocache().cache(), steps, cut, cats)
    assert chain.recording(eager) is None
    expected = eager_plan(eager)
    fresh = snapshot(list(eager.nocache()))
    assert snapshot(list(first)) == fresh  # the first: its Query built, its plan kept
    again = build(spelling(), steps, cut, cats)
    found = orm_queryset._planned(again, "fetch")
    assert chain.recording(again) is not None  # planned without a Query
    assert found is not None
    assert expected is not None
    planned = found[0]
    assert planned.plan == expected.plan
    assert planned.tables == expected.tables
    assert snapshot(list(again)) == fresh
    assert snapshot(list(build(spelling(), steps, cut, cats))) == fresh


def test_hits_build_no_query_and_writes_still_invalidate(shop: Any) -> None:
    cats = _data()

    def page() -> Any:
        return Product.objects.cache().filter(category=cats[0]).order_by("-price")[:3]

    assert [p.name for p in page()] == [
        p.name for p in Product.objects.filter(category=cats[0]).order_by("-price")[:3]
    ]
    qs = page()
    assert len(qs) == 3
    assert chain.recording(qs) is not None  # a hit: no Query was built
    Product.objects.filter(name="p0").update(price=99)
    assert page()[0].price == 99  # "p0" is in category 0: its stamp was renewed
    with transaction.atomic():
        Product.objects.filter(name="p3").update(price=100)
        assert page()[0].price == 100  # read your writes: bypassed (the plan was kept)


def test_same_plan_for_every_spelling(shop: Any) -> None:
    cats = _data()
    a = Product.objects.cache().filter(category=cats[1], status="live").order_by("pk")[:5]
    b = Product.objects.filter(status="live", category=cats[1].pk).order_by("pk").cache()[:5]
    list(a)
    again = Product.objects.cache().filter(category=cats[1], status="live").order_by("pk")[:5]
    found = orm_queryset._planned(again, "fetch")
    assert found is not None
    assert found[0].plan.key == eager_plan(b).plan.key


@pytest.mark.parametrize(
    "make",
    [
        lambda c: Product.objects.cache().filter(Q(category=c[0]) | Q(status="live")),
        lambda c: Product.objects.cache().filter(price=F("category_id")),
        lambda c: Product.objects.cache().filter(price=1.0),
        lambda c: Product.objects.cache().filter(category__in={c[0].pk}),
        lambda c: Product.objects.cache().filter(category__in=Category.objects.all()),
        lambda c: Product.objects.cache().filter(category__in=[c[0]]),
        lambda c: Product.objects.cache().order_by(F("price").desc()),
        lambda c: Product.objects.cache().values("name"),
        lambda c: Product.objects.cache().prefetch_related("tags"),
        lambda c: Product.objects.cache().annotate(n=F("price")),
        lambda c: Product.objects.cache().filter(category=c[0])[2:].filter(),
        lambda c: c[0].products.cache().all(),
    ],
)
def test_other_forms_are_djangos(shop: Any, make: Callable[[list[Category]], Any]) -> None:
    cats = _data()
    qs = make(cats)
    assert chain.recording(qs) is None
    list(qs)


def test_errors_surface_at_evaluation(shop: Any) -> None:
    _data()
    qs = Product.objects.cache().filter(nope=1)  # recorded: Django has not looked at it
    with pytest.raises(FieldError):
        list(qs)
    with pytest.raises(FieldError):
        qs.query  # noqa: B018
    with pytest.raises(FieldError):
        list(Product.objects.cache().order_by("nope"))
    with pytest.raises(ValueError, match="instance"):  # another model's: not recorded
        Product.objects.cache().filter(category=Tag.objects.create(name="t"))
    with pytest.raises(TypeError):
        Product.objects.cache()[:2].filter(status="live")
    with pytest.raises(ValueError, match="Negative"):
        Product.objects.cache()[-1:]


def test_the_queryset_api_on_a_recording(shop: Any) -> None:
    cats = _data()

    def make() -> Any:
        return Product.objects.cache().filter(category=cats[2]).select_related("category")

    expected = list(Product.objects.filter(category=cats[2]).select_related("category"))
    assert str(make().query) == str(
        Product.objects.filter(category=cats[2]).select_related("category").query
    )
    assert repr(make()) == repr(Product.objects.filter(category=cats[2]))
    assert len(make()) == len(expected)
    assert make()
    assert [p.pk for p in make()] == [p.pk for p in expected]
    assert make().count() == len(expected)
    assert make().exists()
    assert make().get(pk=expected[0].pk) == expected[0]
    assert make().first() == expected[0]
    assert make()[1] == expected[1]
    assert make().using("default").order_by("-pk")[0] == expected[-1]
    assert make().cache(timeout=5).filter().all()[:1][0] == expected[0]
    unpickled = pickle.loads(pickle.dumps(make()))
    assert list(unpickled) == expected
    assert str(unpickled.query) == str(make().query)
    with_tags = list(make().prefetch_related("tags"))
    assert with_tags == expected

    async def collect() -> list[Any]:
        return [p async for p in make()]

    assert asyncio.run(collect()) == expected
    assert asyncio.run(collect()) == expected  # a hit, in the event loop
    assert asyncio.run(make().acount()) == len(expected)
    assert asyncio.run(make().acount()) == len(expected)
    assert asyncio.run(make().aexists())
    assert chain.recording(Product.objects.nocache()) is None  # the benchmark's uncached side
    assert chain.recording(Product.objects.filter(category=cats[2]).cache()) is None


def test_managers(shop: Any) -> None:
    cats = _data()
    related = cats[0].products.all()
    assert chain.recording(related) is None
    with override_settings(MCPATTERNS_ORM={**settings.MCPATTERNS_ORM, "models": RULE}):
        assert chain.recording(Product.objects.all()) is not None
        assert chain.recording(cats[0].products.all()) is None
        assert list(cats[0].products.filter(status="live")) == list(
            Product.objects.nocache().filter(category=cats[0], status="live")
        )
        assert chain.recording(Product.objects.nocache()) is None
    live = Featured.objects.cache().live().filter(category=cats[1])
    assert chain.recording(live) is not None
    assert list(live) == list(Featured.objects.filter(status="live", category=cats[1]))
    assert chain.recording(Featured.odd.cache()) is None  # its queryset's __init__ is its own
    assert list(Featured.odd.cache().filter(category=cats[1])) == list(
        Featured.objects.filter(category=cats[1], price__gt=0)
    )


def test_values_are_read_when_recorded(shop: Any) -> None:
    cats = _data()
    ids = [cats[0].pk]
    qs = Product.objects.cache().filter(category__in=ids)
    ids.append(cats[1].pk)  # Django reads the list at filter(): so does a recording
    assert {p.category_id for p in qs} == {cats[0].pk}
    first = {p.category_id for p in Product.objects.cache().filter(category=cats[0])}
    Product.objects.filter(category=cats[0]).update(price=77)  # the result void, its plan kept
    moved = Category.objects.get(pk=cats[0].pk)
    qs = Product.objects.cache().filter(category=moved)  # Django reads the pk at filter()
    moved.pk = cats[1].pk  # as the `obj.pk = None; obj.save()` copy idiom does
    assert {p.category_id for p in qs} == first == {cats[0].pk}  # the call's pk, as Django's
    again = Product.objects.cache().filter(category=cats[0])  # nothing else stored under it
    assert {p.category_id for p in again} == {cats[0].pk}


def test_never_cached_chains_are_remembered_as_such(shop: Any) -> None:
    _data()
    for _ in range(2):
        qs = Product.objects.cache().order_by("?")
        assert orm_queryset._planned(qs, "fetch") is None
    assert len(list(Product.objects.cache().order_by("?"))) == 12


def test_querysets_that_build_their_own_way_never_record(shop: Any) -> None:
    cats = _data()
    assert chain.recording(Scoped.objects.cache()) is None
    pks = [c.pk for c in cats]
    for status in ("live", "draft"):
        SCOPE[0] = status
        try:
            found = {p.status for p in Scoped.objects.cache().filter(category__in=pks)}
        finally:
            SCOPE[0] = "live"
        assert found == {status}


CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("status", default="live")


class ContextFilter(models.QuerySet[Product]):
    """A tenant-style queryset: its filter() adds a condition read from a context."""

    def filter(self, *args: Any, **kwargs: Any) -> Any:
        return super().filter(*args, **{**kwargs, "status": CURRENT.get()})


class ContextBuild(models.QuerySet[Product]):
    """The same, read where Django builds the query."""

    def _filter_or_exclude(self, negate: bool, args: Any, kwargs: Any) -> Any:
        return super()._filter_or_exclude(negate, args, {**kwargs, "status": CURRENT.get()})


@pytest.mark.parametrize("kind", [ContextFilter, ContextBuild])
def test_querysets_that_read_a_context_never_record(shop: Any, kind: type) -> None:
    cats = _data()
    manager: Any = models.Manager.from_queryset(kind)()
    manager.model = Product
    manager.name = "ctx"
    assert chain.recording(manager.cache()) is None
    pks = [c.pk for c in cats]
    for status in ("live", "draft", "live"):
        token = CURRENT.set(status)
        try:
            qs = manager.cache().filter(category__in=pks)
        finally:
            CURRENT.reset(token)
        assert {p.status for p in qs} == {status}


def test_copies_and_pickles_of_a_recording(shop: Any) -> None:
    cats = _data()
    qs = Product.objects.cache().filter(category=cats[0]).order_by("-price")
    eager = Product.objects.nocache().filter(category=cats[0]).order_by("-price")
    expected = [p.pk for p in eager]
    live = [p.pk for p in eager.filter(status="live")]
    for made in (copy.deepcopy(qs), copy.copy(qs)):
        assert [p.pk for p in made] == expected
        assert [p.pk for p in made.filter(status="live")] == live
    assert [p.pk for p in qs] == expected
    state = pickle.loads(pickle.dumps(Product.objects.cache().filter(category=cats[0])))
    # pickled with its query built: a process without the ORM app reads the same query
    assert state.__dict__.get("_mcp_state") is None
    assert str(state.__dict__["_query"]) == str(Product.objects.filter(category=cats[0]).query)


def _live_pks() -> list[int]:
    return sorted(p.pk for p in Product.objects.nocache().filter(status="live"))


def test_a_querysets_query_changed_in_place_after_cache_leaves_the_recording_alone(
    shop: Any,
) -> None:
    """As in Django, a clone never sees its original's Query change afterwards."""
    _data()
    base = Product.objects.all()  # pristine, not recording (no rule): its Query is the base
    cached = base.cache().filter(status="live")
    base.query.add_q(Q(price__gt=5))  # legal in Django: changes base alone
    assert sorted(p.pk for p in cached) == _live_pks()
    assert sorted(p.pk for p in base) == sorted(
        p.pk for p in Product.objects.nocache().filter(price__gt=5)
    )


def test_a_querysets_query_changed_in_place_never_fills_a_kept_plans_key(shop: Any) -> None:
    """A miss of a chain whose plan is kept runs the recording's own query: rows of
    another query are never stored under the key every reader of the chain reads."""
    from django_mcpatterns import orm

    _data()
    list(Product.objects.cache().filter(status="live"))  # the chain's plan is kept
    orm.invalidate_model(Product)  # its result void
    base = Product.objects.all()
    cached = base.cache().filter(status="live")
    base.query.add_q(Q(price__gt=5))
    assert sorted(p.pk for p in cached) == _live_pks()  # the miss fills the chain's key
    assert sorted(p.pk for p in Product.objects.cache().filter(status="live")) == _live_pks()
