"""Byte encodings of what the patterns store in memcached.

Set and list items (:mod:`django_mcpatterns.core.sets`, :mod:`django_mcpatterns.core.sets`) are raw
bytes: ``append`` keeps an item's flags,
so they can never be pickled values.  Their layout::

    set root   HEADER  SNAPSHOT  RECORD*          (records are appended)
    set shard  HEADER  SNAPSHOT                   (written once, never appended to)
    list       REMOVAL*  HEADER  PUSH*            (removals are prepended)

``HEADER`` is fixed-size binary starting with NUL (:class:`Header`).  A member is
encoded canonically as a type byte (``s`` str, ``b`` bytes, ``i`` int) and a
payload: UTF-8 (``surrogatepass``) for str, the bytes themselves, the decimal
``str(int)``.  Payloads are escaped so they never hold the record separator
``\\n``: DLE (``\\x10``) becomes ``DLE e`` and ``\\n`` becomes ``DLE n``.  Equal
members therefore have equal encodings, and ``"1"``, ``b"1"`` and ``1`` differ.

``SNAPSHOT`` is the compacted form: up to four sections, each a type byte, a
4-byte big-endian length and the escaped payloads joined by ``\\n`` (ints that
fit in 64 bits are the narrowest little-endian signed array instead, section
``q``: a width byte and the array), so reading 100,000 str members is one
``decode`` and one ``split``, and 100,000 ints one ``array.frombytes``.

Set records are ``+`` or ``-`` (add, remove) with the member's encoding and
``\\n``, or a loader snapshot ``=`` + 8-byte nonce + 4-byte length + SNAPSHOT.
List records carry a microsecond timestamp: ``+<us>:<member>\\n`` pushes a value,
``-<us>:<count>:<member>\\n`` removes like Redis ``LREM``.

Anything that does not parse raises :class:`~django_mcpatterns.core.exceptions.EncodingError`; an
item that is not a collection of the kind asked for (a plain cache value, a list
read as a set) raises its subclass :class:`~django_mcpatterns.core.exceptions.WrongTypeError`.

A plain value under a set's key
    ``sadd``/``srem`` are blind appends (one request, nothing read), and
    memcached appends to any item: refusing them up front would cost a read
    on every write.  The mismatch is found by the next read instead, which
    always parses the header: every set read (and a write that has to read)
    raises ``WrongTypeError`` and rewrites nothing.  The plain value's own
    readers: pickle stops at its own end (the value reads as before); JSON,
    msgpack and signed values are refused (a counted miss); raw bytes and
    text grow by the records, as memcached's ``append`` always does.
"""

from __future__ import annotations

import re
import struct
import sys
import zlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ..exceptions import EncodingError, WrongTypeError

Member = str | bytes | int

STR, BYTES, INT, INT64 = b"s", b"b", b"i", b"q"
ADD, REMOVE, BASE = b"+", b"-", b"="
SET, SHARD, LIST = b"S", b"H", b"L"
_KIND_NAMES = {SET: "set", SHARD: "set shard", LIST: "list"}

_SEP = b"\n"
_DLE = b"\x10"
_INT = re.compile(rb"-?[0-9]+")
_INTS = re.compile(rb"-?[0-9]+(?:\n-?[0-9]+)*")
_LIST_PUSH = re.compile(rb"\+([0-9]+):(.*)", re.DOTALL)
_LIST_REMOVAL = re.compile(rb"-([0-9]+):(-?[0-9]+):(.*)", re.DOTALL)
_SECTION = struct.Struct(">cI")
_BASE = struct.Struct(">c8sI")

# -- members -------------------------------------------------------------------


def _escape(raw: bytes) -> bytes:
    if _DLE in raw:
        raw = raw.replace(_DLE, b"\x10e")
    if _SEP in raw:
        raw = raw.replace(_SEP, b"\x10n")
    return raw


def _unescape(payload: bytes) -> bytes:
    if _DLE not in payload:
        return payload
    # Every DLE starts "DLE e" or "DLE n"; undo "DLE n" first so a literal "n"
    # after an escaped DLE is never mistaken for an escape.
    if payload.count(_DLE) != payload.count(b"\x10e") + payload.count(b"\x10n"):
        raise EncodingError(f"invalid escape in member payload {payload[:40]!r}")
    return payload.replace(b"\x10n", _SEP).replace(b"\x10e", _DLE)


def _payload(member: Member) -> tuple[bytes, bytes]:
    """Return ``(type, raw payload)``; the one place member types are decided."""
    # Exact types (``type(member) is``, which type checkers narrow): no bool, no subclasses.
    if type(member) is str:
        return STR, member.encode("utf-8", "surrogatepass")
    if type(member) is bytes:
        return BYTES, member
    if type(member) is int:
        return INT, b"%d" % member
    raise TypeError(
        f"set and list members are str, bytes or int (not bool or subclasses), "
        f"not {type(member).__name__}: {member!r}"
    )


