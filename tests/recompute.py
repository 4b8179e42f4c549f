"""Make another caller hold a stale value's recompute, in every protocol and store.

The lock-based path (text mode, the embedded store) is blocked by the recompute
lock; meta mode by memcached's win token, which another client's ``mg`` of the
stale-marked item takes (so this caller gets ``Z``).
"""

from __future__ import annotations

from typing import Any

from django_mcpatterns.core.keys import Key
from django_mcpatterns.core.stampede import Stampede, lock_key
from django_mcpatterns.core.store import TokenStore


def hold_recompute(store: Any, key: Key) -> None:
    """Another caller recomputes ``key`` (marked stale): it holds the lock and the W token."""
    assert store.add(lock_key(key), b"someone else", 30)
    if isinstance(store, TokenStore):
        store.claim(key, None)  # None in text mode: the lock is all there is


def drop_recompute(store: Any, key: Key) -> None:
    """That caller went away: its lock is gone, and the value is marked stale again."""
    store.delete(lock_key(key))
    Stampede(store).mark_stale(key)  # meta: a new item and md I, so W is handed out again
