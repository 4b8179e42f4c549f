"""The sync transport: blocking sockets driving the codec of :mod:`.wire`.

A :class:`Connection` is one socket to one server (TCP with ``TCP_NODELAY``, a
unix socket, or TLS through an :class:`ssl.SSLContext`), opened lazily with the
connect timeout and then used with the I/O timeout.  It writes a batch of
requests at once and reads their replies through a :class:`~.wire.Reader`;
whatever the reader refuses raises :class:`~.exceptions.ProtocolError`, and a
connection that raised is never used again (the caller closes it).

Where the compiled hot path is built (:mod:`..protocol.compiled`), a plain
blocking socket's exchanges run in C on its descriptor: encode, send, receive
and a get's parse with the GIL released once (or kept, while the process looks
first: io.c), answering as the Python code below does (which runs for TLS,
stand-in socket modules, and without it).

A :class:`Pool` holds one server's connections; which process owns a pool
(fork safety) is the node's business (:mod:`.node`).
"""

from __future__ import annotations

import contextlib
import itertools
import selectors
import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, TypeVar

from ..exceptions import ProtocolError
from ..protocol.compiled import COMPILED, ConnectionClosedError, Reader, encode
from ..protocol.wire import NEED_DATA, ErrorReply, Request
from . import epochs

__all__ = [
    "Connection",
    "ConnectionClosedError",
    "Keepalive",
    "Pool",
    "SocketOptions",
    "answer",
    "answering",
    "completed",
    "stamp_completed",
    "tune_tcp",
]

T = TypeVar("T")

_RECV_SIZE = 65536

# Requests this process's sync connections and async channels have seen answered
# (a stamp, not a count).  A read may share a fetch already on the wire only while
# the stamp is the one it was sent under: a write answered since may postdate it.
completed = [0]
_stamps = itertools.count(1)


def stamp_completed() -> None:
    """Note that a request was answered (a write, maybe): fetches sent before are not shared."""
    completed[0] = next(_stamps)  # next() is atomic: threads never share a stamp


class Keepalive(Protocol):
    """TCP keepalive settings (pymemcache's ``KeepaliveOpts`` fits): seconds idle
    before the first probe, seconds between probes, probes before giving up."""

    idle: int
    intvl: int
    cnt: int


@dataclass(frozen=True)
class SocketOptions:
    """How connections are opened (the cluster's timeouts and ``client_options``)."""

    connect_timeout: float | None = 1.0
    timeout: float | None = 1.0
    no_delay: bool = True
    socket_keepalive: Keepalive | None = None
    tls_context: ssl.SSLContext | None = None
    socket_module: ModuleType | Any = socket  # a stand-in module, for tests


