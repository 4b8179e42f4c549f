"""Hand-written pairs for the tests written once in asyncio (``tests/**/_async/``).

scripts/generate_sync.py turns ``async_name`` into ``name`` when it generates a test's sync
form (``tests/**/_sync/``): where the two forms need different objects, the asyncio source
calls ``async_<name>`` from here and its sync form calls ``<name>``.  The tests keep the
sync store they inspect (``store``, ``cluster``) and hand a pattern its face.
"""

from __future__ import annotations

from typing import Any

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.memory import AsyncMemoryStore


class AsyncFace(AsyncMemoryStore):
    """An AsyncMemoryStore over a test's wrapper with a strict view of its own (a counting or
    reply-losing store): the patterns' writes then take that view in both forms."""

    def strict(self) -> Any:
        return async_face(self.sync.strict())  # type: ignore[attr-defined]


def async_face(store: Any) -> Any:
    """The asyncio face of a sync store: a Cluster's twin (``Cluster.aio``, same servers
    and health), or the embedded store (or a test's wrapper of it) as an AsyncMemoryStore."""
    if isinstance(store, Cluster):
        return store.aio
    if callable(getattr(store, "strict", None)):
        return AsyncFace(store)
    return AsyncMemoryStore(store)


def face(store: Any) -> Any:
    """The sync form of :func:`async_face`: the store itself."""
    return store
