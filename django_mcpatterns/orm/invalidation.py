"""Sending invalidations: which stamps a change deletes, and the seam for outages.

A change names a model, a database and rows (canonical values of their
pinnable columns, old and new), or says the rows are unknown (``whole``).
After the commit, :func:`invalidate` reads the registries of the model's
tables (one multi-get), renews the table stamps and every conjunction stamp
the rows match (one multi-set of new tokens) and, for a whole model, deletes
the registries: a missing registry voids every conjunction result built on it.

Outages: :class:`Journal` is where invalidations that could not be sent wait.
Stamps are renewed (a new token), registries deleted.  The default,
:class:`RepairJournal`, hands what could not be sent to the store's journal
(``Store.forget``, docs/failures.md): a stamp that could not be renewed, and
every registry to drop, is deleted on its server now or before that server
serves again, which voids every result built on it just as a renewal does.
Nothing waits for the next invalidation.  :class:`MemoryJournal` (the seam's
first journal: kept in process, sent again with the next invalidation) stays
available to :func:`set_journal`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from django.db import router
from django.db.models import Model

from django_mcpatterns.core import stamps
from django_mcpatterns.core.locks import authoritative
from django_mcpatterns.core.store import Store

from .reads import SPACE, Reader, reader

__all__ = [
    "Journal",
    "MemoryJournal",
    "RepairJournal",
    "chain",
    "invalidate",
    "invalidate_all",
    "invalidate_model",
    "invalidate_obj",
    "set_journal",
]

logger = logging.getLogger("django_mcpatterns.orm")

Rows = Sequence[dict[str, str]]
"""Canonical column values per row; an empty dict is a row whose values are unknown."""


class Journal(Protocol):
    """Where invalidations that could not be sent wait (the outage seam).

    ``renew``: stamps to give new tokens; ``drop``: registries to delete.
    Either way every result built on them is void; what matters is that it
    happens before the server that holds them serves again.
    """

    def deliver(self, store: Store, renew: Sequence[str], drop: Sequence[str], ttl: int) -> None:
        """Send now, or keep until the server that holds the keys can take them."""
        ...


class MemoryJournal:
    """The default journal: what failed is kept and sent again with the next invalidation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.renew: set[str] = set()
        self.drop: set[str] = set()

    def deliver(self, store: Store, renew: Sequence[str], drop: Sequence[str], ttl: int) -> None:
        with self._lock:
            renewing = sorted(self.renew.union(renew))
            dropping = sorted(self.drop.union(drop))
            self.renew.clear()
            self.drop.clear()
        try:
            failed = stamps.renew(store, renewing, dropping, ttl)
        except Exception:
            logger.warning("ORM invalidation not sent; kept for the next one", exc_info=True)
            failed, dropping_failed = renewing, dropping
        else:
            dropping_failed = []
        if failed or dropping_failed:
            with self._lock:
                self.renew.update(failed)
                self.drop.update(dropping_failed)


class RepairJournal:
    """The default journal: what could not be sent is repaired before its server serves again.

    ``set_many`` names the stamps it could not renew (a server out, or whose
    reply never came: renewed or not, unknown); each is deleted through the
    store's journal (``forget``), which voids what was built on it whichever
    happened.  ``delete_many`` names nothing, so each registry is dropped with
    a ``forget`` of its own (a whole-table invalidation drops a few).  An
    outage never raises into the save that sent the invalidation.
    """

    def deliver(self, store: Store, renew: Sequence[str], drop: Sequence[str], ttl: int) -> None:
        try:
            failed = stamps.renew(store, list(renew), [], ttl)
        except Exception:
            logger.warning("ORM stamps not renewed; dropping them instead", exc_info=True)
            failed = list(renew)
        for key in (*failed, *drop):
            try:
                store.forget(key)
            except Exception:
                logger.warning("ORM invalidation of %r not sent", key, exc_info=True)


_journal: list[Journal] = [RepairJournal()]


def set_journal(journal: Journal) -> None:
    """Route every ORM invalidation through ``journal`` (the outage work's seam)."""
    _journal[0] = journal


def chain(model: type[Model]) -> list[type[Model]]:
    """The concrete models whose tables a write of ``model`` changes: it and its parents."""
    concrete = model._meta.concrete_model or model
    return [concrete, *concrete._meta.get_parent_list()]


def invalidate(
    using: str, tables: Mapping[str, Rows], whole: Iterable[str] = (), *, label: str = ""
) -> None:
    """Delete the stamps of ``tables`` (table -> changed rows); ``whole``: void every result."""
    read = reader()
    prefix = read.prefix
    keys: set[str] = set()
    wholes = set(whole)
    registry_keys = {
        stamps.registry_key(prefix, SPACE, table): table for table in tables if table not in wholes
    }
    found = _registries(read, list(registry_keys))
    for registry, table in registry_keys.items():
        keys.add(stamps.table_key(prefix, SPACE, table))
        parsed = found.get(registry)
        if parsed is None:
            # Unknown (the cache did not answer), or, during a ring migration, maybe on
            # the other ring: a stage-2 process that added a scheme deleted the old
            # ring's copy, which stage-1 processes read.  Void the table, drop the registry.
            if registry not in found or read.migrating:
                wholes.add(table)
            continue
        conj, complete = stamps.conjunctions(prefix, SPACE, table, parsed.schemes, tables[table])
        if complete:
            keys |= conj
        else:
            wholes.add(table)
    drop = set()
    for table in wholes:
        keys.add(stamps.table_key(prefix, SPACE, table))
        drop.add(stamps.registry_key(prefix, SPACE, table))
    read.record("invalidation", label or ",".join(sorted(tables) or sorted(wholes)), len(keys))
    _journal[0].deliver(read.values, sorted(keys), sorted(drop), read.settings.stamp_timeout)


def _registries(read: Reader, keys: list[str]) -> dict[str, stamps.Registry | None]:
    # Read through the strict view: an unreachable server must read as "unknown" (the
    # whole table is invalidated), never as "no registry" (its conjunctions left valid).
    store = authoritative(getattr(read.values, "store", read.values))
    try:
        return stamps.registries(store, keys)
    except Exception:
        logger.warning("ORM registries not read; invalidating whole tables", exc_info=True)
        return {}


def invalidate_obj(obj: Model, *, using: str | None = None) -> None:
    """Void every cached result that ``obj``'s row (as it is in memory) can be part of."""
    from .pins import row_values

    db = using or obj._state.db or router.db_for_write(type(obj), instance=obj)
    tables = {m._meta.db_table: [row_values(m, obj, db)] for m in chain(type(obj))}
    invalidate(db, tables, label=type(obj)._meta.label_lower)


def invalidate_model(model: type[Model], *, using: str | None = None) -> None:
    """Void every cached result that reads ``model``'s table (O(1) per table)."""
    db = using or router.db_for_write(model)
    tables = [m._meta.db_table for m in chain(model)]
    invalidate(db, {}, whole=tables, label=model._meta.label_lower)


def invalidate_table(table: str, *, using: str = "default") -> None:
    """Void every cached result that reads ``table`` (raw SQL, other services)."""
    invalidate(using, {}, whole=[table], label=table)


def invalidate_all() -> None:
    """Void every cached ORM result, of every model (one delete)."""
    read = reader()
    read.record("invalidation", "*", 1)
    _journal[0].deliver(read.values, [read.all_key], [], read.settings.stamp_timeout)