class Connection:
    """One connection to ``address`` (``(host, port)`` or a unix socket path).

    ``sock`` is None until :meth:`connect`; :meth:`exchange` connects if needed,
    so the caller that must know whether a command may have left (an outcome
    unknown, not a certain failure) calls :meth:`connect` first.  One
    :class:`~..protocol.reader.Reader` serves every reply of the connection:
    a complete exchange leaves it empty, and a connection that raised is
    never used again.
    """

    __slots__ = ("address", "fd", "options", "reader", "sock", "timeout")

    def __init__(self, address: str | tuple[str, int], options: SocketOptions) -> None:
        self.address = address
        self.options = options
        self.timeout = options.timeout
        self.sock: Any = None  # a socket, an SSLSocket or a test's stand-in
        self.fd = -1  # the socket's descriptor when the compiled path does its I/O
        self.reader = Reader()

    def __repr__(self) -> str:
        state = "open" if self.sock is not None else "closed"
        return f"<Connection {self.address!r} {state}>"

    def connect(self) -> Any:
        """Return the socket, opening it first if needed; nothing is sent."""
        if self.sock is not None:
            return self.sock
        options, s = self.options, self.options.socket_module
        if isinstance(self.address, str):
            sock = s.socket(s.AF_UNIX, s.SOCK_STREAM)
            sockaddr: Any = self.address
        else:
            host, port = self.address
            family, socktype, proto, _, sockaddr = s.getaddrinfo(
                host, port, s.AF_UNSPEC, s.SOCK_STREAM, s.IPPROTO_TCP
            )[0]
            sock = s.socket(family, socktype, proto)
        try:
            if not isinstance(self.address, str):
                tune_tcp(sock, s, options)
                if options.tls_context is not None:
                    sock = options.tls_context.wrap_socket(sock, server_hostname=host)
            sock.settimeout(options.connect_timeout)
            sock.connect(sockaddr)
            _set_io_timeout(sock, s, options)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.reader = Reader()
        # The compiled I/O needs a plain blocking socket (the kernel bounds each call).
        plain = COMPILED and s is socket and options.tls_context is None
        self.fd = sock.fileno() if plain and sock.gettimeout() is None else -1
        epochs.opened(self.address)
        return sock

    def send(self, data: bytes) -> None:
        """Write a batch of encoded requests (:func:`~.wire.encode`)."""
        try:
            sock = self.connect()
            if self.fd >= 0:
                self.reader.send(self.fd, data, self.timeout)
            else:
                _send_all(sock, data, self._deadline())
        except BlockingIOError as exc:
            raise _timed_out(exc) from exc

    def receive(self, requests: Sequence[Request[Any]]) -> list[Any]:
        """Read the replies to ``requests``, sent before, in order.

        Each reply is the request's type, or an :class:`~.wire.ErrorReply`.
        Raise :class:`ProtocolError` for a reply the requests cannot get or bytes
        after the last one, :class:`ConnectionClosedError` or ``OSError`` (a
        timeout included) when the server fails.
        """
        sock = self.sock
        if sock is None:
            raise ConnectionClosedError("the connection is closed")
        reader = self.reader
        if self.fd >= 0:
            try:
                compiled: list[Any] = reader.receive(self.fd, requests, self.timeout)
            except BlockingIOError as exc:
                raise _timed_out(exc) from exc
            completed[0] = next(_stamps)  # stamp_completed(), inlined
            return compiled
        replies: list[Any] = []
        deadline = self._deadline()
        try:
            for request in requests:
                reply = request.read(reader)  # NEED_DATA at once while nothing is buffered
                while reply is NEED_DATA:
                    _receive_more(sock, reader, deadline)
                    reply = request.read(reader)
                replies.append(reply)
        except BlockingIOError as exc:
            raise _timed_out(exc) from exc
        reader.drained()
        stamp_completed()
        return replies

    def exchange(self, requests: Sequence[Request[Any]]) -> list[Any]:
        """Send ``requests`` in one write and return their replies."""
        self.send(encode(requests))
        return self.receive(requests)

    def request(self, request: Request[T]) -> T | ErrorReply:
        """Send one request and return its reply: the hot path of single-key commands."""
        sock = self.sock or self.connect()
        timeout = self.timeout
        if self.fd >= 0:  # the compiled exchange: the GIL released once, or kept (io.c)
            try:
                compiled: T | ErrorReply = self.reader.request(self.fd, request, timeout)
            except BlockingIOError as exc:
                raise _timed_out(exc) from exc
            completed[0] = next(_stamps)
            return compiled
        deadline = time.monotonic() + timeout if timeout else None
        try:
            data = request.encode()
            sent = sock.send(data)
            if sent != len(data):  # a short request goes in one send
                _send_rest(sock, data, sent, deadline)
            data = sock.recv(_RECV_SIZE)  # a short reply: all of it, usually
            if not data:
                raise _closed()
            reader = self.reader
            reader.feed(data)
            reply: Any = request.read(reader)
            while reply is NEED_DATA:
                _receive_more(sock, reader, deadline)
                reply = request.read(reader)
        except BlockingIOError as exc:
            raise _timed_out(exc) from exc
        reader.drained()
        completed[0] = next(_stamps)  # stamp_completed(), inlined: the hot path
        answer: T | ErrorReply = reply  # NEED_DATA is looped away
        return answer

    def _deadline(self) -> float | None:
        """When the operation under way must be over: the kernel bounds each system call only."""
        timeout = self.timeout
        return time.monotonic() + timeout if timeout else None

    def close(self) -> None:
        """Close the socket (this process's descriptor only: nothing is sent)."""
        sock, self.sock = self.sock, None
        self.fd = -1
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()


def _send_all(sock: Any, data: bytes, deadline: float | None) -> None:
    """``sendall``, bounded as a whole: a server reading slowly times the operation out.

    A short batch goes in one ``send``; only a partial one loops, checking the
    deadline between sends.
    """
    sent = sock.send(data)
    if sent != len(data):
        _send_rest(sock, data, sent, deadline)


