"""Recorded querysets: the chain of calls kept instead of Django's Query, until needed.

Building a queryset (``filter``, ``select_related``, ``order_by``, a slice) costs
Django more than a warm cached read of its result: each call clones the Query and
resolves its lookups.  A *pristine* queryset (what a manager's ``get_queryset()``
makes, before anything reads its ``.query``) that is opted in to the cache
(``.cache()`` on it, or its model's ``MCPATTERNS_ORM["models"]`` rule covers
``fetch``) records those calls instead:
each appends a step to an immutable :class:`Recording` on a clone, with the step's
values normalized into a hashable *fingerprint*.  The reader keeps the plan found
for a fingerprint (:meth:`~.reads.Reader.recall`), so a warm read of a chain seen
before builds no Query at all.

Only plain forms are recorded: ``filter``/``exclude`` with keyword arguments whose
values are ints, strings, bools, None, lists or tuples of those, or a model
instance given to a foreign key that targets its primary key; ``order_by`` and
``select_related`` with strings; ``all()``, ``using()``, ``cache()`` and one plain
slice ``[a:b]``.  Anything else, and any read of ``.query``, *materializes*: the
steps are replayed with Django's own methods onto the pristine query, so what is
not recorded is Django's exact behaviour, only later.  An error Django raises while
building (``FieldError``, an instance of the wrong model) surfaces when the
queryset is evaluated (or its ``.query`` read), not at the call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

from django.core.exceptions import FieldDoesNotExist
from django.db.models import ForeignKey, Model, QuerySet
from django.db.models.manager import BaseManager
from django.db.models.query import ModelIterable
from django.db.models.sql import Query

from .shape import zone

__all__ = ["Recording", "fingerprint", "install", "recording", "uninstall"]

STATE = "_mcp_state"
"""The instance attribute holding a queryset's :class:`Recording`, or a pristine one's
Query (None on the class: every other queryset)."""
SHARED = "_mcp_shared"
"""Set on a pristine queryset that ``cache()`` made a recording from: the recording's
base is its Query, which it must copy before anyone may change it in place."""
_ATOMIC = frozenset({int, str, bool, type(None)})
_NO: Hashable = object()
_ORIGINAL: dict[str, Any] = {}
_MANAGER: dict[str, Any] = {}
_relations: dict[tuple[type[Model], str, type], bool] = {}
"""(model, keyword, class of the value): does the lookup compare the value's primary key?"""

Step = tuple[str, tuple[Any, ...], dict[str, Any]]


class Recording(NamedTuple):
    """A recording queryset's state: the pristine Query it was made with and the calls
    made since.  (A pristine queryset not recording holds its Query instead.)

    ``steps``: the calls to replay (Django's method, its arguments); ``keys``: the same
    calls normalized, part of the fingerprint; ``mark``: ``cache()``'s (True, timeout).
    """

    base: Query
    steps: tuple[Step, ...] = ()
    keys: tuple[Hashable, ...] = ()
    mark: tuple[bool, int | None] | None = None
    sliced: bool = False


def recording(qs: Any) -> Recording | None:
    """``qs``'s recording if it records calls (it is on and Django's flags are unset)."""
    state = qs._mcp_state
    if type(state) is not Recording or state.base is not qs._query or not _plain(qs):
        return None
    return state


def _plain(qs: Any) -> bool:
    """None of Django's per-queryset flags a recording cannot carry is set."""
    return not (
        qs._sticky_filter
        or qs._defer_next_filter
        or qs._deferred_filter is not None
        or qs._iterable_class is not ModelIterable
        or qs._fields is not None
        or qs._prefetch_related_lookups
        or qs._known_related_objects
        or qs._for_write
    )


def fingerprint(qs: Any, state: Recording, op: str) -> Hashable:
    """What decides the plan of ``op`` on a recorded queryset: the same fingerprint, the
    same Query, so the same result key and stamps (the time zone is the shape's too)."""
    return (type(qs), qs.model, qs.db, op, zone(), state.keys)


