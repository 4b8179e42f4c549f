"""The sync transport (core/transport.py) and Cluster.exchange, against real memcached."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import NodeUnavailableError, ProtocolError
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.transport import (
    Connection,
    ConnectionClosedError,
    Pool,
    SocketOptions,
)
from django_mcpatterns.core.wire import (
    ErrorReply,
    Get,
    MetaArithmetic,
    MetaGet,
    MetaNoop,
    MetaSet,
    Store,
)
from tests.harness import LOOPBACK, MemcachedServer, cluster_on, free_port


@pytest.fixture
def three(memcached_3: list[MemcachedServer]) -> Iterator[Cluster]:
    with cluster_on(memcached_3) as cluster:
        yield cluster


def test_a_connection_sets_tcp_nodelay_and_its_timeouts(
    memcached_1: list[MemcachedServer],
) -> None:
    conn = Connection((LOOPBACK, memcached_1[0].port), SocketOptions(timeout=2.5))
    sock = conn.connect()
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    # The kernel enforces the I/O timeout on a blocking socket (one system call per read).
    assert sock.gettimeout() is None
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        seconds, micros = struct.unpack("@ll", sock.getsockopt(socket.SOL_SOCKET, option, 16))
        assert seconds + micros / 1e6 == 2.5
    assert conn.exchange([Store("set", b"t:k", b"v"), Get([b"t:k"])])[0] == b"STORED"
    conn.close()
    assert conn.sock is None


def test_a_server_that_never_answers_times_out_as_a_timeout_error() -> None:
    """A silent server costs the configured timeout, then TimeoutError (an OSError)."""
    listener = socket.create_server((LOOPBACK, 0))
    conn = Connection(listener.getsockname(), SocketOptions(timeout=0.2))
    try:
        with pytest.raises(TimeoutError, match="timed out"):
            conn.request(Get([b"t:k"]))
    finally:
        conn.close()
        listener.close()


def test_a_server_trickling_its_reply_times_out_within_the_timeout() -> None:
    """The timeout bounds the whole reply, not each receive: a byte every 0.1 s is not an answer."""
    listener = socket.create_server((LOOPBACK, 0))
    done = threading.Event()

    def serve() -> None:
        peer, _ = listener.accept()
        peer.recv(1024)
        for byte in b"VALUE t:k 0 40\r\n" + b"x" * 40 + b"\r\nEND\r\n":
            if done.is_set():
                break
            with contextlib.suppress(OSError):
                peer.sendall(bytes([byte]))
            time.sleep(0.1)
        peer.close()

    thread = threading.Thread(target=serve)
    thread.start()
    conn = Connection(listener.getsockname(), SocketOptions(timeout=0.3))
    try:
        # A timeout per receive would never fire (a byte comes every 0.1 s): the whole
        # value would arrive after 6 s.
        with pytest.raises(TimeoutError, match="timed out"):
            conn.request(Get([b"t:k"]))
    finally:
        done.set()
        conn.close()
        thread.join()
        listener.close()


def test_a_reply_cut_short_is_a_closed_connection_never_data() -> None:
    """A server that closes mid-value: ConnectionClosedError (an OSError), not a short value."""
    listener = socket.create_server((LOOPBACK, 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        peer, _ = listener.accept()
        peer.recv(1024)
        peer.sendall(b"VALUE k 0 10\r\nabc")
        peer.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        conn = Connection((LOOPBACK, port), SocketOptions())
        with pytest.raises(ConnectionClosedError):
            conn.request(Get([b"k"]))
        conn.close()
    finally:
        thread.join()
        listener.close()


def test_bytes_after_the_reply_are_a_protocol_error(memcached_1: list[MemcachedServer]) -> None:
    conn = Connection((LOOPBACK, memcached_1[0].port), SocketOptions())
    conn.send(b"version\r\n")  # its reply arrives before the next one's
    with pytest.raises(ProtocolError):
        conn.receive([MetaNoop()])
    conn.close()


def test_the_pool_reuses_caps_and_expires_connections() -> None:
    now = [0.0]
    made: list[Connection] = []

    def make() -> Connection:
        made.append(Connection((LOOPBACK, free_port()), SocketOptions()))
        return made[-1]

    pool = Pool(make, max_size=2, idle_timeout=10, clock=lambda: now[0])
    a = pool.get()
    b = pool.get()
    with pytest.raises(RuntimeError):
        pool.get()  # two in use: the cap
    pool.release(a)
    assert pool.get() is a  # reused
    pool.release(a)
    pool.destroy(b)
    assert pool.used == ()
    now[0] = 11.0  # a idled past idle_timeout: replaced
    assert pool.get() is not a
    assert len(made) == 3


def test_exchange_sends_meta_commands_to_the_keys_server(
    three: Cluster, memcached_3: list[MemcachedServer]
) -> None:
    replies = three.exchange(
        "x:counter",
        [
            MetaArithmetic(b"x:counter", vivify=0, initial=10, value=True),
            MetaSet(b"x:other", data=b"1", quiet=True, opaque=b"1"),
            MetaNoop(),
        ],
    )
    assert replies is not None
    assert [r.status for r in replies] == [b"VA", b"HD", b"MN"]
    assert replies[0].data == b"10"
    (hit,) = three.exchange("x:counter", [MetaGet(b"x:counter", value=True, ttl=True)]) or []
    assert (hit.data, hit.ttl) == (b"10", -1)
    assert three.incr("x:counter", 5) == 15  # the same server as the text commands


def test_exchange_returns_error_replies_for_the_caller(three: Cluster) -> None:
    (reply,) = three.exchange("x:k", [MetaArithmetic(b"x:k", extra=(b"Zbogus",))]) or [None]
    assert isinstance(reply, ErrorReply)
    assert reply.kind == "CLIENT_ERROR"


def test_exchange_degrades_or_raises_when_the_server_is_unusable() -> None:
    dead = f"{LOOPBACK}:{free_port()}"
    cluster = Cluster([dead], ClusterOptions(retry_attempts=1))
    assert cluster.exchange("k", [MetaGet(b"k")]) is None
    with pytest.raises(NodeUnavailableError):
        cluster.strict().exchange("k", [MetaGet(b"k")])


def test_ttl_reads_the_meta_reply(three: Cluster) -> None:
    three.set("x:ttl", 1, 100)
    three.set("x:forever", 1)
    ttl = three.ttl("x:ttl")
    assert ttl is not None
    assert 98 <= ttl <= 100
    assert three.ttl("x:forever") == -1
    assert three.ttl("x:missing") is None
