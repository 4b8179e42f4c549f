"""The set and list member encodings (core/sets/_model_layout.py), property-tested.

Every str, bytes and int member must come back exactly, type included, whatever
it holds (the separators, escapes, NUL, record tags, surrogates); equal members
must encode equally; anything that does not parse must raise EncodingError and
nothing else.
"""

from __future__ import annotations

import contextlib
import pickle
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from django_mcpatterns.core.exceptions import EncodingError
from django_mcpatterns.core.sets._model_layout import (
    ADD,
    LIST,
    REMOVE,
    SET,
    Base,
    Header,
    Member,
    base_record,
    decode_record,
    decode_snapshot,
    encode_snapshot,
    member_hash,
    member_token,
    parse_list,
    parse_set_log,
    push_records,
    read_header,
    removal_record,
    set_records,
)

# Characters the encodings care about, mixed into arbitrary text and bytes.
TRICKY = "\n\x10+-= \x00\re\\n:"
texts = st.text(st.characters(codec=None) | st.sampled_from(TRICKY), max_size=40)
raws = st.binary(max_size=40) | st.lists(st.sampled_from(TRICKY.encode()), max_size=8).map(bytes)
ints = st.integers() | st.integers(-(2**70), 2**70)
members = st.one_of(texts, raws, ints)

EDGE_MEMBERS: list[Member] = [
    "",
    b"",
    0,
    -1,
    " ",
    "\n",
    b"\n",
    "\x10",
    b"\x10",
    "\x10n",
    b"\x10e",
    "\x10\n",
    "+a",
    "-a",
    "=",
    "\n=",
    b"\x00MCP",
    "\ud800",  # a lone surrogate
    "\ud83d\ude00",  # a surrogate pair, as two code points
    "😀",
    "ключ",
    "x" * 10_000,
    b"\xff" * 10_000,
    2**200,
    -(2**200),
]


def replay(data: bytes, start: int = 0, result: set[Member] | None = None) -> set[Member]:
    """A plain reading of a set log: what the records say, in order."""
    result = set() if result is None else result
    for chunk in parse_set_log(data, start):
        assert not isinstance(chunk, Base)
        for record in chunk:
            added, member = decode_record(record)
            (result.add if added else result.discard)(member)
    return result


def same(got: Any, expected: Any) -> bool:
    return type(got) is type(expected) and got == expected


@pytest.mark.parametrize("member", EDGE_MEMBERS, ids=repr)
def test_edge_members_round_trip_in_records_and_snapshots(member: Member) -> None:
    [back] = replay(set_records(ADD, [member]))
    assert same(back, member)
    [back] = decode_snapshot(encode_snapshot([member]))
    assert same(back, member)


@given(st.lists(members, max_size=30))
@example(["a", b"a", 1, "1", b"1"])
@example(["", b""])
@example(["x\ny", "x", "y"])
def test_records_round_trip_every_member_with_its_type(listed: list[Member]) -> None:
    got = replay(set_records(ADD, listed))
    assert got == set(listed)
    by_token = {member_token(m): m for m in listed}
    for member in got:
        assert same(member, by_token[member_token(member)])


@given(st.sets(members, max_size=60))
def test_snapshots_round_trip(expected: set[Member]) -> None:
    got = decode_snapshot(encode_snapshot(expected))
    assert got == expected
    assert {(type(m), m) for m in got} == {(type(m), m) for m in expected}


@given(st.lists(st.tuples(st.booleans(), members), max_size=40))
def test_a_log_means_the_last_record_of_each_member(ops: list[tuple[bool, Member]]) -> None:
    log = b"".join(set_records(ADD if add else REMOVE, [m]) for add, m in ops)
    model: set[Member] = set()
    for add, member in ops:
        (model.add if add else model.discard)(member)
    assert replay(log) == model


@given(members, members)
def test_equal_members_encode_equally_and_only_they_do(a: Member, b: Member) -> None:
    equal = type(a) is type(b) and a == b
    assert (member_token(a) == member_token(b)) is equal
    if equal:
        assert member_hash(a) == member_hash(b)


def test_member_hash_is_stable_across_processes() -> None:
    # Fixed values: shard routing must not depend on PYTHONHASHSEED.
    assert member_hash("user:42") == member_hash("user:42")
    assert [member_hash(m) % 16 for m in ("a", b"a", 1)] == [
        member_hash("a") % 16,
        member_hash(b"a") % 16,
        member_hash(1) % 16,
    ]
    assert member_hash("a") != member_hash(b"a")


NOT_MEMBERS = [True, False, 1.5, None, bytearray(b"x"), ("t",), object()]


@pytest.mark.parametrize(
    "bad", NOT_MEMBERS, ids=lambda v: "object()" if type(v) is object else repr(v)
)
def test_members_are_str_bytes_or_int_only(bad: Any) -> None:
    with pytest.raises(TypeError, match="str, bytes or int"):
        member_token(bad)
    with pytest.raises(TypeError):
        encode_snapshot(["fine", bad])


@given(st.sets(members, max_size=20), st.lists(st.tuples(st.booleans(), members), max_size=10))
def test_a_loader_snapshot_is_found_between_log_records(
    snapshot: set[Member], ops: list[tuple[bool, Member]]
) -> None:
    before = set_records(ADD, [m for _, m in ops])
    after = b"".join(set_records(ADD if add else REMOVE, [m]) for add, m in ops)
    data = before + base_record(b"N" * 8, encode_snapshot(snapshot)) + after
    chunks = parse_set_log(data, 0)
    bases = [c for c in chunks if isinstance(c, Base)]
    assert len(bases) == 1
    assert bases[0].nonce == b"N" * 8
    assert decode_snapshot(bases[0].snapshot) == snapshot
    records = [r for c in chunks if not isinstance(c, Base) for r in c]
    assert len(records) == 2 * len(ops)


