"""Cached rows, both forms, where the data is not what packing usually meets: rows that
lead back to each other (select_related on a one-to-one), nesting deeper than the
interpreter recurses, a class that object.__new__ cannot make, a list changed while read."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from django.db.models import Model
from django.db.models.base import ModelState

from django_mcpatterns.core.protocol import compiled
from django_mcpatterns.orm import rows
from tests.orm.shop.models import Category, Product, Special

ARGS_PACK = (rows._labels, rows._label, Model, rows._names)
ARGS_UNPACK = (rows._classes, rows._model, ModelState)
PACK = [
    pytest.param(rows._pack_rows, id="pure"),
    pytest.param(
        compiled.pack_rows,
        id="compiled",
        marks=pytest.mark.skipif(compiled.pack_rows is None, reason="not built"),
    ),
]
UNPACK = [
    pytest.param(rows._unpack_rows, id="pure"),
    pytest.param(
        compiled.unpack_rows,
        id="compiled",
        marks=pytest.mark.skipif(compiled.unpack_rows is None, reason="not built"),
    ),
]


def one_to_one() -> tuple[Product, Special]:
    """A product and its special, each in the other's cache, as
    ``Product.objects.select_related("special")`` leaves them."""
    p = Product.from_db("default", None, (1, "p", 2, 3, "live", None))
    s = Special.from_db("default", None, (1, "p", 2, 3, "live", None, 1, "b"))
    p._state.fields_cache["special"] = s
    s._state.fields_cache["product_ptr"] = p
    return p, s


@pytest.mark.parametrize("pack", PACK)
def test_rows_that_lead_back_to_each_other_are_stored_as_they_are(pack: Any) -> None:
    p, s = one_to_one()
    c = Category.from_db("default", None, (2, "c", True))
    assert pack([c, p], *ARGS_PACK) is None
    assert pack([s], *ARGS_PACK) is None
    shared = Category.from_db("default", None, (3, "d", True))  # no cycle: held twice
    q = Product.from_db("default", None, (4, "q", 3, 3, "live", 3))
    q._state.fields_cache["category"] = shared
    q._state.fields_cache["supplier"] = shared
    packed = pack([q, q], *ARGS_PACK)
    assert packed is not None
    assert len(packed) == 2


def test_a_one_to_one_pair_is_cached_and_read_back_whole() -> None:
    p, _ = one_to_one()
    stored = rows.pack([p])
    assert stored == [p]
    (again,) = rows.unpack(pickle.loads(pickle.dumps(stored)))
    assert again._state.fields_cache["special"]._state.fields_cache["product_ptr"] is again


@pytest.mark.parametrize("unpack", UNPACK)
def test_rows_nested_deeper_than_the_interpreter_recurses_are_refused(unpack: Any) -> None:
    row: Any = ("mcpatterns_orm_shop.category", "default", ("id",), (1,), {})
    for _ in range(200_000):
        row = ("mcpatterns_orm_shop.category", "default", ("id",), (1,), {"up": row})
    with pytest.raises(RecursionError):
        unpack([row], *ARGS_UNPACK)


@pytest.mark.parametrize("unpack", UNPACK)
@pytest.mark.parametrize("cls", [dict, int, KeyError])
def test_a_label_of_a_class_object_new_cannot_make_is_refused(unpack: Any, cls: type) -> None:
    with pytest.raises(TypeError):
        unpack([("x", "default", (), (), {})], {"x": cls}, rows._model, ModelState)


@pytest.mark.parametrize("pack", PACK)
def test_rows_emptied_while_checked_are_packed_as_they_are_then(pack: Any) -> None:
    made = [Category.from_db("default", None, (i, "c", True)) for i in range(3)]

    class Emptying(type):
        def __instancecheck__(cls, obj: Any) -> bool:
            made.clear()
            return True

    class Anything(metaclass=Emptying):
        pass

    assert pack(made, rows._labels, rows._label, Anything, rows._names) == []
