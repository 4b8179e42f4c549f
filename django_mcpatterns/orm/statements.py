"""Compiled statements: a cached query's SQL compiled once per plan, run again on its misses.

Compiling a query is about half of Django's cost of reading it (the page query of
``benchmarks/bench_orm.py``: 410 µs of CPU out of 880), and a cached query paid it again
on every miss: each refill after a write, an eviction or an expiry.  A plan
(:class:`~.reads.Planned`) names one query exactly: its text is every attribute of
the Query that the SQL is made from, its values and the active time zone included
(:mod:`.shape`).  That is what lets a hit serve one stored result to every queryset
with that text, and it lets a miss run what was compiled for the first of them: the
SQL, its parameters and the compiler's description of the rows (columns, model,
``select_related`` parts), turned into instances by Django's own ``ModelIterable``
on the current thread's connection.  A recorded queryset (:mod:`.chain`) that misses
then builds no Query either.

Model instances only; another iterable (``values()``...), a query Django finds empty
before running it (``filter(pk__in=[])``), one with a parameter that is not an immutable
value (a JSON document, an array), one that selects a subquery, and a third-party
backend's are read Django's way every time.
"""

from __future__ import annotations

import datetime
import enum
import threading
from collections import deque
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models.query import ModelIterable
from django.db.models.sql import Query
from django.db.models.sql.compiler import SQLCompiler

from .shape import ATOMS

__all__ = ["DJANGO", "Statement", "compile_query", "keep", "rows"]


class Statement:
    """A query compiled once: its SQL, its parameters and the compiler that made them
    (what the compiler learnt of the rows' shape), detached from any connection."""

    __slots__ = ("compiler", "params", "sql")

    def __init__(self, compiler: SQLCompiler, sql: str, params: tuple[Any, ...]) -> None:
        self.compiler = compiler
        self.sql = sql
        self.params = params

    def bound(self, db: str) -> SQLCompiler:
        """A copy of the compiler on this thread's connection to ``db``, whose ``as_sql()``
        answers with the compiled statement (Django's ``execute_sql`` asks it)."""
        compiler: Any = _new(type(self.compiler))
        compiler.__dict__.update(self.compiler.__dict__)
        compiler.connection = connections[db]
        compiler.as_sql = self._as_sql
        bound: SQLCompiler = compiler
        return bound

    def _as_sql(self) -> tuple[str, tuple[Any, ...]]:
        return self.sql, self.params


DJANGO = Statement.__new__(Statement)
"""A plan whose query is read Django's way on every miss (not compiled ahead)."""
_new = object.__new__


def rows(qs: Any, planned: Any) -> list[Any]:
    """What Django's ``list(qs._iterable_class(qs))`` reads, with ``planned``'s statement
    (compiled from ``qs`` on the plan's first miss, if planning did not)."""
    if qs._iterable_class is not ModelIterable:
        return list(qs._iterable_class(qs))
    statement = planned.statement
    if statement is None:
        compiled = compile_query(qs.query, planned.db)
        statement = DJANGO if compiled is None else compiled[1]
        keep(planned, statement)
    if statement is DJANGO:
        return list(ModelIterable(qs))
    prepared: Any = _Prepared(qs, statement.bound(planned.db), planned.db)
    return list(ModelIterable(prepared))


BUDGET = 8 * 1024 * 1024
"""Bytes of statements a process keeps, as estimated by :func:`_size` (the page query's:
about 11 kB, its compiler with its description of the rows): past that, the oldest kept
are dropped, to be compiled again at their plan's next miss."""
_kept: deque[tuple[Any, int]] = deque()
_held = [0]
_keeping = threading.Lock()


def _size(statement: Statement) -> int:
    """An upper estimate of a statement's memory (measured: 11 kB for the page query,
    73 kB for ``pk__in`` 5,000 ids)."""
    return 10_000 + 2 * len(statement.sql) + 16 * len(statement.params)


def keep(planned: Any, statement: Statement) -> None:
    """Set ``planned``'s statement, within the process's :data:`BUDGET`."""
    planned.statement = statement
    if statement is DJANGO:
        return
    size = _size(statement)
    with _keeping:  # only a plan's first miss, or its planning, comes here
        _kept.append((planned, size))
        _held[0] += size
        while _held[0] > BUDGET and len(_kept) > 1:
            oldest, freed = _kept.popleft()
            oldest.statement = None
            _held[0] -= freed


def compile_query(query: Query, db: str) -> tuple[list[str], Statement] | None:
    """``query`` compiled by Django (on a copy: compiling changes a Query): the table of
    each alias its SQL uses (``select_related`` and ordering across a relation join theirs
    only now), and the statement to keep (:data:`DJANGO`: none).  None: it does not
    compile here (the caller reads it Django's way, which raises what Django raises)."""
    copy = query.chain()
    used: set[str] = set()
    reset = copy.reset_refcounts

    def seen_then_reset(to_counts: dict[str, int]) -> None:
        # as_sql() puts the reference counts back as they were before compiling: the
        # aliases its SQL used are those counted when it does.
        used.update(alias for alias, count in copy.alias_refcount.items() if count)
        reset(to_counts)

    copy.reset_refcounts = seen_then_reset  # type: ignore[method-assign]
    compiler = copy.get_compiler(using=db)
    try:
        sql, params = compiler.as_sql()
    except EmptyResultSet:
        sql, params = "", ()
    except Exception:
        return None
    finally:
        del copy.reset_refcounts
    used.update(alias for alias, count in copy.alias_refcount.items() if count)
    tables = [t.table_name for alias, t in copy.alias_map.items() if alias in used]
    if (
        not sql
        or not type(compiler).__module__.startswith("django.db.")  # may read what is dropped
        or not all(_immutable(value) for value in params)  # may change after compiling
        or any(_holds_query(column) for column, _, _ in compiler.select)  # holds its values
    ):
        return tables, DJANGO
    # What a run reads is the SQL, its parameters and the description of the rows; the
    # Query and its conditions hold the values they were built from (a filter's model
    # instance, with its caches), which a statement kept for the process must not keep.
    compiler.query = compiler.where = compiler.having = compiler.qualify = None
    compiler.connection = None  # each run binds its own thread's connection
    return tables, Statement(compiler, sql, tuple(params))


_IMMUTABLE = frozenset({*ATOMS, datetime.datetime})
"""The parameters a statement keeps: values that cannot change once compiled."""


def _immutable(value: Any) -> bool:
    """An immutable value, or a choices member of one (``TextChoices``, ``IntegerChoices``)."""
    return type(value) in _IMMUTABLE or (
        isinstance(value, enum.Enum) and type(value.value) in _IMMUTABLE
    )


def _holds_query(expression: Any) -> bool:
    if isinstance(expression, Query) or isinstance(getattr(expression, "query", None), Query):
        return True
    sources = getattr(expression, "get_source_expressions", None)
    return sources is not None and any(
        _holds_query(source) for source in sources() if source is not None
    )


class _Prepared:
    """``qs`` as ``ModelIterable`` reads it, its Query answering with a bound statement
    (every other attribute is the queryset's own)."""

    __slots__ = ("_compiler", "_qs", "db")

    def __init__(self, qs: Any, compiler: SQLCompiler, db: str) -> None:
        self._qs = qs
        self._compiler = compiler
        self.db = db  # where the statement ran: a router asked again may answer another

    @property
    def query(self) -> _Prepared:
        return self

    def get_compiler(self, using: str | None = None, **kwargs: Any) -> SQLCompiler:
        return self._compiler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._qs, name)
