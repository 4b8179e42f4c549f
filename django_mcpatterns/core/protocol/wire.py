"""memcached's wire format, sans-IO: requests to bytes, and the replies they get.

Both protocols of memcached's ``doc/protocol.txt``: the classic text commands
(``get``/``gets``, the storage commands, ``delete``, ``incr``/``decr``, ``touch``,
``flush_all``, ``stats``, ``version``) here, and the meta commands of memcached
1.6 (``mg``, ``ms``, ``md``, ``ma``, ``mn``) in :mod:`.meta`.  No sockets: a
transport writes :func:`encode`'s bytes and feeds what it receives to a
:class:`~.reader.Reader`, which parses one reply per request.

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
does not match) raises :class:`~..exceptions.ProtocolError`: a connection out of
step (a fork sharing a socket, a reply left unread) is never read as data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, NamedTuple, Protocol, TypeAlias, TypeVar

__all__ = [
    "CRLF",
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
    "MetaReply",
    "NeedData",
    "Reply",
    "ReplyReader",
    "Request",
    "Stats",
    "Store",
    "StoreCommand",
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

CRLF: Final = b"\r\n"


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


class ReplyReader(Protocol):
    """What a request reads its reply with (:class:`~.reader.Reader`)."""

    def status(self, valid: frozenset[bytes]) -> bytes | ErrorReply | NeedData: ...

    def number(self) -> int | ErrorReply | NeedData | None: ...

    def version(self) -> str | ErrorReply | NeedData: ...

    def stats(self) -> dict[str, str] | ErrorReply | NeedData: ...

    def values(self, keys: Iterable[bytes], cas: bool) -> list[Value] | ErrorReply | NeedData: ...

    def meta(self, request: Any) -> MetaReply | ErrorReply | NeedData: ...

    def noop(self) -> MetaReply | ErrorReply | NeedData: ...


# -- requests --------------------------------------------------------------------


class Request(Generic[T]):
    """A command: :meth:`encode` gives its bytes, :meth:`read` parses its reply."""

    __slots__ = ()

    def encode(self) -> bytes:
        raise NotImplementedError

    def read(self, reader: ReplyReader) -> T | ErrorReply | NeedData:
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
        return (b"gets " if self.cas else b"get ") + b" ".join(self.keys) + CRLF

    def read(self, reader: ReplyReader) -> list[Value] | ErrorReply | NeedData:
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

    def read(self, reader: ReplyReader) -> bytes | ErrorReply | NeedData:
        return reader.status(_CAS_REPLIES if self.command == "cas" else _STORE_REPLIES)


_DELETE_REPLIES = frozenset({DELETED, NOT_FOUND})
_TOUCH_REPLIES = frozenset({TOUCHED, NOT_FOUND})
_OK_REPLIES = frozenset({OK})


@dataclass(frozen=True, slots=True)
class Delete(Request[bytes]):
    key: bytes

    def encode(self) -> bytes:
        return b"delete %s\r\n" % self.key

    def read(self, reader: ReplyReader) -> bytes | ErrorReply | NeedData:
        return reader.status(_DELETE_REPLIES)


@dataclass(frozen=True, slots=True)
class Touch(Request[bytes]):
    key: bytes
    expire: int = 0

    def encode(self) -> bytes:
        return b"touch %s %d\r\n" % (self.key, self.expire)

    def read(self, reader: ReplyReader) -> bytes | ErrorReply | NeedData:
        return reader.status(_TOUCH_REPLIES)


@dataclass(frozen=True, slots=True)
class Incr(Request[int | None]):
    """``incr`` (or ``decr``): the new value, None when the key is missing."""

    key: bytes
    delta: int = 1
    decr: bool = False

    def encode(self) -> bytes:
        return b"%s %s %d\r\n" % (b"decr" if self.decr else b"incr", self.key, self.delta)

    def read(self, reader: ReplyReader) -> int | ErrorReply | NeedData | None:
        return reader.number()


@dataclass(frozen=True, slots=True)
class FlushAll(Request[bytes]):
    delay: int = 0

    def encode(self) -> bytes:
        return b"flush_all %d\r\n" % self.delay if self.delay else b"flush_all\r\n"

    def read(self, reader: ReplyReader) -> bytes | ErrorReply | NeedData:
        return reader.status(_OK_REPLIES)


@dataclass(frozen=True, slots=True)
class Stats(Request[dict[str, str]]):
    """``stats [group]``: ``{name: value}`` as text, as memcached prints them."""

    group: bytes = b""

    def encode(self) -> bytes:
        return b"stats %s\r\n" % self.group if self.group else b"stats\r\n"

    def read(self, reader: ReplyReader) -> dict[str, str] | ErrorReply | NeedData:
        return reader.stats()


@dataclass(frozen=True, slots=True)
class Version(Request[str]):
    def encode(self) -> bytes:
        return b"version\r\n"

    def read(self, reader: ReplyReader) -> str | ErrorReply | NeedData:
        return reader.version()
