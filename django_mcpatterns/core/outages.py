"""What a pattern does when a write cannot reach memcached: ``OPTIONS["on_outage"]``.

``"degrade"`` (the default)
    Set and list writes, namespace invalidations, counter changes,
    ``mark_stale`` and lock releases never raise
    :class:`~.exceptions.NodeUnavailableError` (or its
    :class:`~.exceptions.OutcomeUnknownError`) into the caller.  What the
    write could not do is *repaired* instead: the key it touched is dropped
    on its server (``Store.forget``: now, or through the server's journal
    before it serves again, :mod:`.client.journal`), so its next read rebuilds
    it from its source; a set or list becomes an item that reads as
    incomplete (:class:`~.exceptions.IncompleteSetError`) until a loader
    rebuilds it, never a silently shorter one.  A degraded set or list write
    returns 0 and reports a :class:`WriteDegraded` event (the
    ``write_degraded`` signal).
``"raise"``
    The error reaches the caller, as before this option existed; the repair
    is journaled all the same.

``OPTIONS["raise_errors"] = True`` raises everywhere, patterns included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ON_OUTAGE", "WriteDegraded", "degrades"]

ON_OUTAGE = ("degrade", "raise")


@dataclass(frozen=True)
class WriteDegraded:
    """A write that could not reach memcached was given up on and its key repaired.

    ``key``: the memcached key (bytes, or a namespace's ``Routed`` version
    key); ``command``: ``"sadd"``, ``"srem"``, ``"rpush"``, ``"lrem"``,
    ``"smove"``, ``"spop"``, ``"sunionstore"``..., ``"invalidate_namespace"``,
    ``"counter"``, ``"mark_stale"``, ``"release"``; ``error``: the exception.
    """

    key: Any
    command: str
    error: BaseException


def degrades(store: object) -> bool:
    """Whether ``store``'s patterns degrade on an outage (see the module docstring).

    A store without options (the embedded one, a wrapper) never fails: True.
    """
    options = getattr(store, "options", None)
    if options is None:
        inner = getattr(store, "store", None)  # a wrapper (ChunkedStore): its store's
        options = getattr(inner, "options", None)
    if options is None:
        return True
    return getattr(options, "on_outage", "degrade") == "degrade" and not getattr(
        options, "raise_errors", False
    )
