"""The soft-expiry envelope: a value with its soft expiry and its measured compute time.

Stampede protection (:mod:`django_mcpatterns.core.stampede`) needs to know, on every read, whether a
value is *fresh*, *stale but servable* or gone, and how long it takes to
compute (for early recomputation).  That metadata travels with the value in
one memcached item, so value and metadata can never disagree and one ``get``
reads both.

Wire format
    The envelope is a serialisation format, recorded in the item's flags like
    every other one (pymemcache's ``serde``): the flags are the inner value's
    flags with :data:`FLAG_ENVELOPE` (bit 16) added, and the data is a fixed
    header followed by the inner value's bytes::

        version  soft_expiry  hard_expiry  compute_time  inner data...
        u8 (=1)  f64 (Unix s) f64 (Unix s) f64 (s)
        big-endian; an expiry of +inf means "never"

    Bit 16 is clear of the bits pymemcache (0-4), pylibmc (at most 0-5) and
    spymemcached (0-1, 8-15) set, so their values are never mistaken for an
    envelope.  The version byte lets a later release change the
    layout: an envelope of an unknown version raises
    :class:`~django_mcpatterns.core.exceptions.EncodingError`, it never reads as garbage or a miss.

Why a serde layer
    Both stores decode every value through their serde
    (:class:`~django_mcpatterns.core.cluster.Cluster` in its single-key and pipelined
    fetches, :class:`~django_mcpatterns.core.memory.MemoryStore` in ``_deserialize``).  Wrapping it
    with :class:`EnvelopeSerde` makes *every* read path unwrap envelopes:
    ``get``, ``get_many``, ``gets``, the Django and Flask backends and user code
    calling the store directly, so the envelope never leaks to users.  The one
    reader that wants the metadata, :mod:`django_mcpatterns.core.stampede`, asks for it explicitly:
    the stores' ``gets_envelope`` and ``get_many_envelopes`` decode with
    :meth:`EnvelopeSerde.deserialize_envelope`; no other read returns an
    :class:`Envelope`.

Plain reads honour the soft expiry
    A plain read of an envelope whose soft expiry has passed (on the serde's
    ``clock``, Unix seconds) gets :data:`STALE`, which every store turns into a
    plain miss: ``get``, ``has_key``, ``get_many``, Django's ``{% cache %}``
    and ``cache_page`` see the value for ``timeout`` seconds, as with a plain
    ``set``, never for the grace period after it.  The item stays in
    memcached for the stampede reader, which alone may serve it stale while
    one caller recomputes it.  A stale envelope is not a refused value
    (:mod:`.serializers`): it is neither counted, nor signalled, nor deleted,
    and its inner value is not even decoded.

The invariant :mod:`django_mcpatterns.core.stampede` keeps: ``hard_expiry`` (the memcached TTL) is
later than ``soft_expiry`` by the grace period, so a stale value remains
servable while one caller recomputes it.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from pymemcache.serde import pickle_serde

from ..exceptions import EncodingError
from .layout import Encoded

__all__ = [
    "FLAG_ENVELOPE",
    "STALE",
    "VERSION",
    "Envelope",
    "EnvelopeSerde",
    "with_envelopes",
]

FLAG_ENVELOPE = 1 << 16
VERSION = 1
_HEADER = struct.Struct(">Bddd")  # version, soft_expiry, hard_expiry, compute_time


class _Stale:
    """The type of :data:`STALE`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "STALE"

    def __reduce__(self) -> Any:
        raise EncodingError("STALE marks a soft-expired envelope read plainly; it is never stored")


STALE: Final = _Stale()
"""What :class:`EnvelopeSerde` hands a store for a plain read of a stale envelope: a miss."""


class Serde(Protocol):
    """pymemcache's serialisation protocol (``pymemcache.serde``)."""

    # pymemcache's own serdes return an int's digits as str; Client sends either.
    def serialize(self, key: Any, value: Any) -> tuple[bytes | str, int]: ...

    def deserialize(self, key: Any, value: bytes, flags: int) -> Any: ...


@dataclass(frozen=True, slots=True)
class Envelope:
    """A cached value with the times :mod:`django_mcpatterns.core.stampede` decides by (Unix
    seconds).

    ``soft_expiry``: after it the value is stale (still served while one caller
    recomputes); ``hard_expiry``: when memcached drops the item;
    ``compute_time``: how long computing the value took, the Δ of XFetch.
    """

    value: Any
    soft_expiry: float = math.inf
    hard_expiry: float = math.inf
    compute_time: float = 0.0

    def fresh(self, now: float) -> bool:
        return now < self.soft_expiry

    @property
    def pending(self) -> bool:
        """Whether this is a lease placeholder (:mod:`django_mcpatterns.core.leases`): a miss with a
        fill under way."""
        return self.soft_expiry == -math.inf

    def __reduce__(self) -> Any:
        # Pickled by a serde that does not know envelopes, it would come back
        # from a plain get as this object: refuse instead of leaking it.
        raise EncodingError(
            "a soft-expiry envelope reached a serde that does not know envelopes; "
            "wrap the store's serde with django_mcpatterns.core.envelope.with_envelopes()"
        )