def _value_key(model: type[Model], name: str, value: Any) -> Hashable:
    kind = type(value)
    if kind in _ATOMIC:
        return (kind, value)
    if kind is list or kind is tuple:
        items = []
        for item in value:
            if type(item) not in _ATOMIC:
                return _NO
            items.append((type(item), item))
        return (kind, tuple(items))
    if isinstance(value, Model) and _compares_pk(model, name, kind):
        pk = value.pk
        if pk is not None and type(pk) in _ATOMIC:
            return (kind, pk)
    return _NO


def _compares_pk(model: type[Model], name: str, kind: type) -> bool:
    """``filter(name=<kind instance>)`` compares the instance's primary key: ``name`` (or
    ``name__exact``) is a foreign key to exactly ``kind`` whose target is its pk."""
    found = _relations.get((model, name, kind))
    if found is None:
        found = False
        parts = name.split("__")
        if len(parts) == 2 and parts[1] == "exact":
            parts.pop()
        if len(parts) == 1:
            try:
                field: Any = model._meta.get_field(parts[0])
            except FieldDoesNotExist:
                field = None
            found = (
                isinstance(field, ForeignKey)
                and field.related_model is kind
                and field.target_field is kind._meta.pk
            )
        if len(_relations) >= 4096:
            _relations.clear()
        _relations[model, name, kind] = found
    return found


def _step_key(model: type[Model], step: Step) -> Hashable:
    """A step's part of the fingerprint (what the recording wrappers below make)."""
    name, args, kwargs = step
    if name in ("filter", "exclude"):
        items = []
        for key in sorted(kwargs):
            value = _value_key(model, key, kwargs[key])
            if value is _NO:
                return _NO
            items.append((key, value))
        return (name, tuple(items))
    if name == "__getitem__":
        return (name, args[0].start, args[0].stop)
    return (name, args)


def _clone(qs: Any, state: Recording) -> Any:
    """A copy of ``qs`` with ``state``: no Query cloned (Django's ``_clone``, recorded)."""
    clone = _object_new(type(qs))
    values = qs.__dict__.copy()
    values["_result_cache"] = None
    values["_prefetch_done"] = False
    values["_hints"] = qs._hints or {}  # shared unless empty, as Django's clone does
    values[STATE] = state
    clone.__dict__ = values
    return clone


def _then(state: Recording, step: Step, key: Hashable, sliced: bool = False) -> Recording:
    """``state`` with one more step (a tuple made in C: this runs for every recorded call)."""
    steps = (*state.steps, step)
    return _tuple_new(Recording, (state.base, steps, (*state.keys, key), state.mark, sliced))


_object_new = object.__new__
_tuple_new = tuple.__new__
_EMPTY: dict[str, Any] = {}


def materialize(qs: Any) -> None:
    """Replay ``qs``'s recorded calls with Django's own methods and drop its recording."""
    state = qs.__dict__[STATE]
    if type(state) is not Recording:  # pristine, not recording: its Query is Django's now
        qs.__dict__[STATE] = None
        return
    built = object.__new__(type(qs))
    built.__dict__.update(qs.__dict__)
    built.__dict__[STATE] = None
    built._result_cache = None
    built._query = state.base
    for name, args, kwargs in state.steps:  # each clones: the pristine query is shared
        built = _ORIGINAL[name](built, *args, **kwargs)
    query = built.query if state.steps else state.base.chain()
    if state.mark is not None:
        query.__dict__["_mcp"] = state.mark  # what cache() sets on a Query
    qs._query = query
    qs.__dict__[STATE] = None


# -- the wrapped methods: one attribute read on a queryset that does not record --


def _get_queryset(self: Any) -> Any:
    qs = _django_get_queryset(self)
    kind = type(qs)
    plain = _plain_classes.get(kind)
    if plain is None:
        plain = _plain_classes[kind] = _builds_as_django(kind)
    if plain and qs.model is not None and type(qs._query) is Query:
        query = qs._query
        qs._mcp_state = Recording(query) if _opted(qs.model) else query
    return qs


