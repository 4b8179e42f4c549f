"""Server epochs: what tells this process a server may have restarted since it last looked.

memcached's cas counter restarts with the server (and a new item may then draw a
cas an old one had), so a cas read before a restart proves nothing after it.  A
restart closes every connection, and whatever follows reaches the new server
over a connection opened after it.  So a server's epoch here is a token drawn
each time this process opens a connection to it (pool, asyncio channel or
probe): the same token before and after an exchange proves that the exchange
went over a connection opened before the token was read, to the server that
was there then.  Conservative: a new pooled connection also starts an epoch.

Not the epochs of :mod:`.repairs` (a server's pid and start time, read by ``stats``
after an outage, to tell whether it lost what it held): those take a round trip and
are read only after an outage; these cost nothing and are current at every request,
which is what comparing a cas read earlier with one read now needs (the near cache's
revalidation).  :func:`when_opened` tells a cluster of its first connection to a
server (the server was up then: :func:`.repairs.restarted` compares its uptime).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["current", "opened", "when_opened"]

_tokens = itertools.count(1)  # next() is atomic: each connection draws its own token
_epochs: dict[Any, int] = {}
_waiting: dict[Any, list[Callable[[], object]]] = {}  # address -> calls for its next opening
_lock = threading.Lock()


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a vanished parent thread may have held it


os.register_at_fork(after_in_child=_after_fork)


def opened(address: Any) -> None:
    """A connection to ``address`` was just opened: a new epoch begins."""
    _epochs[address] = next(_tokens)
    if _waiting:  # a dict's truth, read without the lock: only connections pay for it
        with _lock:
            calls = _waiting.pop(address, ())
        for call in calls:
            call()


def when_opened(address: Any, call: Callable[[], object]) -> None:
    """Call ``call()`` once, when the next connection to ``address`` opens (in any cluster)."""
    with _lock:
        _waiting.setdefault(address, []).append(call)


def current(address: Any) -> int:
    """The token of ``address``'s current epoch (0: no connection opened yet)."""
    return _epochs.get(address, 0)
