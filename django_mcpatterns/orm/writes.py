"""Every ORM write path, turned into invalidations sent after the commit.

``save`` (old values read from the database first, the row locked inside a
transaction), ``delete`` and its cascades (signals, plus the ``SET_NULL``
style updates and auto-created m2m rows the collector changes silently),
``QuerySet.update`` (the rows it will change are read, locked, and updated by
primary key), ``bulk_create``, ``bulk_update``, and m2m ``add``/``remove``/
``clear``/``set``.  Each records the tables it wrote for read-your-writes and
schedules :func:`~.invalidation.invalidate` with ``on_commit``: a rolled back
transaction sends nothing.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from django.db import connections, router, transaction
from django.db.models import Model, QuerySet, signals
from django.db.models.deletion import Collector

from django_mcpatterns.core import stamps

from .invalidation import chain, invalidate
from .pins import canonical, row_values
from .reads import SPACE, reader
from .transactions import mark_written

__all__ = ["install", "uninstall"]

logger = logging.getLogger("django_mcpatterns.orm")
UPDATE_ROWS_LIMIT = 1000
"""A ``QuerySet.update`` of more rows than this invalidates its model as a whole."""

_inside: ContextVar[bool] = ContextVar("mcpatterns_orm_inside_write", default=False)
_ORIGINAL: dict[str, Any] = {}
_OLD = "_mcpatterns_orm_old"


def changed(
    using: str, model: type[Model], rows: Sequence[Any] = (), *, whole: bool = False
) -> None:
    """Schedule the invalidation of ``rows`` (instances or dicts; ``{}``: unknown) of ``model``."""
    models = chain(model)
    tables_written = [m._meta.db_table for m in models]
    mark_written(using, tables_written)
    if whole:
        tables: Mapping[str, Sequence[dict[str, str]]] = {}
        wholes = tables_written
    else:
        tables = {m._meta.db_table: [_values(m, row, using) for row in rows] for m in models}
        wholes = []
    label = model._meta.label_lower
    transaction.on_commit(lambda: _send(using, tables, wholes, label), using=using, robust=True)


def _values(model: type[Model], row: Any, using: str) -> dict[str, str]:
    if isinstance(row, _Known):
        return dict(row)
    return row_values(model, row, using) if row else {}


def _send(
    using: str, tables: Mapping[str, Sequence[dict[str, str]]], wholes: list[str], label: str
) -> None:
    try:
        invalidate(using, tables, wholes, label=label)
    except Exception:
        logger.exception("ORM invalidation failed")


def _has_schemes(using: str, model: type[Model]) -> bool:
    """Whether any table of ``model`` has a registered scheme (True when the cache cannot say)."""
    read = reader()
    keys = [stamps.registry_key(read.prefix, SPACE, m._meta.db_table) for m in chain(model)]
    try:
        found = stamps.registries(read.values, keys)
    except Exception:
        return True
    return any(r is not None and r.schemes for r in found.values())


def _attnames(model: type[Model]) -> list[str]:
    names = {model._meta.pk.attname}
    for m in chain(model):
        names.update(f.attname for f in m._meta.local_concrete_fields)
    return sorted(names)


def _locked(qs: QuerySet[Any], using: str) -> QuerySet[Any]:
    conn = connections[using]
    if conn.in_atomic_block and conn.features.has_select_for_update:
        if conn.features.has_select_for_update_of:
            return qs.select_for_update(of=("self",))
        return qs.select_for_update()
    return qs


def _current(model: type[Model], using: str, pks: Iterable[Any]) -> list[dict[str, Any]]:
    """The rows' current values, locked when inside a transaction (chunks of 500 keys)."""
    pks = list(pks)
    names = _attnames(model)
    rows: list[dict[str, Any]] = []
    base = model._base_manager.using(using).nocache()  # type: ignore[attr-defined]
    for start in range(0, len(pks), 500):
        qs = _locked(base.filter(pk__in=pks[start : start + 500]), using)
        rows.extend(qs.values(*names))
    return rows


# -- save --


