"""The stampede's vocabulary: its policy, events, outcomes, lock keys and failure markers.

Pure code (no I/O) shared by the sync :class:`~django_mcpatterns.core.stampede.Stampede` and the
async :class:`~django_mcpatterns.core.stampede.AsyncStampede`, whose algorithm is written once in
``_async.py`` (see :mod:`django_mcpatterns.core.stampede` for how it works).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar, overload

from ..concurrency import Runner
from ..exceptions import ConfigurationError
from ..keys import MAX_KEY_LENGTH, Key, PlainKey, Routed, placed
from ..locks import Backoff
from ..store import CasToken
from ..values.envelope import Envelope

__all__ = [
    "FAILURE_PREFIX",
    "LOCK_SUFFIX",
    "MARK_STALE_ATTEMPTS",
    "NO_VALUE",
    "OVERWRITE",
    "WAIT_TIMEOUT_ACTIONS",
    "Claim",
    "ComputeFailed",
    "DropReason",
    "Fetched",
    "NoValue",
    "OnPlaceholder",
    "Outcome",
    "Overwrite",
    "Reason",
    "Recomputed",
    "RefreshDropped",
    "Runner",
    "StaleServed",
    "StampedePolicy",
    "as_envelope",
    "checked_timeout",
    "failure_marker",
    "lock_key",
    "read_failure_marker",
    "recent_failures",
]

logger = logging.getLogger("django_mcpatterns.stampede")

T = TypeVar("T")

Reason = Literal["miss", "stale", "early", "refresh"]
Outcome = Literal["fresh", "stale", "computed", "waited"]
DropReason = Literal["full", "refused", "lapsed", "unreachable"]
WAIT_TIMEOUT_ACTIONS = ("raise", "compute")

LOCK_SUFFIX = b":stampede-lock"
MARK_STALE_ATTEMPTS = 5
# A lock item holding this (and the failed owner's token, and what failed) is a failure
# marker.  Tokens are hex, so no token starts with it.
FAILURE_PREFIX = b"!compute-failed "
_FAILURE_DESCRIPTION_LIMIT = 200


class NoValue(enum.Enum):
    """The type of :data:`NO_VALUE`: a miss, distinct from a cached ``None``.

    An enum because type checkers narrow ``x is NO_VALUE`` for enum members only.
    """

    NO_VALUE = "NO_VALUE"

    def __repr__(self) -> str:
        return "NO_VALUE"

    def __bool__(self) -> bool:
        return False


NO_VALUE: Final = NoValue.NO_VALUE


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
        (:class:`~django_mcpatterns.core.exceptions.LockTimeoutError`, the default) or ``"compute"``
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
        job, e.g. a :class:`~django_mcpatterns.core.refresh.RefreshRunner` (bounded queue).  A
        runner that raises (a full queue) drops the job: the lock is released and
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

    def recache_for(self, timeout: float) -> int | None:
        """The ``R<seconds>`` of a claim for values of ``timeout``: memcached hands its
        recompute token (``W``) to the first read that finds less TTL left.

        A fill stores the hard TTL as ``ceil(timeout + grace) + 1`` whole seconds
        (:func:`~django_mcpatterns.core.locks.exptime_for`); less than that minus
        ``ceil(timeout)`` is left from ``ceil(timeout)`` seconds after the fill on,
        give or take memcached's one-second tick: from the soft expiry (a
        timeout in whole seconds), never before it.  None under a grace of less
        than a second (the lock-based path decides).
        """
        grace = self.grace_for(timeout)
        if grace < 1 or timeout == math.inf:
            return None
        return math.ceil(timeout + grace) + 1 - math.ceil(timeout)


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


class Claim(enum.Enum):
    """What one try of the recompute lock gave, when it was not the lock."""

    LOST = "lost"
    UNREACHABLE = "unreachable"


class Overwrite(enum.Enum):
    """A fill without a lease: a plain ``set`` (:meth:`Stampede.recompute`, no lock server)."""

    OVERWRITE = "overwrite"


OVERWRITE: Final = Overwrite.OVERWRITE


@dataclass(frozen=True, slots=True)
class OnPlaceholder:
    """A lease on a placeholder (a miss): deleted again when no value is stored."""

    cas: CasToken


class _RecentFailures:
    """The exceptions behind this process's failure markers, by the failed owner's token.

    Lets a waiter in the same process chain the original exception to its
    :class:`~django_mcpatterns.core.exceptions.ComputeFailedError`.  Bounded (exceptions hold their
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


def as_envelope(found: Any) -> Envelope | NoValue:
    if type(found) is Envelope:
        return NO_VALUE if found.pending else found  # a lease placeholder: a fill under way
    if found is NO_VALUE:
        return found
    return Envelope(found)  # stored with a plain set: the user's value and TTL


def checked_timeout(timeout: float | None) -> float | None:
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
