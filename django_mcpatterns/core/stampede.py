"""get_or_compute: soft expiry, one recomputing winner, early recomputation.

Like dogpile's lock, this knows nothing about frameworks: it takes a Store, a
key and a ``compute`` callable.  Values are stored in a soft-expiry
:class:`~.envelope.Envelope` (one item: value, soft expiry, hard expiry,
measured compute time).  What a caller does depends on what one ``get`` finds:

fresh (now < soft expiry)
    Return the value.  One request.  With ``beta > 0`` (XFetch, Vattani et al.
    2015) a caller may instead recompute *early*, when
    ``now - Δ·β·ln(rand()) >= soft_expiry`` with Δ the stored compute time, so
    hot keys are refreshed before anyone sees them stale.
stale (soft expiry <= now < hard expiry)
    Try the recompute lock (``add``, see :mod:`.locks`).  Losers return the
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
    ``policy.wait`` seconds, then raise :class:`~.exceptions.LockTimeoutError`
    (``policy.on_wait_timeout="raise"``, the default) or, opted in with
    ``"compute"``, compute without the lock.

Over memcached's meta protocol (a :class:`~.tokens.TokenStore`) memcached picks
the winner instead of the lock: one write reads the item with ``R<grace>`` and
adds the lease placeholder; ``W`` (a stale value) or the add's success (a miss)
makes this caller the one that computes and fills by that cas, ``Z`` serves the
stale value, a placeholder is waited for (:mod:`.tokens`; docs/stampede.md).
XFetch, background runners and whatever memcached did not flag keep the lock.

Every fill holds a lease (:mod:`.leases`): the winner's re-read is a ``gets``
(on a miss after an ``add`` of a placeholder) and the value is stored with a
``cas`` against it, so a delete, set or :meth:`Stampede.mark_stale` of the key
while ``compute`` runs wins: the computed value is returned, not stored.

While ``compute`` runs, a daemon thread keeps the lock alive (:mod:`.keepalive`:
extended every third of ``lock_timeout``, for at most ``policy.max_lock_time``
seconds), so a slow computation is never joined by a second one.

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
    :class:`~.exceptions.ComputeFailedError` (chained to the original in the
    process that raised it), and nobody computes.  The failing caller is served
    the stale value (``serve_stale_on_error``) or gets its error; a cold miss
    has nothing to serve and raises.  The lock's server is unreachable: stale values are
    served until their hard expiry, cold misses compute without the lock.  The
    value's server is unreachable: every read is a miss, so callers compute.  An
    envelope this release cannot read is logged and recomputed.

A value stored under the key with a plain ``set`` is returned as is, fresh until
its own TTL.  Plain reads (``get``, ``get_many``, everything that is not this
reader) see an envelope's value until its soft expiry and a miss after it, as
if it had been stored with a plain ``set`` for ``timeout`` (:mod:`.envelope`):
only this reader, which reads with the stores' explicit ``gets_envelope`` and
``get_many_envelopes``, serves a stale value, and only while one caller recomputes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import logging
import math
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar, overload

from .envelope import Envelope
from .exceptions import (
    ComputeFailedError,
    ConfigurationError,
    EncodingError,
    LockTimeoutError,
    NodeUnavailableError,
    ValueTooLargeError,
)
from .keepalive import Keepalive
from .keys import MAX_KEY_LENGTH, Key, PlainKey, Routed, placed
from .leases import PLACEHOLDER, fill, take
from .locks import (
    Backoff,
    EventHook,
    LockTimedOut,
    LockWaited,
    Ownership,
    authoritative,
    emit,
    exptime_for,
    new_token,
    rewrite_owned,
)
from .store import CasToken, Store
from .tokens import Claimed, TokenStore

__all__ = [
    "NO_VALUE",
    "ComputeFailed",
    "Fetched",
    "Recomputed",
    "RefreshDropped",
    "Runner",
    "StaleServed",
    "Stampede",
    "StampedePolicy",
    "lock_key",
    "read_failure_marker",
]

logger = logging.getLogger("django_mcpatterns.stampede")

T = TypeVar("T")

Runner = Callable[[Callable[[], None]], object]
"""Runs a zero-argument job off the request path, e.g. a :class:`~.refresh.RefreshRunner`."""

Reason = Literal["miss", "stale", "early", "refresh"]
Outcome = Literal["fresh", "stale", "computed", "waited"]
DropReason = Literal["full", "refused", "lapsed", "unreachable"]
WAIT_TIMEOUT_ACTIONS = ("raise", "compute")

LOCK_SUFFIX = b":stampede-lock"
_MARK_STALE_ATTEMPTS = 5
# A lock item holding this (and the failed owner's token, and what failed) is a failure
# marker.  Tokens are hex, so no token starts with it.
FAILURE_PREFIX = b"!compute-failed "
_FAILURE_DESCRIPTION_LIMIT = 200


class _NoValue(enum.Enum):
    """The type of :data:`NO_VALUE`: a miss, distinct from a cached ``None``.

    An enum because type checkers narrow ``x is NO_VALUE`` for enum members only.
    """

    NO_VALUE = "NO_VALUE"

    def __repr__(self) -> str:
        return "NO_VALUE"

    def __bool__(self) -> bool:
        return False


NO_VALUE: Final = _NoValue.NO_VALUE


# -- events ------------------------------------------------------------------------


@dataclass(frozen=True)
class Recomputed:
    """A value was computed and stored.

    ``reason``: ``"miss"``, ``"stale"``, ``"early"`` (XFetch) or ``"refresh"``
    (:meth:`Stampede.recompute`); ``background``: it ran in ``policy.runner``.
    """

    key: Key
    compute_time: float
    reason: Reason
    background: bool = False


@dataclass(frozen=True)
class StaleServed:
    """A stale value was returned, ``age`` seconds after its soft expiry."""

    key: Key
    age: float


@dataclass(frozen=True)
class ComputeFailed:
    """``compute`` raised ``error`` (logged; the lock was released)."""

    key: Key
    error: BaseException
    background: bool = False


@dataclass(frozen=True)
class RefreshDropped:
    """A background refresh was dropped; the stale value is served meanwhile.

    ``reason``: ``"full"`` (the runner's queue is full), ``"refused"`` (the
    runner raised), ``"lapsed"`` (its lock lapsed before the job ran: another
    caller may be recomputing) or ``"unreachable"`` (its lock's server was).
    """

    key: Key
    reason: DropReason


# -- options -----------------------------------------------------------------------


@dataclass(frozen=True)
class StampedePolicy:
    """How :meth:`Stampede.get_or_compute` behaves; one frozen object, shared freely.

    grace
        Seconds a value stays servable after its soft expiry (the hard TTL is
        ``timeout + grace``); ``None``: as long as the timeout itself.
    lock_timeout
        TTL of the recompute lock: how soon a crashed holder's lock frees the
        key.  A live holder keeps it alive while ``compute`` runs.
    max_lock_time
        The longest a computation keeps its lock alive, in seconds; past it
        the lock lapses after ``lock_timeout`` and another caller may compute.
        At most ``lock_timeout``: no keepalive.
    wait
        Cold miss: seconds a caller waits for another one's computation.
    on_wait_timeout
        Once ``wait`` is over: ``"raise"``
        (:class:`~.exceptions.LockTimeoutError`, the default) or ``"compute"``
        (compute and store it without the lock, alongside the holder).
    failure_backoff
        Seconds a failed computation is shared instead of retried (a failure
        marker in the lock's place); 0 releases the lock at once, so the next
        caller computes again.
    beta
        XFetch's β for early recomputation; 0 disables it, 1 is the paper's
        choice, larger values recompute earlier.
    serve_stale_on_error
        When ``compute`` raises on a stale value, return the stale value
        (the error is logged and signalled) instead of raising.
    runner
        Recompute stale values off the request path: called with a zero-argument
        job, e.g. a :class:`~.refresh.RefreshRunner` (bounded queue).  A runner
        that raises (a full queue) drops the job: the lock is released and
        :class:`RefreshDropped` sent.  ``None``: the winner recomputes inline.
        Cold misses always compute inline.
    backoff
        Polling schedule of cold-miss waiters.
    """

    grace: float | None = None
    lock_timeout: float = 30.0
    max_lock_time: float = 300.0
    wait: float = 10.0
    on_wait_timeout: Literal["raise", "compute"] = "raise"
    failure_backoff: float = 1.0
    beta: float = 0.0
    serve_stale_on_error: bool = True
    runner: Runner | None = None
    backoff: Backoff = dataclasses.field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if self.grace is not None:
            _check_number("grace", self.grace, zero=True)
        _check_number("lock_timeout", self.lock_timeout)
        _check_number("max_lock_time", self.max_lock_time)
        _check_number("wait", self.wait, zero=True)
        _check_number("failure_backoff", self.failure_backoff, zero=True)
        _check_number("beta", self.beta, zero=True)
        if self.on_wait_timeout not in WAIT_TIMEOUT_ACTIONS:
            raise ConfigurationError(
                f"invalid value {self.on_wait_timeout!r} for option 'on_wait_timeout'; "
                "valid choices: " + ", ".join(repr(c) for c in WAIT_TIMEOUT_ACTIONS),
                option="on_wait_timeout",
                choices=WAIT_TIMEOUT_ACTIONS,
            )
        if not isinstance(self.serve_stale_on_error, bool):
            raise ConfigurationError(
                "option 'serve_stale_on_error' must be True or False", option="serve_stale_on_error"
            )
        if self.runner is not None and not callable(self.runner):
            raise ConfigurationError("option 'runner' must be callable", option="runner")
        if not isinstance(self.backoff, Backoff):
            raise ConfigurationError("option 'backoff' must be a Backoff", option="backoff")

    def grace_for(self, timeout: float) -> float:
        return timeout if self.grace is None else self.grace


@dataclass(frozen=True)
class Fetched(Generic[T]):
    """What :meth:`Stampede.fetch` returned and how.

    ``outcome``: ``"fresh"`` (a fresh hit), ``"stale"`` (served stale),
    ``"computed"`` (this caller computed it) or ``"waited"`` (another caller
    computed it while this one waited).  ``envelope``: the metadata of the
    returned value (a value stored with a plain ``set`` reads as never
    soft-expiring), ``None`` when a computed value was not stored.
    """

    value: T
    outcome: Outcome
    envelope: Envelope | None


@dataclass(frozen=True)
class _Job(Generic[T]):
    key: Key
    compute: Callable[[], T]
    timeout: float | None  # soft TTL in seconds; None: never soft-expires; 0: do not store
    policy: StampedePolicy
    should_cache: Callable[[T], bool] | None


class _Claim(enum.Enum):
    LOST = "lost"
    UNREACHABLE = "unreachable"


class _Overwrite(enum.Enum):
    """A fill without a lease: a plain ``set`` (:meth:`Stampede.recompute`, no lock server)."""

    OVERWRITE = "overwrite"


_OVERWRITE: Final = _Overwrite.OVERWRITE


@dataclass(frozen=True, slots=True)
class _OnPlaceholder:
    """A lease on a placeholder (a miss): deleted again when no value is stored."""

    cas: CasToken


@dataclass
class _Won:
    """A lease on a placeholder this caller's add created (meta mode): it is the lock too.

    The keepalive extends the placeholder by cas (so never another writer's
    item) and keeps the new cas here; ``guard`` keeps that apart from the fill.
    """

    cas: CasToken
    filled: bool = False
    guard: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


Lease = CasToken | None | _Overwrite | _OnPlaceholder | _Won
"""The cas a fill must match (:mod:`.leases`); None: it may not land; _OVERWRITE: ``set``."""


@dataclass(frozen=True)
class _Held:
    """The recompute lock, won: the token travels with it.

    The keepalive thread and a background worker extend, release or mark it,
    so it cannot be a :class:`~.locks.Lock`, whose token belongs to the
    acquiring owner.
    """

    store: Store  # the strict view
    key: Key
    token: bytes
    timeout: float
    taken_at: float  # by the Stampede's clock

    def rewrite(self, exptime: int, value: bytes | None = None) -> Ownership:
        return rewrite_owned(self.store, self.key, self.token, exptime, value)


class _RecentFailures:
    """The exceptions behind this process's failure markers, by the failed owner's token.

    Lets a waiter in the same process chain the original exception to its
    :class:`~.exceptions.ComputeFailedError`.  Bounded (exceptions hold their
    tracebacks) and locked; :meth:`clear` empties it.
    """

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._by_token: dict[bytes, BaseException] = {}
        self._guard = threading.Lock()

    def remember(self, token: bytes, error: BaseException) -> None:
        with self._guard:
            self._by_token[token] = error
            while len(self._by_token) > self._size:
                del self._by_token[next(iter(self._by_token))]  # the oldest

    def get(self, token: bytes) -> BaseException | None:
        with self._guard:
            return self._by_token.get(token)

    def clear(self) -> None:
        with self._guard:
            self._by_token.clear()


recent_failures = _RecentFailures()


def failure_marker(token: bytes, error: BaseException) -> bytes:
    """The lock item that shares ``error``: the prefix, the failed owner's token, what failed."""
    kind = type(error)
    described = f"{kind.__module__}.{kind.__qualname__}: {error}"[:_FAILURE_DESCRIPTION_LIMIT]
    return FAILURE_PREFIX + token + b" " + described.encode("utf-8", "replace")


def read_failure_marker(found: object) -> tuple[bytes, str] | None:
    """``(token, description)`` when the lock item ``found`` is a failure marker, else None."""
    if not isinstance(found, bytes) or not found.startswith(FAILURE_PREFIX):
        return None
    token, _, described = found[len(FAILURE_PREFIX) :].partition(b" ")
    return token, described.decode("utf-8", "replace")


@overload
def lock_key(key: PlainKey) -> bytes: ...


@overload
def lock_key(key: Routed) -> Routed: ...


def lock_key(key: Key) -> Key:
    """The key of ``key``'s recompute lock: the key plus a suffix, or a digest if too long.

    A routed key's lock keeps its route: it lives on the value's server.
    """
    raw, ring = placed(key)
    if len(raw) + len(LOCK_SUFFIX) <= MAX_KEY_LENGTH:
        made = raw + LOCK_SUFFIX
    else:
        made = hashlib.sha256(raw).hexdigest().encode() + LOCK_SUFFIX
    return Routed(made, ring) if isinstance(key, Routed) else made


# -- the algorithm ---------------------------------------------------------------------


class Stampede:
    """Stampede-protected computation of values cached in ``store``.

    ``store``'s serde must know envelopes (both stores' default does, see
    :mod:`.envelope`).  ``clock`` is wall time in seconds (soft expiries are
    shared between processes); ``sleep`` and ``rng`` drive the waits and
    XFetch; ``on_event`` receives :class:`Recomputed`, :class:`StaleServed`,
    :class:`ComputeFailed`, :class:`RefreshDropped`, :class:`~.locks.LockWaited`
    and :class:`~.locks.LockTimedOut`.  Stateless apart from these (and the
    process's :data:`recent_failures`): thread-safe.
    """

    def __init__(
        self,
        store: Store,
        policy: StampedePolicy | None = None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] = time.sleep,
        rng: Callable[[], float] = random.random,
        on_event: EventHook | None = None,
    ) -> None:
        self.store = store
        self.policy = policy or StampedePolicy()
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._on_event = on_event
        self._tokens = store if isinstance(store, TokenStore) else None

    # -- public --

    def get_or_compute(
        self,
        key: Key,
        compute: Callable[[], T],
        timeout: float | None,
        *,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """Return the value of ``key``, computing it with ``compute`` at most once at a time.

        ``timeout``: seconds until the value is stale (``None``: never; 0 or
        less: compute and store nothing).  ``should_cache(value)``: store only
        values it accepts (e.g. cacheable responses).
        """
        return self.fetch(key, compute, timeout, policy=policy, should_cache=should_cache).value

    def fetch(
        self,
        key: Key,
        compute: Callable[[], T],
        timeout: float | None,
        *,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> Fetched[T]:
        """Like :meth:`get_or_compute`, also saying how the value was obtained."""
        job = _Job(key, compute, _soft_timeout(timeout), policy or self.policy, should_cache)
        if job.timeout == 0:
            return self._compute(job, "miss")
        claimed = self._claim_tokens(job)
        if claimed is not None:
            return self._by_tokens(job, claimed)
        seen = self._read(key)
        if seen is NO_VALUE:
            return self._cold(job)
        now = self._clock()
        if not seen.fresh(now):
            return self._refresh(job, seen, "stale")
        if self._early(seen, now, job.policy.beta):
            return self._refresh(job, seen, "early")
        return Fetched(seen.value, "fresh", seen)

    def recompute(
        self,
        key: Key,
        compute: Callable[[], T],
        timeout: float | None,
        *,
        policy: StampedePolicy | None = None,
        should_cache: Callable[[T], bool] | None = None,
    ) -> T:
        """Compute and store the value now, whatever is cached (no lock); return it."""
        job = _Job(key, compute, _soft_timeout(timeout), policy or self.policy, should_cache)
        return self._compute(job, "refresh", _OVERWRITE).value

    def mark_stale(self, key: Key) -> bool:
        """Make the cached value stale now, keeping it servable until its hard expiry.

        The next :meth:`get_or_compute` recomputes it (one caller) while the
        others are served the old value: an invalidation without a stampede.
        Return False when there is no envelope to mark (a miss, or a plain value).
        """
        for _ in range(_MARK_STALE_ATTEMPTS):
            found, cas = self.store.gets_envelope(key)
            if type(found) is not Envelope or cas is None or found.pending:
                return False
            now = self._clock()
            remaining = found.hard_expiry - now
            if remaining <= 0:
                return True  # memcached drops it any moment
            # Rewritten even when already stale: the new cas voids the lease of a
            # recompute under way, which may have read the data before this change.
            stale = dataclasses.replace(found, soft_expiry=min(found.soft_expiry, now))
            expire = exptime_for(remaining, now=now)
            if self._tokens is not None:  # meta: also md <key> I, so memcached hands out W
                if self._tokens.cas_stale(key, stale, cas, expire):
                    return True
            elif self.store.cas(key, stale, cas, expire):
                return True
        return False  # rewritten under us every time: someone keeps refreshing it

    def read(self, key: Key) -> Envelope | None:
        """The envelope cached under ``key`` (a plain value wrapped as never stale), or None."""
        found = self._read(key)
        return None if found is NO_VALUE else found

    # -- server-side tokens (meta mode: memcached picks the winner, see :mod:`.tokens`) --

    def _claim_tokens(self, job: _Job[Any]) -> Claimed | None:
        """Round trip 1: the item with a recompute token, and a placeholder's add on a miss."""
        if self._tokens is None:
            return None
        recache = None
        if job.timeout is not None:
            grace = int(job.policy.grace_for(job.timeout))
            recache = grace if grace >= 1 else None  # TTL left < grace: past the soft expiry
        try:
            return self._tokens.claim(
                job.key, recache, PLACEHOLDER, exptime_for(job.policy.lock_timeout)
            )
        except EncodingError:
            return None  # unreadable: the lock-based path logs and overwrites it

    def _by_tokens(self, job: _Job[T], claimed: Claimed | None) -> Fetched[T]:
        """Act on what memcached said: serve, recompute (``W``), win a miss, or wait."""
        start = self._clock()
        attempt = 0
        while True:
            if claimed is None:
                return self._cold(job)  # text mode or unreadable: the lock-based path
            if claimed.cas is None and claimed.added is not None:
                return self._won_miss(job, claimed.added)
            seen = NO_VALUE if claimed.cas is None else _as_envelope(claimed.found)
            if seen is not NO_VALUE:
                if attempt:
                    emit(self._on_event, LockWaited(job.key, self._clock() - start))
                    return Fetched(seen.value, "waited", seen)
                return self._hit(job, seen, claimed)
            found = claimed.found
            failure = read_failure_marker(found.value if type(found) is Envelope else None)
            if failure is not None:
                raise self._shared_failure(job, *failure)
            # A placeholder: another caller computes.  Poll (re-claiming: if it
            # vanished, this caller's add wins) until its value or failure shows.
            remaining = start + job.policy.wait - self._clock()
            if remaining <= 0:
                return self._wait_timed_out(job, job.key, start)
            self._sleep(min(job.policy.backoff.delay(attempt, self._rng), remaining))
            attempt += 1
            claimed = self._claim_tokens(job)

    def _hit(self, job: _Job[T], seen: Envelope, claimed: Claimed) -> Fetched[T]:
        now = self._clock()
        stale = claimed.stale or not seen.fresh(now)
        reason: Reason = "stale" if stale else "early"
        if claimed.won and type(claimed.found) is Envelope:
            if job.policy.runner is not None:
                return self._refresh(job, seen, reason)  # the runner needs the lock's owner
            try:
                return self._compute(job, reason, claimed.cas)  # lease: the item's cas
            except Exception as exc:
                logger.warning("computing the value of %r failed", job.key, exc_info=True)
                emit(self._on_event, ComputeFailed(job.key, exc))
                if stale and not job.policy.serve_stale_on_error:
                    raise
                return self._serve(job, seen, reason)
        if stale:
            if claimed.lost:
                return self._serve(job, seen, "stale")  # another caller holds the token
            return self._refresh(job, seen, "stale")  # no token (clocks disagree): the lock
        if self._early(seen, now, job.policy.beta):
            return self._refresh(job, seen, "early")  # XFetch: the lock-based path
        return Fetched(seen.value, "fresh", seen)

    def _won_miss(self, job: _Job[T], cas: CasToken) -> Fetched[T]:
        """This caller's placeholder won the miss: compute, keeping it alive; fill by its cas."""
        lease = _Won(cas)
        taken_at = self._clock()
        try:
            with self._keepalive(job, taken_at, self._extend_placeholder(job, lease)):
                return self._compute(job, "miss", lease)
        except Exception as exc:
            logger.warning("computing the value of %r failed", job.key, exc_info=True)
            emit(self._on_event, ComputeFailed(job.key, exc))
            if job.policy.failure_backoff <= 0:
                self._drop_placeholder(job, lease)
            else:  # the placeholder becomes the failure marker every waiter reads
                token = new_token()
                recent_failures.remember(token, exc)
                failed = Envelope(failure_marker(token, exc), -math.inf, -math.inf)
                expire = exptime_for(job.policy.failure_backoff)
                self.store.cas(job.key, failed, lease.cas, expire)
            raise
        except BaseException:
            self._drop_placeholder(job, lease)
            raise

    def _extend_placeholder(self, job: _Job[Any], lease: _Won) -> Callable[[float], bool]:
        """Extend the won placeholder while it is ours: a cas, never a blind ``touch``.

        A writer may replace the placeholder meanwhile; a ``touch`` would then
        keep rewriting the writer's TTL.  The new cas becomes the lease's.
        """

        def extend(ttl: float) -> bool:
            with lease.guard:
                if lease.filled:
                    return False
                cas = self.store.recas(job.key, PLACEHOLDER, lease.cas, exptime_for(ttl))
                if cas is None:
                    return False  # replaced or gone: the fill will not land either
                lease.cas = cas
                return True

        return extend

    # -- the three states --

    def _refresh(self, job: _Job[T], seen: Envelope, reason: Reason) -> Fetched[T]:
        """A stale (or XFetch-chosen) value: one caller recomputes, the others serve ``seen``."""
        held = self._claim(job)
        if not isinstance(held, _Held):
            return self._serve(job, seen, reason)  # recomputing, failed moments ago, or unreachable
        current, lease = self._lease(job, missing=False)
        if current is not NO_VALUE and current.soft_expiry > seen.soft_expiry:
            self._release(held)  # another caller refreshed it between our get and our add
            return Fetched(current.value, "fresh", current)
        if job.policy.runner is not None:
            self._dispatch(job, held, reason, lease)
            return self._serve(job, seen, reason)
        try:
            return self._recompute_locked(job, held, reason, lease)
        except Exception:
            if reason == "stale" and not job.policy.serve_stale_on_error:
                raise
            return self._serve(job, seen, reason)

    def _cold(self, job: _Job[T]) -> Fetched[T]:
        """A miss: one caller computes; the others wait for its value, for a bounded time."""
        lock = lock_key(job.key)
        start = self._clock()
        attempt = 0
        while True:
            held = self._claim(job)
            if held is _Claim.UNREACHABLE:
                # No lock to share the work through (and likely no lease either).
                return self._compute(job, "miss", _OVERWRITE)
            if isinstance(held, _Held):
                current, lease = self._lease(job, missing=True)
                if current is not NO_VALUE:
                    self._release(held)  # stored between our get and our add
                    return Fetched(current.value, "fresh", current)
                return self._recompute_locked(job, held, "miss", lease)
            while True:  # lost: poll until the value appears, the lock goes, or it failed
                remaining = start + job.policy.wait - self._clock()
                if remaining <= 0:
                    return self._wait_timed_out(job, lock, start)
                self._sleep(min(job.policy.backoff.delay(attempt, self._rng), remaining))
                attempt += 1
                value, holder = self._poll(job.key, lock)
                if value is not NO_VALUE:
                    emit(self._on_event, LockWaited(lock, self._clock() - start))
                    return Fetched(value.value, "waited", value)
                failure = read_failure_marker(holder)
                if failure is not None:
                    raise self._shared_failure(job, *failure)
                if holder is None:
                    break  # its holder left without storing a value: race for the lock again

    def _wait_timed_out(self, job: _Job[T], key: Key, start: float) -> Fetched[T]:
        waited = self._clock() - start
        emit(self._on_event, LockTimedOut(key, waited))
        if job.policy.on_wait_timeout == "raise":
            raise LockTimeoutError(
                f"gave up after {waited:.3g}s waiting for another caller to compute {job.key!r}"
            )
        return self._compute(job, "miss", self._lease(job, missing=False)[1])

    def _shared_failure(self, job: _Job[Any], token: bytes, error: str) -> ComputeFailedError:
        """The error for a caller that found another caller's failure marker."""
        failed = ComputeFailedError(
            f"computing {job.key!r} failed moments ago ({error}); it is not retried for up "
            f"to {job.policy.failure_backoff:g}s",
            key=job.key,
            error=error,
        )
        failed.__cause__ = recent_failures.get(token)  # the original, in the process it failed in
        return failed

    # -- steps --

    def _compute(
        self, job: _Job[T], reason: Reason, lease: Lease = None, background: bool = False
    ) -> Fetched[T]:
        start = self._clock()
        try:
            value = job.compute()
        except BaseException:
            if not isinstance(lease, _Won):  # its owner leaves the failure marker
                self._drop_placeholder(job, lease)
            raise
        end = self._clock()
        compute_time = max(0.0, end - start)
        envelope = None
        if job.timeout != 0 and (job.should_cache is None or job.should_cache(value)):
            envelope = self._store(job, value, end, compute_time, lease)
        else:
            self._drop_placeholder(job, lease)
        emit(self._on_event, Recomputed(job.key, compute_time, reason, background))
        return Fetched(value, "computed", envelope)

    def _recompute_locked(
        self, job: _Job[T], held: _Held, reason: Reason, lease: Lease, background: bool = False
    ) -> Fetched[T]:
        """Compute under the lock, kept alive meanwhile; release it, or leave a failure marker."""
        try:
            with self._keepalive(job, held.taken_at, self._held_extend(held), held.key):
                fetched = self._compute(job, reason, lease, background)
        except Exception as exc:
            logger.warning("computing the value of %r failed", job.key, exc_info=True)
            emit(self._on_event, ComputeFailed(job.key, exc, background))
            self._mark_failed(job, held, exc)
            raise
        except BaseException:
            self._release(held)  # interrupted (KeyboardInterrupt...): nothing to share
            raise
        self._release(held)
        return fetched

    def _keepalive(
        self,
        job: _Job[Any],
        taken_at: float,
        extend: Callable[[float], bool],
        lock: Key | None = None,
    ) -> contextlib.AbstractContextManager[object]:
        """Extend the lock (or the won placeholder) while ``compute`` runs."""
        if job.policy.max_lock_time <= job.policy.lock_timeout:
            return contextlib.nullcontext()
        return Keepalive(
            extend,
            job.policy.lock_timeout,
            job.policy.max_lock_time,
            start=taken_at,
            clock=self._clock,
            name=f"recompute lock {job.key if lock is None else lock!r}",
        )

    @staticmethod
    def _held_extend(held: _Held) -> Callable[[float], bool]:
        return lambda ttl: held.rewrite(exptime_for(ttl)) == "ours"

    def _dispatch(self, job: _Job[Any], held: _Held, reason: Reason, lease: Lease) -> None:
        """Hand the recompute (which owns the lock and the lease from now on) to the runner."""

        def refresh() -> None:
            if self._still_held(job, held):
                with contextlib.suppress(Exception):  # logged and signalled already
                    self._recompute_locked(job, held, reason, lease, background=True)

        runner = job.policy.runner
        assert runner is not None
        try:
            runner(refresh)
        except queue.Full:
            logger.warning("the stampede runner's queue is full: not refreshing %r", job.key)
            self._drop(job, "full")
            self._release(held)
        except Exception:
            logger.exception("the stampede runner refused to refresh %r", job.key)
            self._drop(job, "refused")
            self._release(held)

    def _still_held(self, job: _Job[Any], held: _Held) -> bool:
        """Whether a queued job still owns its lock: renew it (the queue ate into it) or drop."""
        try:
            ownership = held.rewrite(exptime_for(held.timeout))
        except NodeUnavailableError as exc:
            logger.warning("refresh of %r dropped: its lock is unreachable (%s)", job.key, exc)
            self._drop(job, "unreachable")
            return False
        if ownership == "ours":
            return True
        logger.warning("refresh of %r dropped: its lock lapsed while it was queued", job.key)
        self._drop(job, "lapsed")
        return False

    def _drop(self, job: _Job[Any], reason: DropReason) -> None:
        emit(self._on_event, RefreshDropped(job.key, reason))

    def _store(
        self, job: _Job[Any], value: Any, now: float, compute_time: float, lease: Lease
    ) -> Envelope | None:
        """Store the value: a fill under ``lease`` (:mod:`.leases`), or a plain ``set``."""
        if job.timeout is None:
            soft = hard = math.inf
        else:
            soft = now + job.timeout
            hard = soft + job.policy.grace_for(job.timeout)
        envelope = Envelope(value, soft, hard, compute_time)
        exptime = exptime_for(hard - now, now=now)
        if isinstance(lease, _Won):
            with lease.guard:  # not while the keepalive moves the placeholder's cas
                lease.filled = True
                return envelope if fill(self.store, job.key, envelope, lease.cas, exptime) else None
        if lease is not _OVERWRITE:
            cas = lease.cas if isinstance(lease, _OnPlaceholder) else lease
            return envelope if fill(self.store, job.key, envelope, cas, exptime) else None
        try:
            stored = self.store.set(job.key, envelope, exptime)
        except ValueTooLargeError:
            logger.warning("the value of %r is over the item size limit; not cached", job.key)
            return None
        return envelope if stored else None

    def _lease(self, job: _Job[Any], *, missing: bool) -> tuple[Envelope | _NoValue, Lease]:
        """What the key holds now, and the lease a fill must match (:func:`.leases.take`).

        The placeholder outlives the longest computation the lock allows.  An
        unreadable item is overwritten (it would never read again otherwise).
        """
        ttl = exptime_for(max(job.policy.lock_timeout, job.policy.max_lock_time))
        try:
            found, cas = take(self.store, job.key, ttl, missing=missing)
            if cas is None:  # deleted between our add and gets, or an item nobody can read
                found, cas = take(self.store, job.key, ttl)
        except EncodingError:
            logger.warning("unreadable cached value at %r; recomputing it", job.key, exc_info=True)
            return NO_VALUE, _OVERWRITE
        if cas is None:
            return NO_VALUE, _OVERWRITE  # refused by the serde (or unreachable): overwrite it
        current = _as_envelope(found)
        return current, (_OnPlaceholder(cas) if current is NO_VALUE else cas)

    def _drop_placeholder(self, job: _Job[Any], lease: Lease) -> None:
        """No value will fill the placeholder: delete it (if unchanged), so ``add`` works again."""
        if isinstance(lease, _OnPlaceholder | _Won):
            self.store.cas(job.key, PLACEHOLDER, lease.cas, -1)  # a negative exptime deletes

    def _serve(self, job: _Job[T], seen: Envelope, reason: Reason) -> Fetched[T]:
        if reason == "early":
            return Fetched(seen.value, "fresh", seen)  # still fresh: nothing stale served
        emit(self._on_event, StaleServed(job.key, self._clock() - seen.soft_expiry))
        return Fetched(seen.value, "stale", seen)

    def _early(self, seen: Envelope, now: float, beta: float) -> bool:
        """XFetch: recompute when ``now - Δ·β·ln(rand()) >= soft_expiry``."""
        if beta <= 0 or seen.compute_time <= 0 or seen.soft_expiry == math.inf:
            return False
        # rng() is in [0, 1); 1 - rng() is in (0, 1], so the log is finite and <= 0.
        return now - seen.compute_time * beta * math.log(1.0 - self._rng()) >= seen.soft_expiry

    def _claim(self, job: _Job[Any]) -> _Held | _Claim:
        """Try the recompute lock once (``add`` on the strict view)."""
        store = authoritative(self.store)
        key = lock_key(job.key)
        token = new_token()
        taken_at = self._clock()
        try:
            if not store.add(key, token, exptime_for(job.policy.lock_timeout)):
                return _Claim.LOST
        except NodeUnavailableError as exc:
            logger.warning(
                "recompute lock unavailable (%s): stale values are served, misses "
                "computed without the lock",
                exc,
            )
            return _Claim.UNREACHABLE
        return _Held(store, key, token, job.policy.lock_timeout, taken_at)

    def _release(self, held: _Held) -> None:
        self._let_go(held, -1)  # cas with a negative exptime deletes

    def _mark_failed(self, job: _Job[Any], held: _Held, error: BaseException) -> None:
        """Share ``error`` for ``failure_backoff`` seconds: the lock becomes its marker."""
        if job.policy.failure_backoff <= 0:
            self._release(held)
            return
        recent_failures.remember(held.token, error)
        marker = failure_marker(held.token, error)
        self._let_go(held, exptime_for(job.policy.failure_backoff), marker)

    def _let_go(self, held: _Held, exptime: int, marker: bytes | None = None) -> None:
        """Release the lock, or turn it into ``marker``, if it is still ours."""
        try:
            ownership = held.rewrite(exptime, marker)
        except NodeUnavailableError as exc:
            logger.warning("could not release %r (%s); it lapses by itself", held.key, exc)
            return
        if ownership != "ours":
            logger.warning(
                "computing %r outlived the recompute lock (lock_timeout=%gs): another caller "
                "may have recomputed it too",
                held.key,
                held.timeout,
            )

    def _read(self, key: Key) -> Envelope | _NoValue:
        try:
            found, cas = self.store.gets_envelope(key)
        except EncodingError:
            logger.warning("unreadable cached value at %r; recomputing it", key, exc_info=True)
            return NO_VALUE
        return NO_VALUE if cas is None else _as_envelope(found)

    def _poll(self, key: Key, lock: Key) -> tuple[Envelope | _NoValue, object]:
        """Read the value and its lock in one pipelined request: (value, the lock item or None)."""
        try:
            found = self.store.get_many_envelopes([key, lock])
        except EncodingError:
            # Unreadable: race for the lock; its winner reads it again and overwrites it.
            return NO_VALUE, None
        return _as_envelope(found.get(key, NO_VALUE)), found.get(lock)


def _as_envelope(found: Any) -> Envelope | _NoValue:
    if type(found) is Envelope:
        return NO_VALUE if found.pending else found  # a lease placeholder: a fill under way
    if found is NO_VALUE:
        return found
    return Envelope(found)  # stored with a plain set: the user's value and TTL


def _soft_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    _check_number("timeout", timeout, zero=True, negative=True)
    return max(float(timeout), 0.0)


def _check_number(
    option: str, value: object, *, zero: bool = False, negative: bool = False
) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or math.isnan(value)
        or (not negative and (value < 0 if zero else value <= 0))
    ):
        bound = "" if negative else " >= 0" if zero else " > 0"
        raise ConfigurationError(
            f"option {option!r} must be a number{bound}, not {value!r}", option=option
        )
