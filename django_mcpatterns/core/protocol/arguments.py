"""A command's arguments, checked and encoded before anything is sent.

A bad expire, delta or cas token, or a value the serde cannot encode, raises
here, before any I/O: a command never leaves half-checked.
"""

from __future__ import annotations

from typing import Any

from ..store import MAX_RELATIVE_EXPIRE, CasToken

__all__ = ["EXPIRED", "MAX_DELTA", "cas_token", "delta", "encoded", "expire_time", "raw"]

Serde = Any  # pymemcache's protocol: serialize(key, value), deserialize(key, data, flags)

MAX_DELTA = 2**64  # incr/decr deltas are unsigned 64-bit (protocol.txt)
EXPIRED = MAX_RELATIVE_EXPIRE + 1  # an absolute Unix time long past


def encoded(serde: Serde, kb: bytes, value: Any) -> tuple[bytes, int]:
    """``value`` as the serde encodes it for key ``kb``: ``(data, flags)``."""
    data, flags = serde.serialize(kb, value)
    # Serialisers may return an int's digits as str (pymemcache's serdes do): sent as text.
    return (data if isinstance(data, bytes) else str(data).encode()), flags


def raw(value: bytes) -> bytes:
    """append/prepend's value: bytes only."""
    # append/prepend keep the item's flags, so only raw bytes make sense (store.py).
    if not isinstance(value, bytes):
        raise TypeError(f"append/prepend take bytes, not {type(value).__name__}")
    return value


def delta(delta: int) -> int:
    """An incr/decr delta: an unsigned 64-bit integer."""
    if isinstance(delta, bool) or not isinstance(delta, int) or not 0 <= delta < MAX_DELTA:
        raise ValueError(f"incr/decr delta must be an integer in [0, 2**64), not {delta!r}")
    return delta


def expire_time(expire: int) -> int:
    """memcached's exptime for ``expire``; a negative one is "expired at once"."""
    if not isinstance(expire, int):
        raise ValueError(f"expire must be an integer, not {expire!r}")
    # "Expired at once" as an absolute time in 1970, which memcached treats as
    # it treats a negative exptime: twemproxy closes the connection on those.
    return EXPIRED if expire < 0 else int(expire)


def cas_token(cas: CasToken | str) -> bytes:
    """A cas token as memcached's ASCII digits: int, str or bytes (gets returns bytes)."""
    if isinstance(cas, int) and not isinstance(cas, bool) and cas >= 0:
        return b"%d" % cas
    token = cas.encode("ascii", "replace") if isinstance(cas, str) else cas
    if isinstance(token, bytes) and token.isdigit():
        return token
    raise ValueError(f"cas token must be memcached's unsigned integer, not {cas!r}")
