"""The one exception tree of django-mcpatterns.

::

    McPatternsError
    ├── ConfigurationError      an option or server spec is invalid (also ValueError)
    │   ├── CommandNotSupportedError  the server does not know a command (meta on a
    │   │                             text-only server: OPTIONS["protocol"])
    │   ├── NeedsMetaProtocolError    a meta-only operation in text mode, before any I/O
    │   └── ReplicatedKeyError        an in-place edit (append, incr...) of a replicated key
    ├── InvalidKeyError         a key memcached would reject, raised before I/O (also ValueError)
    ├── ValueTooLargeError      the value is over the item size limit (also ValueError)
    │   └── CollectionTooLargeError   a set or list would pass its configured maximum
    ├── NonNumericValueError    incr/decr of a value that is not a number (also ValueError
    │                           and TypeError)
    ├── EncodingError           stored data could not be decoded (also ValueError)
    │   └── WrongTypeError          a set or list operation on a key holding another kind of value
    ├── IncompleteSetError      a set lost a shard or writes, or awaits its loader: not whole
    │   └── IncompleteListError     a list lost writes in an outage
    ├── ContentionError         a compare-and-swap kept losing to other writers
    ├── ComputeFailedError      another caller's computation of the key failed moments ago
    ├── LockError               a lock was used in a way its state does not allow
    │   ├── LockNotOwnedError       release/extend by an owner whose lock lapsed or was taken over
    │   └── LockTimeoutError        not acquired in time (blocking_timeout, a stampede wait)
    └── ClusterError            a memcached server did not answer as it should
        ├── NodeUnavailableError    the server is unreachable, timed out or marked dead
        │   ├── OutcomeUnknownError     a command left and no reply came: applied or not, unknown
        │   │   └── ProtocolError       its reply did not match the request: connection closed
        │   └── LockUnavailableError    a lock whose server cannot be reached (cache.lock)
        │       └── LockOutcomeUnknownError  an acquire whose reply never came (also
        │                                    an OutcomeUnknownError)
        └── ServerError             the server answered with an error we did not expect

The Django layer turns :class:`ConfigurationError` into ``ImproperlyConfigured``.
Errors are chained (``raise ... from exc``) so the underlying socket or protocol
error stays visible.
"""

from __future__ import annotations


class McPatternsError(Exception):
    """Base class of every error raised by django-mcpatterns."""


class ConfigurationError(McPatternsError, ValueError):
    """An option, weight or server specification is invalid.

    ``option`` names the offending setting and ``choices`` the valid values, when
    there is a closed set of them.
    """

    def __init__(self, message: str, *, option: str | None = None, choices: object = None):
        super().__init__(message)
        self.option = option
        self.choices = choices


class CommandNotSupportedError(ConfigurationError):
    """The server (or proxy) does not know a command the configuration makes us send.

    memcached before 1.6 answers a meta command ``ERROR``; twemproxy closes the
    connection on meta commands, ``flush_all`` and ``stats``.  A setting, not
    a failing server: the server's health is not touched.  ``node`` names the
    server, ``command`` the refused command.
    """

    def __init__(self, message: str, *, node: str, command: str, option: str | None = None):
        super().__init__(message, option=option)
        self.node = node
        self.command = command


class NeedsMetaProtocolError(ConfigurationError):
    """An operation only the meta protocol offers, on a store set to ``"protocol": "text"``.

    Raised before anything is sent.  Patterns that can do without (a rewrite
    that would read the item's TTL) catch it and take their text-mode way.
    """


class ReplicatedKeyError(ConfigurationError):
    """An in-place edit (append, prepend, incr, decr) of a key under a replicated prefix.

    Replicated keys hold whole values written everywhere (``OPTIONS["replicate"]``):
    an edit applied on some copies and not others would leave them different
    for good.  Raised before anything is sent; ``option`` is ``"replicate"``.
    """


class InvalidKeyError(McPatternsError, ValueError):
    """A key that memcached would reject: too long, or with whitespace/control bytes."""


class ValueTooLargeError(McPatternsError, ValueError):
    """A value over the item size limit (memcached's ``-I``, 1 MiB by default)."""


class CollectionTooLargeError(ValueTooLargeError):
    """A set or list write that would pass the configured maximum (``max_shards``
    for sets, one item for lists); nothing of it was stored."""


