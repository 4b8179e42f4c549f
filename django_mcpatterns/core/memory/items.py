"""The items of the embedded store: memcached 1.6's sizes, counters, exptimes and CAS tokens."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from ..keys import Key, PlainKey, Routed
from ..store import MAX_RELATIVE_EXPIRE, CasToken

__all__ = [
    "FLAGS_SUFFIX",
    "ITEM_OVERHEAD",
    "MAX_COUNTER",
    "MIN_ITEM_SIZE",
    "Item",
    "Serde",
    "cas_number",
    "cas_token",
    "check_exptime",
    "deadline_of",
    "item_size",
    "parse_counter",
    "serde_key",
]

# memcached 1.6 item_make_header(): sizeof(item) 48 + key NUL 1 + "\r\n" 2 + CAS 8.
ITEM_OVERHEAD = 59
# Non-zero client flags are stored as a 4-byte suffix (item_make_header()).
FLAGS_SUFFIX = 4
# memcached refuses -I below 1024 and above half of -m.
MIN_ITEM_SIZE = 1024
MAX_COUNTER = 2**64 - 1

# strtoull(): optional leading whitespace, a sign, decimal digits.
_COUNTER = re.compile(rb"[ \t\n\v\f\r]*([+-]?)([0-9]+)")
# safe_strtoull() accepts the number when followed by whitespace or the end of
# the data (memcached's item data is always followed by "\r\n", or a NUL).
_COUNTER_END = frozenset(b" \t\n\v\f\r\x00")


class Serde(Protocol):
    """pymemcache's serialisation protocol (``pymemcache.serde``)."""

    def serialize(self, key: Any, value: Any) -> tuple[bytes | str, int]: ...

    def deserialize(self, key: Any, value: bytes, flags: int) -> Any: ...


def item_size(key: bytes, data: bytes, flags: int) -> int:
    """Bytes memcached 1.6 allocates for an item; compared with the ``-I`` limit."""
    return ITEM_OVERHEAD + len(key) + len(data) + (FLAGS_SUFFIX if flags else 0)


def parse_counter(data: bytes) -> int | None:
    """Return the number ``incr``/``decr`` see in ``data``, or ``None`` if non-numeric.

    Mirrors memcached's ``safe_strtoull``: leading whitespace and ``+`` are
    accepted, anything but whitespace after the digits is not, values over
    2**64 - 1 are refused, and a ``-`` is refused only when it wraps the result
    past 2**63 (so ``b"-0"`` is 0).
    """
    match = _COUNTER.match(data)
    if match is None:
        return None
    end = match.end()
    if end < len(data) and data[end] not in _COUNTER_END:
        return None
    number = int(match.group(2))
    if number > MAX_COUNTER:  # strtoull() sets ERANGE
        return None
    if match.group(1) == b"-":
        number = -number & MAX_COUNTER
        if number > MAX_COUNTER >> 1:
            return None
    return number


@dataclass(frozen=True, slots=True)
class Item:
    """One item as memcached keeps it: the bytes, flags, when it expires, its CAS, its size."""

    data: bytes
    flags: int
    deadline: int | None  # whole-second clock value at which it expires; None: never
    cas: int
    size: int
    leased: bool = False  # vivified by a leasing read: later readers see it pending (Z)

    def expired(self, now: int) -> bool:
        return self.deadline is not None and self.deadline <= now


def check_exptime(expire: int) -> int:
    # The text protocol carries exptimes as decimal integers.
    if isinstance(expire, bool) or not isinstance(expire, int):
        raise ValueError(f"expire must be an integer number of seconds, not {expire!r}")
    return expire


def deadline_of(expire: int, now: int) -> int | None:
    """memcached's ``realtime()``: the clock value at which an item stored ``now`` expires."""
    if expire == 0:
        return None
    if expire < 0:
        return now  # negative exptimes expire at once (EXPTIME_TO_POSITIVE_TIME)
    if expire > MAX_RELATIVE_EXPIRE:
        return expire  # an absolute Unix time
    return now + expire


def serde_key(key: Key) -> PlainKey:
    """The key the serde sees: the one stored (a routed key's bytes, as a Cluster sends them)."""
    return key.key if isinstance(key, Routed) else key


def cas_token(item: Item) -> bytes:
    # pymemcache returns CAS tokens as the ASCII digits memcached sends.
    return b"%d" % item.cas


def cas_number(cas: CasToken | str) -> int:
    # pymemcache sends a token given as int, str or bytes, if it is ASCII digits.
    text = (
        cas if isinstance(cas, bytes) else str(cas).encode() if isinstance(cas, int | str) else b""
    )
    if not text.isdigit():
        raise ValueError(f"cas must be a token of ASCII digits, not {cas!r}")
    return int(text)
