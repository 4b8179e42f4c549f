"""The compiled hot path answers as the pure-Python one: same replies, same errors, same bytes.

Both readers are fed the same byte streams, split at random points, replies valid and
corrupted; both encoders get the same requests.  The compiled I/O (send, receive and
parse with the GIL released) is run on socket pairs for what a server cannot be made
to do on demand: a reply trickled byte by byte, a connection closed mid-reply, a stall.
The contract suites run it against real memcached (and, in CI's second leg, the pure
path with ``DJANGO_MCPATTERNS_PURE_PYTHON=1``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_mcpatterns.core.exceptions import ProtocolError
from django_mcpatterns.core.keys import Routed
from django_mcpatterns.core.protocol import compiled
from django_mcpatterns.core.protocol.reader import MAX_VALUE_LENGTH
from django_mcpatterns.core.protocol.reader import Reader as PureReader
from django_mcpatterns.core.values.envelope import STALE, Envelope, with_envelopes
from django_mcpatterns.core.values.refusals import REFUSED
from django_mcpatterns.core.values.serde import SerdeOptions
from django_mcpatterns.core.wire import (
    NEED_DATA,
    Delete,
    FlushAll,
    Get,
    Incr,
    MetaArithmetic,
    MetaDelete,
    MetaGet,
    MetaNoop,
    MetaSet,
    Request,
    Stats,
    Store,
    Touch,
    Value,
    Version,
)


def test_the_compiled_path_is_built_where_ci_runs() -> None:
    """Under CI=true the compiled path must build and run (unless the pure leg asked)."""
    if os.environ.get("CI") != "true" or os.environ.get(compiled.PURE_SWITCH):
        pytest.skip("only CI requires the compiled path")
    assert compiled.COMPILED, f"the compiled path does not run: {compiled.why_pure}"


needs_compiled = pytest.mark.skipif(
    compiled.speedups is None, reason=f"the compiled path is not built: {compiled.why_pure}"
)
pytestmark = needs_compiled

CReader: Any = compiled.speedups.Reader if compiled.speedups is not None else None

# -- byte streams ----------------------------------------------------------------------

key_names = st.sampled_from([b"a", b"k1", b"key:2", b"x" * 40])
digits = st.integers(0, 2**32).map(lambda n: b"%d" % n)
junk = st.lists(
    st.sampled_from(
        [
            b"\r\n",
            b"\r",
            b"\n",
            b" ",
            b"  ",
            b"\t",
            b"VALUE",
            b"END",
            b"0",
            b"5",
            b"-1",
            b"a",
            b"k1",
            b"STORED",
            b"ERROR",
            b"SERVER_ERROR",
            b"CLIENT_ERROR x",
            b"VA",
            b"HD",
            b"EN",
            b"MN",
            b"c1",
            b"O7",
            b"STAT",
            b"VERSION",
            b"\xff",
        ]
    ),
    max_size=12,
).map(b"".join)


# around the longest value a reply may declare (memcached's 1 GiB item ceiling)
absurd_lengths = [MAX_VALUE_LENGTH, MAX_VALUE_LENGTH + 1, 9_999_999_999_999, 10**18, 10**19]


@st.composite
def value_block(draw: st.DrawFn, cas: bool) -> bytes:
    key = draw(key_names)
    data = draw(st.binary(max_size=70))
    size = (
        len(data)
        if draw(st.integers(0, 9))
        else draw(st.one_of(st.integers(0, 80), st.sampled_from(absurd_lengths)))
    )
    token = b" " + draw(digits) if cas else b""
    sep = draw(st.sampled_from([b" ", b" ", b" ", b"  ", b"\t"]))
    return b"VALUE " + key + sep + draw(digits) + b" %d" % size + token + b"\r\n" + data + b"\r\n"


@st.composite
def get_step(draw: st.DrawFn) -> tuple[Request[Any], bytes]:
    cas = draw(st.booleans())
    keys = draw(st.lists(key_names, min_size=1, max_size=4))
    blocks = draw(st.lists(value_block(cas), max_size=4))
    end = draw(
        st.sampled_from([b"END\r\n"] * 6 + [b"SERVER_ERROR out of memory\r\n", b"ERROR\r\n"])
    )
    return Get(tuple(keys), cas), b"".join(blocks) + end


line_replies = st.sampled_from(
    [
        b"STORED",
        b"NOT_STORED",
        b"EXISTS",
        b"NOT_FOUND",
        b"DELETED",
        b"TOUCHED",
        b"OK",
        b"ERROR",
        b"ERROR unknown command",
        b"CLIENT_ERROR bad data chunk",
        b"SERVER_ERROR",
        b"SERVER_ERRORx",
        b"SERVER_ERROR object too large for cache",
        b"42",
        b"007",
        b"",
        b"VERSION 1.6.18",
        b"VERSION ",
        b"MN",
        b"STORED ",
    ]
).map(lambda line: line + b"\r\n")


@st.composite
def line_step(draw: st.DrawFn) -> tuple[Request[Any], bytes]:
    request = draw(
        st.sampled_from(
            [
                Store("set", b"k", b"v"),
                Store("cas", b"k", b"v", cas_token=b"1"),
                Delete(b"k"),
                Touch(b"k", 5),
                Incr(b"k", 2),
                FlushAll(),
                Version(),
                MetaNoop(),
            ]
        )
    )
    return request, draw(line_replies)


@st.composite
def stats_step(draw: st.DrawFn) -> tuple[Request[Any], bytes]:
    lines = draw(
        st.lists(st.sampled_from([b"STAT pid 7", b"STAT a b c", b"STAT x", b"STAT "]), max_size=4)
    )
    end = draw(st.sampled_from([b"END", b"END", b"ERROR", b"STATS"]))
    return Stats(), b"".join(line + b"\r\n" for line in lines) + end + b"\r\n"


@st.composite
def meta_step(draw: st.DrawFn) -> tuple[Request[Any], bytes]:
    key = draw(key_names)
    quiet = draw(st.booleans())
    opaque = draw(st.sampled_from([None, b"7", b"x1"])) if not quiet else b"7"
    request = draw(
        st.sampled_from(
            [
                MetaGet(key, quiet=quiet, opaque=opaque, value=True, cas=True, client_flags=True),
                MetaSet(key, data=b"v", quiet=quiet, opaque=opaque),
                MetaDelete(key, quiet=quiet, opaque=opaque),
                MetaArithmetic(key, quiet=quiet, opaque=opaque, value=True),
                MetaGet(key, return_key=True),
            ]
        )
    )
    status = draw(st.sampled_from([b"VA", b"HD", b"EN", b"NS", b"EX", b"NF", b"MN", b"XX", b""]))
    flags = draw(
        st.lists(
            st.sampled_from(
                [
                    b"O7",
                    b"Ox1",
                    b"c12",
                    b"c-3",
                    b"cx",
                    b"f0",
                    b"t-1",
                    b"s5",
                    b"W",
                    b"Z",
                    b"X",
                    b"k" + key,
                    b"kother",
                    b"1z",
                    b"h",
                ]
            ),
            max_size=4,
        )
    )
    data = draw(st.binary(max_size=20))
    if status == b"VA":
        odd_sizes = [b"x", b"3", *(b"%d" % n for n in absurd_lengths)]
        size = b"%d" % len(data) if draw(st.integers(0, 5)) else draw(st.sampled_from(odd_sizes))
        head = b" ".join([status, size, *flags])
        return request, head + b"\r\n" + data + b"\r\n"
    return request, b" ".join([status, *flags]) + b"\r\n"


steps = st.lists(
    st.one_of(
        get_step(),
        line_step(),
        stats_step(),
        meta_step(),
        st.tuples(
            st.sampled_from([Get((b"a",)), Store("set", b"k", b"v"), MetaGet(b"a", opaque=b"7")]),
            junk,
        ),
    ),
    min_size=1,
    max_size=5,
)


def split(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(stream) + 1) for c in cuts})
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


def run(
    make: Callable[[], Any], script: list[tuple[Request[Any], bytes]], chunks: list[bytes]
) -> list[Any]:
    """What a reader says, step by step: replies, NEED_DATA with its counts, errors."""
    reader = make()
    said: list[Any] = []
    pending = iter(chunks)
    try:
        for request, _ in script:
            while True:
                reply = request.read(reader)
                if reply is not NEED_DATA:
                    said.append(("reply", reply))
                    break
                said.append(("need", reader.buffered, reader.wanted))
                chunk = next(pending, None)
                if chunk is None:
                    said.append("starved")
                    return said
                reader.feed(chunk)
        for chunk in pending:
            reader.feed(chunk)
        reader.drained()
        said.append("drained")
    except ProtocolError as exc:
        said.append(("ProtocolError", str(exc)))
    return said


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps, cuts=st.lists(st.integers(0, 10_000), max_size=8), extra=junk)
def test_both_readers_answer_the_same_streams_split_anywhere(
    script: list[tuple[Request[Any], bytes]], cuts: list[int], extra: bytes
) -> None:
    stream = b"".join(reply for _, reply in script) + (extra if cuts[:1] == [0] else b"")
    chunks = split(stream, cuts)
    assert run(CReader, script, chunks) == run(PureReader, script, chunks)


@settings(max_examples=200, deadline=None)
@given(
    command=st.sampled_from(["set", "add", "replace", "append", "prepend", "cas"]),
    key=key_names,
    data=st.binary(max_size=50),
    flags=st.integers(0, 2**32),
    expire=st.integers(-1, 2**31),
    token=st.one_of(st.none(), st.integers(0, 2**64 - 1), digits, st.booleans()),
    keys=st.lists(key_names, max_size=5),
    cas=st.booleans(),
)
def test_the_compiled_encoder_writes_the_same_bytes(
    command: Any,
    key: bytes,
    data: bytes,
    flags: int,
    expire: int,
    token: Any,
    keys: list[bytes],
    cas: bool,
) -> None:
    requests: list[Request[Any]] = [
        Store(command, key, data, flags, expire, token),
        Get(tuple(keys), cas),
        Get(keys, cas),
        Delete(key),
        MetaGet(key, value=True, opaque=b"1"),
    ]
    assert compiled.encode(requests) == b"".join(r.encode() for r in requests)
    for request in requests:
        assert compiled.encode([request]) == request.encode()


def test_an_odd_request_encodes_or_fails_as_its_own_encode_does() -> None:
    odd = [
        Store("set", b"k", bytearray(b"v")),
        Store("cas", b"k", b"v", cas_token=1.0),
        Get([bytearray(b"a"), b"b"]),
    ]
    for request in odd:
        assert compiled.encode([request]) == request.encode()
    with pytest.raises(KeyError):
        compiled.encode([Store("bogus", b"k", b"v")])  # type: ignore[arg-type]


def test_both_readers_know_the_same_longest_value() -> None:
    assert compiled.speedups is not None
    assert compiled.speedups.MAX_VALUE_LENGTH == MAX_VALUE_LENGTH == 1 << 30


@pytest.mark.parametrize("make", [PureReader, CReader], ids=["python", "compiled"])
@pytest.mark.parametrize(
    ("request_", "head"),
    [
        (Get((b"a",)), b"VALUE a 0 %d\r\n"),
        (Get((b"a",), cas=True), b"VALUE a 0 %d 7\r\n"),
        (MetaGet(b"a", value=True), b"VA %d\r\n"),
    ],
)
@pytest.mark.parametrize("length", [MAX_VALUE_LENGTH + 1, 9_999_999_999_999, 10**18, 10**30])
def test_a_reply_declaring_an_absurd_length_is_a_protocol_error(
    make: Any, request_: Request[Any], head: bytes, length: int
) -> None:
    """Not a MemoryError (a buffer of the declared size, or a receive of it) into a view."""
    reader = make(head % length + b"xx")
    with pytest.raises(ProtocolError, match="does not answer"):
        request_.read(reader)


def test_the_longest_value_a_reply_may_declare_is_awaited() -> None:
    for make in (PureReader, CReader):
        reader = make(b"VALUE a 0 %d\r\nxx" % MAX_VALUE_LENGTH)
        assert Get((b"a",)).read(reader) is NEED_DATA
        assert reader.wanted == MAX_VALUE_LENGTH  # the 2 bytes buffered and the CRLF


# -- sub-interpreters ----------------------------------------------------------------

SUB_INTERPRETER = """
import sys
try:
    import _interpreters as interpreters
