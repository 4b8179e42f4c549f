"""Keep a held lock alive while the work it protects runs.

A recompute lock's TTL (``lock_timeout``) is what frees it when its holder
crashes, so it should be short; a computation may still take longer.  While
the computation runs, a daemon thread (sync) or a task (async) extends the
lock every third of its TTL, so it never lapses under a live holder, and stops
when the computation ends
(or, at the latest, after a maximum hold time, so a hung computation cannot
wedge its key forever).  The extension is a callable given the new TTL: it
carries the owner's token itself (:func:`~.locks.rewrite_owned`), as this
thread is not the one that acquired the lock.

Written once in ``core/_async/keepalive.py`` (:class:`AsyncKeepalive`); the sync
:class:`Keepalive` is generated from it, the thread/task difference is
:mod:`.background`'s ``Ticker``/``AsyncTicker`` pair.
"""

from __future__ import annotations

from ._async.keepalive import AsyncKeepalive
from ._sync.keepalive import Keepalive

__all__ = ["AsyncKeepalive", "Keepalive"]
