"""Cached rows in a compact form: model instances as their class, fields and related rows.

Pickling a model instance goes through ``Model.__reduce__`` (the app registry,
a version check, a pickled ``ModelState``) for every row and every
``select_related`` row: most of a warm read's time.  Instances are stored
instead as ``(label, db, names, values, related)`` and rebuilt as Django's own
``from_db`` leaves them (``_state.adding`` False, ``_state.db`` set), the
related rows in ``_state.fields_cache`` as ``select_related`` leaves them.
``names`` (the attributes, in order) is one tuple shared by the rows that have
the same ones, so the pickle holds it once and each row as a tuple of values
(against a dict per row: 40% less to unpickle, 20% less to pickle).
Rows of one shape (one class, database, names and related rows of one shape each, as a
queryset's rows are) are stored by column instead: ``(label, db, names, [values, ...],
{name: column})``, a related column the same form or a list of plain values (None): half
the containers to pickle and unpickle (:func:`columns`, :func:`unpack_columns`).
Anything else (``values()`` dicts, tuples, counts) is stored as it is.
:func:`pack_rows` and :func:`unpack_rows` are compiled where the hot path is
(``src/speedups/rows.c``, the same answers): a Python frame per instance was a
fifth of a warm read of 20 rows with their related rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.apps import apps
from django.db.models import Model
from django.db.models.base import ModelState

from django_mcpatterns.core.protocol import compiled

__all__ = ["columns", "pack", "pack_rows", "unpack", "unpack_columns", "unpack_rows"]

_COLUMNS = "mcpatterns-orm-columns"
_ROWS = "mcpatterns-orm-rows"
_MODELS = "mcpatterns-orm-models"  # the form before (a dict of fields per row), still read
_PREFETCHED = "_prefetched_objects_cache"
_NAMES_KEPT = 4096
_classes: dict[str, type[Model]] = {}
_labels: dict[type[Model], str] = {}
_names: dict[tuple[str, ...], tuple[str, ...]] = {}


Packed = tuple[str, str | None, tuple[str, ...], tuple[Any, ...], dict[str, Any]]
"""A row as stored: its model's label, its database alias, its attributes' names and
values, its related rows."""
Column = tuple[str, str | None, tuple[str, ...], list[tuple[Any, ...]], dict[str, Any]]
"""Rows of one shape as stored: label, database alias, names, each row's values, and each
related name's column (a :data:`Column`, or a list of plain values)."""


def pack(value: Any) -> Any:
    """``value`` as stored: a list of plain model instances packed, anything else as is."""
    if type(value) is not list or not value:
        return value
    rows = pack_rows(value, _labels, _label, Model, _names)
    if rows is None:
        return value
    group = columns(rows)
    return (_ROWS, rows) if group is None else (_COLUMNS, group)


def unpack(value: Any) -> Any:
    """The value :func:`pack` stored, with fresh instances."""
    if type(value) is tuple and len(value) == 2:
        if value[0] == _COLUMNS:
            return unpack_columns(value[1], _classes, _model, ModelState)
        if value[0] == _ROWS:
            return unpack_rows(value[1], _classes, _model, ModelState)
        if value[0] == _MODELS:
            return [_unpack_dict(row) for row in value[1]]
    return value


def _label(cls: type[Model]) -> str:
    label = _labels[cls] = cls._meta.label_lower  # Options formats it on every use
    return label


def _model(label: str) -> type[Model]:
    cls = _classes[label] = apps.get_model(label)
    return cls


def _pack_rows(
    value: list[Any],
    labels: dict[type[Model], str],
    label_of: Callable[[type[Model]], str],
    model: type[Model],
    known: dict[tuple[str, ...], tuple[str, ...]],
) -> list[Packed] | None:
    """The rows packed (a label is ``labels[cls]``, else ``label_of(cls)``; ``known``:
    the names tuples seen, each kept once); None unless every row is an instance of
    ``model`` with nothing but fields and related rows, and none of those leads back
    to a row it hangs from (select_related on a one-to-one caches each side on the
    other: pickled as they are, the cycle kept)."""
    for obj in value:
        if not isinstance(obj, model) or _PREFETCHED in obj.__dict__:
            return None

    def packed(obj: Model, path: tuple[Model, ...] = ()) -> Packed:
        if path and any(obj is up for up in path):
            raise _Cycle
        fields = obj.__dict__.copy()  # in C: then the one attribute that is not a field
        state = fields.pop("_state")
        names = tuple(fields)
        values = tuple(fields.values())
        shared = known.get(names)
        if shared is None:
            if len(known) >= _NAMES_KEPT:
                known.clear()
            shared = known[names] = names
        cached = state.__dict__.get("fields_cache")  # made on first use: absent, none related
        related = (
            {
                name: packed(rel, (*path, obj)) if isinstance(rel, model) else rel
                for name, rel in cached.items()
            }
            if cached
            else {}
        )
        cls = type(obj)
        label = labels.get(cls)
        return (label_of(cls) if label is None else label, state.db, shared, values, related)

    try:
        return [packed(obj) for obj in value]
    except _Cycle:
        return None