def member_token(member: Member) -> bytes:
    """The member's canonical encoding: type byte + escaped payload."""
    kind, raw = _payload(member)
    return kind + _escape(raw)


def member_hash(member: Member) -> int:
    """A hash of the member stable across processes (``hash()`` of str is not)."""
    kind, raw = _payload(member)
    return zlib.crc32(raw, kind[0])


def decode_member(kind: int, payload: bytes) -> Member:
    """Decode one escaped payload of type byte ``kind``."""
    try:
        if kind == 0x73:  # s
            return _unescape(payload).decode("utf-8", "surrogatepass")
        if kind == 0x62:  # b
            return _unescape(payload)
        if kind == 0x69 and _INT.fullmatch(payload):  # i
            return int(payload)
    except UnicodeDecodeError as exc:
        raise EncodingError(f"member is not valid UTF-8: {payload[:40]!r}") from exc
    raise EncodingError(f"not a member encoding: type {bytes([kind])!r}, payload {payload[:40]!r}")


def check_members(members: Iterable[Member]) -> list[Member]:
    """Return the members as a list, raising ``TypeError`` for a type sets cannot hold."""
    listed = list(members)
    for member in listed:
        _payload(member)
    return listed


# -- snapshots -------------------------------------------------------------------


def encode_snapshot(members: Iterable[Member]) -> bytes:
    """Encode members as a SNAPSHOT (one section per type present)."""
    strs: list[str] = []
    raws: list[bytes] = []
    ints: list[int] = []
    for member in members:
        kind = type(member)
        if kind is str:
            strs.append(member)  # type: ignore[arg-type]
        elif kind is bytes:
            raws.append(member)  # type: ignore[arg-type]
        elif kind is int:
            ints.append(member)  # type: ignore[arg-type]
        else:
            _payload(member)  # raises TypeError
    sections = []
    if strs:
        text = "\n".join(strs)
        if "\x10" in text or text.count("\n") != len(strs) - 1:
            text = "\n".join(s.replace("\x10", "\x10e").replace("\n", "\x10n") for s in strs)
        sections.append(_section(STR, text.encode("utf-8", "surrogatepass")))
    if raws:
        joined = _SEP.join(raws)
        if _DLE in joined or joined.count(_SEP) != len(raws) - 1:
            joined = _SEP.join(map(_escape, raws))
        sections.append(_section(BYTES, joined))
    if ints:
        small = [i for i in ints if _INT64_MIN <= i <= _INT64_MAX]
        if small:
            sections.append(_section(INT64, _pack_ints(small)))
        if len(small) < len(ints):
            big = [i for i in ints if not _INT64_MIN <= i <= _INT64_MAX]
            sections.append(_section(INT, "\n".join(map(str, big)).encode("ascii")))
    return b"".join(sections)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Array type codes by item width; "i" is 4 bytes wherever CPython runs.
_WIDTHS = {1: "b", 2: "h", 4: "i", 8: "q"}


def _pack_ints(values: list[int]) -> bytes:
    """A width byte and the values as the narrowest little-endian signed array."""
    low, high = min(values), max(values)
    width = next(w for w in _WIDTHS if -(1 << (8 * w - 1)) <= low and high < 1 << (8 * w - 1))
    packed = array(_WIDTHS[width], values)
    if sys.byteorder == "big":
        packed.byteswap()
    return bytes([width]) + packed.tobytes()


def _unpack_ints(payload: bytes) -> array[int]:
    code = _WIDTHS.get(payload[0]) if payload else None
    if code is None or (len(payload) - 1) % payload[0]:
        raise EncodingError("snapshot int array section is malformed")
    packed = array(code)
    packed.frombytes(payload[1:])
    if sys.byteorder == "big":
        packed.byteswap()
    return packed


def _section(kind: bytes, payload: bytes) -> bytes:
    return _SECTION.pack(kind, len(payload)) + payload


def decode_snapshot(data: bytes, start: int = 0, end: int | None = None) -> set[Member]:
    """Decode the SNAPSHOT in ``data[start:end]``: bulk ``decode`` and ``split`` per type."""
    end = len(data) if end is None else end
    members: set[Member] = set()
    pos = start
    while pos < end:
        if pos + _SECTION.size > end:
            raise EncodingError("truncated snapshot section header")
        kind, length = _SECTION.unpack_from(data, pos)
        pos += _SECTION.size
        if pos + length > end:
            raise EncodingError("truncated snapshot section")
        payload = data[pos : pos + length]
        pos += length
        members.update(_decode_section(kind, payload))
    return members


