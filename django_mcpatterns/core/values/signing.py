"""Signed values: HMAC-SHA256 over the key, the flags and the data (``signed``, ``signing_key``).

Every item the serializer encodes (text and structured values) carries an
HMAC-SHA256 over the key, the flags and the data, so an item written by
anyone without the key, or copied from another key, is refused: write
access to memcached does not become code execution through pickle.  Raw
``bytes`` (flags 0) and ``int`` (``FLAG_INTEGER``) items stay unsigned,
because memcached itself rewrites them (``append``/``prepend`` for sets and
lists, ``incr``/``decr`` for counters and namespace versions) and would
break any signature.  They are inert, never given to a deserializer: set
and list items are parsed by the strict codec of :mod:`django_mcpatterns.core.sets`.  The first
key signs, every key verifies (rotation).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pymemcache.serde import FLAG_BYTES, FLAG_INTEGER

from ..exceptions import ConfigurationError
from .refusals import Refusal

__all__ = [
    "FLAG_SIGNED",
    "MIN_SIGNING_KEY_BYTES",
    "UNSIGNED_FLAGS",
    "Signer",
    "derive_signing_key",
    "parse_signing_keys",
    "with_derived_keys",
]

FLAG_SIGNED = 1 << 20
# Items memcached rewrites itself (append/prepend, incr/decr): never signed.
UNSIGNED_FLAGS = frozenset({FLAG_BYTES, FLAG_INTEGER})
MAC_SIZE = hashlib.sha256().digest_size
MIN_SIGNING_KEY_BYTES = 32
# Domain separation: a MAC made here means nothing to any other HMAC user of the key.
_MAC_DOMAIN = b"django-mcpatterns signed value v1\x00"
_MAC_HEADER = struct.Struct(">IH")  # flags, key length


def derive_signing_key(secret: str | bytes) -> bytes:
    """Derive a 32-byte signing key from an application secret (HKDF-SHA256, RFC 5869).

    Django and Flask use it on ``SECRET_KEY`` when ``signed`` is set without a
    key, so the secret itself never signs cache values.
    """
    ikm = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    prk = hmac.new(b"django-mcpatterns", ikm, hashlib.sha256).digest()  # extract
    return hmac.new(prk, b"cache value signing\x01", hashlib.sha256).digest()  # expand, L=32


class Signer:
    """HMAC-SHA256 over key, flags and data; ``keys[0]`` signs, every key verifies."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ConfigurationError("signing needs at least one key", option="signing_keys")
        self._keys = tuple(keys)

    def sign(self, key: Any, flags: int, payload: bytes) -> bytes:
        """Return the signed data: the MAC, then ``payload``."""
        return self._mac(self._keys[0], key, flags, payload) + payload

    def verify(self, key: Any, flags: int, data: bytes) -> bytes:
        """Return the payload of signed ``data``, or raise when no key made its MAC."""
        mac, payload = data[:MAC_SIZE], data[MAC_SIZE:]
        if len(mac) == MAC_SIZE:
            for secret in self._keys:
                if hmac.compare_digest(mac, self._mac(secret, key, flags, payload)):
                    return payload
        raise Refusal("signature", "its signature was not made by any configured signing key")

    @staticmethod
    def _mac(secret: bytes, key: Any, flags: int, payload: bytes) -> bytes:
        # The key is bound in: a signed value copied to another key is refused.
        kb = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        mac = hmac.new(secret, _MAC_DOMAIN + _MAC_HEADER.pack(flags, len(kb)) + kb, hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def __repr__(self) -> str:
        return f"Signer({len(self._keys)} key{'s' if len(self._keys) > 1 else ''})"


def with_derived_keys(
    options: Mapping[str, Any], secrets: Callable[[], Iterable[str | bytes | None]]
) -> dict[str, Any]:
    """``options`` with ``signing_keys`` derived from ``secrets()`` when ``signed`` is True alone.

    What the framework layers do with ``SECRET_KEY`` (Django also passes
    ``SECRET_KEY_FALLBACKS``, which then verify): the core always takes a key.
    ``secrets`` is called only when a key must be derived.
    """
    given = dict(options)
    if (
        given.get("signed") is True
        and not given.get("signing_key")
        and not given.get("signing_keys")
    ):
        given["signing_keys"] = [derive_signing_key(s) for s in secrets() if s]
    return given


def parse_signing_keys(one: object, many: object) -> tuple[bytes, ...]:
    if one is not None and many:
        raise ConfigurationError(
            "give either 'signing_key' or 'signing_keys', not both", option="signing_keys"
        )
    if one is not None:
        many = (one,)
    if isinstance(many, str | bytes) or not isinstance(many, Sequence):
        raise ConfigurationError(
            "option 'signing_keys' must be a list of keys (the first signs)", option="signing_keys"
        )
    keys = []
    for key in many:
        raw = key.encode("utf-8") if isinstance(key, str) else key
        if not isinstance(raw, bytes) or len(raw) < MIN_SIGNING_KEY_BYTES:
            raise ConfigurationError(
                f"signing keys must be str or bytes of at least {MIN_SIGNING_KEY_BYTES} bytes "
                "(e.g. secrets.token_urlsafe(32))",
                option="signing_key" if one is not None else "signing_keys",
            )
        keys.append(bytes(raw))
    return tuple(keys)
