"""Which rows a query can return, as column values: the conjunctions it depends on.

A query whose where clause is an AND that pins columns of its own table to
values (``category=c``, ``status__in=[...]``, ``parent__isnull=True``) can only
return rows with those values, so it depends on the conjunction stamps of
those values, as cacheops does, not on the table as a whole.  Writers find the
same stamps from a row's old and new values: both sides write a value in the
canonical form here.

Only columns whose equality in the database is equality of that form are
pinned: integers, booleans, UUIDs, dates, foreign keys to those, and text
where the database compares text exactly (not on MySQL, not with a
``db_collation``).  Other conditions narrow the result further and need no
stamp of their own.
"""

from __future__ import annotations

import datetime
import itertools
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connections, models
from django.db.models import Field, Model
from django.db.models.expressions import Col
from django.db.models.lookups import Exact, In, IsNull, Lookup
from django.db.models.sql import Query
from django.db.models.sql.datastructures import BaseTable

__all__ = ["MAX_COMBINATIONS", "canonical", "pinnable", "pins", "row_values"]

MAX_COMBINATIONS = 32
"""A query pinning more value combinations than this depends on its table instead."""

_EXACT_TYPES: tuple[type[Field[Any, Any]], ...] = (
    models.AutoField,
    models.BigAutoField,
    models.SmallAutoField,
    models.IntegerField,
    models.BooleanField,
    models.UUIDField,
)
_TEXT_TYPES: tuple[type[Field[Any, Any]], ...] = (models.CharField, models.TextField)


_HOOKS = (
    "db_type",
    "to_python",
    "get_prep_value",
    "get_db_prep_value",
    "get_db_prep_save",
    "pre_save",
)
"""How a field turns a value into what the column stores and compares: a subclass that
changes one (a lower-casing e-mail field, a ``citext`` or ``COLLATE NOCASE`` column type)
stores or compares something else than the value a writer holds."""


def _django_own(field: Field[Any, Any]) -> bool:
    kind = type(field)
    return all(
        getattr(getattr(kind, hook), "__module__", "").startswith("django.db.models.")
        for hook in _HOOKS
    )


def pinnable(field: Field[Any, Any], vendor: str) -> bool:
    """Whether equality on ``field`` in the database is equality of :func:`canonical`."""
    if not _django_own(field):
        return False
    if field.is_relation:
        target = getattr(field, "target_field", None)
        return bool(field.concrete and target is not None and pinnable(target, vendor))
    if isinstance(field, models.DateTimeField):
        return False  # one instant, many time zones
    if isinstance(field, (*_EXACT_TYPES, models.DateField)):
        return True
    if isinstance(field, _TEXT_TYPES):
        return vendor != "mysql" and not getattr(field, "db_collation", None)
    return False


def canonical(field: Field[Any, Any], value: Any) -> str:
    """``value`` of ``field`` as stamp text (raises ValidationError for a value it cannot be)."""
    if isinstance(value, Model):
        value = value.prepare_database_save(field)  # a to_field key: not the pk
    if value is None:
        return "N"
    if hasattr(value, "resolve_expression"):  # F(), Value(), a database default: the
        raise TypeError("an expression")  # stored value is unknown to the writer
    value = field.to_python(value)
    kind = type(value)
    if kind is not str and isinstance(value, str):  # a TextChoices member...: what the
        value = str.__str__(value)  # database compares is its text (and its repr is not)
    elif kind is not int and kind is not bool and isinstance(value, int):
        value = int(value)
    elif kind is not datetime.date and isinstance(value, datetime.date):  # freezegun's,
        value = datetime.date(value.year, value.month, value.day)  # pendulum's: repr names them
    elif kind is not uuid.UUID and isinstance(value, uuid.UUID):
        value = uuid.UUID(int=value.int)
    return repr(value)


def pins(query: Query, vendor: str) -> tuple[tuple[str, ...], list[tuple[str, ...]]] | None:
    """The columns ``query`` pins on its base table and the value combinations.

    ``(scheme, combinations)``: sorted attnames and, for each combination, the
    canonical values in that order.  None: the query pins nothing usable.
    """
    where = query.where
    if where.connector != "AND" or where.negated or not query.alias_map:
        return None
    base = next(iter(query.alias_map))
    if type(query.alias_map[base]) is not BaseTable:
        return None
    pinned: dict[str, list[str]] = {}
    for child in where.children:
        found = _pin(child, base, vendor)
        if found is None:
            continue
        attname, values = found
        if attname in pinned:  # two conditions on one column: keep their intersection
            pinned[attname] = [v for v in pinned[attname] if v in values]
        else:
            pinned[attname] = values
    while pinned and _product(pinned.values()) > MAX_COMBINATIONS:
        widest = max(pinned, key=lambda name: len(pinned[name]))
        del pinned[widest]
    if not pinned or _product(pinned.values()) == 0:
        return None
    scheme = tuple(sorted(pinned))
    combinations = list(itertools.product(*(pinned[name] for name in scheme)))
    return scheme, combinations


def _product(lists: Iterable[Sequence[str]]) -> int:
    total = 1
    for values in lists:
        total *= len(values)
    return total


def _pin(child: Any, base: str, vendor: str) -> tuple[str, list[str]] | None:
    if not isinstance(child, Lookup) or not isinstance(child, (Exact, In, IsNull)):
        return None
    lhs = child.lhs
    if type(lhs) is not Col or lhs.alias != base:
        return None
    field = lhs.target
    if not pinnable(field, vendor) or getattr(field, "model", None) is None:
        return None
    rhs = child.rhs
    try:
        if isinstance(child, IsNull):
            return (field.attname, ["N"]) if rhs is True else None
        if isinstance(child, In):
            if not isinstance(rhs, (list, tuple, set, frozenset)) or any(
                hasattr(v, "resolve_expression") for v in rhs
            ):
                return None
            return field.attname, sorted({canonical(field, v) for v in rhs if v is not None})
        if hasattr(rhs, "resolve_expression") or rhs is None:
            return None
        return field.attname, [canonical(field, rhs)]
    except (ValidationError, TypeError, ValueError):
        return None


def row_values(model: type[Model], obj: Model | dict[str, Any], using: str) -> dict[str, str]:
    """A row's canonical values of its pinnable local columns (for writers)."""
    vendor = connections[using].vendor
    values: dict[str, str] = {}
    get = obj.get if isinstance(obj, dict) else obj.__dict__.get
    missing = object()
    for field in model._meta.local_concrete_fields:
        if not pinnable(field, vendor):
            continue
        value = get(field.attname, missing)
        if value is missing:
            continue  # a deferred column: unknown to this writer
        try:
            values[field.attname] = canonical(field, value)
        except (ValidationError, TypeError, ValueError):
            continue
    return values
