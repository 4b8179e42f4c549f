"""Memcached key rules, checked before anything reaches the wire.

The text protocol separates tokens with spaces and ends lines with ``\\r\\n``, so a
key with whitespace or control bytes could inject commands; keys are limited to
250 bytes (``KEY_MAX_LENGTH`` in memcached.h).

Routing is data, not a property of the key's type: a plain key (``str`` or
``bytes``) is placed on the ketama ring by its own final bytes, as every other
ketama client places it; a :class:`Routed` key names the bytes that place it
(a namespace's keys all route by their root's version key).  A ``Routed`` is
not ``bytes``: a conversion that would drop its route (``bytes(...)``, ``+``,
slicing, :func:`key_bytes`) raises instead of sending the key elsewhere.

Long keys (``OPTIONS["long_keys"] = "hash"``): :func:`shorten` turns a key over
250 bytes into ``<head>:#<digest>``: its first bytes, readable in ``stats
cachedump`` and logs, then 40 hex digits of BLAKE2b-160 over the *whole* key.
The form is stable (every process and release makes the same one, so it is
routed and shared like any key) and at most 250 bytes; keys that fit are
left alone, except a key that already *ends* like a digest form (``:#`` and 40
hex digits), which is hashed too: so no key a caller gives can be stored under
another key's digest form (the two key spaces are disjoint).  Only the length
is forgiven: whitespace and control bytes stay invalid.

Keys the patterns derive from a caller's key (a rate limit's slots, a
counter's flight record) add a suffix; one that no longer fits takes its
digest form (:func:`shorten`), whatever ``long_keys`` says: the caller's key
was valid, so is every key made from it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TypeVar

from .exceptions import InvalidKeyError


@dataclass(frozen=True, slots=True)
class Routed:
    """A memcached key stored as ``key`` on the server the ring names for ``route``.

    Stores with one place (the embedded store) accept it and ignore the route.
    """

    key: bytes
    route: bytes

    def __post_init__(self) -> None:
        if type(self.key) is not bytes or type(self.route) is not bytes:
            raise TypeError(
                "Routed(key, route) takes bytes for both, not "
                f"{type(self.key).__name__} and {type(self.route).__name__}"
            )


PlainKey = str | bytes
Key = PlainKey | Routed
# A key of the caller's own type (str, bytes, a Routed): answers name keys as given.
KeyT = TypeVar("KeyT", bound=Key)
PlainKeyT = TypeVar("PlainKeyT", str, bytes)

MAX_KEY_LENGTH = 250
_FORBIDDEN = re.compile(rb"[\x00-\x20\x7f]")


LONG_KEYS = ("refuse", "hash")
_DIGEST_MARK = b":#"
_DIGEST_HEX = 40  # BLAKE2b-160
_HEAD = MAX_KEY_LENGTH - len(_DIGEST_MARK) - _DIGEST_HEX
_DIGEST_FORM = re.compile(rb":#[0-9a-f]{%d}\Z" % _DIGEST_HEX)


def shorten(key: PlainKeyT) -> PlainKeyT:
    """Return ``key``, or its digest form (``<head>:#<digest>``) when it is over 250 bytes.

    A key that ends like a digest form is hashed too, whatever its length: a
    caller's key never reads or overwrites another key's digest form.  The
    head is cut on a character boundary, so a ``str`` key stays valid UTF-8;
    the result has the type of ``key``.
    """
    raw = key.encode("utf-8") if isinstance(key, str) else key
    if len(raw) <= MAX_KEY_LENGTH and (b":#" not in raw or not _DIGEST_FORM.search(raw)):
        return key
    digest = hashlib.blake2b(raw, digest_size=_DIGEST_HEX // 2).hexdigest().encode()
    head = raw[:_HEAD]
    if isinstance(key, str):
        head = head.decode("utf-8", "ignore").encode("utf-8")  # no half character
        return (head + _DIGEST_MARK + digest).decode("utf-8")
    return head + _DIGEST_MARK + digest


def placed(key: Key) -> tuple[bytes, bytes]:
    """Return ``(wire, ring)``: the bytes sent to memcached and the bytes that pick its server.

    Raise as :func:`key_bytes` does for an invalid key.
    """
    if (  # key_bytes's hot path, inlined: one call less per command
        key.__class__ is str
        and 0 < len(key) <= MAX_KEY_LENGTH
        and key.isascii()
        and key.isprintable()
        and " " not in key
    ):
        raw = key.encode()
        return raw, raw
    if isinstance(key, Routed):
        return key_bytes(key.key), key.route
    raw = key_bytes(key)
    return raw, raw


def key_bytes(key: PlainKey) -> bytes:
    """Return a plain key as the bytes sent to memcached (str is UTF-8), or raise.

    Raise :class:`InvalidKeyError` for an empty key, a key over 250 bytes, or one
    holding whitespace or control bytes, and ``TypeError`` for a :class:`Routed`
    key, whose route the bytes would lose (:func:`placed` keeps it).
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
        raise _not_plain(key)
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


def _not_plain(key: object) -> Exception:
    """The error for a key that is neither str nor bytes: a Routed one is a type error."""
    if type(key) is Routed:
        return TypeError(f"{key!r} is not bytes: its route would be lost (use placed())")
    return InvalidKeyError(f"memcached keys are str or bytes, not {type(key).__name__}")