class EnvelopeSerde:
    """A serde that stores :class:`Envelope` objects in the envelope format.

    Every other value goes to ``inner`` unchanged.  :meth:`deserialize` (every
    plain read) returns an envelope's plain value while it is fresh on
    ``clock`` (Unix seconds) and :data:`STALE` after;
    :meth:`deserialize_envelope` (the stampede reader's explicit path) returns
    the :class:`Envelope` itself, fresh, stale or a lease placeholder.
    """

    __slots__ = ("clock", "inner")

    def __init__(
        self, inner: Serde = pickle_serde, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.inner = inner
        self.clock = clock

    def serialize(self, key: Any, value: Any) -> tuple[bytes | str, int]:
        if type(value) is not Envelope:
            if type(value) is Encoded:  # encoded already (a chunked store's items): as it is
                return value.data, value.flags
            return self.inner.serialize(key, value)
        data, flags = self.inner.serialize(key, value.value)
        if flags & FLAG_ENVELOPE:
            raise EncodingError(
                f"the serde {self.inner!r} uses flag bit 16, which marks soft-expiry envelopes"
            )
        if not isinstance(data, bytes):
            data = str(data).encode()  # pymemcache sends non-bytes output (ints) as text
        header = _HEADER.pack(VERSION, value.soft_expiry, value.hard_expiry, value.compute_time)
        return header + data, flags | FLAG_ENVELOPE

    def deserialize(self, key: Any, value: bytes, flags: int) -> Any:
        """The plain value; :data:`STALE` for an envelope past its soft expiry."""
        if not flags & FLAG_ENVELOPE:
            return self.inner.deserialize(key, value, flags)
        soft_expiry = _header(key, value)[1]
        if self.clock() >= soft_expiry:
            return STALE  # past its timeout: only the stampede reader may serve it
        return self.inner.deserialize(key, value[_HEADER.size :], flags & ~FLAG_ENVELOPE)

    def direct_formats(self) -> dict[int, Callable[[bytes], Any]]:
        """The inner serde's (``ValueSerde.direct_formats``): flags decoded with nothing around."""
        formats = getattr(self.inner, "direct_formats", None)
        found: dict[int, Callable[[bytes], Any]] = formats() if formats is not None else {}
        return {flags: f for flags, f in found.items() if not flags & FLAG_ENVELOPE}

    def direct_types(self) -> frozenset[type]:
        """The types the inner serde writes bare (``ValueSerde.direct_types``)."""
        direct = getattr(self.inner, "direct_types", None)
        return frozenset(direct()) if direct is not None else frozenset()

    def deserialize_envelope(self, key: Any, value: bytes, flags: int) -> Any:
        """An envelope as :class:`Envelope`, fresh or not; any other value as itself."""
        if not flags & FLAG_ENVELOPE:
            return self.inner.deserialize(key, value, flags)
        _, soft_expiry, hard_expiry, compute_time = _header(key, value)
        inner = self.inner.deserialize(key, value[_HEADER.size :], flags & ~FLAG_ENVELOPE)
        return Envelope(inner, soft_expiry, hard_expiry, compute_time)

    def __repr__(self) -> str:
        return f"EnvelopeSerde({self.inner!r})"


def with_envelopes(
    serde: Serde | None = None, *, clock: Callable[[], float] = time.time
) -> EnvelopeSerde:
    """Return ``serde`` (pymemcache's ``pickle_serde`` by default) able to store envelopes.

    ``clock`` (Unix seconds) tells plain reads when an envelope went stale; an
    ``EnvelopeSerde`` is returned as it is, with its own clock.
    """
    if isinstance(serde, EnvelopeSerde):
        return serde
    return EnvelopeSerde(pickle_serde if serde is None else serde, clock=clock)


def _header(key: Any, value: bytes) -> tuple[int, float, float, float]:
    """The envelope header of ``value``; :class:`EncodingError` for an unknown layout."""
    if len(value) < _HEADER.size or value[0] != VERSION:
        found = f"version {value[0]}" if value else "no header"
        raise EncodingError(
            f"cache key {key!r} holds a soft-expiry envelope with {found} "
            f"({len(value)} bytes); this release reads version {VERSION}"
        )
    header: tuple[int, float, float, float] = _HEADER.unpack_from(value)
    return header
