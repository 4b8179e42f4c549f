"""What a read does with an item it will not decode: the policy for values.

A reader decodes bytes, text, integers and *its own* serializer's format,
nothing else.  Another serializer's format, unknown flags, corrupt data (a
bad pickle, bad JSON, invalid UTF-8), an unsigned or forged item under
signing: each is **refused**.  The store answers a *miss* (``get`` returns
the default, ``get_many`` leaves the key out, ``gets`` answers
``(None, None)``), logs a warning on ``django_mcpatterns.serializers``,
counts it by reason (:meth:`~.serde.ValueSerde.refusals`) and calls ``on_refused``
with a :class:`ValueRefused` (Django and Flask send the ``value_refused``
signal).  The item is left in place: on a ring shared with PHP, Java or
pylibmc clients it is another client's value, and a delete (without
``cas``) could also take a fresh value written meanwhile.  ``set`` (and
``get_or_compute``, which stores with ``set``) replaces it; ``add`` and
Django's ``get_or_set`` leave it and return their value uncached.  Never a
silent ``None``, never a guess, never an unpickled stranger.  (Set and list
items, and soft-expiry envelopes of an unknown version, raise
:class:`~django_mcpatterns.core.exceptions.EncodingError` instead: there a miss
would be a wrong answer.)

The decoders (:mod:`.serializers`, :mod:`.signing`, :mod:`.serde`) raise a
:class:`Refusal` saying why; the serde turns it into :data:`REFUSED`, which the
stores read as a miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from ..exceptions import EncodingError
from .envelope import Envelope

__all__ = ["REFUSED", "Reason", "Refusal", "ValueRefused", "is_refused"]

Reason = Literal["unsigned", "signature", "format", "corrupt"]


class Refusal(EncodingError):
    """An item a reader will not decode, with why (the :class:`ValueRefused` reason)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason


class _Refused:
    """The type of :data:`REFUSED`: what the serde hands a store for an item it refused."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REFUSED"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> Any:
        raise EncodingError("REFUSED marks a refused item; it is never stored")


REFUSED: Final = _Refused()


def is_refused(value: Any) -> bool:
    """Whether a store read ``value`` from a refused item (plain, or inside an envelope)."""
    return value is REFUSED or (type(value) is Envelope and value.value is REFUSED)


@dataclass(frozen=True)
class ValueRefused:
    """A store refused an item and answered a miss (logged, counted, then this event).

    ``reason``: ``"unsigned"`` (no signature under signing), ``"signature"`` (a
    signature no configured key made: forged, or copied from another key),
    ``"format"`` (flags of another serializer, or unknown) or ``"corrupt"``
    (the format's decoder failed).
    """

    key: bytes
    reason: Reason
    flags: int
    detail: str