class NonNumericValueError(McPatternsError, ValueError, TypeError):
    """``incr``/``decr`` of a stored value that is not a decimal number.

    Also a :class:`TypeError`, as Django's own backends raise for it (its cache
    tests expect ``TypeError``), and a :class:`ValueError`, as before.
    """


class EncodingError(McPatternsError, ValueError):
    """Stored data could not be decoded; never read as an empty or partial value."""


class WrongTypeError(EncodingError):
    """A set (or list) operation found a key holding another kind of value: Redis' WRONGTYPE.

    A plain cache value (``cache.set``), or a list where a set was expected.
    The item is left as it is; delete it or use another key.
    """


class LockError(McPatternsError):
    """A lock was used in a way its state does not allow (e.g. released while not held)."""


class LockNotOwnedError(LockError):
    """The lock is no longer held by this owner: its TTL lapsed, and maybe another owner took it.

    Raised by ``release()`` and ``extend()``; the other owner's lock is left alone.
    """


class LockTimeoutError(LockError):
    """The lock was not acquired within the time allowed (at once, for a non-blocking lock)."""


class IncompleteSetError(McPatternsError):
    """A set cannot be read whole: a shard was evicted and there is no loader to
    rebuild it, writes to it were lost in an outage (``OPTIONS["on_outage"]``),
    or it is being rebuilt from its loader and was read without one."""


class IncompleteListError(IncompleteSetError):
    """A list lost writes in an outage (``OPTIONS["on_outage"]``): it cannot be read
    whole until it expires or is deleted.  An :class:`IncompleteSetError`, so one
    handler serves both."""


class ContentionError(McPatternsError):
    """A compare-and-swap (``cas``) kept losing to other writers, or to an
    unavailable server, for the configured number of attempts."""


class ComputeFailedError(McPatternsError):
    """Computing the value failed moments ago, in this process or another, and is not retried
    until the failure back-off (``StampedePolicy.failure_backoff``) ends.

    One failure is shared instead of multiplied by every waiting caller.  ``key``
    is the value's key and ``error`` describes the original exception (type and
    message); in the process where it was raised the original is also chained
    as ``__cause__``.
    """

    def __init__(self, message: str, *, key: object, error: str):
        super().__init__(message)
        self.key = key
        self.error = error


class ClusterError(McPatternsError):
    """A memcached server did not answer as it should."""


class NodeUnavailableError(ClusterError, ConnectionError):
    """The server is unreachable, timed out, or marked dead by failover.

    Raised into callers only when the cluster is configured with
    ``raise_errors=True``; by default the operation degrades to a miss or a
    failed write.
    """

    def __init__(self, message: str, *, node: str | None = None):
        super().__init__(message)
        self.node = node


class OutcomeUnknownError(NodeUnavailableError):
    """A command was sent and its reply never came (a timeout, a connection lost
    mid-exchange): memcached may or may not have applied it.

    A :class:`NodeUnavailableError`, so handlers of unreachable servers still
    catch it; raised by the strict view only (the default view answers such a
    write ``False``, like one memcached refused).  Code that cleans up must not
    act on it: read the item again, or leave what it might name to expire.
    """


class ProtocolError(OutcomeUnknownError):
    """The server's reply did not match the request: a key that was not asked
    for, a line out of step, bytes nobody asked for.

    The connection is closed (whatever follows on it cannot be trusted) and the
    operation fails as it would on a server failure: a miss or a failed write
    by default, this error with ``raise_errors=True``.  Never a wrong value.

    A reply was read, so the command reached memcached: its outcome is unknown.
    """


class LockUnavailableError(NodeUnavailableError):
    """A lock could not be taken because its server cannot be reached.

    ``cache.lock(...)`` raises it rather than answer "held by someone else";
    ``django_mcpatterns.middleware.CacheUnavailableMiddleware`` (Flask:
    ``handle_cache_unavailable(app)``) turns it into a 503.  The internal locks
    of stampede protection, page guards and fills never raise it: they compute
    without the lock or serve the stale value.
    """


class LockOutcomeUnknownError(LockUnavailableError, OutcomeUnknownError):
    """An acquire whose reply never came: the lock may be held now, by this owner,
    until it lapses at its timeout.  Both a :class:`LockUnavailableError` and an
    :class:`OutcomeUnknownError`."""


class ServerError(ClusterError):
    """The server answered with an error (``SERVER_ERROR``, ``CLIENT_ERROR``)."""
