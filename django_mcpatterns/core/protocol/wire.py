"""memcached's wire format, sans-IO: requests to bytes, bytes to typed replies.

Both protocols of memcached's ``doc/protocol.txt`` are here: the classic text
commands (``get``/``gets``, the storage commands, ``delete``, ``incr``/``decr``,
``touch``, ``flush_all``, ``stats``, ``version``) and the meta commands of
memcached 1.6 (``mg``, ``ms``, ``md``, ``ma``, ``mn``).  No sockets: a transport
(:mod:`.transport`) writes :func:`encode`'s bytes and feeds what it receives to
a :class:`Reader`, which parses one reply per request.

Requests are frozen dataclasses; each knows the replies its command can get.
Replies are typed:

* text storage, ``delete``, ``touch``, ``flush_all``: the status line as bytes
  (:data:`STORED`, :data:`NOT_STORED`, :data:`EXISTS`, :data:`NOT_FOUND`, ...);
* ``incr``/``decr``: the new value, or None for a missing key;
* ``get``/``gets``: a list of :class:`Value` (the hits, in the server's order);
* ``stats``: ``{name: value}`` as text; ``version``: the version text;
* meta commands: a :class:`MetaReply` (status, return flags, data);
* any command: an :class:`ErrorReply` for ``ERROR``/``CLIENT_ERROR``/``SERVER_ERROR``
  (memcached's errors are answers, and the stream stays in step after them).

A reply the request cannot get (a value for a key that was not asked for, a
key twice, a line of another command, a malformed number, an opaque token that
does not match) raises :class:`~.exceptions.ProtocolError`: a connection out of
step (a fork sharing a socket, a reply left unread) is never read as data.

Quiet meta requests (``q``) get no reply on success (``mg``: on a miss), so
they must carry an opaque token (``O``) or ask for their key back (``k``): a
reply is theirs only if it names them, and the batch ends with :class:`MetaNoop`,
whose ``MN`` closes it.  A suppressed reply reads as :attr:`MetaReply.quiet`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final, Generic, Literal, NamedTuple, TypeAlias, TypeVar

from ..exceptions import ProtocolError

__all__ = [
    "DELETED",
    "END",
    "EXISTS",
    "NEED_DATA",
    "NOT_FOUND",
    "NOT_STORED",
    "OK",
    "STORED",
    "TOUCHED",
    "Delete",
    "ErrorReply",
    "FlushAll",
    "Get",
    "Incr",
    "MetaArithmetic",
    "MetaDelete",
    "MetaGet",
    "MetaNoop",
    "MetaReply",
    "MetaSet",
    "NeedData",
    "Reader",
    "Reply",
    "Request",
    "Stats",
    "Store",
    "Touch",
    "Value",
    "Version",
    "encode",
]

T = TypeVar("T")

STORED: Final = b"STORED"
NOT_STORED: Final = b"NOT_STORED"
EXISTS: Final = b"EXISTS"
NOT_FOUND: Final = b"NOT_FOUND"
DELETED: Final = b"DELETED"
TOUCHED: Final = b"TOUCHED"
OK: Final = b"OK"
END: Final = b"END"

_CRLF = b"\r\n"


class NeedData:
    """The reply is not complete yet: feed more bytes and read again."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()


# -- replies ---------------------------------------------------------------------


class Value(NamedTuple):
    """One item of a ``get``/``gets`` reply; ``cas`` (ASCII digits) only for ``gets``.

    A named tuple, not a dataclass: a multi-get builds one per hit, and a
    tuple is several times cheaper to make than a frozen dataclass.
    """

    key: bytes
    flags: int
    data: bytes
    cas: bytes | None = None


