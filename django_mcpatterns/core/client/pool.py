"""A pool of one server's connections, safe to share between threads."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from .transport import Connection

__all__ = ["Pool"]


class Pool:
    """The idle and busy connections to one server, safe to share between threads.

    :meth:`get` takes the oldest idle connection (closing those idle longer than
    ``idle_timeout`` seconds; 0: never) or opens a new one, up to ``max_size``
    busy at once (then ``RuntimeError``: the caller degrades, the server is not
    to blame).  A connection comes back through :meth:`release` after a
    complete exchange, or :meth:`destroy` when it may be mid-reply.

    Without a size limit or an idle timeout (the defaults) a checkout takes no
    lock: each step is one atomic operation on a deque or a dict (atomic under
    the GIL, and thread-safe on free-threaded Python too), so threads sharing
    a cluster never queue on the pool.  :meth:`take_idle` empties it the same
    way, so a connection is either checked out or closed, never both.
    """

    def __init__(
        self,
        make: Callable[[], Connection],
        *,
        max_size: int | None = None,
        idle_timeout: float = 0.0,
        lock: threading.Lock | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make = make
        self._max_size = max_size
        self._idle_timeout = idle_timeout
        self._lock = lock or threading.Lock()
        self._clock = clock
        self._free: deque[tuple[Connection, float]] = deque()
        self._used: dict[Connection, None] = {}  # insertion-ordered set
        self._unlocked = max_size is None and not idle_timeout

    @property
    def free(self) -> tuple[Connection, ...]:
        return tuple(connection for connection, _ in tuple(self._free))

    @property
    def used(self) -> tuple[Connection, ...]:
        return tuple(self._used)

    def get(self) -> Connection:
        if self._unlocked:  # the hot path: atomic steps, no lock
            try:
                connection = self._free.popleft()[0]
            except IndexError:
                connection = self._make()
            self._used[connection] = None
            return connection
        stale: list[Connection] = []
        with self._lock:
            try:
                connection = self._take(stale)
            finally:
                for old in stale:
                    old.close()
        return connection

    def _take(self, stale: list[Connection]) -> Connection:
        timeout = self._idle_timeout
        now = self._clock() if timeout else 0.0
        while self._free:
            connection, since = self._free.popleft()
            if not timeout or now - since <= timeout:
                break
            stale.append(connection)
        else:
            if self._max_size is not None and len(self._used) >= self._max_size:
                raise RuntimeError(f"connection pool exhausted: {self._max_size} in use")
            connection = self._make()
        self._used[connection] = None
        return connection

    def release(self, connection: Connection) -> None:
        if self._unlocked:
            if self._used.pop(connection, 0) is None:
                self._free.append((connection, 0.0))
            return
        with self._lock:
            if self._used.pop(connection, 0) is None:
                self._free.append((connection, self._clock() if self._idle_timeout else 0.0))

    def destroy(self, connection: Connection) -> None:
        if self._unlocked:
            self._used.pop(connection, None)
        else:
            with self._lock:
                self._used.pop(connection, None)
        connection.close()

    def take_idle(self) -> list[Connection]:
        """Remove and return the idle connections (for closing): none is checked out meanwhile."""
        taken: list[Connection] = []
        with self._lock:
            while True:
                try:
                    taken.append(self._free.popleft()[0])
                except IndexError:
                    return taken
