"""The sans-IO codec (core/wire.py): replies split anywhere parse the same, garbage never
reads as data, requests encode as memcached's protocol.txt writes them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_mcpatterns.core.exceptions import ProtocolError
from django_mcpatterns.core.transport import Connection, SocketOptions
from django_mcpatterns.core.wire import (
    NEED_DATA,
    Delete,
    ErrorReply,
    FlushAll,
    Get,
    Incr,
    MetaArithmetic,
    MetaDelete,
    MetaGet,
    MetaNoop,
    MetaReply,
    MetaSet,
    Reader,
    Request,
    Stats,
    Store,
    Touch,
    Value,
    Version,
)
from tests.harness import MemcachedServer

keys = st.binary(min_size=1, max_size=20).map(lambda b: b.hex().encode())
data = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([b"", b"\r\nEND\r\n", b"VALUE k 0 1\r\nx\r\n", b"\r\n", b"END"]),
)


def parse(requests: Sequence[Request[Any]], chunks: Sequence[bytes]) -> list[Any]:
    """Feed ``chunks`` one by one; return every reply, checking nothing is left over."""
    reader = Reader()
    replies: list[Any] = []
    pending = list(chunks)
    for request in requests:
        reply = request.read(reader)
        while reply is NEED_DATA:
            assert pending, "the reply needs more bytes than were sent"
            reader.feed(pending.pop(0))
            reply = request.read(reader)
        replies.append(reply)
    for chunk in pending:
        reader.feed(chunk)
    reader.drained()
    return replies


def splits(wire: bytes) -> Iterator[list[bytes]]:
    """The reply whole, byte by byte, and cut in two at every boundary."""
    yield [wire]
    yield [wire[i : i + 1] for i in range(len(wire))]
    for i in range(1, len(wire)):
        yield [wire[:i], wire[i:]]


def value_block(key: bytes, flags: int, payload: bytes, cas: int | None = None) -> bytes:
    head = b"VALUE %s %d %d" % (key, flags, len(payload))
    if cas is not None:
        head += b" %d" % cas
    return head + b"\r\n" + payload + b"\r\n"


# -- encoding ------------------------------------------------------------------


def test_text_requests_encode_as_protocol_txt_writes_them() -> None:
    assert Get([b"a", b"b"]).encode() == b"get a b\r\n"
    assert Get([b"a"], cas=True).encode() == b"gets a\r\n"
    assert Store("set", b"k", b"v", 5, 60).encode() == b"set k 5 60 1\r\nv\r\n"
    assert Store("cas", b"k", b"", 0, -1, b"42").encode() == b"cas k 0 -1 0 42\r\n\r\n"
    assert Store("append", b"k", b"xy").encode() == b"append k 0 0 2\r\nxy\r\n"
    assert Delete(b"k").encode() == b"delete k\r\n"
    assert Touch(b"k", 9).encode() == b"touch k 9\r\n"
    assert Incr(b"k", 3).encode() == b"incr k 3\r\n"
    assert Incr(b"k", 3, decr=True).encode() == b"decr k 3\r\n"
    assert FlushAll().encode() == b"flush_all\r\n"
    assert Stats().encode() == b"stats\r\n"
    assert Version().encode() == b"version\r\n"


def test_meta_requests_encode_their_flags() -> None:
    assert MetaGet(b"k", ttl=True).encode() == b"mg k t\r\n"
    assert (
        MetaGet(b"k", value=True, cas=True, ttl=True, client_flags=True, vivify=30).encode()
        == b"mg k v c t f N30\r\n"
    )
    assert (
        MetaSet(b"k", data=b"abc", mode="E", cas=7, ttl=60, client_flags=1, opaque=b"9").encode()
        == b"ms k 3 ME C7 T60 F1 O9\r\nabc\r\n"
    )
    assert MetaDelete(b"k", invalidate=True, quiet=True, opaque=b"1").encode() == (
        b"md k I O1 q\r\n"
    )
    assert (
        MetaArithmetic(b"k", vivify=0, initial=10, delta=2, mode="D", value=True).encode()
        == b"ma k MD D2 N0 J10 v\r\n"
    )
    assert MetaNoop().encode() == b"mn\r\n"


def test_a_quiet_meta_request_must_be_matchable() -> None:
    with pytest.raises(ValueError, match="opaque"):
        MetaDelete(b"k", quiet=True)


# -- parsing: split anywhere, same replies ---------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(
        st.tuples(keys, st.integers(0, 2**32 - 1), data), max_size=4, unique_by=lambda t: t[0]
    ),
    cas=st.booleans(),
)
def test_values_split_at_every_boundary_parse_the_same(
    items: list[tuple[bytes, int, bytes]], cas: bool
) -> None:
    wire = b"".join(
        value_block(k, f, d, 100 + i if cas else None) for i, (k, f, d) in enumerate(items)
    )
    wire += b"END\r\n"
    request = Get([k for k, _, _ in items] + [b"missing"], cas=cas)
    expected = [
        Value(k, f, d, b"%d" % (100 + i) if cas else None) for i, (k, f, d) in enumerate(items)
    ]
    for chunks in splits(wire):
        assert parse([request], chunks) == [expected]


LINE_REPLIES: list[tuple[Request[Any], bytes, Any]] = [
    (Store("set", b"k", b"v"), b"STORED\r\n", b"STORED"),
    (Store("add", b"k", b"v"), b"NOT_STORED\r\n", b"NOT_STORED"),
    (Store("cas", b"k", b"v", cas_token=1), b"EXISTS\r\n", b"EXISTS"),
    (Store("cas", b"k", b"v", cas_token=1), b"NOT_FOUND\r\n", b"NOT_FOUND"),
    (Delete(b"k"), b"DELETED\r\n", b"DELETED"),
    (Touch(b"k"), b"TOUCHED\r\n", b"TOUCHED"),
    (Incr(b"k"), b"18446744073709551615\r\n", 2**64 - 1),
    (Incr(b"k"), b"NOT_FOUND\r\n", None),
    (FlushAll(), b"OK\r\n", b"OK"),
    (Version(), b"VERSION 1.6.18\r\n", "1.6.18"),
    (Stats(), b"STAT pid 1\r\nSTAT version 1.6.18\r\nEND\r\n", {"pid": "1", "version": "1.6.18"}),
    (
        Store("set", b"k", b"v"),
        b"SERVER_ERROR object too large for cache\r\n",
        ErrorReply("SERVER_ERROR", "object too large for cache"),
    ),
    (
        Incr(b"k"),
        b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        ErrorReply("CLIENT_ERROR", "cannot increment or decrement non-numeric value"),
    ),
    (MetaGet(b"k"), b"ERROR\r\n", ErrorReply("ERROR", "")),
    (MetaGet(b"k", ttl=True), b"HD t-1\r\n", MetaReply(b"HD", {"t": b"-1"})),
    (MetaGet(b"k", ttl=True), b"EN\r\n", MetaReply(b"EN", {})),
    (
        MetaGet(b"k", value=True, cas=True, vivify=30),
        b"VA 3 c42 W\r\nabc\r\n",
        MetaReply(b"VA", {"c": b"42", "W": b""}, b"abc"),
    ),
    (MetaSet(b"k", data=b"x", cas=1), b"EX\r\n", MetaReply(b"EX", {})),
    (MetaDelete(b"k"), b"NF\r\n", MetaReply(b"NF", {})),
    (MetaArithmetic(b"k", value=True), b"VA 2\r\n10\r\n", MetaReply(b"VA", {}, b"10")),
]


@pytest.mark.parametrize(("request_", "wire", "expected"), LINE_REPLIES)
def test_every_reply_split_anywhere_parses_the_same(
    request_: Request[Any], wire: bytes, expected: Any
) -> None:
    for chunks in splits(wire):
        assert parse([request_], chunks) == [expected]


def test_error_replies_tell_too_large_and_non_numeric_apart() -> None:
    (too_large,) = parse(
        [Store("set", b"k", b"v")], [b"SERVER_ERROR object too large for cache\r\n"]
    )
    (non_numeric,) = parse(
        [Incr(b"k")], [b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"]
    )
    assert (too_large.too_large, too_large.non_numeric) == (True, False)
    assert (non_numeric.too_large, non_numeric.non_numeric) == (False, True)


@settings(max_examples=50, deadline=None)
@given(
    token=st.binary(min_size=1, max_size=8).map(lambda b: b.hex().encode()),
    payload=data,
    cas=st.integers(0, 2**64 - 1),
    ttl=st.integers(-1, 2**31),
)
def test_meta_flags_round_trip(token: bytes, payload: bytes, cas: int, ttl: int) -> None:
    wire = b"VA %d c%d t%d f5 O%s k%s W X Z\r\n%s\r\n" % (
        len(payload),
        cas,
        ttl,
        token,
        b"key",
        payload,
    )
    request = MetaGet(b"key", value=True, cas=True, ttl=True, opaque=token, return_key=True)
    for chunks in splits(wire) if len(wire) < 80 else [[wire]]:
        (reply,) = parse([request], chunks)
        assert (reply.data, reply.cas, reply.ttl, reply.client_flags) == (payload, cas, ttl, 5)
        assert (reply.opaque, reply.key, reply.won, reply.stale, reply.lost) == (
            token,
            b"key",
            True,
            True,
            True,
        )


def test_quiet_meta_requests_are_matched_by_opaque_up_to_mn() -> None:
    requests: list[Request[Any]] = [
        MetaDelete(b"a", quiet=True, opaque=b"1"),
        MetaDelete(b"b", quiet=True, opaque=b"2"),
        MetaGet(b"c", value=True, quiet=True, opaque=b"3"),
        MetaGet(b"d", value=True, quiet=True, opaque=b"4"),
        MetaNoop(),
    ]
    wire = b"NF O2\r\nVA 1 O4\r\nx\r\nMN\r\n"  # a deleted (HD suppressed), c missed (EN suppressed)
    for chunks in splits(wire):
        replies = parse(requests, chunks)
        assert [(r.status, r.quiet) for r in replies] == [
            (b"HD", True),
            (b"NF", False),
            (b"EN", True),
            (b"VA", False),
            (b"MN", False),
        ]
        assert replies[3].data == b"x"


def test_large_values_are_joined_once() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    wire = value_block(b"big", 0, payload) + b"END\r\n"
    chunks = [wire[i : i + 1000] for i in range(0, len(wire), 1000)]
    assert parse([Get([b"big"])], chunks) == [[Value(b"big", 0, payload)]]


# -- mismatches are ProtocolError, never data ---------------------------------------


MISMATCHES: list[tuple[Request[Any], bytes]] = [
    (Get([b"a"]), b"VALUE b 0 1\r\nx\r\nEND\r\n"),  # a key that was not asked for
    (Get([b"a"]), b"VALUE a 0 1\r\nx\r\nVALUE a 0 1\r\nx\r\nEND\r\n"),  # twice
    (Get([b"a"]), b"VALUE a 0 1 5\r\nx\r\nEND\r\n"),  # a cas on get
    (Get([b"a"]), b"VALUE a zero 1\r\nx\r\nEND\r\n"),  # malformed number
    (Get([b"a"]), b"VALUE a 0 1\r\nxyz\r\nEND\r\n"),  # data longer than announced
    (Get([b"a"]), b"STORED\r\n"),  # another command's reply
    (Get([b"a"]), b"END\r\nEND\r\n"),  # stray bytes after the reply
    (Delete(b"a"), b"STORED\r\n"),
    (Touch(b"a"), b"DELETED\r\n"),
    (Incr(b"a"), b"STORED\r\n"),
    (Incr(b"a"), b"-1\r\n"),
    (Store("set", b"a", b"v"), b"EXISTS\r\n"),
    (FlushAll(), b"STORED\r\n"),
    (MetaGet(b"a"), b"NS\r\n"),
    (MetaGet(b"a", opaque=b"1"), b"HD O2\r\n"),
    (MetaGet(b"a", return_key=True), b"HD kb\r\n"),
    (MetaGet(b"a", ttl=True), b"HD tx\r\n"),
    (MetaGet(b"a", value=True), b"VA x\r\nabc\r\n"),
    (MetaSet(b"a", data=b"v"), b"EN\r\n"),
    (MetaNoop(), b"HD\r\n"),
]


@pytest.mark.parametrize(("request_", "wire"), MISMATCHES)
def test_replies_that_do_not_answer_the_request_are_protocol_errors(
    request_: Request[Any], wire: bytes
) -> None:
    with pytest.raises(ProtocolError):
        parse([request_], [wire])


@settings(max_examples=300, deadline=None)
@given(
    garbage=st.one_of(
        st.binary(max_size=200),
        st.lists(
            st.sampled_from(
                [b"VALUE ", b"a", b"b", b" 0", b" 1", b" 3", b"\r\n", b"END", b"x", b"HD", b"VA 1"]
            ),
            max_size=30,
        ).map(b"".join),
    ),
    cas=st.booleans(),
)
def test_garbage_never_yields_a_value_it_was_not_asked_for(garbage: bytes, cas: bool) -> None:
    """Random bytes give a ProtocolError, an error reply, "need more data" or,
    when they happen to be a valid reply, values only for the keys asked for."""
    for request in (Get([b"a"], cas=cas), MetaGet(b"a", value=True, opaque=b"7")):
        reader = Reader()
        reader.feed(garbage)
        try:
            reply = request.read(reader)
        except ProtocolError:
            continue
        if isinstance(reply, list):
            assert [v.key for v in reply] in ([], [b"a"])
        elif isinstance(reply, MetaReply):
            assert reply.opaque == b"7"


# -- real replies from memcached ------------------------------------------------------


@pytest.fixture
def connection(memcached_1: list[MemcachedServer]) -> Iterator[Connection]:
    conn = Connection(("127.0.0.1", memcached_1[0].port), SocketOptions())
    yield conn
    conn.close()


def captured(conn: Connection, request: bytes) -> bytes:
    """memcached's raw reply to ``request``, read until it is quiet."""
    sock = conn.connect()
    sock.sendall(request)
    sock.settimeout(0.3)
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return out
        if not chunk:
            return out
        out += chunk