_new_value = tuple.__new__  # a Value from a tuple, in C: NamedTuple's own __new__ is Python


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """memcached's ``ERROR``, ``CLIENT_ERROR <text>`` or ``SERVER_ERROR <text>``."""

    kind: Literal["ERROR", "CLIENT_ERROR", "SERVER_ERROR"]
    message: str

    @property
    def too_large(self) -> bool:
        """``SERVER_ERROR object too large for cache``: over the item size limit (``-I``)."""
        return self.kind == "SERVER_ERROR" and "too large" in self.message

    @property
    def out_of_memory(self) -> bool:
        """``SERVER_ERROR out of memory storing object`` (or ``... during read``): not stored.

        memcached could not allocate the item (its memory is full of items it
        cannot evict fast enough, typically under a stream of large ones).
        """
        return self.kind == "SERVER_ERROR" and "out of memory" in self.message.lower()

    @property
    def non_numeric(self) -> bool:
        """``CLIENT_ERROR cannot increment or decrement non-numeric value``."""
        return self.kind == "CLIENT_ERROR" and "non-numeric" in self.message

    def __str__(self) -> str:
        return f"{self.kind} {self.message}".rstrip()


@dataclass(frozen=True, slots=True)
class MetaReply:
    """A meta command's reply: status (``VA``, ``HD``, ``EN``, ``NS``, ``EX``, ``NF``,
    ``MN``), return flags by letter (``{"c": b"42", "W": b""}``) and, for ``VA``, data.

    ``quiet`` marks a reply a ``q`` request did not get: its status is the one
    ``q`` suppresses (``EN`` for ``mg``, ``HD`` for the others).
    """

    status: bytes
    flags: Mapping[str, bytes] = field(default_factory=dict)
    data: bytes | None = None
    quiet: bool = False

    def _int(self, flag: str) -> int | None:
        raw = self.flags.get(flag)
        return None if raw is None else int(raw)

    @property
    def cas(self) -> int | None:
        return self._int("c")

    @property
    def ttl(self) -> int | None:
        """Seconds left (``t``); -1: never expires."""
        return self._int("t")

    @property
    def client_flags(self) -> int | None:
        return self._int("f")

    @property
    def opaque(self) -> bytes | None:
        return self.flags.get("O")

    @property
    def key(self) -> bytes | None:
        return self.flags.get("k")

    @property
    def won(self) -> bool:
        """``W``: this client won the right to recompute the item."""
        return "W" in self.flags

    @property
    def stale(self) -> bool:
        """``X``: the item was marked stale (``md ... I``)."""
        return "X" in self.flags

    @property
    def lost(self) -> bool:
        """``Z``: another client already won the recompute."""
        return "Z" in self.flags


Reply: TypeAlias = bytes | int | list[Value] | dict[str, str] | str | MetaReply | ErrorReply | None


# -- requests --------------------------------------------------------------------


class Request(Generic[T]):
    """A command: :meth:`encode` gives its bytes, :meth:`read` parses its reply."""

    __slots__ = ()

    def encode(self) -> bytes:
        raise NotImplementedError

    def read(self, reader: Reader) -> T | ErrorReply | NeedData:
        raise NotImplementedError


def encode(requests: Iterable[Request[object]]) -> bytes:
    """Return the bytes of a batch of requests, to be written at once."""
    return b"".join([request.encode() for request in requests])


@dataclass(frozen=True, slots=True)
class Get(Request[list[Value]]):
    """``get``/``gets`` of distinct keys; each is answered at most once."""

    keys: Sequence[bytes]
    cas: bool = False

    def encode(self) -> bytes:
        return (b"gets " if self.cas else b"get ") + b" ".join(self.keys) + _CRLF

    def read(self, reader: Reader) -> list[Value] | ErrorReply | NeedData:
        return reader.values(self.keys, self.cas)


StoreCommand = Literal["set", "add", "replace", "append", "prepend", "cas"]
_STORE_REPLIES = frozenset({STORED, NOT_STORED})
_VERBS = {verb: verb.encode() for verb in ("set", "add", "replace", "append", "prepend", "cas")}
_CAS_REPLIES = frozenset({STORED, EXISTS, NOT_FOUND})


