"""The steps of the commands that are more than one request: their generator plans.

A text ``delete_cas`` reads the item, then expires that version; a cas given
a copy's token resolves the home's first (:class:`~.plans.HomeToken`);
``set_many`` writes a replicated value's chunks to all of its replicas before
the value's manifest.  Each is a generator plan (:mod:`.plans`), run by either driver.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeVar

from ..keys import KeyT
from ..store import MAX_RELATIVE_EXPIRE, CasToken
from .decoding import StoreMany, swapped, text_cas_token
from .meta import MetaSet
from .plans import Call, CopyToken, FanOut, HomeToken, Plan
from .replies import cas_stored, first_value, identity
from .wire import Get, Store

__all__ = [
    "EXPIRED",
    "expire_version",
    "not_stored",
    "on_home",
    "set_many",
    "swap_and_mark",
    "text_cas",
]

Serde = Any
Steps = Generator[Any, Any, Any]  # a plan of several steps (see plans.py)
R = TypeVar("R")

EXPIRED = MAX_RELATIVE_EXPIRE + 1  # an absolute Unix time long past


def set_many(
    store_many: StoreMany, given: dict[bytes, Any], replicated: dict[bytes, bytes]
) -> Steps:
    """set_many with keys that follow a replicated key (its chunks): those first, on every
    replica, then the rest (the replicated keys on every replica too).

    So a manifest never reaches a copy before its chunks reach them all, and a
    key whose followers were not stored is not written (it would read broken).
    """
    followers = {kb: given[kb] for kb, ring in replicated.items() if kb != ring}
    parts = yield FanOut(store_many, followers, write=True)
    lost = {kb for part in parts for kb in part}
    dropped = {replicated[kb] for kb in lost} & given.keys()
    rest = {kb: key for kb, key in given.items() if kb not in followers and kb not in dropped}
    parts = yield FanOut(store_many, rest, write=True)
    return not_stored([list(lost), list(dropped), *parts], given)


def not_stored(parts: list[list[bytes]], given: Mapping[bytes, KeyT]) -> list[KeyT]:
    """The keys (as given) of a set_many's parts, each once."""
    return [given[kb] for kb in dict.fromkeys(kb for part in parts for kb in part)]


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
