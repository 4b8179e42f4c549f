"""A queryset's structure as a stable digest, without compiling SQL.

Compiling a query costs more than a warm cached read may (hundreds of µs), so
the result key is derived from the :class:`~django.db.models.sql.Query` object
itself: its model, where tree (lookups and their values), ordering, slicing,
joins, annotations, ``values()``... every attribute a query holds, walked
recursively into text that is the same in every process for the same query.
The walk also collects the tables the query reads (its joins and subqueries).

Anything the walk does not know how to write down stably (a callable, an
object of an unknown kind) makes the query *uncacheable*, as do the shapes
that must never be cached: ``select_for_update``, ``extra()``, ``RawSQL``,
``order_by('?')`` and functions such as ``Now()`` whose value changes between
runs.  Unknown is never guessed: it falls back to the database.

The walk's loops (atoms, sequences, dicts, objects attribute by attribute, columns,
fields and classes once known) run compiled where built (``src/speedups/shape.c``),
calling the handlers here for the rest: the same parts, in the same order.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import types
import uuid
from collections.abc import Callable
from functools import cached_property
from typing import Any

from django.conf import settings
from django.db.models import Field, ForeignObjectRel, Model
from django.db.models.expressions import Col, RawSQL
from django.db.models.functions import Now, Random
from django.db.models.lookups import Lookup
from django.db.models.sql import Query
from django.db.models.sql.datastructures import BaseTable, Join
from django.db.models.sql.where import ExtraWhere, WhereNode
from django.utils import timezone
from django.utils.functional import cached_property as django_cached_property

from django_mcpatterns.core.protocol import compiled

__all__ = ["ATOMS", "Shape", "Uncacheable", "digest_of", "shape_of", "text_digest"]


class Uncacheable(Exception):
    """The query has a part whose meaning the key cannot capture, or must not be cached."""


ATOMS: tuple[type, ...] = (
    # Immutable values written by their repr (a datetime: with its zone, elsewhere).
    int,
    float,
    str,
    bytes,
    bool,
    type(None),
    decimal.Decimal,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    uuid.UUID,
)
_NONDETERMINISTIC: tuple[type, ...] = (Now, Random, RawSQL, ExtraWhere)
_NONDETERMINISTIC_SQL = frozenset(
    {
        "NOW",
        "RANDOM",
        "RAND",
        "CURRENT_TIMESTAMP",
        "CURRENT_DATE",
        "CURRENT_TIME",
        "GEN_RANDOM_UUID",
        "UUID",
        "STATEMENT_TIMESTAMP",
        "CLOCK_TIMESTAMP",
        "SYSDATE",
    }
)
# Attributes that say nothing about the SQL.
_SKIPPED = frozenset({"_mcp"})
_QUERY_IGNORED = frozenset(
    {
        "alias_refcount",
        "used_aliases",
        "filter_is_sticky",
        "_lookup_joins",
        "_annotation_select_cache",
        "_extra_select_cache",
        "table_map",
        "_mcp",
    }
)
_cached_names: dict[type, frozenset[str]] = {}
_walked: dict[tuple[type, tuple[str, ...]], tuple[str, ...]] = {}
"""The attributes walked for a kind of object with those attributes, sorted (made once)."""
_LOOKUP_SKIPPED = frozenset({*_SKIPPED, "_constructor_args"})
"""A lookup's ``lhs``, ``rhs`` and ``bilateral_transforms`` are what its SQL is made of;
its constructor's arguments are the same values before preparation (walked twice)."""


def _computed(kind: type) -> frozenset[str]:
    """Names of ``kind``'s cached properties: values computed from the rest, set on first use.

    A compiled query holds them and a fresh one does not; explicit arguments
    that share a name (an expression's ``output_field``) are in
    ``_constructor_args``, which is walked.
    """
    found = _cached_names.get(kind)
    if found is None:
        found = frozenset(
            name
            for klass in kind.__mro__
            for name, attr in vars(klass).items()
            if isinstance(attr, (cached_property, django_cached_property))
        )
        _cached_names[kind] = found
    return found