def _decode_section(kind: bytes, payload: bytes) -> Iterable[Member]:
    if kind == STR:
        try:
            text = payload.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise EncodingError("snapshot str section is not valid UTF-8") from exc
        if "\x10" not in text:
            return text.split("\n")
        if text.count("\x10") != text.count("\x10e") + text.count("\x10n"):
            raise EncodingError("invalid escape in snapshot str section")
        return [s.replace("\x10n", "\n").replace("\x10e", "\x10") for s in text.split("\n")]
    if kind == BYTES:
        parts = payload.split(_SEP)
        return map(_unescape, parts) if _DLE in payload else parts
    if kind == INT64:
        return _unpack_ints(payload)
    if kind == INT:
        if not _INTS.fullmatch(payload):
            raise EncodingError("snapshot int section holds a non-integer")
        return map(int, payload.split(_SEP))
    raise EncodingError(f"unknown snapshot section type {kind!r}")


# -- headers ---------------------------------------------------------------------

_MAGIC = b"\x00MCP"
_VERSION = 1
_HEADER = struct.Struct(">4sBcc8sQII8sI")


@dataclass(frozen=True, slots=True)
class Header:
    """The fixed-size header of a set root, set shard or list item.

    ``nonce`` names one incarnation of a collection (a set recreated after an
    eviction gets a new one); ``expires_at`` and ``timeout`` record the expiry
    given at creation, which rewrites must reapply (memcached has no
    TTL-keeping rewrite); ``generation`` names the current shard keys;
    ``shards`` is the shard count of a root, the index of a shard; ``snapshot``
    is the length of the SNAPSHOT that follows the header.
    """

    kind: bytes
    nonce: bytes
    expires_at: int = 0  # Unix seconds, 0: never
    timeout: int = 0  # the relative timeout given at creation, 0: none
    pending: bool = False  # a loader-backed set whose snapshot has not arrived yet
    shards: int = 0
    generation: bytes = bytes(8)
    snapshot: int = 0

    SIZE = _HEADER.size

    def pack(self) -> bytes:
        return _HEADER.pack(
            _MAGIC,
            _VERSION,
            self.kind,
            b"P" if self.pending else b"C",
            self.nonce,
            self.expires_at,
            self.timeout,
            self.shards,
            self.generation,
            self.snapshot,
        )

    def names_shard(self, data: object) -> bool:
        """Whether ``data`` is a shard of this root's incarnation and generation."""
        shard = read_header(data, SHARD)
        return shard.nonce == self.nonce and shard.generation == self.generation

    def with_(self, **changes: object) -> Header:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def unpack(cls, data: bytes, offset: int = 0) -> Header:
        if len(data) - offset < _HEADER.size:
            raise EncodingError("item too short for a set or list header")
        magic, version, kind, state, nonce, expires_at, timeout, shards, generation, snapshot = (
            _HEADER.unpack_from(data, offset)
        )
        if magic != _MAGIC or version != _VERSION or state not in (b"C", b"P"):
            raise EncodingError(f"not a set or list item (starts {data[offset : offset + 8]!r})")
        if kind not in (SET, SHARD, LIST):
            raise EncodingError(f"unknown collection kind {kind!r}")
        if offset + _HEADER.size + snapshot > len(data):
            raise EncodingError("snapshot runs past the end of the item")
        return cls(kind, nonce, expires_at, timeout, state == b"P", shards, generation, snapshot)


def read_header(data: object, kind: bytes) -> Header:
    """Parse the header of a stored set root or shard, checking it is of ``kind``.

    Raise :class:`WrongTypeError` for an item that is no such collection.
    """
    if not isinstance(data, bytes):
        raise _wrong_type(kind, f"a plain {type(data).__name__} value")
    if not data.startswith(_MAGIC):
        raise _wrong_type(kind, "a plain bytes value")
    header = Header.unpack(data)
    if header.kind != kind:
        raise _wrong_type(kind, f"a {_KIND_NAMES.get(header.kind, repr(header.kind))}")
    return header


def _wrong_type(kind: bytes, found: str) -> WrongTypeError:
    name = _KIND_NAMES[kind]
    return WrongTypeError(
        f"the key holds {found}, not a {name}: {name} operations refuse it and leave it as "
        "it is; delete it or use another key"
    )


# -- set records -----------------------------------------------------------------


def set_records(op: bytes, members: Iterable[Member]) -> bytes:
    """Encode log records ``op`` (ADD or REMOVE) for each member."""
    return b"".join([op + member_token(member) + _SEP for member in members])


