"""The reader: bytes received from memcached to typed replies, one request at a time.

:class:`Reader` is fed whatever the socket gave and parses the reply of the
request that reads it (``request.read(reader)``), or answers
:data:`~.wire.NEED_DATA`.  Anything a request cannot get raises
:class:`~..exceptions.ProtocolError`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..exceptions import ProtocolError
from .meta import MetaRequest
from .wire import CRLF, END, NEED_DATA, NOT_FOUND, ErrorReply, MetaReply, NeedData, Value

__all__ = ["MAX_VALUE_LENGTH", "Reader"]

MAX_VALUE_LENGTH = 1 << 30
"""The longest value a reply may declare: memcached's item size ceiling (``-I`` is at most
1 GiB).  A longer one is a :class:`ProtocolError`, not a buffer to grow (or a
``MemoryError`` in a view); the compiled reader has the same (``src/speedups/speedups.h``)."""

_CRLF = CRLF
_new_value = tuple.__new__  # a Value from a tuple, in C: NamedTuple's own __new__ is Python


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


def _too_long(digits: bytes) -> bool:
    """Whether a declared length passes MAX_VALUE_LENGTH (checked before int() of a long one)."""
    return len(digits) > 18 or int(digits) > MAX_VALUE_LENGTH


def _size(token: bytes) -> int:
    if not token.isdigit() or _too_long(token):
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
                or _too_long(fields[3])
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

    def meta(self, request: MetaRequest) -> MetaReply | ErrorReply | NeedData:
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
