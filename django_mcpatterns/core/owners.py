"""Who holds a lock: one owner per thread (sync), one per asyncio task (async).

A lock object shared by several callers (a module-level lock, a lock on a view
class) must make each of them its own owner, or one could release what another
took.  Threads are the callers of the sync lock (redis-py's ``thread_local``);
in asyncio every task of a loop runs on one thread, so the async lock keys its
owners by the running task instead.  The generated sync lock uses
:class:`Owners` where the async source names :class:`AsyncOwners`
(``scripts/generate_sync.py`` drops the ``Async`` prefix).  With
``thread_local=False`` both share one :class:`SharedOwner` between callers.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Protocol

from .store import CasToken

__all__ = ["AsyncOwners", "Hold", "OwnerHolds", "Owners", "SharedOwner"]


class Hold:
    """What one owner holds: the token, the item's cas (None: not known here),
    and when the lock lapses at the earliest (by the lock's clock)."""

    __slots__ = ("cas", "deadline", "token")

    def __init__(self) -> None:
        self.token: bytes | None = None
        self.cas: CasToken | None = None
        self.deadline = 0.0


class OwnerHolds(Protocol):
    """Where a lock keeps its owners' holds."""

    def current(self) -> Hold:
        """The calling owner's hold."""
        ...


class SharedOwner:
    """One hold for every caller (``thread_local=False``: a lock handed between callers)."""

    def __init__(self) -> None:
        self._hold = Hold()

    def current(self) -> Hold:
        return self._hold


class Owners(threading.local):
    """One hold per thread."""

    def __init__(self) -> None:
        self._hold = Hold()

    def current(self) -> Hold:
        return self._hold


class AsyncOwners:
    """One hold per asyncio task; a finished task's hold goes with it.

    Outside a task (``repr(lock)`` from sync code) the hold is an empty one
    that nothing keeps: there is no owner to speak of.
    """

    def __init__(self) -> None:
        self._holds: weakref.WeakKeyDictionary[asyncio.Task[object], Hold] = (
            weakref.WeakKeyDictionary()
        )

    def current(self) -> Hold:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop
            task = None
        if task is None:
            return Hold()
        hold = self._holds.get(task)
        if hold is None:
            hold = self._holds[task] = Hold()
        return hold