def _send_rest(sock: Any, data: bytes, sent: int, deadline: float | None) -> None:
    """The rest of a partial send, checking ``deadline`` between sends."""
    rest = memoryview(data)[sent:]
    while rest:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("timed out")
        rest = rest[sock.send(rest) :]


def _receive_more(sock: Any, reader: Reader, deadline: float | None) -> None:
    """Feed ``reader`` the next chunk; a reply still incomplete past ``deadline`` times out.

    The kernel bounds each receive: a server trickling a reply byte by byte
    would otherwise hold the operation as long as it likes.
    """
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError("timed out")
    data = sock.recv(max(reader.wanted, _RECV_SIZE))
    if not data:
        raise _closed()
    reader.feed(data)


def tune_tcp(sock: Any, s: Any, options: SocketOptions) -> None:
    """Apply ``no_delay`` and ``socket_keepalive`` to a TCP socket (``s``: its socket module).

    Both transports (this one and aio_transport.py) tune their sockets here.
    """
    if options.no_delay:
        sock.setsockopt(s.IPPROTO_TCP, s.TCP_NODELAY, 1)
    keepalive = options.socket_keepalive
    if keepalive is not None:
        sock.setsockopt(s.SOL_SOCKET, s.SO_KEEPALIVE, 1)
        sock.setsockopt(s.IPPROTO_TCP, s.TCP_KEEPIDLE, keepalive.idle)
        sock.setsockopt(s.IPPROTO_TCP, s.TCP_KEEPINTVL, keepalive.intvl)
        sock.setsockopt(s.IPPROTO_TCP, s.TCP_KEEPCNT, keepalive.cnt)


def _set_io_timeout(sock: Any, s: Any, options: SocketOptions) -> None:
    """Bound every send and receive by ``options.timeout``.

    A plain TCP or unix socket stays blocking and the kernel enforces the
    timeout (``SO_RCVTIMEO``/``SO_SNDTIMEO``): each send or receive is then one
    system call, where Python's own socket timeout polls before every one.
    When the timeout expires the call fails with ``EAGAIN`` (see
    :func:`_timed_out`).  TLS sockets keep Python's timeout, which the ssl
    module honours inside its own reads.
    """
    timeout = options.timeout
    if not timeout or timeout <= 0 or options.tls_context is not None:
        sock.settimeout(timeout)
        return
    seconds = int(timeout)
    # A zero timeval means no timeout at all: a sub-microsecond one stays one microsecond.
    micros = max(int((timeout - seconds) * 1_000_000), 0 if seconds else 1)
    timeval = struct.pack("@ll", seconds, micros)
    sock.settimeout(None)
    sock.setsockopt(s.SOL_SOCKET, s.SO_RCVTIMEO, timeval)
    sock.setsockopt(s.SOL_SOCKET, s.SO_SNDTIMEO, timeval)


def _closed() -> ConnectionClosedError:
    return ConnectionClosedError("memcached closed the connection mid-reply")


def _timed_out(exc: BlockingIOError) -> TimeoutError:
    """The kernel's timeout (``EAGAIN`` on a blocking socket) as Python's own would say it."""
    return TimeoutError("timed out")


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


def answer(connection: Connection, request: Request[Any]) -> Any:
    """``request``'s reply on ``connection`` (new, closed after); None when refused or down.

    Refused: ``ERROR`` or a closed connection, as a server that does not know
    the command answers it.
    """
    try:
        reply = connection.request(request)
    except (OSError, ProtocolError):
        return None
    finally:
        connection.close()
    if type(reply) is ErrorReply and reply.kind == "ERROR":
        return None
    return reply


def answering(clients: list[Connection], timeout: float | None) -> Collection[Connection]:
    """The connections that start answering within one ``timeout``, waited for together.

    Reading replies one after another, each stalled server would cost a
    timeout of its own; waiting on all of them at once costs one.
    """
    if len(clients) < 2 or not timeout:
        return clients
    deadline = time.monotonic() + timeout
    waiting = {client.sock: client for client in clients if client.sock is not None}
    ready: set[Connection] = set()
    with selectors.DefaultSelector() as selector:
        for sock in waiting:
            selector.register(sock, selectors.EVENT_READ)
        while len(ready) < len(waiting):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for event, _ in selector.select(left):
                ready.add(waiting[event.fileobj])
                selector.unregister(event.fileobj)
    return ready