@dataclass(frozen=True, slots=True)
class Store(Request[bytes]):
    """A storage command; the reply is its status (``cas``: also EXISTS, NOT_FOUND)."""

    command: StoreCommand
    key: bytes
    data: bytes
    flags: int = 0
    expire: int = 0
    cas_token: bytes | int | None = None

    def encode(self) -> bytes:
        token = b""
        if self.command == "cas":
            cas = self.cas_token
            token = b" %s" % (cas if isinstance(cas, bytes) else b"%d" % (cas or 0))
        data = self.data
        # One formatting, so the data is copied once however large it is.
        return b"%s %s %d %d %d%s\r\n%s\r\n" % (
            _VERBS[self.command],
            self.key,
            self.flags,
            self.expire,
            len(data),
            token,
            data,
        )

    def read(self, reader: Reader) -> bytes | ErrorReply | NeedData:
        return reader.status(_CAS_REPLIES if self.command == "cas" else _STORE_REPLIES)


_DELETE_REPLIES = frozenset({DELETED, NOT_FOUND})
_TOUCH_REPLIES = frozenset({TOUCHED, NOT_FOUND})
_OK_REPLIES = frozenset({OK})


@dataclass(frozen=True, slots=True)
class Delete(Request[bytes]):
    key: bytes

    def encode(self) -> bytes:
        return b"delete %s\r\n" % self.key

    def read(self, reader: Reader) -> bytes | ErrorReply | NeedData:
        return reader.status(_DELETE_REPLIES)


@dataclass(frozen=True, slots=True)
class Touch(Request[bytes]):
    key: bytes
    expire: int = 0

    def encode(self) -> bytes:
        return b"touch %s %d\r\n" % (self.key, self.expire)

    def read(self, reader: Reader) -> bytes | ErrorReply | NeedData:
        return reader.status(_TOUCH_REPLIES)


@dataclass(frozen=True, slots=True)
class Incr(Request[int | None]):
    """``incr`` (or ``decr``): the new value, None when the key is missing."""

    key: bytes
    delta: int = 1
    decr: bool = False

    def encode(self) -> bytes:
        return b"%s %s %d\r\n" % (b"decr" if self.decr else b"incr", self.key, self.delta)

    def read(self, reader: Reader) -> int | ErrorReply | NeedData | None:
        return reader.number()


@dataclass(frozen=True, slots=True)
class FlushAll(Request[bytes]):
    delay: int = 0

    def encode(self) -> bytes:
        return b"flush_all %d\r\n" % self.delay if self.delay else b"flush_all\r\n"

    def read(self, reader: Reader) -> bytes | ErrorReply | NeedData:
        return reader.status(_OK_REPLIES)


@dataclass(frozen=True, slots=True)
class Stats(Request[dict[str, str]]):
    """``stats [group]``: ``{name: value}`` as text, as memcached prints them."""

    group: bytes = b""

    def encode(self) -> bytes:
        return b"stats %s\r\n" % self.group if self.group else b"stats\r\n"

    def read(self, reader: Reader) -> dict[str, str] | ErrorReply | NeedData:
        return reader.stats()


@dataclass(frozen=True, slots=True)
class Version(Request[str]):
    def encode(self) -> bytes:
        return b"version\r\n"

    def read(self, reader: Reader) -> str | ErrorReply | NeedData:
        return reader.version()


# -- meta requests ---------------------------------------------------------------


def _flag(letter: bytes, value: int | bytes | None) -> bytes:
    if value is None:
        return b""
    return b" " + letter + (value if isinstance(value, bytes) else b"%d" % value)


def _switch(letter: bytes, on: bool) -> bytes:
    return b" " + letter if on else b""