class Shape:
    """A walk in progress: the text parts and the tables seen."""

    __slots__ = ("parts", "tables")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.tables: set[str] = set()

    def text(self) -> str:
        """The parts written out: the same text for the same query in every process."""
        return "\x1f".join(self.parts)

    def digest(self) -> str:
        return text_digest(self.text())


def text_digest(text: str) -> str:
    """The digest of a shape's :meth:`~Shape.text` (what result keys are named by)."""
    return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()


def shape_of(query: Query, *extra: Any) -> Shape:
    """Walk ``query`` (and ``extra`` parts of the operation); raise :class:`Uncacheable`."""
    if query.select_for_update or query.extra:
        raise Uncacheable("select_for_update and extra() are never cached")
    if "?" in query.order_by:  # random order: its SQL is compiled from the text '?'
        raise Uncacheable("order_by('?') is never cached")
    shape = Shape()
    shape.parts.append(zone())
    _query(query, shape)
    for part in extra:
        _walk(part, shape)
    return shape


def zone() -> str:
    """The active time zone ("" without ``USE_TZ``), part of every shape: Django compiles
    a datetime field's date lookups and truncations (``__year``, ``__date``, ``Trunc``) in
    it, so one query read under two zones is two results."""
    return f"Z:{timezone.get_current_timezone_name()}" if settings.USE_TZ else ""


def digest_of(*parts: Any) -> str:
    """A stable digest of ``parts`` (function arguments...); raise :class:`Uncacheable`."""
    shape = Shape()
    for part in parts:
        _walk(part, shape)
    return shape.digest()


def _names(kind: type, state: dict[str, Any], skipped: frozenset[str]) -> tuple[str, ...]:
    """The attributes of ``state`` to walk, sorted: neither ``skipped`` nor computed."""
    found = _walked.get((kind, tuple(state)))
    if found is None:
        computed = _computed(kind)
        found = tuple(sorted(n for n in state if n not in skipped and n not in computed))
        if len(_walked) >= 4096:
            _walked.clear()
        _walked[kind, tuple(state)] = found
    return found


def _query(query: Query, shape: Shape) -> None:
    shape.parts.append("Q")
    if query.model is not None:
        shape.tables.add(query.model._meta.db_table)
    state = query.__dict__
    _walk_named(state, _names(type(query), state, _QUERY_IGNORED), shape)


def _pure_named(state: dict[str, Any], names: tuple[str, ...], shape: Shape) -> None:
    """Each of ``names`` and its value in ``state``, walked: the loop of :func:`_query`."""
    parts = shape.parts
    handlers = _HANDLERS
    for name in names:
        parts.append(name)
        value = state[name]  # _walk(value, shape), inlined (as in the loops below)
        handler = handlers.get(type(value))
        if handler is _atom:
            parts.append(repr(value))
        else:
            (handler or _handler(type(value)))(value, shape)


def _pure_walk(value: Any, shape: Shape) -> None:
    """Write ``value`` down.  The loops over parts inline it: a frame per value was
    half of the walk of a page query."""
    kind = type(value)
    handler = _HANDLERS.get(kind)
    if handler is None:
        handler = _handler(kind)
    handler(value, shape)


def _handler(kind: type) -> Callable[[Any, Shape], None]:
    """How values of ``kind`` are walked: kept by kind where the kind decides it, otherwise
    :func:`_object` (which looks at the value)."""
    found: Callable[[Any, Shape], None]
    if issubclass(kind, ATOMS):
        found = _typed_atom
    elif issubclass(kind, type):
        found = _class
    elif issubclass(kind, Field):
        found = _field
    elif _plain_kind(kind):
        found = _lookup if issubclass(kind, Lookup) else _attributes
    else:
        return _object
    _HANDLERS[kind] = found
    return found


