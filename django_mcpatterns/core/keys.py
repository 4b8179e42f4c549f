"""Memcached key rules, checked before anything reaches the wire.

The text protocol separates tokens with spaces and ends lines with ``\\r\\n``, so a
key with whitespace or control bytes could inject commands; keys are limited to
250 bytes (``KEY_MAX_LENGTH`` in memcached.h).
"""

from __future__ import annotations

import re
from typing import TypeVar

from .exceptions import InvalidKeyError

Key = str | bytes
# A key of the caller's own type (str, bytes, a RoutedKey): answers name keys as given.
KeyT = TypeVar("KeyT", bound=Key)

MAX_KEY_LENGTH = 250
_FORBIDDEN = re.compile(rb"[\x00-\x20\x7f]")


def key_bytes(key: Key) -> bytes:
    """Return the key as the bytes sent to memcached (str is UTF-8), or raise.

    Raise :class:`InvalidKeyError` for an empty key, a key over 250 bytes, or one
    holding whitespace or control bytes.
    """
    # Hot path (most keys): printable ASCII without spaces has none of the
    # forbidden bytes and as many bytes as characters, checked in C.
    if (
        key.__class__ is str
        and 0 < len(key) <= MAX_KEY_LENGTH
        and key.isascii()
        and key.isprintable()
        and " " not in key
    ):
        return key.encode()
    if isinstance(key, str):
        raw = key.encode("utf-8")
    elif isinstance(key, bytes):
        raw = key
    else:
        raise InvalidKeyError(f"memcached keys are str or bytes, not {type(key).__name__}")
    if not raw:
        raise InvalidKeyError("memcached keys cannot be empty")
    if len(raw) > MAX_KEY_LENGTH:
        raise InvalidKeyError(
            f"key is {len(raw)} bytes; memcached allows at most {MAX_KEY_LENGTH}: {raw[:40]!r}..."
        )
    if _FORBIDDEN.search(raw):
        raise InvalidKeyError(
            f"key {raw!r} contains whitespace or control characters, which memcached forbids"
        )
    return raw
