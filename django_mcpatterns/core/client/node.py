"""One server: its pool of connections, its health, its asyncio channels, and forks.

Connections belong to the process that opened them: a forked child (gunicorn
``--preload``, Celery prefork, ``multiprocessing``, uWSGI) never uses one it
inherited, or parent and child would read each other's replies.

How a fork is noticed, without a system call per operation
    ``os.register_at_fork`` gives the child new, empty pools at once (while it
    has one thread, so locks a vanished parent thread held are replaced too).
    A fork from C bypasses Python's hooks (uWSGI without
    ``py-call-osafterfork``), so every round trip also reads one byte of a
    memory page the kernel wipes in a forked child (``MADV_WIPEONFORK``,
    Linux 4.14 and later): a zero there means "forked, hooks or not", and
    costs a memory read where ``os.getpid()`` would cost a system call.
    Where the kernel cannot wipe a page, the byte is read through a pid
    check instead (today's cost: one ``getpid`` per checkout).
    The inherited sockets are closed in the child only, which sends nothing:
    the parent's connections live on.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from .health import NodeHealth
from .links import Links
from .servers import Server
from .transport import Connection, Pool, SocketOptions

__all__ = ["Node", "after_fork", "armed", "forked", "watch_forks"]


class _AfterFork(Protocol):
    def after_fork(self) -> None: ...


class _PidPage:
    """The guard where the kernel cannot wipe a page: "armed" while the pid is the same."""

    __slots__ = ("pid",)

    def __init__(self) -> None:
        self.pid = os.getpid()

    def __getitem__(self, index: int) -> int:
        return 1 if os.getpid() == self.pid else 0

    def __setitem__(self, index: int, value: int) -> None:
        self.pid = os.getpid()


def _guard_page() -> Any:
    """One byte that reads 1 in the process that armed it and 0 in any forked child."""
    wipe = getattr(mmap, "MADV_WIPEONFORK", 18 if sys.platform == "linux" else None)
    private = getattr(mmap, "MAP_PRIVATE", None)
    anonymous = getattr(mmap, "MAP_ANONYMOUS", None)
    if wipe is None or private is None or anonymous is None:
        return _PidPage()
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, flags=private | anonymous)
        page.madvise(wipe)
    except (OSError, ValueError, AttributeError):  # an older kernel, or no madvise
        return _PidPage()
    page[0] = 1
    return page


# Read by every checkout: ``if not armed[0]`` is the whole hot-path cost.
armed: Any = _guard_page()
_lock = threading.Lock()
_watched: weakref.WeakSet[_AfterFork] = weakref.WeakSet()


def watch_forks(item: _AfterFork) -> None:
    """Call ``item.after_fork()`` in every forked child (held weakly: as long as it lives)."""
    with _lock:
        _watched.add(item)


def after_fork() -> None:
    """In a child right after ``fork`` (Python's hook: it has one thread)."""
    global _lock
    _lock = threading.Lock()  # a vanished parent thread may have held it
    _renew()


def forked() -> None:
    """A checkout found the guard wiped: a fork from C.  Renew this process's state, once."""
    with _lock:
        if not armed[0]:  # another thread may have done it meanwhile
            _renew()


def _renew() -> None:
    for item in list(_watched):
        item.after_fork()
    armed[0] = 1  # this process's from now on: its own children see a wiped page again


os.register_at_fork(after_in_child=after_fork)


class Node:
    """One server: its pool of connections and its health, shared by every thread.

    ``links`` are its asyncio channels (one per event loop), shared by every
    async twin of its cluster.  The pool belongs to this process: a forked
    child replaces it (:meth:`after_fork`) before its first checkout (the
    drivers read :data:`armed` before taking a connection).
    """

    __slots__ = (
        "__weakref__",
        "_idle_timeout",
        "_lock",
        "_make_client",
        "_pool_size",
        "health",
        "links",
        "name",
        "pool",
        "server",
    )

    def __init__(
        self,
        server: Server,
        health: NodeHealth,
        socket_options: SocketOptions,
        pool_size: int | None,
        idle_timeout: float,
    ) -> None:
        self.server = server
        self.name = server.node
        self.health = health
        self._pool_size = pool_size
        self._idle_timeout = idle_timeout
        address = server.address
        self._make_client: Callable[[], Connection] = lambda: Connection(address, socket_options)
        self.links = Links(address, socket_options)
        self._open()
        watch_forks(self)

    def _open(self) -> None:
        """Start an empty pool, this process's."""
        lock = threading.Lock()
        self._lock = lock
        # The pool runs on our lock so drop_idle() can close idle clients without
        # racing a checkout.
        self.pool = Pool(
            self._make_client,
            max_size=self._pool_size,
            idle_timeout=self._idle_timeout,
            lock=lock,
        )

    def connect_aside(self) -> Connection:
        """A new connection outside the pool, for a probe; the caller closes it."""
        return self._make_client()

    def after_fork(self) -> None:
        """In a forked child: forget the parent's connections, keep its view of the server.

        Closing a socket here closes the child's descriptor only; nothing is
        sent, so the parent (and its other children) keep their connections.
        """
        inherited = (*self.pool.free, *self.pool.used)
        self._open()
        self.health.after_fork()
        self.links.after_fork()
        for client in inherited:
            client.close()

    def drop_idle(self) -> None:
        """Close idle connections; busy ones stay with the operations using them.

        A closed connection reconnects on its next use.
        """
        for client in self.pool.take_idle():
            client.close()

    def __repr__(self) -> str:
        return f"<node {self.name}>"
