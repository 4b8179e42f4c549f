"""memcached's server-side stampede tokens (meta protocol), as the stampede reader needs them.

One round trip writes ``mg <key> v c f t R<recache>`` and, optionally, an add
(``ms <key> ME T<ttl> c``) of a lease placeholder (:mod:`.leases`):

* a hit whose TTL left is under ``recache`` seconds, or an item marked stale
  by ``md <key> I``, hands ``W`` (win) to exactly one client, across every
  process and language, and ``Z`` to the others; ``X`` marks the latter;
* on a miss exactly one caller's add stores the placeholder and gets its cas:
  that caller won the cold miss.  On a hit the add fails with no effect.

The cas read (the item's, or the placeholder's) is the fill's lease.  Stores
that cannot do this (text mode, the embedded store) do not offer it, and the
stampede reader takes its lock-based path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .keys import Key
from .store import CasToken

__all__ = ["AsyncTokenStore", "Claimed", "TokenStore"]


@dataclass(frozen=True, slots=True)
class Claimed:
    """What one claiming read found.

    ``found``: the item as :meth:`~.store.Store.gets_envelope` returns it
    (``None`` with ``cas`` None on a miss); ``cas``: its cas token;
    ``won``/``lost``/``stale``: memcached's ``W``/``Z``/``X`` flags;
    ``added``: the placeholder's cas when this caller's add stored it.
    """

    found: Any
    cas: CasToken | None
    won: bool = False
    lost: bool = False
    stale: bool = False
    added: CasToken | None = None


@runtime_checkable
class TokenStore(Protocol):
    """A store whose server chooses recompute winners (meta protocol)."""

    def claim(
        self, key: Key, recache: int | None, placeholder: Any = None, placeholder_ttl: int = 0
    ) -> Claimed | None:
        """Read ``key`` with a recompute token; add ``placeholder`` on a miss.

        ``recache``: seconds of TTL left under which one reader wins
        (``R``); ``placeholder`` None: no add.  None when the store cannot
        (text mode): the caller takes the lock-based path.
        """
        ...

    def cas_stale(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        """``cas``, then mark the item stale on the server (``md <key> I``) where it can."""
        ...


@runtime_checkable
class AsyncTokenStore(Protocol):
    """:class:`TokenStore` for asyncio (an ``AsyncCluster`` in meta mode): the same, awaited."""

    async def claim(
        self, key: Key, recache: int | None, placeholder: Any = None, placeholder_ttl: int = 0
    ) -> Claimed | None: ...

    async def cas_stale(
        self, key: Key, value: Any, cas: CasToken, expire: int = 0
    ) -> bool | None: ...