_BUILDING = (
    "__init__",
    "query",
    "_chain",
    "_clone",
    "_filter_or_exclude",
    "_filter_or_exclude_inplace",
    "_not_support_combined_queries",
    "filter",
    "exclude",
    "order_by",
    "select_related",
    "__getitem__",
    "all",
    "using",
)
"""The recorded methods and what Django's call to build a query: a queryset class that
defines one of them itself may build from state the fingerprint does not hold (a tenant,
a language read at the call or at the replay), so it never records."""
_plain_classes: dict[type, bool] = {}


def _builds_as_django(kind: type) -> bool:
    for klass in kind.__mro__:
        if klass is QuerySet:
            return True
        if any(name in vars(klass) for name in _BUILDING):
            return False
    return False


def _django_get_queryset(self: Any) -> Any:
    """Django's ``BaseManager.get_queryset`` (set by :func:`install`)."""
    raise NotImplementedError


def _never(model: type[Model]) -> bool:
    return False


_opted: Callable[[type[Model]], bool] = _never


def _get_query(self: Any) -> Query:
    state = self._mcp_state
    if state is not None:
        if type(state) is Recording:
            materialize(self)
        else:  # pristine, not recording: from now on its Query may change in place
            self.__dict__[STATE] = None
            if self.__dict__.pop(SHARED, False):  # a recording's base: change a copy instead
                self._query = self._query.chain()
    if self._deferred_filter:  # Django's getter applies it first
        query: Query = _django_query(self)
        return query
    built: Query = self._query
    return built


def _django_query(self: Any) -> Query:
    """Django's ``QuerySet.query`` getter (set by :func:`install`)."""
    raise NotImplementedError


def _getstate(self: Any) -> Any:
    """Pickled with its Query built: a process without these wrappers reads it right."""
    if self._mcp_state is not None:
        _get_query(self)
    return _ORIGINAL["__getstate__"](self)


def _set_query(self: Any, value: Query) -> None:
    if self._mcp_state is not None:
        self.__dict__[STATE] = None
    _ORIGINAL["query"].fset(self, value)


def _steps(self: Any) -> Recording | None:
    """``self``'s recording if a call may be recorded on it (Django's flags for the next
    call unset, nothing sliced): the test each recorded method makes first."""
    state = self._mcp_state
    if (
        type(state) is Recording
        and not state.sliced
        and state.base is self._query
        and not self._sticky_filter
        and not self._defer_next_filter
    ):
        return state
    return None


def _filtering(name: str) -> Callable[..., Any]:
    original = _ORIGINAL[name]

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = None if self._mcp_state is None or args else _steps(self)
        if state is not None:
            if not kwargs:
                return _clone(self, state)
            model = self.model
            items = []
            for key in sorted(kwargs):
                value = kwargs[key]
                kind = type(value)
                normal = (kind, value) if kind in _ATOMIC else _value_key(model, key, value)
                if normal is _NO:
                    break
                if kind is list:  # Django reads a list at the call: so does the recording
                    kwargs[key] = list(value)
                elif isinstance(value, Model):  # Django reads its pk at the call: so does this
                    kwargs[key] = value.pk  # (replayed with it: the key it was recorded under)
                items.append((key, normal))
            else:
                return _clone(self, _then(state, (name, (), kwargs), (name, tuple(items))))
        return original(self, *args, **kwargs)

    return method


def _naming(name: str) -> Callable[..., Any]:
    original = _ORIGINAL[name]

    def method(self: Any, *args: Any) -> Any:  # Django's takes names only
        state = None if self._mcp_state is None else _steps(self)
        if state is not None:
            for arg in args:
                if type(arg) is not str:
                    break
            else:
                return _clone(self, _then(state, (name, args, _EMPTY), (name, args)))
        return original(self, *args)

    return method