@dataclass(frozen=True, slots=True)
class _Meta(Request[MetaReply]):
    """What every meta request shares: its key, quiet mode, opaque and key return."""

    STATUSES: ClassVar[frozenset[bytes]] = frozenset()
    QUIETED: ClassVar[bytes] = b"HD"  # the status ``q`` suppresses

    key: bytes
    quiet: bool = False
    opaque: bytes | None = None
    return_key: bool = False
    base64: bool = False
    extra: tuple[bytes, ...] = ()  # further flags, each a letter and its token

    def __post_init__(self) -> None:
        if self.quiet and self.opaque is None and not self.return_key:
            raise ValueError("a quiet meta request needs an opaque token or return_key")

    def _common(self) -> bytes:
        return (
            _switch(b"b", self.base64)
            + _switch(b"k", self.return_key)
            + _flag(b"O", self.opaque)
            + _switch(b"q", self.quiet)
            + b"".join(b" " + token for token in self.extra)
        )

    def read(self, reader: Reader) -> MetaReply | ErrorReply | NeedData:
        return reader.meta(self)

    def matches(self, flags: Mapping[str, bytes]) -> bool:
        """Whether a reply's return flags name this request (its opaque token, else its key)."""
        if self.opaque is not None:
            return flags.get("O") == self.opaque
        if self.return_key:
            return flags.get("k") == self.key
        return True


@dataclass(frozen=True, slots=True)
class MetaGet(_Meta):
    """``mg``: what to return (``v``, ``c``, ``t``, ``f``, ``s``, ``h``, ``l``), and
    ``N<ttl>`` (vivify a miss: win token), ``R<ttl>`` (recompute token),
    ``T<ttl>`` (touch), ``E<cas>`` (cas to set when vivifying)."""

    STATUSES: ClassVar[frozenset[bytes]] = frozenset({b"VA", b"HD", b"EN"})
    QUIETED: ClassVar[bytes] = b"EN"

    value: bool = False
    cas: bool = False
    ttl: bool = False
    client_flags: bool = False
    size: bool = False
    hit_before: bool = False
    last_access: bool = False
    vivify: int | None = None
    recache: int | None = None
    touch: int | None = None

    def encode(self) -> bytes:
        return (
            b"mg "
            + self.key
            + _switch(b"v", self.value)
            + _switch(b"c", self.cas)
            + _switch(b"t", self.ttl)
            + _switch(b"f", self.client_flags)
            + _switch(b"s", self.size)
            + _switch(b"h", self.hit_before)
            + _switch(b"l", self.last_access)
            + _flag(b"N", self.vivify)
            + _flag(b"R", self.recache)
            + _flag(b"T", self.touch)
            + self._common()
            + _CRLF
        )


MetaSetMode = Literal["E", "A", "P", "R", "S"]


@dataclass(frozen=True, slots=True)
class MetaSet(_Meta):
    """``ms``: ``mode`` (``M``: E add, A append, P prepend, R replace, S set),
    ``cas`` (``C``: store only if unchanged), ``ttl`` (``T``), ``client_flags``
    (``F``), ``invalidate`` (``I``), ``return_cas`` (``c``)."""

    STATUSES: ClassVar[frozenset[bytes]] = frozenset({b"HD", b"NS", b"EX", b"NF"})

    data: bytes = b""
    mode: MetaSetMode | None = None
    cas: int | None = None
    ttl: int | None = None
    client_flags: int | None = None
    invalidate: bool = False
    return_cas: bool = False

    def encode(self) -> bytes:
        return (
            b"ms %s %d" % (self.key, len(self.data))
            + (b" M" + self.mode.encode() if self.mode else b"")
            + _flag(b"C", self.cas)
            + _flag(b"T", self.ttl)
            + _flag(b"F", self.client_flags)
            + _switch(b"I", self.invalidate)
            + _switch(b"c", self.return_cas)
            + self._common()
            + _CRLF
            + self.data
            + _CRLF
        )


