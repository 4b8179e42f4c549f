"""Cached reads of querysets: plan the keys, one multi-get, or a leased fill.

:class:`Reader` is the process's reader for the configured cache alias.  It
turns a queryset and an operation into a :class:`~..core.stamps.Plan` (the
result key from the query's shape, the stamps from its tables and pins),
reads it in one round trip, and on a miss fills it under a lease
(:mod:`django_mcpatterns.core.stamps`).  A cache that cannot be reached, or a
shape that cannot be keyed, falls back to the database: never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.core.cache import caches
from django.core.exceptions import FieldDoesNotExist
from django.db import connections
from django.db.models.query import ModelIterable
from django.db.models.sql import Query

from django_mcpatterns.core import stamps
from django_mcpatterns.core.chunks import AsyncChunkedStore, ChunkedStore
from django_mcpatterns.core.store import AsyncLeaseStore, AsyncStore, LeaseStore, Store

from . import audit, observe
from .conf import OrmSettings, orm_settings
from .pins import pins
from .shape import Uncacheable, shape_of, text_digest
from .statements import Statement, compile_query, keep
from .transactions import dirty_tables, fill_allowed, read_state

__all__ = ["SPACE", "Planned", "Reader", "global_key", "reader", "reset"]

logger = logging.getLogger("django_mcpatterns.orm")
T = TypeVar("T")
NOT_TAKEN = stamps.Read(False)
LEASE_TTL = 30
"""Seconds a fill's lease lives: a filler that died blocks others' fills that long."""
PLANS = 4096
"""Plans a reader keeps by their query's text (then it starts again): a process runs
the same few query shapes over and over.  Kept by the text itself (a page query's is
1.5 kB), the digest is made only for a new plan: hashing the text was a tenth of keying."""


SPACE = ""
"""The database part of stamp keys: none.  Stamps are shared by every database alias, so a
write through the primary voids results read through a replica alias of the same data (a
table of the same name in another database is invalidated along, which is only a miss)."""


def global_key(prefix: str) -> str:
    """The stamp every cached result depends on (``invalidate_all`` deletes it)."""
    return f"{prefix}all"


class Planned:
    """A plan with what the read path needs besides its keys."""

    __slots__ = ("db", "label", "plan", "statement", "tables")

    def __init__(
        self, plan: stamps.Plan, tables: frozenset[str] | set[str], db: str, label: str
    ) -> None:
        self.plan = plan
        self.tables = tables
        self.db = db
        self.label = label
        self.statement: Statement | None = None
        """Its query compiled by the first miss that reads rows (:mod:`.statements`)."""


class Reader:
    """Reads and fills cached results through one cache alias."""

    def __init__(self, settings: OrmSettings) -> None:
        self.settings = settings
        cache: Any = caches[settings.cache]
        store = getattr(cache, "store", None)
        if store is None:
            raise TypeError(
                f"MCPATTERNS_ORM['cache'] = {settings.cache!r} is not a django_mcpatterns "
                "backend (KetamaMemcacheCache or LocMemPatternsCache)"
            )
        values = cache.values
        avalues = cache.avalues
        size = getattr(getattr(store, "options", None), "max_item_size", 1024 * 1024)
        if not isinstance(values, ChunkedStore):
            # The cache API's store: the cluster's, or during a ring migration
            # (OPTIONS["migrate_from"]) the store over both rings, whose rules keep
            # stamps right while processes of two stages run side by side.
            values = ChunkedStore(values, size)
            avalues = AsyncChunkedStore(avalues, size)
        self.values: Store = values
        self.avalues: AsyncStore = avalues
        # During a ring migration a registry this process does not find may be on the
        # other ring, read by processes of the other stage (see invalidation.invalidate).
        self.migrating = getattr(getattr(cache, "binding", None), "migration", None) is not None
        # memcached's own leases, taken by the read (lease="meta"; text mode answers
        # a leasing read without one, and the fill then leases with a placeholder).
        meta = settings.lease == "meta"
        self.leases = values if meta and isinstance(values, LeaseStore) else None
        self.aleases = avalues if meta and isinstance(avalues, AsyncLeaseStore) else None
        self.prefix = f"{getattr(cache, 'key_prefix', '')}{settings.prefix}"
        self.all_key = global_key(self.prefix)
        self.observer = getattr(store, "observer", None)
        self._tables: dict[tuple[str, str], tuple[str, str]] = {}
        self._vendors: dict[str, str] = {}
        self._plans: dict[str, Planned] = {}
        self.memo: dict[Hashable, Planned | None] = {}
        """Plans by a recorded chain's fingerprint (None: not cached), as many as
        :data:`PLANS` (``orm.chain``): a hit of a chain seen before builds no Query."""

    def record(self, event: str, label: str, count: int = 1) -> None:
        """Count an event (orm.stats(), the orm_event signal) and tell the cache's observer
        (Prometheus ``mcpatterns_events{event="orm_hit"}``...)."""
        observe.record(event, label, count)
        observer = self.observer
        if observer is not None:
            observer.event(f"orm_{event}")

    def table_keys(self, db: str, table: str) -> tuple[str, str]:
        """The table's stamp and registry keys (made once per process)."""
        found = self._tables.get((db, table))
        if found is None:
            found = (
                stamps.table_key(self.prefix, db, table),
                stamps.registry_key(self.prefix, db, table),
            )
            self._tables[db, table] = found
        return found

    # -- planning (pure: no I/O) --

    def plan(self, query: Query, db: str, *extra: Any) -> Planned | None:
        """The plan of reading ``query`` on ``db`` (``extra``: the operation), or None.

        The text of the query's structure (its model, ``db`` and every value
        included) decides it: the rest of the plan (the digest naming the result,
        tables, pins, stamp keys) is a function of it, so it is made once per text
        and reused.
        """
        try:
            shape = shape_of(query, db, *extra)
        except Uncacheable as why:
            logger.debug("not cached: %s", why)
            return None
        text = shape.text()
        plans = self._plans
        found = plans.get(text)
        if found is None:
            # Model instances read (queryset.py's extra: the operation, the iterable...).
            rows = len(extra) > 1 and extra[0] in ("fetch", "get") and extra[1] is ModelIterable
            found = self._planned(query, db, shape.tables, text_digest(text), text, rows)
            if found is None:
                return None
            if len(plans) >= PLANS:
                plans.clear()
                self.memo.clear()
            plans[text] = found
        return found

    def forget(self) -> None:
        """Forget every plan, and with them their statements: the next read of each query
        plans (and its miss compiles) anew, as a process's first read of it does."""
        self._plans.clear()
        self.memo.clear()

    def remember(self, fingerprint: Hashable, planned: Planned | None) -> None:
        """Keep ``planned`` (None: the query is not cached) for a recorded chain's
        ``fingerprint`` (``orm.chain``): the plan of every queryset with that chain."""
        memo = self.memo
        if len(memo) >= PLANS:
            memo.clear()
        memo[fingerprint] = planned

    def _planned(
        self,
        query: Query,
        db: str,
        tables: set[str],
        digest: str,
        text: str = "",
        rows: bool = False,
    ) -> Planned | None:
        model = query.model
        if model is None:
            return None
        prefix = self.prefix
        base = model._meta.db_table
        tables.add(base)
        vendor = self._vendors.get(db)
        if vendor is None:
            vendor = self._vendors[db] = connections[db].vendor
        statement: Statement | None = None
        if _joins_when_compiled(query):  # compiled now, once per plan: kept for its misses
            found_compiled = compile_query(query, db)
            if found_compiled is None:
                logger.debug("not cached: the query does not compile")
                return None
            compiled, statement = found_compiled
        else:
            compiled = [t.table_name for a, t in query.alias_map.items() if query.alias_refcount[a]]
        tables.update(compiled)
        again = compiled.count(base) > 1 or _reads_again(query, base, text)
        found = None if again else pins(query, vendor)
        stamp_keys = [self.all_key]
        schemes: tuple[tuple[str, stamps.Scheme], ...] = ()
        for table in sorted(tables):
            if table != base or found is None:
                stamp_keys.append(self.table_keys(SPACE, table)[0])
        if found is not None:
            scheme, combinations = found
            stamp_keys.extend(
                stamps.conjunction_key(prefix, SPACE, base, scheme, values)
                for values in combinations
            )
            schemes = ((self.table_keys(SPACE, base)[1], scheme),)
        plan = stamps.Plan(f"{prefix}q:{digest}", tuple(stamp_keys), schemes)
        planned = Planned(plan, frozenset(tables), db, model._meta.label_lower)
        if statement is not None and rows:
            keep(planned, statement)
        return planned

    def bypassed(self, planned: Planned) -> bool:
        """Read your writes: the current transaction wrote a table this read uses."""
        dirty = dirty_tables(planned.db)
        if dirty is not None and not dirty.isdisjoint(planned.tables):
            self.record("bypass", planned.label)
            return True
        return False

    def admit(self, planned: Planned) -> bool | None:
        """None when the read bypasses the cache (:meth:`bypassed`), else whether a result
        read now may be stored (``fill_allowed``): one look-up of the connection for both."""
        dirty, allowed = read_state(planned.db)
        if dirty is not None and not dirty.isdisjoint(planned.tables):
            self.record("bypass", planned.label)
            return None
        return allowed

    # -- reading --

    def fetch(
        self,
        planned: Planned,
        compute: Callable[[], T],
        timeout: int,
        pack: Callable[[T], Any] | None = None,
        allowed: bool | None = None,
        audited: Callable[[], T] | None = None,
    ) -> T:
        """The cached value of ``planned``, or ``compute()`` (stored when it may be).

        ``pack``: the form to store the value in (a hit returns that form).
        ``allowed``: :meth:`admit`'s answer in this thread, if the caller has it.
        ``audited``: what the auditor compares a hit with (``compute`` by default).
        """
        if allowed is None:
            allowed = fill_allowed(planned.db)
        try:
            leases = self.leases
            if leases is not None and allowed:
                read = stamps.read_leased(leases, planned.plan, LEASE_TTL)
            else:
                read = stamps.read(self.values, planned.plan)
        except Exception:  # the cache is unreachable or refused: the database answers
            logger.warning("ORM cache read failed; reading the database", exc_info=True)
            self.record("uncached", planned.label)
            return compute()
        if read.hit:
            return self._hit(planned, read, compute if audited is None else audited)
        return self.fill(planned, read, compute, timeout, pack, allowed)

    def _hit(self, planned: Planned, read: stamps.Read, audited: Callable[[], T]) -> T:
        """A hit's value, counted, and sampled for the auditor (``audited`` re-reads it)."""
        self.record("hit", planned.label)
        audit.sample(
            self.settings.audit, self.values, planned.plan, planned.label, read.value, audited
        )
        value: T = read.value
        return value

    async def afetch(
        self,
        planned: Planned,
        compute: Callable[[], T],
        timeout: int,
        pack: Callable[[T], Any] | None = None,
        audited: Callable[[], T] | None = None,
    ) -> T:
        """:meth:`fetch` for async code: a hit costs no thread hop; a miss runs in a thread."""
        try:
            aleases = self.aleases
            if aleases is not None and fill_allowed(planned.db):
                read = await stamps.async_read_leased(aleases, planned.plan, LEASE_TTL)
            else:
                read = await stamps.async_read(self.avalues, planned.plan)
        except Exception:
            logger.warning("ORM cache read failed; reading the database", exc_info=True)
            self.record("uncached", planned.label)
            return await sync_to_async(compute)()
        if read.hit:
            return self._hit(planned, read, compute if audited is None else audited)
        return await sync_to_async(self.fill)(planned, read, compute, timeout, pack)

    def fill(
        self,
        planned: Planned,
        read: stamps.Read,
        compute: Callable[[], T],
        timeout: int,
        pack: Callable[[T], Any] | None = None,
        allowed: bool | None = None,
    ) -> T:
        """The miss path: record the stamps' tokens, lease, compute, store.

        A lease the read took (memcached's own: ``read.lease``) or this fill took
        and did not fill (the compute raised, the value is too large) is given
        back, so the next reader fills instead of waiting for it.
        """
        plan = planned.plan
        lease: Any = read.lease  # taken by the read itself: no write of its own
        held = lease is not None  # a lease this fill stores over or gives back
        tokens: tuple[bytes, ...] | None = None
        try:
            if held or (fill_allowed(planned.db) if allowed is None else allowed):
                tokens = stamps.prepare(self.values, plan, read, self.settings.stamp_timeout)
            if tokens is not None and not held:
                if self.settings.lease == "cas":
                    lease = read.cas  # the read's cas is the lease: no extra write
                else:
                    taken = self._take(planned, read)
                    if taken.hit:
                        value: T = taken.value
                        return value
                    lease = taken.lease
                    held = lease is not None
                    if not held:
                        tokens = None
        except Exception:
            logger.warning("ORM cache fill failed; reading the database", exc_info=True)
            tokens = None
        if held and tokens is None:  # not to be stored: the next reader need not wait
            self._release(plan, lease)
            held = False
        try:
            result = compute()
        except BaseException:
            if held:
                self._release(plan, lease)
            raise
        if tokens is None:
            self.record("uncached", planned.label)
            return result
        self.record("miss", planned.label)
        stored = False
        try:
            packed = result if pack is None else pack(result)
            stored = stamps.fill(self.values, plan, lease, tokens, packed, timeout)
        except Exception:
            logger.warning("ORM cache fill failed", exc_info=True)
        if held and not stored:
            self._release(plan, lease)
        return result

    def _take(self, planned: Planned, read: stamps.Read) -> stamps.Read:
        """Lease the result key for a fill, or wait for another filler's result.

        The read that holds the lease (``lease``), or a hit (the other fill's
        result), or neither (compute without storing).  With memcached's own
        leases an invalid result's version is replaced by a lease (one write),
        and a pending lease is waited for at once; otherwise a placeholder is
        added or swapped in (:func:`~django_mcpatterns.core.stamps.claim`).
        """
        plan = planned.plan
        leases = self.leases
        if read.leasing and leases is not None:
            if not read.pending:
                read = stamps.lease(leases, plan, read, LEASE_TTL)
            if read.lease is not None:
                return read
        else:
            lease = stamps.claim(self.values, plan, read, LEASE_TTL)
            if lease is not None:
                return replace(read, lease=lease)
        waited = self._wait(planned, read.leasing)
        return waited if waited is not None else NOT_TAKEN

    def _wait(self, planned: Planned, leasing: bool) -> stamps.Read | None:
        """Another process holds the lease: wait a little for its result (or its lease)."""
        if self.settings.wait <= 0:
            return None
        ttl = LEASE_TTL if leasing else 0
        waited = stamps.wait(self.values, planned.plan, self.settings.wait, ttl)
        if waited is not None and waited.hit:
            self.record("hit", planned.label)
        return waited

    def _release(self, plan: stamps.Plan, lease: Any) -> None:
        try:
            stamps.release(self.values, plan, lease)
        except Exception:
            logger.debug("ORM lease not released", exc_info=True)