except ImportError:
    import _xxsubinterpreters as interpreters
from django_mcpatterns.core.exceptions import ProtocolError
from django_mcpatterns.core.protocol import compiled
from django_mcpatterns.core.wire import Get, Value

def check(when):
    reader = compiled.Reader(b"VALUE a 0 1\\r\\nx\\r\\nEND\\r\\n")
    assert type(Get([b"a"]).read(reader)[0]) is Value, when
    try:
        Get([b"a"]).read(compiled.Reader(b"BOGUS\\r\\n"))
    except ProtocolError:
        pass
    print(when, "ours")

check("before")
sub = interpreters.create()
interpreters.run_string(sub, (
    "from django_mcpatterns.core.protocol import compiled\\n"
    "print('sub', compiled.COMPILED, compiled.why_pure)\\n"
))
sys.stdout.flush()
check("after")
interpreters.destroy(sub)
check("destroyed")
"""


def test_a_sub_interpreter_runs_pure_and_leaves_the_main_ones_classes() -> None:
    """mod_wsgi's application groups: a sub-interpreter importing the package must not
    rebind the compiled path to its classes (the main one's ``except ProtocolError``
    would miss its errors, then use them once it is destroyed)."""
    if not any(importlib.util.find_spec(name) for name in ("_interpreters", "_xxsubinterpreters")):
        pytest.skip("no sub-interpreters in this Python")
    root = str(Path(compiled.__file__).parents[3])
    env = {**os.environ, "PYTHONPATH": root}
    env.pop(compiled.PURE_SWITCH, None)
    done = subprocess.run(
        [sys.executable, "-c", SUB_INTERPRETER], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "before ours"
    assert lines[1].startswith("sub False ")
    assert "another interpreter" in lines[1]
    assert lines[2:] == ["after ours", "destroyed ours"]


# -- the compiled I/O on a socket pair -----------------------------------------------


def serve(
    sock: socket.socket, expect: bytes, pieces: list[bytes], close: bool = False
) -> threading.Thread:
    def run() -> None:
        got = b""
        while len(got) < len(expect):
            got += sock.recv(65536)
        assert got == expect
        for piece in pieces:
            sock.sendall(piece)
        if close:
            sock.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_reply_trickled_byte_by_byte_is_read_whole(pair: Any) -> None:
    ours, theirs = pair
    reply = b"VALUE a 3 5 9\r\nhello\r\nVALUE b 0 0 1\r\n\r\nEND\r\n"
    thread = serve(theirs, b"gets a b\r\n", [bytes([c]) for c in reply])
    got = CReader().request(ours.fileno(), Get((b"a", b"b"), cas=True), 5.0)
    thread.join()
    assert got == PureReader(reply).values((b"a", b"b"), True)


def test_a_batch_is_sent_and_its_replies_received_in_order(pair: Any) -> None:
    ours, theirs = pair
    requests = [Store("set", b"k", b"v"), Get((b"k",)), Delete(b"k"), Stats()]
    replies = b"STORED\r\nVALUE k 0 1\r\nv\r\nEND\r\nDELETED\r\nSTAT pid 1\r\nEND\r\n"
    thread = serve(theirs, compiled.encode(requests), [replies[:7], replies[7:30], replies[30:]])
    reader = CReader()
    reader.send(ours.fileno(), compiled.encode(requests), 5.0)
    got = reader.receive(ours.fileno(), requests, 5.0)
    thread.join()
    assert (got[0], got[2], got[3]) == (b"STORED", b"DELETED", {"pid": "1"})
    assert [tuple(v) for v in got[1]] == [(b"k", 0, b"v", None)]


def test_a_connection_closed_mid_reply_raises_connection_closed(pair: Any) -> None:
    ours, theirs = pair
    thread = serve(theirs, b"get a\r\n", [b"VALUE a 0 5\r\nhel"], close=True)
    with pytest.raises(compiled.ConnectionClosedError, match="mid-reply"):
        CReader().request(ours.fileno(), Get((b"a",)), 5.0)
    thread.join()


def test_an_absurd_length_received_is_a_protocol_error(pair: Any) -> None:
    ours, theirs = pair
    thread = serve(theirs, b"get a\r\n", [b"VALUE a 0 9999999999999\r\nxx"])
    with pytest.raises(ProtocolError, match="9999999999999"):
        CReader().request(ours.fileno(), Get((b"a",)), 5.0)
    thread.join()


def resident() -> int:
    """This process's resident memory, in bytes (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux's /proc")
