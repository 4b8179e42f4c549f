"""Values: what a store turns a value into and back, and the layouts around it.

* :mod:`.serializers`: the formats (pickle, JSON, msgpack), recorded in the flags;
* :mod:`.signing`: HMAC-signed items; :mod:`.compression`: compressed ones;
* :mod:`.refusals`: what a read does with an item it will not decode;
* :mod:`.serde`: the serde of a store, made from ``OPTIONS`` (:class:`SerdeOptions`);
* :mod:`.envelope`: the soft-expiry envelope of ``get_or_compute``;
* :mod:`.layout`: values over the item size limit, stored in chunks;
* :mod:`.plugins`: a class an option names by dotted path.

Nothing here does I/O, nor imports a pattern.
"""

from __future__ import annotations

from .compression import Compressor, ZlibCompressor, ZstdCompressor, load_compressor
from .envelope import STALE, Envelope, EnvelopeSerde, with_envelopes
from .layout import CHUNKED_MAX_TTL, FLAG_CHUNKED, ChunkManifest
from .refusals import REFUSED, ValueRefused, is_refused
from .serde import SerdeOptions, ValueSerde
from .serializers import (
    DEFAULT_SERIALIZER,
    JSONSerializer,
    MsgpackSerializer,
    PickleSerializer,
    Serializer,
    load_serializer,
)
from .signing import Signer, derive_signing_key, with_derived_keys

__all__ = [
    "CHUNKED_MAX_TTL",
    "DEFAULT_SERIALIZER",
    "FLAG_CHUNKED",
    "REFUSED",
    "STALE",
    "ChunkManifest",
    "Compressor",
    "Envelope",
    "EnvelopeSerde",
    "JSONSerializer",
    "MsgpackSerializer",
    "PickleSerializer",
    "SerdeOptions",
    "Serializer",
    "Signer",
    "ValueRefused",
    "ValueSerde",
    "ZlibCompressor",
    "ZstdCompressor",
    "derive_signing_key",
    "is_refused",
    "load_compressor",
    "load_serializer",
    "with_derived_keys",
    "with_envelopes",
]