def base_record(nonce: bytes, snapshot: bytes) -> bytes:
    """A loader snapshot for the pending set incarnation ``nonce``."""
    return _BASE.pack(BASE, nonce, len(snapshot)) + snapshot


@dataclass(frozen=True, slots=True)
class Base:
    """A loader snapshot record, as found in a set's log."""

    nonce: bytes
    snapshot: bytes


def parse_set_log(data: bytes, start: int) -> list[list[bytes] | Base]:
    """Split the records after ``start`` into runs of log records and loader snapshots.

    A run of ``+``/``-`` records is split at once (``bytes.split``); its records
    are ``op + type + payload`` without the newline.  A loader snapshot can only
    start right after a record's newline, and payloads never hold a newline, so
    the first ``\\n=`` after a run's start ends the run.
    """
    chunks: list[list[bytes] | Base] = []
    pos, end = start, len(data)
    while pos < end:
        tag = data[pos]
        if tag == 0x3D:  # "=": a loader snapshot
            if pos + _BASE.size > end:
                raise EncodingError("truncated loader snapshot record")
            _, nonce, length = _BASE.unpack_from(data, pos)
            pos += _BASE.size
            if pos + length > end:
                raise EncodingError("truncated loader snapshot")
            chunks.append(Base(nonce, data[pos : pos + length]))
            pos += length
        elif tag in (0x2B, 0x2D):  # "+" / "-"
            boundary = data.find(b"\n=", pos)
            stop = end if boundary < 0 else boundary + 1
            if data[stop - 1] != 0x0A:
                raise EncodingError("a set record is not terminated")
            chunks.append(data[pos : stop - 1].split(_SEP))
            pos = stop
        else:
            raise EncodingError(f"unexpected byte {bytes([tag])!r} at offset {pos} of a set")
    return chunks


def decode_record(record: bytes) -> tuple[bool, Member]:
    """Return ``(is_add, member)`` for one ``+``/``-`` record."""
    if len(record) < 2 or record[0] not in (0x2B, 0x2D):
        raise EncodingError(f"not a set record: {record[:40]!r}")
    return record[0] == 0x2B, decode_member(record[1], record[2:])


# -- list records ----------------------------------------------------------------


def push_records(stamp: int, members: Iterable[Member]) -> bytes:
    prefix = b"+%d:" % stamp
    return b"".join([prefix + member_token(member) + _SEP for member in members])


def removal_record(stamp: int, count: int, member: Member) -> bytes:
    return b"-%d:%d:" % (stamp, count) + member_token(member) + _SEP


@dataclass(frozen=True, slots=True)
class Removal:
    """``LREM count member``, hiding values pushed before ``stamp``."""

    stamp: int
    count: int
    member: Member


def parse_list(data: object) -> tuple[list[Removal], int, Header, list[tuple[int, Member]]]:
    """Return ``(removals, header_offset, header, pushes)`` of a stored list."""
    if not isinstance(data, bytes):
        raise _wrong_type(LIST, f"a plain {type(data).__name__} value")
    removals: list[Removal] = []
    pos = list_header_offset(data)
    for record in data[:pos].split(_SEP)[:-1]:  # the prepended "-" records
        match = _LIST_REMOVAL.fullmatch(record)
        if match is None:
            raise EncodingError(f"bad list removal record {record[:40]!r}")
        member = _list_member(match.group(3))
        removals.append(Removal(int(match.group(1)), int(match.group(2)), member))
    if not data.startswith(_MAGIC, pos):
        raise _wrong_type(LIST, "a plain bytes value")
    header = Header.unpack(data, pos)
    if header.kind != LIST:
        raise _wrong_type(LIST, f"a {_KIND_NAMES.get(header.kind, repr(header.kind))}")
    body = pos + Header.SIZE
    pushes: list[tuple[int, Member]] = []
    if body < len(data):
        if data[-1] != 0x0A:
            raise EncodingError("a list record is not terminated")
        for record in data[body:-1].split(_SEP):
            match = _LIST_PUSH.fullmatch(record)
            if match is None:
                raise EncodingError(f"bad list record {record[:40]!r}")
            pushes.append((int(match.group(1)), _list_member(match.group(2))))
    return removals, pos, header, pushes


def list_header_offset(data: bytes) -> int:
    """Where the header of a stored list starts (after its prepended removals)."""
    pos = 0
    while pos < len(data) and data[pos] == 0x2D:
        stop = data.find(_SEP, pos)
        if stop < 0:
            raise EncodingError("a list removal record is not terminated")
        pos = stop + 1
    return pos


def _list_member(token: bytes) -> Member:
    if not token:
        raise EncodingError("empty list member encoding")
    return decode_member(token[0], token[1:])