def test_a_large_request_sent_leaves_no_send_buffer_behind(pair: Any) -> None:
    """A pooled connection's reader keeps no copy of the largest set it ever sent."""
    ours, theirs = pair
    size = 64 << 20
    request = Store("set", b"k", b"x" * size)
    expect = len(request.encode())

    def peer() -> None:
        got = 0
        while got < expect:
            got += len(theirs.recv(1 << 20))
        theirs.sendall(b"STORED\r\n")

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    reader = CReader()
    before = resident()
    assert reader.request(ours.fileno(), request, 30.0) == b"STORED"
    thread.join()
    assert resident() - before < size // 4  # not the 64 MiB encoded into the reader


def test_a_stalled_server_is_the_kernels_timeout(pair: Any) -> None:
    ours, theirs = pair
    thread = serve(theirs, b"delete k\r\n", [b"DEL"])
    with pytest.raises(BlockingIOError):  # EAGAIN after SO_RCVTIMEO: the transport's timeout
        CReader().request(ours.fileno(), Delete(b"k"), None)
    thread.join()


def test_bytes_after_the_reply_are_a_protocol_error(pair: Any) -> None:
    ours, theirs = pair
    thread = serve(theirs, b"touch k 0\r\n", [b"TOUCHED\r\nSTORED\r\n"])
    with pytest.raises(ProtocolError, match="STORED"):
        CReader().request(ours.fileno(), Touch(b"k"), 5.0)
    thread.join()


