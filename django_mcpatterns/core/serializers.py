"""The serializers' documented path: they live in :mod:`django_mcpatterns.core.values`."""

from __future__ import annotations

from .values.refusals import REFUSED, ValueRefused, is_refused
from .values.serde import DEFAULT_COMPRESS_MIN_LEN, SerdeOptions, ValueSerde
from .values.serializers import (
    DEFAULT_SERIALIZER,
    FLAG_JSON,
    FLAG_MSGPACK,
    JSONSerializer,
    MsgpackSerializer,
    PickleSerializer,
    Serializer,
    UnpicklableValueError,
    load_serializer,
)
from .values.signing import (
    FLAG_SIGNED,
    MIN_SIGNING_KEY_BYTES,
    Signer,
    derive_signing_key,
    with_derived_keys,
)

__all__ = [
    "DEFAULT_COMPRESS_MIN_LEN",
    "DEFAULT_SERIALIZER",
    "FLAG_JSON",
    "FLAG_MSGPACK",
    "FLAG_SIGNED",
    "MIN_SIGNING_KEY_BYTES",
    "REFUSED",
    "JSONSerializer",
    "MsgpackSerializer",
    "PickleSerializer",
    "SerdeOptions",
    "Serializer",
    "Signer",
    "UnpicklableValueError",
    "ValueRefused",
    "ValueSerde",
    "derive_signing_key",
    "is_refused",
    "load_serializer",
    "with_derived_keys",
]
