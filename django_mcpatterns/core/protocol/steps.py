"""The steps of the commands that are more than one request: their generator plans.

A text ``delete_cas`` reads the item, then expires that version; a cas given
a copy's token resolves the home's first (:class:`~.plans.HomeToken`);
``set_many`` writes a replicated key to all of its replicas before fanning
out the rest.  Each is a generator plan (:mod:`.plans`), run by either driver.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

from ..keys import Key, placed
from ..store import MAX_RELATIVE_EXPIRE, CasToken
from .decoding import DeleteMany, StoreMany, swapped, text_cas_token
from .meta import MetaSet
from .plans import Call, CopyToken, FanOut, HomeToken, Plan
from .replies import cas_stored, deleted, first_value, identity, written
from .wire import Delete, Get, Store

__all__ = [
    "EXPIRED",
    "delete_many",
    "expire_version",
    "on_home",
    "set_many",
    "swap_and_mark",
    "text_cas",
]

Serde = Any
Steps = Generator[Any, Any, Any]  # a plan of several steps (see plans.py)
R = TypeVar("R")

EXPIRED = MAX_RELATIVE_EXPIRE + 1  # an absolute Unix time long past


def set_many(store_many: StoreMany, given: dict[bytes, Any], replicated: list[bytes]) -> Steps:
    """set_many with replicated keys: each to all its replicas first, then the others fanned out."""
    failed: list[Key] = []
    for kb in replicated:
        key = given.pop(kb)
        (request,) = store_many.requests([kb])
        if not (yield Call(placed(key)[1], request, written, False)):
            failed.append(key)
    parts = yield FanOut(store_many, given, write=True)
    return failed + [given[kb] for part in parts for kb in part]


def delete_many(given: dict[bytes, Key], replicated: list[bytes]) -> Steps:
    """delete_many: replicated keys from all their replicas, each, then the others fanned out."""
    for kb in replicated:
        key = given.pop(kb)
        yield Call(placed(key)[1], Delete(kb), deleted, False)
    yield FanOut(DeleteMany(), given, write=True)


def on_home(kb: bytes, cas: CasToken, step: Callable[[CasToken], Plan[R]], missing: R) -> Plan[R]:
    """``step(cas)``; a token read from a copy becomes the home's first (None: ``missing``)."""
    if type(cas) is not CopyToken:
        return step(cas)
    return via_home(kb, cas, step, missing)


def via_home(
    kb: bytes, cas: CopyToken, step: Callable[[CasToken], Plan[R]], missing: R
) -> Generator[Any, Any, R]:
    home = yield HomeToken(kb, cas)
    if home is None:
        return missing
    result: R = yield from steps(step(home))
    return result


def steps(plan: Plan[Any]) -> Steps:
    return (yield plan) if type(plan) is Call else (yield from plan)  # type: ignore[misc]


def text_cas(ring: bytes, write: Store) -> Steps:
    """A text storage command and a ``gets`` in one write: the stored item's cas."""
    replies = yield Call(ring, (write, Get((write.key,), cas=True)), None, None)
    return None if replies is None else text_cas_token(write, replies, write.data, write.flags)


def expire_version(kb: bytes, ring: bytes, token: bytes) -> Steps:
    """No cas on a text delete: read the item's bytes, then expire that version."""
    item = yield Call(ring, Get((kb,), cas=True), first_value, None)
    if item is None or item.cas != token:
        return False
    expired = Store("cas", kb, item.data, item.flags, EXPIRED, token)
    return bool((yield Call(ring, expired, cas_stored, False)))


def swap_and_mark(kb: bytes, ring: bytes, swap: MetaSet) -> Steps:
    """``ms <key> C<cas> c``, then ``md <key> I`` of the very version it wrote (cas_stale)."""
    answer, invalidate = swapped(kb, (yield Call(ring, swap, identity, None)))
    if invalidate is not None:
        yield Call(ring, invalidate, identity, None)
    return answer