_readers: dict[int, Reader] = {}


def reader() -> Reader:
    """The process's reader for the current settings."""
    settings = orm_settings()
    found = _readers.get(id(settings))
    if found is None or found.settings is not settings:
        found = _readers[id(settings)] = Reader(settings)
    return found


def reset() -> None:
    """Forget the readers (the cache or the settings changed)."""
    _readers.clear()


def _reads_again(query: Query, base: str, text: str) -> bool:
    """Whether a subquery of ``query`` reads its base table: rows its pins do not match
    then change its result, so it depends on the table stamp.  The shape text names
    every table alias of the query and its subqueries once (``B:``/``J:``)."""
    top = sum(1 for t in query.alias_map.values() if t.table_name == base)
    return text.count(f"B:{base}:") + text.count(f"J:{base}:") > top


def _joins_when_compiled(query: Query) -> bool:
    """Whether compiling ``query`` may join tables its alias map does not hold yet
    (``select_related``, a parent's table, ordering across a relation or by a related
    model's ``Meta.ordering``); True when unsure."""
    model = query.model
    if model is None:
        return True
    meta = model._meta
    concrete = meta.concrete_model or model
    if query.select_related or concrete._meta.parents or query.distinct_fields:
        return True
    names = query.order_by or ((meta.ordering or ()) if query.default_ordering else ())
    for name in names:
        if not isinstance(name, str):
            return True
        head, _, rest = name.lstrip("-").partition("__")
        if rest:
            return True
        if head == "pk":
            continue
        try:
            field = meta.get_field(head)
        except FieldDoesNotExist:
            continue  # an annotation: its joins are made when it is added
        if field.is_relation:
            return True
    return False
