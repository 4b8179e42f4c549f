"""Cached rows: the compiled packing and unpacking answer as the pure-Python forms do.

Rows are made as Django's ``from_db`` makes them (no database needed): random field
values, deferred fields, annotations, related rows present, None or absent, nested,
the child of a multi-table model, another database alias.  Both forms must pack them
to the same data, and rebuild from it instances with the same class, attributes and
state, fresh on every unpacking.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import Model
from django.db.models.base import ModelState
from hypothesis import given, settings
from hypothesis import strategies as st

from django_mcpatterns.core.protocol import compiled
from django_mcpatterns.orm import rows
from tests.orm.shop.models import Category, Product, Special

needs_compiled = pytest.mark.skipif(
    compiled.pack_rows is None, reason=f"the compiled path is not built: {compiled.why_pure}"
)

names = st.text(max_size=8)
ids = st.integers(1, 2**40)
aliases = st.sampled_from(["default", "replica"])


@st.composite
def categories(draw: st.DrawFn) -> Category:
    return Category.from_db(draw(aliases), None, (draw(ids), draw(names), draw(st.booleans())))


@st.composite
def products(draw: st.DrawFn) -> Product:
    special = draw(st.booleans())
    values: list[Any] = [draw(ids), draw(names), draw(ids), draw(st.integers()), draw(names)]
    values.append(draw(st.none() | ids))
    if special:
        values += [values[0], draw(names)]  # product_ptr_id, badge
    cls = Special if special else Product
    obj = cls.from_db(draw(aliases), None, tuple(values))
    for name in draw(st.sets(st.sampled_from(["name", "price", "status"]))):
        del obj.__dict__[name]  # deferred (.only()/.defer())
    if draw(st.booleans()):
        obj.__dict__["n_tags"] = draw(st.integers())  # an annotation
    for field in ("category", "supplier"):
        related = draw(st.sampled_from(["absent", "none", "row"]))
        if related != "absent":
            obj._state.fields_cache[field] = None if related == "none" else draw(categories())
    if special and draw(st.booleans()):
        obj._state.fields_cache["product_ptr"] = Product.from_db(
            obj._state.db, None, (values[0], "", values[2], 0, "", None)
        )
    return obj


def shape(obj: Any) -> Any:
    """An instance as plain data: its class, attributes and state, related rows alike."""
    if not isinstance(obj, Model):
        return obj
    attributes = {k: v for k, v in obj.__dict__.items() if k != "_state"}
    state = dict(obj._state.__dict__)
    cache = state.pop("fields_cache", {})
    return (type(obj), attributes, state, {k: shape(v) for k, v in cache.items()})


ARGS_PACK = (rows._labels, rows._label, Model, rows._names)
ARGS_UNPACK = (rows._classes, rows._model, ModelState)


@given(st.lists(products(), min_size=1, max_size=8))
@settings(max_examples=150, deadline=None)
def test_the_pure_form_rebuilds_what_it_packed(made: list[Product]) -> None:
    packed = rows._pack_rows(made, *ARGS_PACK)
    assert packed is not None
    again = rows._unpack_rows(packed, *ARGS_UNPACK)
    assert [shape(o) for o in again] == [shape(o) for o in made]
    for obj in again:
        assert obj._state.adding is False


@needs_compiled
@given(st.lists(products(), min_size=1, max_size=8))
@settings(max_examples=150, deadline=None)
def test_both_forms_pack_and_unpack_alike(made: list[Product]) -> None:
    pure = rows._pack_rows(made, *ARGS_PACK)
    built = rows.pack_rows(made, *ARGS_PACK)
    assert built == pure
    assert built is not None
    first = rows.unpack_rows(built, *ARGS_UNPACK)
    second = rows.unpack_rows(built, *ARGS_UNPACK)
    expected = [shape(o) for o in rows._unpack_rows(built, *ARGS_UNPACK)]
    assert [shape(o) for o in first] == expected == [shape(o) for o in made]
    for a, b, row in zip(first, second, built, strict=True):  # fresh every time
        assert a is not b
        assert a._state is not b._state
        assert a.__dict__ is not b.__dict__
        assert "_state" not in row[2]


@pytest.mark.parametrize("pack", [rows._pack_rows, rows.pack_rows], ids=["pure", "compiled"])
def test_rows_that_are_not_plain_instances_are_not_packed(pack: Any) -> None:
    if pack is None:
        pytest.skip("the compiled path is not built")
    c = Category.from_db("default", None, (1, "c", True))
    prefetched = Category.from_db("default", None, (2, "d", True))
    prefetched._prefetched_objects_cache = {}
    assert pack([c, {"id": 1}], *ARGS_PACK) is None
    assert pack([c, prefetched], *ARGS_PACK) is None
    names = ("id", "name", "active")
    assert pack([c], *ARGS_PACK) == [
        ("mcpatterns_orm_shop.category", "default", names, (1, "c", True), {})
    ]


@pytest.mark.parametrize("pack", [rows._pack_rows, rows.pack_rows], ids=["pure", "compiled"])
def test_rows_with_the_same_attributes_share_one_names_tuple(pack: Any) -> None:
    if pack is None:
        pytest.skip("the compiled path is not built")
    made = [Category.from_db("default", None, (i, "c", True)) for i in range(3)]
    del made[2].__dict__["name"]
    known: dict[tuple[str, ...], tuple[str, ...]] = {}
    packed = pack(made, rows._labels, rows._label, Model, known)
    assert packed[0][2] is packed[1][2]
    assert packed[2][2] == ("id", "active")
    assert set(known) == {("id", "name", "active"), ("id", "active")}
    assert pack(made, rows._labels, rows._label, Model, known)[0][2] is packed[0][2]


def test_rows_stored_in_the_form_before_are_read() -> None:
    before = (
        "mcpatterns-orm-models",
        [
            (
                "mcpatterns_orm_shop.product",
                "default",
                {"id": 1, "name": "p", "category_id": 2, "price": 3, "status": "live"},
                {"category": ("mcpatterns_orm_shop.category", "default", {"id": 2}, {})},
            )
        ],
    )
    (p,) = rows.unpack(before)
    assert type(p) is Product
    assert (p.pk, p.price, p._state.db, p._state.adding) == (1, 3, "default", False)
    assert p.category.pk == 2


@needs_compiled
@pytest.mark.parametrize(
    "bad",
    [
        [("a", "default", (), ())],
        [["x", "default", (), (), {}]],
        [("x", "default", [], (), {})],
        [("x", "default", ("a",), (), {})],
        [("x", "default", (), (), [])],
        [1],
    ],
)
def test_the_compiled_unpacking_refuses_what_packing_never_makes(bad: list[Any]) -> None:
    with pytest.raises(TypeError):
        rows.unpack_rows(bad, *ARGS_UNPACK)


@pytest.mark.parametrize("unpack", [rows._unpack_rows, rows.unpack_rows], ids=["pure", "compiled"])
def test_a_class_not_known_yet_is_asked_for_by_its_label(unpack: Any) -> None:
    if unpack is None:
        pytest.skip("the compiled path is not built")
    c = Category.from_db("default", None, (1, "c", True))
    packed = rows._pack_rows([c, c], *ARGS_PACK)
    asked: list[str] = []

    def model_of(label: str) -> type[Model]:
        asked.append(label)
        return Category

    made = unpack(packed, {}, model_of, ModelState)
    assert [shape(o) for o in made] == [shape(c), shape(c)]
    assert asked == ["mcpatterns_orm_shop.category"] * 2
    with pytest.raises(LookupError):
        unpack(
            [("mcpatterns_orm_shop.nothing", "default", (), (), {})], {}, rows._model, ModelState
        )


# -- rows of one shape, stored by column -----------------------------------------------


@st.composite
def one_shape(draw: st.DrawFn) -> list[Product]:
    """Rows as one queryset makes them: one class, database, deferred set and related
    shape, only the values differ (a nested related row here and there)."""
    special = draw(st.booleans())
    db = draw(aliases)
    deferred = draw(st.sets(st.sampled_from(["name", "price", "status"])))
    annotated = draw(st.booleans())
    related = {
        f: draw(st.sampled_from(["absent", "none", "row"])) for f in ("category", "supplier")
    }
    made = []
    for _ in range(draw(st.integers(1, 6))):
        values: list[Any] = [draw(ids), draw(names), draw(ids), draw(st.integers()), draw(names)]
        values.append(draw(st.none() | ids))
        if special:
            values += [values[0], draw(names)]
        obj = (Special if special else Product).from_db(db, None, tuple(values))
        for name in deferred:
            del obj.__dict__[name]
        if annotated:
            obj.__dict__["n_tags"] = draw(st.integers())
        for field, mode in related.items():
            if mode != "absent":
                row = Category.from_db(db, None, (draw(ids), draw(names), draw(st.booleans())))
                obj._state.fields_cache[field] = None if mode == "none" else row
        made.append(obj)
    return made


def both_columns(made: list[Any]) -> Any:
    packed = rows._pack_rows(made, *ARGS_PACK)
    assert packed is not None
    pure = rows._columns(packed)
    if compiled.columns is not None:
        assert compiled.columns(packed) == pure
    return pure


@given(one_shape())
@settings(max_examples=150, deadline=None)
def test_rows_of_one_shape_are_stored_by_column_and_rebuilt_alike(made: list[Product]) -> None:
    group = both_columns(made)
    assert group is not None
    forms = [rows._unpack_columns]
    if compiled.unpack_columns is not None:
        forms.append(compiled.unpack_columns)
    for unpack in forms:
        first = unpack(group, *ARGS_UNPACK)
        second = unpack(group, *ARGS_UNPACK)
        assert [shape(o) for o in first] == [shape(o) for o in made]
        for a, b in zip(first, second, strict=True):  # fresh every time
            assert a is not b
            assert a._state is not b._state
            assert a._state.adding is False
    assert [shape(o) for o in rows.unpack(rows.pack(made))] == [shape(o) for o in made]


@given(st.lists(products(), min_size=1, max_size=6))
@settings(max_examples=150, deadline=None)
def test_rows_of_shapes_apart_are_judged_alike(made: list[Product]) -> None:
    group = both_columns(made)  # None unless the rows happen to share one shape
    stored = rows.pack(made)
    assert stored[0] == ("mcpatterns-orm-rows" if group is None else "mcpatterns-orm-columns")
    assert [shape(o) for o in rows.unpack(stored)] == [shape(o) for o in made]


def test_rows_apart_in_class_database_names_or_related_are_kept_by_row() -> None:
    def category(i: int, db: str = "default") -> Category:
        return Category.from_db(db, None, (i, "c", True))

    def product(related: Category | None) -> Product:
        p = Product.from_db("default", None, (1, "p", 2, 3, "live", None))
        p._state.fields_cache["category"] = related
        return p

    deferred = category(2)
    del deferred.__dict__["name"]
    for made in (
        [category(1), category(2, "replica")],
        [category(1), deferred],
        [product(category(1)), product(None)],
        [Product.from_db("default", None, (1, "p", 2, 3, "live", None)), category(1)],
    ):
        assert both_columns(made) is None
        assert rows.pack(made)[0] == "mcpatterns-orm-rows"
    assert both_columns([product(None), product(None)]) is not None  # all none: a plain column


@pytest.mark.parametrize(
    "unpack", [rows._unpack_columns, compiled.unpack_columns], ids=["pure", "compiled"]
)
def test_a_column_group_of_the_wrong_size_is_refused(unpack: Any) -> None:
    if unpack is None:
        pytest.skip("the compiled path is not built")
    names = ("id", "name", "active")
    label = "mcpatterns_orm_shop.category"
    with pytest.raises(TypeError):
        unpack((label, "default", names, [(1, "c", True)], {"x": [None, None]}), *ARGS_UNPACK)
    with pytest.raises(TypeError):
        unpack((label, "default", names, [(1, "c")], {}), *ARGS_UNPACK)


class Meddling(str):
    """A str whose comparison or hash runs Python code that changes the rows being read
    (nothing of this package makes one: the compiled forms must stay safe all the same);
    its hash stays the same however often it runs."""

    meddle: Any = None

    def __eq__(self, other: object) -> bool:
        if self.meddle is not None:
            self.meddle()
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        if self.meddle is not None:
            self.meddle()
        return str.__hash__(self)


@needs_compiled
def test_rows_changed_while_stored_by_column_are_read_as_given() -> None:
    """A label's __eq__ replaces a row of the list: the compiled form reads the rows as
    they were given (each held), not a freed row nor an int read as a row."""
    made = [Category.from_db("default", None, (i, "c", True)) for i in (1, 2, 3)]
    packed = rows._pack_rows(made, *ARGS_PACK)
    assert packed is not None
    label = Meddling(packed[1][0])
    packed[1] = (label, *packed[1][1:])
    given_values = [row[3] for row in packed]

    def replace() -> None:
        packed[1] = 2**100  # a heap int: read as a row's fourth item, outside the object
        label.meddle = None

    label.meddle = replace
    group = compiled.columns(packed)  # type: ignore[misc]
    assert group is not None
    assert group[3] == given_values


@needs_compiled
def test_rows_changed_while_unpacked_from_columns_are_refused() -> None:
    """A name's __hash__ empties the group's values, or a related column: the compiled
    form says so rather than read a freed row or past the column's end."""
    label = "mcpatterns_orm_shop.category"
    for emptied in ("values", "related"):
        values: list[Any] = [(1, "c", True), (2, "d", False)]
        related: list[Any] = [None, None]
        name = Meddling("name")
        name.meddle = (values if emptied == "values" else related).clear
        group = (label, "default", ("id", name, "active"), values, {"category": related})
        with pytest.raises(RuntimeError, match="changed while unpacked"):
            compiled.unpack_columns(group, *ARGS_UNPACK)  # type: ignore[misc]
