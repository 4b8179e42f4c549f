"""The pure rules of owner-safe locks, shared by the sync and the async lock.

What :mod:`django_mcpatterns.core.locks` (and stampede, namespaces, sets) build on that does no I/O:
tokens, exptimes on memcached's whole-second clock, back-off between tries,
the waiting events, the strict view of a store (:func:`authoritative`) and
argument checks.  The lock algorithms themselves are written once, as asyncio
code in ``_async.py`` (``AsyncLock``), and generated into
``_sync.py`` (``Lock``); every name here stays importable from
:mod:`django_mcpatterns.core.locks`.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar, cast, runtime_checkable

from ..exceptions import (
    ConfigurationError,
    LockOutcomeUnknownError,
    LockUnavailableError,
    NodeUnavailableError,
    OutcomeUnknownError,
)
from ..keys import Key
from ..store import MAX_RELATIVE_EXPIRE, AsyncStore, Store

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
    "AsyncDecorated",
    "Backoff",
    "Decorated",
    "EventHook",
    "LockTimedOut",
    "LockWaited",
    "Ownership",
    "Reaching",
    "SupportsStrict",
    "authoritative",
    "check_positive",
    "emit",
    "exptime_for",
    "new_token",
]

logger = logging.getLogger("django_mcpatterns.locks")

DEFAULT_TIMEOUT = 60.0
# Locks longer than memcached's relative exptime range would need absolute Unix
# times, which a monotonic clock cannot give; no lock should be held that long.
MAX_TIMEOUT = float(MAX_RELATIVE_EXPIRE - 1)

EventHook = Callable[[Any], object]

# What a lock used as a decorator wraps: any function (sync), a coroutine function (async).
Decorated = TypeVar("Decorated", bound=Callable[..., Any])
AsyncDecorated = TypeVar("AsyncDecorated", bound=Callable[..., Awaitable[Any]])

Ownership = Literal["ours", "taken", "free"]


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
            check_positive(f"backoff {name}", getattr(self, name))
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

    def strict(self) -> Any:
        """The same store, raising :class:`NodeUnavailableError` where it would degrade."""
        ...


S = TypeVar("S", Store, AsyncStore)


def authoritative(store: S) -> S:
    """Return ``store`` answering an unreachable server with :class:`NodeUnavailableError`.

    For a :class:`~django_mcpatterns.core.cluster.Cluster` (or its asyncio twin) that is its
    ``strict()`` view (shared servers, pools and node health); a store that
    cannot be unreachable (the in-process :class:`~django_mcpatterns.core.memory.MemoryStore`) is
    returned as is.
    """
    return cast(S, store.strict()) if isinstance(store, SupportsStrict) else store


def new_token() -> bytes:
    """A token no other owner will draw: 128 random bits, hex (readable by any client)."""
    return secrets.token_hex(16).encode()


class Reaching:
    """``with Reaching(key, action):`` names the lock and the action in an unreachable
    server's error: :class:`~django_mcpatterns.core.exceptions.LockUnavailableError` when
    taking or reading the lock, else keeping its class (a release whose reply was
    lost stays an :class:`~django_mcpatterns.core.exceptions.OutcomeUnknownError`).
    A class, not a generator: it wraps every request of a lock."""

    __slots__ = ("action", "key")

    def __init__(self, key: Key, action: str) -> None:
        self.key = key
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(exc, NodeUnavailableError):
            # Taking or reading a lock: LockUnavailableError (a 503 for the middleware).
            # Releasing or extending it keeps the class: an unknown outcome matters there.
            error: type[NodeUnavailableError] = type(exc)
            if self.action in ("acquire", "inspect"):
                unknown = isinstance(exc, OutcomeUnknownError)
                error = LockOutcomeUnknownError if unknown else LockUnavailableError
            raise error(
                f"cannot {self.action} lock {self.key!r}, its server is unreachable: {exc}",
                node=exc.node,
            ) from exc


# -- validation -------------------------------------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_positive(
    what: str, value: object, *, zero: bool = False, maximum: float = math.inf
) -> None:
    """Raise :class:`ConfigurationError` unless ``value`` is a number in range."""
    ok = _is_number(value) and (value >= 0 if zero else value > 0) and value <= maximum  # type: ignore[operator]
    if not ok:
        bound = ">= 0" if zero else "> 0"
        limit = "" if maximum == math.inf else f" and <= {maximum:g}"
        raise ConfigurationError(f"{what} must be a number {bound}{limit}, not {value!r}")
