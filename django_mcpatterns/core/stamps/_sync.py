# Generated from core/stamps/_async.py by scripts/generate_sync.py: do not edit.
"""Stamps' I/O, written once for asyncio (the sync form is generated: ``_sync.py``).

A cached read is one ``gets_many`` of the result and all its stamps and
registries (:func:`async_read`).  A fill first makes what is missing exist
(stamps get fresh tokens, schemes get registered), recording the tokens
*before* the compute, then leases the result key (a placeholder swapped in
by cas, or added) and stores the value by cas.  A writer that deletes a stamp
after the compute's tokens were read voids the fill's result at the next read,
whoever stored it; the lease keeps a late fill from replacing a newer one and
tells concurrent readers that someone is computing (stampede protection).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from django_mcpatterns.core.concurrency import sleep
from django_mcpatterns.core.exceptions import ValueTooLargeError
from django_mcpatterns.core.leases import PLACEHOLDER
from django_mcpatterns.core.store import CasToken, LeaseStore, Store

from ._model import (
    Plan,
    Read,
    Registry,
    Scheme,
    backoff,
    judge,
    new_cached,
    new_token,
    registry_line,
    registry_start,
    tokens_for,
)


def read(store: Store, plan: Plan) -> Read:
    """The one round trip of a cached read: the result, its stamps and registries, judged."""
    return judge(plan, store.gets_many(plan.keys()))


def read_leased(store: LeaseStore, plan: Plan, ttl: int) -> Read:
    """:func:`async_read` that leases a missing result for ``ttl`` seconds in the same trip.

    memcached's own lease (``mg <key> v c f N<ttl>``): one reader of a missing
    result gets the lease (``Read.lease``), the others see it pending until the
    fill lands.  So a cold miss costs this read and the fill.
    """
    leased = store.gets_leased(plan.key, plan.dependencies(), ttl)
    return judge(plan, leased.found, leased)


def lease(store: LeaseStore, plan: Plan, read: Read, ttl: int) -> Read:
    """Lease a result found invalid: its version is replaced by a lease (one write).

    The read, with the lease taken (``lease``), or another filler's seen
    (``pending``), or neither (the result changed since: read it again).
    """
    taken = store.lease(plan.key, ttl, read.cas)
    return replace(read, lease=taken.lease, pending=taken.pending)


def prepare(store: Store, plan: Plan, read: Read, stamp_ttl: int) -> tuple[bytes, ...] | None:
    """Make the plan's stamps and schemes exist; return the tokens a fill records.

    None: the result cannot be cached now (a registry is full, a write failed).
    Called before the compute: tokens read later could postdate a write the
    compute did not see.
    """
    if read.full or read.tokens is None:
        return None
    tokens = dict(read.tokens)
    for registry, scheme, parsed in read.unregistered:
        generation = _register(store, registry, scheme, parsed)
        if generation is None:
            return None
        tokens[registry] = generation
    if read.missing:
        fresh = {key: new_token() for key in read.missing}
        if store.set_many(fresh, stamp_ttl):
            return None
        tokens.update(fresh)
    return tokens_for(plan, tokens)


def _register(store: Store, registry: str, scheme: Scheme, parsed: Registry | None) -> bytes | None:
    """Add ``scheme`` to ``registry`` (creating it); return the generation it was added to."""
    if parsed is not None and store.append(registry, registry_line(scheme)):
        return parsed.generation
    token = new_token()
    if store.add(registry, registry_start(token, scheme), 0):
        return token
    if not store.append(registry, registry_line(scheme)):
        return None
    again = Registry.parse(store.get(registry))
    return again.generation if again is not None and scheme in again.schemes else None


def claim(store: Store, plan: Plan, read: Read, ttl: int) -> CasToken | None:
    """Lease the result key for a fill: None when another filler holds it (or it failed)."""
    if read.present:
        return store.recas(plan.key, PLACEHOLDER, read.cas, ttl)
    return store.add_cas(plan.key, PLACEHOLDER, ttl)


def release(store: Store, plan: Plan, lease: CasToken) -> None:
    """Give a lease back unfilled (the compute failed): delete the placeholder if still ours."""
    store.delete_cas(plan.key, lease)


def fill(
    store: Store,
    plan: Plan,
    lease: CasToken | None,
    tokens: tuple[bytes, ...],
    value: object,
    expire: int,
) -> bool:
    """Store ``value`` under the lease (None: only if the key is still empty).

    False when it did not land: another fill, or a value over the item size.
    """
    try:
        if lease is None:
            return store.add(plan.key, new_cached(tokens, value), expire)
        stored = store.cas(plan.key, new_cached(tokens, value), lease, expire)
    except ValueTooLargeError:
        return False
    return stored is True


def renew(store: Store, stamps: Sequence[str], drop: Sequence[str], ttl: int) -> list[str]:
    """A writer's invalidation: new tokens for ``stamps``, ``drop`` deleted (registries).

    Renewing rather than deleting keeps the stamps a reader needs in place, so
    the read after a write costs no extra round trip to recreate them.  Returns
    the stamps that were not stored.
    """
    failed: list[str] = []
    if stamps:
        failed = [str(key) for key in store.set_many({key: new_token() for key in stamps}, ttl)]
    if drop:
        store.delete_many(drop)
    return failed


def wait(store: Store, plan: Plan, budget: float, lease_ttl: int = 0) -> Read | None:
    """Wait up to ``budget`` seconds for another filler's result: the valid read, or None.

    ``lease_ttl``: re-read with leasing reads (``store`` takes leases), so a lease
    given back or expired meanwhile goes to this waiter: the read then holds it.
    """
    leases = store if lease_ttl and isinstance(store, LeaseStore) else None
    for pause in backoff(budget):
        sleep(pause)
        again = read(store, plan) if leases is None else read_leased(leases, plan, lease_ttl)
        if again.hit or again.lease is not None:
            return again
        if again.present and not again.pending:
            return None  # the fill landed and is already void, or was abandoned
    return None


def registries(store: Store, keys: Iterable[str]) -> dict[str, Registry | None]:
    """The registries of the tables a writer touched (a missing one: None)."""
    wanted = list(keys)
    found = store.get_many(wanted)
    return {key: Registry.parse(found.get(key)) for key in wanted}
