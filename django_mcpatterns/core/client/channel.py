"""The asyncio transport: one pipelined connection per server and event loop.

A :class:`Channel` is an :class:`asyncio.Protocol` on one connection.  Every
caller's requests are queued in order and written together once per loop
iteration; replies are parsed by the sans-IO :class:`~.wire.Reader` as bytes
arrive (``data_received``) and handed to the callers' futures in the same
order.  So:

Pipelining
    Fifty tasks' commands issued in one iteration leave in one ``send`` and
    cost one round trip, writes included.
Auto-batching
    Reads by key (:meth:`Channel.fetch`) issued in one iteration join one
    ``get``/``gets`` request (a *batch*), written in the queue's order.  A key
    already in a batch not yet answered is not asked for again: its callers
    share that batch's reply (each deserialises its own copy).  The reply of a
    batch is parsed before any later reply, so a read never misses a write
    that completed before it was issued.  A write answered on another
    connection of this process may postdate a batch on the wire: once any
    request was answered since a batch was written
    (:data:`.transport.completed`), new reads do not share it.
Cancellation
    The channel, not the caller, reads every reply: a cancelled caller's
    future is simply dropped when its reply arrives, so the connection is
    never left mid-reply and every later caller gets its own reply.  Each
    caller waits on a future of its own: one cancelled caller never cancels a
    batch others share.
Timeouts
    The request at the head of the queue must be answered within ``timeout``
    seconds of becoming the head (a whole reply, as the sync transport bounds
    it); otherwise the server is stalled and the channel fails every request
    it holds (their outcome is unknown: they were sent).  One timer per
    channel, re-armed only when it fires, so a reply costs no timer.
Failures
    A reply the requests cannot get, bytes nobody asked for, a closed
    connection or a timeout fail the channel: every waiting caller gets the
    error and the channel is never used again (:attr:`Channel.broken`).
    Requests not yet written get :class:`NotSentError` instead: their outcome
    is certain (not applied), where the written ones' is unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Sequence
from typing import Any

from ..protocol.compiled import Reader, encode
from ..protocol.compiled import resolve as resolve_all
from ..protocol.wire import NEED_DATA, ErrorReply, Get, Request, Value
from . import epochs
from .transport import (
    ConnectionClosedError,
    SocketOptions,
    completed,
    stamp_completed,
    tune_tcp,
)

__all__ = ["Batch", "Channel", "NotSentError", "open_channel"]


class NotSentError(ConnectionClosedError):
    """The channel failed before these requests were written: certainly not applied."""


class _Item:
    """Requests written together, their replies, and the futures waiting for them."""

    __slots__ = ("data", "replies", "requests", "waiters")

    def __init__(self, requests: Sequence[Request[Any]]) -> None:
        self.requests = requests
        # Encoded now, by the caller: a request that cannot be raises to it.
        self.data = _encode(requests) if requests else b""
        self.replies: list[Any] = []
        self.waiters: list[asyncio.Future[Any]] = []

    def resolve(self) -> None:
        replies = self.replies
        for waiter in self.waiters:
            if not waiter.done():  # a cancelled caller's future is dropped
                waiter.set_result(replies)

    def fail(self, exc: BaseException) -> None:
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_exception(exc)


class Batch(_Item):
    """One ``get``/``gets`` for the keys read in one loop iteration; its reply by key.

    Open (keys may join) until the channel writes it at the end of the
    iteration; then in flight until its reply is parsed.
    """

    __slots__ = ("cas", "keys", "read", "sent_under", "values")

    def __init__(self, read: Get | None = None) -> None:
        # _Item's fields set here, not through super(): a batch is made per loop iteration.
        self.requests: Sequence[Request[Any]] = ()
        self.data = b""
        self.replies = []
        self.waiters = []
        self.keys: dict[bytes, None] = {}  # an ordered set
        self.cas = False
        self.values: dict[bytes, Value] = {}
        self.sent_under = -1  # the completion stamp when written; -1: open
        self.read = read  # the first caller's own get, sent as it is if no key joins

    def joinable(self, cas: bool) -> bool:
        """Whether a read of one of its keys, issued now, may share its reply.

        Open: yes.  Written: only if no request was answered in this process
        since (on another connection, a write answered then may postdate it).
        """
        if cas and not self.cas:
            return False
        return self.sent_under < 0 or self.sent_under == completed[0]

    def seal(self) -> None:
        self.sent_under = completed[0]
        read = self.read
        if read is None or len(self.keys) != len(read.keys) or read.cas != self.cas:
            read = Get(list(self.keys), self.cas)
        self.requests = (read,)
        self.data = read.encode()  # keys of placed(): valid bytes

    def resolve(self) -> None:
        (reply,) = self.replies
        if type(reply) is list:
            self.values = {value.key: value for value in reply}
        # An ErrorReply: each caller judges it.  A cancelled caller's waiter is dropped.
        resolve_all(self.waiters, self if type(reply) is list else reply)


def _encode(requests: Sequence[Request[Any]]) -> bytes:
    return encode(requests)


class Channel(asyncio.Protocol):
    """One connection to one server, used by every task of one event loop (see module)."""

    # Slots: the compiled get reads a channel's fields at their slots (src/speedups/trip.c).
    __slots__ = (
        "__weakref__",
        "_close_when_idle",
        "_flush_scheduled",
        "_head_since",
        "_in_flight",
        "_open_batch",
        "_out",
        "_queue",
        "_reader",
        "_timer",
        "broken",
        "loop",
        "timeout",
        "transport",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float | None) -> None:
        self.loop = loop
        self.timeout = timeout
        self.transport: asyncio.Transport | None = None
        self.broken: BaseException | None = None
        self._reader = Reader()
        self._queue: deque[_Item] = deque()  # written or about to be, in order
        self._out: list[_Item] = []  # queued this iteration, not written yet
        self._open_batch: Batch | None = None
        self._in_flight: dict[bytes, Batch] = {}  # key -> the newest batch asking for it
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._head_since = 0.0  # when the head of the queue became the head
        self._close_when_idle = False

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.broken is None:
            closed = ConnectionClosedError("memcached closed the connection mid-reply")
            if exc is not None:
                closed.__cause__ = exc
            self._fail(closed)

    def eof_received(self) -> bool:
        return False  # close the transport: memcached never half-closes

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        queue = self._queue
        try:
            while queue:
                item = queue[0]
                replies = item.replies
                requests = item.requests
                while len(replies) < len(requests):
                    reply = requests[len(replies)].read(reader)
                    if reply is NEED_DATA:
                        return
                    replies.append(reply)
                queue.popleft()
                self._head_since = self.loop.time()
                if type(item) is Batch:
                    self._forget(item)
                else:
                    stamp_completed()  # a write, maybe: fetches on the wire are not shared
                item.resolve()
            reader.drained()  # bytes nobody asked for: out of step
        except Exception as exc:  # ProtocolError, or a bug: never read on out of step
            self._fail(exc)
            return
        if self._close_when_idle and not self._out:
            self.close()

    # -- sending --

    @property
    def idle(self) -> bool:
        return not self._queue and not self._out

    def submit(self, requests: Sequence[Request[Any]]) -> asyncio.Future[list[Any]]:
        """Queue ``requests`` (written together); the future gets their replies."""
        item = _Item(requests)
        waiter: asyncio.Future[list[Any]] = self.loop.create_future()
        item.waiters.append(waiter)
        self._enqueue(item)
        return waiter

    def fetch_one(
        self, kb: bytes, cas: bool, read: Get | None = None
    ) -> asyncio.Future[Batch | ErrorReply]:
        """:meth:`fetch` of one key (the hot path of ``get``); ``read``: the caller's request."""
        batch = self._in_flight.get(kb)
        # batch.joinable(cas), inlined: the hot path of every get
        if (
            batch is None
            or (cas and not batch.cas)
            or (batch.sent_under >= 0 and batch.sent_under != completed[0])
        ):
            batch = self._open_batch
            if batch is None:
                batch = self._open_batch = Batch(read)
                self._enqueue(batch)
            else:
                batch.read = None  # another caller's key joins: the batch's own get is sent
            batch.keys[kb] = None
            self._in_flight[kb] = batch
            if cas:
                batch.cas = True
        waiter: asyncio.Future[Batch | ErrorReply] = self.loop.create_future()
        batch.waiters.append(waiter)
        return waiter

    def fetch(
        self, kbs: Sequence[bytes], cas: bool, read: Get | None = None
    ) -> list[asyncio.Future[Batch | ErrorReply]]:
        """Futures of the batches that will answer ``kbs`` (one, usually).

        A key in a batch not yet answered (asking for cas tokens if ``cas``)
        joins it; the others join this iteration's open batch.  ``read``: the
        caller's request for ``kbs``, sent as it is by a batch of those keys only.
        """
        in_flight = self._in_flight
        batches: dict[int, Batch] = {}
        opened = self._open_batch  # the open batch before this call, if any
        for kb in kbs:
            batch = in_flight.get(kb)
            if batch is None or not batch.joinable(cas):
                batch = self._open_batch
                if batch is None:
                    batch = self._open_batch = Batch()
                    self._enqueue(batch)
                batch.keys[kb] = None
                in_flight[kb] = batch
            batches[id(batch)] = batch
        batch = self._open_batch
        if batch is not None and id(batch) in batches:
            if batch is opened:
                batch.read = None  # our keys join another caller's: its own get is sent
            elif len(batch.keys) == len(kbs):
                batch.read = read  # made for these keys, all of them: our get is sent
        if cas and self._open_batch is not None and id(self._open_batch) in batches:
            self._open_batch.cas = True
        futures: list[asyncio.Future[Batch | ErrorReply]] = []
        for batch in batches.values():
            waiter: asyncio.Future[Any] = self.loop.create_future()
            batch.waiters.append(waiter)
            futures.append(waiter)
        return futures

    def _enqueue(self, item: _Item) -> None:
        if self.broken is not None:
            raise NotSentError(f"not sent: the connection failed ({self.broken!r})")
        self._out.append(item)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Write everything queued this iteration in one ``send`` (the batches sealed)."""
        self._flush_scheduled = False
        self._open_batch = None
        out = self._out
        if self.broken is not None or not out:
            return  # failed already: _fail answered every caller
        try:
            assert self.transport is not None  # connected before the first request
            parts = []
            for item in out:
                if type(item) is Batch:
                    item.seal()
                parts.append(item.data)
            data = b"".join(parts) if len(parts) > 1 else parts[0]
        except Exception as exc:  # a bug: fail the callers rather than leave them waiting
            self._fail(exc)
            return
        self._out = []
        if not self._queue:
            self._head_since = self.loop.time()
        self._queue.extend(out)
        self.transport.write(data)
        if self._timer is None and self.timeout:
            self._timer = self.loop.call_at(self._head_since + self.timeout, self._check_deadline)

    def _forget(self, batch: Batch) -> None:
        in_flight = self._in_flight
        for kb in batch.keys:
            if in_flight.get(kb) is batch:
                del in_flight[kb]

    # -- timeouts and failures --

    def _check_deadline(self) -> None:
        self._timer = None
        if not self._queue or self.broken is not None or not self.timeout:
            return
        deadline = self._head_since + self.timeout
        if self.loop.time() >= deadline:
            self._fail(TimeoutError("timed out"))
        else:
            self._timer = self.loop.call_at(deadline, self._check_deadline)

    def _fail(self, exc: BaseException) -> None:
        """Fail every request held and close the connection: it is never used again."""
        if self.broken is not None:
            return
        self.broken = exc
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        written, unsent = list(self._queue), self._out
        self._queue.clear()
        self._out = []
        self._open_batch = None
        self._in_flight.clear()
        if self.transport is not None:
            self.transport.abort()
        for item in written:
            item.fail(exc)
        if unsent:
            not_sent = NotSentError(f"not sent: the connection failed first ({exc!r})")
            not_sent.__cause__ = exc
            for item in unsent:
                item.fail(not_sent)

    def fail(self, exc: BaseException) -> None:
        """Give up on this connection (a caller found its reply out of step)."""
        self._fail(exc)

    def abandon(self) -> None:
        """End the connection of a loop that was closed without closing it (this process's).

        The transport cannot be closed without its loop; shutting the socket
        down ends the connection now, and garbage collection frees the rest.
        """
        self.broken = self.broken or ConnectionClosedError("its event loop was closed")
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close now if idle, else once every request held is answered."""
        if self.idle:
            if self.broken is None:
                self.broken = ConnectionClosedError("the connection is closed")
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                if self.transport is not None:
                    self.transport.close()
        else:
            self._close_when_idle = True


class HeldLoopTimeout:
    """:func:`asyncio.timeout` that does not count the time its event loop was held.

    A loop held past the deadline by a slow callback (or a process the OS did not
    run) wakes with the deadline's timer and the connect's completion due at once,
    and runs the timer first: :func:`asyncio.timeout` would cancel a connection the
    kernel had made.  A timer that fires late (by more than a tenth of the timeout)
    gives the awaited work the time the loop was held, at most one more timeout and
    at most :attr:`EXTENSIONS` times; a timer on time, or the last, expires.
    """

    EXTENSIONS = 3

    __slots__ = ("_extensions", "_handle", "_loop", "_seconds", "_timeout", "_when")

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._timeout = asyncio.timeout(None)
        self._handle: asyncio.TimerHandle | None = None
        self._extensions = 0
        self._when = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> HeldLoopTimeout:
        await self._timeout.__aenter__()
        self._loop = loop = asyncio.get_running_loop()
        if self._seconds is not None:
            self._arm(loop.time() + self._seconds)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        await self._timeout.__aexit__(*exc_info)

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        self._when = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        assert self._loop is not None
        assert self._seconds is not None
        self._handle = None
        now = self._loop.time()
        held = now - self._when
        if held > self._seconds / 10 and self._extensions < self.EXTENSIONS:
            self._extensions += 1
            self._arm(now + min(held, self._seconds))
        else:
            self._timeout.reschedule(now)  # expires: the awaited work is cancelled


async def open_channel(address: str | tuple[str, int], options: SocketOptions) -> Channel:
    """Connect to ``address`` within ``options.connect_timeout``, not counting time the
    loop was held (:class:`HeldLoopTimeout`); nothing is sent."""
    loop = asyncio.get_running_loop()
    channel = Channel(loop, options.timeout)
    async with HeldLoopTimeout(options.connect_timeout):
        if isinstance(address, str):
            await loop.create_unix_connection(lambda: channel, address)
        else:
            host, port = address
            await loop.create_connection(
                lambda: channel,
                host,
                port,
                ssl=options.tls_context,
                server_hostname=host if options.tls_context is not None else None,
            )
    transport = channel.transport
    assert transport is not None
    sock = transport.get_extra_info("socket")
    if sock is not None and not isinstance(address, str):
        tune_tcp(sock, socket, options)
    epochs.opened(address)
    return channel