@dataclass(frozen=True, slots=True)
class MetaDelete(_Meta):
    """``md``: ``cas`` (``C``: delete only that version), ``invalidate`` (``I``: mark
    stale instead of deleting), ``ttl`` (``T``, with ``I``)."""

    STATUSES: ClassVar[frozenset[bytes]] = frozenset({b"HD", b"NF", b"EX"})

    cas: int | None = None
    invalidate: bool = False
    ttl: int | None = None

    def encode(self) -> bytes:
        return (
            b"md "
            + self.key
            + _flag(b"C", self.cas)
            + _switch(b"I", self.invalidate)
            + _flag(b"T", self.ttl)
            + self._common()
            + _CRLF
        )


@dataclass(frozen=True, slots=True)
class MetaArithmetic(_Meta):
    """``ma``: ``mode`` (``M``: I incr, D decr), ``delta`` (``D``), ``vivify`` (``N``:
    create a missing counter with that TTL), ``initial`` (``J``), ``value`` (``v``)."""

    STATUSES: ClassVar[frozenset[bytes]] = frozenset({b"HD", b"VA", b"NF", b"NS", b"EX"})

    mode: Literal["I", "D"] | None = None
    delta: int | None = None
    vivify: int | None = None
    initial: int | None = None
    cas: int | None = None
    ttl: int | None = None
    value: bool = False
    return_cas: bool = False

    def encode(self) -> bytes:
        return (
            b"ma "
            + self.key
            + (b" M" + self.mode.encode() if self.mode else b"")
            + _flag(b"D", self.delta)
            + _flag(b"N", self.vivify)
            + _flag(b"J", self.initial)
            + _flag(b"C", self.cas)
            + _flag(b"T", self.ttl)
            + _switch(b"v", self.value)
            + _switch(b"c", self.return_cas)
            + self._common()
            + _CRLF
        )


@dataclass(frozen=True, slots=True)
class MetaNoop(Request[MetaReply]):
    """``mn``: answered ``MN`` once every request before it is answered."""

    def encode(self) -> bytes:
        return b"mn\r\n"

    def read(self, reader: Reader) -> MetaReply | ErrorReply | NeedData:
        return reader.noop()


# -- the reader ------------------------------------------------------------------


def _mismatch(reply: bytes | bytearray) -> ProtocolError:
    return ProtocolError(f"reply {bytes(reply[:64])!r} does not answer the request")


def _error(line: bytes) -> ErrorReply | None:
    """The error a line is, if it is one of memcached's error lines."""
    if line.startswith(b"SERVER_ERROR"):
        return ErrorReply("SERVER_ERROR", line[13:].decode("utf-8", "replace"))
    if line.startswith(b"CLIENT_ERROR"):
        return ErrorReply("CLIENT_ERROR", line[13:].decode("utf-8", "replace"))
    if line == b"ERROR" or line.startswith(b"ERROR "):
        return ErrorReply("ERROR", line[6:].decode("utf-8", "replace"))
    return None


def _unexpected(line: bytes) -> ErrorReply:
    """An error reply, or the :class:`ProtocolError` of a line the command cannot get."""
    error = _error(line)
    if error is None:
        raise _mismatch(line)
    return error


def _size(token: bytes) -> int:
    if not token.isdigit():
        raise _mismatch(token)
    return int(token)


def _meta_flags(tokens: list[bytes]) -> dict[str, bytes]:
    flags: dict[str, bytes] = {}
    for token in tokens:
        letter = token[:1]
        if not letter.isalpha():
            raise _mismatch(token)
        flags[letter.decode()] = token[1:]
    return flags


_NUMERIC_FLAGS = ("c", "t", "f", "s", "h", "l")
_META_STATUSES = frozenset({b"VA", b"HD", b"EN", b"NS", b"EX", b"NF", b"MN"})


def _numeric(raw: bytes) -> bool:
    return raw.isdigit() or (raw[:1] == b"-" and raw[1:].isdigit())