def _plain_kind(kind: type) -> bool:
    """Lookups and where nodes: kinds :func:`_object` walks as attributes whatever the
    instance (no ``function`` that names SQL, not callable, nothing never cached)."""
    return (
        issubclass(kind, (Lookup, WhereNode))
        and not issubclass(kind, _NONDETERMINISTIC)
        and not getattr(kind, "function", None)
        and not any("__call__" in vars(klass) for klass in kind.__mro__)
    )


def _atom(value: Any, shape: Shape) -> None:
    shape.parts.append(repr(value))


_PLAIN: tuple[type, ...] = (str, int, float, bytes)


def _typed_atom(value: Any, shape: Shape) -> None:
    kind = type(value)
    if kind in ATOMS:
        shape.parts.append(f"{kind.__name__}:{value!r}")
        return
    text = repr(value)
    for plain in _PLAIN:  # a subclass (an enum...): its own __repr__ may hide its value
        if isinstance(value, plain):
            text = plain.__repr__(value)  # type: ignore[call-arg]
            break
    shape.parts.append(f"{kind.__module__}.{kind.__qualname__}:{text}")


def _class(value: type, shape: Shape) -> None:
    if issubclass(value, Model):
        shape.parts.append(f"M:{value._meta.label}")
    else:
        shape.parts.append(f"T:{value.__module__}.{value.__qualname__}")


def _sequence(value: tuple[Any, ...] | list[Any], shape: Shape) -> None:
    parts = shape.parts
    if not value:
        parts.append("()")
        return
    parts.append(f"({len(value)}")
    handlers = _HANDLERS
    for item in value:
        handler = handlers.get(type(item))
        if handler is _atom:
            parts.append(repr(item))
        else:
            (handler or _handler(type(item)))(item, shape)
    parts.append(")")


def _mapping(value: dict[Any, Any], shape: Shape) -> None:
    parts = shape.parts
    if not value:
        parts.append("{}")
        return
    parts.append(f"{{{len(value)}")
    handlers = _HANDLERS
    for key, item in value.items():
        for part in (key, item):
            handler = handlers.get(type(part))
            if handler is _atom:
                parts.append(repr(part))
            else:
                (handler or _handler(type(part)))(part, shape)
    parts.append("}")


def _unordered(value: set[Any] | frozenset[Any], shape: Shape) -> None:
    items = []
    for item in value:
        sub = Shape()
        _walk(item, sub)
        shape.tables |= sub.tables
        items.append("\x1e".join(sub.parts))
    shape.parts.append(f"<{len(items)}")
    shape.parts.extend(sorted(items))
    shape.parts.append(">")


def _base_table(value: BaseTable, shape: Shape) -> None:
    shape.tables.add(value.table_name)
    shape.parts.append(f"B:{value.table_name}:{value.table_alias}")


def _join(value: Join, shape: Shape) -> None:
    """A join is its table, aliases, type, field and nullability (the rest follows from those)."""
    shape.tables.add(value.table_name)
    parts = shape.parts
    parts.append(
        f"J:{value.table_name}:{value.parent_alias}:{value.table_alias}:{value.join_type}:"
        f"{value.nullable}"
    )
    _walk(value.join_field, shape)
    if value.filtered_relation is not None:
        _walk(value.filtered_relation, shape)


def _col(value: Col, shape: Shape) -> None:
    target = value.target
    shape.parts.append(f"C:{value.alias}")
    _walk(target, shape)
    if value.output_field is not target:
        _walk(value.output_field, shape)


def _table(value: BaseTable | Join, shape: Shape) -> None:
    if type(value) is Join:
        _join(value, shape)
    elif type(value) is BaseTable:
        _base_table(value, shape)
    else:
        shape.tables.add(value.table_name)
        _attributes(value, shape)