def test_threads_overlap_while_one_waits_for_its_reply(pair: Any) -> None:
    """The GIL is released while a reply is awaited: another thread runs meanwhile."""
    ours, theirs = pair
    ran = threading.Event()

    def server() -> None:
        theirs.recv(100)
        assert ran.wait(5)  # answers only once the other thread ran, which needs the GIL
        theirs.sendall(b"STORED\r\n")

    thread = threading.Thread(target=server, daemon=True)
    thread.start()
    other = threading.Thread(target=ran.set)
    reader = CReader()
    timer = threading.Timer(0.0, other.start)
    timer.start()
    assert reader.request(ours.fileno(), Store("set", b"k", b"v"), 5.0) == b"STORED"
    thread.join()
    other.join()


# -- multi-key bookkeeping and the requests' makers -------------------------------------


@contextlib.contextmanager
def pure() -> Iterator[None]:
    """compiled.py's pure-Python branches, for the comparison."""
    module = compiled.speedups
    compiled.speedups = None
    try:
        yield
    finally:
        compiled.speedups = module


def outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except Exception as exc:
        return (type(exc), str(exc))


any_key = st.one_of(
    st.text(max_size=260),
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=8),
    st.binary(max_size=260),
    st.sampled_from([Routed(b"k", b"r"), 3, None, "a b", "\x7f", "é"]),
)


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(any_key, max_size=6))
def test_keyed_answers_as_placed_does(keys: list[Any]) -> None:
    compiled_answer = outcome(lambda: compiled.keyed(keys))
    with pure():
        assert outcome(lambda: compiled.keyed(keys)) == compiled_answer


