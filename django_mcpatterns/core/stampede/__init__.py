"""get_or_compute: soft expiry, one recomputing winner, early recomputation.

Like dogpile's lock, this knows nothing about frameworks: it takes a Store, a
key and a ``compute`` callable.  Values are stored in a soft-expiry
:class:`~django_mcpatterns.core.values.envelope.Envelope` (one item: value, soft expiry, hard
expiry, measured compute time).  What a caller does depends on what one ``get`` finds:

fresh (now < soft expiry)
    Return the value.  One request.  With ``beta > 0`` (XFetch, Vattani et al.
    2015) a caller may instead recompute *early*, when
    ``now - Δ·β·ln(rand()) >= soft_expiry`` with Δ the stored compute time, so
    hot keys are refreshed before anyone sees them stale.
stale (soft expiry <= now < hard expiry)
    Try the recompute lock (``add``, see :mod:`django_mcpatterns.core.locks`).  Losers return the
    stale value at once (two requests).  The winner reads the key again with
    its cas, the lease (a caller that finished just before may have refreshed
    it: then it returns that), computes, fills it by ``cas`` and releases the
    lock (six requests in all; seven on a miss, whose lease adds a placeholder), or
    hands the recompute to ``policy.runner`` and returns the stale value.
miss
    Try the recompute lock.  The winner computes; every other caller polls the
    value and the lock (one pipelined ``get_many``, with back-off) until the
    value appears (returned), the lock goes without a value (they race for
    the lock again) or becomes a failure marker (below), for at most
    ``policy.wait`` seconds, then raise :class:`~django_mcpatterns.core.exceptions.LockTimeoutError`
    (``policy.on_wait_timeout="raise"``, the default) or, opted in with
    ``"compute"``, compute without the lock.

Over memcached's meta protocol (a :class:`~django_mcpatterns.core.store.TokenStore`) memcached picks
the winner instead of the lock: one write reads the item with ``R<grace>`` and
adds the lease placeholder; ``W`` (a stale value) or the add's success (a miss)
makes this caller the one that computes and fills by that cas, ``Z`` serves the
stale value, a placeholder is waited for (:mod:`django_mcpatterns.core.store`; docs/stampede.md).
XFetch, background runners and whatever memcached did not flag keep the lock.

Every fill holds a lease (:mod:`django_mcpatterns.core.leases`): the winner's re-read is a ``gets``
(on a miss after an ``add`` of a placeholder) and the value is stored with a
``cas`` against it, so a delete, set or :meth:`Stampede.mark_stale` of the key
while ``compute`` runs wins: the computed value is returned, not stored.

While ``compute`` runs, a daemon thread (a task in async) keeps the lock alive
(``_async_keepalive.py``: extended every third of ``lock_timeout``, for at most
``policy.max_lock_time`` seconds), so a slow computation is never joined by a second one.

The invariant: the hard TTL (memcached's exptime) is the soft one plus
``policy.grace`` (default: the soft timeout again), so a stale value outlives
its soft expiry by at least the grace period and can be served while it is
recomputed.  Losing it (eviction, restart) only turns a stale hit into a miss.

Failure modes
    ``compute`` raises: the error is logged and sent as :class:`ComputeFailed`,
    and the lock item is rewritten (owner-safe, by ``cas``) into a *failure
    marker* naming the error, which memcached drops after
    ``policy.failure_backoff`` seconds.  Until then the failure is shared, not
    multiplied, in every process: stale callers lose the lock race and are
    served the stale value, cold-miss waiters find the marker and raise
    :class:`~django_mcpatterns.core.exceptions.ComputeFailedError` (chained to the original in the
    process that raised it), and nobody computes.  The failing caller is served
    the stale value (``serve_stale_on_error``) or gets its error; a cold miss
    has nothing to serve and raises.  The lock's server is unreachable: stale values are
    served until their hard expiry, cold misses compute without the lock.  The
    value's server is unreachable: every read is a miss, so callers compute.  An
    envelope this release cannot read is logged and recomputed.

A value stored under the key with a plain ``set`` is returned as is, fresh until
its own TTL.  Plain reads (``get``, ``get_many``, everything that is not this
reader) see an envelope's value until its soft expiry and a miss after it, as
if it had been stored with a plain ``set`` for ``timeout``
(:mod:`django_mcpatterns.core.values.envelope`): only this reader, which reads with the stores'
explicit ``gets_envelope`` and ``get_many_envelopes``, serves a stale value, and only while one
caller recomputes it.

Written once: :class:`AsyncStampede` (``_async.py`` and ``_async_steps.py``, over an
:class:`~django_mcpatterns.core.store.AsyncStore`) is the source, :class:`Stampede` its generated
sync form.  In async, ``compute`` may be a coroutine function (awaited) or a plain
callable (run through ``sync_to_async``, since it may use the ORM), waiters
sleep with ``asyncio.sleep`` and the keepalive and background refreshes are
tasks on the running loop (:mod:`django_mcpatterns.core.concurrency`).  The vocabulary both share
(policy, events, lock keys, failure markers) is ``_model.py``.
"""

from __future__ import annotations

from ._async import AsyncStampede
from ._async_keepalive import AsyncKeepalive
from ._model import (
    FAILURE_PREFIX,
    LOCK_SUFFIX,
    NO_VALUE,
    WAIT_TIMEOUT_ACTIONS,
    ComputeFailed,
    DropReason,
    Fetched,
    Outcome,
    Reason,
    Recomputed,
    RefreshDropped,
    Runner,
    StaleServed,
    StampedePolicy,
    failure_marker,
    lock_key,
    read_failure_marker,
    recent_failures,
)
from ._sync import Stampede
from ._sync_keepalive import Keepalive

__all__ = [
    "FAILURE_PREFIX",
    "LOCK_SUFFIX",
    "NO_VALUE",
    "WAIT_TIMEOUT_ACTIONS",
    "AsyncKeepalive",
    "AsyncStampede",
    "ComputeFailed",
    "DropReason",
    "Fetched",
    "Keepalive",
    "Outcome",
    "Reason",
    "Recomputed",
    "RefreshDropped",
    "Runner",
    "StaleServed",
    "Stampede",
    "StampedePolicy",
    "failure_marker",
    "lock_key",
    "read_failure_marker",
    "recent_failures",
]
