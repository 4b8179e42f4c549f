"""Looking first: the compiled exchange keeps the GIL when a reply is there at once.

While a process's near cache answers most of its reads, ``Reader.request`` (io.c) sends
without waiting, holding the GIL, and takes a reply already there (docs/near.md, "Threads and
the GIL").  Each socket-pair test here runs both ways (the ``looking`` fixture forces it);
test_compiled.py's socket-pair tests run both ways too.  The judged tests drive the
process's own judgement through near reads.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_mcpatterns.core.protocol import compiled
from django_mcpatterns.core.protocol.reader import Reader as PureReader
from django_mcpatterns.core.wire import Get, Store, Touch
from tests.core.test_compiled import serve

pytestmark = pytest.mark.skipif(
    compiled.speedups is None, reason=f"the compiled path is not built: {compiled.why_pure}"
)
CReader: Any = compiled.speedups.Reader if compiled.speedups is not None else None


# conftest's pair, with a 2 s bound on each call: these tests interrupt calls with signals
# and feed replies slowly.
PAIR_TIMEOUT = 2.0


@pytest.fixture
def alarm() -> Iterator[list[int]]:
    """SIGALRM every 2 ms (the main thread's system calls see EINTR); handler calls counted."""
    calls: list[int] = []
    old = signal.signal(signal.SIGALRM, lambda *_: calls.append(1))
    signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
    yield calls
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    signal.signal(signal.SIGALRM, old)


# -- the exchange, both ways ---------------------------------------------------------------


def test_a_reply_there_before_its_request_is_read_at_once(pair: Any) -> None:
    """A reply found at once (the path that keeps the GIL) is read as an awaited one."""
    ours, theirs = pair
    theirs.sendall(b"STORED\r\n")
    assert CReader().request(ours.fileno(), Store("set", b"k", b"v"), 5.0) == b"STORED"
    assert theirs.recv(100) == b"set k 0 0 1\r\nv\r\n"


def test_a_reply_partly_there_at_once_is_awaited_for_the_rest(pair: Any) -> None:
    ours, theirs = pair
    reply = b"VALUE a 3 5 9\r\nhello\r\nVALUE b 0 0 1\r\n\r\nEND\r\n"
    theirs.sendall(reply[:20])
    thread = serve(theirs, b"gets a b\r\n", [reply[20:]])
    got = CReader().request(ours.fileno(), Get((b"a", b"b"), cas=True), 5.0)
    thread.join()
    assert got == PureReader(reply).values((b"a", b"b"), True)


def test_replies_there_or_not_alike_are_read_the_same(pair: Any) -> None:
    """Replies mostly awaited make a connection look first only once in a while; the
    replies it finds there are then read on the awaiting path, and the other way round."""
    ours, theirs = pair
    reader = CReader()
    for i in range(80):
        if i % 10 < 8:
            thread = serve(theirs, b"touch k 0\r\n", [b"TOUCHED\r\n"])
        else:
            theirs.sendall(b"TOUCHED\r\n")
            thread = serve(theirs, b"touch k 0\r\n", [])
        assert reader.request(ours.fileno(), Touch(b"k"), 5.0) == b"TOUCHED"
        thread.join()


def test_a_large_reply_there_at_once_is_read_whole(pair: Any) -> None:
    """More than try_first's 64 KiB already buffered: the rest read by read_reply."""
    ours, theirs = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    value = bytes(range(256)) * 600  # 150 KiB
    reply = b"VALUE a 7 %d\r\n%s\r\nEND\r\n" % (len(value), value)
    sender = threading.Thread(target=theirs.sendall, args=(reply,))
    sender.start()
    time.sleep(0.05)  # buffered before the request goes (as much as fits)
    got = CReader().request(ours.fileno(), Get((b"a",)), 5.0)
    sender.join()
    assert theirs.recv(100) == b"get a\r\n"
    assert got == PureReader(reply).values((b"a",), False)


def test_signals_while_a_large_set_is_sent_lose_no_byte(pair: Any, alarm: list[int]) -> None:
    """Sends interrupted by signals (a request this large never looks first: its reply
    cannot be there when its send returns): the peer gets it exactly once, in order."""
    ours, theirs = pair
    request = Store("set", b"k", os.urandom(8 << 20))
    expect = request.encode()
    got = bytearray()

    def peer() -> None:
        while len(got) < len(expect):
            time.sleep(0.0005)  # slow: the sender blocks, and is interrupted
            got.extend(theirs.recv(1 << 16))
        theirs.sendall(b"STORED\r\n")

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    assert CReader().request(ours.fileno(), request, 60.0) == b"STORED"
    thread.join()
    assert bytes(got) == expect
    assert alarm  # the handler ran


def test_signals_while_a_reply_is_awaited_lose_no_byte(pair: Any, alarm: list[int]) -> None:
    ours, theirs = pair
    reply = b"VALUE a 3 5 9\r\nhello\r\nVALUE b 0 0 1\r\n\r\nEND\r\n"

    def peer() -> None:
        theirs.recv(100)
        for c in reply:
            time.sleep(0.003)
            theirs.sendall(bytes([c]))

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    got = CReader().request(ours.fileno(), Get((b"a", b"b"), cas=True), 30.0)
    thread.join()
    assert got == PureReader(reply).values((b"a", b"b"), True)
    assert alarm


def test_a_signal_handler_raising_leaves_the_reader_usable(pair: Any) -> None:
    ours, theirs = pair
    old = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        reader = CReader()
        with pytest.raises(KeyboardInterrupt):
            reader.request(ours.fileno(), Get((b"a",)), 5.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert theirs.recv(100) == b"get a\r\n"
    theirs.sendall(b"END\r\n")  # the abandoned reply: a connection the pool destroys
    fresh, peer = socket.socketpair()
    try:
        peer.sendall(b"TOUCHED\r\n")
        assert reader.request(fresh.fileno(), Touch(b"k"), 5.0) == b"TOUCHED"
    finally:
        fresh.close()
        peer.close()


def test_a_peer_that_shut_its_side_is_a_closed_connection(pair: Any) -> None:
    ours, theirs = pair
    theirs.shutdown(socket.SHUT_WR)  # its FIN is there before our request goes
    with pytest.raises(compiled.ConnectionClosedError):
        CReader().request(ours.fileno(), Touch(b"k"), 5.0)


def test_a_peer_gone_is_the_same_error_both_ways(pair: Any) -> None:
    ours, theirs = pair
    theirs.close()
    with pytest.raises(BrokenPipeError):
        CReader().request(ours.fileno(), Touch(b"k"), 5.0)


def test_a_reset_tcp_peer_is_the_same_error_both_ways(looking: bool) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    ours = socket.create_connection(listener.getsockname())
    theirs, _ = listener.accept()
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    theirs.close()  # RST
    listener.close()
    time.sleep(0.05)
    try:
        with pytest.raises(ConnectionResetError):
            CReader().request(ours.fileno(), Touch(b"k"), 5.0)
    finally:
        ours.close()


# -- the judgement: the near cache's reads ------------------------------------------------


@pytest.fixture
def judged() -> Iterator[None]:
    """The process's judgement from scratch (no near read counted yet), restored after."""
    compiled.speedups.look_first(None)
    yield
    compiled.speedups.look_first(None)


def near_reads(hits: int, misses: int) -> None:
    """``hits`` reads a near table answers and ``misses`` it does not (the store's)."""
    from django_mcpatterns.core.memory import MemoryStore
    from django_mcpatterns.core.near import NearOptions, NearStore, NearTable

    store = MemoryStore()
    near = NearStore(store, NearTable(NearOptions(max_age=3600)))
    store.set("hot", "v")
    assert near.get("hot") == "v"  # a miss, held from now on
    for _ in range(hits):
        assert near.get("hot") == "v"
    for i in range(misses - 1):
        assert near.get(f"cold:{i}") is None


def round_trips_without_near_reads(requests: int) -> None:
    """``requests`` compiled round trips on a socket pair, and no near read meanwhile."""
    ours, theirs = socket.socketpair()

    def server() -> None:
        for _ in range(requests):
            got = b""
            while not got.endswith(b"\r\n"):
                got += theirs.recv(100)
            theirs.sendall(b"TOUCHED\r\n")

    thread = threading.Thread(target=server, daemon=True)
    thread.start()
    reader = CReader()
    try:
        for _ in range(requests):
            assert reader.request(ours.fileno(), Touch(b"k"), 5.0) == b"TOUCHED"
    finally:
        thread.join(5)
        ours.close()
        theirs.close()


def test_a_process_looks_first_while_its_near_cache_answers_most_reads(judged: None) -> None:
    assert compiled.speedups.look_first() is False  # nothing judged: the GIL is released
    near_reads(hits=700, misses=400)  # one window of 1024 reads, 2 in 3 answered near
    assert compiled.speedups.look_first() is True
    near_reads(hits=400, misses=700)  # the next: most go to memcached
    assert compiled.speedups.look_first() is False


def test_a_process_stops_looking_first_once_its_near_cache_is_no_longer_read(
    judged: None,
) -> None:
    """Looking first, then thousands of requests and no near read (a batch job of plain
    writes in a process that served near hits): the exchange releases the GIL again."""
    near_reads(hits=1100, misses=1)
    assert compiled.speedups.look_first() is True
    round_trips_without_near_reads(8200)  # more than io.c's QUIET_REQUESTS
    assert compiled.speedups.look_first() is False


def test_look_first_takes_a_flag_or_none() -> None:
    with pytest.raises(TypeError):
        compiled.speedups.look_first(True, False)
    try:
        assert compiled.speedups.look_first(True) is True
        assert compiled.speedups.look_first(False) is False
    finally:
        assert compiled.speedups.look_first(None) is False


def test_a_forked_child_judges_from_its_own_reads(judged: None) -> None:
    """A forked child's near tables start empty, and so does its judgement (a preforking
    server's worker forked from a parent that served near hits)."""
    near_reads(hits=1100, misses=1)
    assert compiled.speedups.look_first() is True
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, b"1" if compiled.speedups.look_first() else b"0")
        os._exit(0)
    os.close(w)
    said = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert said == b"0"


def test_a_judgement_is_made_of_recent_reads(judged: None) -> None:
    """Looking first ended by 8,192 requests without a judgement (fewer than 1,024 near
    reads): the next judgement is of the reads made after, not of the hits counted before."""
    near_reads(hits=1100, misses=1)  # judged: looking (window restarted, 77 hits counted)
    near_reads(hits=940, misses=1)  # 941 more: 1017 hits in the open window
    assert compiled.speedups.look_first() is True
    round_trips_without_near_reads(8200)
    assert compiled.speedups.look_first() is False  # quiet: stopped
    near_reads(hits=0, misses=10)  # ten near reads, all missed
    assert compiled.speedups.look_first() is False  # not 1017 old hits of 1024


def test_a_connection_whose_replies_are_never_there_at_once_reads_the_same(
    judged: None,
) -> None:
    """Judged (not forced): replies awaited request after request make a connection look
    first only once in 16; replies then there before their request are read on the
    releasing path, and the connection looks again as they keep coming at once."""
    near_reads(hits=1100, misses=1)
    assert compiled.speedups.look_first() is True
    ours, theirs = socket.socketpair()
    reader = CReader()
    try:
        for i in range(120):
            if i < 40 or i >= 80:  # answered after the request arrived
                thread = serve(theirs, b"touch k 0\r\n", [b"TOUCHED\r\n"])
            else:  # there before the request goes
                theirs.sendall(b"TOUCHED\r\n")
                thread = serve(theirs, b"touch k 0\r\n", [])
            assert reader.request(ours.fileno(), Touch(b"k"), 5.0) == b"TOUCHED"
            thread.join()
    finally:
        ours.close()
        theirs.close()