def save_base(self: Model, *args: Any, **kwargs: Any) -> None:
    using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
    if self.pk is None or _inside.get():
        self.__dict__[_OLD] = None
        return _save(self, using, args, kwargs)
    if not _has_schemes(using, type(self)):
        self.__dict__[_OLD] = [{}]  # unknown old values: enough unless a scheme appears
        return _save(self, using, args, kwargs)
    with transaction.atomic(using=using, savepoint=False):
        self.__dict__[_OLD] = _current(type(self), using, [self.pk])
        return _save(self, using, args, kwargs)


def _save(self: Model, using: str, args: Any, kwargs: Any) -> None:
    try:
        _ORIGINAL["save_base"](self, *args, **kwargs)
    finally:
        old = self.__dict__.pop(_OLD, None)
    if not _inside.get():
        changed(using, type(self), [*(old or ()), self])


# -- delete --


def _pre_delete(
    sender: type[Model], instance: Model, using: str, origin: Any = None, **_: Any
) -> None:
    if isinstance(origin, Model) and origin is instance and instance.pk is not None:
        instance.__dict__[_OLD] = _current(sender, using, [instance.pk])


def _post_delete(sender: type[Model], instance: Model, using: str, **_: Any) -> None:
    old = instance.__dict__.pop(_OLD, None)
    changed(using, sender, [*(old or ()), instance])
    for m in chain(sender):
        for field in m._meta.get_fields(include_hidden=True):
            through = getattr(getattr(field, "remote_field", None), "through", None)
            if field.many_to_many and through is not None and through._meta.auto_created:
                changed(using, through, whole=True)


def collector_delete(self: Collector) -> Any:
    touched = {field.model for (field, _value) in self.field_updates}
    result = _ORIGINAL["collector_delete"](self)
    for model in touched:
        changed(self.using, model, whole=True)
    return result


# -- QuerySet writes --


def update(self: Any, **kwargs: Any) -> int:
    if _inside.get():
        result: int = _ORIGINAL["update"](self, **kwargs)
        return result
    self._for_write = True
    using = self.db
    model = self.model
    plain = all(not hasattr(v, "resolve_expression") for v in kwargs.values())
    if not _has_schemes(using, model) or self.query.annotations or self.query.combinator:
        rows = _ORIGINAL["update"](self, **kwargs)
        changed(using, model, [{}], whole=not plain or bool(self.query.annotations))
        return int(rows)
    with transaction.atomic(using=using, savepoint=False):
        names = _attnames(model)
        old = list(_locked(self.nocache(), using).values(*names)[: UPDATE_ROWS_LIMIT + 1])
        if len(old) > UPDATE_ROWS_LIMIT or not plain:
            rows = _ORIGINAL["update"](self, **kwargs)
            changed(using, model, whole=True)
            return int(rows)
        pk = model._meta.pk.attname
        by_pk = model._base_manager.using(using).filter(pk__in=[row[pk] for row in old])
        rows = _ORIGINAL["update"](by_pk, **kwargs)
        new = [{**row, **_attvalues(model, kwargs)} for row in old]
        changed(using, model, [*old, *new])
        return int(rows)


