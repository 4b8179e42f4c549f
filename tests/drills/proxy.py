"""A loopback TCP proxy in front of one memcached: it records the bytes, and can cut replies.

Clients connect to :attr:`Proxy.spec` instead of the server.  Every connection's
bytes are kept in both directions (:attr:`Proxy.connections`), so a test can
assert on exactly what reached memcached (:mod:`tests.drills.wire` parses them).
With :attr:`Proxy.cut_after` set, a connection is closed after that many bytes
of replies: a server or network dying in the middle of a response.  With :attr:`Proxy.delay`
set, each chunk of replies is held that long (a slow network).  With
:meth:`Proxy.withhold`, the reply to the next command that starts with the given
bytes is never delivered (memcached still runs the command): a reply lost after
the request arrived, which the client can only see as a timeout; memcached's
answer to it arrives all the same (:meth:`Proxy.wait_withheld_answered`), and
until it has, the proxy forwards no other connection's request: a read the
client sends after giving up comes after the write it gave up on.  With
:attr:`Proxy.gate` set to an event, replies wait until it is set (a stalled
server the test releases); :attr:`Proxy.client_closed` is set once the client
closes a connection (e.g. after its timeout): gating one proxy's replies on
another's ``client_closed`` shows whether a client waited for two servers one
after the other or together, with no clock.

:attr:`Proxy.round_trips` counts round trips on the wire: a burst of bytes from
the client that follows a reply (or opens the connection) starts one; more
bytes before any reply (a pipelined batch, a large value sent in pieces) belong
to it.  Tests count what a pattern costs there, never by patching our code.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.harness import LOOPBACK


@dataclass
class Connection:
    """One client connection: what the client sent and what it was answered."""

    sent: bytearray = field(default_factory=bytearray)
    received: bytearray = field(default_factory=bytearray)
    cut: bool = False
    holding: bool = False  # from the withheld command on, replies are dropped
    held: int = 0  # reply bytes dropped (counted, not kept: bounded)
    round_trips: int = 0  # client bursts, each after a reply (see the module docstring)
    answered: bool = True  # the server replied since the client last sent
    withheld_by: int = 0  # which call of Proxy.withhold this connection's holding answers
    settled: bool = False  # its withheld command was answered (or the connection closed)


class Proxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream_port``, recording; a context manager."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = (LOOPBACK, upstream_port)
        self.cut_after: int | None = None
        self.delay = 0.0  # seconds each chunk of replies is held before it is forwarded
        self.gate: threading.Event | None = None  # replies wait until it is set
        self.client_closed = threading.Event()  # a client closed one of its connections
        self._answered = threading.Event()  # memcached answered the command to withhold
        self._answered.set()
        self._settled = threading.Event()  # cleared from the withheld command to its answer
        self._settled.set()
        self.connections: list[Connection] = []
        self._withhold: bytes | None = None
        self._withholds = 0  # calls of withhold(): a previous one's late close sets nothing
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)

    @property
    def spec(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def __enter__(self) -> Proxy:
        self._acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.drop_connections()
        self._acceptor.join(timeout=5)

    def drop_connections(self) -> None:
        """Close every open connection (both sides), as a network cut does."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def forget(self) -> None:
        """Empty the records; open (pooled) connections keep being recorded from here on.

        Call it between requests only: a record then starts at a command boundary.
        """
        with self._lock:
            for connection in self.connections:
                connection.sent.clear()
                connection.received.clear()
                connection.round_trips = 0

    def sent(self) -> list[bytes]:
        """What each connection sent to memcached so far."""
        with self._lock:
            return [bytes(c.sent) for c in self.connections]

    def received(self) -> list[bytes]:
        with self._lock:
            return [bytes(c.received) for c in self.connections]

    def withhold(self, command: bytes) -> None:
        """Drop the replies on the connection of the next command starting with ``command``.

        Once: the command after it is forwarded normally.  The connection's
        replies stay dropped until the client gives up and closes it.
        """
        with self._lock:
            self._withhold = command
            self._withholds += 1
            self._answered.clear()

    def wait_withheld_answered(self, timeout: float = 30) -> bool:
        """Wait until memcached answered the withheld command (so it has applied it).

        The proxy may forward that command after the client gave up on it (a busy
        machine runs its threads late): this waits for it to be sent and answered.
        """
        return self._answered.wait(timeout)

    @property
    def withheld(self) -> int:
        """How many connections had a reply withheld."""
        with self._lock:
            return sum(c.holding for c in self.connections)

    @property
    def round_trips(self) -> int:
        """Round trips on every connection since the proxy started (or :meth:`forget`)."""
        with self._lock:
            return sum(c.round_trips for c in self.connections)

    @property
    def cuts(self) -> int:
        with self._lock:
            return sum(c.cut for c in self.connections)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()  # upstream down: the client sees a closed connection
                continue
            server.settimeout(None)
            record = Connection()
            with self._lock:
                self.connections.append(record)
                self._sockets += [client, server]
            for source, target, upstream in ((client, server, True), (server, client, False)):
                threading.Thread(
                    target=self._pump,
                    args=(source, target, record, upstream),
                    name="proxy-pump",
                    daemon=True,
                ).start()

    def _mark_withheld(self, record: Connection, data: bytes) -> None:
        # Marked before the command is forwarded, so its reply cannot overtake the mark.
        # Clients send one request and read its reply before the next, so a
        # command starts a chunk.
        with self._lock:
            if self._withhold is not None and data.startswith(self._withhold):
                self._withhold = None
                record.holding = True
                record.withheld_by = self._withholds
                self._settled.clear()

    def _settle(self, record: Connection) -> None:
        """The withheld command on ``record`` was answered (or its connection closed).

        Once per connection; and only the latest withheld command's answer is waited
        for: an earlier one's connection closing late (a busy machine runs this thread
        late) is no answer to the command withheld since.
        """
        with self._lock:
            if record.settled:
                return
            record.settled = True
            self._settled.set()
            if record.withheld_by == self._withholds:
                self._answered.set()

    def _pump(
        self, source: socket.socket, target: socket.socket, record: Connection, upstream: bool
    ) -> None:
        buffer = record.sent if upstream else record.received
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    if upstream:
                        self.client_closed.set()
                    break
                if upstream:
                    self._mark_withheld(record, data)
                    if not record.holding:
                        # A busy machine may run this thread before the one forwarding a
                        # withheld command: nothing overtakes that command's answer.
                        self._settled.wait(30)
                    with self._lock:
                        if record.answered:
                            record.round_trips += 1
                            record.answered = False
                else:
                    with self._lock:
                        record.answered = True
                if not upstream and record.holding:
                    record.held += len(data)
                    self._settle(record)
                    continue
                if not upstream and self.delay:
                    time.sleep(self.delay)
                if not upstream and self.gate is not None:
                    self.gate.wait(30)
                limit = None if upstream else self.cut_after
                if limit is not None and len(buffer) + len(data) >= limit:
                    data = data[: max(limit - len(buffer), 0)]
                    buffer += data
                    target.sendall(data)
                    record.cut = True
                    break
                buffer += data
                target.sendall(data)
        except OSError:
            pass
        finally:
            if upstream and record.holding:
                # The client gave up: memcached still reads and answers what was forwarded
                # (the answer is dropped), then closes, which ends the other pump.
                with contextlib.suppress(OSError):
                    source.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    target.shutdown(socket.SHUT_WR)
            else:
                if not upstream and record.holding:
                    self._settle(record)  # closed unanswered: nothing left to wait for
                for sock in (source, target):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def proxied(upstream_port: int) -> Iterator[Proxy]:
    with Proxy(upstream_port) as proxy:
        yield proxy
