"""Cached rows in a compact form: model instances as their class, fields and related rows.

Pickling a model instance goes through ``Model.__reduce__`` (the app registry,
a version check, a pickled ``ModelState``) for every row and every
``select_related`` row: most of a warm read's time.  Instances are stored
instead as ``(label, fields, related)`` and rebuilt as Django's own
``from_db`` leaves them (``_state.adding`` False, ``_state.db`` set), the
related rows in ``_state.fields_cache`` as ``select_related`` leaves them.
Anything else (``values()`` dicts, tuples, counts) is stored as it is.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db.models import Model
from django.db.models.base import ModelState

__all__ = ["pack", "unpack"]

_MODELS = "mcpatterns-orm-models"
_classes: dict[str, type[Model]] = {}


def pack(value: Any) -> Any:
    """``value`` as stored: a list of plain model instances packed, anything else as is."""
    if (
        type(value) is list
        and value
        and all(isinstance(obj, Model) and _plain(obj) for obj in value)
    ):
        return (_MODELS, [_pack(obj) for obj in value])
    return value


def _plain(obj: Model) -> bool:
    """Rows with nothing but their fields and related rows (no prefetched objects)."""
    return "_prefetched_objects_cache" not in obj.__dict__


def _pack(obj: Model) -> tuple[str, str | None, dict[str, Any], dict[str, Any]]:
    fields = obj.__dict__.copy()  # a copy in C, then the one attribute that is not a field
    state = fields.pop("_state")
    cached = state.__dict__.get("fields_cache")  # made on first use: absent, nothing related
    related = (
        {name: _pack(rel) if isinstance(rel, Model) else rel for name, rel in cached.items()}
        if cached
        else {}
    )
    return (obj._meta.label_lower, state.db, fields, related)


def unpack(value: Any) -> Any:
    """The value :func:`pack` stored, with fresh instances."""
    if type(value) is tuple and len(value) == 2 and value[0] == _MODELS:
        return [_unpack(row) for row in value[1]]
    return value


def _unpack(row: tuple[str, str | None, dict[str, Any], dict[str, Any]]) -> Model:
    label, db, fields, related = row
    cls = _classes.get(label)
    if cls is None:
        cls = _classes[label] = apps.get_model(label)
    obj: Model = object.__new__(cls)
    obj.__dict__.update(fields)
    state = ModelState()
    state.adding = False
    state.db = db
    if related:
        state.fields_cache = {
            name: _unpack(rel) if type(rel) is tuple else rel for name, rel in related.items()
        }
    obj._state = state
    return obj