def _attvalues(model: type[Model], kwargs: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in kwargs.items():
        field = model._meta.get_field(name)
        if isinstance(value, Model):  # what Django's update() stores: a to_field's value
            value = value.prepare_database_save(field)  # type: ignore[arg-type]
        out[field.attname] = value  # type: ignore[union-attr]
    return out


def bulk_create(self: Any, objs: Iterable[Model], *args: Any, **kwargs: Any) -> list[Model]:
    token = _inside.set(True)
    try:
        created: list[Model] = _ORIGINAL["bulk_create"](self, objs, *args, **kwargs)
    finally:
        _inside.reset(token)
    upsert = bool(kwargs.get("update_conflicts"))
    # A row whose key was not returned (ignore_conflicts: m2m add() writes its pairs so) is
    # known but for its key: a scheme without the key stays fine-grained.
    pk = self.model._meta.pk.attname
    rows: list[Any] = [
        obj
        if obj.pk is not None
        else _Known({k: v for k, v in row_values(self.model, obj, self.db).items() if k != pk})
        for obj in created
    ]
    changed(self.db, self.model, [*rows, {}] if upsert else rows)
    return created


def bulk_update(
    self: Any, objs: Iterable[Model], fields: Sequence[str], batch_size: int | None = None
) -> int:
    objs = tuple(objs)
    using = self.db
    if not objs or _inside.get():
        result: int = _ORIGINAL["bulk_update"](self, objs, fields, batch_size=batch_size)
        return result
    token = _inside.set(True)
    try:
        if not _has_schemes(using, self.model):
            done: int = _ORIGINAL["bulk_update"](self, objs, fields, batch_size=batch_size)
            changed(using, self.model, [{}])
            return done
        with transaction.atomic(using=using, savepoint=False):
            old = _current(self.model, using, [obj.pk for obj in objs])
            done = _ORIGINAL["bulk_update"](self, objs, fields, batch_size=batch_size)
        attnames = [self.model._meta.get_field(name).attname for name in fields]
        pk_field = self.model._meta.pk
        by_pk = {_key(pk_field, row[pk_field.attname]): row for row in old}
        # Every object's values: duplicates of one row are all written (the first wins
        # within a batch, the last across batches), and a key given as text is the row's.
        new = [
            {**by_pk[key], **{a: getattr(obj, a) for a in attnames}}
            for obj in objs
            if (key := _key(pk_field, obj.pk)) in by_pk
        ]
        changed(using, self.model, [*old, *new])
        return done
    finally:
        _inside.reset(token)


def _key(field: Any, value: Any) -> Any:
    try:
        return field.to_python(value)
    except Exception:
        return value


# -- m2m --


def _m2m_changed(
    sender: type[Model],
    instance: Model,
    action: str,
    reverse: bool,
    model: type[Model],
    pk_set: set[Any] | None,
    using: str,
    **_: Any,
) -> None:
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    through = sender
    source = [
        f
        for f in through._meta.concrete_fields
        if f.is_relation and f.related_model is type(instance)._meta.concrete_model
    ]
    target = [
        f
        for f in through._meta.concrete_fields
        if f.is_relation and f.related_model is model._meta.concrete_model
    ]
    if action == "post_clear" or len(source) != 1 or len(target) != 1 or source[0] is target[0]:
        changed(using, through, whole=True)
        return
    src, dst = source[0], target[0]
    rows = [
        {src.attname: canonical(src, instance), dst.attname: canonical(dst, pk)}
        for pk in pk_set or ()
    ]
    changed(using, through, [_Known(row) for row in rows])


class _Known(dict[str, str]):
    """Row values already canonical (m2m rows are built from keys, not instances)."""


_WRAPPED: tuple[tuple[str, type, Any], ...] = (
    ("save_base", Model, save_base),
    ("collector_delete", Collector, collector_delete),
    ("update", QuerySet, update),
    ("bulk_create", QuerySet, bulk_create),
    ("bulk_update", QuerySet, bulk_update),
)


def install() -> None:
    """Wrap the write paths and connect the signal receivers (idempotent)."""
    if _ORIGINAL:
        return
    for name, owner, wrapper in _WRAPPED:
        attr = "delete" if name == "collector_delete" else name
        original = getattr(owner, attr)
        _ORIGINAL[name] = original
        functools.update_wrapper(wrapper, original)
        setattr(owner, attr, wrapper)
    signals.pre_delete.connect(_pre_delete, dispatch_uid="mcpatterns_orm_pre_delete")
    signals.post_delete.connect(_post_delete, dispatch_uid="mcpatterns_orm_post_delete")
    signals.m2m_changed.connect(_m2m_changed, dispatch_uid="mcpatterns_orm_m2m")


def uninstall() -> None:
    """Restore Django's methods and disconnect the receivers (tests)."""
    for name, owner, _wrapper in _WRAPPED:
        if name in _ORIGINAL:
            setattr(owner, "delete" if name == "collector_delete" else name, _ORIGINAL[name])
    _ORIGINAL.clear()
    signals.pre_delete.disconnect(dispatch_uid="mcpatterns_orm_pre_delete")
    signals.post_delete.disconnect(dispatch_uid="mcpatterns_orm_post_delete")
    signals.m2m_changed.disconnect(dispatch_uid="mcpatterns_orm_m2m")