class _Cycle(Exception):
    """A related row leads back to a row it hangs from."""


def _unpack_rows(
    rows: list[Packed],
    classes: dict[str, type[Model]],
    model_of: Callable[[str], type[Model]],
    model_state: type[ModelState],
) -> list[Model]:
    """Fresh instances of packed rows, as ``from_db`` leaves them (a row's class is
    ``classes[label]``, else ``model_of(label)``)."""

    def unpacked(row: Packed) -> Model:
        label, db, names, values, related = row
        if len(names) != len(values):
            raise TypeError("a packed row has as many values as names")
        cls = classes.get(label)
        obj: Model = object.__new__(model_of(label) if cls is None else cls)
        obj.__dict__.update(zip(names, values, strict=False))  # as long: checked above
        state = model_state()
        state.adding = False
        state.db = db
        if related:
            state.fields_cache = {
                name: unpacked(rel) if type(rel) is tuple else rel for name, rel in related.items()
            }
        obj._state = state
        return obj

    return [unpacked(row) for row in rows]


def _columns(rows: list[Packed]) -> Column | None:
    """``rows`` by column, or None unless they have one shape: the same label, database
    and names (the very tuple), related rows under the same names in the same order, each
    name's either all packed rows of one shape or none."""
    if not rows or any(type(row) is not tuple or len(row) != 5 for row in rows):
        return None
    if any(type(row[4]) is not dict for row in rows):
        return None
    label, db, names, _, related = rows[0]
    order = tuple(related)
    for row in rows:
        if row[0] != label or row[1] != db or row[2] is not names or tuple(row[4]) != order:
            return None
    by_name: dict[str, Any] = {}
    for name in order:
        column = [row[4][name] for row in rows]
        packed = [type(rel) is tuple for rel in column]
        if all(packed):
            nested = _columns(column)
            if nested is None:
                return None
            by_name[name] = nested
        elif any(packed):
            return None
        else:
            by_name[name] = column
    return (label, db, names, [row[3] for row in rows], by_name)


def _unpack_columns(
    group: Column,
    classes: dict[str, type[Model]],
    model_of: Callable[[str], type[Model]],
    model_state: type[ModelState],
) -> list[Model]:
    """Fresh instances of rows stored by column, as :func:`_unpack_rows` makes each."""
    label, db, names, values, related = group
    made = {
        name: _unpack_columns(column, classes, model_of, model_state)
        if type(column) is tuple
        else column
        for name, column in related.items()
    }
    if any(len(column) != len(values) for column in made.values()):
        raise TypeError("a related column has as many rows as its group")
    cls = classes.get(label)
    cls = model_of(label) if cls is None else cls
    out: list[Model] = []
    for i, row in enumerate(values):
        if len(names) != len(row):
            raise TypeError("a packed row has as many values as names")
        obj: Model = object.__new__(cls)
        obj.__dict__.update(zip(names, row, strict=False))  # as long: checked above
        state = model_state()
        state.adding = False
        state.db = db
        if made:
            state.fields_cache = {name: column[i] for name, column in made.items()}
        obj._state = state
        out.append(obj)
    return out


def _unpack_dict(row: tuple[str, str | None, dict[str, Any], dict[str, Any]]) -> Model:
    """A row packed before names and values were apart (a fields dict per row)."""
    label, db, fields, related = row
    cls = _classes.get(label)
    obj: Model = object.__new__(_model(label) if cls is None else cls)
    obj.__dict__.update(fields)
    state = ModelState()
    state.adding = False
    state.db = db
    if related:
        state.fields_cache = {
            name: _unpack_dict(rel) if type(rel) is tuple else rel for name, rel in related.items()
        }
    obj._state = state
    return obj


# The compiled forms where they are built (src/speedups/rows.c: the same answers).
pack_rows: Callable[..., list[Packed] | None] = compiled.pack_rows or _pack_rows
unpack_rows: Callable[..., list[Model]] = compiled.unpack_rows or _unpack_rows
columns: Callable[[list[Packed]], Column | None] = compiled.columns or _columns
unpack_columns: Callable[..., list[Model]] = compiled.unpack_columns or _unpack_columns
