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
_PREFETCHED = "_prefetched_objects_cache"
_classes: dict[str, type[Model]] = {}
_labels: dict[type[Model], str] = {}


def pack(value: Any) -> Any:
    """``value`` as stored: a list of plain model instances packed, anything else as is."""
    if type(value) is not list or not value:
        return value
    for obj in value:  # rows with nothing but their fields and related rows
        if not isinstance(obj, Model) or _PREFETCHED in obj.__dict__:
            return value
    return (_MODELS, [_pack(obj) for obj in value])


def _label(cls: type[Model]) -> str:
    label = _labels.get(cls)
    if label is None:  # Options.label_lower formats it on every use
        label = _labels[cls] = cls._meta.label_lower
    return label


def _pack(obj: Model) -> tuple[str, str | None, dict[str, Any], dict[str, Any]]:
    fields = obj.__dict__.copy()  # a copy in C, then the one attribute that is not a field
    state = fields.pop("_state")
    cached = state.__dict__.get("fields_cache")  # made on first use: absent, nothing related
    related = (
        {name: _pack(rel) if isinstance(rel, Model) else rel for name, rel in cached.items()}
        if cached
        else {}
    )
    return (_label(type(obj)), state.db, fields, related)


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
