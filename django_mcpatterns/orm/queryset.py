"""``QuerySet.cache()``/``.nocache()`` and the cached forms of its reading methods.

Installed once by the app (:func:`install`): Django's own methods are wrapped,
so every queryset of every model has them, managers included.  A wrapped
method decides from the queryset (``cache()``/``nocache()`` on it, else the
model's ``MCPATTERNS_ORM["models"]`` rule for the operation) whether to go
through the :class:`~.reads.Reader`; otherwise it is Django's, unchanged.
``iterator()`` and ``raw()`` never are.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from typing import Any

from asgiref.sync import sync_to_async
from django.db import models
from django.db.models import Model, QuerySet
from django.db.models.manager import BaseManager
from django.db.models.query import MAX_GET_RESULTS, ModelIterable

from . import chain, statements
from .conf import may_have_rules, orm_settings
from .reads import Planned, Reader, reader
from .rows import pack, unpack

__all__ = ["install", "uninstall"]

_FETCH_ONE: Any = getattr(models, "FETCH_ONE", None)
"""Django 6.1's default fetch mode (None before: no fetch modes)."""

_MARK = "_mcp"
_op: ContextVar[str] = ContextVar("mcpatterns_orm_op", default="fetch")
_ORIGINAL: dict[str, Any] = {}


def cache(self: Any, timeout: int | None = None) -> QuerySet[Any]:
    """This queryset, read through the ORM cache (``timeout``: its results' TTL)."""
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0
    ):
        raise ValueError(
            f"cache(timeout=...) must be a positive number of seconds, not {timeout!r}"
        )
    recorded: QuerySet[Any] | None = chain.start(self, (True, timeout))
    if recorded is not None:  # a pristine queryset: its calls are recorded from now on
        return recorded
    clone: QuerySet[Any] = self._chain()
    setattr(clone.query, _MARK, (True, timeout))
    return clone


def nocache(self: Any) -> QuerySet[Any]:
    """This queryset, never read through the ORM cache."""
    clone: QuerySet[Any] = self._chain()
    setattr(clone.query, _MARK, (False, None))
    return clone


def _timeout(qs: Any, op: str) -> int | None:
    """The TTL to cache ``op`` of ``qs`` with, or None when it is not cached."""
    state = qs._mcp_state
    mark = state.mark if type(state) is chain.Recording else qs.query.__dict__.get(_MARK)
    settings = orm_settings()
    if mark is not None:
        enabled, timeout = mark
        if not enabled:
            return None
        if timeout is not None:
            return int(timeout)
    rule = settings.rule(qs.model)
    if mark is None and (rule is None or op not in rule.ops):
        return None
    if rule is not None and rule.timeout is not None:
        return rule.timeout
    return settings.timeout


Found = tuple[Planned, int, Reader, bool]
"""The plan, its TTL, the reader and whether a result read now may be stored."""


def _planned(qs: Any, op: str, *extra: Any) -> Found | None:
    if qs._result_cache is not None:
        return None
    timeout = _timeout(qs, op)
    if timeout is None:
        return None
    found = reader()
    state = None if extra or qs._mcp_state is None else chain.recording(qs)
    if state is not None:
        planned = _recalled(qs, state, op, found)
    else:
        planned = found.plan(qs.query, qs.db, op, qs._iterable_class, qs._fields, *extra)
    if planned is None:
        return None
    allowed = found.admit(planned)
    if allowed is None:
        return None
    return planned, timeout, found, allowed


def _recalled(qs: Any, state: chain.Recording, op: str, found: Reader) -> Planned | None:
    """The plan of a recorded queryset: kept by its chain's fingerprint, or made from its
    Query (built now) and kept (an instance's pk is recorded as it was at the call)."""
    key = chain.fingerprint(qs, state, op)
    try:
        return found.memo[key]
    except KeyError:
        pass
    planned = found.plan(qs.query, qs.db, op, ModelIterable, None)
    found.remember(key, planned)
    return planned


def _records(model: Any) -> bool:
    """A new pristine queryset of ``model`` records its calls: its rule caches fetches."""
    if not may_have_rules():
        return False
    rule = orm_settings().rule(model)
    return rule is not None and "fetch" in rule.ops