@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(
        st.tuples(key_names, st.sampled_from([0, 1, 2, 4, 16, 8, 3]), st.binary(max_size=12)),
        max_size=6,
    ),
    cas=st.booleans(),
    signed=st.booleans(),
)
def test_decoded_answers_as_the_python_loop(items: list[Any], cas: bool, signed: bool) -> None:
    options = SerdeOptions(signed=True, signing_key="k" * 32) if signed else SerdeOptions()
    serde = with_envelopes(options.build(None))
    direct = serde.direct_formats()
    assert direct
    values = [Value(key, flags, data, b"9" if cas else None) for key, flags, data in items]
    compiled_answer = outcome(lambda: compiled.decoded(values, direct, serde.deserialize, cas))
    with pure():
        answer = outcome(lambda: compiled.decoded(values, direct, serde.deserialize, cas))
    assert repr(answer) == repr(compiled_answer)


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(key_names, max_size=3), cas=st.booleans(), flags=st.integers(0, 99))
def test_the_makers_make_what_the_classes_do(keys: list[bytes], cas: bool, flags: int) -> None:
    for made, real in [
        (compiled.new_get(keys, cas), Get(keys, cas)),
        (compiled.new_store("set", b"k", b"v", flags, 0, None), Store("set", b"k", b"v", flags)),
    ]:
        assert type(made) is type(real)
        assert (made, repr(made), made.encode()) == (real, repr(real), real.encode())
    assert hash(compiled.new_get(tuple(keys), cas)) == hash(Get(tuple(keys), cas))
    with pytest.raises(TypeError):
        compiled.new_get(keys)  # type: ignore[call-arg]
    assert compiled.maker(MetaGet) is MetaGet  # a __post_init__ that checks: the class itself