class Reader:
    """Parse replies from the bytes fed so far, one request at a time.

    :meth:`feed` takes whatever the socket gave; ``request.read(reader)``
    returns the request's reply, consuming it, or :data:`NEED_DATA`.  A reply
    spread over many reads is parsed piece by piece (a get's values are kept
    as they complete), and chunks are joined only once the awaited piece can
    be complete, so a large value costs one copy, not one per chunk.
    :meth:`drained` checks that nothing followed the last reply.
    """

    __slots__ = ("_buf", "_chunks", "_need", "_pending", "_pos", "_stats", "_unanswered", "_values")

    def __init__(self, data: bytes = b"") -> None:
        """Start with ``data``, a reply's first bytes if already received."""
        self._buf = data
        self._pos = 0
        self._chunks: list[bytes] = []
        self._pending = 0  # bytes in _chunks
        self._need = 0  # bytes (from _pos) the awaited piece needs; 0: a line
        self._values: list[Value] = []  # the items of a get so far...
        self._unanswered: set[bytes] | None = None  # ...and the keys not answered yet
        self._stats: dict[str, str] = {}

    def feed(self, data: bytes) -> None:
        """Add bytes received from the server."""
        if not data:
            return
        if not self._chunks and self._pos == len(self._buf):
            # Everything so far is parsed (a reply's first read, usually): the
            # bytes become the buffer at once, as joining one chunk would do.
            self._buf = data
            self._pos = 0
        else:
            self._chunks.append(data)
            self._pending += len(data)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet parsed."""
        return len(self._buf) - self._pos + self._pending

    @property
    def wanted(self) -> int:
        """Bytes still missing for the awaited piece (0: unknown, a line at least)."""
        return max(self._need - self.buffered, 0)

    def drained(self) -> None:
        """Raise :class:`ProtocolError` if bytes nobody asked for follow the replies."""
        if len(self._buf) - self._pos + self._pending:  # buffered, inlined: every reply ends here
            self._need = 0
            self._join()
            raise _mismatch(self._buf[self._pos :])

    def _join(self) -> bool:
        """Merge the received chunks into the buffer, once they can complete the piece."""
        if not self._chunks:
            return False
        rest = len(self._buf) - self._pos
        if self._need and rest + self._pending < self._need:
            return False
        chunks = self._chunks
        if rest:
            chunks.insert(0, self._buf[self._pos :])
        self._buf = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._pending = 0
        self._pos = 0
        return True

    def _line(self) -> bytes | None:
        """The next whole line (without CRLF), consumed; None if it is not all here."""
        eol = self._buf.find(_CRLF, self._pos)
        while eol < 0:
            self._need = 0
            if not self._join():
                return None
            eol = self._buf.find(_CRLF, self._pos)
        line = self._buf[self._pos : eol]
        self._pos = eol + 2
        return line

    def status(self, valid: frozenset[bytes]) -> bytes | ErrorReply | NeedData:
        """A one-line status among ``valid``."""
        line = self._line()
        if line is None:
            return NEED_DATA
        if line in valid:
            return line
        return _unexpected(line)

    def number(self) -> int | ErrorReply | NeedData | None:
        """``incr``/``decr``: digits, or NOT_FOUND (None)."""
        line = self._line()
        if line is None:
            return NEED_DATA
        if line.isdigit():
            return int(line)
        if line == NOT_FOUND:
            return None
        return _unexpected(line)

    def version(self) -> str | ErrorReply | NeedData:
        line = self._line()
        if line is None:
            return NEED_DATA
        if line.startswith(b"VERSION "):
            return line[8:].decode("ascii", "replace")
        return _unexpected(line)

    def stats(self) -> dict[str, str] | ErrorReply | NeedData:
        """``STAT <name> <value>`` lines up to END."""
        while True:
            line = self._line()
            if line is None:
                return NEED_DATA
            if line.startswith(b"STAT "):
                name, _, value = line[5:].partition(b" ")
                self._stats[name.decode("ascii", "replace")] = value.decode("ascii", "replace")
                continue
            stats, self._stats = self._stats, {}
            return stats if line == END else _unexpected(line)

    def values(self, keys: Iterable[bytes], cas: bool) -> list[Value] | ErrorReply | NeedData:
        """VALUE blocks up to END; each key asked for is answered at most once."""
        width = 5 if cas else 4
        unanswered = self._unanswered
        if unanswered is None:
            unanswered = self._unanswered = set(keys)
        found = self._values
        # The hot loop of multi-gets: buffer and position stay in locals, written
        # back only before a join (which reads them) or a return.
        buf, pos = self._buf, self._pos
        while True:
            eol = buf.find(_CRLF, pos)
            if eol < 0:
                self._pos = pos
                self._need = 0
                if self._join():
                    buf, pos = self._buf, self._pos
                    continue
                return NEED_DATA
            if not buf.startswith(b"VALUE ", pos):
                line = buf[pos:eol]
                self._pos = eol + 2
                self._need = 0
                self._values, self._unanswered = [], None
                return found if line == END else _unexpected(line)
            fields = buf[pos:eol].split()  # VALUE <key> <flags> <bytes> [<cas unique>]
            if (
                len(fields) != width
                or fields[1] not in unanswered
                or not (fields[2].isdigit() and fields[3].isdigit())
                or (cas and not fields[4].isdigit())
            ):
                raise _mismatch(buf[pos:eol])
            start = eol + 2
            end = start + int(fields[3])
            if end + 2 > len(buf):
                self._pos = pos
                self._need = end + 2 - pos
                if self._join():
                    buf, pos = self._buf, self._pos
                    continue
                return NEED_DATA
            if buf[end : end + 2] != _CRLF:
                raise _mismatch(buf[end : end + 2])
            pos = end + 2
            key = fields[1]
            unanswered.discard(key)
            found.append(
                _new_value(Value, (key, int(fields[2]), buf[start:end], fields[4] if cas else None))
            )

    def meta(self, request: _Meta) -> MetaReply | ErrorReply | NeedData:
        """A meta reply to ``request``, or the one its ``q`` suppressed."""
        while True:
            buf, pos = self._buf, self._pos
            eol = buf.find(_CRLF, pos)
            if eol < 0:
                self._need = 0
                if self._join():
                    continue
                return NEED_DATA
            line = buf[pos:eol]
            tokens = line.split()
            status = tokens[0] if tokens else line
            if status not in _META_STATUSES:
                self._pos = eol + 2
                return _unexpected(line)
            va = status == b"VA"
            if va and len(tokens) < 2:
                raise _mismatch(line)
            flags = _meta_flags(tokens[2:] if va else tokens[1:])
            ours = status != b"MN" and request.matches(flags)
            if not ours and request.quiet:
                return MetaReply(request.QUIETED, quiet=True)  # left for a later request
            if not ours or status not in request.STATUSES:
                raise _mismatch(line)
            for letter in _NUMERIC_FLAGS:
                raw = flags.get(letter)
                if raw is not None and not _numeric(raw):
                    raise _mismatch(line)
            data = None
            end = eol + 2
            if va:
                end += _size(tokens[1])
                if end + 2 > len(buf):
                    self._need = end + 2 - pos
                    if self._join():
                        continue
                    return NEED_DATA
                if buf[end : end + 2] != _CRLF:
                    raise _mismatch(buf[end : end + 2])
                data = buf[eol + 2 : end]
                end += 2
            self._need = 0
            self._pos = end
            return MetaReply(status, flags, data)

    def noop(self) -> MetaReply | ErrorReply | NeedData:
        line = self._line()
        if line is None:
            return NEED_DATA
        if line == b"MN":
            return MetaReply(b"MN")
        return _unexpected(line)
