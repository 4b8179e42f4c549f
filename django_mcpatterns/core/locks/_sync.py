# Generated from core/locks/_async.py by scripts/generate_sync.py: do not edit.
"""Add-based, owner-safe, expiring locks: the algorithm, written once (see :mod:`..locks`).

``AsyncLock`` waits with ``async_sleep`` (never blocking the loop) and keeps one
owner per task (:class:`~django_mcpatterns.core.owners.AsyncOwners`); the
generated ``Lock`` sleeps and keeps one owner per thread.  The protocol, its
round trips and its owners are described in :mod:`django_mcpatterns.core.locks`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from django_mcpatterns.core.concurrency import (
    Hold,
    OwnerHolds,
    Owners,
    SharedOwner,
    Sleeper,
    Undo,
    finish_then_undo,
    sleep,
)
from django_mcpatterns.core.exceptions import (
    LockError,
    LockNotOwnedError,
    LockTimeoutError,
    NodeUnavailableError,
)
from django_mcpatterns.core.keys import Key, placed
from django_mcpatterns.core.outages import WriteDegraded, degrades
from django_mcpatterns.core.store import CasToken, Store

from .. import chance
from ._model import (
    DEFAULT_TIMEOUT,
    MAX_TIMEOUT,
    Backoff,
    Decorated,
    EventHook,
    LockTimedOut,
    LockWaited,
    Ownership,
    Reaching,
    authoritative,
    check_positive,
    emit,
    exptime_for,
    new_token,
)

__all__ = ["Lock", "rewrite_owned", "strict_view"]

logger = logging.getLogger("django_mcpatterns.locks")


def strict_view(store: Store) -> Store:
    """:func:`~django_mcpatterns.core.locks.authoritative` for this form's store type.

    The stampede and namespaces take their lock's strict view through it (its
    sync form is ``strict_view``).
    """
    return authoritative(store)


def rewrite_owned(
    store: Store, key: Key, token: bytes, exptime: int, value: bytes | None = None
) -> Ownership:
    """Rewrite the lock item at ``key`` only while ``token`` holds it; say who holds it.

    ``gets`` then ``cas``: a new ``exptime`` (negative deletes) and, with
    ``value``, a new content.  ``"ours"``: rewritten; ``"taken"``: another owner
    holds it; ``"free"``: nobody does.  The token is passed in rather than read
    from a lock, so another owner (a keepalive, a background worker) can extend
    or release it.  ``store`` must be the strict view (:func:`authoritative`).
    """
    found, cas = store.gets(key)
    if found != token or cas is None:
        return "free" if found is None else "taken"
    stored = store.cas(key, token if value is None else value, cas, exptime)
    if stored:
        return "ours"
    return "free" if stored is None else "taken"  # it lapsed, or changed, after our gets


class Lock:
    """A lock held in memcached under ``key``, expiring after ``timeout`` seconds.

    ``blocking`` / ``blocking_timeout`` are the defaults of :meth:`acquire`
    (``None``: wait as long as it takes).  ``clock`` (monotonic seconds),
    ``sleep`` and ``rng`` are injectable for tests; ``on_event`` receives
    :class:`LockWaited` and :class:`LockTimedOut`.  ``thread_local``: each
    caller using the object (a thread; a task of the asyncio form) is its own
    owner; False shares one owner between them, for handing a held lock over.
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
        sleep: Sleeper = sleep,
        rng: Callable[[], float] = chance.uniform,
        on_event: EventHook | None = None,
        thread_local: bool = True,
    ) -> None:
        placed(key)  # an invalid key fails here, not on first use
        check_positive("lock timeout", timeout, maximum=MAX_TIMEOUT)
        if blocking_timeout is not None:
            check_positive("blocking_timeout", blocking_timeout, zero=True)
        self.key = key
        self.timeout = float(timeout)
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.backoff = backoff or Backoff()
        self._store = authoritative(store)
        self._degrade = degrades(store)  # a release whose server is out: logged, not raised
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._on_event = on_event
        self.thread_local = thread_local
        self._owners: OwnerHolds = Owners() if thread_local else SharedOwner()

    def __repr__(self) -> str:
        state = "held" if self._owners.current().token is not None else "not held"
        return f"<{type(self).__name__} {self.key!r} timeout={self.timeout:g}s {state}>"

    @property
    def token(self) -> bytes | None:
        """This owner's token while it holds the lock (per thread or task by default), else None."""
        return self._owners.current().token

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
        (never a silent False), :class:`LockError` if this owner (this thread or
        task, with ``thread_local``) already holds it.
        """
        hold = self._owners.current()
        if hold.token is not None:
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
            if self._try_add(hold, token):
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
        ``token``: release for the owner of that token, from any thread or task.
        A server that cannot be reached leaves the lock to lapse at its timeout:
        logged and reported (``OPTIONS["on_outage"] = "degrade"``, the default) or
        raised as :class:`NodeUnavailableError` (``"raise"``).
        """
        hold = self._owners.current()
        token = self._held(hold, "release", token)
        cas = hold.cas if hold.token == token else None
        if hold.token == token:
            hold.token = hold.cas = None
        # Run to its end even if this task is cancelled meanwhile: text memcached deletes
        # by cas in two requests, and a release left halfway holds the lock until it lapses.
        try:
            finish_then_undo(self._let_go(hold, token, cas), _released)
        except NodeUnavailableError as exc:
            if not self._degrade:
                raise
            logger.warning("lock %r not released (%s): it lapses at its timeout", self.key, exc)
            emit(self._on_event, WriteDegraded(self.key, "release", exc))

    def _let_go(self, hold: Hold, token: bytes, cas: CasToken | None) -> bool:
        """Delete the lock item (by cas, else by the token); True: it went by cas."""
        if cas is not None:
            with Reaching(self.key, "release"):
                if self._store.delete_cas(self.key, cas):
                    return True
        self._replace(hold, token, -1, "release")  # by the token; negative deletes
        return False

    def extend(
        self, additional_time: float, replace_ttl: bool = False, token: bytes | None = None
    ) -> None:
        """Keep the lock ``additional_time`` seconds longer (or, with ``replace_ttl``,
        exactly that long from now).  Raise :class:`LockNotOwnedError` if it lapsed.

        ``token``: extend for the owner of that token, from any thread or task
        (a keepalive); where this owner does not hold it, the time left is not
        known here and ``additional_time`` counts from now.
        """
        mine = self._owners.current()
        token = self._held(mine, "extend", token)
        hold = mine if mine.token == token else Hold()
        now = self._clock()
        remaining = max(0.0, hold.deadline - now)
        ttl = additional_time if replace_ttl else remaining + additional_time
        check_positive("the extended lock time", ttl, maximum=MAX_TIMEOUT)
        exptime = exptime_for(ttl)
        cas = None
        if hold.cas is not None:
            with Reaching(self.key, "extend"):
                cas = self._store.recas(self.key, token, hold.cas, exptime)
        if cas is None:
            # by the token: the new cas is not known
            self._replace(mine, token, exptime, "extend")
        hold.cas = cas
        hold.deadline = now + ttl

    def locked(self) -> bool:
        """Whether anyone holds the lock now (one ``get``)."""
        with Reaching(self.key, "inspect"):
            return self._store.get(self.key) is not None

    def owned(self) -> bool:
        """Whether this owner still holds the lock, as memcached sees it (one ``get``)."""
        token = self._owners.current().token
        if token is None:
            return False
        with Reaching(self.key, "inspect"):
            return bool(self._store.get(self.key) == token)

    # -- context manager and decorator --

    def __enter__(self) -> Lock:
        if not self.acquire():
            limit = self.blocking_timeout
            waited = f" within {limit:g}s" if self.blocking and limit is not None else ""
            raise LockTimeoutError(f"could not acquire lock {self.key!r}{waited}: it is held")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __call__(self, func: Decorated) -> Decorated:
        """Decorate ``func`` to run under the lock, each call as a fresh owner."""

        @functools.wraps(func)
        def locked_call(*args: Any, **kwargs: Any) -> Any:
            with self.copy():
                return func(*args, **kwargs)

        return cast(Decorated, locked_call)

    # -- steps --

    def _try_add(self, hold: Hold, token: bytes) -> bool:
        now = self._clock()
        exptime = exptime_for(self.timeout)
        with Reaching(self.key, "acquire"):
            # A task cancelled while its add is answered must not leave the lock taken
            # by nobody until it lapses: the add is awaited to its end, and undone.
            add = self._store.add_cas(self.key, token, exptime)  # sync: runs here
            cas = finish_then_undo(add, self._unclaim())
        if cas is None:
            return False
        hold.token = token
        hold.cas = cas
        hold.deadline = now + self.timeout
        return True

    def _unclaim(self) -> Undo[CasToken | None]:
        """What deletes the lock a cancelled acquire's ``add`` took (by its cas)."""

        def undo(cas: CasToken | None) -> None:
            if cas is not None:
                with Reaching(self.key, "release"):
                    self._store.delete_cas(self.key, cas)

        return undo

    def _replace(self, hold: Hold, token: bytes, exptime: int, action: str) -> None:
        """Rewrite our lock item (new exptime; negative deletes) only while it is ours."""
        with Reaching(self.key, action):
            held = rewrite_owned(self._store, self.key, token, exptime)
        if held != "ours":
            raise self._not_owned(hold, action, token, holder=held == "taken")

    def _held(self, hold: Hold, action: str, token: bytes | None) -> bytes:
        """The token to act for: the one given, else this owner's (or a LockError)."""
        if token is not None:
            return token
        if hold.token is None:
            raise LockError(f"cannot {action} lock {self.key!r}: this Lock object does not hold it")
        return hold.token

    def _not_owned(
        self, hold: Hold, action: str, token: bytes, *, holder: bool
    ) -> LockNotOwnedError:
        if hold.token == token:
            hold.token = None
        now = "another owner may hold it now" if holder else "nobody holds it now"
        return LockNotOwnedError(
            f"cannot {action} lock {self.key!r}: this owner no longer holds it "
            f"(its TTL lapsed; {now}); the critical section outlived the lock timeout"
        )


def _released(_: bool) -> None:
    """Nothing to hand back once a cancelled owner's release is done."""
