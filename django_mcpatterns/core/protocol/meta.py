"""memcached 1.6's meta commands (``mg``, ``ms``, ``md``, ``ma``, ``mn``), sans-IO.

Each request is a frozen dataclass whose fields are its command's flags; its
reply is a :class:`~.wire.MetaReply` (or an :class:`~.wire.ErrorReply`).

Quiet meta requests (``q``) get no reply on success (``mg``: on a miss), so
they must carry an opaque token (``O``) or ask for their key back (``k``): a
reply is theirs only if it names them, and the batch ends with :class:`MetaNoop`,
whose ``MN`` closes it.  A suppressed reply reads as :attr:`MetaReply.quiet`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from .wire import CRLF, ErrorReply, MetaReply, NeedData, ReplyReader, Request

__all__ = [
    "MetaArithmetic",
    "MetaDelete",
    "MetaGet",
    "MetaNoop",
    "MetaRequest",
    "MetaSet",
    "MetaSetMode",
]


def _flag(letter: bytes, value: int | bytes | None) -> bytes:
    if value is None:
        return b""
    return b" " + letter + (value if isinstance(value, bytes) else b"%d" % value)


def _switch(letter: bytes, on: bool) -> bytes:
    return b" " + letter if on else b""


@dataclass(frozen=True, slots=True)
class MetaRequest(Request[MetaReply]):
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

    def read(self, reader: ReplyReader) -> MetaReply | ErrorReply | NeedData:
        return reader.meta(self)

    def matches(self, flags: Mapping[str, bytes]) -> bool:
        """Whether a reply's return flags name this request (its opaque token, else its key)."""
        if self.opaque is not None:
            return flags.get("O") == self.opaque
        if self.return_key:
            return flags.get("k") == self.key
        return True


@dataclass(frozen=True, slots=True)
class MetaGet(MetaRequest):
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
            + CRLF
        )


MetaSetMode = Literal["E", "A", "P", "R", "S"]


@dataclass(frozen=True, slots=True)
class MetaSet(MetaRequest):
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
            + CRLF
            + self.data
            + CRLF
        )


@dataclass(frozen=True, slots=True)
class MetaDelete(MetaRequest):
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
            + CRLF
        )


@dataclass(frozen=True, slots=True)
class MetaArithmetic(MetaRequest):
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
            + CRLF
        )


@dataclass(frozen=True, slots=True)
class MetaNoop(Request[MetaReply]):
    """``mn``: answered ``MN`` once every request before it is answered."""

    def encode(self) -> bytes:
        return b"mn\r\n"

    def read(self, reader: ReplyReader) -> MetaReply | ErrorReply | NeedData:
        return reader.noop()
