"""Add-based, owner-safe, expiring locks over any Store (memcached's "ghetto" locks).

The protocol, in memcached's own primitives (reference 004, "Ghetto central
locking"), and what it costs in round trips (meta protocol / text protocol):

acquire
    ``add_cas(key, token, exptime)``: stored only when nobody holds the key,
    and it hands back the item's cas token (meta: ``ms <key> ME T<ttl> c``;
    text: ``add`` and ``gets`` in one write).  1 / 1; a blocking acquire
    repeats it with back-off.
release
    ``delete_cas(key, cas)``: deletes only the version our acquire (or
    extend) stored, so a lock that lapsed and was taken over by another owner
    is never deleted.  Meta ``md <key> C<cas>``: 1; text has no such delete,
    so ``gets`` then ``cas`` of the same bytes with exptime -1: 2.  An
    uncontended acquire + release costs 2 / 3.
extend
    ``recas(key, token, cas, <new TTL>)``, returning the new cas (meta
    ``ms <key> C<cas> T<ttl> c``; text ``cas`` and ``gets`` in one write): 1 / 1.
fallback
    Where the cas is not known here (another thread acts with ``token=``) or
    no longer matches (a keepalive extended the lock), release and extend go
    by the token instead: :func:`rewrite_owned`, ``gets`` then ``cas``, which
    rewrites the item only while it holds our token.
locked, owned
    ``get``: one request.

Every lock expires, so a holder that crashed cannot wedge anything.  memcached's
clock ticks in whole seconds (an item stored with exptime ``e`` lives more than
``e - 1`` and at most ``e`` seconds), so a lock of ``timeout`` seconds is stored
with exptime ``ceil(timeout) + 1``: it is held at least ``timeout`` seconds and
freed at most ``ceil(timeout) + 1`` seconds after it was taken.

"Held by someone else" is not "server unreachable"
    A :class:`~.cluster.Cluster` degrades an unreachable server to misses and
    failed writes by default, and a failed ``add`` would then look exactly like
    a lost race (the reference warns about this).  Locks therefore run on the
    store's *strict* view (:func:`authoritative`): the same servers, pools and
    node health, but an unreachable server raises
    :class:`~.exceptions.NodeUnavailableError`.  Users keep ``raise_errors``
    off for ordinary cache traffic and still get a clear error from locks.

With ``failover="remap"`` a lock whose server is dead is taken on the next
server of the ring; processes that disagree about the dead server's health can
then hold the "same" lock on two servers.  Use ``"miss"`` (the default) where
exclusion matters more than availability.

Owners
    A :class:`Lock` object keeps one owner per thread: its token lives in a
    ``threading.local`` (redis-py's ``thread_local=True``), so threads sharing
    one object (a module-level lock, a lock on a view class) exclude each other
    like separate owners, and a thread can only release what it took.  To let
    another thread finish an owner's work, pass the owner's token explicitly
    (``extend(..., token=t)``, ``release(token=t)``: a keepalive thread) or
    build the lock with ``thread_local=False`` to hand the whole object over (a
    background job that releases it).  Used as a decorator it takes a fresh
    owner (token) per call.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from .exceptions import (
    ConfigurationError,
    LockError,
    LockNotOwnedError,
    LockTimeoutError,
    NodeUnavailableError,
)
from .keys import Key, placed
from .store import MAX_RELATIVE_EXPIRE, CasToken, Store

__all__ = [
    "DEFAULT_TIMEOUT",
    "Backoff",
    "EventHook",
    "Lock",
    "LockTimedOut",
    "LockWaited",
    "authoritative",
    "exptime_for",
    "rewrite_owned",
]

logger = logging.getLogger("django_mcpatterns.locks")

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_TIMEOUT = 60.0
# Locks longer than memcached's relative exptime range would need absolute Unix
# times, which a monotonic clock cannot give; no lock should be held that long.
MAX_TIMEOUT = float(MAX_RELATIVE_EXPIRE - 1)

EventHook = Callable[[Any], object]


# -- events ---------------------------------------------------------------------


@dataclass(frozen=True)
class LockWaited:
    """A caller waited ``waited`` seconds on the lock at ``key`` and then got what it waited for.

    Sent by a blocking :meth:`Lock.acquire` that had to wait, and by stampede
    callers that waited for another caller's computation.
    """

    key: Key
    waited: float


@dataclass(frozen=True)
class LockTimedOut:
    """A caller gave up waiting on the lock at ``key`` after ``waited`` seconds."""

    key: Key
    waited: float


def emit(hook: EventHook | None, event: object) -> None:
    """Send ``event`` to ``hook``; a failing hook is logged, never raised into the caller."""
    if hook is None:
        return
    try:
        hook(event)
    except Exception:
        logger.exception("event hook failed for %r", event)


# -- timing -----------------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """Sleeps between tries while waiting: exponential, capped, jittered.

    The n-th sleep (from 0) is drawn uniformly from ``[d/2, d]`` with
    ``d = min(maximum, initial * multiplier**n)``: waiters spread out instead of
    retrying in lockstep, and none sleeps longer than ``maximum`` (so it notices
    a released lock within that long) or hammers the server faster than
    ``initial / 2``.
    """

    initial: float = 0.005
    maximum: float = 0.1
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        for name in ("initial", "maximum"):
            _check_positive(f"backoff {name}", getattr(self, name))
        if self.maximum < self.initial:
            raise ConfigurationError("backoff maximum must be >= initial", option="maximum")
        if not _is_number(self.multiplier) or self.multiplier < 1:
            raise ConfigurationError(
                f"backoff multiplier must be a number >= 1, not {self.multiplier!r}",
                option="multiplier",
            )

    def delay(self, attempt: int, rng: Callable[[], float]) -> float:
        """The sleep before try ``attempt + 1``; ``rng`` returns floats in ``[0, 1)``."""
        try:
            grown = self.initial * self.multiplier**attempt
        except OverflowError:
            grown = math.inf
        ceiling = min(self.maximum, grown)
        return ceiling * (0.5 + 0.5 * rng())


def exptime_for(seconds: float, *, now: float | None = None) -> int:
    """Return the memcached exptime that keeps an item at least ``seconds`` (inf: never).

    An item stored with exptime ``e`` lives more than ``e - 1`` seconds
    (memcached's whole-second clock), hence ``ceil(seconds) + 1``.  Beyond
    30 days memcached reads exptimes as absolute Unix times, which needs the
    wall-clock ``now``.
    """
    if seconds == math.inf:
        return 0
    relative = max(math.ceil(seconds), 0) + 1
    if relative <= MAX_RELATIVE_EXPIRE:
        return relative
    if now is None:
        raise ValueError(f"{seconds}s is over memcached's 30-day relative limit; give now=")
    return math.ceil(now + seconds) + 1


# -- the strict view ----------------------------------------------------------------


@runtime_checkable
class SupportsStrict(Protocol):
    """A store that can answer "unreachable" with an error instead of a miss."""

    def strict(self) -> Store:
        """The same store, raising :class:`NodeUnavailableError` where it would degrade."""
        ...


def authoritative(store: Store) -> Store:
    """Return ``store`` answering an unreachable server with :class:`NodeUnavailableError`.

    For a :class:`~.cluster.Cluster` that is its ``strict()`` view (shared
    servers, pools and node health); a store that cannot be unreachable (the
    in-process :class:`~.memory.MemoryStore`) is returned as is.
    """
    return store.strict() if isinstance(store, SupportsStrict) else store


def new_token() -> bytes:
    """A token no other owner will draw: 128 random bits, hex (readable by any client)."""
    return secrets.token_hex(16).encode()


Ownership = Literal["ours", "taken", "free"]


def rewrite_owned(
    store: Store, key: Key, token: bytes, exptime: int, value: bytes | None = None
) -> Ownership:
    """Rewrite the lock item at ``key`` only while ``token`` holds it; say who holds it.

    ``gets`` then ``cas``: a new ``exptime`` (negative deletes) and, with
    ``value``, a new content.  ``"ours"``: rewritten; ``"taken"``: another owner
    holds it; ``"free"``: nobody does.  The token is passed in rather than read
    from a :class:`Lock`, so a thread other than the acquirer (a keepalive, a
    background worker) can extend or release it.  ``store`` must be the strict
    view (:func:`authoritative`).
    """
    found, cas = store.gets(key)
    if found != token or cas is None:
        return "free" if found is None else "taken"
    stored = store.cas(key, token if value is None else value, cas, exptime)
    if stored:
        return "ours"
    return "free" if stored is None else "taken"  # it lapsed, or changed, after our gets


# -- the lock -----------------------------------------------------------------------


class _Hold:
    """What a Lock object holds: the token, the item's cas (None: not known here),
    and when the lock lapses at the earliest."""

    token: bytes | None = None
    cas: CasToken | None = None
    deadline: float = 0.0  # by the lock's clock


class _ThreadHold(threading.local):
    """A :class:`_Hold` per thread (``thread_local=True``)."""

    token: bytes | None = None
    cas: CasToken | None = None
    deadline: float = 0.0


class Lock:
    """A lock held in memcached under ``key``, expiring after ``timeout`` seconds.

    ``blocking`` / ``blocking_timeout`` are the defaults of :meth:`acquire`
    (``None``: wait as long as it takes).  ``clock`` (monotonic seconds),
    ``sleep`` and ``rng`` are injectable for tests; ``on_event`` receives
    :class:`LockWaited` and :class:`LockTimedOut`.  ``thread_local``: each
    thread using the object is its own owner (see "Owners" above); False
    shares one owner between threads, for handing a held lock to another.
    """

    def __init__(
        self,
        store: Store,
        key: Key,
        timeout: float = DEFAULT_TIMEOUT,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        *,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
        rng: Callable[[], float] = random.random,
        on_event: EventHook | None = None,
        thread_local: bool = True,
    ) -> None:
        placed(key)  # an invalid key fails here, not on first use
        _check_positive("lock timeout", timeout, maximum=MAX_TIMEOUT)
        if blocking_timeout is not None:
            _check_positive("blocking_timeout", blocking_timeout, zero=True)
        self.key = key
        self.timeout = float(timeout)
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.backoff = backoff or Backoff()
        self._store = authoritative(store)
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._on_event = on_event
        self.thread_local = thread_local
        self._hold: _Hold | _ThreadHold = _ThreadHold() if thread_local else _Hold()

    def __repr__(self) -> str:
        state = "held" if self._hold.token is not None else "not held"
        return f"<Lock {self.key!r} timeout={self.timeout:g}s {state}>"

    @property
    def token(self) -> bytes | None:
        """This owner's token while it holds the lock (per thread by default), else None."""
        return self._hold.token

    def copy(self) -> Lock:
        """A new, unacquired owner of the same lock with the same settings."""
        return Lock(
            self._store,
            self.key,
            self.timeout,
            self.blocking,
            self.blocking_timeout,
            backoff=self.backoff,
            clock=self._clock,
            sleep=self._sleep,
            rng=self._rng,
            on_event=self._on_event,
            thread_local=self.thread_local,
        )

    # -- the protocol --

    def acquire(
        self,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: bytes | None = None,
    ) -> bool:
        """Take the lock; return whether it was taken.

        Non-blocking: one ``add``.  Blocking: retry with :class:`Backoff` until
        taken or ``blocking_timeout`` seconds have passed.  Raise
        :class:`NodeUnavailableError` when the lock's server cannot be reached
        (never a silent False), :class:`LockError` if this owner (this thread,
        with ``thread_local``) already holds it.
        """
        if self._hold.token is not None:
            raise LockError(
                f"lock {self.key!r} is already held by this Lock object; "
                "locks are not reentrant: use one Lock object per owner"
            )
        blocking = self.blocking if blocking is None else blocking
        limit = self.blocking_timeout if blocking_timeout is None else blocking_timeout
        token = token or new_token()
        start = self._clock()
        attempt = 0
        while True:
            if self._try_add(token):
                if attempt:
                    emit(self._on_event, LockWaited(self.key, self._clock() - start))
                return True
            if not blocking:
                return False
            pause = self.backoff.delay(attempt, self._rng)
            if limit is not None:
                remaining = start + limit - self._clock()
                if remaining <= 0:
                    emit(self._on_event, LockTimedOut(self.key, self._clock() - start))
                    return False
                pause = min(pause, remaining)
            self._sleep(pause)
            attempt += 1

    def release(self, token: bytes | None = None) -> None:
        """Free the lock if this owner still holds it.

        Raise :class:`LockNotOwnedError` when it lapsed meanwhile (the lock, maybe
        held by another owner now, is left alone) and :class:`LockError` when this
        owner never acquired it.  The owner forgets the lock in every case.
        ``token``: release for the owner of that token, from any thread.
        """
        token = self._held("release", token)
        cas = self._hold.cas if self._hold.token == token else None
        if self._hold.token == token:
            self._hold.token = self._hold.cas = None
        if cas is not None and self._call("release", self._store.delete_cas, self.key, cas):
            return
        self._replace(token, -1, "release")  # by the token; a negative exptime deletes

    def extend(
        self, additional_time: float, replace_ttl: bool = False, token: bytes | None = None
    ) -> None:
        """Keep the lock ``additional_time`` seconds longer (or, with ``replace_ttl``,
        exactly that long from now).  Raise :class:`LockNotOwnedError` if it lapsed.

        ``token``: extend for the owner of that token, from any thread (a
        keepalive); where this thread does not hold it, the time left is not
        known here and ``additional_time`` counts from now.
        """
        token = self._held("extend", token)
        hold = self._hold if self._hold.token == token else _Hold()
        now = self._clock()
        remaining = max(0.0, hold.deadline - now)
        ttl = additional_time if replace_ttl else remaining + additional_time
        _check_positive("the extended lock time", ttl, maximum=MAX_TIMEOUT)
        exptime = exptime_for(ttl)
        cas = None
        if hold.cas is not None:
            cas = self._call("extend", self._store.recas, self.key, token, hold.cas, exptime)
        if cas is None:
            self._replace(token, exptime, "extend")  # by the token: the new cas is not known
        hold.cas = cas
        hold.deadline = now + ttl

    def locked(self) -> bool:
        """Whether anyone holds the lock now (one ``get``)."""
        return self._call("inspect", self._store.get, self.key) is not None

    def owned(self) -> bool:
        """Whether this owner still holds the lock, as memcached sees it (one ``get``)."""
        token = self._hold.token
        return token is not None and self._call("inspect", self._store.get, self.key) == token

    # -- context manager and decorator --

    def __enter__(self) -> Lock:
        if not self.acquire():
            limit = self.blocking_timeout
            waited = f" within {limit:g}s" if self.blocking and limit is not None else ""
            raise LockTimeoutError(f"could not acquire lock {self.key!r}{waited}: it is held")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __call__(self, func: F) -> F:
        """Decorate ``func`` to run under the lock, each call as a fresh owner."""

        @functools.wraps(func)
        def locked_call(*args: Any, **kwargs: Any) -> Any:
            with self.copy():
                return func(*args, **kwargs)

        return locked_call  # type: ignore[return-value]

    # -- steps --

    def _try_add(self, token: bytes) -> bool:
        now = self._clock()
        exptime = exptime_for(self.timeout)
        cas = self._call("acquire", self._store.add_cas, self.key, token, exptime)
        if cas is None:
            return False
        self._hold.token = token
        self._hold.cas = cas
        self._hold.deadline = now + self.timeout
        return True

    def _replace(self, token: bytes, exptime: int, action: str) -> None:
        """Rewrite our lock item (new exptime; negative deletes) only while it is ours."""
        held = self._call(action, rewrite_owned, self._store, self.key, token, exptime)
        if held != "ours":
            raise self._not_owned(action, token, holder=held == "taken")

    def _held(self, action: str, token: bytes | None) -> bytes:
        """The token to act for: the one given, else this owner's (or a LockError)."""
        if token is not None:
            return token
        if self._hold.token is None:
            raise LockError(f"cannot {action} lock {self.key!r}: this Lock object does not hold it")
        return self._hold.token

    def _not_owned(self, action: str, token: bytes, *, holder: bool) -> LockNotOwnedError:
        if self._hold.token == token:
            self._hold.token = None
        now = "another owner may hold it now" if holder else "nobody holds it now"
        return LockNotOwnedError(
            f"cannot {action} lock {self.key!r}: this owner no longer holds it "
            f"(its TTL lapsed; {now}); the critical section outlived the lock timeout"
        )

    def _call(self, action: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except NodeUnavailableError as exc:
            # Same class: a release or extend whose reply was lost stays an OutcomeUnknownError.
            raise type(exc)(
                f"cannot {action} lock {self.key!r}, its server is unreachable: {exc}",
                node=exc.node,
            ) from exc


# -- validation -------------------------------------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_positive(
    what: str, value: object, *, zero: bool = False, maximum: float = math.inf
) -> None:
    ok = _is_number(value) and (value >= 0 if zero else value > 0) and value <= maximum  # type: ignore[operator]
    if not ok:
        bound = ">= 0" if zero else "> 0"
        limit = "" if maximum == math.inf else f" and <= {maximum:g}"
        raise ConfigurationError(f"{what} must be a number {bound}{limit}, not {value!r}")