@settings(max_examples=50, deadline=None)
@given(data=st.binary(max_size=20), flags=st.integers(0, 2**32 - 1), cas=st.integers(0, 2**63))
def test_the_values_made_field_by_field_are_the_classes_own(
    data: bytes, flags: int, cas: int
) -> None:
    from django_mcpatterns.core.chunks import _async as chunks
    from django_mcpatterns.core.protocol import commands
    from django_mcpatterns.core.protocol.meta import MetaSet
    from django_mcpatterns.core.stamps import _model as stamps
    from django_mcpatterns.core.values.layout import Encoded

    swap = commands._meta_swap(b"k", data, flags, b"%d" % cas, 30)
    real = MetaSet(b"k", data=data, cas=cas, ttl=30, client_flags=flags, return_cas=True)
    assert type(swap) is MetaSet
    assert (swap, repr(swap), swap.encode()) == (real, repr(real), real.encode())
    cached = stamps.new_cached((data,), [flags])
    assert type(cached) is stamps.Cached
    assert cached == stamps.Cached((data,), [flags])
    assert chunks.new_encoded(data, flags) == Encoded(data, flags)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(
        st.one_of(key_names, key_names.map(lambda k: Routed(k, b"r:" + k[:1]))), max_size=8
    ),
    remembered=st.lists(key_names, max_size=3),
)
def test_grouped_answers_as_the_python_loop(keys: list[Any], remembered: list[bytes]) -> None:
    given = compiled.keyed(keys)

    def run() -> Any:
        known = dict.fromkeys(remembered, "known")
        asked: list[bytes] = []

        def locate(ring: bytes) -> str:
            asked.append(ring)
            return f"s{len(ring) % 3}"

        return outcome(lambda: compiled.grouped(given, locate, known)), asked

    compiled_answer = run()
    with pure():
        assert run() == compiled_answer


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(
        st.dictionaries(
            key_names,
            st.sampled_from(
                [b"v", 3, STALE, REFUSED, Envelope(b"x"), Envelope(REFUSED), Envelope(STALE)]
            ),
            max_size=4,
        ),
        max_size=3,
    ),
    cas=st.booleans(),
)
def test_hits_answers_as_the_python_loop(parts: list[dict[bytes, Any]], cas: bool) -> None:
    if cas:
        parts = [{kb: (value, b"7") for kb, value in part.items()} for part in parts]
    given: dict[bytes, Any] = {kb: kb.decode() for part in parts for kb in part}
    compiled_answer = outcome(lambda: compiled.hits(parts, given, cas))
    with pure():
        assert outcome(lambda: compiled.hits(parts, given, cas)) == compiled_answer
