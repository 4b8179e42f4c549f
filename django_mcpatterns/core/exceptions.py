"""The one exception tree of django-mcpatterns.

::

    McPatternsError
    ├── ConfigurationError      an option or server spec is invalid (also ValueError)
    ├── InvalidKeyError         a key memcached would reject, raised before I/O (also ValueError)
    ├── ValueTooLargeError      the value is over the item size limit (also ValueError)
    │   └── CollectionTooLargeError   a set or list would pass its configured maximum
    ├── NonNumericValueError    incr/decr of a value that is not a number (also ValueError
    │                           and TypeError)
    ├── EncodingError           stored data could not be decoded (also ValueError)
    │   └── WrongTypeError          a set or list operation on a key holding another kind of value
    ├── IncompleteSetError      a set lost a shard, or awaits its loader: it cannot be read whole
    ├── ContentionError         a compare-and-swap kept losing to other writers
    ├── LockError               a lock was used in a way its state does not allow
    │   ├── LockNotOwnedError       release/extend by an owner whose lock lapsed or was taken over
    │   └── LockTimeoutError        not acquired in time (blocking_timeout, a stampede wait)
    └── ClusterError            a memcached server did not answer as it should
        ├── NodeUnavailableError    the server is unreachable, timed out or marked dead
        └── ServerError             the server answered with an error we did not expect

The Django layer turns :class:`ConfigurationError` into ``ImproperlyConfigured``.
Errors are chained (``raise ... from exc``) so the underlying socket or pymemcache
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
    rebuild it, or it is being rebuilt from its loader and was read without one."""


class ContentionError(McPatternsError):
    """A compare-and-swap (``cas``) kept losing to other writers, or to an
    unavailable server, for the configured number of attempts."""


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


class ServerError(ClusterError):
    """The server answered with an error (``SERVER_ERROR``, ``CLIENT_ERROR``)."""