def _object(value: Any, shape: Shape) -> None:
    if isinstance(value, type):
        _class(value, shape)
    elif isinstance(value, Field):
        _field(value, shape)
    elif isinstance(value, ForeignObjectRel):
        field = value.field
        shape.parts.append(f"R:{type(value).__qualname__}:{field.model._meta.label}.{field.name}")
    elif isinstance(value, (types.FunctionType, types.BuiltinFunctionType)) and (
        "<" not in value.__qualname__
    ):
        shape.parts.append(f"fn:{value.__module__}.{value.__qualname__}")
    elif isinstance(value, Model):
        if value.pk is None:
            raise Uncacheable("an unsaved instance in a query")
        shape.parts.append(f"I:{value._meta.label}:{value.pk!r}")
    elif isinstance(value, Query):
        _query(value, shape)
    elif isinstance(value, (BaseTable, Join)):
        _table(value, shape)
    elif isinstance(value, _NONDETERMINISTIC) or _names_volatile_sql(value):
        raise Uncacheable(f"{type(value).__name__} changes between runs")
    elif callable(value) or not hasattr(value, "__dict__"):
        raise Uncacheable(f"cannot key on {type(value).__name__}")
    else:
        _attributes(value, shape)


def _names_volatile_sql(value: Any) -> bool:
    """A function whose SQL names one that changes between runs: as a class attribute or
    given to ``Func(function=...)`` (kept in ``extra``); a ``template=`` given there is SQL
    the key cannot judge."""
    extra = getattr(value, "extra", None)
    if isinstance(extra, dict) and "template" in extra:
        return True
    named = extra.get("function") if isinstance(extra, dict) else None
    function = named or getattr(value, "function", "") or ""
    return str(function).upper() in _NONDETERMINISTIC_SQL


def _attributes(value: Any, shape: Shape, skipped: frozenset[str] = _SKIPPED) -> None:
    kind = type(value)
    parts = shape.parts
    parts.append(f"O:{kind.__module__}.{kind.__qualname__}")
    state = value.__dict__
    handlers = _HANDLERS
    for name in _names(kind, state, skipped):
        parts.append(name)
        item = state[name]
        handler = handlers.get(type(item))
        if handler is _atom:
            parts.append(repr(item))
        else:
            (handler or _handler(type(item)))(item, shape)
    parts.append(";")


def _lookup(value: Lookup[Any], shape: Shape) -> None:
    _attributes(value, shape, _LOOKUP_SKIPPED)


_bound: dict[int, tuple[Field[Any, Any], str]] = {}


def _field(field: Field[Any, Any], shape: Shape) -> None:
    known = _bound.get(id(field))
    if known is not None and known[0] is field:
        shape.parts.append(known[1])
        return
    model = getattr(field, "model", None)
    kind = type(field)
    if model is not None:
        text = f"F:{kind.__qualname__}:{model._meta.label}.{field.name}"
        _bound[id(field)] = (field, text)  # a model's fields live as long as the process
        shape.parts.append(text)
        return
    _name, path, args, kwargs = field.deconstruct()
    shape.parts.append(f"F:{path}")
    _walk(tuple(args), shape)
    _walk(dict(sorted(kwargs.items())), shape)


_HANDLERS: dict[type, Callable[[Any, Shape], None]] = {
    str: _atom,
    int: _atom,
    bool: _atom,
    type(None): _atom,
    tuple: _sequence,
    list: _sequence,
    dict: _mapping,
    set: _unordered,
    frozenset: _unordered,
    BaseTable: _base_table,
    Join: _join,
    Col: _col,
}

# The walk's loops in C where built (src/speedups/shape.c): the same parts, in the same
# order; the handlers above that are not loops are called from it as they are.
_compiled = compiled.shape_walker(
    _HANDLERS,
    _atom,
    _sequence,
    _mapping,
    _attributes,
    _lookup,
    _names,
    _handler,
    _SKIPPED,
    _LOOKUP_SKIPPED,
    _field,
    _class,
    _col,
)
PURE_WALK = (_pure_walk, _pure_named)
"""The pure-Python forms (tests compare the compiled ones with them)."""
_walk: Callable[[Any, Shape], None]
_walk_named: Callable[[dict[str, Any], tuple[str, ...], Shape], None]
_walk, _walk_named = _compiled or PURE_WALK