def _getitem(self: Any, k: Any) -> Any:
    state = None if self._mcp_state is None or type(k) is not slice else _steps(self)
    if (
        state is not None
        and k.step is None
        and self._result_cache is None
        and _bound(k.start)
        and _bound(k.stop)
    ):
        step = ("__getitem__", (k,), _EMPTY)
        return _clone(self, _then(state, step, ("__getitem__", k.start, k.stop), True))
    return _ORIGINAL["__getitem__"](self, k)


def _bound(value: Any) -> bool:
    return value is None or (type(value) is int and value >= 0)


def _all(self: Any) -> Any:
    state = None if self._mcp_state is None else _steps(self)
    if state is not None:
        return _clone(self, state)
    return _ORIGINAL["all"](self)


def _using(self: Any, alias: Any) -> Any:
    state = None if self._mcp_state is None else _steps(self)
    if state is not None and type(alias) is str:
        clone = _clone(self, state)
        clone._db = alias
        return clone
    return _ORIGINAL["using"](self, alias)


def start(qs: Any, mark: tuple[bool, int | None]) -> Any:
    """``cache()`` on a pristine or recording queryset: a recording clone with ``mark``,
    or None (the queryset is Django's: mark its Query)."""
    state = qs._mcp_state
    if state is None or not _plain(qs):
        return None
    if type(state) is Recording:
        if state.base is not qs._query:
            return None
        return _clone(qs, _tuple_new(Recording, (*state[:3], mark, state.sliced)))
    if state is not qs._query:
        return None
    recording = _clone(qs, _tuple_new(Recording, (state, (), (), mark, False)))
    qs.__dict__[SHARED] = True  # its Query is the recording's base now: never changed in place
    return recording


_STEPS = ("filter", "exclude", "order_by", "select_related", "__getitem__")


def install(opted: Callable[[type[Model]], bool]) -> None:
    """Wrap QuerySet's construction, ``.query`` and the recorded methods (idempotent).

    ``opted(model)``: whether a new pristine queryset of ``model`` records at once.
    """
    global _opted, _django_query, _django_get_queryset
    _opted = opted
    if _ORIGINAL:
        return
    _ORIGINAL["query"] = QuerySet.__dict__["query"]
    _ORIGINAL["__getstate__"] = QuerySet.__dict__["__getstate__"]
    for name in (*_STEPS, "all", "using"):
        _ORIGINAL[name] = QuerySet.__dict__[name]
    _django_query = _ORIGINAL["query"].fget
    _django_get_queryset = _MANAGER["get_queryset"] = BaseManager.get_queryset
    QuerySet._mcp_state = None  # type: ignore[attr-defined]
    BaseManager.get_queryset = _get_queryset  # type: ignore[method-assign]
    QuerySet.query = property(_get_query, _set_query)  # type: ignore[assignment]
    QuerySet.__getstate__ = _getstate  # type: ignore[method-assign]
    for name in ("filter", "exclude"):
        setattr(QuerySet, name, _wrapped(_filtering(name), name))
    for name in ("order_by", "select_related"):
        setattr(QuerySet, name, _wrapped(_naming(name), name))
    QuerySet.__getitem__ = _wrapped(_getitem, "__getitem__")  # type: ignore[method-assign]
    QuerySet.all = _all  # type: ignore[method-assign]
    QuerySet.using = _using  # type: ignore[method-assign]


def _wrapped(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    original = _ORIGINAL[name]
    method.__name__ = name
    method.__qualname__ = f"QuerySet.{name}"
    method.__doc__ = original.__doc__
    return method


def uninstall() -> None:
    """Restore Django's methods (tests)."""
    for name, original in _ORIGINAL.items():
        setattr(QuerySet, name, original)
    _ORIGINAL.clear()
    for name, original in _MANAGER.items():
        setattr(BaseManager, name, original)
    _MANAGER.clear()
    if "_mcp_state" in QuerySet.__dict__:
        delattr(QuerySet, "_mcp_state")
