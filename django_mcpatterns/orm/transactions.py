"""Transactions and the cache: read your writes, fill only what a commit could not void.

Inside a transaction that wrote a table, reads of that table bypass the cache
(neither served nor filled): the cache holds committed data, the transaction
sees its own.  Invalidations wait for the commit (``on_commit``), so a rolled
back transaction sends none.  A fill inside a transaction is allowed only
where each statement reads the latest committed data (PostgreSQL's default
READ COMMITTED): under a snapshot taken earlier (REPEATABLE READ, SQLite's
transactions) a fill could store rows older than a stamp it read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections, transaction

__all__ = ["dirty_tables", "fill_allowed", "mark_written", "read_state"]

_DIRTY = "_mcpatterns_orm_dirty"


def dirty_tables(using: str) -> set[str] | None:
    """The tables the current transaction on ``using`` wrote; None outside one (or none)."""
    return _dirty(connections[using])


def read_state(using: str) -> tuple[set[str] | None, bool]:
    """:func:`dirty_tables` and :func:`fill_allowed` of ``using``, its connection looked up
    once (a look-up goes through the handler's context-local storage: ~11k instructions)."""
    conn = connections[using]
    return _dirty(conn), _allowed(conn)


def _dirty(conn: Any) -> set[str] | None:
    dirty: set[str] | None = conn.__dict__.get(_DIRTY)
    if not dirty:
        return None
    if not conn.in_atomic_block:  # committed or rolled back since
        dirty.clear()
        return None
    return dirty


def mark_written(using: str, tables: Iterable[str]) -> None:
    """Record that the current transaction on ``using`` wrote ``tables``."""
    conn = connections[using]
    if not conn.in_atomic_block:
        return
    dirty: set[str] = conn.__dict__.setdefault(_DIRTY, set())
    if not dirty:
        transaction.on_commit(dirty.clear, using=using)
    dirty.update(tables)


def fill_allowed(using: str) -> bool:
    """Whether a result read now on ``using`` may be stored."""
    return _allowed(connections[using])


def _allowed(conn: Any) -> bool:
    if not conn.in_atomic_block:
        return True
    if conn.vendor != "postgresql":
        return False
    level = getattr(conn, "isolation_level", None)
    return level is None or getattr(level, "name", str(level)).upper() == "READ_COMMITTED"