def _known_related(qs: Any, results: list[Any]) -> None:
    """What Django's ModelIterable does besides making rows, on cached rows: a related
    manager's object set on each row, and Django 6.1's fetch mode (``fetch_mode()``)."""
    if qs._iterable_class is not ModelIterable:
        return
    for field, objects in qs._known_related_objects.items():
        attname = field.attname
        for obj in results:
            # Not by reading a deferred key (a query per row), as Django 6.1 (5.2 reads it).
            # A cached row may hold a stored copy of the object: the manager's own wins.
            if attname not in obj.__dict__:
                continue
            rel = objects.get(obj.__dict__[attname])
            if rel is not None:
                setattr(obj, field.name, rel)
    mode = getattr(qs, "_fetch_mode", _FETCH_ONE)
    if mode is not _FETCH_ONE:
        known = {id(o) for objects in qs._known_related_objects.values() for o in objects.values()}
        _fetching(mode, results, known)


def _fetching(mode: Any, results: list[Any], known: set[int]) -> None:
    """Each row, and each row it holds through ``select_related``, fetches its deferred
    fields and relations in ``mode``; with peers, with the rows of the same path.  The
    ``known`` objects (a related manager's own instance) are the caller's: left alone."""
    peers: dict[tuple[str, ...], list[Any]] = {}
    seen = set(known)

    def made(obj: Any, path: tuple[str, ...]) -> None:
        seen.add(id(obj))
        state = obj._state
        state.fetch_mode = mode
        if mode.track_peers:
            group = peers.setdefault(path, [])
            group.append(weakref.ref(obj))
            state.peers = group
        for name, rel in list(state.fields_cache.items()):
            if isinstance(rel, Model) and id(rel) not in seen:
                made(rel, (*path, name))

    for obj in results:
        made(obj, ())


def _cached_rows(qs: Any, found: Found) -> list[Any]:
    """``qs``'s rows through the cache: a hit, or a miss run as its plan's statement."""
    planned, timeout, read, allowed = found
    results: list[Any] = unpack(
        read.fetch(
            planned, lambda: statements.rows(qs, planned), timeout, pack, allowed, lambda: _rows(qs)
        )
    )
    _known_related(qs, results)
    return results


async def _acached_rows(qs: Any, found: Found) -> list[Any]:
    """:func:`_cached_rows` for async code (a miss runs in a thread)."""
    planned, timeout, read, _ = found
    results: list[Any] = unpack(
        await read.afetch(
            planned, lambda: statements.rows(qs, planned), timeout, pack, lambda: _rows(qs)
        )
    )
    _known_related(qs, results)
    return results


def _rows(qs: Any) -> list[Any]:
    """What Django's _fetch_all reads, Django's way (what the auditor compares hits with)."""
    return list(qs._iterable_class(qs))


def _fetch_all(self: Any) -> None:
    if self._result_cache is None:
        found = _planned(self, _op.get())
        if found is not None:
            self._result_cache = _cached_rows(self, found)
    _ORIGINAL["_fetch_all"](self)


def get(self: Any, *args: Any, **kwargs: Any) -> Any:
    token = _op.set("get")
    try:
        return _ORIGINAL["get"](self, *args, **kwargs)
    finally:
        _op.reset(token)


def count(self: Any) -> int:
    found = _planned(self, "count")
    if found is None:
        result: int = _ORIGINAL["count"](self)
        return result
    planned, timeout, read, allowed = found
    counted: int = read.fetch(planned, lambda: _ORIGINAL["count"](self), timeout, None, allowed)
    return counted


def exists(self: Any) -> bool:
    found = _planned(self, "exists")
    if found is None:
        result: bool = _ORIGINAL["exists"](self)
        return result
    planned, timeout, read, allowed = found
    there: bool = read.fetch(planned, lambda: _ORIGINAL["exists"](self), timeout, None, allowed)
    return there