def test_real_replies_split_at_every_boundary_parse_the_same(connection: Connection) -> None:
    replies = connection.exchange(
        [
            Store("set", b"wire:a", b"\r\nEND\r\nVALUE wire:b 0 1\r\n", 3),
            Store("set", b"wire:b", b"", 0),
            MetaSet(b"wire:c", data=b"meta", ttl=100),
        ]
    )
    assert replies == [b"STORED", b"STORED", MetaReply(b"HD", {})]
    cases: list[tuple[Request[Any], bytes]] = [
        (Get([b"wire:a", b"wire:b", b"wire:none"], cas=True), b"gets wire:a wire:b wire:none\r\n"),
        (MetaGet(b"wire:c", value=True, ttl=True, cas=True), b"mg wire:c v t c\r\n"),
        (MetaGet(b"wire:none", ttl=True), b"mg wire:none t\r\n"),
        (Stats(), b"stats\r\n"),
    ]
    for request, raw in cases:
        wire = captured(connection, raw)
        assert wire, raw
        expected = parse([request], [wire])
        for chunks in (
            splits(wire)
            if len(wire) < 400
            else [[wire[:i], wire[i:]] for i in range(0, len(wire), 7)]
        ):
            assert parse([request], chunks) == expected
    (values,) = parse(cases[0][:1], [captured(connection, cases[0][1])])
    assert [(v.key, v.flags, v.data) for v in values] == [
        (b"wire:a", 3, b"\r\nEND\r\nVALUE wire:b 0 1\r\n"),
        (b"wire:b", 0, b""),
    ]


def test_the_transport_pipelines_text_and_meta(connection: Connection) -> None:
    replies = connection.exchange(
        [
            MetaSet(b"wire:m", data=b"1", quiet=True, opaque=b"1"),
            MetaArithmetic(b"wire:m", delta=4, value=True, opaque=b"2"),
            MetaDelete(b"wire:none", quiet=True, opaque=b"3"),
            MetaNoop(),
            Incr(b"wire:m", 1),
        ]
    )
    assert [r if isinstance(r, int) else (r.status, r.quiet) for r in replies] == [
        (b"HD", True),
        (b"VA", False),
        (b"NF", False),
        (b"MN", False),
        6,
    ]
    assert replies[1].data == b"5"