@given(
    st.sampled_from([SET, LIST]),
    st.binary(min_size=8, max_size=8),
    st.integers(0, 2**40),
    st.integers(0, 2**31),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_headers_round_trip(
    kind: bytes, nonce: bytes, expires_at: int, timeout: int, pending: bool, shards: int
) -> None:
    header = Header(kind, nonce, expires_at, timeout, pending, shards, b"g" * 8, 0)
    assert Header.unpack(header.pack()) == header
    assert len(header.pack()) == Header.SIZE


@given(
    st.lists(st.tuples(st.integers(0, 2**53), members), max_size=15),
    st.lists(st.tuples(st.integers(0, 2**53), st.integers(-5, 5), members), max_size=5),
)
def test_list_records_round_trip(
    pushes: list[tuple[int, Member]], removals: list[tuple[int, int, Member]]
) -> None:
    data = b"".join(removal_record(*r) for r in reversed(removals))  # prepended
    data += Header(LIST, b"n" * 8).pack()
    data += b"".join(push_records(stamp, [m]) for stamp, m in pushes)
    got_removals, _, header, got_pushes = parse_list(data)
    assert header.kind == LIST
    assert [(s, type(m), m) for s, m in got_pushes] == [(s, type(m), m) for s, m in pushes]
    assert [(r.stamp, r.count, r.member) for r in reversed(got_removals)] == removals


# -- corrupt and foreign data ------------------------------------------------------


def a_set_item() -> bytes:
    snapshot = encode_snapshot(["a", b"b", 3, "x\ny"])
    header = Header(SET, b"n" * 8, snapshot=len(snapshot))
    return header.pack() + snapshot + set_records(ADD, ["c"]) + set_records(REMOVE, [3])


def read_set(data: bytes) -> set[Member]:
    header = read_header(data, SET)
    start = Header.SIZE + header.snapshot
    return replay(data, start, decode_snapshot(data, Header.SIZE, start))


@pytest.mark.parametrize(
    "foreign",
    [None, 42, "a str", pickle.dumps({1, 2}), b"", b"+sa\n", b"\x00MCP", {"a": 1}],
    ids=repr,
)
def test_values_that_are_not_set_items_raise_encoding_error(foreign: Any) -> None:
    with pytest.raises(EncodingError):
        read_header(foreign, SET)


def test_a_sound_item_reads() -> None:
    assert read_set(a_set_item()) == {"a", b"b", "x\ny", "c"}


@given(st.data())
def test_damaged_items_raise_encoding_error_or_read_whole(data: st.DataObject) -> None:
    item = bytearray(a_set_item())
    position = data.draw(st.integers(0, len(item) - 1))
    how = data.draw(st.sampled_from(["flip", "truncate", "insert"]))
    if how == "flip":
        item[position] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        del item[position:]
    else:
        item[position:position] = data.draw(st.binary(min_size=1, max_size=4))
    try:
        got = read_set(bytes(item))
    except EncodingError:
        return
    # What still parses is made only of members (no stray exception, no garbage type).
    assert all(type(m) in (str, bytes, int) for m in got)


@pytest.mark.parametrize(
    "record",
    [b"+", b"*sa", b"+xa", b"+i1.5", b"+i", b"+s\xff\xfe", b"+b\x10z", b"+s\x10"],
    ids=repr,
)
def test_bad_records_raise_encoding_error(record: bytes) -> None:
    with pytest.raises(EncodingError):
        replay(record + b"\n")


def test_an_unterminated_record_raises_encoding_error() -> None:
    with pytest.raises(EncodingError, match="not terminated"):
        replay(b"+sa\n+sb")


INT_EDGES = [0, -1, 127, 128, -128, -129, 2**15, -(2**15) - 1, 2**31 - 1, 2**31, -(2**31)]
INT_EDGES += [2**63 - 1, 2**63, -(2**63), -(2**63) - 1]


@pytest.mark.parametrize("edge", INT_EDGES)
def test_ints_round_trip_at_every_array_width(edge: int) -> None:
    for group in ([edge], [0, edge], [edge, 1, -1], [edge, 2**100]):
        got = decode_snapshot(encode_snapshot(group))
        assert got == set(group)
        assert all(type(m) is int for m in got)


def test_small_ints_take_their_narrowest_width() -> None:
    assert len(encode_snapshot(range(100))) == 5 + 1 + 100  # section header, width, bytes
    assert len(encode_snapshot(range(100_000))) == 5 + 1 + 4 * 100_000


@pytest.mark.parametrize("payload", [b"", b"\x03abc", b"\x04abc", b"\x09" + bytes(9)], ids=repr)
def test_a_malformed_int_array_raises_encoding_error(payload: bytes) -> None:
    section = b"q" + len(payload).to_bytes(4, "big") + payload
    with pytest.raises(EncodingError):
        decode_snapshot(section)


def test_a_truncated_snapshot_raises_encoding_error() -> None:
    snapshot = encode_snapshot(["abc", 1])
    with pytest.raises(EncodingError):
        decode_snapshot(snapshot[:-1])
    with pytest.raises(EncodingError):
        decode_snapshot(snapshot[:3])


@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_raise_anything_but_encoding_error(blob: bytes) -> None:
    assume(blob)
    for reader in (read_set, parse_list, decode_snapshot, replay):
        with contextlib.suppress(EncodingError):
            reader(blob)