def aggregate(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    found = _planned(self, "aggregate", args, kwargs)
    if found is None:
        result: dict[str, Any] = _ORIGINAL["aggregate"](self, *args, **kwargs)
        return result
    planned, timeout, read, allowed = found
    return read.fetch(
        planned, lambda: _ORIGINAL["aggregate"](self, *args, **kwargs), timeout, None, allowed
    )


# -- async: a hit is served in the event loop, a miss runs Django's sync path in a thread --


async def aget(self: Any, *args: Any, **kwargs: Any) -> Any:
    if self.query.combinator or self.query.select_for_update:
        return await _ORIGINAL["aget"](self, *args, **kwargs)
    clone = self.filter(*args, **kwargs)
    if clone.query.can_filter() and not clone.query.distinct_fields:
        clone = clone.order_by()
    clone.query.set_limits(high=MAX_GET_RESULTS)
    found = _planned(clone, "get")
    if found is None:
        return await _ORIGINAL["aget"](self, *args, **kwargs)
    results = clone._result_cache = await _acached_rows(clone, found)
    if clone._prefetch_related_lookups:
        await sync_to_async(clone._prefetch_related_objects)()
    if len(results) == 1:
        return results[0]
    return _raise_for_get(clone, len(results))


def _raise_for_get(self: Any, num: int) -> Any:
    if not num:
        raise self.model.DoesNotExist(
            f"{self.model._meta.object_name} matching query does not exist."
        )
    raise self.model.MultipleObjectsReturned(
        f"get() returned more than one {self.model._meta.object_name} -- it returned "
        f"{num if num < MAX_GET_RESULTS else f'more than {MAX_GET_RESULTS - 1}'}!"
    )


async def acount(self: Any) -> int:
    found = _planned(self, "count")
    if found is None:
        counted: int = await _ORIGINAL["acount"](self)
        return counted
    result: int = await found[2].afetch(found[0], lambda: _ORIGINAL["count"](self), found[1])
    return result


async def aexists(self: Any) -> bool:
    found = _planned(self, "exists")
    if found is None:
        there: bool = await _ORIGINAL["aexists"](self)
        return there
    result: bool = await found[2].afetch(found[0], lambda: _ORIGINAL["exists"](self), found[1])
    return result


async def aaggregate(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    found = _planned(self, "aggregate", args, kwargs)
    if found is None:
        done: dict[str, Any] = await _ORIGINAL["aaggregate"](self, *args, **kwargs)
        return done
    result: dict[str, Any] = await found[2].afetch(
        found[0], lambda: _ORIGINAL["aggregate"](self, *args, **kwargs), found[1]
    )
    return result


def __aiter__(self: Any) -> AsyncIterator[Any]:
    async def generator() -> AsyncIterator[Any]:
        if self._result_cache is None:
            found = _planned(self, "fetch")
            if found is not None:
                self._result_cache = await _acached_rows(self, found)
        if self._result_cache is None or (
            self._prefetch_related_lookups and not self._prefetch_done
        ):
            await sync_to_async(self._fetch_all)()  # prefetches, or Django's own read
        for item in self._result_cache or ():
            yield item

    return generator()


_WRAPPED: dict[str, Callable[..., Any]] = {
    "_fetch_all": _fetch_all,
    "get": get,
    "count": count,
    "exists": exists,
    "aggregate": aggregate,
    "aget": aget,
    "acount": acount,
    "aexists": aexists,
    "aaggregate": aaggregate,
    "__aiter__": __aiter__,
}


def _manager_method(name: str) -> Callable[..., Any]:
    def method(self: BaseManager[Any], *args: Any, **kwargs: Any) -> Any:
        return getattr(self.get_queryset(), name)(*args, **kwargs)

    method.__name__ = name
    return method


def install() -> None:
    """Wrap QuerySet's reading methods and add cache()/nocache() (idempotent)."""
    if _ORIGINAL:
        return
    for name, wrapper in _WRAPPED.items():
        original = getattr(QuerySet, name)
        _ORIGINAL[name] = original
        functools.update_wrapper(wrapper, original)
        setattr(QuerySet, name, wrapper)
    chain.install(_records)
    QuerySet.cache = cache  # type: ignore[attr-defined]
    QuerySet.nocache = nocache  # type: ignore[attr-defined]
    # Managers made by from_queryset() before now get the methods from BaseManager.
    for name in ("cache", "nocache"):
        setattr(BaseManager, name, _manager_method(name))


def uninstall() -> None:
    """Restore Django's methods (tests)."""
    for name, original in _ORIGINAL.items():
        setattr(QuerySet, name, original)
    _ORIGINAL.clear()
    chain.uninstall()
    for name in ("cache", "nocache"):
        delattr(QuerySet, name)
        delattr(BaseManager, name)
